"""A simulated NVML with pynvml's own function names, argument conventions, ctypes structs and errors.

Production code receives an instance of `SimulatedNvml` where it would otherwise receive the `pynvml`
module (see `dra_driver.nvml.api.NvmlLibrary`) and cannot tell the difference: handles are real
`c_nvmlDevice_t`/`c_nvmlGpuInstance_t`/`c_nvmlComputeInstance_t` pointers (never dereferenced), results are
the structs pynvml returns, and failures raise `pynvml.NVMLError` subclasses with NVML's return codes.

Out-of-band operations a person does to hardware (resetting a GPU, a GPU falling off the bus) are the
methods that do not start with `nvml`.
"""

from __future__ import annotations

import ctypes
import itertools
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Any, NoReturn

import pynvml

from dra_driver.nvml.migprofile import COMPUTE_INSTANCE_ENUM_BY_SLICES
from dra_driver.simulator import mig_rules
from dra_driver.simulator.catalog import (
    ARCHITECTURE_ENUM,
    BRAND_ENUM,
    GpuInstanceProfileSpec,
    MachineSpec,
    ProductSpec,
    machine,
    product,
    recovery_catalog,
)
from dra_driver.simulator.driverroot import ensure_driver_root, write_nvidia_smi
from dra_driver.simulator.events import GPU_LEVEL, SUPPORTED_EVENT_TYPES, EventSetState, EventStore
from dra_driver.simulator.libnvml import write_conf
from dra_driver.simulator.mig_rules import MigRuleError
from dra_driver.simulator.procfs import ci_cap_minor, gi_cap_minor, write_fake_procfs
from dra_driver.simulator.state import (
    ComputeInstanceState,
    FabricState,
    GpuInstanceState,
    GpuProcess,
    GpuState,
    MachineState,
    StateStore,
)
from dra_driver.simulator.structs import (
    c_nvmlComputeInstanceProfileInfo_v3_t,
    c_nvmlGpuInstanceProfileInfo_v3_t,
    nvmlComputeInstanceProfileInfo_v3,
    nvmlGpuInstanceProfileInfo_v3,
)
from dra_driver.simulator.sysfs import write_fake_sysfs
from dra_driver.simulator.tools.state import process_start_time

_UUID_NAMESPACE = uuid.UUID("6f1c6d3e-6a43-4d39-9a4c-5b0b8d7f3a10")

# Recovery actions, least to most severe: a GPU reports the worst one outstanding.
_RECOVERY_SEVERITY = {
    a: i
    for i, a in enumerate(
        (
            pynvml.NVML_GPU_RECOVERY_ACTION_NONE,
            pynvml.NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN,
            pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P,
            pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET,
            pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET,
            pynvml.NVML_GPU_RECOVERY_ACTION_BUS_RESET,
            pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT,
            pynvml.NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT,
        )
    )
}


# Handle address layout: kind | gpu index | GPU instance id | compute instance id.
_KIND_DEVICE, _KIND_GPU_INSTANCE, _KIND_COMPUTE_INSTANCE, _KIND_MIG_DEVICE = 1, 2, 3, 4
_MAX_MIG_DEVICES = 7
_ENGINE_PROFILE_SHARED = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
_KIND_EVENT_SET = 5  # event-set handles: kind | a process-wide counter
_EVENT_SET_IDS = itertools.count(1)
_EVENT_POLL_SECONDS = 0.05  # what a process sees within; each poll is two stat() calls


def _fail(code: int) -> NoReturn:
    raise pynvml.NVMLError(code)


def _encode(kind: int, gpu: int, gi: int = 0, ci: int = 0) -> int:
    return (kind << 40) | (gpu << 24) | (gi << 12) | ci


def _decode(handle: Any) -> tuple[int, int, int, int]:
    try:
        addr = ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    if not addr:
        _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return handle_ids(addr)


def handle_ids(address: int) -> tuple[int, int, int, int]:
    """(kind, GPU index, GPU-instance id, compute-instance id) a handle's address encodes (`KIND_*`; zeros where the
    kind has none): for code that checks handles without calling the simulator (the library server's container
    view)."""
    return address >> 40, (address >> 24) & 0xFFFF, (address >> 12) & 0xFFF, address & 0xFFF


KIND_DEVICE, KIND_GPU_INSTANCE, KIND_COMPUTE_INSTANCE, KIND_MIG_DEVICE, KIND_EVENT_SET = (
    _KIND_DEVICE,
    _KIND_GPU_INSTANCE,
    _KIND_COMPUTE_INSTANCE,
    _KIND_MIG_DEVICE,
    _KIND_EVENT_SET,
)


def _pointer(pointer_type: Any, address: int) -> Any:
    return ctypes.cast(ctypes.c_void_p(address), pointer_type)


def _deref(ref: Any) -> Any:
    """The object behind `ctypes.byref(x)`, or `x` itself when passed directly."""
    return getattr(ref, "_obj", ref)


def _fill(handles: list[Any], array_ref: Any, count_ref: Any) -> int:
    """NVML's array-out convention: a NULL array asks for the count; too small an array is INSUFFICIENT_SIZE."""
    count = _deref(count_ref)
    if array_ref is None or count.value < len(handles):
        count.value = len(handles)
        if array_ref is not None:
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        return int(pynvml.NVML_SUCCESS)
    array = _deref(array_ref)
    for i, h in enumerate(handles):
        array[i] = h
    count.value = len(handles)
    return int(pynvml.NVML_SUCCESS)


def _mig_memory_mib(prod: ProductSpec, gi: GpuInstanceState) -> int:
    # The usable memory of a MIG device depends on its placement (guide: A100-40GB 3g.20gb shows 20096MiB at 0:4
    # and 20224MiB at 4:4), so it differs from the profile's memorySizeMB.
    return mig_rules.profile_by_id(prod, gi.profile_id).memory_mib + (128 if gi.start else 0)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _parse_bus_id(text: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) of a PCI bus id in one of nvml.h's formats, None if it is none of them."""
    try:
        parts = text.strip().split(":")
        if len(parts) == 3:
            domain, bus, rest = parts
        elif len(parts) == 2:
            domain, (bus, rest) = "0", parts
            if "." not in rest:
                return None
        else:
            return None
        device, _, function = rest.partition(".")
        return int(domain, 16), int(bus, 16), int(device, 16), int(function or "0", 16)
    except ValueError:
        return None


class SimulatedNvml:
    """One simulated machine. Its state lives in `state_dir` and is shared by every process using it."""

    def __init__(self, machine_spec: MachineSpec | str, state_dir: Path | str) -> None:
        self.spec = machine(machine_spec) if isinstance(machine_spec, str) else machine_spec
        self.state_dir = Path(state_dir)
        self.products: list[ProductSpec] = [product(g.product) for g in self.spec.gpus]
        self.minors = [i if g.minor is None else g.minor for i, g in enumerate(self.spec.gpus)]
        self.proc_root = self.state_dir / "proc"
        self.gpu_uuids = [
            "GPU-" + str(uuid.uuid5(_UUID_NAMESPACE, f"{self.spec.name}/{i}/{g.pci_bus_id}"))
            for i, g in enumerate(self.spec.gpus)
        ]
        self.store = StateStore(self.state_dir, self.spec, on_commit=self._sync_kernel_files)
        write_conf(self.state_dir, self.spec)  # the simulated libnvidia-ml of the driver root finds its server by it
        self.sysfs_root = write_fake_sysfs(self.state_dir / "sys", self.spec.gpus, self.spec.numa)
        ensure_driver_root(self.driver_root, self.spec.driver_version, smi_table=None)  # nvidia-smi: at commits
        self._init_count = 0

    @property
    def driver_root(self) -> Path:
        """The driver's user-space files (libraries, binaries, firmware), as a host has them under `/`."""
        return self.state_dir / "driver-root"

    def _sync_kernel_files(self, state: MachineState) -> None:
        write_fake_procfs(self.proc_root, state, self.minors)
        write_nvidia_smi(self.driver_root, self._smi_table(state))

    def _smi_table(self, state: MachineState) -> str:
        """What nvidia-smi in a container learns from the kernel: the devices and their device nodes' minors (the
        table data/nvidia-smi-view.sh reads), GPUs by PCI bus id as nvidia-smi numbers them."""
        cuda = self.spec.cuda_driver_version
        lines = [f"driver|{self.spec.driver_version}|{cuda // 1000}.{cuda % 1000 // 10}"]
        for index in sorted(range(len(state.gpus)), key=lambda i: self.spec.gpus[i].pci_bus_id):
            gpu, prod, minor = state.gpus[index], self.products[index], self.minors[index]
            mig = "Enabled" if gpu.mig_current else "Disabled"
            bus = self.spec.gpus[index].pci_bus_id
            lines.append(f"gpu|{minor}|{bus}|{self.gpu_uuids[index]}|{prod.memory_mib}|{mig}|{prod.name}")
            for gi_id, ci_id in self._mig_devices(gpu):
                gi = self._find_gi(gpu, gi_id)
                ci = next(c for c in gi.compute_instances if c.id == ci_id)
                caps = f"{gi_cap_minor(minor, gi_id)}|{ci_cap_minor(minor, gi_id, ci_id)}"
                profile = mig_rules.profile_by_id(prod, gi.profile_id).name
                lines.append(f"mig|{caps}|{gi_id}|{ci_id}|{_mig_memory_mib(prod, gi)}|{ci.uuid}|{profile}")
        return "".join(line + "\n" for line in lines)

    # ----- plumbing -------------------------------------------------------------------------------------
    def _require_init(self) -> MachineState:
        if self._init_count <= 0:
            _fail(pynvml.NVML_ERROR_UNINITIALIZED)
        return self.store.read()

    def _gpu(self, handle: Any, *, allow_mig: bool = False) -> tuple[int, GpuState, ProductSpec]:
        state = self._require_init()
        kind, index, _, _ = _decode(handle)
        if kind != _KIND_DEVICE and not (allow_mig and kind == _KIND_MIG_DEVICE):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(state.gpus):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = state.gpus[index]
        if gpu.lost:
            _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
        return index, gpu, self.products[index]

    def _mig_gpu(self, handle: Any) -> tuple[int, GpuState, ProductSpec]:
        index, gpu, prod = self._gpu(handle)
        if not prod.mig_capable:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return index, gpu, prod

    @staticmethod
    def _find_gi(gpu: GpuState, gi_id: int) -> GpuInstanceState:
        for gi in gpu.gpu_instances:
            if gi.id == gi_id:
                return gi
        _fail(pynvml.NVML_ERROR_NOT_FOUND)

    def _gi(self, handle: Any) -> tuple[int, GpuState, ProductSpec, GpuInstanceState]:
        kind, index, gi_id, _ = _decode(handle)
        if kind != _KIND_GPU_INSTANCE:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _, gpu, prod = self._gpu(self._device_handle(index))
        for gi in gpu.gpu_instances:
            if gi.id == gi_id:
                return index, gpu, prod, gi
        _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # stale handle: the instance was destroyed

    def _ci(self, handle: Any) -> tuple[int, GpuState, ProductSpec, GpuInstanceState, ComputeInstanceState]:
        kind, index, gi_id, ci_id = _decode(handle)
        if kind not in (_KIND_COMPUTE_INSTANCE, _KIND_MIG_DEVICE):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        _, gpu, prod, gi = self._gi(self._gi_handle(index, gi_id))
        for ci in gi.compute_instances:
            if ci.id == ci_id:
                return index, gpu, prod, gi, ci
        _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    @contextmanager
    def _mutate(self, index: int) -> Iterator[GpuState]:
        with self.store.mutate() as state:
            gpu = state.gpus[index]
            if gpu.lost:
                _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
            try:
                yield gpu
            except MigRuleError as e:
                raise pynvml.NVMLError(e.code) from e

    @staticmethod
    def _device_handle(index: int) -> Any:
        return _pointer(pynvml.c_nvmlDevice_t, _encode(_KIND_DEVICE, index))

    @staticmethod
    def _gi_handle(index: int, gi_id: int) -> Any:
        return _pointer(pynvml.c_nvmlGpuInstance_t, _encode(_KIND_GPU_INSTANCE, index, gi_id))

    @staticmethod
    def _ci_handle(index: int, gi_id: int, ci_id: int) -> Any:
        return _pointer(pynvml.c_nvmlComputeInstance_t, _encode(_KIND_COMPUTE_INSTANCE, index, gi_id, ci_id))

    @staticmethod
    def _mig_handle(index: int, gi_id: int, ci_id: int) -> Any:
        return _pointer(pynvml.c_nvmlDevice_t, _encode(_KIND_MIG_DEVICE, index, gi_id, ci_id))

    # ----- init and system ------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._init_count += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        if self._init_count <= 0:
            _fail(pynvml.NVML_ERROR_UNINITIALIZED)
        self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._require_init()
        return self.spec.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._require_init()
        return self.spec.cuda_driver_version

    nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._require_init()
        return f"{self.spec.cuda_driver_version // 1000}.{self.spec.driver_version}"

    # ----- devices --------------------------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        return len(self._require_init().gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < len(self._require_init().gpus):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._device_handle(index)

    def nvmlDeviceGetHandleByUUID(self, device_uuid: str | bytes) -> Any:
        state = self._require_init()
        wanted = _text(device_uuid)
        if wanted in self.gpu_uuids:
            return self._device_handle(self.gpu_uuids.index(wanted))
        for index, gpu in enumerate(state.gpus):
            for gi in gpu.gpu_instances:
                for ci in gi.compute_instances:
                    if ci.uuid == wanted:
                        return self._mig_handle(index, gi.id, ci.id)
        _fail(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByUUIDV(self, value: str | bytes, uuid_type: int) -> Any:
        """pynvml's form of nvml.h's nvmlUUID_t: the UUID as text (NVML_UUID_TYPE_ASCII) or its 16 bytes
        (NVML_UUID_TYPE_BINARY, which does not say whether it names a GPU or a MIG device)."""
        if uuid_type == pynvml.NVML_UUID_TYPE_ASCII:
            return self.nvmlDeviceGetHandleByUUID(value)
        raw = value.encode() if isinstance(value, str) else bytes(value)
        if uuid_type != pynvml.NVML_UUID_TYPE_BINARY or len(raw) != pynvml.NVML_DEVICE_UUID_BINARY_LEN:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        text = str(uuid.UUID(bytes=raw))
        try:
            return self.nvmlDeviceGetHandleByUUID(f"GPU-{text}")
        except pynvml.NVMLError_NotFound:
            return self.nvmlDeviceGetHandleByUUID(f"MIG-{text}")

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str | bytes) -> Any:
        """nvml.h's formats: domain:bus:device.function, domain:bus:device, bus:device.function (hex)."""
        state = self._require_init()
        wanted = _parse_bus_id(_text(bus_id))
        if wanted is None:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for index, gpu in enumerate(self.spec.gpus):
            if _parse_bus_id(gpu.pci_bus_id) == wanted:
                if state.gpus[index].lost:
                    _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
                return self._device_handle(index)
        _fail(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._gpu(handle)[0]

    def nvmlDeviceGetName(self, handle: Any) -> str:
        kind = _decode(handle)[0]
        if kind == _KIND_MIG_DEVICE:
            _, _, prod, gi, _ = self._ci(handle)
            return f"{prod.name} MIG {mig_rules.profile_by_id(prod, gi.profile_id).name}"
        return self._gpu(handle)[2].name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if _decode(handle)[0] == _KIND_MIG_DEVICE:
            return self._ci(handle)[4].uuid
        return self.gpu_uuids[self._gpu(handle)[0]]

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self.minors[self._gpu(handle)[0]]

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        index, _, prod = self._gpu(handle)
        bus_id = self.spec.gpus[index].pci_bus_id
        domain, bus, rest = bus_id.split(":")
        dev = rest.split(".")[0]
        info = pynvml.nvmlPciInfo_t()
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(dev, 16)
        # nvml.h: NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT "%04X:%02X:%02X.0", NVML_DEVICE_PCI_BUS_ID_FMT "%08X:%02X:%02X.0"
        info.busIdLegacy = f"{info.domain:04X}:{info.bus:02X}:{info.device:02X}.0".encode()
        info.busId = bus_id.encode()
        info.pciDeviceId = prod.pci_device_id
        info.pciSubSystemId = 0x165710DE
        return info

    nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        if _decode(handle)[0] == _KIND_MIG_DEVICE:
            _, _, prod, gi, _ = self._ci(handle)
            mib = _mig_memory_mib(prod, gi)
        else:
            mib = self._gpu(handle)[2].memory_mib
        total = mib << 20
        used = self._workload_memory(handle, total)
        if version:  # nvmlDeviceGetMemoryInfo_v2: no memory is reserved for the system here
            if version != pynvml.nvmlMemory_v2:
                _fail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
            mem2 = pynvml.c_nvmlMemory_v2_t()
            mem2.version, mem2.total, mem2.reserved, mem2.free, mem2.used = version, total, 0, total - used, used
            return mem2
        mem = pynvml.c_nvmlMemory_t()
        mem.total, mem.free, mem.used = total, total - used, used
        return mem

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._gpu(handle, allow_mig=True)[2].cuda_compute_capability

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        return ARCHITECTURE_ENUM[self._gpu(handle, allow_mig=True)[2].architecture]

    def nvmlDeviceGetBrand(self, handle: Any) -> int:
        return BRAND_ENUM[self._gpu(handle, allow_mig=True)[2].brand]

    def nvmlDeviceGetVirtualizationMode(self, handle: Any) -> int:
        self._gpu(handle)
        return int(pynvml.NVML_GPU_VIRTUALIZATION_MODE_NONE)

    # ----- MIG mode -------------------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        _, gpu, _ = self._mig_gpu(handle)
        return [gpu.mig_current, gpu.mig_pending]

    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        """Returns the activation status, as pynvml does; the call itself succeeds."""
        index, _, prod = self._mig_gpu(handle)
        if mode not in (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._mutate(index) as gpu:
            if mode == pynvml.NVML_DEVICE_MIG_DISABLE and gpu.gpu_instances:
                return int(pynvml.NVML_ERROR_IN_USE)
            gpu.mig_pending = mode
            if prod.mig_toggle_needs_reset and gpu.mig_current != mode:
                return int(pynvml.NVML_ERROR_RESET_REQUIRED)  # Ampere: pending until the GPU is reset
            gpu.mig_current = mode
            return int(pynvml.NVML_SUCCESS)

    def reset_gpu(self, index: int) -> None:
        """`nvidia-smi -r`: a pending MIG mode becomes current; MIG instances do not survive; the recovery action is
        none again (and says so with an event). Nothing checks for processes here: `busy` is nvidia-smi's check."""
        with self._mutate(index) as gpu:
            gpu.mig_current = gpu.mig_pending
            gpu.gpu_instances = []
            was, gpu.recovery_action = gpu.recovery_action, pynvml.NVML_GPU_RECOVERY_ACTION_NONE
            gpu.processes = []
        if was != pynvml.NVML_GPU_RECOVERY_ACTION_NONE and self.recovery_supported:
            self.events.append(index, pynvml.nvmlEventTypeGpuRecoveryAction, 0, GPU_LEVEL, GPU_LEVEL)

    # ----- the simulated nvidia-persistenced (a container's way to the machine) ---------------------------
    def start_persistenced(self) -> None:
        """Start the machine's simulated nvidia-persistenced, as a node starts it at boot: the simulated
        libnvidia-ml in a container whose CDI spec came from this machine's driver root reaches the machine through
        its socket (dra_driver.simulator.libnvml.persistenced). It runs until the state directory is gone or
        `stop_persistenced`."""
        from dra_driver.simulator.libnvml import persistenced

        persistenced.start(self.state_dir)

    def stop_persistenced(self) -> None:
        from dra_driver.simulator.libnvml import persistenced

        persistenced.stop(self.state_dir)

    # ----- the NVLink fabric (NVL72 racks) ---------------------------------------------------------------
    def place_in_fabric(self, cluster_uuid: str, clique_id: int) -> None:
        """Where this machine's GPUs sit in their NVLink fabric: the rack's cluster and the clique inside it (as the
        fabric manager of the rack assigns them). Only machines with `nvlink_fabric` have one."""
        if not self.spec.nvlink_fabric:
            raise ValueError(f"{self.spec.name} has no NVLink fabric")
        with self.store.mutate() as state:
            state.fabric = FabricState(cluster_uuid=str(uuid.UUID(cluster_uuid)), clique_id=clique_id)

    def _fabric(self) -> FabricState:
        """The machine's placement; unplaced, a rack of its own (a cluster named after its state directory)."""
        placed = self._require_init().fabric
        if placed is not None:
            return placed
        return FabricState(cluster_uuid=str(uuid.uuid5(_UUID_NAMESPACE, f"fabric:{self.state_dir}")), clique_id=1)

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info: Any) -> int:
        """The GPU's cluster UUID and clique, fabric registration COMPLETED; NOT_SUPPORTED off an NVLink fabric."""
        self._gpu(handle)
        if not self.spec.nvlink_fabric:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        target = _deref(info)
        fabric = self._fabric()
        target.clusterUuid = (ctypes.c_ubyte * 16)(*uuid.UUID(fabric.cluster_uuid).bytes)
        target.status = pynvml.NVML_SUCCESS
        target.cliqueId = fabric.clique_id
        target.state = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        if hasattr(target, "healthMask"):
            target.healthMask = 0
        return int(pynvml.NVML_SUCCESS)

    nvmlDeviceGetGpuFabricInfoV = nvmlDeviceGetGpuFabricInfo

    # ----- processes holding a GPU, and its recovery action ---------------------------------------------
    def attach_process(self, index: int, pid: int) -> None:
        """Process `pid` now holds GPU `index` (it created a CUDA context there), until it exits."""
        start = process_start_time(pid)
        if start is None:
            raise ProcessLookupError(pid)
        with self._mutate(index) as gpu:
            gpu.processes = [p for p in gpu.processes if p.pid != pid] + [GpuProcess(pid=pid, start_time=start)]

    def busy(self, index: int) -> list[int]:
        """The live processes holding GPU `index` (an exited one, or one whose pid was reused, holds nothing)."""
        gpu = self.store.read().gpus[index]
        return [p.pid for p in gpu.processes if process_start_time(p.pid) == p.start_time]

    def _processes(self, handle: Any) -> list[int]:
        if _decode(handle)[0] == _KIND_MIG_DEVICE:
            self._ci(handle)
            return []  # processes are recorded per GPU (attach_process), none per MIG device
        return self.busy(self._gpu(handle)[0])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        """pynvml's objects for the live processes holding the GPU (`attach_process`): pid, no memory figure (None,
        NVML_VALUE_NOT_AVAILABLE in C), no GPU or compute instance (0xFFFFFFFF, a whole GPU)."""
        return [
            pynvml.nvmlFriendlyObject(
                {"pid": pid, "usedGpuMemory": None, "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF}
            )
            for pid in self._processes(handle)
        ]

    nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses
    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        """None: a data-center GPU runs no graphics; MPS clients are not tracked here either."""
        self._processes(handle)
        return []

    nvmlDeviceGetGraphicsRunningProcesses_v2 = nvmlDeviceGetGraphicsRunningProcesses
    nvmlDeviceGetGraphicsRunningProcesses_v3 = nvmlDeviceGetGraphicsRunningProcesses
    nvmlDeviceGetMPSComputeRunningProcesses = nvmlDeviceGetGraphicsRunningProcesses
    nvmlDeviceGetMPSComputeRunningProcesses_v2 = nvmlDeviceGetGraphicsRunningProcesses
    nvmlDeviceGetMPSComputeRunningProcesses_v3 = nvmlDeviceGetGraphicsRunningProcesses

    @cached_property
    def recovery_supported(self) -> bool:
        """Whether this machine's driver reports GPU recovery actions (R565 and later)."""
        return recovery_catalog().supported(self.spec.driver_version)

    def _raise_recovery_action(self, index: int, xid: int) -> None:
        """What the GPU asks for after `xid`: the most severe action outstanding, announced when it changes."""
        action = recovery_catalog().action(xid, self.products[index].architecture)
        if not self.recovery_supported or action is None:
            return
        with self.store.mutate() as state:
            gpu = state.gpus[index]
            before = gpu.recovery_action
            gpu.recovery_action = max(before, action, key=_RECOVERY_SEVERITY.__getitem__)
        if gpu.recovery_action != before:
            self.events.append(index, pynvml.nvmlEventTypeGpuRecoveryAction, gpu.recovery_action, GPU_LEVEL, GPU_LEVEL)

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> Any:
        """Each value with its own return code, as NVML answers: the GPU recovery action from an R565 driver on,
        NOT_SUPPORTED for every field this simulator does not model."""
        _, gpu, _ = self._gpu(handle)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        now_us = int(time.time() * 1_000_000)
        for value, field_id in zip(values, field_ids, strict=True):
            value.fieldId, value.scopeId = field_id if isinstance(field_id, tuple) else (field_id, 0)
            value.timestamp = now_us
            if value.fieldId == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and self.recovery_supported:
                value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = gpu.recovery_action
                value.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def set_gpu_lost(self, index: int, lost: bool = True) -> None:
        """The GPU falls off the bus (every call on it then fails with GPU_IS_LOST) or comes back."""
        with self.store.mutate() as state:
            state.gpus[index].lost = lost

    # ----- GPU instance profiles and placements -----------------------------------------------------------
    def _profile_by_enum(self, prod: ProductSpec, enum: int) -> GpuInstanceProfileSpec:
        if not 0 <= enum < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for p in prod.mig_profiles:
            if p.enum_value == enum:
                return p
        _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _profile_by_id(self, prod: ProductSpec, profile_id: int) -> GpuInstanceProfileSpec:
        try:
            return mig_rules.profile_by_id(prod, profile_id)
        except MigRuleError as e:
            raise pynvml.NVMLError(e.code) from e

    @staticmethod
    def _profile_info(p: GpuInstanceProfileSpec, version: int) -> Any:
        """Version 1 and 2 as pynvml has them; 3 (dra_driver.simulator.structs) as nvml.h: capabilities instead of
        isP2pSupported (P2P is not supported on any profile modelled here, GFX only on +gfx profiles)."""
        info: Any
        if version == 3:
            info = c_nvmlGpuInstanceProfileInfo_v3_t()
            info.version = nvmlGpuInstanceProfileInfo_v3
            info.capabilities = pynvml.NVML_GPU_INSTANCE_PROFILE_CAPS_GFX if p.enum.endswith("_GFX") else 0
        elif version == 2:
            info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
            info.isP2pSupported = 0
        else:
            info = pynvml.c_nvmlGpuInstanceProfileInfo_t()
            info.isP2pSupported = 0
        info.id, info.sliceCount, info.instanceCount = p.id, p.compute_slices, p.instance_count
        info.multiprocessorCount, info.copyEngineCount = p.multiprocessors, p.copy_engines
        info.decoderCount, info.encoderCount = p.decoders, p.encoders
        info.jpegCount, info.ofaCount, info.memorySizeMB = p.jpeg_engines, p.ofa_engines, p.memory_mib
        if version >= 2:
            info.name = f"MIG {p.name}".encode()
        return info

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int, version: int = 2) -> Any:
        if version not in (1, 2, 3):
            _fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        _, _, prod = self._mig_gpu(handle)
        return self._profile_info(self._profile_by_enum(prod, profile), version)

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo

    def nvmlDeviceGetGpuInstanceProfileInfoById(self, handle: Any, profile_id: int, version: int = 2) -> Any:
        if version not in (2, 3):
            _fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        _, _, prod = self._mig_gpu(handle)
        return self._profile_info(self._profile_by_id(prod, profile_id), version)

    nvmlDeviceGetGpuInstanceProfileInfoByIdV = nvmlDeviceGetGpuInstanceProfileInfoById

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: Any, profile_id: int, placements_ref: Any, count_ref: Any
    ) -> int:
        # nvml.h: works whether or not MIG is enabled.
        _, _, prod = self._mig_gpu(handle)
        p = self._profile_by_id(prod, profile_id)
        count = _deref(count_ref)
        if placements_ref is None:
            count.value = len(p.placements)
            return int(pynvml.NVML_SUCCESS)
        if count.value < len(p.placements):
            count.value = len(p.placements)
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        array = _deref(placements_ref)
        for i, start in enumerate(p.placements):
            array[i].start, array[i].size = start, p.memory_slices
        count.value = len(p.placements)
        return int(pynvml.NVML_SUCCESS)

    def _mig_enabled_gpu(self, handle: Any) -> tuple[int, GpuState, ProductSpec]:
        index, gpu, prod = self._mig_gpu(handle)
        if not gpu.mig_current:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return index, gpu, prod

    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, handle: Any, profile_id: int) -> int:
        _, gpu, prod = self._mig_enabled_gpu(handle)
        return mig_rules.remaining_capacity(prod, gpu, self._profile_by_id(prod, profile_id))

    # ----- GPU instances --------------------------------------------------------------------------------
    def _create_gi(self, handle: Any, profile_id: int, start: int | None) -> Any:
        index, _, prod = self._mig_enabled_gpu(handle)
        p = self._profile_by_id(prod, profile_id)
        with self._mutate(index) as gpu:
            if start is None:
                start = mig_rules.default_placement(prod, gpu, p)
            mig_rules.check_gpu_instance(prod, gpu, p, start)
            gi_id = mig_rules.allocate_gpu_instance_id(gpu, p.memory_slices)
            gpu.gpu_instances.append(GpuInstanceState(id=gi_id, profile_id=p.id, start=start, size=p.memory_slices))
        return self._gi_handle(index, gi_id)

    def nvmlDeviceCreateGpuInstance(self, handle: Any, profile_id: int) -> Any:
        return self._create_gi(handle, profile_id, None)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profile_id: int, placement: Any) -> Any:
        p = _deref(placement)
        _, _, prod = self._mig_gpu(handle)
        if p.size != self._profile_by_id(prod, profile_id).memory_slices:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._create_gi(handle, profile_id, int(p.start))

    def nvmlDeviceGetGpuInstances(self, handle: Any, profile_id: int, instances_ref: Any, count_ref: Any) -> int:
        index, gpu, prod = self._mig_enabled_gpu(handle)
        p = self._profile_by_id(prod, profile_id)
        found = sorted((gi for gi in gpu.gpu_instances if gi.profile_id == p.id), key=lambda gi: gi.id)
        return _fill([self._gi_handle(index, gi.id) for gi in found], instances_ref, count_ref)

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gpu_instance_id: int) -> Any:
        index, gpu, _ = self._mig_enabled_gpu(handle)
        return self._gi_handle(index, self._find_gi(gpu, gpu_instance_id).id)

    def nvmlGpuInstanceGetInfo(self, gpu_instance: Any) -> Any:
        index, _, _, gi = self._gi(gpu_instance)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = self._device_handle(index)
        info.id, info.profileId = gi.id, gi.profile_id
        info.placement.start, info.placement.size = gi.start, gi.size
        return info

    def nvmlGpuInstanceDestroy(self, gpu_instance: Any) -> int:
        index, _, _, gi = self._gi(gpu_instance)
        with self._mutate(index) as gpu:
            live = self._find_gi(gpu, gi.id)
            if live.compute_instances:
                _fail(pynvml.NVML_ERROR_IN_USE)  # nvml.h: destroy the compute instances first
            gpu.gpu_instances.remove(live)
        return int(pynvml.NVML_SUCCESS)

    # ----- compute instances ----------------------------------------------------------------------------
    def _ci_slices(self, gi_slices: int, profile: int) -> int:
        for slices, enum in COMPUTE_INSTANCE_ENUM_BY_SLICES.items():
            if enum == profile:
                if slices not in mig_rules.CI_SLICES_FOR_GI.get(gi_slices, []):
                    _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
                return slices
        if 0 <= profile < pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # _REV1 / _NVL variants are not offered here
        _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpu_instance: Any, profile: int, eng_profile: int, version: int = 2
    ) -> Any:
        if version not in (1, 2, 3):
            _fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        _, _, prod, gi = self._gi(gpu_instance)
        if eng_profile != _ENGINE_PROFILE_SHARED:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        gp = mig_rules.profile_by_id(prod, gi.profile_id)
        c = self._ci_slices(gp.compute_slices, profile)
        info: Any
        if version == 3:  # dra_driver.simulator.structs: v2 plus capabilities (no GFX compute profile here)
            info = c_nvmlComputeInstanceProfileInfo_v3_t()
            info.version, info.capabilities = nvmlComputeInstanceProfileInfo_v3, 0
        elif version == 2:
            info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        else:
            info = pynvml.c_nvmlComputeInstanceProfileInfo_t()
        info.id, info.sliceCount, info.instanceCount = profile, c, gp.compute_slices // c
        info.multiprocessorCount = gp.multiprocessors * c // gp.compute_slices
        info.sharedCopyEngineCount, info.sharedDecoderCount = gp.copy_engines, gp.decoders
        info.sharedEncoderCount, info.sharedJpegCount, info.sharedOfaCount = (
            gp.encoders,
            gp.jpeg_engines,
            gp.ofa_engines,
        )
        if version >= 2:
            name = gp.name if c == gp.compute_slices else f"{c}c.{gp.name}"
            info.name = f"MIG {name}".encode()
        return info

    nvmlGpuInstanceGetComputeInstanceProfileInfoV = nvmlGpuInstanceGetComputeInstanceProfileInfo

    def nvmlGpuInstanceCreateComputeInstance(self, gpu_instance: Any, profile_id: int) -> Any:
        return self._create_ci(gpu_instance, profile_id, None)

    def nvmlGpuInstanceCreateComputeInstanceWithPlacement(
        self, gpu_instance: Any, profile_id: int, placement: Any
    ) -> Any:
        """`placement`: a c_nvmlComputeInstancePlacement_t or ctypes.byref of one (its C parameter is a pointer)."""
        p = _deref(placement)
        _, _, prod, gi = self._gi(gpu_instance)
        c = self._ci_slices(mig_rules.profile_by_id(prod, gi.profile_id).compute_slices, profile_id)
        if p.size != c:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._create_ci(gpu_instance, profile_id, int(p.start))

    def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(self, gpu_instance: Any, profile_id: int) -> int:
        _, _, prod, gi = self._gi(gpu_instance)
        gi_slices = mig_rules.profile_by_id(prod, gi.profile_id).compute_slices
        c = self._ci_slices(gi_slices, profile_id)
        free = 0
        for start in mig_rules.compute_instance_placements(gi_slices, c):  # equal aligned blocks: none overlap
            try:
                mig_rules.check_compute_instance(gi, gi_slices, c, start)
            except MigRuleError:
                continue
            free += 1
        return free

    def nvmlGpuInstanceGetComputeInstancePossiblePlacements(
        self, gpu_instance: Any, profile_id: int, placements_ref: Any, count_ref: Any
    ) -> int:
        """Every placement of the profile in this GPU instance, occupied or not, as for GPU instances."""
        _, _, prod, gi = self._gi(gpu_instance)
        gi_slices = mig_rules.profile_by_id(prod, gi.profile_id).compute_slices
        c = self._ci_slices(gi_slices, profile_id)
        starts = mig_rules.compute_instance_placements(gi_slices, c)
        count = _deref(count_ref)
        if placements_ref is None:
            count.value = len(starts)
            return int(pynvml.NVML_SUCCESS)
        if count.value < len(starts):
            count.value = len(starts)
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        array = _deref(placements_ref)
        for i, start in enumerate(starts):
            array[i].start, array[i].size = start, c
        count.value = len(starts)
        return int(pynvml.NVML_SUCCESS)

    def _create_ci(self, gpu_instance: Any, profile_id: int, start: int | None) -> Any:
        index, _, prod, gi = self._gi(gpu_instance)
        gi_slices = mig_rules.profile_by_id(prod, gi.profile_id).compute_slices
        c = self._ci_slices(gi_slices, profile_id)
        with self._mutate(index) as gpu:
            live = self._find_gi(gpu, gi.id)
            if start is None:
                start = mig_rules.first_free_compute_placement(live, gi_slices, c)
            else:
                mig_rules.check_compute_instance(live, gi_slices, c, start)
            ci_id = mig_rules.allocate_compute_instance_id(live)
            # R470+ MIG UUIDs have the version-5 shape and change whenever the instance is re-created.
            mig_uuid = "MIG-" + str(uuid.uuid5(_UUID_NAMESPACE, uuid.uuid4().hex))
            live.compute_instances.append(
                ComputeInstanceState(id=ci_id, profile_id=profile_id, start=start, size=c, uuid=mig_uuid)
            )
        return self._ci_handle(index, gi.id, ci_id)

    def nvmlGpuInstanceGetComputeInstances(
        self, gpu_instance: Any, profile_id: int, instances_ref: Any, count_ref: Any
    ) -> int:
        index, _, prod, gi = self._gi(gpu_instance)
        self._ci_slices(mig_rules.profile_by_id(prod, gi.profile_id).compute_slices, profile_id)
        found = sorted((ci for ci in gi.compute_instances if ci.profile_id == profile_id), key=lambda ci: ci.id)
        return _fill([self._ci_handle(index, gi.id, ci.id) for ci in found], instances_ref, count_ref)

    def nvmlGpuInstanceGetComputeInstanceById(self, gpu_instance: Any, compute_instance_id: int) -> Any:
        index, _, _, gi = self._gi(gpu_instance)
        if not any(ci.id == compute_instance_id for ci in gi.compute_instances):
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return self._ci_handle(index, gi.id, compute_instance_id)

    def nvmlComputeInstanceGetInfo(self, compute_instance: Any) -> Any:
        index, _, _, gi, ci = self._ci(compute_instance)
        info = pynvml.c_nvmlComputeInstanceInfo_t()
        info.device = self._mig_handle(index, gi.id, ci.id)  # the MIG device, not the parent GPU
        info.gpuInstance = self._gi_handle(index, gi.id)
        info.id, info.profileId = ci.id, ci.profile_id
        info.placement.start, info.placement.size = ci.start, ci.size
        return info

    nvmlComputeInstanceGetInfo_v2 = nvmlComputeInstanceGetInfo

    def nvmlComputeInstanceDestroy(self, compute_instance: Any) -> int:
        index, _, _, gi, ci = self._ci(compute_instance)
        with self._mutate(index) as gpu:
            live = self._find_gi(gpu, gi.id)
            live.compute_instances = [c for c in live.compute_instances if c.id != ci.id]
        return int(pynvml.NVML_SUCCESS)

    # ----- MIG device handles ---------------------------------------------------------------------------
    def _mig_devices(self, gpu: GpuState) -> list[tuple[int, int]]:
        return sorted((gi.id, ci.id) for gi in gpu.gpu_instances for ci in gi.compute_instances)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        _, gpu, prod = self._gpu(handle)
        return _MAX_MIG_DEVICES if prod.mig_capable and gpu.mig_current else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        gpu_index, gpu, _ = self._mig_enabled_gpu(handle)
        if not 0 <= index < _MAX_MIG_DEVICES:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        devices = self._mig_devices(gpu)
        if index >= len(devices):
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return self._mig_handle(gpu_index, *devices[index])

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> Any:
        self._require_init()
        # pynvml returns the raw c_uint here, not its value.
        return ctypes.c_uint(int(_decode(handle)[0] == _KIND_MIG_DEVICE))

    def _mig_ids(self, handle: Any) -> tuple[int, int, int]:
        if _decode(handle)[0] != _KIND_MIG_DEVICE:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        index, _, _, gi, ci = self._ci(handle)
        return index, gi.id, ci.id

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return self._mig_ids(handle)[1]

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return self._mig_ids(handle)[2]

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any) -> Any:
        return self._device_handle(self._mig_ids(handle)[0])

    def nvmlDeviceGetAttributes(self, handle: Any) -> Any:
        if _decode(handle)[0] != _KIND_MIG_DEVICE:
            self._gpu(handle)
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # nvml.h: only MIG device handles
        _, _, prod, gi, ci = self._ci(handle)
        gp = mig_rules.profile_by_id(prod, gi.profile_id)
        attrs = pynvml.c_nvmlDeviceAttributes()
        attrs.multiprocessorCount = gp.multiprocessors * ci.size // gp.compute_slices
        attrs.sharedCopyEngineCount, attrs.sharedDecoderCount = gp.copy_engines, gp.decoders
        attrs.sharedEncoderCount, attrs.sharedJpegCount, attrs.sharedOfaCount = (
            gp.encoders,
            gp.jpeg_engines,
            gp.ofa_engines,
        )
        attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount = gp.compute_slices, ci.size
        attrs.memorySizeMB = gp.memory_mib
        return attrs

    nvmlDeviceGetAttributes_v2 = nvmlDeviceGetAttributes

    # ----- events (health): see dra_driver.simulator.events ----------------------------------------------
    @cached_property
    def events(self) -> EventStore:
        return EventStore(self.state_dir)

    @cached_property
    def _event_sets(self) -> dict[int, EventSetState]:
        return {}

    def _event_set(self, event_set: Any) -> EventSetState:
        self._require_init()
        try:
            addr = ctypes.cast(event_set, ctypes.c_void_p).value
        except (ctypes.ArgumentError, TypeError):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not addr or addr not in self._event_sets:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._event_sets[addr]

    def nvmlEventSetCreate(self) -> Any:
        self._require_init()
        addr = (_KIND_EVENT_SET << 40) | next(_EVENT_SET_IDS)
        self._event_sets[addr] = EventSetState(self.events.last_seq())
        return _pointer(pynvml.c_nvmlEventSet_t, addr)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        state = self._event_set(event_set)
        self._event_sets = {a: s for a, s in self._event_sets.items() if s is not state}

    @property
    def _default_events(self) -> int:
        return int(SUPPORTED_EVENT_TYPES | (pynvml.nvmlEventTypeGpuRecoveryAction if self.recovery_supported else 0))

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        index = self._gpu(handle)[0]
        return self.events.supported(index, self._default_events)

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        index = self._gpu(handle)[0]
        state = self._event_set(event_set)
        if event_types & ~self.events.supported(index, self._default_events):
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # nvml.h: some of the types are not supported
        state.masks[index] = state.masks.get(index, 0) | event_types

    def nvmlEventSetWait(self, event_set: Any, timeoutms: int) -> Any:
        """The next event of a registered GPU, or NVMLError_Timeout; once the queued events are read,
        GPU_IS_LOST while a registered GPU is lost."""
        state = self._event_set(event_set)
        deadline = time.monotonic() + timeoutms / 1000
        seen: tuple[object, object] | None = None
        while True:
            log, gpus = self.events.read(), self.store.read()  # the same objects while the files are unchanged
            event = None
            if seen is None or log is not seen[0] or gpus is not seen[1]:
                seen = (log, gpus)
                event = state.next_event(log)  # events already queued come before a loss
                if event is None and any(gpus.gpus[i].lost for i in state.masks):
                    _fail(pynvml.NVML_ERROR_GPU_IS_LOST)
            if event is not None:
                data = pynvml.c_nvmlEventData_t()
                data.device = self._device_handle(event.gpu)
                data.eventType, data.eventData = event.event_type, event.data
                data.gpuInstanceId, data.computeInstanceId = event.gi_id, event.ci_id
                return data
            left = deadline - time.monotonic()
            if left <= 0:
                _fail(pynvml.NVML_ERROR_TIMEOUT)
            time.sleep(min(left, _EVENT_POLL_SECONDS))

    nvmlEventSetWait_v2 = nvmlEventSetWait

    def inject_event(
        self, index: int, event_type: int, *, xid: int = 0, gi_id: int = GPU_LEVEL, ci_id: int = GPU_LEVEL
    ) -> int:
        """What the GPU reports: an XID (`xid` is the event data), or an ECC error; on a MIG device when
        `gi_id`/`ci_id` are set. Seen by every process using this state directory. Returns the sequence number."""
        if not 0 <= index < len(self.spec.gpus):
            raise IndexError(f"no GPU {index}")
        seq = self.events.append(index, event_type, xid, gi_id, ci_id)
        if event_type & pynvml.nvmlEventTypeXidCriticalError:
            self._raise_recovery_action(index, xid)
        return seq

    def set_supported_events(self, index: int, mask: int | None) -> None:
        """Which event types GPU `index` supports (None: the default, XID and ECC, and recovery actions from R565)."""
        self.events.set_supported(index, mask)

    # ----- end of events ---------------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Callable[..., Any]:
        # A pynvml function the simulator does not model behaves like a symbol missing from an old driver.
        if name.startswith("nvml") and hasattr(pynvml, name):

            def missing(*args: Any, **kwargs: Any) -> Any:
                _fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

            return missing
        raise AttributeError(name)

    # ===== telemetry ==================================================================================
    # Utilisation, temperature, power and ECC counters read
    # the per-GPU values of `dra_driver.simulator.telemetry` (a file next to the NVML state that tests set
    # from outside); nvmlDeviceGetMemoryInfo above serves memory for GPUs and MIG devices alike. MIG device
    # handles support none of these four, as on real GPUs.
    @property
    def telemetry(self) -> Any:
        """The `TelemetryStore` of this machine (dra_driver.simulator.telemetry)."""
        from dra_driver.simulator.telemetry import TelemetryStore

        store = self.__dict__.get("_telemetry_store")
        if store is None:
            store = self.__dict__["_telemetry_store"] = TelemetryStore(self.state_dir)
        return store

    def _telemetry_of(self, handle: Any) -> tuple[GpuState, Any]:
        if _decode(handle)[0] == _KIND_MIG_DEVICE:
            self._ci(handle)  # a stale handle is INVALID_ARGUMENT, a lost parent GPU_IS_LOST
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        index, gpu, _ = self._gpu(handle)
        return gpu, self.telemetry.get(index)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu, t = self._telemetry_of(handle)
        if gpu.mig_current:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)  # nvml.h: not supported on MIG-enabled GPUs
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = t.gpu_utilization, t.memory_utilization
        if t.workload is not None:  # a workload profile (dra_driver.simulator.workload) drives it
            util.gpu = t.workload.utilization(time.time())
            util.memory = util.gpu // 2
        return util

    def _workload_memory(self, handle: Any, total: int) -> int:
        """Bytes in use on a GPU or MIG device under its workload profile; 0 without one."""
        uuid: str | None = None
        if _decode(handle)[0] == _KIND_MIG_DEVICE:
            index, _, _, _, ci = self._ci(handle)
            uuid = ci.uuid
        else:
            index = self._gpu(handle)[0]
        workload = self.telemetry.workload(index, uuid)
        return workload.memory_used(total) if workload is not None else 0

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        _, t = self._telemetry_of(handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(t.temperature_c)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        """Milliwatts."""
        return int(self._telemetry_of(handle)[1].power_mw)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        _, t = self._telemetry_of(handle)
        if error_type not in (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if counter_type not in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        corrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        if counter_type == pynvml.NVML_VOLATILE_ECC:
            return int(t.ecc_corrected if corrected else t.ecc_uncorrected)
        return int(t.ecc_corrected_aggregate if corrected else t.ecc_uncorrected_aggregate)

    # ===== end of telemetry ===========================================================================

    # ===== the board: modes, identity, PCIe link, power limits, clocks, topology ========================
    # What a data-center GPU answers that the simulator keeps no state for: fixed by the product's data
    # (catalog.BoardSpec) and the machine's layout. Persistence mode on (nvidia-persistenced runs on such nodes),
    # no display, ECC on; a simulated GPU runs at its maximum clocks on a link trained at its maximum. MIG device
    # handles support none of these, as the telemetry above.
    def _board(self, handle: Any) -> tuple[int, ProductSpec]:
        if _decode(handle)[0] == _KIND_MIG_DEVICE:
            self._ci(handle)
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        index, _, prod = self._gpu(handle)
        return index, prod

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        self._board(handle)
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetDisplayMode(self, handle: Any) -> int:
        self._board(handle)
        return int(pynvml.NVML_FEATURE_DISABLED)

    nvmlDeviceGetDisplayActive = nvmlDeviceGetDisplayMode

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        """[current, pending]."""
        self._board(handle)
        return [int(pynvml.NVML_FEATURE_ENABLED), int(pynvml.NVML_FEATURE_ENABLED)]

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        """A 13-digit board serial number, fixed per GPU of the machine (as nvidia-smi -q prints it)."""
        index, _ = self._board(handle)
        return str(1650000000000 + uuid.UUID(self.gpu_uuids[index][4:]).int % 10**10)

    def nvmlDeviceGetBoardId(self, handle: Any) -> int:
        """The PCI bus and device-function of the GPU (nvidia-smi -q's "Board ID: 0x1b00" for 00000000:1B:00.0)."""
        index, _ = self._board(handle)
        parsed = _parse_bus_id(self.spec.gpus[index].pci_bus_id)
        assert parsed is not None
        _, bus, device, function = parsed
        return (bus << 8) | (device << 3) | function

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._board(handle)[1].board.pcie_generation

    nvmlDeviceGetGpuMaxPcieLinkGeneration = nvmlDeviceGetMaxPcieLinkGeneration
    nvmlDeviceGetCurrPcieLinkGeneration = nvmlDeviceGetMaxPcieLinkGeneration

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._board(handle)[1].board.pcie_width

    nvmlDeviceGetCurrPcieLinkWidth = nvmlDeviceGetMaxPcieLinkWidth

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        """Milliwatts, as every power limit."""
        return self._board(handle)[1].board.power_limit_w * 1000

    nvmlDeviceGetPowerManagementDefaultLimit = nvmlDeviceGetPowerManagementLimit
    nvmlDeviceGetEnforcedPowerLimit = nvmlDeviceGetPowerManagementLimit

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        """[min, max] milliwatts."""
        board = self._board(handle)[1].board
        return [board.min_power_limit_w * 1000, board.max_power_limit_w * 1000]

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        """MHz of NVML_CLOCK_GRAPHICS, _SM, _MEM or _VIDEO."""
        board = self._board(handle)[1].board
        clocks = {
            pynvml.NVML_CLOCK_GRAPHICS: board.graphics_clock_mhz,
            pynvml.NVML_CLOCK_SM: board.sm_clock_mhz,
            pynvml.NVML_CLOCK_MEM: board.memory_clock_mhz,
            pynvml.NVML_CLOCK_VIDEO: board.video_clock_mhz,
        }
        if clock_type not in clocks:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return clocks[clock_type]

    nvmlDeviceGetClockInfo = nvmlDeviceGetMaxClockInfo

    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        """NOT_SUPPORTED: nvml.h's NUMA node of a GPU that is a NUMA node itself (coherent GPU memory), which no
        simulated machine models; the NUMA node near a GPU is its PCI function's sysfs numa_node."""
        self._board(handle)
        _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        """The closest PCIe ancestor of two GPUs from the machine's layout: the GPU itself, the switch of a shared
        PCIe root (the data pairs GPUs behind one switch there: PXB), their NUMA node's host bridges, or the system
        (across sockets)."""
        first, _ = self._board(device1)
        second, _ = self._board(device2)
        a, b = self.spec.gpus[first], self.spec.gpus[second]
        if first == second:
            return int(pynvml.NVML_TOPOLOGY_INTERNAL)
        if a.pcie_root == b.pcie_root:
            return int(pynvml.NVML_TOPOLOGY_MULTIPLE)
        if a.numa_node == b.numa_node:
            return int(pynvml.NVML_TOPOLOGY_NODE)
        return int(pynvml.NVML_TOPOLOGY_SYSTEM)

    # ===== end of the board ===========================================================================

    # ===== compute mode (sharing) =====================================================================
    # Kept with the simulated driver tools' time slices and MPS daemons (dra_driver.simulator.tools.state), so
    # that `nvidia-smi -c`, NVML and every process see one value. A MIG device runs under its GPU's mode and
    # cannot be given one of its own.
    def _compute_mode_state(self) -> Any:
        from dra_driver.simulator.tools.state import SharingState

        return SharingState(self.state_dir)

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        index = self._ci(handle)[0] if _decode(handle)[0] == _KIND_MIG_DEVICE else self._gpu(handle)[0]
        return int(self._compute_mode_state().compute_mode(self.gpu_uuids[index]))

    def nvmlDeviceSetComputeMode(self, handle: Any, mode: int) -> None:
        if _decode(handle)[0] == _KIND_MIG_DEVICE:
            self._ci(handle)
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        index = self._gpu(handle)[0]
        modes = (pynvml.NVML_COMPUTEMODE_DEFAULT, pynvml.NVML_COMPUTEMODE_PROHIBITED)
        if mode not in (*modes, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS):  # EXCLUSIVE_THREAD is long gone
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._compute_mode_state().set_compute_mode(self.gpu_uuids[index], int(mode))

    # ===== end of compute mode (sharing) ==============================================================
