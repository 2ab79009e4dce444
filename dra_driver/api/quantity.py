"""Kubernetes `resource.Quantity`: exact parsing, and the API server's spelling of an amount.

Values are `fractions.Fraction`s so `1Gi == 1024Mi` and `0.1 + 0.2 == 0.3` hold exactly, as with Go's inf.Dec.
Parsing follows apimachinery's ParseQuantity: decimal SI, binary SI and e-notation suffixes, non-zero values
rounded *up* (away from zero) to 1n, binary-suffixed magnitudes capped at 2^63-1. The CEL type
`kubernetes.Quantity` (dra_driver.cel.quantity) is built on this parser.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Final

_QUANTITY_RE: Final = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)\Z")
_BARE_SUFFIX_RE: Final = re.compile(r"^[+-]?([eEinumkKMGTP]+[-+]?[0-9]*)\Z")
FORMAT_MESSAGE: Final = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
_DECIMAL: Final = {"": 0, "n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_NANO: Final = Fraction(1, 10**9)
_MAX: Final = Fraction(2**63 - 1)
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


def format_quantity(value: Fraction | int) -> str:
    """An amount as the API server spells a BinarySI quantity: a whole number with the largest exact binary
    suffix (1024: "1Ki", 1536: "1536"); a fraction in milli units where exact ("1500m"), else as a float."""
    value = Fraction(value)
    if value.denominator == 1:
        n = value.numerator
        suffix = ""
        for s in _BINARY:
            if n == 0 or n % 1024:
                break
            n //= 1024
            suffix = s
        return f"{n}{suffix}"
    milli = value * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    return str(float(value))


def binary_quantity(n: int) -> str:
    """Bytes as the API server canonicalises a BinarySI quantity (`format_quantity` of a count that cannot be
    negative)."""
    if n < 0:
        raise ValueError(f"negative quantity {n}")
    return format_quantity(n)


def count_quantity(n: int) -> str:
    if n < 0:
        raise ValueError(f"negative quantity {n}")
    return str(n)
