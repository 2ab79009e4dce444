"""Waiting for a cluster or a daemon to get somewhere: poll with a deadline, never a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    what: str, check: Callable[[], Any], timeout: float = 30, *, tolerate_errors: bool = False, interval: float = 0.2
) -> Any:
    """Poll `check` until it returns something truthy (returned); fail with `what` at the deadline. With
    `tolerate_errors`, an exception from `check` counts as "not yet" (objects that do not exist yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
        except Exception:
            if not tolerate_errors:
                raise
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60) -> None:
    """`wait_until` for API objects that may not exist yet: errors from `check` mean "not yet"."""
    wait_until(what, check, timeout, tolerate_errors=True)
