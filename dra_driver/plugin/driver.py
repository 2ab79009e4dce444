"""Preparing and unpreparing claims on this node: the ClaimPreparer behind the kubelet gRPC services.

Order of a prepare, chosen so that a crash at any step leaves nothing that the next start cannot find and
undo: validate everything (no change yet) -> checkpoint PrepareStarted -> carve MIG devices, recording each
in the checkpoint as soon as it exists -> apply sharing (time-slicing, MPS; recorded before and after) -> write
the CDI spec -> checkpoint PrepareCompleted. Unprepare and
startup recovery walk the same steps backwards. Device changes are serialised by an in-process lock and a
node-wide file lock (`<plugin dir>/pu.lock`), so two plugin processes (a rolling update) exclude each other;
reading claims from the API server happens outside the lock, in parallel.
"""

from __future__ import annotations

import fcntl
import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from dra_driver.cdi.devnodes import CharDevice, DevNodeError, gpu_nodes, mig_cap_nodes
from dra_driver.cdi.spec import cdi_device_id, claim_spec
from dra_driver.cdi.store import CdiStore
from dra_driver.nvml.api import NvmlLibrary
from dra_driver.nvml.discovery import discover
from dra_driver.nvml.inventory import Inventory
from dra_driver.nvml.mig import (
    LiveMig,
    MigError,
    create_mig_device,
    destroy_at,
    destroy_gpu_instance,
    disable_mig_if_unused,
    list_gpu_instances,
    mig_enabled,
)
from dra_driver.plugin import features
from dra_driver.plugin.catalog import CatalogEntry, build_catalog, conflicts
from dra_driver.plugin.checkpoint import Checkpoint, CheckpointedDevice, ClaimEntry, ClaimState
from dra_driver.plugin.claims import ClaimSource, DeviceClass, ResourceClaim
from dra_driver.plugin.config import ConfigError, GpuConfig, MigDeviceConfig, resolve
from dra_driver.plugin.selectors import SelectorCheck, check_selectors
from dra_driver.plugin.types import ClaimRef, PreparedDevice, PrepareResult
from dra_driver.sharing import CommandRunner, SharingError, SharingManager, Target, default_runner, with_edits
from dra_driver.slices.devices import PublishMode

log = logging.getLogger(__name__)


class PrepareError(RuntimeError):
    """A claim cannot be prepared; nothing was changed for it."""


@dataclass(frozen=True)
class PluginSettings:
    driver: str
    pool: str  # the node name
    plugin_dir: Path
    cdi_root: Path
    mode: PublishMode = PublishMode.PARTITIONABLE
    feature_gates: Mapping[str, bool] = field(default_factory=lambda: dict(features.DEFAULTS))


@dataclass(frozen=True)
class _Planned:
    request: str
    entry: CatalogEntry
    admin_access: bool
    config: GpuConfig | MigDeviceConfig | None = None  # sharing
    share_id: str | None = None  # set for devices several claims hold at once (consumable capacity)


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
    ) -> None:
        self.settings = settings
        self.lib = lib
        self.claims = claims
        self.proc_root = proc_root
        self.inventory = discover(lib, sysfs_root)
        self.catalog = build_catalog(self.inventory, settings.mode)
        self.cdi = CdiStore(settings.cdi_root, settings.driver)
        settings.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._thread_lock = threading.Lock()
        self._lock_path = settings.plugin_dir / "pu.lock"
        self._boot_id = boot_id
        self.sharing = SharingManager(sharing_runner or default_runner(lib), settings.plugin_dir)
        self.lib.nvmlInit()  # one long-lived NVML session: handle lookups stay cheap
        with self._locked():
            self.checkpoint = Checkpoint(settings.plugin_dir / "checkpoint.json", boot_id)
            self._recover()

    def close(self) -> None:
        self.lib.nvmlShutdown()

    def refresh_inventory(self, inventory: Inventory) -> bool:
        """Adopt a new discovery; True when the devices this node publishes changed (MIG instances that the
        driver itself carves do not count: they are not published)."""
        catalog = build_catalog(inventory, self.settings.mode)
        with self._thread_lock:
            changed = {n: e.device for n, e in catalog.items()} != {n: e.device for n, e in self.catalog.items()}
            self.inventory, self.catalog = inventory, catalog
        return changed

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock, open(self._lock_path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                # Another process (the other pod of a rolling update) may have changed the checkpoint.
                if hasattr(self, "checkpoint"):
                    self.checkpoint = Checkpoint(self.checkpoint.path, self._boot_id)
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # ----- prepare ----------------------------------------------------------------------------------------
    def prepare(self, claims: list[ClaimRef]) -> dict[str, PrepareResult]:
        fetched: dict[str, ResourceClaim | str] = {}
        classes: dict[str, DeviceClass | str] = {}
        for ref in claims:  # API reads outside the device lock
            fetched[ref.uid] = self._fetch(ref, classes)
        out: dict[str, PrepareResult] = {}
        for ref in claims:
            got = fetched[ref.uid]
            if isinstance(got, str):
                out[ref.uid] = PrepareResult(error=got)
                continue
            try:
                with self._locked():
                    out[ref.uid] = PrepareResult(devices=self._prepare_claim(ref, got, classes))
            except (PrepareError, ConfigError, MigError, DevNodeError, SharingError, OSError) as e:
                log.warning("prepare %s/%s (%s) failed: %s", ref.namespace, ref.name, ref.uid, e)
                out[ref.uid] = PrepareResult(error=str(e))
        return out

    def _fetch(self, ref: ClaimRef, classes: dict[str, DeviceClass | str]) -> ResourceClaim | str:
        try:
            claim = self.claims.get_claim(ref.namespace, ref.name)
        except Exception as e:  # the API server is down, the claim is gone, ...
            return f"retrieve claim {ref.namespace}/{ref.name}: {e}"
        if claim.metadata.uid != ref.uid:
            return f"claim {ref.namespace}/{ref.name} got replaced (uid {claim.metadata.uid}, expected {ref.uid})"
        if claim.status.allocation is None:
            return f"claim {ref.namespace}/{ref.name} not allocated"
        for result in claim.status.allocation.devices.results:
            if result.driver != self.settings.driver:
                continue
            try:
                class_name, _ = claim.request_class_and_selectors(result.request)
            except KeyError as e:
                return str(e.args[0])
            if class_name not in classes:
                try:
                    classes[class_name] = self.claims.get_device_class(class_name)
                except Exception as e:
                    classes[class_name] = f"retrieve device class {class_name}: {e}"
        return claim

    def _prepare_claim(
        self, ref: ClaimRef, claim: ResourceClaim, classes: dict[str, DeviceClass | str]
    ) -> list[PreparedDevice]:
        existing = self.checkpoint.claims.get(ref.uid)
        if existing is not None and existing.state is ClaimState.PREPARE_COMPLETED:
            return self._answer(existing)  # idempotent: same answer, no work
        if existing is not None:
            log.info("claim %s was half prepared before; rolling it back first", ref.uid)
            self._rollback(existing)
        planned = self._plan(claim, classes)  # raises before anything changes
        entry = ClaimEntry(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            state=ClaimState.PREPARE_STARTED,
            devices=[
                CheckpointedDevice(
                    requests=[p.request.split("/", 1)[0]],
                    pool=self.settings.pool,
                    device=p.entry.device.name,
                    cdi_device_ids=[cdi_device_id(self.settings.driver, ref.uid, p.entry.device.name)],
                    admin_access=p.admin_access,
                    share_id=p.share_id,
                )
                for p in planned
            ],
        )
        self.checkpoint.put(entry)
        try:
            nodes: dict[str, list[CharDevice]] = {}
            uuids: list[str] = []
            for p, record in zip(planned, entry.devices, strict=True):
                gpu = p.entry.gpu
                if p.entry.profile is None:
                    self._ensure_whole_gpu(p.entry)
                    nodes[record.device] = gpu_nodes(self.proc_root, gpu.minor)
                    uuids.append(gpu.uuid)
                    continue
                live = self._mig_for(p, ref.uid)
                record.mig = live
                self.checkpoint.save()  # the instance exists: record it before anything else can fail
                nodes[record.device] = gpu_nodes(self.proc_root, gpu.minor) + mig_cap_nodes(
                    self.proc_root, gpu.minor, live.gi_id, live.ci_id
                )
                uuids.append(live.uuid)
            targets = [
                Target(record, p.config, uuid, p.entry.profile is not None)
                for p, record, uuid in zip(planned, entry.devices, uuids, strict=True)
            ]
            edits = self.sharing.apply(ref.uid, targets, self.checkpoint.save)  # recorded in the checkpoint
            self.cdi.write(ref.uid, with_edits(claim_spec(self.settings.driver, ref.uid, nodes, uuids), edits))
            entry.state = ClaimState.PREPARE_COMPLETED
            self.checkpoint.put(entry)
        except Exception:
            self._rollback(entry)
            raise
        return self._answer(entry)

    def _plan(self, claim: ResourceClaim, classes: dict[str, DeviceClass | str]) -> list[_Planned]:
        assert claim.status.allocation is not None
        allocation = claim.status.allocation.devices
        held = [
            (uid, self.catalog[d.device])
            for uid, e in self.checkpoint.claims.items()
            for d in e.devices
            if not d.admin_access and d.device in self.catalog
        ]
        planned: list[_Planned] = []
        for result in allocation.results:
            if result.driver != self.settings.driver:
                continue
            if result.pool != self.settings.pool:
                raise PrepareError(f"device {result.device} is allocated from pool {result.pool}, not this node's")
            entry = self.catalog.get(result.device)
            if entry is None:
                raise PrepareError(f"device {result.device} is not a device of this node (pool {result.pool})")
            admin = bool(result.admin_access)
            if not admin:
                for uid, other in held:
                    if conflicts(entry, other):
                        raise PrepareError(
                            f"device {result.device} overlaps {other.device.name}, which claim {uid} holds"
                        )
                for p in planned:
                    if not p.admin_access and conflicts(entry, p.entry):
                        raise PrepareError(f"devices {p.entry.device.name} and {result.device} overlap")
            class_name, claim_selectors = claim.request_class_and_selectors(result.request)
            device_class = classes.get(class_name)
            if not isinstance(device_class, DeviceClass):
                raise PrepareError(device_class or f"device class {class_name} not found")
            failure = check_selectors(
                self.settings.driver,
                entry.device,
                [SelectorCheck(f"class {class_name}", i, e) for i, e in enumerate(device_class.expressions)]
                + [SelectorCheck(f"claim request {result.request}", i, e) for i, e in enumerate(claim_selectors)],
            )
            if failure:
                raise PrepareError(f"device {result.device}: {failure}")
            config = resolve(allocation.config, self.settings.driver, result.request, _device_type(entry))
            if config is not None and config.sharing is not None:
                why = features.strategy_disabled(self.settings.feature_gates, config.sharing.strategy)
                if why:
                    raise PrepareError(f"device {result.device}: {why}")
            planned.append(_Planned(result.request, entry, admin, config, result.share_id))
        self.sharing.validate([(p.entry.device.name, p.config, p.admin_access) for p in planned])
        return planned

    def _mig_for(self, p: _Planned, claim_uid: str) -> LiveMig:
        assert p.entry.profile is not None and p.entry.placement_start is not None
        gpu, profile = p.entry.gpu, p.entry.profile
        if p.admin_access:  # admin access shares the partition another claim carved
            for e in self.checkpoint.claims.values():
                for d in e.devices:
                    if d.device == p.entry.device.name and d.mig is not None and e.uid != claim_uid:
                        return d.mig
            raise PrepareError(f"admin access to {p.entry.device.name}: no claim has carved that MIG device")
        return create_mig_device(
            self.lib,
            gpu.uuid,
            gpu.minor,
            profile.id,
            profile.compute_slices,
            p.entry.placement_start,
            profile.memory_slices,
        )

    def _ensure_whole_gpu(self, entry: CatalogEntry) -> None:
        """A whole GPU needs MIG off; on Hopper and later it is switched off if no instance is left."""
        handle = self.lib.nvmlDeviceGetHandleByUUID(entry.gpu.uuid)
        if entry.gpu.mig_capable and mig_enabled(self.lib, handle):
            disable_mig_if_unused(self.lib, entry.gpu.uuid, [p.id for p in entry.gpu.mig_profiles])
            if mig_enabled(self.lib, handle):
                raise PrepareError(f"GPU {entry.gpu.minor} has MIG enabled and cannot be handed out whole")

    def _answer(self, entry: ClaimEntry) -> list[PreparedDevice]:
        return [
            PreparedDevice(
                requests=d.requests, pool=d.pool, device=d.device, cdi_device_ids=d.cdi_device_ids, share_id=d.share_id
            )
            for d in entry.devices
        ]

    # ----- unprepare and recovery -------------------------------------------------------------------------
    def unprepare(self, claims: list[ClaimRef]) -> dict[str, str]:
        out: dict[str, str] = {}
        for ref in claims:
            try:
                with self._locked():
                    entry = self.checkpoint.claims.get(ref.uid)
                    if entry is not None:  # unknown claim: nothing to do, success
                        self._rollback(entry)
                out[ref.uid] = ""
            except (MigError, SharingError, OSError) as e:
                log.warning("unprepare %s (%s) failed: %s", ref.name, ref.uid, e)
                out[ref.uid] = str(e)
        return out

    def _rollback(self, entry: ClaimEntry) -> None:
        """Undo a claim, whatever step it reached: sharing (MPS daemon, time slices), MIG devices (CI, then GI),
        CDI spec, checkpoint entry."""
        self.sharing.undo(entry.uid, entry.devices)
        touched: set[str] = set()
        for d in entry.devices:
            cat = self.catalog.get(d.device)
            if d.admin_access or cat is None or cat.profile is None or cat.placement_start is None:
                continue
            if d.mig is not None:
                handle = self.lib.nvmlDeviceGetHandleByUUID(d.mig.parent_uuid)
                destroy_gpu_instance(self.lib, handle, d.mig.gi_id, f"MIG device {d.device}")
            else:  # crashed before the ids were recorded: find it by profile and placement
                destroy_at(self.lib, cat.gpu.uuid, cat.profile.id, cat.placement_start)
            touched.add(cat.gpu.uuid)
        for uuid in touched:
            gpu = next(g for g in self.inventory.gpus if g.uuid == uuid)
            disable_mig_if_unused(self.lib, uuid, [p.id for p in gpu.mig_profiles])
        self.cdi.remove(entry.uid)
        self.checkpoint.drop(entry.uid)

    def _recover(self) -> None:
        """At start: roll back half-prepared claims, destroy MIG devices no completed claim owns, remove CDI
        specs no completed claim owns."""
        for entry in [e for e in self.checkpoint.claims.values() if e.state is ClaimState.PREPARE_STARTED]:
            log.warning(
                "rolling back claim %s/%s (%s), interrupted while preparing", entry.namespace, entry.name, entry.uid
            )
            self._rollback(entry)
        self.sharing.remove_orphans(set(self.checkpoint.claims))
        owned = {
            (d.mig.parent_uuid, d.mig.gi_id)
            for e in self.checkpoint.claims.values()
            for d in e.devices
            if d.mig is not None
        }
        for gpu in self.inventory.gpus:
            if not gpu.mig_profiles:
                continue
            handle = self.lib.nvmlDeviceGetHandleByUUID(gpu.uuid)
            if not mig_enabled(self.lib, handle):
                continue
            for view in list_gpu_instances(self.lib, handle, [p.id for p in gpu.mig_profiles]):
                if (gpu.uuid, view.gi_id) not in owned and self.settings.mode is PublishMode.PARTITIONABLE:
                    log.warning(
                        "destroying MIG GPU instance %d on GPU %d: no prepared claim owns it", view.gi_id, gpu.minor
                    )
                    destroy_gpu_instance(self.lib, handle, view.gi_id, f"GPU instance {view.gi_id}")
        completed = {e.uid for e in self.checkpoint.claims.values() if e.state is ClaimState.PREPARE_COMPLETED}
        for uid in self.cdi.claim_uids() - completed:
            log.warning("removing CDI spec of claim %s: no prepared claim owns it", uid)
            self.cdi.remove(uid)


def _device_type(entry: CatalogEntry) -> str:
    return str(entry.device.attributes["type"].value())
