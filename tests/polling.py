"""Waiting for a cluster or a daemon to get somewhere: poll with a deadline, never a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
    """Poll `check` until it returns something truthy (returned); fail with `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)
