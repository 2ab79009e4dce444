"""The node daemon's Prometheus endpoint on a `BoundedHTTPServer` (prometheus_client's own server gives every
connection a thread and a descriptor, with no limit and no timeout: a thousand idle connections made every prepare
fail with "Too many open files").

Serves the registry on any GET path, as prometheus_client does, in the format the scraper accepts (text or
OpenMetrics), gzipped when it asks for it, `name[]=` selecting metrics.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

from dra_driver.httpserver import BoundedHandler, BoundedHTTPServer, Limits

log = logging.getLogger(__name__)

METRICS_HANDOFF_SOCKET = "metrics-handoff.sock"  # in the plugin directory: SharedPortMetrics

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
    def __init__(
        self,
        address: tuple[str, int],
        registry: CollectorRegistry,
        limits: Limits,
        *,
        listener: socket.socket | None = None,
    ) -> None:
        self.registry = registry
        super().__init__(address, _Handler, limits, listener=listener)


def serve_metrics(
    port: int,
    address: str,
    registry: CollectorRegistry = REGISTRY,
    limits: Limits = METRICS_LIMITS,
    *,
    listener: socket.socket | None = None,
) -> MetricsServer:
    """The endpoint on `address`:`port` (never implicitly on every interface), in a daemon thread; on `listener`
    when given (a socket already listening there, handed over by another process)."""
    server = MetricsServer((address, port), registry, limits, listener=listener)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


class SharedPortMetrics:
    """The endpoint on a port of the node's network (hostNetwork), which the next pod of a rolling update serves
    beside this one without a gap.

    Two processes cannot both bind the port, and with SO_REUSEPORT each would get a queue of its own, whose waiting
    connections the kernel resets when the old one exits. So there is one listening socket, handed from pod to pod:
    the pod holding it answers on a Unix socket in the plugin directory (`handoff`) with the listener's descriptor
    (SCM_RIGHTS); the next pod takes it from there and serves the same queue, and when the old pod exits nothing
    waiting is lost. Nobody answering (the first pod, or one of a version before this), the pod binds the port
    itself, and while that is refused (the older pod still holds it) it tries again every second in the background:
    the kubelet plugin never waits for the metrics."""

    RETRY_S = 1.0
    HANDOFF_TIMEOUT_S = 2.0

    def __init__(self, port: int, address: str, handoff: Path, registry: CollectorRegistry = REGISTRY) -> None:
        self.port, self.address, self.handoff, self.registry = port, address, handoff, registry
        self.server: MetricsServer | None = None
        self.handed_over = False  # the listener came from the pod before
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._handoff_sock: socket.socket | None = None
        self._handoff_inode = 0

    def start(self) -> SharedPortMetrics:
        listener = self._take_over()
        if listener is not None:
            self.handed_over = True
            self._serve(listener)
        elif not self._bind():
            log.info("metrics port %s:%d held by a process that does not hand it over; binding once it is free",
                     self.address, self.port)  # fmt: skip
            self._thread(self._bind_when_free, "metrics-bind")
        return self

    def _bind(self) -> bool:
        """Bind the port and serve; False while another process holds it."""
        try:
            self._serve(None)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            return False
        return True

    def _thread(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _serve(self, listener: socket.socket | None) -> None:
        self.server = serve_metrics(self.port, self.address, self.registry, listener=listener)
        self._offer()

    def _take_over(self) -> socket.socket | None:
        """The listener of the pod serving now, or None when none answers or it is not ours to take."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(self.HANDOFF_TIMEOUT_S)
                conn.connect(str(self.handoff))
                _, fds, _, _ = socket.recv_fds(conn, 1, 1)
        except OSError:
            return None
        if not fds:
            return None
        listener = socket.socket(fileno=fds[0])
        try:
            here = listener.getsockname()
            ok = listener.type == socket.SOCK_STREAM and (here[0], here[1]) == (self.address, self.port)
        except OSError:
            ok = False
        if not ok:  # another address (a pod of its own network) or port: bind our own
            listener.close()
            return None
        return listener

    def _offer(self) -> None:
        """Answer the next pod on the handoff socket with this listener's descriptor."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            self.handoff.unlink()  # the pod before's (it has handed over already)
        sock.bind(str(self.handoff))
        self.handoff.chmod(0o600)
        self._handoff_inode = self.handoff.stat().st_ino
        sock.listen(4)
        sock.settimeout(1.0)
        self._handoff_sock = sock
        self._thread(self._answer, "metrics-handoff")

    def _answer(self) -> None:
        assert self._handoff_sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._handoff_sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                server = self.server
                if server is not None:
                    with contextlib.suppress(OSError):
                        conn.settimeout(self.HANDOFF_TIMEOUT_S)
                        socket.send_fds(conn, [b"L"], [server.socket.fileno()])
                        log.info("metrics listener handed to the next pod")

    def _bind_when_free(self) -> None:
        while not self._stop.wait(self.RETRY_S):
            try:
                if not self._bind():
                    continue
            except OSError as e:
                log.error("metrics endpoint %s:%d: %s", self.address, self.port, e)
                return
            log.info("metrics endpoint %s:%d serving", self.address, self.port)
            return

    def stop(self, wait_s: float = 2.0) -> None:
        """Stop accepting and let the requests under way finish (`wait_s`); the listener itself stays open in the
        pod it was handed to, if any, with whatever waits in its queue."""
        self._stop.set()
        if self._handoff_sock is not None:
            self._handoff_sock.close()
            with contextlib.suppress(OSError):  # unless the next pod has bound its own there meanwhile
                if self.handoff.stat().st_ino == self._handoff_inode:
                    self.handoff.unlink()
        for thread in self._threads:
            thread.join(timeout=5)
        server, self.server = self.server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            deadline = time.monotonic() + wait_s
            while server.connections() and time.monotonic() < deadline:
                time.sleep(0.02)
