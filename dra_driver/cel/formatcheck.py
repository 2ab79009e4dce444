"""ext.Strings' compile-time check of `"literal".format([literal list])` (cel-go ext/formatting.go's validator).

Each clause's argument must have a static type the clause accepts (`dyn` always passes; `any`, e.g. an attribute
value, does not), and the list may not hold more arguments than the clauses use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from dra_driver.cel import ast
from dra_driver.cel.errors import CelCompileError
from dra_driver.cel.typesys import type_name

if TYPE_CHECKING:
    from dra_driver.cel.checker import Checker

_STRINGABLE: Final = frozenset(
    {"list", "map", "int", "uint", "double", "bool", "string", "google.protobuf.Timestamp", "bytes"}
    | {"google.protobuf.Duration", "type", "null_type"}
)
_ACCEPTS: Final = {
    "d": (frozenset({"int", "uint"}), "decimal clause can only be used on integers"),
    "f": (frozenset({"double", "string"}), "fixed-point clause can only be used on doubles"),
    "e": (frozenset({"double", "string"}), "scientific clause can only be used on doubles"),
    "b": (frozenset({"int", "uint", "bool"}), "only integers and bools can be formatted as binary"),
    "x": (
        frozenset({"int", "uint", "string", "bytes"}),
        "only integers, byte buffers, and strings can be formatted as hex",
    ),
    "X": (
        frozenset({"int", "uint", "string", "bytes"}),
        "only integers, byte buffers, and strings can be formatted as hex",
    ),
    "o": (frozenset({"int", "uint"}), "octal clause can only be used on integers"),
}
_STRING_CLAUSE: Final = (
    "string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, types, durations, "
    "and timestamps"
)


def validate_format_calls(checker: Checker, nodes: list[ast.Node]) -> None:
    for node in nodes:
        if (
            isinstance(node, ast.Call)
            and node.function == "format"
            and isinstance(node.target, ast.Const)
            and type(node.target.value) is str
            and len(node.args) == 1
            and isinstance(node.args[0], ast.ListLit)
        ):
            _check_call(checker, node, node.target.value, node.args[0].elements)


def _check_call(checker: Checker, call: ast.Call, fmt: str, args: tuple[ast.Node, ...]) -> None:
    i, used = 0, 0
    while i < len(fmt):
        if fmt[i] != "%":
            i += 1
            continue
        if i + 1 < len(fmt) and fmt[i + 1] == "%":
            i += 2
            continue
        if i + 1 >= len(fmt):
            raise checker.fail(call, "unexpected end of string")
        if used >= len(args):
            raise checker.fail(call, f"index {used} out of range")
        j = i + 1
        if fmt[j] == ".":
            j += 1
            while j < len(fmt) and fmt[j].isascii() and fmt[j].isdigit():
                j += 1
            if j >= len(fmt):
                raise checker.fail(call, "could not parse formatting clause: error while parsing precision: "
                                   "could not find end of precision specifier")  # fmt: skip
        verb = fmt[j]
        if verb != "s" and verb not in _ACCEPTS:
            raise checker.fail(call, f'could not parse formatting clause: unrecognized formatting clause "{verb}"')
        _check_arg(checker, verb, args[used])
        used += 1
        i = j + 1
    if len(args) > used:
        raise checker.fail(call, f"too many arguments supplied to string.format (expected {used}, got {len(args)})")


def _check_arg(checker: Checker, verb: str, arg: ast.Node) -> None:
    if verb == "s":
        bad = _bad_string_arg(checker, arg)
        if bad is not None:
            raise _error(checker, bad, f"{_STRING_CLAUSE}, was given {type_name(checker.final(bad))}")
        return
    accepted, message = _ACCEPTS[verb]
    t = checker.final(arg)
    if t.kind != "dyn" and t.kind not in accepted:
        raise _error(checker, arg, f"{message}, was given {type_name(t)}")


def _bad_string_arg(checker: Checker, arg: ast.Node) -> ast.Node | None:
    t = checker.final(arg)
    if t.kind != "dyn" and t.kind not in _STRINGABLE:
        return arg
    children: list[ast.Node] = []
    if isinstance(arg, ast.ListLit):
        children = list(arg.elements)
    elif isinstance(arg, ast.MapLit):
        children = [x for k, v, _ in arg.entries for x in (k, v)]
    for child in children:
        bad = _bad_string_arg(checker, child)
        if bad is not None:
            return bad
    return None


def _error(checker: Checker, node: ast.Node, message: str) -> CelCompileError:
    return checker.fail(node, f"error during formatting: {message}")
