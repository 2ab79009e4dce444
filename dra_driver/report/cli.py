"""`dra-driver report`: GPU-hours held, idle and utilised per namespace (or claim), from Prometheus."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dra_driver.report.duration import parse_duration
from dra_driver.report.prometheus import DEFAULT_TIMEOUT, Prometheus, PrometheusError


def add_subcommand(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="GPU-hours held, idle and utilised per namespace (or claim), the idlest first, from Prometheus",
        description="Reads the GPU-hours recording rules (deploy/prometheus/rules.yaml) from Prometheus.",
    )
    p.add_argument("--prometheus", required=True, metavar="URL", help="e.g. http://prometheus.monitoring:9090")
    p.add_argument("--since", default="7d", help="the window before now: 7d, 12h, 90m, 1h30m (default 7d)")
    p.add_argument("--step", type=int, metavar="SECONDS", help="sampling step (default: window/10000, at least 1)")
    p.add_argument("-o", "--output", choices=["table", "wide", "json"], default="table", help="wide: per claim")
    p.add_argument("--plot", type=Path, metavar="FILE.png", help="also draw the report as a bar chart (matplotlib)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds for each query (default 30)")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from dra_driver.report.gpu_hours import gpu_hours
    from dra_driver.report.table import as_json, as_table

    since_s = parse_duration(args.since)
    wide = args.output in ("wide", "json")
    try:
        rows = gpu_hours(Prometheus(args.prometheus, timeout=args.timeout), since_s, wide=wide, step_s=args.step)
    except PrometheusError as e:
        print(f"dra-driver report: {e}", file=sys.stderr)
        return 1
    print(as_json(rows) if args.output == "json" else as_table(rows, wide=wide))
    if args.plot is not None:
        from dra_driver.report.plot import plot

        try:
            plot(rows, args.plot, title=f"GPU-hours over the last {args.since}, the idlest first")
        except RuntimeError as e:
            print(f"dra-driver report: {e}", file=sys.stderr)
            return 1
    return 0
