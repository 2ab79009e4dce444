"""`kubectl get ... -o json` answered in the test process, for `ControlPlane.kubectl_json`, and the connection and
resource names of `ControlPlane`'s other calls from the test process (`api_call`, and `apply`, `create`, `delete`
and `patch` in place of kubectl's).

Each kubectl run is a Go process that costs about 0.12 s of CPU before it asks anything (0.25 s for `apply`); the
tests poll the API server with `get` thousands of times a run, and on a 2-core machine those processes were a fifth
of all the CPU a run used. Here the same read is an HTTPS request on a kept-alive connection (about 2 ms), and the
answer is shaped as kubectl prints it: a single object as the server sends it, a list as kubectl's `List` with each
item's `apiVersion` and `kind`, `metadata.managedFields` dropped unless `--show-managed-fields`, an error as
kubectl's `Error from server (Reason): message` with exit status 1. Resource names resolve as kubectl resolves them
(plural, singular, short name or kind, optionally `.group`; the core group first, each group's preferred version),
from the server's discovery, read once and again when a name is unknown (a CRD installed since).

Anything else (another verb, an output other than JSON, several resources, a flag not handled here) is not
answered (`None`), and the caller runs kubectl. tests/test_apiget.py runs the same reads through both.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# kubectl get's flags handled here, each taking a value; any other flag makes the call kubectl's.
_VALUE_FLAGS = {
    "-n": "namespace",
    "--namespace": "namespace",
    "-l": "labelSelector",
    "--selector": "labelSelector",
    "--field-selector": "fieldSelector",
}
_ALL_NAMESPACES = ("-A", "--all-namespaces")
_MANAGED_FIELDS = "--show-managed-fields"
DEFAULT_NAMESPACE = "default"  # the test kubeconfig's context names none


@dataclass(frozen=True)
class Resource:
    group_version: str  # "v1", "apps/v1"
    plural: str
    kind: str
    namespaced: bool

    def path(self, namespace: str | None, name: str | None) -> str:
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        scope = f"/namespaces/{namespace}" if self.namespaced and namespace else ""
        return f"{base}{scope}/{self.plural}" + (f"/{urllib.parse.quote(name)}" if name else "")


class ApiError(Exception):
    """The server refused a read: kubectl's message and exit status for it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class GetRequest:
    resource: str
    name: str | None
    namespace: str | None  # None: all namespaces
    query: dict[str, str]
    managed_fields: bool


def parse_get(args: tuple[str, ...]) -> GetRequest | None:
    """The read `kubectl get <args> -o json` asks for, or None where these args are not handled here."""
    if not args or args[0] != "get":
        return None
    positional: list[str] = []
    namespace, all_namespaces = DEFAULT_NAMESPACE, False
    query: dict[str, str] = {}
    managed_fields = False
    output = None
    words = list(args[1:])
    while words:
        word = words.pop(0)
        flag, equals, value = word.partition("=")
        if equals and flag.startswith("--") and (flag in _VALUE_FLAGS or flag == "--output"):
            words[:0] = [flag, value]  # `--flag=value` as `--flag value`
            continue
        if word in ("-o", "--output"):
            if not words:
                return None
            output = words.pop(0)
        elif word in _VALUE_FLAGS:
            if not words:
                return None
            value = words.pop(0)
            if _VALUE_FLAGS[word] == "namespace":
                namespace = value
            else:
                query[_VALUE_FLAGS[word]] = value
        elif word in _ALL_NAMESPACES:
            all_namespaces = True
        elif word == _MANAGED_FIELDS:
            managed_fields = True
        elif word.startswith("-"):
            return None
        else:
            positional.append(word)
    if output != "json" or not 1 <= len(positional) <= 2 or "," in positional[0] or "/" in positional[0]:
        return None
    name = positional[1] if len(positional) == 2 else None
    if name is not None and all_namespaces:
        return None  # kubectl refuses a name with --all-namespaces
    return GetRequest(positional[0], name, None if all_namespaces else namespace, query, managed_fields)


class ApiReader:
    """GETs against one API server with the admin client certificate, one kept-alive connection per thread."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext) -> None:
        self._host, self._port, self._context = host, port, context
        self._local = threading.local()
        self._lock = threading.Lock()
        self._resources: list[tuple[str, Resource, tuple[str, ...]]] | None = None  # (group, resource, names)

    def _new_connection(self, timeout: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self._host, self._port, context=self._context, timeout=timeout)

    def _connection(self, timeout: float) -> http.client.HTTPSConnection:
        conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._new_connection(timeout)
            self._local.conn = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def request(
        self,
        path: str,
        query: dict[str, str] | None = None,
        timeout: float = 60.0,
        *,
        method: str = "GET",
        body: Any = None,
        content_type: str = "application/json",
        text: bool = False,
    ) -> tuple[int, Any]:
        """(HTTP status, the JSON answer, or with `text` the answer as text) of one call; `body` is sent as JSON."""
        url = path + ("?" + urllib.parse.urlencode(query) if query else "")
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), content_type
        # A read goes on the thread's kept-alive connection, and once more on a new one where that fails: the server
        # may have closed it meanwhile (stopped and started again on the same port, TLS EOF or a reset). A write
        # always takes a new connection, so that it is never sent twice.
        reuse = method == "GET"
        for attempt in (1, 2):
            fresh = not reuse or getattr(self._local, "conn", None) is None
            conn = self._connection(timeout) if reuse else self._new_connection(timeout)
            try:
                conn.request(method, url, body=data, headers=headers)
                resp = conn.getresponse()
                answer = resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                if reuse:
                    self._local.conn = None
                if fresh or attempt == 2:
                    raise
                continue
            except BaseException:
                conn.close()
                if reuse:
                    self._local.conn = None
                raise
            finally:
                if not reuse:
                    conn.close()
            if text:
                return resp.status, answer.decode(errors="replace")
            return resp.status, json.loads(answer) if answer else None
        raise AssertionError("unreachable")

    def _discover(self, timeout: float) -> list[tuple[str, Resource, tuple[str, ...]]]:
        found: list[tuple[str, Resource, tuple[str, ...]]] = []

        def add(group: str, group_version: str) -> None:
            status, listing = self.request(f"/api/{group_version}" if not group else f"/apis/{group_version}",
                                           timeout=timeout)  # fmt: skip
            if status != 200:
                return
            for r in listing.get("resources", []):
                if "/" in r["name"] or "get" not in r.get("verbs", []):
                    continue
                names = (r["name"], r.get("singularName") or "", r["kind"].lower(), *r.get("shortNames", []))
                found.append((group, Resource(group_version, r["name"], r["kind"], bool(r["namespaced"])), names))

        add("", "v1")
        status, groups = self.request("/apis", timeout=timeout)
        if status == 200:
            for g in groups.get("groups", []):
                add(g["name"], g["preferredVersion"]["groupVersion"])
        return found

    def _find(self, match: Callable[[str, Resource, tuple[str, ...]], bool], timeout: float) -> Resource | None:
        """The first discovered resource that `match(group, resource, names)` accepts; discovery is read again once
        where none does (a CRD installed since)."""
        for refresh in (False, True):
            with self._lock:
                if self._resources is None or refresh:
                    self._resources = self._discover(timeout)
                resources = self._resources
            for group, resource, names in resources:
                if match(group, resource, names):
                    return resource
        return None

    def resolve(self, name: str, timeout: float) -> Resource | None:
        """kubectl's resource for `name`: plural, singular, short name or kind, optionally suffixed by its group."""

        def named(group: str, _: Resource, names: tuple[str, ...]) -> bool:
            return any(c and name.lower() in (c, f"{c}.{group}" if group else c) for c in names)

        return self._find(named, timeout)

    def resource_of(self, api_version: str, kind: str, timeout: float = 60.0) -> Resource:
        """The resource that objects of `kind` in `api_version` are, at that version (discovery lists each group's
        preferred version; the plural and scope are the same in every version)."""
        group = api_version.rpartition("/")[0]
        found = self._find(lambda g, resource, _: g == group and resource.kind == kind, timeout)
        if found is None:
            raise ApiError(f'error: resource mapping not found for kind "{kind}" in version "{api_version}"')
        return Resource(api_version, found.plural, kind, found.namespaced)

    def get(self, args: tuple[str, ...], timeout: float = 60.0) -> Any | None:
        """`kubectl get <args>` as kubectl prints it with `-o json`; None where it is kubectl's to answer.
        Raises ApiError where kubectl would fail."""
        req = parse_get(args)
        if req is None:
            return None
        resource = self.resolve(req.resource, timeout)
        if resource is None:
            return None  # kubectl's "the server doesn't have a resource type" message is kubectl's to give
        status, body = self.request(resource.path(req.namespace, req.name), req.query, timeout)
        if status != 200:
            raise ApiError(server_error(body))
        if req.name is not None:
            return _as_kubectl_prints(body, req.managed_fields)
        typed = ({"apiVersion": resource.group_version, "kind": resource.kind, **i} for i in body.get("items", []))
        items = [_as_kubectl_prints(item, req.managed_fields) for item in typed]
        return {"apiVersion": "v1", "items": items, "kind": "List", "metadata": {"resourceVersion": ""}}


def server_error(body: Any) -> str:
    """kubectl's line for a call the server refused, from the Status it answered."""
    reason = body.get("reason", "Unknown") if isinstance(body, dict) else "Unknown"
    message = body.get("message", "") if isinstance(body, dict) else str(body)
    return f"Error from server ({reason}): {message}"


def _as_kubectl_prints(obj: dict[str, Any], managed_fields: bool) -> dict[str, Any]:
    if not managed_fields and "managedFields" in obj.get("metadata", {}):
        obj = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "managedFields"}}
    return obj
