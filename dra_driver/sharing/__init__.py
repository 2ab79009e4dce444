"""GPU sharing applied at prepare time: time-slice intervals and compute modes (nvidia-smi) and a per-claim MPS
control daemon, with no cross-talk between claims that share a GPU.

The driver's tools run from the driver root (`runner.DriverRootRunner`): the host's, or the simulator's, whose
tools are real processes too (dra_driver.simulator.tools). Tests can wrap the runner to record or fail calls.
"""

from dra_driver.sharing.conflicts import TIME_SLICE, SharingConflict
from dra_driver.sharing.manager import SharingManager, Target, with_edits
from dra_driver.sharing.nvsmi import SharingError
from dra_driver.sharing.runner import CommandResult, CommandRunner, DriverRootRunner, RealRunner, default_runner

__all__ = [
    "TIME_SLICE",
    "CommandResult",
    "CommandRunner",
    "DriverRootRunner",
    "RealRunner",
    "SharingConflict",
    "SharingError",
    "SharingManager",
    "Target",
    "default_runner",
    "with_edits",
]
