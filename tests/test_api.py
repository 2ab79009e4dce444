"""dra_driver.api: quantities."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dra_driver.api.quantity import binary_quantity, format_quantity


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
