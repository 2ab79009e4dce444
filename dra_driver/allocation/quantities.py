"""Exact quantity arithmetic for counters and capacity (Fractions): quantities parsed once per spelling."""

from __future__ import annotations

import functools
from fractions import Fraction

from dra_driver.api.quantity import parse_quantity


def parse(text: object) -> Fraction:
    """A quantity (string or int) to its exact value; `QuantityError` on bad input."""
    return _parse(str(text))


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> Fraction:  # a fleet spells the same few quantities thousands of times; Fractions are immutable
    return parse_quantity(text)
