"""Applying and undoing a claim's sharing settings, crash-safe through the plugin's checkpoint.

Each change is recorded in the checkpoint (the device's `sharing` record, `applied: false`) *before* it is made
and marked `applied: true` after, so a crash at any point leaves a record that `undo` acts on:

- TimeSlicing, whole GPUs only (a MIG device takes no interval): compute mode DEFAULT, then
  `nvidia-smi compute-policy -i <uuid> --set-timeslice <0..3>` (Default/Short/Medium/Long), as NVIDIA's plugin
  does; undone by interval 0 and the compute mode found.
- MPS: one control daemon per claim, in `<plugin dir>/mps/<claim uid>/{pipe,log,shm}` with a tmpfs on shm
  (tmpfs.py), run by a launcher (mps_launch.py): a pod of its own that outlives the plugin (mps_deployment.py), or
  the plugin's child. Its whole GPUs get compute mode EXCLUSIVE_PROCESS before it starts and the mode found back
  after it stops; a MIG device's GPU keeps its mode, as in NVIDIA's plugin (the mode of a GPU is that of every MIG
  device on it, other claims' included). Undone in reverse: daemon stopped (and gone), tmpfs unmounted, directory
  removed, compute mode restored; a daemon that does not stop fails the unprepare, which the kubelet retries.

The compute mode found is read (`nvidia-smi --query-gpu=compute_mode`) before anything changes and recorded with
the intent; a claim joining a GPU that another claim set up records the mode that claim found. Claims sharing a
whole GPU never overwrite or undo each other's settings (conflicts.py): the caller passes the checkpoint's other
claims. Devices prepared with admin access share a device another claim prepared: they are never share-checked, set
nothing and undo nothing (the plugin refuses an admin device whose config asks for sharing: docs/admin-access.md).

The records are the checkpoint's typed TimeSlicingRecord and MpsRecord, written through the claim's ClaimRecord
as the step table says (claimstate.steps: APPLY_SHARING, UNDO_SHARING). Every command and daemon wait ends at the
call's deadline (CallContext).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dra_driver.cdi.spec import CdiSpec, ContainerEdits
from dra_driver.claimstate.checkpoint import ClaimEntry, MpsRecord, SharingRecord, TimeSlicingRecord
from dra_driver.claimstate.config import ConfigError, GpuConfig, MigDeviceConfig, MpsConfig, pinned_limit_mib
from dra_driver.claimstate.context import NO_DEADLINE, CallContext
from dra_driver.claimstate.steps import APPLY_SHARING, UNDO_SHARING, ClaimRecord
from dra_driver.sharing import conflicts, tmpfs
from dra_driver.sharing.conflicts import TIME_SLICE, Wanted
from dra_driver.sharing.mps_control_daemon import MpsSettings
from dra_driver.sharing.mps_launch import LocalMps, MpsLauncher, container_edits
from dra_driver.sharing.nvsmi import COMPUTE_MODES, DEFAULT, EXCLUSIVE_PROCESS, NvidiaSmi, SharingError
from dra_driver.sharing.runner import DEFAULT_TIMEOUT_S, CommandRunner, DriverRootRunner, RealRunner
from dra_driver.sharing.tmpfs import ShmMounter, TmpfsError

log = logging.getLogger(__name__)

Config = GpuConfig | MigDeviceConfig
_MODE_SET_BY = {"TimeSlicing": DEFAULT, "MPS": EXCLUSIVE_PROCESS}
MPS_STOP_TIMEOUT_S = 40.0  # an unprepare's wait for a daemon to go (the kubelet retries a failed unprepare)


@dataclass(frozen=True)
class Target:
    """One prepared device: its index in the claim's entry (whose `sharing` record it gets), name, admin access,
    config, and GPU or MIG UUID."""

    index: int
    device: str
    admin_access: bool
    config: Config | None
    uuid: str
    is_mig: bool


def _strategy(config: Config | None) -> str | None:
    return config.sharing.strategy if config is not None and config.sharing is not None else None


def _interval(config: Config | None) -> int:
    ts = config.sharing.time_slicing_config if config is not None and config.sharing is not None else None
    return TIME_SLICE[ts.interval if ts is not None else "Default"]


class SharingManager:
    def __init__(
        self,
        runner: CommandRunner,
        plugin_dir: Path,
        *,
        mps: MpsLauncher | None = None,
        shm: ShmMounter | None = None,
    ) -> None:
        """`runner` runs the driver's tools by name (nvidia-smi, nvidia-cuda-mps-control): normally a
        DriverRootRunner; tests may wrap it to record or fail calls. `mps`: who runs MPS daemons (None: LocalMps,
        the plugin's children); `shm`: mounts the tmpfs on MPS shm directories (None: plain directories)."""
        self.runner = runner
        self.plugin_dir = plugin_dir
        self.smi = NvidiaSmi(runner)
        self.mps: MpsLauncher = mps if mps is not None else LocalMps(runner)
        self.shm = shm
        # the node's MPS defaults (its node configuration): what a claim's MPS config leaves out
        self.mps_defaults: MpsConfig | None = None

    @classmethod
    def at_driver_root(
        cls,
        driver_root: Path,
        plugin_dir: Path,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        mps: MpsLauncher | None = None,
        shm: ShmMounter | None = None,
    ) -> SharingManager:
        """The tools of the driver root (the host's, where the chart mounts it; the simulator's)."""
        return cls(DriverRootRunner(driver_root, RealRunner(timeout_s)), plugin_dir, mps=mps, shm=shm)

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
            # numbers' ranges were checked when the config was decoded
            percentages.setdefault(self._percentage(config.sharing.mps_config), name)
        if len(percentages) > 1:
            raise ConfigError(
                "the MPS devices of one claim share one control daemon and need the same "
                f"defaultActiveThreadPercentage (devices {', '.join(sorted(percentages.values()))} differ)"
            )

    # ----- apply ----------------------------------------------------------------------------------------------
    def apply(
        self, claim: ClaimRecord, targets: list[Target], others: Iterable[ClaimEntry], call: CallContext = NO_DEADLINE
    ) -> ContainerEdits | None:
        """Apply the claim's sharing, recording it in `claim` (APPLY_SHARING); returns the container edits the
        claim's CDI spec needs (None: none). `others`: the checkpoint's other claims (SharingConflict, before any
        change, when they are in the way)."""
        held = list(others)
        live = [t for t in targets if not t.admin_access]
        slices = [t for t in live if _strategy(t.config) == "TimeSlicing" and not t.is_mig]
        mps = [t for t in live if _strategy(t.config) == "MPS"]
        whole = [t for t in live if not t.is_mig]
        conflicts.check([Wanted(t.device, t.uuid, _strategy(t.config), _interval(t.config)) for t in whole], held)
        if not slices and not mps:
            return None
        mps_gpus = [t for t in mps if not t.is_mig]
        found = {
            t.uuid: conflicts.found_mode(t.uuid, held) or self.smi.compute_mode(t.uuid, call) for t in slices + mps_gpus
        }
        directory = self.mps_dir(claim.entry.uid)
        intents: dict[int, SharingRecord] = {}
        for t in slices:
            intents[t.index] = TimeSlicingRecord(
                gpu_uuid=t.uuid, interval=_interval(t.config), compute_mode=found[t.uuid]
            )
        for t in mps:
            whole_gpu = None if t.is_mig else t.uuid
            intents[t.index] = MpsRecord(
                dir=str(directory),
                uuid=t.uuid,
                gpu_uuid=whole_gpu,
                compute_mode=found.get(t.uuid) if whole_gpu else None,
            )
        entry = claim.entry
        for index, record in intents.items():
            entry = entry.with_device(index, sharing=record)
        claim.record(APPLY_SHARING, "intent", entry)  # intents first: from here on undo knows what may be set
        for t in slices:
            if found[t.uuid] != DEFAULT:
                self.smi.set_compute_mode(t.uuid, DEFAULT, call)
            self.smi.set_timeslice(t.uuid, _interval(t.config), call)
        for t in mps_gpus:
            if found[t.uuid] != EXCLUSIVE_PROCESS:
                self.smi.set_compute_mode(t.uuid, EXCLUSIVE_PROCESS, call)
        edits = self._start_mps(claim.entry.uid, directory, mps, call) if mps else None
        APPLY_SHARING.at("done")
        entry = claim.entry
        for index, record in intents.items():
            entry = entry.with_device(index, sharing=record.model_copy(update={"applied": True}))
        claim.record(APPLY_SHARING, "recorded", entry)
        return edits

    def _start_mps(self, claim_uid: str, directory: Path, targets: list[Target], call: CallContext) -> ContainerEdits:
        for sub in ("pipe", "log", "shm"):
            (directory / sub).mkdir(parents=True, exist_ok=True)
        if self.shm is not None:
            try:
                self.shm.mount(directory / "shm")
            except TmpfsError as e:
                raise SharingError(f"MPS shm of claim {claim_uid}: {e}") from e
        self.mps.start(claim_uid, directory, [t.uuid for t in targets], self._mps_settings(targets), call.deadline)
        return container_edits(directory)

    def _percentage(self, mps: MpsConfig | None) -> int | None:
        if mps is not None and mps.default_active_thread_percentage is not None:
            return mps.default_active_thread_percentage
        return self.mps_defaults.default_active_thread_percentage if self.mps_defaults else None

    def _pinned_limit(self, mps: MpsConfig | None) -> str | None:
        if mps is not None and mps.default_pinned_device_memory_limit is not None:
            return mps.default_pinned_device_memory_limit
        return self.mps_defaults.default_pinned_device_memory_limit if self.mps_defaults else None

    def _mps_settings(self, targets: list[Target]) -> MpsSettings:
        """The claim's MPS settings, each one the node's default where the claim leaves it out."""
        first = targets[0].config
        assert first is not None and first.sharing is not None
        percentage = self._percentage(first.sharing.mps_config)
        limits: list[tuple[int, str]] = []
        for index, t in enumerate(targets):  # device indices as the daemon sees them: CUDA_VISIBLE_DEVICES order
            assert t.config is not None and t.config.sharing is not None
            limit = self._pinned_limit(t.config.sharing.mps_config)
            if limit is not None:
                limits.append((index, f"{pinned_limit_mib(limit)}M"))
        return MpsSettings(percentage, tuple(limits))

    # ----- undo -----------------------------------------------------------------------------------------------
    def undo(self, claim: ClaimRecord, others: Iterable[ClaimEntry], call: CallContext = NO_DEADLINE) -> None:
        """Undo whatever the claim's records say was (or may have been) applied, then clear them (UNDO_SHARING):
        stop the MPS daemon and remove its directory, then reset time slices and compute modes, except on GPUs where
        one of `others` (the checkpoint's other claims) holds a setting too. Safe to repeat. Raises SharingError
        when a setting that was applied cannot be undone (the unprepare fails and the kubelet retries)."""
        held = list(others)
        uid = claim.entry.uid
        shared = [d.sharing for d in claim.entry.devices if d.sharing is not None]
        if not shared:
            return
        directories = {Path(s.dir) for s in shared if isinstance(s, MpsRecord) and s.dir}
        for directory in sorted(directories):  # a failure here leaves the compute modes to the retried unprepare
            self._stop_mps(uid, directory, call)
        failures: list[str] = []
        done: set[str] = set()
        for s in shared:
            gpu = s.gpu_uuid
            if gpu is None or gpu in done:
                continue
            done.add(gpu)
            holders = conflicts.holders(gpu, held)
            if holders:
                log.info("claim %s: GPU %s keeps its settings, claim %s holds them too", uid, gpu, holders[0].claim)
                continue
            try:
                self._restore(gpu, s, call)
            except SharingError as e:
                if s.applied:
                    failures.append(str(e))
                else:  # never confirmed: most likely applying it failed
                    log.warning("claim %s: %s (the setting was never confirmed applied)", uid, e)
        if failures:
            raise SharingError("; ".join(failures))
        UNDO_SHARING.at("done")
        claim.record(UNDO_SHARING, "recorded", claim.entry.with_devices(sharing=None))

    def _restore(self, gpu: str, record: SharingRecord, call: CallContext) -> None:
        if isinstance(record, TimeSlicingRecord):
            self.smi.set_timeslice(gpu, 0, call, gone_is_fine=True)
        found = record.compute_mode
        if found in COMPUTE_MODES and found != _MODE_SET_BY[record.strategy]:
            self.smi.set_compute_mode(gpu, found, call, gone_is_fine=True)

    def _stop_mps(self, claim_uid: str, directory: Path, call: CallContext = NO_DEADLINE) -> None:
        """Stop the claim's daemon (it is gone when this returns), unmount the shm tmpfs, remove the directory."""
        self.mps.stop(claim_uid, directory, call.deadline_within(MPS_STOP_TIMEOUT_S))
        try:
            tmpfs.unmount(directory / "shm")  # mounted or not, whatever was recorded: mountinfo says
        except TmpfsError as e:
            raise SharingError(f"MPS shm of claim {claim_uid}: {e}") from e
        if directory.exists():
            shutil.rmtree(directory)

    def remove_orphans(self, keep: set[str]) -> None:
        """At start: stop the MPS daemons and remove the directories of claims not in `keep` (the checkpoint's
        claims). A daemon that cannot be stopped now is logged: it is tried again at the next start."""
        root = self.plugin_dir / "mps"
        found = {d.name for d in root.iterdir() if d.is_dir()} if root.is_dir() else set()
        try:
            found |= set(self.mps.list())
        except SharingError as e:  # the API server is down: the daemons of the directories are still tried
            log.error("listing MPS control daemons: %s", e)
        for uid in sorted(found - keep):
            if (root / uid).parent != root or uid in (".", ".."):  # not a claim's directory name
                continue
            log.warning("stopping the MPS control daemon of claim %s and removing its directory: no prepared "
                        "claim owns it", uid)  # fmt: skip
            try:
                self._stop_mps(uid, root / uid)
            except (SharingError, OSError) as e:
                log.error("removing the MPS control daemon of claim %s: %s", uid, e)


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
