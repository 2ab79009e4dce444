"""Runtime cost accounting: the running total of one evaluation, checked against the limit.

What is charged is cel-go's actual cost as Kubernetes configures it (interpreter/runtimecost.go): see the
interpreter's docstring for attributes, conditionals and macros, and `callcost` for function calls. The constants
here are cel-go's [common/cost.go]. `Activation.charge` checks the total against the limit, so nested
comprehensions over large lists or repeated string doubling stop as soon as they pass CELSelectorExpressionMaxCost,
with cel-go's message; the hot unit charges of attributes and plain calls only add (the program checks the total
once more at the end), so the cost reported at a cut can be a few units past cel-go's.
"""

from __future__ import annotations

from typing import Any, Final

from dra_driver.cel.errors import CostLimitExceeded

MAX_COST: Final = 1_000_000  # resourceapi.CELSelectorExpressionMaxCost
LIST_CREATE: Final = 10
MAP_CREATE: Final = 30
STRUCT_CREATE: Final = 40  # a message literal
# `accu + [x]`, the step of map/filter/transformList as cel-go's tracker sees it: reading `accu` (1), the new list
# (10) and the call (1).
APPEND_STEP: Final = 1 + LIST_CREATE + 1


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
