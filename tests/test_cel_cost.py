"""Runtime cost, as cel-go's tracker and Kubernetes' estimator charge it: each figure below is the cost
Kubernetes 1.36.3 reported for the same expression (tools/celeval; 1.37.2 gives the same unless said), so the limit
cuts at the same place."""

from __future__ import annotations

import pytest

from dra_driver.cel import (
    KUBERNETES_1_37,
    CelDevice,
    CelRuntimeError,
    Features,
    compile_selector,
    configure,
    estimate_cost,
)

DEVICE = CelDevice(driver="gpu.example.com", attributes={"productName": {"string": "NVIDIA H100"}})


@pytest.mark.parametrize(
    ("expression", "kubernetes_cost"),
    [
        ("1 == 1", 1),
        ('device.driver == "x"', 3),
        ("[1, 2] == [1, 2]", 1),  # constant literals are prebuilt
        ("2 in [1, 2, 3]", 0),  # set membership on a constant list
        ("[1, 2, 3].all(x, x > 0)", 16),
        ("[1, 2, 3].exists(x, x > 5)", 19),
        ("[1, 2, 3].exists_one(x, x > 2)", 10),
        ("[1, 2, 3].map(x, x * 2).size() == 3", 45),
        ("[1, 2, 3, 4].filter(x, x > 1).size() == 3", 50),
        ("[1, 2, 3, 4].filter(x, x > 10).size() == 0", 11),
        ('{"a": 1, "b": 2}.transformMap(k, v, v > 1, v + 1).size() == 1', 12),
        ("[3, 1, 2].sortBy(x, x).size() == 3", 73),
        ("lists.range(10).distinct().size() == 10", 234),
        ("[[1], [2]].flatten().size() == 2", 15),
        ("sets.equivalent(lists.range(700), lists.range(700))", 981423),
        ("lists.range(290).all(i, lists.range(290).all(j, i + j >= 0))", 677452),
        ("lists.range(100).map(i, lists.range(100).filter(j, j > i).size()).size() > 0", 106964),
        ("lists.range(500).map(x, string(x)).sort().size() > 0", 532525),
        ("lists.range(999987).size() > 0", 1000000),
    ],
)
def test_cost_matches_kubernetes(expression: str, kubernetes_cost: int) -> None:
    selector = compile_selector(expression)
    selector.evaluate(DEVICE)
    assert selector.last_cost == kubernetes_cost


@pytest.mark.parametrize(
    "expression",
    [
        "lists.range(999988).size() > 0",
        "lists.range(707).distinct().size() > 0",
        "sets.contains(lists.range(999), lists.range(999))",
    ],
)
def test_one_past_the_limit_is_cancelled(expression: str) -> None:
    with pytest.raises(CelRuntimeError, match="actual cost limit exceeded"):
        compile_selector(expression).evaluate(DEVICE)


LISTS = CelDevice(
    driver="gpu.example.com", attributes={"productName": {"string": "NVIDIA H100"}, "peers": {"ints": [1, 2, 3]}}
)


@pytest.mark.parametrize(
    ("expression", "cost_1_37", "estimate_1_37", "cost_1_36", "estimate_1_36"),
    [
        # cel-go 0.29 traverses the prefix, no longer the string (its estimate always did)
        ('device.attributes["gpu.example.com"].productName.startsWith("NV")', 5, 5, 6, 5),
        # cel-go 0.29 prices the global matches() like the member one (1 before)
        ('matches(device.attributes["gpu.example.com"].productName, "H1+")', 6, 11, 5, 5),
        # includes() is the lists library's since 1.37: a traversal of the list, estimated on the attribute's size
        ('device.attributes["gpu.example.com"].peers.includes(3)', 7, 68, 5, 52),
    ],
)
def test_costs_that_1_37_changed(
    expression: str, cost_1_37: int, estimate_1_37: int, cost_1_36: int, estimate_1_36: int
) -> None:
    """Figures of tools/celeval at v0.37.2 and v0.36.3 (DRAListTypeAttributes on, so 1.36 reads the list too)."""
    for release, cost, estimate in ((37, cost_1_37, estimate_1_37), (36, cost_1_36, estimate_1_36)):
        features = Features(list_type_attributes=True, minor=release)
        configure(features)
        try:
            selector = compile_selector(expression)
            assert selector.evaluate(LISTS) is True
            assert (selector.last_cost, estimate_cost(expression, features).max) == (cost, estimate), release
        finally:
            configure(KUBERNETES_1_37)
