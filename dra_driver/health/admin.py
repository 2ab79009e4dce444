"""The node daemon's local health admin endpoint: HTTP over a Unix socket, for operators (`dra-driver health`).

The socket (`<plugin dir>/health.sock`, mode 0600) is reachable only from inside the node daemon's container
(`kubectl exec`) or by root on the node; no TCP port, no Kubernetes credentials involved.

- ``GET /health``: the monitor's state as JSON: per device its taints and the incidents behind them, lost GPUs
  and GPUs that cannot be monitored.
- ``POST /health/clear`` with ``{"device": "<device name or GPU UUID>"}``: clear the XID/ECC incidents of that
  device (`HealthMonitor.clear`); answers ``{"device": ..., "cleared": n}``. A body that is not such an object is
  a 400, an unknown device a 404; neither changes anything.

Errors are ``{"error": "<message>"}`` with the status code. `request()` is the client side the CLI uses.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import secrets
import socket
import threading
from pathlib import Path
from typing import Any

from dra_driver.health.monitor import HealthMonitor, Incident, UnknownDeviceError
from dra_driver.httpserver import BoundedHandler, BoundedHTTPServer, Limits
from dra_driver.plugin.socket_identity import (
    DEFAULT_SOCKET_CHECK_INTERVAL_S,
    SocketId,
    SocketWatchdog,
    place_socket,
    remove_own_socket,
    serve_again_if_gone,
)
from dra_driver.slices.naming import gpu_device_name

log = logging.getLogger(__name__)

SOCKET_NAME = "health.sock"
MAX_BODY = 64 * 1024
# Root on the node only (mode 0600): an operator or two, and the requests' pace and size bounded all the same.
LIMITS = Limits(max_connections=8, request_timeout_s=10.0, idle_timeout_s=30.0)


def _tmp_name() -> str:
    """A private name to bind the socket under, beside its final path: unique per daemon (not the PID, 1 in every
    container), short (Unix socket paths have 107 bytes), hidden (a leading dot)."""
    return f".health-{secrets.token_hex(4)}.sock"


def health_report(monitor: HealthMonitor) -> dict[str, Any]:
    """What ``GET /health`` answers."""
    taints = monitor.taints()
    incidents = monitor.incidents()
    devices: dict[str, dict[str, Any]] = {}
    for name, ts in taints.items():
        devices[name] = {
            "taints": [t.to_api() for t in ts],
            "incidents": [_incident(i) for i in incidents if name in i.devices],
        }

    def gpu(uuid: str) -> dict[str, Any]:
        info = monitor.gpu_of(uuid)
        return {"uuid": uuid, "device": gpu_device_name(info.minor) if info is not None else ""}

    unmonitored_reasons = {i.gpu_uuid: i.value for i in incidents if i.kind == "unmonitored"}
    return {
        "driver": monitor.driver_name,
        "devices": devices,
        "lostGPUs": [gpu(u) for u in sorted(monitor.lost())],
        "unmonitoredGPUs": [
            {**gpu(u), "reason": unmonitored_reasons.get(u) or ""} for u in sorted(monitor.unmonitored())
        ],
    }


def _incident(i: Incident) -> dict[str, Any]:
    return {
        "kind": i.kind,
        "value": i.value,
        "effect": i.effect,
        "gpu": i.gpu_uuid,
        "since": i.time_added,
        "lastSeen": i.last_seen,
        "count": i.count,  # repeats of a cause are merged into one incident
        "clearable": i.clearable,
        "devices": sorted(i.devices),
    }


class _Handler(BoundedHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("health admin: " + format, *args)  # client_address is "" on a Unix socket

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, indent=1).encode() + b"\n"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/health":
            self._reply(404, {"error": f"no such endpoint: GET {self.path} (try GET /health)"})
            return
        self._reply(200, health_report(self.server.monitor))

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != "/health/clear":
            self._reply(404, {"error": f"no such endpoint: POST {self.path} (try POST /health/clear)"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            self._reply(400, {"error": f"a JSON body of at most {MAX_BODY} bytes, with its Content-Length"})
            return
        try:
            raw = self.read_body(length)
        except OSError:  # the deadline passed or the client left: nobody to answer
            self.close_connection = True
            return
        try:
            body = json.loads(raw or b"null")
        except ValueError as e:
            self._reply(400, {"error": f"the body is not JSON: {e}"})
            return
        device = body.get("device") if isinstance(body, dict) else None
        if not isinstance(device, str) or not device.strip():
            self._reply(400, {"error": 'expected a JSON object {"device": "<device name or GPU UUID>"}'})
            return
        try:
            cleared = self.server.monitor.clear(device.strip())
        except UnknownDeviceError as e:
            self._reply(404, {"error": str(e.args[0])})
            return
        self._reply(200, {"device": device.strip(), "cleared": cleared})


class _Server(BoundedHTTPServer):
    address_family = socket.AF_UNIX
    allow_reuse_address = False

    def __init__(self, path: str, monitor: HealthMonitor) -> None:
        self.monitor = monitor
        super().__init__(path, _Handler, LIMITS)


class HealthAdminServer:
    """Serves the admin endpoint on `socket_path` in a background thread, until `stop()` (which removes it).

    Two daemons may serve the same path for a while (the old and the new pod of a rolling update share the plugin
    directory): as the gRPC server does for its sockets (`dra_driver.plugin.grpc.server`), the socket is bound
    under a private temporary name (random: the PID is 1 in every container) and renamed into place, so the newer
    daemon atomically takes the path over, and `stop()` removes the file only if it is still the one this server
    bound (same device, inode and ctime), never the socket of the daemon that replaced it. Every
    ``socket_check_interval_s`` (None: never) the socket is bound again if its file is gone, as the kubelet's
    sockets are (`dra_driver.plugin.socket_identity.SocketWatchdog`)."""

    def __init__(
        self,
        monitor: HealthMonitor,
        socket_path: Path,
        socket_check_interval_s: float | None = DEFAULT_SOCKET_CHECK_INTERVAL_S,
    ) -> None:
        self.monitor = monitor
        self.socket_path = socket_path
        self._socket_check_interval_s = socket_check_interval_s
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._socket_id: SocketId | None = None
        self._watchdog: SocketWatchdog | None = None

    def _serve(self, *, replace: bool) -> None:
        """Serve on the socket path: replacing a socket there, or without ``replace`` only if nothing is there
        (FileExistsError). A server serving before (its socket deleted) stops; its open connections finish."""
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        # Bound under a temporary name, restricted, then moved: never reachable with a wider mode.
        tmp = self.socket_path.with_name(_tmp_name())
        server = _Server(str(tmp), self.monitor)
        try:
            os.chmod(tmp, 0o600)
            socket_id = place_socket(tmp, self.socket_path, replace=replace)
        except OSError:
            server.server_close()
            tmp.unlink(missing_ok=True)
            raise
        self._stop_server()
        self._server, self._socket_id = server, socket_id
        self._thread = threading.Thread(target=server.serve_forever, name="health-admin", daemon=True)
        self._thread.start()
        log.info("health admin endpoint on %s", self.socket_path)

    def start(self) -> None:
        with self._lock:
            self._serve(replace=True)
            if self._socket_check_interval_s:
                self._watchdog = SocketWatchdog("health-admin-watchdog", self._socket_check_interval_s, self._check)
                self._watchdog.start()

    def _check(self) -> None:
        with self._lock:
            if self._watchdog is not None and self._server is not None:
                serve_again_if_gone(self.socket_path, "the health admin endpoint", lambda: self._serve(replace=False))

    def _stop_server(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = None

    def stop(self) -> None:
        with self._lock:
            watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.stop()
        with self._lock:
            if self._server is None:
                return
            self._stop_server()
            ours, self._socket_id = self._socket_id, None
            remove_own_socket(self.socket_path, ours)


class AdminError(RuntimeError):
    """The admin endpoint cannot be reached, or answered an error."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self._path))
        except OSError:
            sock.close()
            raise
        self.sock = sock


def request(socket_path: Path, method: str, path: str, body: Any = None, timeout: float = 30.0) -> dict[str, Any]:
    """One request to the admin endpoint; its JSON answer, or `AdminError` with the server's message."""
    conn = _UnixConnection(socket_path, timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        except OSError as e:
            raise AdminError(f"cannot reach the node daemon's health endpoint at {socket_path}: {e}") from e
    finally:
        conn.close()
    try:
        answer = json.loads(raw)
    except ValueError as e:
        raise AdminError(f"{method} {path}: HTTP {response.status}, not JSON: {raw[:200]!r}") from e
    if response.status != 200:
        message = answer.get("error") if isinstance(answer, dict) else None
        raise AdminError(str(message or f"{method} {path}: HTTP {response.status}"))
    if not isinstance(answer, dict):
        raise AdminError(f"{method} {path}: expected a JSON object, got {answer!r}")
    return answer
