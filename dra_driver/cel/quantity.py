"""Kubernetes `resource.Quantity` with exact arithmetic (the `kubernetes.Quantity` CEL type).

Values are `fractions.Fraction`s so `1Gi == 1024Mi` and `0.1 + 0.2 == 0.3` hold exactly, as with Go's inf.Dec.
Parsing follows apimachinery's ParseQuantity: decimal SI, binary SI and e-notation suffixes, non-zero values
rounded *up* (away from zero) to 1n, binary-suffixed magnitudes capped at 2^63-1.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache
from typing import Final

from dra_driver.cel.errors import EvalError

_QUANTITY_RE: Final = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)\Z")
_BARE_SUFFIX_RE: Final = re.compile(r"^[+-]?([eEinumkKMGTP]+[-+]?[0-9]*)\Z")
FORMAT_MESSAGE: Final = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
_DECIMAL: Final = {"": 0, "n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_NANO: Final = Fraction(1, 10**9)
_MAX: Final = Fraction(2**63 - 1)
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


class QuantityError(ValueError):
    """Raised by `parse_quantity` with apimachinery's error text."""


def _multiplier(suffix: str) -> Fraction:
    if suffix in _DECIMAL:
        return Fraction(10) ** _DECIMAL[suffix]
    if suffix in _BINARY:
        return Fraction(2 ** _BINARY[suffix])
    exp = re.fullmatch(r"[eE]([-+]?[0-9]+)", suffix)
    if exp is None:
        raise QuantityError("unable to parse quantity's suffix")
    return Fraction(10) ** int(exp.group(1))


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity string, or `QuantityError`."""
    match = _QUANTITY_RE.match(text)
    if match is None:
        bare = _BARE_SUFFIX_RE.match(text)
        if bare is None:
            raise QuantityError(FORMAT_MESSAGE)
        _multiplier(bare.group(1))  # apimachinery reads a bare suffix ("Gi") as zero, if the suffix is valid
        return Fraction(0)
    number, suffix = match.group(1), match.group(2)
    digits = number.lstrip("+-")
    # The regex lets "1.2.3" or "." through; apimachinery rejects them while scanning digits.
    if digits.count(".") > 1 or digits.strip(".") == "":
        raise QuantityError(FORMAT_MESSAGE)
    # A sign inside the suffix is only legal as an exponent sign ("1e-3"), not e.g. "1Ki-3".
    value = Fraction(digits if not digits.endswith(".") else digits[:-1]) * _multiplier(suffix)
    negative = number.startswith("-")
    if value != 0:
        value = math.ceil(value / _NANO) * _NANO  # round up to 1n, like ParseQuantity
    if suffix in _BINARY:
        value = min(value, _MAX)  # apimachinery caps only BinarySI amounts at 2^63-1
    return -value if negative else value


def int64_scale(text: str) -> int | None:
    """The scale of apimachinery's int64Amount representation of a parsed quantity, or None when ParseQuantity
    falls back to inf.Dec (too many digits, large binary suffixes, fractions of binary suffixes...)."""
    match = _QUANTITY_RE.match(text)
    if match is None:
        return 0  # a bare suffix: zero
    number, suffix = match.group(1).lstrip("+-"), match.group(2)
    whole, _, denom = number.partition(".")
    num = whole.lstrip("0")
    if suffix in _BINARY:
        exponent = _BINARY[suffix]
        precision = 15 - len(num) - int(exponent * 3 / 10) - 1 if not denom else -1
        scale, mantissa = 0, 2**exponent
    else:
        exp = re.fullmatch(r"[eE]([-+]?[0-9]+)", suffix)
        scale = int(exp.group(1)) if exp else _DECIMAL.get(suffix, 0)
        precision, mantissa = 18 - len(num) - len(denom), 1
    if precision < 0:
        return None
    scale -= len(denom)
    if scale < -9 or abs(int((num + denom) or "0") * mantissa) > _INT64_MAX:
        return None
    return scale


class Quantity:
    """An immutable quantity; `text` keeps the source spelling for messages. `scale` mirrors apimachinery's
    representation (int64Amount scale, None for inf.Dec), which decides AsInt64 and so isInteger/asInteger."""

    __slots__ = ("scale", "text", "value")

    def __init__(self, value: Fraction, text: str | None = None, scale: int | None = 0) -> None:
        self.value = value
        self.text = text if text is not None else _format(value)
        self.scale = scale

    @staticmethod
    def parse(text: str) -> Quantity:
        try:
            return _parse_cached(text)
        except QuantityError as err:
            raise EvalError(str(err)) from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"quantity({self.text!r})"

    def compare(self, other: Quantity) -> int:
        return (self.value > other.value) - (self.value < other.value)

    def sign(self) -> int:
        return (self.value > 0) - (self.value < 0)

    def is_integer(self) -> bool:
        """apimachinery AsInt64: only an int64Amount with a non-negative scale (so "1000m" is not), in range."""
        if self.scale is None or self.scale < 0:
            return False
        return self.value.denominator == 1 and _INT64_MIN <= self.value.numerator <= _INT64_MAX

    def as_integer(self) -> int:
        if not self.is_integer():
            raise EvalError("cannot convert value to integer")
        return self.value.numerator

    def as_float(self) -> float:
        return float(self.value)

    def add(self, other: Quantity | int) -> Quantity:
        value = self.value + (other.value if isinstance(other, Quantity) else other)
        return Quantity(value, scale=self._sum_scale(other, value))

    def sub(self, other: Quantity | int) -> Quantity:
        value = self.value - (other.value if isinstance(other, Quantity) else other)
        return Quantity(value, scale=self._sum_scale(other, value))

    def _sum_scale(self, other: Quantity | int, value: Fraction) -> int | None:
        """int64Amount.Add aligns to the smaller scale and stays int64 unless it overflows (then inf.Dec)."""
        other_scale = other.scale if isinstance(other, Quantity) else 0
        if self.scale is None or other_scale is None:
            return None
        scale = min(self.scale, other_scale)
        return scale if abs(value * Fraction(10) ** -scale) <= _INT64_MAX else None


@lru_cache(maxsize=4096)
def _parse_cached(text: str) -> Quantity:
    """Quantities are immutable, so one object per spelling can be shared (exceptions are not cached)."""
    return Quantity(parse_quantity(text), text, int64_scale(text))


def _format(value: Fraction) -> str:
    """A readable spelling for computed values (messages only; not apimachinery's canonical form)."""
    if value.denominator == 1:
        return str(value.numerator)
    for suffix, exp in (("m", 3), ("u", 6), ("n", 9)):
        scaled = value * 10**exp
        if scaled.denominator == 1:
            return f"{scaled.numerator}{suffix}"
    return str(float(value))
