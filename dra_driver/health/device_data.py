"""What the status entry of a prepared device says about it (`status.devices[].data`, KEP-4817), beside its health
condition: which GPU or MIG device the container got, on which driver, and how it is shared.

    uuid, productName            the GPU's, or the MIG device's own UUID (and parentUUID)
    mig                          profile and placement {start, size} of a MIG partition, and its GPU and compute
                                 instance ids {gpuInstanceId, computeInstanceId}: with parentUUID what dcgm-exporter
                                 labels a MIG device's metrics with (UUID of the GPU, GPU_I_ID, GPU_I_PROFILE)
    computeMode                  a whole GPU's, as NVML reports it now (Default, Exclusive_Process, Prohibited)
    sharing                      {strategy: TimeSlicing, interval: Default|Short|Medium|Long} or {strategy: MPS}
    driverVersion, cudaDriverVersion

Read from what the plugin already holds (catalog, checkpoint, inventory) plus one NVML call for the compute mode: a
failing call leaves that field out rather than the entry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pynvml

from dra_driver.claimstate.checkpoint import CheckpointedDevice, ClaimEntry, MpsRecord, TimeSlicingRecord
from dra_driver.health.claim_status import DeviceData
from dra_driver.nvml.api import NvmlLibrary, describe
from dra_driver.nvml.inventory import Inventory
from dra_driver.plugin.catalog import CatalogEntry
from dra_driver.sharing.conflicts import TIME_SLICE

log = logging.getLogger(__name__)

COMPUTE_MODE_NAMES = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: "Default",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "Exclusive_Process",
    pynvml.NVML_COMPUTEMODE_PROHIBITED: "Prohibited",
}


def device_data_source(
    lib: NvmlLibrary, inventory: Callable[[], Inventory], catalog: Callable[[], dict[str, CatalogEntry]]
) -> DeviceData:
    """`data(claim, device)` for the claim status reporter (None for a device of an older inventory)."""

    def data(claim: ClaimEntry, device: CheckpointedDevice) -> dict[str, Any] | None:
        entry = catalog().get(device.device)
        if entry is None:
            return None
        inv, gpu = inventory(), entry.gpu
        out: dict[str, Any] = {"productName": gpu.product_name}
        if entry.profile is not None and entry.placement_start is not None:
            out["parentUUID"] = gpu.uuid
            out["mig"] = {
                "profile": entry.profile.name,
                "placement": {"start": entry.placement_start, "size": entry.profile.memory_slices},
            }
            if device.mig is not None:
                out["uuid"] = device.mig.uuid
                out["mig"].update(gpuInstanceId=device.mig.gi_id, computeInstanceId=device.mig.ci_id)
        else:
            out["uuid"] = gpu.uuid
            mode = _compute_mode(lib, gpu.uuid)
            if mode is not None:
                out["computeMode"] = mode
        if isinstance(device.sharing, TimeSlicingRecord):
            interval = next((n for n, v in TIME_SLICE.items() if v == device.sharing.interval), None)
            out["sharing"] = {"strategy": "TimeSlicing", "interval": interval or str(device.sharing.interval)}
        elif isinstance(device.sharing, MpsRecord):
            out["sharing"] = {"strategy": "MPS"}
        out["driverVersion"] = inv.driver_version
        out["cudaDriverVersion"] = inv.cuda_driver_version
        return out

    return data


def _compute_mode(lib: NvmlLibrary, uuid: str) -> str | None:
    try:
        mode = lib.nvmlDeviceGetComputeMode(lib.nvmlDeviceGetHandleByUUID(uuid))
    except pynvml.NVMLError as err:
        log.info("compute mode of %s: %s", uuid, describe(err))
        return None
    return COMPUTE_MODE_NAMES.get(mode)
