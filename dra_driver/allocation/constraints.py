"""Claim constraints: matchAttribute (all devices share a value) and distinctAttribute (all values differ).

Both are monotonic, so the search can prune as soon as `add` fails. A constraint with no request names applies to
every request; `req` matches its subrequests too, `req/sub` only that subrequest.

With DRAListTypeAttributes (`sets`) the scheduler's experimental allocator compares values as sets, a scalar being a
set of one: matchAttribute wants a value common to every device (the intersection so far narrows with each device),
distinctAttribute wants every device's set disjoint from each other's; values of different types never meet. Without
it a list attribute matches nothing: the first device may hold one, but no device can join it, nor follow it.
"""

from __future__ import annotations

from typing import Any

from dra_driver.allocation.pools import PoolDevice
from dra_driver.api.slice import LIST_KINDS

_SCALARS = ("string", "int", "bool", "version")


class _List:
    """A list value seen without DRAListTypeAttributes: equal to nothing, not even another list."""


def _value(attr: dict[str, Any] | None) -> tuple[str, Any] | None:
    if not attr:
        return None
    for kind in _SCALARS:
        if kind in attr:
            return (kind, attr[kind])
    for kind in LIST_KINDS:
        if kind in attr:
            return ("list", _List())
    return None


Values = tuple[str, frozenset[Any]]  # (scalar kind, the set of values)


def _as_set(attr: dict[str, Any] | None) -> Values | None:
    """attributeAsSet: a non-empty list's items, else the scalar as a set of one; the kind keeps 1 and true apart."""
    if not attr:
        return None
    for kind in LIST_KINDS:
        if attr.get(kind):
            return (kind[:-1], frozenset(attr[kind]))
    for kind in _SCALARS:
        if attr.get(kind) is not None:
            return (kind, frozenset((attr[kind],)))
    return None


def _common(a: Values, b: Values) -> Values | None:
    """deviceAttributeListAsSet.intersection: None when the types differ or nothing is shared."""
    if a[0] != b[0] or not a[1] & b[1]:
        return None
    return (a[0], a[1] & b[1])


class Constraint:
    def __init__(
        self,
        index: int,
        requests: list[str],
        attribute: str,
        distinct: bool,
        sets: bool = False,
        per_request: bool = False,
    ) -> None:
        self.index = index
        self.requests = set(requests)
        self.attribute = attribute
        self.distinct = distinct
        self.sets = sets  # DRAListTypeAttributes: compare as sets (the module's docstring)
        # every device's value (matchAttribute: the first decides), popped on remove
        self.values: list[tuple[str, Any]] = []
        # with sets: matchAttribute's intersection after each device, distinctAttribute's sets; popped on remove
        self.stack: list[Values] = []
        # 1.36's distinctAttribute (v0.36 incubating allocator): one value kept per request name, the last device's
        self.per_request = per_request
        self.by_request: dict[str, tuple[str, Any]] = {}
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
        if self.sets:
            return self._add_set(_as_set(device.attribute(self.attribute)))
        value = _value(device.attribute(self.attribute))
        if value is None:
            return False
        if self.distinct:
            return self._add_per_request(request, value) if self.per_request else self._add_distinct(value)
        if self.values and value != self.values[0]:
            return False
        self.values.append(value)
        return True

    def _add_set(self, values: Values | None) -> bool:
        if values is None:
            return False
        if self.distinct:
            if any(_common(values, other) is not None for other in self.stack):
                return False
            self.stack.append(values)
            return True
        if self.stack:
            narrowed = _common(self.stack[-1], values)
            if narrowed is None:
                return False
            values = narrowed
        self.stack.append(values)
        return True

    def _add_per_request(self, request: str, value: tuple[str, Any]) -> bool:
        # As 1.36's: a request's third device is only kept apart from its second, and a value forgotten when another
        # device of its request is removed no longer counts; a list is refused once any value is kept.
        if self.count and (value in self.by_request.values() or (value[0] == "list" and self.by_request)):
            return False
        self.by_request[request] = value
        self.count += 1
        return True

    def _add_distinct(self, value: tuple[str, Any]) -> bool:
        # As upstream's distinctAttributeConstraint: every device's value so far, not one per request (a request's
        # second device must differ from its first too: the list-attribute scenarios of tests/test_alloc_differential
        # showed the scheduler refuse it), and a list value after the first device is refused, as a type it does not
        # compare.
        if self.values and (value[0] == "list" or value in self.values):
            return False
        self.values.append(value)
        return True

    def remove(self, request: str, subrequest: str) -> None:
        if not self.applies(request, subrequest):
            return
        if self.sets:
            self.stack.pop()
        elif self.distinct and self.per_request:
            self.by_request.pop(request, None)
            self.count -= 1
        else:
            self.values.pop()
