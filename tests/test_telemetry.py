"""GPU telemetry: the simulator's telemetry functions and the Prometheus collector over them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.api.claim import ResourceClaim
from dra_driver.plugin.claims import KubeClaimSource
from dra_driver.plugin.driver import Driver, PluginSettings
from dra_driver.plugin.types import ClaimRef
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.simulator.telemetry import GpuTelemetry, TelemetryStore
from dra_driver.telemetry import GpuCollector, ReservedPods, register_gpu_metrics
from tests.plugin_helpers import DRIVER, GPU_CLASS, Node, claim, ref
from tests.simhelpers import create_full_ci, create_gi, nvml_code

MIG_DEVICE = "gpu-1-mig-3g40gb-9-4"  # on `mixed`, NVML index 0 (minor 1) has MIG on


def scrape(registry: CollectorRegistry) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)]."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    found = [v for lbls, v in samples.get(name, []) if all(lbls.get(k) == x for k, x in labels.items())]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


def has(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> bool:
    return any(all(lbls.get(k) == x for k, x in labels.items()) for lbls, _ in samples.get(name, []))


# ----- simulator ----------------------------------------------------------------------------------------------
def test_simulator_defaults_are_deterministic(sim_factory: Any) -> None:
    sim: SimulatedNvml = sim_factory("dgx-h100")
    h = sim.nvmlDeviceGetHandleByIndex(3)
    util = sim.nvmlDeviceGetUtilizationRates(h)
    assert isinstance(util, pynvml.c_nvmlUtilization_t) and (util.gpu, util.memory) == (0, 0)
    d = GpuTelemetry()
    assert sim.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == d.temperature_c
    assert sim.nvmlDeviceGetPowerUsage(h) == d.power_mw
    for error_type in (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
        for counter in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
            assert sim.nvmlDeviceGetTotalEccErrors(h, error_type, counter) == 0


def test_simulator_values_set_from_outside(sim_factory: Any, tmp_path: Path) -> None:
    state = tmp_path / "shared"
    sim: SimulatedNvml = sim_factory("dgx-h100", state)
    TelemetryStore(state).set(2, gpu_utilization=87, memory_utilization=40, temperature_c=71, power_mw=612_345)
    TelemetryStore(state).add_ecc_errors(2, corrected=3, uncorrected=1)
    h = sim.nvmlDeviceGetHandleByIndex(2)
    util = sim.nvmlDeviceGetUtilizationRates(h)
    assert (util.gpu, util.memory) == (87, 40)
    assert sim.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 71
    assert sim.nvmlDeviceGetPowerUsage(h) == 612_345
    corrected, uncorrected = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    assert sim.nvmlDeviceGetTotalEccErrors(h, corrected, pynvml.NVML_VOLATILE_ECC) == 3
    assert sim.nvmlDeviceGetTotalEccErrors(h, uncorrected, pynvml.NVML_AGGREGATE_ECC) == 1
    TelemetryStore(state).set(2, ecc_corrected=0)  # a driver reload clears the volatile counter only
    assert sim.nvmlDeviceGetTotalEccErrors(h, corrected, pynvml.NVML_VOLATILE_ECC) == 0
    assert sim.nvmlDeviceGetTotalEccErrors(h, corrected, pynvml.NVML_AGGREGATE_ECC) == 3
    other = sim.nvmlDeviceGetHandleByIndex(1)
    assert sim.nvmlDeviceGetUtilizationRates(other).gpu == 0  # per GPU
    with pytest.raises(pynvml.NVMLError) as e:
        sim.nvmlDeviceGetTemperature(h, 7)
    assert nvml_code(e) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    with pytest.raises(ValueError):
        TelemetryStore(state).set(2, gpu_utilization=101)


def test_simulator_mig_handles_and_lost_gpu(sim_factory: Any) -> None:
    sim: SimulatedNvml = sim_factory("mixed")
    parent = sim.nvmlDeviceGetHandleByIndex(0)  # MIG on
    with pytest.raises(pynvml.NVMLError) as e:
        sim.nvmlDeviceGetUtilizationRates(parent)
    assert nvml_code(e) == pynvml.NVML_ERROR_NOT_SUPPORTED  # nvml.h: not on MIG-enabled GPUs
    assert sim.nvmlDeviceGetTemperature(parent, pynvml.NVML_TEMPERATURE_GPU) == GpuTelemetry().temperature_c
    ci = create_full_ci(sim, create_gi(sim, parent, 9, 4, 4), 3)
    mig = sim.nvmlComputeInstanceGetInfo(ci).device
    assert sim.nvmlDeviceGetMemoryInfo(mig).total > 0
    for call in (
        lambda: sim.nvmlDeviceGetUtilizationRates(mig),
        lambda: sim.nvmlDeviceGetTemperature(mig, pynvml.NVML_TEMPERATURE_GPU),
        lambda: sim.nvmlDeviceGetPowerUsage(mig),
        lambda: sim.nvmlDeviceGetTotalEccErrors(mig, 0, 0),
    ):
        with pytest.raises(pynvml.NVMLError) as e:
            call()
        assert nvml_code(e) == pynvml.NVML_ERROR_NOT_SUPPORTED
    sim.set_gpu_lost(2)
    with pytest.raises(pynvml.NVMLError) as e:
        sim.nvmlDeviceGetPowerUsage(sim.nvmlDeviceGetHandleByIndex(2))
    assert nvml_code(e) == pynvml.NVML_ERROR_GPU_IS_LOST


# ----- collector --------------------------------------------------------------------------------------------------
@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path, "mixed")


def test_scrape_reports_what_the_simulator_was_set_to(node: Node) -> None:
    driver = node.driver()
    registry = CollectorRegistry()
    register_gpu_metrics(registry, node.sim, driver)
    store = TelemetryStore(node.sim.state_dir)
    # NVML index 2 is minor 2 (an H100 with MIG off); index 1 is minor 0.
    store.set(2, gpu_utilization=63, temperature_c=58, power_mw=431_500)
    store.add_ecc_errors(2, corrected=7, uncorrected=2)
    store.set(1, gpu_utilization=5)
    s = scrape(registry)
    assert value(s, "dra_driver_gpu_utilization_ratio", device="gpu-2") == pytest.approx(0.63)
    assert value(s, "dra_driver_gpu_utilization_ratio", device="gpu-0") == pytest.approx(0.05)
    assert value(s, "dra_driver_gpu_temperature_celsius", device="gpu-2") == 58
    assert value(s, "dra_driver_gpu_power_watts", device="gpu-2") == pytest.approx(431.5)
    assert value(s, "dra_driver_gpu_ecc_errors_total", device="gpu-2", type="corrected") == 7
    assert value(s, "dra_driver_gpu_ecc_errors_total", device="gpu-2", type="uncorrected") == 2
    gpu2 = driver.inventory.gpu_by_minor(2)
    labels = {"device": "gpu-2", "uuid": gpu2.uuid, "product": "NVIDIA H100 80GB HBM3"}
    assert value(s, "dra_driver_gpu_memory_total_bytes", **labels) == gpu2.memory_bytes
    assert value(s, "dra_driver_gpu_memory_used_bytes", **labels) == 0  # the simulator reports nothing in use
    assert value(s, "dra_driver_gpu_up", **labels, claim="", namespace="", pod="") == 1
    assert not has(s, "dra_driver_gpu_utilization_ratio", device="gpu-1")  # MIG on: NVML has no utilisation
    assert value(s, "dra_driver_gpu_temperature_celsius", device="gpu-1") == GpuTelemetry().temperature_c
    assert sorted(lbls["device"] for lbls, _ in s["dra_driver_gpu_up"]) == [f"gpu-{m}" for m in range(5)]
    store.set(2, gpu_utilization=100)  # read again on every scrape
    assert value(scrape(registry), "dra_driver_gpu_utilization_ratio", device="gpu-2") == 1.0


def test_labels_of_a_prepared_mig_claim_and_whole_gpu_claim(node: Node) -> None:
    mig_claim = claim([MIG_DEVICE], name="train", device_class="mig")
    gpu_claim = claim(["gpu-3"], name="infer")
    node.add(mig_claim, gpu_claim)
    driver = node.driver()
    result = driver.prepare([ref(mig_claim), ref(gpu_claim)])
    assert all(not r.error for r in result.values()), result
    pods = {("default", "train"): "train-pod-0"}
    registry = CollectorRegistry()
    collector = register_gpu_metrics(registry, node.sim, driver, pod_of=lambda ns, c: pods.get((ns, c), ""))
    mig_uuid = next(d.mig.uuid for d in driver.checkpoint.claims[ref(mig_claim).uid].devices if d.mig)
    collector.record_xid(mig_uuid, 94)
    collector.record_xid(mig_uuid, 94)
    collector.record_xid(driver.inventory.gpu_by_minor(3).uuid, 79)
    s = scrape(registry)
    held = {"device": MIG_DEVICE, "uuid": mig_uuid, "claim": "train", "namespace": "default", "pod": "train-pod-0"}
    profile = driver.inventory.gpu_by_minor(1).profile(9)
    assert value(s, "dra_driver_gpu_memory_total_bytes", **held) == (profile.memory_mib + 128) << 20  # start 4
    assert value(s, "dra_driver_gpu_memory_used_bytes", **held) == 0
    assert value(s, "dra_driver_gpu_up", **held) == 1
    assert value(s, "dra_driver_gpu_up", device=MIG_DEVICE, product="NVIDIA A100-SXM4-80GB") == 1
    assert not has(s, "dra_driver_gpu_utilization_ratio", device=MIG_DEVICE)  # not supported on MIG devices
    assert value(s, "dra_driver_gpu_xid_errors_total", **held, xid="94") == 2
    assert value(s, "dra_driver_gpu_xid_errors_total", device="gpu-3", claim="infer", pod="", xid="79") == 1
    assert value(s, "dra_driver_gpu_power_watts", device="gpu-3", claim="infer", namespace="default") > 0
    assert value(s, "dra_driver_gpu_up", device="gpu-1", claim="") == 1  # the parent itself is not claimed
    # Unprepared: the MIG device is gone and the GPU no longer carries the claim; the claims' XID series go with
    # them (issue 39: kept, they would grow with every claim the node ever ran).
    driver.unprepare([ref(mig_claim), ref(gpu_claim)])
    s = scrape(registry)
    assert not has(s, "dra_driver_gpu_up", device=MIG_DEVICE)
    assert value(s, "dra_driver_gpu_up", device="gpu-3") == 1
    assert value(s, "dra_driver_gpu_power_watts", device="gpu-3", claim="") > 0
    assert "dra_driver_gpu_xid_errors_total" not in s


def test_unclaimed_mig_device_is_named_from_its_placement(node: Node) -> None:
    driver = node.driver()
    node.sim.nvmlInit()
    parent = node.sim.nvmlDeviceGetHandleByIndex(0)
    create_full_ci(node.sim, create_gi(node.sim, parent, 9, 4, 4), 3)  # made behind the driver's back
    registry = CollectorRegistry()
    register_gpu_metrics(registry, node.sim, driver)
    s = scrape(registry)
    assert value(s, "dra_driver_gpu_up", device=MIG_DEVICE, claim="") == 1


def test_lost_gpu_does_not_break_the_scrape(node: Node) -> None:
    driver = node.driver()
    registry = CollectorRegistry()
    register_gpu_metrics(registry, node.sim, driver)
    node.sim.set_gpu_lost(2)  # NVML index 2 = gpu-2
    s = scrape(registry)
    assert value(s, "dra_driver_gpu_up", device="gpu-2") == 0
    for name in ("dra_driver_gpu_memory_total_bytes", "dra_driver_gpu_power_watts", "dra_driver_gpu_ecc_errors_total"):
        assert not has(s, name, device="gpu-2")
    for minor in (0, 1, 3, 4):
        assert value(s, "dra_driver_gpu_up", device=f"gpu-{minor}") == 1
        assert value(s, "dra_driver_gpu_memory_total_bytes", device=f"gpu-{minor}") > 0
    node.sim.set_gpu_lost(2, False)
    assert value(scrape(registry), "dra_driver_gpu_up", device="gpu-2") == 1


def test_registering_reads_no_gpu(node: Node) -> None:
    driver = node.driver()
    calls: list[str] = []

    class Spy:
        def __getattr__(self, name: str) -> Any:
            calls.append(name)
            return getattr(node.sim, name)

    registry = CollectorRegistry(auto_describe=True)
    collector = register_gpu_metrics(registry, Spy(), driver)
    assert isinstance(collector, GpuCollector) and calls == []
    assert "dra_driver_gpu_up" in {f.name for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert calls


# ----- XIDs from the health monitor -----------------------------------------------------------------------------
def test_injected_xids_are_counted_per_device_ignored_ones_too(node: Node) -> None:
    from dra_driver.health.monitor import HealthMonitor

    mig_claim = claim([MIG_DEVICE], name="train", device_class="mig")
    node.add(mig_claim)
    driver = node.driver()
    assert not driver.prepare([ref(mig_claim)])[ref(mig_claim).uid].error
    live = driver.checkpoint.claims[ref(mig_claim).uid].devices[0].mig
    assert live is not None
    registry = CollectorRegistry()
    collector = register_gpu_metrics(registry, node.sim, driver)
    monitor = HealthMonitor(node.sim, driver, "gpu.dra-driver.dev", wait_ms=50, on_xid=collector.record_xid)
    # Another MIG device on the same GPU, carved behind the driver's back: found through NVML.
    node.sim.nvmlInit()
    other_gi = create_gi(node.sim, node.sim.nvmlDeviceGetHandleByIndex(0), 19, 0, 1)
    other = node.sim.nvmlComputeInstanceGetInfo(create_full_ci(node.sim, other_gi, 1))
    other_gi_id = node.sim.nvmlGpuInstanceGetInfo(other_gi).id
    other_uuid = node.sim.nvmlDeviceGetUUID(other.device)
    monitor.start()
    try:
        assert monitor.ready.wait(5)
        gpu2 = driver.inventory.gpu_by_minor(2)
        node.sim.inject_event(2, pynvml.nvmlEventTypeXidCriticalError, xid=79)  # NVML index 2 = gpu-2
        node.sim.inject_event(2, pynvml.nvmlEventTypeXidCriticalError, xid=13)  # ignored for taints, still counted
        node.sim.inject_event(2, pynvml.nvmlEventTypeXidCriticalError, xid=13)
        xid = pynvml.nvmlEventTypeXidCriticalError
        node.sim.inject_event(0, xid, xid=94, gi_id=live.gi_id, ci_id=live.ci_id)  # the claimed partition
        node.sim.inject_event(0, xid, xid=94, gi_id=other_gi_id, ci_id=other.id)
        node.sim.inject_event(0, xid, xid=95, gi_id=live.gi_id + 40, ci_id=0)  # no such instance: the GPU
        node.sim.inject_event(3, pynvml.nvmlEventTypeDoubleBitEccError)  # not an XID: not counted

        def counted() -> float:
            return sum(v for _, v in scrape(registry).get("dra_driver_gpu_xid_errors_total", []))

        deadline = time.monotonic() + 10
        while counted() < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        s = scrape(registry)
        assert value(s, "dra_driver_gpu_xid_errors_total", device="gpu-2", uuid=gpu2.uuid, xid="79") == 1
        assert value(s, "dra_driver_gpu_xid_errors_total", device="gpu-2", xid="13", claim="") == 2
        assert value(s, "dra_driver_gpu_xid_errors_total", device=MIG_DEVICE, uuid=live.uuid, claim="train") == 1
        assert value(s, "dra_driver_gpu_xid_errors_total", device="gpu-1-mig-1g10gb-19-0", uuid=other_uuid) == 1
        gpu1 = driver.inventory.gpu_by_minor(1)
        assert value(s, "dra_driver_gpu_xid_errors_total", device="gpu-1", uuid=gpu1.uuid, xid="95") == 1
        assert len(s["dra_driver_gpu_xid_errors_total"]) == 5 and counted() == 6
        assert "gpu-2" in monitor.taints()  # XID 79 tainted; 13 did not add a taint of its own
        assert [t.value for t in monitor.taints()["gpu-2"]] == ["79"]
    finally:
        monitor.stop()
        driver.unprepare([ref(mig_claim)])
        driver.close()


# ----- the `pod` label: the claim's status.reservedFor ---------------------------------------------------------
class _Claims:
    """A claim source counting its reads; `fail` makes every read raise."""

    def __init__(self) -> None:
        self.reserved: dict[tuple[str, str], list[str]] = {}
        self.reads = 0
        self.fail = False

    def get_claim(self, namespace: str, name: str) -> ResourceClaim:
        self.reads += 1
        if self.fail or (namespace, name) not in self.reserved:
            raise LookupError(f"resourceclaims.resource.k8s.io {name!r} not found")
        refs = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in self.reserved[(namespace, name)]]
        refs.append({"apiGroup": "example.com", "resource": "pods", "name": "not-a-core-pod", "uid": "x"})
        refs.append({"resource": "jobs", "name": "a-job", "uid": "y"})
        return ResourceClaim.model_validate(
            {"metadata": {"name": name, "namespace": namespace}, "status": {"reservedFor": refs}}
        )


def test_reserved_pods_are_cached_and_errors_are_empty() -> None:
    claims, now = _Claims(), [100.0]
    pods = ReservedPods(claims.get_claim, ttl=30, error_ttl=5, clock=lambda: now[0])
    claims.reserved[("ns", "train")] = ["worker-1", "worker-0"]
    assert pods("ns", "train") == "worker-0,worker-1"  # pods only, sorted
    assert [pods("ns", "train") for _ in range(50)] == ["worker-0,worker-1"] * 50 and claims.reads == 1
    claims.reserved[("ns", "train")] = ["worker-2"]
    now[0] += 29
    assert pods("ns", "train") == "worker-0,worker-1" and claims.reads == 1  # still cached
    now[0] += 2
    assert pods("ns", "train") == "worker-2" and claims.reads == 2  # expired: read again
    assert pods("ns", "gone") == "" and claims.reads == 3  # an error is "", never an exception
    assert pods("ns", "gone") == "" and claims.reads == 3  # and cached too, shorter
    now[0] += 6
    claims.fail = True
    assert pods("ns", "gone") == "" and claims.reads == 4
    now[0] += 31
    assert pods("ns", "train") == "" and claims.reads == 5  # the API server is down: "" too


def test_pod_label_from_a_claim_reserved_for_a_pod(control_plane, tmp_path: Path) -> None:
    from tests.test_publisher import api_client

    cp, node_name = control_plane, "telemetry-pods-node"
    gpu_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                 "metadata": {"name": "telemetry-gpu"}, "spec": GPU_CLASS["spec"]}  # fmt: skip
    cp.apply(gpu_class)
    reserved = cp.create_allocated(claim(["gpu-3"], device_class="telemetry-gpu", pool=node_name))
    unreserved = cp.create_allocated(claim(["gpu-5"], device_class="telemetry-gpu", pool=node_name))
    name = reserved["metadata"]["name"]
    # A pod using the claim (bound by name: no scheduler, no kubelet), and what the scheduler writes for it.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer-0", "namespace": "default"},
           "spec": {"nodeName": node_name, "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                    "containers": [{"name": "c", "image": "registry.invalid/cuda",
                                    "resources": {"claims": [{"name": "gpu"}]}}]}}  # fmt: skip
    pod_uid = cp.create(pod)["metadata"]["uid"]
    consumer = {"resource": "pods", "name": "trainer-0", "uid": pod_uid}
    cp.kubectl("patch", "resourceclaim", name, "--subresource=status", "--type=merge",
               "-p", json.dumps({"status": {"reservedFor": [consumer]}}))  # fmt: skip
    sim = SimulatedNvml("dgx-h100", tmp_path / "gpu")
    settings = PluginSettings(driver=DRIVER, pool=node_name, plugin_dir=tmp_path / "plugin", cdi_root=tmp_path / "cdi")
    api = api_client(cp.kubeconfig)
    driver = Driver(
        settings, sim, KubeClaimSource(api), sysfs_root=sim.sysfs_root, proc_root=sim.proc_root, boot_id="b"
    )
    refs = [ClaimRef(namespace="default", name=c["metadata"]["name"], uid=c["metadata"]["uid"])
            for c in (reserved, unreserved)]  # fmt: skip
    try:
        assert all(not r.error for r in driver.prepare(refs).values())
        registry = CollectorRegistry()
        register_gpu_metrics(registry, sim, driver, pod_of=ReservedPods(KubeClaimSource(api).get_claim))
        s = scrape(registry)
        assert value(s, "dra_driver_gpu_up", device="gpu-3", claim=name, namespace="default", pod="trainer-0") == 1
        assert value(s, "dra_driver_gpu_power_watts", device="gpu-3", pod="trainer-0") > 0
        assert value(s, "dra_driver_gpu_up", device="gpu-5", claim=unreserved["metadata"]["name"], pod="") == 1
        assert value(s, "dra_driver_gpu_up", device="gpu-0", claim="", pod="") == 1
        driver.unprepare(refs)
    finally:
        driver.close()
        cp.delete("pod", "trainer-0", missing_ok=False, grace_period=0)
        for c in (reserved, unreserved):
            cp.delete("resourceclaim", c["metadata"]["name"], missing_ok=False)
