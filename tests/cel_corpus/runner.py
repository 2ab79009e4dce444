"""The two evaluators (ours, and Kubernetes' through tools/celeval) and the comparison of their outcomes."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

from dra_driver.cel import KUBERNETES_1_37, CelCompileError, CelDevice, CelRuntimeError, Features, ast, compile_selector
from dra_driver.cel.checker import check, dra_env
from dra_driver.cel.estimate import check_new_selector
from dra_driver.cel.extlib import EXT_DECLS
from dra_driver.cel.features import active, configure
from dra_driver.cel.parser import parse

# The release of tools/celeval's pin (k8s.io/dynamic-resource-allocation v0.36.3): ours runs as that release where
# the two are compared, whatever our default.
REFERENCE: Final = KUBERNETES_1_37


@contextmanager
def as_reference() -> Iterator[None]:
    previous = active()
    configure(REFERENCE)
    try:
        yield
    finally:
        configure(previous)


Kind = Literal["true", "false", "compile_error", "runtime_error", "crash", "input_error", "panic"]


@dataclass(frozen=True)
class Case:
    category: str
    expression: str
    device: str  # JSON: {"driver", "attributes", "capacity", "allowMultipleAllocations"}
    device_name: str = ""


@dataclass(frozen=True)
class Outcome:
    kind: str
    message: str = ""
    cost: int | None = None  # the runtime cost, when the evaluation ran (celeval reports it)


def ours(case: Case) -> Outcome:
    """Evaluate as the allocator does: `compile_selector(expr).matches(CelDevice.from_slice_device(...))`."""
    with as_reference():
        return _ours(case)


def _ours(case: Case) -> Outcome:
    try:
        selector = compile_selector(case.expression)
    except CelCompileError as err:
        return Outcome("compile_error", str(err))
    except Exception as err:  # a bug of ours is a disagreement class, not a harness failure
        return Outcome("crash", f"compile: {type(err).__name__}: {err}")
    raw: dict[str, Any] = json.loads(case.device)
    try:
        device = CelDevice.from_slice_device(raw["driver"], raw)
        return Outcome("true" if selector.matches(device) else "false")
    except CelRuntimeError as err:
        return Outcome("runtime_error", str(err))
    except Exception as err:
        return Outcome("crash", f"evaluate: {type(err).__name__}: {err}")


def ours_with_cost(case: Case) -> Outcome:
    """Like `ours`, evaluated afresh (no memo) to read the cost it charged."""
    with as_reference():
        return _ours_with_cost(case)


def _ours_with_cost(case: Case) -> Outcome:
    try:
        selector = compile_selector(case.expression)
    except CelCompileError as err:
        return Outcome("compile_error", str(err))
    raw: dict[str, Any] = json.loads(case.device)
    try:
        result = selector.evaluate(CelDevice.from_slice_device(raw["driver"], raw))
    except CelRuntimeError as err:
        return Outcome("runtime_error", str(err), selector.last_cost)
    except Exception as err:
        return Outcome("crash", f"evaluate: {type(err).__name__}: {err}")
    return Outcome("true" if result else "false", cost=selector.last_cost)


# Macros whose cost or result depends on the order of iteration: over a map, Kubernetes' order is random.
_ORDER_SENSITIVE: Final = frozenset({"all", "exists", "map", "filter", "transformList", "sortBy"})


def order_dependent(expression: str) -> bool:
    """Whether Kubernetes' cost may vary from run to run: a short-circuiting or list-building macro over a range
    that is not statically a list (a map, or an attribute)."""
    try:
        tree = parse(expression)
        _, checker = check(tree, expression, dra_env(False, EXT_DECLS))
    except CelCompileError:
        return False
    return any(
        isinstance(n, ast.Comprehension) and n.macro in _ORDER_SENSITIVE and checker.final(n.target).kind != "list"
        for n in ast.walk(tree)
    )


def kubernetes(binary: Path, cases: list[Case], timeout: float = 600, flags: tuple[str, ...] = ()) -> list[Outcome]:
    """Every case through one celeval process (it compiles each distinct expression once); `flags` are celeval's
    (feature gates)."""
    requests = [{"expression": c.expression, "device": json.loads(c.device)} for c in cases]
    results = _celeval(binary, list(flags), requests, timeout)
    return [Outcome(r["outcome"], r.get("message", ""), r.get("cost")) for r in results]


def _celeval(binary: Path, flags: list[str], requests: list[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    """One celeval process for all `requests` (ids added), its answers in order."""
    lines = [json.dumps({"id": str(i), **r}) for i, r in enumerate(requests)]
    proc = subprocess.run(
        [str(binary), *flags],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"celeval {' '.join(flags)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    if [r["id"] for r in results] != [str(i) for i in range(len(requests))]:
        raise RuntimeError(f"celeval answered {len(results)} lines for {len(requests)} requests, or out of order")
    return results


def signature(message: str) -> str:
    """A message with positions, quoted text and numbers blanked: one disagreement class per kind of error."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    first = re.sub(r"^compilation failed: ERROR: <input>:\d+:\d+: ", "compile: ", first)
    first = re.sub(r"'[^']*'|\"[^\"]*\"", "'_'", first)
    first = re.sub(r"\d+", "N", first)
    return first[:90]


@dataclass
class Report:
    total: int = 0
    agree: int = 0
    same_message: int = 0
    per_category: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    classes: Counter[str] = field(default_factory=Counter)
    examples: dict[str, tuple[Case, Outcome, Outcome]] = field(default_factory=dict)

    @property
    def agreement(self) -> float:
        return self.agree / self.total if self.total else 1.0

    def add(self, case: Case, k: Outcome, p: Outcome) -> None:
        self.total += 1
        stats = self.per_category[case.category]
        stats[1] += 1
        if k.kind == p.kind:
            self.agree += 1
            stats[0] += 1
            self.same_message += k.message == p.message
            return
        key = f"K {k.kind} / P {p.kind}: {signature(k.message if k.message else p.message)}"
        self.classes[key] += 1
        self.examples.setdefault(key, (case, k, p))

    def render(self, title: str) -> str:
        same = 100 * self.same_message / max(1, self.total)
        lines = [
            f"{title}: {self.agree}/{self.total} outcomes agree ({100 * self.agreement:.1f}%), "
            f"{self.same_message}/{self.total} also with identical messages ({same:.1f}%)"
        ]
        for category, (ok, n) in sorted(self.per_category.items()):
            lines.append(f"  {category:<18} {ok:>5}/{n:<5} {100 * ok / n:5.1f}%")
        lines.append(f"  {len(self.classes)} disagreement classes:")
        for key, count in self.classes.most_common():
            case, k, p = self.examples[key]
            device = f" [{case.device_name}]" if case.device_name else ""
            lines.append(f"  {count:>5}  {key}")
            lines.append(f"         e.g. {case.category}{device}: {case.expression[:200]}")
            lines.append(f"              K: {k.message.splitlines()[0][:160] if k.message else k.kind}")
            lines.append(f"              P: {p.message.splitlines()[0][:160] if p.message else p.kind}")
        return "\n".join(lines)


def compare(cases: list[Case], theirs: list[Outcome]) -> Report:
    report = Report()
    for case, k in zip(cases, theirs, strict=True):
        report.add(case, k, ours(case))
    return report


@dataclass(frozen=True)
class Estimate:
    """The API server's verdict on a new selector: outcome "ok" / "compile_error" / "too_complex" (or "too_long"
    on our side, which celeval does not check), and the estimated max cost when it compiles."""

    outcome: str
    max_cost: int | None = None
    message: str = ""


def kubernetes_estimates(binary: Path, expressions: list[str], *flags: str, timeout: float = 600) -> list[Estimate]:
    """`celeval -estimate` (validateCELSelector without the length check) for every expression, in order."""
    requests = [{"expression": e, "device": {"driver": "gpu.dra-driver.dev"}} for e in expressions]
    results = _celeval(binary, ["-estimate", *flags], requests, timeout)
    return [Estimate(r["outcome"], r.get("max_cost"), r.get("message", "")) for r in results]


def our_estimate(expression: str, features: Features) -> Estimate:
    """Our verdict, without the length check (as celeval); a crash is its own outcome, not a harness failure."""
    try:
        verdict = check_new_selector(expression, replace(features, minor=REFERENCE.minor), check_length=False)
    except Exception as err:
        return Estimate("crash", None, f"{type(err).__name__}: {err}")
    return Estimate(verdict.outcome, verdict.cost.max if verdict.cost is not None else None, verdict.message)
