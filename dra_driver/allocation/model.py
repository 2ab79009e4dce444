"""Pydantic models at the allocator's edges: the parts of DeviceClass/ResourceClaim it reads, and the
`status.allocation` it writes (field names as the API spells them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Api(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class CelSelector(_Api):
    expression: str


class DeviceSelector(_Api):
    cel: CelSelector | None = None


class OpaqueConfig(_Api):
    driver: str
    parameters: Any = None


class DeviceClassConfig(_Api):
    opaque: OpaqueConfig | None = None


class DeviceClassSpec(_Api):
    selectors: list[DeviceSelector] = Field(default_factory=list)
    config: list[DeviceClassConfig] = Field(default_factory=list)


class ObjectMeta(_Api):
    name: str = ""
    namespace: str = ""


class DeviceClass(_Api):
    metadata: ObjectMeta
    spec: DeviceClassSpec = Field(default_factory=DeviceClassSpec)


class Toleration(_Api):
    key: str = ""
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds")


class CapacityRequirements(_Api):
    requests: dict[str, str] = Field(default_factory=dict)


class DeviceSubRequest(_Api):
    """A subrequest of `firstAvailable`; also the shape of `exactly` (plus adminAccess)."""

    name: str = ""
    device_class_name: str = Field(default="", alias="deviceClassName")
    selectors: list[DeviceSelector] = Field(default_factory=list)
    allocation_mode: Literal["ExactCount", "All"] = Field(default="ExactCount", alias="allocationMode")
    count: int | None = None
    tolerations: list[Toleration] = Field(default_factory=list)
    capacity: CapacityRequirements | None = None
    admin_access: bool | None = Field(default=None, alias="adminAccess")

    @property
    def wanted(self) -> int:
        return 1 if self.count is None else self.count


class DeviceRequest(_Api):
    name: str
    exactly: DeviceSubRequest | None = None
    first_available: list[DeviceSubRequest] = Field(default_factory=list, alias="firstAvailable")


class DeviceConstraint(_Api):
    requests: list[str] = Field(default_factory=list)
    match_attribute: str | None = Field(default=None, alias="matchAttribute")
    distinct_attribute: str | None = Field(default=None, alias="distinctAttribute")


class DeviceClaimConfig(_Api):
    requests: list[str] = Field(default_factory=list)
    opaque: OpaqueConfig | None = None


class DeviceClaim(_Api):
    requests: list[DeviceRequest] = Field(default_factory=list)
    constraints: list[DeviceConstraint] = Field(default_factory=list)
    config: list[DeviceClaimConfig] = Field(default_factory=list)


class ResourceClaimSpec(_Api):
    devices: DeviceClaim = Field(default_factory=DeviceClaim)


class ResourceClaim(_Api):
    metadata: ObjectMeta
    spec: ResourceClaimSpec = Field(default_factory=ResourceClaimSpec)
    status: dict[str, Any] = Field(default_factory=dict)

    @property
    def key(self) -> str:
        """`namespace/name`, as klog.KObj prints it."""
        return f"{self.metadata.namespace}/{self.metadata.name}" if self.metadata.namespace else self.metadata.name


# ---- results -------------------------------------------------------------------------------------------------


class DeviceRequestAllocationResult(_Api):
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool | None = Field(default=None, alias="adminAccess")
    tolerations: list[Toleration] | None = None
    share_id: str | None = Field(default=None, alias="shareID")
    consumed_capacity: dict[str, str] | None = Field(default=None, alias="consumedCapacity")


class DeviceAllocationConfiguration(_Api):
    source: Literal["FromClass", "FromClaim"]
    requests: list[str] = Field(default_factory=list)
    opaque: OpaqueConfig | None = None


class DeviceAllocationResult(_Api):
    results: list[DeviceRequestAllocationResult] = Field(default_factory=list)
    config: list[DeviceAllocationConfiguration] = Field(default_factory=list)


class AllocationResult(_Api):
    devices: DeviceAllocationResult = Field(default_factory=DeviceAllocationResult)
    node_selector: dict[str, Any] | None = Field(default=None, alias="nodeSelector")
    allocation_timestamp: str | None = Field(default=None, alias="allocationTimestamp")

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
