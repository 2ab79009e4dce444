"""Differential test: the same claims through the real kube-scheduler and through our allocator.

Each scenario is a sequence of claims, each used by a pod of its own, created one after another (so the
order of allocation is the same on both sides). Feasibility must agree for every claim, and where only one
device can satisfy a request the device must agree too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.allocation.simulate import simulate
from dra_driver.nvml.discovery import discover
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME as D
from dra_driver.slices.builder import build_slices
from tests.cluster.scheduling import schedule_claim

NODE = "diff-node"
NS = "diff"
CLASSES = [
    {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": f"diff-{t}"},
     "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{D}' && "
                                                    f"device.attributes['{D}'].type == '{t}'"}}]}}
    for t in ("gpu", "mig")
]  # fmt: skip


def request(name: str, cls: str, count: int = 1, selectors: list[str] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "exactly": {
            "deviceClassName": f"diff-{cls}",
            "count": count,
            "selectors": [{"cel": {"expression": e}} for e in selectors or []],
        },
    }


def profile(p: str) -> str:
    return f"device.attributes['{D}'].profile == '{p}'"


ON_GPU0 = "device.attributes['resource.kubernetes.io'].pciBusID == '0000:1b:00.0'"


def claim(name: str, *requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"devices": {"requests": list(requests)}}
    if constraints:
        spec["devices"]["constraints"] = constraints
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


SCENARIOS: dict[str, list[dict[str, Any]]] = {
    "whole GPUs until the node is full": [
        claim("four", request("g", "gpu", 4)),
        claim("four-more", request("g", "gpu", 4)),
        claim("one-too-many", request("g", "gpu")),
    ],
    "two GPUs with matchAttribute on product": [
        claim("pair", request("a", "gpu"), request("b", "gpu"),
              constraints=[{"requests": [], "matchAttribute": f"{D}/productName"}]),
    ],
    "MIG partitions filling one GPU": [
        # pinned to GPU 0, so a single device can satisfy each: the choice is determined
        claim("big", request("m", "mig", selectors=[profile("4g.40gb"), ON_GPU0])),
        claim("three", request("m", "mig", selectors=[profile("3g.40gb"), ON_GPU0])),
        claim("no-room-left", request("m", "mig", selectors=[profile("1g.10gb"), ON_GPU0])),
        claim("many-1g", request("m", "mig", 28, selectors=[profile("1g.10gb")])),
    ],
    "four GPUs on one NUMA node": [
        claim("numa0-one", request("g", "gpu", selectors=[f"device.attributes['{D}'].numaNode == 0"])),
        # three GPUs are left on node 0: matchAttribute puts all four on node 1
        claim("numa-four", request("g", "gpu", 4), constraints=[{"requests": [], "matchAttribute": f"{D}/numaNode"}]),
        claim("numa-four-more", request("g", "gpu", 4), constraints=[{"matchAttribute": f"{D}/numaNode"}]),
    ],
    "a claim that cannot fit": [
        claim("nine", request("g", "gpu", 9)),
        claim("no-such-product", request("g", "gpu", selectors=[f"device.attributes['{D}'].productName == 'B300'"])),
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def cluster(control_plane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, list[dict[str, Any]]]]:
    cp = control_plane
    uid = cp.create_node(NODE)
    sim = SimulatedNvml("dgx-h100", tmp_path_factory.mktemp("diff-gpu"))
    slices = [
        s.to_api()
        for s in build_slices(discover(sim, sim.sysfs_root), node_name=NODE, k8s_version="1.36", node_uid=uid)
    ]
    cp.apply(*slices, *CLASSES)
    cp.create_namespace(NS)
    yield cp, slices
    cp.delete("namespace", NS, missing_ok=False)
    cp.delete("resourceslices", wait=120, field_selector=f"spec.nodeName={NODE}")
    cp.delete_node(NODE)


def _cleanup(cp: Any) -> None:
    cp.delete("pods", namespace=NS, grace_period=0, wait=120)
    cp.delete("resourceclaims", namespace=NS, wait=120)


def _numa(slices: list[dict[str, Any]], device: str) -> int:
    (d,) = [d for s in slices for d in s["spec"].get("devices") or [] if d["name"] == device]
    return int(d["attributes"]["numaNode"]["int"])


def _devices(allocation: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((r["request"], r["device"]) for r in allocation["devices"]["results"])


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_same_feasibility_as_the_kube_scheduler(cluster, scenario: str) -> None:
    cp, slices = cluster
    claims = SCENARIOS[scenario]
    try:
        scheduler = [schedule_claim(cp, c, NODE, NS) for c in claims]
        ours = simulate(slices, CLASSES, claims, node=NODE).outcomes
        for c, theirs, mine in zip(claims, scheduler, ours, strict=True):
            name = c["metadata"]["name"]
            assert (theirs is not None) == mine.allocated, (name, theirs, mine.explanations)
            if theirs is None:
                continue
            assert mine.allocation is not None
            assert len(_devices(theirs)) == len(_devices(mine.allocation)), name
            if name in ("big", "three"):  # a single device can satisfy these: the choice is determined
                assert _devices(theirs) == _devices(mine.allocation), name
            if name == "numa-four":  # four GPUs exist only on NUMA node 1 now: the set is determined
                assert _devices(theirs) == _devices(mine.allocation)
                assert {_numa(slices, d) for _, d in _devices(theirs)} == {1}
    finally:
        _cleanup(cp)


def test_explanations_name_the_blocking_reason(cluster) -> None:
    _, slices = cluster
    ours = simulate(slices, CLASSES, SCENARIOS["a claim that cannot fit"], node=NODE).outcomes
    text = ["\n".join(line for e in o.explanations for line in e.lines()) for o in ours]
    assert "not enough devices" in text[0] or "wants 9" in text[0]
    assert "rejected by claim diff/no-such-product selector #0" in text[1]


def test_scenarios_file_is_self_consistent() -> None:
    names = [c["metadata"]["name"] for cs in SCENARIOS.values() for c in cs]
    assert len(names) == len(set(names))
    assert Path(__file__).is_file()


def test_simulate_explains_a_pending_claim_of_a_live_cluster(cluster) -> None:
    import subprocess
    import sys

    cp, _ = cluster
    claims = SCENARIOS["whole GPUs until the node is full"]
    try:
        assert [schedule_claim(cp, c, NODE, NS) is not None for c in claims] == [True, True, False]
        out = subprocess.run([sys.executable, "-m", "dra_driver", "simulate", "--kubeconfig", str(cp.kubeconfig),
                              "--node", NODE], capture_output=True, text=True, timeout=120)  # fmt: skip
        assert out.returncode == 3, out.stderr
        assert "claim diff/one-too-many" in out.stdout and "cannot be allocated" in out.stdout
        assert "8 already allocated" in out.stdout, out.stdout  # the two earlier claims hold all 8 GPUs
    finally:
        _cleanup(cp)


def _rule(device: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": "diff-maintenance"},
        "spec": {
            "deviceSelector": {"driver": D, "pool": NODE, "device": device},
            "taint": {"key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"},
        },
    }


def test_a_device_taint_rule_steers_the_scheduler_and_simulate_alike(cluster) -> None:
    """A DeviceTaintRule (not the driver) taints GPU 0: the scheduler and `simulate`, offline with the rule's file
    and live from the cluster, keep every claim off it unless the claim tolerates the taint."""
    import subprocess
    import sys

    cp, slices = cluster
    (gpu0,) = [
        d["name"]
        for s in slices
        for d in s["spec"].get("devices") or []
        if d["attributes"].get("type", {}).get("string") == "gpu"
        and d["attributes"].get("resource.kubernetes.io/pciBusID", {}).get("string") == "0000:1b:00.0"
    ]
    rule = _rule(gpu0)
    tolerating = request("g", "gpu", selectors=[ON_GPU0])
    tolerating["exactly"]["tolerations"] = [{"key": "example.com/maintenance", "operator": "Exists"}]
    claims = [
        claim("any-gpu", request("g", "gpu")),  # first in search order is GPU 0: the taint moves it on
        claim("pinned-to-gpu0", request("g", "gpu", selectors=[ON_GPU0])),
        claim("tolerating-gpu0", tolerating),
    ]
    cp.apply(rule)
    try:
        time.sleep(2)  # the scheduler's ResourceSlice tracker applies the rule from its informer
        scheduler = [schedule_claim(cp, c, NODE, NS) for c in claims]
        assert [s is not None for s in scheduler] == [True, False, True]
        assert _devices(scheduler[2]) == [("g", gpu0)] and gpu0 not in {d for _, d in _devices(scheduler[0])}
        offline = simulate(slices, CLASSES, claims, node=NODE, taint_rules=[rule]).outcomes
        assert [o.allocated for o in offline] == [True, False, True]
        for theirs, mine in zip(scheduler, offline, strict=True):
            if theirs is not None:
                assert mine.allocation is not None and _devices(theirs) == _devices(mine.allocation)
        assert "example.com/maintenance=planned:NoSchedule" in "\n".join(
            line for e in offline[1].explanations for line in e.lines()
        )
        without = simulate(slices, CLASSES, claims, node=NODE).outcomes  # the rule is what decides:
        assert without[0].allocation is not None and _devices(without[0].allocation) == [("g", gpu0)]
        assert [o.allocated for o in without] == [True, False, False]  # without it GPU 0 goes to the first claim
        live = subprocess.run([sys.executable, "-m", "dra_driver", "simulate", "--kubeconfig", str(cp.kubeconfig),
                               "--node", NODE, "-o", "json"], capture_output=True, text=True, timeout=120)  # fmt: skip
        assert live.returncode == 3, live.stderr
        pending = [o for o in json.loads(live.stdout)["claims"] if not o["allocated"]]
        assert [o["claim"] for o in pending] == [f"{NS}/pinned-to-gpu0"], live.stdout
    finally:
        _cleanup(cp)
        cp.delete("devicetaintrule", "diff-maintenance", wait=120)
