"""The GPU-hours report as a chart: per namespace (or claim), bars of GPU-hours held, idle and utilised.

matplotlib is an optional dependency (the `report` extra): imported only here, only when a plot is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dra_driver.report.gpu_hours import Row


def plot(rows: Sequence[Row], path: Path, *, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError("--plot needs matplotlib: pip install 'dra-driver[report]'") from e
    labels = [r.namespace if r.claim is None else f"{r.namespace}/{r.claim}" for r in rows]
    ys = range(len(rows))
    height = 0.27
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.6 * len(rows)), layout="constrained")
    try:
        ax.barh([y - height for y in ys], [r.held for r in rows], height, label="held", color="#4c72b0")
        ax.barh(list(ys), [r.idle for r in rows], height, label="idle", color="#dd8452")
        utilized = [r.utilized or 0.0 for r in rows]
        ax.barh([y + height for y in ys], utilized, height, label="utilised", color="#55a868")
        ax.set_yticks(list(ys), labels)
        ax.invert_yaxis()  # the idlest (first row) on top
        ax.set_xlabel("GPU-hours")
        ax.set_title(title)
        ax.legend(loc="lower right")
        ax.grid(axis="x", alpha=0.3)
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
