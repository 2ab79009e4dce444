"""Shared counters of partitionable devices (KEP-4815): counters per (driver, pool, counter set)."""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

from dra_driver.allocation.pools import Pool, PoolDevice

SetKey = tuple[str, str, str]  # driver, pool, counter set


class CounterLedger:
    """Available = the set's counters minus what allocated and in-flight devices consume."""

    def __init__(self, pools: Iterable[Pool]) -> None:
        self.total: dict[SetKey, dict[str, Fraction]] = {}
        for pool in pools:
            for name, counters in pool.counters.items():
                self.total[(pool.driver, pool.name, name)] = dict(counters)
        self.used: dict[SetKey, dict[str, Fraction]] = {}

    def shortage(self, device: PoolDevice) -> tuple[str, list[str]] | None:
        """(counter set, counters) that adding the device would overdraw in the first short set, or None."""
        for set_name, counters in device.consumes:
            key = (device.driver, device.pool, set_name)
            total = self.total.get(key)
            if total is None:
                return (set_name, sorted(counters))  # missing set: nothing to consume from
            used = self.used.get(key, {})
            # Unknown counters are skipped: validation guarantees they exist, and upstream ignores them too.
            short = [c for c, n in counters.items() if c in total and used.get(c, Fraction(0)) + n > total[c]]
            if short:
                return (set_name, short)
        return None

    def add(self, device: PoolDevice, sign: int = 1) -> None:
        for set_name, counters in device.consumes:
            used = self.used.setdefault((device.driver, device.pool, set_name), {})
            for counter, amount in counters.items():
                used[counter] = used.get(counter, Fraction(0)) + sign * amount

    def remove(self, device: PoolDevice) -> None:
        self.add(device, -1)
