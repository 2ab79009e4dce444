"""Small wrappers over the pynvml call conventions, used by several test modules."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

from dra_driver.nvml.migprofile import COMPUTE_INSTANCE_ENUM_BY_SLICES


def create_gi(lib: Any, dev: Any, profile_id: int, start: int, size: int) -> Any:
    placement = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
    return lib.nvmlDeviceCreateGpuInstanceWithPlacement(dev, profile_id, ctypes.byref(placement))


def create_full_ci(lib: Any, gi: Any, slices: int) -> Any:
    enum = COMPUTE_INSTANCE_ENUM_BY_SLICES[slices]
    info = lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, enum, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    )
    return lib.nvmlGpuInstanceCreateComputeInstance(gi, info.id)


def nvml_code(excinfo: Any) -> int:
    return int(excinfo.value.value)
