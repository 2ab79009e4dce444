"""Static CEL types for the checker, printed the way cel-go prints them (`list(int)`, `map(string, dyn)`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class T:
    kind: str
    params: tuple[T, ...] = ()

    def __str__(self) -> str:
        if not self.params:
            return self.kind
        return f"{self.kind}({', '.join(str(p) for p in self.params)})"

    def param(self, index: int) -> T:
        """A type parameter (list element, map value...), dyn when unknown."""
        return self.params[index] if len(self.params) > index else DYN


DYN: Final = T("dyn")
BOOL: Final = T("bool")
INT: Final = T("int")
UINT: Final = T("uint")
DOUBLE: Final = T("double")
STRING: Final = T("string")
BYTES: Final = T("bytes")
NULL: Final = T("null_type")
TYPE: Final = T("type")
QUANTITY: Final = T("kubernetes.Quantity")
SEMVER: Final = T("kubernetes.Semver")
DEVICE: Final = T("kubernetes.DRADevice")
LIST_DYN: Final = T("list", (DYN,))
LIST_STRING: Final = T("list", (STRING,))
LIST_INT: Final = T("list", (INT,))
NUMERIC: Final = frozenset({INT, UINT, DOUBLE})


def list_of(elem: T) -> T:
    return T("list", (elem,))


def map_of(key: T, value: T) -> T:
    return T("map", (key, value))


def optional_of(elem: T) -> T:
    return T("optional_type", (elem,))


# The DRADevice object type of compile.go: attribute values are dyn, capacities are Quantity.
DEVICE_FIELDS: Final = {
    "driver": STRING,
    "attributes": map_of(STRING, map_of(STRING, DYN)),
    "capacity": map_of(STRING, map_of(STRING, QUANTITY)),
    "allowMultipleAllocations": BOOL,
}
