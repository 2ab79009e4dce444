"""Two drivers' ResourceSlices for one node, compared device by device, attribute by attribute, capacity by capacity
and counter by counter (tests/test_nvidia_slices.py: NVIDIA's gpu-kubelet-plugin against ours).

Each pool is first reduced to a `Pool`: its devices by name (attributes with the driver's own domain taken off, so
`gpu.nvidia.com/uuid` and our `gpu.dra-driver.dev/uuid` both read `uuid`; Kubernetes' standard
`resource.kubernetes.io/...` names stay as they are), its counter sets by name, and the shape of the pool (how many
slices, which hold counters, the order of the devices). `differences` lists every place the two disagree as a
`Difference`, whose `key` (the aspect, the name, the kind of device) is what a table of known differences names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Device:
    name: str
    attributes: dict[str, tuple[str, Any]]  # name -> (type: int/bool/string/version, value)
    capacity: dict[str, str]
    policies: dict[str, dict[str, Any]]  # capacity -> its requestPolicy (consumable capacity), where it has one
    consumes: dict[str, dict[str, str]]  # counter set -> counter -> value
    extra: dict[str, Any]  # every other field of the device (allowMultipleAllocations, taints, ...)

    @property
    def kind(self) -> str:
        """`gpu`, `mig <profile>`, or the `type` attribute's value."""
        kind = str(self.attributes.get("type", ("string", "?"))[1])
        if kind == "mig" and "profile" in self.attributes:
            return f"mig {self.attributes['profile'][1]}"
        return kind


@dataclass
class Pool:
    driver: str
    devices: dict[str, Device] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # device names in the order of the slices, then of each slice
    counter_sets: dict[str, dict[str, str]] = field(default_factory=dict)
    layout: list[str] = field(default_factory=list)  # per slice: "counters:<n>" / "devices:<n>" / both
    # every other field of the slices (spec.nodeName, spec.pool.name, the owner), with the values the slices have
    slice_fields: dict[str, set[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Difference:
    aspect: str  # device, attribute, capacity, counter, consumption, device field, layout, order
    name: str  # the attribute, capacity or counter; for devices, the device kind
    kind: str  # the kind of device it is found on ("gpu", "mig", "counter set", "pool")
    where: str  # the device or counter set
    theirs: Any
    ours: Any

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.aspect, self.name, self.kind)

    def __str__(self) -> str:
        return f"{self.aspect} {self.name!r} on {self.where} ({self.kind}): theirs {self.theirs!r}, ours {self.ours!r}"


def _unqualified(name: str, driver: str) -> str:
    return name.removeprefix(f"{driver}/")


def _attribute(value: dict[str, Any]) -> tuple[str, Any]:
    ((kind, v),) = value.items()
    return kind, v


def pool_of(driver: str, slices: Iterable[dict[str, Any]]) -> Pool:
    """The pool of `driver` in `slices` (the server's objects), ordered by slice name (both drivers name their slices
    so that the name sorts as they were built)."""
    pool = Pool(driver)
    for s in sorted(slices, key=lambda s: s["metadata"]["name"]):
        spec = s["spec"]
        if spec["driver"] != driver:
            continue
        counters, devices = spec.get("sharedCounters") or [], spec.get("devices") or []
        rest = {k: v for k, v in spec.items() if k not in ("driver", "devices", "sharedCounters", "pool")}
        rest["pool.name"] = spec["pool"]["name"]
        rest["owner"] = [f"{o['kind']}/{o['name']}" for o in s["metadata"].get("ownerReferences", [])]
        for k, v in rest.items():
            pool.slice_fields.setdefault(k, set()).add(json.dumps(v, sort_keys=True))
        pool.layout.append("+".join(p for p, n in (("counters", len(counters)), ("devices", len(devices))) if n))
        for cs in counters:
            pool.counter_sets[cs["name"]] = {k: v["value"] for k, v in cs["counters"].items()}
        for d in devices:
            rest = {k: v for k, v in d.items() if k not in ("name", "attributes", "capacity", "consumesCounters")}
            pool.devices[d["name"]] = Device(
                name=d["name"],
                attributes={_unqualified(k, driver): _attribute(v) for k, v in (d.get("attributes") or {}).items()},
                capacity={_unqualified(k, driver): v["value"] for k, v in (d.get("capacity") or {}).items()},
                policies={
                    _unqualified(k, driver): v["requestPolicy"]
                    for k, v in (d.get("capacity") or {}).items()
                    if "requestPolicy" in v
                },
                consumes={
                    c["counterSet"]: {k: v["value"] for k, v in c["counters"].items()}
                    for c in d.get("consumesCounters") or []
                },
                extra=rest,
            )
            pool.order.append(d["name"])
    return pool


def _base_kind(kind: str) -> str:
    return kind.split(" ", 1)[0]


def _mapping_differences(
    aspect: str, kind: str, where: str, theirs: dict[str, Any], ours: dict[str, Any]
) -> list[Difference]:
    return [
        Difference(aspect, k, kind, where, theirs.get(k), ours.get(k))
        for k in sorted(set(theirs) | set(ours))
        if theirs.get(k) != ours.get(k)
    ]


def differences(theirs: Pool, ours: Pool, *, order: bool = True) -> list[Difference]:
    """Every disagreement of two pools, theirs first: devices only one side has, then per common device its
    attributes, capacities, counter consumptions and other fields, then the counter sets, then the pool's shape and
    (with `order`) the order of the devices both have."""
    out: list[Difference] = []
    for name in sorted(set(theirs.devices) | set(ours.devices)):
        t, o = theirs.devices.get(name), ours.devices.get(name)
        if t is None or o is None:
            present = t or o
            assert present is not None
            out.append(Difference("device", present.kind, _base_kind(present.kind), name, t is not None, o is not None))
            continue
        kind = _base_kind(t.kind)
        out += _mapping_differences("attribute", kind, name, t.attributes, o.attributes)
        out += _mapping_differences("capacity", kind, name, t.capacity, o.capacity)
        out += _policy_differences(kind, name, t.policies, o.policies)
        for cs in sorted(set(t.consumes) | set(o.consumes)):
            where = f"{name} of {cs}"
            out += _mapping_differences("consumption", kind, where, t.consumes.get(cs, {}), o.consumes.get(cs, {}))
        out += _mapping_differences("device field", kind, name, t.extra, o.extra)
    for cs in sorted(set(theirs.counter_sets) | set(ours.counter_sets)):
        t_cs, o_cs = theirs.counter_sets.get(cs), ours.counter_sets.get(cs)
        if t_cs is None or o_cs is None:
            out.append(Difference("counter set", "", "counter set", cs, t_cs is not None, o_cs is not None))
            continue
        out += _mapping_differences("counter", _counter_family(cs), cs, t_cs, o_cs)
    out += _mapping_differences("slice field", "pool", "pool", theirs.slice_fields, ours.slice_fields)
    if theirs.layout != ours.layout:
        out.append(Difference("layout", "slices", "pool", "pool", theirs.layout, ours.layout))
    common = set(theirs.order) & set(ours.order)
    t_order, o_order = [n for n in theirs.order if n in common], [n for n in ours.order if n in common]
    if order and t_order != o_order:
        out.append(Difference("order", "devices", "pool", "pool", _first_swap(t_order, o_order), None))
    return out


def _policy_differences(
    kind: str, where: str, theirs: dict[str, dict[str, Any]], ours: dict[str, dict[str, Any]]
) -> list[Difference]:
    """Request policies field by field: `memory.default`, `memory.validRange.min`, ..."""
    flat_t, flat_o = ({f"{c}.{k}": v for c, p in side.items() for k, v in _flat(p)} for side in (theirs, ours))
    return _mapping_differences("capacity policy", kind, where, flat_t, flat_o)


def _flat(policy: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in policy.items():
        out += _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]
    return out


def _counter_family(counter_set: str) -> str:
    return re.sub(r"^gpu-\d+-", "gpu-N-", counter_set)


def _first_swap(a: list[str], b: list[str]) -> str:
    i = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
    return f"theirs {a[i]} where ours {b[i]}"
