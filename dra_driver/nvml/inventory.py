"""What discovery found on a node: plain data, independent of NVML and of Kubernetes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Placement(_Frozen):
    start: int
    size: int


class MigProfile(_Frozen):
    """One GPU-instance profile of a GPU, with the compute instance spanning it (C == G)."""

    enum: int  # NVML_GPU_INSTANCE_PROFILE_* index passed to GetGpuInstanceProfileInfo
    id: int  # info.id: what Create*/GetGpuInstances take and GpuInstanceInfo.profileId holds
    name: str  # canonical name computed as NVIDIA does, e.g. 3g.71gb
    driver_name: str  # info.name as the driver reports it
    compute_slices: int
    memory_slices: int
    instance_count: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    memory_mib: int
    placements: tuple[Placement, ...]

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib << 20  # nvml.h documents memorySizeMB in MiB


class MigInstance(_Frozen):
    """A MIG device that exists now (GPU instance + compute instance)."""

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile_id: int
    profile_name: str
    placement: Placement
    memory_bytes: int
    multiprocessors: int


class GpuInfo(_Frozen):
    index: int
    minor: int
    uuid: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str  # "9.0"
    pci_bus_id: str  # extended BDF, lower case
    pcie_root: str | None
    pci_device_id: int
    memory_bytes: int
    mig_capable: bool
    mig_enabled: bool
    mig_pending: bool
    virtualized: bool  # a vGPU guest: MIG cannot be managed from here
    mig_toggle_needs_reset: bool  # Ampere: MIG mode changes need a GPU reset
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_instances: tuple[MigInstance, ...] = ()
    numa_node: int | None = None  # sysfs numa_node; None: unknown or no affinity
    # The other nodes of the GPU's socket as close to it as its own (sub-NUMA clustering), ascending: the list form
    # of numaNode is (numa_node, *numa_peers) (nvml.pcie.numa_nodes)
    numa_peers: tuple[int, ...] = ()
    fabric_cluster: str | None = None  # NVLink fabric cluster UUID (an NVL72 rack's domain); None: no fabric
    fabric_clique: int | None = None  # the clique within it: GPUs that reach each other over NVLink

    def profile(self, profile_id: int) -> MigProfile:
        for p in self.mig_profiles:
            if p.id == profile_id:
                return p
        raise KeyError(f"GPU {self.minor} has no MIG profile with id {profile_id}")


class Inventory(_Frozen):
    driver_version: str
    cuda_driver_version: str  # "12.4"
    gpus: tuple[GpuInfo, ...]

    def gpu_by_minor(self, minor: int) -> GpuInfo:
        for g in self.gpus:
            if g.minor == minor:
                return g
        raise KeyError(f"no GPU with minor number {minor}")

    def gpu_by_uuid(self, uuid: str) -> GpuInfo | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)
