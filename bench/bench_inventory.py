"""Time to discover a simulated dgx-h200 (8 GPUs) and build all its ResourceSlices (every MIG placement).

Run: python bench/bench_inventory.py [--runs N]. Prints a table; the first run of a fresh process (cold
caches) is reported separately from the steady state. Target: under 200 ms in-process.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from dra_driver.nvml.discovery import discover
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.builder import build_slices


def one_run(sim: SimulatedNvml, version: str) -> tuple[float, float, int, int]:
    t0 = time.perf_counter()
    inv = discover(sim, sim.sysfs_root)
    t1 = time.perf_counter()
    slices = build_slices(inv, node_name="bench-node", k8s_version=version)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3, len(slices), sum(len(s.spec.devices or []) for s in slices)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--machine", default="dgx-h200")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as state:
        sim = SimulatedNvml(args.machine, Path(state))
        rows = []
        for version in ("1.35", "1.34"):
            cold = one_run(sim, version)
            warm = [one_run(sim, version) for _ in range(args.runs)]
            rows.append((version, "cold (first)", cold[0], cold[1], cold[2], cold[3]))
            for label, pick in (("median", statistics.median), ("max", max)):
                d, b = pick(w[0] for w in warm), pick(w[1] for w in warm)
                rows.append((version, f"{label} of {args.runs}", d, b, warm[0][2], warm[0][3]))
    print(f"{args.machine}: discover + build ResourceSlices, in-process (ms)")
    print(f"{'k8s':<5} {'run':<14} {'discover':>9} {'build':>8} {'total':>8} {'slices':>7} {'devices':>8}")
    for version, label, d, b, n_slices, n_devices in rows:
        print(f"{version:<5} {label:<14} {d:>9.1f} {b:>8.1f} {d + b:>8.1f} {n_slices:>7} {n_devices:>8}")


if __name__ == "__main__":
    main()
