"""A small Kubernetes REST client over urllib3: JSON in, JSON out, every request with a timeout.

Errors: an HTTP error status raises `ApiError` (with `status`, `reason` and `body`, as the official client's
ApiException has them); urllib3's errors (connection refused, timed out) pass through. A timed-out request is
never retried: a retry would start the timeout over (a GET timing out would take four times its timeout).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote, urlencode

import urllib3
from urllib3 import BaseHTTPResponse
from urllib3.connectionpool import ConnectionPool
from urllib3.exceptions import TimeoutError as Urllib3TimeoutError
from urllib3.util.retry import Retry

from dra_driver.kube.config import ClusterConfig, UnsupportedKubeconfig, from_api_client, in_cluster, load_kubeconfig

DEFAULT_TIMEOUT_S = 10.0
POOL_SIZE = 16  # connections kept per host: prepares of different claims read in parallel


class ApiError(Exception):
    def __init__(self, method: str, path: str, status: int, reason: str, body: str) -> None:
        self.status, self.reason, self.body = status, reason, body
        try:
            message = str(json.loads(body)["message"])
        except (ValueError, KeyError, TypeError):
            message = body.strip()[:500]
        self.message = message
        super().__init__(f"{method} {path}: {status} {reason}: {message}")


class _TimeoutsNotRetried(Retry):
    """urllib3's retries (connection errors), except after a timeout."""

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: BaseHTTPResponse | None = None,
        error: Exception | None = None,
        _pool: ConnectionPool | None = None,
        _stacktrace: TracebackType | None = None,
    ) -> Self:
        if isinstance(error, Urllib3TimeoutError):
            raise error
        return super().increment(method, url, response, error, _pool, _stacktrace)


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

    def __init__(self, response: BaseHTTPResponse, what: str) -> None:
        self._response = response
        self._what = what
        self._stopped = threading.Event()

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        buffer = b""
        ended = False  # the server ended the watch: the connection can serve the next request
        try:
            for chunk in self._response.stream(65536):
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
                self._response.release_conn()
            else:  # events left unread (or a shut-down socket): never hand this connection to another request
                self._response.close()

    def stop(self) -> None:
        self._stopped.set()
        # unblocks a read waiting for the next event; ValueError, RuntimeError: the response is done already
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            self._response.shutdown()


class KubeRest:
    def __init__(self, config: ClusterConfig, *, timeout: float = DEFAULT_TIMEOUT_S, pool_size: int = POOL_SIZE):
        self.config = config
        self.timeout = timeout
        self._pool = urllib3.PoolManager(
            num_pools=4, maxsize=pool_size, retries=_TimeoutsNotRetried(3), ssl_context=config.ssl_context
        )

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "dra-driver"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        auth = self.config.authorization()
        if auth:
            headers["Authorization"] = auth
        return headers

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        """The decoded JSON answer (None for an empty one). `timeout`: seconds for the whole request (default
        the client's); a zero or negative one is made a millisecond, never "no limit"."""
        url = self.config.server + path + ("?" + urlencode(query) if query else "")
        seconds = self.timeout if timeout is None else max(timeout, 0.001)
        response = self._pool.request(
            method,
            url,
            body=None if body is None else json.dumps(body).encode(),
            headers=self._headers(content_type if body is not None else None),
            timeout=urllib3.Timeout(total=seconds),
        )
        if response.status >= 400:
            raise ApiError(method, path, response.status, response.reason or "", response.data.decode(errors="replace"))
        return json.loads(response.data) if response.data else None

    def get(self, path: str, *, timeout: float | None = None, **query: Any) -> Any:
        return self.request("GET", path, query=query or None, timeout=timeout)

    def watch(self, path: str, *, resource_version: str = "", seconds: int = 300, **query: Any) -> Watch:
        """A watch the server ends after `seconds`; a read waits at most 30 s longer (a dead link)."""
        params: dict[str, Any] = {**query, "watch": "true", "timeoutSeconds": seconds, "allowWatchBookmarks": "false"}
        if resource_version:
            params["resourceVersion"] = resource_version
        response = self._pool.request(
            "GET",
            self.config.server + path + "?" + urlencode(params),
            headers=self._headers(None),
            timeout=urllib3.Timeout(connect=self.timeout, read=seconds + 30),
            preload_content=False,
        )
        if response.status >= 400:
            data = response.read().decode(errors="replace")
            response.release_conn()
            raise ApiError("WATCH", path, response.status, response.reason or "", data)
        return Watch(response, path)

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
