"""A fake sysfs tree with the PCI topology of a simulated machine, so PCIe-root and NUMA discovery read a real
directory layout (`/sys/bus/pci/devices/<bdf>` -> `/sys/devices/pci<dom>:<bus>/.../<bdf>`, with its `numa_node`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from dra_driver.nvml.pcie import normalize_bus_id
from dra_driver.simulator.catalog import MachineGpu


def write_fake_sysfs(root: Path, gpus: Sequence[MachineGpu]) -> Path:
    bus_dir = root / "bus" / "pci" / "devices"
    bus_dir.mkdir(parents=True, exist_ok=True)
    for gpu in gpus:
        bdf = normalize_bus_id(gpu.pci_bus_id)
        domain = bdf.split(":")[0]
        bridge = f"{domain}:{int(bdf.split(':')[1], 16) - 1:02x}:00.0"  # the switch port above the GPU
        device_dir = root / "devices" / gpu.pcie_root / bridge / bdf
        device_dir.mkdir(parents=True, exist_ok=True)
        (device_dir / "numa_node").write_text(f"{gpu.numa_node}\n")
        link = bus_dir / bdf
        if not link.is_symlink():
            os.symlink(os.path.relpath(device_dir, bus_dir), link)
    return root
