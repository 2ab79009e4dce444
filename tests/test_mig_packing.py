"""The partitionable layout keeps every way to pack a GPU: for each MIG-capable product, the combinations NVIDIA's
MIG user guide lists as filling one GPU (seven 1g, 4g + 3g, 3g + 2g + 1g + 1g, three 2g + 1g) are allocated on one
GPU from the published slices, one more 1g does not fit beside any of them, and the scheduler's own allocator
(tools/allocbench) gives the same answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver.allocation.allocator import Allocator
from dra_driver.nvml.discovery import discover
from dra_driver.simulator.catalog import product
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME as D
from dra_driver.slices.builder import build_slices
from dra_driver.slices.devices import PublishMode
from tests.test_allocbench import build_allocbench, run_go_many

MACHINE_OF = {  # a simulated machine with the product, and its NVML index there
    "a100-sxm4-40gb": ("dgx-a100", 0),
    "a100-sxm4-80gb": ("mixed", 0),
    "h100-sxm5-80gb": ("dgx-h100", 0),
    "h200-sxm5-141gb": ("dgx-h200", 0),
    "b200-180gb": ("dgx-b200", 0),
    "gb200-186gb": ("gb200-nvl72-tray", 0),
}
PACKINGS = {  # (compute slices, memory slices) of each partition
    "seven 1g": [(1, 1)] * 7,
    "4g + 3g": [(4, 4), (3, 4)],
    "3g + 2g + 1g + 1g": [(3, 4), (2, 2), (1, 1), (1, 1)],
    "three 2g + 1g": [(2, 2)] * 3 + [(1, 1)],
}
MIG_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "mig"},
             "spec": {"selectors": [{"cel": {"expression": f"device.attributes['{D}'].type == 'mig'"}}]}}  # fmt: skip


def profile_names(key: str) -> dict[tuple[int, int], str]:
    """(compute, memory slices) -> the product's profile of that shape (the one without media extensions)."""
    return {(p.compute_slices, p.memory_slices): p.name for p in product(key).mig_profiles if "+" not in p.name}


def packing_claim(key: str, parent_uuid: str, shapes: list[tuple[int, int]]) -> dict[str, Any]:
    names = profile_names(key)
    requests = [
        {"name": f"p{i}", "exactly": {"deviceClassName": "mig", "allocationMode": "ExactCount", "count": 1,
                                      "selectors": [{"cel": {"expression":
                                          f"device.attributes['{D}'].profile == '{names[shape]}' && "
                                          f"device.attributes['{D}'].parentUUID == '{parent_uuid}'"}}]}}
        for i, shape in enumerate(shapes)
    ]  # fmt: skip
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"pack-{len(shapes)}", "namespace": "mig", "uid": "uid"},
            "spec": {"devices": {"requests": requests}}}  # fmt: skip


def gpu_slices(key: str, state_dir: Path) -> tuple[str, list[dict[str, Any]]]:
    """(the UUID of a GPU of the product, its machine's partitionable slices), MIG made available where Ampere needs
    an admin's reset for it."""
    machine, index = MACHINE_OF[key]
    sim = SimulatedNvml(machine, state_dir)
    sim.nvmlInit()
    handle = sim.nvmlDeviceGetHandleByIndex(index)
    if sim.nvmlDeviceGetMigMode(handle)[0] == 0:  # Ampere publishes MIG devices only with MIG on: an admin's reset
        sim.nvmlDeviceSetMigMode(handle, 1)
        sim.reset_gpu(index)
    inventory = discover(sim, sim.sysfs_root)
    gpu = next(g for g in inventory.gpus if g.index == index)
    assert product(key).name == gpu.product_name
    slices = [
        s.to_api() for s in build_slices(inventory, node_name="n", k8s_version="1.36", mode=PublishMode.PARTITIONABLE)
    ]
    return gpu.uuid, slices


@pytest.mark.parametrize("key", sorted(MACHINE_OF))
def test_every_way_to_fill_a_gpu_is_allocatable_and_full(key: str, tmp_path: Path) -> None:
    uuid, slices = gpu_slices(key, tmp_path / "gpu")
    binary = build_allocbench()
    for packing, shapes in PACKINGS.items():
        full = packing_claim(key, uuid, shapes)
        too_many = packing_claim(key, uuid, [*shapes, (1, 1)])
        ours = [Allocator(slices, [MIG_CLASS]).allocate([c], "n") is not None for c in (full, too_many)]
        assert ours == [True, False], (key, packing)
        # allocbench allocates the claims one after the other: the second finds the GPU full either way
        go, alone = (
            out["results"]
            for out in run_go_many(
                binary,
                [
                    {"slices": slices, "classes": [MIG_CLASS], "claims": claims, "nodes": ["n"]}
                    for claims in ([full, too_many], [too_many])
                ],
            )
        )
        assert [bool(go[0].get("node")), bool(alone[0].get("node"))] == [True, False], (key, packing, json.dumps(go))
