"""The real test node (tests/cluster/node.py): containerd + runc + the kubelet built from the pinned modules join the
test control plane, run pods from images imported without a registry, and leave the host as they found it."""

from __future__ import annotations

import ipaddress
import json
import time
from typing import Any

from tests.cluster import images, netcheck
from tests.cluster.controlplane import ControlPlane, primary_version
from tests.cluster.node import Node
from tests.polling import wait_until


def workload_pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "show",
                    "image": images.WORKLOAD_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": [images.SHOW_DEVICES],
                }
            ],
            **spec,
        },
    }


def run_pod(cp: ControlPlane, pod: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    cp.create(pod)
    name = pod["metadata"]["name"]
    ns = pod["metadata"].get("namespace", "default")
    cp.kubectl("wait", "-n", ns, "--for=condition=Ready", f"pod/{name}", f"--timeout={int(timeout)}s")
    return dict(cp.kubectl_json("get", "-n", ns, "pod", name))


def test_the_node_joins_ready_with_the_pinned_versions_and_its_own_address(real_node: Node) -> None:
    node = real_node.cp.kubectl_json("get", "node", real_node.name)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == primary_version()
    assert info["containerRuntimeVersion"] == "containerd://2.4.2"
    assert {"type": "InternalIP", "address": real_node.ip} in node["status"]["addresses"]
    # an address of the node's own, not one this machine has or routes (lo's /32 aside, which the node added)
    others = [h for h in netcheck.host_networks() if not (h.device == "lo" and str(h.network) == f"{real_node.ip}/32")]
    assert netcheck.conflicts(real_node.ip, others) == []
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    # the images came from tarballs: the dead registry was never needed
    assert {images.PAUSE_IMAGE, images.WORKLOAD_IMAGE} <= set(real_node.image_names())


def test_a_plain_pod_runs_with_a_service_account_token_and_its_log_is_readable(real_node: Node) -> None:
    cp = real_node.cp
    wait_until(
        "the default service account",
        lambda: cp.kubectl("get", "serviceaccount", "default", check=False).returncode == 0,
    )
    pod = run_pod(cp, workload_pod("plain"))
    assert pod["spec"]["nodeName"] == real_node.name
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(real_node.pod_subnet)
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert any(m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount" for m in mounts)
    seen = json.loads(images.shown_lines(cp, "plain")[-1])
    assert seen == {"devices": [], "env": {}, "mounts": []}  # no GPU asked for, none given
    cp.delete("pod", "plain", missing_ok=False, wait=60)


def test_a_pull_never_leaves_the_machine(real_node: Node) -> None:
    cp = real_node.cp
    pod = workload_pod("pull")
    pod["spec"]["containers"][0]["image"] = "registry.example.invalid/nothing:1"
    pod["spec"]["containers"][0]["imagePullPolicy"] = "Always"
    cp.create(pod)

    def pull_failed() -> str | None:
        p = cp.kubectl_json("get", "pod", "pull")
        for status in p["status"].get("containerStatuses", []):
            waiting = status["state"].get("waiting", {})
            if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff"):
                return str(waiting.get("message", ""))
        return None

    message = wait_until("the pull to fail", pull_failed, timeout=60)
    assert "127.0.0.1:9" in message  # every registry is the dead loopback port
    cp.delete("pod", "pull", missing_ok=False, wait=60)


def test_kubelet_restart_keeps_running_pods(real_node: Node) -> None:
    cp = real_node.cp
    before = run_pod(cp, workload_pod("survivor"))
    began = time.monotonic()
    real_node.restart_kubelet()
    assert time.monotonic() - began < 60
    after = cp.kubectl_json("get", "pod", "survivor")
    assert after["status"]["phase"] == "Running"
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
    assert (
        after["status"]["containerStatuses"][0]["containerID"]
        == before["status"]["containerStatuses"][0]["containerID"]
    )
    cp.delete("pod", "survivor", missing_ok=False, wait=60)
