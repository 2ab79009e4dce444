"""Exact quantity arithmetic for counters and capacity (Fractions), and a canonical-ish spelling for results."""

from __future__ import annotations

import functools
from fractions import Fraction

from dra_driver.cel.quantity import QuantityError, parse_quantity

__all__ = ["QuantityError", "format_quantity", "parse"]

_BINARY = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def parse(text: object) -> Fraction:
    """A quantity (string or int) to its exact value; `QuantityError` on bad input."""
    return _parse(str(text))


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> Fraction:  # a fleet spells the same few quantities thousands of times; Fractions are immutable
    return parse_quantity(text)


def format_quantity(value: Fraction) -> str:
    """How the API server would print a computed amount: BinarySI for whole multiples of 1024, else plain/milli."""
    if value.denominator == 1:
        n = value.numerator
        if n == 0:
            return "0"
        suffix = ""
        for s in _BINARY:
            if n % 1024:
                break
            n //= 1024
            suffix = s
        return f"{n}{suffix}" if suffix else str(value.numerator)
    milli = value * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    return str(float(value))
