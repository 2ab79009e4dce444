"""Keeping the node daemon's resident memory small (it runs on every GPU node, beside the workloads).

glibc gives every thread that allocates its own malloc arena (up to 8 per core), and memory freed in one is never
returned while anything above it lives: a daemon with two gRPC thread pools, watches and monitors ends up holding
tens of MB of freed heap. Two arenas are plenty for a daemon whose hot path is a few allocations per request; and
start-up (discovery, the catalog, the first slices) frees a lot that `malloc_trim` hands back. On a libc without
these calls (musl) both are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from functools import cache
from typing import Any

log = logging.getLogger(__name__)

M_ARENA_MAX = -8  # <malloc.h>
ARENAS = 2


@cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas; call before the first threads start. True when the C library took it."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    ok = bool(libc.mallopt(M_ARENA_MAX, arenas))
    log.debug("malloc arenas capped at %d: %s", arenas, ok)
    return ok


def trim() -> bool:
    """Return freed heap memory to the kernel (after start-up and rediscoveries). True when some was."""
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    return bool(libc.malloc_trim(0))


class TrimWhenIdle:
    """`trim` once calls stop: a burst of prepares on many gRPC threads leaves MB of freed heap in malloc's arenas
    (bench/bench_prepare.py's 16 callers). Call `tick` once a period with the number of calls so far; the
    first tick without new calls after some trims. True when it did."""

    def __init__(self, calls: int = 0) -> None:
        self._calls, self._trimmed = calls, True

    def tick(self, calls: int) -> bool:
        if calls != self._calls:
            self._calls, self._trimmed = calls, False
            return False
        if self._trimmed:
            return False
        self._trimmed = True
        trim()
        return True
