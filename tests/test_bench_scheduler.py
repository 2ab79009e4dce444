"""bench/bench_scheduler.py measures each Kubernetes version with what that version's users get: the slice layout
the driver publishes for it, and a NUMA constraint on the attribute name it publishes; it measures kube-scheduler with
its client limits raised, beside rows with its defaults, and prints the limits in force; it fills the cluster to a
given share of its GPUs before the measured pods."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dra_driver.api.slice import ResourceSlice
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME
from dra_driver.slices.devices import PublishMode
from dra_driver.slices.limits import limits_for
from dra_driver.slices.validation import validate_pool
from tests.cluster.controlplane import SCHEDULER_DEFAULT_CLIENT, ControlPlane
from tests.loadscript import load_script
from tests.test_allocbench import fleet

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script(ROOT / "bench" / "bench_scheduler.py")


@pytest.mark.parametrize("minor", [34, 35, 36, 37])
def test_the_fleet_has_the_layout_and_names_of_the_version_it_is_measured_on(
    bench: ModuleType, tmp_path: Path, minor: int
) -> None:
    _, slices = fleet(1, tmp_path, PublishMode.PARTITIONABLE, f"v1.{minor}.0")
    validate_pool([ResourceSlice.model_validate(s) for s in slices], limits_for(minor))
    both = [s for s in slices if s["spec"].get("sharedCounters") and s["spec"].get("devices")]
    assert bool(both) == (minor == 34)  # 1.34 keeps a GPU's counter set beside its devices; later minors may not
    claim, _ = bench.claim_and_pod(0, "gpu", bench.FOUR_NUMA, minor)
    (constraint,) = claim["spec"]["devices"]["constraints"]
    name = constraint["matchAttribute"].removeprefix(f"{DEFAULT_DRIVER_NAME}/")  # as the slices spell our own
    gpus = [d for s in slices for d in s["spec"].get("devices") or [] if d["attributes"]["type"]["string"] == "gpu"]
    assert gpus and all(name in d["attributes"] for d in gpus), constraint


@pytest.mark.parametrize(("mode", "devices"), [(PublishMode.STATIC, 8), (PublishMode.PARTITIONABLE, 208)])
def test_nvidias_slices_are_captured_once_and_replicated_per_node(
    bench: ModuleType, control_plane: ControlPlane, tmp_path: Path, mode: PublishMode, devices: int
) -> None:
    """The side "NVIDIA's slices": what its plugin publishes for one simulated dgx-h100 (default gates beside our
    static, DynamicMIG beside partitionable), renamed for each bench node."""
    names, slices = bench.nvidia_fleet(control_plane, 2, mode, tmp_path)
    assert names == ["node-000", "node-001"]
    for name in names:
        mine = [s for s in slices if s["spec"]["nodeName"] == name]
        assert mine and all(s["spec"]["pool"]["name"] == name for s in mine)
        assert all(s["spec"]["driver"] == bench.NVIDIA_DRIVER for s in mine)
        assert all(s["spec"]["pool"]["resourceSliceCount"] == len(mine) for s in mine)
        assert sum(len(s["spec"].get("devices") or []) for s in mine) == devices
        assert bool([s for s in mine if s["spec"].get("sharedCounters")]) == (mode == PublishMode.PARTITIONABLE)
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)
    assert all(set(s["metadata"]) == {"name"} for s in slices)  # no uid, owner or version of the captured ones
    assert bench.nvidia_fleet(control_plane, 1, mode, tmp_path / "again")[1] == [
        s for s in slices if s["spec"]["nodeName"] == "node-000"
    ]  # captured once per server version and layout


@pytest.mark.usefixtures("control_plane")  # skips where the control plane's binaries are not built
def test_nvidias_slices_schedule_a_tiny_run(bench: ModuleType, tmp_path: Path) -> None:
    """A row of NVIDIA's DynamicMIG slices: the MIG mix (1g.10gb, whole GPUs, 3g.40gb) bound on two nodes."""
    (r,) = bench.run_layout(PublishMode.PARTITIONABLE, "MIG mix", 2, 4, tmp_path, nvidia=True)
    assert (r["layout"], r["devices"], r["bound"], r["pods"]) == ("NVIDIA DynamicMIG", 208, 4, 4)


def test_the_limits_are_read_from_configz_as_every_version_reports_them(bench: ModuleType) -> None:
    """1.36 and 1.37 answer /configz in the v1 API's names, 1.35 and older in their Go fields: the same limits."""
    new = {"clientConnection": {"qps": 5000, "burst": 5000}, "parallelism": 16, "percentageOfNodesToScore": 0}
    old = {"ClientConnection": {"QPS": 5000, "Burst": 5000}, "Parallelism": 16, "PercentageOfNodesToScore": 0}
    expected = "QPS 5000, burst 5000, parallelism 16, percentageOfNodesToScore adaptive"
    assert bench.limits_in_force(bench.configz_fields(new)) == bench.limits_in_force(bench.configz_fields(old))
    assert bench.limits_in_force(bench.configz_fields(old)) == expected


def _results(claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for c in claims for r in c["status"]["allocation"]["devices"]["results"]]


@pytest.mark.parametrize("mode", [PublishMode.STATIC, PublishMode.PARTITIONABLE, PublishMode.SHARED])
def test_fill_claims_bring_the_cluster_evenly_to_the_share_of_its_gpus(
    bench: ModuleType, tmp_path: Path, mode: PublishMode
) -> None:
    _, slices = fleet(3, tmp_path, mode, "v1.37.2")
    half = bench.fill_claims(slices, [], 50, 0, "gpu.example.com")
    assert len(half) == 12 and len({c["metadata"]["name"] for c in half}) == 12
    for claim in half:
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        (term,) = claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
        assert term["matchFields"][0]["values"] == [result["pool"]]  # on the node whose pool it is
        assert result["device"].startswith("gpu-") and "mig" not in result["device"]
        assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.example.com"
        assert bool(result.get("shareID")) == (mode == PublishMode.SHARED)
        if mode == PublishMode.SHARED:  # a shared GPU taken whole: all of its memory
            assert result["consumedCapacity"] == {"memory": "81559Mi"}
    per_node = {
        pool: sorted(r["device"] for r in _results(half) if r["pool"] == pool)
        for pool in {"node-000", "node-001", "node-002"}
    }
    assert all(devices == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"] for devices in per_node.values()), per_node
    # 90% on top of the half: 22 of the 24 GPUs (round(21.6)), ten more, to the nodes with the fewest first, none
    # taken twice, names going on
    more = bench.fill_claims(slices, _results(half), 90, len(half), "gpu.example.com")
    assert len(more) == 10 and more[0]["metadata"]["name"] == "fill-00012"
    taken = [(r["pool"], r["device"]) for r in _results(half + more)]
    assert len(taken) == len(set(taken)) == 22
    assert sorted(Counter(pool for pool, _ in taken).values()) == [7, 7, 8]
    assert bench.free_gpus(slices, _results(half + more)) == 2


def test_a_gpu_with_a_partition_allocated_counts_as_in_use(bench: ModuleType, tmp_path: Path) -> None:
    """On a partitionable layout a GPU one of whose MIG devices is allocated is not filled again: a pod of the level
    before took it."""
    _, slices = fleet(1, tmp_path, PublishMode.PARTITIONABLE, "v1.37.2")
    devices = [d["name"] for s in slices for d in s["spec"].get("devices") or []]
    mig = next(d for d in devices if d.startswith("gpu-0-mig-1g"))
    claims = bench.fill_claims(slices, [{"pool": "node-000", "device": mig, "request": "r"}], 50, 0, "gpu")
    assert sorted(r["device"] for r in _results(claims)) == ["gpu-1", "gpu-2", "gpu-3"]


@pytest.mark.usefixtures("control_plane")
def test_fill_levels_leave_room_for_exactly_the_measured_pods(bench: ModuleType, tmp_path: Path) -> None:
    """Two nodes, three pods asked for per level: the pods of the empty cluster wherever the scheduler puts them,
    then the top-up to 50% and to 90% (14 of 16 GPUs: two left, so two pods), each level timed with the limits
    raised and every pod bound."""
    rows = bench.run_layout(PublishMode.PARTITIONABLE, "whole GPUs", 2, 3, tmp_path, fills=(0, 50, 90))
    assert [(r["fill"], r["bound"], r["pods"]) for r in rows] == [(0, 3, 3), (50, 3, 3), (90, 2, 2)]
    assert all(r["client"] == "5000/5000" and r["seconds"] > 0 for r in rows)


@pytest.mark.usefixtures("control_plane")
def test_the_bench_raises_the_schedulers_client_limits_and_prints_them(bench: ModuleType) -> None:
    """The measured rows run kube-scheduler with QPS and burst 5000 and the "as deployed" row with its defaults, each
    as the running scheduler reports it (/configz), and the output states both and the API server's limits."""
    assert (bench.RAISED.qps, bench.RAISED.burst) == (5000, 5000)
    assert (SCHEDULER_DEFAULT_CLIENT.qps, SCHEDULER_DEFAULT_CLIENT.burst) == (50, 100)
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_scheduler.py"), "--nodes", "2", "--pods", "2", "--fills", "0",
         "--layouts", "static", "--no-nvidia", "--k8s", "primary"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split(" | ") for line in out.stdout.splitlines() if line.startswith("| v1.")]
    assert [(r[2], r[7], r[-1].rstrip(" |")) for r in rows] == [
        ("static", "2/2", "5000/5000"),
        ("static", "2/2", "50/100"),
    ]
    assert (
        "scheduler client 5000/5000: kube-scheduler's configuration in force (its /configz): QPS 5000, burst 5000"
        in out.stdout
    )
    assert (
        "scheduler client 50/100: kube-scheduler's configuration in force (its /configz): QPS 50, burst 100"
        in out.stdout
    )
    assert "--max-requests-inflight 400" in out.stdout
    assert "apiserver_flowcontrol_rejected_requests_total): 0" in out.stdout


def test_compatibility_groups_put_whole_gpus_and_partitions_apart(bench: ModuleType, tmp_path: Path) -> None:
    """The KEP-5963 shape tried against counters alone: a whole GPU in group `whole` with one counter, each partition
    in group `mig` with its counters; everything else as published."""
    _, slices = fleet(1, tmp_path, PublishMode.PARTITIONABLE, "v1.37.2")
    grouped = bench.with_compatibility_groups(slices)
    devices = [d for s in grouped for d in s["spec"].get("devices") or []]
    plain = [d for s in slices for d in s["spec"].get("devices") or []]
    assert [d["name"] for d in devices] == [d["name"] for d in plain]
    for d, before in zip(devices, plain, strict=True):
        (c,) = d["consumesCounters"]
        whole = d["attributes"]["type"]["string"] == "gpu"
        assert c["compatibilityGroups"] == (["whole"] if whole else ["mig"])
        assert len(c["counters"]) == 1 if whole else c["counters"] == before["consumesCounters"][0]["counters"]
    assert "compatibilityGroups" not in json.dumps(slices)  # the published slices are left as they were
