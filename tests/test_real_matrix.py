"""The version matrix: every supported Kubernetes minor besides the primary one (tools/k8sbins/versions/: the latest
patch of each that the Go module proxy serves, built by `scripts/build-control-plane.sh VERSION`), each run as its
users run it: a control plane and a real node of that version with its default feature gates, the driver installed
by its chart with the chart's default layout for that version (static before 1.37: whole GPUs and the MIG devices
an admin created, here a 1g.10gb instance on GPU 0 made before the install), and the smoke set: the slices the
driver publishes for that version stored as published, a whole GPU, a MIG partition, a claim shared by two pods,
and a kubelet restart that running pods outlive with their devices. The primary version runs the full suite.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from dra_driver.nvml.discovery import discover
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.builder import PublishMode, build_slices
from dra_driver.slices.limits import parse_minor
from tests.cluster.controlplane import ControlPlane, matrix_versions
from tests.cluster.driver import DRIVER_NAME as D
from tests.cluster.fixtures import SharedNode, start_node, stop_node
from tests.cluster.node import NODE_CONTROLLERS
from tests.simhelpers import create_full_ci, create_gi
from tests.test_apiserver_accepts_slices import _differences
from tests.test_real_node_life import delete_and_check_clean
from tests.test_real_pods import GPU, NS, SHARED, Cluster, claim, deployed, mig, pod, req, template, time_slice

pytestmark = pytest.mark.timeout(900)
MACHINE = "dgx-h100"
ADMINS = [(0, 19, 6)]  # the MIG instance an admin made: GPU 0, 1g.10gb (profile 19) at memory slice 6


@pytest.fixture(scope="module", params=matrix_versions())
def versioned(request: pytest.FixtureRequest, node_binaries: Any, shared_node: SharedNode) -> Iterator[Cluster]:
    shared_node.stop()  # one node on the host at a time
    cp = ControlPlane(version=request.param, service_accounts=True, controllers=NODE_CONTROLLERS)
    node = start_node(cp)
    try:
        # what an admin made before installing the driver: MIG on GPU 0, one 1g.10gb instance (Hopper: no reset)
        sim = SimulatedNvml(MACHINE, node.work_dir / "sim-state" / MACHINE)
        sim.nvmlInit()
        ((index, profile, start),) = ADMINS
        gpu = sim.nvmlDeviceGetHandleByIndex(index)
        sim.nvmlDeviceSetMigMode(gpu, pynvml.NVML_DEVICE_MIG_ENABLE)
        create_full_ci(sim, create_gi(sim, gpu, profile, start, 1), 1)
        sim.nvmlShutdown()
        with deployed(node, values=["--set", "mode="], machine=MACHINE) as c:  # the chart's default layout
            yield c
    finally:
        stop_node(node)


def default_mode(minor: int) -> PublishMode:
    """The chart's default layout (templates/_helpers.tpl, dra-driver.mode)."""
    return PublishMode.PARTITIONABLE if minor >= 37 else PublishMode.STATIC


def by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items}


def test_the_server_stores_the_slices_as_the_driver_published_them_for_its_version(versioned: Cluster) -> None:
    release = versioned.release
    server = versioned.cp.server_version()
    assert server == versioned.cp.version
    sim = SimulatedNvml(release.machine, release.sim_state / release.machine)
    built = [s.to_api() for s in build_slices(discover(sim, sim.sysfs_root), node_name=versioned.node.name,
                                              k8s_version=server, mode=default_mode(parse_minor(server)))]  # fmt: skip
    stored = release.slices()
    assert len(stored) == len(built)

    def pooled(slices: list[dict[str, Any]], field: str) -> dict[str, dict[str, Any]]:
        return by_name([item for s in slices for item in s["spec"].get(field) or []])

    for field in ("devices", "sharedCounters"):
        ours, theirs = pooled(built, field), pooled(stored, field)
        assert sorted(ours) == sorted(theirs), field
        assert [d for name in ours for d in _differences(ours[name], theirs[name], f"{field}[{name}]")] == []


def test_a_whole_gpu_a_mig_partition_and_a_shared_claim(versioned: Cluster) -> None:
    versioned.apply(
        template("one-gpu", req("gpu", GPU)),
        template("one-1g", req("gpu", mig("1g.10gb"))),
        claim("timesliced", req("gpu", SHARED), config=time_slice("Long")),
    )
    pods = [pod("whole", template_name="one-gpu"), pod("small", template_name="one-1g")]
    pods += [pod(f"ts-{i}", claim_name="timesliced") for i in range(2)]
    versioned.apply(*pods)
    for p in pods:
        versioned.wait_running(p["metadata"]["name"])
        versioned.check_sees_its_devices(p["metadata"]["name"])
    assert versioned.mig_instances() == ADMINS  # handed out as it is
    assert versioned.expected("ts-0")[2] == versioned.expected("ts-1")[2]
    delete_and_check_clean(versioned, "whole", "small", "ts-0", "ts-1", mig_left=ADMINS)
    versioned.cp.delete("resourceclaim", "timesliced", namespace=NS, missing_ok=False, wait=120)


def test_running_pods_outlive_a_kubelet_restart_with_their_devices(versioned: Cluster) -> None:
    versioned.apply(pod("before-restart", template_name="one-1g"))
    before = versioned.wait_running("before-restart")
    registered = versioned.release.registrations()
    versioned.node.restart_kubelet()
    versioned.release.wait_registered(time.monotonic() + 60, registrations=registered + 1)
    after = versioned.cp.kubectl_json("get", "pod", "before-restart", "-n", NS)
    assert after["status"]["phase"] == "Running"
    assert (
        after["status"]["containerStatuses"][0]["containerID"]
        == before["status"]["containerStatuses"][0]["containerID"]
    )
    versioned.apply(pod("after-restart", template_name="one-gpu"))
    versioned.wait_running("after-restart")
    versioned.check_sees_its_devices("after-restart")
    assert {r["driver"] for c in versioned.claims_of("after-restart")
            for r in c["status"]["allocation"]["devices"]["results"]} == {D}  # fmt: skip
    delete_and_check_clean(versioned, "before-restart", "after-restart", mig_left=ADMINS)
