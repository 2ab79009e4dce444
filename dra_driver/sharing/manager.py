"""Applying and undoing a claim's sharing settings, crash-safe through the plugin's checkpoint.

Each change is written to the checkpoint (the device's `sharing` record, `applied: false`) *before* it is made
and marked `applied: true` after, so a crash at any point leaves a record that rollback can act on:

- TimeSlicing on a whole GPU: `nvidia-smi compute-policy -i <uuid> --set-timeslice <0..3>`
  (Default/Short/Medium/Long); undone by setting 0 (Default). MIG devices cannot take an interval.
- MPS: one control daemon per claim for all its MPS devices, with `<plugin dir>/mps/<claim uid>/{pipe,log,shm}`;
  started with `nvidia-cuda-mps-control -d` (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY,
  CUDA_VISIBLE_DEVICES), settings sent through the control pipe; undone with `quit` and removing the directory.
  Containers get CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps and the pipe and shm directories mounted.

Devices prepared with admin access share a device another claim prepared: their sharing config is ignored,
so that unpreparing them never resets the other claim's settings.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.cdi.spec import CdiSpec, ContainerEdits, Mount
from dra_driver.plugin import crashpoints
from dra_driver.plugin.checkpoint import CheckpointedDevice
from dra_driver.plugin.config import ConfigError, GpuConfig, MigDeviceConfig, pinned_limit_mib
from dra_driver.sharing.runner import CommandResult, CommandRunner

log = logging.getLogger(__name__)

TIME_SLICE = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
MPS_CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
_NO_DEVICES = 6  # nvidia-smi: "No devices were found" (the GPU is gone: nothing left to reset)

Config = GpuConfig | MigDeviceConfig


class SharingError(RuntimeError):
    """A sharing command failed."""


@dataclass(frozen=True)
class Target:
    """One prepared device: its checkpoint record (gets the `sharing` record), config, and GPU or MIG UUID."""

    record: CheckpointedDevice
    config: Config | None
    uuid: str
    is_mig: bool


def _strategy(config: Config | None) -> str | None:
    return config.sharing.strategy if config is not None and config.sharing is not None else None


class SharingManager:
    def __init__(
        self,
        runner: CommandRunner,
        plugin_dir: Path,
        *,
        nvidia_smi: str = "nvidia-smi",
        mps_control: str = "nvidia-cuda-mps-control",
    ) -> None:
        self.runner = runner
        self.plugin_dir = plugin_dir
        self.nvidia_smi = nvidia_smi
        self.mps_control = mps_control

    def mps_dir(self, claim_uid: str) -> Path:
        return self.plugin_dir / "mps" / claim_uid

    # ----- validation (before anything changes) -------------------------------------------------------------
    def validate(self, devices: list[tuple[str, Config | None, bool]]) -> None:
        """(device name, resolved config, admin access) of every device of one claim; ConfigError if the
        settings cannot be applied."""
        percentages: dict[int | None, str] = {}
        for name, config, admin in devices:
            if admin or config is None or config.sharing is None or config.sharing.strategy != "MPS":
                continue
            mps = config.sharing.mps_config  # numbers' ranges were checked when the config was decoded
            percentages.setdefault(mps.default_active_thread_percentage if mps else None, name)
        if len(percentages) > 1:
            raise ConfigError(
                "the MPS devices of one claim share one control daemon and need the same "
                f"defaultActiveThreadPercentage (devices {', '.join(sorted(percentages.values()))} differ)"
            )

    # ----- apply ----------------------------------------------------------------------------------------------
    def apply(self, claim_uid: str, targets: list[Target], save: Callable[[], None]) -> ContainerEdits | None:
        """Apply the claim's sharing; returns the container edits the claim's CDI spec needs (None: none).
        `save` writes the checkpoint: called once with the intents recorded, once with them marked applied."""
        live = [t for t in targets if not t.record.admin_access]
        slices = [t for t in live if _strategy(t.config) == "TimeSlicing" and not t.is_mig]
        mps = [t for t in live if _strategy(t.config) == "MPS"]
        if not slices and not mps:
            return None
        directory = self.mps_dir(claim_uid)
        for t in slices:
            assert t.config is not None and t.config.sharing is not None
            ts = t.config.sharing.time_slicing_config
            interval = TIME_SLICE[ts.interval if ts is not None else "Default"]
            t.record.sharing = {"strategy": "TimeSlicing", "gpuUuid": t.uuid, "interval": interval, "applied": False}
        for t in mps:
            t.record.sharing = {"strategy": "MPS", "dir": str(directory), "uuid": t.uuid, "applied": False}
        save()  # intents first: a crash from here on leaves records that rollback undoes
        crashpoints.reached("prepare.sharing-intent-recorded")
        for t in slices:
            assert t.record.sharing is not None
            self._set_timeslice(t.uuid, int(t.record.sharing["interval"]))
        edits = self._start_mps(directory, mps) if mps else None
        crashpoints.reached("prepare.sharing-applied")
        for t in slices + mps:
            assert t.record.sharing is not None
            t.record.sharing["applied"] = True
        save()
        return edits

    def _check(self, what: str, result: CommandResult) -> None:
        if result.returncode != 0:
            detail = (result.stderr.strip() or result.stdout.strip() or "no output").replace("\n", "; ")
            raise SharingError(f"{what}: {' '.join(result.args)} exited with {result.returncode}: {detail}")

    def _set_timeslice(self, uuid: str, interval: int, *, gone_is_fine: bool = False) -> CommandResult:
        argv = [self.nvidia_smi, "compute-policy", "-i", uuid, "--set-timeslice", str(interval)]
        try:
            result = self.runner.run(argv)
        except OSError as e:
            raise SharingError(f"set time slice of GPU {uuid}: {argv[0]}: {e}") from e
        if gone_is_fine and result.returncode == _NO_DEVICES:
            log.warning("resetting the time slice of GPU %s: the GPU is gone", uuid)
        else:
            self._check(f"set time slice of GPU {uuid}", result)
        return result

    def _mps_env(self, directory: Path, uuids: list[str] | None = None) -> dict[str, str]:
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(directory / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(directory / "log")}
        if uuids is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
        return env

    def _mps_run(self, argv: list[str], env: Mapping[str, str], stdin: str | None = None) -> CommandResult:
        try:
            return self.runner.run(argv, env=env, input=stdin)
        except OSError as e:
            raise SharingError(f"{argv[0]}: {e}") from e

    def _start_mps(self, directory: Path, targets: list[Target]) -> ContainerEdits:
        for sub in ("pipe", "log", "shm"):
            (directory / sub).mkdir(parents=True, exist_ok=True)
        uuids = [t.uuid for t in targets]
        env = self._mps_env(directory, uuids)
        self._check(f"start MPS control daemon for {','.join(uuids)}", self._mps_run([self.mps_control, "-d"], env))
        commands: list[str] = []
        first = targets[0].config
        assert first is not None and first.sharing is not None
        if first.sharing.mps_config and first.sharing.mps_config.default_active_thread_percentage is not None:
            commands.append(
                f"set_default_active_thread_percentage {first.sharing.mps_config.default_active_thread_percentage}"
            )
        for index, t in enumerate(targets):  # device indices as the daemon sees them: CUDA_VISIBLE_DEVICES order
            assert t.config is not None and t.config.sharing is not None
            mps = t.config.sharing.mps_config
            if mps is not None and mps.default_pinned_device_memory_limit is not None:
                mib = pinned_limit_mib(mps.default_pinned_device_memory_limit)
                commands.append(f"set_default_device_pinned_mem_limit {index} {mib}M")
        if commands:
            result = self._mps_run([self.mps_control], env, "\n".join(commands) + "\n")
            self._check("configure MPS control daemon", result)
        return ContainerEdits(
            env=[f"CUDA_MPS_PIPE_DIRECTORY={MPS_CONTAINER_PIPE_DIR}"],
            mounts=[
                Mount(
                    host_path=str(directory / "pipe"), container_path=MPS_CONTAINER_PIPE_DIR, options=["rbind", "rw"]
                ),
                Mount(host_path=str(directory / "shm"), container_path="/dev/shm", options=["rbind", "rw"]),
            ],
        )

    # ----- undo -----------------------------------------------------------------------------------------------
    def undo(self, claim_uid: str, records: list[CheckpointedDevice]) -> None:
        """Undo whatever the records say was (or may have been) applied: stop the MPS daemon and remove its
        directory, reset time slices to Default. Safe to repeat. Raises SharingError when a time slice that was
        applied cannot be reset (the unprepare fails and the kubelet retries)."""
        shared: list[dict[str, Any]] = [r.sharing for r in records if r.sharing]
        directories = {Path(s["dir"]) for s in shared if s.get("strategy") == "MPS" and s.get("dir")}
        directories.add(self.mps_dir(claim_uid))
        for directory in sorted(directories):
            self._stop_mps(directory)
        failures: list[str] = []
        reset: set[str] = set()
        for s in shared:
            uuid = s.get("gpuUuid")
            if s.get("strategy") != "TimeSlicing" or not isinstance(uuid, str) or uuid in reset:
                continue
            reset.add(uuid)
            try:
                self._set_timeslice(uuid, 0, gone_is_fine=True)
            except SharingError as e:
                if s.get("applied"):
                    failures.append(str(e))
                else:  # never confirmed: most likely the set itself failed
                    log.warning("claim %s: %s (the time slice was never confirmed set)", claim_uid, e)
        if failures:
            raise SharingError("; ".join(failures))

    def _stop_mps(self, directory: Path) -> None:
        if not directory.exists():
            return
        if (directory / "pipe").is_dir():
            result = self._mps_run([self.mps_control], self._mps_env(directory), "quit\n")
            if result.returncode != 0:  # not running (never started, or died): the directory still goes
                log.warning(
                    "stopping MPS control daemon in %s: exit %d: %s",
                    directory,
                    result.returncode,
                    (result.stderr or result.stdout).strip(),
                )
        shutil.rmtree(directory)

    def remove_orphans(self, keep: set[str]) -> None:
        """At start: stop and remove MPS directories of claims not in `keep` (the checkpoint's claims)."""
        root = self.plugin_dir / "mps"
        if not root.is_dir():
            return
        for directory in sorted(root.iterdir()):
            if directory.is_dir() and directory.name not in keep:
                log.warning("removing MPS directory %s: no prepared claim owns it", directory)
                self._stop_mps(directory)


def with_edits(spec: CdiSpec, edits: ContainerEdits | None) -> CdiSpec:
    """The claim's spec with sharing's container edits added to its spec-level edits (they concern every
    container that gets a device of the claim, and must not be repeated per device)."""
    if edits is None:
        return spec
    base = spec.container_edits or ContainerEdits()
    merged = base.model_copy(
        update={
            "env": (base.env or []) + (edits.env or []) or None,
            "mounts": (base.mounts or []) + (edits.mounts or []) or None,
        }
    )
    return spec.model_copy(update={"container_edits": merged})
