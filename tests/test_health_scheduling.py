"""Device health reaches the real kube-scheduler: an injected XID taints exactly the affected device, the scheduler
then avoids it (a claim that needs it stays Pending; a claim that tolerates the taint gets it), and clearing the
taint lets the pending claim through. A lost GPU is tainted NoExecute and the kube-controller-manager's
device-taint-eviction controller evicts the pod using it; the taint goes when the GPU answers again.

The node daemon runs in-process as deployed (`dra_driver.daemon.run`: Driver, HealthMonitor wired to the
publisher, slices built with the monitor's taints) on a simulated DGX H100 in `gpus` mode (one slice, 8 devices);
events come from another SimulatedNvml on the same state directory, as from the GPU itself.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from prometheus_client import CollectorRegistry

from dra_driver import daemon
from dra_driver.health.monitor import HealthMonitor
from dra_driver.nvml.source import NvmlSource
from dra_driver.plugin.driver import PluginSettings
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME as D
from dra_driver.slices.devices import PublishMode
from tests.polling import wait_until

NODE, NS, CLASS = "health-node", "health", "health-gpu"
XID = pynvml.nvmlEventTypeXidCriticalError
SICK = 5  # NVML index of the GPU that reports the XID and later falls off the bus


@dataclass
class Daemon:
    cp: Any
    state: Path
    stop: threading.Event = field(default_factory=threading.Event)
    monitors: list[HealthMonitor] = field(default_factory=list)
    error: BaseException | None = None

    @property
    def health(self) -> HealthMonitor:
        assert len(self.monitors) == 1, self.monitors
        return self.monitors[0]

    def devices(self) -> dict[str, dict[str, Any]]:
        """The devices of this node's published pool, by name ({} before it is published)."""
        items = self.cp.kubectl_json("get", "resourceslices", "--field-selector", f"spec.nodeName={NODE}")["items"]
        if not items:
            return {}
        assert len(items) == 1 and items[0]["spec"]["pool"]["resourceSliceCount"] == 1, items  # gpus mode: 1 slice
        return {d["name"]: d for d in items[0]["spec"]["devices"]}

    def taints(self) -> dict[str, list[tuple[str, str | None, str]]]:
        """{device: [(key, value, effect)]} of the tainted devices of the published pool."""
        return {
            n: [(t["key"], t.get("value"), t["effect"]) for t in d["taints"]]
            for n, d in self.devices().items()
            if d.get("taints")
        }


@pytest.fixture
def node(control_plane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    cp = control_plane
    cp.create_node(NODE)
    cp.create_namespace(NS)
    gpu = f"device.driver == '{D}' && device.attributes['{D}'].type == 'gpu'"
    gpu_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": CLASS},
                 "spec": {"selectors": [{"cel": {"expression": gpu}}]}}  # fmt: skip
    cp.apply(gpu_class)
    d = Daemon(cp, tmp_path / "gpu")

    # daemon.run as the `dra-driver plugin` command runs it, with three test seams: it runs in a thread (signal
    # handlers can only be set in the main thread; `stop` ends it instead), its telemetry goes to a registry of its
    # own, and the health monitor it creates is kept (so that the test can clear a taint, as an operator would)
    # and polls every 0.2 s instead of 5 s (a lost GPU is probed once per poll).
    monkeypatch.setattr(daemon, "signal", SimpleNamespace(SIGTERM=signal.SIGTERM, SIGINT=signal.SIGINT,
                                                          signal=lambda *_: None))  # fmt: skip
    monkeypatch.setattr(daemon, "REGISTRY", CollectorRegistry())

    def monitor(*args: Any, **kwargs: Any) -> HealthMonitor:
        m = HealthMonitor(*args, **{**kwargs, "wait_ms": 200})
        d.monitors.append(m)
        return m

    monkeypatch.setattr(daemon, "HealthMonitor", monitor)
    sockets = Path(f"/tmp/dra-health-{os.getpid()}")
    settings = PluginSettings(driver=D, pool=NODE, plugin_dir=sockets / "plugin", cdi_root=tmp_path / "cdi",
                              mode=PublishMode.GPUS)  # fmt: skip
    options = daemon.DaemonOptions(settings, sockets / "registry", cp.kubeconfig, None, rediscover_seconds=3600)
    sim = SimulatedNvml("dgx-h100", d.state)
    source = NvmlSource(sim, sim.sysfs_root, sim.proc_root, "simulated dgx-h100")

    def run() -> None:
        try:
            daemon.run(options, source, d.stop)
        except BaseException as e:  # reported by the test, not lost in the thread
            d.error = e

    thread = threading.Thread(target=run, name="node-daemon", daemon=True)
    thread.start()
    try:
        wait_until("the pool", lambda: d.error or len(d.devices()) == 8)
        assert d.error is None, d.error
        assert d.health.ready.wait(10)
        yield d
    finally:
        d.stop.set()  # the daemon winds down (its pool watch may take up to 30 s to notice) while we clean up
        cp.delete("pods", namespace=NS, grace_period=0, wait=120)
        cp.delete_namespace(NS, pods_first=False)
        thread.join(timeout=60)
        cp.delete("resourceslices", wait=120, field_selector=f"spec.nodeName={NODE}")
        cp.delete("deviceclass", CLASS, wait=120)
        cp.delete_node(NODE)
    assert not thread.is_alive() and d.error is None, d.error


def claim_and_pod(name: str, count: int = 1, tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A ResourceClaim for `count` GPUs and a pod on this node that uses it, as one List."""
    exactly: dict[str, Any] = {"deviceClassName": CLASS, "count": count}
    if tolerations:
        exactly["tolerations"] = tolerations
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": NS},
             "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}}  # fmt: skip
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
           "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE},
                    "containers": [{"name": "c", "image": "registry.invalid/cuda",
                                    "resources": {"claims": [{"name": "gpus"}]}}],
                    "resourceClaims": [{"name": "gpus", "resourceClaimName": name}]}}  # fmt: skip
    return {"apiVersion": "v1", "kind": "List", "items": [claim, pod]}


def allocated(cp: Any, name: str) -> list[str]:
    """The devices the scheduler allocated to claim `name` ([] while it has none)."""
    status = cp.kubectl_json("get", "resourceclaim", name, "-n", NS).get("status", {})
    return sorted(r["device"] for r in status.get("allocation", {}).get("devices", {}).get("results", []))


def get_pod(cp: Any, name: str) -> dict[str, Any]:
    return dict(cp.kubectl_json("get", "pod", name, "-n", NS))


def conditions(p: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in p.get("status", {}).get("conditions", [])}


def unschedulable(cp: Any, name: str) -> str:
    """The scheduler's message while pod `name` is Unschedulable, else ''."""
    cond = conditions(get_pod(cp, name)).get("PodScheduled", {})
    return str(cond.get("message") or "?") if cond.get("reason") == "Unschedulable" else ""


def schedule(cp: Any, name: str, **kwargs: Any) -> list[str]:
    cp.apply(claim_and_pod(name, **kwargs))
    return list(wait_until(f"claim {name} allocated", lambda: allocated(cp, name)))


def test_tainted_device_is_avoided_by_the_scheduler_until_cleared(node: Daemon) -> None:
    cp = node.cp
    assert node.taints() == {}
    uuid = SimulatedNvml("dgx-h100", node.state).gpu_uuids[SICK]
    sick = next(n for n, d in node.devices().items() if d["attributes"]["uuid"]["string"] == uuid)

    # The GPU reports XID 79 (fell off the bus, recovered): exactly its device is tainted NoSchedule.
    SimulatedNvml("dgx-h100", node.state).inject_event(SICK, XID, xid=79)
    wait_until("the XID taint published", lambda: node.taints())
    assert node.taints() == {sick: [(f"{D}/xid", "79", "NoSchedule")]}

    # The real scheduler: seven GPUs are the seven healthy ones, an eighth claim stays Pending.
    seven = schedule(cp, "seven", count=7)
    assert len(seven) == 7 and sick not in seven
    cp.apply(claim_and_pod("needs-the-sick-one"))
    message = wait_until("needs-the-sick-one unschedulable", lambda: unschedulable(cp, "needs-the-sick-one"))
    assert "cannot allocate all claims" in message, message
    assert allocated(cp, "needs-the-sick-one") == []

    # A request that tolerates the taint may have the device; then it is given back.
    tolerant = schedule(cp, "tolerant", tolerations=[{"key": f"{D}/xid", "operator": "Exists", "effect": "NoSchedule"}])
    assert tolerant == [sick]
    cp.delete("pod", "tolerant", namespace=NS, missing_ok=False, grace_period=0, wait=120)
    cp.delete("resourceclaim", "tolerant", namespace=NS, missing_ok=False, wait=60)
    assert allocated(cp, "needs-the-sick-one") == [] and unschedulable(cp, "needs-the-sick-one")

    # The operator clears the XID: the taint leaves the slice and the pending claim gets the device.
    assert node.health.clear(sick) == 1
    wait_until("the taint removed", lambda: node.taints() == {})
    assert wait_until("needs-the-sick-one allocated", lambda: allocated(cp, "needs-the-sick-one")) == [sick]
    wait_until("needs-the-sick-one bound", lambda: get_pod(cp, "needs-the-sick-one")["spec"].get("nodeName") == NODE)

    # The GPU falls off the bus: NoExecute, and the device-taint-eviction controller evicts the pod using it
    # (no kubelet here, so the evicted pod stays Terminating: deletionTimestamp and a DisruptionTarget condition).
    SimulatedNvml("dgx-h100", node.state).set_gpu_lost(SICK)
    wait_until("the gpu-lost taint published", lambda: node.taints())
    assert node.taints() == {sick: [(f"{D}/gpu-lost", None, "NoExecute")]}
    evicted = wait_until("the pod evicted", lambda: evicted_reason(cp, "needs-the-sick-one"))
    assert evicted == "DeletionByDeviceTaintManager", evicted
    assert "deletionTimestamp" not in get_pod(cp, "seven")["metadata"]  # the pod on the healthy GPUs stays

    # It answers again: the gpu-lost taint goes by itself.
    SimulatedNvml("dgx-h100", node.state).set_gpu_lost(SICK, False)
    wait_until("the gpu-lost taint removed", lambda: node.taints() == {})


def evicted_reason(cp: Any, name: str) -> str:
    """The DisruptionTarget reason once pod `name` is being deleted, else ''."""
    p = get_pod(cp, name)
    if "deletionTimestamp" not in p["metadata"]:
        return ""
    return str(conditions(p).get("DisruptionTarget", {}).get("reason", "(no DisruptionTarget condition)"))
