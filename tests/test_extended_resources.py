"""Pods written for NVIDIA's device plugin (`nvidia.com/gpu: 1` in limits) under the real kube-scheduler, on a
cluster where some nodes still advertise the resource through a device plugin and others publish this driver's
slices (kubelet-less nodes of the session's control plane). As Kubernetes documents for DRA extended resources: a
node whose allocatable has the resource serves it as before, even if it also publishes slices; a node without it
serves it from the DeviceClass whose extendedResourceName it is (deviceclasses/gpu.yaml), through a claim the
scheduler creates for the pod."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dra_driver.slices.devices import PublishMode
from tests.cluster.controlplane import ControlPlane
from tests.polling import wait_until
from tests.test_allocbench import fleet

ROOT = Path(__file__).resolve().parent.parent
NS = "default"
GROUP = {"ext-resources-test": "mixed"}
PLUGIN_NODE, DRA_NODE, BOTH_NODE = "ext-device-plugin", "ext-dra", "ext-both"


def device_plugin_pod(name: str, node: str | None = None) -> dict[str, Any]:
    selector = {"kubernetes.io/hostname": node} if node else GROUP
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"nodeSelector": selector,
                     "containers": [{"name": "c", "image": "registry.invalid/cuda-check",
                                     "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}  # fmt: skip


def advertise(cp: ControlPlane, node: str, count: int) -> None:
    """What the device plugin's kubelet reports: `count` nvidia.com/gpu in the node's capacity and allocatable."""
    resources = {"cpu": "100", "memory": "1000Gi", "pods": "5000", "nvidia.com/gpu": str(count)}
    patch = {"status": {"capacity": resources, "allocatable": resources}}
    cp.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(patch))


def publish(cp: ControlPlane, node: str, tmp: Path) -> None:
    _, slices = fleet(1, tmp, PublishMode.STATIC)
    items = json.loads(json.dumps(slices).replace("node-000", node))
    for item in items:
        cp.create(item)


def placed(cp: ControlPlane, name: str, namespace: str = NS) -> dict[str, Any]:
    def bound() -> dict[str, Any] | None:
        p = cp.kubectl_json("get", "pod", name, "-n", namespace)
        return p if p["spec"].get("nodeName") else None

    return dict(wait_until(f"pod {name} bound", bound, timeout=60))


def test_each_kind_of_node_serves_nvidia_com_gpu_and_a_device_plugin_node_keeps_its_own(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = control_plane
    cp.kubectl("apply", "-f", str(ROOT / "deviceclasses" / "gpu.yaml"))
    for node in (PLUGIN_NODE, DRA_NODE, BOTH_NODE):
        cp.create_node(node, labels=GROUP)
    advertise(cp, PLUGIN_NODE, 1)
    advertise(cp, BOTH_NODE, 1)
    publish(cp, DRA_NODE, tmp_path)
    publish(cp, BOTH_NODE, tmp_path)
    pods = ["on-plugin-node", "on-dra-node", "on-both-node", "anywhere"]
    try:
        nodes = (PLUGIN_NODE, DRA_NODE, BOTH_NODE)
        cp.apply(*(device_plugin_pod(n, node) for n, node in zip(pods[:3], nodes, strict=True)))
        plugin_pod, dra_pod, both_pod = (placed(cp, n) for n in pods[:3])
        # the device plugin's nodes serve it from their allocatable: no claim
        assert plugin_pod["spec"]["nodeName"] == PLUGIN_NODE
        assert "extendedResourceClaimStatus" not in plugin_pod["status"]
        assert both_pod["spec"]["nodeName"] == BOTH_NODE
        assert "extendedResourceClaimStatus" not in both_pod["status"]
        # the DRA node through a claim the scheduler made, allocated a whole GPU of this driver on that node
        status = dra_pod["status"]["extendedResourceClaimStatus"]
        mappings = [(m["containerName"], m["resourceName"]) for m in status["requestMappings"]]
        assert mappings == [("c", "nvidia.com/gpu")]
        claim = cp.kubectl_json("get", "resourceclaim", status["resourceClaimName"], "-n", NS)
        assert claim["metadata"]["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == ("gpu.dra-driver.dev", DRA_NODE)
        assert result["device"].startswith("gpu-")
        # both device-plugin GPUs are taken: the next pod of the group can only be served by DRA
        cp.apply(device_plugin_pod("anywhere"))
        anywhere = placed(cp, "anywhere")
        assert anywhere["spec"]["nodeName"] == DRA_NODE and anywhere["status"].get("extendedResourceClaimStatus")
    finally:
        cp.delete("pod", *pods, namespace=NS)
        cp.delete("resourceslices", wait=120, field_selector=f"spec.nodeName={DRA_NODE}", check=False)
        cp.delete("resourceslices", wait=120, field_selector=f"spec.nodeName={BOTH_NODE}", check=False)
        cp.delete("node", PLUGIN_NODE, DRA_NODE, BOTH_NODE)
