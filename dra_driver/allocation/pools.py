"""GatherPools: the slices a node can see, grouped into pools at their highest generation.

A pool is incomplete while fewer slices than `resourceSliceCount` are visible at that generation, and invalid when a
device name repeats. Devices are flattened in slice order, which is the allocator's search order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any

from dra_driver.allocation.quantities import parse
from dra_driver.cel import CelDevice


@dataclass(frozen=True)
class Node:
    """The node being filtered: name plus labels for nodeSelector terms."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class CapacityEntry:
    value: Fraction
    policy: dict[str, Any] | None


@dataclass
class PoolDevice:
    driver: str
    pool: str
    slice_name: str
    name: str
    raw: dict[str, Any]
    node_name: str | None  # the node this device is local to (slice or per-device nodeName)
    node_selector: dict[str, Any] | None
    consumes: list[tuple[str, dict[str, Fraction]]]
    capacity: dict[str, CapacityEntry]
    taints: list[dict[str, Any]]
    allow_multiple: bool
    _cel: CelDevice | None = None

    @cached_property  # the allocator's search asks millions of times
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.pool}/{self.name}"

    def cel(self) -> CelDevice:
        if self._cel is None:
            self._cel = CelDevice.from_slice_device(self.driver, self.raw)
        return self._cel

    def attribute(self, qualified: str) -> dict[str, Any] | None:
        """lookupAttribute: the full name, or the bare id when the domain is the driver's."""
        attrs = self.raw.get("attributes") or {}
        if qualified in attrs:
            return dict(attrs[qualified])
        domain, sep, ident = qualified.partition("/")
        if sep and domain == self.driver and ident in attrs:
            return dict(attrs[ident])
        return None


@dataclass
class Pool:
    driver: str
    name: str
    generation: int
    slice_count: int
    slices: list[dict[str, Any]] = field(default_factory=list)
    devices: list[PoolDevice] = field(default_factory=list)
    counters: dict[str, dict[str, Fraction]] = field(default_factory=dict)  # counter set -> counter -> value
    incomplete: bool = False
    invalid_reason: str = ""

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.name}"


def _requirement_matches(req: dict[str, Any], value: str | None) -> bool:
    op, values = req.get("operator", ""), [str(v) for v in req.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            a, b = int(value), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def node_selector_matches(selector: dict[str, Any], node: Node) -> bool:
    """core/v1 NodeSelector: terms are ORed, requirements inside a term ANDed; matchFields know metadata.name."""
    for term in selector.get("nodeSelectorTerms") or []:
        exprs, fields = term.get("matchExpressions") or [], term.get("matchFields") or []
        if not exprs and not fields:
            continue  # an empty term matches nothing
        ok = all(_requirement_matches(r, node.labels.get(r.get("key", ""))) for r in exprs)
        ok = ok and all(_requirement_matches(r, node.name if r.get("key") == "metadata.name" else None) for r in fields)
        if ok:
            return True
    return False


def _visible(spec: dict[str, Any], node: Node | None) -> bool:
    if node is None:
        return True
    if spec.get("nodeName") is not None:
        return bool(spec["nodeName"] == node.name)
    if spec.get("nodeSelector") is not None:
        return node_selector_matches(spec["nodeSelector"], node)
    return True  # allNodes, perDeviceNodeSelection (checked per device), or counters-only slices


def device_visible(device: PoolDevice, node: Node | None) -> bool:
    """Per-device node selection (perDeviceNodeSelection slices)."""
    if node is None:
        return True
    if device.node_name is not None:
        return device.node_name == node.name
    if device.node_selector is not None:
        return node_selector_matches(device.node_selector, node)
    return True


def _device(spec: dict[str, Any], slice_name: str, raw: dict[str, Any]) -> PoolDevice:
    per_device = bool(spec.get("perDeviceNodeSelection"))
    node_name = raw.get("nodeName") if per_device else spec.get("nodeName")
    node_selector = raw.get("nodeSelector") if per_device else spec.get("nodeSelector")
    consumes = [
        (str(c["counterSet"]), {n: parse(v["value"]) for n, v in (c.get("counters") or {}).items()})
        for c in raw.get("consumesCounters") or []
    ]
    capacity = {
        n: CapacityEntry(parse(v["value"]), v.get("requestPolicy")) for n, v in (raw.get("capacity") or {}).items()
    }
    return PoolDevice(
        driver=str(spec["driver"]),
        pool=str(spec["pool"]["name"]),
        slice_name=slice_name,
        name=str(raw["name"]),
        raw=raw,
        node_name=node_name,
        node_selector=node_selector,
        consumes=consumes,
        capacity=capacity,
        taints=list(raw.get("taints") or []),
        allow_multiple=bool(raw.get("allowMultipleAllocations")),
    )


# A slice's shared counter sets and devices, parsed (quantities are exact Fractions)
ParsedSlice = tuple[dict[str, dict[str, Fraction]], list[PoolDevice]]


def parse_slice(s: dict[str, Any]) -> ParsedSlice:
    spec = s["spec"]
    name = str((s.get("metadata") or {}).get("name", ""))
    counters = {
        str(cs["name"]): {n: parse(v["value"]) for n, v in (cs.get("counters") or {}).items()}
        for cs in spec.get("sharedCounters") or []
    }
    return counters, [_device(spec, name, raw) for raw in spec.get("devices") or []]


def gather_pools(
    slices: Iterable[dict[str, Any]], node: Node | None, parsed: Callable[[dict[str, Any]], ParsedSlice] = parse_slice
) -> list[Pool]:
    """The pools the node sees, each with the slices of its highest generation, in the allocator's search order
    (1.36's and 1.37's): sorted by driver and pool name, slices by name, and pools with a device that has binding
    conditions last (the incubating allocator's GatherPools). `parsed`: a slice's counters and devices (an Allocator
    remembers them: its slices do not change)."""
    pools: dict[tuple[str, str], Pool] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if not _visible(spec, node):
            continue
        key = (str(spec["driver"]), str(spec["pool"]["name"]))
        gen = int(spec["pool"].get("generation", 0))
        count = int(spec["pool"].get("resourceSliceCount", 1))
        pool = pools.get(key)
        if pool is None or gen > pool.generation:
            fresh = Pool(driver=key[0], name=key[1], generation=gen, slice_count=count)
            pools[key] = pool = fresh if pool is None else _replace(pool, fresh)
        elif gen < pool.generation:
            continue
        pool.slices.append(s)
    for pool in pools.values():
        pool.slices.sort(key=lambda s: str((s.get("metadata") or {}).get("name", "")))
        _fill(pool, parsed)
    return sorted(pools.values(), key=lambda p: (_has_binding_conditions(p), p.driver, p.name))


def _has_binding_conditions(pool: Pool) -> bool:
    return any(d.raw.get("bindingConditions") is not None for d in pool.devices)


def _replace(old: Pool, fresh: Pool) -> Pool:
    """Drop the older generation's slices."""
    old.generation, old.slice_count, old.slices = fresh.generation, fresh.slice_count, []
    return old


def _fill(pool: Pool, parsed: Callable[[dict[str, Any]], ParsedSlice]) -> None:
    pool.incomplete = len(pool.slices) < pool.slice_count
    seen: set[str] = set()
    for s in pool.slices:
        counters, devices = parsed(s)
        pool.counters.update(counters)
        for dev in devices:
            if dev.name in seen:
                pool.invalid_reason = f"duplicate device name {dev.name}"
            seen.add(dev.name)
            pool.devices.append(dev)
