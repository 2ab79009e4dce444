"""CEL runtime values as Python objects, CEL equality, and CEL type names.

int → int, uint → `UInt`, double → float, bool → bool, string → str, bytes → bytes, null → None, list → list,
map → dict, optional → `Optional`, type → `CelType`; Kubernetes' Quantity and Semver are their own classes.
`bool` is a Python `int` subclass, so every check below tests `bool` first.
"""

from __future__ import annotations

from typing import Any, Final

from dra_driver.cel.errors import EvalError, GoPanic
from dra_driver.cel.ext import CIDR, IP, URL, Duration, NamedFormat, Timestamp
from dra_driver.cel.ext import TYPE_NAMES as _EXT_NAMES
from dra_driver.cel.quantity import Quantity
from dra_driver.cel.semver import Semver


class UInt(int):
    """A CEL uint: distinct from int for type(), overloads and equality with negative ints."""

    __slots__ = ()


class CelType:
    """A value of CEL type `type`, e.g. the result of `type(1)`."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CelType) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return self.name


class Optional:
    """cel-go's optional_type: `optional.of(v)` or `optional.none()`."""

    __slots__ = ("has_value", "value")

    def __init__(self, has_value: bool, value: Any = None) -> None:
        self.has_value, self.value = has_value, value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Optional) or other.has_value != self.has_value:
            return False
        return not self.has_value or cel_equal(self.value, other.value)

    __hash__ = None  # type: ignore[assignment]


NONE: Final = Optional(False)


class NativeMap(dict[str, Any]):
    """A map of the device (its attributes or capacities, all of a domain): a Go map with string keys, whose Find
    takes a key of another type as absent (a literal map, keyed by any value, hashes it: see `GoKey`)."""


class DomainMap(NativeMap):
    """`device.attributes` / `device.capacity`: an unknown domain reads as an empty map (compile.go's Find)."""

    def __missing__(self, key: str) -> NativeMap:
        return NativeMap()


class Device:
    """The `device` variable (`kubernetes.DRADevice` object type)."""

    __slots__ = ("allowMultipleAllocations", "attributes", "capacity", "driver")
    FIELDS: Final = ("driver", "attributes", "capacity", "allowMultipleAllocations")

    def __init__(self, driver: str, attributes: DomainMap, capacity: DomainMap, allow_multiple: bool) -> None:
        self.driver = driver
        self.attributes = attributes
        self.capacity = capacity
        self.allowMultipleAllocations = allow_multiple


def type_name(value: Any) -> str:
    """The runtime type name cel-go prints (`ref.Val.Type().TypeName()`)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, UInt):
        return "uint"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes):
        return "bytes"
    if value is None:
        return "null_type"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "map"
    if isinstance(value, Quantity):
        return "kubernetes.Quantity"
    if isinstance(value, Semver):
        return "kubernetes.Semver"
    if isinstance(value, Optional):
        return "optional_type"
    if isinstance(value, CelType):
        return "type"
    if isinstance(value, Device):
        return "kubernetes.DRADevice"
    return _EXT_NAMES.get(type(value)) or type(value).__name__


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# A double beyond these bounds is beyond every int (uint); Go's float64(math.MaxInt64) rounds up to 2^63.
_INT_BOUNDS: Final = (-(2.0**63), 2.0**63)
_UINT_BOUNDS: Final = (0.0, 2.0**64)


def number_compare(left: int | float, right: int | float) -> int:
    """cel-go's ordering of two numbers (NaN aside): an int and a uint compare exactly, but an int or uint and a
    double compare as two doubles once the double is known to be within the integer type's range, so
    9007199254740993 equals 9007199254740992.0."""
    if isinstance(left, float) == isinstance(right, float):
        return int((left > right) - (left < right))
    if isinstance(left, float):
        return -number_compare(right, left)
    low, high = _UINT_BOUNDS if isinstance(left, UInt) else _INT_BOUNDS
    if right < low:
        return 1
    if right > high:
        return -1
    as_double = float(left)
    return int((as_double > right) - (as_double < right))


def number_equal(left: int | float, right: int | float) -> bool:
    """Numeric equality across int, uint and double, as cel-go's Equal: NaN equals nothing."""
    if right != right or left != left:
        return False
    return number_compare(left, right) == 0


def cel_equal(left: Any, right: Any) -> bool:
    """Heterogeneous equality: different types are unequal (not an error); numbers compare across int/uint/double."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if is_number(left) and is_number(right):
        return number_equal(left, right)
    if type(left) is not type(right):
        if isinstance(left, Quantity | Semver):  # their Equal() rejects other types; String's just says false
            raise EvalError("no such overload")
        if isinstance(left, dict) and isinstance(right, dict):
            pass  # DomainMap vs dict
        else:
            return False
    if isinstance(left, list):
        return len(left) == len(right) and all(cel_equal(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, dict):
        if len(left) != len(right):
            return False
        for key, val in left.items():
            other = map_get(right, key_of(key))
            if other is _MISSING or not cel_equal(val, other):
                return False
        return True
    return bool(left == right)


# Kubernetes' own value types, whose Equal() is "no such overload" against any other type.
_STRICT_EQUAL: Final = (Quantity, Semver, IP, CIDR, URL, NamedFormat)
NO_SUCH_OVERLOAD: Final = "no such overload"


def equals(left: Any, right: Any) -> bool | None:
    """cel-go's `types.Equal` (what `==` and `!=` run): null equals only null, else `left.Equal(right)`; `None` is
    the error that Equal returns (Kubernetes' types against another type). `==` fails on it, `!=` is true."""
    if left is None or right is None:
        return left is None and right is None
    return value_equals(left, right)


def value_equals(left: Any, right: Any) -> bool | None:
    """`left.Equal(right)`, by the type of `left`: `None` for an error. A list or map compares its elements with
    `types.Equal` and is unequal only when one pair is false: an error between elements is passed over."""
    if isinstance(left, bool):
        return isinstance(right, bool) and left == right
    if isinstance(left, int | float):
        return is_number(right) and number_equal(left, right)
    if isinstance(left, _STRICT_EQUAL):
        if type(right) is not type(left):
            return None
        return bool(left == right)
    if isinstance(left, list):
        if not isinstance(right, list) or len(left) != len(right):
            return False
        return all(equals(a, b) is not False for a, b in zip(left, right, strict=True))
    if isinstance(left, dict):
        if not isinstance(right, dict) or len(left) != len(right):
            return False
        for key, val in left.items():
            other = map_get(right, key_of(key))
            if other is _MISSING or equals(val, other) is False:
                return False
        return True
    if isinstance(left, Optional):
        if not isinstance(right, Optional):
            return False
        if not left.has_value or not right.has_value:
            return left.has_value == right.has_value
        return value_equals(left.value, right.value)
    return type(left) is type(right) and bool(left == right)


_UNHASHABLE: Final = {bytes: "types.Bytes", Semver: "cel.Semver", NamedFormat: "cel.Format"}


def set_keys(items: list[Any]) -> frozenset[tuple[str, Any]] | None:
    """cel-go's `x in [constant scalars]` set (maybeOptimizeSetMembership): each element, and its lossless
    conversions to the other numeric types (an int's double, even when rounded); `None` when an element is not
    bool, int, uint, double or string (then `in` runs as for any list)."""
    keys: set[tuple[str, Any]] = set()
    for item in items:
        if isinstance(item, bool):
            keys.add(("b", item))
        elif isinstance(item, UInt):
            keys |= {("u", int(item)), ("d", float(item))}
            if item <= 2**63 - 1:
                keys.add(("i", int(item)))
        elif isinstance(item, int):
            keys.add(("i", item))
            keys.add(("d", float(item)))
            if item >= 0:
                keys.add(("u", item))
        elif isinstance(item, float):
            if item == item:
                keys.add(("d", item))
            if item.is_integer() and -(2.0**63) < item < 2.0**63:
                keys.add(("i", int(item)))
            if item.is_integer() and 0 <= item < 2.0**64:
                keys.add(("u", int(item)))
        elif type(item) is str:
            keys.add(("s", item))
        else:
            return None
    return frozenset(keys)


def set_contains(keys: frozenset[tuple[str, Any]], value: Any) -> bool:
    """A Go map lookup of `value` in `set_keys`: found only as one of those kinds; a Go type that cannot be hashed
    panics, which Kubernetes reports as an internal error."""
    if isinstance(value, bool):
        key: tuple[str, Any] = ("b", value)
    elif isinstance(value, UInt):
        key = ("u", int(value))
    elif isinstance(value, int):
        key = ("i", value)
    elif isinstance(value, float):
        if value != value:
            return False
        key = ("d", value)
    elif type(value) is str:
        key = ("s", value)
    else:
        unhashable = _UNHASHABLE.get(type(value))
        if unhashable is not None:
            raise GoPanic(f"hash of unhashable type {unhashable}")
        return False
    return key in keys


_MISSING: Final = object()


class GoKey:
    """A map key other than a string, as cel-go's map literal holds it: a Go map keyed by `ref.Val` interfaces, so
    two keys are one only with the same type and equal values (1, 1u, 1.0 and true are four keys; -0.0 is 0.0,
    NaN never equals itself); a list, map, optional or Quantity is a pointer, equal only to itself; bytes cannot be
    hashed (a Go panic). Strings, the keys of every map a device holds, are stored as they are."""

    __slots__ = ("identity", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        self.identity = _identity(value)

    def __hash__(self) -> int:
        return hash(self.identity)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GoKey) or self.value != self.value:  # NaN
            return False
        return self.identity == other.identity


def _identity(value: Any) -> tuple[Any, ...]:
    if isinstance(value, bool | int | float | str | Duration | Timestamp | CelType) or value is None:
        return (type_name(value), value)
    if isinstance(value, Optional) and not value.has_value:
        return ("optional_type",)  # optional.none() is one value in cel-go
    if isinstance(value, IP | CIDR):
        return (type_name(value), str(value))  # Go structs of netip values
    unhashable = _UNHASHABLE.get(type(value))
    if unhashable is not None:
        raise GoPanic(f"hash of unhashable type {unhashable}")
    return ("pointer", id(value))


def map_key(key: Any) -> Any:
    """How a map stores `key` (see `GoKey`); `key_of` gives it back."""
    return key if type(key) is str else GoKey(key)


def key_of(stored: Any) -> Any:
    return stored.value if type(stored) is GoKey else stored


def map_get(mapping: dict[Any, Any], key: Any) -> Any:
    """cel-go's map Find: the key itself, else a number as the other integer type it converts to losslessly (a
    double as an int, then as a uint; an int as a uint; a uint as an int). `_MISSING` when absent."""
    if type(key) is str:
        return mapping.get(key, _MISSING)  # .get() bypasses DomainMap.__missing__, so `in`/has() stay false
    if isinstance(mapping, NativeMap):
        return _MISSING
    value = mapping.get(GoKey(key), _MISSING)
    if value is not _MISSING or isinstance(key, bool):
        return value
    if isinstance(key, float):
        if key.is_integer() and -(2.0**63) <= key < 2.0**63:
            value = mapping.get(GoKey(int(key)), _MISSING)
        if value is _MISSING and key.is_integer() and 0 <= key < 2.0**64:
            value = mapping.get(GoKey(UInt(int(key))), _MISSING)
    elif isinstance(key, UInt):
        if key <= 2**63 - 1:
            value = mapping.get(GoKey(int(key)), _MISSING)
    elif isinstance(key, int) and key >= 0:
        value = mapping.get(GoKey(UInt(key)), _MISSING)
    return value


def is_missing(value: Any) -> bool:
    return value is _MISSING
