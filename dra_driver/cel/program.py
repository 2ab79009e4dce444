"""`compile_selector` and `Selector`: compile caching, evaluation, memoisation.

Compiled selectors are kept in an LRU keyed by expression text (like cel-go's `cel.NewCache`), compile errors
included. Each selector memoises results keyed only by the device values it can read (`keys.py`), so identical
devices across a fleet of nodes are evaluated once; errors are memoised too, as evaluation is deterministic.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from functools import cache
from typing import Any, Final

from dra_driver.cel import ast, cost
from dra_driver.cel.checker import CheckEnv, Checker, check, dra_env
from dra_driver.cel.device import CelDevice
from dra_driver.cel.errors import CelCompileError, CelRuntimeError, CostLimitExceeded, EvalError
from dra_driver.cel.extlib import EXT_DECLS
from dra_driver.cel.features import Features, active
from dra_driver.cel.instantiate import instantiation_error
from dra_driver.cel.interpreter import Compiler, Fn
from dra_driver.cel.keys import KeyPlan, plan_keys
from dra_driver.cel.parser import parse
from dra_driver.cel.types import BOOL, DEVICE, T
from dra_driver.cel.typesys import ANY
from dra_driver.cel.values import type_name

MAX_EXPRESSION_LENGTH: Final = 10 * 1024  # resourceapi.CELSelectorExpressionMaxLength
COMPILE_CACHE_SIZE: Final = 1024
MEMO_SIZE: Final = 16384
# cel-go accepts 250 nested levels; parsing, checking and compiling one takes ~10 Python frames per level.
_RECURSION_LIMIT: Final = 6000
if sys.getrecursionlimit() < _RECURSION_LIMIT:
    sys.setrecursionlimit(_RECURSION_LIMIT)


class Selector:
    """A compiled device selector."""

    def __init__(self, expression: str, fn: Fn, keys: KeyPlan, cost_limit: int = cost.MAX_COST) -> None:
        self.expression = expression
        self._fn = fn
        self._keys = keys
        self._memo: dict[Any, bool | str] = {}
        self._lock = threading.Lock()
        self.cost_limit = cost_limit
        self.evaluations = 0  # real evaluations; memo hits do not count
        self.memo_hits = 0
        self.last_cost = 0

    def matches(self, device: CelDevice) -> bool:
        """True/False, or `CelRuntimeError` (missing key, overflow, non-bool result, cost limit...)."""
        # Convert first (once per instance, cached): as in Kubernetes, a device with an invalid attribute is an
        # error whatever the expression reads, so a memoised answer must not hide it.
        device.cel_parts  # noqa: B018
        key = self._keys.key(device)
        cached = self._memo.get(key)  # a plain dict read is atomic under the GIL; writes take the lock
        if cached is None:
            cached = self._evaluate(device)
            with self._lock:
                self._memo[key] = cached
                if len(self._memo) > MEMO_SIZE:  # bounded, oldest first
                    del self._memo[next(iter(self._memo))]
        else:
            self.memo_hits += 1
        if cached is True or cached is False:
            return cached
        raise CelRuntimeError(cached)

    def evaluate(self, device: CelDevice) -> bool:
        """Like `matches` without the memo (for benchmarks and tests)."""
        result = self._evaluate(device)
        if isinstance(result, str):
            raise CelRuntimeError(result)
        return result

    def _evaluate(self, device: CelDevice) -> bool | str:
        """The result, or the error message as a string (so that it can be memoised)."""
        self.evaluations += 1
        act = cost.Activation({"device": device.cel_value()}, self.cost_limit)
        try:
            result = self._fn(act)
        except CostLimitExceeded as err:
            return err.message
        except EvalError as err:
            return err.message
        except RecursionError:
            return "max recursion depth exceeded"
        except (ArithmeticError, TypeError, ValueError, OverflowError) as err:  # defensive: never leak
            return f"internal evaluation error: {err}"
        finally:
            self.last_cost = act.cost
        if act.cost > self.cost_limit:
            return CostLimitExceeded().message
        if type(result) is not bool:
            name = type_name(result)
            detail = f"type conversion error from '{name}' to 'bool'"
            return f"CEL result of type {name} could not be converted to bool: {detail}"
        return result

    def clear_memo(self) -> None:
        with self._lock:
            self._memo.clear()


_cache: OrderedDict[tuple[Features, str], Selector | CelCompileError] = OrderedDict()
_cache_lock = threading.Lock()
_stats = {"hits": 0, "misses": 0}


def compile_selector(expression: str) -> Selector:
    """Compile (or fetch from the LRU) a DRA device selector for the configured feature gates, as the
    kube-scheduler does (no length check: that is API validation, see `expression_length_error`);
    raises `CelCompileError`."""
    key = (active(), expression)
    with _cache_lock:
        entry = _cache.get(key)
        if entry is not None:
            _cache.move_to_end(key)
            _stats["hits"] += 1
    if entry is None:
        _stats["misses"] += 1
        entry = _compile(expression, key[0])
        with _cache_lock:
            _cache[key] = entry
            if len(_cache) > COMPILE_CACHE_SIZE:
                _cache.popitem(last=False)
    if isinstance(entry, CelCompileError):
        raise CelCompileError(str(entry))  # a fresh exception: cached ones must not accumulate tracebacks
    return entry


def cache_info() -> dict[str, int]:
    return {**_stats, "size": len(_cache), "maxsize": COMPILE_CACHE_SIZE}


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()
        _stats.update(hits=0, misses=0)


def expression_length_error(expression: str) -> str | None:
    """The API server's validation of a selector's length (the scheduler itself compiles any length)."""
    size = len(expression.encode("utf-8"))
    if size > MAX_EXPRESSION_LENGTH:
        return f"expression too long: {size} bytes, may not be more than {MAX_EXPRESSION_LENGTH}"
    return None


@cache
def _environment(features: Features) -> CheckEnv:
    return dra_env(features.list_values, EXT_DECLS, minor=features.minor)


def build_environment() -> None:
    """Build the checking environment of the active gates now (tens of milliseconds), not at the first compile."""
    _environment(active())


def _compile(expression: str, features: Features) -> Selector | CelCompileError:
    try:
        return build(expression, features, _environment(features))[0]
    except CelCompileError as err:
        return err.with_traceback(None)  # cached: must not keep the compile's frames alive


def _results(features: Features, env: CheckEnv) -> tuple[T, ...]:
    """The result types compile.go accepts: bool and the environment's attribute type, by cel-go's IsExactType in
    1.37 (which a bool wrapper passes: its kind and name are bool's); 1.36 compared types by identity, and also took
    `any` where attributes are `dyn`."""
    attribute = env.fields[DEVICE.kind]["attributes"].param(1).param(1)
    if features.minor >= 37:
        return BOOL, attribute, T("wrapper", (BOOL,))
    return BOOL, ANY, attribute


def build(expression: str, features: Features, env: CheckEnv) -> tuple[Selector, ast.Node, Checker]:
    """Parse, check in `env`, validate and compile, as compile.go's CompileCELExpression does; also returns the
    checked tree (for the cost estimator). Raises `CelCompileError` with Kubernetes' message."""
    try:
        tree = parse(expression, escaped_fields=features.minor >= 37)
        result_type, checker = check(tree, expression, env)
    except CelCompileError as err:
        raise CelCompileError(f"compilation failed: {err}") from None
    except RecursionError:
        raise CelCompileError("compilation failed: expression nesting exceeds the supported depth") from None
    if result_type not in _results(features, env):
        raise CelCompileError(f"must evaluate to bool or the unknown type, not {result_type}")
    failure = instantiation_error(tree, checker.references)
    if failure is not None:
        raise CelCompileError(f"program instantiation failed: {failure}")
    try:
        fn = Compiler(checker).compile(tree)
    except RecursionError:
        raise CelCompileError("compilation failed: expression nesting exceeds the supported depth") from None
    return Selector(expression, fn, plan_keys(tree)), tree, checker
