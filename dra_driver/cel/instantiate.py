"""What cel-go's planner evaluates when it builds a program (interpreter/decorators.go), so it fails there.

With `OptOptimize` (Kubernetes' setting), a type conversion of a constant is folded and constant regex patterns of
`matches`, `find` and `findAll` are compiled: an error in either is "program instantiation failed", a compile-time
error for the selector, even on a branch that evaluation would never take.
"""

from __future__ import annotations

from typing import Any, Final

from dra_driver.cel import ast
from dra_driver.cel.cost import Activation
from dra_driver.cel.errors import EvalError
from dra_driver.cel.library import REGISTRY
from dra_driver.cel.regex import regex_error

_CONVERSIONS: Final = frozenset(
    {"int", "uint", "double", "string", "bytes", "bool", "dyn", "type", "timestamp", "duration"}
)
_NOT_CONSTANT: Final = object()


def instantiation_error(tree: ast.Node) -> str | None:
    """The first error cel-go's planner would raise (children are planned before their parents)."""
    for node in reversed(ast.walk(tree)):
        if not isinstance(node, ast.Call):
            continue
        message = _regex_constant_error(node) or _conversion_error(node)
        if message is not None:
            return message
    return None


def _regex_constant_error(call: ast.Call) -> str | None:
    if call.function not in ("matches", "find", "findAll"):
        return None
    args = ([call.target] if call.target is not None else []) + list(call.args)
    if len(args) < 2:
        return None
    pattern = args[1]
    if isinstance(pattern, ast.Const) and type(pattern.value) is str:
        return regex_error(pattern.value)
    return None


def _conversion_error(call: ast.Call) -> str | None:
    if call.target is not None or call.function not in _CONVERSIONS or len(call.args) != 1:
        return None
    try:
        _constant(call)
    except EvalError as err:
        return err.message
    return None


def _constant(node: ast.Node) -> Any:
    """The node's value when the planner sees a constant, else `_NOT_CONSTANT`; raises the folding error."""
    if isinstance(node, ast.Const):
        return node.value
    if isinstance(node, ast.ListLit) and not any(node.optional):
        values = [_constant(e) for e in node.elements]
        return _NOT_CONSTANT if any(v is _NOT_CONSTANT for v in values) else values
    if isinstance(node, ast.Call) and node.target is None and node.function in _CONVERSIONS and len(node.args) == 1:
        arg = _constant(node.args[0])
        overload = REGISTRY.get((node.function, False, 1))
        if arg is _NOT_CONSTANT or overload is None:
            return _NOT_CONSTANT
        return overload.impl(Activation({}), arg)
    return _NOT_CONSTANT
