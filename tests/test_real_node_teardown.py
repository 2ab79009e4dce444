"""The real test node's teardown, with a node of its own (`no_shared_node` stops the shared one first)."""

from __future__ import annotations

from pathlib import Path

from tests.cluster import images
from tests.cluster.controlplane import ControlPlane
from tests.cluster.node import Node
from tests.polling import wait_until
from tests.test_real_node import run_pod, workload_pod


def test_a_stopped_node_leaves_nothing_on_the_host(node_binaries: Path, no_shared_node: None) -> None:
    """Its own control plane and node (so it runs with no other node alive): a pod running at stop() time, then
    every process, mount, network namespace, cgroup, bridge, address, sysctl and directory checked."""
    with ControlPlane(bin_dir=node_binaries, service_accounts=True) as cp:
        node = Node(cp, sandbox_image=images.PAUSE_IMAGE, images=[images.pause_image(), images.workload_image()])
        node.start()
        try:
            work, state = node.work_dir, node.state_dir
            pod = workload_pod("left-running", volumes=[{"name": "scratch", "emptyDir": {"medium": "Memory"}}])
            pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
            wait_until(
                "the default service account",
                lambda: cp.kubectl("get", "serviceaccount", "default", check=False).returncode == 0,
            )
            run_pod(cp, pod)
        finally:
            node.stop()
        assert node.leftovers(work, state) == {}
