"""Throughput of DRA CEL device selectors over the devices of simulated dgx-h100 nodes.

Run: python bench/bench_cel.py [--nodes N]. For each selector: compile time (cache cleared), cold evaluation
rate (every device evaluated, no memo) over one node's devices, and the memoised rate over a fleet of N identical
nodes (devices differ in uuid/PCI attributes, like real nodes), where `matches` evaluates only once per distinct
value of what the selector reads. Device conversion (JSON -> CEL values, once per device) is reported apart.
"""

from __future__ import annotations

import argparse
import tempfile
import time
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=100, help="identical nodes in the memoised fleet")
    parser.add_argument("--compiles", type=int, default=50, help="compilations averaged per selector")
    args = parser.parse_args()

    driver, devices = node_devices()
    node = fleet(driver, devices, 1)
    for dev in node:
        dev.cel_value()
    t0 = time.perf_counter()
    many = fleet(driver, devices, args.nodes)
    for dev in many:
        dev.cel_value()
    convert_us = (time.perf_counter() - t0) / len(many) * 1e6

    print(f"dgx-h100: {len(devices)} devices per node; fleet of {args.nodes} nodes = {len(many)} devices")
    print(f"CelDevice.from_slice_device + conversion to CEL values (once per device): {convert_us:.1f} us")
    header = f"{'selector':<18} {'compile ms':>10} {'cold evals/s':>13} {'cold us/eval':>13} {'memo evals/s':>13}"
    print(header + f" {'distinct':>8} {'matched':>8}")
    print("-" * (len(header) + 18))
    for name, expr in selectors(driver).items():
        start = time.perf_counter()
        for _ in range(args.compiles):
            clear_cache()
            compile_selector(expr)
        compile_ms = (time.perf_counter() - start) / args.compiles * 1e3

        sel = compile_selector(expr)
        rounds = 20
        start = time.perf_counter()
        for _ in range(rounds):
            for dev in node:
                sel.evaluate(dev)
        cold = rounds * len(node) / (time.perf_counter() - start)

        sel.clear_memo()
        sel.evaluations = 0
        start = time.perf_counter()
        matched = sum(sel.matches(dev) for dev in many)
        memo = len(many) / (time.perf_counter() - start)
        print(
            f"{name:<18} {compile_ms:>10.3f} {cold:>13,.0f} {1e6 / cold:>13.1f} {memo:>13,.0f}"
            f" {sel.evaluations:>8} {matched:>8}"
        )


if __name__ == "__main__":
    main()
