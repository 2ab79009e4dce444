"""Preparing and unpreparing claims on this node: the ClaimPreparer behind the kubelet gRPC services.

A prepare checks everything first (the claim, its classes, CEL selectors, configs, device nodes: `_check`, outside
the device locks, in parallel with other prepares; then, under them, the other claims' devices: `_plan`), then runs
the prepare steps of `claimstate.steps` (their handlers: `machine`); unprepare and a failed prepare run the teardown
steps, and the first call to get the device locks runs start-up recovery. Device changes are serialised by an
in-process lock and a node-wide file lock (`<plugin dir>/pu.lock`, 0600), so two plugin processes (a rolling update)
exclude each other. Every wait of a call ends at its deadline (its CallContext): the API reads, the locks, each
prepare step (checked before it starts), sharing's commands and MPS daemon; a teardown does not stop between its
steps (each is quick, and what is done is recorded), its waits do. When another process holds the locks too long at
start, the plugin serves anyway and leaves recovery to the first to get them (a background retry, or a prepare or
unprepare).
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from dra_driver.api.claim import ResourceClaim
from dra_driver.api.deviceclass import DeviceClass
from dra_driver.cdi.devnodes import DevNodeError, gpu_nodes
from dra_driver.cdi.driverfiles import common_edits, discover_driver_files
from dra_driver.cdi.metadata import POD_CLAIM_NAME_ANNOTATION, MetadataStore
from dra_driver.cdi.spec import ContainerEdits, cdi_device_id
from dra_driver.cdi.store import CdiStore
from dra_driver.claimstate.checkpoint import Checkpoint, CheckpointedDevice, ClaimEntry, ClaimState
from dra_driver.claimstate.config import ConfigError, resolve
from dra_driver.claimstate.context import NO_DEADLINE, CallContext
from dra_driver.claimstate.steps import ClaimRecord
from dra_driver.nvml.api import NvmlLibrary
from dra_driver.nvml.discovery import discover
from dra_driver.nvml.inventory import Inventory
from dra_driver.plugin import features, machine
from dra_driver.plugin.catalog import build_catalog, conflicts
from dra_driver.plugin.claims import ClaimSource, read_timeout
from dra_driver.plugin.failures import (
    ClaimFailure,
    FailureKind,
    LockTimeout,
    PrepareError,
    failure_of,
    late_failure,
    logged,
    read_failure,
)
from dra_driver.plugin.machine import Checked
from dra_driver.plugin.selectors import SelectorCheck, check_selectors
from dra_driver.plugin.types import ClaimRef, PreparedDevice, PrepareResult
from dra_driver.sharing import (
    CommandRunner,
    DriverRootRunner,
    SharingManager,
    default_runner,
)
from dra_driver.sharing.mps_launch import MpsLauncher
from dra_driver.sharing.tmpfs import ShmMounter
from dra_driver.slices.devices import DEFAULT_MODE, MigProfiles, PublishMode

log = logging.getLogger(__name__)


# How long start-up waits for the node's device lock before it serves without it: recovery then runs in the
# background, or in the first prepare or unprepare that gets the lock (another process may hold it for long)
STARTUP_LOCK_WAIT_S = 10.0
_RECOVERY_RETRY_S = 1.0


def _flock(fd: int, call: CallContext) -> None:
    """Exclusive flock, polled so that the wait ends at the call's deadline (another process may hold it long)."""
    if call.deadline is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if call.expired():
                raise LockTimeout(
                    "deadline exceeded waiting for the node's device lock (held by another plugin process)"
                ) from None
            time.sleep(0.01)


@dataclass(frozen=True)
class PluginSettings:
    driver: str
    pool: str  # the node name
    plugin_dir: Path
    cdi_root: Path
    mode: PublishMode = DEFAULT_MODE
    mig_profiles: MigProfiles = None  # partitionable: the MIG profiles published and prepared (None: every one)
    feature_gates: Mapping[str, bool] = field(default_factory=lambda: dict(features.DEFAULTS))
    # NVIDIA's `nvidia-cdi-hook` (or `nvidia-ctk`) on the host: CDI specs then carry its update-ldcache and
    # create-symlinks hooks instead of a bind mount per library link (cdi.driverfiles.common_edits)
    cdi_hook_path: str | None = None


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
        self.catalog = build_catalog(self.inventory, settings.mode, settings.mig_profiles)
        self.driver_root = driver_root
        self.host_driver_root = host_driver_root or driver_root
        self.driver_edits = self._driver_edits(self.inventory)
        self.cdi = CdiStore(settings.cdi_root, settings.driver)
        # always there: a teardown removes what a prepare wrote with the DeviceMetadata gate on, whatever it is now
        self.metadata = MetadataStore(settings.plugin_dir, settings.driver)
        settings.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._thread_lock = threading.Lock()
        self.calls = 0  # prepares and unprepares so far (the daemon trims memory once they stop)
        self.on_prepared: Callable[[], None] | None = None  # after a call that prepared a claim (its status to write)
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
            with self._locked(CallContext.within(startup_lock_wait_s)):
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
                with self._locked(CallContext.within(_RECOVERY_RETRY_S)):
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
        catalog = build_catalog(inventory, self.settings.mode, self.settings.mig_profiles)
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

    def reconfigure(
        self,
        mode: PublishMode,
        *,
        shared_changes: bool,
        mig_profiles: MigProfiles = None,
        call: CallContext = NO_DEADLINE,
    ) -> list[str]:
        """Serve `mode` (with `mig_profiles`) from now on, unless a prepared claim holds a device that it would not
        publish the same way: gone (a profile left out too), held alone where it was shared or the other way round,
        a MIG partition the driver carved where the mode changes, or (`shared_changes`) any shared device, whose
        sharing terms change. Returns those claims, as `namespace/name: device`; nothing changed then."""
        catalog = build_catalog(self.inventory, mode, mig_profiles)
        with self._locked(call):
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
                self.settings = replace(self.settings, mode=mode, mig_profiles=mig_profiles)
                self.catalog = catalog
        return blockers

    def _driver_edits(self, inventory: Inventory) -> ContainerEdits | None:
        """The driver's libraries, binaries, firmware and sockets for every claim's CDI spec (found once per
        driver version: 20-70 ms)."""
        if self.driver_root is None or self.host_driver_root is None:
            return None
        files = discover_driver_files(self.driver_root, inventory.driver_version)
        return common_edits(files, self.host_driver_root, hook_path=self.settings.cdi_hook_path)

    def others(self, uid: str) -> list[ClaimEntry]:
        """The checkpoint's other claims (called under the device locks): who else holds a shared GPU."""
        return [e for e in self.checkpoint.claims.values() if e.uid != uid]

    @contextmanager
    def _locked(self, call: CallContext = NO_DEADLINE) -> Iterator[None]:
        """Both device locks; LockTimeout instead of waiting past the call's deadline. Start-up recovery runs in the
        first call that gets them."""
        # 0600: anyone who can open the lock file can take it and stall every prepare on the node.
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if not self._thread_lock.acquire(timeout=-1 if call.deadline is None else call.timeout(math.inf)):
                raise LockTimeout("deadline exceeded waiting for another prepare or unprepare on this node")
            try:
                _flock(fd, call)
                try:
                    # Another process (the other pod of a rolling update) may have changed the checkpoint.
                    self.checkpoint.refresh()
                    if not self._recovered:
                        machine.recover(self, call)
                        self._recovered = True
                    yield
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                self._thread_lock.release()
        finally:
            os.close(fd)  # after the locks: one system call less while other prepares wait for them

    # ----- prepare ----------------------------------------------------------------------------------------
    def prepare(self, claims: list[ClaimRef], call: CallContext = NO_DEADLINE) -> dict[str, PrepareResult]:
        """A claim that cannot be read or prepared before the call's deadline gets an error instead (the kubelet
        retries it)."""
        self.calls += 1
        fetched: dict[str, ResourceClaim | ClaimFailure] = {}
        classes: dict[str, DeviceClass | ClaimFailure] = {}
        for ref in claims:  # API reads outside the device lock
            fetched[ref.uid] = self._fetch(ref, classes, call)
        results = {ref.uid: self._prepare_one(ref, fetched[ref.uid], classes, call) for ref in claims}
        if self.on_prepared is not None and any(r.failure is None for r in results.values()):
            self.on_prepared()
        return results

    def _prepare_one(
        self,
        ref: ClaimRef,
        got: ResourceClaim | ClaimFailure,
        classes: dict[str, DeviceClass | ClaimFailure],
        call: CallContext,
    ) -> PrepareResult:
        if isinstance(got, ClaimFailure):
            return PrepareResult(failure=logged(call, "prepare", ref, got))
        try:
            checked: list[Checked] | ClaimFailure
            try:  # CEL, configs and device nodes outside the lock: other prepares go on meanwhile
                checked = self._check(got, classes)
            except (PrepareError, ConfigError, DevNodeError) as e:  # answered under the lock, unless the claim is
                checked = failure_of(e)  # prepared already
            with self._locked(call):
                if call.expired():  # the wait used up the time: an answer after the work would come too late
                    return PrepareResult(failure=logged(call, "prepare", ref, late_failure(ref, "prepared")))
                annotations = got.metadata.annotations or {}
                devices = self._prepare_claim(ref, checked, call, annotations.get(POD_CLAIM_NAME_ANNOTATION))
        except Exception as e:  # whatever it is (an NVML error of a lost GPU, a bug): this claim's failure only
            return PrepareResult(failure=logged(call, "prepare", ref, failure_of(e), e))
        if isinstance(devices, ClaimFailure):
            return PrepareResult(failure=logged(call, "prepare", ref, devices))
        return PrepareResult(devices=devices)

    def _fetch(
        self, ref: ClaimRef, classes: dict[str, DeviceClass | ClaimFailure], call: CallContext
    ) -> ResourceClaim | ClaimFailure:
        what = f"claim {ref.namespace}/{ref.name}"
        timeout = read_timeout(call.deadline)
        if timeout <= 0:
            return ClaimFailure.of(
                FailureKind.DEADLINE, f"deadline exceeded before {what} could be read from the API server"
            )
        try:
            claim = self.claims.get_claim(ref.namespace, ref.name, timeout=timeout)
        except Exception as e:  # the API server is down or too slow, the claim is gone, ...
            return read_failure(f"retrieve {what}: {e}", e)
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
                timeout = read_timeout(call.deadline)
                if timeout <= 0:
                    return ClaimFailure.of(
                        FailureKind.DEADLINE,
                        f"deadline exceeded before device class {class_name} could be read from the API server",
                    )
                try:
                    classes[class_name] = self.claims.get_device_class(class_name, timeout=timeout)
                except Exception as e:
                    classes[class_name] = read_failure(f"retrieve device class {class_name}: {e}", e)
        return claim

    def _prepare_claim(
        self,
        ref: ClaimRef,
        checked: list[Checked] | ClaimFailure,
        call: CallContext,
        pod_claim_name: str | None = None,
    ) -> list[PreparedDevice] | ClaimFailure:
        existing = self.checkpoint.claims.get(ref.uid)
        if existing is not None and existing.state is ClaimState.PREPARE_COMPLETED:
            lost = machine.lost(self, existing)
            if lost is None:
                return self._answer(existing)  # idempotent: same answer, no work
            call.log.warning("claim %s was prepared, but %s: preparing it again", ref.uid, lost)
        if existing is not None:
            call.log.info("claim %s is not (or no longer) fully prepared; undoing what is left first", ref.uid)
            machine.teardown(self, ClaimRecord(self.checkpoint, existing), call)
        if isinstance(checked, ClaimFailure):  # e.g. its class changed since: only a prepared claim is answered
            return checked
        machine.finish_interrupted(self, call)
        planned = self._plan(checked)  # raises before anything changes
        if not planned:  # allocated only to other drivers: nothing to record, no (empty, invalid) CDI spec
            return []
        entry = ClaimEntry(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            state=ClaimState.PREPARE_STARTED,
            devices=tuple(
                CheckpointedDevice(
                    requests=[p.request.split("/", 1)[0]],
                    pool=self.settings.pool,
                    device=p.entry.name,
                    cdi_device_ids=[cdi_device_id(self.settings.driver, ref.uid, p.entry.name)],
                    admin_access=p.admin_access,
                    share_id=p.share_id,
                )
                for p in planned
            ),
        )
        run = machine.Prepare(ClaimRecord(self.checkpoint, entry), planned, call, pod_claim_name=pod_claim_name)
        try:
            machine.run_prepare(self, run)
        except Exception as failure:
            if run.claim.entry.uid not in self.checkpoint.claims:  # failed before the first record: nothing to undo
                raise
            try:
                machine.teardown(self, run.claim, call)
            except Exception as undo:
                call.log.error("claim %s: undoing the failed prepare failed too: %s", ref.uid, undo)
                first = failure_of(failure)  # what failed the prepare names the kind, not the undo
                raise PrepareError(
                    first.kind,
                    f"{failure}; undoing the prepare failed too ({undo}); it is retried on the next prepare or "
                    "unprepare of this claim",
                    retryable=first.retryable,
                ) from failure
            raise
        return self._answer(run.claim.entry)

    def _check(
        self, claim: ResourceClaim, classes: dict[str, DeviceClass | ClaimFailure]
    ) -> list[Checked] | ClaimFailure:
        """This driver's results, checked against what needs no device lock: pool, catalog, class and claim
        selectors, configs and feature gates. Raises (or returns the failure of a class read) before anything
        changes."""
        assert claim.status.allocation is not None
        allocation = claim.status.allocation.devices
        catalog = self.catalog  # one snapshot: refresh_inventory replaces it whole
        checked: list[Checked] = []
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
            # An admin claim's sharing setting is refused, as NVIDIA's driver does, not silently dropped: the
            # device's sharing is its holder's (docs/admin-access.md).
            if admin and config is not None and config.sharing is not None:
                raise PrepareError(
                    FailureKind.INVALID_CONFIG,
                    f"device {result.device}: admin access uses the device as the claim that holds it set it up; "
                    f"its {config.sharing.strategy} sharing setting cannot apply (use a class and config without one)",
                )
            if config is not None and config.sharing is not None:
                why = features.strategy_disabled(self.settings.feature_gates, config.sharing.strategy)
                if why:
                    raise PrepareError(FailureKind.INVALID_CONFIG, f"device {result.device}: {why}")
            nodes = gpu_nodes(self.proc_root, entry.gpu.minor)  # /proc/devices read outside the device lock
            checked.append(Checked(result.request, entry, admin, config, result.share_id, nodes))
        return checked

    def _plan(self, checked: list[Checked]) -> list[Checked]:
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

    def _answer(self, entry: ClaimEntry) -> list[PreparedDevice]:
        return [
            PreparedDevice(
                requests=d.requests, pool=d.pool, device=d.device, cdi_device_ids=d.cdi_device_ids, share_id=d.share_id
            )
            for d in entry.devices
        ]

    # ----- unprepare and recovery -------------------------------------------------------------------------
    def unprepare(self, claims: list[ClaimRef], call: CallContext = NO_DEADLINE) -> dict[str, ClaimFailure | None]:
        """A claim whose turn at the node's device lock comes after the call's deadline gets a failure, with nothing
        changed (the kubelet retries)."""
        self.calls += 1
        return {ref.uid: self._unprepare_one(ref, call) for ref in claims}

    def _unprepare_one(self, ref: ClaimRef, call: CallContext) -> ClaimFailure | None:
        what = f"unprepare {ref.namespace}/{ref.name}"
        try:
            with self._locked(call):
                if call.expired():
                    return logged(call, "unprepare", ref, late_failure(ref, "unprepared"))
                entry = self.checkpoint.claims.get(ref.uid)
                if entry is not None:  # unknown claim: nothing to do, success
                    machine.teardown(self, ClaimRecord(self.checkpoint, entry), call)
            return None
        except LockTimeout as e:
            return logged(call, "unprepare", ref, replace(e.failure, message=f"{what}: {e}; nothing was changed"))
        except Exception as e:  # one claim's failure, whatever it is, stays that claim's
            failure = replace(failure_of(e), message=f"{what}: {type(e).__name__}: {e}")
            return logged(call, "unprepare", ref, failure, e)
