"""Preparing and unpreparing claims on this node: the ClaimPreparer behind the kubelet gRPC services.

Order of a prepare, chosen so that a crash at any step leaves nothing that the next start cannot find and
undo: validate everything (no change yet) -> checkpoint PrepareStarted -> carve MIG devices, recording each
in the checkpoint as soon as it exists -> apply sharing (time-slicing, MPS; recorded before and after) -> write
the CDI spec -> checkpoint PrepareCompleted. Unprepare, a failed prepare and start-up recovery walk the same steps
backwards from UnprepareStarted, destroying a MIG device only after checking it is still the one recorded (GPU
instance ids are reused). A PrepareCompleted claim whose MIG device or CDI spec is gone is undone and prepared
again, never answered as prepared. Each step is a named crash point (`crashpoints`) for the kill tests.
Device changes are serialised by an in-process lock and a node-wide file lock (`<plugin dir>/pu.lock`, 0600), so
two plugin processes (a rolling update) exclude each other. A prepare or unprepare waits for them only until the
kubelet's deadline; start-up reads the checkpoint and recovers under them too, and when another process holds them
too long it serves anyway and leaves that to the first to get them (a background retry, or a prepare or unprepare).
Only what reads or changes the node's device state (checkpoint, MIG, sharing, CDI files) runs under it: API reads,
CEL selector re-checks, config resolution and a GPU's device nodes (`_check`: the claim, its classes, the catalog
and /proc/devices) run before it, in parallel with other prepares. The checkpoint records a claim when the driver
puts it, after each of its steps (`Checkpoint.put`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import pynvml

from dra_driver.api.claim import ResourceClaim
from dra_driver.api.deviceclass import DeviceClass
from dra_driver.cdi.devnodes import CharDevice, DevNodeError, gpu_nodes, mig_cap_nodes
from dra_driver.cdi.driverfiles import common_edits, discover_driver_files
from dra_driver.cdi.spec import ContainerEdits, cdi_device_id, claim_spec
from dra_driver.cdi.store import CdiStore
from dra_driver.claimstate import crashpoints
from dra_driver.claimstate.checkpoint import Checkpoint, CheckpointedDevice, ClaimEntry, ClaimState
from dra_driver.claimstate.config import ConfigError, GpuConfig, MigDeviceConfig, resolve
from dra_driver.claimstate.deadline import DEADLINE_MARGIN_S, time_left
from dra_driver.kube.rest import ApiError
from dra_driver.nvml.api import NvmlLibrary
from dra_driver.nvml.discovery import discover
from dra_driver.nvml.inventory import Inventory, MigInstance
from dra_driver.nvml.mig import (
    LiveMig,
    MigError,
    create_mig_device,
    destroy_at,
    destroy_gpu_instance,
    destroy_mig_device,
    disable_mig_if_unused,
    find_mig_device,
    list_gpu_instances,
    mig_enabled,
)
from dra_driver.plugin import features
from dra_driver.plugin.catalog import CatalogEntry, build_catalog, conflicts
from dra_driver.plugin.claims import ClaimSource, read_timeout
from dra_driver.plugin.failures import ClaimFailure, FailureKind
from dra_driver.plugin.selectors import SelectorCheck, check_selectors
from dra_driver.plugin.types import ClaimRef, PreparedDevice, PrepareResult
from dra_driver.sharing import (
    CommandRunner,
    DriverRootRunner,
    SharingError,
    SharingManager,
    Target,
    default_runner,
    with_edits,
)
from dra_driver.sharing.mps_launch import MpsLauncher
from dra_driver.sharing.tmpfs import ShmMounter
from dra_driver.slices.devices import DEFAULT_MODE, PublishMode

log = logging.getLogger(__name__)


class PrepareError(RuntimeError):
    """A claim cannot be prepared; nothing was changed for it."""

    def __init__(self, kind: FailureKind, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.failure = ClaimFailure.of(kind, message, retryable=retryable)


class LockTimeout(PrepareError):
    """The node's device lock could not be had before the caller's deadline; nothing was changed."""

    def __init__(self, message: str) -> None:
        super().__init__(FailureKind.LOCK_TIMEOUT, message)


# What the errors of the steps of a prepare or unprepare stand for (PrepareError names its own kind)
_ERROR_KINDS: tuple[tuple[type[Exception], FailureKind], ...] = (
    (ConfigError, FailureKind.INVALID_CONFIG),
    (DevNodeError, FailureKind.CDI),
    (MigError, FailureKind.MIG),
    (SharingError, FailureKind.SHARING),
    (OSError, FailureKind.IO),
)
_UNEXPECTED = frozenset({FailureKind.NVML, FailureKind.INTERNAL})  # logged as errors, with their traceback


def _failure(e: Exception) -> ClaimFailure:
    """The failure of a claim that `e` ended."""
    if isinstance(e, PrepareError):
        return e.failure
    if isinstance(e, MigError) and e.code == pynvml.NVML_ERROR_GPU_IS_LOST:  # off the bus: back only after a reset
        return ClaimFailure.of(FailureKind.MIG, str(e), retryable=False)
    for error, kind in _ERROR_KINDS:
        if isinstance(e, error):
            return ClaimFailure.of(kind, str(e))
    kind = FailureKind.NVML if isinstance(e, pynvml.NVMLError) else FailureKind.INTERNAL
    return ClaimFailure.of(kind, f"{type(e).__name__}: {e}")


def _read_failure(message: str, e: Exception) -> ClaimFailure:
    """A failed read of a claim or device class: gone (a retry cannot help), or the API server did not answer."""
    gone = isinstance(e, LookupError) or (isinstance(e, ApiError) and e.status == 404)
    return ClaimFailure.of(FailureKind.NOT_FOUND if gone else FailureKind.API_UNAVAILABLE, message)


def _failed(verb: str, ref: ClaimRef, failure: ClaimFailure, error: Exception | None = None) -> ClaimFailure:
    """Log a claim's failure with its kind (the traceback of an unexpected one); returns it."""
    unexpected = failure.kind in _UNEXPECTED
    log.log(
        logging.ERROR if unexpected else logging.WARNING,
        "%s %s/%s (%s) failed %s: %s",
        verb,
        ref.namespace,
        ref.name,
        ref.uid,
        failure.describe(),
        failure.message,
        exc_info=error if unexpected else None,
    )
    return failure


# How long start-up waits for the node's device lock before it serves without it: recovery then runs in the
# background, or in the first prepare or unprepare that gets the lock (another process may hold it for long)
STARTUP_LOCK_WAIT_S = 10.0
_RECOVERY_RETRY_S = 1.0


def _flock(fd: int, deadline: float | None) -> None:
    """Exclusive flock, polled so that the wait ends at `deadline` (another process may hold it for long)."""
    if deadline is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time_left(deadline) <= 0:
                raise LockTimeout(
                    "deadline exceeded waiting for the node's device lock (held by another plugin process)"
                ) from None
            time.sleep(0.01)


def _late(deadline: float | None) -> bool:
    """Whether the wait for the locks used up the time: an answer after the work would come too late."""
    return deadline is not None and time_left(deadline) <= 0


def _late_failure(ref: ClaimRef, done: str) -> ClaimFailure:
    return ClaimFailure.of(
        FailureKind.DEADLINE,
        f"deadline exceeded before claim {ref.namespace}/{ref.name} could be {done}; nothing was changed",
    )


@dataclass(frozen=True)
class PluginSettings:
    driver: str
    pool: str  # the node name
    plugin_dir: Path
    cdi_root: Path
    mode: PublishMode = DEFAULT_MODE
    feature_gates: Mapping[str, bool] = field(default_factory=lambda: dict(features.DEFAULTS))
    # NVIDIA's `nvidia-cdi-hook` (or `nvidia-ctk`) on the host: CDI specs then carry its update-ldcache and
    # create-symlinks hooks instead of a bind mount per library link (cdi.driverfiles.common_edits)
    cdi_hook_path: str | None = None


@dataclass(frozen=True)
class _Checked:
    """A result of this driver that passed every check needing no device lock (`Driver._check`); `Driver._plan`
    checks it against the other claims under the lock."""

    request: str
    entry: CatalogEntry
    admin_access: bool
    config: GpuConfig | MigDeviceConfig | None  # sharing
    share_id: str | None  # set for devices several claims hold at once (consumable capacity)
    nodes: list[CharDevice]  # the GPU's device nodes (a MIG device's capability nodes are known once it exists)


class Driver:
    def __init__(
        self,
        settings: PluginSettings,
        lib: NvmlLibrary,
        claims: ClaimSource,
        *,
        sysfs_root: Path,
        proc_root: Path,
        boot_id: str,
        sharing_runner: CommandRunner | None = None,  # None: the runner matching `lib` (sharing.default_runner)
        driver_root: Path | None = None,  # the driver's files as this process reads them; None: CDI specs without
        host_driver_root: Path | None = None,  # the same directory as the host sees it (default: driver_root)
        mps_launcher: MpsLauncher | None = None,  # None: MPS daemons as this process's children (LocalMps)
        shm: ShmMounter | None = None,  # the tmpfs on MPS shm directories; None: plain directories
        startup_lock_wait_s: float = STARTUP_LOCK_WAIT_S,
    ) -> None:
        self.settings = settings
        self.lib = lib
        self.claims = claims
        self.proc_root = proc_root
        self.inventory = discover(lib, sysfs_root)
        self.catalog = build_catalog(self.inventory, settings.mode)
        self.driver_root = driver_root
        self.host_driver_root = host_driver_root or driver_root
        self.driver_edits = self._driver_edits(self.inventory)
        self.cdi = CdiStore(settings.cdi_root, settings.driver)
        settings.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._thread_lock = threading.Lock()
        self.calls = 0  # prepares and unprepares so far (the daemon trims memory once they stop)
        self._lock_path = settings.plugin_dir / "pu.lock"
        self._boot_id = boot_id
        # nvidia-smi and the MPS control daemon from the driver root, as NVIDIA's driver runs them
        runner = sharing_runner or (DriverRootRunner(driver_root) if driver_root is not None else default_runner(lib))
        self.sharing = SharingManager(runner, settings.plugin_dir, mps=mps_launcher, shm=shm)
        self.lib.nvmlInit()  # one long-lived NVML session: handle lookups stay cheap
        # read, and start-up recovery run, by whoever takes the node lock first (`_locked`)
        self.checkpoint = Checkpoint(settings.plugin_dir / "checkpoint.json", boot_id, load=False)
        self._recovered = False
        self._closed = threading.Event()
        try:
            with self._locked(time.monotonic() + DEADLINE_MARGIN_S + startup_lock_wait_s):
                pass
        except LockTimeout:
            log.warning(
                "the node's device lock %s is held by another process for more than %g s: serving without start-up "
                "recovery for now; it runs once the lock is free, before any prepare or unprepare",
                self._lock_path,
                startup_lock_wait_s,
            )
            threading.Thread(target=self._recover_when_free, name="start-up-recovery", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self.lib.nvmlShutdown()

    @property
    def recovered(self) -> bool:
        """Whether start-up recovery has run (it waits for the node's device lock)."""
        return self._recovered

    def _recover_when_free(self) -> None:
        while not self._closed.is_set():
            try:
                with self._locked(time.monotonic() + DEADLINE_MARGIN_S + _RECOVERY_RETRY_S):
                    log.info("start-up recovery done: the node's device lock was free again")
                return
            except LockTimeout:
                continue
            except Exception:  # retried by the next prepare or unprepare, which report it
                log.exception("start-up recovery failed")
                return

    def refresh_inventory(self, inventory: Inventory) -> bool:
        """Adopt a new discovery; True when the devices this node publishes changed (MIG instances that the
        driver itself carves do not count: they are not published)."""
        catalog = build_catalog(inventory, self.settings.mode)
        # a driver upgrade under a running plugin: the next claims get the new version's files
        edits = self._driver_edits(inventory) if inventory.driver_version != self.inventory.driver_version else None
        with self._thread_lock:
            changed = {n: e.device_json for n, e in catalog.items()} != {
                n: e.device_json for n, e in self.catalog.items()
            }
            self.inventory, self.catalog = inventory, catalog
            if edits is not None:
                self.driver_edits = edits
        return changed

    def reconfigure(self, mode: PublishMode, *, shared_changes: bool, deadline: float | None = None) -> list[str]:
        """Serve `mode` from now on, unless a prepared claim holds a device that `mode` would not publish the same
        way: gone, held alone where it was shared or the other way round, a MIG partition the driver carved, or
        (`shared_changes`) any shared device, whose sharing terms change. Returns those claims, as
        `namespace/name: device`; nothing changed then."""
        catalog = build_catalog(self.inventory, mode)
        with self._locked(deadline):
            blockers = []
            for entry in self.checkpoint.claims.values():
                for d in entry.devices:
                    old, new = self.catalog.get(d.device), catalog.get(d.device)
                    if d.released or d.admin_access or old is None:
                        continue
                    carved = d.mig is not None and mode is not self.settings.mode  # its undo depends on the mode
                    if (
                        carved
                        or new is None
                        or new.multiple_allocations != old.multiple_allocations
                        or (shared_changes and old.multiple_allocations)
                    ):
                        blockers.append(f"{entry.namespace}/{entry.name}: {d.device}")
            if not blockers:
                self.settings = replace(self.settings, mode=mode)
                self.catalog = catalog
        return blockers

    def _driver_edits(self, inventory: Inventory) -> ContainerEdits | None:
        """The driver's libraries, binaries, firmware and sockets for every claim's CDI spec (found once per
        driver version: 20-70 ms)."""
        if self.driver_root is None or self.host_driver_root is None:
            return None
        files = discover_driver_files(self.driver_root, inventory.driver_version)
        return common_edits(files, self.host_driver_root, hook_path=self.settings.cdi_hook_path)

    def _others(self, uid: str) -> list[ClaimEntry]:
        """The checkpoint's other claims (called under the device locks): who else holds a shared GPU."""
        return [e for e in self.checkpoint.claims.values() if e.uid != uid]

    @contextmanager
    def _locked(self, deadline: float | None = None) -> Iterator[None]:
        """Both device locks; with a `deadline` (time.monotonic()), LockTimeout instead of waiting past it."""
        # 0600: anyone who can open the lock file can take it and stall every prepare on the node.
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if not self._thread_lock.acquire(timeout=-1 if deadline is None else max(0.0, time_left(deadline))):
                raise LockTimeout("deadline exceeded waiting for another prepare or unprepare on this node")
            try:
                _flock(fd, deadline)
                try:
                    # Another process (the other pod of a rolling update) may have changed the checkpoint.
                    self.checkpoint.refresh()
                    if not self._recovered:
                        self._recover()
                        self._recovered = True
                    yield
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                self._thread_lock.release()
        finally:
            os.close(fd)  # after the locks: one system call less while other prepares wait for them

    # ----- prepare ----------------------------------------------------------------------------------------
    def prepare(self, claims: list[ClaimRef], deadline: float | None = None) -> dict[str, PrepareResult]:
        """`deadline`: when the caller (the kubelet) gives up, a time.monotonic() value; a claim that cannot be
        read or prepared before then gets an error instead (the kubelet retries it)."""
        self.calls += 1
        fetched: dict[str, ResourceClaim | ClaimFailure] = {}
        classes: dict[str, DeviceClass | ClaimFailure] = {}
        for ref in claims:  # API reads outside the device lock
            fetched[ref.uid] = self._fetch(ref, classes, deadline)
        return {ref.uid: self._prepare_one(ref, fetched[ref.uid], classes, deadline) for ref in claims}

    def _prepare_one(
        self,
        ref: ClaimRef,
        got: ResourceClaim | ClaimFailure,
        classes: dict[str, DeviceClass | ClaimFailure],
        deadline: float | None,
    ) -> PrepareResult:
        if isinstance(got, ClaimFailure):
            return PrepareResult(failure=_failed("prepare", ref, got))
        try:
            checked: list[_Checked] | ClaimFailure
            try:  # CEL, configs and device nodes outside the lock: other prepares go on meanwhile
                checked = self._check(got, classes)
            except (PrepareError, ConfigError, DevNodeError) as e:  # answered under the lock, unless the claim is
                checked = _failure(e)  # prepared already
            with self._locked(deadline):
                if _late(deadline):
                    return PrepareResult(failure=_failed("prepare", ref, _late_failure(ref, "prepared")))
                devices = self._prepare_claim(ref, checked, deadline)
        except Exception as e:  # whatever it is (an NVML error of a lost GPU, a bug): this claim's failure only
            return PrepareResult(failure=_failed("prepare", ref, _failure(e), e))
        if isinstance(devices, ClaimFailure):
            return PrepareResult(failure=_failed("prepare", ref, devices))
        return PrepareResult(devices=devices)

    def _fetch(
        self, ref: ClaimRef, classes: dict[str, DeviceClass | ClaimFailure], deadline: float | None = None
    ) -> ResourceClaim | ClaimFailure:
        what = f"claim {ref.namespace}/{ref.name}"
        timeout = read_timeout(deadline)
        if timeout <= 0:
            return ClaimFailure.of(
                FailureKind.DEADLINE, f"deadline exceeded before {what} could be read from the API server"
            )
        try:
            claim = self.claims.get_claim(ref.namespace, ref.name, timeout=timeout)
        except Exception as e:  # the API server is down or too slow, the claim is gone, ...
            return _read_failure(f"retrieve {what}: {e}", e)
        if claim.metadata.uid != ref.uid:
            return ClaimFailure.of(
                FailureKind.CLAIM_CHANGED, f"{what} got replaced (uid {claim.metadata.uid}, expected {ref.uid})"
            )
        if claim.status.allocation is None:
            return ClaimFailure.of(FailureKind.CLAIM_CHANGED, f"{what} not allocated")
        for result in claim.status.allocation.devices.results:
            if result.driver != self.settings.driver:
                continue
            try:
                class_name, _ = claim.request_class_and_selectors(result.request)
            except KeyError as e:
                return ClaimFailure.of(FailureKind.CLAIM_CHANGED, str(e.args[0]))
            if class_name not in classes:
                timeout = read_timeout(deadline)
                if timeout <= 0:
                    return ClaimFailure.of(
                        FailureKind.DEADLINE,
                        f"deadline exceeded before device class {class_name} could be read from the API server",
                    )
                try:
                    classes[class_name] = self.claims.get_device_class(class_name, timeout=timeout)
                except Exception as e:
                    classes[class_name] = _read_failure(f"retrieve device class {class_name}: {e}", e)
        return claim

    def _prepare_claim(
        self, ref: ClaimRef, checked: list[_Checked] | ClaimFailure, deadline: float | None = None
    ) -> list[PreparedDevice] | ClaimFailure:
        existing = self.checkpoint.claims.get(ref.uid)
        if existing is not None and existing.state is ClaimState.PREPARE_COMPLETED:
            lost = self._lost(existing)
            if lost is None:
                return self._answer(existing)  # idempotent: same answer, no work
            log.warning("claim %s was prepared, but %s: preparing it again", ref.uid, lost)
        if existing is not None:
            log.info("claim %s is not (or no longer) fully prepared; undoing what is left first", ref.uid)
            self._teardown(existing)
        if isinstance(checked, ClaimFailure):  # e.g. its class changed since: only a prepared claim is answered
            return checked
        planned = self._plan(checked)  # raises before anything changes
        if not planned:  # allocated only to other drivers: nothing to record, no (empty, invalid) CDI spec
            return []
        entry = ClaimEntry(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            state=ClaimState.PREPARE_STARTED,
            devices=[
                CheckpointedDevice(
                    requests=[p.request.split("/", 1)[0]],
                    pool=self.settings.pool,
                    device=p.entry.name,
                    cdi_device_ids=[cdi_device_id(self.settings.driver, ref.uid, p.entry.name)],
                    admin_access=p.admin_access,
                    share_id=p.share_id,
                )
                for p in planned
            ],
        )
        if not all(p.entry.profile is None and (p.config is None or p.config.sharing is None) for p in planned):
            # MIG devices to carve or sharing to set up: recorded before the node changes. A claim of whole GPUs
            # without sharing changes nothing but its CDI spec, which PrepareCompleted records once it is written
            # (a crash before leaves a spec no claim owns, which start-up removes): one checkpoint write, not two.
            self.checkpoint.put(entry)
            crashpoints.reached("prepare.started-recorded")
        try:
            nodes: dict[str, list[CharDevice]] = {}
            uuids: list[str] = []
            for p, record in zip(planned, entry.devices, strict=True):
                gpu = p.entry.gpu
                if p.entry.profile is None:
                    self._ensure_whole_gpu(p.entry)
                    nodes[record.device] = p.nodes
                    uuids.append(gpu.uuid)
                    continue
                admins = self._existing_mig(p.entry)
                if admins is not None:  # an admin's MIG device (static, shared): used as it is, never destroyed
                    cap_nodes = mig_cap_nodes(
                        self.proc_root, gpu.minor, admins.gpu_instance_id, admins.compute_instance_id
                    )
                    nodes[record.device] = p.nodes + cap_nodes
                    uuids.append(admins.uuid)
                    continue
                live = self._mig_for(p, ref.uid)
                crashpoints.reached("prepare.mig-created")
                record.mig = live
                self.checkpoint.put(entry)  # the instance exists: record it before anything else can fail
                crashpoints.reached("prepare.mig-recorded")
                nodes[record.device] = p.nodes + mig_cap_nodes(self.proc_root, gpu.minor, live.gi_id, live.ci_id)
                uuids.append(live.uuid)
            targets = [
                Target(record, p.config, uuid, p.entry.profile is not None)
                for p, record, uuid in zip(planned, entry.devices, uuids, strict=True)
            ]
            # recorded in the checkpoint; the other claims' records say who else holds a shared GPU's settings
            edits = self.sharing.apply(
                ref.uid, targets, lambda: self.checkpoint.put(entry), self._others(ref.uid), deadline=deadline
            )
            spec = claim_spec(self.settings.driver, ref.uid, nodes, uuids, common=self.driver_edits)
            self.cdi.write(ref.uid, with_edits(spec, edits))
            crashpoints.reached("prepare.cdi-written")
            entry.state = ClaimState.PREPARE_COMPLETED
            self.checkpoint.put(entry)
            crashpoints.reached("prepare.completed-recorded")
        except Exception as failure:
            try:
                self._teardown(entry)
            except Exception as undo:
                log.error("claim %s: undoing the failed prepare failed too: %s", ref.uid, undo)
                first = _failure(failure)  # what failed the prepare names the kind, not the undo
                raise PrepareError(
                    first.kind,
                    f"{failure}; undoing the prepare failed too ({undo}); it is retried on the next prepare or "
                    "unprepare of this claim",
                    retryable=first.retryable,
                ) from failure
            raise
        return self._answer(entry)

    def _check(
        self, claim: ResourceClaim, classes: dict[str, DeviceClass | ClaimFailure]
    ) -> list[_Checked] | ClaimFailure:
        """This driver's results, checked against what needs no device lock: pool, catalog, class and claim
        selectors, configs and feature gates. Raises (or returns the failure of a class read) before anything
        changes."""
        assert claim.status.allocation is not None
        allocation = claim.status.allocation.devices
        catalog = self.catalog  # one snapshot: refresh_inventory replaces it whole
        checked: list[_Checked] = []
        for result in allocation.results:
            if result.driver != self.settings.driver:
                continue
            if result.pool != self.settings.pool:
                raise PrepareError(
                    FailureKind.DEVICE_UNKNOWN,
                    f"device {result.device} is allocated from pool {result.pool}, not this node's",
                )
            entry = catalog.get(result.device)
            if entry is None:
                raise PrepareError(
                    FailureKind.DEVICE_UNKNOWN,
                    f"device {result.device} is not a device of this node (pool {result.pool})",
                )
            admin = bool(result.admin_access)
            for c in checked:  # the claim's own devices; other claims' are checked under the lock (_plan)
                if not admin and not c.admin_access and conflicts(entry, c.entry):
                    raise PrepareError(
                        FailureKind.DEVICE_IN_USE,
                        f"devices {c.entry.name} and {result.device} overlap",
                        retryable=False,
                    )
            class_name, claim_selectors = claim.request_class_and_selectors(result.request)
            device_class = classes.get(class_name)
            if isinstance(device_class, ClaimFailure):  # reading it failed (`_fetch`)
                return device_class
            if device_class is None:
                raise PrepareError(FailureKind.NOT_FOUND, f"device class {class_name} not found")
            failure = check_selectors(
                entry.cel_device(self.settings.driver),
                [SelectorCheck(f"class {class_name}", i, e) for i, e in enumerate(device_class.expressions)]
                + [SelectorCheck(f"claim request {result.request}", i, e) for i, e in enumerate(claim_selectors)],
            )
            if failure:
                raise PrepareError(FailureKind.SELECTOR_MISMATCH, f"device {result.device}: {failure}")
            config = resolve(allocation.config, self.settings.driver, result.request, entry.device_type)
            if config is not None and config.sharing is not None:
                why = features.strategy_disabled(self.settings.feature_gates, config.sharing.strategy)
                if why:
                    raise PrepareError(FailureKind.INVALID_CONFIG, f"device {result.device}: {why}")
            nodes = gpu_nodes(self.proc_root, entry.gpu.minor)  # /proc/devices read outside the device lock
            checked.append(_Checked(result.request, entry, admin, config, result.share_id, nodes))
        return checked

    def _plan(self, checked: list[_Checked]) -> list[_Checked]:
        """Under the device locks: the checked devices against what other claims hold now (raises if one is in
        the way); returns them."""
        held = [
            (uid, self.catalog[d.device])
            for uid, e in self.checkpoint.claims.items()
            for d in e.devices
            if not d.admin_access and not d.released and d.device in self.catalog
        ]
        for c in checked:
            name = c.entry.name
            if self.catalog.get(name) != c.entry:  # rediscovered since it was checked: the kubelet retries
                raise PrepareError(
                    FailureKind.DEVICE_UNKNOWN,
                    f"device {name} changed while the claim was being prepared; retry",
                    retryable=True,
                )
            if not c.admin_access:
                for uid, other in held:
                    if conflicts(c.entry, other):
                        raise PrepareError(
                            FailureKind.DEVICE_IN_USE, f"device {name} overlaps {other.name}, which claim {uid} holds"
                        )
        self.sharing.validate([(c.entry.name, c.config, c.admin_access) for c in checked])
        return checked

    def _existing_mig_mode(self) -> bool:
        """Whether the mode publishes the MIG devices that exist (every mode but partitionable, which carves)."""
        return self.settings.mode is not PublishMode.PARTITIONABLE

    def _existing_mig(self, entry: CatalogEntry) -> MigInstance | None:
        """The MIG device a published MIG entry stands for, where the mode publishes those that exist;
        PrepareError if it is gone or another one took its place."""
        if not self._existing_mig_mode() or entry.profile is None:
            return None
        gone = FailureKind.DEVICE_UNKNOWN  # the published device is not there any more: a retry finds the same
        for inst in entry.gpu.mig_instances:  # the inventory the entry was published from: its UUID
            if inst.profile_id == entry.profile.id and inst.placement.start == entry.placement_start:
                try:  # by identity, not placement: the device may have been destroyed and made again since
                    self.lib.nvmlDeviceGetHandleByUUID(inst.uuid)
                except pynvml.NVMLError as e:
                    raise PrepareError(gone, f"MIG device {entry.name} ({inst.uuid}) no longer exists: {e}") from None
                return inst
        raise PrepareError(gone, f"MIG device {entry.name} no longer exists")

    def _mig_for(self, p: _Checked, claim_uid: str) -> LiveMig:
        assert p.entry.profile is not None and p.entry.placement_start is not None
        gpu, profile = p.entry.gpu, p.entry.profile
        if p.admin_access:  # admin access shares the partition another claim carved
            for e in self.checkpoint.claims.values():
                for d in e.devices:
                    if d.device == p.entry.name and d.mig is not None and not d.released and e.uid != claim_uid:
                        return d.mig
            raise PrepareError(FailureKind.MIG, f"admin access to {p.entry.name}: no claim has carved that MIG device")
        return create_mig_device(
            self.lib,
            gpu.uuid,
            gpu.minor,
            profile.id,
            profile.compute_slices,
            p.entry.placement_start,
            profile.memory_slices,
        )

    def _lost(self, entry: ClaimEntry) -> str | None:
        """What a PrepareCompleted claim lost since (its MIG device destroyed, its CDI spec removed), or None."""
        for d in entry.devices:
            if d.mig is not None and not d.released and find_mig_device(self.lib, d.mig) is None:
                return f"its MIG device {d.device} ({d.mig.uuid}) no longer exists"
        if not self.cdi.exists(entry.uid):
            return f"its CDI spec {self.cdi.path(entry.uid)} no longer exists"
        return None

    def _ensure_whole_gpu(self, entry: CatalogEntry) -> None:
        """A whole GPU needs MIG off; on Hopper and later it is switched off if no instance is left."""
        handle = self.lib.nvmlDeviceGetHandleByUUID(entry.gpu.uuid)
        if entry.gpu.mig_capable and mig_enabled(self.lib, handle):
            disable_mig_if_unused(self.lib, entry.gpu.uuid, [p.id for p in entry.gpu.mig_profiles])
            if mig_enabled(self.lib, handle):
                raise PrepareError(
                    FailureKind.MIG, f"GPU {entry.gpu.minor} has MIG enabled and cannot be handed out whole"
                )

    def _answer(self, entry: ClaimEntry) -> list[PreparedDevice]:
        return [
            PreparedDevice(
                requests=d.requests, pool=d.pool, device=d.device, cdi_device_ids=d.cdi_device_ids, share_id=d.share_id
            )
            for d in entry.devices
        ]

    # ----- unprepare and recovery -------------------------------------------------------------------------
    def unprepare(self, claims: list[ClaimRef], deadline: float | None = None) -> dict[str, ClaimFailure | None]:
        """`deadline` as for `prepare`: a claim whose turn at the node's device lock comes too late gets a failure,
        with nothing changed (the kubelet retries)."""
        self.calls += 1
        return {ref.uid: self._unprepare_one(ref, deadline) for ref in claims}

    def _unprepare_one(self, ref: ClaimRef, deadline: float | None) -> ClaimFailure | None:
        what = f"unprepare {ref.namespace}/{ref.name}"
        try:
            with self._locked(deadline):
                if _late(deadline):
                    return _failed("unprepare", ref, _late_failure(ref, "unprepared"))
                entry = self.checkpoint.claims.get(ref.uid)
                if entry is not None:  # unknown claim: nothing to do, success
                    self._teardown(entry)
            return None
        except LockTimeout as e:
            return _failed("unprepare", ref, replace(e.failure, message=f"{what}: {e}; nothing was changed"))
        except Exception as e:  # one claim's failure, whatever it is, stays that claim's
            failure = replace(_failure(e), message=f"{what}: {type(e).__name__}: {e}")
            return _failed("unprepare", ref, failure, e)

    def _teardown(self, entry: ClaimEntry) -> None:
        """Undo a claim, whatever step it reached, recording each step: UnprepareStarted, then sharing (MPS
        daemon, time slices), MIG devices (only if each is still the device recorded: ids are reused), `released`,
        MIG mode, CDI spec, and last the checkpoint entry. Safe to repeat after a failure or a crash at any step."""
        if entry.state is not ClaimState.UNPREPARE_STARTED:
            entry.state = ClaimState.UNPREPARE_STARTED  # from here on it is never answered as prepared
            if not self._only_a_cdi_spec(entry):
                self.checkpoint.put(entry)
                crashpoints.reached("unprepare.started-recorded")
            # else: the spec is removed, then the entry dropped; a crash between leaves a PrepareCompleted claim
            # whose spec is gone, which start-up undoes (and the kubelet repeats the unprepare anyway)
        self.sharing.undo(entry.uid, entry.devices, self._others(entry.uid))
        crashpoints.reached("unprepare.sharing-undone")
        others = {
            d.mig.uuid
            for e in self.checkpoint.claims.values()
            if e.uid != entry.uid
            for d in e.devices
            if d.mig is not None and not d.released
        }
        gpus: set[str] = set()
        mig_released = False
        try:
            for d in entry.devices:
                cat = self.catalog.get(d.device)
                # a partition this mode carves; an admin's MIG device (every other mode) is never destroyed
                carves = cat is not None and cat.profile is not None and not self._existing_mig_mode()
                if d.mig is not None:
                    gpus.add(d.mig.parent_uuid)
                elif carves and cat is not None:
                    gpus.add(cat.gpu.uuid)
                if d.released or d.admin_access:  # admin access never destroys the partition it shares
                    d.released = True
                    continue
                if d.mig is not None or carves:
                    mig_released = True
                destroyed = False  # a whole GPU, or a MIG device already gone
                if d.mig is not None:
                    destroyed = destroy_mig_device(self.lib, d.mig, f"MIG device {d.device} ({d.mig.uuid})")
                elif carves and cat is not None and cat.profile is not None and cat.placement_start is not None:
                    # crashed before its ids were recorded: find it by profile and placement
                    destroyed = destroy_at(self.lib, cat.gpu.uuid, cat.profile.id, cat.placement_start, others)
                if destroyed:
                    crashpoints.reached("unprepare.mig-destroyed")
                d.released = True
        finally:
            # Only a MIG device's release needs recording (its ids are reused once it is gone); a whole GPU holds
            # nothing on the node once sharing is undone, and a crash before the entry is dropped repeats this.
            if mig_released:
                self.checkpoint.put(entry)
        crashpoints.reached("unprepare.released-recorded")
        for uuid in sorted(gpus):
            self._restore_mig_mode(uuid)
        if gpus:
            crashpoints.reached("unprepare.mig-mode-restored")
        self.cdi.remove(entry.uid)
        crashpoints.reached("unprepare.cdi-removed")
        self.checkpoint.drop(entry.uid)
        crashpoints.reached("unprepare.dropped")

    def _only_a_cdi_spec(self, entry: ClaimEntry) -> bool:
        """Whether all the claim holds on the node is its CDI spec: whole GPUs, no sharing applied."""
        for d in entry.devices:
            cat = self.catalog.get(d.device)
            if d.mig is not None or d.sharing is not None or cat is None or cat.profile is not None:
                return False
        return True

    def _destroy_orphans(self, gpu_uuid: str, minor: int, profile_ids: list[int], recorded: list[LiveMig]) -> None:
        handle = self.lib.nvmlDeviceGetHandleByUUID(gpu_uuid)
        if not mig_enabled(self.lib, handle):
            return
        for view in list_gpu_instances(self.lib, handle, profile_ids):
            if any(m.parent_uuid == gpu_uuid and view.is_device(m) for m in recorded):
                continue
            log.warning("destroying MIG GPU instance %d on GPU %d: no prepared claim owns it", view.gi_id, minor)
            destroy_gpu_instance(self.lib, handle, view.gi_id, f"GPU instance {view.gi_id}")
            crashpoints.reached("recover.orphan-mig-destroyed")
        # In this mode the driver turns MIG on when it carves: off again where no claim holds a partition, as an
        # unprepare would (also after a crash between destroying the last instance and switching MIG off).
        if not any(m.parent_uuid == gpu_uuid for m in recorded):
            self._restore_mig_mode(gpu_uuid)

    def _restore_mig_mode(self, gpu_uuid: str) -> None:
        """MIG off again where the driver carved and no instance is left (Hopper and later)."""
        gpu = self.inventory.gpu_by_uuid(gpu_uuid)
        if gpu is not None and gpu.mig_profiles:
            disable_mig_if_unused(self.lib, gpu_uuid, [p.id for p in gpu.mig_profiles])

    def _recover(self) -> None:
        """At start: finish undoing claims that were being prepared or unprepared, and prepared claims that lost
        a device; destroy MIG devices no claim owns (MIG off again where none is left); remove CDI specs no
        prepared claim owns and temp files of interrupted writes."""
        crashpoints.reached("recover.started")
        for entry in list(self.checkpoint.claims.values()):
            if entry.state is ClaimState.PREPARE_COMPLETED:
                try:
                    lost = self._lost(entry)
                except Exception as e:  # e.g. its GPU fell off the bus: cannot tell, keep it
                    log.error("checking prepared claim %s failed: %s", entry.uid, e)
                    continue
                if lost is None:
                    continue
                log.warning("claim %s/%s (%s) was prepared, but %s: undoing it", entry.namespace, entry.name,
                            entry.uid, lost)  # fmt: skip
            else:
                log.warning("undoing claim %s/%s (%s), interrupted in %s", entry.namespace, entry.name, entry.uid,
                            entry.state)  # fmt: skip
            try:
                self._teardown(entry)
            except Exception as e:  # retried by the claim's next prepare or unprepare
                log.error("undoing claim %s failed: %s", entry.uid, e)
                continue
            crashpoints.reached("recover.claim-torn-down")
        self.sharing.remove_orphans(set(self.checkpoint.claims))
        recorded = [
            d.mig for e in self.checkpoint.claims.values() for d in e.devices if d.mig is not None and not d.released
        ]
        for gpu in self.inventory.gpus:
            if gpu.mig_profiles and self.settings.mode is PublishMode.PARTITIONABLE:
                try:
                    self._destroy_orphans(gpu.uuid, gpu.minor, [p.id for p in gpu.mig_profiles], recorded)
                except Exception as e:  # one broken GPU must not keep the plugin from starting
                    log.error("looking for orphan MIG devices on GPU %d failed: %s", gpu.minor, e)
        completed = {e.uid for e in self.checkpoint.claims.values() if e.state is ClaimState.PREPARE_COMPLETED}
        pending = set(self.checkpoint.claims) - completed  # their teardown failed: it removes their spec later
        for uid in self.cdi.claim_uids() - completed - pending:
            log.warning("removing CDI spec of claim %s: no prepared claim owns it", uid)
            self.cdi.remove(uid)
            crashpoints.reached("recover.orphan-cdi-removed")
        for tmp in self.cdi.stale_temp_files():
            log.warning("removing %s, left by an interrupted write", tmp)
            tmp.unlink(missing_ok=True)
