"""Device health reaches the kubelet (KEP-4680, ResourceHealthStatus: beta and on by default in 1.36), on the real
node: the kubelet reads the node daemon's `v1alpha1.DRAResourceHealth/NodeWatchResources` stream and reports the
health of each container's allocated devices in the pod's `status.containerStatuses[].allocatedResourcesStatus`.

An XID is injected into the simulated GPU a running pod holds, from this process, through the simulator's state on
the host (shared with the driver pod by a hostPath), as the GPU would report it; the operator clears the incident
as users do, `kubectl exec` into the driver pod and `dra-driver health clear <device>`. The same again after a
kubelet restart and after a rolling update of the driver (the new pod beside the old one). The tests run in order
and share the pod.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from dra_driver.simulator.nvml import SimulatedNvml
from tests.cluster.driver import DRIVER_NAME as D
from tests.cluster.logs import KUBELET_ROUTINE
from tests.cluster.node import Node
from tests.polling import wait_until
from tests.test_real_pods import GPU, NS, Cluster, deployed, pod, req, template

XID = 79  # "GPU has fallen off the bus": critical, not in the chart's ignored list (13, 31, 43, 45, 68, 109)
# The kubelet hears of a change at once (the daemon's monitor wakes the stream) and syncs the pod's status at once.
# Measured on 2 busy cores: under 0.5 s (the first poll sees it), every step below. The bound leaves room for load,
# and stays under the 30 s after which the kubelet takes a device it has heard nothing about for Unknown.
HEALTH_BOUND_S = 15.0
# Only one real node runs on the machine at a time: the first test may wait minutes for another module's.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def cluster(real_node: Node) -> Iterator[Cluster]:
    # The DaemonSet's update surges (maxSurge 1; on the node's network too, the pods sharing the metrics port): the
    # new driver pod starts beside the old one, as on a production node; the last test relies on it.
    with deployed(real_node) as c:
        yield c


def device_health(cluster: Cluster, name: str) -> dict[str, tuple[str, str]]:
    """`{resourceID: (health, message)}` of the pod's first container, from `allocatedResourcesStatus`."""
    p = cluster.cp.kubectl_json("get", "pod", name, "-n", NS)
    statuses = p["status"].get("containerStatuses") or [{}]
    out = {}
    for entry in statuses[0].get("allocatedResourcesStatus") or []:
        assert entry["name"] == "claim:gpu", entry  # the container's one claim, no request named
        for r in entry.get("resources") or []:
            out[r["resourceID"]] = (r.get("health", ""), r.get("message", ""))
    return out


def wait_health(cluster: Cluster, name: str, resource_id: str, health: str) -> tuple[float, tuple[str, str]]:
    """Wait until the pod reports `health` for the device; (seconds it took, (health, message))."""
    start = time.monotonic()

    def reported() -> tuple[str, str] | None:
        got = device_health(cluster, name).get(resource_id)
        return got if got is not None and got[0] == health else None

    try:
        got = wait_until(f"{name}: {resource_id} {health}", reported, timeout=HEALTH_BOUND_S, interval=0.5)
    except AssertionError:
        raise AssertionError(
            f"{name}: {resource_id} not {health} within {HEALTH_BOUND_S}s: {device_health(cluster, name)}\n"
            f"{kubelet_lines(cluster.node, 'DRAResourceHealth', 'WatchResources', 'health update')[-20:]}"
        ) from None
    return time.monotonic() - start, got


def kubelet_lines(node: Node, *needles: str) -> list[str]:
    log = node.kubelet_log.read_text(errors="replace").splitlines()
    return [line for line in log if any(n in line for n in needles)]


def driver_pod(cluster: Cluster) -> str:
    return str(cluster.release.wait_ready_pod()["metadata"]["name"])


def health_cli(cluster: Cluster, *args: str) -> str:
    """`dra-driver health ...` in the driver pod, as an operator runs it."""
    release = cluster.release
    proc = cluster.cp.kubectl(
        "exec", "-n", release.namespace, driver_pod(cluster), "-c", "plugin", "--", "dra-driver", "health", *args,
        check=False, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, f"dra-driver health {' '.join(args)}: {proc.stdout}{proc.stderr}"
    return str(proc.stdout)


def allocated(cluster: Cluster, pod_name: str) -> dict[str, Any]:
    [c] = cluster.claims_of(pod_name)
    [result] = c["status"]["allocation"]["devices"]["results"]
    return {**result, "claim_uid": c["metadata"]["uid"]}


class Gpu:
    """The GPU the pod `name` holds: the device the kubelet reports on, and its XIDs."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        self.cluster, self.pod = cluster, name
        device = allocated(cluster, name)
        assert device["driver"] == D and device["pool"] == cluster.node.name, device
        self.device: str = device["device"]
        # The kubelet names the device by its first CDI id, as the claim's CDI spec gives it to the container.
        spec = cluster.cdi_spec(device["claim_uid"])
        [cdi_device] = spec["devices"]
        assert cdi_device["name"].endswith(self.device), (cdi_device, device)
        self.resource_id = f"{spec['kind']}={cdi_device['name']}"
        release = cluster.release
        self.sim = SimulatedNvml(release.machine, release.sim_state / release.machine)
        self.index = self.sim.gpu_uuids.index(cluster.attribute(self.device, "uuid"))

    def wait(self, health: str) -> float:
        took, (_, message) = wait_health(self.cluster, self.pod, self.resource_id, health)
        expected = f"{D}/xid={XID}:NoSchedule" if health == "Unhealthy" else ""
        assert message == expected, message  # the message: ResourceHealthStatusMessage, beta and on in 1.36
        assert list(device_health(self.cluster, self.pod)) == [self.resource_id]
        return took

    def xid(self) -> float:
        """The GPU reports a critical XID: how long until the pod shows the device Unhealthy."""
        uuid = self.sim.gpu_uuids[self.index]
        self.cluster.release.log.expect(rf"health: xid {XID} on {uuid} ")  # the incident, logged as one
        self.sim.inject_event(self.index, pynvml.nvmlEventTypeXidCriticalError, xid=XID)
        took = self.wait("Unhealthy")
        assert self.cluster.cp.kubectl_json("get", "pod", self.pod, "-n", NS)["status"]["phase"] == "Running"
        status = health_cli(self.cluster, "status")
        assert f"{self.device}: {D}/xid={XID}:NoSchedule" in status, status
        return took

    def clear(self) -> float:
        """The operator has dealt with it and clears the incident: how long until the pod shows Healthy."""
        cleared = health_cli(self.cluster, "clear", self.device)
        assert f"{self.device}: cleared 1 incident(s)" in cleared, cleared
        return self.wait("Healthy")


def test_the_pod_reports_its_gpu_unhealthy_after_an_xid_and_healthy_once_cleared(cluster: Cluster) -> None:
    cluster.apply(template("one-gpu", req("gpu", GPU)), pod("sick", template_name="one-gpu"))
    cluster.wait_running("sick")
    gpu = Gpu(cluster, "sick")
    first = gpu.wait("Healthy")  # from the list the daemon sent when the kubelet opened the stream
    unhealthy, healthy = gpu.xid(), gpu.clear()
    print(f"\nhealth in pod status: Healthy {first:.1f}s after Running, Unhealthy {unhealthy:.1f}s after the XID, "
          f"Healthy {healthy:.1f}s after the clear")  # fmt: skip


def test_health_reaches_the_pod_again_after_a_kubelet_restart(cluster: Cluster) -> None:
    """The restarted kubelet registers the plugin again and opens a new stream (the old one ended with the old
    kubelet: the daemon must not count it against its stream limit)."""
    gpu = Gpu(cluster, "sick")
    registrations = cluster.release.registrations()
    cluster.node.restart_kubelet()
    cluster.release.wait_registered(time.monotonic() + 60, registrations=registrations + 1)
    first = gpu.wait("Healthy")
    unhealthy, healthy = gpu.xid(), gpu.clear()
    print(f"\nafter a kubelet restart: Healthy {first:.1f}s after registration, Unhealthy {unhealthy:.1f}s after the "
          f"XID, Healthy {healthy:.1f}s after the clear")  # fmt: skip


# What the kubelet logs when the health stream fails: kubelet/cm/dra/manager.go, plugin/dra_plugin.go.
STREAM_ERRORS = ("Error receiving from WatchResources stream", "NodeWatchResources RPC call failed", "Unimplemented")
KLOG_ERROR = re.compile(r"^E\d{4} ")


def plugin_errors(lines: list[str]) -> list[str]:
    """The kubelet's errors about our plugin or its health stream: level E or an `err=` naming the driver or the
    health service, or one of the stream's failure messages; not what every stop of a driver pod causes."""
    ours = [line for line in lines if any(n in line for n in (D, "DRAResourceHealth", "WatchResources"))]
    errors = [x for x in ours if KLOG_ERROR.match(x) or " err=" in x or any(e in x for e in STREAM_ERRORS)]
    return [line for line in errors if not any(p.search(line) for p in KUBELET_ROUTINE)]


def kubelet_log(cluster: Cluster) -> list[str]:
    """The kubelet's lines about the driver since this module installed it (other modules share the node)."""
    return cluster.release.log.kubelet_lines()


def test_the_kubelet_logs_no_error_about_the_plugin_or_its_health_stream(cluster: Cluster) -> None:
    """Everything so far ran without a plugin restart (a kubelet restart is not one): no error the kubelet logged
    may name our driver or its health service, and the kubelet did keep a stream open (logged at -v=2)."""
    lines = kubelet_log(cluster)
    started = [line for line in lines if "Successfully started WatchResources health stream" in line]
    assert len(started) >= 2, started  # one per kubelet
    assert plugin_errors(lines) == [], "\n".join(plugin_errors(lines))


def test_a_rolling_update_hands_the_health_stream_and_the_admin_socket_over(cluster: Cluster) -> None:
    """The new driver pod starts beside the old one (maxSurge 1, sockets named with each pod's UID); both share
    `<plugin dir>/health.sock`, which the new one takes over. When the old one stops it must leave the new one's
    socket (else `dra-driver health` finds no daemon), the kubelet reads health from the new pod's stream, and once
    the old pod is gone the kubelet logs no error about the plugin."""
    release, gpu = cluster.release, Gpu(cluster, "sick")
    old = driver_pod(cluster)
    registrations = release.registrations()
    before = len(kubelet_log(cluster))
    [ds] = cluster.cp.kubectl_json("get", "daemonsets", "-n", release.namespace)["items"]
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 1, ds["spec"]["updateStrategy"]
    name, ns = ds["metadata"]["name"], release.namespace
    # The chart's readiness probe keeps the old pod until the new one's sockets answer: both serve for a while.
    cluster.cp.kubectl("rollout", "restart", "daemonset", name, "-n", ns)

    def handed_over() -> str | None:
        names = [p["metadata"]["name"] for p in release.pods()]
        new = release.ready_pod()
        if old in names or new is None or release.registrations() < registrations + 1:
            return None
        return str(new["metadata"]["name"])

    start = time.monotonic()
    seen: list[str] = []  # the device's health in the pod's status while the daemons hand over

    def watched() -> str | None:
        state = device_health(cluster, "sick").get(gpu.resource_id, ("", ""))[0]
        if not seen or seen[-1] != state:
            seen.append(state)
        return handed_over()

    try:
        new = wait_until("the old driver pod replaced", watched, timeout=180, interval=0.5)
    except AssertionError:
        raise AssertionError(release.describe()) from None
    replaced = time.monotonic() - start
    after = len(kubelet_log(cluster))
    assert new != old
    assert "Unhealthy" not in seen, seen
    # the two daemons did serve side by side: the kubelet had both registered
    both = [line for line in kubelet_log(cluster)[before:after] if "Registered DRA plugin" in line]
    assert any("numPlugins=2" in line for line in both), both
    sock = release.plugin_dir / "health.sock"
    assert sock.is_socket(), f"{sock} gone: the old pod removed the new pod's admin socket"
    health_cli(cluster, "status")  # the new pod's daemon answers on it
    first = gpu.wait("Healthy")  # the old pod's stream ended (the kubelet forgot its lists); the new pod's resends
    unhealthy, healthy = gpu.xid(), gpu.clear()
    errors = plugin_errors(kubelet_log(cluster)[after:])
    assert errors == [], "\n".join(errors)
    print(f"\nrolling update: {replaced:.1f}s, the device meanwhile {' -> '.join(seen)}; then Healthy in {first:.1f}s, "
          f"Unhealthy {unhealthy:.1f}s after the XID, Healthy {healthy:.1f}s after the clear")  # fmt: skip
