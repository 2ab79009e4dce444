"""The runtime cost of one function call, as cel-go's CostTracker.costCall charges it in Kubernetes.

Three layers, first answer wins (interpreter/runtimecost.go):
  1. the trackers ext.Lists and ext.Sets register per overload id (`lists.range`, `sort`, `sets.contains`...);
  2. Kubernetes' library cost estimator, per function name (apiserver/pkg/cel/library/cost.go CallCost);
  3. cel-go's own table per overload id (string comparisons, `+` on strings, `matches`, `contains`...);
and 1 for anything else. The cost replaces the call's 1, it is not added to it, and it can be 0 (`"" == x`).

The overload id is the one the type checker resolved, and only when it resolved exactly one: cel-go's planner keeps
no id for a call with several candidate overloads (`dyn(a) + dyn(b)`), so such a call gets neither a tracker nor
cel-go's table, only Kubernetes' per-name costs, else 1.

Sizes are cel-go's `actualSize`: characters of a string, bytes, list or map entries, an optional's value, the
bytes of an IP or CIDR prefix, otherwise 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dra_driver.cel.cost import LIST_CREATE
from dra_driver.cel.ext.formats import NamedFormat
from dra_driver.cel.ext.net import CIDR, IP
from dra_driver.cel.ext.urls import URL
from dra_driver.cel.features import active
from dra_driver.cel.library import range_size_error
from dra_driver.cel.quantity import Quantity
from dra_driver.cel.semver import Semver
from dra_driver.cel.values import DomainMap, NativeMap, Optional, UInt, key_of

STRING_TRAVERSAL: Final = 0.1  # common.StringTraversalCostFactor
REGEX_LENGTH: Final = 0.25  # common.RegexStringLengthCostFactor


@dataclass(frozen=True, slots=True)
class CallCost:
    """`fn(args, result)`: receiver first in `args`; `result` is None when the call failed (cel-go then sizes its
    error value as 1). `uses_result` False: the cost depends on the arguments only, so it can be charged before the
    work is done, which keeps an O(n²) call over the limit from running at all."""

    fn: Callable[[Sequence[Any], Any], int]
    uses_result: bool = False


def actual_size(value: Any) -> int:
    if isinstance(value, str | bytes | list | dict):
        return len(value)
    if isinstance(value, Optional):
        return actual_size(value.value) if value.has_value else 1
    if isinstance(value, IP | CIDR):
        return value.size()
    return 1


def _factor(size: float, per_unit: float) -> int:
    """uint64(math.Ceil(size * factor))."""
    return math.ceil(size * per_unit)


def tenth(size: int) -> int:
    """ceil(size x 0.1), the string traversal factor; integer arithmetic where it equals Go's float result."""
    return (size + 9) // 10 if size < 2000 else math.ceil(size * STRING_TRAVERSAL)


def _traversal(value: Any) -> int:
    """Kubernetes' traversalCost: a tenth of each string's bytes, rounded down, summed over lists and maps."""
    if isinstance(value, str):
        return int(len(value.encode("utf-8", "surrogateescape")) * STRING_TRAVERSAL)
    if isinstance(value, bytes):
        return int(len(value) * STRING_TRAVERSAL)
    if isinstance(value, list):
        return sum(_traversal(item) for item in value)
    if isinstance(value, dict):
        return sum(_traversal(key_of(k)) + _traversal(v) for k, v in value.items())
    return 1


# -- 1. ext.Lists / ext.Sets trackers, by overload id --------------------------------------------------------------
def _allocating(factor: float, size: int) -> int:
    """trackAllocatingListCall: per-element cost, plus the call and the new list."""
    return int(size * factor) + 1 + LIST_CREATE


def _self_compare(items: Any) -> int:
    """trackListSelfCompare: O(n²) comparisons, a bit more for strings and bytes."""
    size = actual_size(items)
    factor = 2.0
    if size and isinstance(items, list) and isinstance(items[0], str | bytes):
        factor += STRING_TRAVERSAL
    return _allocating(factor, size * size)


def _range_size(args: Sequence[Any]) -> int:
    n = args[0]
    if type(n) is not int or range_size_error(n) is not None:
        return 1  # an error result sizes as 1
    return max(n, 0)


def _slice_size(args: Sequence[Any]) -> int:
    items, start, end = args
    valid = isinstance(items, list) and type(start) is int and type(end) is int and 0 <= start <= end <= len(items)
    return end - start if valid else 1  # an error result sizes as 1


def _flatten(args: Sequence[Any]) -> int:
    depth = float(args[1]) if len(args) == 2 and type(args[1]) is int else 1.0
    if depth < 0 and active().minor >= 37:  # cel-go 0.29 prices a negative depth (an error) as depth 1
        depth = 1.0
    return int(actual_size(args[0]) * depth) + 1 + LIST_CREATE


def _sets(factor: float) -> CallCost:
    return CallCost(lambda args, _: 1 + int(actual_size(args[0]) * actual_size(args[1]) * factor))


_TRACKERS: Final[dict[str, CallCost]] = {
    # the result's size, known from the arguments: charged before a long list is built
    "lists_range": CallCost(lambda args, _: _allocating(1, _range_size(args))),
    "list_slice": CallCost(lambda args, _: _allocating(1, _slice_size(args))),
    "list_reverse": CallCost(lambda args, _: _allocating(1, len(args[0]) if isinstance(args[0], list) else 1)),
    "list_flatten": CallCost(lambda args, _: _flatten(args)),
    "list_flatten_int": CallCost(lambda args, _: _flatten(args)),
    "list_distinct": CallCost(lambda args, _: _self_compare(args[0])),
    "list_sets_contains_list": _sets(1.0),
    "list_sets_intersects_list": _sets(1.0),
    "list_sets_equivalent_list": _sets(2.0),
}
_SORT: Final = CallCost(lambda args, _: _self_compare(args[0]))
_SORT_BY: Final = CallCost(lambda args, _: _self_compare(args[1]))


# -- 2. Kubernetes' library.CostEstimator.CallCost, by function name -----------------------------------------------
_FIRST_TENTH: Final = CallCost(lambda args, _: tenth(len(args[0]) if type(args[0]) is str else actual_size(args[0])))
_ONE: Final = CallCost(lambda _args, _result: 1)
_TRAVERSAL: Final = CallCost(lambda args, _: _traversal(args[0]))
_NOMINAL: Final = frozenset(
    {
        "masked", "prefixLength", "family", "isUnspecified", "isLoopback", "isLinkLocalMulticast",
        "isLinkLocalUnicast", "isGlobalUnicast", "sign", "asInteger", "isInteger", "asApproximateFloat",
        "isGreaterThan", "isLessThan", "compareTo", "add", "sub", "major", "minor", "patch", "getScheme",
        "getHostname", "getHost", "getPort", "getEscapedPath", "getQuery", "format.named",
    }
)  # fmt: skip
_UNIT_EQUALITY: Final = frozenset({Quantity, Semver, IP, CIDR, URL, NamedFormat})  # Kubernetes' types, compared in O(1)
_LENGTH: Final = frozenset({str, bytes, list, dict, NativeMap, DomainMap})
_SCALAR: Final = frozenset({int, float, bool, UInt, type(None)})


def equality(left: Any, right: Any, unit: bool = True) -> int:
    """`==` (`unit`: 1 for Kubernetes' types) and `!=` (not special-cased: an IPv6 address sizes 16): a tenth of
    the smaller operand. A hot path, written for speed."""
    kind = type(left)
    if kind in _LENGTH:
        size = len(left)
    elif kind in _SCALAR:
        size = 1
    elif unit and kind in _UNIT_EQUALITY:
        return 1
    else:
        size = actual_size(left)
    kind = type(right)
    other = len(right) if kind in _LENGTH else 1 if kind in _SCALAR else actual_size(right)
    return tenth(other if other < size else size)


_EQUALS: Final = CallCost(lambda args, _: equality(args[0], args[1]))
_NOT_EQUALS: Final = CallCost(lambda args, _: equality(args[0], args[1], unit=False))


def _regex(args: Sequence[Any]) -> int:
    """ceil((1 + subject) x 0.1) x ceil(pattern x 0.25): RE2 runs in time linear in both."""
    subject, pattern = args[0], args[1]
    n = len(subject) if type(subject) is str else actual_size(subject)
    m = len(pattern) if type(pattern) is str else actual_size(pattern)
    return tenth(n + 1) * ((m + 3) // 4)  # a quarter of an int is exact in floating point too


def _contains_ip(args: Sequence[Any], overload: str, cidr_extra: int) -> int:
    cidr = actual_size(args[0])
    cost = _factor(cidr + cidr, STRING_TRAVERSAL) + cidr_extra
    if cidr_extra:  # containsCIDR masks the base CIDR too
        cost += _factor(cidr, STRING_TRAVERSAL)
    if overload.endswith("_string"):  # parses the string first
        cost += _factor(actual_size(args[1]), STRING_TRAVERSAL)
    return cost


def _validate(args: Sequence[Any]) -> int:
    """A format's validate(): priced as a regex of the format's size over the string (1 if not a format)."""
    if not isinstance(args[0], NamedFormat):
        return 1
    return _factor(1 + actual_size(args[1]), STRING_TRAVERSAL) * _factor(args[0].max_regex_size, REGEX_LENGTH)


def _kubernetes(function: str, overload: str, minor: int) -> CallCost | None:
    if function in _NOMINAL:
        return _ONE
    if function in ("isSorted", "sum", "max", "min", "indexOf", "lastIndexOf"):
        return _TRAVERSAL
    if function == "includes" and minor >= 37:  # the lists library's since 1.37 (DRA's own costed 1 before)
        return _TRAVERSAL
    if function in ("url", "lowerAscii", "upperAscii", "substring", "trim", "cidr", "isIP", "isCIDR"):
        return _FIRST_TENTH
    if function in ("quantity", "isQuantity", "semver", "isSemver"):
        return _FIRST_TENTH
    if function in ("replace", "split", "ip.isCanonical"):
        return CallCost(lambda args, _: _factor(actual_size(args[0]) * 2, STRING_TRAVERSAL))
    if function == "join":
        return CallCost(lambda _, result: _factor(actual_size(result) * 2, STRING_TRAVERSAL), uses_result=True)
    if function in ("find", "findAll"):
        return CallCost(lambda args, _: _regex(args))
    if function == "validate":
        return CallCost(lambda args, _: _validate(args) if len(args) >= 2 else 1)
    if function == "ip":
        return _ONE if overload == "cidr_ip" else _FIRST_TENTH
    if function == "containsIP":
        return CallCost(lambda args, _: _contains_ip(args, overload, 0))
    if function == "containsCIDR":
        return CallCost(lambda args, _: _contains_ip(args, overload, 1))
    if function == "_==_":  # Kubernetes' own types compare in O(1); anything else falls through to cel-go's table
        return _EQUALS
    return None


# -- 3. cel-go's own table, by overload id -------------------------------------------------------------------------
def _tenth(value: Any) -> int:
    return _factor(actual_size(value), STRING_TRAVERSAL)


def _min_size(args: Sequence[Any]) -> int:
    return _factor(min(actual_size(args[0]), actual_size(args[1])), STRING_TRAVERSAL)


_CEL_GO: Final[dict[str, CallCost]] = {
    **dict.fromkeys(
        ("starts_with_string", "ends_with_string", "string_to_bytes", "bytes_to_string", "strings_quote"),
        _FIRST_TENTH,
    ),
    "string_format": _FIRST_TENTH,
    "in_list": CallCost(lambda args, _: actual_size(args[1])),
    **dict.fromkeys(
        (*(f"{op}_{t}" for op in ("less", "less_equals", "greater", "greater_equals") for t in ("string", "bytes")),),
        CallCost(lambda args, _: _min_size(args)),
    ),
    "equals": CallCost(lambda args, _: equality(args[0], args[1], unit=False)),
    "not_equals": _NOT_EQUALS,
    **dict.fromkeys(
        ("add_string", "add_bytes"),
        CallCost(lambda args, _: _factor(actual_size(args[0]) + actual_size(args[1]), STRING_TRAVERSAL)),
    ),
    "matches_string": CallCost(lambda args, _: _regex(args)),
    "contains_string": CallCost(lambda args, _: _tenth(args[0]) * _tenth(args[1])),
}
# cel-go 0.29 (Kubernetes 1.37) over 0.26: startsWith/endsWith traverse the prefix or suffix, not the string, and
# the global `matches(s, re)` is priced like the member one (1 before).
_CEL_GO_0_29: Final[dict[str, CallCost]] = {
    **_CEL_GO,
    **dict.fromkeys(("starts_with_string", "ends_with_string"), CallCost(lambda args, _: _tenth(args[1]))),
    "matches": CallCost(lambda args, _: _regex(args)),
}


def call_cost(function: str, overload: str, minor: int = 37) -> CallCost | None:
    """The cost of calls to `function` resolved to `overload` ("" when several overloads matched) in Kubernetes
    1.`minor`; None for 1."""
    if overload:
        tracker = _TRACKERS.get(overload)
        if tracker is not None:
            return tracker
        if overload.startswith("list_") and overload.endswith("_sortByAssociatedKeys"):
            return _SORT_BY
        if overload.startswith("list_") and overload.endswith("_sort"):
            return _SORT
    found = _kubernetes(function, overload, minor)
    if found is not None:
        return found
    return (_CEL_GO_0_29 if minor >= 37 else _CEL_GO).get(overload)
