"""ResourceClaims and DeviceClasses as the plugin reads them from the API server.

Only the fields the plugin uses are modelled, leniently (unknown fields ignored): the API server already
validated these objects, and newer API versions add fields.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from dra_driver.claimstate.context import time_left
from dra_driver.kube.rest import as_rest, path_of

RESOURCE_GROUP, RESOURCE_VERSION = "resource.k8s.io", "v1"
API_TIMEOUT_S = 10.0  # the longest one API read of a prepare may take, deadline or not


def read_timeout(deadline: float | None, limit: float = API_TIMEOUT_S) -> float:
    """The timeout of one API read: `limit`, shortened to end DEADLINE_MARGIN_S before `deadline` (a
    time.monotonic() value; None: no deadline). Zero or less: no time is left for a read."""
    if deadline is None:
        return limit
    return min(limit, time_left(deadline))


class _Api(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class OpaqueConfig(_Api):
    driver: str
    parameters: dict[str, Any]


class AllocatedConfig(_Api):
    source: str  # FromClass | FromClaim
    requests: list[str] = Field(default_factory=list)
    opaque: OpaqueConfig | None = None


class DeviceResult(_Api):
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool | None = Field(default=None, alias="adminAccess")
    share_id: str | None = Field(default=None, alias="shareID")


class DeviceAllocation(_Api):
    results: list[DeviceResult] = Field(default_factory=list)
    config: list[AllocatedConfig] = Field(default_factory=list)


class Allocation(_Api):
    devices: DeviceAllocation = Field(default_factory=DeviceAllocation)


class CelSelector(_Api):
    expression: str


class Selector(_Api):
    cel: CelSelector | None = None


class SubRequest(_Api):
    name: str
    device_class_name: str = Field(alias="deviceClassName")
    selectors: list[Selector] = Field(default_factory=list)


class ExactRequest(_Api):
    device_class_name: str = Field(alias="deviceClassName")
    selectors: list[Selector] = Field(default_factory=list)


class Request(_Api):
    name: str
    exactly: ExactRequest | None = None
    first_available: list[SubRequest] = Field(default_factory=list, alias="firstAvailable")


class ClaimDevicesSpec(_Api):
    requests: list[Request] = Field(default_factory=list)


class ClaimSpec(_Api):
    devices: ClaimDevicesSpec = Field(default_factory=ClaimDevicesSpec)


class ConsumerReference(_Api):
    """An entry of status.reservedFor: who uses the claim (the scheduler reserves it for pods)."""

    api_group: str = Field(default="", alias="apiGroup")
    resource: str
    name: str
    uid: str = ""


class DeviceCondition(_Api):
    """A metav1.Condition of status.devices[].conditions."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: str = Field(default="", alias="lastTransitionTime")


class AllocatedDeviceStatus(_Api):
    """An entry of status.devices (list-map key: driver, pool, device, shareID)."""

    driver: str
    pool: str
    device: str
    share_id: str | None = Field(default=None, alias="shareID")
    conditions: list[DeviceCondition] = Field(default_factory=list)


class ClaimStatus(_Api):
    allocation: Allocation | None = None
    reserved_for: list[ConsumerReference] = Field(default_factory=list, alias="reservedFor")
    devices: list[AllocatedDeviceStatus] = Field(default_factory=list)

    def reserved_pods(self) -> list[str]:
        """Names of the pods the claim is reserved for (core group, resource "pods"), sorted."""
        return sorted({r.name for r in self.reserved_for if r.resource == "pods" and r.api_group == ""})


class Metadata(_Api):
    name: str
    namespace: str = ""
    uid: str = ""


class ResourceClaim(_Api):
    metadata: Metadata
    spec: ClaimSpec = Field(default_factory=ClaimSpec)
    status: ClaimStatus = Field(default_factory=ClaimStatus)

    def request_class_and_selectors(self, request_ref: str) -> tuple[str, list[str]]:
        """The device class and claim CEL selectors behind a result's `request` (`req` or `req/sub`)."""
        base, _, sub = request_ref.partition("/")
        for r in self.spec.devices.requests:
            if r.name != base:
                continue
            if sub:
                for s in r.first_available:
                    if s.name == sub:
                        return s.device_class_name, [x.cel.expression for x in s.selectors if x.cel]
            elif r.exactly is not None:
                return r.exactly.device_class_name, [x.cel.expression for x in r.exactly.selectors if x.cel]
        raise KeyError(f"claim {self.metadata.namespace}/{self.metadata.name} has no request {request_ref!r}")


class DeviceClassSpec(_Api):
    selectors: list[Selector] = Field(default_factory=list)


class DeviceClass(_Api):
    metadata: Metadata
    spec: DeviceClassSpec = Field(default_factory=DeviceClassSpec)

    @property
    def expressions(self) -> list[str]:
        return [s.cel.expression for s in self.spec.selectors if s.cel]


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
        path = path_of(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", name, namespace)
        # parsed from the bytes by pydantic-core: no Python dicts of managedFields and the like built on the way
        return ResourceClaim.model_validate_json(self._rest.request_bytes("GET", path, timeout=self._timeout(timeout)))

    def get_device_class(self, name: str, *, timeout: float | None = None) -> DeviceClass:
        path = path_of(RESOURCE_GROUP, RESOURCE_VERSION, "deviceclasses", name)
        return DeviceClass.model_validate(self._rest.get(path, timeout=self._timeout(timeout)))

    def apply_claim_status(self, namespace: str, name: str, body: dict[str, Any], field_manager: str) -> None:
        """Server-side apply of `body` (a ResourceClaim apply configuration) to the claim's status subresource:
        only the fields `field_manager` applies are changed or owned; other writers' fields are left alone."""
        self._rest.request(
            "PATCH",
            path_of(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", name, namespace, "status"),
            query={"fieldManager": field_manager, "force": "true"},
            body=body,  # JSON is YAML
            content_type="application/apply-patch+yaml",
            timeout=self._timeout(None),
        )
