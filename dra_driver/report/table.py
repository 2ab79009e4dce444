"""The GPU-hours report as text: a table (per namespace, or per claim when wide) or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence

from dra_driver.report.gpu_hours import Row


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def as_table(rows: Sequence[Row], *, wide: bool) -> str:
    head = ["NAMESPACE", *(["CLAIM"] if wide else []), "HELD GPU-H", "IDLE GPU-H", "IDLE %", "UTILISED GPU-H"]
    lines = [head]
    for r in rows:
        claim = [r.claim or ""] if wide else []
        pct = f"{100 * r.idle_fraction:.0f}"
        lines.append([r.namespace, *claim, _hours(r.held), _hours(r.idle), pct, _hours(r.utilized)])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text_columns = 2 if wide else 1
    out = []
    for line in lines:
        cells = [
            c.ljust(w) if i < text_columns else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def as_json(rows: Sequence[Row]) -> str:
    return json.dumps(
        [
            {
                "namespace": r.namespace,
                **({"claim": r.claim} if r.claim is not None else {}),
                "held_gpu_hours": r.held,
                "idle_gpu_hours": r.idle,
                "utilized_gpu_hours": r.utilized,
            }
            for r in rows
        ],
        indent=2,
    )
