"""The devices this node publishes, by name, with what the plugin needs to prepare each of them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dra_driver.api.slice import Device
from dra_driver.nvml.inventory import GpuInfo, Inventory, MigProfile
from dra_driver.slices.devices import MigProfiles, PublishMode, gpu_devices
from dra_driver.slices.naming import MigRef, parse_device_name

if TYPE_CHECKING:
    from dra_driver.cel.device import CelDevice


@dataclass(frozen=True)
class CatalogEntry:
    """A device this node publishes. The device itself is kept as its JSON: the daemon holds its catalog for its
    whole life, and as pydantic models a DGX H100's 208 devices (every MIG placement) took megabytes; as JSON they
    stay under one (tests/test_memory.py)."""

    name: str
    device_type: str  # its "type" attribute: gpu or mig
    multiple_allocations: bool  # allowMultipleAllocations: several claims may hold it at once
    device_json: bytes  # the device as published in the ResourceSlice (what selectors see), compact JSON
    gpu: GpuInfo  # the whole GPU, or the parent of a MIG partition
    profile: MigProfile | None  # set for MIG partitions
    placement_start: int | None
    # the device as CEL selectors see it, by driver name: converted at its first check only (an entry never
    # changes, a rediscovery builds new ones), not at every prepare
    _cel: dict[str, CelDevice] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, device: Device, gpu: GpuInfo, profile: MigProfile | None, placement_start: int | None) -> CatalogEntry:
        kind = str(device.attributes["type"].value())
        multiple = bool(device.allow_multiple_allocations)
        return cls(device.name, kind, multiple, device.to_api_json(), gpu, profile, placement_start)

    def cel_device(self, driver: str) -> CelDevice:
        cel = self._cel.get(driver)
        if cel is None:
            from dra_driver.cel.device import CelDevice  # CEL loads after start-up (plugin.selectors)

            cel = self._cel[driver] = CelDevice.from_slice_device(driver, json.loads(self.device_json))
        return cel

    @property
    def memory_slices(self) -> set[int]:
        """The memory slices this device occupies on its GPU (all of them for a whole GPU)."""
        if self.profile is None or self.placement_start is None:
            return set(range(8))
        return set(range(self.placement_start, self.placement_start + self.profile.memory_slices))


def build_catalog(inventory: Inventory, mode: PublishMode, mig_profiles: MigProfiles = None) -> dict[str, CatalogEntry]:
    catalog: dict[str, CatalogEntry] = {}
    for gpu in inventory.gpus:
        for device in gpu_devices(inventory, gpu, mode, mig_profiles=mig_profiles).devices:
            ref = parse_device_name(device.name)
            if isinstance(ref, MigRef):
                catalog[device.name] = CatalogEntry.of(device, gpu, gpu.profile(ref.profile_id), ref.placement_start)
            else:
                catalog[device.name] = CatalogEntry.of(device, gpu, None, None)
    return catalog


def conflicts(a: CatalogEntry, b: CatalogEntry) -> bool:
    """Two devices of this node cannot be held at once: same GPU and overlapping memory slices; except a device
    published for several claims (allowMultipleAllocations), whose sharing the scheduler accounts for."""
    if a.name == b.name and a.multiple_allocations:
        return False
    return a.gpu.uuid == b.gpu.uuid and bool(a.memory_slices & b.memory_slices)
