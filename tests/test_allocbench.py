"""Differential test of allocation: tools/allocbench (the kube-scheduler's structured allocator, Go) and ours on the
same fleet of simulated dgx-h100 nodes and the same mixed claims (whole GPUs, MIG partitions, counts of two, one
too big to fit anywhere) must give every claim the same node and the same devices. The helpers are
bench/bench_allocator.py's too. Skipped without Go unless DRA_K8S_REQUIRE=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from dra_driver.allocation.allocator import AllocationError, Allocator
from dra_driver.cel.features import active
from dra_driver.nvml.discovery import discover
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.builder import build_slices
from dra_driver.slices.devices import PublishMode
from tests.gotools import built_binary

ROOT = Path(__file__).resolve().parent.parent
REQUIRE = os.environ.get("DRA_K8S_REQUIRE") == "1"
CLASS_FILES = ("gpu", "mig-1g.10gb", "mig-3g.40gb")
NS = "bench"

# One pod's claim each, in this rotation: what a GPU cluster's mix of small and whole-GPU jobs looks like.
MIX: tuple[tuple[str, int], ...] = (("gpu", 1), ("mig-1g.10gb", 1), ("gpu", 2), ("mig-3g.40gb", 1), ("mig-1g.10gb", 2))


def build_allocbench() -> Path:
    """The allocbench binary (built and cached by scripts/build-allocbench.sh); skips or fails without Go."""
    return _build("build-allocbench.sh")


def _build(script: str) -> Path:
    return built_binary(script)


def classes() -> list[dict[str, Any]]:
    return [yaml.safe_load((ROOT / "deviceclasses" / f"{name}.yaml").read_text()) for name in CLASS_FILES]


@cache
def _node_slices(mode: PublishMode, tmp: str, k8s_version: str, mig_profiles: frozenset[str] | None = None) -> str:
    sim = SimulatedNvml("dgx-h100", Path(tmp))
    slices = build_slices(discover(sim, sim.sysfs_root), node_name="NODE-NAME", k8s_version=k8s_version, mode=mode,
                          mig_profiles=mig_profiles)  # fmt: skip
    return json.dumps([s.to_api() for s in slices])


def fleet(
    nodes: int,
    tmp: Path,
    mode: PublishMode = PublishMode.PARTITIONABLE,
    k8s_version: str = "1.36",
    mig_profiles: frozenset[str] | None = None,
) -> tuple[list[str], list[Any]]:
    """Node names and the slices of that many dgx-h100 nodes: one node's slices from our builder for `k8s_version`'s
    layout (partitionable: with only `mig_profiles`' partitions, None: every one), renamed."""
    names = [f"node-{i:03d}" for i in range(nodes)]
    one = _node_slices(mode, str(tmp), k8s_version, mig_profiles)
    return names, [s for name in names for s in json.loads(one.replace("NODE-NAME", name))]


def class_name(file: str) -> str:
    return str(yaml.safe_load((ROOT / "deviceclasses" / f"{file}.yaml").read_text())["metadata"]["name"])


def claims(count: int, extra: tuple[tuple[str, int], ...] = ()) -> list[dict[str, Any]]:
    """Claims as the API server stores them (defaults filled in: the Go allocator does not default)."""
    kinds = [MIX[i % len(MIX)] for i in range(count)] + list(extra)
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"c{i:04d}-{cls}-x{n}", "namespace": NS, "uid": f"uid-{i}"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {
                "deviceClassName": class_name(cls), "allocationMode": "ExactCount", "count": n}}]}},
        }
        for i, (cls, n) in enumerate(kinds)
    ]  # fmt: skip


def run_go(binary: Path, inp: dict[str, Any], repeat: int = 1, timeout: float = 600) -> tuple[list[Any], float]:
    """(results, best seconds of `repeat` runs) from allocbench."""
    (got,) = run_go_many(binary, [{**inp, "repeat": repeat}], timeout)
    return got["results"], float(got["seconds"])


def run_go_many(binary: Path, inputs: list[dict[str, Any]], timeout: float = 600) -> list[dict[str, Any]]:
    """allocbench's output for each input, from one process: its start (client-go's init) costs more than most
    scenarios."""
    out = subprocess.run(
        [str(binary)], input="".join(json.dumps(i) + "\n" for i in inputs), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    got = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(got) == len(inputs), out.stderr[-4000:]
    return got


def run_ours(inp: dict[str, Any]) -> tuple[list[Any], float]:
    """The same loop as allocbench's `run`, with our allocator: claim i tries nodes from i mod len(nodes)."""
    t0 = time.perf_counter()
    features = inp.get("features") or {}
    alloc = Allocator(
        inp["slices"],
        inp["classes"],
        taint_rules=inp.get("deviceTaintRules") or (),
        binding_conditions=features.get("DeviceBindingAndStatus", True),
        features=replace(active(), list_type_attributes=features.get("ListTypeAttributes", False)),
    )
    nodes: list[str] = inp["nodes"]
    results: list[dict[str, Any]] = []
    for i, claim in enumerate(inp["claims"]):
        meta = claim["metadata"]
        r: dict[str, Any] = {"claim": f"{meta.get('namespace', NS)}/{meta['name']}", "devices": []}
        for k in range(len(nodes)):
            node = nodes[(i + k) % len(nodes)]
            try:
                got = alloc.allocate([claim], node)
            except AllocationError as err:
                r["error"] = str(err)
                break
            if got is None:
                continue
            api = got[0].to_api()
            r["node"] = node
            r["devices"] = [_as_allocbench(d) for d in api["devices"]["results"]]
            if api.get("nodeSelector"):
                r["nodeSelector"] = api["nodeSelector"]
            alloc.state.add(api)
            break
        results.append(r)
    return results, time.perf_counter() - t0


def _as_allocbench(result: dict[str, Any]) -> dict[str, Any]:
    """A device result as allocbench prints it (share ids are random: only whether there is one)."""
    out = {key: result[key] for key in ("request", "driver", "pool", "device")}
    if result.get("shareID"):
        out["shared"] = True
    for key in ("consumedCapacity", "bindingConditions", "bindingFailureConditions"):
        if result.get(key):
            out[key] = result[key]
    return out


def differences(ours: list[Any], go: list[Any]) -> list[str]:
    return [f"{a['claim']}: ours {a} / Go {b}" for a, b in zip(ours, go, strict=True) if a != b]


def test_allocbench_and_ours_agree_on_a_mixed_fleet(tmp_path: Path) -> None:
    binary = build_allocbench()
    names, slices = fleet(3, tmp_path)
    # 36 claims on 3 nodes (24 GPUs): the later ones find nodes full and move on, the last ones fit nowhere.
    inp = {"slices": slices, "classes": classes(), "claims": claims(36, extra=(("gpu", 9),)), "nodes": names}
    go, _ = run_go(binary, inp, timeout=60)
    ours, _ = run_ours(inp)
    assert len(ours) == len(go) == 37
    assert [r["error"] for r in go if r.get("error")] == []
    assert differences(ours, go) == []
    placed = [r for r in go if r.get("node")]
    assert {r["node"] for r in placed} == set(names)
    assert any(r["devices"] and "-mig-" in r["devices"][0]["device"] for r in placed), "no MIG partition allocated"
    assert not go[-1].get("node") and go[-1]["devices"] == []  # nine GPUs fit on no node
    assert any(not r.get("node") for r in go[:-1]), "the fleet never filled up: the test checks nothing about failure"
