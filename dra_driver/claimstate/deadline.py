"""The deadline of a call working on claims (a gRPC request of the kubelet): how much of it is left for work."""

from __future__ import annotations

import time

DEADLINE_MARGIN_S = 0.5  # give up this long before the caller's deadline, so that the answer still reaches it


def time_left(deadline: float) -> float:
    """Seconds left for work before `deadline` (a time.monotonic() value), the margin kept for the answer."""
    return deadline - time.monotonic() - DEADLINE_MARGIN_S
