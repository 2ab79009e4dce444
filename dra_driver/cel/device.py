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
from dra_driver.cel.values import Device, DomainMap, NativeMap

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
        """Drop the cached conversions from copies: `update` may change the fields they were computed from."""
        copied = super().model_copy(update=update, deep=deep)
        for cached in ("cel_parts", "converted"):
            copied.__dict__.pop(cached, None)
        return copied

    def cel_value(self) -> Device:
        return self.converted

    def raw_index(self) -> dict[str, dict[str, dict[str, Any]]]:
        """{"attributes"|"capacity": {domain: {id: hashable raw value}}}."""
        return self.cel_parts[1]

    @cached_property
    def converted(self) -> Device:
        """The `device` variable, converted once per instance: the model is frozen, so it is a pure function of the
        fields. (cached_property writes the instance dict directly; pydantic's equality and dumps ignore it.)"""
        return _convert(self)

    @cached_property
    def cel_parts(self) -> tuple[Device, dict[str, dict[str, dict[str, Any]]]]:
        """The CEL value and the raw index the memo keys read. The index is built only here, on the memoised path:
        a cold evaluation (the one Kubernetes does every time) needs only the value."""
        device = self.converted  # first: an invalid attribute raises the conversion's error
        return device, _raw_index(self)


def _attribute_value(name: str, attr: dict[str, Any], lists: bool) -> tuple[Any, tuple[str, Any]]:
    """compile.go's getAttributeValue: the first value field set, in its order (lists first, only when `lists`:
    `Features.list_values`); none usable is "unsupported attribute value"."""
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


_SCALARS: Final = {"int": int, "bool": bool, "string": str}
_SCALARS_AND_VERSION: Final = frozenset(("int", "bool", "string", "version"))
_versions: dict[str, Any] = {}  # spelling -> Semver or CelRuntimeError message: fleets repeat a few versions


def _version(text: str) -> Any:
    """A cached semver parse; an invalid spelling raises the same error every time."""
    parsed = _versions.get(text)
    if parsed is None:
        try:
            parsed = parse_semver(text)
        except EvalError as err:
            parsed = f"parse semantic version: {err.message}"
        if len(_versions) < 4096:  # bounded: attribute values come from the cluster
            _versions[text] = parsed
    if type(parsed) is str:
        raise CelRuntimeError(parsed)
    return parsed


def _convert(dev: CelDevice) -> Device:
    """The hot path of a cold evaluation (aimed within 2x of Go's), hence the inlined fast case: an attribute
    with exactly one scalar field of the exact type, which is every attribute a driver normally publishes. Anything
    else takes `_attribute_value`, the general rule."""
    driver = dev.driver
    attributes, capacity = DomainMap(), DomainMap()
    lists = active().list_values
    values: dict[str, Any] = {}
    current = None
    for name, attr in dev.attributes.items():
        if "/" in name:
            domain, _, ident = name.partition("/")
        else:
            domain, ident = driver, name
        if domain != current:
            current = domain
            values = attributes.get(domain) or attributes.setdefault(domain, NativeMap())
        if len(attr) == 1:
            ((kind, raw),) = attr.items()
            expected = _SCALARS.get(kind)
            if expected is not None and type(raw) is expected:
                values[ident] = raw
                continue
            if kind == "version" and type(raw) is str:
                values[ident] = _version(raw)
                continue
        values[ident] = _attribute_value(name, attr, lists)[0]
    current = None
    for name, text in dev.capacity.items():
        if "/" in name:
            domain, _, ident = name.partition("/")
        else:
            domain, ident = driver, name
        if domain != current:
            current = domain
            values = capacity.get(domain) or capacity.setdefault(domain, NativeMap())
        try:
            values[ident] = Quantity.parse(text)  # cached by text: fleets repeat the same few values
        except EvalError as err:
            raise CelRuntimeError(f"capacity {name}: {err.message}") from None
    return Device(driver, attributes, capacity, dev.allow_multiple_allocations)


def _raw_index(dev: CelDevice) -> dict[str, dict[str, dict[str, Any]]]:
    """The JSON-level value of every attribute (as (kind, value), the kind `_attribute_value` picked) and capacity,
    per domain; called after `_convert` succeeded, so every attribute has a usable value."""
    lists = active().list_values
    attributes: dict[str, dict[str, Any]] = {}
    for name, attr in dev.attributes.items():
        domain, ident = split_name(name, dev.driver)
        if len(attr) == 1 and next(iter(attr)) in _SCALARS_AND_VERSION:
            raw_value = next(iter(attr.items()))
        else:
            raw_value = _attribute_value(name, attr, lists)[1]
        attributes.setdefault(domain, {})[ident] = raw_value
    capacity: dict[str, dict[str, Any]] = {}
    for name, text in dev.capacity.items():
        domain, ident = split_name(name, dev.driver)
        capacity.setdefault(domain, {})[ident] = text
    return {"attributes": attributes, "capacity": capacity}
