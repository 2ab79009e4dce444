"""Throughput of DRA CEL device selectors over the devices of simulated dgx-h100 nodes.

Run: python bench/bench_cel.py [--nodes N] [--go-iterations K]. For each selector: compile time (cache cleared);
the cold evaluation rate over one node's devices, where cold = the device converted into CEL values afresh and then
evaluated, no memo (what Kubernetes does on every call); and the memoised rate over a fleet of N identical nodes
(devices differ in uuid/PCI attributes, like real nodes), where `matches` evaluates once per distinct value of what
the selector reads. Next to them, Kubernetes' own evaluator (tools/celeval -bench, built with Go when available) on
the same selectors and devices: its cold rate (cel.Device -> DeviceMatches, which rebuilds the attribute and capacity
maps every call, with the compiled program reused as the scheduler's cache does). Go has no memo, so the memoised
ratio compares our memoised rate with Go's cold one.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from dra_driver.cel import CelDevice, clear_cache, compile_selector
from dra_driver.nvml.discovery import discover
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.builder import build_slices


def node_devices() -> tuple[str, list[dict[str, Any]]]:
    with tempfile.TemporaryDirectory() as tmp:
        sim = SimulatedNvml("dgx-h100", tmp)
        slices = build_slices(discover(sim, sim.sysfs_root), node_name="n")
    driver = slices[0].spec.driver
    return driver, [d.to_api() for s in slices for d in s.spec.devices or []]


def fleet(driver: str, devices: list[dict[str, Any]], nodes: int) -> list[CelDevice]:
    out: list[CelDevice] = []
    for n in range(nodes):
        for dev in devices:
            attrs = dict(dev["attributes"])
            for key in ("uuid", "parentUUID"):
                if key in attrs:
                    attrs[key] = {"string": f"{attrs[key]['string']}-node{n}"}
            out.append(CelDevice.from_slice_device(driver, {**dev, "attributes": attrs}))
    return out


def selectors(d: str) -> dict[str, str]:
    return {
        "driver": f'device.driver == "{d}"',
        "gpu type": f'device.attributes["{d}"].type == "gpu"',
        "product regex": f'device.attributes["{d}"].productName.lowerAscii().matches("h100|h200")',
        "memory >= 40Gi": f'device.capacity["{d}"].memory.compareTo(quantity("40Gi")) >= 0',
        "driver semver": f'device.attributes["{d}"].driverVersion.isGreaterThan(semver("535.0.0"))',
        "mig profile": (
            f'device.attributes["{d}"].type == "mig" && '
            f'device.attributes["{d}"].profile.startsWith("1g.") && '
            f'device.capacity["{d}"].memory.isGreaterThan(quantity("9Gi"))'
        ),
        "optional+bind": (
            f'cel.bind(a, device.attributes["{d}"], a.?profile.orValue("").size() == 0 && '
            f'a.architecture in ["Hopper", "Blackwell"])'
        ),
        "pcie root (k8s)": 'device.attributes["resource.kubernetes.io"].pcieRoot.startsWith("pci0000:")',
    }


ROOT = Path(__file__).resolve().parent.parent


def go_evaluator() -> Path | None:
    """tools/celeval, built (or reused from its cache) by scripts/build-celeval.sh; None without Go."""
    env = {**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/local/go/bin"}
    try:
        out = subprocess.run(
            [str(ROOT / "scripts" / "build-celeval.sh")], capture_output=True, text=True, timeout=1800, env=env
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else None


def go_cold_rate(binary: Path, expr: str, driver: str, devices: list[dict[str, Any]], iterations: int) -> float:
    """Kubernetes' cold evaluations per second of `expr` over `devices` (mean of the per-device ns/op)."""
    lines = [
        json.dumps({"id": str(i), "expression": expr, "device": {**dev, "driver": driver}})
        for i, dev in enumerate(devices)
    ]
    out = subprocess.run(
        [str(binary), "-bench", str(iterations)],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    ns = [json.loads(line).get("ns_per_op") for line in out.stdout.splitlines()]
    timed = [n for n in ns if n]
    return 1e9 * len(timed) / sum(timed) if timed else float("nan")


def cold_rate(sel: Any, node: list[CelDevice], rounds: int) -> float:
    """Our cold evaluations per second: conversion dropped and redone before every evaluation, no memo."""
    start = time.perf_counter()
    for _ in range(rounds):
        for dev in node:
            dev.__dict__.pop("converted", None)  # the cached conversion (a cached_property)
            sel.evaluate(dev)
    return rounds * len(node) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=100, help="identical nodes in the memoised fleet")
    parser.add_argument("--compiles", type=int, default=50, help="compilations averaged per selector")
    parser.add_argument("--go-iterations", type=int, default=100, help="Go evaluations per device and selector")
    parser.add_argument(
        "--runs", type=int, default=5, help="cold rates: the best of this many runs (noise only slows a run down)"
    )
    parser.add_argument("--no-go", action="store_true", help="skip Kubernetes' evaluator")
    args = parser.parse_args()
    binary = None if args.no_go else go_evaluator()

    driver, devices = node_devices()
    node = fleet(driver, devices, 1)
    for dev in node:
        dev.cel_value()
    t0 = time.perf_counter()
    many = fleet(driver, devices, args.nodes)
    for dev in many:
        dev.cel_parts  # noqa: B018  (the value and the raw index the memo keys read)
    convert_us = (time.perf_counter() - t0) / len(many) * 1e6

    print(f"dgx-h100: {len(devices)} devices per node; fleet of {args.nodes} nodes = {len(many)} devices")
    print(
        f"CelDevice.from_slice_device + conversion to CEL values and memo index (once per device): {convert_us:.1f} us"
    )
    print(f"Go evaluator: {binary or 'unavailable (no Go toolchain): Go columns are blank'}")
    print("cold = convert the device + evaluate, no memo; Go has no memo: 'memo/Go' divides our memoised rate by Go's")
    print("cold rate; 'Go/ours cold' is how many times slower our cold evaluation is (the aim: at most 2).")
    header = (
        f"{'selector':<16} {'compile ms':>10} {'cold evals/s':>12} {'Go cold/s':>10} {'Go/ours cold':>12}"
        f" {'memo evals/s':>12} {'memo/Go':>8} {'distinct':>8} {'matched':>7}"
    )
    print(header)
    print("-" * len(header))
    for name, expr in selectors(driver).items():
        start = time.perf_counter()
        for _ in range(args.compiles):
            clear_cache()
            compile_selector(expr)
        compile_ms = (time.perf_counter() - start) / args.compiles * 1e3

        sel = compile_selector(expr)
        cold, go = 0.0, float("nan")
        for _ in range(args.runs):  # alternated, so that both sides see the same background load
            cold = max(cold, cold_rate(sel, node, 5))
            if binary:
                go = max(go if go == go else 0.0, go_cold_rate(binary, expr, driver, devices, args.go_iterations))

        sel.clear_memo()
        sel.evaluations = 0
        gc.collect()  # the fleet's garbage must not land on whichever selector runs first
        start = time.perf_counter()
        matched = sum(sel.matches(dev) for dev in many)
        memo = len(many) / (time.perf_counter() - start)
        print(
            f"{name:<16} {compile_ms:>10.3f} {cold:>12,.0f} {go:>10,.0f} {go / cold:>12.2f}"
            f" {memo:>12,.0f} {memo / go:>8.1f} {sel.evaluations:>8} {matched:>7}"
        )


if __name__ == "__main__":
    main()
