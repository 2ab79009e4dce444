"""Opening the NVML backend a command asked for: the real library or a named simulated machine.

Here, above dra_driver.nvml, because the choice needs both: the simulator is built on nvml's types, so nvml
itself must not know it. The simulator is imported only when asked for, so that a real node never loads it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from dra_driver.nvml.api import real_nvml
from dra_driver.nvml.source import NvmlSource


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
    driver_root: Path | None = None,
    host_driver_root: Path | None = None,
) -> NvmlSource:
    """`sim_machine` selects a simulated machine (state shared through `sim_state`); None means real NVML.
    `driver_root`: default `/` (a simulated machine: its own simulated driver root); `host_driver_root`: default
    `driver_root`."""
    if sim_machine is None:
        root = driver_root or Path("/")
        return NvmlSource(real_nvml(), sysfs_root, proc_root, "NVML (libnvidia-ml)", root, host_driver_root or root)
    from dra_driver.simulator.nvml import SimulatedNvml

    sim = SimulatedNvml(sim_machine, sim_state or default_sim_state_dir(sim_machine))
    root = driver_root or sim.driver_root
    return NvmlSource(
        sim,
        sim.sysfs_root,
        sim.proc_root,
        f"simulated {sim_machine} (state in {sim.state_dir})",
        root,
        host_driver_root or root,
    )


def serve_containers(source: NvmlSource | None) -> None:
    """`plugin --sim M --sim-persistenced`: start the machine's simulated nvidia-persistenced (unless it runs), as a
    node runs nvidia-persistenced: the simulated libnvidia-ml in the containers our CDI specs give GPUs reaches the
    machine through its socket (docs/simulated-libnvml.md, "In a container"). It outlives the plugin's process, not its
    container (in a pod it leaves with it). Nothing for real NVML; a failure to start it is logged, not fatal."""
    start = getattr(getattr(source, "lib", None), "start_persistenced", None)
    if start is None:
        return
    try:
        start()
    except (OSError, RuntimeError) as e:
        logging.getLogger(__name__).warning("the simulated nvidia-persistenced did not start: %s", e)
