"""Wires the value libraries of `dra_driver.cel.ext` (IP/CIDR, URL, timestamps/durations) into the environment.

Their overload tables give both halves: typed declarations for the checker (`EXT_DECLS`) and runtime dispatch,
merged into `library.REGISTRY` in front of any core overload with the same name and arity (`string(x)`, `_+_`...),
chosen by the runtime argument types as cel-go's dispatcher does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_driver.cel import ext
from dra_driver.cel.cost import Activation
from dra_driver.cel.decls import Decl, make_decl
from dra_driver.cel.errors import EvalError
from dra_driver.cel.library import REGISTRY, Overload, no_overload
from dra_driver.cel.types import T

EXT_DECLS: Final[tuple[Decl, ...]] = tuple(
    make_decl(o.function, o.member, ", ".join(o.params), o.result, o.overload_id) for o in ext.OVERLOADS
)


_EXT_TYPES: Final = tuple(ext.TYPE_NAMES)


def _dispatcher(name: str, member: bool, core: Callable[..., Any] | None) -> Callable[..., Any]:
    candidates = tuple(o for o in ext.OVERLOADS if o.function == name and o.member == member)

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
        raise no_overload(name, *args)

    return impl


def _register() -> None:
    keys = {(o.function, o.member, len(o.params)) for o in ext.OVERLOADS}
    for name, member, nargs in sorted(keys):
        core = REGISTRY.get((name, member, nargs))
        REGISTRY[(name, member, nargs)] = Overload(_dispatcher(name, member, core.impl if core else None), T("dyn"))


_register()
