"""NVIDIA's own software on the real node (kubelet, containerd and runc), on simulated GPUs: what its users run today,
measured where our tests run ours.

- Its device plugin (v0.19.0) with its time-slicing config `replicas: 4` on a one-GPU machine: the kubelet
  advertises `nvidia.com/gpu: 4` and four pods written for it run at once on the one GPU; an XID on the GPU, which
  its health check reads through NVML's events, takes one of the four out of allocatable, as v0.18.0 and v0.19.0 do
  (tests/nvidia_device_plugin.py).

The device plugin registers `nvidia.com/gpu` with the kubelet, which keeps the resource in the Node's capacity once
the plugin has gone; a node with it there serves `nvidia.com/gpu` through device plugins, never through a DRA class.
So this module comes last on the shared node and hands it on to nobody (LEAVES_NODE_UNFIT, tests/cluster/fixtures.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_driver.simulator.catalog import machine
from dra_driver.simulator.nvml import SimulatedNvml
from tests.cluster import images
from tests.cluster.node import Node
from tests.nvidia_device_plugin import RESOURCE, NvidiaDevicePlugin
from tests.polling import wait_until
from tests.test_extended_resources import GROUP, ROOT, placed, publish

LEAVES_NODE_UNFIT = True
NS = "nvidia"
DRA_NODE = "nvidia-mixed-dra"  # kubelet-less, publishing our slices
DEVICE_CLASS = ROOT / "deviceclasses" / "gpu.yaml"  # extendedResourceName: nvidia.com/gpu


def one_gpu_machine(state: Path) -> SimulatedNvml:
    """A one-GPU H100 host (a cloud VM's shape): the first GPU of the simulated DGX H100."""
    dgx = machine("dgx-h100")
    spec = dgx.model_copy(update={"name": "h100-1gpu", "description": "one H100 80GB HBM3", "gpus": dgx.gpus[:1]})
    return SimulatedNvml(spec, state)


def workload_pod(name: str, limits: dict[str, int]) -> dict[str, Any]:
    """A pod as written for NVIDIA's device plugin: the resource in its limits; it prints what it sees."""
    container = {
        "name": "show",
        "image": images.WORKLOAD_IMAGE,
        "imagePullPolicy": "Never",
        "command": [images.SHOW_DEVICES],
        "resources": {"limits": limits},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False, "containers": [container]},
    }


@pytest.fixture(scope="module")
def node(real_node: Node) -> Iterator[Node]:
    real_node.cp.create_namespace(NS)
    try:
        yield real_node
    finally:
        real_node.cp.delete_namespace(NS)


def allocatable(node: Node, resource: str) -> str | None:
    status = node.cp.kubectl_json("get", "node", node.name)["status"]
    value = status.get("allocatable", {}).get(resource)
    return None if value is None else str(value)


def phase(node: Node, name: str) -> dict[str, Any]:
    return dict(node.cp.kubectl_json("get", "pod", name, "-n", NS))


def test_the_device_plugins_time_slicing_runs_four_pods_on_one_gpu(node: Node, tmp_path: Path) -> None:
    sim = one_gpu_machine(tmp_path / "machine")
    (uuid,) = sim.gpu_uuids
    names = [f"shared-{i}" for i in range(4)]
    with NvidiaDevicePlugin(sim, tmp_path / "device-plugin", replicas=4) as plugin:
        try:
            wait_until(f"{RESOURCE}: 4 on the node", lambda: allocatable(node, RESOURCE) == "4", timeout=60)
        except AssertionError:
            raise AssertionError(f"not advertised; the plugin's log:\n{plugin.log()[-4000:]}") from None
        pods = [workload_pod(n, {RESOURCE: 1}) for n in [*names, "fifth"]]
        node.cp.apply(*pods)
        try:
            for name in names:
                wait_until(f"{name} Running", lambda n=name: phase(node, n)["status"].get("phase") == "Running", 90)
            seen = {n: json.loads(images.shown_lines(node.cp, n, NS)[-1]) for n in names}
            # every one of the four got the one GPU, by UUID, the device plugin's way (no device nodes: the
            # NVIDIA container runtime would add them from NVIDIA_VISIBLE_DEVICES; this node's runc does not)
            assert {n: s["env"].get("NVIDIA_VISIBLE_DEVICES") for n, s in seen.items()} == dict.fromkeys(names, uuid)

            def unschedulable() -> str | None:
                conds = {c["type"]: c for c in phase(node, "fifth")["status"].get("conditions", [])}
                c = conds.get("PodScheduled", {})
                return str(c.get("message")) if c.get("reason") == "Unschedulable" else None

            # a fifth replica does not exist: the fifth pod waits
            assert f"Insufficient {RESOURCE}" in wait_until("fifth Unschedulable", unschedulable, timeout=60)
            # Its health check reads the GPU's XID events through NVML. An XID 79 (fallen off the bus) on the simulated
            # GPU marks ONE of its four replicas unhealthy, so the kubelet keeps three in allocatable and would start
            # three more pods on a GPU that is gone: its health.go keeps one device per GPU UUID, one replica
            # (NVIDIA/k8s-device-plugin#1929; still so in v0.19.0). Ours taints the GPU's device, every
            # share of it (docs/comparison.md).
            sim.nvmlInit()
            try:
                sim.inject_event(0, pynvml.nvmlEventTypeXidCriticalError, xid=79)
            finally:
                sim.nvmlShutdown()
            wait_until(f"{RESOURCE}: 3 on the node", lambda: allocatable(node, RESOURCE) == "3", timeout=60)
            marking = rf"XidCriticalError: Xid=79 on Device={uuid}::(\d); marking device as unhealthy"
            marked = re.findall(marking, plugin.log())
            assert len(marked) == 1, plugin.log()[-4000:]  # which replica: Go's map order
            assert all(phase(node, n)["status"].get("phase") == "Running" for n in names)
            assert plugin.alive() and plugin.problems() == [], plugin.log()[-4000:]
        finally:
            node.cp.delete("pods", namespace=NS, wait=120, check=False)


def test_the_device_plugins_node_keeps_its_pods_and_a_dra_node_takes_the_rest(node: Node, tmp_path: Path) -> None:
    """The device-plugin node of the mixed cluster (tests/test_extended_resources.py) made real: this node with
    NVIDIA's device plugin on a one-GPU machine, beside a kubelet-less node publishing this driver's slices, with
    the DeviceClass whose extendedResourceName is `nvidia.com/gpu` (deviceclasses/gpu.yaml). A pod asking for
    `nvidia.com/gpu: 1` runs on the device plugin's GPU, no claim made; once it is taken, the next such pod of the
    same group is served by DRA on the other node, through a claim the scheduler makes."""
    cp = node.cp
    sim = one_gpu_machine(tmp_path / "machine")
    (uuid,) = sim.gpu_uuids
    cp.kubectl("apply", "-f", str(DEVICE_CLASS))
    ((label, value),) = GROUP.items()
    cp.kubectl("label", "node", node.name, f"{label}={value}", "--overwrite")
    try:
        with NvidiaDevicePlugin(sim, tmp_path / "device-plugin") as plugin:
            wait_until(f"{RESOURCE}: 1 on the node", lambda: allocatable(node, RESOURCE) == "1", timeout=60)
            first = workload_pod("first", {RESOURCE: 1})
            first["spec"]["nodeSelector"] = GROUP
            cp.create(first)
            wait_until("first Running", lambda: phase(node, "first")["status"].get("phase") == "Running", 90)
            ran = phase(node, "first")
            assert ran["spec"]["nodeName"] == node.name and "extendedResourceClaimStatus" not in ran["status"]
            assert json.loads(images.shown_lines(cp, "first", NS)[-1])["env"]["NVIDIA_VISIBLE_DEVICES"] == uuid
            # the device plugin's one GPU is taken: the group's next pod goes to the DRA node
            cp.create_node(DRA_NODE, labels=GROUP)
            publish(cp, DRA_NODE, tmp_path)
            second = workload_pod("second", {RESOURCE: 1})
            second["spec"]["nodeSelector"] = GROUP
            cp.create(second)
            bound = placed(cp, "second", NS)
            assert bound["spec"]["nodeName"] == DRA_NODE
            status = bound["status"]["extendedResourceClaimStatus"]
            claim = cp.kubectl_json("get", "resourceclaim", status["resourceClaimName"], "-n", NS)
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert (result["driver"], result["pool"]) == ("gpu.dra-driver.dev", DRA_NODE)
            assert plugin.alive() and plugin.problems() == [], plugin.log()[-4000:]
    finally:
        # the pod bound to the kubelet-less node has no kubelet to confirm its end: forced, and the node deleted
        cp.delete("pod", "second", namespace=NS, grace_period=0, wait=120, check=False)
        cp.delete("resourceslices", wait=120, field_selector=f"spec.nodeName={DRA_NODE}", check=False)
        cp.delete("node", DRA_NODE)
        cp.delete("pods", namespace=NS, wait=120, check=False)
        cp.kubectl("delete", "-f", str(DEVICE_CLASS), "--ignore-not-found", check=False)
        cp.kubectl("label", "node", node.name, f"{label}-", check=False)
