"""GPU sharing applied at prepare time: time-slice intervals (nvidia-smi) and a per-claim MPS control daemon.

Everything goes through an injectable command runner (`runner.CommandRunner`), so the simulated node gets a
simulated nvidia-smi / nvidia-cuda-mps-control (`simulated.SimulatedRunner`) and tests can record the calls.
"""

from dra_driver.sharing.manager import SharingError, SharingManager, Target, with_edits
from dra_driver.sharing.runner import CommandResult, CommandRunner, RealRunner, default_runner
from dra_driver.sharing.simulated import SimulatedRunner

__all__ = [
    "CommandResult",
    "CommandRunner",
    "RealRunner",
    "SharingError",
    "SharingManager",
    "SimulatedRunner",
    "Target",
    "default_runner",
    "with_edits",
]
