"""The NVML backend a process works with, and where it finds the node's sysfs, procfs and driver files.

`dra_driver.simulator.source.open_source` opens one: the real library or a simulated machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dra_driver.nvml.api import NvmlLibrary


@dataclass(frozen=True)
class NvmlSource:
    lib: NvmlLibrary
    sysfs_root: Path
    proc_root: Path  # /proc/devices and the MIG capability files
    description: str
    # The NVIDIA driver's user-space files (libraries, binaries, firmware) as this process reads them, and as the
    # host sees them (the paths CDI specs name): /driver-root and /run/nvidia/driver for a GPU Operator install.
    driver_root: Path = Path("/")
    host_driver_root: Path = Path("/")
