"""The context of one call working on claims (a kubelet gRPC request): its deadline, an id for its log lines, and
its logger. The gRPC layer makes one per request; prepare and unprepare hand it down to every wait of the call: the
API reads, the node lock, the steps (MIG carving, sharing's commands and daemons, the CDI write, the checkpoint),
so that each ends at the deadline instead of holding a gRPC worker after the kubelet gave up."""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

DEADLINE_MARGIN_S = 0.5  # give up this long before the caller's deadline, so that the answer still reaches it

_ids = itertools.count(1)


def time_left(deadline: float) -> float:
    """Seconds left for work before `deadline` (a time.monotonic() value), the margin kept for the answer."""
    return deadline - time.monotonic() - DEADLINE_MARGIN_S


class DeadlineExceeded(Exception):
    """The call's deadline passed before a step could start: the steps done so far are recorded and undone."""


class _CallLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        assert self.extra is not None
        return f"[{self.extra['request']}] {msg}", kwargs


@dataclass(frozen=True)
class CallContext:
    deadline: float | None = None  # time.monotonic() when the caller gives up; None: it never does
    request_id: str = field(default_factory=lambda: f"r{next(_ids)}")
    log: logging.LoggerAdapter = field(init=False, repr=False, compare=False)  # type: ignore[type-arg]

    def __post_init__(self) -> None:
        logger = logging.getLogger("dra_driver.plugin.driver")
        object.__setattr__(self, "log", _CallLog(logger, {"request": self.request_id}))

    @classmethod
    def within(cls, seconds: float) -> CallContext:
        """A call that gives up `seconds` from now (start-up recovery's own deadline, tests)."""
        return cls(time.monotonic() + DEADLINE_MARGIN_S + seconds)

    def time_left(self) -> float:
        """Seconds left for work (infinite without a deadline)."""
        return math.inf if self.deadline is None else time_left(self.deadline)

    def expired(self) -> bool:
        return self.time_left() <= 0

    def check(self, before: str) -> None:
        """DeadlineExceeded when no time is left to start `before`."""
        if self.expired():
            raise DeadlineExceeded(f"deadline exceeded before {before}")

    def timeout(self, limit: float) -> float:
        """`limit`, shortened to what is left of the call (never negative)."""
        return max(0.0, min(limit, self.time_left()))

    def deadline_within(self, limit: float) -> float:
        """A deadline like the caller's (the answer margin not yet taken off), at most `limit` seconds of work from
        now: for waits that take a deadline and measure it with `time_left`, as every waiter does."""
        capped = time.monotonic() + limit + DEADLINE_MARGIN_S
        return capped if self.deadline is None else min(self.deadline, capped)


NO_DEADLINE = CallContext(request_id="internal")
