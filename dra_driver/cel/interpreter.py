"""Turns a checked CEL syntax tree into nested Python closures.

The checker (`checker.py`) is the only type checker: it has rejected what cel-go rejects before this runs, and its
resolutions (functions and their overloads, type names, the static type of each node) steer what is compiled here.
What only a value can tell (an attribute's type, a `dyn`) fails at evaluation, as in cel-go.

The closures charge the runtime cost as cel-go observes its planned program (interpreter/runtimecost.go): an
attribute (a variable with its chain of field and index qualifiers) costs 1 plus 1 a qualifier, where a qualifier
that is itself an attribute (`m[device.driver]`) costs what that attribute costs, and one applied to a value that is
not an attribute (`f(x).y`, `[1, 2][0]`) adds 1 for the relative attribute; a conditional costs only its condition
and branch, and an attribute taken as a branch loses its own 1; `has()` and absent optional qualifiers cost nothing
for the test; constants, type conversions of constants, constant list and map literals and set membership in a
constant list are built once and cost 0; `&&`, `||`, `or` and `orValue` cost nothing themselves; a call costs what
`callcost` says, charged once its arguments are evaluated; the macros cost what their cel-go expansions cost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_driver.cel import ast, cost
from dra_driver.cel.callcost import CallCost, call_cost, equality, tenth
from dra_driver.cel.checker import Checker
from dra_driver.cel.cost import Activation
from dra_driver.cel.errors import EvalError, EvaluationAborted
from dra_driver.cel.ext.timeutil import Duration, Timestamp
from dra_driver.cel.library import (
    FOLDABLE,
    REGISTRY,
    check_sort_keys,
    no_overload,
)
from dra_driver.cel.messages import new_message
from dra_driver.cel.quantity import Quantity
from dra_driver.cel.semver import Semver
from dra_driver.cel.types import DEVICE, T
from dra_driver.cel.values import (
    NONE,
    CelType,
    Device,
    DomainMap,
    NativeMap,
    Optional,
    UInt,
    is_missing,
    key_of,
    map_get,
    map_key,
    set_contains,
    set_keys,
    type_name,
)

Fn = Callable[[Activation], Any]
_UNSET: Final = object()
# cel-go (matches) and Kubernetes (find, findAll) precompile a constant pattern (interpreter.RegexOptimization)
_REGEX_OPTIMIZED: Final = frozenset({"matches", "find", "findAll"})
# Functions cel-go binds once for all their overloads (stdlib operators aside): called directly, never dispatched
# as varargs (stdlib's size, type, dyn, matches; ext lists' sort)
_SINGLETON_BOUND: Final = frozenset({"size", "type", "dyn", "matches", "sort"})
# cel-go's planner folds these when their argument is a constant (decOptimize: maybeOptimizeConstUnary)
_CONVERSIONS: Final = frozenset(
    {"int", "uint", "double", "bool", "string", "bytes", "timestamp", "duration", "type", "dyn"}
)


class Compiler:
    """Compiles a tree `checker` has checked, by its resolutions: functions and overloads (`Checker.resolved`),
    names that are types or enum values (`Checker.references`), static types (for the fast paths only)."""

    def __init__(self, checker: Checker) -> None:
        self.checker = checker
        self.resolved = checker.resolved
        self.constants: dict[int, Any] = {}  # id(node) → value, for nodes cel-go's planner makes constant

    def _constant(self, node: ast.Node, value: Any) -> Fn:
        self.constants[id(node)] = value
        return lambda a: value

    def is_constant(self, node: ast.Node) -> bool:
        """Compiled already, to a constant (call after compiling `node`)."""
        return id(node) in self.constants

    def is_attribute(self, node: ast.Node) -> bool:
        """What cel-go plans as an attribute: a variable, a selection or index (qualifiers), `has()`, `?:`."""
        if isinstance(node, ast.Ident | ast.Select) and id(node) in self.checker.references:
            return False  # a type name or enum value: a constant
        if isinstance(node, ast.Call):
            return node.function == "_?_:_"
        return isinstance(node, ast.Ident | ast.Select | ast.Index | ast.Has)

    def _static(self, node: ast.Node) -> T:
        return self.checker.final(node)

    def _own_charge(self, node: ast.Node) -> int:
        """1 when `node` is an attribute whose evaluation charges 1 for itself (a variable, or a relative attribute
        over a value), which a conditional does not charge for a branch; 0 otherwise (a chain over a conditional)."""
        if not isinstance(node, ast.Ident | ast.Select | ast.Index) or not self.is_attribute(node):
            return 0
        while isinstance(node, ast.Select | ast.Index):
            node = node.operand
        return 0 if isinstance(node, ast.Call) and node.function == "_?_:_" else 1

    def compile(self, node: ast.Node) -> Fn:
        method = getattr(self, f"_{type(node).__name__.lower()}")
        result: Fn = method(node)
        return result

    # -- leaves --------------------------------------------------------------------------------------------------
    def _const(self, node: ast.Const) -> Fn:
        return self._constant(node, node.value)

    def _reference(self, node: ast.Ident | ast.Select) -> Fn | None:
        """A name the checker resolved to a type or an enum value: a constant."""
        ref = self.checker.references.get(id(node))
        if ref is None:
            return None
        return self._constant(node, CelType(ref) if isinstance(ref, str) else ref)

    def _ident(self, node: ast.Ident) -> Fn:
        constant = self._reference(node)
        if constant is not None:
            return constant
        name = node.name

        def ident(a: Activation) -> Any:
            a.cost += 1
            value = a.vars[name]
            return value.get(a) if type(value) is _Lazy else value

        return ident

    # -- selection and indexing ----------------------------------------------------------------------------------
    def _select(self, node: ast.Select) -> Fn:
        constant = self._reference(node)
        if constant is not None:
            return constant
        operand = self.compile(node.operand)
        otype = self._static(node.operand)
        field = node.field

        relative = 0 if self.is_attribute(node.operand) else 1
        if node.optional:

            def opt_select(a: Activation) -> Any:
                found = _optional_get(operand(a), field, True)
                a.cost += relative + found.has_value  # an absent optional qualifier is not charged
                return found

            return opt_select

        charge = 1 + relative
        if otype == DEVICE or otype.kind == "map":  # never an optional: the common path, kept lean

            def plain_select(a: Activation) -> Any:
                value = operand(a)
                a.cost += charge
                return _get(value, field, True)

            return plain_select

        def select(a: Activation) -> Any:
            value = operand(a)
            if type(value) is Optional and not value.has_value:
                a.cost += relative  # a qualifier applied to an empty optional is not charged
            else:
                a.cost += charge
            return _get(value, field, True)

        return select

    def _index(self, node: ast.Index) -> Fn:
        operand = self.compile(node.operand)
        index = self.compile(node.index)
        otype = self._static(node.operand)
        relative = 0 if self.is_attribute(node.operand) else 1
        # an attribute used as the index is charged as itself (its evaluation is the qualifier's observation)
        by_attribute = self.is_attribute(node.index)
        qualifier = 0 if by_attribute else 1
        if node.optional:
            absent = -1 if by_attribute else 0

            def opt_index(a: Activation) -> Any:
                found = _optional_get(operand(a), index(a), False)
                a.cost += relative + (qualifier if found.has_value else absent)
                return found

            return opt_index

        charge = relative + qualifier
        if otype == DEVICE or otype.kind in ("map", "list"):  # never an optional: the common path, kept lean

            def plain_idx(a: Activation) -> Any:
                value = operand(a)
                key = index(a)
                a.cost += charge
                return _get(value, key, False)

            return plain_idx

        def idx(a: Activation) -> Any:
            value = operand(a)
            key = index(a)
            if type(value) is Optional and not value.has_value:
                a.cost += relative  # a qualifier applied to an empty optional is not charged
            else:
                a.cost += charge
            return _get(value, key, False)

        return idx

    def _has(self, node: ast.Has) -> Fn:
        operand = self.compile(node.select.operand)
        field = node.select.field

        # the presence test replaces the attribute's own 1; over a value that is no attribute, it adds 1
        extra = 0 if self.is_attribute(node.select.operand) else 1
        # over an optional, cel-go charges the presence test only when it finds the field (a variable's own 1 is
        # the test's, so it is given back)
        refund = extra if extra else int(isinstance(node.select.operand, ast.Ident))

        def has(a: Activation) -> bool:
            value = operand(a)
            a.cost += extra
            present = _present(value, field)
            if not present and isinstance(value, Optional):
                a.cost -= refund
            return present

        return has

    # -- literals ------------------------------------------------------------------------------------------------
    def _listlit(self, node: ast.ListLit) -> Fn:
        fns = [self.compile(e) for e in node.elements]
        if not any(node.optional):

            def make_list(a: Activation) -> list[Any]:
                a.charge(cost.LIST_CREATE)
                return [fn(a) for fn in fns]

            return self._prebuilt(node, make_list)
        flags = node.optional

        def make_opt_list(a: Activation) -> list[Any]:
            a.charge(cost.LIST_CREATE)
            out: list[Any] = []
            for fn, opt in zip(fns, flags, strict=True):
                value = fn(a)
                if not opt:
                    out.append(value)
                elif not isinstance(value, Optional):
                    raise no_overload("optional list element", value)
                elif value.has_value:
                    out.append(value.value)
            return out

        return make_opt_list

    def _maplit(self, node: ast.MapLit) -> Fn:
        plan = [(self.compile(k), self.compile(v), opt) for k, v, opt in node.entries]

        def make_map(a: Activation) -> dict[Any, Any]:
            a.charge(cost.MAP_CREATE)
            out: dict[Any, Any] = {}
            for kf, vf, opt in plan:
                raw = kf(a)
                value = vf(a)
                key = map_key(raw)  # cel-go's Go map: any key type, one entry per Go-equal key (see `GoKey`)
                out.pop(key, None)  # a repeated key: the last entry wins (a none optional one removes it)
                if opt:
                    if not isinstance(value, Optional):
                        raise no_overload("optional map entry", value)
                    if not value.has_value:
                        continue
                    value = value.value
                out[key] = value
            return out

        return self._prebuilt(node, make_map)

    def _struct(self, node: ast.Struct) -> Fn:
        """A message literal: the field values in order (the first error stops them), then the message, which
        costs what cel-go charges any object construction, also when it fails."""
        name = self.checker.references[id(node)]
        assert isinstance(name, str)
        plan = [(f.name, self.compile(f.value), f.optional) for f in node.fields]

        def make_message(a: Activation) -> Any:
            a.charge(cost.STRUCT_CREATE)
            fields: dict[str, Any] = {}
            for field, fn, opt in plan:
                value = fn(a)
                if opt:
                    if not isinstance(value, Optional):
                        raise EvalError(f"cannot initialize optional entry '{field}' from non-optional value {value}")
                    if not value.has_value:
                        fields.pop(field, None)
                        continue
                    value = value.value
                fields[field] = value
            return new_message(name, fields)

        return make_message

    # -- macros --------------------------------------------------------------------------------------------------
    def _bind(self, node: ast.Bind) -> Fn:
        init = self.compile(node.init)
        body = self.compile(node.body)
        var = node.var
        # cel-go evaluates a bind's value on first use (an error or cost in an unused one never happens). The value
        # must see the variables of the bind: snapshot them only when the value reads a name that the bind itself
        # or its body rebinds (`cel.bind(x, x + 1, ...)` reads the outer x).
        snapshot = _rebinds_a_read(node.init, var, node.body)

        def bind(a: Activation) -> Any:
            saved = a.vars.get(var, _UNSET)
            a.vars[var] = _Lazy(init, dict(a.vars) if snapshot else None)
            try:
                return body(a)
            finally:
                _restore(a, var, saved)

        return bind

    def _comprehension(self, node: ast.Comprehension) -> Fn:
        target = self.compile(node.target)
        macro, var, var2 = node.macro, node.var, node.var2
        if macro in ("optMap", "optFlatMap"):
            return self._opt_map(node, target)
        body = self.compile(node.body)
        transform = self.compile(node.transform) if node.transform else None
        run = _MACROS[macro]
        step = self._fold_step(node)

        def comprehension(a: Activation) -> Any:
            items = target(a)
            if isinstance(items, list):
                pairs: Any = enumerate(items) if var2 else ((None, x) for x in items)
            elif isinstance(items, dict):
                pairs = ((key_of(k), v) for k, v in items.items()) if var2 else ((None, key_of(k)) for k in items)
            elif var2 and type(items) in _GO_TYPES:  # cel-go's fold names the value's Go type
                raise EvalError(f"unsupported comprehension range type: {_GO_TYPES[type(items)]}")
            elif type(items) in _GO_TYPES:
                raise EvalError(f"got '{_GO_TYPES[type(items)]}', expected iterable type")
            else:
                raise EvalError(f"expression of type '{type_name(items)}' cannot be range of a comprehension")
            saved = (a.vars.get(var, _UNSET), a.vars.get(var2, _UNSET) if var2 else _UNSET)
            try:
                return run(a, pairs, len(items), var, var2, body, transform, step)
            finally:
                _restore(a, var, saved[0])
                if var2:
                    _restore(a, var2, saved[1])

        return comprehension

    def _fold_step(self, node: ast.Comprehension) -> Any:
        """What one element's step costs beyond the user's expressions: `accu + [x]` is the accumulator (1), a new
        list (10, nothing for a constant one) and `+` (1); `cel.@mapInsert(accu, k, v)` 3, `(accu, entry)` 2.
        sortBy also needs the price of its `@sortByAssociatedKeys` call."""
        macro = node.macro
        if macro in ("map", "transformList", "sortBy"):
            element = node.transform if node.transform is not None else node.body
            append = 2 if self.is_constant(element) else cost.APPEND_STEP
            if macro != "sortBy":
                return append
            _, decls = self.resolved.get(id(node), ("", ()))
            overload = decls[0].overload_id if len(decls) == 1 else ""
            return append, call_cost("@sortByAssociatedKeys", overload, self.checker.env.minor)
        return {"filter": cost.APPEND_STEP + 1, "transformMap": 3, "transformMapEntry": 2}.get(macro, 0)

    def _opt_map(self, node: ast.Comprehension, target: Fn) -> Fn:
        """`t.hasValue() ? optional.of(cel.bind(v, t.value(), body)) : optional.none()`, as cel-go expands it (for
        optFlatMap without `optional.of`): the target is evaluated again, with `value()`, only when the body first
        reads `v`."""
        body = self.compile(node.body)
        var = node.var
        wrap = node.macro == "optMap"
        snapshot = _rebinds_a_read(node.target, var, node.body)

        def reread(a: Activation) -> Any:
            again = target(a)
            a.cost += 1  # value()
            if not isinstance(again, Optional):
                raise no_overload("value", again)
            if not again.has_value:
                raise EvalError("optional.none() dereference")
            return again.value

        def opt_map(a: Activation) -> Any:
            opt = target(a)
            a.cost += 1  # hasValue()
            if not isinstance(opt, Optional):
                raise no_overload("hasValue", opt)
            if not opt.has_value:
                a.cost += 1  # optional.none()
                return NONE
            saved = a.vars.get(var, _UNSET)
            a.vars[var] = _Lazy(reread, dict(a.vars) if snapshot else None)
            try:
                result = body(a)
            finally:
                _restore(a, var, saved)
            if not wrap:
                return result
            a.cost += 1  # optional.of()
            return Optional(True, result)

        return opt_map

    # -- calls ---------------------------------------------------------------------------------------------------
    def _call(self, node: ast.Call) -> Fn:
        name, target = node.function, node.target
        if name in ("_&&_", "_||_"):
            return self._logic(node)
        if name == "_?_:_":
            return self._ternary(node)
        if name == "!_":
            fn = self.compile(node.args[0])

            def not_(a: Activation) -> bool:
                try:
                    value = fn(a)
                finally:
                    a.cost += 1  # charged on an error too
                if value is True or value is False:
                    return not value
                raise no_overload("!_", value)

            return not_
        # `optional.of(x)`, `sets.contains(a, b)`, `lists.range(n)`: the checker folded a namespace into the name
        name = self.resolved[id(node)][0]
        if name != node.function:
            target = None
        member = target is not None
        fns = [self.compile(arg) for arg in ([target] if target is not None else []) + list(node.args)]
        overload = REGISTRY.get((name, member, len(fns)))
        assert overload is not None, f"the checker resolved '{name}', which has no implementation"
        impl = overload.impl
        if name in ("or", "orValue") and member:
            return _optional_or(fns[0], fns[1], name == "orValue")
        args = [target, *node.args] if target is not None else list(node.args)
        if name == "@in" and isinstance(node.args[1], ast.ListLit) and self.is_constant(node.args[1]):
            items = self.constants[id(node.args[1])]
            if not items:  # cel-go: a constant `false`, the element not even evaluated
                return self._constant(node, False)
            keys = set_keys(items)
            if keys is not None:
                return self._set_membership(fns[0], keys)
        priced = self._price(node, name)
        constant = all(self.is_constant(arg) for arg in args)
        if constant and not member and (name in _CONVERSIONS or name in FOLDABLE):
            values = [self.constants[id(arg)] for arg in args]
            try:
                folded = impl(cost.Activation({}), *values)
            except EvalError:
                pass
            else:
                if name in _CONVERSIONS:  # cel-go folds these: a constant, free
                    return self._constant(node, folded)
                # ours only, for speed: charged as the call it replaces
                charge = 1 if priced is None else priced.fn(values, folded)

                def folded_call(a: Activation) -> Any:
                    a.charge(charge)
                    return folded

                return folded_call
        if name in ("_==_", "_!=_"):
            return _equality_call(impl, fns[0], fns[1], name == "_==_")
        # cel-go compiles a constant pattern once and calls through a varargs call, which stops at a failed argument
        varargs = name in _REGEX_OPTIMIZED and len(args) >= 2 and self.is_constant(args[1])
        # A call the checker left to several overloads runs through the function's dynamic dispatch, which cel-go
        # plans as a varargs call unless the function has a single (singleton) binding
        if len(args) == 2 and name not in _SINGLETON_BOUND and name[0].isalpha():
            varargs = varargs or len(self.resolved.get(id(node), (name, ()))[1]) > 1
        return _invoke(impl, fns, priced, varargs)

    def _price(self, node: ast.Call, name: str) -> CallCost | None:
        """The call's cost: by the overload the checker resolved when it resolved exactly one (cel-go's planner
        keeps no overload id otherwise); `==` and `!=` are always cel-go's `equals` / `not_equals`."""
        function, decls = self.resolved.get(id(node), (name, ()))
        minor = self.checker.env.minor
        if function in ("_==_", "_!=_"):
            return call_cost(function, "equals" if function == "_==_" else "not_equals", minor)
        return call_cost(function, decls[0].overload_id if len(decls) == 1 else "", minor)

    @staticmethod
    def _set_membership(element: Fn, keys: frozenset[tuple[str, Any]]) -> Fn:
        """cel-go's set-membership optimisation: `x in [constant scalars]` becomes a Go map lookup that costs
        nothing (`values.set_contains`)."""

        def member(a: Activation) -> bool:
            return set_contains(keys, element(a))

        return member

    def _logic(self, node: ast.Call) -> Fn:
        left, right = (self.compile(arg) for arg in node.args)
        absorbing = node.function == "_||_"  # the value that decides the result regardless of the other side
        name = node.function

        def logic(a: Activation) -> Any:
            try:
                lv = left(a)
            except EvaluationAborted:
                raise
            except EvalError as err:
                lv = err
            if lv is absorbing:
                return absorbing
            rv = right(a)  # an error here propagates unless the left side decided (handled above)
            if rv is absorbing:
                return absorbing
            if isinstance(lv, EvalError):
                raise lv
            if type(lv) is not bool:
                raise no_overload(name, lv, rv)
            if type(rv) is not bool:
                raise no_overload(name, lv, rv)
            return not absorbing

        return logic

    def _ternary(self, node: ast.Call) -> Fn:
        cond, then, other = (self.compile(arg) for arg in node.args)
        then_own, other_own = self._own_charge(node.args[1]), self._own_charge(node.args[2])

        def ternary(a: Activation) -> Any:
            c = cond(a)
            if c is True:
                a.cost -= then_own
                return then(a)
            if c is False:
                a.cost -= other_own
                return other(a)
            raise no_overload("_?_:_", c)

        return ternary

    def _prebuilt(self, node: ast.ListLit | ast.MapLit, make: Fn) -> Fn:
        """A literal of constants is built once, at no runtime cost, as cel-go's OptOptimize does (values are never
        mutated in place); one whose construction fails stays dynamic so that it fails at evaluation."""
        optional = node.optional if isinstance(node, ast.ListLit) else tuple(opt for _, _, opt in node.entries)
        if any(optional) or not all(self.is_constant(child) for child in ast.children(node)):
            return make
        try:
            value = make(Activation({}))
        except EvalError:
            return make
        return self._constant(node, value)


# -- runtime helpers ----------------------------------------------------------------------------------------------
def _invoke(impl: Callable[..., Any], fns: list[Fn], priced: CallCost | None, varargs: bool = False) -> Fn:
    """A call: the arguments (receiver first), then its cost, then the function. As in cel-go, a failed argument
    still leaves the call charged (sized 1) when every argument was evaluated: a call of one or two arguments
    evaluates both whatever happens; a varargs call (three or more arguments, or `varargs`) stops at the first
    failure and is then not charged. One and two arguments have their own closures: they are most calls."""
    price = priced.fn if priced is not None else None
    by_arguments = priced is None or not priced.uses_result
    if len(fns) == 1 and by_arguments:
        (f0,) = fns

        def call1(a: Activation) -> Any:
            try:
                value = f0(a)
            except EvaluationAborted:
                raise
            except EvalError as err:
                a.charge(1 if price is None else price((err,), None))
                raise
            if price is None:
                a.cost += 1
            else:
                a.charge(price((value,), None))
            return impl(a, value)

        return call1
    if len(fns) == 2 and by_arguments:
        f0, f1 = fns

        def call2(a: Activation) -> Any:
            failed: EvalError | None = None
            try:
                left = f0(a)
            except EvaluationAborted:
                raise
            except EvalError as err:
                if varargs:
                    raise  # stops before the second argument: never charged
                left = failed = err
            try:
                right = f1(a)
            except EvaluationAborted:
                raise
            except EvalError as err:
                right = err
                failed = failed or err
            if price is None:
                a.cost += 1
            else:
                a.charge(price((left, right), None))
            if failed is not None:
                raise failed
            return impl(a, left, right)

        return call2
    stops = 1 if varargs else 3  # from how many arguments a failure stops the argument list

    def call(a: Activation) -> Any:
        values = _arguments(a, fns, price, stops)
        if price is None:
            a.cost += 1
        elif by_arguments:  # before the work: an O(n²) call over the limit never runs
            a.charge(price(values, None))
        else:
            try:
                result = impl(a, *values)
            except EvalError:
                a.charge(price(values, None))  # cel-go sizes the error value as 1
                raise
            a.charge(price(values, result))
            return result
        return impl(a, *values)

    return call


def _equality_call(impl: Callable[..., Any], f0: Fn, f1: Fn, unit: bool) -> Fn:
    """`==` / `!=`, the commonest calls: `call2` with the cost of `callcost.equality` inlined for strings."""

    def equal(a: Activation) -> Any:
        failed: EvalError | None = None
        try:
            left = f0(a)
        except EvaluationAborted:
            raise
        except EvalError as err:
            left = failed = err
        try:
            right = f1(a)
        except EvaluationAborted:
            raise
        except EvalError as err:
            right = err
            failed = failed or err
        if type(left) is str and type(right) is str:
            size = len(left) if len(left) < len(right) else len(right)
            a.cost += (size + 9) // 10 if size < 2000 else tenth(size)
        else:
            a.cost += equality(left, right, unit)
        if failed is not None:
            raise failed
        return impl(a, left, right)

    return equal


def _arguments(a: Activation, fns: list[Fn], price: Callable[[Any, Any], int] | None, stops: int) -> list[Any]:
    """The argument values; on an error, the call's cost is charged (when cel-go would) before it propagates: a call
    of at least `stops` arguments stops at a failed one, and is charged only if it was the last."""
    values: list[Any] = []
    failed: EvalError | None = None
    for i, fn in enumerate(fns):
        try:
            values.append(fn(a))
        except EvaluationAborted:
            raise
        except EvalError as err:
            values.append(err)
            failed = failed or err
            if len(fns) >= stops and i < len(fns) - 1:
                raise  # cel-go's varargs call stops here, its cost never observed
    if failed is not None:
        a.charge(1 if price is None else price(values, None))
        raise failed
    return values


def _optional_or(lhs: Fn, rhs: Fn, unwrap: bool) -> Fn:
    """cel-go's evalOptionalOr / evalOptionalOrValue: free, and the right side only runs for an empty left side
    (a left side that is not an optional is returned as it is)."""

    def or_(a: Activation) -> Any:
        left = lhs(a)
        if not isinstance(left, Optional):
            return left
        if left.has_value:
            return left.value if unwrap else left
        return rhs(a)

    return or_


class _Lazy:
    """A `cel.bind` value computed on first read, then kept; it sees the variables of the bind (`scope`, when the
    body could have rebound one it reads), not of the read."""

    __slots__ = ("fn", "scope", "value")

    def __init__(self, fn: Fn, scope: dict[str, Any] | None) -> None:
        self.fn, self.scope, self.value = fn, scope, _UNSET

    def get(self, a: Activation) -> Any:
        if self.value is _UNSET:
            if self.scope is None:
                self.value = self.fn(a)
                return self.value
            current, a.vars = a.vars, self.scope
            try:
                self.value = self.fn(a)
            finally:
                a.vars = current
        return self.value


def _free_names(node: ast.Node) -> set[str]:
    return {n.name for n in ast.walk(node) if isinstance(n, ast.Ident)}


def _rebinds_a_read(value: ast.Node, var: str, body: ast.Node) -> bool:
    """Whether a lazily read `value` bound to `var` over `body` reads a name that `var` or `body` shadows, so that
    it must be evaluated with the variables of the bind rather than those of the read."""
    return bool(_free_names(value) & (_bound_names(body) | {var}))


def _bound_names(node: ast.Node) -> set[str]:
    names: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Comprehension):
            names.update(v for v in (n.var, n.var2) if v is not None)
        elif isinstance(n, ast.Bind):
            names.add(n.var)
    return names


def _restore(a: Activation, var: str, saved: Any) -> None:
    if saved is _UNSET:
        a.vars.pop(var, None)
    else:
        a.vars[var] = saved


def _get(container: Any, key: Any, is_field: bool) -> Any:
    if isinstance(container, dict):
        value = map_get(container, key)
        if is_missing(value):
            if isinstance(container, DomainMap):
                return NativeMap()  # unknown domain: empty map, not an error
            raise EvalError(f"no such key: {_show_key(key)}")
        return value
    if isinstance(container, Device) and is_field and key in Device.FIELDS:
        return getattr(container, key)
    if isinstance(container, list) and not is_field:
        if (
            isinstance(key, bool)
            or not isinstance(key, int | float)
            or (isinstance(key, float) and not key.is_integer())
        ):
            raise no_overload("_[_]", container, key)
        i = int(key)
        if not 0 <= i < len(container):
            raise EvalError(f"index out of bounds: {i}")  # cel-go's list wording (strings say "range")
        return container[i]
    if isinstance(container, Optional):
        return _optional_get(container, key, is_field)
    raise no_overload("_[_]" if not is_field else "_._", container, key)


def _present(value: Any, field: str) -> bool:
    """cel-go's presence test of `field`: an optional is looked into, a map (the device too) has the key, a list
    refuses a string index, and anything else (a scalar, a Kubernetes type) has no fields: false, not an error."""
    if isinstance(value, Optional):
        if not value.has_value:
            return False
        value = value.value
    if isinstance(value, DomainMap):
        return True  # compile.go's map Find() reports every domain present (an empty default)
    if isinstance(value, dict):
        return not is_missing(map_get(value, field))
    if isinstance(value, Device):
        return field in Device.FIELDS
    if isinstance(value, list):
        raise EvalError("unsupported index type 'string' in list")
    return False


def _show_key(key: Any) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


def _optional_get(container: Any, key: Any, is_field: bool) -> Optional:
    if isinstance(container, Optional):
        if not container.has_value:
            return NONE
        container = container.value
    if isinstance(container, dict):
        value = map_get(container, key)
        if is_missing(value) and isinstance(container, DomainMap):
            return Optional(True, NativeMap())  # Find() with a default: an unknown domain is present and empty
        return NONE if is_missing(value) else Optional(True, value)
    if isinstance(container, list) and not is_field:
        if type(key) is int and 0 <= key < len(container):
            return Optional(True, container[key])
        return NONE
    return Optional(True, _get(container, key, is_field))


def _set(a: Activation, var: str, var2: str | None, first: Any, second: Any) -> None:
    if var2 is None:
        a.vars[var] = second
    else:
        a.vars[var] = first
        a.vars[var2] = second


def _quantifier(decisive: bool, name: str, condition: int) -> Callable[..., bool]:
    """`all` (decisive False) and `exists` (decisive True): the first element giving the decisive value ends the
    loop; an error (or a non-bool) counts only when no element decides, as CEL's error absorption requires.

    Cost, as cel-go's fold runs: per element the loop condition (`@not_strictly_false(accu)`: 2, or 3 with the
    negation of exists) and the step's read of the accumulator (1) besides the predicate; once decided, the next
    element's condition check, if there is a next element, ends the loop; the result reads the accumulator (1)."""

    def run(a: Activation, pairs: Any, n: int, var: str, var2: str | None, body: Fn, _t: Fn | None, _s: Any) -> bool:
        error: EvalError | None = None
        seen = 0
        for first, second in pairs:
            a.charge(condition + 1)
            seen += 1
            _set(a, var, var2, first, second)
            try:
                value = body(a)
            except EvaluationAborted:
                raise
            except EvalError as err:
                error = error or err  # `accu && p` (`||`) keeps the accumulated error: the first one
                continue
            if value is decisive:
                a.charge(condition + 1 if seen < n else 1)  # the result reads `accu`
                return bool(decisive)
            if value is not (not decisive):
                error = error or no_overload(name, value)
        a.charge(1)
        if error is not None:
            raise error
        return not decisive

    return run


_run_all = _quantifier(False, "all", 2)
_run_exists = _quantifier(True, "exists", 3)


def _run_exists_one(
    a: Activation, pairs: Any, n: int, var: str, var2: str | None, body: Fn, _t: Fn | None, _s: Any
) -> bool:
    """`pred ? accu + 1 : accu`: the untaken accumulator branch costs nothing, `accu + 1` 2; then `accu == 1`.
    The loop has no condition: a predicate's error becomes the accumulator and the loop goes on, each later error
    replacing it (the conditional returns its condition's error), and the result is the last error."""
    count = 0
    error: EvalError | None = None
    for first, second in pairs:
        _set(a, var, var2, first, second)
        try:
            value = body(a)
        except EvaluationAborted:
            raise
        except EvalError as err:
            error = err
            continue
        if type(value) is not bool:
            error = no_overload("exists_one", value)
            continue
        if value:
            a.charge(2)
        count += value
    a.charge(2)
    if error is not None:
        raise error
    return count == 1


def _predicate(value: Any, macro: str) -> bool:
    if type(value) is not bool:
        raise no_overload(macro, value)
    return value


def _run_map(
    a: Activation, pairs: Any, n: int, var: str, var2: str | None, body: Fn, transform: Fn | None, step: int
) -> list[Any]:
    out: list[Any] = []
    for first, second in pairs:
        _set(a, var, var2, first, second)
        if transform is None:
            out.append(body(a))
        elif _predicate(body(a), "map"):
            out.append(transform(a))
        else:
            continue  # the filter's untaken `accu` branch costs nothing
        a.charge(step)
    a.charge(1)  # the result reads `accu` (its initial `[]` is a prebuilt constant)
    return out


def _run_filter(
    a: Activation, pairs: Any, n: int, var: str, var2: str | None, body: Fn, _t: Fn | None, step: int
) -> list[Any]:
    out: list[Any] = []
    for first, second in pairs:
        _set(a, var, var2, first, second)
        if _predicate(body(a), "filter"):
            a.charge(step)  # `accu + [x]` reads x again
            out.append(second)
    a.charge(1)
    return out


def _run_transform_list(
    a: Activation, pairs: Any, n: int, var: str, var2: str | None, body: Fn, t: Fn | None, step: int
) -> list[Any]:
    assert t is not None
    out: list[Any] = []
    for first, second in pairs:
        _set(a, var, var2, first, second)
        if _predicate(body(a), "transformList"):
            out.append(t(a))
            a.charge(step)
    a.charge(1)
    return out


def _run_transform_map(
    a: Activation, pairs: Any, n: int, var: str, var2: str | None, body: Fn, t: Fn | None, step: int
) -> Any:
    assert t is not None
    out: dict[Any, Any] = {}
    for first, second in pairs:
        _set(a, var, var2, first, second)
        if _predicate(body(a), "transformMap"):
            out[map_key(first)] = t(a)
            a.charge(step)
    a.charge(1)
    return out


def _run_sort_by(
    a: Activation, pairs: Any, n: int, var: str, var2: str | None, body: Fn, _t: Fn | None, step: Any
) -> list[Any]:
    append, priced = step
    keyed: list[tuple[Any, Any]] = []
    # `cel.bind(in, list, in.@sortByAssociatedKeys(in.map(x, key)))`: two reads of `in`, the map's result
    a.charge(2)
    for first, second in pairs:
        a.charge(append)
        _set(a, var, var2, first, second)
        keyed.append((body(a), second))
    a.charge(1)
    keys = [k for k, _ in keyed]
    a.charge(1 if priced is None else priced.fn([[v for _, v in keyed], keys], None))
    check_sort_keys(keys)
    keyed.sort(key=lambda kv: kv[0])
    return [v for _, v in keyed]


def _run_transform_map_entry(
    a: Activation, pairs: Any, n: int, var: str, var2: str | None, body: Fn, t: Fn | None, step: int
) -> Any:
    assert t is not None
    out: dict[Any, Any] = {}
    for first, second in pairs:
        _set(a, var, var2, first, second)
        if not _predicate(body(a), "transformMapEntry"):
            continue
        a.charge(step)
        entry = t(a)
        if not isinstance(entry, dict):
            raise no_overload("cel.@mapInsert", out, entry)
        for key, value in entry.items():
            if not is_missing(map_get(out, key_of(key))):
                raise EvalError(f"insert failed: key {_show_key(key_of(key))} already exists")
            out[key] = value
    a.charge(1)
    return out


# Go's %T of the values a `dyn` range may hold (checked against tools/celeval's messages).
_GO_TYPES: Final[dict[type, str]] = {
    str: "types.String",
    int: "types.Int",
    UInt: "types.Uint",
    float: "types.Double",
    bool: "types.Bool",
    bytes: "types.Bytes",
    type(None): "types.Null",
    Optional: "*types.Optional",
    CelType: "*types.Type",
    Duration: "types.Duration",
    Timestamp: "types.Timestamp",
    Quantity: "cel.Quantity",
    Semver: "cel.Semver",
}


_MACROS: Final[dict[str, Callable[..., Any]]] = {
    "all": _run_all,
    "exists": _run_exists,
    "exists_one": _run_exists_one,
    "map": _run_map,
    "filter": _run_filter,
    "transformList": _run_transform_list,
    "transformMap": _run_transform_map,
    "transformMapEntry": _run_transform_map_entry,
    "sortBy": _run_sort_by,
}
