"""The feature gates that shape Kubernetes' DRA CEL environment (tools/celeval's flags), defaulting to 1.36's.

A process serves one cluster, so the gates are process-wide: call `configure()` at start-up, before devices are
converted (a `CelDevice` caches its conversion). Compiled selectors are cached per gate set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Features:
    # DRAConsumableCapacity (beta, on in 1.36): kept for celeval parity; selectors see allowMultipleAllocations
    # either way, as Kubernetes compiles them in its StoredExpressions environment, which ignores gates.
    consumable_capacity: bool = True
    list_type_attributes: bool = False  # DRAListTypeAttributes (alpha, off in 1.36): list attributes, includes()


KUBERNETES_1_36: Final = Features()
_active: list[Features] = [KUBERNETES_1_36]


def configure(features: Features) -> None:
    _active[0] = features


def active() -> Features:
    return _active[0]
