"""The simulated tools' view of the node's devices: the simulator's NVML, opened as the real tools open the
driver's, and device ids (index or GPU/MIG UUID) looked up in it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pynvml

NO_DRIVER_MESSAGE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


class NoDriver(Exception):
    pass


def open_nvml(state_dir: Path) -> Any:
    """An initialised `SimulatedNvml` of the machine whose state lives in `state_dir`; NoDriver if none does."""
    from dra_driver.simulator.nvml import SimulatedNvml

    try:
        machine = json.loads((state_dir / "nvml-state.json").read_text())["machine"]
    except (OSError, ValueError, KeyError):
        raise NoDriver(NO_DRIVER_MESSAGE) from None
    nvml = SimulatedNvml(machine, state_dir)
    nvml.nvmlInit()
    return nvml


def find_device(nvml: Any, device_id: str) -> Any | None:
    """The device with this index or UUID (GPU or MIG), None if there is none."""
    device_id = device_id.strip()
    try:
        if device_id.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(device_id))
        return nvml.nvmlDeviceGetHandleByUUID(device_id)
    except pynvml.NVMLError:
        return None
