"""Device health in the status of prepared ResourceClaims: the DeviceHealthy condition of status.devices[]."""

from __future__ import annotations

import json
import uuid as uuidlib
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_driver.api.claim import ResourceClaim
from dra_driver.api.slice import DeviceTaint
from dra_driver.claimstate.checkpoint import CheckpointedDevice, ClaimEntry, ClaimState
from dra_driver.health.claim_status import CONDITION_TYPE, FIELD_MANAGER, ClaimStatusReporter, device_condition
from dra_driver.health.monitor import HealthMonitor
from dra_driver.kube import ApiError
from dra_driver.plugin.claims import KubeClaimSource
from dra_driver.plugin.driver import Driver, PluginSettings
from dra_driver.plugin.types import ClaimRef
from dra_driver.simulator.nvml import SimulatedNvml
from tests.plugin_helpers import DRIVER, GPU_CLASS, claim
from tests.polling import wait_for
from tests.test_publisher import api_client

XID = pynvml.nvmlEventTypeXidCriticalError
IMMUTABLE_UID = (
    '{"kind":"Status","status":"Failure","reason":"Invalid","details":{"causes":[{"reason":"FieldValueInvalid",'
    '"message":"Invalid value: \\"x\\": field is immutable","field":"metadata.uid"}]},"code":422}'
)


def taint(kind: str, value: str | None = None, effect: str = "NoSchedule") -> DeviceTaint:
    return DeviceTaint(key=f"{DRIVER}/{kind}", value=value, effect=effect, time_added="2026-01-02T03:04:05Z")  # type: ignore[arg-type]


# ----- the condition -------------------------------------------------------------------------------------------
def test_device_condition() -> None:
    healthy = device_condition("gpu-0", [])
    assert (healthy.status, healthy.reason) == ("True", "Healthy")
    xid = device_condition("gpu-0", [taint("xid", "79")])
    assert (xid.status, xid.reason) == ("False", "XID")
    assert xid.message == (f"gpu-0: XID 79 since 2026-01-02T03:04:05Z (taint {DRIVER}/xid=79:NoSchedule)")
    both = device_condition("gpu-0", [taint("xid", "79"), taint("gpu-lost", None, "NoExecute")])
    assert (both.status, both.reason) == ("False", "GPULost")  # the most severe names the reason
    assert both.message.index("GPU lost") < both.message.index("XID 79")
    ecc = device_condition("gpu-0", [taint("unmonitored", "events-not-supported", "None"), taint("ecc", "double-bit")])
    assert (ecc.status, ecc.reason) == ("False", "ECC") and "double-bit ECC error" in ecc.message
    unknown = device_condition("gpu-0", [taint("unmonitored", "xid-events-not-supported", "None")])
    assert (unknown.status, unknown.reason) == ("Unknown", "Unmonitored")


# ----- the reporter, against a stand-in API server ---------------------------------------------------------------
class FakeApi:
    """Claims by (namespace, name); applies merge status.devices entries by key, as server-side apply does for
    the entries one field manager owns."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.applied: list[dict[str, Any]] = []
        self.reads = 0
        self.fail: Exception | None = None

    def add(self, entry: ClaimEntry) -> None:
        self.claims[(entry.namespace, entry.name)] = {
            "metadata": {"name": entry.name, "namespace": entry.namespace, "uid": entry.uid},
            "status": {"devices": []},
        }

    def get_claim(self, namespace: str, name: str) -> ResourceClaim:
        self.reads += 1
        return ResourceClaim.model_validate(self.claims[(namespace, name)])

    def apply_claim_status(self, namespace: str, name: str, body: dict[str, Any], field_manager: str) -> None:
        assert field_manager == FIELD_MANAGER
        if self.fail is not None:
            raise self.fail
        obj = self.claims[(namespace, name)]
        assert body["metadata"]["uid"] == obj["metadata"]["uid"]
        self.applied.append(body)
        keys = {(d["driver"], d["pool"], d["device"]) for d in body["status"]["devices"]}
        kept = [d for d in obj["status"]["devices"] if (d["driver"], d["pool"], d["device"]) not in keys]
        obj["status"]["devices"] = kept + body["status"]["devices"]

    def conditions(self, name: str) -> dict[str, tuple[str, str, str]]:
        """device -> (status, reason, lastTransitionTime) of this driver's entries."""
        return {
            d["device"]: (c["status"], c["reason"], c["lastTransitionTime"])
            for d in self.claims[("default", name)]["status"]["devices"]
            if d["driver"] == DRIVER
            for c in d["conditions"]
            if c["type"] == CONDITION_TYPE
        }


def entry(name: str, *devices: str, state: ClaimState = ClaimState.PREPARE_COMPLETED) -> ClaimEntry:
    return ClaimEntry(
        uid=str(uuidlib.uuid4()),
        namespace="default",
        name=name,
        state=state,
        devices=[CheckpointedDevice(pool="node-a", device=d) for d in devices],
    )


class Clock:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return f"2026-01-01T00:00:{self.n:02d}Z"


@pytest.fixture
def world() -> tuple[FakeApi, list[ClaimEntry], dict[str, list[DeviceTaint]], Clock]:
    return FakeApi(), [], {}, Clock()


def reporter(world: Any) -> ClaimStatusReporter:
    api, entries, taints, clock = world
    return ClaimStatusReporter(api, DRIVER, lambda: list(entries), lambda: dict(taints), clock=clock)


def test_writes_when_a_held_device_is_tainted_and_when_it_recovers(world: Any) -> None:
    api, entries, taints, _ = world
    two, other, half = entry("two", "gpu-0", "gpu-1"), entry("other", "gpu-5"), entry("half", "gpu-0")
    half = half.with_state(ClaimState.PREPARE_STARTED)
    for e in (two, other, half):
        api.add(e)
        entries.append(e)
    r = reporter(world)
    assert r.sync_once() and api.applied == []  # all healthy, never reported: nothing written
    taints["gpu-0"] = [taint("xid", "79")]
    taints["gpu-7"] = [taint("ecc", "double-bit")]  # no claim holds it
    assert r.sync_once()
    assert len(api.applied) == 1 and api.applied[0]["metadata"]["name"] == "two"  # not `half`: not prepared
    assert api.conditions("two") == {
        "gpu-0": ("False", "XID", "2026-01-01T00:00:01Z"),
        "gpu-1": ("True", "Healthy", "2026-01-01T00:00:01Z"),
    }
    written = api.applied[0]["status"]["devices"]
    assert {(d["driver"], d["pool"]) for d in written} == {(DRIVER, "node-a")}
    assert "XID 79" in written[0]["conditions"][0]["message"]
    assert r.sync_once() and len(api.applied) == 1  # nothing changed: nothing written
    taints["gpu-0"] = [taint("xid", "79"), taint("gpu-lost", None, "NoExecute")]
    assert r.sync_once() and len(api.applied) == 2
    assert api.conditions("two")["gpu-0"] == ("False", "GPULost", "2026-01-01T00:00:01Z")  # still False: same time
    del taints["gpu-0"]  # recovered, or cleared by the operator
    assert r.sync_once() and len(api.applied) == 3
    assert api.conditions("two") == {
        "gpu-0": ("True", "Healthy", "2026-01-01T00:00:03Z"),
        "gpu-1": ("True", "Healthy", "2026-01-01T00:00:01Z"),
    }
    assert api.conditions("other") == {} and api.reads == 2  # the prepared claims, read once at the first sync
    assert r.sync_once() and len(api.applied) == 3


def test_a_failed_write_is_retried(world: Any) -> None:
    api, entries, taints, _ = world
    e = entry("c", "gpu-2")
    api.add(e)
    entries.append(e)
    r = reporter(world)
    taints["gpu-2"] = [taint("ecc", "double-bit")]
    api.fail = ApiError("PATCH", "/x", 503, "Service Unavailable", "")
    assert r.sync_once() is False and api.conditions("c") == {}
    api.fail = None
    assert r.sync_once() is True and api.conditions("c")["gpu-2"][:2] == ("False", "ECC")


def test_a_gone_claim_is_not_retried(world: Any) -> None:
    api, entries, taints, _ = world
    e = entry("c", "gpu-2")
    api.add(e)
    entries.append(e)
    r = reporter(world)
    taints["gpu-2"] = [taint("xid", "48")]
    # Replaced by a claim of the same name: the API server refuses the old UID.
    api.fail = ApiError("PATCH", "/x", 422, "Unprocessable Entity", IMMUTABLE_UID)
    assert r.sync_once() is True
    api.fail = AssertionError("written again")
    assert r.sync_once() is True
    other = entry("d", "gpu-2")
    api.add(other)
    entries.append(other)
    api.fail = ApiError("PATCH", "/x", 422, "Unprocessable Entity", '{"message": "something else"}')
    assert r.sync_once() is False  # another invalid answer: retried


def test_after_a_restart_a_stale_false_becomes_true(world: Any) -> None:
    api, entries, taints, _ = world
    e = entry("c", "gpu-3")
    api.add(e)
    entries.append(e)
    taints["gpu-3"] = [taint("xid", "79")]
    assert reporter(world).sync_once() and api.conditions("c")["gpu-3"][:2] == ("False", "XID")
    taints.clear()  # cleared while no daemon ran
    reads = api.reads
    fresh = reporter(world)
    assert fresh.sync_once() and api.conditions("c")["gpu-3"][:2] == ("True", "Healthy")
    assert fresh.sync_once() and api.reads == reads + 1  # read once, at the first sync


def test_thread_writes_on_trigger(world: Any) -> None:
    api, entries, taints, _ = world
    e = entry("c", "gpu-1")
    api.add(e)
    entries.append(e)
    api_, _, _, clock = world
    r = ClaimStatusReporter(api_, DRIVER, lambda: list(entries), lambda: dict(taints), resync_seconds=3600, clock=clock)
    r.start()
    try:
        taints["gpu-1"] = [taint("xid", "79")]
        r.trigger()
        wait_for("condition written", lambda: api.conditions("c").get("gpu-1", ("",))[0] == "False", timeout=10)
    finally:
        r.stop()


# ----- against a real API server ---------------------------------------------------------------------------------
NODE = "claim-health-node"
OTHER_DRIVER = "nic.example.com"


def _conditions(cp: Any, name: str) -> dict[tuple[str, str], dict[str, Any]]:
    status = cp.kubectl_json("get", "resourceclaim", name)["status"]
    return {
        (d["driver"], d["device"]): {c["type"]: c for c in d.get("conditions", [])} for d in status.get("devices", [])
    }


def test_claim_status_follows_the_health_of_its_device(control_plane, tmp_path: Path) -> None:
    cp = control_plane
    gpu_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                 "metadata": {"name": "claim-health-gpu"}, "spec": GPU_CLASS["spec"]}  # fmt: skip
    cp.apply(gpu_class)
    # Allocated as the scheduler allocates a node-local device, plus a device of another driver in the same claim.
    held = claim(["gpu-0"], device_class="claim-health-gpu", pool=NODE)
    held["spec"]["devices"]["requests"].append({"name": "nic", "exactly": {"deviceClassName": "claim-health-gpu"}})
    allocation = held["status"]["allocation"]
    allocation["devices"]["results"].append({"request": "nic", "driver": OTHER_DRIVER, "pool": NODE, "device": "nic-0"})
    allocation["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}  # fmt: skip
    bystander = claim(["gpu-1"], device_class="claim-health-gpu", pool=NODE)
    created = [cp.create_allocated(c) for c in (held, bystander)]
    name, other_name = (c["metadata"]["name"] for c in created)
    refs = [ClaimRef(namespace="default", name=c["metadata"]["name"], uid=c["metadata"]["uid"]) for c in created]
    # The other driver's own entry, written by its own field manager.
    nic = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": name, "namespace": "default"},
           "status": {"devices": [{"driver": OTHER_DRIVER, "pool": NODE, "device": "nic-0", "conditions": [
               {"type": "Ready", "status": "True", "reason": "Up", "message": "link up",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]}}  # fmt: skip
    cp.kubectl("apply", "--server-side", "--subresource=status", "--field-manager=nic-driver", "-f", "-",
               input=json.dumps(nic))  # fmt: skip

    sim = SimulatedNvml("dgx-h100", tmp_path / "gpu")
    settings = PluginSettings(driver=DRIVER, pool=NODE, plugin_dir=tmp_path / "plugin", cdi_root=tmp_path / "cdi")
    api = KubeClaimSource(api_client(cp.kubeconfig), request_timeout=10)
    driver = Driver(settings, sim, api, sysfs_root=sim.sysfs_root, proc_root=sim.proc_root, boot_id="b")
    monitor = HealthMonitor(sim, driver, DRIVER, wait_ms=50, on_change=lambda: status.trigger())
    status = ClaimStatusReporter(api, DRIVER, lambda: list(driver.checkpoint.claims.values()), monitor.taints)
    try:
        assert all(not r.error for r in driver.prepare(refs).values())
        status.start()
        monitor.start()
        assert monitor.ready.wait(10)
        sim.inject_event(0, XID, xid=79)

        def healthy(expected: str) -> bool:
            cond = _conditions(cp, name).get((DRIVER, "gpu-0"), {}).get(CONDITION_TYPE)
            return cond is not None and cond["status"] == expected

        wait_for("DeviceHealthy False", lambda: healthy("False"), timeout=30)
        conditions = _conditions(cp, name)
        bad = conditions[(DRIVER, "gpu-0")][CONDITION_TYPE]
        assert bad["reason"] == "XID" and "XID 79" in bad["message"]
        assert conditions[(OTHER_DRIVER, "nic-0")]["Ready"]["status"] == "True"  # the other writer's entry stays
        assert _conditions(cp, other_name) == {}  # a claim on a healthy device is not written

        assert monitor.clear("gpu-0") == 1  # the operator's clear
        wait_for("DeviceHealthy True", lambda: healthy("True"), timeout=30)
        conditions = _conditions(cp, name)
        good = conditions[(DRIVER, "gpu-0")][CONDITION_TYPE]
        assert good["reason"] == "Healthy" and good["lastTransitionTime"] >= bad["lastTransitionTime"]
        assert conditions[(OTHER_DRIVER, "nic-0")]["Ready"]["reason"] == "Up"
        managers = {m["manager"] for m in cp.kubectl_json("get", "resourceclaim", name, "--show-managed-fields")[
            "metadata"]["managedFields"] if m.get("subresource") == "status"}  # fmt: skip
        assert {FIELD_MANAGER, "nic-driver"} <= managers

        # A claim deleted and created again under the same name is never written by mistake (the UID guards it).
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default", "uid": str(uuidlib.uuid4())},
                "status": {"devices": []}}  # fmt: skip
        with pytest.raises(ApiError) as replaced:
            api.apply_claim_status("default", name, body, FIELD_MANAGER)
        assert replaced.value.status == 422 and '"field":"metadata.uid"' in replaced.value.body
        assert (DRIVER, "gpu-0") in _conditions(cp, name)
        driver.unprepare(refs)
    finally:
        monitor.stop()
        status.stop()
        driver.close()
        for c in created:
            cp.delete("resourceclaim", c["metadata"]["name"], missing_ok=False)


# ----- data: what the node daemon says of each prepared device (KEP-4817) ---------------------------------------
def test_with_a_data_source_every_prepared_claim_gets_its_entries_at_once_and_data_changes_are_written(
    world: Any,
) -> None:
    api, entries, taints, clock = world
    one = entry("one", "gpu-0")
    api.add(one)
    entries.append(one)
    described = {"gpu-0": {"uuid": "GPU-0", "computeMode": "Default"}}
    r = ClaimStatusReporter(
        api, DRIVER, lambda: list(entries), lambda: dict(taints), clock=clock, data=lambda e, d: described[d.device]
    )
    assert r.sync_once() and len(api.applied) == 1  # healthy, but with something to say
    (written,) = api.applied[0]["status"]["devices"]
    assert written["data"] == {"uuid": "GPU-0", "computeMode": "Default"}
    assert written["conditions"][0]["status"] == "True"
    assert r.sync_once() and len(api.applied) == 1
    described["gpu-0"] = {"uuid": "GPU-0", "computeMode": "Exclusive_Process"}
    assert r.sync_once() and len(api.applied) == 2
    assert api.applied[-1]["status"]["devices"][0]["data"]["computeMode"] == "Exclusive_Process"
    taints["gpu-0"] = [taint("xid", "48", "NoExecute")]
    assert r.sync_once() and len(api.applied) == 3
    (again,) = api.applied[-1]["status"]["devices"]
    assert again["conditions"][0]["reason"] == "XID" and again["data"]["computeMode"] == "Exclusive_Process"
    # a restarted daemon reads what its predecessor wrote, data included, and writes nothing when it is the same
    fresh = ClaimStatusReporter(
        api, DRIVER, lambda: list(entries), lambda: dict(taints), clock=clock, data=lambda e, d: described[d.device]
    )
    assert fresh.sync_once() and len(api.applied) == 3


def test_device_data_names_the_gpu_the_partition_and_the_sharing(tmp_path: Path) -> None:
    from dra_driver.health.device_data import device_data_source
    from tests.plugin_helpers import Node, ref
    from tests.test_sharing import time_slicing

    node = Node(tmp_path)
    d = node.driver()
    try:
        whole, mig, sliced = (
            claim(["gpu-0"]),
            claim(["gpu-2-mig-3g40gb-9-4"], device_class="mig"),
            claim(["gpu-5"], config=[time_slicing("Long")]),
        )
        for c in (whole, mig, sliced):
            node.add(c)
            assert d.prepare([ref(c)])[c["metadata"]["uid"]].error == ""
        data = device_data_source(node.sim, lambda: d.inventory, lambda: d.catalog)

        def of(c: dict[str, Any]) -> dict[str, Any]:
            e = d.checkpoint.claims[c["metadata"]["uid"]]
            out = data(e, e.devices[0])
            assert out is not None
            return out

        versions = {"driverVersion": "550.54.15", "cudaDriverVersion": d.inventory.cuda_driver_version}
        gpu0, gpu2 = d.inventory.gpu_by_minor(0), d.inventory.gpu_by_minor(2)
        assert of(whole) == {"productName": gpu0.product_name, "uuid": gpu0.uuid, "computeMode": "Default", **versions}
        live = d.checkpoint.claims[mig["metadata"]["uid"]].devices[0].mig
        assert live is not None
        assert of(mig) == {
            "productName": gpu2.product_name,
            "parentUUID": gpu2.uuid,
            "uuid": live.uuid,
            "mig": {
                "profile": "3g.40gb",
                "placement": {"start": 4, "size": 4},
                "gpuInstanceId": live.gi_id,  # dcgm-exporter's GPU_I_ID, with the parent's UUID
                "computeInstanceId": live.ci_id,
            },
            **versions,
        }
        assert of(sliced)["sharing"] == {"strategy": "TimeSlicing", "interval": "Long"}
    finally:
        d.close()
