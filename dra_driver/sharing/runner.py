"""How sharing runs the driver's tools: a Protocol, the subprocess runner, and the runner that takes the tools from
a driver root, as NVIDIA's plugin does (nvidia-smi from the driver root, `LD_PRELOAD` of its libnvidia-ml.so.1:
the plugin image ships neither, and the host's libraries are not on the container's library path)."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dra_driver.cdi.driverfiles import BINARY_DIRS, LIBRARY_DIRS, resolve_in_root

DEFAULT_TIMEOUT_S = 60.0  # nvidia-smi can hang on a sick GPU
CONTAINER_DRIVER_ROOT = Path("/driver-root")  # where the chart mounts the host's driver root
# what each tool needs preloaded: nvidia-smi NVML; the MPS daemon (and the server it starts) CUDA too
_PRELOAD = {"nvidia-smi": ("libnvidia-ml.so.1",), "nvidia-cuda-mps-control": ("libcuda.so.1", "libnvidia-ml.so.1")}


@dataclass(frozen=True)
class CommandResult:
    """What `subprocess.CompletedProcess` carries, text mode."""

    args: list[str]
    returncode: int
    stdout: str = ""
    stderr: str = ""


class CommandRunner(Protocol):
    def run(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run `argv` (env: variables added to the runner's environment; input: fed to stdin; timeout: at most
        this long, the caller's deadline, within the runner's own limit); never raises for a non-zero exit, only
        for a command that cannot be started (OSError)."""
        ...


class RealRunner:
    """Runs the commands on this host; `timeout_s` bounds each one (exit 124 when it runs out)."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s

    def run(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        full_env = {**os.environ, **env} if env else None
        limit = self.timeout_s if timeout is None else min(self.timeout_s, timeout)
        try:
            done = subprocess.run(
                argv, env=full_env, input=input, capture_output=True, text=True, timeout=limit, check=False
            )
        except subprocess.TimeoutExpired as e:
            return CommandResult(list(argv), 124, "", f"timed out after {limit:g}s: {e}")
        return CommandResult(list(argv), done.returncode, done.stdout, done.stderr)


class DriverRootRunner:
    """Runs a driver tool named by `argv[0]` (nvidia-smi, nvidia-cuda-mps-control) from `driver_root`: the
    binary found in the root's bin directories, the libraries it needs preloaded from the root's library
    directories (links resolved inside the root, as if it were `/`)."""

    def __init__(self, driver_root: Path, inner: CommandRunner | None = None) -> None:
        self.driver_root = Path(driver_root)
        self.inner: CommandRunner = inner or RealRunner()

    def tool(self, name: str) -> Path:
        """The tool's path on this host; FileNotFoundError when the root has none."""
        for d in BINARY_DIRS:
            real = resolve_in_root(self.driver_root, f"{d}/{name}")
            path = None if real is None else self.driver_root / real.lstrip("/")
            if path is not None and path.is_file() and path.stat().st_mode & stat.S_IXUSR:
                return path
        searched = ", ".join(str(self.driver_root / d.lstrip("/")) for d in BINARY_DIRS)
        raise FileNotFoundError(f"{name} not found in driver root {self.driver_root} (searched {searched})")

    def library(self, soname: str) -> Path | None:
        for d in LIBRARY_DIRS:
            real = resolve_in_root(self.driver_root, f"{d}/{soname}")
            if real is not None and (self.driver_root / real.lstrip("/")).is_file():
                return self.driver_root / real.lstrip("/")
        return None

    def environment(self, name: str) -> dict[str, str]:
        """What the tool needs added to its environment: the root's libraries it loads, preloaded ahead of any
        LD_PRELOAD this process has."""
        libraries = [str(path) for soname in _PRELOAD.get(name, ()) if (path := self.library(soname)) is not None]
        if not libraries:
            return {}
        return {"LD_PRELOAD": ":".join([*libraries, *filter(None, [os.environ.get("LD_PRELOAD")])])}

    def run(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        name = os.path.basename(argv[0])
        command = [str(self.tool(name)), *argv[1:]]
        return self.inner.run(command, env={**self.environment(name), **(env or {})}, input=input, timeout=timeout)


def default_runner(lib: Any) -> CommandRunner:
    """The runner that matches an NVML source: the tools of the simulator's driver root, or the host's (mounted
    at /driver-root by the chart, else this host's own `/`)."""
    root = getattr(lib, "driver_root", None)  # the simulator's (dra_driver.simulator.nvml.SimulatedNvml)
    if root is None:
        root = CONTAINER_DRIVER_ROOT if CONTAINER_DRIVER_ROOT.is_dir() else Path("/")
    return DriverRootRunner(Path(root))
