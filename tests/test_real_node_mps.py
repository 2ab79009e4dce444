"""MPS on the real node, the driver installed by its chart with the simulator privileged (`mps.simulatorPrivileged`):
a claim's MPS control daemon runs in a pod of its own (dra_driver.sharing.mps_deployment), so it outlives the
driver pod (deleted and recreated, then a rolling update); the claim's /dev/shm is a real tmpfs that the plugin
mounts and the host, the workload and the daemon share; deleting the workload unprepares it all: the daemon pod is
gone, the tmpfs unmounted, the directory removed and the GPU's compute mode restored."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from dra_driver.sharing.tmpfs import mount_at
from dra_driver.simulator.tools.state import SharingState
from tests.cluster import images
from tests.cluster.driver import DRIVER_NAME as D
from tests.cluster.node import Node
from tests.polling import wait_until
from tests.test_real_pods import GPU, NS, Cluster, claim, deployed, pod, req, sharing

SHM_SIZE_KIB = 96 * 1024  # mps.shmSize: not containerd's 64 MiB /dev/shm, not half of this host's memory
VALUES = ("--set", "mps.simulatorPrivileged=true", "--set", f"mps.shmSize={SHM_SIZE_KIB}k")


@pytest.fixture(scope="module")
def cluster(real_node: Node) -> Iterator[Cluster]:
    # Bidirectional propagation needs the host directory on a shared mount (containerd refuses a private one): a
    # host with systemd has / shared; this node's directories are on a private mount, so the plugin directory gets
    # a shared bind mount of its own for the module.
    plugin_dir = real_node.kubelet_dir / "plugins" / D
    plugin_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(plugin_dir), str(plugin_dir)], check=True, timeout=30)
    subprocess.run(["mount", "--make-shared", str(plugin_dir)], check=True, timeout=30)
    try:
        with deployed(real_node, values=VALUES) as c:
            yield c
    finally:
        subprocess.run(["umount", "--lazy", "--recursive", str(plugin_dir)], check=False, timeout=30)


def daemon_pods(c: Cluster) -> list[dict[str, Any]]:
    listed = c.cp.kubectl_json("get", "pods", "-n", c.release.namespace, "-l", f"{D}/mps-claim-uid")
    return list(listed["items"])


def ready_daemon(c: Cluster) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        pods = daemon_pods(c)
        if len(pods) != 1:
            return None
        conditions = {x["type"]: x["status"] for x in pods[0]["status"].get("conditions", [])}
        return pods[0] if conditions.get("Ready") == "True" else None

    return dict(wait_until("the MPS daemon pod Ready", ready, timeout=60))


def state(c: Cluster) -> SharingState:
    return SharingState(c.release.sim_state / c.release.machine)


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def workload(name: str, claim_name: str) -> dict[str, Any]:
    """A pod of the claim whose container prints its /dev/shm mount, writes a file there, then shows its devices."""
    p = pod(name, claim_name=claim_name)
    (container,) = p["spec"]["containers"]
    container["command"] = ["sh", "-c", "grep ' /dev/shm ' /proc/self/mounts; echo hi > /dev/shm/from-workload; "
                            "exec show-devices"]  # fmt: skip
    return p


def test_an_mps_claims_daemon_outlives_the_driver_pod_and_goes_with_the_claim(cluster: Cluster) -> None:
    c, release = cluster, cluster.release
    c.apply(claim("mps", req("gpu", GPU), config=sharing("MPS", defaultActiveThreadPercentage=50)),
            workload("mps-0", "mps"))  # fmt: skip
    c.wait_running("mps-0")
    uid = c.cp.kubectl_json("get", "resourceclaim", "mps", "-n", NS)["metadata"]["uid"]
    directory = release.plugin_dir / "mps" / uid

    # the daemon: its own pod on this node, the simulated daemon a real process on the host (hostPID)
    daemon = ready_daemon(c)
    assert daemon["metadata"]["name"] == f"mps-control-daemon-{uid}"
    assert daemon["spec"]["nodeName"] == c.node.name and daemon["spec"]["hostPID"] is True
    env = {e["name"]: e["value"] for e in daemon["spec"]["containers"][0]["env"]}
    (gpu_uuid,) = env["CUDA_VISIBLE_DEVICES"].split(",")
    running = state(c).daemons()[str(directory / "pipe")]
    pid = int(running["pid"])
    assert running["foreground"] is True and running["active_thread_percentage"] == 50 and alive(pid)
    assert state(c).compute_mode(gpu_uuid) == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS

    # the workload: the daemon's pipe, and the claim's tmpfs as /dev/shm, the same one the host sees
    lines = images.shown_lines(c.cp, "mps-0", NS)
    seen = json.loads(lines[-1])
    assert seen["env"]["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert any(m["target"] == "/tmp/nvidia-mps" for m in seen["mounts"]), seen
    shm_lines = [line.split() for line in lines[:-1] if " /dev/shm " in line]
    assert shm_lines and shm_lines[-1][2] == "tmpfs" and f"size={SHM_SIZE_KIB}k" in shm_lines[-1][3], lines
    host_shm = mount_at(directory / "shm")
    assert host_shm is not None and host_shm.fs_type == "tmpfs" and f"size={SHM_SIZE_KIB}k" in host_shm.options
    assert (directory / "shm" / "from-workload").read_text() == "hi\n"
    inside = c.cp.kubectl("exec", "-n", release.namespace, daemon["metadata"]["name"], "--",
                          "grep", f" {directory}/shm ", "/proc/self/mounts").stdout  # fmt: skip
    assert " tmpfs " in inside and f"size={SHM_SIZE_KIB}k" in inside, inside  # the daemon's view: the same tmpfs

    # the driver pod deleted and recreated, then a rolling update: the same daemon pod and process throughout
    old = release.wait_ready_pod()
    registered = release.registrations()
    c.cp.delete("pod", old["metadata"]["name"], namespace=release.namespace, missing_ok=False, wait=120)
    fresh = release.wait_registered(time.monotonic() + 90, registrations=registered + 1)
    assert fresh["metadata"]["uid"] != old["metadata"]["uid"]
    release.install("--set-string", f"podAnnotations.restarted={time.time_ns()}")  # a new template: a new pod
    newest = release.wait_ready_pod()
    assert newest["metadata"]["uid"] not in (old["metadata"]["uid"], fresh["metadata"]["uid"])
    after = ready_daemon(c)
    assert after["metadata"]["uid"] == daemon["metadata"]["uid"]
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
    assert int(state(c).daemons()[str(directory / "pipe")]["pid"]) == pid and alive(pid)
    assert c.cp.kubectl_json("get", "pod", "mps-0", "-n", NS)["status"]["phase"] == "Running"
    assert mount_at(directory / "shm") is not None

    # the workload goes: unprepared by the newest driver pod, the daemon goes first, then what it used
    c.cp.delete("pod", "mps-0", namespace=NS, missing_ok=False, wait=120)
    c.cp.delete("resourceclaim", "mps", namespace=NS, missing_ok=False, wait=120)
    wait_until("checkpoint empty", lambda: release.checkpoint_claims() == {}, timeout=60)
    assert daemon_pods(c) == []
    wait_until("the daemon process gone", lambda: not alive(pid), timeout=30)
    assert state(c).daemons() == {}
    assert mount_at(directory / "shm") is None and not directory.exists()
    assert state(c).compute_mode(gpu_uuid) == pynvml.NVML_COMPUTEMODE_DEFAULT
    assert c.claim_specs() == []
    logs = release.logs()
    assert "no privilege to mount" not in logs, logs  # privileged: a real tmpfs, no fallback
