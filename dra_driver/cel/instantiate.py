"""What cel-go's planner evaluates when it builds a program (interpreter/decorators.go), so it fails there.

A name that checks as a type but that the runtime's registry lacks (`google.protobuf.Int64Value`) fails there.
With `OptOptimize` (Kubernetes' setting), a type conversion of a constant is folded and constant regex patterns of
`matches`, `find` and `findAll` are compiled: an error in either is "program instantiation failed", a compile-time
error for the selector, even on a branch that evaluation would never take.
"""

from __future__ import annotations

from typing import Any, Final

from dra_driver.cel import ast
from dra_driver.cel.cost import Activation
from dra_driver.cel.errors import EvalError
from dra_driver.cel.ext import Duration, Timestamp
from dra_driver.cel.library import REGISTRY
from dra_driver.cel.messages import RUNTIME_TYPE_NAMES
from dra_driver.cel.regex import regex_error
from dra_driver.cel.values import CelType, Optional, map_key

_CONVERSIONS: Final = frozenset(
    {"int", "uint", "double", "string", "bytes", "bool", "dyn", "type", "timestamp", "duration"}
)
_NOT_CONSTANT: Final = object()


def instantiation_error(tree: ast.Node, references: dict[int, str | int]) -> str | None:
    """The first error cel-go's planner would raise (children are planned before their parents). `references`
    are the checker's resolved names: a type name the runtime does not know fails (cel-go's planCheckedIdent)."""
    for node in reversed(ast.walk(tree)):
        ref = references.get(id(node))
        if isinstance(node, ast.Ident | ast.Select) and isinstance(ref, str) and ref not in RUNTIME_TYPE_NAMES:
            return f"reference to undefined type: {ref}"
        if isinstance(node, ast.Index):
            message = _qualifier_error(node.index, references)
        elif isinstance(node, ast.Call):
            message = _regex_constant_error(node, references) or _conversion_error(node, references)
        else:
            continue
        if message is not None:
            return message
    return None


# The Go types of constants that cannot index (cel-go's newQualifier takes strings, numbers and bools only).
_QUALIFIER_TYPES: Final = {
    type(None): "types.Null",
    bytes: "types.Bytes",
    list: "*types.baseList",
    dict: "*types.baseMap",
    Duration: "types.Duration",
    Timestamp: "types.Timestamp",
    CelType: "*types.Type",
    Optional: "*types.Optional",
}


def _qualifier_error(index: ast.Node, references: dict[int, str | int]) -> str | None:
    """A constant index becomes a qualifier when cel-go plans the program, which fails for a value of another type
    (`m[null]`, `m[dyn(b"x")]`, `m[int]`)."""
    try:
        value = _constant(index, references)
    except EvalError:
        return None  # the conversion's own error (a child, planned first) is the one reported
    go_type = _QUALIFIER_TYPES.get(type(value))
    return f"invalid qualifier type: {go_type}" if go_type is not None else None


def _regex_constant_error(call: ast.Call, references: dict[int, str | int]) -> str | None:
    """The regex optimizers compile a pattern the planner already holds as a constant: a literal, or a conversion
    of one folded before it (`matches(dyn("["))`, `find(string("("))`)."""
    if call.function not in ("matches", "find", "findAll"):
        return None
    args = ([call.target] if call.target is not None else []) + list(call.args)
    if len(args) < 2:
        return None
    try:
        pattern = _constant(args[1], references)
    except EvalError:
        return None  # the conversion's own error (a child, planned first) is the one reported
    if type(pattern) is str:
        return regex_error(pattern)
    return None


def _conversion_error(call: ast.Call, references: dict[int, str | int]) -> str | None:
    if call.target is not None or call.function not in _CONVERSIONS or len(call.args) != 1:
        return None
    try:
        _constant(call, references)
    except EvalError as err:
        return err.message
    return None


def _constant(node: ast.Node, references: dict[int, str | int]) -> Any:
    """The node's value when the planner sees a constant, else `_NOT_CONSTANT`; raises the folding error. A name
    the checker resolved to a type or an enum value is a constant too (`dyn(int)`)."""
    if isinstance(node, ast.Const):
        return node.value
    ref = references.get(id(node))
    if isinstance(node, ast.Ident | ast.Select) and ref is not None:
        return CelType(ref) if isinstance(ref, str) else ref
    if isinstance(node, ast.ListLit) and not any(node.optional):
        values = [_constant(e, references) for e in node.elements]
        return _NOT_CONSTANT if any(v is _NOT_CONSTANT for v in values) else values
    if isinstance(node, ast.MapLit) and not any(opt for _, _, opt in node.entries):
        entries = [(_constant(k, references), _constant(v, references)) for k, v, _ in node.entries]
        if any(x is _NOT_CONSTANT for entry in entries for x in entry):
            return _NOT_CONSTANT
        return {map_key(k): v for k, v in entries}
    if isinstance(node, ast.Call) and node.target is None and node.function in _CONVERSIONS and len(node.args) == 1:
        arg = _constant(node.args[0], references)
        overload = REGISTRY.get((node.function, False, 1))
        if arg is _NOT_CONSTANT or overload is None:
            return _NOT_CONSTANT
        return overload.impl(Activation({}), arg)
    return _NOT_CONSTANT
