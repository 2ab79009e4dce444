"""`CelDevice`, the input of a selector, and its conversion into the CEL `device` variable.

A device is converted once (cached on the frozen model): attribute names are split into domain and id (an
unqualified name goes under the driver's domain), versions become `Semver`, capacities `Quantity`. `raw_index`
keeps the JSON-level values per domain so memoisation keys can be built from exactly the paths a selector reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from dra_driver.cel.errors import CelRuntimeError, EvalError
from dra_driver.cel.features import active
from dra_driver.cel.quantity import Quantity
from dra_driver.cel.semver import parse_semver
from dra_driver.cel.values import Device, DomainMap

ATTRIBUTE_KINDS: Final = ("int", "bool", "string", "version", "ints", "bools", "strings", "versions")
Raw = tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]  # sorted (domain, sorted (id, raw value)) pairs


def split_name(name: str, driver: str) -> tuple[str, str]:
    """`domain/id` → (domain, id); a bare id belongs to the driver's domain."""
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


class CelDevice(BaseModel):
    """What a selector can see of a device: driver, attributes, capacity, allowMultipleAllocations."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    driver: str
    attributes: dict[str, dict[str, Any]] = Field(default_factory=dict)
    capacity: dict[str, str] = Field(default_factory=dict)
    allow_multiple_allocations: bool = Field(default=False, alias="allowMultipleAllocations")

    @classmethod
    def from_slice_device(cls, driver: str, device: dict[str, Any]) -> CelDevice:
        """From a ResourceSlice device JSON dict (capacity entries are `{"value": quantity}`)."""
        capacity = {name: str(entry["value"]) for name, entry in (device.get("capacity") or {}).items()}
        return cls(
            driver=driver,
            attributes=dict(device.get("attributes") or {}),
            capacity=capacity,
            allowMultipleAllocations=bool(device.get("allowMultipleAllocations", False)),
        )

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> CelDevice:
        """Drop the cached conversion from copies: `update` may change the fields it was computed from."""
        copied = super().model_copy(update=update, deep=deep)
        copied.__dict__.pop("cel_parts", None)
        return copied

    def cel_value(self) -> Device:
        return self.cel_parts[0]

    def raw_index(self) -> dict[str, dict[str, dict[str, Any]]]:
        """{"attributes"|"capacity": {domain: {id: hashable raw value}}}."""
        return self.cel_parts[1]

    @cached_property
    def cel_parts(self) -> tuple[Device, dict[str, dict[str, dict[str, Any]]]]:
        """Converted once per instance: the model is frozen, so the result is a pure function of the fields.
        (cached_property writes the instance dict directly; pydantic's equality and dumps ignore it.)"""
        return _convert(self)


def _attribute_value(name: str, attr: dict[str, Any], lists: bool) -> tuple[Any, tuple[str, Any]]:
    """compile.go's getAttributeValue: the first value field set, in its order (lists first, only when the
    DRAListTypeAttributes gate is on); none usable is "unsupported attribute value"."""
    kinds = ATTRIBUTE_KINDS[4:] + ATTRIBUTE_KINDS[:4] if lists else ATTRIBUTE_KINDS[:4]
    present = [kind for kind in kinds if attr.get(kind) is not None]
    if not present:
        raise CelRuntimeError(f"attribute {name}: unsupported attribute value")
    kind = present[0]
    raw = attr[kind]
    if kind.endswith("s"):  # 1.36+ list attributes (DRAListTypeAttributes) become CEL lists
        items = [_attribute_value(name, {kind[:-1]: item}, False)[0] for item in raw]
        return items, (kind, tuple(raw))
    if kind == "version":
        try:
            return parse_semver(str(raw)), (kind, raw)
        except EvalError as err:
            raise CelRuntimeError(f"parse semantic version: {err.message}") from None
    expected = {"int": int, "bool": bool, "string": str}[kind]
    if not isinstance(raw, expected) or (kind == "int" and isinstance(raw, bool)):
        raise CelRuntimeError(f"attribute {name}: {kind} value has type {type(raw).__name__}")
    return raw, (kind, raw)


def _convert(dev: CelDevice) -> tuple[Device, dict[str, dict[str, dict[str, Any]]]]:
    attributes, capacity = DomainMap(), DomainMap()
    raw: dict[str, dict[str, dict[str, Any]]] = {"attributes": {}, "capacity": {}}
    lists = active().list_type_attributes
    for name, attr in dev.attributes.items():
        domain, ident = split_name(name, dev.driver)
        value, raw_value = _attribute_value(name, attr, lists)
        attributes.setdefault(domain, {})[ident] = value
        raw["attributes"].setdefault(domain, {})[ident] = raw_value
    for name, text in dev.capacity.items():
        domain, ident = split_name(name, dev.driver)
        try:
            quantity = Quantity.parse(text)  # cached by text: fleets repeat the same few values
        except EvalError as err:
            raise CelRuntimeError(f"capacity {name}: {err.message}") from None
        capacity.setdefault(domain, {})[ident] = quantity
        raw["capacity"].setdefault(domain, {})[ident] = text
    return Device(dev.driver, attributes, capacity, dev.allow_multiple_allocations), raw
