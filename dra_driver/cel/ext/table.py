"""What every ext library exports: the overload record the interpreter registers, and the error it raises.

The ext modules know nothing about the interpreter: an overload is plain Python (`str`, `int`, `bool`, the ext
value classes in and out) plus the CEL signature the type checker needs, spelled as cel-go prints types.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final


class ExtError(ValueError):
    """A CEL error value; `message` is Kubernetes' / cel-go's exact text."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class ExtOverload:
    """One CEL overload: `member` calls take the receiver as `params[0]` and as the first argument of `impl`."""

    function: str
    overload_id: str
    member: bool
    params: tuple[str, ...]
    result: str
    impl: Callable[..., object]


# CEL type names of the Python values the ext overloads take; the ext classes add their own (see `TYPE_NAMES`).
_PRIMITIVES: Final[dict[type, str]] = {bool: "bool", int: "int", str: "string"}


def resolve(
    overloads: Iterable[ExtOverload], function: str, member: bool, args: tuple[object, ...], names: dict[type, str]
) -> ExtOverload | None:
    """The overload whose parameter types match the runtime argument types exactly (CEL has no implicit conversion)."""
    kinds = tuple(names.get(type(arg)) or _PRIMITIVES.get(type(arg)) for arg in args)
    for overload in overloads:
        if overload.function == function and overload.member == member and overload.params == kinds:
            return overload
    return None


def go_quote(text: str) -> str:
    """Go's strconv.Quote, used verbatim in netip's and net/url's error messages."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8, kept by "surrogateescape"
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif char.isprintable() and code != 0xAD:
            out.append(char)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


_ESCAPES: Final = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
