"""Go's strconv number parsing, which cel-go's int(), uint() and double() of a string use (each returns `None`
where Go returns an error: bad syntax, or out of range), and its printing of a double, which string() uses."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Final

_INT: Final = re.compile(r"[+-]?[0-9]+\Z")  # ParseInt(s, 10, 64): a sign, ASCII digits, no underscores
_UINT: Final = re.compile(r"[0-9]+\Z")  # ParseUint(s, 10, 64): not even a sign
_SPECIAL: Final = re.compile(r"([+-]?)(inf|infinity)\Z|nan\Z", re.IGNORECASE)
_DECIMAL: Final = re.compile(r"[+-]?(?=\.?[0-9])[0-9_]*(?:\.[0-9_]*)?(?:[eE][+-]?[0-9][0-9_]*)?\Z")
_HEX: Final = re.compile(r"[+-]?0[xX](?=\.?[0-9a-fA-F_])[0-9a-fA-F_]*(?:\.[0-9a-fA-F_]*)?[pP][+-]?[0-9][0-9_]*\Z")


def parse_int(text: str) -> int | None:
    if _INT.match(text) is None:
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


def parse_uint(text: str) -> int | None:
    if _UINT.match(text) is None:
        return None
    value = int(text)
    return value if value < 2**64 else None


def parse_float(text: str) -> float | None:
    """ParseFloat(s, 64): decimal or hexadecimal (with a `p` exponent), `_` between digits, inf/infinity/nan in
    any case; a finite spelling that rounds beyond the largest double is out of range."""
    special = _SPECIAL.match(text)
    if special is not None:
        return math.nan if special.group(2) is None else -math.inf if special.group(1) == "-" else math.inf
    hexadecimal = _HEX.match(text) is not None
    if not (hexadecimal or _DECIMAL.match(text)) or ("_" in text and not _underscores_ok(text)):
        return None
    digits = text.replace("_", "")
    try:
        value = float.fromhex(digits) if hexadecimal else float(digits)
    except (OverflowError, ValueError):
        return None
    return None if math.isinf(value) else value


def _underscores_ok(text: str) -> bool:
    """Go's underscoreOK: every `_` sits between two digits (a base prefix counts as a digit)."""
    body = text[1:] if text[:1] in "+-" else text
    hexadecimal = body[:2].lower() == "0x"
    saw = "0" if hexadecimal else "^"
    for char in body[2:] if hexadecimal else body:
        if char.isascii() and (char.isdigit() or (hexadecimal and char.lower() in "abcdef")):
            saw = "0"
        elif char == "_":
            if saw != "0":
                return False
            saw = "_"
        elif saw == "_":
            return False
        else:
            saw = "!"
    return saw != "_"


def scalar_text(value: object) -> str | None:
    """How cel-go writes a bool, int, uint, double or string as text (its string() conversion, and the formatter's
    `%s` of them); None for any other value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return format_double(value)
    if isinstance(value, str):
        return value
    return None


def format_double(value: float) -> str:
    """Go's `%g` (strconv.FormatFloat(v, 'g', -1, 64)), which cel-go's string(double) uses: the shortest digits
    that round-trip, in exponent form when the decimal exponent is below -4 or at least 6."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return f"{sign}0"
    shortest = Decimal(repr(abs(value))).normalize().as_tuple()  # repr: the shortest round-trip digits
    digits = "".join(map(str, shortest.digits))
    exponent = len(digits) - 1 + int(shortest.exponent)
    if exponent < -4 or exponent >= 6:
        fraction = f".{digits[1:]}" if len(digits) > 1 else ""
        return f"{sign}{digits[0]}{fraction}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    if exponent < 0:
        return f"{sign}0.{'0' * (-exponent - 1)}{digits}"
    whole, fraction = digits[: exponent + 1].ljust(exponent + 1, "0"), digits[exponent + 1 :]
    return f"{sign}{whole}.{fraction}" if fraction else f"{sign}{whole}"
