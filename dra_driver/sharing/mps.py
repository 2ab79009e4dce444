"""One MPS control daemon per claim: `<plugin dir>/mps/<claim uid>/{pipe,log,shm}`, started with
`nvidia-cuda-mps-control -d` (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY, CUDA_VISIBLE_DEVICES), set up
through its control pipe, stopped with `quit`. Containers get CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps and the
pipe and shm directories mounted."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from pathlib import Path

from dra_driver.cdi.spec import ContainerEdits, Mount
from dra_driver.claimstate.context import time_left
from dra_driver.sharing.nvsmi import SharingError, check
from dra_driver.sharing.runner import CommandResult, CommandRunner

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"


class MpsControl:
    def __init__(self, runner: CommandRunner) -> None:
        self.runner = runner

    @staticmethod
    def env(directory: Path, uuids: list[str] | None = None) -> dict[str, str]:
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(directory / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(directory / "log")}
        if uuids is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
        return env

    def _run(
        self, argv: list[str], env: Mapping[str, str], stdin: str | None = None, deadline: float | None = None
    ) -> CommandResult:
        timeout = None if deadline is None else max(0.0, time_left(deadline))
        try:
            return self.runner.run(argv, env=env, input=stdin, timeout=timeout)
        except OSError as e:
            raise SharingError(f"{argv[0]}: {e}") from e

    def start(
        self, directory: Path, uuids: list[str], commands: list[str], deadline: float | None = None
    ) -> ContainerEdits:
        """Start the daemon for `uuids` (in CUDA_VISIBLE_DEVICES order), send it `commands`; the edits that
        connect a container to it. Each command ends at `deadline` (time.monotonic()) at the latest."""
        for sub in ("pipe", "log", "shm"):
            (directory / sub).mkdir(parents=True, exist_ok=True)
        env = self.env(directory, uuids)
        check(f"start MPS control daemon for {','.join(uuids)}", self._run([CONTROL, "-d"], env, deadline=deadline))
        if commands:
            check("configure MPS control daemon", self._run([CONTROL], env, "\n".join(commands) + "\n", deadline))
        return ContainerEdits(
            env=[f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}"],
            mounts=[
                Mount(host_path=str(directory / "pipe"), container_path=CONTAINER_PIPE_DIR, options=["rbind", "rw"]),
                Mount(host_path=str(directory / "shm"), container_path="/dev/shm", options=["rbind", "rw"]),
            ],
        )

    def stop(self, directory: Path) -> None:
        """Quit the daemon of `directory` if one runs, then remove the directory. Safe to repeat."""
        if not directory.exists():
            return
        if (directory / "pipe").is_dir():
            result = self._run([CONTROL], self.env(directory), "quit\n")
            if result.returncode != 0:  # not running (never started, or died): the directory still goes
                log.warning(
                    "stopping MPS control daemon in %s: exit %d: %s",
                    directory,
                    result.returncode,
                    (result.stderr or result.stdout).strip(),
                )
        shutil.rmtree(directory)
