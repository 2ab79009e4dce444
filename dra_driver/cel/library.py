"""Function overloads of the Kubernetes DRA CEL environment.

Each overload is `impl(act, *args)` (the receiver first for member functions); it checks runtime types itself and
raises `EvalError` with cel-go's "no matching overload" wording when they do not fit, since `dyn` values (attribute
values are `dyn` in DRA) are only resolved at runtime. `ret` is the static result type used by the checker. The
interpreter charges each call's cost (`callcost`), the overloads do not.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from dra_driver.api.quantity import QuantityError, parse_quantity
from dra_driver.cel.cost import Activation
from dra_driver.cel.errors import EvalError
from dra_driver.cel.ext.timeutil import Duration, Timestamp
from dra_driver.cel.features import active
from dra_driver.cel.goconv import parse_float, parse_int, parse_uint, scalar_text
from dra_driver.cel.quantity import Quantity
from dra_driver.cel.regex import RegexError, compile_go_regex, regex_search
from dra_driver.cel.semver import Semver, parse_semver
from dra_driver.cel.strformat import format_non_finite, format_string, non_finite_double
from dra_driver.cel.types import (
    BOOL,
    BYTES,
    DOUBLE,
    DYN,
    INT,
    LIST_INT,
    LIST_STRING,
    QUANTITY,
    SEMVER,
    STRING,
    TYPE,
    UINT,
    T,
)
from dra_driver.cel.values import (
    NO_SUCH_OVERLOAD,
    NONE,
    CelType,
    Optional,
    UInt,
    cel_equal,
    equals,
    is_missing,
    is_number,
    map_get,
    number_compare,
    type_name,
    value_equals,
)

Impl = Callable[..., Any]
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
UINT64_MAX: Final = 2**64 - 1


@dataclass(frozen=True, slots=True)
class Overload:
    impl: Impl
    ret: T = DYN


# (name, member, number of arguments including the receiver) -> overload
REGISTRY: dict[tuple[str, bool, int], Overload] = {}


def register(name: str, member: bool, nargs: int, ret: T = DYN) -> Callable[[Impl], Impl]:
    def wrap(impl: Impl) -> Impl:
        REGISTRY[(name, member, nargs)] = Overload(impl, ret)
        return impl

    return wrap


def known_names() -> set[str]:
    return {name for name, _, _ in REGISTRY}


def no_overload(name: str, *args: Any) -> EvalError:
    return EvalError(f"no matching overload for '{name}' applied to '({', '.join(type_name(a) for a in args)})'")


def _check_int(value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise EvalError("integer overflow")
    return value


def _check_uint(value: int) -> UInt:
    if not 0 <= value <= UINT64_MAX:
        raise EvalError("unsigned integer overflow")
    return UInt(value)


def _same(kind: type, *values: Any) -> bool:
    return all(type(v) is kind for v in values)


# -- arithmetic ---------------------------------------------------------------------------------------------------
@register("_+_", False, 2)
def _add(act: Activation, a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is tb:
        if ta is int:
            return _check_int(a + b)
        if ta is float:
            return a + b
        if ta is str or ta is bytes or ta is list:
            return a + b
        if ta is UInt:
            return _check_uint(a + b)
    raise no_overload("_+_", a, b)


@register("_-_", False, 2)
def _sub(act: Activation, a: Any, b: Any) -> Any:
    ta = type(a)
    if ta is type(b):
        if ta is int:
            return _check_int(a - b)
        if ta is float:
            return a - b
        if ta is UInt:
            return _check_uint(a - b)
    raise no_overload("_-_", a, b)


@register("_*_", False, 2)
def _mul(act: Activation, a: Any, b: Any) -> Any:
    ta = type(a)
    if ta is type(b):
        if ta is int:
            return _check_int(a * b)
        if ta is float:
            return a * b
        if ta is UInt:
            return _check_uint(a * b)
    raise no_overload("_*_", a, b)


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


@register("_/_", False, 2)
def _div(act: Activation, a: Any, b: Any) -> Any:
    ta = type(a)
    if ta is type(b):
        if ta is float:
            if b == 0:
                return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1, b)
            return a / b
        if ta is int or ta is UInt:
            if b == 0:
                raise EvalError("division by zero")
            q = _trunc_div(a, b)
            return _check_int(q) if ta is int else UInt(q)
    raise no_overload("_/_", a, b)


@register("_%_", False, 2)
def _mod(act: Activation, a: Any, b: Any) -> Any:
    ta = type(a)
    if ta is type(b) and (ta is int or ta is UInt):
        if b == 0:
            raise EvalError("modulus by zero")
        if a == INT64_MIN and b == -1 and ta is int:
            raise EvalError("integer overflow")
        r = a - b * _trunc_div(a, b)  # Go semantics: the sign follows the dividend
        return r if ta is int else UInt(r)
    raise no_overload("_%_", a, b)


@register("-_", False, 1)
def _neg(act: Activation, a: Any) -> Any:
    if type(a) is int:
        return _check_int(-a)
    if type(a) is float:
        return -a
    raise no_overload("-_", a)


# -- comparison ---------------------------------------------------------------------------------------------------
def _ordered(name: str, act: Activation, a: Any, b: Any) -> int:
    ta, tb = type(a), type(b)
    # CrossTypeNumericComparisons: any two numbers order; otherwise two strings, bytes or bools
    comparable = (is_number(a) and is_number(b)) or (ta is tb and ta in (str, bytes, bool))
    if not comparable:
        raise no_overload(name, a, b)
    if (isinstance(a, float) and math.isnan(a)) or (isinstance(b, float) and math.isnan(b)):
        raise EvalError("NaN values cannot be ordered")
    return number_compare(a, b) if ta is not tb else int((a > b) - (a < b))


@register("_<_", False, 2, BOOL)
def _lt(act: Activation, a: Any, b: Any) -> bool:
    return _ordered("_<_", act, a, b) == -1


@register("_<=_", False, 2, BOOL)
def _le(act: Activation, a: Any, b: Any) -> bool:
    return _ordered("_<=_", act, a, b) in (-1, 0)


@register("_>_", False, 2, BOOL)
def _gt(act: Activation, a: Any, b: Any) -> bool:
    return _ordered("_>_", act, a, b) == 1


@register("_>=_", False, 2, BOOL)
def _ge(act: Activation, a: Any, b: Any) -> bool:
    return _ordered("_>=_", act, a, b) in (0, 1)


@register("_==_", False, 2, BOOL)
def _eq(act: Activation, a: Any, b: Any) -> bool:
    if type(a) is str and type(b) is str:
        return a == b
    result = equals(a, b)  # Kubernetes' types' Equal rejects another type
    if result is None:
        raise EvalError(NO_SUCH_OVERLOAD)
    return result


@register("_!=_", False, 2, BOOL)
def _ne(act: Activation, a: Any, b: Any) -> bool:
    if type(a) is str and type(b) is str:
        return a != b
    return equals(a, b) is not True  # cel-go: `types.Equal(l, r) != types.True`, so never an error


@register("@in", False, 2, BOOL)
def _in(act: Activation, a: Any, b: Any) -> bool:
    if isinstance(b, list):  # baseList.Contains: `elem.Equal(item) == True` (no null rule; an error is not a match)
        return any(value_equals(a, item) is True for item in b)
    if isinstance(b, dict):
        return not is_missing(map_get(b, a))
    raise no_overload("@in", a, b)


# -- standard functions -------------------------------------------------------------------------------------------
def _size(act: Activation, a: Any) -> int:
    if isinstance(a, str | bytes | list | dict):
        return len(a)
    raise no_overload("size", a)


register("size", False, 1, INT)(_size)
register("size", True, 1, INT)(_size)


def _strings(name: str, *args: Any) -> None:
    if not all(type(a) is str for a in args):
        raise no_overload(name, *args)


@register("contains", True, 2, BOOL)
def _contains(act: Activation, s: Any, sub: Any) -> bool:
    _strings("contains", s, sub)
    return bool(sub in s)


@register("startsWith", True, 2, BOOL)
def _starts(act: Activation, s: Any, prefix: Any) -> bool:
    _strings("startsWith", s, prefix)
    return bool(s.startswith(prefix))


@register("endsWith", True, 2, BOOL)
def _ends(act: Activation, s: Any, suffix: Any) -> bool:
    _strings("endsWith", s, suffix)
    return bool(s.endswith(suffix))


def compile_regex(pattern: str) -> Any:
    try:
        return compile_go_regex(pattern)
    except RegexError as err:
        raise EvalError(str(err)) from None


def _matches(act: Activation, s: Any, pattern: Any) -> bool:
    _strings("matches", s, pattern)
    return regex_search(compile_regex(pattern), s)


register("matches", True, 2, BOOL)(_matches)
register("matches", False, 2, BOOL)(_matches)


@register("int", False, 1, INT)
def _to_int(act: Activation, a: Any) -> int:
    if isinstance(a, bool):
        raise no_overload("int", a)
    if isinstance(a, int):
        return _check_int(int(a))
    if isinstance(a, float):
        if math.isnan(a) or not -(2.0**63) < a < 2.0**63:
            raise EvalError("integer overflow")
        return int(a)
    if isinstance(a, str):
        return _from_string(parse_int(a), "int")
    raise no_overload("int", a)


@register("uint", False, 1, UINT)
def _to_uint(act: Activation, a: Any) -> UInt:
    if isinstance(a, bool):
        raise no_overload("uint", a)
    if isinstance(a, int):
        return _check_uint(int(a))
    if isinstance(a, float):
        if math.isnan(a) or not 0 <= a < 2.0**64:  # -0.5 too: cel-go refuses any negative double
            raise EvalError("unsigned integer overflow")
        return UInt(int(a))
    if isinstance(a, str):
        return UInt(_from_string(parse_uint(a), "uint"))
    raise no_overload("uint", a)


_N = TypeVar("_N", int, float)


@register("double", False, 1, DOUBLE)
def _to_double(act: Activation, a: Any) -> float:
    if is_number(a):
        return float(a)
    if isinstance(a, str):
        return _from_string(parse_float(a), "double")
    raise no_overload("double", a)


def _from_string(value: _N | None, kind: str) -> _N:
    """A string conversion's result, or cel-go's error where Go's strconv refused the string."""
    if value is None:
        raise EvalError(f"type conversion error from 'string' to '{kind}'")
    return value


@register("string", False, 1, STRING)
def _to_string(act: Activation, a: Any) -> str:
    text = scalar_text(a)
    if text is not None:
        return text
    if isinstance(a, bytes):
        try:
            return a.decode("utf-8")
        except UnicodeDecodeError:
            raise EvalError("invalid UTF-8 in bytes, cannot convert to string") from None
    raise no_overload("string", a)


@register("bytes", False, 1, BYTES)
def _to_bytes(act: Activation, a: Any) -> bytes:
    if isinstance(a, bytes):
        return a
    if isinstance(a, str):
        return a.encode("utf-8")
    raise no_overload("bytes", a)


@register("bool", False, 1, BOOL)
def _to_bool(act: Activation, a: Any) -> bool:
    if isinstance(a, bool):
        return a
    if isinstance(a, str):
        if a in ("1", "t", "T", "true", "TRUE", "True"):
            return True
        if a in ("0", "f", "F", "false", "FALSE", "False"):
            return False
        raise EvalError(f"type conversion error from 'string' to 'bool': {a!r}")
    raise no_overload("bool", a)


@register("type", False, 1, TYPE)
def _type(act: Activation, a: Any) -> CelType:
    return CelType(type_name(a))


@register("dyn", False, 1)
def _dyn(act: Activation, a: Any) -> Any:
    return a


# -- optional types (cel-go OptionalTypes) ------------------------------------------------------------------------
@register("optional.of", False, 1)
def _opt_of(act: Activation, a: Any) -> Optional:
    return Optional(True, a)


@register("optional.none", False, 0)
def _opt_none(act: Activation) -> Optional:
    return NONE


@register("optional.ofNonZeroValue", False, 1)
def _opt_nonzero(act: Activation, a: Any) -> Optional:
    zero = a is None or a is False or (is_number(a) and a == 0) or (isinstance(a, str | bytes | list | dict) and not a)
    return NONE if zero else Optional(True, a)


def _optional(name: str, *args: Any) -> Optional:
    if not isinstance(args[0], Optional):
        raise no_overload(name, *args)
    return args[0]


@register("hasValue", True, 1, BOOL)
def _has_value(act: Activation, o: Any) -> bool:
    return _optional("hasValue", o).has_value


@register("value", True, 1)
def _value(act: Activation, o: Any) -> Any:
    opt = _optional("value", o)
    if not opt.has_value:
        raise EvalError("optional.none() dereference")
    return opt.value


@register("orValue", True, 2)
def _or_value(act: Activation, o: Any, default: Any) -> Any:
    opt = _optional("orValue", o, default)
    return opt.value if opt.has_value else default


@register("or", True, 2)
def _or(act: Activation, o: Any, other: Any) -> Any:
    opt = _optional("or", o, other)
    if not isinstance(other, Optional):
        raise no_overload("or", o, other)
    return opt if opt.has_value else other


def _unwrap(act: Activation, items: Any) -> list[Any]:
    if not isinstance(items, list) or not all(isinstance(x, Optional) for x in items):
        raise no_overload("optional.unwrap", items)
    return [x.value for x in items if x.has_value]


register("optional.unwrap", False, 1)(_unwrap)
register("unwrapOpt", True, 1)(_unwrap)


# -- ext.Strings (version 2) --------------------------------------------------------------------------------------
@register("charAt", True, 2, STRING)
def _char_at(act: Activation, s: Any, i: Any) -> str:
    if type(s) is not str or type(i) is not int:
        raise no_overload("charAt", s, i)
    if not 0 <= i <= len(s):
        raise EvalError(f"index out of range: {i}")
    return s[i : i + 1]


def _index_of(name: str, act: Activation, s: Any, sub: Any, offset: Any, last: bool) -> int:
    if isinstance(s, list):  # k8s lists library: list.indexOf(x) / lastIndexOf(x)
        positions = range(len(s) - 1, -1, -1) if last else range(len(s))
        return next((i for i in positions if value_equals(s[i], sub) is True), -1)  # an error is no match
    if type(s) is not str or type(sub) is not str or (offset is not None and type(offset) is not int):
        raise no_overload(name, s, sub)
    if offset is None:
        return s.rfind(sub) if last else s.find(sub)
    if sub == "":  # ext.Strings returns the offset itself: unchecked before cel-go 0.29, then clamped to the end
        if active().minor < 37:
            return int(offset)
        if offset < 0:
            raise EvalError(f"index out of range: {offset}")
        return min(offset, len(s))
    if offset < 0:
        raise EvalError(f"index out of range: {offset}")
    if offset >= len(s):
        return -1  # past the end is "not found", not an error
    return s.rfind(sub, 0, offset + len(sub)) if last else s.find(sub, offset)


@register("indexOf", True, 2, INT)
def _index_of2(act: Activation, s: Any, sub: Any) -> int:
    return _index_of("indexOf", act, s, sub, None, False)


@register("indexOf", True, 3, INT)
def _index_of3(act: Activation, s: Any, sub: Any, offset: Any) -> int:
    return _index_of("indexOf", act, s, sub, offset, False)


@register("lastIndexOf", True, 2, INT)
def _last_index_of2(act: Activation, s: Any, sub: Any) -> int:
    return _index_of("lastIndexOf", act, s, sub, None, True)


@register("lastIndexOf", True, 3, INT)
def _last_index_of3(act: Activation, s: Any, sub: Any, offset: Any) -> int:
    return _index_of("lastIndexOf", act, s, sub, offset, True)


def _ascii_case(s: str, upper: bool) -> str:
    # Only ASCII letters change, unlike str.lower(), matching cel-go's lowerAscii/upperAscii.
    table = _UPPER if upper else _LOWER
    return s.translate(table)


_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_UPPER: Final = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


@register("lowerAscii", True, 1, STRING)
def _lower(act: Activation, s: Any) -> str:
    _strings("lowerAscii", s)
    return _ascii_case(s, False)


@register("upperAscii", True, 1, STRING)
def _upper(act: Activation, s: Any) -> str:
    _strings("upperAscii", s)
    return _ascii_case(s, True)


def _replace(act: Activation, s: Any, old: Any, new: Any, n: Any = -1) -> str:
    if not (type(s) is str and type(old) is str and type(new) is str and type(n) is int):
        raise no_overload("replace", s, old, new)
    return str(s.replace(old, new, n if n >= 0 else -1))


register("replace", True, 3, STRING)(_replace)
register("replace", True, 4, STRING)(_replace)


def _split(act: Activation, s: Any, sep: Any, n: Any = -1) -> list[str]:
    if not (type(s) is str and type(sep) is str and type(n) is int):
        raise no_overload("split", s, sep)
    if n == 0:
        return []
    if sep == "":  # Go's strings.SplitN with an empty separator splits into code points
        chars = list(s)
        return chars if n < 0 or n >= len(chars) else [*chars[: n - 1], "".join(chars[n - 1 :])]
    return list(s.split(sep, n - 1 if n > 0 else -1))


register("split", True, 2, LIST_STRING)(_split)
register("split", True, 3, LIST_STRING)(_split)


def _substring(act: Activation, s: Any, start: Any, end: Any = None) -> str:
    if type(s) is not str or type(start) is not int or (end is not None and type(end) is not int):
        raise no_overload("substring", s, start)
    stop = len(s) if end is None else end
    if not 0 <= start <= len(s):
        raise EvalError(f"index out of range: {start}")
    if not 0 <= stop <= len(s):
        raise EvalError(f"index out of range: {stop}")
    if start > stop:
        raise EvalError(f"invalid substring range. start: {start}, end: {stop}")
    return s[start:stop]


register("substring", True, 2, STRING)(_substring)
register("substring", True, 3, STRING)(_substring)


@register("trim", True, 1, STRING)
def _trim(act: Activation, s: Any) -> str:
    _strings("trim", s)
    return str(s.strip())


def _join(act: Activation, items: Any, sep: Any = "") -> str:
    if not isinstance(items, list) or type(sep) is not str or not all(type(x) is str for x in items):
        raise no_overload("join", items, sep)
    return str(sep.join(items))


register("join", True, 1, STRING)(_join)
register("join", True, 2, STRING)(_join)


@register("strings.quote", False, 1, STRING)
def _quote(act: Activation, s: Any) -> str:
    _strings("strings.quote", s)
    return '"' + str(s).translate(_QUOTE_ESCAPES) + '"'


# cel-go's quote escapes only these; every other character, printable or not, is written as it is
_QUOTE_ESCAPES: Final = str.maketrans(
    {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
    | {"\\": "\\\\", '"': '\\"'}
)


@register("format", True, 2, STRING)
def _format(act: Activation, fmt: Any, args: Any) -> str:
    """`"%s has %d".format([a, b])`: the verbs %s %d %f %.Nf %e %x %X %o %b %%."""
    if type(fmt) is not str or not isinstance(args, list):
        raise no_overload("format", fmt, args)
    out: list[str] = []
    i, argi = 0, 0
    while i < len(fmt):
        ch = fmt[i]
        if ch != "%":
            out.append(ch)
            i += 1
            continue
        j = i + 1
        precision: int | None = None
        if j < len(fmt) and fmt[j] == ".":
            k = j + 1
            while k < len(fmt) and fmt[k].isdigit():
                k += 1
            precision, j = int(fmt[j + 1 : k] or 0), k
        if j >= len(fmt):
            raise EvalError("unterminated format verb")
        verb = fmt[j]
        i = j + 1
        if verb == "%":
            out.append("%")
            continue
        if argi >= len(args):
            raise EvalError(f"index {argi} out of range")
        out.append(_format_verb(act, verb, args[argi], precision))
        argi += 1
    return "".join(out)


def _format_verb(act: Activation, verb: str, arg: Any, precision: int | None) -> str:
    if verb == "s":
        return format_string(arg)
    if verb == "d" and isinstance(arg, int) and not isinstance(arg, bool):
        return str(int(arg))
    if verb in "fe" and (non_finite := non_finite_double(arg)) is not None:
        return format_non_finite(non_finite, 6 if verb == "e" else 0)
    if verb == "f" and is_number(arg):  # golang.org/x/text's en_US printer: thousands separators
        return f"{float(arg):,.{6 if precision is None else precision}f}"
    if verb == "e" and is_number(arg):
        return _scientific(float(arg))
    if verb == "b" and isinstance(arg, bool):
        return "1" if arg else "0"
    if verb in "xXob" and isinstance(arg, int | str | bytes) and not isinstance(arg, bool):
        if isinstance(arg, int):
            return format(int(arg), verb)
        data = arg.encode() if isinstance(arg, str) else arg
        return data.hex() if verb == "x" else data.hex().upper()
    raise EvalError(f"error during formatting: unrecognized formatting clause or argument for verb %{verb}")


_SUPERSCRIPT: Final = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def _scientific(value: float) -> str:
    """cel-go builds `%6e` (a width, not a precision: always 6 decimals) and prints it through x/text, which
    writes the exponent as a multiplication sign, 10 and superscript digits (1234.5 gives 1.234500, then x10^03)."""
    mantissa, exponent = f"{value:.6e}".split("e")
    exp = int(exponent)
    return f"{mantissa}\u00d710" + f"{'-' if exp < 0 else ''}{abs(exp):02d}".translate(_SUPERSCRIPT)


# -- k8s Regex library --------------------------------------------------------------------------------------------
@register("find", True, 2, STRING)
def _find(act: Activation, s: Any, pattern: Any) -> str:
    _strings("find", s, pattern)
    match = compile_regex(pattern).search(s)
    return str(match.group(0)) if match else ""


def _find_all(act: Activation, s: Any, pattern: Any, n: Any = -1) -> list[str]:
    if type(s) is not str or type(pattern) is not str or type(n) is not int:
        raise no_overload("findAll", s, pattern)
    found = [str(m.group(0)) for m in compile_regex(pattern).finditer(s)]
    return found if n < 0 else found[:n]


register("findAll", True, 2, LIST_STRING)(_find_all)
register("findAll", True, 3, LIST_STRING)(_find_all)


# -- ext.Lists (v3) and the k8s Lists library ---------------------------------------------------------------------
def _list(name: str, *args: Any) -> list[Any]:
    if not isinstance(args[0], list):
        raise no_overload(name, *args)
    return args[0]


@register("slice", True, 3)
def _slice(act: Activation, items: Any, start: Any, end: Any) -> list[Any]:
    seq = _list("slice", items, start, end)
    if type(start) is not int or type(end) is not int:
        raise no_overload("slice", items, start, end)
    if start < 0 or end < 0:
        raise EvalError(f"cannot slice({start}, {end}), negative indexes not supported")
    if start > end:
        raise EvalError(f"cannot slice({start}, {end}), start index must be less than or equal to end index")
    if end > len(seq):
        raise EvalError(f"cannot slice({start}, {end}), list is length {len(seq)}")
    return seq[start:end]


def _flatten(act: Activation, items: Any, depth: Any = 1) -> list[Any]:
    seq = _list("flatten", items)
    if type(depth) is not int:
        raise no_overload("flatten", items, depth)
    if depth < 0:
        raise EvalError("level must be non-negative")
    return _flat(seq, depth)


def _flat(seq: list[Any], depth: int) -> list[Any]:
    out: list[Any] = []
    for item in seq:
        if isinstance(item, list) and depth > 0:
            out.extend(_flat(item, depth - 1))
        else:
            out.append(item)
    return out


register("flatten", True, 1)(_flatten)
register("flatten", True, 2)(_flatten)


@register("lists.range", False, 1, LIST_INT)
def _range(act: Activation, n: Any) -> list[int]:
    if type(n) is not int:
        raise no_overload("lists.range", n)
    refused = range_size_error(n)
    if refused is not None:
        raise EvalError(refused)
    return list(range(n))


MAX_RANGE_SIZE: Final = 1_000_000  # ext.Lists' default maxRangeSize (cel-go 0.29), which Kubernetes keeps


def range_size_error(n: int) -> str | None:
    """cel-go 0.29's check of `lists.range(n)` (Kubernetes 1.37); 0.26 gave an empty list for a negative size."""
    if active().minor < 37:
        return None
    if n < 0:
        return f"lists.range: size must be non-negative, got {n}"
    if n > MAX_RANGE_SIZE:
        return f"lists.range: size {n} exceeds maximum allowed ({MAX_RANGE_SIZE})"
    return None


@register("distinct", True, 1)
def _distinct(act: Activation, items: Any) -> list[Any]:
    seq = _list("distinct", items)
    out: list[Any] = []
    for item in seq:
        if not any(cel_equal(item, seen) for seen in out):
            out.append(item)
    return out


@register("reverse", True, 1)
def _reverse(act: Activation, items: Any) -> list[Any]:
    seq = _list("reverse", items)
    return list(reversed(seq))


_COMPARABLE: Final = (str, bytes, bool, int, float, UInt, Duration, Timestamp)


def check_sort_keys(keys: list[Any]) -> None:
    """cel-go's @sortByAssociatedKeys (sort, sortBy): the first key must be comparable and every key of its
    very type (an int and a double never sort together)."""
    if not keys:
        return
    first = type(keys[0])
    if first not in _COMPARABLE:
        raise EvalError("list elements must be comparable")
    if any(type(k) is not first for k in keys):
        raise EvalError("list elements must have the same type")


def _order(name: str, act: Activation, a: Any, b: Any) -> int:
    """-1, 0 or 1, for the lists library: durations and timestamps order too."""
    if type(a) is type(b) and isinstance(a, Duration | Timestamp):
        return a.compare(b)
    return _ordered(name, act, a, b)


@register("sort", True, 1)
def _sort(act: Activation, items: Any) -> list[Any]:
    seq = _list("sort", items)
    check_sort_keys(seq)
    return sorted(seq)


@register("first", True, 1)
def _first(act: Activation, items: Any) -> Optional:
    seq = _list("first", items)
    return Optional(True, seq[0]) if seq else NONE


@register("last", True, 1)
def _last(act: Activation, items: Any) -> Optional:
    seq = _list("last", items)
    return Optional(True, seq[-1]) if seq else NONE


@register("isSorted", True, 1, BOOL)
def _is_sorted(act: Activation, items: Any) -> bool:
    seq = _list("isSorted", items)
    for i, item in enumerate(seq):  # Kubernetes' isSorted: each element comparable, a failed comparison passed over
        if type(item) not in _COMPARABLE:
            raise no_overload("isSorted", item)
        if i and _order_or_none(act, seq[i - 1], item) == 1:
            return False
    return True


def _order_or_none(act: Activation, a: Any, b: Any) -> int | None:
    try:
        return _order("isSorted", act, a, b)
    except EvalError:
        return None


@register("sum", True, 1)
def _sum(act: Activation, items: Any) -> Any:
    seq = _list("sum", items)
    if not seq:
        return 0
    add = REGISTRY[("_+_", False, 2)].impl  # the dispatcher, with the durations of the ext library
    total = seq[0]
    for item in seq[1:]:
        total = add(act, total, item)
    return total


def _extreme(name: str, act: Activation, items: Any, want: int) -> Any:
    """Kubernetes' cmp: each element comparable, and a failed comparison (a string against an int in a `dyn` list)
    passes over the element rather than failing, as in isSorted."""
    seq = _list(name, items)
    if not seq:
        raise EvalError(f"{name} called on empty list")
    best = seq[0]
    for i, item in enumerate(seq):
        if type(item) not in _COMPARABLE:
            raise no_overload(name, item)
        if i and _order_or_none(act, best, item) == -want:
            best = item
    return best


@register("min", True, 1)
def _min(act: Activation, items: Any) -> Any:
    return _extreme("min", act, items, -1)


@register("max", True, 1)
def _max(act: Activation, items: Any) -> Any:
    return _extreme("max", act, items, 1)


@register("includes", True, 2, BOOL)
def _includes(act: Activation, attr: Any, value: Any) -> bool:
    """1.36+ DRA `includes()`: a scalar attribute equals the value, or a list attribute contains it."""
    if isinstance(attr, list):
        if len(attr) > 48:  # ResourceSliceMaxAttributeValuesPerDevice
            raise EvalError(f"includes: list has {len(attr)} elements, more than the 48 allowed")
        return any(cel_equal(item, value) for item in attr)
    return cel_equal(attr, value)


# -- ext.Sets -----------------------------------------------------------------------------------------------------
def _sets(name: str, act: Activation, a: Any, b: Any) -> tuple[list[Any], list[Any]]:
    if not isinstance(a, list) or not isinstance(b, list):
        raise no_overload(name, a, b)
    return a, b


@register("sets.contains", False, 2, BOOL)
def _sets_contains(act: Activation, a: Any, b: Any) -> bool:
    left, right = _sets("sets.contains", act, a, b)  # baseList.Contains: `x.Equal(y) == True`
    return all(any(value_equals(x, y) is True for y in left) for x in right)


@register("sets.equivalent", False, 2, BOOL)
def _sets_equivalent(act: Activation, a: Any, b: Any) -> bool:
    return bool(_sets_contains(act, a, b) and _sets_contains(act, b, a))


@register("sets.intersects", False, 2, BOOL)
def _sets_intersects(act: Activation, a: Any, b: Any) -> bool:
    left, right = _sets("sets.intersects", act, a, b)
    return any(any(value_equals(x, y) is True for y in right) for x in left)


# -- k8s Semver library -------------------------------------------------------------------------------------------
def _semver(act: Activation, s: Any, normalize: Any = False) -> Semver:
    if type(s) is not str or type(normalize) is not bool:
        raise no_overload("semver", s, normalize)
    return parse_semver(s, normalize)


register("semver", False, 1, SEMVER)(_semver)
register("semver", False, 2, SEMVER)(_semver)


def _is_semver(act: Activation, s: Any, normalize: Any = False) -> bool:
    if type(s) is not str or type(normalize) is not bool:
        raise no_overload("isSemver", s, normalize)
    return Semver.valid(s, normalize)


register("isSemver", False, 1, BOOL)(_is_semver)
register("isSemver", False, 2, BOOL)(_is_semver)


def _semver_part(name: str) -> Impl:
    def part(act: Activation, v: Any) -> int:
        if not isinstance(v, Semver):
            raise no_overload(name, v)
        value = int(getattr(v, name))  # a uint64 that Kubernetes converts to int64: Go wraps it around
        return value - 2**64 if value > INT64_MAX else value

    return part


for _part in ("major", "minor", "patch"):
    register(_part, True, 1, INT)(_semver_part(_part))


def _compare(name: str, a: Any, b: Any) -> int:
    """compareTo for Semver and Quantity; both operands must have the same type."""
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a.compare(b)
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return a.compare(b)
    raise no_overload(name, a, b)


@register("compareTo", True, 2, INT)
def _compare_to(act: Activation, a: Any, b: Any) -> int:
    return _compare("compareTo", a, b)


@register("isGreaterThan", True, 2, BOOL)
def _is_greater(act: Activation, a: Any, b: Any) -> bool:
    return _compare("isGreaterThan", a, b) == 1


@register("isLessThan", True, 2, BOOL)
def _is_less(act: Activation, a: Any, b: Any) -> bool:
    return _compare("isLessThan", a, b) == -1


# -- k8s Quantity library -----------------------------------------------------------------------------------------
@register("quantity", False, 1, QUANTITY)
def _quantity(act: Activation, s: Any) -> Quantity:
    _strings("quantity", s)
    return Quantity.parse(s)


@register("isQuantity", False, 1, BOOL)
def _is_quantity(act: Activation, s: Any) -> bool:
    _strings("isQuantity", s)
    try:
        parse_quantity(s)
    except QuantityError:
        return False
    return True


def _qty(name: str, *args: Any) -> Quantity:
    if not isinstance(args[0], Quantity):
        raise no_overload(name, *args)
    return args[0]


@register("sign", False, 1, INT)  # a global function in Kubernetes' quantity library: `sign(q)`
def _sign(act: Activation, q: Any) -> int:
    return _qty("sign", q).sign()


@register("isInteger", True, 1, BOOL)
def _is_integer(act: Activation, q: Any) -> bool:
    return _qty("isInteger", q).is_integer()


@register("asInteger", True, 1, INT)
def _as_integer(act: Activation, q: Any) -> int:
    return _qty("asInteger", q).as_integer()


@register("asApproximateFloat", True, 1, DOUBLE)
def _as_float(act: Activation, q: Any) -> float:
    return _qty("asApproximateFloat", q).as_float()


def _arith(name: str, q: Any, other: Any) -> tuple[Quantity, Quantity | int]:
    qty = _qty(name, q, other)
    if isinstance(other, Quantity) or (type(other) is int):
        return qty, other
    raise no_overload(name, q, other)


@register("add", True, 2, QUANTITY)
def _qty_add(act: Activation, q: Any, other: Any) -> Quantity:
    qty, rhs = _arith("add", q, other)
    return qty.add(rhs)


@register("sub", True, 2, QUANTITY)
def _qty_sub(act: Activation, q: Any, other: Any) -> Quantity:
    qty, rhs = _arith("sub", q, other)
    return qty.sub(rhs)


# Pure constructors that the compiler may run once when all arguments are constants (only if that succeeds:
# a bad literal stays a runtime error, as in cel-go).
FOLDABLE: Final = frozenset({"quantity", "semver", "isQuantity", "isSemver"})

# Functions whose static result is the receiver's type (a list keeps its element type).
SAME_AS_RECEIVER: Final = frozenset({"slice", "distinct", "reverse", "sort"})
