"""The two evaluators (ours, and Kubernetes' through tools/celeval) and the comparison of their outcomes."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dra_driver.cel import CelCompileError, CelDevice, CelRuntimeError, compile_selector

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


def ours(case: Case) -> Outcome:
    """Evaluate as the allocator does: `compile_selector(expr).matches(CelDevice.from_slice_device(...))`."""
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


def kubernetes(binary: Path, cases: list[Case], timeout: float = 600) -> list[Outcome]:
    """Every case through one celeval process (it compiles each distinct expression once)."""
    lines = [
        json.dumps({"id": str(i), "expression": c.expression, "device": json.loads(c.device)})
        for i, c in enumerate(cases)
    ]
    proc = subprocess.run(
        [str(binary)], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"celeval exited {proc.returncode}: {proc.stderr[-2000:]}")
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    if [r["id"] for r in results] != [str(i) for i in range(len(cases))]:
        raise RuntimeError(f"celeval answered {len(results)} lines for {len(cases)} cases, or out of order")
    return [Outcome(r["outcome"], r.get("message", "")) for r in results]


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
