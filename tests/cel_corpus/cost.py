"""Selectors for the runtime-cost differential test (tests/test_cel_cost_differential.py): what cel-go's cost tracker
charges differently from a plain count of operations. Macros over `lists.range(n)` and over maps, nested, and their
neighbours, then the other rules: attributes and qualifiers, relative attributes, conditional branches, presence tests
and optional qualifiers, size-dependent function costs, constant folding, calls left without an overload id, failed
arguments.

Kubernetes iterates maps in random order, so a quantifier over a map here never decides before its last entry: its
cost does not depend on the order. Ranges stay well below the size where cel-go's own evaluation of a macro becomes
slow enough for the scheduler's 10 s timeout (its cost tracker makes a long fold quadratic in time: about 4 s for
40,000 elements here). Nothing here says what a cost is: `tools/celeval` does.
"""

from __future__ import annotations

from typing import Final

from tests.cel_corpus.formats import COST as FORMAT_COST

D: Final = 'device.attributes["gpu.dra-driver.dev"]'
C: Final = 'device.capacity["gpu.dra-driver.dev"]'

# The device every case runs on: a few attributes in the driver's domain and another, and two capacities.
DEVICE: Final = {
    "driver": "gpu.dra-driver.dev",
    "attributes": {
        "model": {"string": "H100"},
        "type": {"string": "gpu"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "uuid": {"string": "GPU-6f1c9c5e-2a8e-4a57-b6b4-3d2e9a1f0c11"},
        "cores": {"int": 132},
        "driverVersion": {"version": "550.54.15"},
        "example.com/empty": {"string": ""},
    },
    "capacity": {"memory": {"value": "80Gi"}, "multiprocessors": {"value": "132"}},
}

COST_CASES: Final[list[tuple[str, str]]] = [
    # macros over lists.range(n)
    ("range", "lists.range(10).all(x, x >= 0)"),
    ("range", "lists.range(1000).all(x, x >= 0)"),
    ("range", "lists.range(10000).all(x, x >= 0)"),
    ("range", "lists.range(1000).all(x, x < 500)"),  # decides early: one more loop condition, then stops
    ("range", "lists.range(1000).exists(x, x == 999)"),
    ("range", "lists.range(1000).exists(x, x == 5)"),
    ("range", "lists.range(1000).exists(x, x < 0)"),
    ("range", "lists.range(1000).exists_one(x, x == 5)"),
    ("range", "lists.range(1000).exists_one(x, x < 5)"),
    ("range", "lists.range(1000).map(x, x * 2).size() == 1000"),
    ("range", "lists.range(1000).map(x, x % 2 == 0, x).size() == 500"),
    ("range", "lists.range(1000).map(x, 1).size() == 1000"),  # a constant element: no list built per step
    ("range", "lists.range(1000).filter(x, x % 2 == 0).size() == 500"),
    ("range", "lists.range(1000).all(i, v, i == v)"),
    ("range", "lists.range(1000).exists(i, v, i != v)"),
    ("range", "lists.range(1000).exists_one(i, v, v == 7)"),
    ("range", "lists.range(1000).transformList(i, v, v + i).size() == 1000"),
    ("range", "lists.range(1000).transformList(i, v, v > 10, v).size() == 989"),
    ("range", "lists.range(100).transformMap(i, v, v * 2).size() == 100"),
    ("range", "lists.range(100).transformMapEntry(i, v, {v: i}).size() == 100"),
    ("range", "lists.range(100).sortBy(x, -x)[0] == 99"),
    ("range", "lists.range(100).sortBy(x, 1).size() == 100"),
    ("range", "cel.bind(r, lists.range(500), r.all(x, x >= 0) && r.exists(x, x == 499))"),
    # nested
    ("nested", "lists.range(30).all(x, lists.range(30).all(y, x + y >= 0))"),
    ("nested", "lists.range(30).exists(x, lists.range(30).exists(y, x * y == 841))"),
    ("nested", "lists.range(30).map(x, lists.range(x).size()).sum() == 435"),
    ("nested", "lists.range(30).filter(x, lists.range(x).exists(y, y == 20)).size() == 9"),
    ("nested", "lists.range(200).all(x, lists.range(200).all(y, true))"),
    ("nested", "lists.range(20).map(x, lists.range(20).filter(y, y < x)).all(l, l.size() < 20)"),
    ("nested", "[[1, 2], [3, 4]].all(l, l.all(x, x > 0))"),
    ("nested", "[[1, 2], [3, 4]].exists(l, l.exists(x, x == 4))"),
    ("nested", "lists.range(400).all(x, lists.range(400).exists(y, y == x))"),
    # over maps (no early decision)
    ("maps", '{"a": 1, "b": 2, "c": 3}.all(k, k != "")'),
    ("maps", '{"a": 1, "b": 2, "c": 3}.all(k, k != "z")'),
    ("maps", '{"a": 1, "b": 2, "c": 3}.exists(k, k == "z")'),
    ("maps", '{"a": 1, "b": 2, "c": 3}.exists_one(k, k == "b")'),
    ("maps", '{"a": 1, "b": 2, "c": 3}.map(k, k + k).size() == 3'),
    ("maps", '{"a": 1, "b": 2, "c": 3}.filter(k, k > "a").size() == 2'),
    ("maps", '{"a": 1, "b": 2, "c": 3}.all(k, v, v > 0)'),
    ("maps", '{"a": 1, "b": 2, "c": 3}.exists(k, v, v > 5)'),
    ("maps", '{"a": 1, "b": 2, "c": 3}.exists_one(k, v, v == 2)'),
    ("maps", '{"a": 1, "b": 2, "c": 3}.transformList(k, v, v).size() == 3'),
    ("maps", '{"a": 1, "b": 2, "c": 3}.transformMap(k, v, v * 2).size() == 3'),
    ("maps", '{"a": 1, "b": 2, "c": 3}.transformMapEntry(k, v, {v: k}).size() == 3'),
    ("maps", '{"a": {"x": 1}, "b": {"y": 2}}.all(k, v, v.all(k2, v2, v2 > 0))'),
    ("maps", '{"a": [1, 2], "b": [3]}.exists(k, v, v.exists(x, x == 4))'),
    ("maps", 'device.attributes.all(dom, device.attributes[dom].all(k, k != ""))'),
    ("maps", f'{D}.all(k, k != "")'),
    ("maps", f'{D}.exists(k, k == "nope")'),
    ("maps", f'{D}.exists_one(k, k == "model")'),
    ("maps", f"{D}.map(k, k).size() > 0"),
    ("maps", f'{D}.filter(k, k.startsWith("m")).size() > 0'),
    ("maps", f'{D}.all(k, v, k != "")'),
    ("maps", f'{D}.exists(k, v, k == "model" && v == "nope")'),
    ("maps", f'{C}.all(k, v, v.isGreaterThan(quantity("0")))'),
    ("maps", 'device.capacity.exists(dom, m, m.exists(k, q, q.compareTo(quantity("1")) < 0))'),
    # attributes, qualifiers, relative attributes, conditionals, presence and optional qualifiers
    ("attributes", "device.driver == device.driver"),
    ("attributes", "!device.allowMultipleAllocations"),
    ("attributes", f'device.attributes[device.driver].type == "gpu" && {D}.type == "gpu"'),
    ("attributes", '[1, 2][0] == 1 && {"a": 1}.a == 1'),
    ("attributes", f"lists.range(3)[1] == 1 && [{D}.model][0].size() == 4"),
    ("attributes", f'(true ? {D} : {{}}).model == "H100"'),
    ("attributes", f'(false ? "x" : {D}.model) == "H100"'),
    ("attributes", f"has({D}.model) && !has({D}.nope) && has(device.attributes.nope)"),
    ("attributes", f"true ? has({D}.model) : false"),
    ("attributes", f'{D}.?model.hasValue() && !{D}.?nope.hasValue() && {D}[?"nope"].orValue("x") == "x"'),
    ("attributes", 'device.attributes[?"nope.com"].?x.orValue("y") == "y"'),
    ("attributes", f'{D}.?model.or(optional.of("y")).value() == "H100"'),
    ("attributes", "optional.of(1).optMap(x, x + 1).value() == 2 && !optional.none().optMap(x, x).hasValue()"),
    ("attributes", f"optional.of({D}.model).optMap(m, m.size()).orValue(0) == 4"),
    # size-dependent function costs, and what cel-go folds or leaves without an overload id
    ("functions", f'{D}.productName == "NVIDIA H100 80GB HBM3" && {D}.productName != ""'),
    ("functions", f'{D}.uuid.startsWith("GPU-") && {D}.uuid.endsWith("11") && {D}.uuid.contains("4a57")'),
    ("functions", f'{D}.productName.matches("^NVIDIA H[0-9]+") && matches({D}.model, "H1")'),
    ("functions", f'{D}.productName.lowerAscii().upperAscii().trim().substring(7) == "H100 80GB HBM3"'),
    ("functions", f'{D}.uuid.replace("-", "").split("c").join("c").size() == 36'),
    ("functions", f'{D}.uuid.indexOf("-") == 12 && {D}.uuid.lastIndexOf("-") == 27'),
    ("functions", f'{D}.productName.find("H[0-9]+") == "H100" && {D}.productName.findAll("[0-9]+").size() == 3'),
    ("functions", f'strings.quote({D}.model) == "\\"H100\\""'),
    ("functions", f'"%s-%s".format([string({D}.model), string({D}.type)]) == "H100-gpu"'),
    ("functions", f'{D}.model + {D}.type == "H100gpu" && [1] + [2] == [1, 2]'),
    ("functions", f'{D}.model < "Z" && b"a" < b"b" && dyn({D}.model) < dyn("Z")'),
    ("functions", 'int("5") == 5 && string(int("5")) == "5" && duration("1h") > duration("1m")'),
    ("functions", f'{D}.model in ["H100", "A100"] && {D}.model in [{D}.type, {D}.model] && !(1 in [])'),
    ("functions", f'isSemver("99999999999999999999.0.0") == false && {D}.driverVersion.major() == 550'),
    ("functions", f'quantity("80Gi") == {C}.memory && {C}.memory.isGreaterThan(quantity("1Gi"))'),
    ("functions", '["b", "a"].sort() == ["a", "b"] && dyn([2, 1]).sort() == [1, 2]'),
    ("functions", "[1, 2, 3].isSorted() && [1, 2, 3].sum() == 6 && ['a', 'bb'].max() == 'bb'"),
    ("functions", "lists.range(10).reverse()[0] == 9 && lists.range(10).slice(2, 5).size() == 3"),
    ("functions", "lists.range(50).distinct().size() == 50 && [[1], [2, 3]].flatten().size() == 3"),
    ("functions", "sets.contains(lists.range(30), [1, 2]) && sets.equivalent([1, 2], [2, 1])"),
    ("functions", 'url("https://example.com/a").getHost() == "example.com" && ip("10.0.0.1").family() == 4'),
    ("functions", 'cidr("10.0.0.0/8").containsIP(ip("10.1.2.3")) && cidr("10.0.0.0/8").containsIP("10.1.2.3")'),
    ("functions", '[duration("1h"), duration("1m")].sort()[0] == duration("1m")'),
    # a failed argument still leaves the call charged
    ("errors", "(1 / 0 == 0) || true"),
    ("errors", f"({C}.nope.isInteger()) || true"),
    ("errors", '(quantity("1 Gi") == quantity("1Ei")) || true'),
    ("errors", f"({D}.uuid.reverse().reverse() == {D}.uuid) || true"),
    # a call left to runtime dispatch among several overloads is a varargs call: a failed receiver is not charged
    ("errors", f'({D}.nope.indexOf("0") == 22) || true'),
    ("errors", f'({D}.nope.lastIndexOf("0") == 22) || true'),
    ("errors", f"({D}.nope.indexOf({D}.model) == 22) || true"),
    ("errors", f"(dyn({D}.model).indexOf(dyn(1 / 0)) == 22) || true"),
    ("errors", f"(dyn(1 / 0).add(dyn(1)) == {C}.memory) || true"),
    # `in` a constant list of scalars is a set lookup that costs nothing
    ("functions", f'{D}.model in [dyn("H100"), dyn("A100")] && !({D}.cores in [dyn(1)])'),
    ("functions", f"!(dyn({C}.memory) in [dyn(1)]) && !(dyn({D}.driverVersion) in [dyn({D}.cores)])"),
    *FORMAT_COST,  # Kubernetes' format library (tests/cel_corpus/formats.py)
]
