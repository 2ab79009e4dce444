"""The API server's compile-time cost estimate of a new selector: cel-go's checker/cost.go as Kubernetes runs it.

The API server validates a new DeviceClass or ResourceClaim selector (pkg/apis/resource/validation,
validateCELSelector) by compiling it in the NewExpressions environment, where `includes` and
`device.allowMultipleAllocations` exist only with their feature gates, and refuses it with
"too complex, exceeds cost limit" when the estimated worst-case cost is over CELSelectorExpressionMaxCost. The
scheduler would still run such a selector, so `compile_selector` alone cannot tell. The estimate is a static bound,
not a measurement: a string or list of unknown size counts as 2^64 - 1 long, so `["a", "b"].join("-")` is refused.

What is ported, over our checked tree:
  * cel-go's coster (checker/cost.go), walking the tree as cel-go's macros expand it (`all` is a fold with
    `@not_strictly_false(accu)` and `accu && pred`, `map` appends with `accu + [x]`, `cel.bind` is a fold over `[]`),
    with its size, list/map entry size and field path tracking;
  * the estimators Kubernetes plugs in: ext.Lists' and ext.Sets' per-overload estimates, the library cost estimator
    (apiserver/pkg/cel/library/cost.go), DRA's `includes` estimate, and DRA's size estimator, which bounds what
    `device` holds (compile.go: attribute values 64, ids 32, domains 63, 32 entries per map);
  * `has()` is free, as Kubernetes configures it (PresenceTestHasCost(false)).
The arithmetic is cel-go's: saturating at 2^64 - 1, cost factors rounded up, and Go's wrap-around and float-to-uint
conversion where cel-go has them.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import cache
from typing import Final

from dra_driver.cel import ast
from dra_driver.cel.checker import CheckEnv, Checker, dra_env
from dra_driver.cel.cost import LIST_CREATE, MAP_CREATE, MAX_COST, STRUCT_CREATE
from dra_driver.cel.decls import Decl
from dra_driver.cel.errors import CelCompileError
from dra_driver.cel.extlib import EXT_DECLS
from dra_driver.cel.features import Features, active
from dra_driver.cel.program import build, expression_length_error
from dra_driver.cel.types import BOOL, DYN, INT, STRING, T, list_of

U64: Final = 2**64 - 1
TOO_COMPLEX: Final = "too complex, exceeds cost limit"  # validateCELSelector's field.Forbidden detail
STRING_TRAVERSAL: Final = 0.1  # common.StringTraversalCostFactor
REGEX_LENGTH: Final = 0.25  # common.RegexStringLengthCostFactor
ACCUMULATOR: Final = "@result"  # the accumulator name cel-go's parser gives macro folds
CACHE_SIZE: Final = 1024


# -- cel-go's SizeEstimate / CostEstimate arithmetic --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CostRange:
    """A [min, max] size or cost estimate (cel-go's SizeEstimate and CostEstimate share their arithmetic)."""

    min: int
    max: int

    def __add__(self, other: CostRange) -> CostRange:
        return CostRange(min(self.min + other.min, U64), min(self.max + other.max, U64))

    def __mul__(self, other: CostRange) -> CostRange:
        return CostRange(min(self.min * other.min, U64), min(self.max * other.max, U64))

    def factor(self, per_unit: float) -> CostRange:
        """MultiplyByCostFactor: each bound times a float factor, rounded up."""
        return CostRange(_by_factor(self.min, per_unit), _by_factor(self.max, per_unit))

    def union(self, other: CostRange) -> CostRange:
        return CostRange(min(self.min, other.min), max(self.max, other.max))


ZERO: Final = CostRange(0, 0)
ONE: Final = CostRange(1, 1)
UNKNOWN: Final = CostRange(0, U64)


def _by_factor(x: int, per_unit: float) -> int:
    value = float(x)
    if value > 0 and per_unit > 0 and value > float(U64) / per_unit:
        return U64
    rounded = math.ceil(value * per_unit)
    return U64 if rounded >= 2**64 else rounded


def _wrap(x: int) -> int:
    """Go's uint64 arithmetic, which wraps where cel-go does not guard it."""
    return x & U64


def _to_uint64(value: float) -> int:
    """Go's float64 → uint64 conversion on amd64 (out of range gives 2^63, not a saturated value)."""
    if value < 2**63:
        return int(value)
    high = value - 2**63
    return (int(high) if high < 2**63 else 2**63) | 2**63


# -- the tree as cel-go checks it: macros expanded, calls carrying their overload ids --------------------------------
@dataclass(eq=False, slots=True)
class _Lit:
    type: T
    value: object


@dataclass(eq=False, slots=True)
class _Ident:
    type: T
    name: str


@dataclass(eq=False, slots=True)
class _Select:
    type: T
    operand: _Expr
    field: str
    test_only: bool = False


@dataclass(eq=False, slots=True)
class _Call:
    type: T
    function: str
    target: _Expr | None
    args: tuple[_Expr, ...]
    overloads: tuple[str, ...]


@dataclass(eq=False, slots=True)
class _List:
    type: T
    elements: tuple[_Expr, ...]


@dataclass(eq=False, slots=True)
class _Map:
    type: T
    entries: tuple[tuple[_Expr, _Expr], ...]


@dataclass(eq=False, slots=True)
class _Struct:
    type: T
    fields: tuple[_Expr, ...]


@dataclass(eq=False, slots=True)
class _Fold:
    type: T
    iter_range: _Expr
    iter_var: str
    iter_var2: str | None
    accu_var: str
    accu_init: _Expr
    condition: _Expr
    step: _Expr
    result: _Expr


_Expr = _Lit | _Ident | _Select | _Call | _List | _Map | _Struct | _Fold


def _ids(decls: tuple[Decl, ...]) -> tuple[str, ...]:
    return tuple(d.overload_id for d in decls)


def _bind(t: T, var: str, init: _Expr, body: _Expr) -> _Fold:
    """cel.bind's expansion (ext/bindings.go), also used by optMap and sortBy: a fold over `[]`."""
    empty = _List(list_of(DYN), ())
    return _Fold(t, empty, "#unused", None, var, init, _Lit(BOOL, False), _Ident(init.type, var), body)


def _accu(t: T) -> _Ident:
    return _Ident(t, ACCUMULATOR)


class _Expander:
    """Our tree (macros as `Comprehension`) to cel-go's checked tree, with the checker's final types."""

    def __init__(self, checker: Checker) -> None:
        self.checker = checker

    def type_of(self, node: ast.Node) -> T:
        return self.checker.final(node) if id(node) in self.checker.types else DYN

    def expand(self, node: ast.Node) -> _Expr:
        t = self.type_of(node)
        if isinstance(node, ast.Const):
            return _Lit(t, node.value)
        if isinstance(node, ast.Ident):
            return _Ident(t, node.name)
        if isinstance(node, ast.Select):
            operand = self.expand(node.operand)
            if node.optional:  # `a.?b` is the call `_?._(a, "b")`
                return _Call(t, "_?._", None, (operand, _Lit(STRING, node.field)), ("select_optional_field",))
            return _Select(t, operand, node.field)
        if isinstance(node, ast.Has):
            return _Select(BOOL, self.expand(node.select.operand), node.select.field, test_only=True)
        if isinstance(node, ast.Index):
            name, decls = self.checker.resolved[id(node)]
            return _Call(t, name, None, (self.expand(node.operand), self.expand(node.index)), _ids(decls))
        if isinstance(node, ast.Call):
            args = tuple(self.expand(a) for a in node.args)
            if node.function in ("_&&_", "_||_"):
                overload = "logical_and" if node.function == "_&&_" else "logical_or"
                return _Call(BOOL, node.function, None, args, (overload,))
            name, decls = self.checker.resolved[id(node)]
            # a receiver that spells a qualified name (`sets.contains(...)`) was folded into a global call
            target = self.expand(node.target) if node.target is not None and name == node.function else None
            return _Call(t, name, target, args, _ids(decls))
        if isinstance(node, ast.ListLit):
            return _List(t, tuple(self.expand(e) for e in node.elements))
        if isinstance(node, ast.MapLit):
            return _Map(t, tuple((self.expand(k), self.expand(v)) for k, v, _ in node.entries))
        if isinstance(node, ast.Struct):
            return _Struct(t, tuple(self.expand(f.value) for f in node.fields))
        if isinstance(node, ast.Bind):
            return _bind(t, node.var, self.expand(node.init), self.expand(node.body))
        assert isinstance(node, ast.Comprehension)
        return self._macro(node, t)

    def _macro(self, node: ast.Comprehension, t: T) -> _Expr:
        """The expansions of parser/macro.go, ext/comprehensions.go, ext/lists.go (sortBy), cel/library.go (optMap,
        optFlatMap)."""
        macro = node.macro
        target = self.expand(node.target)
        if macro in ("optMap", "optFlatMap"):
            inner = target.type.param(0) if target.type.kind == "optional_type" else DYN
            has_value = _Call(BOOL, "hasValue", target, (), ("optional_hasValue",))
            value = _Call(inner, "value", self.expand(node.target), (), ("optional_value",))  # a copy of the target
            body = self.expand(node.body)
            some: _Expr = _bind(body.type, node.var, value, body)
            if macro == "optMap":
                some = _Call(t, "optional.of", None, (some,), ("optional_of",))
            none = _Call(t, "optional.none", None, (), ("optional_none",))
            return _Call(t, "_?_:_", None, (has_value, some, none), ("conditional",))
        if macro == "sortBy":
            var = "@__sortBy_input__"
            key = self.expand(node.body)
            keys = self._append_fold(list_of(key.type), _Ident(target.type, var), node.var, None, key, None)
            _, decls = self.checker.resolved[id(node)]
            call = _Call(t, "@sortByAssociatedKeys", _Ident(target.type, var), (keys,), _ids(decls))
            return _bind(t, var, target, call)
        if macro in ("all", "exists", "exists_one"):
            return self._quantifier(node, target, t)
        if macro in ("map", "filter", "transformList"):
            if macro == "filter":  # appends the iteration variable itself
                element: _Expr = _Ident(t.param(0), node.var)
                keep: _Expr | None = self.expand(node.body)
            elif node.transform is None:  # map(x, f)
                element, keep = self.expand(node.body), None
            else:
                element = self.expand(node.transform)
                keep = self.expand(node.body) if node.filtered else None
            return self._append_fold(t, target, node.var, node.var2, element, keep)
        # transformMap / transformMapEntry: cel.@mapInsert(accu, key, value) / cel.@mapInsert(accu, entries)
        assert node.transform is not None
        entry = self.expand(node.transform)
        keep = self.expand(node.body) if node.filtered else None
        if macro == "transformMap":
            key_type = INT if target.type.kind == "list" else target.type.param(0)
            inserted: tuple[_Expr, ...] = (_accu(t), _Ident(key_type, node.var), entry)
        else:
            inserted = (_accu(t), entry)
        step: _Expr = _Call(t, "cel.@mapInsert", None, inserted, (f"cel_@mapInsert_{len(inserted)}",))
        if keep is not None:
            step = _Call(t, "_?_:_", None, (keep, step, _accu(t)), ("conditional",))
        return _Fold(t, target, node.var, node.var2, ACCUMULATOR, _Map(t, ()), _Lit(BOOL, True), step, _accu(t))

    def _quantifier(self, node: ast.Comprehension, target: _Expr, t: T) -> _Fold:
        pred = self.expand(node.body)
        if node.macro == "all":
            init: _Expr = _Lit(BOOL, True)
            cond: _Expr = _Call(BOOL, "@not_strictly_false", None, (_accu(BOOL),), ("not_strictly_false",))
            step: _Expr = _Call(BOOL, "_&&_", None, (_accu(BOOL), pred), ("logical_and",))
            result: _Expr = _accu(BOOL)
        elif node.macro == "exists":
            init = _Lit(BOOL, False)
            negated = _Call(BOOL, "!_", None, (_accu(BOOL),), ("logical_not",))
            cond = _Call(BOOL, "@not_strictly_false", None, (negated,), ("not_strictly_false",))
            step = _Call(BOOL, "_||_", None, (_accu(BOOL), pred), ("logical_or",))
            result = _accu(BOOL)
        else:  # exists_one counts matches
            init, cond = _Lit(INT, 0), _Lit(BOOL, True)
            plus_one = _Call(INT, "_+_", None, (_accu(INT), _Lit(INT, 1)), ("add_int64",))
            step = _Call(INT, "_?_:_", None, (pred, plus_one, _accu(INT)), ("conditional",))
            result = _Call(BOOL, "_==_", None, (_accu(INT), _Lit(INT, 1)), ("equals",))
        return _Fold(t, target, node.var, node.var2, ACCUMULATOR, init, cond, step, result)

    @staticmethod
    def _append_fold(t: T, target: _Expr, var: str, var2: str | None, element: _Expr, keep: _Expr | None) -> _Fold:
        """map/filter/transformList: `accu + [element]`, under `keep ? ... : accu` when filtered."""
        step: _Expr = _Call(t, "_+_", None, (_accu(t), _List(list_of(element.type), (element,))), ("add_list",))
        if keep is not None:
            step = _Call(t, "_?_:_", None, (keep, step, _accu(t)), ("conditional",))
        return _Fold(t, target, var, var2, ACCUMULATOR, _List(t, ()), _Lit(BOOL, True), step, _accu(t))


# -- field paths, with Go's slice sharing -------------------------------------------------------------------------
class _Path:
    """A field path as cel-go builds it: a Go slice, appended to in place while its backing array has room. Two
    appends to one path then share a slot, so a later one rewrites the earlier path: `m.transformMap(k, v, ...)`
    over `device.attributes["d"]` gives `k` the path of `v` (an attribute, up to 64 long, not an id of 32). Read
    a path only when it is used, as Go does."""

    __slots__ = ("items", "length")

    def __init__(self, items: list[str], length: int) -> None:
        self.items = items
        self.length = length

    def read(self) -> tuple[str, ...]:
        return tuple(self.items[: self.length])


def _append(path: _Path | None, name: str) -> _Path:
    """Go's append: in place when the capacity allows, else a new array of twice the capacity (paths are short)."""
    if path is None:
        return _Path([name], 1)
    if path.length < len(path.items):
        path.items[path.length] = name
        return _Path(path.items, path.length + 1)
    capacity = max(2 * len(path.items), path.length + 1)
    grown = [*path.items[: path.length], name, *[""] * (capacity - path.length - 1)]
    return _Path(grown, path.length + 1)


def _read(path: _Path | None) -> tuple[str, ...] | None:
    return path.read() if path is not None else None


# -- DRA's size estimator: the declared bounds of what `device` holds (compile.go) ---------------------------------
@dataclass(eq=False, slots=True)
class _DeclType:
    max_elements: int
    fields: dict[str, _DeclType] | None = None
    key: _DeclType | None = None
    elem: _DeclType | None = None


_ATTRIBUTE: Final = _DeclType(64)  # DeviceAttributeMaxValueLength; list attributes: max(64, 48 values)
_DOMAIN: Final = _DeclType(63)  # DeviceMaxDomainLength
_ID: Final = _DeclType(32)  # DeviceMaxIDLength
_PER_DEVICE: Final = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
_DEVICE: Final = _DeclType(
    0,
    fields={
        "driver": _DeclType(63),  # DriverNameMaxLength
        "allowMultipleAllocations": _DeclType(1),
        "attributes": _DeclType(_PER_DEVICE, key=_DOMAIN, elem=_DeclType(_PER_DEVICE, key=_ID, elem=_ATTRIBUTE)),
        "capacity": _DeclType(_PER_DEVICE, key=_DOMAIN, elem=_DeclType(_PER_DEVICE, key=_ID, elem=_DeclType(0))),
    },
)
_INCLUDES_MAX: Final = 48  # ResourceSliceMaxAttributeValuesPerDevice


def _device_size(path: tuple[str, ...] | None) -> CostRange | None:
    """compile.go's sizeEstimator.EstimateSize: walk the path through the declared type of `device`."""
    if not path or path[0] != "device":
        return None
    node = _DEVICE
    for name in path[1:]:
        if name in ("@items", "@values"):
            if node.elem is None:
                return None
            node = node.elem
        elif name == "@keys":
            if node.key is None:
                return None
            node = node.key
        else:
            found = (node.fields or {}).get(name)
            if found is None:
                if node.elem is _ATTRIBUTE:  # `attrs.someName`: any attribute has the same bound
                    node = _ATTRIBUTE
                    continue
                return None
            node = found
    return CostRange(0, node.max_elements)


# -- cel-go's view of types ------------------------------------------------------------------------------------------
_SCALARS: Final = frozenset({"bool", "int", "uint", "double", "google.protobuf.Duration", "google.protobuf.Timestamp"})
_STRUCTS: Final = frozenset({"kubernetes.DRADevice", "kubernetes.Quantity", "kubernetes.Semver", "kubernetes.URL"})


def _is_scalar(t: T) -> bool:
    if t.kind == "optional_type":
        return _is_scalar(t.param(0))
    return t.kind in _SCALARS


def _literal_size(e: _Expr) -> CostRange | None:
    """computeExprSize: the exact size of a literal."""
    if isinstance(e, _Lit):
        if isinstance(e.value, str | bytes):
            return CostRange(len(e.value), len(e.value))
        return ONE
    if isinstance(e, _List):
        return CostRange(len(e.elements), len(e.elements))
    if isinstance(e, _Map):
        return CostRange(len(e.entries), len(e.entries))
    return None


# -- the coster -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _EntrySize:
    """The sizes of a list's (index, element) or a map's (key, value), when both are known."""

    container: str  # "list" | "map"
    key: CostRange
    val: CostRange

    def union(self, other: _EntrySize | None) -> _EntrySize | None:
        if other is None:
            return None
        return _EntrySize(self.container, self.key.union(other.key), self.val.union(other.val))


@dataclass(frozen=True, slots=True)
class _Local:
    path: _Path | None
    size: CostRange | None
    entry: _EntrySize | None


@dataclass(frozen=True, slots=True)
class _Node:
    """cel-go's AstNode as the function estimators see it (path, type, expression, size computed so far)."""

    path: _Path | None
    type: T
    expr: _Expr | None
    size: CostRange | None


Estimate = tuple[CostRange, CostRange | None]  # a call's cost and, when it bounds it, its result's size


class _Coster:
    def __init__(self, minor: int) -> None:
        self.minor = minor  # the Kubernetes release: its cel-go and library estimate some calls differently
        self.paths: dict[_Expr, _Path | None] = {}
        self.sizes: dict[_Expr, CostRange] = {}
        self.entries: dict[_Expr, _EntrySize] = {}
        self.locals: dict[str, list[_Local]] = {}

    def cost(self, e: _Expr) -> CostRange:
        if isinstance(e, _Lit):
            return ZERO
        if isinstance(e, _Ident):
            local = self._peek(e.name)
            self.paths[e] = local.path if local is not None else _Path([e.name], 1)
            return ONE
        if isinstance(e, _Select):
            return self._select(e)
        if isinstance(e, _Call):
            return self._call(e)
        if isinstance(e, _List):
            return self._list(e)
        if isinstance(e, _Map):
            return self._map(e)
        if isinstance(e, _Struct):  # costCreateStruct
            return sum((self.cost(f) for f in e.fields), ZERO) + CostRange(STRUCT_CREATE, STRUCT_CREATE)
        if _is_bind(e):
            return self._bind(e)
        return self._fold(e)

    # -- scopes, paths, sizes
    def _peek(self, name: str) -> _Local | None:
        stack = self.locals.get(name)
        return stack[-1] if stack else None

    def _push(self, name: str, local: _Local) -> None:
        self.locals.setdefault(name, []).append(local)

    def _pop(self, name: str) -> None:
        self.locals[name].pop()

    def _path(self, e: _Expr) -> _Path | None:
        if isinstance(e, _Ident):
            local = self._peek(e.name)
            if local is not None:
                return local.path
        return self.paths.get(e)

    def _size(self, e: _Expr) -> CostRange | None:
        """computeSize: computed so far, literal, declared bound of the path, scalar type, or the local's."""
        if e in self.sizes:
            return self.sizes[e]
        size = _literal_size(e)
        if size is not None:
            return size
        size = _device_size(_read(self._path(e)))
        if size is not None:
            self.sizes[e] = size
            return size
        if _is_scalar(e.type):
            return ONE
        if isinstance(e, _Ident):
            local = self._peek(e.name)
            if local is not None and local.size is not None:
                return local.size
        return None

    def _size_or_unknown(self, e: _Expr) -> CostRange:
        size = self._size(e)
        return UNKNOWN if size is None else size

    def _set_size(self, e: _Expr, size: CostRange | None) -> None:
        if size is not None:
            self.sizes[e] = size

    def _entry(self, e: _Expr) -> _EntrySize | None:
        if e in self.entries:
            return self.entries[e]
        if isinstance(e, _Ident):
            local = self._peek(e.name)
            if local is not None:
                return local.entry
        return None

    def _set_entry(self, e: _Expr, entry: _EntrySize | None) -> None:
        if entry is not None:
            self.entries[e] = entry

    def _node(self, e: _Expr) -> _Node:
        path = self._path(e)
        if path is not None and path.length and path.items[0] in (ACCUMULATOR, "__result__"):
            path = None  # only paths rooted at variables reach the estimators
        return _Node(path, e.type, e, self._size(e))

    # -- expressions
    def _select(self, e: _Select) -> CostRange:
        if e.test_only:  # has(): free in Kubernetes, only the operand is charged
            return self.cost(e.operand)
        total = self.cost(e.operand)
        kind = e.operand.type.kind
        if kind == "map" or kind in _STRUCTS or kind.startswith("?"):
            total += ONE
        self.paths[e] = _append(self._path(e.operand), e.field)
        return total

    def _call(self, e: _Call) -> CostRange:
        if e.function == "dyn":  # only switches type checking off: 1 plus the argument, sizes passed through
            arg = e.args[0]
            arg_cost = self.cost(arg)
            self._set_size(e, self._size(arg))
            self._set_entry(e, self._entry(arg))
            return ONE + arg_cost
        arg_costs = []
        nodes = []
        for arg in e.args:
            arg_costs.append(self.cost(arg))
            nodes.append(self._node(arg))
        if not e.overloads:
            return ZERO
        total = ZERO
        target = None
        if e.target is not None:
            total = self.cost(e.target)
            target = self._node(e.target)
        fn_cost = CostRange(U64, 0)  # the union of every candidate overload's estimate
        result_size: CostRange | None = None
        for overload in e.overloads:
            cost, size = self._function(e, overload, target, nodes, arg_costs)
            fn_cost = fn_cost.union(cost)
            if size is not None:
                result_size = size if result_size is None else result_size.union(size)
            if overload in ("index_list", "index_map") and e.args:
                entry = self._entry(e.args[0])
                result_size = entry.val if entry is not None else None
                step = "@items" if overload == "index_list" else "@values"
                self.paths[e] = _append(self._path(e.args[0]), step)
            if result_size is None:
                result_size = self._size(e)
        self._set_size(e, result_size)
        return total + fn_cost

    def _list(self, e: _List) -> CostRange:
        total = ZERO
        items = CostRange(U64, 0) if e.elements else ZERO
        for element in e.elements:
            total += self.cost(element)
            items = items.union(self._size_or_unknown(element))
        self._set_entry(e, _EntrySize("list", ONE, items))
        return total + CostRange(LIST_CREATE, LIST_CREATE)

    def _map(self, e: _Map) -> CostRange:
        total = ZERO
        keys = CostRange(U64, 0) if e.entries else ZERO
        values = keys
        for key, value in e.entries:
            total += self.cost(key)
            total += self.cost(value)
            keys = keys.union(self._size_or_unknown(key))
            values = values.union(self._size_or_unknown(value))
        self._set_entry(e, _EntrySize("map", keys, values))
        return total + CostRange(MAP_CREATE, MAP_CREATE)

    def _push_local(self, name: str, init: _Expr) -> None:
        path = self._path(init)
        entry = self._entry(init)
        self._push(name, _Local(path, self._size(init), entry))

    def _push_iter(self, name: str, iter_range: _Expr, part: str) -> None:
        """pushIterSingle / pushIterKey / pushIterValue: the variable's path and size within the range."""
        entry = self._entry(iter_range)
        container = entry.container if entry is not None else iter_range.type.kind
        is_list = container == "list"
        if part == "single":
            size = (entry.val if is_list else entry.key) if entry is not None else None
            step = "@items" if is_list else "@keys"
        elif part == "key":
            size = entry.key if entry is not None else None
            step = "@indices" if is_list else "@keys"
        else:
            size = entry.val if entry is not None else None
            step = "@items" if is_list else "@values"
        self._push(name, _Local(_append(self._path(iter_range), step), size, None))

    def _fold(self, e: _Fold) -> CostRange:
        total = self.cost(e.iter_range) + self.cost(e.accu_init)
        self._push_local(e.accu_var, e.accu_init)
        if e.iter_var2 is not None:
            self._push_iter(e.iter_var, e.iter_range, "key")
            self._push_iter(e.iter_var2, e.iter_range, "value")
        else:
            self._push_iter(e.iter_var, e.iter_range, "single")
        loop = self.cost(e.condition)
        step = self.cost(e.step)
        self._pop(e.iter_var)
        if e.iter_var2 is not None:
            self._pop(e.iter_var2)
        total += self.cost(e.result)
        self._pop(e.accu_var)
        count = self._size_or_unknown(e.iter_range)
        total += count * (step + loop)
        if isinstance(e.accu_init, _Lit):
            self._set_size(e, self._size(e.accu_init))
        elif isinstance(e.accu_init, _List | _Map):
            self._set_size(e, count)
            self._set_entry(e, self._entry(e.step))
        return total

    def _bind(self, e: _Fold) -> CostRange:
        # binds are lazy, yet the estimate keeps the cost of creating the empty range
        total = self.cost(e.iter_range) + self.cost(e.accu_init)
        self._push_local(e.accu_var, e.accu_init)
        total += self.cost(e.result)
        self._pop(e.accu_var)
        self._set_size(e, self._size(e.result))
        self._set_entry(e, self._entry(e.result))
        return total

    # -- functions: ext overload estimators, then DRA's and Kubernetes' library estimator, then cel-go's own
    def _function(
        self, e: _Call, overload: str, target: _Node | None, args: list[_Node], arg_costs: list[CostRange]
    ) -> Estimate:
        arg_sum = ZERO
        for cost in arg_costs:
            arg_sum += cost
        found = _ext_estimate(overload, target, args)
        if found is None:
            found = _library_estimate(e.function, overload, target, args, self.minor)
        if found is not None:
            return found[0] + arg_sum, found[1]
        return self._builtin(e, overload, target, args, arg_costs, arg_sum)

    def _builtin(
        self,
        e: _Call,
        overload: str,
        target: _Node | None,
        args: list[_Node],
        arg_costs: list[CostRange],
        arg_sum: CostRange,
    ) -> Estimate:
        """checker/cost.go's functionCost switch; anything else costs 1 plus its arguments."""
        if overload == "string_format" and target is not None:
            return _known(target).factor(STRING_TRAVERSAL) + arg_sum, None
        if overload in ("string_to_bytes", "bytes_to_string", "strings_quote") and len(args) == 1:
            size = _known(args[0])
            if overload == "string_to_bytes":  # up to 4 bytes a character
                result = CostRange(size.min, _wrap(size.max * 4))
            elif overload == "bytes_to_string":
                result = CostRange(size.min // 4, size.max)
            else:  # every character escaped, plus the quotes
                result = CostRange(_wrap(size.min + 2), _wrap(size.max * 2 + 2))
            return size.factor(STRING_TRAVERSAL) + arg_sum, result
        if overload in ("starts_with_string", "ends_with_string") and len(args) == 1:
            return _known(args[0]).factor(STRING_TRAVERSAL) + arg_sum, None
        if overload == "in_list" and len(args) == 2:
            return _known(args[1]).factor(1) + arg_sum, None
        if overload == "matches_string" and target is not None and len(args) == 1:
            text = (_known(target) + ONE).factor(STRING_TRAVERSAL)
            return text * _known(args[0]).factor(REGEX_LENGTH) + arg_sum, None
        if overload == "matches" and self.minor >= 37 and target is None and len(args) == 2:  # cel-go 0.29
            text = (_known(args[0]) + ONE).factor(STRING_TRAVERSAL)
            return text * _known(args[1]).factor(REGEX_LENGTH) + arg_sum, None
        if overload == "contains_string" and target is not None and len(args) == 1:
            text = _known(target).factor(STRING_TRAVERSAL)
            return text * _known(args[0]).factor(STRING_TRAVERSAL) + arg_sum, None
        if overload in ("logical_and", "logical_or"):  # short-circuits: at least the left side
            lhs, rhs = arg_costs
            return CostRange(lhs.min, (lhs + rhs).max), None
        if overload == "conditional":
            size = _known(args[1]).union(_known(args[2]))
            entry = self._entry(args[1].expr) if args[1].expr is not None else None
            other = self._entry(args[2].expr) if args[2].expr is not None else None
            self._set_entry(e, entry.union(other) if entry is not None else None)
            return arg_costs[0] + arg_costs[1].union(arg_costs[2]), size
        if overload in ("add_string", "add_bytes", "add_list") and len(args) == 2:
            result = _known(args[0]) + _known(args[1])
            entry = self._entry(args[0].expr) if args[0].expr is not None else None
            other = self._entry(args[1].expr) if args[1].expr is not None else None
            self._set_entry(e, entry.union(other) if entry is not None else None)
            if overload == "add_list":  # O(1), tracked for the size
                return ONE + arg_sum, result
            return result.factor(STRING_TRAVERSAL) + arg_sum, result
        if overload in _SIZED_COMPARISONS:
            smallest = min(_known(args[0]).max, _known(args[1]).max)
            return CostRange(1 if smallest > 0 else 0, smallest).factor(STRING_TRAVERSAL) + arg_sum, None
        return ONE + arg_sum, None


_SIZED_COMPARISONS: Final = frozenset(
    {"equals", "not_equals"}
    | {f"{op}_{t}" for op in ("less", "less_equals", "greater", "greater_equals") for t in ("string", "bytes")}
)


def _known(node: _Node) -> CostRange:
    """cel-go's sizeOrUnknown of an AstNode: its computed size only."""
    return UNKNOWN if node.size is None else node.size


def _bound(node: _Node) -> CostRange:
    """The estimators' size of a node: computed, else DRA's declared bound of its path, else unknown."""
    if node.size is not None:
        return node.size
    size = _device_size(_read(node.path))
    return UNKNOWN if size is None else size


def _list_element(node: _Node) -> _Node | None:
    """library.CostEstimator.listElementNode: the element type, with the `@items` path when the list has one."""
    if not node.type.params:
        return None
    path = _Path([*node.path.read(), "@items"], node.path.length + 1) if node.path is not None else None
    return _Node(path, node.type.params[0], None, None)


def _int_literal(node: _Node, default: int) -> int:
    """ext/lists.go's nodeAsIntValue."""
    e = node.expr
    if isinstance(e, _Lit) and type(e.value) is int:
        return max(e.value, 0)
    return default


def _allocating(factor: float, size: CostRange) -> Estimate:
    """ext/lists.go's estimateAllocatingListCall: per-element cost, the call and the new list."""
    return size.factor(factor) + ONE + CostRange(LIST_CREATE, LIST_CREATE), size


def _sort(node: _Node, elem_kind: str) -> Estimate:
    size = _bound(node)
    factor = 2.0
    if elem_kind in ("string", "bytes"):
        factor += STRING_TRAVERSAL
    return _allocating(factor, size * size)


def _ext_estimate(overload: str, target: _Node | None, args: list[_Node]) -> Estimate | None:
    """The per-overload estimators ext.Lists (version 3) and ext.Sets register."""
    if overload == "list_slice" and target is not None and len(args) == 2:
        size = _bound(target)
        start, end = _int_literal(args[0], 0), _int_literal(args[1], size.max)
        return _allocating(1, CostRange(_wrap(end - start), _wrap(end - start)))
    if overload == "lists_range" and target is None and len(args) == 1:
        n = _int_literal(args[0], U64)
        return _allocating(1, CostRange(n, n))
    if overload == "list_reverse" and target is not None and not args:
        return _allocating(1, _bound(target))
    if overload in ("list_flatten", "list_flatten_int") and target is not None and len(args) <= 1:
        depth = _int_literal(args[0], U64) if args else 1
        return _allocating(float(depth), _bound(target))
    if overload == "list_distinct" and target is not None and not args:
        size = _bound(target)
        return _allocating(2.0, size * size)
    if overload.endswith("_sort") and overload.startswith("list_") and target is not None and not args:
        return _sort(target, overload[len("list_") : -len("_sort")])
    if overload.endswith("_sortByAssociatedKeys") and target is not None and len(args) == 1:
        return _sort(args[0], overload[len("list_") : -len("_sortByAssociatedKeys")])
    if overload in _SET_FACTORS and len(args) == 2:
        return (_bound(args[0]) * _bound(args[1])).factor(_SET_FACTORS[overload]) + ONE, None
    return None


_SET_FACTORS: Final = {
    "list_sets_contains_list": 1.0,
    "list_sets_intersects_list": 1.0,
    "list_sets_equivalent_list": 2.0,
}
_NOMINAL: Final = frozenset(
    {
        # net accessors
        "masked", "prefixLength", "family", "isUnspecified", "isLoopback", "isLinkLocalMulticast",
        "isLinkLocalUnicast", "isGlobalUnicast",
        # quantity and semver
        "sign", "asInteger", "isInteger", "asApproximateFloat", "isGreaterThan", "isLessThan", "compareTo", "add",
        "sub", "major", "minor", "patch",
        # url accessors
        "getScheme", "getHostname", "getHost", "getPort", "getEscapedPath", "getQuery",
    }
)  # fmt: skip
_PARSERS: Final = frozenset({"cidr", "isIP", "isCIDR", "quantity", "isQuantity", "semver", "isSemver"})
_NET_BYTES: Final = CostRange(4, 16)  # an IPv4 or IPv6 address
_MAX_NAME_FORMAT_REGEX: Final = 128  # apiserver/pkg/cel/limits.go MaxNameFormatRegexSize
_MAX_FORMAT_SIZE: Final = 64  # MaxFormatSize


def _library_estimate(
    function: str, overload: str, target: _Node | None, args: list[_Node], minor: int
) -> Estimate | None:
    """compile.go's draCostEstimator (1.36), then apiserver/pkg/cel/library/cost.go's EstimateCallCost, for the
    functions this environment declares (the authorizer and selector libraries' functions cannot be reached here)."""
    if function == "includes" and overload == "dra_includes_dyn_dyn" and target is not None:
        if minor >= 37:  # the lists library's: the target's size, 1 per element (it may be a list under dyn)
            return _bound(target) * ONE, None
        return CostRange(0, _INCLUDES_MAX) * ONE, None  # like `arg in target`, linear in the list
    if function in _NOMINAL:
        return ONE, None
    if function in ("isSorted", "sum", "max", "min", "indexOf", "lastIndexOf") and target is not None:
        element = _list_element(target)
        if element is None:  # the string indexOf / lastIndexOf
            return _bound(target).factor(STRING_TRAVERSAL), None
        per_element = ONE
        if element.type.kind in ("string", "bytes"):
            per_element += _bound(element).factor(STRING_TRAVERSAL)
        return _bound(target) * per_element, None
    if function == "url" and len(args) == 1:
        size = _bound(args[0])
        return size.factor(STRING_TRAVERSAL), size
    if function in ("lowerAscii", "upperAscii", "substring", "trim") and target is not None:
        size = _bound(target)
        return size.factor(STRING_TRAVERSAL), size
    if function == "replace" and target is not None and len(args) >= 2:
        return _replace(_bound(target), _bound(args[0]), _bound(args[1]))
    if function == "split" and target is not None:
        size = _bound(target)
        most = size.max  # worst case: an empty separator, one element a character
        if len(args) > 1 and isinstance(args[1].expr, _Lit) and type(args[1].expr.value) is int:
            most = _wrap(args[1].expr.value)
        return size.factor(2 * STRING_TRAVERSAL), CostRange(0, most)
    if function == "join" and target is not None:
        return _join(target, args)
    if function in ("find", "findAll") and target is not None and args:
        size = _bound(target)
        text = (size + ONE).factor(STRING_TRAVERSAL)
        return text * _bound(args[0]).factor(REGEX_LENGTH), CostRange(0, size.max)
    if function in _PARSERS and args:
        return _bound(args[0]).factor(STRING_TRAVERSAL), None
    if function == "ip":
        if overload == "cidr_ip":  # a field of the CIDR
            return ONE, None
        if args:
            return _bound(args[0]).factor(STRING_TRAVERSAL), None
    if function == "validate" and args:  # a format's validate(): the string against the longest name regex
        return _bound(args[0]).factor(STRING_TRAVERSAL).factor(_MAX_NAME_FORMAT_REGEX * REGEX_LENGTH), None
    if function == "format.named":
        return ONE, None
    if function == "ip.isCanonical" and args:
        return _bound(args[0]).factor(2 * STRING_TRAVERSAL), None
    if function in ("containsIP", "containsCIDR") and args:
        cost = (_NET_BYTES + _NET_BYTES).factor(STRING_TRAVERSAL)
        if function == "containsCIDR":  # masks the base CIDR and compares the prefix bits too
            cost = cost + _NET_BYTES.factor(STRING_TRAVERSAL) + ONE
        if overload in ("cidr_contains_ip_string", "cidr_contains_cidr_string"):  # parses the string
            cost = cost + _bound(args[0]).factor(STRING_TRAVERSAL)
        return cost, None
    if function == "_==_" and len(args) == 2 and args[0].type == args[1].type:
        kind = args[0].type.kind
        if kind in ("net.IP", "net.CIDR", "kubernetes.Quantity", "kubernetes.Semver"):
            return ONE, None
        if kind == "kubernetes.NamedFormat":
            return CostRange(1, _MAX_FORMAT_SIZE).factor(STRING_TRAVERSAL), None
        if kind == "kubernetes.URL":
            size = ONE
            rhs = args[1].size
            if rhs is not None:
                size = rhs  # sic: Kubernetes unions the right-hand size with itself
            return CostRange(1, size.max).factor(STRING_TRAVERSAL), None
    return None


def _replace(size: CostRange, old: CostRange, new: CostRange) -> Estimate:
    """The library estimator's bound on `s.replace(old, new)`'s result; the cost is two traversals of `s`."""
    if old.min == 0:  # an empty `old` surrounds every character with `new`
        count_max = size.max + 1 if size.max < U64 else size.max
        kept_max = size.max
    elif new.max <= old.min:
        count_max, kept_max = 0, size.max
    else:
        count_max, kept_max = _to_uint64(math.ceil(float(size.max) / float(old.min))), 0
    if old.max == 0:
        count_min = size.min + 1 if size.min < U64 else size.min
        kept_min = size.min
    elif old.max <= new.min:
        count_min, kept_min = 0, size.min
    else:
        count_min, kept_min = _to_uint64(math.ceil(float(size.min) / float(old.max))), 0
    result = CostRange(count_min, count_max) * new + CostRange(kept_min, kept_max)
    return size.factor(2 * STRING_TRAVERSAL), result


def _join(target: _Node, args: list[_Node]) -> Estimate:
    count = _bound(target)
    size = ZERO
    element = _list_element(target)
    if element is not None:
        size = count * _bound(element)
    if args:
        separators = CostRange(max(count.min - 1, 0), max(count.max - 1, 0))
        size = size + _bound(args[0]) * separators
    return size.factor(STRING_TRAVERSAL), size


def _is_bind(e: _Fold) -> bool:
    return (
        isinstance(e.iter_range, _List)
        and not e.iter_range.elements
        and isinstance(e.condition, _Lit)
        and e.condition.value is False
        and e.accu_var != "__result__"
    )


def estimate_tree(tree: ast.Node, checker: Checker) -> CostRange:
    """cel-go's checker.Cost of a checked tree, with Kubernetes' DRA estimators."""
    return _Coster(checker.env.minor).cost(_Expander(checker).expand(tree))


# -- the API server's verdict on a new selector ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class NewSelectorVerdict:
    """What validateCELSelector says of a selector in a new DeviceClass or ResourceClaim."""

    outcome: str  # "ok", "too_long", "compile_error" or "too_complex"
    message: str = ""
    cost: CostRange | None = None  # the estimate, when it compiles

    @property
    def refused(self) -> bool:
        return self.outcome != "ok"

    def describe(self) -> str:
        """The API server's reason, with the estimate when it is the cost."""
        if self.outcome == "too_complex" and self.cost is not None:
            return f"{self.message} (estimated cost up to {self.cost.max}, limit {MAX_COST})"
        return self.message


@cache
def _new_expressions_env(features: Features) -> CheckEnv:
    return dra_env(
        features.list_type_attributes,
        EXT_DECLS,
        new_expressions=True,
        consumable_capacity=features.consumable_capacity,
        minor=features.minor,
    )


_verdicts: OrderedDict[tuple[Features, str], NewSelectorVerdict] = OrderedDict()
_verdicts_lock = threading.Lock()


def check_new_selector(
    expression: str, features: Features | None = None, *, check_length: bool = True
) -> NewSelectorVerdict:
    """The API server's verdict on `expression` in a new object, for the given (default: configured) gates.
    `check_length=False` leaves out the 10 KiB limit, as `tools/celeval -estimate` does."""
    if check_length:
        too_long = expression_length_error(expression)
        if too_long is not None:
            return NewSelectorVerdict("too_long", too_long)
    key = (features or active(), expression)
    with _verdicts_lock:
        verdict = _verdicts.get(key)
        if verdict is not None:
            _verdicts.move_to_end(key)
            return verdict
    verdict = _verdict(expression, key[0])
    with _verdicts_lock:
        _verdicts[key] = verdict
        if len(_verdicts) > CACHE_SIZE:
            _verdicts.popitem(last=False)
    return verdict


def _verdict(expression: str, features: Features) -> NewSelectorVerdict:
    try:
        _, tree, checker = build(expression, features, _new_expressions_env(features))
    except CelCompileError as err:
        return NewSelectorVerdict("compile_error", str(err))
    try:
        cost = estimate_tree(tree, checker)
    except RecursionError:  # deeper than cel-go's parser accepts anyway; say so rather than crash
        return NewSelectorVerdict("compile_error", "cost estimation failed: expression nesting too deep")
    if cost.max > MAX_COST:
        return NewSelectorVerdict("too_complex", TOO_COMPLEX, cost)
    return NewSelectorVerdict("ok", cost=cost)


def estimate_cost(expression: str, features: Features | None = None) -> CostRange:
    """The estimated [min, max] cost of a selector as the API server computes it; `CelCompileError` if it does not
    compile in the NewExpressions environment (or is too long to be accepted)."""
    verdict = check_new_selector(expression, features)
    if verdict.cost is None:
        raise CelCompileError(verdict.message)
    return verdict.cost
