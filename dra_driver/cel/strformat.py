"""The values that cel-go's string.format() (ext strings, its first formatter) prints for `%s`, and the doubles it
prints for `%f` and `%e` that are not finite.

`%s` of a scalar is its string() conversion; inside a list or map every element is written as a CEL literal
(strings quoted as Go's %q, doubles as `%.6f`, durations as `duration("1s")`), map entries sorted by key."""

from __future__ import annotations

import math
from typing import Any, Final

from dra_driver.cel.errors import EvalError
from dra_driver.cel.ext.table import go_quote
from dra_driver.cel.ext.timeutil import Duration, Timestamp
from dra_driver.cel.goconv import format_double, scalar_text
from dra_driver.cel.values import CelType, UInt, key_of, type_name

STRING_CLAUSE: Final = (
    "error during formatting: string clause can only be used on strings, bools, bytes, ints, doubles, maps, "
    "lists, types, durations, and timestamps, was given "
)
# x/text's printer writes an infinity as the sign and ∞; %e asks for a width of 6 (`%6e`), which pads it
_NON_FINITE: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def format_string(arg: Any) -> str:
    """cel-go's FormatString: a list or map as literals, anything else as string() converts it."""
    if isinstance(arg, list):
        return _format_list(arg)
    if isinstance(arg, dict):
        return _format_map(arg)
    if arg is None:
        return "null"
    text = scalar_text(arg)
    if text is not None:
        return text
    if isinstance(arg, bytes):
        return _bytes_text(arg)
    if isinstance(arg, Duration | Timestamp):
        return str(arg)
    if isinstance(arg, CelType):
        return arg.name
    raise EvalError(STRING_CLAUSE + type_name(arg))


def non_finite_double(arg: Any) -> float | None:
    """The double that %f and %e print for `arg` when it is not finite: NaN, ±Inf, or the strings that spell them
    (which those clauses accept in place of a double); `None` for any other argument."""
    if isinstance(arg, str):
        return _NON_FINITE.get(arg)
    if isinstance(arg, float) and not math.isfinite(arg):
        return arg
    return None


def format_non_finite(value: float, width: int) -> str:
    text = "NaN" if math.isnan(value) else "∞" if value > 0 else "-∞"
    return text.rjust(width)


def _bytes_text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        message = go_quote("invalid UTF-8 in bytes, cannot convert to string")
        raise EvalError(f"error during formatting: could not convert argument {message} to string") from None


def _format_list(items: list[Any]) -> str:
    return "[" + ", ".join(_literal(item) for item in items) + "]"


def _format_map(mapping: dict[Any, Any]) -> str:
    entries = sorted((_key_literal(key_of(key)), _literal(value)) for key, value in mapping.items())
    return "{" + ", ".join(f"{key}:{value}" for key, value in entries) + "}"


def _key_literal(key: Any) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, str):
        return go_quote(key)
    if isinstance(key, int):
        return str(int(key))
    raise EvalError(f"no formatting function for map key of type {type_name(key)}")


def _literal(value: Any) -> str:
    """clauseForType then quoteForCEL: an element of a list or a map's value, written as CEL would read it."""
    if isinstance(value, list | dict) or value is None or isinstance(value, bool | CelType):
        return format_string(value)
    if isinstance(value, UInt | int):
        return str(int(value))
    if isinstance(value, str):
        return go_quote(value)
    if isinstance(value, bytes):
        return "b" + go_quote(_bytes_text(value))
    if isinstance(value, float):
        text = f"{value:.6f}" if math.isfinite(value) else format_double(value)
        return text if math.isfinite(value) else go_quote(text)
    if isinstance(value, Duration):
        return f"duration({go_quote(str(value))})"
    if isinstance(value, Timestamp):
        return f"timestamp({go_quote(str(value))})"
    raise EvalError(f"no formatting function for {type_name(value)}")
