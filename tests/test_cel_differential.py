"""Our CEL (`dra_driver.cel`) against Kubernetes' own DRA CEL (tools/celeval, k8s.io/dynamic-resource-allocation/cel
at the pinned version, compiled and evaluated as the kube-scheduler does).

The hand-written corpus (tests/cel_corpus/handwritten.py) and a seeded generator (tests/cel_corpus/generator.py) run
through both; a case agrees when both give the same outcome (true, false, compile error, runtime error). The figures,
per category, and every disagreement class with one example are printed. The baselines are ratchets: the test fails
when we get worse. Skipped without Go unless DRA_K8S_REQUIRE=1.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest

from tests.cel_corpus.devices import DEFAULT_DEVICES, named_devices
from tests.cel_corpus.generator import ATOMS, SHARED, generate
from tests.cel_corpus.handwritten import cases as handwritten
from tests.cel_corpus.runner import Case, Outcome, Report, compare, kubernetes, ours
from tests.gotools import pinned
from tests.test_cel_ext_support import celeval_binary

ROOT = Path(__file__).resolve().parent.parent
REQUIRE = os.environ.get("DRA_K8S_REQUIRE") == "1"
SEED: Final = 13
GENERATED: Final = 3000

# Agreement with Kubernetes 1.37.2 (tools/celeval's pin); never lower them.
BASELINE_HANDWRITTEN: Final = 1.0
BASELINE_GENERATED: Final = 1.0


@pytest.fixture(scope="module")
def celeval() -> Path:
    """tools/celeval, built once per session (skips without Go unless DRA_K8S_REQUIRE=1)."""
    return celeval_binary()


def handwritten_cases() -> list[Case]:
    devices = named_devices()
    return [
        Case(category, expression, devices[name], name)
        for category, expression, names in handwritten()
        for name in names or DEFAULT_DEVICES
    ]


def _show(report_table: Callable[[str, str], None], title: str, text: str) -> None:
    """All of it in the test's output; the figures and the classes (no examples) in the terminal summary."""
    print(text)
    report_table(title, "\n".join(line for line in text.splitlines() if not line.startswith("      ")))


def test_handwritten_corpus_agrees_at_least_as_much_as_the_baseline(
    celeval: Path, report_table: Callable[[str, str], None]
) -> None:
    cases = handwritten_cases()
    report = compare(cases, kubernetes(celeval, cases))
    title = f"CEL differential, hand-written corpus ({len(cases)} cases)"
    _show(report_table, f"CEL differential ({pinned('celeval')})", report.render(title))
    assert report.agreement >= BASELINE_HANDWRITTEN, f"agreement fell below the baseline {BASELINE_HANDWRITTEN}"


def test_generated_selectors_agree_at_least_as_much_as_the_baseline(
    celeval: Path, report_table: Callable[[str, str], None]
) -> None:
    cases = [Case(category, expr, device) for category, expr, device in generate(SEED, GENERATED)]
    theirs = kubernetes(celeval, cases)
    # Kubernetes iterates maps in random order: a second run must not change any outcome, or the generator made an
    # order-dependent expression and the comparison would be noise.
    again = kubernetes(celeval, cases)
    flaky = [c.expression for c, a, b in zip(cases, theirs, again, strict=True) if a.kind != b.kind]
    assert not flaky, f"order-dependent expressions: {flaky[:5]}"
    report = compare(cases, theirs)
    title = f"CEL differential, generated (seed {SEED}, {len(cases)} cases)"
    _show(report_table, f"CEL differential ({pinned('celeval')})", report.render(title))
    assert report.agreement >= BASELINE_GENERATED, f"agreement fell below the baseline {BASELINE_GENERATED}"


def test_celeval_gives_the_schedulers_four_outcomes(celeval: Path) -> None:
    device = named_devices()["h100"]
    exprs = ['device.attributes["gpu.dra-driver.dev"].type == "gpu"', "1 == 2", "1 +", 'device.attributes["x"].y']
    got = kubernetes(celeval, [Case("t", e, device) for e in exprs])
    assert [o.kind for o in got] == ["true", "false", "compile_error", "runtime_error"]
    assert "Syntax error" in got[2].message and "no such key: y" in got[3].message


# The harness itself, without Go.


def test_generator_is_seeded_and_mixes_every_library() -> None:
    a, b = generate(SEED, 300), generate(SEED, 300)
    assert a == b and a != generate(SEED + 1, 300)
    categories = {category for category, _, _ in generate(SEED, 1000)}
    assert {f"gen-{lib}" for lib in ATOMS} | {f"gen-{lib}" for lib, _ in SHARED.values()} | {"gen-mixed"} <= categories
    assert any("cel.bind(" in expr for _, expr, _ in a)
    assert len({device for _, _, device in a}) > 50  # many devices, not one


def test_our_side_maps_selectors_to_the_four_outcomes() -> None:
    device = named_devices()["mig"]
    kinds = [ours(Case("t", e, device)).kind for e in ("1 == 1", "1 == 2", "1 +", 'device.attributes["x"].y')]
    assert kinds == ["true", "false", "compile_error", "runtime_error"]
    list_attr = named_devices()["list-attribute"]  # a list attribute is a CEL list since 1.37, whatever the gate
    assert ours(Case("t", 'device.attributes["gpu.dra-driver.dev"].nvlinkPeers.size() > 0', list_attr)).kind == "true"


def test_report_groups_disagreements_into_classes() -> None:
    report = Report()
    device = named_devices()["h100"]
    k_err = Outcome("compile_error", "compilation failed: ERROR: <input>:1:6: found no matching overload for '_==_'")
    report.add(Case("a", "1 == 1.0", device), k_err, Outcome("true"))
    report.add(Case("a", "2 == 2.0", device), Outcome(k_err.kind, k_err.message.replace(":6:", ":7:")), Outcome("true"))
    report.add(Case("b", "true", device), Outcome("true"), Outcome("true"))
    assert (report.total, report.agree) == (3, 1)
    assert report.classes == {"K compile_error / P true: compile: found no matching overload for '_'": 2}
    assert report.per_category["a"] == [0, 2] and report.per_category["b"] == [1, 1]
    assert "1 == 1.0" in report.render("t")


def test_kubernetes_runner_refuses_a_short_or_reordered_answer(tmp_path: Path) -> None:
    fake = tmp_path / "celeval"
    fake.write_text('#!/bin/sh\ncat >/dev/null\necho \'{"id": "1", "outcome": "true"}\'\n')
    fake.chmod(0o755)
    device = json.dumps({"driver": "d", "attributes": {}, "capacity": {}})
    with pytest.raises(RuntimeError, match="answered 1 lines for 2 requests"):
        kubernetes(fake, [Case("t", "true", device), Case("t", "false", device)])
