"""Nothing keyed by claim or event grows for ever (issue 39, T1 and H1): the XID counter's series follow the
claims that are prepared on the node, and the health monitor's incidents are merged per device and cause."""

from __future__ import annotations

from pathlib import Path

import pynvml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.health.admin import health_report
from dra_driver.health.monitor import GPU_LEVEL, HealthMonitor
from dra_driver.telemetry import register_gpu_metrics
from tests.plugin_helpers import DRIVER, Node, claim, ref

XID = pynvml.nvmlEventTypeXidCriticalError
DBE = pynvml.nvmlEventTypeDoubleBitEccError
RECOVERY = pynvml.nvmlEventTypeGpuRecoveryAction
XID_SERIES = "dra_driver_gpu_xid_errors_total"
MIG_DEVICE = "gpu-1-mig-3g40gb-9-4"  # on `mixed`, minor 1 has MIG on


def xid_series(registry: CollectorRegistry) -> list[tuple[dict[str, str], float]]:
    return [
        (dict(s.labels), s.value)
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if s.name == XID_SERIES
    ]


# ----- T1: the XID counter -------------------------------------------------------------------------------------
def test_xid_series_of_unprepared_claims_are_removed_and_live_ones_keep_counting(tmp_path: Path) -> None:
    node = Node(tmp_path, "mixed")
    driver = node.driver()
    registry = CollectorRegistry()
    collector = register_gpu_metrics(registry, node.sim, driver)
    uuid = {minor: driver.inventory.gpu_by_minor(minor).uuid for minor in (2, 3, 4)}
    keeper = claim(["gpu-2"], name="long-lived")
    node.add(keeper)
    assert not driver.prepare([ref(keeper)])[ref(keeper).uid].error
    collector.record_xid(uuid[4], 79)  # no claim holds gpu-4: the device's own series, which stays
    cycles = 60
    try:
        for i in range(cycles):
            short = claim(["gpu-3"], name=f"short-{i}")
            mig = claim([MIG_DEVICE], name=f"mig-{i}", device_class="mig")
            node.add(short, mig)
            result = driver.prepare([ref(short), ref(mig)])
            assert not any(r.error for r in result.values()), result
            mig_uuid = next(d.mig.uuid for d in driver.checkpoint.claims[ref(mig).uid].devices if d.mig)
            for held in (uuid[3], mig_uuid, uuid[2]):
                collector.record_xid(held, 79)
            live = sorted(labels["claim"] for labels, _ in xid_series(registry))
            assert live == ["", "long-lived", f"mig-{i}", f"short-{i}"], f"cycle {i}: {live}"
            assert driver.unprepare([ref(short), ref(mig)]) == {ref(short).uid: None, ref(mig).uid: None}
        # The last cycle's claims are gone too, with nothing recorded since: a scrape alone drops their series.
        series = {labels["claim"]: (labels["device"], count) for labels, count in xid_series(registry)}
        assert series == {"": ("gpu-4", 1), "long-lived": ("gpu-2", cycles)}
    finally:
        driver.unprepare([ref(keeper)])
        driver.close()
    assert [labels["claim"] for labels, _ in xid_series(registry)] == [""]


# ----- H1: the health monitor's incidents ----------------------------------------------------------------------
def test_repeated_events_merge_per_device_and_cause_and_cleared_ones_expire(tmp_path: Path) -> None:
    """dgx-h100: a 550 driver, no NVML verdict: the XID list decides and XID/ECC incidents stay until cleared."""
    node = Node(tmp_path)
    driver = node.driver()
    monitor = HealthMonitor(node.sim, driver, DRIVER)
    uuids = node.sim.gpu_uuids
    causes = [(XID, 79), (XID, 48), (XID, 13), (DBE, 0)]  # 13 is on the ignore list: it taints nothing
    events = 20_000
    seen: dict[tuple[int, str, str], int] = {}  # (GPU, taint kind, value) -> events
    latest_xid: dict[int, str] = {}
    for i in range(events):
        gpu, (event_type, data) = i % 3, causes[(i // 3) % len(causes)]
        # every 5th on a GPU instance that does not exist: routed to the whole GPU, the same devices
        monitor.handle_event(uuids[gpu], event_type, data, GPU_LEVEL if i % 5 else 1000, GPU_LEVEL)
        if (event_type, data) == (XID, 13):
            continue
        kind, value = ("xid", str(data)) if event_type == XID else ("ecc", "double-bit")
        seen[(gpu, kind, value)] = seen.get((gpu, kind, value), 0) + 1
        if kind == "xid":
            latest_xid[gpu] = value
    incidents = monitor.incidents()
    assert len(incidents) == len(seen) == 3 * 3, f"{len(incidents)} incidents after {events} events"
    gpu_of = {u: i for i, u in enumerate(uuids)}
    assert {(gpu_of[i.gpu_uuid], i.kind, i.value): i.count for i in incidents} == seen
    assert all(i.time_added <= i.last_seen for i in incidents)

    # taints() as before merging: one taint per key, the latest event's value
    taints = monitor.taints()
    gpu_devices = {g: {n for n, e in driver.catalog.items() if e.gpu.minor == g} for g in range(3)}
    assert set(taints) == set().union(*gpu_devices.values())
    for g, names in gpu_devices.items():
        expected = [(f"{DRIVER}/ecc", "double-bit", "NoSchedule"), (f"{DRIVER}/xid", latest_xid[g], "NoSchedule")]
        assert all([(t.key, t.value, t.effect) for t in taints[n]] == expected for n in names)
    report = health_report(monitor)["devices"]["gpu-1"]["incidents"]
    assert sorted((i["kind"], i["value"], i["count"]) for i in report) == sorted(
        (kind, value, n) for (g, kind, value), n in seen.items() if g == 1
    )

    # a repeated cause is the latest again: its value is the taint's, as it was with one incident per event
    gpu4 = uuids[4]
    for xid, shown in ((79, "79"), (48, "48"), (79, "79")):
        monitor.handle_event(gpu4, XID, xid, GPU_LEVEL, GPU_LEVEL)
        assert [t.value for t in monitor.taints()["gpu-4"]] == [shown]

    # healed (XID/ECC without a verdict: cleared by an operator): gone, and a new event starts a new incident
    assert monitor.clear("gpu-0") == 3
    assert "gpu-0" not in monitor.taints() and len(monitor.incidents()) == 6 + 2
    monitor.handle_event(uuids[0], XID, 79, GPU_LEVEL, GPU_LEVEL)
    [again] = [i for i in monitor.incidents() if i.gpu_uuid == uuids[0]]
    assert (again.kind, again.value, again.count) == ("xid", "79", 1)
    driver.close()


def test_lost_gpus_and_recovery_actions_expire_when_healed(tmp_path: Path) -> None:
    """The other incidents end by themselves: a lost GPU that answers again, a recovery action back to none."""
    node = Node(tmp_path, "dgx-b200")
    driver = node.driver()
    monitor = HealthMonitor(node.sim, driver, DRIVER)
    uuid = node.sim.gpu_uuids[2]
    for _ in range(200):
        for action in (pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET, pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET):
            monitor.handle_event(uuid, RECOVERY, action, GPU_LEVEL, GPU_LEVEL)
        assert [(i.kind, i.recovery) for i in monitor.incidents()] == [("xid", "gpu-reset")]
        monitor.handle_event(uuid, RECOVERY, pynvml.NVML_GPU_RECOVERY_ACTION_NONE, GPU_LEVEL, GPU_LEVEL)
        assert monitor.incidents() == []
    for _ in range(50):
        node.sim.set_gpu_lost(5)
        monitor.probe()
        assert [(i.kind, i.gpu_uuid) for i in monitor.incidents()] == [("gpu-lost", node.sim.gpu_uuids[5])]
        node.sim.set_gpu_lost(5, False)
        monitor.probe()
        assert monitor.incidents() == [] and monitor.taints() == {}
    driver.close()
