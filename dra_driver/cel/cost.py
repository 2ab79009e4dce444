"""Runtime cost accounting, modelled on cel-go's actual-cost tracker (interpreter/runtimecost.go).

What is charged (cel-go's constants in brackets):
  * 1 per identifier, field selection, index, `has()` test and function/operator call [SelectAndIdentCost, 1/call];
    constants and `&&`/`||`/`?:` themselves are free, their operands are charged as they are evaluated;
  * 10 per list literal, 30 per map literal [ListCreateBaseCost, MapCreateBaseCost];
  * string/bytes/list traversing functions add ceil(0.1 x size) [StringTraversalCostFactor]: comparisons, `+`,
    contains/startsWith/endsWith, lowerAscii/upperAscii/trim/split/join/replace/indexOf, `in` on lists, sort...;
    regex functions add ceil(0.25 x length of the subject) [RegexStringLengthCostFactor];
  * each comprehension iteration adds 1 for the loop step, on top of the cost of the body it evaluates.
The total is checked against the limit on every charge, so nested comprehensions over large lists or repeated
string doubling stop as soon as they pass CELSelectorExpressionMaxCost, with cel-go's message.
"""

from __future__ import annotations

from typing import Any, Final

from dra_driver.cel.errors import CostLimitExceeded

MAX_COST: Final = 1_000_000  # resourceapi.CELSelectorExpressionMaxCost
LIST_CREATE: Final = 10
MAP_CREATE: Final = 30
# Per-element cost of cel-go's macro expansions as its runtime tracker sees them (reading `accu` costs 1, a call 1,
# a list literal 10): all/exists run `@not_strictly_false(accu)` then `accu && pred`; map/filter append with
# `accu + [x]`; transformMap inserts with `cel.@mapInsert(accu, k, v)`.
QUANTIFIER_STEP: Final = 3
APPEND_STEP: Final = 12
INSERT_STEP: Final = 3
SKIP_STEP: Final = 0  # the ternary's untaken `accu` branch is not charged


def self_compare(items: list[Any]) -> int:
    """ext.Lists' cost of sort/distinct/sortBy (trackListSelfCompare): 2 per pair, 2.1 for strings or bytes,
    plus the call and the new list (the interpreter charges the call)."""
    factor = 2.1 if items and isinstance(items[0], str | bytes) else 2.0
    return int(len(items) * len(items) * factor) + LIST_CREATE


class Activation:
    """Variables in scope plus the running cost of one evaluation."""

    __slots__ = ("cost", "limit", "vars")

    def __init__(self, variables: dict[str, Any], limit: int = MAX_COST) -> None:
        self.vars = variables
        self.cost = 0
        self.limit = limit

    def charge(self, amount: int) -> None:
        self.cost += amount
        if self.cost > self.limit:
            raise CostLimitExceeded()


def traversal(size: int) -> int:
    """ceil(0.1 x size), cel-go's StringTraversalCostFactor."""
    return (size + 9) // 10


def regex(size: int) -> int:
    """ceil(0.25 x size), cel-go's RegexStringLengthCostFactor."""
    return (size + 3) // 4


def size_of(value: Any) -> int:
    if isinstance(value, str | bytes | list | dict):
        return len(value)
    return 1
