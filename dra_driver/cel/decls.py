"""Typed overload declarations of the Kubernetes 1.36 DRA CEL environment, as cel-go and Kubernetes declare them.

The checker resolves calls against these; the runtime implementations live in `library.py` keyed by
(name, member, arity), and `tests/test_cel_checker.py` asserts every declaration has one. Single capital letters in
a signature are type parameters (`list(A)`), as in cel-go's `TypeParamType("A")`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Final

from dra_driver.cel.types import T
from dra_driver.cel.typesys import param, type_params


@dataclass(frozen=True, slots=True)
class Decl:
    name: str
    member: bool
    params: tuple[T, ...]
    result: T
    type_params: frozenset[str]
    overload_id: str = ""  # cel-go's overload id: the estimated and the runtime cost key some costs on it


_TOKEN: Final = re.compile(r"\s*([\w.]+|[(),])")


def parse_type(text: str) -> T:
    """`map(string, list(A))` → T; a single capital letter is a type parameter."""
    tokens = _TOKEN.findall(text)
    pos = 0

    def one() -> T:
        nonlocal pos
        name = tokens[pos]
        pos += 1
        params: list[T] = []
        if pos < len(tokens) and tokens[pos] == "(":
            pos += 1
            while tokens[pos] != ")":
                params.append(one())
                if tokens[pos] == ",":
                    pos += 1
            pos += 1
        if len(name) == 1 and name.isupper():
            return param(name)
        return T(_ALIASES.get(name, name), tuple(params))

    return one()


_ALIASES: Final = {
    "optional": "optional_type",
    "Quantity": "kubernetes.Quantity",
    "Semver": "kubernetes.Semver",
    "timestamp": "google.protobuf.Timestamp",
    "duration": "google.protobuf.Duration",
}

_COMPARABLE: Final = ("int", "uint", "double", "bool", "duration", "timestamp", "string", "bytes")
_ORDER_PAIRS: Final = [
    "bool,bool",
    "int,int",
    "int,uint",
    "int,double",
    "uint,uint",
    "uint,int",
    "uint,double",
    "double,double",
    "double,int",
    "double,uint",
    "string,string",
    "bytes,bytes",
]

# name, member, "param, param", result (several lines per name are several overloads)
_SPECS: Final[list[tuple[str, bool, str, str]]] = [
    ("_?_:_", False, "bool, A, A", "A"),
    ("!_", False, "bool", "bool"),
    ("-_", False, "int", "int"),
    ("-_", False, "double", "double"),
    ("_==_", False, "A, A", "bool"),
    ("_!=_", False, "A, A", "bool"),
    *[(op, False, pair.replace(",", ", "), "bool") for op in ("_<_", "_<=_", "_>_", "_>=_") for pair in _ORDER_PAIRS],
    *[("_+_", False, f"{t}, {t}", t) for t in ("int", "uint", "double", "string", "bytes", "list(A)")],
    *[(op, False, f"{t}, {t}", t) for op in ("_-_", "_*_", "_/_") for t in ("int", "uint", "double")],
    *[("_%_", False, f"{t}, {t}", t) for t in ("int", "uint")],
    ("_[_]", False, "list(A), int", "A"),
    ("_[_]", False, "map(K, V), K", "V"),
    ("_[_]", False, "optional(list(V)), int", "optional(V)"),
    ("_[_]", False, "optional(map(K, V)), K", "optional(V)"),
    ("_[?_]", False, "list(V), int", "optional(V)"),
    ("_[?_]", False, "optional(list(V)), int", "optional(V)"),
    ("_[?_]", False, "map(K, V), K", "optional(V)"),
    ("_[?_]", False, "optional(map(K, V)), K", "optional(V)"),
    ("@in", False, "A, list(A)", "bool"),
    ("@in", False, "A, map(A, B)", "bool"),
    *[("size", m, t, "int") for m in (False, True) for t in ("string", "bytes", "list(A)", "map(A, B)")],
    *[("int", False, t, "int") for t in ("int", "uint", "double", "string")],
    *[("uint", False, t, "uint") for t in ("int", "uint", "double", "string")],
    *[("double", False, t, "double") for t in ("int", "uint", "double", "string")],
    *[("string", False, t, "string") for t in ("int", "uint", "double", "bool", "string", "bytes")],
    *[("bytes", False, t, "bytes") for t in ("bytes", "string")],
    *[("bool", False, t, "bool") for t in ("bool", "string")],
    ("dyn", False, "A", "dyn"),
    ("type", False, "A", "type(A)"),
    *[(f, True, "string, string", "bool") for f in ("contains", "startsWith", "endsWith", "matches")],
    ("matches", False, "string, string", "bool"),
    # cel.OptionalTypes (latest version)
    ("optional.of", False, "A", "optional(A)"),
    ("optional.ofNonZeroValue", False, "A", "optional(A)"),
    ("optional.none", False, "", "optional(A)"),
    ("value", True, "optional(A)", "A"),
    ("hasValue", True, "optional(A)", "bool"),
    ("or", True, "optional(A), optional(A)", "optional(A)"),
    ("orValue", True, "optional(A), A", "A"),
    ("first", True, "list(A)", "optional(A)"),
    ("last", True, "list(A)", "optional(A)"),
    ("optional.unwrap", False, "list(optional(A))", "list(A)"),
    ("unwrapOpt", True, "list(optional(A))", "list(A)"),
    # ext.Strings(2)
    ("charAt", True, "string, int", "string"),
    *[(f, True, "string, string", "int") for f in ("indexOf", "lastIndexOf")],
    *[(f, True, "string, string, int", "int") for f in ("indexOf", "lastIndexOf")],
    *[(f, True, "string", "string") for f in ("lowerAscii", "upperAscii", "trim")],
    ("replace", True, "string, string, string", "string"),
    ("replace", True, "string, string, string, int", "string"),
    ("split", True, "string, string", "list(string)"),
    ("split", True, "string, string, int", "list(string)"),
    ("substring", True, "string, int", "string"),
    ("substring", True, "string, int, int", "string"),
    ("format", True, "string, list(dyn)", "string"),
    ("strings.quote", False, "string", "string"),
    ("join", True, "list(string)", "string"),
    ("join", True, "list(string), string", "string"),
    # Kubernetes lists library
    *[("isSorted", True, f"list({t})", "bool") for t in _COMPARABLE],
    *[("sum", True, f"list({t})", t) for t in ("int", "uint", "double", "duration")],
    *[(f, True, f"list({t})", t) for f in ("max", "min") for t in _COMPARABLE],
    ("indexOf", True, "list(A), A", "int"),
    ("lastIndexOf", True, "list(A), A", "int"),
    # ext.Lists(3)
    ("slice", True, "list(A), int, int", "list(A)"),
    ("flatten", True, "list(list(A))", "list(A)"),
    ("flatten", True, "list(dyn), int", "list(dyn)"),
    *[("sort", True, f"list({t})", f"list({t})") for t in _COMPARABLE],
    *[("@sortByAssociatedKeys", True, f"list(A), list({t})", "list(A)") for t in _COMPARABLE],
    ("lists.range", False, "int", "list(int)"),
    ("reverse", True, "list(A)", "list(A)"),
    ("distinct", True, "list(A)", "list(A)"),
    # ext.Sets
    *[(f"sets.{f}", False, "list(A), list(A)", "bool") for f in ("contains", "equivalent", "intersects")],
    # Kubernetes regex library
    ("find", True, "string, string", "string"),
    ("findAll", True, "string, string", "list(string)"),
    ("findAll", True, "string, string, int", "list(string)"),
    # Kubernetes semver library (version 1)
    ("semver", False, "string", "Semver"),
    ("semver", False, "string, bool", "Semver"),
    ("isSemver", False, "string", "bool"),
    ("isSemver", False, "string, bool", "bool"),
    *[(f, True, "Semver", "int") for f in ("major", "minor", "patch")],
    # Kubernetes quantity library; `sign` is a global function there, not a member
    ("quantity", False, "string", "Quantity"),
    ("isQuantity", False, "string", "bool"),
    ("sign", False, "Quantity", "int"),
    ("asApproximateFloat", True, "Quantity", "double"),
    ("asInteger", True, "Quantity", "int"),
    ("isInteger", True, "Quantity", "bool"),
    *[(f, True, f"{t}, {t}", "bool") for f in ("isGreaterThan", "isLessThan") for t in ("Semver", "Quantity")],
    *[("compareTo", True, f"{t}, {t}", "int") for t in ("Semver", "Quantity")],
    *[(f, True, f"Quantity, {t}", "Quantity") for f in ("add", "sub") for t in ("Quantity", "int")],
]

# DRA's own (1.36, DRAListTypeAttributes): declared whatever the gate, as Kubernetes compiles selectors in its
# StoredExpressions environment, which ignores feature gates.
_SPECS.append(("includes", True, "dyn, dyn", "bool"))


def make_decl(name: str, member: bool, params: str, result: str, overload_id: str = "") -> Decl:
    ptypes = parse_type(f"f({params})").params if params else ()
    rtype = parse_type(result)
    names: set[str] = set()
    for t in (*ptypes, rtype):
        names |= type_params(t)
    return Decl(name, member, ptypes, rtype, frozenset(names), overload_id or _overload_id(name, member, ptypes))


# cel-go's ids of the overloads whose cost depends on the id (checker/cost.go, interpreter/runtimecost.go,
# ext/lists.go, ext/sets.go, compile.go); any other overload gets a made-up id, as only its being distinct matters.
_RELATION_IDS: Final = {"_<_": "less", "_<=_": "less_equals", "_>_": "greater", "_>=_": "greater_equals"}
_MEMBER_STRING_IDS: Final = {
    "contains": "contains_string",
    "startsWith": "starts_with_string",
    "endsWith": "ends_with_string",
    "matches": "matches_string",
}
_FIXED_IDS: Final = {
    "_==_": "equals",
    "_!=_": "not_equals",
    "_?_:_": "conditional",
    "!_": "logical_not",
    "strings.quote": "strings_quote",
    "format": "string_format",
    "slice": "list_slice",
    "lists.range": "lists_range",
    "reverse": "list_reverse",
    "distinct": "list_distinct",
    "sets.contains": "list_sets_contains_list",
    "sets.intersects": "list_sets_intersects_list",
    "sets.equivalent": "list_sets_equivalent_list",
    "includes": "dra_includes_dyn_dyn",
}


def _overload_id(name: str, member: bool, params: tuple[T, ...]) -> str:
    shown = ",".join(map(str, params))
    if name in _RELATION_IDS and shown in ("string,string", "bytes,bytes"):
        return f"{_RELATION_IDS[name]}_{params[0]}"
    if name == "_+_" and shown in ("string,string", "bytes,bytes"):
        return f"add_{params[0]}"
    if name == "_+_" and params[0].kind == "list":
        return "add_list"
    if name == "_[_]" and params[0].kind in ("list", "map"):
        return f"index_{params[0].kind}"
    if name == "@in" and params[1].kind == "list":
        return "in_list"
    if (name, shown) in (("bytes", "string"), ("string", "bytes")):
        return f"{shown}_to_{name}"
    if member and name in _MEMBER_STRING_IDS:
        return _MEMBER_STRING_IDS[name]
    if name == "matches":
        return "matches"
    if name == "flatten":
        return "list_flatten" if len(params) == 1 else "list_flatten_int"
    if name in ("sort", "@sortByAssociatedKeys"):  # one per comparable element type (of the sort keys for sortBy)
        return f"list_{params[-1].param(0).kind}_{name.lstrip('@')}"
    if name in _FIXED_IDS:
        return _FIXED_IDS[name]
    return f"{name}/{'member' if member else 'global'}/{shown}"


@cache
def declarations(extra: tuple[Decl, ...] = ()) -> dict[str, tuple[Decl, ...]]:
    """Function name → its overloads, in declaration order."""
    table: dict[str, list[Decl]] = {}
    for decl in [make_decl(*spec) for spec in _SPECS] + list(extra):
        table.setdefault(decl.name, []).append(decl)
    return {name: tuple(decls) for name, decls in table.items()}
