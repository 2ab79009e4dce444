"""ResourceClaim: what it asks for (spec) and what it was given (status.allocation), who uses it (reservedFor)
and how its devices are (status.devices). The plugin reads claims from the API server, the allocator from files
or a cluster, and writes `status.allocation` (`AllocationResult.to_api`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from dra_driver.api.deviceclass import DeviceSelector, OpaqueConfig
from dra_driver.api.meta import ApiModel, ObjectMeta


class Toleration(ApiModel):
    """DeviceToleration. `operator`: Equal (also when empty) or Exists."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None


class CapacityRequirements(ApiModel):
    requests: dict[str, str] = Field(default_factory=dict)


class DeviceSubRequest(ApiModel):
    """A subrequest of `firstAvailable`; also the shape of `exactly` (which has no name, and has adminAccess).
    `allocationMode`: ExactCount or All.

    The names default to "" (the plugin's model required them, the allocator's did not): the API server stores
    no request without a class, and the allocator refuses one from a file as the scheduler does, with its message.
    """

    name: str = ""
    device_class_name: str = ""
    selectors: list[DeviceSelector] = Field(default_factory=list)
    allocation_mode: str = "ExactCount"
    count: int | None = None
    tolerations: list[Toleration] = Field(default_factory=list)
    capacity: CapacityRequirements | None = None
    admin_access: bool | None = None

    @property
    def wanted(self) -> int:
        return 1 if self.count is None else self.count

    @property
    def expressions(self) -> list[str]:
        """The request's CEL selectors."""
        return [s.cel.expression for s in self.selectors if s.cel]


class DeviceRequest(ApiModel):
    name: str
    exactly: DeviceSubRequest | None = None
    first_available: list[DeviceSubRequest] = Field(default_factory=list)


class DeviceConstraint(ApiModel):
    requests: list[str] = Field(default_factory=list)
    match_attribute: str | None = None
    distinct_attribute: str | None = None


class DeviceClaimConfiguration(ApiModel):
    requests: list[str] = Field(default_factory=list)
    opaque: OpaqueConfig | None = None


class DeviceClaim(ApiModel):
    requests: list[DeviceRequest] = Field(default_factory=list)
    constraints: list[DeviceConstraint] = Field(default_factory=list)
    config: list[DeviceClaimConfiguration] = Field(default_factory=list)


class ResourceClaimSpec(ApiModel):
    devices: DeviceClaim = Field(default_factory=DeviceClaim)


# ---- status -------------------------------------------------------------------------------------------------


class DeviceRequestAllocationResult(ApiModel):
    request: str  # `req`, or `req/sub` for a subrequest of firstAvailable
    driver: str
    pool: str
    device: str
    admin_access: bool | None = None
    tolerations: list[Toleration] | None = None
    share_id: str | None = Field(default=None, alias="shareID")
    consumed_capacity: dict[str, str] | None = None
    binding_conditions: list[str] | None = None
    binding_failure_conditions: list[str] | None = None


class DeviceAllocationConfiguration(ApiModel):
    source: str  # FromClass | FromClaim
    requests: list[str] = Field(default_factory=list)
    opaque: OpaqueConfig | None = None


class DeviceAllocationResult(ApiModel):
    results: list[DeviceRequestAllocationResult] = Field(default_factory=list)
    config: list[DeviceAllocationConfiguration] = Field(default_factory=list)


class AllocationResult(ApiModel):
    devices: DeviceAllocationResult = Field(default_factory=DeviceAllocationResult)
    node_selector: dict[str, Any] | None = None
    allocation_timestamp: str | None = None

    def to_api(self) -> dict[str, Any]:
        """The JSON the API holds in `status.allocation` (empty lists and unset fields omitted)."""
        out: dict[str, Any] = self.model_dump(by_alias=True, exclude_none=True, mode="json")
        devices = out["devices"]
        for result in devices["results"]:
            for tol in result.get("tolerations", []):
                for key in ("key", "value", "effect"):
                    if tol.get(key) == "":
                        del tol[key]
        for cfg in devices["config"]:
            if not cfg["requests"]:
                del cfg["requests"]
        if not devices["config"]:
            del devices["config"]
        return out


class ResourceClaimConsumerReference(ApiModel):
    """An entry of status.reservedFor: who uses the claim (the scheduler reserves it for pods)."""

    api_group: str = ""
    resource: str
    name: str
    uid: str = ""


class DeviceCondition(ApiModel):
    """A metav1.Condition of status.devices[].conditions."""

    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""


class AllocatedDeviceStatus(ApiModel):
    """An entry of status.devices (list-map key: driver, pool, device, shareID)."""

    driver: str
    pool: str
    device: str
    share_id: str | None = Field(default=None, alias="shareID")
    conditions: list[DeviceCondition] = Field(default_factory=list)
    data: dict[str, Any] | None = None  # the driver's own description of the device (any JSON object)


class ResourceClaimStatus(ApiModel):
    allocation: AllocationResult | None = None
    reserved_for: list[ResourceClaimConsumerReference] = Field(default_factory=list)
    devices: list[AllocatedDeviceStatus] = Field(default_factory=list)

    def reserved_pods(self) -> list[str]:
        """Names of the pods the claim is reserved for (core group, resource "pods"), sorted."""
        return sorted({r.name for r in self.reserved_for if r.resource == "pods" and r.api_group == ""})


class ResourceClaim(ApiModel):
    metadata: ObjectMeta
    spec: ResourceClaimSpec = Field(default_factory=ResourceClaimSpec)
    status: ResourceClaimStatus = Field(default_factory=ResourceClaimStatus)

    @property
    def key(self) -> str:
        """`namespace/name`, as klog.KObj prints it."""
        return f"{self.metadata.namespace}/{self.metadata.name}" if self.metadata.namespace else self.metadata.name

    def request_class_and_selectors(self, request_ref: str) -> tuple[str, list[str]]:
        """The device class and claim CEL selectors behind a result's `request` (`req` or `req/sub`)."""
        base, _, sub = request_ref.partition("/")
        for r in self.spec.devices.requests:
            if r.name != base:
                continue
            if sub:
                for s in r.first_available:
                    if s.name == sub:
                        return s.device_class_name, s.expressions
            elif r.exactly is not None:
                return r.exactly.device_class_name, r.exactly.expressions
        raise KeyError(f"claim {self.metadata.namespace}/{self.metadata.name} has no request {request_ref!r}")
