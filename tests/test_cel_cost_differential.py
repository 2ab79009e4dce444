"""Runtime cost against Kubernetes': the cost our evaluator charges (`Selector.last_cost`) against the cost
tools/celeval reports for the same evaluation (cel-go's tracker with Kubernetes' estimator, as the scheduler runs it).
The cost decides where CELSelectorExpressionMaxCost stops an evaluation, so it must be Kubernetes' to the unit.

Two sets: tests/cel_corpus/cost.py (macros over ranges and maps, and every rule of the
tracker), where every case must agree on the outcome and the cost; and the
differential suite's corpora (hand-written and generated), where every true/false evaluation must cost the same,
except an expression whose Kubernetes cost depends on its random map order (counted and left out). Skipped without Go
unless DRA_K8S_REQUIRE=1.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Final

from tests.cel_corpus.cost import COST_CASES, DEVICE
from tests.cel_corpus.generator import generate
from tests.cel_corpus.runner import Case, Outcome, kubernetes, order_dependent, ours_with_cost
from tests.gotools import pinned
from tests.test_cel_differential import SEED, celeval, handwritten_cases  # noqa: F401  (the fixture, shared)

GENERATED: Final = 3000
FINISHED: Final = ("true", "false")


def _compared(k: Outcome) -> tuple[str, int | None]:
    """What must agree: the outcome, and the cost of an evaluation that finished. One stopped by the cost limit only
    has to stop: cel-go checks the limit at every step, we check it at every charge larger than 1, so the cost we
    report at the cut can be a few units higher."""
    return k.kind, k.cost if k.kind in FINISHED else None


def _report(title: str, cases: list[Case], theirs: list[Outcome], skip: set[int]) -> tuple[list[str], list[str]]:
    wrong: Counter[str] = Counter()
    examples: dict[str, str] = {}
    compared = 0
    for i, (case, k) in enumerate(zip(cases, theirs, strict=True)):
        if i in skip:
            continue
        compared += 1
        p = ours_with_cost(case)
        want, got = _compared(k), _compared(p)
        if want != got:
            key = f"K {k.kind} / P {p.kind}" + (" (cost differs)" if k.kind == p.kind else "")
            wrong[key] += 1
            examples.setdefault(key, f"{case.expression[:160]}  K {want}  P {got}")
    agree = compared - sum(wrong.values())
    lines = [f"{title}: {agree}/{compared} agree on outcome and cost ({100 * agree / max(compared, 1):.1f}%)"]
    if skip:
        lines[0] += f"; {len(skip)} left out, their cost depending on Kubernetes' random map order"
    for key, count in wrong.most_common():
        lines += [f"  {count:>5}  {key}", f"         e.g. {examples[key]}"]
    return lines, [f"{key}: {count}, e.g. {examples[key]}" for key, count in wrong.most_common()]


def _device_free_once(cases: list[Case]) -> list[Case]:
    """An expression that does not read the device costs the same on every device: one case of it is enough (the
    hand-written corpus runs some near-limit ones on three devices)."""
    seen: set[str] = set()
    kept = []
    for case in cases:
        if "device" not in case.expression:
            if case.expression in seen:
                continue
            seen.add(case.expression)
        kept.append(case)
    return kept


def _show(report_table: Callable[[str, str], None], lines: list[str]) -> None:
    print("\n".join(lines))
    report_table(
        f"CEL runtime cost ({pinned('celeval')})", "\n".join(line for line in lines if not line.startswith("         "))
    )


def test_cost_corpus_costs_what_kubernetes_charges(
    celeval: Path,  # noqa: F811
    report_table: Callable[[str, str], None],
) -> None:
    device = json.dumps(DEVICE)
    cases = [Case(category, expression, device) for category, expression in COST_CASES]
    theirs = kubernetes(celeval, cases)
    assert all(k.kind in FINISHED or "cost limit" in k.message for k in theirs), "a case failed in Kubernetes"
    lines, wrong = _report(f"cost corpus ({len(cases)} cases)", cases, theirs, set())
    _show(report_table, lines)
    assert not wrong, "\n".join(wrong)


def test_differential_corpora_cost_what_kubernetes_charges(
    celeval: Path,  # noqa: F811
    report_table: Callable[[str, str], None],
) -> None:
    lines: list[str] = []
    wrong: list[str] = []
    generated = [Case(category, expr, device) for category, expr, device in generate(SEED, GENERATED)]
    for title, cases in (
        ("hand-written corpus", _device_free_once(handwritten_cases())),
        (f"generated (seed {SEED})", generated),
    ):
        theirs = kubernetes(celeval, cases)
        skip = {i for i, case in enumerate(cases) if order_dependent(case.expression)}
        more_lines, more_wrong = _report(f"{title} ({len(cases)} cases)", cases, theirs, skip)
        lines, wrong = lines + more_lines, wrong + more_wrong
    _show(report_table, lines)
    assert not wrong, "\n".join(wrong)
