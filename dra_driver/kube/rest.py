"""A small Kubernetes REST client over HTTP/1.1 connections of its own (`http1`): JSON in, JSON out, every request
with a deadline for all of it, keep-alive connections reused.

Errors: an HTTP error status raises `ApiError` (with `status`, `reason` and `body`, as the official client's
ApiException has them); connection errors (`ConnectionError`, `OSError`) and timeouts (`TimeoutError`, "timed out")
pass through. A timed-out request is never retried: a retry would start the timeout over. A request that fails on a
reused connection (the server closed it while idle) is sent once more on a new one when that is safe: an idempotent
method, or a request that never got out. A 401 has the configuration re-read its credentials (a rotated token) and,
when they changed, the request is sent once more. urllib3, then http.client, did the same with more CPU per request,
most of it their own bookkeeping and header parsing, on every prepare.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from dra_driver.kube.config import ClusterConfig, UnsupportedKubeconfig, from_api_client, in_cluster, load_kubeconfig
from dra_driver.kube.dial import remaining
from dra_driver.kube.http1 import Connection, Response

DEFAULT_TIMEOUT_S = 10.0
POOL_SIZE = 16  # idle connections kept: prepares of different claims read in parallel
WATCH_SLACK_S = 30.0  # how long after its timeoutSeconds a watch may last: the server ends it, or the link is dead
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})


class ApiError(Exception):
    def __init__(self, method: str, path: str, status: int, reason: str, body: str) -> None:
        self.status, self.reason, self.body = status, reason, body
        try:
            message = str(json.loads(body)["message"])
        except (ValueError, KeyError, TypeError):
            message = body.strip()[:500]
        self.message = message
        super().__init__(f"{method} {path}: {status} {reason}: {message}")


def _closed_by_peer(sock: socket.socket) -> bool:
    """An idle keep-alive connection has nothing to read unless the server closed it (or broke the protocol)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class _Connections:
    """Keep-alive connections to one server: at most `size` idle ones kept, the latest reused first, and one the
    server closed while it was idle (its idle timeout, a restart) dropped before use."""

    def __init__(self, config: ClusterConfig, timeout: float, size: int) -> None:
        url = urlsplit(config.server)
        https = url.scheme == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if https else 80)
        self._context = config.ssl_context if https else None
        self._server_name = config.tls_server_name
        self._proxy = config.proxy
        self._timeout = timeout
        self._size = size
        self._idle: list[Connection] = []
        self._lock = threading.Lock()

    def new(self) -> Connection:
        return Connection(self._host, self._port, context=self._context, timeout=self._timeout,
                          server_name=self._server_name, proxy=self._proxy)  # fmt: skip

    def take(self) -> tuple[Connection, bool]:
        """A connection (True: a reused one)."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self.new(), False
            if conn.sock is not None and not conn.buffer and not _closed_by_peer(conn.sock):
                return conn, True
            conn.close()

    def give_back(self, conn: Connection, response: Response) -> None:
        """After `response` was read to its end."""
        if not response.will_close and response.complete and conn.sock is not None:
            with self._lock:
                if len(self._idle) < self._size:
                    self._idle.append(conn)
                    return
        conn.close()


def path_of(group: str, version: str, plural: str, name: str = "", namespace: str = "", sub: str = "") -> str:
    """The REST path of a resource (group "" is the core API)."""
    parts = ["/api/" + version if not group else f"/apis/{group}/{version}"]
    if namespace:
        parts.append(f"namespaces/{quote(namespace, safe='')}")
    parts.append(plural)
    if name:
        parts.append(quote(name, safe=""))
    if sub:
        parts.append(sub)
    return "/".join(parts)


class Watch:
    """The events of one watch request; `stop()` (from another thread) ends the iteration at once."""

    def __init__(self, connections: _Connections, conn: Connection, response: Response, what: str) -> None:
        self._connections = connections
        self._conn = conn
        self._response = response
        self._what = what
        self._stopped = threading.Event()

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        buffer = b""
        ended = False  # the server ended the watch: the connection can serve the next request
        try:
            while chunk := self._response.read1(65536):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind, obj = str(event["type"]), event["object"]
                    if kind == "ERROR":  # e.g. 410 Gone: the resourceVersion is too old
                        raise ApiError("WATCH", self._what, int(obj.get("code", 0)), "", json.dumps(obj))
                    yield kind, obj
                if self._stopped.is_set():
                    return
            ended = not self._stopped.is_set()
        except Exception:
            if self._stopped.is_set():
                return  # the socket was shut down under the read
            raise
        finally:
            if ended:
                self._connections.give_back(self._conn, self._response)
            else:  # events left unread (or a shut-down socket): never hand this connection to another request
                self._conn.close()

    def stop(self) -> None:
        self._stopped.set()
        sock = self._conn.sock
        if sock is not None:  # unblocks a read waiting for the next event
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class KubeRest:
    def __init__(self, config: ClusterConfig, *, timeout: float = DEFAULT_TIMEOUT_S, pool_size: int = POOL_SIZE):
        self.config = config
        self.timeout = timeout
        self._connections = _Connections(config, timeout, pool_size)
        self._prefix = urlsplit(config.server).path.rstrip("/")  # a server URL may have a path
        self._extra: Sequence[tuple[str, str]] = config.headers

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "dra-driver"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        auth = self.config.authorization()
        if auth:
            headers["Authorization"] = auth
        return headers

    def _exchange(
        self, method: str, target: str, body: bytes | None, content_type: str | None, deadline: float
    ) -> tuple[Connection, Response]:
        """The response's status and headers read, its body not yet; a 401 has the credentials read again and,
        when they differ from those sent (read again by another request maybe), the request sent once more."""
        headers = self._headers(content_type)
        conn, response = self._send(method, target, body, headers, deadline)
        if response.status != 401:
            return conn, response
        self.config.reauthorize()
        fresh = self._headers(content_type)
        if fresh.get("Authorization") == headers.get("Authorization"):
            return conn, response
        self._body(conn, response)  # a 401 means the server did nothing: safe to send again, even a POST
        return self._send(method, target, body, fresh, deadline)

    def _body(self, conn: Connection, response: Response) -> bytes:
        try:
            data = response.read()
        except BaseException:
            conn.close()
            raise
        self._connections.give_back(conn, response)
        return data

    def _send(
        self, method: str, target: str, body: bytes | None, headers: dict[str, str], deadline: float
    ) -> tuple[Connection, Response]:
        remaining(deadline)
        conn, reused = self._connections.take()
        while True:
            sent = False
            try:
                conn.request(method, self._prefix + target, body, headers, extra=self._extra, deadline=deadline)
                sent = True
                return conn, conn.getresponse(method)
            except ConnectionError:  # reset, broken pipe, closed without an answer (a timeout is not one)
                conn.close()
                if not reused or (sent and method not in _IDEMPOTENT):
                    raise
            except BaseException:
                conn.close()
                raise
            # the server closed the reused connection: once more on a new one
            conn, reused = self._connections.new(), False

    def request(self, method: str, path: str, **options: Any) -> Any:
        """The decoded JSON answer (None for an empty one); `options` as `request_bytes` takes them."""
        data = self.request_bytes(method, path, **options)
        return json.loads(data) if data else None

    def request_bytes(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> bytes:
        """The answer's body, undecoded (a model parses it itself: pydantic-core). `timeout`: seconds for the whole
        request (default the client's); a zero or negative one is made a millisecond, never "no limit"."""
        target = path + ("?" + urlencode(query) if query else "")
        deadline = time.monotonic() + (self.timeout if timeout is None else max(timeout, 0.001))
        payload = None if body is None else json.dumps(body).encode()
        conn, response = self._exchange(method, target, payload, content_type if body is not None else None, deadline)
        data = self._body(conn, response)
        if response.status >= 400:
            raise ApiError(method, path, response.status, response.reason or "", data.decode(errors="replace"))
        return data

    def get(self, path: str, *, timeout: float | None = None, **query: Any) -> Any:
        return self.request("GET", path, query=query or None, timeout=timeout)

    def watch(self, path: str, *, resource_version: str = "", seconds: int = 300, **query: Any) -> Watch:
        """A watch the server ends after `seconds`; its head comes within the client's timeout, its events end
        WATCH_SLACK_S after `seconds` at the latest."""
        params: dict[str, Any] = {**query, "watch": "true", "timeoutSeconds": seconds, "allowWatchBookmarks": "false"}
        if resource_version:
            params["resourceVersion"] = resource_version
        conn, response = self._exchange("GET", path + "?" + urlencode(params), None, None,
                                        time.monotonic() + self.timeout)  # fmt: skip
        if response.status >= 400:
            data = self._body(conn, response).decode(errors="replace")
            raise ApiError("WATCH", path, response.status, response.reason or "", data)
        conn.deadline = time.monotonic() + seconds + WATCH_SLACK_S
        return Watch(self._connections, conn, response, path)

    def version(self, *, timeout: float | None = None) -> str:
        """`1.<minor>` of the API server."""
        info = self.get("/version", timeout=timeout)
        return f"{info['major']}.{str(info['minor']).rstrip('+')}"


def as_rest(api: Any) -> KubeRest:
    """`api` if it is a KubeRest already, else one with the configuration of an official-client ApiClient (its
    authentication included: exec plugins and other token sources refresh through the client's hook)."""
    if isinstance(api, KubeRest):
        return api
    return KubeRest(from_api_client(api))


def connect(kubeconfig: Path | None = None) -> KubeRest:
    """The API server of `kubeconfig`, or the pod's service account when None."""
    if kubeconfig is None:
        return KubeRest(in_cluster())
    try:
        return KubeRest(load_kubeconfig(kubeconfig))
    except UnsupportedKubeconfig:
        from kubernetes import config

        return as_rest(config.new_client_from_config(config_file=str(kubeconfig)))  # type: ignore[no-untyped-call]
