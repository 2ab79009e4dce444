"""Differential cases of issue 43 item 7, what Kubernetes 1.37's cel-go (0.29) added or checks, each run through
tools/celeval (k8s.io/dynamic-resource-allocation v0.37.2) and ours, which must give the same outcome (and, where the
evaluation finishes, the same actual cost):

- backquoted (escaped) field names: `` a.`b-c` ``, `` .?`x.y` ``, `` has(a.`b c`) ``, a message field
  `` T{`f`: v} `` (cel-go 0.29's parser takes them; 0.26's, Kubernetes 1.36's, refuses them: "unsupported syntax");
- the two-variable comprehension macros, `existsOne(i, v, p)` (the camel-case spelling) among them, and their
  parse errors (duplicate variable before accumulator);
- the error cases of the lists extension and of Kubernetes' lists library: `lists.range` refuses a negative size
  and one past 1,000,000 since 0.29, `slice`, `flatten`, `sort`, and `min`/`max` passing over an element they
  cannot compare;
- constants that the program planner checks when it builds the program, also after `dyn()` or another conversion
  folds them: a regex pattern of `matches`/`find`/`findAll`, a qualifier (`m[dyn(int)]`).

Each case also pins Kubernetes 1.37.2's and 1.36.3's outcomes (tools/celeval at v0.37.2 and, built once by hand, at
v0.36.3): ours must give them under KUBERNETES_1_37 and KUBERNETES_1_36 without Go. The differential half skips
without Go unless DRA_K8S_REQUIRE=1, as tests/test_cel_differential.py does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import pytest

from dra_driver.cel import KUBERNETES_1_36, KUBERNETES_1_37, Features, configure
from dra_driver.cel.features import active
from tests.cel_corpus.devices import named_devices
from tests.cel_corpus.runner import Case, Outcome, _ours_with_cost, kubernetes
from tests.test_cel_differential import celeval  # noqa: F401  (the fixture: the built binary, shared)

# (expression, Kubernetes 1.37.2's outcome, Kubernetes 1.36.3's outcome), on the simulated H100.
ESCAPED = [
    ('device.attributes.`gpu.dra-driver.dev`.type == "gpu"', "true", "compile_error"),
    ('device.attributes["gpu.dra-driver.dev"].`productName`.startsWith("NVIDIA")', "true", "compile_error"),
    ('device.attributes["resource.kubernetes.io"].`pciBusID` == "0000:1b:00.0"', "true", "compile_error"),
    ('device.capacity.`gpu.dra-driver.dev`.memory.compareTo(quantity("1Gi")) > 0', "true", "compile_error"),
    ("has(device.attributes.`gpu.dra-driver.dev`.productName)", "true", "compile_error"),
    ("has(device.attributes.`gpu.dra-driver.dev`.`no such`)", "false", "compile_error"),
    ('device.attributes.?`gpu.dra-driver.dev`.?type.orValue("") == "gpu"', "true", "compile_error"),
    ("device.attributes.?`nope.example.com`.hasValue()", "true", "compile_error"),
    ('device.`driver` == "gpu.dra-driver.dev"', "true", "compile_error"),
    ('{"a b/c-d.e_f": 1}.`a b/c-d.e_f` == 1', "true", "compile_error"),
    ("google.protobuf.Int64Value{`value`: 1} == 1", "true", "compile_error"),
    ("device.attributes.`gpu.dra-driver.dev`.`no such` == 1", "runtime_error", "compile_error"),
    ('{"a": 1}.`a`.b == 1', "compile_error", "compile_error"),
    ('{"": 1}.`` == 1', "compile_error", "compile_error"),
    ('{"a": 1}.`a+b` == 1', "compile_error", "compile_error"),
    ('{"é": 1}.`é` == 1', "compile_error", "compile_error"),
    ('`device`.driver == "gpu.dra-driver.dev"', "compile_error", "compile_error"),
    ('{"ab": 1}.`ab`() == 1', "compile_error", "compile_error"),
]
TWO_VAR = [
    ("[1, 2, 1].existsOne(i, v, v == 2)", "true", "true"),
    ("[1, 2, 1].existsOne(i, v, v == 1)", "false", "false"),
    ("[1, 2, 1].exists_one(i, v, i == 2 && v == 1)", "true", "true"),
    ('device.attributes["gpu.dra-driver.dev"].existsOne(k, v, k == "numaNode" && v == 0)', "true", "true"),
    ('{"a": 1, "b": 2}.existsOne(k, v, v > 1)', "true", "true"),
    ("[].existsOne(i, v, true)", "false", "false"),
    ("[0, 1].existsOne(i, v, 1 / v == 1)", "runtime_error", "runtime_error"),
    ('[dyn("x"), dyn(0), dyn(1)].existsOne(i, v, 1 / v == 1)', "runtime_error", "runtime_error"),
    ('[dyn(0), dyn("x"), dyn(1)].all(i, v, 1 / v == 1)', "runtime_error", "runtime_error"),
    ("[1, 2].existsOne(v, v == 1)", "compile_error", "compile_error"),
    ("[1, 2].existsOne(i, v, v == 1, true)", "compile_error", "compile_error"),
    ("[1, 2].existsOne(i, i, true)", "compile_error", "compile_error"),
    ("[1, 2].existsOne(__result__, v, true)", "compile_error", "compile_error"),
    ("[1, 2].all(__result__, __result__, true)", "compile_error", "compile_error"),
    ("[1, 2].existsOne(i.j, v, true)", "compile_error", "compile_error"),
    ('dyn("ab").existsOne(i, v, true)', "runtime_error", "runtime_error"),
    (
        'device.attributes["gpu.dra-driver.dev"].all(k, v, k != "" && v != 1.5)',
        "true",
        "true",
    ),
    ("[1, 2, 3].transformList(i, v, i > 0, v * i) == [2, 6]", "true", "true"),
    (
        'device.attributes["gpu.dra-driver.dev"].transformMapEntry(k, v, k == "type", {v: k}) == {"gpu": "type"}',
        "true",
        "true",
    ),
]
LISTS = [
    ("lists.range(-1).size() == 0", "runtime_error", "true"),
    ("lists.range(dyn(-5)) == []", "runtime_error", "true"),
    ("cel.bind(n, -1, lists.range(n).size() == 0)", "runtime_error", "true"),
    ("lists.range(1000000).size() == 1000000", "runtime_error", "runtime_error"),
    ("lists.range(1000001).size() > 0", "runtime_error", "runtime_error"),
    ("lists.range(0) == [] && lists.range(3) == [0, 1, 2]", "true", "true"),
    ("[1, 2, 3].slice(-1, 2) == [3]", "runtime_error", "runtime_error"),
    ("[1, 2, 3].slice(2, 1) == []", "runtime_error", "runtime_error"),
    ("[1, 2, 3].slice(0, 4) == [1, 2, 3]", "runtime_error", "runtime_error"),
    ("[1, 2, 3].slice(3, 3) == []", "true", "true"),
    ("[[1], [2]].flatten(-1) == [1, 2]", "runtime_error", "runtime_error"),
    ("dyn([[1], 2]).flatten() == [1, 2]", "compile_error", "compile_error"),
    ('dyn("x").flatten() == []', "runtime_error", "runtime_error"),
    ('[dyn(1), dyn("a")].sort() == [1]', "runtime_error", "runtime_error"),
    ('[1, 2].sortBy(x, dyn(x == 1 ? 1 : "a")) == [1, 2]', "compile_error", "compile_error"),
    ('[dyn(1), dyn("a")].min() == 1', "true", "true"),
    ('[dyn("a"), dyn(1)].max() == "a"', "true", "true"),
    ("[1.0, 0.0/0.0, 0.5].min() == 0.5", "true", "true"),
    ("[dyn(1), dyn(null)].min() == 1", "runtime_error", "runtime_error"),
    ("[].max() == 0", "runtime_error", "runtime_error"),
    ("dyn(1).reverse() == [1]", "runtime_error", "runtime_error"),
]
DYN_CONSTANTS = [
    ('"abc".matches(dyn("["))', "compile_error", "compile_error"),
    ('false && "abc".matches(dyn("["))', "compile_error", "compile_error"),
    ('true || matches("abc", dyn("("))', "compile_error", "compile_error"),
    ('"abc".find(dyn("[")) == ""', "compile_error", "compile_error"),
    ('"abc".findAll(dyn("("), 1) == []', "compile_error", "compile_error"),
    ('"abc".matches(dyn(dyn("[")))', "compile_error", "compile_error"),
    ('false && "abc".matches(string(dyn("\\\\C")))', "compile_error", "compile_error"),
    ('device.attributes["gpu.dra-driver.dev"].productName.matches(dyn("H100"))', "true", "true"),
    ('"abc".findAll(dyn("[ab]")) == ["a", "b"]', "true", "true"),
    ('false && {"a": 1}[dyn(int)] == 1', "compile_error", "compile_error"),
    ('false && {"a": 1}[dyn(null)] == 1', "compile_error", "compile_error"),
    ('false && int(dyn("x")) == 1', "compile_error", "compile_error"),
    ('false && duration(dyn("bad")) == duration("1s")', "compile_error", "compile_error"),
    ('false && quantity(dyn("bad")) == quantity("1")', "false", "false"),
    ('isSemver(dyn("x"))', "false", "false"),
    ('false && semver(dyn("x")) == semver("1.0.0")', "false", "false"),
    ('false && "%d".format([dyn("x")]) == ""', "false", "false"),
    ('format.named(dyn("nope")).hasValue()', "false", "false"),
]

CLASSES: Final = {
    "escaped-fields": ESCAPED,
    "two-variable-macros": TWO_VAR,
    "lists-errors": LISTS,
    "dyn-constants": DYN_CONSTANTS,
}


@contextmanager
def release(features: Features) -> Iterator[None]:
    previous = active()
    configure(features)
    try:
        yield
    finally:
        configure(previous)


def cases(name: str) -> list[Case]:
    device = named_devices()["h100"]
    return [Case(name, expression, device, "h100") for expression, _, _ in CLASSES[name]]


def ours(case: Case, features: Features) -> Outcome:
    with release(features):
        return _ours_with_cost(case)


def test_every_class_has_cases_that_evaluate_and_cases_that_fail() -> None:
    for name, table in CLASSES.items():
        kinds = {k137 for _, k137, _ in table}
        assert len(table) >= 8 and kinds & {"true", "false"} and kinds & {"compile_error", "runtime_error"}, name


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_kubernetes_1_37_gives_the_pinned_outcomes_and_ours_agrees(celeval: Path, name: str) -> None:  # noqa: F811
    """celeval (1.37.2) against ours as 1.37: same outcome and cost (unless the cost limit stopped it); for the
    macros, the same runtime error (which one a comprehension keeps after an error)."""
    theirs = kubernetes(celeval, cases(name))
    wrong = []
    for case, (_, pinned, _), k in zip(cases(name), CLASSES[name], theirs, strict=True):
        o = ours(case, KUBERNETES_1_37)
        if k.kind != pinned:
            wrong.append(f"celeval gives {k.kind} ({k.message!r}), the table {pinned}: {case.expression}")
        if o.kind != k.kind:
            wrong.append(f"celeval {k.kind} ({k.message!r}), ours {o.kind} ({o.message!r}): {case.expression}")
        elif o.cost != k.cost and not k.message.startswith("operation cancelled"):
            wrong.append(f"celeval cost {k.cost}, ours {o.cost}: {case.expression}")
        elif k.kind == "runtime_error" and name == "two-variable-macros" and o.message != k.message:
            wrong.append(f"celeval {k.message!r}, ours {o.message!r}: {case.expression}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(("features", "column"), [(KUBERNETES_1_37, 1), (KUBERNETES_1_36, 2)], ids=["1.37", "1.36"])
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_ours_gives_each_releases_pinned_outcomes(name: str, features: Features, column: int) -> None:
    wrong = [
        f"{row[column]} expected, ours {got.kind} ({got.message!r}): {case.expression}"
        for case, row in zip(cases(name), CLASSES[name], strict=True)
        if (got := ours(case, features)).kind != row[column]
    ]
    assert not wrong, "\n".join(wrong)
