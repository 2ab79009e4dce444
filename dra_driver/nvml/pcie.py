"""PCI addresses and topology in the forms Kubernetes' standard attributes use."""

from __future__ import annotations

import os
from pathlib import Path


def normalize_bus_id(nvml_bus_id: str) -> str:
    """NVML's `00000000:1B:00.0` -> the extended BDF `0000:1b:00.0` of `resource.kubernetes.io/pciBusID`."""
    domain, bus, devfn = nvml_bus_id.strip().lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{devfn}"


def pcie_root(bdf: str, sysfs_root: Path) -> str | None:
    """The root complex (`pci<domain>:<bus>`) a PCI device hangs off, read from sysfs; None when unknown."""
    link = sysfs_root / "bus" / "pci" / "devices" / bdf
    if not link.exists():
        return None
    for part in Path(os.path.realpath(link)).parts:
        if part.startswith("pci") and ":" in part:
            return part
    return None


def numa_node(bdf: str, sysfs_root: Path) -> int | None:
    """The NUMA node the kernel gives a PCI device (`numa_node` in sysfs, as k8s.io/dynamic-resource-allocation's
    deviceattribute reads it); None when unknown or -1 (no affinity: such a device publishes no NUMA attribute,
    which would otherwise match every other device without one)."""
    try:
        value = int((sysfs_root / "bus" / "pci" / "devices" / bdf / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None
