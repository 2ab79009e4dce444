"""Where the plugin reads ResourceClaims and DeviceClasses (`dra_driver.api` models): the API server, or a
stand-in in tests."""

from __future__ import annotations

from typing import Any, Protocol

from dra_driver.api import GROUP, VERSION
from dra_driver.api.claim import ResourceClaim
from dra_driver.api.deviceclass import DeviceClass
from dra_driver.claimstate.context import time_left
from dra_driver.kube.rest import as_rest, path_of

API_TIMEOUT_S = 10.0  # the longest one API read of a prepare may take, deadline or not


def read_timeout(deadline: float | None, limit: float = API_TIMEOUT_S) -> float:
    """The timeout of one API read: `limit`, shortened to end DEADLINE_MARGIN_S before `deadline` (a
    time.monotonic() value; None: no deadline). Zero or less: no time is left for a read."""
    if deadline is None:
        return limit
    return min(limit, time_left(deadline))


class ClaimSource(Protocol):
    """Where the plugin reads claims and classes: the API server, or a stand-in in tests."""

    def get_claim(self, namespace: str, name: str, *, timeout: float | None = None) -> ResourceClaim:
        """`timeout` (seconds) bounds this read; None: the source's own limit."""
        ...

    def get_device_class(self, name: str, *, timeout: float | None = None) -> DeviceClass: ...


class StaticClaimSource:
    """An in-memory stand-in for the API server (tests without a control plane)."""

    def __init__(self, claims: list[dict[str, Any]] | None = None, classes: list[dict[str, Any]] | None = None):
        self.claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims or []}
        self.classes = {c["metadata"]["name"]: c for c in classes or []}

    def get_claim(self, namespace: str, name: str, *, timeout: float | None = None) -> ResourceClaim:
        try:
            return ResourceClaim.model_validate(self.claims[(namespace, name)])
        except KeyError:
            raise LookupError(f"resourceclaims.resource.k8s.io {name!r} not found") from None

    def get_device_class(self, name: str, *, timeout: float | None = None) -> DeviceClass:
        try:
            return DeviceClass.model_validate(self.classes[name])
        except KeyError:
            raise LookupError(f"deviceclasses.resource.k8s.io {name!r} not found") from None


class KubeClaimSource:
    """Reads from the API server (resource.k8s.io/v1) through `dra_driver.kube`; `api` is a KubeRest or an
    official-client ApiClient. `request_timeout` (seconds) bounds each request (None: the client's limit), a
    per-read `timeout` can shorten it. A timed-out request is not retried."""

    def __init__(self, api: Any, request_timeout: float | None = None) -> None:
        self._rest = as_rest(api)
        self._request_timeout = request_timeout

    def _timeout(self, timeout: float | None) -> float | None:
        limits = [t for t in (timeout, self._request_timeout) if t is not None]
        return min(limits) if limits else None

    def get_claim(self, namespace: str, name: str, *, timeout: float | None = None) -> ResourceClaim:
        path = path_of(GROUP, VERSION, "resourceclaims", name, namespace)
        # parsed from the bytes by pydantic-core: no Python dicts of managedFields and the like built on the way
        return ResourceClaim.model_validate_json(self._rest.request_bytes("GET", path, timeout=self._timeout(timeout)))

    def get_device_class(self, name: str, *, timeout: float | None = None) -> DeviceClass:
        path = path_of(GROUP, VERSION, "deviceclasses", name)
        return DeviceClass.model_validate(self._rest.get(path, timeout=self._timeout(timeout)))

    def apply_claim_status(self, namespace: str, name: str, body: dict[str, Any], field_manager: str) -> None:
        """Server-side apply of `body` (a ResourceClaim apply configuration) to the claim's status subresource:
        only the fields `field_manager` applies are changed or owned; other writers' fields are left alone."""
        self._rest.request(
            "PATCH",
            path_of(GROUP, VERSION, "resourceclaims", name, namespace, "status"),
            query={"fieldManager": field_manager, "force": "true"},
            body=body,  # JSON is YAML
            content_type="application/apply-patch+yaml",
            timeout=self._timeout(None),
        )
