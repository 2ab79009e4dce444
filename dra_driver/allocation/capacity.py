"""Consumable capacity (KEP-5075): how much of each capacity a request consumes from a device.

For every capacity of the device: the requested amount if the request names it, else the policy's default, else
the full value; then rounded up to the policy (validValues: the smallest valid value >= request; validRange:
min, then min + k*step, up to max). A request for a capacity the device lacks, or above what the policy/device
allows, makes the device unsuitable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

from dra_driver.allocation.pools import CapacityEntry
from dra_driver.allocation.quantities import parse


class CapacityMismatch(Exception):
    """The device cannot satisfy the request's capacity (message says which capacity)."""


def _apply_policy(name: str, amount: Fraction, entry: CapacityEntry) -> Fraction:
    policy = entry.policy or {}
    if policy.get("validValues"):
        for text in policy["validValues"]:
            valid = parse(text)
            if valid >= amount:
                return valid
        raise CapacityMismatch(f"capacity {name}: no valid value >= {amount}")
    rng = policy.get("validRange")
    if rng:
        low = parse(rng["min"])
        if amount <= low:
            amount = low
        elif rng.get("step"):
            step = parse(rng["step"])
            amount = low + math.ceil((amount - low) / step) * step
        if rng.get("max") is not None and amount > parse(rng["max"]):
            raise CapacityMismatch(f"capacity {name}: {amount} above validRange max {rng['max']}")
    return amount


def consumed_capacity(
    requests: Mapping[str, str], capacity: Mapping[str, CapacityEntry], driver: str, multi: bool
) -> dict[str, Fraction]:
    """What allocating the device for this request consumes; `CapacityMismatch` when it cannot.

    For a device without allowMultipleAllocations only the check applies (requested <= capacity)."""
    wanted = {_local(name, driver): parse(text) for name, text in requests.items()}
    for name in wanted:
        if name not in capacity:
            raise CapacityMismatch(f"capacity {name}: not provided by the device")
    out: dict[str, Fraction] = {}
    for name, entry in capacity.items():
        if name in wanted:
            amount = _apply_policy(name, wanted[name], entry) if multi else wanted[name]
        elif multi and entry.policy and entry.policy.get("default") is not None:
            amount = parse(entry.policy["default"])
        else:
            amount = entry.value if multi else Fraction(0)
        if amount > entry.value:
            raise CapacityMismatch(f"capacity {name}: requested {amount} exceeds {entry.value}")
        out[name] = amount
    return out


def _local(name: str, driver: str) -> str:
    """Capacity keys in the request may be fully qualified; devices use the bare id in the driver's domain."""
    domain, sep, ident = name.partition("/")
    return ident if sep and domain == driver else name
