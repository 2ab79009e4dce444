"""The node daemon's Prometheus endpoint on a `BoundedHTTPServer` (prometheus_client's own server gives every
connection a thread and a descriptor, with no limit and no timeout: a thousand idle connections made every prepare
fail with "Too many open files").

Serves the registry on any GET path, as prometheus_client does, in the format the scraper accepts (text or
OpenMetrics), gzipped when it asks for it, `name[]=` selecting metrics.
"""

from __future__ import annotations

import gzip
import threading
from urllib.parse import parse_qs, urlsplit

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

from dra_driver.httpserver import BoundedHandler, BoundedHTTPServer, Limits

# A scraper or two, and a person with curl: 16 connections in all, 4 from one address.
METRICS_LIMITS = Limits(max_connections=16, max_per_peer=4, request_timeout_s=10.0, idle_timeout_s=30.0)


class _Handler(BoundedHandler):
    server: MetricsServer
    server_version = "dra-driver-metrics"
    sys_version = ""

    def log_message(self, format: str, *args: object) -> None:  # quiet: a scrape every few seconds
        pass

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        names = parse_qs(url.query).get("name[]")
        registry = self.server.registry.restricted_registry(names) if names else self.server.registry
        encoder, content_type = choose_encoder(self.headers.get("Accept") or "")
        body = encoder(registry)
        gzipped = "gzip" in (self.headers.get("Accept-Encoding") or "")
        if gzipped:
            body = gzip.compress(body, compresslevel=1)
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        self.wfile.write(body)


class MetricsServer(BoundedHTTPServer):
    def __init__(self, address: tuple[str, int], registry: CollectorRegistry, limits: Limits) -> None:
        self.registry = registry
        super().__init__(address, _Handler, limits)


def serve_metrics(
    port: int, address: str, registry: CollectorRegistry = REGISTRY, limits: Limits = METRICS_LIMITS
) -> MetricsServer:
    """The endpoint on `address`:`port` (never implicitly on every interface), in a daemon thread."""
    server = MetricsServer((address, port), registry, limits)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
