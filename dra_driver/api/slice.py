"""ResourceSlice, as far as this driver writes it. Dumps to the API's JSON shape."""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import ConfigDict, Field

from dra_driver.api import API_VERSION
from dra_driver.api.meta import ApiModel, ObjectMeta


class _Written(ApiModel):
    # Only built here, never read: an unknown field is a mistake of the builder (ObjectMeta, which claims and
    # classes share, is lenient).
    model_config = ConfigDict(extra="forbid")

    def to_api(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)

    def to_api_json(self) -> bytes:
        """`to_api` as compact JSON (json.loads of it equals `to_api()`), encoded by pydantic-core."""
        return self.model_dump_json(by_alias=True, exclude_none=True).encode()


# DeviceAttribute's list fields as the API spells them (DRAListTypeAttributes)
LIST_KINDS: Final = ("ints", "bools", "strings", "versions")


class DeviceAttribute(_Written):
    int_: int | None = Field(default=None, alias="int")
    bool_: bool | None = Field(default=None, alias="bool")
    string: str | None = None
    version: str | None = None
    # List values (DRAListTypeAttributes: alpha from 1.36, off by default): an API server without the gate drops
    # them, and the attribute left without a value is rejected.
    ints: list[int] | None = None
    bools: list[bool] | None = None
    strings: list[str] | None = None
    versions: list[str] | None = None

    def value(self) -> object:
        for v in (self.int_, self.bool_, self.string, self.version, self.ints, self.bools, self.strings, self.versions):
            if v is not None:
                return v
        raise ValueError("empty attribute")

    @property
    def is_list(self) -> bool:
        return any(v is not None for v in (self.ints, self.bools, self.strings, self.versions))

    def elements(self) -> list[object]:
        """The attribute's values: a list's items, or the one scalar (what the API server counts against
        ResourceSliceMaxAttributeValuesPerDevice)."""
        value = self.value()
        return list(value) if isinstance(value, list) else [value]


class CapacityRange(_Written):
    min: str
    max: str | None = None
    step: str | None = None


class CapacityRequestPolicy(_Written):
    default: str | None = None
    valid_range: CapacityRange | None = None


class DeviceCapacity(_Written):
    value: str
    request_policy: CapacityRequestPolicy | None = None  # only with allowMultipleAllocations (consumable capacity)


class Counter(_Written):
    value: str


class CounterSet(_Written):
    name: str
    counters: dict[str, Counter]


class DeviceCounterConsumption(_Written):
    counter_set: str
    counters: dict[str, Counter]


class DeviceTaint(_Written):
    key: str
    value: str | None = None
    effect: Literal["None", "NoSchedule", "NoExecute"]
    time_added: str | None = None


class Device(_Written):
    name: str
    attributes: dict[str, DeviceAttribute] = {}
    capacity: dict[str, DeviceCapacity] = {}
    consumes_counters: list[DeviceCounterConsumption] | None = None
    taints: list[DeviceTaint] | None = None
    allow_multiple_allocations: bool | None = None


class ResourcePool(_Written):
    name: str
    generation: int
    resource_slice_count: int


class ResourceSliceSpec(_Written):
    driver: str
    pool: ResourcePool
    node_name: str | None = None
    devices: list[Device] | None = None
    shared_counters: list[CounterSet] | None = None


class ResourceSlice(_Written):
    api_version: Literal["resource.k8s.io/v1"] = API_VERSION
    kind: Literal["ResourceSlice"] = "ResourceSlice"
    metadata: ObjectMeta
    spec: ResourceSliceSpec
