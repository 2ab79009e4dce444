/* The NVML functions the simulator models: each forwards its parameters to the simulator's server, which answers from
 * the simulated machine's state (dra_driver/simulator/libnvml/handlers.py has the other half of every line: the same
 * name and format). Every other function of the NVML header (nvml_functions.txt) is a stub generated at build time
 * that returns NVML_ERROR_NOT_SUPPORTED. nvmlInit*, nvmlShutdown and nvmlErrorString live in libnvml.c.
 *
 * Sizes in the formats are the C layouts of nvml.h's structs on LP64 (x86_64, aarch64); the server checks each
 * struct it sends against them: nvmlPciInfo_t 68, nvmlMemory_t 24, nvmlGpuInstanceProfileInfo_t 48,
 * nvmlComputeInstanceProfileInfo_t 36, nvmlGpuInstanceInfo_t 24, nvmlComputeInstanceInfo_t 32,
 * nvmlDeviceAttributes_t 40, nvmlEventData_t 32, nvmlUtilization_t 8, nvmlUUID_t 52, placements 8, handles 8. */
#include "libnvml.h"

typedef void *handle_t; /* nvmlDevice_t, nvmlGpuInstance_t, nvmlComputeInstance_t, nvmlEventSet_t */

#define FORWARD(name, fmt, params, ...)                                                                               \
    NVML_EXPORT nvmlReturn_t name params { return simnvml_forward(#name, fmt, __VA_ARGS__); }

/* ----- system ----------------------------------------------------------------------------------------------- */
FORWARD(nvmlSystemGetDriverVersion, "S", (char *version, unsigned int length), version, length)
FORWARD(nvmlSystemGetNVMLVersion, "S", (char *version, unsigned int length), version, length)
FORWARD(nvmlSystemGetCudaDriverVersion, "o4", (int *version), version)
FORWARD(nvmlSystemGetCudaDriverVersion_v2, "o4", (int *version), version)

/* ----- devices ---------------------------------------------------------------------------------------------- */
FORWARD(nvmlDeviceGetCount, "o4", (unsigned int *count), count)
FORWARD(nvmlDeviceGetCount_v2, "o4", (unsigned int *count), count)
FORWARD(nvmlDeviceGetHandleByIndex, "u o8", (unsigned int index, handle_t *device), index, device)
FORWARD(nvmlDeviceGetHandleByIndex_v2, "u o8", (unsigned int index, handle_t *device), index, device)
FORWARD(nvmlDeviceGetHandleByUUID, "s o8", (const char *uuid, handle_t *device), uuid, device)
FORWARD(nvmlDeviceGetHandleByUUIDV, "B52 o8", (const void *uuid, handle_t *device), uuid, device)
FORWARD(nvmlDeviceGetHandleByPciBusId, "s o8", (const char *bus_id, handle_t *device), bus_id, device)
FORWARD(nvmlDeviceGetHandleByPciBusId_v2, "s o8", (const char *bus_id, handle_t *device), bus_id, device)
FORWARD(nvmlDeviceGetName, "h S", (handle_t device, char *name, unsigned int length), device, name, length)
FORWARD(nvmlDeviceGetUUID, "h S", (handle_t device, char *uuid, unsigned int length), device, uuid, length)
FORWARD(nvmlDeviceGetMinorNumber, "h o4", (handle_t device, unsigned int *minor), device, minor)
FORWARD(nvmlDeviceGetIndex, "h o4", (handle_t device, unsigned int *index), device, index)
FORWARD(nvmlDeviceGetPciInfo, "h o68", (handle_t device, void *pci), device, pci)
FORWARD(nvmlDeviceGetPciInfo_v2, "h o68", (handle_t device, void *pci), device, pci)
FORWARD(nvmlDeviceGetPciInfo_v3, "h o68", (handle_t device, void *pci), device, pci)
FORWARD(nvmlDeviceGetMemoryInfo, "h o24", (handle_t device, void *memory), device, memory)
FORWARD(nvmlDeviceGetMemoryInfo_v2, "h v", (handle_t device, void *memory), device, memory)
FORWARD(nvmlDeviceGetBrand, "h o4", (handle_t device, int *brand), device, brand)
FORWARD(nvmlDeviceGetArchitecture, "h o4", (handle_t device, unsigned int *arch), device, arch)
FORWARD(nvmlDeviceGetCudaComputeCapability, "h o4 o4", (handle_t device, int *major, int *minor), device, major,
        minor)
FORWARD(nvmlDeviceGetVirtualizationMode, "h o4", (handle_t device, int *mode), device, mode)
FORWARD(nvmlDeviceGetComputeMode, "h o4", (handle_t device, int *mode), device, mode)
FORWARD(nvmlDeviceSetComputeMode, "h i", (handle_t device, int mode), device, mode)

/* ----- MIG mode, GPU instance profiles and placements --------------------------------------------------------- */
FORWARD(nvmlDeviceGetMigMode, "h o4 o4", (handle_t device, unsigned int *current, unsigned int *pending), device,
        current, pending)
FORWARD(nvmlDeviceSetMigMode, "h u o4", (handle_t device, unsigned int mode, int *activation_status), device, mode,
        activation_status)
FORWARD(nvmlDeviceGetGpuInstanceProfileInfo, "h u o48", (handle_t device, unsigned int profile, void *info), device,
        profile, info)
FORWARD(nvmlDeviceGetGpuInstanceProfileInfoV, "h u v", (handle_t device, unsigned int profile, void *info), device,
        profile, info)
FORWARD(nvmlDeviceGetGpuInstanceProfileInfoByIdV, "h u v", (handle_t device, unsigned int profile_id, void *info),
        device, profile_id, info)
FORWARD(nvmlDeviceGetGpuInstancePossiblePlacements, "h u A8",
        (handle_t device, unsigned int profile_id, void *placements, unsigned int *count), device, profile_id,
        placements, count)
FORWARD(nvmlDeviceGetGpuInstancePossiblePlacements_v2, "h u A8",
        (handle_t device, unsigned int profile_id, void *placements, unsigned int *count), device, profile_id,
        placements, count)
FORWARD(nvmlDeviceGetGpuInstanceRemainingCapacity, "h u o4",
        (handle_t device, unsigned int profile_id, unsigned int *count), device, profile_id, count)

/* ----- GPU instances ---------------------------------------------------------------------------------------- */
FORWARD(nvmlDeviceCreateGpuInstance, "h u o8", (handle_t device, unsigned int profile_id, handle_t *gpu_instance),
        device, profile_id, gpu_instance)
FORWARD(nvmlDeviceCreateGpuInstanceWithPlacement, "h u B8 o8",
        (handle_t device, unsigned int profile_id, const void *placement, handle_t *gpu_instance), device,
        profile_id, placement, gpu_instance)
FORWARD(nvmlGpuInstanceDestroy, "h", (handle_t gpu_instance), gpu_instance)
FORWARD(nvmlDeviceGetGpuInstances, "h u A8",
        (handle_t device, unsigned int profile_id, handle_t *gpu_instances, unsigned int *count), device, profile_id,
        gpu_instances, count)
FORWARD(nvmlDeviceGetGpuInstanceById, "h u o8", (handle_t device, unsigned int id, handle_t *gpu_instance), device,
        id, gpu_instance)
FORWARD(nvmlGpuInstanceGetInfo, "h o24", (handle_t gpu_instance, void *info), gpu_instance, info)

/* ----- compute instances ------------------------------------------------------------------------------------ */
FORWARD(nvmlGpuInstanceGetComputeInstanceProfileInfo, "h u u o36",
        (handle_t gpu_instance, unsigned int profile, unsigned int eng_profile, void *info), gpu_instance, profile,
        eng_profile, info)
FORWARD(nvmlGpuInstanceGetComputeInstanceProfileInfoV, "h u u v",
        (handle_t gpu_instance, unsigned int profile, unsigned int eng_profile, void *info), gpu_instance, profile,
        eng_profile, info)
FORWARD(nvmlGpuInstanceGetComputeInstanceRemainingCapacity, "h u o4",
        (handle_t gpu_instance, unsigned int profile_id, unsigned int *count), gpu_instance, profile_id, count)
FORWARD(nvmlGpuInstanceGetComputeInstancePossiblePlacements, "h u A8",
        (handle_t gpu_instance, unsigned int profile_id, void *placements, unsigned int *count), gpu_instance,
        profile_id, placements, count)
FORWARD(nvmlGpuInstanceCreateComputeInstance, "h u o8",
        (handle_t gpu_instance, unsigned int profile_id, handle_t *compute_instance), gpu_instance, profile_id,
        compute_instance)
FORWARD(nvmlGpuInstanceCreateComputeInstanceWithPlacement, "h u B8 o8",
        (handle_t gpu_instance, unsigned int profile_id, const void *placement, handle_t *compute_instance),
        gpu_instance, profile_id, placement, compute_instance)
FORWARD(nvmlComputeInstanceDestroy, "h", (handle_t compute_instance), compute_instance)
FORWARD(nvmlGpuInstanceGetComputeInstances, "h u A8",
        (handle_t gpu_instance, unsigned int profile_id, handle_t *compute_instances, unsigned int *count),
        gpu_instance, profile_id, compute_instances, count)
FORWARD(nvmlGpuInstanceGetComputeInstanceById, "h u o8",
        (handle_t gpu_instance, unsigned int id, handle_t *compute_instance), gpu_instance, id, compute_instance)
FORWARD(nvmlComputeInstanceGetInfo, "h o32", (handle_t compute_instance, void *info), compute_instance, info)
FORWARD(nvmlComputeInstanceGetInfo_v2, "h o32", (handle_t compute_instance, void *info), compute_instance, info)

/* ----- MIG device handles ----------------------------------------------------------------------------------- */
FORWARD(nvmlDeviceIsMigDeviceHandle, "h o4", (handle_t device, unsigned int *is_mig), device, is_mig)
FORWARD(nvmlDeviceGetGpuInstanceId, "h o4", (handle_t device, unsigned int *id), device, id)
FORWARD(nvmlDeviceGetComputeInstanceId, "h o4", (handle_t device, unsigned int *id), device, id)
FORWARD(nvmlDeviceGetMaxMigDeviceCount, "h o4", (handle_t device, unsigned int *count), device, count)
FORWARD(nvmlDeviceGetMigDeviceHandleByIndex, "h u o8", (handle_t device, unsigned int index, handle_t *mig_device),
        device, index, mig_device)
FORWARD(nvmlDeviceGetDeviceHandleFromMigDeviceHandle, "h o8", (handle_t mig_device, handle_t *device), mig_device,
        device)
FORWARD(nvmlDeviceGetAttributes, "h o40", (handle_t device, void *attributes), device, attributes)
FORWARD(nvmlDeviceGetAttributes_v2, "h o40", (handle_t device, void *attributes), device, attributes)

/* ----- events ----------------------------------------------------------------------------------------------- */
FORWARD(nvmlEventSetCreate, "o8", (handle_t *set), set)
FORWARD(nvmlEventSetFree, "h", (handle_t set), set)
FORWARD(nvmlEventSetWait, "h o32 u", (handle_t set, void *data, unsigned int timeout_ms), set, data, timeout_ms)
FORWARD(nvmlEventSetWait_v2, "h o32 u", (handle_t set, void *data, unsigned int timeout_ms), set, data, timeout_ms)
FORWARD(nvmlDeviceRegisterEvents, "h U h", (handle_t device, unsigned long long event_types, handle_t set), device,
        event_types, set)
FORWARD(nvmlDeviceGetSupportedEventTypes, "h o8", (handle_t device, unsigned long long *event_types), device,
        event_types)

/* ----- telemetry -------------------------------------------------------------------------------------------- */
FORWARD(nvmlDeviceGetUtilizationRates, "h o8", (handle_t device, void *utilization), device, utilization)
FORWARD(nvmlDeviceGetTemperature, "h i o4", (handle_t device, int sensor, unsigned int *temperature), device, sensor,
        temperature)
FORWARD(nvmlDeviceGetPowerUsage, "h o4", (handle_t device, unsigned int *milliwatts), device, milliwatts)
FORWARD(nvmlDeviceGetTotalEccErrors, "h i i o8",
        (handle_t device, int error_type, int counter_type, unsigned long long *count), device, error_type,
        counter_type, count)

/* ----- the board: modes, identity, PCIe link, power limits, clocks, topology, fabric --------------------------
 * nvmlGpuFabricInfo_t 28 bytes; nvmlGpuFabricInfo_v2_t (nvmlDeviceGetGpuFabricInfoV) 36. */
FORWARD(nvmlDeviceGetPersistenceMode, "h o4", (handle_t device, int *mode), device, mode)
FORWARD(nvmlDeviceGetDisplayMode, "h o4", (handle_t device, int *display), device, display)
FORWARD(nvmlDeviceGetDisplayActive, "h o4", (handle_t device, int *active), device, active)
FORWARD(nvmlDeviceGetEccMode, "h o4 o4", (handle_t device, int *current, int *pending), device, current, pending)
FORWARD(nvmlDeviceGetSerial, "h S", (handle_t device, char *serial, unsigned int length), device, serial, length)
FORWARD(nvmlDeviceGetBoardId, "h o4", (handle_t device, unsigned int *board_id), device, board_id)
FORWARD(nvmlDeviceGetMaxPcieLinkGeneration, "h o4", (handle_t device, unsigned int *gen), device, gen)
FORWARD(nvmlDeviceGetGpuMaxPcieLinkGeneration, "h o4", (handle_t device, unsigned int *gen), device, gen)
FORWARD(nvmlDeviceGetCurrPcieLinkGeneration, "h o4", (handle_t device, unsigned int *gen), device, gen)
FORWARD(nvmlDeviceGetMaxPcieLinkWidth, "h o4", (handle_t device, unsigned int *width), device, width)
FORWARD(nvmlDeviceGetCurrPcieLinkWidth, "h o4", (handle_t device, unsigned int *width), device, width)
FORWARD(nvmlDeviceGetPowerManagementLimit, "h o4", (handle_t device, unsigned int *milliwatts), device, milliwatts)
FORWARD(nvmlDeviceGetPowerManagementDefaultLimit, "h o4", (handle_t device, unsigned int *milliwatts), device,
        milliwatts)
FORWARD(nvmlDeviceGetEnforcedPowerLimit, "h o4", (handle_t device, unsigned int *milliwatts), device, milliwatts)
FORWARD(nvmlDeviceGetPowerManagementLimitConstraints, "h o4 o4",
        (handle_t device, unsigned int *min_milliwatts, unsigned int *max_milliwatts), device, min_milliwatts,
        max_milliwatts)
FORWARD(nvmlDeviceGetMaxClockInfo, "h i o4", (handle_t device, int type, unsigned int *mhz), device, type, mhz)
FORWARD(nvmlDeviceGetClockInfo, "h i o4", (handle_t device, int type, unsigned int *mhz), device, type, mhz)
FORWARD(nvmlDeviceGetTopologyCommonAncestor, "h h o4", (handle_t first, handle_t second, int *level), first, second,
        level)
FORWARD(nvmlDeviceGetGpuFabricInfo, "h o28", (handle_t device, void *info), device, info)
FORWARD(nvmlDeviceGetGpuFabricInfoV, "h v", (handle_t device, void *info), device, info)

/* ----- processes: nvmlProcessInfo_v1_t 16 bytes, nvmlProcessInfo_v2_t and nvmlProcessInfo_t (v3) 24; the count
 * comes before the array here, so the arguments are passed in the "A" token's order. */
FORWARD(nvmlDeviceGetComputeRunningProcesses, "h A16",
        (handle_t device, unsigned int *count, void *infos), device, infos, count)
FORWARD(nvmlDeviceGetComputeRunningProcesses_v2, "h A24",
        (handle_t device, unsigned int *count, void *infos), device, infos, count)
FORWARD(nvmlDeviceGetComputeRunningProcesses_v3, "h A24",
        (handle_t device, unsigned int *count, void *infos), device, infos, count)
FORWARD(nvmlDeviceGetGraphicsRunningProcesses, "h A16",
        (handle_t device, unsigned int *count, void *infos), device, infos, count)
FORWARD(nvmlDeviceGetGraphicsRunningProcesses_v2, "h A24",
        (handle_t device, unsigned int *count, void *infos), device, infos, count)
FORWARD(nvmlDeviceGetGraphicsRunningProcesses_v3, "h A24",
        (handle_t device, unsigned int *count, void *infos), device, infos, count)
FORWARD(nvmlDeviceGetMPSComputeRunningProcesses, "h A16",
        (handle_t device, unsigned int *count, void *infos), device, infos, count)
FORWARD(nvmlDeviceGetMPSComputeRunningProcesses_v2, "h A24",
        (handle_t device, unsigned int *count, void *infos), device, infos, count)
FORWARD(nvmlDeviceGetMPSComputeRunningProcesses_v3, "h A24",
        (handle_t device, unsigned int *count, void *infos), device, infos, count)
