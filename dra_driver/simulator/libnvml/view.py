"""What the simulated libnvidia-ml answers in a container: NVML there sees only the GPUs and MIG devices whose device
nodes the container has (docs/simulated-libnvml.md, "In a container").

The server learns them from the kernel, never from the caller's word: a container's connection reaches the server
handed over by the machine's simulated nvidia-persistenced, and the server reads the character devices
`/dev/nvidia<N>` and `/dev/nvidia-caps/nvidia-cap<N>` in the mount namespace of the process that connected
(`/proc/<pid>/root/dev`, the pid from the connection's peer credentials: `of_process`). Where the server cannot see
that process (another pid namespace: a server started in a pod), the library's first request carries its nodes as
open descriptors, and the server takes the device numbers of those (`of_nodes`): a process can only pass nodes it
can open. Either way a node counts by its device number (major and minor), not its name. The server answers every
later call on that connection through this view of the one machine state:

- GPUs: those whose `/dev/nvidia<minor>` is there, numbered from 0 in the machine's order (`nvmlDeviceGetCount`,
  `…GetHandleByIndex`, `…GetIndex`); a GPU that is not is `NVML_ERROR_NOT_FOUND` by UUID or PCI bus id, and a
  handle of it (or of an instance on it) `NVML_ERROR_INVALID_ARGUMENT`.
- MIG: a GPU instance is seen with the capability node of its `access` file
  (`/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access`), a compute instance and its MIG device with
  that one and its own (`…/gi<G>/ci<C>/access`), every instance with the `mig/monitor` capability (minor 2).
  Creating or destroying instances needs the `mig/config` capability (minor 1), MIG and compute modes the host:
  `NVML_ERROR_NO_PERMISSION`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pynvml

from dra_driver.simulator.libnvml.wire import Arg, ArrayOut, Out
from dra_driver.simulator.nvml import (
    KIND_COMPUTE_INSTANCE,
    KIND_DEVICE,
    KIND_GPU_INSTANCE,
    KIND_MIG_DEVICE,
    SimulatedNvml,
    handle_ids,
)
from dra_driver.simulator.procfs import CAPS_MAJOR, NVIDIA_MAJOR, ci_cap_minor, gi_cap_minor

CONFIG_CAP, MONITOR_CAP = 1, 2  # /proc/driver/nvidia/capabilities/mig/{config,monitor}
_INSTANCES = 64  # more GPU or compute instances than a GPU has
_GPU_MINORS = range(254)  # 254 and 255 are nvidia-modeset and nvidiactl
_GPU_NODE, _CAP_NODE = re.compile(r"nvidia\d+"), re.compile(r"nvidia-cap\d+")
MAX_NODES = 16384  # entries read of a /dev (a privileged container's may be the host's): a crafted one is cut short


def _fail(code: int) -> None:
    raise pynvml.NVMLError(code)


def _char_devices(directory: str, name: re.Pattern[str]) -> list[int]:
    """The device numbers of the character devices in `directory` whose name matches (not followed: a symbolic
    link in a container's /dev would be resolved in the server's root)."""
    found = []
    try:
        with os.scandir(directory) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_NODES:
                    break
                if name.fullmatch(entry.name):
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISCHR(st.st_mode):
                        found.append(st.st_rdev)
    except (FileNotFoundError, NotADirectoryError):
        pass
    return found


@dataclass(frozen=True)
class ContainerView:
    gpu_minors: frozenset[int]
    cap_minors: frozenset[int]

    def sorted(self) -> tuple[list[int], list[int]]:
        return sorted(self.gpu_minors), sorted(self.cap_minors)

    @classmethod
    def of_devices(cls, devices: Iterable[int]) -> ContainerView:
        """The view that device numbers give: the NVIDIA driver's GPU minors, the nvidia-caps capability minors."""
        gpus, caps = set(), set()
        for rdev in devices:
            if os.major(rdev) == NVIDIA_MAJOR and os.minor(rdev) in _GPU_MINORS:
                gpus.add(os.minor(rdev))
            elif os.major(rdev) == CAPS_MAJOR:
                caps.add(os.minor(rdev))
        return cls(frozenset(gpus), frozenset(caps))

    @classmethod
    def of_process(cls, pid: int) -> ContainerView | None:
        """The device nodes in `pid`'s mount namespace; None when this process may not look there (then the caller
        must prove what it has: `of_nodes`)."""
        root = f"/proc/{pid}/root"
        try:
            os.stat(f"{root}/")
        except OSError:
            return None  # gone, or not ours to look into
        dev = f"{root}/dev"
        return cls.of_devices(_char_devices(dev, _GPU_NODE) + _char_devices(f"{dev}/nvidia-caps", _CAP_NODE))

    @classmethod
    def of_nodes(cls, fds: Iterable[int]) -> ContainerView:
        """The device nodes a process passed open (SCM_RIGHTS): what each one really is, whatever it was said to be."""
        devices = []
        for fd in fds:
            with contextlib.suppress(OSError):
                st = os.fstat(fd)
                if stat.S_ISCHR(st.st_mode):
                    devices.append(st.st_rdev)
        return cls.of_devices(devices)

    def gpus(self, sim: SimulatedNvml) -> list[int]:
        """The machine's indexes of the GPUs this container has, in the machine's order: its NVML indexes."""
        return [i for i, minor in enumerate(sim.minors) if minor in self.gpu_minors]

    def gi_visible(self, sim: SimulatedNvml, index: int, gi_id: int) -> bool:
        return MONITOR_CAP in self.cap_minors or gi_cap_minor(sim.minors[index], gi_id) in self.cap_minors

    def ci_visible(self, sim: SimulatedNvml, index: int, gi_id: int, ci_id: int) -> bool:
        if MONITOR_CAP in self.cap_minors:
            return True
        minor = sim.minors[index]
        return {gi_cap_minor(minor, gi_id), ci_cap_minor(minor, gi_id, ci_id)} <= self.cap_minors

    def visible(self, sim: SimulatedNvml, address: int) -> bool:
        """Whether a handle is one this container can hold (any handle that names no GPU, e.g. an event set's, is:
        the simulator judges it)."""
        kind, index, gi_id, ci_id = handle_ids(address)
        if kind not in (KIND_DEVICE, KIND_GPU_INSTANCE, KIND_COMPUTE_INSTANCE, KIND_MIG_DEVICE):
            return True
        if index >= len(sim.minors) or sim.minors[index] not in self.gpu_minors:
            return False
        if kind == KIND_GPU_INSTANCE:
            return self.gi_visible(sim, index, gi_id)
        if kind in (KIND_COMPUTE_INSTANCE, KIND_MIG_DEVICE):
            return self.ci_visible(sim, index, gi_id, ci_id)
        return True


def _address(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


# ----- the calls a container's view answers differently ---------------------------------------------------------
ViewHandler = Callable[..., None]
VIEW_FUNCTIONS: dict[str, ViewHandler] = {}


def _view(*names: str) -> Callable[[ViewHandler], ViewHandler]:
    def register(handler: ViewHandler) -> ViewHandler:
        for name in names:
            VIEW_FUNCTIONS[name] = handler
        return handler

    return register


@_view("nvmlDeviceGetCount", "nvmlDeviceGetCount_v2")
def _count(view: ContainerView, sim: SimulatedNvml, out: Out) -> None:
    sim.nvmlDeviceGetCount()  # NVML's errors first
    out.set(len(view.gpus(sim)))


@_view("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2")
def _by_index(view: ContainerView, sim: SimulatedNvml, index: int, out: Out) -> None:
    sim.nvmlDeviceGetCount()
    gpus = view.gpus(sim)
    if not 0 <= index < len(gpus):
        _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    out.set(sim.nvmlDeviceGetHandleByIndex(gpus[index]))


@_view("nvmlDeviceGetIndex")
def _index(view: ContainerView, sim: SimulatedNvml, device: int, out: Out) -> None:
    host = sim.nvmlDeviceGetIndex(ctypes.cast(ctypes.c_void_p(device), pynvml.c_nvmlDevice_t))
    out.set(view.gpus(sim).index(host))  # visible: its handle passed the check


def _mig_devices(sim: SimulatedNvml, device: Any) -> list[Any]:
    found = []
    for i in range(_INSTANCES):
        try:
            found.append(sim.nvmlDeviceGetMigDeviceHandleByIndex(device, i))
        except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
            break
    return found


@_view("nvmlDeviceGetMigDeviceHandleByIndex")
def _mig_by_index(view: ContainerView, sim: SimulatedNvml, device: int, index: int, out: Out) -> None:
    dev = ctypes.cast(ctypes.c_void_p(device), pynvml.c_nvmlDevice_t)
    with contextlib.suppress(pynvml.NVMLError_NotFound):  # NVML's errors: MIG off, an index past the maximum
        sim.nvmlDeviceGetMigDeviceHandleByIndex(dev, index)
    mine = [h for h in _mig_devices(sim, dev) if view.visible(sim, _address(h))]
    if index >= len(mine):
        _fail(pynvml.NVML_ERROR_NOT_FOUND)
    out.set(mine[index])


def _answer_array(out: ArrayOut, elem: Any, handles: list[Any]) -> None:
    """NVML's array convention for `handles`: a NULL array asks for the count; too small an array is
    NVML_ERROR_INSUFFICIENT_SIZE with the count needed."""
    out.set_count(len(handles))
    if not out.array_present:
        return
    if out.count < len(handles):
        _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    array = (elem * max(len(handles), 1))(*handles)
    out.set_items(bytes(array)[: len(handles) * ctypes.sizeof(elem)])


def _all(call: Callable[[Any, Any], object], elem: Any) -> list[Any]:
    array = (elem * _INSTANCES)()
    count = ctypes.c_uint(_INSTANCES)
    call(array, ctypes.byref(count))
    return list(array[: count.value])


@_view("nvmlDeviceGetGpuInstances")
def _gpu_instances(view: ContainerView, sim: SimulatedNvml, device: int, profile_id: int, out: ArrayOut) -> None:
    dev = ctypes.cast(ctypes.c_void_p(device), pynvml.c_nvmlDevice_t)
    elem = pynvml.c_nvmlGpuInstance_t
    every = _all(lambda array, count: sim.nvmlDeviceGetGpuInstances(dev, profile_id, array, count), elem)
    _answer_array(out, elem, [h for h in every if view.visible(sim, _address(h))])


@_view("nvmlGpuInstanceGetComputeInstances")
def _compute_instances(
    view: ContainerView, sim: SimulatedNvml, gpu_instance: int, profile_id: int, out: ArrayOut
) -> None:
    gi = ctypes.cast(ctypes.c_void_p(gpu_instance), pynvml.c_nvmlGpuInstance_t)
    elem = pynvml.c_nvmlComputeInstance_t
    every = _all(lambda array, count: sim.nvmlGpuInstanceGetComputeInstances(gi, profile_id, array, count), elem)
    _answer_array(out, elem, [h for h in every if view.visible(sim, _address(h))])


# Lookups whose handle (the last output) must be one of this container's, else NVML_ERROR_NOT_FOUND.
LOOKUPS = frozenset(
    {
        "nvmlDeviceGetHandleByUUID",
        "nvmlDeviceGetHandleByUUIDV",
        "nvmlDeviceGetHandleByPciBusId",
        "nvmlDeviceGetHandleByPciBusId_v2",
        "nvmlDeviceGetGpuInstanceById",
        "nvmlGpuInstanceGetComputeInstanceById",
    }
)
# Changes a container may not make: MIG and compute modes (the host's), instances (the mig/config capability's).
HOST_ONLY = frozenset({"nvmlDeviceSetMigMode", "nvmlDeviceSetComputeMode"})
MIG_CONFIG = frozenset(
    {
        "nvmlDeviceCreateGpuInstance",
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        "nvmlGpuInstanceDestroy",
        "nvmlGpuInstanceCreateComputeInstance",
        "nvmlGpuInstanceCreateComputeInstanceWithPlacement",
        "nvmlComputeInstanceDestroy",
    }
)


def call_in_view(
    view: ContainerView,
    sim: SimulatedNvml,
    name: str,
    letters: list[str],
    args: list[Arg],
    handler: Callable[..., None],
) -> None:
    """Run one call as NVML answers it in this container (`letters`: the format's token letters, one per arg)."""
    for letter, arg in zip(letters, args, strict=True):
        if letter == "h" and isinstance(arg, int) and not view.visible(sim, arg):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # not a handle this process could have been given
    if name in HOST_ONLY or (name in MIG_CONFIG and CONFIG_CAP not in view.cap_minors):
        _fail(pynvml.NVML_ERROR_NO_PERMISSION)
    override = VIEW_FUNCTIONS.get(name)
    if override is not None:
        override(view, sim, *args)
        return
    handler(sim, *args)
    if name in LOOKUPS:
        out = args[-1]
        assert isinstance(out, Out)
        if out.data is not None and not view.visible(sim, int.from_bytes(out.data, "little")):
            out.data = None
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
