"""Device taints and request tolerations (resourceclaim.ToleratesTaint, allocator's taintPreventsAllocation)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dra_driver.api.claim import Toleration

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def tolerates(toleration: Toleration, taint: dict[str, Any]) -> bool:
    if toleration.effect and toleration.effect != taint.get("effect"):
        return False
    if toleration.key and toleration.key != taint.get("key"):
        return False
    if toleration.operator == "Exists":
        return True  # an empty key with Exists tolerates every taint
    if toleration.operator in ("Equal", ""):
        return toleration.value == str(taint.get("value", ""))
    return False  # an operator of a newer API


def blocking_taint(taints: Sequence[dict[str, Any]], tolerations: Sequence[Toleration]) -> dict[str, Any] | None:
    """The first NoSchedule/NoExecute taint no toleration covers; `None` and unknown effects never block."""
    for taint in taints:
        if taint.get("effect") in BLOCKING_EFFECTS and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def describe_taint(taint: dict[str, Any]) -> str:
    value = taint.get("value")
    return f"{taint.get('key')}{'=' + str(value) if value else ''}:{taint.get('effect')}"
