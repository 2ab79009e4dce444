"""Workload profiles in the simulator (utilisation and memory as functions of time) and the share metric the
GPU-hours rules weigh MIG partitions by."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.simulator.telemetry import TelemetryStore
from dra_driver.simulator.workload import Profile, Workload
from dra_driver.telemetry import register_gpu_metrics
from tests.plugin_helpers import Node, claim, ref
from tests.test_telemetry import MIG_DEVICE, scrape, value


def test_profiles_are_deterministic_functions_of_time() -> None:
    bursty = Workload(profile=Profile.BURSTY, start=1000.0, period_s=4, duty=0.25)
    assert [bursty.utilization(1000.0 + t) for t in (0, 0.99, 1.0, 3.9, 4.0, 4.5, 5.0)] == [90, 90, 0, 0, 90, 90, 0]
    assert bursty.utilization(996.5) == 90  # before `start`: the same wave, continued backwards
    busy, idle = Workload(profile="busy"), Workload(profile="idle")
    assert {busy.utilization(t) for t in range(0, 100, 7)} == {95}
    assert {idle.utilization(t) for t in range(0, 100, 7)} == {0}
    assert (busy.memory_used(1000), bursty.memory_used(1000), idle.memory_used(1000)) == (800, 500, 0)
    with pytest.raises(ValueError):
        Workload(profile="sleepy")


def test_nvml_readings_follow_the_workload(sim_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "sim"
    sim: SimulatedNvml = sim_factory("dgx-h100", state)
    store = TelemetryStore(state)
    h = sim.nvmlDeviceGetHandleByIndex(1)
    total = sim.nvmlDeviceGetMemoryInfo(h).total
    assert sim.nvmlDeviceGetMemoryInfo(h).used == 0 and sim.nvmlDeviceGetUtilizationRates(h).gpu == 0
    store.set(1, workload=Workload(profile="bursty", start=100.0, period_s=10), gpu_utilization=33)
    now = [101.0]
    monkeypatch.setattr("dra_driver.simulator.nvml.time.time", lambda: now[0])
    assert sim.nvmlDeviceGetUtilizationRates(h).gpu == 90  # the workload wins over the fixed value
    now[0] = 107.0
    assert sim.nvmlDeviceGetUtilizationRates(h).gpu == 0
    mem = sim.nvmlDeviceGetMemoryInfo(h)
    assert (mem.used, mem.free, mem.total) == (total // 2, total - total // 2, total)
    other = sim.nvmlDeviceGetHandleByIndex(2)
    assert sim.nvmlDeviceGetMemoryInfo(other).used == 0  # per GPU
    store.set(1, workload=None)
    assert sim.nvmlDeviceGetUtilizationRates(h).gpu == 33 and sim.nvmlDeviceGetMemoryInfo(h).used == 0


def test_mig_devices_follow_their_gpu_or_their_own_workload(tmp_path: Path) -> None:
    node = Node(tmp_path, "mixed")
    mig_claim = claim([MIG_DEVICE], name="train", device_class="mig")
    node.add(mig_claim)
    driver = node.driver()
    assert not driver.prepare([ref(mig_claim)])[ref(mig_claim).uid].error
    mig_uuid = next(d.mig.uuid for d in driver.checkpoint.claims[ref(mig_claim).uid].devices if d.mig)
    registry = CollectorRegistry()
    register_gpu_metrics(registry, node.sim, driver)
    store = TelemetryStore(node.sim.state_dir)
    labels = {"device": MIG_DEVICE, "claim": "train"}
    total = value(scrape(registry), "dra_driver_gpu_memory_total_bytes", **labels)
    store.set(0, workload=Workload(profile="busy"))  # NVML index 0: the A100 with MIG on (minor 1)
    assert value(scrape(registry), "dra_driver_gpu_memory_used_bytes", **labels) == int(total * 0.8)
    store.set_mig_workload(mig_uuid, Workload(profile="idle"))
    assert value(scrape(registry), "dra_driver_gpu_memory_used_bytes", **labels) == 0
    store.set_mig_workload(mig_uuid, None)
    assert value(scrape(registry), "dra_driver_gpu_memory_used_bytes", **labels) == int(total * 0.8)


def test_share_ratio_weighs_mig_partitions_by_compute_slices(tmp_path: Path) -> None:
    node = Node(tmp_path, "mixed")
    small = "gpu-1-mig-1g10gb-19-0"
    claims = [claim([MIG_DEVICE], name="big", device_class="mig"), claim([small], name="small", device_class="mig")]
    node.add(*claims)
    driver = node.driver()
    assert all(not r.error for r in driver.prepare([ref(c) for c in claims]).values())
    registry = CollectorRegistry()
    register_gpu_metrics(registry, node.sim, driver)
    s = scrape(registry)
    assert value(s, "dra_driver_gpu_share_ratio", device=MIG_DEVICE, claim="big") == pytest.approx(3 / 7)
    assert value(s, "dra_driver_gpu_share_ratio", device=small, claim="small") == pytest.approx(1 / 7)
    assert value(s, "dra_driver_gpu_share_ratio", device="gpu-3") == 1.0
    assert value(s, "dra_driver_gpu_share_ratio", device="gpu-1") == 1.0  # the MIG-enabled GPU itself, unclaimed
