"""cel-go's type assignability and unification (checker/types.go), over `types.T`.

Type parameters are `T` whose kind starts with `?` (`?A`, fresh ones `?_var3`); a substitution mapping binds them.
`any` (google.protobuf.Any, the DRA attribute type) behaves like `dyn` for assignability but is a distinct type:
it cannot be iterated, and it is what the homogeneous-literal validator reports.
"""

from __future__ import annotations

from typing import Final

from dra_driver.cel.types import DYN, T

ANY: Final = T("any")
ERROR: Final = T("*error*")
TIMESTAMP: Final = T("google.protobuf.Timestamp")
DURATION: Final = T("google.protobuf.Duration")
_PRIMITIVES: Final = frozenset({"bool", "int", "uint", "double", "string", "bytes", TIMESTAMP.kind, DURATION.kind})
_STRUCTS: Final = frozenset({"kubernetes.DRADevice", "google.protobuf.Empty"})
_LEGACY_NULLABLE: Final = frozenset({"opaque", "struct", "any"})

Mapping = dict[str, T]


def wrapper_of(prim: T) -> T:
    """A protobuf wrapper type (`google.protobuf.Int64Value`): the primitive, or null."""
    return T("wrapper", (prim,))


def _unwrap(t: T) -> T:
    return t.params[0] if t.kind == "wrapper" else t


def kind(t: T) -> str:
    k = t.kind
    if k in ("dyn", "any", "list", "map", "type"):
        return k
    if k.startswith("?"):
        return "param"
    if k in _PRIMITIVES or k == "wrapper":
        return "prim"
    if k == "null_type":
        return "null"
    if k == ERROR.kind:
        return "error"
    return "struct" if k in _STRUCTS else "opaque"


def param(name: str) -> T:
    return T(f"?{name}")


def is_dyn(t: T) -> bool:
    return t.kind in ("dyn", "any")


def is_dyn_or_error(t: T) -> bool:
    return t.kind in ("dyn", "any", ERROR.kind)


def is_optional(t: T) -> bool:
    return t.kind == "optional_type"


def type_name(t: T) -> str:
    """`Type.TypeName()`: the runtime name, without parameters."""
    return {"any": "google.protobuf.Any"}.get(t.kind, t.kind)


def _less_specific(t1: T, t2: T) -> bool:
    k1, k2 = kind(t1), kind(t2)
    if is_dyn(t1) or k1 == "param":
        return True
    if is_dyn(t2) or k2 == "param":
        return False
    if k1 != k2:
        return False
    if k1 in ("opaque", "list", "map"):
        return (
            t1.kind == t2.kind
            and len(t1.params) == len(t2.params)
            and all(_less_specific(a, b) for a, b in zip(t1.params, t2.params, strict=True))
        )
    if k1 == "type":
        return True
    return t1 == t2


def most_general(t1: T, t2: T) -> T:
    return t1 if _less_specific(t1, t2) else t2


def _not_referenced_in(m: Mapping, t: T, within: T) -> bool:
    if t == within:
        return False
    kw = kind(within)
    if kw == "param":
        sub = m.get(within.kind)
        return True if sub is None else _not_referenced_in(m, t, sub)
    return all(_not_referenced_in(m, t, p) for p in within.params)


def _valid_substitution(m: Mapping, t1: T, t2: T) -> tuple[bool, bool]:
    if t1 == t2:
        return True, True
    sub = m.get(t2.kind)
    if sub is not None:
        if t1 == sub:
            return True, True
        if _assignable(m, t1, sub):
            new = most_general(t1, sub)
            if _not_referenced_in(m, t2, new):
                m[t2.kind] = new
            return True, True
        return False, True
    if _not_referenced_in(m, t2, t1):
        m[t2.kind] = t1
        return True, False
    return False, False


def _nullable(t: T) -> bool:
    return kind(t) in _LEGACY_NULLABLE or t.kind in (TIMESTAMP.kind, DURATION.kind, "null_type", "dyn", "wrapper")


def _assignable(m: Mapping, t1: T, t2: T) -> bool:
    k1, k2 = kind(t1), kind(t2)
    if k2 == "param":
        valid, has_sub = _valid_substitution(m, t1, t2)
        if valid:
            return True
        if has_sub:
            return False
    if k1 == "param":
        return _valid_substitution(m, t2, t1)[0]
    if is_dyn_or_error(t1) or is_dyn_or_error(t2):
        return True
    if k1 == "null":
        return _nullable(t2)
    if k2 == "null":
        return _nullable(t1)
    if k1 == "prim":  # a wrapper is its primitive's kind and name (cel-go's Type.defaultIsAssignableType)
        return _unwrap(t1) == _unwrap(t2)
    if k1 in ("struct", "any"):
        return t1 == t2
    if k1 == "type":
        return k2 == "type"
    if k1 in ("opaque", "list", "map"):
        return t1.kind == t2.kind and _assignable_list(m, t1.params, t2.params)
    return False


def _assignable_list(m: Mapping, l1: tuple[T, ...] | list[T], l2: tuple[T, ...] | list[T]) -> bool:
    return len(l1) == len(l2) and all(_assignable(m, a, b) for a, b in zip(l1, l2, strict=True))


def assignable(m: Mapping, t1: T, t2: T) -> Mapping | None:
    """The extended mapping when `t1` is assignable to `t2`, else None (the mapping is left untouched)."""
    copy = dict(m)
    return copy if _assignable(copy, t1, t2) else None


def assignable_list(m: Mapping, l1: list[T], l2: list[T]) -> Mapping | None:
    copy = dict(m)
    return copy if _assignable_list(copy, l1, l2) else None


def substitute(m: Mapping, t: T, to_dyn: bool) -> T:
    if kind(t) == "param":
        sub = m.get(t.kind)
        if sub is not None:
            return substitute(m, sub, to_dyn)
        return DYN if to_dyn else t
    if t.params:
        return T(t.kind, tuple(substitute(m, p, to_dyn) for p in t.params))
    return t


def type_params(t: T) -> set[str]:
    found = {t.kind} if kind(t) == "param" else set()
    for p in t.params:
        found |= type_params(p)
    return found
