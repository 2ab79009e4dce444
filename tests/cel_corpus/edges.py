"""Hand-written selectors at the edges where an interpreter most easily parts from cel-go, one category per class:
a name bound again over itself, numbers at the limits of exact representation, `has()` on what has no fields,
conversions and formatting as Go prints them, type names, and the checks cel-go makes before evaluating.

Nothing here says what a result is: `tools/celeval` does. The cases run on one device; they do not read it.
"""

from __future__ import annotations

from typing import Final

# `cel.bind` and comprehension variables that shadow the same name: the inner value reads the outer one.
BIND: Final[tuple[str, ...]] = (
    "cel.bind(x, 1, cel.bind(x, x + 1, x == 2))",
    "cel.bind(x, [1, 2], cel.bind(x, x.size(), x == 2))",
    "cel.bind(x, 1, cel.bind(x, x, x == 1))",
    'cel.bind(x, "a", cel.bind(x, x + "b", cel.bind(x, x + "c", x == "abc")))',
    "cel.bind(x, 1, cel.bind(x, x + 1, x) + x) == 3",
    "cel.bind(x, 1, cel.bind(x, 1 / 0, true))",
    "cel.bind(x, 1, cel.bind(x, x / 0, x == 1))",
    "cel.bind(x, 1, cel.bind(y, x, cel.bind(x, y + 1, x + y == 3)))",
    "[1, 2].all(x, cel.bind(x, x * 2, x > 1))",
    '{"a": 1}.all(k, v, cel.bind(v, v + 1, v == 2))',
    "[1, 2].transformList(i, v, cel.bind(v, v + i, v)) == [1, 3]",
    "[1, 2].exists_one(x, cel.bind(x, x - 1, x == 0))",
    "[1, 2].map(x, cel.bind(x, [x, x], x.size())) == [2, 2]",
    "cel.bind(x, 1, optional.of(x).optMap(x, x + 1).value() == 2)",
    "cel.bind(x, optional.of(2), x.optMap(x, x * 2).value() == 4)",
    "cel.bind(x, 5, [1, 2].exists(x, x == 2) && x == 5)",
    "cel.bind(x, [1], x.all(x, x == 1))",
    "[[1], [2]].all(x, x.all(x, x > 0))",
    "[1].map(x, [2].map(x, x)) == [[2]]",
    "[1, 2].filter(x, [x].exists(x, x == 2)) == [2]",
    "[1, 2].map(x, cel.bind(y, x, [y].map(x, x + y))) == [[2], [4]]",
    "cel.bind(x, 1, [x].map(x, x + 1)) == [2]",
)

CLASSES: Final[dict[str, tuple[str, ...]]] = {
    "edge-bind": BIND,
}


def cases() -> list[tuple[str, str, tuple[str, ...]]]:
    """(category, expression, device names): one device, which none of them reads."""
    return [(category, e, ("h100",)) for category, expressions in CLASSES.items() for e in expressions]
