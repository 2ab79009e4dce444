"""MIG profile facts that are the same on every NVIDIA GPU: enum meanings and the profile-name formula.

Profile *tables* (ids, placements, memory) differ per product and come from NVML at run time
(or from the simulator's data files); only the enum semantics live here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pynvml

ONE_MIB = 1024 * 1024
ONE_GIB = 1024 * ONE_MIB


@dataclass(frozen=True)
class GpuInstanceEnum:
    """What a `NVML_GPU_INSTANCE_PROFILE_*` enum value means."""

    value: int
    gpu_slices: int
    suffix: str  # "", "+me", "+me.all", "+gfx", "-me"


# NVML_GPU_INSTANCE_PROFILE_* -> compute-slice count and name suffix (go-nvlib mig_profile.go).
GPU_INSTANCE_ENUMS: dict[int, GpuInstanceEnum] = {
    e.value: e
    for e in (
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 1, ""),
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 2, ""),
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 3, ""),
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 4, ""),
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 7, ""),
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE, 8, ""),
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE, 6, ""),
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, "+me"),
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1, 2, "+me"),
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 1, ""),
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX, 1, "+gfx"),
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX, 2, "+gfx"),
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX, 4, "+gfx"),
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, 1, "-me"),
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME, 2, "-me"),
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, 1, "+me.all"),
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME, 2, "+me.all"),
        GpuInstanceEnum(pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE_GFX, 3, "+gfx"),
    )
}

# NVML_COMPUTE_INSTANCE_PROFILE_* for a compute instance of N slices (the _REV1 and _NVL variants are
# never used: the driver creates exactly one compute instance spanning its GPU instance).
COMPUTE_INSTANCE_ENUM_BY_SLICES: dict[int, int] = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    6: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    8: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
}


def _go_round(x: float) -> int:
    # Go's math.Round rounds half away from zero; Python's round() is banker's rounding
    # (H200 3g: 70.5 must give 71, not 70).
    return math.floor(x + 0.5)


def mig_memory_gb(total_device_memory_bytes: int, mig_memory_mib: int) -> int:
    """The `<N>gb` part of a profile name, as go-nvlib computes it from the memory fraction."""
    fraction = (mig_memory_mib * ONE_MIB) / total_device_memory_bytes
    fraction = math.ceil(fraction * 8) / 8
    total_gb = (total_device_memory_bytes + ONE_GIB - 1) // ONE_GIB
    return _go_round(fraction * total_gb)


def profile_name(
    gi_enum: int, total_device_memory_bytes: int, mig_memory_mib: int, ci_slices: int | None = None
) -> str:
    """Canonical MIG profile name, e.g. `3g.71gb`, `1g.10gb+me`, `1c.3g.40gb`."""
    try:
        gi = GPU_INSTANCE_ENUMS[gi_enum]
    except KeyError:
        raise ValueError(f"unknown GPU instance profile enum {gi_enum}") from None
    gb = mig_memory_gb(total_device_memory_bytes, mig_memory_mib)
    base = f"{gi.gpu_slices}g.{gb}gb{gi.suffix}"
    if ci_slices is None or ci_slices == gi.gpu_slices:
        return base
    return f"{ci_slices}c.{base}"


_PROFILE_RE = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.(\d+)gb((?:\+me\.all|\+me|\+gfx|-me))?\Z")


@dataclass(frozen=True)
class ParsedProfile:
    compute_slices: int
    gpu_slices: int
    memory_gb: int
    suffix: str


def parse_profile_name(name: str) -> ParsedProfile:
    """Parse `[<c>c.]<g>g.<gb>gb[+me|+me.all|+gfx|-me]`; raises ValueError with the grammar on failure."""
    m = _PROFILE_RE.match(name)
    if not m:
        raise ValueError(f"invalid MIG profile name {name!r}: expected [<c>c.]<g>g.<gb>gb[+me|+me.all|+gfx|-me]")
    g = int(m.group(2))
    c = int(m.group(1)) if m.group(1) else g
    return ParsedProfile(c, g, int(m.group(3)), m.group(4) or "")
