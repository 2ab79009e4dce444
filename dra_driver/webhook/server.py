"""The webhook's HTTPS server (a `BoundedHTTPServer` with TLS: a thread per connection, their number, pace and
size bounded, see dra_driver.httpserver).

- ``POST /validate-resource-claim-parameters``: an AdmissionReview v1 (JSON) in, its response out (review.py).
  A body that is no AdmissionReview (or no JSON, or JSON that Python's parser refuses, such as an integer of more
  than 4300 digits) is a 400; a failure of our own a 500: the API server then applies the
  webhook's failurePolicy.
- ``GET /healthz``: 200 once the certificate is loaded (the readiness probe).
- ``GET /metrics``: Prometheus text (metrics.py).

The TLS handshake happens in the connection's thread, not in the accept loop, so a client that stalls its
handshake holds up only itself; the certificate is looked at for every connection and reloaded when it changed.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any, Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from dra_driver.httpserver import BoundedHandler, BoundedHTTPServer, Limits
from dra_driver.webhook.metrics import RESULT_ERROR, UNKNOWN_KIND, WebhookMetrics
from dra_driver.webhook.review import MalformedReview, judge
from dra_driver.webhook.tls import ReloadingContext

log = logging.getLogger(__name__)

REVIEW_PATH: Final = "/validate-resource-claim-parameters"
HEALTH_PATH: Final = "/healthz"
METRICS_PATH: Final = "/metrics"
DEFAULT_PORT: Final = 8443
# The API server takes request bodies of up to 3 MB, and an UPDATE's review carries the object and the old object.
MAX_BODY: Final = 6 * 1024 * 1024
# The handshake, then each request from its first byte to its body's last (the API server's timeoutSeconds is 10 by
# default, 30 at most: a request still arriving after that is answered to nobody); 60 s for a kept-alive connection
# to send its next; 64 connections (at most 6 MB of body each), 32 from one address (each API server has its own).
LIMITS: Final = Limits(max_connections=64, max_per_peer=32, request_timeout_s=10.0, idle_timeout_s=60.0)
SHUTDOWN_GRACE_S: Final = 5.0  # after SIGTERM: time for the Service to drop this pod before it stops answering


class _Handler(BoundedHandler):
    server: _HttpsServer
    server_version = "dra-driver-webhook"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.client_address[0], *args)

    def _reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, *, close: bool = False) -> None:
        self.close_connection = self.close_connection or close
        self._reply(status, json.dumps({"error": message}).encode() + b"\n")

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == HEALTH_PATH:
            self._reply(200, b"ok\n", "text/plain; charset=utf-8")
        elif path == METRICS_PATH:
            self._reply(200, generate_latest(self.server.metrics.registry), CONTENT_TYPE_LATEST)
        else:
            self._error(404, f"no such endpoint: GET {path} (GET {HEALTH_PATH}, GET {METRICS_PATH})")

    def do_POST(self) -> None:
        body = self._body()  # read first, even for a wrong path: a connection closed on unread data loses the answer
        if body is None:
            self.server.metrics.reviewed(UNKNOWN_KIND, RESULT_ERROR)
            return
        path = self.path.split("?", 1)[0]  # the API server adds ?timeout=10s
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if path != REVIEW_PATH:
            self._error(404, f"no such endpoint: POST {path} (POST {REVIEW_PATH})")
            return
        if content_type != "application/json":
            self.server.metrics.reviewed(UNKNOWN_KIND, RESULT_ERROR)
            self._error(415, f"Content-Type {content_type or '(none)'}: expected application/json")
            return
        try:
            # ValueError: not JSON, or JSON Python's parser refuses (an integer of more than 4300 digits)
            verdict = judge(_parse(body), self.server.driver)
        except MalformedReview as e:
            self.server.metrics.reviewed(UNKNOWN_KIND, RESULT_ERROR)
            log.warning("bad review from %s: %s", self.client_address[0], e)
            self._error(400, str(e))
            return
        except Exception:  # a bug of ours: the API server applies failurePolicy
            self.server.metrics.reviewed(UNKNOWN_KIND, RESULT_ERROR)
            log.exception("review from %s failed", self.client_address[0])
            self._error(500, "internal error while reviewing; see the webhook's log")
            return
        self.server.metrics.reviewed(verdict.kind, verdict.result)
        if verdict.allowed:
            log.debug("allowed %s %s (%s)", verdict.kind, verdict.subject, verdict.uid)
        else:
            log.info("denied %s %s (%s): %s", verdict.kind, verdict.subject, verdict.uid, verdict.message)
        self._reply(200, json.dumps(verdict.response()).encode())

    def _body(self) -> bytes | None:
        """The request body, or None after answering why not (the connection is closed then)."""
        if self.headers.get("Transfer-Encoding") or self.headers.get("Content-Length") is None:
            self._error(411, "a Content-Length is required (no chunked bodies)", close=True)
            return None
        try:
            length = int(self.headers["Content-Length"])
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            declared = self.headers["Content-Length"]
            self._error(413, f"the body must be 0 to {MAX_BODY} bytes, not {declared}", close=True)
            return None
        try:
            return self.read_body(length)  # by the request's deadline: no slow drip
        except TimeoutError:
            timeout = self.server.limits.request_timeout_s
            self._error(408, f"the request did not arrive within {timeout:g} s", close=True)
        except OSError:
            self.close_connection = True  # the client went away mid-body: nobody to answer
        return None


def _parse(body: bytes) -> Any:
    """The body as JSON; MalformedReview saying why not (ValueError covers what Python's parser refuses beyond
    JSON's grammar: integers of more than 4300 digits)."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise MalformedReview(f"the body is not JSON this webhook can read: {e}") from None


class _HttpsServer(BoundedHTTPServer):
    def __init__(
        self, address: tuple[str, int], tls: ReloadingContext, driver: str, metrics: WebhookMetrics, limits: Limits
    ) -> None:
        self.tls, self.driver, self.metrics = tls, driver, metrics
        super().__init__(address, _Handler, limits)

    def wrap(self, request: socket.socket) -> socket.socket | None:
        try:  # in the connection's thread, by the request timeout set on it
            return self.tls.current().wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:  # a port scan, a client that does not trust us, a stalled handshake
            log.debug("TLS handshake failed: %s", e)
            return None


class WebhookServer:
    """The server on `address`:`port` (port 0: a free one, see `.port`), in a thread of its own from `start()`."""

    def __init__(
        self,
        driver: str,
        cert: Path,
        key: Path,
        *,
        address: str = "0.0.0.0",
        port: int = DEFAULT_PORT,
        registry: CollectorRegistry | None = None,
        limits: Limits = LIMITS,
    ) -> None:
        tls = ReloadingContext(cert, key)
        self._server = _HttpsServer((address, port), tls, driver, WebhookMetrics.for_registry(registry), limits)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> WebhookServer:
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self._server.server_close()


def run(driver: str, cert: Path, key: Path, address: str, port: int, grace_s: float = SHUTDOWN_GRACE_S) -> None:
    """Serve until SIGTERM or SIGINT, then for `grace_s` more (the pod's endpoint is being removed meanwhile)."""
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    server = WebhookServer(driver, cert, key, address=address, port=port).start()
    log.info("validating %s configs on https://%s:%d%s", driver, address, server.port, REVIEW_PATH)
    while not stopping.wait(1.0):
        pass
    log.info("stopping in %g s", grace_s)
    time.sleep(grace_s)
    server.stop()
