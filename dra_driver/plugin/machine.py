"""The claim state machine's step handlers: one per step of the tables in `claimstate.steps`, run in the tables'
order by `run_prepare`, `teardown` and `recover` (the tables are checked against the handlers at import). Each
handler changes the node as its step says, writes its records through the claim's `ClaimRecord` and reaches its
crash points. All of it runs under the driver's device locks (`Driver._locked`).

A MIG device is destroyed only after checking it is still the one recorded (GPU instance ids are reused); an admin's
MIG device (every mode but partitionable) is used as it is and never destroyed.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pynvml

from dra_driver.cdi.devnodes import CharDevice, mig_cap_nodes
from dra_driver.cdi.metadata import ClaimInfo, MetadataDevice, container_path
from dra_driver.cdi.spec import ContainerEdits, Mount, claim_spec
from dra_driver.claimstate import steps
from dra_driver.claimstate.checkpoint import ClaimEntry, ClaimState
from dra_driver.claimstate.config import GpuConfig, MigDeviceConfig
from dra_driver.claimstate.context import CallContext
from dra_driver.claimstate.steps import ClaimRecord, Step
from dra_driver.nvml.inventory import MigInstance
from dra_driver.nvml.mig import (
    LiveMig,
    create_mig_device,
    destroy_at,
    destroy_gpu_instance,
    destroy_mig_device,
    disable_mig_if_unused,
    find_mig_device,
    list_gpu_instances,
    mig_enabled,
)
from dra_driver.plugin.catalog import CatalogEntry
from dra_driver.plugin.failures import FailureKind, PrepareError
from dra_driver.sharing import Target, with_edits
from dra_driver.slices.devices import PublishMode

if TYPE_CHECKING:
    from dra_driver.plugin.driver import Driver

log = logging.getLogger("dra_driver.plugin.driver")


@dataclass(frozen=True)
class Checked:
    """A result of this driver that passed every check needing no device lock (`Driver._check`); `Driver._plan`
    checks it against the other claims under the lock, and the prepare steps work from it."""

    request: str
    entry: CatalogEntry
    admin_access: bool
    config: GpuConfig | MigDeviceConfig | None  # sharing
    share_id: str | None  # set for devices several claims hold at once (consumable capacity)
    nodes: list[CharDevice]  # the GPU's device nodes (a MIG device's capability nodes are known once it exists)


@dataclass
class Prepare:
    """One claim's prepare in progress: what its steps hand on to the next."""

    claim: ClaimRecord
    planned: list[Checked]
    call: CallContext
    nodes: dict[str, list[CharDevice]] = field(default_factory=dict)  # device name -> its device nodes
    uuids: list[str] = field(default_factory=list)  # the planned devices' GPU or MIG UUIDs, in order
    edits: ContainerEdits | None = None  # sharing's, for the CDI spec
    pod_claim_name: str | None = None  # the claim's pod-claim-name annotation (made from a template): metadata's path
    mounts: dict[str, list[Mount]] = field(default_factory=dict)  # device name -> its metadata mount, for the spec


@dataclass
class Teardown:
    claim: ClaimRecord
    call: CallContext
    gpus: set[str] = field(default_factory=set)  # GPUs whose MIG mode may go back off


def run_prepare(d: Driver, run: Prepare) -> None:
    """The prepare steps in order, each only if the call's deadline leaves time to start it."""
    entry = run.claim.entry
    for step in steps.PREPARE:
        run.call.check(f"step {step.name} of claim {entry.namespace}/{entry.name}")
        _PREPARE[step](d, run)


def teardown(d: Driver, claim: ClaimRecord, call: CallContext) -> None:
    """Undo a claim, whatever step it reached: the teardown steps in order, each recorded. Safe to repeat after a
    failure or a crash at any step."""
    run = Teardown(claim, call)
    for step in steps.TEARDOWN:
        _TEARDOWN[step](d, run)


def recover(d: Driver, call: CallContext) -> None:
    """At start (in the first call to get the device locks): the recovery steps in order."""
    for step in steps.RECOVERY:
        _RECOVERY[step](d, call)


def finish_interrupted(d: Driver, call: CallContext) -> None:
    """Undo the claims whose prepare or teardown stopped halfway (a full disk failed their undo too), so that their
    devices are free again: under the device locks no other call is working on them."""
    for entry in list(d.checkpoint.claims.values()):
        if entry.state is ClaimState.PREPARE_COMPLETED:
            continue
        try:
            teardown(d, ClaimRecord(d.checkpoint, entry), call)
        except Exception as e:  # still in the way: the claims that need its devices are refused as before
            call.log.error("claim %s: undoing what its interrupted %s left failed again: %s", entry.uid, entry.state, e)


def lost(d: Driver, entry: ClaimEntry) -> str | None:
    """What a PrepareCompleted claim lost since (its MIG device destroyed, its CDI spec removed), or None."""
    for dev in entry.devices:
        if dev.mig is not None and not dev.released and find_mig_device(d.lib, dev.mig) is None:
            return f"its MIG device {dev.device} ({dev.mig.uuid}) no longer exists"
    if not d.cdi.exists(entry.uid):
        return f"its CDI spec {d.cdi.path(entry.uid)} no longer exists"
    return None


# ----- prepare -----------------------------------------------------------------------------------------------------
def _record_started(d: Driver, run: Prepare) -> None:
    run.claim.record(steps.STARTED, "recorded", run.claim.entry)


def _carve_mig(d: Driver, run: Prepare) -> None:
    """Each device's nodes and UUID; a MIG partition carved where the mode carves, recorded once it exists."""
    for index, p in enumerate(run.planned):
        gpu = p.entry.gpu
        if p.entry.profile is None:
            _ensure_whole_gpu(d, p.entry)
            run.nodes[p.entry.name] = p.nodes
            run.uuids.append(gpu.uuid)
            continue
        admins = _existing_mig(d, p.entry)
        if admins is not None:  # an admin's MIG device (static, shared): used as it is, never destroyed
            cap_nodes = mig_cap_nodes(d.proc_root, gpu.minor, admins.gpu_instance_id, admins.compute_instance_id)
            run.nodes[p.entry.name] = p.nodes + cap_nodes
            run.uuids.append(admins.uuid)
            continue
        run.call.check(f"carving MIG device {p.entry.name}")
        live = _mig_for(d, p, run.claim.entry.uid)
        steps.CARVE_MIG.at("done")
        run.claim.record(steps.CARVE_MIG, "recorded", run.claim.entry.with_device(index, mig=live))
        run.nodes[p.entry.name] = p.nodes + mig_cap_nodes(d.proc_root, gpu.minor, live.gi_id, live.ci_id)
        run.uuids.append(live.uuid)


def _apply_sharing(d: Driver, run: Prepare) -> None:
    targets = [
        Target(index, p.entry.name, p.admin_access, p.config, uuid, p.entry.profile is not None)
        for index, (p, uuid) in enumerate(zip(run.planned, run.uuids, strict=True))
    ]
    # the other claims' records say who else holds a shared GPU's settings
    run.edits = d.sharing.apply(run.claim, targets, d.others(run.claim.entry.uid), run.call)


def _write_metadata(d: Driver, run: Prepare) -> None:
    """Each request's devices with their attributes as published, plus the UUID of a MIG device carved now (the
    slice cannot publish it); the file is mounted by the request's first device."""
    if not d.settings.feature_gates.get("DeviceMetadata", False):
        return
    entry = run.claim.entry
    claim = ClaimInfo(entry.namespace, entry.name, entry.uid, run.pod_claim_name)
    requests: dict[str, list[MetadataDevice]] = {}
    first: dict[str, str] = {}  # request -> the device whose CDI entry mounts its file
    for p, uuid in zip(run.planned, run.uuids, strict=True):
        attributes = json.loads(p.entry.device_json).get("attributes", {})
        attributes.setdefault("uuid", {"string": uuid})
        requests.setdefault(p.request, []).append(MetadataDevice(d.settings.pool, p.entry.name, attributes))
        first.setdefault(p.request, p.entry.name)
    for request, host in d.metadata.write(claim, requests).items():
        mount = Mount(
            host_path=str(host),
            container_path=container_path(d.settings.driver, claim, request),
            options=["ro", "bind"],  # upstream's
        )
        run.mounts.setdefault(first[request], []).append(mount)
    steps.WRITE_METADATA.at("done")


def _write_cdi(d: Driver, run: Prepare) -> None:
    uid = run.claim.entry.uid
    spec = claim_spec(d.settings.driver, uid, run.nodes, run.uuids, common=d.driver_edits, mounts=run.mounts)
    d.cdi.write(uid, with_edits(spec, run.edits))
    steps.WRITE_CDI.at("done")
    run.claim.record_state(steps.WRITE_CDI, ClaimState.PREPARE_COMPLETED)


def _carves(d: Driver) -> bool:
    """Whether the mode carves MIG devices (partitionable); every other mode publishes those that exist."""
    return d.settings.mode is PublishMode.PARTITIONABLE


def _existing_mig(d: Driver, entry: CatalogEntry) -> MigInstance | None:
    """The MIG device a published MIG entry stands for, where the mode publishes those that exist; PrepareError if
    it is gone or another one took its place."""
    if _carves(d) or entry.profile is None:
        return None
    gone = FailureKind.DEVICE_UNKNOWN  # the published device is not there any more: a retry finds the same
    for inst in entry.gpu.mig_instances:  # the inventory the entry was published from: its UUID
        if inst.profile_id == entry.profile.id and inst.placement.start == entry.placement_start:
            try:  # by identity, not placement: the device may have been destroyed and made again since
                d.lib.nvmlDeviceGetHandleByUUID(inst.uuid)
            except pynvml.NVMLError as e:
                raise PrepareError(gone, f"MIG device {entry.name} ({inst.uuid}) no longer exists: {e}") from None
            return inst
    raise PrepareError(gone, f"MIG device {entry.name} no longer exists")


def _mig_for(d: Driver, p: Checked, claim_uid: str) -> LiveMig:
    assert p.entry.profile is not None and p.entry.placement_start is not None
    gpu, profile = p.entry.gpu, p.entry.profile
    if p.admin_access:  # admin access shares the partition another claim carved
        for e in d.checkpoint.claims.values():
            for dev in e.devices:
                if dev.device == p.entry.name and dev.mig is not None and not dev.released and e.uid != claim_uid:
                    return dev.mig
        raise PrepareError(FailureKind.MIG, f"admin access to {p.entry.name}: no claim has carved that MIG device")
    return create_mig_device(
        d.lib, gpu.uuid, gpu.minor, profile.id, profile.compute_slices, p.entry.placement_start, profile.memory_slices
    )


def _ensure_whole_gpu(d: Driver, entry: CatalogEntry) -> None:
    """A whole GPU needs MIG off; on Hopper and later it is switched off if no instance is left."""
    handle = d.lib.nvmlDeviceGetHandleByUUID(entry.gpu.uuid)
    if entry.gpu.mig_capable and mig_enabled(d.lib, handle):
        disable_mig_if_unused(d.lib, entry.gpu.uuid, [p.id for p in entry.gpu.mig_profiles])
        if mig_enabled(d.lib, handle):
            raise PrepareError(FailureKind.MIG, f"GPU {entry.gpu.minor} has MIG enabled and cannot be handed out whole")


# ----- teardown ----------------------------------------------------------------------------------------------------
def _record_unprepare_started(d: Driver, run: Teardown) -> None:
    if run.claim.entry.state is not ClaimState.UNPREPARE_STARTED:  # from here on never answered as prepared
        run.claim.record_state(steps.UNPREPARE_STARTED, ClaimState.UNPREPARE_STARTED)


def _undo_sharing(d: Driver, run: Teardown) -> None:
    d.sharing.undo(run.claim, d.others(run.claim.entry.uid), run.call)


def _destroy_mig(d: Driver, run: Teardown) -> None:
    """Destroy the MIG devices the claim carved (skipped, with its record, for a claim holding none); `released` is
    recorded for the devices done, also when one fails."""
    entry = run.claim.entry
    others = {
        dev.mig.uuid
        for e in d.checkpoint.claims.values()
        if e.uid != entry.uid
        for dev in e.devices
        if dev.mig is not None and not dev.released
    }
    released: list[int] = []
    try:
        for index, dev in enumerate(entry.devices):
            cat = d.catalog.get(dev.device)
            # a partition this mode carves; an admin's MIG device (every other mode) is never destroyed
            carved = cat is not None and cat.profile is not None and _carves(d)
            if dev.mig is not None:
                run.gpus.add(dev.mig.parent_uuid)
            elif carved and cat is not None:
                run.gpus.add(cat.gpu.uuid)
            if dev.released or (dev.mig is None and not carved):
                continue
            if not dev.admin_access:  # admin access never destroys the partition it shares
                destroyed = False  # a MIG device already gone
                if dev.mig is not None:
                    destroyed = destroy_mig_device(d.lib, dev.mig, f"MIG device {dev.device} ({dev.mig.uuid})")
                elif cat is not None and cat.profile is not None and cat.placement_start is not None:
                    # crashed before its ids were recorded: find it by profile and placement
                    destroyed = destroy_at(d.lib, cat.gpu.uuid, cat.profile.id, cat.placement_start, others)
                if destroyed:
                    steps.DESTROY_MIG.at("done")
            released.append(index)
    finally:
        if released:
            for index in released:
                entry = entry.with_device(index, released=True)
            run.claim.record(steps.DESTROY_MIG, "recorded", entry)


def _restore_mig_modes(d: Driver, run: Teardown) -> None:
    for uuid in sorted(run.gpus):
        _restore_mig_mode(d, uuid)
    if run.gpus:
        steps.RESTORE_MIG_MODE.at("done")


def _remove_metadata(d: Driver, run: Teardown) -> None:
    entry = run.claim.entry
    if d.metadata.remove(entry.namespace, entry.name, entry.uid):
        steps.REMOVE_METADATA.at("done")


def _remove_cdi(d: Driver, run: Teardown) -> None:
    d.cdi.remove(run.claim.entry.uid)
    steps.REMOVE_CDI.at("done")
    run.claim.drop(steps.REMOVE_CDI)


def _restore_mig_mode(d: Driver, gpu_uuid: str) -> None:
    """MIG off again where the driver carved and no instance is left (Hopper and later)."""
    gpu = d.inventory.gpu_by_uuid(gpu_uuid)
    if gpu is not None and gpu.mig_profiles:
        disable_mig_if_unused(d.lib, gpu_uuid, [p.id for p in gpu.mig_profiles])


# ----- start-up recovery -------------------------------------------------------------------------------------------
def _recovery_started(d: Driver, call: CallContext) -> None:
    steps.RECOVERY_STARTED.at("done")


def _undo_interrupted(d: Driver, call: CallContext) -> None:
    """Finish undoing claims that were being prepared or unprepared, and prepared claims that lost a device."""
    for entry in list(d.checkpoint.claims.values()):
        if entry.state is ClaimState.PREPARE_COMPLETED:
            try:
                gone = lost(d, entry)
            except Exception as e:  # e.g. its GPU fell off the bus: cannot tell, keep it
                log.error("checking prepared claim %s failed: %s", entry.uid, e)
                continue
            if gone is None:
                continue
            log.warning("claim %s/%s (%s) was prepared, but %s: undoing it", entry.namespace, entry.name, entry.uid,
                        gone)  # fmt: skip
        else:
            log.warning("undoing claim %s/%s (%s), interrupted in %s", entry.namespace, entry.name, entry.uid,
                        entry.state)  # fmt: skip
        try:
            teardown(d, ClaimRecord(d.checkpoint, entry), call)
        except Exception as e:  # retried by the claim's next prepare or unprepare
            log.error("undoing claim %s failed: %s", entry.uid, e)
            continue
        steps.UNDO_INTERRUPTED.at("done")


def _remove_orphan_mps(d: Driver, call: CallContext) -> None:
    d.sharing.remove_orphans(set(d.checkpoint.claims))


def _destroy_orphan_mig(d: Driver, call: CallContext) -> None:
    """MIG devices no claim owns (the carving mode only); MIG off again where none is left."""
    if not _carves(d):
        return
    recorded = [dev.mig for e in d.checkpoint.claims.values() for dev in e.devices if dev.mig and not dev.released]
    for gpu in d.inventory.gpus:
        if not gpu.mig_profiles:
            continue
        try:
            handle = d.lib.nvmlDeviceGetHandleByUUID(gpu.uuid)
            if not mig_enabled(d.lib, handle):
                continue
            for view in list_gpu_instances(d.lib, handle, [p.id for p in gpu.mig_profiles]):
                if any(m.parent_uuid == gpu.uuid and view.is_device(m) for m in recorded):
                    continue
                log.warning("destroying MIG GPU instance %d on GPU %d: no prepared claim owns it", view.gi_id,
                            gpu.minor)  # fmt: skip
                destroy_gpu_instance(d.lib, handle, view.gi_id, f"GPU instance {view.gi_id}")
                steps.DESTROY_ORPHAN_MIG.at("done")
            # The driver turns MIG on when it carves: off again where no claim holds a partition, as an unprepare
            # would (also after a crash between destroying the last instance and switching MIG off).
            if not any(m.parent_uuid == gpu.uuid for m in recorded):
                _restore_mig_mode(d, gpu.uuid)
        except Exception as e:  # one broken GPU must not keep the plugin from starting
            log.error("looking for orphan MIG devices on GPU %d failed: %s", gpu.minor, e)


def _remove_orphan_cdi(d: Driver, call: CallContext) -> None:
    """CDI specs no prepared claim owns, and temp files of interrupted writes."""
    completed = {e.uid for e in d.checkpoint.claims.values() if e.state is ClaimState.PREPARE_COMPLETED}
    pending = set(d.checkpoint.claims) - completed  # their teardown failed: it removes their spec later
    for uid in d.cdi.claim_uids() - completed - pending:
        log.warning("removing CDI spec of claim %s: no prepared claim owns it", uid)
        d.cdi.remove(uid)
        steps.REMOVE_ORPHAN_CDI.at("done")
    for tmp in d.cdi.stale_temp_files():
        log.warning("removing %s, left by an interrupted write", tmp)
        tmp.unlink(missing_ok=True)


def _remove_orphan_metadata(d: Driver, call: CallContext) -> None:
    """Metadata directories of claims the checkpoint does not hold: its entry goes last, after its directory, so
    these are another boot's (the plugin directory outlives a reboot)."""
    for uid, path in d.metadata.claim_uids().items():
        if uid not in d.checkpoint.claims:
            log.warning("removing device metadata %s: no claim owns it", path)
            shutil.rmtree(path, ignore_errors=True)


# The handler of every step of the tables, in the tables' order.
_PREPARE: dict[Step, Callable[[Driver, Prepare], None]] = {
    steps.STARTED: _record_started,
    steps.CARVE_MIG: _carve_mig,
    steps.APPLY_SHARING: _apply_sharing,
    steps.WRITE_METADATA: _write_metadata,
    steps.WRITE_CDI: _write_cdi,
}
_TEARDOWN: dict[Step, Callable[[Driver, Teardown], None]] = {
    steps.UNPREPARE_STARTED: _record_unprepare_started,
    steps.UNDO_SHARING: _undo_sharing,
    steps.DESTROY_MIG: _destroy_mig,
    steps.RESTORE_MIG_MODE: _restore_mig_modes,
    steps.REMOVE_METADATA: _remove_metadata,
    steps.REMOVE_CDI: _remove_cdi,
}
_RECOVERY: dict[Step, Callable[[Driver, CallContext], None]] = {
    steps.RECOVERY_STARTED: _recovery_started,
    steps.UNDO_INTERRUPTED: _undo_interrupted,
    steps.REMOVE_ORPHAN_MPS: _remove_orphan_mps,
    steps.DESTROY_ORPHAN_MIG: _destroy_orphan_mig,
    steps.REMOVE_ORPHAN_CDI: _remove_orphan_cdi,
    steps.REMOVE_ORPHAN_METADATA: _remove_orphan_metadata,
}
for _table, _handlers in ((steps.PREPARE, _PREPARE), (steps.TEARDOWN, _TEARDOWN), (steps.RECOVERY, _RECOVERY)):
    if tuple(_handlers) != _table:
        raise AssertionError(f"the handlers {list(_handlers)} do not follow the step table {_table}")
