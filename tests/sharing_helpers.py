"""Finding and stopping the simulated MPS control daemons of a simulated node (real processes: a test that
started one must not leave it behind)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dra_driver.simulator.tools.state import pid_alive


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def daemon_pids(state_dir: Path) -> list[int]:
    """Live MPS control daemons run from this node's driver root, whether or not they recorded themselves."""
    marker = f"{state_dir}/driver-root/usr/bin/nvidia-cuda-mps-control".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline and pid_alive(int(entry)):
            pids.append(int(entry))
    return pids


def stop_daemons(state_dir: Path) -> list[int]:
    """SIGTERM (then SIGKILL) every daemon of the node; returns the pids that were still running."""
    left = daemon_pids(state_dir)
    for pid in left:
        os.kill(pid, signal.SIGTERM)
    for pid in left:
        if not wait_gone(pid, 5.0):
            os.kill(pid, signal.SIGKILL)
            wait_gone(pid, 5.0)
    return left


@contextmanager
def no_daemon_left(state_dir: Path) -> Iterator[None]:
    """Stops whatever daemon the block leaves behind (cleanup even when the block fails)."""
    try:
        yield
    finally:
        stop_daemons(state_dir)
