"""A static type checker with cel-go's rules (checker/checker.go) for the DRA environment.

`check(tree, source, env)` returns the expression's output type or raises `CelCompileError` with cel-go's message
at cel-go's position. Macros are typed as their cel-go expansions would be (e.g. `exists_one`'s predicate goes
through `_?_:_`, so a non-bool predicate reports that overload). After checking, the AST validators Kubernetes
enables run: homogeneous aggregate literals, constant regex patterns and `format` strings with literal arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from dra_driver.cel import ast
from dra_driver.cel.cost import Activation
from dra_driver.cel.decls import Decl, declarations
from dra_driver.cel.errors import CelCompileError, EvalError
from dra_driver.cel.formatcheck import validate_format_calls
from dra_driver.cel.library import REGISTRY
from dra_driver.cel.messages import ENUM_VALUES, MESSAGES
from dra_driver.cel.parser import format_error
from dra_driver.cel.regex import regex_error
from dra_driver.cel.types import BOOL, BYTES, DOUBLE, DYN, INT, NULL, QUANTITY, STRING, UINT, T, list_of, map_of
from dra_driver.cel.typesys import (
    ANY,
    Mapping,
    assignable,
    assignable_list,
    is_dyn,
    is_dyn_or_error,
    is_optional,
    kind,
    most_general,
    substitute,
    type_name,
)
from dra_driver.cel.values import UInt

_CONST: Final = {bool: BOOL, int: INT, UInt: UINT, float: DOUBLE, str: STRING, bytes: BYTES, type(None): NULL}
_TYPE_IDENTS: Final = {
    n: T("type", (t,))
    for n, t in {
        "int": INT,
        "uint": UINT,
        "double": DOUBLE,
        "bool": BOOL,
        "string": STRING,
        "bytes": BYTES,
        "null_type": NULL,
        "list": list_of(DYN),
        "map": map_of(DYN, DYN),
        "type": T("type"),
        "optional_type": T("optional_type"),  # the optional library's type (cel-go's Types(types.OptionalType))
    }.items()
}


@dataclass(frozen=True, slots=True)
class CheckEnv:
    """The declarations one compile sees: variables, struct fields, functions (per feature gates)."""

    variables: dict[str, T]
    fields: dict[str, dict[str, T]]  # struct type name → field → type
    functions: dict[str, tuple[Decl, ...]]
    minor: int = 37  # the Kubernetes release (its cel-go): some costs and declarations differ


def dra_env(
    list_attributes: bool = False,
    extra: tuple[Decl, ...] = (),
    *,
    new_expressions: bool = False,
    consumable_capacity: bool = True,
    minor: int = 37,
) -> CheckEnv:
    """compile.go's environment: attribute values are `any`, or `dyn` with list-type attributes enabled. Other
    gates do not matter to the StoredExpressions environment (the scheduler's), which declares every gated variable
    and function; the NewExpressions one (the API server's check of a new selector) declares `includes` only with
    DRAListTypeAttributes and `device.allowMultipleAllocations` only with DRAConsumableCapacity. cel-go 0.29
    (Kubernetes 1.37, `minor`) no longer declares `duration(int)`."""
    attr = DYN if list_attributes else ANY
    fields = {
        "driver": STRING,
        "attributes": map_of(STRING, map_of(STRING, attr)),
        "capacity": map_of(STRING, map_of(STRING, QUANTITY)),
        "allowMultipleAllocations": BOOL,
    }
    functions = declarations(extra)
    if new_expressions:
        if not consumable_capacity:
            del fields["allowMultipleAllocations"]
        if not list_attributes:
            functions = {name: decls for name, decls in functions.items() if name != "includes"}
    if minor >= 37:
        durations = tuple(d for d in functions["duration"] if d.overload_id != "int64_to_duration")
        functions = {**functions, "duration": durations}
    device = T("kubernetes.DRADevice")
    return CheckEnv({"device": device}, {device.kind: fields}, functions, minor)


class Checker:
    def __init__(self, source: str, env: CheckEnv) -> None:
        self.source = source
        self.env = env
        self.mapping: Mapping = {}
        self.types: dict[int, T] = {}
        self.counter = 0
        self.format_args: set[int] = set()  # ids of literals inside `format` calls (exempt from homogeneity)
        # Call/Index node id → the function name resolved (qualified names folded in) and its matching overloads,
        # cel-go's reference map; a sortBy comprehension's entry is its `@sortByAssociatedKeys` call.
        self.resolved: dict[int, tuple[str, tuple[Decl, ...]]] = {}
        # Ident/Select node id → what the name resolved to when not a variable: a type name (str), or an enum
        # value (int); cel-go's reference map, which its planner turns into constants.
        self.references: dict[int, str | int] = {}
        self._matched: tuple[Decl, ...] = ()

    def fail(self, node: ast.Node | int, message: str) -> CelCompileError:
        pos = node if isinstance(node, int) else node.pos
        return CelCompileError(format_error(self.source, pos, message))

    def fresh(self) -> T:
        self.counter += 1
        return T(f"?_var{self.counter}")

    def final(self, node: ast.Node) -> T:
        return substitute(self.mapping, self.types[id(node)], True)

    def is_assignable(self, t1: T, t2: T) -> bool:
        m = assignable(self.mapping, t1, t2)
        if m is None:
            return False
        self.mapping = m
        return True

    def check(self, node: ast.Node, scope: dict[str, T]) -> T:
        t: T = getattr(self, f"_{type(node).__name__.lower()}")(node, scope)
        self.types[id(node)] = t
        return t

    # -- leaves and selection ------------------------------------------------------------------------------------
    def _const(self, node: ast.Const, scope: dict[str, T]) -> T:
        return _CONST[type(node.value)]

    def _ident(self, node: ast.Ident, scope: dict[str, T]) -> T:
        found = self.lookup(node, node.name, scope)
        if found is None:
            raise self.fail(node, f"undeclared reference to '{node.name}' (in container '')")
        return found

    def lookup(self, node: ast.Node, name: str, scope: dict[str, T]) -> T | None:
        """cel-go's Env.LookupIdent: a variable, else a type name (the registry's, or a message type), else an
        enum value; a name that is not a variable is recorded in `references`."""
        name = name.removeprefix(".")  # a leading dot only roots the name
        if name in scope:
            return scope[name]
        if name in _TYPE_IDENTS:
            self.references[id(node)] = name
            return _TYPE_IDENTS[name]
        if name in MESSAGES:
            self.references[id(node)] = name
            return T("type", (MESSAGES[name].type,))
        if name in ENUM_VALUES:
            self.references[id(node)] = ENUM_VALUES[name]
            return INT
        return None

    def _select_field(self, node: ast.Node, operand: ast.Node, field: str, optional: bool, scope: dict[str, T]) -> T:
        otype = substitute(self.mapping, self.check(operand, scope), False)
        target, was_opt = (otype.param(0), True) if is_optional(otype) else (otype, False)
        k = kind(target)
        if k == "map":
            result = target.param(1)
        elif k == "struct":
            fields = self.env.fields.get(target.kind, {})
            if field not in fields:
                raise self.fail(node, f"undefined field '{field}'")
            result = fields[field]
        elif k == "param":
            self.is_assignable(DYN, target)
            result = DYN
        else:
            if not is_dyn_or_error(target):
                raise self.fail(node, f"type '{target}' does not support field selection")
            result = DYN
        return T("optional_type", (result,)) if was_opt or optional else result

    def _select(self, node: ast.Select, scope: dict[str, T]) -> T:
        qualified = _qualified_name(node)  # cel-go first tries `a.b.c` as one name (no variable has a dot)
        if qualified is not None:
            found = self.lookup(node, qualified, {})
            if found is not None:
                return found
        return substitute(self.mapping, self._select_field(node, node.operand, node.field, node.optional, scope), False)

    def _has(self, node: ast.Has, scope: dict[str, T]) -> T:
        self._select_field(node.select, node.select.operand, node.select.field, False, scope)
        return BOOL

    def _index(self, node: ast.Index, scope: dict[str, T]) -> T:
        args = [self.check(node.operand, scope), self.check(node.index, scope)]
        name = "_[?_]" if node.optional else "_[_]"
        result = self.resolve(node, name, args, False)
        self.resolved[id(node)] = (name, self._matched)
        return result

    # -- calls ---------------------------------------------------------------------------------------------------
    def _call(self, node: ast.Call, scope: dict[str, T]) -> T:
        name, target = node.function, node.target
        if name in ("_&&_", "_||_"):
            for arg in node.args:
                t = self.check(arg, scope)
                if not self.is_assignable(t, BOOL):
                    raise self.fail(arg, f"expected type 'bool' but found '{substitute(self.mapping, t, True)}'")
            return BOOL
        if target is not None:
            qualified = _qualified_name(target)
            if qualified is not None and f"{qualified}.{name}" in self.env.functions:
                name, target = f"{qualified}.{name}", None
        args = [self.check(arg, scope) for arg in node.args]
        if target is not None:
            args.insert(0, self.check(target, scope))
        if name == "format" and target is not None:
            self.format_args.update(_literal_ids(node.args))
        result = self.resolve(node, name, args, target is not None)
        self.resolved[id(node)] = (name, self._matched)
        return result

    def resolve(self, node: ast.Node, name: str, args: list[T], member: bool) -> T:
        overloads = self.env.functions.get(name)
        if overloads is None:
            raise self.fail(node, f"undeclared reference to '{name}' (in container '')")
        result: T | None = None
        matched: list[Decl] = []
        for decl in overloads:
            if decl.member != member or len(decl.params) != len(args):
                continue
            params, ret = list(decl.params), decl.result
            if decl.type_params:
                subs = {p: self.fresh() for p in decl.type_params}
                params = [substitute(subs, p, False) for p in params]
                ret = substitute(subs, ret, False)
            m = assignable_list(self.mapping, args, params)
            if m is None:
                continue
            self.mapping = m
            matched.append(decl)
            rtype = substitute(m, ret, False)
            if result is None:
                result = rtype
            elif not is_dyn(result) and rtype != result:
                result = DYN
        if result is None:
            shown = [str(substitute(self.mapping, a, True)) for a in args]
            sig = f"{shown[0]}.({', '.join(shown[1:])})" if member else f"({', '.join(shown)})"
            raise self.fail(node, f"found no matching overload for '{name}' applied to '{sig}'")
        self._matched = tuple(matched)
        return result

    # -- literals ------------------------------------------------------------------------------------------------
    def _join(self, node: ast.Node, previous: T | None, current: T) -> T:
        if previous is None:
            return current
        m = assignable(self.mapping, previous, current)
        if m is not None:
            self.mapping = m
            return most_general(previous, current)
        return DYN  # cel-go's default aggregate literal element type; homogeneity is the validator's job

    def _unwrap_opt(self, node: ast.Node, t: T) -> T:
        if is_optional(t):
            return t.param(0)
        if not is_dyn(t):
            raise self.fail(node, f"expected type 'optional_type({t})' but found '{t}'")
        return t

    def _listlit(self, node: ast.ListLit, scope: dict[str, T]) -> T:
        elem: T | None = None
        for e, opt in zip(node.elements, node.optional, strict=True):
            t = self.check(e, scope)
            elem = self._join(e, elem, self._unwrap_opt(e, t) if opt else t)
        return list_of(elem if elem is not None else self.fresh())

    def _maplit(self, node: ast.MapLit, scope: dict[str, T]) -> T:
        key_t: T | None = None
        val_t: T | None = None
        for k, v, opt in node.entries:
            key_t = self._join(k, key_t, self.check(k, scope))
            vt = self.check(v, scope)
            val_t = self._join(v, val_t, self._unwrap_opt(v, vt) if opt else vt)
        if key_t is None or val_t is None:
            return map_of(self.fresh(), self.fresh())
        return map_of(key_t, val_t)

    def _struct(self, node: ast.Struct, scope: dict[str, T]) -> T:
        """cel-go's checkCreateStruct: the name must be a message type; each field must exist and take its value."""
        ident = self.lookup(node, node.type_name, scope)
        if ident is None:
            raise self.fail(node, f"undeclared reference to '{node.type_name}' (in container '')")
        if ident.kind != "type":
            raise self.fail(node, f"'{ident}' is not a type")
        name = self.references.get(id(node))
        if not isinstance(name, str) or name not in MESSAGES:
            raise self.fail(node, f"'{ident.param(0)}' is not a message type")
        fields = self.env.fields.get(name) or MESSAGES[name].fields
        for f in node.fields:
            value = self.check(f.value, scope)
            if f.name not in fields:
                raise self.fail(f, f"undefined field '{f.name}'")
            if f.optional:
                value = self._unwrap_opt(f.value, value)
            if not self.is_assignable(fields[f.name], value):
                shown = substitute(self.mapping, value, True)
                raise self.fail(
                    f, f"expected type of field '{f.name}' is '{fields[f.name]}' but provided type is '{shown}'"
                )
        return MESSAGES[name].type

    # -- macros --------------------------------------------------------------------------------------------------
    def _bind(self, node: ast.Bind, scope: dict[str, T]) -> T:
        init = self.check(node.init, scope)
        return self.check(node.body, {**scope, node.var: init})

    def _comprehension(self, node: ast.Comprehension, scope: dict[str, T]) -> T:
        rtype = substitute(self.mapping, self.check(node.target, scope), False)
        macro = node.macro
        if macro in ("optMap", "optFlatMap"):  # `t.hasValue() ? optional.of(body) : optional.none()`
            if not is_optional(rtype) and not is_dyn_or_error(rtype) and kind(rtype) != "param":
                raise self.fail(node, f"found no matching overload for 'hasValue' applied to '{rtype}.()'")
            inner = rtype.param(0) if is_optional(rtype) else DYN
            body = self.check(node.body, {**scope, node.var: inner})
            if macro == "optMap":
                return T("optional_type", (body,))
            # optFlatMap's body is the optional itself: `t.hasValue() ? body : optional.none()`
            return self.resolve(node, "_?_:_", [BOOL, body, T("optional_type", (self.fresh(),))], False)
        two = node.var2 is not None
        k = kind(rtype)
        if k == "list":
            vtypes = (INT, rtype.param(0)) if two else (rtype.param(0), DYN)
        elif k == "map":
            vtypes = (rtype.param(0), rtype.param(1))
        elif k in ("dyn", "error", "param"):
            self.is_assignable(DYN, rtype)
            vtypes = (DYN, DYN)
        else:
            raise self.fail(
                node.target,
                f"expression of type '{rtype}' cannot be range of a comprehension (must be list, map, or dynamic)",
            )
        inner_scope = {**scope, node.var: vtypes[0]}
        if node.var2 is not None:
            inner_scope[node.var2] = vtypes[1]
        body = substitute(self.mapping, self.check(node.body, inner_scope), False)
        transform = self.check(node.transform, inner_scope) if node.transform is not None else None
        if macro in ("all", "exists"):
            if not self.is_assignable(body, BOOL):
                raise self.fail(node.body, f"expected type 'bool' but found '{_show(self, body)}'")
            return BOOL
        if macro == "exists_one":
            self.resolve(node.body, "_?_:_", [body, INT, INT], False)
            return BOOL
        if macro == "sortBy":
            elem = vtypes[0] if not two else vtypes[1]
            result = self.resolve(node, "@sortByAssociatedKeys", [list_of(elem), list_of(body)], True)
            self.resolved[id(node)] = ("@sortByAssociatedKeys", self._matched)
            return result
        if macro == "map" and transform is None:
            return list_of(body)
        if macro == "filter":
            out = list_of(vtypes[0])
            self.resolve(node.body, "_?_:_", [body, out, out], False)
            return out
        assert transform is not None
        if macro == "transformMapEntry":  # each entry is merged in with cel.@mapInsert(map(K, V), map(K, V))
            out = transform if kind(transform) == "map" else map_of(DYN, DYN)
            if kind(transform) not in ("map", "dyn", "param", "error"):
                raise self.fail(
                    node, f"found no matching overload for 'cel.@mapInsert' applied to '({out}, {transform})'"
                )
        else:
            out = map_of(vtypes[0], transform) if macro == "transformMap" else list_of(transform)
        self.resolve(node.body, "_?_:_", [body, out, out], False)
        return out


def _show(checker: Checker, t: T) -> str:
    return str(substitute(checker.mapping, t, True))


def _qualified_name(node: ast.Node) -> str | None:
    if isinstance(node, ast.Ident):
        return node.name
    if isinstance(node, ast.Select) and not node.optional:
        prefix = _qualified_name(node.operand)
        return f"{prefix}.{node.field}" if prefix is not None else None
    return None


def _literal_ids(nodes: tuple[ast.Node, ...]) -> set[int]:
    found: set[int] = set()
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if isinstance(n, ast.ListLit | ast.MapLit):
            found.add(id(n))
        stack.extend(ast.children(n))
    return found


def check(tree: ast.Node, source: str, env: CheckEnv) -> tuple[T, Checker]:
    """The output type (type parameters resolved to dyn); raises `CelCompileError` like cel-go's `env.Check`."""
    checker = Checker(source, env)
    checker.check(tree, dict(env.variables))
    nodes = ast.walk(tree)
    _validate_homogeneous(checker, nodes)
    validate_format_calls(checker, nodes)
    validate_literal_arguments(checker, nodes)
    return substitute(checker.mapping, checker.types[id(tree)], True), checker


def _validate_homogeneous(checker: Checker, nodes: list[ast.Node]) -> None:
    """cel.ValidateHomogeneousAggregateLiterals, with `format` arguments exempt (as ext.Strings configures)."""
    for n in nodes:
        if id(n) in checker.format_args:
            continue
        if isinstance(n, ast.ListLit):
            _same_types(checker, [(e, opt) for e, opt in zip(n.elements, n.optional, strict=True)])
        elif isinstance(n, ast.MapLit):
            _same_types(checker, [(k, False) for k, _, _ in n.entries])
            _same_types(checker, [(v, opt) for _, v, opt in n.entries])


def _same_types(checker: Checker, items: list[tuple[ast.Node, bool]]) -> None:
    first: T | None = None
    for node, opt in items:
        t = checker.final(node)
        if opt and is_optional(t):
            t = t.param(0)
        if first is None:
            first = t
        elif t != first:
            raise checker.fail(node, f"expected type '{first}' but found '{t}'")


__all__ = ["CheckEnv", "Checker", "check", "dra_env", "type_name"]


def validate_literal_arguments(checker: Checker, nodes: list[ast.Node]) -> None:
    """cel.ValidateDurationLiterals, ValidateTimestampLiterals and ValidateRegexLiterals: the first argument
    (receiver excluded) of any `duration`, `timestamp` or `matches` call, when a literal, must be valid."""
    for n in nodes:
        if not (isinstance(n, ast.Call) and n.function in ("duration", "timestamp", "matches") and n.args):
            continue
        lit = n.args[0]
        if not isinstance(lit, ast.Const):
            continue
        if n.function == "matches":
            bad = type(lit.value) is str and regex_error(lit.value) is not None
        else:
            bad = _fails(n.function, lit.value)
        if bad:
            raise checker.fail(lit, f"invalid {n.function} argument")


def _fails(function: str, value: object) -> bool:
    overload = REGISTRY.get((function, False, 1))
    if overload is None:
        return False
    try:
        overload.impl(Activation({}), value)
    except EvalError:
        return True
    return False
