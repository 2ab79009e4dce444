"""The node daemon's health admin endpoint (a Unix socket) and `dra-driver health`, over a real HealthMonitor on
the simulator."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_driver.health.admin import AdminError, HealthAdminServer, request
from tests.plugin_helpers import DRIVER, Node
from tests.polling import wait_until
from tests.test_health import Health, eventually

XID = pynvml.nvmlEventTypeXidCriticalError
DBE = pynvml.nvmlEventTypeDoubleBitEccError


class Admin:
    def __init__(self, health: Health, sock: Path) -> None:
        self.health, self.sock = health, sock
        self.server = HealthAdminServer(health.monitor, sock)

    def raw(self, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, Any]]:
        """A request as any HTTP client sends it (no help from `request`)."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(self.sock))
        conn = http.client.HTTPConnection("localhost")
        conn.sock = s
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = json.loads(response.read())
        conn.close()
        return response.status, answer

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dra_driver", "health", *args, "--socket", str(self.sock)],
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="dra-health-", dir="/tmp"))  # Unix socket paths are limited to 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def admin(tmp_path: Path, short_dir: Path) -> Iterator[Admin]:
    node = Node(tmp_path)
    node.sim.set_supported_events(2, 0)  # GPU 2 cannot be monitored
    driver = node.driver()
    health = Health(node, driver)
    health.monitor.start()
    assert health.monitor.ready.wait(5)
    a = Admin(health, short_dir / "plugin" / "health.sock")
    a.server.start()
    yield a
    a.server.stop()
    health.monitor.stop()
    driver.close()


def test_status_lists_taints_incidents_lost_and_unmonitored_gpus(admin: Admin) -> None:
    sim, monitor = admin.health.node.sim, admin.health.monitor
    assert stat.S_IMODE(os.stat(admin.sock).st_mode) == 0o600 and stat.S_ISSOCK(os.stat(admin.sock).st_mode)
    sim.inject_event(3, XID, xid=79)
    sim.set_gpu_lost(4)
    eventually(lambda: "gpu-3" in monitor.taints() and "gpu-4" in monitor.taints())
    report = request(admin.sock, "GET", "/health")
    assert report["driver"] == DRIVER
    gpu3 = report["devices"]["gpu-3"]
    assert [(t["key"], t["value"], t["effect"]) for t in gpu3["taints"]] == [(f"{DRIVER}/xid", "79", "NoSchedule")]
    [incident] = gpu3["incidents"]
    assert incident["kind"] == "xid" and incident["value"] == "79" and incident["clearable"] is True
    assert incident["gpu"] == sim.gpu_uuids[3] and "gpu-3" in incident["devices"]
    assert set(report["devices"]) == set(monitor.taints())  # MIG partitions of GPU 3, 4 and 2 too
    assert report["lostGPUs"] == [{"uuid": sim.gpu_uuids[4], "device": "gpu-4"}]
    assert report["devices"]["gpu-4"]["incidents"][0]["clearable"] is False
    assert report["unmonitoredGPUs"] == [
        {"uuid": sim.gpu_uuids[2], "device": "gpu-2", "reason": "xid-events-not-supported"}
    ]


def test_clear_over_the_socket_by_name_and_by_uuid(admin: Admin) -> None:
    sim, monitor = admin.health.node.sim, admin.health.monitor
    sim.inject_event(3, XID, xid=79)
    sim.inject_event(5, DBE)
    eventually(lambda: "gpu-3" in monitor.taints() and "gpu-5" in monitor.taints())
    changes = admin.health.changes
    assert request(admin.sock, "POST", "/health/clear", {"device": "gpu-3"}) == {"device": "gpu-3", "cleared": 1}
    assert "gpu-3" not in monitor.taints() and "gpu-5" in monitor.taints()
    assert admin.health.changes == changes + 1  # the monitor told the daemon: the pool is republished
    uuid = sim.gpu_uuids[5]
    assert request(admin.sock, "POST", "/health/clear", {"device": uuid}) == {"device": uuid, "cleared": 1}
    assert request(admin.sock, "POST", "/health/clear", {"device": "gpu-5"})["cleared"] == 0
    assert set(monitor.taints()) == admin.health.gpu_devices(2)  # only the unmonitored GPU is left


def test_bad_input_is_an_error_and_changes_nothing(admin: Admin) -> None:
    sim, monitor = admin.health.node.sim, admin.health.monitor
    sim.inject_event(3, XID, xid=79)
    eventually(lambda: "gpu-3" in monitor.taints())
    before, changes = monitor.taints(), admin.health.changes
    for body in (b"{not json", b'["gpu-3"]', b"{}", b'{"device": 3}', b'{"device": ""}', b'{"name": "gpu-3"}', b""):
        status, answer = admin.raw("POST", "/health/clear", body)
        assert status == 400 and "error" in answer, (body, status, answer)
    status, answer = admin.raw("POST", "/health/clear", b'{"device": "gpu-99"}')
    assert status == 404 and answer["error"] == "'gpu-99' is neither a device of this node nor a GPU UUID"
    assert admin.raw("POST", "/health/clean", b'{"device": "gpu-3"}')[0] == 404
    assert admin.raw("GET", "/metrics")[0] == 404
    with pytest.raises(AdminError, match="neither a device of this node nor a GPU UUID"):
        request(admin.sock, "POST", "/health/clear", {"device": "GPU-00000000-0000-0000-0000-000000000000"})
    assert monitor.taints() == before and admin.health.changes == changes


def test_cli_status_and_clear(admin: Admin) -> None:
    sim, monitor = admin.health.node.sim, admin.health.monitor
    sim.inject_event(3, XID, xid=79)
    eventually(lambda: "gpu-3" in monitor.taints())
    table = admin.cli("status")
    assert table.returncode == 0, table.stderr
    assert f"gpu-3: {DRIVER}/xid=79:NoSchedule" in table.stdout
    assert f"xid 79 on GPU {sim.gpu_uuids[3]}" in table.stdout and "(clearable)" in table.stdout
    assert f"unmonitored GPUs: gpu-2 ({sim.gpu_uuids[2]}: xid-events-not-supported)" in table.stdout
    assert "lost GPUs: none" in table.stdout
    as_json = admin.cli("status", "-o", "json")
    assert json.loads(as_json.stdout) == request(admin.sock, "GET", "/health")

    bad = admin.cli("clear", "gpu-99")
    assert bad.returncode == 1 and "'gpu-99' is neither a device of this node nor a GPU UUID" in bad.stderr
    assert "gpu-3" in monitor.taints()

    cleared = admin.cli("clear", "gpu-3")
    assert cleared.returncode == 0, cleared.stderr
    assert "gpu-3: cleared 1 incident(s)" in cleared.stdout
    assert "gpu-3" not in monitor.taints()
    again = admin.cli("clear", "gpu-3")
    assert again.returncode == 0 and "no XID or ECC incident to clear" in again.stdout


def test_cli_without_a_daemon(short_dir: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dra_driver", "health", "status", "--socket", str(short_dir / "none.sock")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "cannot reach the node daemon's health endpoint" in out.stderr
    assert "Traceback" not in out.stderr


def test_default_socket_follows_the_plugin_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    from dra_driver.cli import _health_socket, build_parser

    monkeypatch.delenv("DRA_DRIVER_HEALTH_SOCKET", raising=False)
    args = build_parser().parse_args(["health", "clear", "gpu-1"])
    assert _health_socket(args) == Path(f"/var/lib/kubelet/plugins/{DRIVER}/health.sock")
    other = build_parser().parse_args(["health", "status", "--driver", "gpu.example.com"])
    assert _health_socket(other) == Path("/var/lib/kubelet/plugins/gpu.example.com/health.sock")
    monkeypatch.setenv("DRA_DRIVER_HEALTH_SOCKET", "/run/plugin/health.sock")  # set by the chart
    assert _health_socket(args) == Path("/run/plugin/health.sock")
    explicit = build_parser().parse_args(["health", "status", "--socket", "/x/health.sock"])
    assert _health_socket(explicit) == Path("/x/health.sock")


def test_stop_removes_the_socket_and_a_stale_one_is_replaced(tmp_path: Path, short_dir: Path) -> None:
    node = Node(tmp_path)
    driver = node.driver()
    health = Health(node, driver)
    sock = short_dir / "health.sock"
    sock.write_text("left over by a crashed daemon")
    server = HealthAdminServer(health.monitor, sock)
    server.start()
    try:
        assert stat.S_ISSOCK(os.stat(sock).st_mode)
        assert request(sock, "GET", "/health")["devices"] == {}
    finally:
        server.stop()
        driver.close()
    assert not sock.exists() and list(short_dir.iterdir()) == []


def _listening(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen()
    return s


def test_a_stopping_daemon_leaves_the_socket_of_the_daemon_that_replaced_it(tmp_path: Path, short_dir: Path) -> None:
    """A rolling update: the new pod's daemon takes the shared path over, then the old one stops. The old one must
    not remove the new one's socket (nor, while binding, another daemon's temporary socket: the PID is 1 in every
    container, so it cannot name the temporary file)."""
    node = Node(tmp_path)
    driver = node.driver()
    health = Health(node, driver)
    sock = short_dir / "health.sock"
    # another daemon, binding at this moment, under the names a PID-based temporary name would take
    others = [_listening(short_dir / f".health.sock.{pid}") for pid in (1, os.getpid())]
    old, new = HealthAdminServer(health.monitor, sock), HealthAdminServer(health.monitor, sock)
    try:
        old.start()
        new.start()
        old.stop()
        assert stat.S_ISSOCK(os.lstat(sock).st_mode), "the old daemon removed the new one's socket"
        assert request(sock, "GET", "/health")["driver"] == DRIVER  # served by the new daemon
        new.stop()
        assert not sock.exists()
        assert sorted(p.name for p in short_dir.iterdir()) == sorted(
            {f".health.sock.{pid}" for pid in (1, os.getpid())}
        )  # the other daemon's temporary sockets were left alone, none of ours is left behind
    finally:
        for s in others:
            s.close()
        old.stop()
        new.stop()
        driver.close()


def test_a_socket_replaced_after_start_by_someone_else_is_left_on_stop(tmp_path: Path, short_dir: Path) -> None:
    node = Node(tmp_path)
    driver = node.driver()
    health = Health(node, driver)
    sock = short_dir / "health.sock"
    server = HealthAdminServer(health.monitor, sock)
    server.start()
    sock.unlink()  # removed, and another daemon's socket appears there (maybe reusing the inode number)
    other = _listening(sock)
    try:
        server.stop()
        assert stat.S_ISSOCK(os.lstat(sock).st_mode)
    finally:
        other.close()
        driver.close()


def test_a_deleted_socket_is_served_again(tmp_path: Path, short_dir: Path) -> None:
    node = Node(tmp_path)
    driver = node.driver()
    health = Health(node, driver)
    sock = short_dir / "health.sock"
    server = HealthAdminServer(health.monitor, sock, socket_check_interval_s=0.05)
    server.start()
    try:
        assert request(sock, "GET", "/health")["driver"] == DRIVER
        sock.unlink()  # e.g. a cleanup of the plugin directory
        wait_until("health.sock is served again", sock.exists, timeout=10)
        assert stat.S_IMODE(os.lstat(sock).st_mode) == 0o600
        assert request(sock, "GET", "/health")["driver"] == DRIVER
    finally:
        server.stop()
        driver.close()
    assert not sock.exists() and list(short_dir.iterdir()) == []
