"""The simulated `nvidia-smi`: the forms the driver uses, with real nvidia-smi's outputs and exit codes.

- `nvidia-smi compute-policy [-i <id>] --set-timeslice <0..3>`: a whole GPU's time slice (MIG devices: 3)
- `nvidia-smi [-i <id>] -c <DEFAULT|EXCLUSIVE_PROCESS|PROHIBITED|0|2|3>`: compute mode, through the simulator's
  NVML (`nvmlDeviceSetComputeMode`, as the real one does); a MIG device has none of its own (3)
- `nvidia-smi [-i <id>] --query-gpu=<fields> --format=csv[,noheader]` (index, uuid, name, pci.bus_id, compute_mode,
  gpu_recovery_action); `nvidia-smi -L`
- `nvidia-smi -r [-i <id>]`: reset GPUs (every GPU without `-i`); refused (255) for a GPU a live process holds,
  as the real one refuses: the simulator's reset (`SimulatedNvml.reset_gpu`) clears its recovery action

`<id>`: GPU index or UUID, comma-separated. Exit codes (nvidia-smi(1)): 2 bad arguments, 3 not supported on the
device, 6 no such device, 9 no driver, 15 GPU lost.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from dra_driver.simulator.tools.devices import NoDriver, find_device, open_nvml
from dra_driver.simulator.tools.state import MODE_NAMES, SharingState

OK, BAD_ARGUMENTS, NOT_SUPPORTED, NO_DEVICES, NO_DRIVER, GPU_LOST, OTHER = 0, 2, 3, 6, 9, 15, 255
BAD_MESSAGE = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
NO_DEVICES_MESSAGE = "No devices were found"
COMPUTE_MODES = {"DEFAULT": 0, "0": 0, "PROHIBITED": 2, "2": 2, "EXCLUSIVE_PROCESS": 3, "3": 3}
_VALUED = {"-i": "id", "--id": "id", "-c": "compute-mode", "--compute-mode": "compute-mode",
           "--query-gpu": "query-gpu", "--format": "format", "--set-timeslice": "set-timeslice"}  # fmt: skip
_FLAGS = {"-L": "list-gpus", "--list-gpus": "list-gpus", "-r": "gpu-reset", "--gpu-reset": "gpu-reset"}
RECOVERY_ACTION_NAMES = {  # as nvidia-smi -q prints "GPU Recovery Action"
    pynvml.NVML_GPU_RECOVERY_ACTION_NONE: "None",
    pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET: "Reset",
    pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT: "Reboot",
    pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P: "Drain P2P",
    pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET: "Drain and Reset",
}
IN_USE_MESSAGE = (
    "{n} device is currently being used by one or more other processes (e.g., Fabric Manager, CUDA application, "
    "graphics application such as an X server, or a monitoring application such as another instance of "
    "nvidia-smi). Please first kill all processes using this device and all compute applications running in the "
    "system."
)


class Failure(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse(args: list[str]) -> tuple[str | None, dict[str, str]]:
    """(subcommand, options by long name); Failure(2) for anything nvidia-smi would refuse."""
    sub = None
    if args and args[0] == "compute-policy":
        sub, args = args[0], args[1:]
    options: dict[str, str] = {}
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if name in _FLAGS and not eq:
            options[_FLAGS[name]] = ""
        elif name in _VALUED:
            if not eq:
                i += 1
                if i >= len(args):
                    raise Failure(BAD_ARGUMENTS, BAD_MESSAGE)
                value = args[i]
            options[_VALUED[name]] = value
        else:
            raise Failure(BAD_ARGUMENTS, BAD_MESSAGE)
        i += 1
    allowed = (
        {"id", "set-timeslice"} if sub else {"id", "compute-mode", "query-gpu", "format", "list-gpus", "gpu-reset"}
    )
    if "gpu-reset" in options and set(options) - {"gpu-reset", "id"}:
        raise Failure(BAD_ARGUMENTS, BAD_MESSAGE)
    if set(options) - allowed or (sub and "set-timeslice" not in options):
        raise Failure(BAD_ARGUMENTS, BAD_MESSAGE)
    if ("query-gpu" in options) != ("format" in options) or ("compute-mode" in options and "query-gpu" in options):
        raise Failure(BAD_ARGUMENTS, BAD_MESSAGE)
    return sub, options


class Smi:
    def __init__(self, state_dir: Path) -> None:
        try:
            self.nvml = open_nvml(state_dir)
        except NoDriver as e:
            raise Failure(NO_DRIVER, str(e)) from None
        self.state = SharingState(state_dir)
        self.out: list[str] = []

    def devices(self, ids: str | None) -> list[Any]:
        if ids is None:
            return [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.nvml.nvmlDeviceGetCount())]
        handles = [find_device(self.nvml, item) for item in ids.split(",")]
        if any(h is None for h in handles):
            raise Failure(NO_DEVICES, NO_DEVICES_MESSAGE)
        return handles

    def is_mig(self, handle: Any) -> bool:
        return bool(self.nvml.nvmlDeviceIsMigDeviceHandle(handle).value)

    def bus_id(self, handle: Any) -> str:
        """The GPU's PCI bus id, as nvidia-smi names GPUs; Failure(15) when the GPU is lost."""
        try:
            bus = self.nvml.nvmlDeviceGetPciInfo(handle).busId
        except pynvml.NVMLError as e:
            raise self.nvml_failure(e, "GPU") from None
        return bus.decode() if isinstance(bus, bytes) else str(bus)

    @staticmethod
    def nvml_failure(e: pynvml.NVMLError, what: str) -> Failure:
        if e.value == pynvml.NVML_ERROR_GPU_IS_LOST:
            return Failure(GPU_LOST, f"Unable to determine the device handle for {what}: GPU is lost. "
                                     "Reboot the system to recover this GPU")  # fmt: skip
        if e.value == pynvml.NVML_ERROR_NOT_SUPPORTED:
            return Failure(NOT_SUPPORTED, f"{what}: Not Supported")
        return Failure(OTHER, f"{what}: {e}")

    # ----- commands ---------------------------------------------------------------------------------------
    def set_timeslice(self, ids: str | None, value: str) -> None:
        if value not in ("0", "1", "2", "3"):
            raise Failure(BAD_ARGUMENTS, f'Invalid value "{value}" for --set-timeslice: valid values are '
                                         "0 (default), 1 (short), 2 (medium) and 3 (long).")  # fmt: skip
        for handle in self.devices(ids):
            if self.is_mig(handle):
                uuid = self.nvml.nvmlDeviceGetUUID(handle)
                raise Failure(NOT_SUPPORTED, f"Setting the compute policy of MIG device {uuid} is not supported.")
            bus = self.bus_id(handle)
            uuid = self.nvml.nvmlDeviceGetUUID(handle)
            with self.state.mutate() as data:
                data["timeslice"][uuid] = int(value)
            self.out.append(f"Set compute policy time slice to {value} for GPU {bus}.")

    def set_compute_mode(self, ids: str | None, value: str) -> None:
        mode = COMPUTE_MODES.get(value.upper())
        if mode is None:
            raise Failure(BAD_ARGUMENTS, BAD_MESSAGE)
        name = next(k for k, v in COMPUTE_MODES.items() if v == mode and not k.isdigit())
        for handle in self.devices(ids):
            label = self.nvml.nvmlDeviceGetUUID(handle) if self.is_mig(handle) else self.bus_id(handle)
            try:
                self.nvml.nvmlDeviceSetComputeMode(handle, mode)
            except pynvml.NVMLError as e:
                raise self.nvml_failure(e, f"Unable to set the compute mode for GPU {label}") from None
            self.out.append(f"Set compute mode to {name} for GPU {label}.")
        self.out.append("All done.")

    def query(self, ids: str | None, fields: str, fmt: str) -> None:
        flags = fmt.split(",")
        if flags[0] != "csv" or set(flags[1:]) - {"noheader", "nounits"}:
            raise Failure(BAD_ARGUMENTS, f'"{fmt}" is not a valid format.')
        getters: dict[str, Callable[[Any], str]] = {
            "index": lambda h: str(self.nvml.nvmlDeviceGetIndex(h)),
            "uuid": lambda h: str(self.nvml.nvmlDeviceGetUUID(h)),
            "name": lambda h: str(self.nvml.nvmlDeviceGetName(h)),
            "pci.bus_id": self.bus_id,
            "compute_mode": lambda h: MODE_NAMES[self.nvml.nvmlDeviceGetComputeMode(h)],
            "gpu_recovery_action": self.recovery_action,
        }
        names = [f.strip() for f in fields.split(",")]
        for f in names:
            if f not in getters:
                raise Failure(BAD_ARGUMENTS, f'Field "{f}" is not a valid field to query.')
        handles = self.devices(ids)
        if any(self.is_mig(h) for h in handles):
            raise Failure(NO_DEVICES, NO_DEVICES_MESSAGE)  # --query-gpu reports GPUs only
        if "noheader" not in flags:
            self.out.append(", ".join(names))
        for h in handles:
            self.bus_id(h)  # a lost GPU fails the query
            self.out.append(", ".join(getters[f](h) for f in names))

    def recovery_action(self, handle: Any) -> str:
        (value,) = self.nvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        if value.nvmlReturn != pynvml.NVML_SUCCESS:
            return "[N/A]"
        return RECOVERY_ACTION_NAMES.get(value.value.uiVal, "Unknown")

    def reset(self, ids: str | None) -> None:
        handles = self.devices(ids)
        if any(self.is_mig(h) for h in handles):
            raise Failure(NOT_SUPPORTED, "Resetting a MIG device is not supported: reset its GPU.")
        busy = [(h, self.bus_id(h)) for h in handles if self.nvml.busy(self.nvml.nvmlDeviceGetIndex(h))]
        if busy:
            lines = ["The following GPUs could not be reset:"]
            lines += [f"  GPU {bus}: In use by another client" for _, bus in busy]
            raise Failure(OTHER, "\n".join([*lines, "", IN_USE_MESSAGE.format(n=len(busy))]))
        for handle in handles:
            bus = self.bus_id(handle)
            self.nvml.reset_gpu(self.nvml.nvmlDeviceGetIndex(handle))
            self.out.append(f"GPU {bus} was successfully reset.")
        self.out.append("All done.")

    def list_gpus(self) -> None:
        for index, handle in enumerate(self.devices(None)):
            name, uuid = self.nvml.nvmlDeviceGetName(handle), self.nvml.nvmlDeviceGetUUID(handle)
            self.out.append(f"GPU {index}: {name} (UUID: {uuid})")


def run(state_dir: Path, args: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr)."""
    try:
        sub, options = parse(args)
        smi = Smi(state_dir)
        ids = options.get("id")
        if sub == "compute-policy":
            smi.set_timeslice(ids, options["set-timeslice"])
        elif "compute-mode" in options:
            smi.set_compute_mode(ids, options["compute-mode"])
        elif "query-gpu" in options:
            smi.query(ids, options["query-gpu"], options["format"])
        elif "gpu-reset" in options:
            smi.reset(ids)
        else:
            smi.list_gpus()
    except Failure as f:  # nvidia-smi prints its errors on stdout
        return f.code, f"{f}\n", ""
    return OK, "".join(line + "\n" for line in smi.out), ""


def main(state_dir: Path, argv: list[str]) -> int:
    code, out, err = run(state_dir, argv[1:])
    sys.stdout.write(out)
    sys.stderr.write(err)
    SharingState(state_dir).record_call(argv, os.environ, None, code)
    return code
