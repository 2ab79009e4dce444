"""Crash points: where a test can kill the process. Their names and order are declared with the steps they belong
to (claimstate.steps: `ALL_POINTS`).

Off unless the environment asks for it, so production never pays more than one dict lookup per step:

- ``DRA_DRIVER_CRASH_AT=<step>[:<n>]``: SIGKILL this process the n-th time (default 1) it reaches ``<step>``;
- ``DRA_DRIVER_CRASH_TRACE=<file>``: append every step reached to ``<file>``, one name a line (coverage);
- ``DRA_DRIVER_CRASH_ONCE=<file>``: with ``DRA_DRIVER_CRASH_AT``, kill only while ``<file>`` does not exist, creating it
  first: a container that the kubelet restarts with the same environment crashes once, not in a loop.

SIGKILL, not an exception: nothing runs after it (no ``finally``, no rollback, no flush), as in a real crash. As PID 1
of a container's PID namespace the process ignores its own SIGKILL; ``os._exit`` then ends it just as abruptly.
"""

from __future__ import annotations

import os
import signal
import threading

CRASH_AT_ENV = "DRA_DRIVER_CRASH_AT"
TRACE_ENV = "DRA_DRIVER_CRASH_TRACE"
ONCE_ENV = "DRA_DRIVER_CRASH_ONCE"

_lock = threading.Lock()
_counts: dict[str, int] = {}


def reached(step: str) -> None:
    """Mark that the crash point `step` is reached; kills the process here when the environment says so."""
    target = os.environ.get(CRASH_AT_ENV)
    trace = os.environ.get(TRACE_ENV)
    if not target and not trace:
        return
    with _lock:
        if trace:
            with open(trace, "a") as f:
                f.write(step + "\n")
                f.flush()
                os.fsync(f.fileno())
        if not target:
            return
        name, _, nth = target.partition(":")
        if name != step:
            return
        _counts[step] = _counts.get(step, 0) + 1
        if _counts[step] != int(nth or 1):
            return
        once = os.environ.get(ONCE_ENV)
        if once:
            try:
                os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            except FileExistsError:
                return
        os.kill(os.getpid(), signal.SIGKILL)
        os._exit(128 + signal.SIGKILL)  # PID 1 of a PID namespace: its own SIGKILL is ignored
