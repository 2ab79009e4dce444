"""A fake sysfs tree with the PCI topology of a simulated machine, so PCIe-root discovery reads a real
directory layout (`/sys/bus/pci/devices/<bdf>` -> `/sys/devices/pci<dom>:<bus>/.../<bdf>`)."""

from __future__ import annotations

import os
from pathlib import Path

from dra_driver.nvml.pcie import normalize_bus_id


def write_fake_sysfs(root: Path, nvml_bus_ids: list[str], pcie_roots: list[str]) -> Path:
    bus_dir = root / "bus" / "pci" / "devices"
    bus_dir.mkdir(parents=True, exist_ok=True)
    for bus_id, pcie_root in zip(nvml_bus_ids, pcie_roots, strict=True):
        bdf = normalize_bus_id(bus_id)
        domain = bdf.split(":")[0]
        bridge = f"{domain}:{int(bdf.split(':')[1], 16) - 1:02x}:00.0"  # the switch port above the GPU
        device_dir = root / "devices" / pcie_root / bridge / bdf
        device_dir.mkdir(parents=True, exist_ok=True)
        link = bus_dir / bdf
        if not link.is_symlink():
            os.symlink(os.path.relpath(device_dir, bus_dir), link)
    return root
