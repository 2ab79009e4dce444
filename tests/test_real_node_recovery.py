"""Health that recovers by itself, on the real node: a simulated DGX B200 (driver R570, which reports NVML's GPU
recovery action). An XID whose recovery action is none taints nothing; one that needs a GPU reset taints the GPU
`NoExecute` and the pod holding it (its claim tolerates the taint, so the device-taint-eviction controller leaves it
running) shows the device Unhealthy; `nvidia-smi -r` on the simulated driver root is refused while a process holds
the GPU, then resets it: the taint goes with no operator command, an Event on the Node says so, the pod shows the
device Healthy again, and once that pod is gone a new claim that does not tolerate anything gets the device. The
claim's `status.devices` entry describes the GPU (`data`) and follows its health (`DeviceHealthy`)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from dra_driver.simulator.nvml import SimulatedNvml
from tests.cluster.driver import DRIVER_NAME as D
from tests.cluster.node import Node
from tests.polling import wait_until
from tests.test_real_node_health import device_health, wait_health
from tests.test_real_pods import GPU, NS, Cluster, deployed, pod, req, template

MACHINE = "dgx-b200"
XID_NONE, XID_RESET = 13, 48  # an application fault; a double-bit ECC error (NVML: reset the GPU)
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def cluster(real_node: Node) -> Iterator[Cluster]:
    with deployed(real_node, machine=MACHINE) as c:
        yield c


def taints(cluster: Cluster, device: str) -> list[tuple[str, str | None, str]]:
    for s in cluster.release.slices():
        for d in s["spec"].get("devices") or []:
            if d["name"] == device:
                return [(t["key"], t.get("value"), t["effect"]) for t in d.get("taints") or []]
    raise KeyError(device)


def node_events(cluster: Cluster, reason: str) -> list[str]:
    events = cluster.cp.kubectl_json(
        "get", "events", "-n", "default", "--field-selector", f"involvedObject.name={cluster.node.name},reason={reason}"
    )["items"]
    return [str(e["message"]) for e in events]


def claim_status(cluster: Cluster, claim: dict[str, Any], health: str) -> dict[str, Any] | None:
    """The driver's status.devices entry of the claim's one device, once its DeviceHealthy status is `health`."""
    got = cluster.cp.kubectl_json("get", "resourceclaim", claim["metadata"]["name"], "-n", NS)
    for entry in (got.get("status") or {}).get("devices") or []:
        if entry["driver"] == D and any(
            c["type"] == "DeviceHealthy" and c["status"] == health for c in entry["conditions"]
        ):
            return dict(entry)
    return None


def test_a_gpu_that_needs_a_reset_is_tainted_until_it_is_reset_then_serves_a_new_claim(cluster: Cluster) -> None:
    tolerating = req("gpu", GPU, tolerations=[{"key": f"{D}/xid", "operator": "Exists", "effect": "NoExecute"}])
    cluster.apply(template("tolerating-gpu", tolerating), pod("holder", template_name="tolerating-gpu"))
    cluster.wait_running("holder")
    [claim] = cluster.claims_of("holder")
    [result] = claim["status"]["allocation"]["devices"]["results"]
    device = result["device"]
    spec = cluster.cdi_spec(claim["metadata"]["uid"])
    resource_id = f"{spec['kind']}={spec['devices'][0]['name']}"
    release = cluster.release
    sim = SimulatedNvml(release.machine, release.sim_state / release.machine)
    index = sim.gpu_uuids.index(cluster.attribute(device, "uuid"))
    wait_health(cluster, "holder", resource_id, "Healthy")
    uuid = cluster.attribute(device, "uuid")
    status = wait_until("the claim's device status", lambda: claim_status(cluster, claim, "True"), 30)
    assert status["data"]["uuid"] == uuid and status["data"]["computeMode"] == "Default", status
    assert status["data"]["driverVersion"] == sim.spec.driver_version, status

    # An application fault: NVML's recovery action stays none, nothing is tainted.
    sim.inject_event(index, pynvml.nvmlEventTypeXidCriticalError, xid=XID_NONE)
    time.sleep(3)  # the daemon handles events within milliseconds: a taint would be published by now
    assert taints(cluster, device) == []
    assert device_health(cluster, "holder")[resource_id][0] == "Healthy"

    # A double-bit ECC error: the GPU needs a reset; running work on it is lost, so NoExecute.
    release.log.expect(rf"health: GPU {sim.gpu_uuids[index]} needs gpu-reset")
    sim.inject_event(index, pynvml.nvmlEventTypeXidCriticalError, xid=XID_RESET)
    wait_until("the taint", lambda: taints(cluster, device) == [(f"{D}/xid", str(XID_RESET), "NoExecute")], 30)
    _, (_, message) = wait_health(cluster, "holder", resource_id, "Unhealthy")
    assert message == f"{D}/xid={XID_RESET}:NoExecute"
    assert cluster.cp.kubectl_json("get", "pod", "holder", "-n", NS)["status"]["phase"] == "Running"  # tolerated
    assert any("needs gpu-reset" in m for m in node_events(cluster, "GpuNeedsRecovery"))
    sick = wait_until("the claim's device status False", lambda: claim_status(cluster, claim, "False"), 30)
    assert sick["conditions"][0]["reason"] == "XID" and sick["data"]["uuid"] == uuid, sick

    # The reset, as an operator (or a remediation controller) runs it on the host: refused while a process holds
    # the GPU, as the real nvidia-smi refuses; done once it has exited.
    smi = release.sim_state / release.machine / "driver-root" / "usr" / "bin" / "nvidia-smi"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        sim.attach_process(index, holder.pid)
        refused = subprocess.run([str(smi), "-r", "-i", str(index)], capture_output=True, text=True, timeout=60)
        assert refused.returncode == 255 and "In use by another client" in refused.stdout, refused
    finally:
        holder.kill()
        holder.wait()
    assert taints(cluster, device) != []  # a refused reset changes nothing
    reset = subprocess.run([str(smi), "-r", "-i", str(index)], capture_output=True, text=True, timeout=60)
    assert reset.returncode == 0 and "was successfully reset" in reset.stdout, reset
    wait_until("the taint gone", lambda: taints(cluster, device) == [], 30)
    wait_health(cluster, "holder", resource_id, "Healthy")
    assert any(device in m or sim.gpu_uuids[index] in m for m in node_events(cluster, "GpuRecovered"))

    wait_until("the claim's device status True again", lambda: claim_status(cluster, claim, "True"), 30)

    # The device serves a claim that tolerates nothing, once the pod that held it is gone.
    cluster.cp.delete("pod", "holder", namespace=NS, missing_ok=False, wait=120)
    pinned = req("gpu", GPU, selectors=[{"cel": {"expression": f"device.attributes['{D}'].uuid == '{uuid}'"}}])
    cluster.apply(template("that-gpu", pinned), pod("after-reset", template_name="that-gpu"))
    cluster.wait_running("after-reset")
    [again] = cluster.claims_of("after-reset")
    assert [r["device"] for r in again["status"]["allocation"]["devices"]["results"]] == [device]
