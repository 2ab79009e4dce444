"""PCI addresses and topology in the forms Kubernetes' standard attributes use."""

from __future__ import annotations

import os
import re
from pathlib import Path

# k8s.io/dynamic-resource-allocation's verifyPCIBDFFormat: a bus id it refuses gets no NUMA attribute from it either.
_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]\Z")
_GO_INT = re.compile(r"[+-]?[0-9]+\Z")
_INT64 = range(-(1 << 63), 1 << 63)


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


def _atoi(text: str) -> int:
    """Go's strconv.Atoi, which upstream reads sysfs numbers with: ASCII digits and a sign only (Python's int() would
    take `1_0` and other scripts' digits), within int64; ValueError otherwise."""
    if not _GO_INT.match(text) or int(text) not in _INT64:
        raise ValueError(f"invalid syntax: {text!r}")
    return int(text)


def _read_int(path: Path) -> int:
    """readSysfsInt: the file's text, trimmed, as an int; OSError or ValueError when unreadable."""
    return _atoi(path.read_text().strip())


def numa_node(bdf: str, sysfs_root: Path) -> int | None:
    """The NUMA node the kernel gives a PCI device (`numa_node` in sysfs, as k8s.io/dynamic-resource-allocation's
    deviceattribute reads it); None when unknown or -1 (no affinity: such a device publishes no NUMA attribute,
    which would otherwise match every other device without one)."""
    try:
        value = _read_int(sysfs_root / "bus" / "pci" / "devices" / bdf / "numa_node")
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def numa_nodes(bdf: str, sysfs_root: Path) -> tuple[int, ...]:
    """The list form of `numaNode` (upstream's GetNUMANodeAttributeByPCIBusID with ListAttribute): the device's own
    node first, then the other nodes of its socket at the least SLIT distance from it, in ascending order (sub-NUMA
    clustering splits a socket into nodes that are equally close to the device); just the own node when the distance
    table cannot be read. Empty where `numa_node` gives None."""
    if not _BDF.match(bdf):
        return ()
    physical = numa_node(bdf, sysfs_root)
    if physical is None:
        return ()
    equidistant = _equidistant_nodes(sysfs_root, physical) or [physical]
    return (physical, *(n for n in equidistant if n != physical))


def _equidistant_nodes(sysfs_root: Path, node: int) -> list[int] | None:
    """getEquidistantNUMANodes: `node` and the nodes at the least distance from it (its own excepted) in its row of
    the SLIT table, sorted, less those known to sit on another socket; None where upstream returns an error (no
    distance file, an empty or short row, a value that is no number)."""
    try:
        fields = (sysfs_root / "devices" / "system" / "node" / f"node{node}" / "distance").read_text().split()
        distances = [_atoi(f) for f in fields]
    except (OSError, ValueError):
        return None
    if not distances or node >= len(distances):
        return None
    others = [d for i, d in enumerate(distances) if i != node]
    if not others:
        return [node]
    least = min(others)
    socket = _socket(sysfs_root, node)
    nodes = []
    for i, d in enumerate(distances):
        if i != node and d != least:
            continue
        if i != node and socket is not None:
            # A candidate is dropped only when its socket is known and differs: a node whose socket cannot be told
            # (a CPU-less memory node has an empty cpulist) is kept, as upstream keeps it, rather than risk dropping
            # a node of the same socket.
            theirs = _socket(sysfs_root, i)
            if theirs is not None and theirs != socket:
                continue
        nodes.append(i)
    return sorted(nodes)


def _socket(sysfs_root: Path, node: int) -> int | None:
    """getSocketForNUMANode: the physical package of one CPU of the node's cpulist; None when the node has no CPUs or
    either file is unreadable. Upstream takes whichever CPU its set's map yields first; the kernel keeps a node's
    CPUs on one package, so any one answers, and the lowest keeps this deterministic."""
    try:
        cpu = _first_cpu((sysfs_root / "devices" / "system" / "node" / f"node{node}" / "cpulist").read_text().strip())
        if cpu is None:
            return None
        path = sysfs_root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology" / "physical_package_id"
        return _read_int(path)
    except (OSError, ValueError):
        return None


def _first_cpu(cpulist: str) -> int | None:
    """The lowest CPU of a cpulist (`0-27,112-139`) parsed as k8s.io/utils' cpuset.Parse parses it; None for the empty
    list, ValueError where Parse fails (a field that is no number, a range that runs backwards)."""
    if not cpulist:
        return None
    first: int | None = None
    for part in cpulist.split(","):
        low, dash, high = part.partition("-")
        start = _atoi(low)
        end = _atoi(high) if dash else start
        if start > end:
            raise ValueError(f"invalid range {part!r}")
        first = start if first is None else min(first, start)
    return first
