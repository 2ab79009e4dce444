"""dra_driver.claimstate.crashpoints: the kill happens where asked, once with DRA_DRIVER_CRASH_ONCE, and as PID 1."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = "from dra_driver.claimstate import crashpoints; crashpoints.reached('prepare.cdi-written'); print('survived')"


def run(env: dict[str, str], *prefix: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DRA_DRIVER_CRASH")}
    return subprocess.run(
        [*prefix, sys.executable, "-c", SCRIPT], env={**clean, **env}, capture_output=True, text=True, timeout=60
    )


def test_a_crash_point_kills_at_its_step_only() -> None:
    assert run({"DRA_DRIVER_CRASH_AT": "prepare.cdi-written"}).returncode == -9
    assert run({"DRA_DRIVER_CRASH_AT": "prepare.mig-created"}).stdout.strip() == "survived"


def test_crash_once_kills_the_first_process_only(tmp_path: Path) -> None:
    marker = tmp_path / "crashed"
    env = {"DRA_DRIVER_CRASH_AT": "prepare.cdi-written", "DRA_DRIVER_CRASH_ONCE": str(marker)}
    assert run(env).returncode == -9
    assert marker.exists()
    again = run(env)  # the kubelet restarts the container with the same environment
    assert again.returncode == 0 and again.stdout.strip() == "survived"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_pid_1_of_a_pid_namespace_dies_too(tmp_path: Path) -> None:
    """A container's main process ignores its own SIGKILL (the kernel protects a namespace's init)."""
    proc = run({"DRA_DRIVER_CRASH_AT": "prepare.cdi-written"}, "unshare", "--pid", "--fork", "--mount-proc")
    assert "survived" not in proc.stdout
    assert proc.returncode == 137, (proc.returncode, proc.stderr)
