"""Allocator differential on seeded random input: ours and the 1.37 scheduler's allocator
(k8s.io/dynamic-resource-allocation/structured through tools/allocbench, DeviceTaintRules applied by the scheduler's
own ResourceSlice tracker) must give every claim the same node, devices, consumed capacity, binding conditions and
node selector, and fail the same claims with the same message. The scenarios (tests/alloc_generator.py) mix device
taints and DeviceTaintRules, binding conditions, shared counters, consumable capacity with request policies,
`firstAvailable`, `All`, selectors and constraints. Prints the agreement in the run's summary."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.alloc_generator import Scenario
from tests.gotools import pinned
from tests.test_allocbench import build_allocbench, run_go_many, run_ours

SEEDS = range(1, 161)
CLAIMS = 8


def _features(inp: dict[str, Any]) -> Counter[str]:
    """What a scenario exercises, for the summary (so a generator change that drops a feature shows)."""
    seen: Counter[str] = Counter()
    devices = [d for s in inp["slices"] for d in s["spec"].get("devices") or []]
    seen["device taints"] += any(d.get("taints") for d in devices)
    seen["DeviceTaintRules"] += bool(inp["deviceTaintRules"])
    seen["DeviceTaintRules without a selector"] += any(
        "deviceSelector" not in r["spec"] for r in inp["deviceTaintRules"]
    )
    seen["binding conditions"] += any(d.get("bindingConditions") for d in devices)
    seen["binding feature off"] += not inp["features"]["DeviceBindingAndStatus"]
    seen["shared counters"] += any(d.get("consumesCounters") for d in devices)
    seen["request policies"] += any(c.get("requestPolicy") for d in devices for c in (d.get("capacity") or {}).values())
    requests = [r for c in inp["claims"] for r in c["spec"]["devices"]["requests"]]
    seen["firstAvailable"] += any("firstAvailable" in r for r in requests)
    seen["capacity requests"] += any("capacity" in (r.get("exactly") or {}) for r in requests)
    seen["tolerations"] += any("tolerations" in (r.get("exactly") or {}) for r in requests)
    if inp["features"].get("ListTypeAttributes"):
        constraints = [c for claim in inp["claims"] for c in claim["spec"]["devices"].get("constraints") or []]
        attributes = [c.get("matchAttribute") or c.get("distinctAttribute") or "" for c in constraints]
        on_lists = [a for a in attributes if a.rpartition("/")[2] in ("numas", "zones")]
        seen["list constraints"] += len(on_lists)
        seen["list constraints failing as scalars"] += _set_semantics_decide(inp)
    return seen


def _set_semantics_decide(inp: dict[str, Any]) -> int:
    """Claims that our allocator places with the gate on and not with it off: the sets decide somewhere."""
    on, _ = run_ours(inp)
    off, _ = run_ours({**inp, "features": {**inp["features"], "ListTypeAttributes": False}})
    return sum(bool(a.get("node")) and not b.get("node") for a, b in zip(on, off, strict=True))


def _outcomes(results: list[dict[str, Any]]) -> Counter[str]:
    return Counter("error" if r.get("error") else "allocated" if r.get("node") else "unallocated" for r in results)


def _differential(
    binary: Path, tmp_path: Path, lists: bool, gate: bool | None = None
) -> tuple[list[str], Counter[str], Counter[str]]:
    """(disagreements, features exercised, Go's outcomes) over SEEDS; `gate`: DRAListTypeAttributes if not the
    scenario's own (on with list attributes)."""
    disagreements: list[str] = []
    exercised: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    inputs = []
    for seed in SEEDS:
        inp = Scenario(seed, lists=lists).input(CLAIMS)
        if gate is not None:
            inp["features"]["ListTypeAttributes"] = gate
        inputs.append(inp)
    for seed, inp, got in zip(SEEDS, inputs, run_go_many(binary, inputs, timeout=600), strict=True):
        exercised += _features(inp)
        go = got["results"]
        ours, _ = run_ours(inp)
        outcomes += _outcomes(go)
        for a, b in zip(ours, go, strict=True):
            if a != b:  # errors included, message and all
                disagreements.append(f"seed {seed}, {a['claim']}:\n  ours {json.dumps(a)}\n  Go   {json.dumps(b)}")
                (tmp_path / f"seed-{seed}.json").write_text(json.dumps(inp, indent=1))
    return disagreements, exercised, outcomes


def test_ours_and_the_schedulers_allocator_agree_on_random_scenarios(
    tmp_path: Path, report_table: Callable[[str, str], None]
) -> None:
    disagreements, exercised, outcomes = _differential(build_allocbench(), tmp_path, lists=False)
    total = len(SEEDS) * CLAIMS
    report_table(
        f"allocator differential ({pinned('allocbench')})",
        f"{len(SEEDS)} random scenarios x {CLAIMS} claims (seeds {SEEDS.start}-{SEEDS.stop - 1}): "
        f"{total - len(disagreements)}/{total} agree with k8s.io/dynamic-resource-allocation/structured; Go: "
        + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items()))
        + "\nscenarios with "
        + ", ".join(f"{k} {n}" for k, n in sorted(exercised.items())),
    )
    assert disagreements == [], "\n".join(disagreements[:10])
    # the scenarios are worth something only if claims both fit and fail, and every feature appears
    assert outcomes["allocated"] > total // 3 and outcomes["unallocated"] > total // 10, outcomes
    assert all(exercised[k] >= 10 for k in _features(Scenario(1).input(CLAIMS))), exercised


def test_list_attributes_with_the_gate_on_agree_on_random_scenarios(
    tmp_path: Path, report_table: Callable[[str, str], None]
) -> None:
    """DRAListTypeAttributes on (the scheduler's experimental allocator): matchAttribute and distinctAttribute on list
    attributes, scalars and lists of one name mixed, compare as sets, as upstream's do."""
    disagreements, exercised, outcomes = _differential(build_allocbench(), tmp_path, lists=True)
    total = len(SEEDS) * CLAIMS
    report_table(
        f"allocator differential, list attributes ({pinned('allocbench')}, DRAListTypeAttributes on)",
        f"{len(SEEDS)} random scenarios x {CLAIMS} claims: {total - len(disagreements)}/{total} agree; Go: "
        + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items()))
        + "\nscenarios with "
        + ", ".join(f"{k} {n}" for k, n in sorted(exercised.items())),
    )
    assert disagreements == [], "\n".join(disagreements[:10])
    assert outcomes["allocated"] > total // 3 and outcomes["unallocated"] > total // 10, outcomes
    assert exercised["list constraints"] >= 50 and exercised["list constraints failing as scalars"] >= 10, exercised


def test_list_attributes_with_the_gate_off_agree_on_random_scenarios(tmp_path: Path) -> None:
    """The same scenarios with DRAListTypeAttributes off (a client-built slice the API server never saw): a list value
    matches nothing after the first device, in ours as in upstream's allocator."""
    disagreements, _, outcomes = _differential(build_allocbench(), tmp_path, lists=True, gate=False)
    assert disagreements == [], "\n".join(disagreements[:10])
    assert outcomes["allocated"] > len(SEEDS) * CLAIMS // 4, outcomes
