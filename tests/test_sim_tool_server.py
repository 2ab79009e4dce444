"""The simulated tools' fork server (dra_driver.simulator.tools.forkserver): a served call answers as a process of its
own would (output, exit code, the caller's environment, directory and streams), a caller killed midway takes its
child with it, and the MPS daemon's start is never served (its command line is how it is known)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.simulator.tools import forkserver
from dra_driver.simulator.tools.state import pid_alive
from tests.sharing_helpers import daemon_pids, wait_gone
from tests.test_sim_tools import sim  # noqa: F401  (the fixture: a dgx-h100, no MPS daemon left behind)

TIMEOUT_S = 30


def run(machine: SimulatedNvml, name: str, *args: str, served: bool, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(machine.driver_root / "usr" / "bin" / name), *args], capture_output=True, text=True, timeout=TIMEOUT_S,
        env={**os.environ, forkserver.ENV: "1" if served else "0", **env},
    )  # fmt: skip


def server_pid() -> int:
    """The fork server of this test's context, once it listens."""
    deadline = time.monotonic() + TIMEOUT_S
    marker = str(forkserver.socket_path()).encode()
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if marker in Path(f"/proc/{entry}/cmdline").read_bytes() and forkserver.socket_path().exists():
                        return int(entry)
                except OSError:
                    continue
        time.sleep(0.05)
    raise AssertionError("no fork server started")


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(stat[1]) == pid and stat[0] != "Z":
                out.append(int(entry))
    return out


def test_a_served_call_answers_as_its_own_process_would(sim: SimulatedNvml, tmp_path: Path) -> None:  # noqa: F811
    uuid = sim.gpu_uuids[2]
    run(sim, "nvidia-smi", "-L", served=True)  # starts the server if none runs
    server_pid()
    for args in (
        ["-L"],
        ["--query-gpu=compute_mode", "--format=csv,noheader", "-i", uuid],
        ["-i", "99", "-c", "DEFAULT"],  # exit code 6, its message on stdout
        ["--no-such-option"],
    ):
        direct, served = run(sim, "nvidia-smi", *args, served=False), run(sim, "nvidia-smi", *args, served=True)
        assert (served.returncode, served.stdout, served.stderr) == (direct.returncode, direct.stdout, direct.stderr)
    assert run(sim, "nvidia-smi", "-i", "99", "-c", "DEFAULT", served=True).returncode == 6
    # the caller's directory and environment: the mps client finds its pipe directory by both
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    started = run(
        sim, "nvidia-cuda-mps-control", "-d", served=True, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_VISIBLE_DEVICES=uuid
    )
    assert started.returncode == 0, started.stderr
    (daemon,) = daemon_pids(sim.state_dir)  # known by its command line: the start was not served
    assert daemon not in children_of(server_pid())
    quit_ = subprocess.run(
        [str(sim.driver_root / "usr" / "bin" / "nvidia-cuda-mps-control")], input="quit\n", capture_output=True,
        text=True, timeout=TIMEOUT_S, env={**os.environ, forkserver.ENV: "1", "CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
    )  # fmt: skip
    assert quit_.returncode == 0, quit_.stderr
    assert wait_gone(daemon)


def test_a_caller_killed_midway_takes_its_child_with_it(sim: SimulatedNvml, tmp_path: Path) -> None:  # noqa: F811
    run(sim, "nvidia-smi", "-L", served=True)
    server = server_pid()
    # the mps client reads its commands from stdin: served, it waits there in the server's child
    caller = subprocess.Popen(
        [str(sim.driver_root / "usr" / "bin" / "nvidia-cuda-mps-control")], stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
        env={**os.environ, forkserver.ENV: "1", "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)},
    )  # fmt: skip
    deadline = time.monotonic() + TIMEOUT_S
    while not (children := children_of(server)):
        assert time.monotonic() < deadline and caller.poll() is None, "the call was not served"
        time.sleep(0.02)
    caller.send_signal(signal.SIGKILL)
    caller.wait(TIMEOUT_S)
    assert all(wait_gone(child) for child in children)
    assert pid_alive(server)  # and it serves the next call
    assert run(sim, "nvidia-smi", "-L", served=True).stdout.count("GPU ") == 8
