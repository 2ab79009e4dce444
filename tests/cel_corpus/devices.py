"""Devices the selectors run against: our simulator's published slices plus a few hand-made edge devices.

Every device is a `{"driver", "attributes", "capacity", "allowMultipleAllocations"}` dict, the JSON both evaluators
read (attributes and capacity exactly as in a ResourceSlice).
"""

from __future__ import annotations

import copy
import json
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from dra_driver.nvml.discovery import discover
from dra_driver.simulator.catalog import machine_names
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME
from dra_driver.slices.builder import build_slices

Device = dict[str, Any]
OTHER_DRIVER = "gpu.nvidia.com"  # a second driver: unqualified names land in its domain instead


def _slice_devices(machine: str, state: Path) -> list[Device]:
    sim = SimulatedNvml(machine, state)
    sim.nvmlInit()
    try:
        inventory = discover(sim, sim.sysfs_root)
    finally:
        sim.nvmlShutdown()
    out = []
    for s in build_slices(inventory, node_name="node-a", k8s_version="1.36"):
        api = s.to_api()
        for dev in api["spec"].get("devices") or []:
            out.append(
                {
                    "driver": api["spec"]["driver"],
                    "attributes": dev.get("attributes") or {},
                    "capacity": dev.get("capacity") or {},
                    "allowMultipleAllocations": bool(dev.get("allowMultipleAllocations", False)),
                }
            )
    return out


@cache
def simulator_devices() -> tuple[str, ...]:
    """Every machine's devices, deduplicated by content (UUIDs and bus IDs make most GPUs distinct), as JSON."""
    seen: dict[str, None] = {}
    with tempfile.TemporaryDirectory(prefix="cel-corpus-") as tmp:
        for i, machine in enumerate(machine_names()):
            for dev in _slice_devices(machine, Path(tmp) / f"{i}"):
                seen.setdefault(json.dumps(dev, sort_keys=True))
    return tuple(seen)


def _pick(kind: str, product: str) -> Device:
    for text in simulator_devices():
        dev: Device = json.loads(text)
        attrs = dev["attributes"]
        if attrs["type"]["string"] == kind and product in attrs["productName"]["string"]:
            return dev
    raise LookupError(f"no simulated {kind} device of {product}")


@cache
def named_devices() -> dict[str, str]:
    """Hand-picked devices for the hand-written corpus, by name (JSON text: cached values must stay immutable)."""
    h100, mig, a100 = _pick("gpu", "H100"), _pick("mig", "H100"), _pick("gpu", "A100")
    other = copy.deepcopy(h100)
    other["driver"] = OTHER_DRIVER
    shared = copy.deepcopy(mig)
    shared["allowMultipleAllocations"] = True
    list_attr = copy.deepcopy(
        h100
    )  # a list attribute (DRAListTypeAttributes, alpha; read whatever the gate since 1.37)
    list_attr["attributes"]["nvlinkPeers"] = {"ints": [1, 2, 3]}
    two_values = copy.deepcopy(h100)  # invalid in the API, but what does each evaluator do with it?
    two_values["attributes"]["index"] = {"int": 0, "string": "zero"}
    qualified = copy.deepcopy(a100)  # names spelled with the driver's domain resolve like bare ones
    attrs = a100["attributes"]
    qualified["attributes"] = {k if "/" in k else f"{DEFAULT_DRIVER_NAME}/{k}": v for k, v in attrs.items()}
    devices = {
        "h100": h100,
        "mig": mig,
        "a100": a100,
        "other-driver": other,
        "shared": shared,
        "list-attribute": list_attr,
        "two-values": two_values,
        "qualified": qualified,
    }
    return {name: json.dumps(dev, sort_keys=True) for name, dev in devices.items()}


DEFAULT_DEVICES = ("h100", "mig", "other-driver")  # what a hand-written case runs against unless it names others
