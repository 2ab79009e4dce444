"""The CEL syntax tree.  Operators are `Call`s named like cel-go's (`_+_`, `!_`, `_?_:_`) to share dispatch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Node:
    pos: int


@dataclass(frozen=True, slots=True)
class Const(Node):
    value: Any


@dataclass(frozen=True, slots=True)
class Ident(Node):
    name: str


@dataclass(frozen=True, slots=True)
class Select(Node):
    operand: Node
    field: str
    optional: bool = False  # `a.?b`


@dataclass(frozen=True, slots=True)
class Index(Node):
    operand: Node
    index: Node
    optional: bool = False  # `a[?b]`


@dataclass(frozen=True, slots=True)
class Call(Node):
    function: str
    args: tuple[Node, ...]
    target: Node | None = None  # receiver of `target.function(args)`


@dataclass(frozen=True, slots=True)
class ListLit(Node):
    elements: tuple[Node, ...]
    optional: tuple[bool, ...]  # `[?x]` entries are skipped when x is none


@dataclass(frozen=True, slots=True)
class MapLit(Node):
    entries: tuple[tuple[Node, Node, bool], ...]  # key, value, optional (`{?k: v}`)


@dataclass(frozen=True, slots=True)
class Field(Node):
    """One initializer of a message literal, at its colon (cel-go's position for the field's errors)."""

    name: str
    value: Node
    optional: bool = False  # `{?name: v}`


@dataclass(frozen=True, slots=True)
class Struct(Node):
    """A message literal `google.protobuf.Duration{seconds: 5}` (at its brace); the name as written, dots joined."""

    type_name: str
    fields: tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class Has(Node):
    select: Select


@dataclass(frozen=True, slots=True)
class Comprehension(Node):
    """A macro over a list or map: all, exists, exists_one, map, filter (one or two iteration variables)."""

    macro: str
    target: Node
    var: str
    var2: str | None
    body: Node
    transform: Node | None = None  # `map(x, filter, transform)` / `transformList(i, v, filter, transform)`
    filtered: bool = True  # False for a transform macro given no filter: `body` is then a stand-in `true`


@dataclass(frozen=True, slots=True)
class Bind(Node):
    var: str
    init: Node
    body: Node


def children(n: Node) -> list[Node]:
    if isinstance(n, Select):
        return [n.operand]
    if isinstance(n, Index):
        return [n.operand, n.index]
    if isinstance(n, Call):
        return [*([n.target] if n.target is not None else []), *n.args]
    if isinstance(n, ListLit):
        return list(n.elements)
    if isinstance(n, MapLit):
        return [x for k, v, _ in n.entries for x in (k, v)]
    if isinstance(n, Struct):
        return [f.value for f in n.fields]
    if isinstance(n, Has):
        return [n.select.operand]
    if isinstance(n, Comprehension):
        return [n.target, n.body, *([n.transform] if n.transform is not None else [])]
    if isinstance(n, Bind):
        return [n.init, n.body]
    return []


def walk(node: Node) -> list[Node]:
    """Every node, parents before children."""
    out: list[Node] = []
    stack = [node]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(reversed(children(n)))
    return out
