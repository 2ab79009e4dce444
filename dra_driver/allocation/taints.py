"""Device taints and request tolerations (resourceclaim.ToleratesTaint, allocator's taintPreventsAllocation), and the
taints DeviceTaintRules add to devices (the scheduler's ResourceSlice tracker, resourceslice/tracker applyPatches)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


def apply_taint_rules(
    slices: list[dict[str, Any]], rules: Sequence[Mapping[str, Any]], minor: int = 37
) -> list[dict[str, Any]]:
    """The slices with each rule's taint appended to every device its selector names (driver, pool, device: each
    unset one matches all), in rule order; slices no rule touches are returned as they are, the others copied.

    A rule without a device selector taints no device, as its API documents and the 1.37 tracker does; the 1.36
    tracker (`minor` 36) took it for the empty selector, which taints every device."""
    if not rules:
        return slices
    if minor >= 37:
        rules = [r for r in rules if (r.get("spec") or {}).get("deviceSelector") is not None]
    out = []
    for s in slices:
        spec = s.get("spec") or {}
        devices = spec.get("devices") or []
        added: dict[int, list[dict[str, Any]]] = {}
        for rule in rules:
            rule_spec = rule.get("spec") or {}
            selector = rule_spec.get("deviceSelector") or {}
            if selector.get("driver") not in (None, spec.get("driver")):
                continue
            if selector.get("pool") not in (None, (spec.get("pool") or {}).get("name")):
                continue
            given = rule_spec.get("taint") or {}
            taint = {k: given[k] for k in _TAINT_FIELDS if given.get(k) not in ("", None)}
            for i, device in enumerate(devices):
                if selector.get("device") in (None, device.get("name")):
                    added.setdefault(i, []).append(taint)
        if not added:
            out.append(s)
            continue
        patched = [
            {**d, "taints": [*(d.get("taints") or []), *added[i]]} if i in added else d for i, d in enumerate(devices)
        ]
        out.append({**s, "spec": {**spec, "devices": patched}})
    return out


_TAINT_FIELDS = ("key", "value", "effect", "timeAdded")
