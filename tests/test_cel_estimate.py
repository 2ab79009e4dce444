"""The API server's estimated cost of a new selector (`dra_driver.cel.estimate`) against Kubernetes' own: tools/celeval
-estimate compiles as validateCELSelector does (NewExpressions environment, cel-go's cost estimator with Kubernetes'
estimators) and answers ok / compile_error / too_complex with the estimated max cost.

Every expression must get Kubernetes' outcome, and its max cost whenever it compiles (too complex included). Three
corpora: the differential suite's hand-written selectors, tests/cel_corpus/estimate.py (the estimator's own corners,
also under other feature gates, which change what compiles) and the seeded generator. The figures, with how many
selectors the API server refuses although the scheduler would run them, go to the terminal summary. Skipped without
Go unless DRA_K8S_REQUIRE=1.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest

from dra_driver.cel import KUBERNETES_1_37, CelCompileError, Features
from dra_driver.cel.estimate import TOO_COMPLEX, check_new_selector, estimate_cost
from dra_driver.cel.program import MAX_EXPRESSION_LENGTH
from tests.cel_corpus.devices import named_devices
from tests.cel_corpus.estimate import ESTIMATE_CASES
from tests.cel_corpus.generator import generate
from tests.cel_corpus.handwritten import cases as handwritten
from tests.cel_corpus.runner import Case, Estimate, kubernetes, kubernetes_estimates, our_estimate
from tests.gotools import pinned
from tests.test_cel_differential import celeval  # noqa: F401  (the fixture: the built binary, shared)

SEED: Final = 13
GENERATED: Final = 3000
GATES: Final = {  # label → (our features, celeval's flags)
    "1.37 gates": (KUBERNETES_1_37, ()),
    "DRAListTypeAttributes=true": (Features(list_type_attributes=True), ("-list-type-attributes=true",)),
    "DRAConsumableCapacity=false": (Features(consumable_capacity=False), ("-consumable-capacity=false",)),
}


def _scheduler_accepts(binary: Path, expressions: list[str], flags: tuple[str, ...]) -> list[bool]:
    """Whether the scheduler (celeval's default mode, StoredExpressions) compiles each expression."""
    device = json.dumps(named_devices()["h100"])
    outcomes = kubernetes(binary, [Case("estimate", e, device) for e in expressions], flags=flags)
    return [o.kind != "compile_error" for o in outcomes]


def _compare(binary: Path, title: str, expressions: list[str], gates: str) -> tuple[list[str], list[str]]:
    """Both sides on every expression: the report's lines (examples indented deeper) and the disagreements."""
    features, flags = GATES[gates]
    theirs = kubernetes_estimates(binary, expressions, *flags)
    accepted = _scheduler_accepts(binary, expressions, flags)
    wrong: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for expression, k in zip(expressions, theirs, strict=True):
        p = our_estimate(expression, features)
        if (p.outcome, p.max_cost) != (k.outcome, k.max_cost):
            key = f"K {k.outcome} / P {p.outcome}" + (" (max cost differs)" if p.outcome == k.outcome else "")
            wrong[key] += 1
            examples.setdefault(key, f"{expression[:160]}  K {_show(k)}  P {_show(p)}")
    outcomes = Counter(k.outcome for k in theirs)
    refused = sum(1 for k, ok in zip(theirs, accepted, strict=True) if k.outcome == "too_complex" and ok)
    n, agree = len(expressions), len(expressions) - sum(wrong.values())
    lines = [
        f"{title} ({n} expressions, {gates}): {agree}/{n} agree on outcome and max cost ({100 * agree / n:.1f}%)",
        f"  Kubernetes: {outcomes['ok']} ok, {outcomes['too_complex']} too complex, "
        f"{outcomes['compile_error']} compile errors; {refused} refused as too complex though the scheduler runs them",
    ]
    for key, count in wrong.most_common():
        lines += [f"  {count:>5}  {key}", f"         e.g. {examples[key]}"]
    return lines, [f"{key}: {count}, e.g. {examples[key]}" for key, count in wrong.most_common()]


def _report(report_table: Callable[[str, str], None], lines: list[str]) -> None:
    """All of it in the test's output; the figures and classes (no examples) in the terminal summary."""
    print("\n".join(lines))
    report_table(
        f"CEL estimated cost ({pinned('celeval')})",
        "\n".join(line for line in lines if not line.startswith("         ")),
    )


def _show(e: Estimate) -> str:
    return f"{e.outcome} {e.max_cost}" if e.max_cost is not None else f"{e.outcome} {e.message[:100]!r}"


def test_estimate_agrees_with_kubernetes_on_the_hand_written_selectors(
    celeval: Path,  # noqa: F811
    report_table: Callable[[str, str], None],
) -> None:
    differential = sorted({expression for _, expression, *_ in handwritten()})
    lines, wrong = _compare(celeval, "hand-written corpus", differential, "1.37 gates")
    corners = [expression for _, expression in ESTIMATE_CASES]
    for gates in GATES:
        more_lines, more_wrong = _compare(celeval, "estimator corpus", corners, gates)
        lines, wrong = lines + more_lines, wrong + more_wrong
    _report(report_table, lines)
    assert not wrong, "\n".join(wrong)


def test_estimate_agrees_with_kubernetes_on_generated_selectors(
    celeval: Path,  # noqa: F811
    report_table: Callable[[str, str], None],
) -> None:
    expressions = [expression for _, expression, _ in generate(SEED, GENERATED)]
    lines, wrong = _compare(celeval, f"generated (seed {SEED})", expressions, "1.37 gates")
    _report(report_table, lines)
    assert not wrong, "\n".join(wrong)


# Without Go: what celeval leaves out, and the interface.


def test_the_length_limit_comes_first_as_in_validate_cel_selector() -> None:
    # validateCELSelector refuses an expression over CELSelectorExpressionMaxLength bytes before compiling it
    long = "true" + " && true" * (MAX_EXPRESSION_LENGTH // 8)
    verdict = check_new_selector(long)
    assert verdict.outcome == "too_long" and verdict.refused and verdict.cost is None
    assert check_new_selector(long, check_length=False).outcome in ("ok", "too_complex")


def test_estimate_cost_raises_what_the_api_server_refuses_to_compile() -> None:
    assert estimate_cost("device.driver == 'x'").max >= estimate_cost("device.driver == 'x'").min
    with pytest.raises(CelCompileError, match="undeclared reference to 'includes'"):  # gated off for new selectors
        estimate_cost('device.attributes["d"].x.includes(1)')
    assert check_new_selector("lists.range(1000000).all(x, x >= 0)").message == TOO_COMPLEX
