"""The shared counters of a MIG-capable GPU (KEP-4815 partitionable devices).

One counter set per GPU: one counter per memory slice, plus one per MIG capacity that refuses a combination of
partitions the memory slices allow (`binding_capacities`: on every product simulated, one or two media engines).
Every MIG partition consumes its memory slices and those capacities; the whole GPU consumes everything, so the
scheduler can never hand out overlapping partitions or a partition together with its whole GPU.
"""

from __future__ import annotations

from functools import cache
from itertools import combinations

from dra_driver.nvml.inventory import MigProfile
from dra_driver.slices.attributes import (
    CAP_COPY_ENGINES,
    CAP_DECODERS,
    CAP_ENCODERS,
    CAP_JPEG_ENGINES,
    CAP_MEMORY,
    CAP_MULTIPROCESSORS,
    CAP_OFA_ENGINES,
    MIG_CAPACITIES,
)


def profile_capacities(p: MigProfile) -> dict[str, int]:
    """Capacity name -> value, in MIG_CAPACITIES order; memory in bytes."""
    values = {
        CAP_MULTIPROCESSORS: p.multiprocessors,
        CAP_COPY_ENGINES: p.copy_engines,
        CAP_DECODERS: p.decoders,
        CAP_ENCODERS: p.encoders,
        CAP_JPEG_ENGINES: p.jpeg_engines,
        CAP_OFA_ENGINES: p.ofa_engines,
        CAP_MEMORY: p.memory_bytes,
    }
    return {name: values[name] for name in MIG_CAPACITIES}


def memory_slice_count(profiles: tuple[MigProfile, ...]) -> int:
    return max((pl.start + pl.size for p in profiles for pl in p.placements), default=0)


def _by_start(profiles: tuple[MigProfile, ...]) -> dict[int, list[int]]:
    """Memory slice -> the indexes of the profiles with a placement starting there."""
    starts: dict[int, list[int]] = {}
    for i, p in enumerate(profiles):
        for pl in p.placements:
            starts.setdefault(pl.start, []).append(i)
    return starts


@cache
def counter_totals(profiles: tuple[MigProfile, ...]) -> dict[str, int]:
    """Counter value per capacity: the most any legal combination of partitions consumes together.

    Taking the largest single profile (as the official driver does) is not enough in general: a counter
    smaller than a legal layout's sum would make the scheduler refuse a layout the hardware accepts.
    Layouts are enumerated over memory slices (disjoint placements, per-profile instance limits and the
    compute-slice budget) with memoisation; each capacity is maximised independently.
    """
    slices = memory_slice_count(profiles)
    compute_budget = max((p.compute_slices for p in profiles), default=0)
    starts = _by_start(profiles)
    caps = [profile_capacities(p) for p in profiles]
    memo: dict[tuple[int, int, tuple[int, ...]], tuple[int, ...]] = {}

    def best(pos: int, compute_left: int, used: tuple[int, ...]) -> tuple[int, ...]:
        if pos >= slices:
            return (0,) * len(MIG_CAPACITIES)
        key = (pos, compute_left, used)
        if key in memo:
            return memo[key]
        result = best(pos + 1, compute_left, used)
        for i in starts.get(pos, []):
            p = profiles[i]
            if used[i] >= p.instance_count or p.compute_slices > compute_left:
                continue
            nxt = best(pos + p.memory_slices, compute_left - p.compute_slices, (*used[:i], used[i] + 1, *used[i + 1 :]))
            here = tuple(caps[i][c] + nxt[k] for k, c in enumerate(MIG_CAPACITIES))
            result = tuple(max(a, b) for a, b in zip(result, here, strict=True))
        memo[key] = result
        return result

    totals = best(0, compute_budget, (0,) * len(profiles))
    return dict(zip(MIG_CAPACITIES, totals, strict=True))


def _most_with(profiles: tuple[MigProfile, ...], target: str, limits: dict[str, int]) -> int:
    """The most of capacity `target` that non-overlapping partitions (what the memory-slice counters alone admit:
    instance limits and the compute budget not applied) consume together while staying within `limits`."""
    slices = memory_slice_count(profiles)
    starts = _by_start(profiles)
    caps = [profile_capacities(p) for p in profiles]
    bound = tuple(limits)
    memo: dict[tuple[int, tuple[int, ...]], int] = {}

    def best(pos: int, acc: tuple[int, ...]) -> int:
        if pos >= slices:
            return 0
        key = (pos, acc)
        if key not in memo:
            result = best(pos + 1, acc)
            for i in starts.get(pos, []):
                nxt = tuple(a + caps[i][c] for a, c in zip(acc, bound, strict=True))
                if all(v <= limits[c] for v, c in zip(nxt, bound, strict=True)):
                    result = max(result, caps[i][target] + best(pos + profiles[i].memory_slices, nxt))
            memo[key] = result
        return memo[key]

    return best(0, (0,) * len(bound))


@cache
def binding_capacities(profiles: tuple[MigProfile, ...]) -> tuple[str, ...]:
    """The capacity counters worth publishing: with the memory slices, they refuse every combination of partitions
    that the full set of counters refuses, so the scheduler admits exactly the same combinations. The others refuse
    nothing these do not, and each counter a device consumes is work for the scheduler on every node it tries.
    The fewest that do (the first such set in MIG_CAPACITIES order)."""
    totals = counter_totals(profiles)
    for size in range(len(MIG_CAPACITIES) + 1):
        for kept in combinations(MIG_CAPACITIES, size):
            limits = {c: totals[c] for c in kept}
            if all(_most_with(profiles, c, limits) <= totals[c] for c in MIG_CAPACITIES if c not in limits):
                return kept
    raise AssertionError("unreachable: with every capacity kept, none is left out")
