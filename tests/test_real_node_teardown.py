"""The real test node's teardown, with a node of its own (`no_shared_node` stops the shared one first)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.cluster import images, netfilter
from tests.cluster.controlplane import ControlPlane, KubectlError
from tests.cluster.node import DEVICE_PLUGIN_CHECKPOINT, Node
from tests.polling import wait_until
from tests.test_real_node import run_pod, workload_pod

# What the kubelet wrote in its device-plugin checkpoint while NVIDIA's device plugin served a pod (test_real_nvidia),
# checksum and all: a session killed then leaves it behind.
STALE_CHECKPOINT = (
    '{"Data":{"PodDeviceEntries":[{"PodUID":"a45fc179-7015-4d00-934b-9400cc9ae09c","ContainerName":"show",'
    '"ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["GPU-a27ebfab-f146-52e5-955b-450ab7a0edc4"]},"AllocResp":'
    '"CkIKFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSKEdQVS1hMjdlYmZhYi1mMTQ2LTUyZTUtOTU1Yi00NTBhYjdhMGVkYzQ="}],'
    '"RegisteredDevices":{"nvidia.com/gpu":["GPU-a27ebfab-f146-52e5-955b-450ab7a0edc4"]}},"Checksum":3626023466}'
)


def test_a_stopped_node_leaves_nothing_on_the_host(node_binaries: Path, no_shared_node: None) -> None:
    """Its own control plane and node (so it runs with no other node alive): a pod running at stop() time, then
    every process, mount, network namespace, cgroup, bridge, address, sysctl, iptables/nftables rule and directory
    checked. It starts where a killed session left the kubelet's device-plugin checkpoint, which a new kubelet would
    restore into its Node's capacity (every later module on the shared node then found it unfit and started a node of
    its own). The kubelet makes no iptables chain (makeIPTablesUtilChains: false): before, it left KUBE-FIREWALL in the
    host's INPUT and OUTPUT, its canaries and its hint behind."""
    made = [p for p in reversed(DEVICE_PLUGIN_CHECKPOINT.parents) if not p.exists()]
    DEVICE_PLUGIN_CHECKPOINT.parent.mkdir(parents=True, exist_ok=True)
    DEVICE_PLUGIN_CHECKPOINT.write_text(STALE_CHECKPOINT)
    try:
        with ControlPlane(bin_dir=node_binaries, service_accounts=True) as cp:
            node = Node(cp, sandbox_image=images.PAUSE_IMAGE, images=[images.pause_image(), images.workload_image()])
            node.start()
            try:
                capacity = cp.kubectl_json("get", "node", node.name)["status"]["capacity"]
                assert not [r for r in capacity if r.startswith("nvidia.com/")], capacity
                assert netfilter.kubelet_chains() == []
                work, state = node.work_dir, node.state_dir
                pod = workload_pod("left-running", volumes=[{"name": "scratch", "emptyDir": {"medium": "Memory"}}])
                pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
                wait_until("the default service account", lambda: _exists(cp, "serviceaccount", "default"))
                run_pod(cp, pod)
            finally:
                node.stop()
        assert node.leftovers(work, state) == {}
    finally:
        for path in reversed(made):  # what this test made before the node started
            shutil.rmtree(path, ignore_errors=True)


def _exists(cp: ControlPlane, kind: str, name: str) -> bool:
    try:
        cp.kubectl_json("get", kind, name)
    except KubectlError:
        return False
    return True
