"""Data files that describe simulated hardware: GPU products (one file each) and named machines.

Profile tables are data keyed by product *and* driver version, never code: the same product reports
different MIG memory under different drivers (see docs in each file's `sources`).
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any, Literal

import pynvml
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_DATA = resources.files("dra_driver.simulator") / "data"


def _load_yaml(text: str) -> Any:
    """libyaml's parser where PyYAML has it (several times faster: the daemon's start waits for the catalog)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


MEMORY_SLICES = 8  # every product modelled here is an 8-memory-slice / 7-compute-slice part

Architecture = Literal["ampere", "ada", "hopper", "blackwell"]
ARCHITECTURE_ENUM: dict[str, int] = {
    "ampere": pynvml.NVML_DEVICE_ARCH_AMPERE,
    "ada": pynvml.NVML_DEVICE_ARCH_ADA,
    "hopper": pynvml.NVML_DEVICE_ARCH_HOPPER,
    "blackwell": pynvml.NVML_DEVICE_ARCH_BLACKWELL,
}
BRAND_ENUM: dict[str, int] = {"nvidia": pynvml.NVML_BRAND_NVIDIA, "tesla": pynvml.NVML_BRAND_TESLA}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuInstanceProfileSpec(_Strict):
    enum: str = Field(description="suffix of NVML_GPU_INSTANCE_PROFILE_*, e.g. 1_SLICE_REV1")
    id: int = Field(description="info.id as nvidia-smi mig -lgip prints it")
    name: str = Field(description="profile name as nvidia-smi prints it (without 'MIG ')")
    compute_slices: int
    memory_slices: int = Field(description="placement size in memory slices")
    instance_count: int
    placements: list[int] = Field(description="legal placement starts")
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    memory_mib: int

    @property
    def enum_value(self) -> int:
        value = getattr(pynvml, f"NVML_GPU_INSTANCE_PROFILE_{self.enum}", None)
        if not isinstance(value, int):
            raise ValueError(f"unknown GPU instance profile enum {self.enum}")
        return value

    @model_validator(mode="after")
    def _check_geometry(self) -> GpuInstanceProfileSpec:
        self.enum_value  # noqa: B018 - validates the enum name
        for start in self.placements:
            if start % self.memory_slices or start + self.memory_slices > MEMORY_SLICES:
                raise ValueError(f"profile {self.name}: placement {start}:{self.memory_slices} is not aligned")
        return self


class BoardSpec(_Strict):
    """What NVML reports of the board beyond its identity: its PCIe link, power limits and maximum clocks (the
    product's data sheet and published `nvidia-smi -q` outputs; a simulated GPU runs at its maximum clocks)."""

    pcie_generation: int = Field(ge=1, le=6, description="nvmlDeviceGetMaxPcieLinkGeneration (and the GPU's own)")
    pcie_width: int = Field(default=16, description="lanes, nvmlDeviceGetMaxPcieLinkWidth")
    power_limit_w: int = Field(description="default and enforced power limit (nvidia-smi's Default Power Limit)")
    min_power_limit_w: int
    max_power_limit_w: int
    graphics_clock_mhz: int = Field(description="nvmlDeviceGetMaxClockInfo(NVML_CLOCK_GRAPHICS)")
    sm_clock_mhz: int
    memory_clock_mhz: int
    video_clock_mhz: int

    @model_validator(mode="after")
    def _limits_in_order(self) -> BoardSpec:
        if not self.min_power_limit_w <= self.power_limit_w <= self.max_power_limit_w:
            limits = (self.min_power_limit_w, self.power_limit_w, self.max_power_limit_w)
            raise ValueError(f"power limits out of order (min, default, max): {limits}")
        return self


class ProductSpec(_Strict):
    key: str
    name: str = Field(description="nvmlDeviceGetName")
    pci_device_id: int
    architecture: Architecture
    brand: Literal["nvidia", "tesla"]
    cuda_compute_capability: tuple[int, int]
    memory_mib: int = Field(description="nvmlDeviceGetMemoryInfo().total in MiB, as nvidia-smi shows it")
    driver_version: str = Field(description="driver the profile table was observed with")
    board: BoardSpec
    mig_profiles: list[GpuInstanceProfileSpec] = []
    sources: list[str] = []
    inferred: list[str] = Field(default=[], description="values not seen on hardware")

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    @property
    def mig_toggle_needs_reset(self) -> bool:
        # A100/A30: "Setting MIG mode on the A100/A30 requires a GPU reset" (MIG user guide).
        return self.architecture == "ampere"

    @field_validator("mig_profiles")
    @classmethod
    def _unique_profiles(cls, profiles: list[GpuInstanceProfileSpec]) -> list[GpuInstanceProfileSpec]:
        for attr in ("enum", "id", "name"):
            values = [getattr(p, attr) for p in profiles]
            if len(values) != len(set(values)):
                raise ValueError(f"duplicate profile {attr} in {values}")
        return profiles


class MachineGpu(_Strict):
    product: str
    pci_bus_id: str = Field(description="NVML form, e.g. 00000000:1B:00.0")
    pcie_root: str = Field(description="sysfs root complex, e.g. pci0000:15")
    mig_enabled: bool = False
    minor: int | None = Field(default=None, description="/dev/nvidiaN; defaults to the NVML index")
    numa_node: int = Field(default=-1, ge=-1, description="sysfs numa_node of the GPU's PCI function; -1: none")


class NumaTopology(_Strict):
    """The host's CPUs and NUMA nodes as the kernel shows them under /sys/devices/system (what the list form of
    `numaNode` reads): nodes numbered socket by socket, each with its cores, the hyperthread siblings numbered after
    every first thread (Linux's order), and the SLIT distance table of /sys/devices/system/node/nodeN/distance."""

    sockets: int = Field(default=2, ge=1)
    nodes_per_socket: int = Field(
        default=1, ge=1, description="above 1: sub-NUMA clustering (Intel SNC2/SNC4) or AMD's NPS2/NPS4"
    )
    cores_per_node: int = Field(ge=1)
    threads_per_core: int = Field(default=2, ge=1, le=2)
    local_distance: int = 10  # the ACPI SLIT's self distance
    same_socket_distance: int = Field(default=12, description="between two nodes of one socket")
    other_socket_distance: int = Field(description="between nodes of different sockets")

    @property
    def nodes(self) -> int:
        return self.sockets * self.nodes_per_socket

    def socket(self, node: int) -> int:
        return node // self.nodes_per_socket

    def distances(self, node: int) -> list[int]:
        """Node `node`'s row of the distance table."""
        return [
            self.local_distance
            if other == node
            else self.same_socket_distance
            if self.socket(other) == self.socket(node)
            else self.other_socket_distance
            for other in range(self.nodes)
        ]

    def cpu_ranges(self, node: int) -> list[range]:
        """The node's CPUs: its cores' first threads, then (with SMT) their siblings, numbered after all first ones."""
        cores = self.nodes * self.cores_per_node
        first = node * self.cores_per_node
        return [range(t * cores + first, t * cores + first + self.cores_per_node) for t in range(self.threads_per_core)]


class MachineSpec(_Strict):
    name: str
    description: str
    driver_version: str
    cuda_driver_version: int = Field(description="nvmlSystemGetCudaDriverVersion, e.g. 12080")
    nvlink_fabric: bool = Field(default=False, description="GPUs join a multi-node NVLink fabric (NVL72 racks)")
    numa: NumaTopology | None = Field(default=None, description="None: no /sys/devices/system tree")
    gpus: list[MachineGpu]

    @model_validator(mode="after")
    def _gpus_on_known_nodes(self) -> MachineSpec:
        if self.numa is not None:
            for gpu in self.gpus:
                if gpu.numa_node >= self.numa.nodes:
                    raise ValueError(f"GPU {gpu.pci_bus_id}: NUMA node {gpu.numa_node} of {self.numa.nodes}")
        return self


RECOVERY_ACTIONS: dict[str, int] = {
    "none": pynvml.NVML_GPU_RECOVERY_ACTION_NONE,
    "gpu-reset": pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET,
    "node-reboot": pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT,
    "drain-p2p": pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P,
    "drain-and-reset": pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET,
}
RecoveryAction = Literal["none", "gpu-reset", "node-reboot", "drain-p2p", "drain-and-reset"]


class XidRecovery(_Strict):
    action: RecoveryAction
    by_architecture: dict[Architecture, RecoveryAction] = {}


class RecoveryCatalog(_Strict):
    """data/xid-recovery.yaml: the recovery action a GPU reports after an XID, from driver `min_driver_major`."""

    min_driver_major: int
    xids: dict[int, XidRecovery]

    def supported(self, driver_version: str) -> bool:
        return int(driver_version.split(".")[0]) >= self.min_driver_major

    def action(self, xid: int, architecture: str) -> int | None:
        """The NVML recovery action after `xid` on a GPU of this architecture; None: the XID changes nothing."""
        entry = self.xids.get(xid)
        if entry is None:
            return None
        return RECOVERY_ACTIONS[entry.by_architecture.get(architecture, entry.action)]  # type: ignore[call-overload]


@cache
def recovery_catalog() -> RecoveryCatalog:
    return RecoveryCatalog.model_validate(_load_yaml((_DATA / "xid-recovery.yaml").read_text()))


@cache
def product(key: str) -> ProductSpec:
    path = _DATA / "products" / f"{key}.yaml"
    if not path.is_file():
        raise KeyError(f"unknown GPU product {key!r}; known: {', '.join(product_keys())}")
    return ProductSpec.model_validate({"key": key, **_load_yaml(path.read_text())})


def product_keys() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in (_DATA / "products").iterdir() if p.name.endswith(".yaml"))


@cache
def _machines() -> dict[str, MachineSpec]:
    raw = _load_yaml((_DATA / "machines.yaml").read_text())
    machines = {name: MachineSpec.model_validate({"name": name, **spec}) for name, spec in raw.items()}
    for m in machines.values():
        for gpu in m.gpus:
            product(gpu.product)  # fail on load, not on first use
    return machines


def machine(name: str) -> MachineSpec:
    try:
        return _machines()[name]
    except KeyError:
        raise KeyError(f"unknown simulated machine {name!r}; known: {', '.join(machine_names())}") from None


def machine_names() -> list[str]:
    return sorted(_machines())
