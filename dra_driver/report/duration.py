"""Durations as Prometheus writes them (7d, 90m, 1h30m, 45s)."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")


def parse_duration(text: str) -> float:
    """Seconds in `text`; ValueError when it is not a positive Prometheus duration."""
    parts = _PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r} (e.g. 7d, 12h, 90m, 1h30m)")
    seconds = sum(int(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"not a positive duration: {text!r}")
    return seconds


def promql_duration(seconds: float) -> str:
    """Whole seconds, as PromQL reads them."""
    return f"{max(1, round(seconds))}s"
