"""What `.ci/run`'s Python set-up choices cost on this machine, side by side in one run.

- bytecode: the CPU of one process that imports what a node daemon imports, where the environment sets
  PYTHONDONTWRITEBYTECODE and no bytecode exists (every process compiles the driver and its libraries again), against
  one that finds bytecode in a PYTHONPYCACHEPREFIX written once (what `.ci/run` does). Runs alternate.
- install (`--install`): a fresh venv with the project's dev dependencies, by pip (its venv, its upgrade, the install)
  and by uv (`uv venv --seed`, `uv pip install`), each from warm download caches. Needs the network and uv on PATH
  or in ~/.cache/dra-driver.

Run: python bench/bench_ci_setup.py [--runs N] [--install]. Prints a table.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORTS = (
    "import dra_driver.daemon, dra_driver.cli, dra_driver.simulator.nvml, dra_driver.plugin.selectors as s; s.warm_up()"
)


def _child_cpu(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[float, float]:
    """(CPU seconds of the children, wall seconds) of running `cmd`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, wall


def bytecode(runs: int) -> list[tuple[str, float, float]]:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    with tempfile.TemporaryDirectory() as tmp:
        none, cache = Path(tmp) / "none", Path(tmp) / "cache"
        without = {**base, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(none)}
        written = {**base, "PYTHONPYCACHEPREFIX": str(cache)}
        cmd = [sys.executable, "-c", IMPORTS]
        _child_cpu(cmd, written)  # writes the cache once, as a run's first process does
        results: dict[str, list[tuple[float, float]]] = {"no bytecode (compiled each time)": [], "bytecode cache": []}
        for _ in range(runs):
            results["no bytecode (compiled each time)"].append(_child_cpu(cmd, without))
            results["bytecode cache"].append(_child_cpu(cmd, written))
    return [(k, statistics.median(c for c, _ in v), statistics.median(w for _, w in v)) for k, v in results.items()]


def _uv() -> str | None:
    cached = Path(os.environ.get("DRA_DRIVER_CACHE") or Path.home() / ".cache" / "dra-driver") / "uv-0.13.9" / "bin"
    return shutil.which("uv") or (str(cached / "uv") if (cached / "uv").exists() else None)


def install() -> list[tuple[str, float, float]]:
    uv = _uv()
    if uv is None:
        raise SystemExit("uv not found: run .ci/run once (it caches uv) or put uv on PATH")
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, steps in (
            ("pip", [[sys.executable, "-m", "venv", "{venv}"],
                     ["{venv}/bin/python", "-m", "pip", "install", "-q", "--upgrade", "pip"],
                     ["{venv}/bin/python", "-m", "pip", "install", "-q", "-e", ".[dev]"]]),
            ("uv", [[uv, "venv", "-q", "--seed", "--python", sys.executable, "{venv}"],
                    [uv, "pip", "install", "-q", "--python", "{venv}/bin/python", "-e", ".[dev]"]]),
        ):  # fmt: skip
            venv = Path(tmp) / name
            cpu = wall = 0.0
            for step in steps:
                c, w = _child_cpu([a.format(venv=venv) for a in step], env, cwd=ROOT)
                cpu, wall = cpu + c, wall + w
            rows.append((f"fresh venv + dev install by {name}", cpu, wall))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--install", action="store_true")
    args = parser.parse_args()
    rows = bytecode(args.runs)
    if args.install:
        rows += install()
    print(f"{'what':<40} {'CPU s':>7} {'wall s':>7}")
    for name, cpu, wall in rows:
        print(f"{name:<40} {cpu:>7.2f} {wall:>7.2f}")


if __name__ == "__main__":
    main()
