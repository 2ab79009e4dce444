"""The server's half of every modelled NVML function: each C function of native/libnvml/functions.c (same name, same
format) is answered here by the pynvml-style method of `SimulatedNvml`, the one source of truth, so that the C API,
pynvml and the driver see the same machine. Handles cross the wire as the addresses the simulator encodes them to;
structs as the bytes of the ctypes structs the simulator returns.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pynvml

from dra_driver.simulator.libnvml.wire import ArrayOut, Out, StrOut, VersionedOut
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.simulator.structs import nvmlComputeInstanceProfileInfo_v3, nvmlGpuInstanceProfileInfo_v3

Handler = Callable[..., None]
FUNCTIONS: dict[str, tuple[str, Handler]] = {}


def forward(fmt: str, *names: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        for name in names:
            FUNCTIONS[name] = (fmt, handler)
        return handler

    return register


def _dev(address: int) -> Any:
    return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlDevice_t)


def _gi(address: int) -> Any:
    return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlGpuInstance_t)


def _ci(address: int) -> Any:
    return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlComputeInstance_t)


def _set(address: int) -> Any:
    return ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlEventSet_t)


# An array call is first made with room for this many elements, not the caller's count (any u32: a request could
# otherwise make the server allocate 32 GiB); more than any NVML array here holds (placements, instances).
ARRAY_FIRST_TRY = 64


def _array(out: ArrayOut, elem: Any, call: Callable[[Any, Any], object]) -> None:
    """Run a pynvml-style array call (`call(array or None, byref(count))`) into `out`: the count goes back to the
    caller also when the array was too small (NVML_ERROR_INSUFFICIENT_SIZE tells it how many). Room is made for
    what the answer holds, never for the caller's count as such."""
    room = min(out.count, ARRAY_FIRST_TRY)
    while True:
        array = (elem * room)() if out.array_present else None
        given = room if out.array_present else out.count
        count = ctypes.c_uint(given)
        try:
            call(array, ctypes.byref(count))
        except pynvml.NVMLError_InsufficientSize:
            if array is not None and room < count.value <= out.count:
                room = count.value  # the caller's array holds what is needed: again, with that much room
                continue
            out.set_count(count.value)
            raise
        except pynvml.NVMLError:
            out.set_count(out.count if count.value == given else count.value)  # untouched: the caller's
            raise
        out.set_count(count.value)
        if array is not None:
            out.set_items(bytes(array)[: count.value * ctypes.sizeof(elem)])
        return


# ----- init and system ---------------------------------------------------------------------------------------------
@forward("u", "nvmlInitWithFlags")
def _init(sim: SimulatedNvml, flags: int) -> None:
    sim.nvmlDeviceGetCount()  # the machine answers: its state is readable


@forward("S", "nvmlSystemGetDriverVersion")
def _driver_version(sim: SimulatedNvml, out: StrOut) -> None:
    out.set(sim.nvmlSystemGetDriverVersion())


@forward("S", "nvmlSystemGetNVMLVersion")
def _nvml_version(sim: SimulatedNvml, out: StrOut) -> None:
    out.set(sim.nvmlSystemGetNVMLVersion())


@forward("o4", "nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2")
def _cuda_version(sim: SimulatedNvml, out: Out) -> None:
    out.set(sim.nvmlSystemGetCudaDriverVersion())


# ----- devices -----------------------------------------------------------------------------------------------------
@forward("o4", "nvmlDeviceGetCount", "nvmlDeviceGetCount_v2")
def _count(sim: SimulatedNvml, out: Out) -> None:
    out.set(sim.nvmlDeviceGetCount())


@forward("u o8", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2")
def _by_index(sim: SimulatedNvml, index: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetHandleByIndex(index))


@forward("s o8", "nvmlDeviceGetHandleByUUID")
def _by_uuid(sim: SimulatedNvml, uuid: bytes, out: Out) -> None:
    out.set(sim.nvmlDeviceGetHandleByUUID(uuid))


@forward("B52 o8", "nvmlDeviceGetHandleByUUIDV")
def _by_uuid_v(sim: SimulatedNvml, uuid: bytes, out: Out) -> None:
    value = pynvml.c_nvmlUUID_t.from_buffer_copy(uuid)
    if value.version != pynvml.nvmlUUID_v1:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    text: bytes = value.value.str if value.type == pynvml.NVML_UUID_TYPE_ASCII else bytes(value.value.bytes)
    out.set(sim.nvmlDeviceGetHandleByUUIDV(text, value.type))


@forward("s o8", "nvmlDeviceGetHandleByPciBusId", "nvmlDeviceGetHandleByPciBusId_v2")
def _by_bus_id(sim: SimulatedNvml, bus_id: bytes, out: Out) -> None:
    out.set(sim.nvmlDeviceGetHandleByPciBusId(bus_id))


@forward("h S", "nvmlDeviceGetName")
def _name(sim: SimulatedNvml, device: int, out: StrOut) -> None:
    out.set(sim.nvmlDeviceGetName(_dev(device)))


@forward("h S", "nvmlDeviceGetUUID")
def _uuid(sim: SimulatedNvml, device: int, out: StrOut) -> None:
    out.set(sim.nvmlDeviceGetUUID(_dev(device)))


@forward("h o4", "nvmlDeviceGetMinorNumber")
def _minor(sim: SimulatedNvml, device: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetMinorNumber(_dev(device)))


@forward("h o4", "nvmlDeviceGetIndex")
def _index(sim: SimulatedNvml, device: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetIndex(_dev(device)))


@forward("h o68", "nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo_v3")
def _pci(sim: SimulatedNvml, device: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetPciInfo(_dev(device)))


@forward("h o24", "nvmlDeviceGetMemoryInfo")
def _memory(sim: SimulatedNvml, device: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetMemoryInfo(_dev(device)))


@forward("h v", "nvmlDeviceGetMemoryInfo_v2")
def _memory_v2(sim: SimulatedNvml, device: int, out: VersionedOut) -> None:
    out.set(sim.nvmlDeviceGetMemoryInfo(_dev(device), version=out.version))


@forward("h o4", "nvmlDeviceGetBrand")
def _brand(sim: SimulatedNvml, device: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetBrand(_dev(device)))


@forward("h o4", "nvmlDeviceGetArchitecture")
def _architecture(sim: SimulatedNvml, device: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetArchitecture(_dev(device)))


@forward("h o4 o4", "nvmlDeviceGetCudaComputeCapability")
def _compute_capability(sim: SimulatedNvml, device: int, major: Out, minor: Out) -> None:
    cc = sim.nvmlDeviceGetCudaComputeCapability(_dev(device))
    major.set(cc[0])
    minor.set(cc[1])


@forward("h o4", "nvmlDeviceGetVirtualizationMode")
def _virtualization(sim: SimulatedNvml, device: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetVirtualizationMode(_dev(device)))


@forward("h o4", "nvmlDeviceGetComputeMode")
def _compute_mode(sim: SimulatedNvml, device: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetComputeMode(_dev(device)))


@forward("h i", "nvmlDeviceSetComputeMode")
def _set_compute_mode(sim: SimulatedNvml, device: int, mode: int) -> None:
    sim.nvmlDeviceSetComputeMode(_dev(device), mode)


# ----- MIG mode, GPU instance profiles and placements -----------------------------------------------------------------
@forward("h o4 o4", "nvmlDeviceGetMigMode")
def _mig_mode(sim: SimulatedNvml, device: int, current: Out, pending: Out) -> None:
    modes = sim.nvmlDeviceGetMigMode(_dev(device))
    current.set(modes[0])
    pending.set(modes[1])


@forward("h u o4", "nvmlDeviceSetMigMode")
def _set_mig_mode(sim: SimulatedNvml, device: int, mode: int, status: Out) -> None:
    status.set(sim.nvmlDeviceSetMigMode(_dev(device), mode))


@forward("h u o48", "nvmlDeviceGetGpuInstanceProfileInfo")
def _gi_profile_v1(sim: SimulatedNvml, device: int, profile: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetGpuInstanceProfileInfo(_dev(device), profile, version=1))


def _gi_profile_version(out: VersionedOut) -> int:
    if out.version == pynvml.nvmlGpuInstanceProfileInfo_v2:
        return 2
    if out.version == nvmlGpuInstanceProfileInfo_v3:
        return 3
    raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # nvml.h: info->version invalid


@forward("h u v", "nvmlDeviceGetGpuInstanceProfileInfoV")
def _gi_profile(sim: SimulatedNvml, device: int, profile: int, out: VersionedOut) -> None:
    version = _gi_profile_version(out)
    out.set(sim.nvmlDeviceGetGpuInstanceProfileInfo(_dev(device), profile, version=version))


@forward("h u v", "nvmlDeviceGetGpuInstanceProfileInfoByIdV")
def _gi_profile_by_id(sim: SimulatedNvml, device: int, profile_id: int, out: VersionedOut) -> None:
    version = _gi_profile_version(out)
    out.set(sim.nvmlDeviceGetGpuInstanceProfileInfoById(_dev(device), profile_id, version=version))


@forward("h u A8", "nvmlDeviceGetGpuInstancePossiblePlacements", "nvmlDeviceGetGpuInstancePossiblePlacements_v2")
def _gi_placements(sim: SimulatedNvml, device: int, profile_id: int, out: ArrayOut) -> None:
    _array(
        out,
        pynvml.c_nvmlGpuInstancePlacement_t,
        lambda array, count: sim.nvmlDeviceGetGpuInstancePossiblePlacements(_dev(device), profile_id, array, count),
    )


@forward("h u o4", "nvmlDeviceGetGpuInstanceRemainingCapacity")
def _gi_capacity(sim: SimulatedNvml, device: int, profile_id: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetGpuInstanceRemainingCapacity(_dev(device), profile_id))


# ----- GPU instances -----------------------------------------------------------------------------------------------
@forward("h u o8", "nvmlDeviceCreateGpuInstance")
def _create_gi(sim: SimulatedNvml, device: int, profile_id: int, out: Out) -> None:
    out.set(sim.nvmlDeviceCreateGpuInstance(_dev(device), profile_id))


@forward("h u B8 o8", "nvmlDeviceCreateGpuInstanceWithPlacement")
def _create_gi_placed(sim: SimulatedNvml, device: int, profile_id: int, placement: bytes, out: Out) -> None:
    p = pynvml.c_nvmlGpuInstancePlacement_t.from_buffer_copy(placement)
    out.set(sim.nvmlDeviceCreateGpuInstanceWithPlacement(_dev(device), profile_id, ctypes.byref(p)))


@forward("h", "nvmlGpuInstanceDestroy")
def _destroy_gi(sim: SimulatedNvml, gpu_instance: int) -> None:
    sim.nvmlGpuInstanceDestroy(_gi(gpu_instance))


@forward("h u A8", "nvmlDeviceGetGpuInstances")
def _gis(sim: SimulatedNvml, device: int, profile_id: int, out: ArrayOut) -> None:
    _array(
        out,
        pynvml.c_nvmlGpuInstance_t,
        lambda array, count: sim.nvmlDeviceGetGpuInstances(_dev(device), profile_id, array, count),
    )


@forward("h u o8", "nvmlDeviceGetGpuInstanceById")
def _gi_by_id(sim: SimulatedNvml, device: int, gi_id: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetGpuInstanceById(_dev(device), gi_id))


@forward("h o24", "nvmlGpuInstanceGetInfo")
def _gi_info(sim: SimulatedNvml, gpu_instance: int, out: Out) -> None:
    out.set(sim.nvmlGpuInstanceGetInfo(_gi(gpu_instance)))


# ----- compute instances -------------------------------------------------------------------------------------------
@forward("h u u o36", "nvmlGpuInstanceGetComputeInstanceProfileInfo")
def _ci_profile_v1(sim: SimulatedNvml, gpu_instance: int, profile: int, engine: int, out: Out) -> None:
    out.set(sim.nvmlGpuInstanceGetComputeInstanceProfileInfo(_gi(gpu_instance), profile, engine, version=1))


@forward("h u u v", "nvmlGpuInstanceGetComputeInstanceProfileInfoV")
def _ci_profile(sim: SimulatedNvml, gpu_instance: int, profile: int, engine: int, out: VersionedOut) -> None:
    if out.version == pynvml.nvmlComputeInstanceProfileInfo_v2:
        version = 2
    elif out.version == nvmlComputeInstanceProfileInfo_v3:
        version = 3
    else:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # nvml.h: info->version invalid
    out.set(sim.nvmlGpuInstanceGetComputeInstanceProfileInfo(_gi(gpu_instance), profile, engine, version=version))


@forward("h u o4", "nvmlGpuInstanceGetComputeInstanceRemainingCapacity")
def _ci_capacity(sim: SimulatedNvml, gpu_instance: int, profile_id: int, out: Out) -> None:
    out.set(sim.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(_gi(gpu_instance), profile_id))


@forward("h u A8", "nvmlGpuInstanceGetComputeInstancePossiblePlacements")
def _ci_placements(sim: SimulatedNvml, gpu_instance: int, profile_id: int, out: ArrayOut) -> None:
    _array(
        out,
        pynvml.c_nvmlComputeInstancePlacement_t,
        lambda array, count: sim.nvmlGpuInstanceGetComputeInstancePossiblePlacements(
            _gi(gpu_instance), profile_id, array, count
        ),
    )


@forward("h u o8", "nvmlGpuInstanceCreateComputeInstance")
def _create_ci(sim: SimulatedNvml, gpu_instance: int, profile_id: int, out: Out) -> None:
    out.set(sim.nvmlGpuInstanceCreateComputeInstance(_gi(gpu_instance), profile_id))


@forward("h u B8 o8", "nvmlGpuInstanceCreateComputeInstanceWithPlacement")
def _create_ci_placed(sim: SimulatedNvml, gpu_instance: int, profile_id: int, placement: bytes, out: Out) -> None:
    p = pynvml.c_nvmlComputeInstancePlacement_t.from_buffer_copy(placement)
    out.set(sim.nvmlGpuInstanceCreateComputeInstanceWithPlacement(_gi(gpu_instance), profile_id, ctypes.byref(p)))


@forward("h", "nvmlComputeInstanceDestroy")
def _destroy_ci(sim: SimulatedNvml, compute_instance: int) -> None:
    sim.nvmlComputeInstanceDestroy(_ci(compute_instance))


@forward("h u A8", "nvmlGpuInstanceGetComputeInstances")
def _cis(sim: SimulatedNvml, gpu_instance: int, profile_id: int, out: ArrayOut) -> None:
    _array(
        out,
        pynvml.c_nvmlComputeInstance_t,
        lambda array, count: sim.nvmlGpuInstanceGetComputeInstances(_gi(gpu_instance), profile_id, array, count),
    )


@forward("h u o8", "nvmlGpuInstanceGetComputeInstanceById")
def _ci_by_id(sim: SimulatedNvml, gpu_instance: int, ci_id: int, out: Out) -> None:
    out.set(sim.nvmlGpuInstanceGetComputeInstanceById(_gi(gpu_instance), ci_id))


@forward("h o32", "nvmlComputeInstanceGetInfo", "nvmlComputeInstanceGetInfo_v2")
def _ci_info(sim: SimulatedNvml, compute_instance: int, out: Out) -> None:
    out.set(sim.nvmlComputeInstanceGetInfo(_ci(compute_instance)))


# ----- MIG device handles ------------------------------------------------------------------------------------------
@forward("h o4", "nvmlDeviceIsMigDeviceHandle")
def _is_mig(sim: SimulatedNvml, device: int, out: Out) -> None:
    out.set(int(sim.nvmlDeviceIsMigDeviceHandle(_dev(device)).value))


@forward("h o4", "nvmlDeviceGetGpuInstanceId")
def _gi_id(sim: SimulatedNvml, device: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetGpuInstanceId(_dev(device)))


@forward("h o4", "nvmlDeviceGetComputeInstanceId")
def _ci_id(sim: SimulatedNvml, device: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetComputeInstanceId(_dev(device)))


@forward("h o4", "nvmlDeviceGetMaxMigDeviceCount")
def _max_mig(sim: SimulatedNvml, device: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetMaxMigDeviceCount(_dev(device)))


@forward("h u o8", "nvmlDeviceGetMigDeviceHandleByIndex")
def _mig_by_index(sim: SimulatedNvml, device: int, index: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetMigDeviceHandleByIndex(_dev(device), index))


@forward("h o8", "nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
def _parent(sim: SimulatedNvml, device: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(_dev(device)))


@forward("h o40", "nvmlDeviceGetAttributes", "nvmlDeviceGetAttributes_v2")
def _attributes(sim: SimulatedNvml, device: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetAttributes(_dev(device)))


# ----- events ------------------------------------------------------------------------------------------------------
@forward("o8", "nvmlEventSetCreate")
def _event_set_create(sim: SimulatedNvml, out: Out) -> None:
    out.set(sim.nvmlEventSetCreate())


@forward("h", "nvmlEventSetFree")
def _event_set_free(sim: SimulatedNvml, event_set: int) -> None:
    sim.nvmlEventSetFree(_set(event_set))


@forward("h o32 u", "nvmlEventSetWait", "nvmlEventSetWait_v2")
def _event_set_wait(sim: SimulatedNvml, event_set: int, out: Out, timeout_ms: int) -> None:
    out.set(sim.nvmlEventSetWait(_set(event_set), timeout_ms))


@forward("h U h", "nvmlDeviceRegisterEvents")
def _register_events(sim: SimulatedNvml, device: int, event_types: int, event_set: int) -> None:
    sim.nvmlDeviceRegisterEvents(_dev(device), event_types, _set(event_set))


@forward("h o8", "nvmlDeviceGetSupportedEventTypes")
def _supported_events(sim: SimulatedNvml, device: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetSupportedEventTypes(_dev(device)))


# ----- telemetry ---------------------------------------------------------------------------------------------------
@forward("h o8", "nvmlDeviceGetUtilizationRates")
def _utilization(sim: SimulatedNvml, device: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetUtilizationRates(_dev(device)))


@forward("h i o4", "nvmlDeviceGetTemperature")
def _temperature(sim: SimulatedNvml, device: int, sensor: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetTemperature(_dev(device), sensor))


@forward("h o4", "nvmlDeviceGetPowerUsage")
def _power(sim: SimulatedNvml, device: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetPowerUsage(_dev(device)))


@forward("h i i o8", "nvmlDeviceGetTotalEccErrors")
def _ecc(sim: SimulatedNvml, device: int, error_type: int, counter_type: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetTotalEccErrors(_dev(device), error_type, counter_type))


# ----- the board: modes, identity, PCIe link, power limits, clocks, topology, fabric ---------------------------------
def _scalar(method: str) -> Handler:
    def handler(sim: SimulatedNvml, device: int, out: Out) -> None:
        out.set(getattr(sim, method)(_dev(device)))

    return handler


_SCALARS = (
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetDisplayMode",
    "nvmlDeviceGetDisplayActive",
    "nvmlDeviceGetBoardId",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetEnforcedPowerLimit",
)
for _method in _SCALARS:
    forward("h o4", _method)(_scalar(_method))


@forward("h o4 o4", "nvmlDeviceGetEccMode")
def _ecc_mode(sim: SimulatedNvml, device: int, current: Out, pending: Out) -> None:
    modes = sim.nvmlDeviceGetEccMode(_dev(device))
    current.set(modes[0])
    pending.set(modes[1])


@forward("h S", "nvmlDeviceGetSerial")
def _serial(sim: SimulatedNvml, device: int, out: StrOut) -> None:
    out.set(sim.nvmlDeviceGetSerial(_dev(device)))


@forward("h o4 o4", "nvmlDeviceGetPowerManagementLimitConstraints")
def _power_constraints(sim: SimulatedNvml, device: int, low: Out, high: Out) -> None:
    limits = sim.nvmlDeviceGetPowerManagementLimitConstraints(_dev(device))
    low.set(limits[0])
    high.set(limits[1])


@forward("h i o4", "nvmlDeviceGetMaxClockInfo")
def _max_clock(sim: SimulatedNvml, device: int, clock_type: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetMaxClockInfo(_dev(device), clock_type))


@forward("h i o4", "nvmlDeviceGetClockInfo")
def _clock(sim: SimulatedNvml, device: int, clock_type: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetClockInfo(_dev(device), clock_type))


@forward("h h o4", "nvmlDeviceGetTopologyCommonAncestor")
def _common_ancestor(sim: SimulatedNvml, first: int, second: int, out: Out) -> None:
    out.set(sim.nvmlDeviceGetTopologyCommonAncestor(_dev(first), _dev(second)))


@forward("h o28", "nvmlDeviceGetGpuFabricInfo")
def _fabric(sim: SimulatedNvml, device: int, out: Out) -> None:
    info = pynvml.c_nvmlGpuFabricInfo_t()
    sim.nvmlDeviceGetGpuFabricInfo(_dev(device), ctypes.byref(info))
    out.set(info)


@forward("h v", "nvmlDeviceGetGpuFabricInfoV")
def _fabric_v(sim: SimulatedNvml, device: int, out: VersionedOut) -> None:
    if out.version != pynvml.nvmlGpuFabricInfo_v2:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    info.version = out.version
    sim.nvmlDeviceGetGpuFabricInfoV(_dev(device), ctypes.byref(info))
    out.set(info)


# ----- processes -----------------------------------------------------------------------------------------------------
class _ProcessInfoV1(ctypes.Structure):
    """nvml.h's nvmlProcessInfo_v1_t (the unsuffixed functions'), which pynvml does not define."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE for an unsigned long long


def _processes(method: str, elem: Any) -> Handler:
    """NVML's process-list convention: *count in, the number of processes out; too small (a NULL array with a count
    of 0 asks) is NVML_ERROR_INSUFFICIENT_SIZE."""

    def handler(sim: SimulatedNvml, device: int, out: ArrayOut) -> None:
        found = getattr(sim, method)(_dev(device))
        structs = []
        for proc in found:
            info = elem()
            info.pid = proc.pid
            info.usedGpuMemory = _NOT_AVAILABLE if proc.usedGpuMemory is None else proc.usedGpuMemory
            if hasattr(info, "gpuInstanceId"):
                info.gpuInstanceId, info.computeInstanceId = proc.gpuInstanceId, proc.computeInstanceId
            structs.append(info)
        out.set_count(len(structs))
        if out.count < len(structs) or (structs and not out.array_present):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        if out.array_present:
            out.set_items(b"".join(bytes(info) for info in structs))

    return handler


for _kind in ("Compute", "Graphics", "MPSCompute"):
    _base = f"nvmlDevice{_kind}RunningProcesses".replace("nvmlDevice", "nvmlDeviceGet")
    forward("h A16", _base)(_processes(_base, _ProcessInfoV1))
    for _suffix in ("_v2", "_v3"):
        forward("h A24", _base + _suffix)(_processes(_base + _suffix, pynvml.c_nvmlProcessInfo_v2_t))
