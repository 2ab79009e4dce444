"""Carving and destroying MIG devices through NVML (the only code that changes GPU state).

A MIG device here is one GPU instance at a given placement plus one compute instance spanning it. Every
step tolerates the half-finished states a crash can leave (a GPU instance without its compute instance,
an instance already destroyed by an earlier, interrupted cleanup). NVML reuses GPU instance ids, so a recorded
device is only ever destroyed after checking that it is still the same device (:func:`find_mig_device`).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, TypeVar

import pynvml
from pydantic import BaseModel, ConfigDict

from dra_driver.nvml.api import Handle, NvmlLibrary, as_text, describe, error_code, error_name
from dra_driver.nvml.migprofile import COMPUTE_INSTANCE_ENUM_BY_SLICES

log = logging.getLogger(__name__)
T = TypeVar("T")

_SHARED = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
_GONE = (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT)


class MigError(RuntimeError):
    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class LiveMig(BaseModel):
    """A MIG device that exists: enough to find it again and to destroy it."""

    model_config = ConfigDict(extra="allow")  # kept in the checkpoint: preserve what a newer driver added

    parent_uuid: str
    parent_minor: int
    profile_id: int
    placement_start: int
    gi_id: int
    ci_id: int
    uuid: str


@dataclass(frozen=True)
class GpuInstanceView:
    gi_id: int
    profile_id: int
    start: int
    size: int
    compute: tuple[tuple[int, str], ...]  # (compute instance id, MIG device UUID)

    @property
    def ci_ids(self) -> tuple[int, ...]:
        return tuple(ci for ci, _ in self.compute)

    @property
    def mig_uuids(self) -> frozenset[str]:
        return frozenset(uuid for _, uuid in self.compute)

    def is_device(self, mig: LiveMig) -> bool:
        """True when this GPU instance is the recorded device `mig`, not another one that got its reused id.

        A GPU instance without compute instance (a crash between destroying the two, or between creating them)
        has no UUID to compare; it counts as `mig` when id, profile and placement match, because the driver never
        lets a second claim hold a placement that a recorded device still occupies.
        """
        return (
            self.gi_id == mig.gi_id
            and self.profile_id == mig.profile_id
            and self.start == mig.placement_start
            and (not self.compute or mig.uuid in self.mig_uuids)
        )


def _nvml(what: str, fn: Callable[..., T], *args: Any) -> T:
    try:
        return fn(*args)
    except pynvml.NVMLError as e:
        raise MigError(f"{what}: {describe(e)}", error_code(e)) from e


def list_gpu_instances(lib: NvmlLibrary, parent: Handle, profile_ids: list[int]) -> list[GpuInstanceView]:
    """Every GPU instance of the given profiles with its compute instances, including GPU instances that
    have none (which MIG device handles would not show)."""
    found: list[GpuInstanceView] = []
    for pid in profile_ids:
        count = ctypes.c_uint(0)
        lib.nvmlDeviceGetGpuInstances(parent, pid, None, ctypes.byref(count))
        if not count.value:
            continue
        array = (pynvml.c_nvmlGpuInstance_t * count.value)()
        lib.nvmlDeviceGetGpuInstances(parent, pid, array, ctypes.byref(count))
        for i in range(count.value):
            info = lib.nvmlGpuInstanceGetInfo(array[i])
            found.append(
                GpuInstanceView(
                    info.id,
                    info.profileId,
                    info.placement.start,
                    info.placement.size,
                    tuple(_compute_instances(lib, array[i])),
                )
            )
    return sorted(found, key=lambda v: (v.start, v.gi_id))


def _compute_instances(lib: NvmlLibrary, gi: Handle) -> list[tuple[int, str]]:
    """(id, MIG device UUID) of every compute instance of the GPU instance."""
    found: list[tuple[int, str]] = []
    for enum in COMPUTE_INSTANCE_ENUM_BY_SLICES.values():
        try:
            ci_profile = lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, enum, _SHARED)
        except pynvml.NVMLError as e:
            if error_code(e) in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                continue
            raise
        count = ctypes.c_uint(0)
        lib.nvmlGpuInstanceGetComputeInstances(gi, ci_profile.id, None, ctypes.byref(count))
        if not count.value:
            continue
        array = (pynvml.c_nvmlComputeInstance_t * count.value)()
        lib.nvmlGpuInstanceGetComputeInstances(gi, ci_profile.id, array, ctypes.byref(count))
        for i in range(count.value):
            info = lib.nvmlComputeInstanceGetInfo(array[i])
            found.append((info.id, as_text(lib.nvmlDeviceGetUUID(info.device))))
    return sorted(found)


def mig_enabled(lib: NvmlLibrary, parent: Handle) -> bool:
    return bool(lib.nvmlDeviceGetMigMode(parent)[0])


def ensure_mig_enabled(lib: NvmlLibrary, parent: Handle, parent_uuid: str) -> None:
    if mig_enabled(lib, parent):
        return
    status = _nvml(f"enable MIG mode on {parent_uuid}", lib.nvmlDeviceSetMigMode, parent, pynvml.NVML_DEVICE_MIG_ENABLE)
    if status != pynvml.NVML_SUCCESS:
        # Ampere: RESET_REQUIRED (the mode is only pending); busy GPU: IN_USE.
        raise MigError(f"cannot enable MIG mode on {parent_uuid}: activation status {error_name(status)}", status)


def create_mig_device(
    lib: NvmlLibrary, parent_uuid: str, parent_minor: int, profile_id: int, compute_slices: int, start: int, size: int
) -> LiveMig:
    parent = _nvml(f"GPU {parent_uuid}", lib.nvmlDeviceGetHandleByUUID, parent_uuid)
    ensure_mig_enabled(lib, parent, parent_uuid)
    placement = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
    where = f"GPU instance of profile {profile_id} at {start}:{size} on {parent_uuid}"
    try:
        gi = lib.nvmlDeviceCreateGpuInstanceWithPlacement(parent, profile_id, ctypes.byref(placement))
    except pynvml.NVMLError as e:
        code = error_code(e)
        # NVML says INSUFFICIENT_RESOURCES both for "taken" and "already exists": look to tell them apart.
        if code == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES:
            existing = [v for v in list_gpu_instances(lib, parent, [profile_id]) if v.start == start]
            if existing:
                raise MigError(f"{where}: already exists (GPU instance {existing[0].gi_id})", code) from e
        raise MigError(f"create {where}: {describe(e)}", code) from e
    try:
        gi_info = lib.nvmlGpuInstanceGetInfo(gi)
        ci_profile = lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, COMPUTE_INSTANCE_ENUM_BY_SLICES[compute_slices], _SHARED
        )
        ci = lib.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
        ci_info = lib.nvmlComputeInstanceGetInfo(ci)
        # The CI's device handle gives the MIG UUID directly; walking all MIG devices can take seconds.
        mig_uuid = lib.nvmlDeviceGetUUID(ci_info.device)
    except pynvml.NVMLError as e:
        try:
            lib.nvmlGpuInstanceDestroy(gi)
        except pynvml.NVMLError as cleanup:
            log.warning("could not remove half-created %s: %s", where, cleanup)
        raise MigError(f"create compute instance in {where}: {describe(e)}", error_code(e)) from e
    return LiveMig(
        parent_uuid=parent_uuid,
        parent_minor=parent_minor,
        profile_id=profile_id,
        placement_start=start,
        gi_id=gi_info.id,
        ci_id=ci_info.id,
        uuid=as_text(mig_uuid),
    )


def destroy_gpu_instance(lib: NvmlLibrary, parent: Handle, gi_id: int, where: str) -> bool:
    """Destroy every compute instance of the GPU instance, then the GPU instance. False if it was gone."""
    try:
        gi = lib.nvmlDeviceGetGpuInstanceById(parent, gi_id)
    except pynvml.NVMLError as e:
        if error_code(e) in (*_GONE, pynvml.NVML_ERROR_NOT_SUPPORTED):  # NOT_SUPPORTED: MIG already off
            return False
        raise MigError(f"look up {where}: {describe(e)}", error_code(e)) from e
    for ci_id, _ in _compute_instances(lib, gi):
        try:
            lib.nvmlComputeInstanceDestroy(lib.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id))
        except pynvml.NVMLError as e:
            if error_code(e) not in _GONE:  # a previous, partial cleanup may have removed it
                raise MigError(f"destroy compute instance {ci_id} of {where}: {describe(e)}", error_code(e)) from e
    try:
        lib.nvmlGpuInstanceDestroy(gi)
    except pynvml.NVMLError as e:
        if error_code(e) in _GONE:
            return False
        raise MigError(f"destroy {where}: {describe(e)}", error_code(e)) from e
    return True


def find_mig_device(lib: NvmlLibrary, mig: LiveMig) -> GpuInstanceView | None:
    """The GPU instance of the recorded device `mig` if that device still exists (see GpuInstanceView.is_device)."""
    parent = _nvml(f"GPU {mig.parent_uuid}", lib.nvmlDeviceGetHandleByUUID, mig.parent_uuid)
    if not mig_enabled(lib, parent):
        return None
    for view in list_gpu_instances(lib, parent, [mig.profile_id]):
        if view.is_device(mig):
            return view
    return None


def destroy_mig_device(lib: NvmlLibrary, mig: LiveMig, where: str) -> bool:
    """Destroy the recorded device `mig` if it still exists as that device; False if it is gone (a GPU instance
    that reuses its id belongs to someone else and is left alone)."""
    if find_mig_device(lib, mig) is None:
        return False
    parent = _nvml(f"GPU {mig.parent_uuid}", lib.nvmlDeviceGetHandleByUUID, mig.parent_uuid)
    return destroy_gpu_instance(lib, parent, mig.gi_id, where)


def destroy_at(lib: NvmlLibrary, parent_uuid: str, profile_id: int, start: int, keep: Collection[str] = ()) -> bool:
    """Destroy the GPU instance of `profile_id` at `start` (and its compute instances), if it exists and none
    of its MIG devices is in `keep` (UUIDs that other claims recorded).

    Works from the device name alone: used for rollback, when the instance ids may never have been recorded.
    """
    parent = _nvml(f"GPU {parent_uuid}", lib.nvmlDeviceGetHandleByUUID, parent_uuid)
    if not mig_enabled(lib, parent):
        return False
    for view in list_gpu_instances(lib, parent, [profile_id]):
        if view.start == start and not view.mig_uuids & set(keep):
            return destroy_gpu_instance(lib, parent, view.gi_id, f"GPU instance {view.gi_id} on {parent_uuid}")
    return False


def disable_mig_if_unused(lib: NvmlLibrary, parent_uuid: str, profile_ids: list[int]) -> bool:
    """Switch MIG off when no instance is left (Hopper and later only: Ampere would need a reset)."""
    parent = _nvml(f"GPU {parent_uuid}", lib.nvmlDeviceGetHandleByUUID, parent_uuid)
    if lib.nvmlDeviceGetArchitecture(parent) <= pynvml.NVML_DEVICE_ARCH_AMPERE or not mig_enabled(lib, parent):
        return False
    if list_gpu_instances(lib, parent, profile_ids):
        return False
    status = lib.nvmlDeviceSetMigMode(parent, pynvml.NVML_DEVICE_MIG_DISABLE)
    if status != pynvml.NVML_SUCCESS:
        log.warning("MIG mode stays on for %s: activation status %s", parent_uuid, error_name(status))
        return False
    return True
