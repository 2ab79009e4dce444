"""The feature gates and Kubernetes release that shape Kubernetes' DRA CEL environment and structured allocator
(tools/celeval's and tools/allocbench's flags), defaulting to 1.37's.

A process serves one cluster, so the gates are process-wide: call `configure()` at start-up, before devices are
converted (a `CelDevice` caches its conversion). Compiled selectors are cached per gate set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Features:
    # DRAConsumableCapacity (beta, on in 1.36 and 1.37): kept for celeval parity; selectors see
    # allowMultipleAllocations either way, as Kubernetes compiles them in its StoredExpressions environment, which
    # ignores gates.
    consumable_capacity: bool = True
    list_type_attributes: bool = False  # DRAListTypeAttributes (alpha, off in 1.36 and 1.37): list attributes
    # The minor release whose ungated behaviour to follow where 1.37 changed it (a 1.36 cluster's scheduler still
    # behaves the old way): the allocator's `All` capacity check, DeviceTaintRules without a device selector, the
    # scheduler's list attributes (`list_values`).
    minor: int = 37

    @property
    def list_values(self) -> bool:
        """Whether the scheduler reads list attributes as lists, and types attribute values `dyn`: with
        DRAListTypeAttributes, and whatever the gate since 1.37 (compile.go converts every list, and its
        StoredExpressions environment keeps the last device declaration, the list-typed one)."""
        return self.list_type_attributes or self.minor >= 37


KUBERNETES_1_37: Final = Features()
KUBERNETES_1_36: Final = Features(minor=36)
RELEASES: Final = {"1.37": KUBERNETES_1_37, "1.36": KUBERNETES_1_36}
_active: list[Features] = [KUBERNETES_1_37]


def configure(features: Features) -> None:
    _active[0] = features


def active() -> Features:
    return _active[0]
