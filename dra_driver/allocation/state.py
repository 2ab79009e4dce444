"""What is already allocated: devices in exclusive use, shared-device capacity consumed, counters consumed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dra_driver.allocation.quantities import parse

DeviceKey = tuple[str, str, str]  # driver, pool, device


@dataclass
class AllocatedState:
    in_use: set[DeviceKey] = field(default_factory=set)
    shared: dict[DeviceKey, dict[str, Fraction]] = field(default_factory=dict)  # consumed capacity per shared device

    @property
    def consuming(self) -> set[DeviceKey]:
        """Devices whose counters are consumed (exclusive or shared allocations; not admin access)."""
        return self.in_use | set(self.shared)

    def add(self, allocation: Mapping[str, Any]) -> None:
        """Record one more allocation (what the next pod sees)."""
        extra = allocated_state([allocation])
        self.in_use |= extra.in_use
        for key, used in extra.shared.items():
            mine = self.shared.setdefault(key, {})
            for name, amount in used.items():
                mine[name] = mine.get(name, Fraction(0)) + amount


def _allocation(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """Accept an AllocationResult, or a ResourceClaim carrying status.allocation."""
    if "devices" in obj and "results" in (obj.get("devices") or {}):
        return obj
    status = obj.get("status") or {}
    alloc = status.get("allocation")
    return alloc if isinstance(alloc, Mapping) else None


def allocated_state(allocations: Iterable[Mapping[str, Any]]) -> AllocatedState:
    state = AllocatedState()
    for obj in allocations:
        alloc = _allocation(obj)
        if alloc is None:
            continue
        for result in (alloc.get("devices") or {}).get("results") or []:
            if result.get("adminAccess"):
                continue  # admin access does not make the device unavailable
            key = (str(result["driver"]), str(result["pool"]), str(result["device"]))
            if result.get("shareID"):
                used = state.shared.setdefault(key, {})
                for name, text in (result.get("consumedCapacity") or {}).items():
                    used[name] = used.get(name, Fraction(0)) + parse(text)
            else:
                state.in_use.add(key)
    return state
