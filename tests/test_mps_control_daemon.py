"""`dra-driver mps-control-daemon` (dra_driver.sharing.mps_control_daemon), the main process of a claim's MPS
daemon pod, run as a real process against the simulated driver root's real `nvidia-cuda-mps-control`: it starts
the daemon in the foreground, sets it up, marks itself ready, turns SIGTERM into `quit`, and dies with the daemon."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_driver.cli import main as cli_main
from dra_driver.sharing.mps_control_daemon import MpsSettings, parse_pinned
from dra_driver.simulator.nvml import SimulatedNvml
from tests.polling import wait_until


@dataclass
class Node:
    state: Path
    root: Path
    mps: Path
    uuids: list[str]

    def daemons(self) -> dict[str, Any]:
        path = self.state / "sharing-state.json"
        return dict(json.loads(path.read_text()).get("mps", {})) if path.exists() else {}

    def env(self, uuids: list[str] | None = None) -> dict[str, str]:
        return {
            **os.environ,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.mps / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(self.mps / "log"),
            "CUDA_VISIBLE_DEVICES": ",".join(self.uuids if uuids is None else uuids),
        }

    def entry(self, *args: str, uuids: list[str] | None = None) -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "dra_driver", "-v", "mps-control-daemon", f"--driver-root={self.root}"]
        return subprocess.Popen(
            [*argv, f"--ready-file={self.mps / 'ready'}", *args],
            env=self.env(uuids),
            stderr=subprocess.PIPE,
            text=True,
        )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    sim = SimulatedNvml("dgx-h100", tmp_path / "state")
    sim.nvmlInit()
    uuids = [sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetHandleByIndex(i)) for i in range(2)]
    mps = tmp_path / "mps" / "claim"
    for sub in ("pipe", "log", "shm"):
        (mps / sub).mkdir(parents=True)
    n = Node(sim.state_dir, sim.driver_root, mps, uuids)
    yield n
    for entry in n.daemons().values():  # a failed test leaves no daemon behind
        if _alive(int(entry["pid"])):
            os.kill(int(entry["pid"]), signal.SIGKILL)


def _ready(node: Node, proc: subprocess.Popen[str]) -> Any:
    def check() -> Any:
        assert proc.poll() is None, proc.communicate()[1]
        return (node.mps / "ready").exists() and node.daemons()

    return wait_until("the daemon ready", check, timeout=30)


def test_runs_the_daemon_in_the_foreground_with_the_settings_until_sigterm(node: Node) -> None:
    proc = node.entry("--active-thread-percentage=40", "--pinned-mem-limit=1=512M", "--pinned-mem-limit=0=2G")
    try:
        (daemon,) = _ready(node, proc).values()
        pid = int(daemon["pid"])
        assert daemon["foreground"] is True and daemon["visible"] == node.uuids
        assert daemon["active_thread_percentage"] == 40 and daemon["pinned_mem_limits"] == {"1": "512M", "0": "2G"}
        ppid = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("PPid"))
        assert int(ppid.split()[1]) == proc.pid  # its child: it lives and dies with the pod's main process
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert "Cmd:quit" in (node.mps / "log" / "control.log").read_text()
    assert node.daemons() == {} and not _alive(pid) and not (node.mps / "ready").exists()


def test_exits_with_a_failure_when_the_daemon_dies(node: Node) -> None:
    proc = node.entry()
    try:
        (daemon,) = _ready(node, proc).values()
        os.kill(int(daemon["pid"]), signal.SIGKILL)
        assert proc.wait(timeout=30) == 128 + signal.SIGKILL  # the kubelet restarts the container
    finally:
        proc.kill()
    assert "the MPS control daemon exited with -9" in proc.communicate()[1]
    assert not (node.mps / "ready").exists()


def test_a_setting_the_daemon_refuses_fails_the_start_and_stops_the_daemon(node: Node) -> None:
    proc = node.entry("--pinned-mem-limit=5=512M")  # two devices are visible: there is no device 5
    try:
        assert proc.wait(timeout=60) == 1
    finally:
        proc.kill()
    err = proc.communicate()[1]
    assert "set_default_device_pinned_mem_limit 5 512M: exit 1" in err and "Invalid device" in err
    assert node.daemons() == {} and not (node.mps / "ready").exists()


def test_a_daemon_that_cannot_start_fails_the_start(node: Node, tmp_path: Path) -> None:
    proc = node.entry(uuids=["GPU-00000000-0000-0000-0000-000000000000"])  # not a GPU of this node
    assert proc.wait(timeout=60) == 1
    assert "exited with 1 before it answered" in proc.communicate()[1]
    empty = tmp_path / "empty-root"
    empty.mkdir()
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "dra_driver",
            "mps-control-daemon",
            f"--driver-root={empty}",
            f"--ready-file={tmp_path / 'ready'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1 and "nvidia-cuda-mps-control not found in driver root" in missing.stderr


def test_sigterm_while_the_daemon_starts_stops_it_at_once(tmp_path: Path) -> None:
    """A pod deleted while its daemon starts: the entry point stops it and exits, within the grace period."""
    tool = tmp_path / "root" / "usr" / "bin" / "nvidia-cuda-mps-control"
    tool.parent.mkdir(parents=True)
    tool.write_text(  # a daemon that never answers
        '#!/bin/sh\n[ "$1" = -f ] && { echo $$ > "$CUDA_MPS_PIPE_DIRECTORY/pid"; exec sleep 600; }\n'
        'echo "Cannot find MPS control daemon process" >&2; exit 1\n'
    )
    tool.chmod(0o755)
    (tmp_path / "pipe").mkdir()
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dra_driver", "mps-control-daemon", f"--driver-root={tmp_path / 'root'}",
         f"--ready-file={tmp_path / 'ready'}"], env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        pid = int(wait_until("the daemon started", lambda: (tmp_path / "pipe" / "pid").read_text().strip(),
                             tolerate_errors=True))  # fmt: skip
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 1
    finally:
        proc.kill()
    assert "asked to stop before" in proc.communicate()[1]
    assert not _alive(pid) and not (tmp_path / "ready").exists()


def test_a_ready_file_that_is_not_a_regular_file_is_never_removed(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "root").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "dra_driver", "mps-control-daemon", f"--driver-root={tmp_path / 'root'}",
         f"--ready-file={fifo}"], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1 and "nvidia-cuda-mps-control not found" in done.stderr
    assert fifo.is_fifo() and "is not a regular file: left as it is" in done.stderr


def test_settings_commands_and_arguments() -> None:
    s = MpsSettings(40, ((0, "1024M"), (1, "2G")))
    assert s.commands() == [
        "set_default_active_thread_percentage 40",
        "set_default_device_pinned_mem_limit 0 1024M",
        "set_default_device_pinned_mem_limit 1 2G",
    ]
    assert MpsSettings().commands() == [] and MpsSettings().args() == []
    assert parse_pinned("3=512M") == (3, "512M")
    for bad in ("512M", "a=512M", "0=512", "0=0M", "0=1.5G"):
        with pytest.raises(ValueError):
            parse_pinned(bad)
    for percentage in (0, 101):
        with pytest.raises(ValueError):
            MpsSettings(percentage)


def test_cli_refuses_a_malformed_limit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["mps-control-daemon", "--ready-file=/nonexistent/ready", "--pinned-mem-limit=0=lots"])
    assert exit_.value.code == 2 and "expected <device index>=<n>M" in capsys.readouterr().err
