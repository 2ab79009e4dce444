"""The MIG rules a real GPU enforces, as pure functions over one GPU's state.

Where NVIDIA documents a behaviour, the rule follows it; where hardware shows a behaviour the docs do not
explain (instance ids, default placements), the rule reproduces the observed shape so that code relying
on coincidences (GI id == placement start, ids 0..n) fails here as it would on a GPU.
"""

from __future__ import annotations

import pynvml

from dra_driver.simulator.catalog import MEMORY_SLICES, GpuInstanceProfileSpec, ProductSpec
from dra_driver.simulator.state import GpuInstanceState, GpuState

COMPUTE_SLICES = 7
MAX_GPU_INSTANCE_ID = 14  # /proc/driver/nvidia-caps/mig-minors numbers gi0..gi14

# GI ids come from per-size pools in this order (MIG user guide examples: 7g -> 0, 3g -> {2, 1},
# 2g -> {3..6}, 1g -> {7..14}, handed out in an order unrelated to the placement).
_GI_ID_POOLS: dict[int, list[int]] = {8: [0], 4: [2, 1], 2: [5, 3, 4, 6], 1: [13, 11, 12, 7, 8, 9, 10, 14]}

# Placement NVML picks when none is given. It reproduces the guide's failure: on an empty A100,
# `-cgi 19,19,14,9` fails with Insufficient Resources because the 1g instances land on slots 6 and 4.
_DEFAULT_PLACEMENT_ORDER: dict[int, list[int]] = {1: [6, 4, 5, 0, 1, 2, 3], 2: [4, 0, 2, 6], 4: [4, 0], 8: [0]}

# Compute-instance sizes a GPU instance of G slices offers (A100 pattern from the guide).
CI_SLICES_FOR_GI: dict[int, list[int]] = {1: [1], 2: [1, 2], 3: [1, 2, 3], 4: [1, 2, 4], 7: [1, 2, 3, 4, 7]}


class MigRuleError(Exception):
    """Carries the NVML return code a real GPU gives for the violated rule."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


def occupied_slices(gpu: GpuState) -> set[int]:
    return {s for gi in gpu.gpu_instances for s in range(gi.start, gi.start + gi.size)}


def profile_by_id(product: ProductSpec, profile_id: int) -> GpuInstanceProfileSpec:
    for p in product.mig_profiles:
        if p.id == profile_id:
            return p
    raise MigRuleError(pynvml.NVML_ERROR_INVALID_ARGUMENT, f"no GPU instance profile with id {profile_id}")


def _compute_slices_used(product: ProductSpec, gpu: GpuState) -> int:
    return sum(profile_by_id(product, gi.profile_id).compute_slices for gi in gpu.gpu_instances)


def check_gpu_instance(product: ProductSpec, gpu: GpuState, profile: GpuInstanceProfileSpec, start: int) -> None:
    """Raise MigRuleError unless a GPU instance of `profile` can be created at `start` now."""
    if start not in profile.placements:
        raise MigRuleError(
            pynvml.NVML_ERROR_INVALID_ARGUMENT,
            f"{profile.name}: {start}:{profile.memory_slices} is not a possible placement "
            f"(possible starts {profile.placements})",
        )
    # A taken placement is INSUFFICIENT_RESOURCES, not ALREADY_EXISTS, on real hardware.
    wanted = set(range(start, start + profile.memory_slices))
    if wanted & occupied_slices(gpu):
        raise MigRuleError(
            pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, f"memory slices {sorted(wanted)} overlap an existing instance"
        )
    same = sum(1 for gi in gpu.gpu_instances if gi.profile_id == profile.id)
    if same >= profile.instance_count:
        raise MigRuleError(
            pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, f"{profile.name}: at most {profile.instance_count} instances"
        )
    if _compute_slices_used(product, gpu) + profile.compute_slices > COMPUTE_SLICES:
        raise MigRuleError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, "not enough free compute slices")


def default_placement(product: ProductSpec, gpu: GpuState, profile: GpuInstanceProfileSpec) -> int:
    order = _DEFAULT_PLACEMENT_ORDER.get(profile.memory_slices, [])
    candidates = [s for s in order if s in profile.placements] + [s for s in profile.placements if s not in order]
    for start in candidates:
        try:
            check_gpu_instance(product, gpu, profile, start)
        except MigRuleError:
            continue
        return start
    raise MigRuleError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, f"{profile.name}: no free placement")


def remaining_capacity(product: ProductSpec, gpu: GpuState, profile: GpuInstanceProfileSpec) -> int:
    """How many more instances of `profile` fit, given what exists (greedy by start is optimal here:
    all of one profile's placements have the same size)."""
    trial = gpu.model_copy(deep=True)
    count = 0
    for start in sorted(profile.placements):
        try:
            check_gpu_instance(product, trial, profile, start)
        except MigRuleError:
            continue
        trial.gpu_instances.append(
            GpuInstanceState(id=-1, profile_id=profile.id, start=start, size=profile.memory_slices)
        )
        count += 1
    return count


def allocate_gpu_instance_id(gpu: GpuState, memory_slices: int) -> int:
    used = {gi.id for gi in gpu.gpu_instances}
    pool = _GI_ID_POOLS.get(memory_slices, [])
    candidates: list[int] = [*pool, *range(MAX_GPU_INSTANCE_ID + 1)]
    for candidate in candidates:
        if candidate not in used:
            return int(candidate)
    raise MigRuleError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, "no free GPU instance id")


def compute_instance_placements(gi_slices: int, ci_slices: int) -> list[int]:
    return [k * ci_slices for k in range(gi_slices // ci_slices)]


def check_compute_instance(gi: GpuInstanceState, gi_slices: int, ci_slices: int, start: int) -> None:
    if start not in compute_instance_placements(gi_slices, ci_slices):
        raise MigRuleError(pynvml.NVML_ERROR_INVALID_ARGUMENT, f"{start}:{ci_slices} is not a possible CI placement")
    wanted = set(range(start, start + ci_slices))
    taken = {s for ci in gi.compute_instances for s in range(ci.start, ci.start + ci.size)}
    if wanted & taken:
        raise MigRuleError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, "compute slices overlap an existing CI")


def first_free_compute_placement(gi: GpuInstanceState, gi_slices: int, ci_slices: int) -> int:
    for start in compute_instance_placements(gi_slices, ci_slices):
        try:
            check_compute_instance(gi, gi_slices, ci_slices, start)
        except MigRuleError:
            continue
        return start
    raise MigRuleError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, "no free compute slices in the GPU instance")


def allocate_compute_instance_id(gi: GpuInstanceState) -> int:
    used = {ci.id for ci in gi.compute_instances}
    return next(i for i in range(8) if i not in used)


__all__ = ["MEMORY_SLICES", "MigRuleError"]
