"""The tests' child processes: none outlives the test process, and each is stopped the same way."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Pre-exec (or first thing in a child): get SIGKILL when the parent dies, so no daemon outlives a test."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def stop(proc: subprocess.Popen[Any] | None, timeout: float = 30.0) -> None:
    """`proc` ended: SIGTERM, then SIGKILL after `timeout` seconds; nothing to do when it has gone already."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)
