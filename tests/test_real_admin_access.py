"""Admin access (KEP-5018, GA in 1.37) on the real node: a claim with `adminAccess: true`, in a namespace labelled
`resource.kubernetes.io/admin-access: "true"`, on a GPU and a MIG device that a user's pod holds. The admin pod gets
the held device's nodes; nothing of the holder's changes: no MIG instance carved or destroyed, the GPU's time slice
kept, the holder's CDI spec and checkpoint entry untouched when the admin pod goes (docs/admin-access.md).

`static` (the chart's layout before 1.37, the MIG device made by an admin before the install) runs through the real
scheduler. `partitionable` cannot yet: kube-scheduler (1.37.2 too) checks an admin request's counters as a user's
(kubernetes/kubernetes#140729), so no held partitionable device fits; the test shows that, then hands the kubelet a
claim allocated as the fixed scheduler would, to show the driver shares the carved partition without carving one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from dra_driver.simulator.nvml import SimulatedNvml
from tests.cluster import images
from tests.cluster.controlplane import KubectlError
from tests.cluster.driver import DRIVER_NAME as D
from tests.cluster.driver import NO_SURGE_VALUES
from tests.cluster.node import Node
from tests.polling import wait_until
from tests.simhelpers import create_full_ci, create_gi
from tests.test_real_pods import GPU, NS, Cluster, claim, deployed, mig, pod, req, time_slice

ADMIN_NS = "gpu-admin"
ADMIN_LABEL = "resource.kubernetes.io/admin-access"
MACHINE = "dgx-h100"
PREMADE = (0, 19, 6)  # static: the 1g.10gb instance an admin made on GPU 0 (profile 19, memory slice 6)
TIME_SLICE_SETTERS = ("--set-timeslice", "-c", "--compute-mode")


def _mig(enable: bool, node: Node) -> None:
    """GPU 0 of the shared node's simulated machine: MIG on with the pre-made instance, or off with none."""
    sim = SimulatedNvml(MACHINE, node.work_dir / "sim-state" / MACHINE)
    sim.nvmlInit()
    try:
        gpu = sim.nvmlDeviceGetHandleByIndex(PREMADE[0])
        if enable:
            sim.nvmlDeviceSetMigMode(gpu, pynvml.NVML_DEVICE_MIG_ENABLE)
            create_full_ci(sim, create_gi(sim, gpu, PREMADE[1], PREMADE[2], 1), 1)
            return
        if sim.nvmlDeviceGetMigMode(gpu)[0]:
            for gi in sim.store.read().gpus[PREMADE[0]].gpu_instances:
                handle = sim.nvmlDeviceGetGpuInstanceById(gpu, gi.id)
                for ci in gi.compute_instances:
                    sim.nvmlComputeInstanceDestroy(sim.nvmlGpuInstanceGetComputeInstanceById(handle, ci.id))
                sim.nvmlGpuInstanceDestroy(handle)
            sim.nvmlDeviceSetMigMode(gpu, pynvml.NVML_DEVICE_MIG_DISABLE)
    finally:
        sim.nvmlShutdown()


@pytest.fixture(scope="module")
def cluster(real_node: Node) -> Iterator[Cluster]:
    _mig(True, real_node)  # before the install: `static` publishes what exists
    try:
        # the last test changes the mode by helm upgrade: no surge (NO_SURGE_VALUES says why)
        values = ["--set", "mode=static", *NO_SURGE_VALUES]
        with deployed(real_node, values=values, machine=MACHINE) as c:
            c.cp.create_namespace(ADMIN_NS)
            c.cp.patch("namespace", ADMIN_NS, {"metadata": {"labels": {ADMIN_LABEL: "true"}}})
            try:
                yield c
            finally:
                c.cp.delete_namespace(ADMIN_NS)
    finally:
        _mig(False, real_node)


# ----- helpers ---------------------------------------------------------------------------------------------------
def admin_claim(name: str, cls: str, selector: str, config: Any = None) -> dict[str, Any]:
    c = claim(name, req("gpu", cls, adminAccess=True, selectors=[{"cel": {"expression": selector}}]), config=config)
    c["metadata"]["namespace"] = ADMIN_NS
    return c


def admin_pod(name: str, claim_name: str) -> dict[str, Any]:
    p = pod(name, claim_name=claim_name)
    p["metadata"]["namespace"] = ADMIN_NS
    return p


def by_uuid(uuid: str) -> str:
    return f'device.attributes["{D}"].uuid == "{uuid}"'


def get(c: Cluster, kind: str, name: str, ns: str) -> dict[str, Any]:
    return dict(c.cp.kubectl_json("get", kind, name, "-n", ns))


def wait_admin_running(c: Cluster, name: str) -> None:
    def running() -> bool:
        return bool(get(c, "pod", name, ADMIN_NS)["status"].get("phase") == "Running")

    try:
        wait_until(f"admin pod {name} Running", running, timeout=90)
    except AssertionError:
        described = c.cp.kubectl("describe", "pod", name, "-n", ADMIN_NS, check=False).stdout
        raise AssertionError(f"{name} not Running:\n{described[-3000:]}\n{c.release.logs()[-3000:]}") from None


def result_of(claim_obj: dict[str, Any]) -> dict[str, Any]:
    (result,) = claim_obj["status"]["allocation"]["devices"]["results"]
    return dict(result)


def char_devices(c: Cluster, pod_name: str, ns: str) -> set[tuple[str, int, int]]:
    seen = json.loads(images.shown_lines(c.cp, pod_name, ns)[-1])
    return {(d["path"], d["major"], d["minor"]) for d in seen["devices"] if d["type"] == "c"}


def spec_nodes(spec: dict[str, Any]) -> set[tuple[str, int, int]]:
    edits = [spec.get("containerEdits", {}), *(d["containerEdits"] for d in spec["devices"])]
    return {(n["path"], n["major"], n["minor"]) for e in edits for n in e.get("deviceNodes", [])}


def sharing_now(c: Cluster) -> dict[str, Any]:
    state = c.sharing_state().read()
    return {k: state[k] for k in ("timeslice", "compute_mode", "mps")}


def setters(c: Cluster) -> int:
    """How many nvidia-smi calls so far changed a GPU's time slice or compute mode."""
    return sum(1 for call in c.sharing_state().calls if any(a in TIME_SLICE_SETTERS for a in call["argv"]))


def prepare_failures(c: Cluster, pod_name: str) -> list[str]:
    listed = c.cp.kubectl_json("get", "events", "-n", ADMIN_NS, "--field-selector", f"involvedObject.name={pod_name}")
    return [str(e.get("message", "")) for e in listed["items"] if e.get("type") == "Warning"]


# ----- tests -----------------------------------------------------------------------------------------------------
def test_an_admin_claim_outside_an_admin_namespace_is_refused_by_the_api_server(cluster: Cluster) -> None:
    with pytest.raises(KubectlError) as refused:
        cluster.cp.create(claim("no-label", req("gpu", GPU, adminAccess=True)))
    assert ADMIN_LABEL in refused.value.stderr, refused.value.stderr
    assert "Forbidden" in refused.value.stderr or "forbidden" in refused.value.stderr, refused.value.stderr


def test_admin_pods_get_the_held_gpu_and_mig_device_and_change_nothing_of_the_holder(cluster: Cluster) -> None:
    cluster.apply(
        claim("held-gpu", req("gpu", GPU), config=time_slice("Long")),
        claim("held-mig", req("gpu", mig("1g.10gb"))),
        pod("user-gpu", claim_name="held-gpu"),
        pod("user-mig", claim_name="held-mig"),
    )
    for name in ("user-gpu", "user-mig"):
        cluster.wait_running(name)
        cluster.check_sees_its_devices(name)
    held = {n: get(cluster, "resourceclaim", n, NS) for n in ("held-gpu", "held-mig")}
    gpu_dev, mig_dev = (result_of(held[n])["device"] for n in ("held-gpu", "held-mig"))
    gpu_uuid, mig_uuid = cluster.attribute(gpu_dev, "uuid"), cluster.attribute(mig_dev, "uuid")
    assert cluster.sharing_state().timeslice(gpu_uuid) == 3  # Long, the holder's
    user_uids = {held[n]["metadata"]["uid"] for n in held}
    before = {
        "mig": cluster.mig_instances(),
        "sharing": sharing_now(cluster),
        "setters": setters(cluster),
        "checkpoint": {u: e for u, e in cluster.release.checkpoint_claims().items() if u in user_uids},
        "specs": {u: cluster.cdi_spec(u) for u in user_uids},
    }
    assert before["mig"] == [PREMADE]

    cluster.apply(
        admin_claim("watch-gpu", GPU, by_uuid(gpu_uuid)),
        admin_claim("watch-mig", mig("1g.10gb"), by_uuid(mig_uuid)),
        admin_pod("admin-gpu", "watch-gpu"),
        admin_pod("admin-mig", "watch-mig"),
    )
    for name in ("admin-gpu", "admin-mig"):
        wait_admin_running(cluster, name)
    admins = {n: get(cluster, "resourceclaim", n, ADMIN_NS) for n in ("watch-gpu", "watch-mig")}
    # the real scheduler gave each the very device the user's claim holds, with admin access
    assert {k: result_of(v)["device"] for k, v in admins.items()} == {"watch-gpu": gpu_dev, "watch-mig": mig_dev}
    assert all(result_of(v).get("adminAccess") is True for v in admins.values())
    admin_uids = {v["metadata"]["uid"] for v in admins.values()}
    # each admin pod sees its CDI spec's device nodes: the held GPU's, and the MIG device's capability nodes
    for admin, user, name in (("admin-gpu", "user-gpu", "watch-gpu"), ("admin-mig", "user-mig", "watch-mig")):
        seen = char_devices(cluster, admin, ADMIN_NS)
        assert seen == spec_nodes(cluster.cdi_spec(admins[name]["metadata"]["uid"])), admin
        assert seen == char_devices(cluster, user, NS), admin  # the same nodes as the holder's
    assert any("nvidia-caps" in path for path, _, _ in char_devices(cluster, "admin-mig", ADMIN_NS))
    entries = cluster.release.checkpoint_claims()
    for uid in admin_uids:
        (device,) = entries[uid]["devices"]
        assert device.get("admin_access") is True and not device.get("sharing"), device
    # nothing of the holder changed: no MIG instance carved, no sharing setting made
    assert cluster.mig_instances() == before["mig"]
    assert sharing_now(cluster) == before["sharing"] and setters(cluster) == before["setters"]

    cluster.cp.delete("pod", "admin-gpu", "admin-mig", namespace=ADMIN_NS, missing_ok=False, wait=120)
    wait_until("the admin claims unprepared", lambda: not admin_uids & set(cluster.release.checkpoint_claims()),
               timeout=60)  # fmt: skip
    left = [p.name for u in admin_uids for p in cluster.node.cdi_dir.glob(f"*{u}*")]
    assert not [n for n in left if n.endswith(".json")], left  # their CDI specs removed
    # ... and their unprepare left the holder's state alone
    assert {u: e for u, e in cluster.release.checkpoint_claims().items() if u in user_uids} == before["checkpoint"]
    assert {u: cluster.cdi_spec(u) for u in user_uids} == before["specs"]
    assert cluster.mig_instances() == before["mig"]
    assert sharing_now(cluster) == before["sharing"] and setters(cluster) == before["setters"]
    for name in ("user-gpu", "user-mig"):
        assert get(cluster, "pod", name, NS)["status"]["phase"] == "Running"


def test_an_admin_claim_asking_for_sharing_of_its_own_is_refused_at_prepare(cluster: Cluster) -> None:
    """A sharing setting is the GPU's, set by the claim that holds it: an admin claim cannot change or add one. The
    driver refuses it (as NVIDIA's driver does) rather than run the pod without what it asked for."""
    gpu_uuid = cluster.attribute(result_of(get(cluster, "resourceclaim", "held-gpu", NS))["device"], "uuid")
    before, calls = sharing_now(cluster), setters(cluster)
    cluster.apply(
        admin_claim("watch-sliced", GPU, by_uuid(gpu_uuid), config=time_slice("Short")),
        admin_pod("admin-sliced", "watch-sliced"),
    )

    def refused() -> list[str] | None:
        found = [m for m in prepare_failures(cluster, "admin-sliced") if "admin access uses the device" in m]
        return found or None

    (message, *_) = wait_until("the admin claim's prepare refused", refused, timeout=60)
    assert "TimeSlicing sharing setting cannot apply" in message, message
    uid = get(cluster, "resourceclaim", "watch-sliced", ADMIN_NS)["metadata"]["uid"]
    assert uid not in cluster.release.checkpoint_claims()
    assert get(cluster, "pod", "admin-sliced", ADMIN_NS)["status"]["phase"] == "Pending"
    assert sharing_now(cluster) == before and setters(cluster) == calls  # still Long, nothing run
    cluster.release.log.expect(r"admin access uses the device as the claim that holds it set it up")
    cluster.cp.delete("pod", "admin-sliced", namespace=ADMIN_NS, missing_ok=False, wait=120)
    cluster.cp.delete("pod", "user-gpu", "user-mig", namespace=NS, missing_ok=False, wait=120)
    wait_until("every claim unprepared", lambda: cluster.release.checkpoint_claims() == {}, timeout=60)
    assert cluster.mig_instances() == [PREMADE]  # the admin-made instance stays: not the driver's
    assert cluster.sharing_state().timeslice(gpu_uuid) == 0  # the holder's Long reset at its unprepare


def test_partitionable_the_scheduler_refuses_and_the_driver_shares_the_carved_partition(cluster: Cluster) -> None:
    """Under `partitionable` every device consumes counters, and kube-scheduler checks an admin request's counters
    as a user's (kubernetes/kubernetes#140729): an admin claim on a held whole GPU stays unschedulable. A claim
    allocated as the scheduler will once that is fixed (admin access, the holder's carved partition) is prepared on
    the real kubelet by sharing the partition: no MIG instance carved, none destroyed when the admin pod goes."""
    _mig(False, cluster.node)  # the pre-made instance goes; partitionable carves its own
    cluster.release.install("--set", "mode=partitionable")
    wait_until("partitionable slices", lambda: any(s["spec"].get("sharedCounters") for s in cluster.release.slices()),
               timeout=60)  # fmt: skip
    cluster.apply(
        claim("carved", req("gpu", mig("1g.10gb"))),
        claim("whole", req("gpu", GPU)),
        pod("user-carved", claim_name="carved"),
        pod("user-whole", claim_name="whole"),
    )
    for name in ("user-carved", "user-whole"):
        cluster.wait_running(name)
    carved = get(cluster, "resourceclaim", "carved", NS)
    instances = cluster.mig_instances()
    assert len(instances) == 1
    # the scheduler: the held whole GPU's counters are consumed, and it counts them again for the admin request
    whole_uuid = cluster.attribute(result_of(get(cluster, "resourceclaim", "whole", NS))["device"], "uuid")
    cluster.apply(admin_claim("watch-whole", GPU, by_uuid(whole_uuid)), admin_pod("admin-whole", "watch-whole"))

    def unschedulable() -> str | None:
        conditions = get(cluster, "pod", "admin-whole", ADMIN_NS)["status"].get("conditions", [])
        found = [c for c in conditions if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"]
        return str(found[0].get("message")) if found else None

    wait_until("the admin pod on the held whole GPU unschedulable", unschedulable, timeout=60)
    assert "allocation" not in get(cluster, "resourceclaim", "watch-whole", ADMIN_NS).get("status", {})
    cluster.cp.delete("pod", "admin-whole", namespace=ADMIN_NS, missing_ok=False, wait=60)

    # the driver: what the scheduler would write (the holder's partition, admin access; the pod bound to the node and
    # reserving the claim), written here; the kubelet and the driver do the rest
    cluster.cp.create(admin_claim("watch-carved", mig("1g.10gb"), "true"))
    p = admin_pod("admin-carved", "watch-carved")
    p["spec"]["nodeName"] = cluster.node.name
    uid = cluster.cp.create(p)["metadata"]["uid"]
    allocation = {"devices": {"results": [{**result_of(carved), "adminAccess": True}]},
                  "nodeSelector": carved["status"]["allocation"]["nodeSelector"]}  # fmt: skip
    reserved = [{"resource": "pods", "name": "admin-carved", "uid": uid}]
    cluster.cp.patch("resourceclaim", "watch-carved", {"status": {"allocation": allocation, "reservedFor": reserved}},
                     namespace=ADMIN_NS, subresource="status")  # fmt: skip
    wait_admin_running(cluster, "admin-carved")
    admin_uid = get(cluster, "resourceclaim", "watch-carved", ADMIN_NS)["metadata"]["uid"]
    assert char_devices(cluster, "admin-carved", ADMIN_NS) == char_devices(cluster, "user-carved", NS)
    entries = cluster.release.checkpoint_claims()
    ((admin_dev,),) = [entries[admin_uid]["devices"]]
    ((user_dev,),) = [entries[carved["metadata"]["uid"]]["devices"]]
    assert admin_dev["admin_access"] is True and admin_dev["mig"] == user_dev["mig"]  # the holder's instance
    assert cluster.mig_instances() == instances  # none carved
    cluster.cp.delete("pod", "admin-carved", namespace=ADMIN_NS, missing_ok=False, wait=120)
    wait_until("the admin claim unprepared", lambda: admin_uid not in cluster.release.checkpoint_claims(), timeout=60)
    assert cluster.mig_instances() == instances  # the holder's partition stays
    assert get(cluster, "pod", "user-carved", NS)["status"]["phase"] == "Running"
    assert carved["metadata"]["uid"] in cluster.release.checkpoint_claims()
    cluster.cp.delete("pod", "user-carved", "user-whole", namespace=NS, missing_ok=False, wait=120)
    wait_until("every claim unprepared", lambda: cluster.release.checkpoint_claims() == {}, timeout=60)
    wait_until("the carved partition destroyed", lambda: cluster.mig_instances() == [], timeout=30)
