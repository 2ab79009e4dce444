"""`dra-driver mps-control-daemon`: the main process of a claim's MPS control daemon pod (sharing.mps_deployment).

It runs the driver root's `nvidia-cuda-mps-control -f` as its child, waits until the daemon answers on its control
pipe, sends the claim's settings, then writes a ready file that the pod's startup probe reads. SIGTERM (the pod being
deleted) is passed on as `quit`; the process exits when the daemon does, with its exit status, so the kubelet
restarts a daemon that died.

The binary runs from the mounted driver root directly, not in a chroot as NVIDIA's template does: the simulated
binary is a Python script whose interpreter is in this image, not in the root, and without a chroot the pipe, log and
shm directories keep the host paths the plugin and the CDI specs use. Only the driver libraries the tool needs are
preloaded (`runner.DriverRootRunner`), never the root's whole library directory, which on a `/` driver root would
put the host's glibc under this image's programs. The real nvidia-cuda-mps-control needs nothing but glibc itself.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from dra_driver.sharing.nvsmi import SharingError
from dra_driver.sharing.runner import DriverRootRunner

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
CLIENT_TIMEOUT_S = 10.0  # one control-pipe exchange
POLL_S = 0.1
_PINNED = re.compile(r"^[1-9][0-9]*[MG]\Z")


class MpsDaemonError(SharingError):
    """A claim's MPS control daemon could not be started, set up or stopped."""


@dataclass(frozen=True)
class MpsSettings:
    """A claim's MPS settings: the default active thread percentage, and pinned device memory limits by device
    index (the order of CUDA_VISIBLE_DEVICES) as the control pipe takes them ("<n>M")."""

    active_thread_percentage: int | None = None
    pinned_mem_limits: tuple[tuple[int, str], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.active_thread_percentage is not None and not 1 <= self.active_thread_percentage <= 100:
            raise ValueError(f"active thread percentage {self.active_thread_percentage}: expected 1..100")
        for index, limit in self.pinned_mem_limits:
            if index < 0 or not _PINNED.match(limit):
                raise ValueError(f"pinned memory limit {index}={limit}: expected <device index>=<n>M or <n>G")

    def commands(self) -> list[str]:
        """The control pipe commands that apply these settings."""
        out = []
        if self.active_thread_percentage is not None:
            out.append(f"set_default_active_thread_percentage {self.active_thread_percentage}")
        out += [f"set_default_device_pinned_mem_limit {i} {limit}" for i, limit in self.pinned_mem_limits]
        return out

    def args(self) -> list[str]:
        """These settings as `dra-driver mps-control-daemon` options."""
        out = (
            []
            if self.active_thread_percentage is None
            else [f"--active-thread-percentage={self.active_thread_percentage}"]
        )
        return out + [f"--pinned-mem-limit={i}={limit}" for i, limit in self.pinned_mem_limits]


def parse_pinned(text: str) -> tuple[int, str]:
    """`<device index>=<limit>` of --pinned-mem-limit."""
    index, sep, limit = text.partition("=")
    if not sep or not index.isdigit() or not _PINNED.match(limit):
        raise ValueError(f"--pinned-mem-limit {text!r}: expected <device index>=<n>M, as 0=1024M")
    return int(index), limit


class ControlDaemon:
    """`nvidia-cuda-mps-control -f` from `driver_root`, as a child process, and its control pipe."""

    def __init__(self, driver_root: Path, env: Mapping[str, str]) -> None:
        runner = DriverRootRunner(driver_root)
        self.tool = runner.tool(CONTROL)  # FileNotFoundError: the root has none
        path = (
            f"{self.tool.parent}{os.pathsep}{env.get('PATH', os.defpath)}"  # the daemon starts nvidia-cuda-mps-server
        )
        self.env = {**env, **runner.environment(CONTROL), "PATH": path}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        pipe = self.env.get("CUDA_MPS_PIPE_DIRECTORY")
        if pipe:
            os.makedirs(pipe, exist_ok=True)
        self.process = subprocess.Popen([str(self.tool), "-f"], env=self.env, stdin=subprocess.DEVNULL)

    def exited(self) -> int | None:
        assert self.process is not None
        return self.process.poll()

    def send(self, commands: list[str], timeout: float = CLIENT_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """The client `nvidia-cuda-mps-control` with `commands` on its stdin."""
        try:
            return subprocess.run(
                [str(self.tool)],
                env=self.env,
                input="".join(f"{c}\n" for c in commands),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess([str(self.tool)], 124, "", f"no answer within {timeout:g}s")

    def wait_answering(self, deadline: float, stopping: Callable[[], bool] = lambda: False) -> None:
        """Until the daemon answers on its pipe; MpsDaemonError when it exits, `deadline` passes or `stopping()`."""
        last = ""
        while time.monotonic() < deadline:
            if stopping():
                raise MpsDaemonError(f"asked to stop before {self.tool} -f answered")
            code = self.exited()
            if code is not None:
                raise MpsDaemonError(f"{self.tool} -f exited with {code} before it answered")
            result = self.send(
                ["get_server_list"], timeout=min(CLIENT_TIMEOUT_S, max(0.1, deadline - time.monotonic()))
            )
            if result.returncode == 0:
                return
            last = (result.stderr or result.stdout).strip()
            time.sleep(POLL_S)
        raise MpsDaemonError(f"{self.tool} -f did not answer on its control pipe in time: {last or 'no answer'}")

    def stop(self, timeout: float) -> int:
        """`quit`, then SIGTERM, then SIGKILL, each given part of `timeout`; the daemon's exit status."""
        assert self.process is not None
        if self.process.poll() is None:
            result = self.send(["quit"], timeout=timeout / 2)
            if result.returncode != 0:
                log.warning("quit: exit %d: %s", result.returncode, (result.stderr or result.stdout).strip())
        for escalate in (None, self.process.terminate, self.process.kill):
            if escalate is not None:
                escalate()
            try:
                return self.process.wait(timeout=timeout / 4)
            except subprocess.TimeoutExpired:
                continue
        return self.process.wait()


def _remove_marker(path: Path) -> None:
    """Remove the ready file: a regular file (or a link) only, never a device, pipe or directory given by mistake."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
        path.unlink(missing_ok=True)
    else:
        log.warning("ready file %s is not a regular file: left as it is", path)


def run(
    driver_root: Path,
    settings: MpsSettings,
    ready_file: Path,
    *,
    env: Mapping[str, str] | None = None,
    start_timeout: float = 60.0,
    stop_timeout: float = 10.0,
) -> int:
    """The pod's main process: start, set up, mark ready, then live and die with the daemon (see module doc)."""
    stopping: list[str] = []

    def on_signal(signum: int, _: FrameType | None) -> None:
        stopping.append(signal.Signals(signum).name)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    _remove_marker(ready_file)
    try:
        daemon = ControlDaemon(driver_root, dict(os.environ if env is None else env))
        daemon.start()
    except OSError as e:  # no such tool, not executable
        log.error("starting %s: %s", CONTROL, e)
        return 1
    try:
        daemon.wait_answering(time.monotonic() + start_timeout, lambda: bool(stopping))
        commands = settings.commands()
        if commands:
            result = daemon.send(commands)
            if result.returncode != 0:
                detail = (result.stderr or result.stdout).strip()
                raise MpsDaemonError(f"setting {'; '.join(commands)}: exit {result.returncode}: {detail}")
        ready_file.parent.mkdir(parents=True, exist_ok=True)
        ready_file.write_text("startup complete\n")
        log.info("MPS control daemon %d ready (%s)", daemon.process.pid if daemon.process else 0, "; ".join(commands))
        while not stopping:
            code = daemon.exited()
            if code is not None:
                log.error("the MPS control daemon exited with %d", code)
                return code if code > 0 else 128 - code if code < 0 else 1  # not asked to stop: a failure
            time.sleep(POLL_S)
        log.info("%s: stopping the MPS control daemon", stopping[0])
        return daemon.stop(stop_timeout)
    except MpsDaemonError as e:
        log.error("%s", e)
        daemon.stop(stop_timeout)
        return 1
    finally:
        _remove_marker(ready_file)
        for s, handler in previous.items():
            signal.signal(s, handler)
