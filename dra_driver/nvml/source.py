"""Choosing the NVML backend: the real library or a named simulated machine. The only place that knows."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dra_driver.nvml.api import NvmlLibrary, real_nvml


@dataclass(frozen=True)
class NvmlSource:
    lib: NvmlLibrary
    sysfs_root: Path
    proc_root: Path  # /proc/devices and the MIG capability files
    description: str


def default_sim_state_dir(machine: str) -> Path:
    base = os.environ.get("DRA_DRIVER_SIM_STATE") or os.path.join(
        os.environ.get("XDG_RUNTIME_DIR") or "/tmp", "dra-driver-sim"
    )
    return Path(base) / machine


def open_source(
    sim_machine: str | None,
    sim_state: Path | None = None,
    sysfs_root: Path = Path("/sys"),
    proc_root: Path = Path("/proc"),
) -> NvmlSource:
    """`sim_machine` selects a simulated machine (state shared through `sim_state`); None means real NVML."""
    if sim_machine is None:
        return NvmlSource(real_nvml(), sysfs_root, proc_root, "NVML (libnvidia-ml)")
    from dra_driver.simulator.nvml import SimulatedNvml

    sim = SimulatedNvml(sim_machine, sim_state or default_sim_state_dir(sim_machine))
    return NvmlSource(sim, sim.sysfs_root, sim.proc_root, f"simulated {sim_machine} (state in {sim.state_dir})")
