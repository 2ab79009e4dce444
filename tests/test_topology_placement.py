"""Multi-node jobs inside one NVLink clique, with the real kube-scheduler: four simulated GB200 NVL72 compute trays
(4 GPUs each) in one rack's fabric, two cliques of two trays; their slices and node labels as the node daemon
publishes them (no kubelets). A job's pods each claim a whole tray's four GPUs and ask, through pod affinity on the
driver's `gpu.clique` node label, to run in the clique of their siblings: they all land in one clique, and a pod
for which that clique has no room waits rather than spill into the other one."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.labels import node_labels
from dra_driver.nvml.discovery import discover
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME as D
from dra_driver.slices.builder import build_slices
from dra_driver.slices.devices import PublishMode
from tests.polling import wait_until

NS = "topology"
CLUSTER = "5f0c2c0e-7a1b-4c7e-9e6f-0000000000aa"
TRAYS = {"tray-0": 1, "tray-1": 1, "tray-2": 2, "tray-3": 2}  # node -> clique
CLIQUE_LABEL = f"{D}/gpu.clique"
GPU_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "topology-gpu"},
             "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{D}' && "
                                                            f"device.attributes['{D}'].type == 'gpu'"}}]}}  # fmt: skip


@pytest.fixture(scope="module")
def cluster(control_plane: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    cp = control_plane
    tmp = tmp_path_factory.mktemp("trays")
    objects: list[dict[str, Any]] = [GPU_CLASS]
    for node, clique in TRAYS.items():
        sim = SimulatedNvml("gb200-nvl72-tray", tmp / node)
        sim.place_in_fabric(CLUSTER, clique)
        inventory = discover(sim, sim.sysfs_root)
        uid = cp.create_node(node, labels=node_labels(inventory, D))
        slices = build_slices(inventory, node_name=node, k8s_version="1.36", mode=PublishMode.GPUS, node_uid=uid)
        objects += [s.to_api() for s in slices]
    cp.apply(*objects)
    cp.create_namespace(NS)
    yield cp
    cp.delete("namespace", NS, missing_ok=False)
    for node in TRAYS:
        cp.delete("resourceslices", wait=120, field_selector=f"spec.nodeName={node}")
        cp.delete_node(node)
    cp.delete("deviceclass", "topology-gpu", wait=120)


def job_pod(job: str, i: int) -> list[dict[str, Any]]:
    """A pod of `job` with a claim for four GPUs, placed in the NVLink clique of the job's other pods."""
    name = f"{job}-{i}"
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": NS},
             "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "topology-gpu",
                                                                             "count": 4}}]}}}  # fmt: skip
    affinity = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"job": job}}, "topologyKey": CLIQUE_LABEL}]}}  # fmt: skip
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": {"job": job}},
           "spec": {"affinity": affinity, "nodeSelector": {f"{D}/gpu.nvlink-cluster": CLUSTER},
                    "containers": [{"name": "c", "image": "registry.invalid/x",
                                    "resources": {"claims": [{"name": "g"}]}}],
                    "resourceClaims": [{"name": "g", "resourceClaimName": name}]}}  # fmt: skip
    return [claim, pod]


def placement(cp: Any, name: str) -> str | None:
    """The node the pod was bound to; None once the scheduler has found it unschedulable."""
    pod = cp.kubectl_json("get", "pod", name, "-n", NS)
    if pod["spec"].get("nodeName"):
        return str(pod["spec"]["nodeName"])
    conditions = {c["type"]: c for c in pod.get("status", {}).get("conditions", [])}
    if conditions.get("PodScheduled", {}).get("reason") == "Unschedulable":
        return None
    raise LookupError(name)  # not decided yet


def decided(cp: Any, name: str) -> str | None:
    def done() -> tuple[str | None] | None:
        try:
            return (placement(cp, name),)
        except LookupError:
            return None

    return wait_until(f"the scheduler's decision on {name}", done, timeout=60)[0]


def test_a_jobs_pods_share_one_nvlink_clique_and_the_one_that_does_not_fit_waits(cluster: Any) -> None:
    cp = cluster
    nodes_of = {n: cp.kubectl_json("get", "node", n)["metadata"]["labels"] for n in TRAYS}
    assert {n: labels[CLIQUE_LABEL] for n, labels in nodes_of.items()} == {
        n: f"{CLUSTER}.{c}" for n, c in TRAYS.items()
    }
    first = job_pod("train", 0)
    cp.apply(*first)
    home = decided(cp, "train-0")
    assert home is not None
    time.sleep(1)  # the second pod's affinity needs the first one's binding in the scheduler's cache
    second = job_pod("train", 1)
    cp.apply(*second)
    other = decided(cp, "train-1")
    assert other is not None and other != home and TRAYS[other] == TRAYS[home]  # the clique's other tray
    third = job_pod("train", 2)
    cp.apply(*third)
    assert decided(cp, "train-2") is None  # the clique is full; the other clique has room, but is not the job's
    devices = {
        r["device"]
        for i in (0, 1)
        for r in cp.kubectl_json("get", "resourceclaim", f"train-{i}", "-n", NS)["status"]["allocation"]["devices"][
            "results"
        ]
    }
    assert devices == {f"gpu-{m}" for m in range(4)}  # four GPUs of each tray (the same names on both nodes)
    # a job of its own goes to the free clique
    lone = job_pod("eval", 0)
    cp.apply(*lone)
    elsewhere = decided(cp, "eval-0")
    assert elsewhere is not None and TRAYS[elsewhere] != TRAYS[home]


def test_the_trays_gpus_carry_their_clique(cluster: Any) -> None:
    slices = cluster.kubectl_json("get", "resourceslices")["items"]
    cliques = {
        s["spec"]["nodeName"]: {d["attributes"]["nvlinkClique"]["string"] for d in s["spec"]["devices"]}
        for s in slices
        if s["spec"].get("nodeName") in TRAYS
    }
    assert cliques == {n: {f"{CLUSTER}.{c}"} for n, c in TRAYS.items()}
