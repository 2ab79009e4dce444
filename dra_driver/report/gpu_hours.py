"""GPU-hours held, idle and utilised per namespace (or per claim) over a window, from the recording rules.

Each measure is one instant query: the recorded GPUs held / idle / utilised now (dra_driver.report.rules), summed
over the window by a subquery sampling them every `step` seconds, times `step`: an integral accurate to a step at
each end of a claim's life. Wider steps for longer windows keep a query under Prometheus's 11,000 points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dra_driver.report.duration import promql_duration
from dra_driver.report.prometheus import Prometheus, PrometheusError
from dra_driver.report.rules import MEASURES, rate_rule

MAX_POINTS = 10_000


class NoData(PrometheusError):
    """Prometheus answers, but has nothing to report over the window."""


@dataclass(frozen=True)
class Row:
    namespace: str
    claim: str | None  # None in a per-namespace report
    held: float  # GPU-hours
    idle: float
    utilized: float | None  # None: no utilisation reading on its devices (MIG partitions)

    @property
    def idle_fraction(self) -> float:
        return self.idle / self.held if self.held else 0.0


def auto_step(since_s: float) -> int:
    return max(1, math.ceil(since_s / MAX_POINTS))


def gpu_hours(
    prometheus: Prometheus, since_s: float, *, wide: bool = False, step_s: int | None = None, at: float | None = None
) -> list[Row]:
    """Rows over the `since_s` seconds before `at` (default: now), the most idle GPU-hours first."""
    step = step_s or auto_step(since_s)
    by = ("namespace", "claim") if wide else ("namespace",)
    window = f"[{promql_duration(since_s)}:{step}s]"
    totals: dict[str, dict[tuple[str, ...], float]] = {}
    for measure in MEASURES:
        promql = f"sum by ({', '.join(by)}) (sum_over_time({rate_rule(measure)}{window})) * {step} / 3600"
        totals[measure] = {tuple(s.metric.get(k, "") for k in by): s.number for s in prometheus.query(promql, at)}
    if not totals["held"]:
        raise NoData(_why_empty(prometheus, since_s, at))
    rows = [
        Row(
            namespace=key[0],
            claim=key[1] if wide else None,
            held=held,
            idle=totals["idle"].get(key, 0.0),
            utilized=totals["utilized"].get(key),
        )
        for key, held in totals["held"].items()
    ]
    return sorted(rows, key=lambda r: (-r.idle, -r.idle_fraction, r.namespace, r.claim or ""))


def _why_empty(prometheus: Prometheus, since_s: float, at: float | None) -> str:
    window = promql_duration(since_s)
    scraped = prometheus.query(f"count(count_over_time(dra_driver_gpu_up[{window}]))", at)
    if not scraped:
        return (
            f"Prometheus at {prometheus.url} has no dra_driver_gpu metrics over the last {window}: is it scraping "
            "the node daemons' metrics port (dra-driver plugin --metrics-port)?"
        )
    return (
        f"Prometheus at {prometheus.url} has GPU metrics but no GPU-hours over the last {window}: either no claim "
        "held a GPU, or the recording rules (deploy/prometheus/rules.yaml) are not loaded"
    )
