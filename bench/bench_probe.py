"""`dra-driver probe`, the chart's startup, liveness and readiness check, per run: through the command's entry point
(dra_driver.entry: gRPC's health client and the socket names only) and through the whole CLI (dra_driver.cli, as
the command ran before: the driver's pydantic models, the Kubernetes client, the plugin's servers), alternating in
one run against a serving plugin. The kubelet runs it in the driver's container every few seconds.

Run: python bench/bench_probe.py [--runs 15]. Prints a table (median and p90 CPU time and wall time per run).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry

from dra_driver.plugin.grpc.server import PluginServer
from dra_driver.plugin.types import PrepareResult

DRIVER = "gpu.dra-driver.dev"
WAYS = {
    "entry point (dra_driver.entry)": "from dra_driver.entry import main",
    "whole CLI (dra_driver.cli)": "from dra_driver.cli import main",
}


class Idle:
    def prepare(self, claims: object, call: object = None) -> dict[str, PrepareResult]:
        return {}

    def unprepare(self, claims: object, call: object = None) -> dict[str, str | None]:
        return {}


def run_once(code: str, argv: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one probe process; it must pass."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    script = f"import sys; {code}; sys.exit(main({argv!r}))"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def p90(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.9 * len(values)) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="probe-", dir="/tmp") as tmp:
        dirs = (Path(tmp) / "plugins" / DRIVER, Path(tmp) / "registry")
        server = PluginServer(Idle(), DRIVER, *dirs, CollectorRegistry(), grace_period_s=0)  # type: ignore[arg-type]
        argv = ["probe", f"--driver={DRIVER}", f"--plugin-dir={dirs[0]}", f"--registry-dir={dirs[1]}"]
        with server:
            results: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
            for _ in range(args.runs):
                for way, code in WAYS.items():  # alternating: the machine's noise falls on both
                    results[way].append(run_once(code, argv))
    print(f"dra-driver probe against a serving plugin, {args.runs} runs each, alternating")
    print(f"{'how the command starts':34} {'CPU p50':>8} {'CPU p90':>8} {'wall p50':>9} {'wall p90':>9}")
    for way, runs in results.items():
        cpu, wall = [r[0] for r in runs], [r[1] for r in runs]
        print(f"{way:34} {statistics.median(cpu):7.2f}s {p90(cpu):7.2f}s {statistics.median(wall):8.2f}s "
              f"{p90(wall):8.2f}s")  # fmt: skip


if __name__ == "__main__":
    main()
