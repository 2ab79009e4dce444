"""dra_driver.api: the resource.k8s.io models as every part of the driver reads and writes them, and quantities."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dra_driver.api.claim import ResourceClaim
from dra_driver.api.meta import ObjectMeta
from dra_driver.api.quantity import binary_quantity, format_quantity


def test_a_claim_of_a_newer_api_is_read() -> None:
    """Unknown fields are ignored and enums are strings: the plugin must not refuse a claim it prepares for a field
    it does not read (the allocator refuses what it does not know: tests/test_alloc_allocator.py)."""
    exactly = {
        "deviceClassName": "gpu",
        "allocationMode": "Some",
        "tolerations": [{"key": "k", "operator": "Gt", "value": "1"}],
        "newField": {"a": 1},
    }
    c = ResourceClaim.model_validate(
        {
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}},
        }
    )
    assert c.request_class_and_selectors("r") == ("gpu", [])
    assert c.key == "ns/c" and c.status.allocation is None


def test_object_meta_omits_empty_strings_as_go_does() -> None:
    meta = ObjectMeta.model_validate({"name": "n", "namespace": "", "uid": "", "labels": {"a": "b"}})
    assert meta.model_dump(by_alias=True, exclude_none=True) == {"name": "n", "labels": {"a": "b"}}


@pytest.mark.parametrize(
    ("n", "q"),
    [(0, "0"), (1023, "1023"), (1024, "1Ki"), (81559 << 20, "81559Mi"), (140 << 30, "140Gi"), (1536, "1536")],
)
def test_binary_quantity(n: int, q: str) -> None:
    assert binary_quantity(n) == q


def test_format_quantity_of_computed_amounts() -> None:
    assert format_quantity(Fraction(3 << 30)) == "3Gi"
    assert format_quantity(Fraction(3, 2)) == "1500m"
    assert format_quantity(Fraction(1, 3)) == str(1 / 3)
    with pytest.raises(ValueError, match="negative quantity -1"):
        binary_quantity(-1)
