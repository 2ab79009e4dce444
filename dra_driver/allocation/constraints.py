"""Claim constraints: matchAttribute (all devices share a value) and distinctAttribute (all values differ).

Both are monotonic, so the search can prune as soon as `add` fails. A constraint with no request names applies to
every request; `req` matches its subrequests too, `req/sub` only that subrequest.
"""

from __future__ import annotations

from typing import Any

from dra_driver.allocation.pools import PoolDevice


def _value(attr: dict[str, Any] | None) -> tuple[str, Any] | None:
    if not attr:
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in attr:
            return (kind, attr[kind])
    for kind in ("strings", "ints", "bools", "versions"):
        if kind in attr:
            return (kind, tuple(attr[kind]))
    return None


class Constraint:
    def __init__(self, index: int, requests: list[str], attribute: str, distinct: bool) -> None:
        self.index = index
        self.requests = set(requests)
        self.attribute = attribute
        self.distinct = distinct
        self.values: list[tuple[str, Any]] = []  # matchAttribute: every device's, the first one decides
        self.by_request: dict[str, tuple[str, Any]] = {}  # distinctAttribute
        self.count = 0

    def describe(self) -> str:
        kind = "distinctAttribute" if self.distinct else "matchAttribute"
        over = ", ".join(sorted(self.requests)) if self.requests else "all requests"
        return f"constraint #{self.index} ({kind} {self.attribute} over {over})"

    def applies(self, request: str, subrequest: str) -> bool:
        if not self.requests:
            return True
        return request in self.requests or (bool(subrequest) and f"{request}/{subrequest}" in self.requests)

    def add(self, request: str, subrequest: str, device: PoolDevice) -> bool:
        if not self.applies(request, subrequest):
            return True
        value = _value(device.attribute(self.attribute))
        if value is None:
            return False
        if self.distinct:
            return self._add_distinct(request, value)
        if self.values and value != self.values[0]:
            return False
        self.values.append(value)
        return True

    def _add_distinct(self, request: str, value: tuple[str, Any]) -> bool:
        # As upstream's distinctAttributeConstraint: one value kept per request name (the last device's), compared
        # with those; so a request's third device is only kept apart from its second, and a shared device another
        # request holds may be picked again when its value was overwritten.
        if self.count and value in self.by_request.values():
            return False
        self.by_request[request] = value
        self.count += 1
        return True

    def remove(self, request: str, subrequest: str) -> None:
        if not self.applies(request, subrequest):
            return
        if self.distinct:
            self.by_request.pop(request, None)
            self.count -= 1
        else:
            self.values.pop()
