"""A fake sysfs tree with the PCI and NUMA topology of a simulated machine, so PCIe-root and NUMA discovery read a
real directory layout: `/sys/bus/pci/devices/<bdf>` -> `/sys/devices/pci<dom>:<bus>/.../<bdf>`, with its
`numa_node`; `/sys/devices/system/node/nodeN/{distance,cpulist}` and
`/sys/devices/system/cpu/cpuX/topology/physical_package_id`, which the list form of `numaNode` reads to find the
same-socket nodes as close as the GPU's own (sub-NUMA clustering)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from dra_driver.nvml.pcie import normalize_bus_id
from dra_driver.simulator.catalog import MachineGpu, NumaTopology


def _cpulist(ranges: Sequence[range]) -> str:
    """The kernel's cpulist format: `0-27,112-139`."""
    return ",".join(f"{r.start}-{r.stop - 1}" if len(r) > 1 else str(r.start) for r in ranges)


def _write_numa(root: Path, numa: NumaTopology) -> None:
    system = root / "devices" / "system"
    for node in range(numa.nodes):
        node_dir = system / "node" / f"node{node}"
        node_dir.mkdir(parents=True, exist_ok=True)
        (node_dir / "distance").write_text(" ".join(map(str, numa.distances(node))) + "\n")
        ranges = numa.cpu_ranges(node)
        (node_dir / "cpulist").write_text(_cpulist(ranges) + "\n")
        for cpu in (c for r in ranges for c in r):
            topology = system / "cpu" / f"cpu{cpu}" / "topology"
            topology.mkdir(parents=True, exist_ok=True)
            (topology / "physical_package_id").write_text(f"{numa.socket(node)}\n")


def write_fake_sysfs(root: Path, gpus: Sequence[MachineGpu], numa: NumaTopology | None = None) -> Path:
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
    if numa is not None:
        _write_numa(root, numa)
    return root
