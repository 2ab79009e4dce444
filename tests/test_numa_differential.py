"""The `numaNode` attribute, ours (nvml.pcie.numa_nodes, through discovery) against upstream's
(k8s.io/dynamic-resource-allocation/deviceattribute's GetNUMANodeAttributeByPCIBusID, through `allocbench numa`) in
both forms: for every GPU of every simulated machine, on hand-made sysfs trees for the fallbacks (no distance file, a
CPU-less memory node, numa_node -1, an equidistant node of the other socket, unreadable and malformed files) and on
seeded random trees. Skipped without Go unless DRA_K8S_REQUIRE=1."""

from __future__ import annotations

import json
import os
import random
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dra_driver.nvml.discovery import discover
from dra_driver.nvml.pcie import numa_node, numa_nodes
from dra_driver.simulator.catalog import machine_names
from dra_driver.simulator.nvml import SimulatedNvml
from tests.test_allocbench import build_allocbench


def upstream(root: Path, bdfs: list[str]) -> dict[str, dict[str, Any]]:
    """allocbench numa's answer per bus id: {"scalar": {"int": n}, "list": {"ints": [...]}} or {"error": ...}."""
    out = subprocess.run(
        [str(build_allocbench()), "numa", str(root), *bdfs], capture_output=True, text=True, timeout=60, check=True
    )
    return {r.pop("bdf"): r for r in json.loads(out.stdout)}


def ours(root: Path, bdf: str) -> dict[str, Any]:
    """Ours in allocbench's shape: no attribute (upstream's error) where the device has no NUMA node."""
    nodes = numa_nodes(bdf, root)
    if not nodes:
        return {}
    assert nodes[0] == numa_node(bdf, root)
    return {"scalar": {"int": nodes[0]}, "list": {"ints": list(nodes)}}


def _theirs(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k != "error"}


@pytest.mark.parametrize("name", machine_names())
def test_every_simulated_gpu_agrees_with_upstream(name: str, tmp_path: Path) -> None:
    sim = SimulatedNvml(name, tmp_path / name)
    inv = discover(sim, sim.sysfs_root)
    theirs = upstream(sim.sysfs_root, [g.pci_bus_id for g in inv.gpus])
    for gpu in inv.gpus:
        mine = {} if gpu.numa_node is None else {"int": gpu.numa_node}
        assert _theirs(theirs[gpu.pci_bus_id]).get("scalar", {}) == mine, gpu.pci_bus_id
        listed = [] if gpu.numa_node is None else [gpu.numa_node, *gpu.numa_peers]
        assert _theirs(theirs[gpu.pci_bus_id]).get("list", {}).get("ints", []) == listed, gpu.pci_bus_id


def test_sub_numa_clustering_lists_the_socket_and_the_rest_stay_scalar(tmp_path: Path) -> None:
    """What the simulated machines publish: SNC2 and NPS4 nodes list their socket's other nodes; one node per socket
    (the other socket is farther, and on another package) keeps a one-element list."""

    def lists(name: str) -> list[tuple[int, ...]]:
        sim = SimulatedNvml(name, tmp_path / name)
        return [numa_nodes(g.pci_bus_id, sim.sysfs_root) for g in discover(sim, sim.sysfs_root).gpus]

    assert lists("dgx-h100-snc2") == [(0, 1), (0, 1), (1, 0), (1, 0), (2, 3), (2, 3), (3, 2), (3, 2)]
    assert lists("dgx-a100")[:3] == [(3, 0, 1, 2), (3, 0, 1, 2), (1, 0, 2, 3)]
    assert lists("dgx-h100") == [(0,)] * 4 + [(1,)] * 4
    assert lists("mixed")[-1] == ()  # the L40S: numa_node -1


@dataclass
class Tree:
    """A hand-made sysfs: PCI devices with a numa_node text, nodes with distance rows and cpulists (None: no file),
    CPUs with their physical_package_id text (None: no file)."""

    devices: dict[str, str] = field(default_factory=dict)
    distance: dict[int, str | None] = field(default_factory=dict)
    cpulist: dict[int, str | None] = field(default_factory=dict)
    package: dict[int, str | None] = field(default_factory=dict)

    def write(self, root: Path) -> Path:
        for bdf, text in self.devices.items():
            d = root / "bus" / "pci" / "devices" / bdf
            d.mkdir(parents=True)
            (d / "numa_node").write_text(text)
        for node in {*self.distance, *self.cpulist}:
            d = root / "devices" / "system" / "node" / f"node{node}"
            d.mkdir(parents=True, exist_ok=True)
            for name, text in (("distance", self.distance.get(node)), ("cpulist", self.cpulist.get(node))):
                if text is not None:
                    (d / name).write_text(text)
        for cpu, text in self.package.items():
            d = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
            d.mkdir(parents=True)
            if text is not None:
                (d / "physical_package_id").write_text(text)
        return root


A, B, C, D = "0000:01:00.0", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0"


def _snc(**changes: Any) -> Tree:
    """Two sockets of two nodes each (SNC2), a device on each node, one CPU per node: node 0's list is [0, 1]."""
    tree = Tree(
        devices={A: "0\n", B: "1\n", C: "2\n", D: "3\n"},
        distance={0: "10 12 21 21\n", 1: "12 10 21 21\n", 2: "21 21 10 12\n", 3: "21 21 12 10\n"},
        cpulist={0: "0\n", 1: "1\n", 2: "2\n", 3: "3\n"},
        package={0: "0\n", 1: "0\n", 2: "1\n", 3: "1\n"},
    )
    for name, value in changes.items():
        getattr(tree, name).update(value)
    return tree


# name -> (tree, what our list form of device A is)
EDGES: dict[str, tuple[Tree, tuple[int, ...]]] = {
    "SNC2": (_snc(), (0, 1)),
    "no distance file: one-element list": (_snc(distance={0: None}), (0,)),
    "empty distance file": (_snc(distance={0: "\n"}), (0,)),
    "distance row shorter than the node number": (_snc(devices={A: "3\n"}, distance={3: "10 12\n"}), (3,)),
    "distance value no number": (_snc(distance={0: "10 12 x 21\n"}), (0,)),
    "one-node table": (Tree(devices={A: "0\n"}, distance={0: "10\n"}, cpulist={0: "0"}, package={0: "0"}), (0,)),
    "numa_node -1: no attribute": (_snc(devices={A: "-1\n"}), ()),
    "no numa_node file: no attribute": (Tree(devices={}, distance={0: "10 12\n"}), ()),
    "numa_node not a number": (_snc(devices={A: "zero\n"}), ()),
    "numa_node with an underscore (Python's int() would read it)": (_snc(devices={A: "0_0\n"}), ()),
    "numa_node with a plus sign (strconv.Atoi reads it)": (_snc(devices={A: "+1\n"}), (1, 0)),
    "numa_node padded with blanks": (_snc(devices={A: "  2 \n"}), (2, 3)),
    "CPU-less memory node at the least distance: kept": (
        _snc(distance={0: "10 21 21 21 12\n"}, cpulist={4: "\n"}),
        (0, 4),
    ),
    "equidistant node on the other socket: dropped": (_snc(distance={0: "10 12 12 21\n"}), (0, 1)),
    "own socket unknown (no cpulist): every equidistant node kept": (
        _snc(distance={0: "10 12 12 21\n"}, cpulist={0: None}),
        (0, 1, 2),
    ),
    "own socket unknown (no physical_package_id)": (_snc(distance={0: "10 12 12 21\n"}, package={0: None}), (0, 1, 2)),
    "candidate's cpulist malformed: its socket unknown, kept": (
        _snc(distance={0: "10 12 12 21\n"}, cpulist={2: "3-1\n"}),
        (0, 1, 2),
    ),
    "cpulist with ranges": (
        _snc(cpulist={0: "4-5,0-1\n"}, package={0: "0", 1: "0", 4: "0", 5: "0"}),
        (0, 1),
    ),
    "least distance below the node's own": (_snc(distance={0: "10 5 21 21\n"}), (0, 1)),
    "several nodes at the least distance, listed in order": (
        _snc(devices={A: "3\n"}, distance={3: "12 12 12 10\n"}, package={0: "1", 1: "1"}),
        (3, 0, 1, 2),
    ),
    "no node on the device's socket as close": (_snc(distance={0: "10 21 12 12\n"}), (0,)),
}


@pytest.mark.parametrize("case", sorted(EDGES))
def test_hand_made_trees_agree_with_upstream(case: str, tmp_path: Path) -> None:
    tree, expected = EDGES[case]
    root = tree.write(tmp_path / "sys")
    bdfs = sorted({A, *tree.devices})
    theirs = upstream(root, bdfs)
    assert ours(root, A) == _theirs(theirs[A])
    assert numa_nodes(A, root) == expected
    for bdf in bdfs:
        assert ours(root, bdf) == _theirs(theirs[bdf]), bdf


def _random_tree(rng: random.Random) -> Tree:
    """A tree of 1..6 nodes on 1..3 packages with random distances and holes. Every CPU of a node reports the same
    package (as the kernel's do): upstream asks whichever CPU of the node its map yields first."""
    nodes = rng.randint(1, 6)
    tree = Tree()
    cpu = 0
    for node in range(nodes):
        row = [rng.choice((10, 11, 12, 12, 21, 32)) for _ in range(nodes)]
        row[node] = 10
        tree.distance[node] = None if rng.random() < 0.1 else " ".join(map(str, row)) + "\n"
        if rng.random() < 0.15:
            tree.cpulist[node] = rng.choice(("\n", None))  # a CPU-less node, or none of its files
            continue
        count = rng.randint(1, 3)
        cpus = list(range(cpu, cpu + count))
        cpu += count
        tree.cpulist[node] = f"{cpus[0]}-{cpus[-1]}\n" if count > 1 else f"{cpus[0]}\n"
        package = None if rng.random() < 0.1 else f"{rng.randint(0, 2)}\n"
        for c in cpus:
            tree.package[c] = package
    for i in range(rng.randint(1, 4)):
        tree.devices[f"0000:{i + 1:02x}:00.0"] = f"{rng.randint(-1, nodes)}\n"
    return tree


def test_random_trees_agree_with_upstream(tmp_path: Path) -> None:
    seeds = range(int(os.environ.get("DRA_NUMA_SEEDS", "60")))
    roots = {seed: _random_tree(random.Random(seed)).write(tmp_path / str(seed)) for seed in seeds}
    listed = 0
    for seed, root in roots.items():
        bdfs = sorted(p.name for p in (root / "bus" / "pci" / "devices").iterdir())
        theirs = upstream(root, bdfs)
        for bdf in bdfs:
            assert ours(root, bdf) == _theirs(theirs[bdf]), (seed, bdf)
            listed += len(numa_nodes(bdf, root)) > 1
    assert listed >= 10  # the seeds reach lists longer than one, not only the fallbacks
