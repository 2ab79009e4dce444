"""The node daemon as deployed: one process publishing the node's pool and serving the kubelet, against a real
control plane, with the kubelet played over the real sockets."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pynvml

from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME as DRIVER
from tests.kubelet_harness import KubeletHarness
from tests.plugin_helpers import GPU_CLASS, claim, ref
from tests.polling import wait_for
from tests.test_publisher import pool, pool_complete

NODE = "daemon-node"
HEALTHY, UNHEALTHY = 1, 2  # v1alpha1.HealthStatus


def next_health(stream: Any, device: str, wanted: int) -> dict[str, int]:
    """Read the kubelet's health stream until `device` has the `wanted` status; the last list, {device: status}."""
    for response in stream:
        assert {d.device.pool_name for d in response.devices} == {NODE}
        got = {d.device.device_name: d.health for d in response.devices}
        if got.get(device) == wanted:
            return got
    raise AssertionError(f"the health stream ended before {device} was {wanted}")


def device_taints(cp: Any, device: str) -> list[tuple[str, str]]:
    """(key, value) of the taints of a device in the node's pool."""
    devices = {d["name"]: d for o in pool(cp, NODE) for d in o["spec"].get("devices") or []}
    return [(t["key"], t.get("value", "")) for t in devices[device].get("taints") or []]


def claim_health(cp: Any, name: str) -> tuple[str, str] | None:
    """(status, reason) of the DeviceHealthy condition this driver wrote in the claim's status."""
    for d in cp.kubectl_json("get", "resourceclaim", name).get("status", {}).get("devices") or []:
        for c in d.get("conditions") or []:
            if d["driver"] == DRIVER and c["type"] == "DeviceHealthy":
                return c["status"], c["reason"]
    return None


def test_daemon_publishes_serves_and_republishes(control_plane, tmp_path: Path) -> None:
    cp = control_plane
    cp.create_node(NODE)
    state = tmp_path / "gpu"
    sockets = Path(f"/tmp/dra-daemon-{os.getpid()}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "dra_driver", "plugin", "--sim", "dgx-a100", "--mode", "partitionable",
           "--sim-state", str(state),
           "--node-name", NODE, "--kubeconfig", str(cp.kubeconfig), "--plugin-dir", str(sockets / "plugin"),
           "--registry-dir", str(sockets / "registry"), "--cdi-root", str(tmp_path / "cdi"),
           "--rediscover-seconds", "0.5", "--metrics-port", str(port)]  # fmt: skip
    daemon = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    kubelet = KubeletHarness(sockets / "registry", DRIVER)
    try:
        wait_for("pool published", lambda: pool_complete(cp, NODE, 1, 1), timeout=60)  # A100s, MIG off: whole GPUs
        assert len(pool(cp, NODE)[0]["spec"]["devices"]) == 8
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert re.search(r'dra_driver_gpu_temperature_celsius\{[^}]*device="gpu-3"', metrics)  # GPU telemetry
        assert 'dra_driver_publish_total{result="published"}' in metrics
        info = kubelet.register()
        assert "v1alpha1.DRAResourceHealth" in info.supported_versions
        health_stream = kubelet.watch_resources(timeout=120)  # as the kubelet does (ResourceHealthStatus, 1.36)
        first = next_health(health_stream, "gpu-4", HEALTHY)
        assert len(first) == 8 and set(first.values()) == {HEALTHY}
        cp.apply({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                                         "metadata": {"name": "daemon-gpu"},
                                                         "spec": GPU_CLASS["spec"]})  # fmt: skip
        created = cp.create_allocated(claim(["gpu-4"], device_class="daemon-gpu", pool=NODE))
        c_ref = ref(created)
        result = kubelet.prepare([c_ref])[c_ref.uid]
        assert result.error == "" and result.devices[0].device == "gpu-4"
        assert len(list((tmp_path / "cdi").glob("*.json"))) == 1

        # Device health: an XID on the prepared GPU taints it in the pool, marks the claim's device unhealthy and
        # is counted; the operator clears it through the admin socket, and both go back.
        admin_socket = sockets / "plugin" / "health.sock"
        assert stat.S_IMODE(admin_socket.stat().st_mode) == 0o600
        sim = SimulatedNvml("dgx-a100", state)
        sim.inject_event(4, pynvml.nvmlEventTypeXidCriticalError, xid=79)
        wait_for("gpu-4 tainted in the pool", lambda: device_taints(cp, "gpu-4") == [(f"{DRIVER}/xid", "79")])
        wait_for("claim's device unhealthy", lambda: claim_health(cp, c_ref.name) == ("False", "XID"))
        assert next_health(health_stream, "gpu-4", UNHEALTHY)["gpu-3"] == HEALTHY
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        xid_series = rf'dra_driver_gpu_xid_errors_total\{{[^}}]*claim="{c_ref.name}"[^}}]*device="gpu-4"[^}}]*\}} 1.0'
        assert re.search(xid_series, metrics), metrics
        status = subprocess.run([sys.executable, "-m", "dra_driver", "health", "status", "--socket", str(admin_socket)],
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        assert status.returncode == 0 and f"gpu-4: {DRIVER}/xid=79:NoSchedule" in status.stdout, status
        clear = subprocess.run([sys.executable, "-m", "dra_driver", "health", "clear", "gpu-4", "--socket",
                                str(admin_socket)], capture_output=True, text=True, timeout=60)  # fmt: skip
        assert clear.returncode == 0 and "gpu-4: cleared 1 incident(s)" in clear.stdout, clear
        wait_for("gpu-4 untainted", lambda: device_taints(cp, "gpu-4") == [])
        wait_for("claim's device healthy again", lambda: claim_health(cp, c_ref.name) == ("True", "Healthy"))
        assert set(next_health(health_stream, "gpu-4", HEALTHY).values()) == {HEALTHY}
        health_stream.cancel()
        assert kubelet.unprepare([c_ref]) == {c_ref.uid: ""}

        # An operator switches MIG on for GPU 0 and resets it: its partitions appear in the pool.
        sim.nvmlInit()
        sim.nvmlDeviceSetMigMode(sim.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_DEVICE_MIG_ENABLE)
        sim.reset_gpu(0)
        # (generation 4: the XID and its clear republished the pool as generations 2 and 3)
        wait_for("republished with MIG partitions", lambda: pool_complete(cp, NODE, 3, 4), timeout=60)
        names = {d["name"] for o in pool(cp, NODE) for d in o["spec"].get("devices") or []}
        assert "gpu-0" not in names and "gpu-0-mig-3g20gb-9-4" in names
    finally:
        kubelet.close()
        daemon.send_signal(signal.SIGTERM)
        out, _ = daemon.communicate(timeout=60)
        cp.delete("resourceslices", wait=120, field_selector=f"spec.nodeName={NODE}")
        cp.delete_node(NODE)
    assert daemon.returncode == 0, out
    assert not list((sockets / "registry").glob("*.sock")) and not (sockets / "plugin" / "dra.sock").exists()
    assert not (sockets / "plugin" / "health.sock").exists()


def test_metrics_listen_only_on_the_given_address() -> None:
    from dra_driver.metricsserver import serve_metrics

    # 127.0.0.2 is loopback too: a server bound to 0.0.0.0 would answer on 127.0.0.1 as well
    server = serve_metrics(0, "127.0.0.2")
    try:
        address, port = server.server_address[:2]
        assert address == "127.0.0.2"
        assert urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=10).status == 200
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0
    finally:
        server.shutdown()
        server.server_close()
