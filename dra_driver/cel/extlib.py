"""Wires the value libraries of `dra_driver.cel.ext` (IP/CIDR, URL, time, named formats) into the environment.

Their overload tables give both halves: typed declarations for the checker (`EXT_DECLS`) and runtime dispatch,
merged into `library.REGISTRY` in front of any core overload with the same name and arity (`string(x)`, `_+_`...),
chosen by the runtime argument types as cel-go's dispatcher does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, Final

from dra_driver.cel import ext
from dra_driver.cel.cost import Activation
from dra_driver.cel.decls import Decl, make_decl
from dra_driver.cel.errors import EvalError
from dra_driver.cel.library import REGISTRY, Overload, no_overload
from dra_driver.cel.types import T
from dra_driver.cel.values import NONE, Optional, type_name

EXT_DECLS: Final[tuple[Decl, ...]] = tuple(
    make_decl(o.function, o.member, ", ".join(o.params), o.result, o.overload_id) for o in ext.OVERLOADS
)


_EXT_TYPES: Final = tuple(ext.TYPE_NAMES)


def _optional(impl: Callable[..., object]) -> Callable[..., object]:
    """An ext overload declared to return `optional(...)` returns None or the value: made a CEL optional here."""

    def wrapped(*args: object) -> object:
        result = impl(*args)
        return NONE if result is None else Optional(True, result)

    return wrapped


_OVERLOADS: Final = tuple(
    replace(o, impl=_optional(o.impl)) if o.result.startswith("optional(") else o for o in ext.OVERLOADS
)
# Functions whose every overload is an ext one: a call none of them takes fails as cel-go's dispatcher says.
_EXT_ONLY: Final = frozenset(o.function for o in ext.FORMAT_OVERLOADS)


def _dispatcher(name: str, member: bool, core: Callable[..., Any] | None) -> Callable[..., Any]:
    candidates = tuple(o for o in _OVERLOADS if o.function == name and o.member == member)

    def impl(act: Activation, *args: Any) -> Any:
        if core is not None and not any(isinstance(arg, _EXT_TYPES) for arg in args):
            return core(act, *args)  # the hot path: a core overload on core values (`a >= b` on ints)
        overload = ext.resolve(candidates, name, member, args, ext.TYPE_NAMES)
        if overload is not None:
            try:
                return overload.impl(*args)
            except ext.ExtError as err:
                raise EvalError(err.message) from None
        if core is not None:
            return core(act, *args)
        if name in _EXT_ONLY:
            raise EvalError(f"no such overload: {name}({', '.join(type_name(arg) for arg in args)})")
        raise no_overload(name, *args)

    return impl


def _register() -> None:
    keys = {(o.function, o.member, len(o.params)) for o in ext.OVERLOADS}
    for name, member, nargs in sorted(keys):
        core = REGISTRY.get((name, member, nargs))
        REGISTRY[(name, member, nargs)] = Overload(_dispatcher(name, member, core.impl if core else None), T("dyn"))


_register()
