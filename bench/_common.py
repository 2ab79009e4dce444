"""Small helpers shared by the benches: percentiles, process RSS, ratios."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence


def pctl(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process (all its threads), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """VmRSS of a process in MB (10^6 bytes), from /proc/PID/status."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"no VmRSS for process {pid}")


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.1f}x" if theirs > 0 and not math.isnan(ours) and not math.isnan(theirs) else "-"
