"""resource.k8s.io/v1 ResourceSlice, as far as this driver writes it. Dumps to the API's JSON shape."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

API_VERSION = "resource.k8s.io/v1"


class _ApiModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_api(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)

    def to_api_json(self) -> bytes:
        """`to_api` as compact JSON (json.loads of it equals `to_api()`), encoded by pydantic-core."""
        return self.model_dump_json(by_alias=True, exclude_none=True).encode()


class DeviceAttribute(_ApiModel):
    int_: int | None = Field(default=None, alias="int")
    bool_: bool | None = Field(default=None, alias="bool")
    string: str | None = None
    version: str | None = None

    def value(self) -> object:
        for v in (self.int_, self.bool_, self.string, self.version):
            if v is not None:
                return v
        raise ValueError("empty attribute")


class CapacityRange(_ApiModel):
    min: str
    max: str | None = None
    step: str | None = None


class CapacityRequestPolicy(_ApiModel):
    default: str | None = None
    valid_range: CapacityRange | None = None


class DeviceCapacity(_ApiModel):
    value: str
    request_policy: CapacityRequestPolicy | None = None  # only with allowMultipleAllocations (consumable capacity)


class Counter(_ApiModel):
    value: str


class CounterSet(_ApiModel):
    name: str
    counters: dict[str, Counter]


class DeviceCounterConsumption(_ApiModel):
    counter_set: str
    counters: dict[str, Counter]


class DeviceTaint(_ApiModel):
    key: str
    value: str | None = None
    effect: Literal["None", "NoSchedule", "NoExecute"]
    time_added: str | None = None


class Device(_ApiModel):
    name: str
    attributes: dict[str, DeviceAttribute] = {}
    capacity: dict[str, DeviceCapacity] = {}
    consumes_counters: list[DeviceCounterConsumption] | None = None
    taints: list[DeviceTaint] | None = None
    allow_multiple_allocations: bool | None = None


class ResourcePool(_ApiModel):
    name: str
    generation: int
    resource_slice_count: int


class OwnerReference(_ApiModel):
    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None


class ObjectMeta(_ApiModel):
    name: str
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: list[OwnerReference] | None = None


class ResourceSliceSpec(_ApiModel):
    driver: str
    pool: ResourcePool
    node_name: str | None = None
    devices: list[Device] | None = None
    shared_counters: list[CounterSet] | None = None


class ResourceSlice(_ApiModel):
    api_version: Literal["resource.k8s.io/v1"] = "resource.k8s.io/v1"
    kind: Literal["ResourceSlice"] = "ResourceSlice"
    metadata: ObjectMeta
    spec: ResourceSliceSpec
