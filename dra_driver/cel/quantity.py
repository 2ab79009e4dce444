"""The `kubernetes.Quantity` CEL type: a Kubernetes quantity (dra_driver.api.quantity) with exact arithmetic and
apimachinery's int64Amount scale, which decides isInteger/asInteger."""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from typing import Final

from dra_driver.api.quantity import QuantityError, int64_scale, parse_quantity
from dra_driver.cel.errors import EvalError

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


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
