"""The command runner behind sharing: a Protocol, the real subprocess runner, and the default choice."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class CommandResult:
    """What `subprocess.CompletedProcess` carries, text mode."""

    args: list[str]
    returncode: int
    stdout: str = ""
    stderr: str = ""


class CommandRunner(Protocol):
    def run(self, argv: list[str], *, env: Mapping[str, str] | None = None, input: str | None = None) -> CommandResult:
        """Run `argv` (env: variables added to the runner's environment; input: fed to stdin); never raises
        for a non-zero exit, only for a command that cannot be started (OSError)."""
        ...


class RealRunner:
    """Runs the commands on this host. `timeout_s` bounds each command (nvidia-smi can hang on a sick GPU)."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s

    def run(self, argv: list[str], *, env: Mapping[str, str] | None = None, input: str | None = None) -> CommandResult:
        full_env = {**os.environ, **env} if env else None
        try:
            done = subprocess.run(
                argv, env=full_env, input=input, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except subprocess.TimeoutExpired as e:
            return CommandResult(list(argv), 124, "", f"timed out after {self.timeout_s:g}s: {e}")
        return CommandResult(list(argv), done.returncode, done.stdout, done.stderr)


def default_runner(lib: Any) -> CommandRunner:
    """The runner that matches an NVML source: a simulated one for the NVML simulator (state kept next to the
    simulator's), the real one otherwise."""
    from dra_driver.simulator.nvml import SimulatedNvml

    if isinstance(lib, SimulatedNvml):
        from dra_driver.sharing.simulated import SimulatedRunner

        return SimulatedRunner.for_simulator(lib)
    return RealRunner()
