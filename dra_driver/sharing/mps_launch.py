"""Who runs a claim's MPS control daemon: the `MpsLauncher` protocol and its two forms.

- `mps_deployment.MpsPods`: a pod of its own per claim, so the daemon outlives the plugin (a plugin in a cluster).
- `LocalMps`: `nvidia-cuda-mps-control -d`, a child of the plugin that dies with it: for a plugin with no cluster to
  run pods in (the demo, in-process tests).

Both work on the claim's directory, `<plugin dir>/mps/<claim uid>/{pipe,log,shm}`, which the manager creates and
removes (with the tmpfs on shm), and give containers the same edits (`container_edits`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from dra_driver.cdi.spec import ContainerEdits, Mount
from dra_driver.claimstate.context import time_left
from dra_driver.sharing.mps import CONTAINER_PIPE_DIR, CONTROL, MpsControl
from dra_driver.sharing.mps_control_daemon import MpsSettings
from dra_driver.sharing.nvsmi import SharingError
from dra_driver.sharing.runner import CommandRunner

log = logging.getLogger(__name__)


class MpsLauncher(Protocol):
    def start(
        self, claim_uid: str, mps_dir: Path, uuids: list[str], settings: MpsSettings, deadline: float | None = None
    ) -> None:
        """Start the claim's daemon for `uuids` (CUDA_VISIBLE_DEVICES order) with `settings`, and return once it
        answers; SharingError (MpsDaemonError) otherwise. `deadline`: when the caller gives up (time.monotonic(),
        the answer margin not taken off: waits measure it with `time_left`), None for a default."""
        ...

    def stop(self, claim_uid: str, mps_dir: Path, deadline: float | None = None) -> None:
        """Stop the claim's daemon and return once it has exited; not running is fine. SharingError otherwise."""
        ...

    def list(self, deadline: float | None = None) -> list[str]:
        """The claims whose daemons this launcher knows of beyond their directories (for orphan cleanup)."""
        ...


class LocalMps:
    """The daemon as the plugin's child, `nvidia-cuda-mps-control -d`, through the driver root's tools."""

    def __init__(self, runner: CommandRunner) -> None:
        self.runner = runner
        self.control = MpsControl(runner)

    def start(
        self, claim_uid: str, mps_dir: Path, uuids: list[str], settings: MpsSettings, deadline: float | None = None
    ) -> None:
        self.control.start(mps_dir, uuids, settings.commands(), deadline)

    def stop(self, claim_uid: str, mps_dir: Path, deadline: float | None = None) -> None:
        if not (mps_dir / "pipe").is_dir():
            return
        try:
            timeout = None if deadline is None else max(0.0, time_left(deadline))
            result = self.runner.run([CONTROL], env=MpsControl.env(mps_dir), input="quit\n", timeout=timeout)
        except OSError as e:
            raise SharingError(f"{CONTROL}: {e}") from e
        if result.returncode != 0:  # not running (never started, or died): nothing to stop
            log.warning("stopping MPS control daemon in %s: exit %d: %s", mps_dir, result.returncode,
                        (result.stderr or result.stdout).strip())  # fmt: skip

    def list(self, deadline: float | None = None) -> list[str]:
        return []  # a daemon of this kind lives in its claim's directory: the directories say it all


def container_edits(mps_dir: Path) -> ContainerEdits:
    """What a container of the claim gets: the daemon's pipe directory and the claim's shm as its /dev/shm."""
    return ContainerEdits(
        env=[f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE_DIR}"],
        mounts=[
            Mount(host_path=str(mps_dir / "pipe"), container_path=CONTAINER_PIPE_DIR, options=["rbind", "rw"]),
            Mount(host_path=str(mps_dir / "shm"), container_path="/dev/shm", options=["rbind", "rw"]),
        ],
    )
