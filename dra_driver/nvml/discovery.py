"""Read-only discovery of GPUs, MIG profiles, placements and existing MIG devices through NVML."""

from __future__ import annotations

import ctypes
import logging
import uuid
from pathlib import Path
from typing import Any

import pynvml

from dra_driver.nvml.api import Handle, NvmlLibrary, as_text, describe, error_code
from dra_driver.nvml.inventory import GpuInfo, Inventory, MigInstance, MigProfile, Placement
from dra_driver.nvml.migprofile import COMPUTE_INSTANCE_ENUM_BY_SLICES, GPU_INSTANCE_ENUMS, profile_name
from dra_driver.nvml.pcie import normalize_bus_id, numa_nodes, pcie_root

log = logging.getLogger(__name__)

# go-nvlib's names, so `architecture`/`brand` attribute values match the official driver's.
ARCHITECTURE_NAMES: dict[int, str] = {
    pynvml.NVML_DEVICE_ARCH_KEPLER: "Kepler",
    pynvml.NVML_DEVICE_ARCH_MAXWELL: "Maxwell",
    pynvml.NVML_DEVICE_ARCH_PASCAL: "Pascal",
    pynvml.NVML_DEVICE_ARCH_VOLTA: "Volta",
    pynvml.NVML_DEVICE_ARCH_TURING: "Turing",
    pynvml.NVML_DEVICE_ARCH_AMPERE: "Ampere",
    pynvml.NVML_DEVICE_ARCH_ADA: "Ada Lovelace",
    pynvml.NVML_DEVICE_ARCH_HOPPER: "Hopper",
    pynvml.NVML_DEVICE_ARCH_BLACKWELL: "Blackwell",
}
BRAND_NAMES: dict[int, str] = {
    pynvml.NVML_BRAND_UNKNOWN: "Unknown",
    pynvml.NVML_BRAND_QUADRO: "Quadro",
    pynvml.NVML_BRAND_TESLA: "Tesla",
    pynvml.NVML_BRAND_NVS: "NVS",
    pynvml.NVML_BRAND_GRID: "Grid",
    pynvml.NVML_BRAND_GEFORCE: "GeForce",
    pynvml.NVML_BRAND_TITAN: "Titan",
    pynvml.NVML_BRAND_NVIDIA: "Nvidia",
}
_SKIP_PROFILE = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT)


class DiscoveryError(RuntimeError):
    pass


def _call(what: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except pynvml.NVMLError as e:
        raise DiscoveryError(f"{what}: {describe(e)}") from e


def cuda_version_string(cuda_driver_version: int) -> str:
    return f"{cuda_driver_version // 1000}.{(cuda_driver_version % 1000) // 10}"


def discover(lib: NvmlLibrary, sysfs_root: Path = Path("/sys")) -> Inventory:
    """Everything the slice builder and the plugin need to know about this node. Changes nothing."""
    try:
        lib.nvmlInit()
    except pynvml.NVMLError as e:
        raise DiscoveryError(
            f"cannot initialise NVML: {describe(e)} (no NVIDIA driver here? `--sim MACHINE` uses a simulated node)"
        ) from e
    try:
        driver = as_text(_call("driver version", lib.nvmlSystemGetDriverVersion))
        cuda = cuda_version_string(_call("CUDA driver version", lib.nvmlSystemGetCudaDriverVersion))
        count = _call("device count", lib.nvmlDeviceGetCount)
        gpus = tuple(_discover_gpu(lib, i, sysfs_root) for i in range(count))
    finally:
        lib.nvmlShutdown()
    return Inventory(driver_version=driver, cuda_driver_version=cuda, gpus=gpus)


def _mig_mode(lib: NvmlLibrary, h: Handle) -> tuple[bool, bool, bool]:
    """(capable, current, pending)."""
    try:
        current, pending = lib.nvmlDeviceGetMigMode(h)
    except pynvml.NVMLError as e:
        if error_code(e) == pynvml.NVML_ERROR_NOT_SUPPORTED:
            return False, False, False
        raise DiscoveryError(f"MIG mode: {describe(e)}") from e
    return True, bool(current), bool(pending)


def _fabric(lib: NvmlLibrary, h: Handle) -> tuple[str | None, int | None]:
    """(NVLink fabric cluster UUID, clique id) of a GPU registered in a multi-node NVLink fabric; (None, None)
    where there is none (NOT_SUPPORTED, a driver without the call) or its registration has not completed."""
    info = pynvml.c_nvmlGpuFabricInfo_t()
    try:
        lib.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info))
    except pynvml.NVMLError:
        return None, None
    if info.state != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED or info.status != pynvml.NVML_SUCCESS:
        return None, None
    cluster = uuid.UUID(bytes=bytes(info.clusterUuid))
    return (None, None) if cluster.int == 0 else (str(cluster), int(info.cliqueId))


def _discover_gpu(lib: NvmlLibrary, index: int, sysfs_root: Path) -> GpuInfo:
    h = _call(f"GPU {index} handle", lib.nvmlDeviceGetHandleByIndex, index)
    memory_total = int(_call(f"GPU {index} memory", lib.nvmlDeviceGetMemoryInfo, h).total)
    pci = _call(f"GPU {index} PCI info", lib.nvmlDeviceGetPciInfo, h)
    bdf = normalize_bus_id(as_text(pci.busId))
    major, minor_cc = _call(f"GPU {index} compute capability", lib.nvmlDeviceGetCudaComputeCapability, h)
    arch = _call(f"GPU {index} architecture", lib.nvmlDeviceGetArchitecture, h)
    virtualized = (
        _call(f"GPU {index} virtualization mode", lib.nvmlDeviceGetVirtualizationMode, h)
        == pynvml.NVML_GPU_VIRTUALIZATION_MODE_VGPU
    )
    capable, enabled, pending = _mig_mode(lib, h)
    profiles = _mig_profiles(lib, h, memory_total) if capable and not virtualized else ()
    instances = _mig_instances(lib, h, profiles) if enabled else ()
    cluster, clique = _fabric(lib, h)
    numa = numa_nodes(bdf, sysfs_root)
    return GpuInfo(
        index=index,
        minor=_call(f"GPU {index} minor number", lib.nvmlDeviceGetMinorNumber, h),
        uuid=as_text(_call(f"GPU {index} UUID", lib.nvmlDeviceGetUUID, h)),
        product_name=as_text(_call(f"GPU {index} name", lib.nvmlDeviceGetName, h)),
        brand=BRAND_NAMES.get(_call(f"GPU {index} brand", lib.nvmlDeviceGetBrand, h), "Unknown"),
        architecture=ARCHITECTURE_NAMES.get(arch, "Unknown"),
        cuda_compute_capability=f"{major}.{minor_cc}",
        pci_bus_id=bdf,
        pcie_root=pcie_root(bdf, sysfs_root),
        numa_node=numa[0] if numa else None,
        numa_peers=numa[1:],
        fabric_cluster=cluster,
        fabric_clique=clique,
        pci_device_id=int(pci.pciDeviceId),
        memory_bytes=memory_total,
        mig_capable=capable and bool(profiles),
        mig_enabled=enabled,
        mig_pending=pending,
        virtualized=virtualized,
        mig_toggle_needs_reset=arch <= pynvml.NVML_DEVICE_ARCH_AMPERE,
        mig_profiles=profiles,
        mig_instances=instances,
    )


def _placements(lib: NvmlLibrary, h: Handle, profile_id: int) -> tuple[Placement, ...]:
    count = ctypes.c_uint(0)
    lib.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, None, ctypes.byref(count))
    array = (pynvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
    lib.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, array, ctypes.byref(count))
    return tuple(Placement(start=array[i].start, size=array[i].size) for i in range(count.value))


def _mig_profiles(lib: NvmlLibrary, h: Handle, memory_total: int) -> tuple[MigProfile, ...]:
    profiles: list[MigProfile] = []
    for enum in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = lib.nvmlDeviceGetGpuInstanceProfileInfo(h, enum)
            placements = _placements(lib, h, info.id)
        except pynvml.NVMLError as e:
            if error_code(e) in _SKIP_PROFILE:  # absent on this product
                continue
            raise DiscoveryError(f"MIG profile {enum}: {describe(e)}") from e
        if not placements:
            continue
        g = GPU_INSTANCE_ENUMS[enum].gpu_slices
        if g not in COMPUTE_INSTANCE_ENUM_BY_SLICES:
            continue
        profiles.append(
            MigProfile(
                enum=enum,
                id=info.id,
                name=profile_name(enum, memory_total, info.memorySizeMB),
                driver_name=as_text(info.name).removeprefix("MIG "),
                compute_slices=info.sliceCount,
                memory_slices=placements[0].size,
                instance_count=info.instanceCount,
                multiprocessors=info.multiprocessorCount,
                copy_engines=info.copyEngineCount,
                decoders=info.decoderCount,
                encoders=info.encoderCount,
                jpeg_engines=info.jpegCount,
                ofa_engines=info.ofaCount,
                memory_mib=info.memorySizeMB,
                placements=placements,
            )
        )
    return tuple(profiles)


def _mig_instances(lib: NvmlLibrary, h: Handle, profiles: tuple[MigProfile, ...]) -> tuple[MigInstance, ...]:
    by_id = {p.id: p for p in profiles}
    found: list[MigInstance] = []
    for i in range(_call("max MIG device count", lib.nvmlDeviceGetMaxMigDeviceCount, h)):
        try:
            mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
        except pynvml.NVMLError as e:
            if error_code(e) in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                continue
            raise DiscoveryError(f"MIG device {i}: {describe(e)}") from e
        gi_id = _call("GPU instance id", lib.nvmlDeviceGetGpuInstanceId, mig)
        ci_id = _call("compute instance id", lib.nvmlDeviceGetComputeInstanceId, mig)
        gi_info = _call(
            "GPU instance info",
            lib.nvmlGpuInstanceGetInfo,
            _call("GPU instance", lib.nvmlDeviceGetGpuInstanceById, h, gi_id),
        )
        profile = by_id.get(gi_info.profileId)
        attrs = _call("MIG attributes", lib.nvmlDeviceGetAttributes, mig)
        found.append(
            MigInstance(
                uuid=as_text(_call("MIG UUID", lib.nvmlDeviceGetUUID, mig)),
                gpu_instance_id=gi_id,
                compute_instance_id=ci_id,
                profile_id=gi_info.profileId,
                profile_name=profile.name if profile else f"profile-{gi_info.profileId}",
                placement=Placement(start=gi_info.placement.start, size=gi_info.placement.size),
                memory_bytes=int(_call("MIG memory", lib.nvmlDeviceGetMemoryInfo, mig).total),
                multiprocessors=attrs.multiprocessorCount,
            )
        )
    return tuple(found)
