"""The nvidia-smi commands sharing needs: a whole GPU's time slice and compute mode (there is no public NVML
setter for the time slice; NVIDIA's plugin sets both through nvidia-smi)."""

from __future__ import annotations

import logging

from dra_driver.claimstate.context import NO_DEADLINE, CallContext
from dra_driver.sharing.runner import DEFAULT_TIMEOUT_S, CommandResult, CommandRunner

log = logging.getLogger(__name__)

NO_DEVICES = 6  # nvidia-smi: "No devices were found" (the GPU is gone: nothing left to reset)
# compute modes as `--query-gpu=compute_mode` prints them -> as `-c` takes them
COMPUTE_MODES = {"Default": "DEFAULT", "Exclusive_Process": "EXCLUSIVE_PROCESS", "Prohibited": "PROHIBITED"}
DEFAULT, EXCLUSIVE_PROCESS = "Default", "Exclusive_Process"


class SharingError(RuntimeError):
    """A sharing command failed, or the settings cannot be applied."""


def check(what: str, result: CommandResult) -> None:
    if result.returncode != 0:
        detail = (result.stderr.strip() or result.stdout.strip() or "no output").replace("\n", "; ")
        raise SharingError(f"{what}: {' '.join(result.args)} exited with {result.returncode}: {detail}")


class NvidiaSmi:
    def __init__(self, runner: CommandRunner) -> None:
        self.runner = runner

    def _run(self, what: str, argv: list[str], call: CallContext, *, gone_is_fine: bool = False) -> str:
        call.check(what)  # DeadlineExceeded: no time left to run it
        try:
            result = self.runner.run(["nvidia-smi", *argv], timeout=call.timeout(DEFAULT_TIMEOUT_S))
        except OSError as e:
            raise SharingError(f"{what}: nvidia-smi: {e}") from e
        if gone_is_fine and result.returncode == NO_DEVICES:
            log.warning("%s: the GPU is gone", what)
            return ""
        check(what, result)
        return result.stdout

    def set_timeslice(
        self, uuid: str, interval: int, call: CallContext = NO_DEADLINE, *, gone_is_fine: bool = False
    ) -> None:
        self._run(
            f"set time slice of GPU {uuid}",
            ["compute-policy", "-i", uuid, "--set-timeslice", str(interval)],
            call,
            gone_is_fine=gone_is_fine,
        )

    def compute_mode(self, uuid: str, call: CallContext = NO_DEADLINE) -> str:
        """The GPU's compute mode, one of COMPUTE_MODES."""
        what = f"read compute mode of GPU {uuid}"
        out = self._run(what, ["--query-gpu=compute_mode", "--format=csv,noheader", "-i", uuid], call).strip()
        if out not in COMPUTE_MODES:
            raise SharingError(f"{what}: nvidia-smi answered {out!r}, not one of {', '.join(COMPUTE_MODES)}")
        return out

    def set_compute_mode(
        self, uuid: str, mode: str, call: CallContext = NO_DEADLINE, *, gone_is_fine: bool = False
    ) -> None:
        self._run(
            f"set compute mode of GPU {uuid} to {mode}",
            ["-i", uuid, "-c", COMPUTE_MODES[mode]],
            call,
            gone_is_fine=gone_is_fine,
        )
