"""Device health: NVML XID and ECC events, and lost GPUs, turned into device taints.

One thread per node, over the same `NvmlLibrary` as the rest of the driver (real or simulated). It registers every
GPU for XID-critical and ECC events and waits on the event set, as NVIDIA's driver does
(`cmd/gpu-kubelet-plugin/device_health.go`), and keeps a set of *incidents*; the taints of each published device
are derived from them:

- a critical XID, judged by NVML's own verdict where the driver gives one (R565 on: the GPU's recovery action,
  `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, and an event whenever it changes): none (or an IMEX-domain recovery, not
  the GPU's) taints nothing; a drain (`drain-p2p`, `drain-and-reset`) taints the whole GPU and its partitions
  `NoSchedule`, a reset or reboot `NoExecute` (the GPU is unusable until then: running work is lost), key
  `<driver>/xid`, value the XID. Such a taint goes by itself when the action returns to none (the GPU was reset),
  with a `GpuRecovered` Event. Where NVML has no verdict (older drivers), the XID list decides: an XID not on the
  ignore list (default 13, 31, 43, 45, 68, 109: application errors) taints `NoSchedule` until an operator clears
  it. A double-bit ECC error: `NoSchedule`, key `<driver>/ecc`, value `double-bit`. Single-bit (corrected) ECC
  errors are only logged.
- where an event lands: a GPU-level event (GPU and compute instance ids 0xFFFFFFFF) taints the whole GPU and every
  MIG partition published for it. A MIG-level event is routed to the partition whose live instance has the event's
  parent GPU and GPU/compute instance ids: first the plugin checkpoint (the instances this driver carved), then
  NVML (the GPU instance's profile and placement, for instances carved by someone else). Decision: it taints that
  partition **and every device that shares memory slices with it** (the whole GPU and the overlapping placements),
  because those devices would run on the same faulty slices once the instance is gone; partitions elsewhere on the
  GPU stay schedulable. A MIG-level event whose instance cannot be found taints the whole GPU.
- a GPU that stops answering (GPU_IS_LOST from the wait or from a probe): `NoExecute`, key `<driver>/gpu-lost`, on
  the GPU and its partitions. Lost GPUs are left out of the event set and probed on every wait; a GPU that answers
  again loses its gpu-lost taint by itself.
- a GPU whose driver cannot deliver XID events (NOT_SUPPORTED): key `<driver>/unmonitored`, effect `None`
  (informational, Kubernetes 1.35+; `publishable()` drops it for older servers), so it is not trusted silently.

ECC incidents, and XID incidents without NVML's verdict, stay until an operator calls `clear(name)` (a device name,
`gpu-<minor>`, or a GPU UUID; the node daemon serves it on a local socket, `dra_driver.health.admin`): it removes
every XID/ECC incident that tainted that device, on all the devices they tainted (a recovery taint too: operators
keep the last word). The current taints are `taints()` (`{device name: [DeviceTaint]}`), the incidents behind them
`incidents()`; `on_change` is called (from the monitor thread, or from `clear`) whenever they change.

An XID or ECC event whose cause (kind and value) already has an incident on the same GPU and devices updates that
incident (`count`, `last_seen`) rather than adding one: a GPU repeating an XID for months keeps one incident, so the
incidents are bounded by devices and causes, never by events. The other kinds are one per GPU at most. Every
incident ends once healed: a recovery action back to none, a lost GPU answering again, or an operator's `clear`.

Every XID event, ignored ones included (counting is not tainting), is also passed to `on_xid(uuid, xid)` (the
telemetry's XID counter): `uuid` is the MIG device's UUID for a MIG-level event whose MIG device can be found
(checkpoint, then NVML), the GPU's otherwise.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import pynvml

from dra_driver.api.slice import DeviceTaint
from dra_driver.nvml.api import NvmlLibrary, as_text, describe, error_code
from dra_driver.nvml.inventory import GpuInfo, Inventory
from dra_driver.plugin.catalog import CatalogEntry, conflicts
from dra_driver.slices.limits import limits_for
from dra_driver.slices.naming import gpu_device_name

log = logging.getLogger(__name__)

Effect = Literal["None", "NoSchedule", "NoExecute"]
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
GPU_LEVEL = 0xFFFFFFFF
XID = pynvml.nvmlEventTypeXidCriticalError
SINGLE_BIT_ECC = pynvml.nvmlEventTypeSingleBitEccError
DOUBLE_BIT_ECC = pynvml.nvmlEventTypeDoubleBitEccError
RECOVERY = pynvml.nvmlEventTypeGpuRecoveryAction
WANTED_EVENTS = XID | SINGLE_BIT_ECC | DOUBLE_BIT_ECC | RECOVERY
# NVML's recovery actions: their names (in logs and Events) and the taint effect each calls for; None: no taint
RECOVERY_ACTIONS: dict[int, tuple[str, Effect | None]] = {
    pynvml.NVML_GPU_RECOVERY_ACTION_NONE: ("none", None),
    pynvml.NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN: ("recover-imex-domain", None),  # the domain's, not the GPU's
    pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P: ("drain-p2p", "NoSchedule"),
    pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET: ("drain-and-reset", "NoSchedule"),
    pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET: ("gpu-reset", "NoExecute"),
    pynvml.NVML_GPU_RECOVERY_ACTION_BUS_RESET: ("bus-reset", "NoExecute"),
    pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT: ("node-reboot", "NoExecute"),
    pynvml.NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT: ("system-reboot", "NoExecute"),
}
UNKNOWN_ACTION: tuple[str, Effect | None] = ("unknown", "NoExecute")  # a newer driver's action: assume the worst
MAX_DRAINED = 256  # events handled from a set being replaced: a storm must not keep the monitor off the new one
INFORMATIONAL_EFFECT_MINOR = 35  # effect None is accepted from Kubernetes 1.35


def api_time_now() -> str:
    """Now as the API server writes metav1.Time (RFC 3339, UTC, whole seconds): taints' timeAdded, conditions'
    lastTransitionTime."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PluginView(Protocol):
    """What the monitor reads from the kubelet plugin (`dra_driver.plugin.driver.Driver`)."""

    inventory: Inventory
    catalog: dict[str, CatalogEntry]
    checkpoint: Any  # .claims: {uid: ClaimEntry}; devices[].mig: LiveMig | None


class UnknownDeviceError(LookupError):
    """`clear` of a name that is neither a device of this node nor a GPU UUID."""


@dataclass
class Incident:
    kind: str  # xid | ecc | gpu-lost | unmonitored
    gpu_uuid: str
    devices: frozenset[str]
    value: str | None
    effect: Effect
    time_added: str = field(default_factory=api_time_now)  # its first event
    recovery: str | None = None  # NVML's recovery action behind it: the incident ends when the GPU's is none again
    count: int = 1  # the events merged into it
    last_seen: str = ""  # its latest event; time_added until a second one

    def __post_init__(self) -> None:
        if not self.last_seen:
            self.last_seen = self.time_added

    @property
    def clearable(self) -> bool:
        return self.kind in ("xid", "ecc")

    @property
    def cause(self) -> tuple[object, ...]:
        """What makes two events one incident: a repeat is merged into it rather than kept beside it."""
        return (self.kind, self.gpu_uuid, self.devices, self.value, self.effect, self.recovery)


def publishable(taints: Mapping[str, list[DeviceTaint]], k8s_version: str | int) -> dict[str, list[DeviceTaint]]:
    """The taints a server of this version accepts: effect None only from 1.35."""
    minor = limits_for(k8s_version).minor  # "v1.37.2" is 37 (its last number is the patch)
    out: dict[str, list[DeviceTaint]] = {}
    for name, ts in taints.items():
        kept = [t for t in ts if t.effect != "None" or minor >= INFORMATIONAL_EFFECT_MINOR]
        if kept:
            out[name] = kept
    return out


class HealthMonitor:
    def __init__(
        self,
        lib: NvmlLibrary,
        plugin: PluginView,
        driver_name: str,
        *,
        ignored_xids: Iterable[int] = DEFAULT_IGNORED_XIDS,
        wait_ms: int = 1000,  # nvmlEventSetWait cannot be interrupted: the longest `stop` waits for the monitor
        on_change: Callable[[], None] | None = None,
        on_xid: Callable[[str, int], None] | None = None,
        on_event: Callable[[str, str, str], None] | None = None,
    ) -> None:
        """`on_event(type, reason, message)`: a Kubernetes Event to record about the node (a GPU that needs a
        reset or reboot, one that recovered)."""
        self.lib = lib
        self.plugin = plugin
        self.driver_name = driver_name
        self.ignored_xids = frozenset(ignored_xids)
        self.wait_ms = wait_ms
        self.on_change = on_change
        self.on_xid = on_xid
        self.on_event = on_event
        self._last_xid: dict[str, int] = {}  # GPU UUID -> its latest XID, the value of a recovery taint
        self.ready = threading.Event()  # set once every GPU has been registered (or marked) the first time
        self._lock = threading.Lock()
        self._incidents: list[Incident] = []
        self._lost: set[str] = set()  # GPU UUIDs
        self._unmonitored: set[str] = set()
        self._event_set: Any = None
        self._registered: frozenset[str] = frozenset()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ----- public ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="health-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(10.0, 2 * self.wait_ms / 1000))

    def taints(self) -> dict[str, list[DeviceTaint]]:
        """{device name: taints}, one taint per key (the latest incident's value), in a stable order."""
        with self._lock:
            incidents = list(self._incidents)
        by_device: dict[str, dict[str, DeviceTaint]] = {}
        # least recently seen first: the latest event's incident wins, at that event's time, as when every event
        # was an incident of its own
        for inc in incidents:
            taint = DeviceTaint(
                key=f"{self.driver_name}/{inc.kind}", value=inc.value, effect=inc.effect, time_added=inc.last_seen
            )
            for name in inc.devices:
                by_device.setdefault(name, {})[taint.key] = taint
        return {n: [ts[k] for k in sorted(ts)] for n, ts in sorted(by_device.items())}

    def unmonitored(self) -> set[str]:
        with self._lock:
            return set(self._unmonitored)

    def lost(self) -> set[str]:
        with self._lock:
            return set(self._lost)

    def incidents(self) -> list[Incident]:
        """The incidents behind the taints, least recently seen first (copies)."""
        with self._lock:
            return [replace(i) for i in self._incidents]

    def gpu_of(self, uuid: str) -> GpuInfo | None:
        return self.plugin.inventory.gpu_by_uuid(uuid)

    def clear(self, device_or_gpu: str) -> int:
        """Remove the XID/ECC incidents that tainted this device (or GPU, by UUID); returns how many.

        Raises `UnknownDeviceError` (and changes nothing) for a name that is neither a published device, a GPU
        UUID, nor a device some incident still names (one of an older inventory)."""
        names = {device_or_gpu}
        gpu = self.gpu_of(device_or_gpu)
        if gpu is not None:
            names = self._gpu_devices(gpu) | {gpu_device_name(gpu.minor)}
        elif device_or_gpu not in self.plugin.catalog:
            with self._lock:
                named = any(device_or_gpu in i.devices for i in self._incidents)
            if not named:
                raise UnknownDeviceError(f"{device_or_gpu!r} is neither a device of this node nor a GPU UUID")
        with self._lock:
            gone = [i for i in self._incidents if i.clearable and i.devices & names]
            self._incidents = [i for i in self._incidents if i not in gone]
        if gone:
            log.info("health: operator cleared %d incident(s) on %s", len(gone), device_or_gpu)
            self._changed()
        return len(gone)

    # ----- event handling -------------------------------------------------------------------------------
    def handle_event(self, gpu_uuid: str, event_type: int, data: int, gi_id: int, ci_id: int) -> None:
        """One NVML event (public so that it can be fed without a thread)."""
        gpu = self.gpu_of(gpu_uuid)
        if event_type & XID:
            self._count_xid(gpu, gpu_uuid, data, gi_id, ci_id)
        if gpu is None:
            log.warning("health: event 0x%x for unknown GPU %s", event_type, gpu_uuid)
            return
        if event_type & RECOVERY:
            self._recovery_action_is(gpu, data)
            return
        if event_type & XID:
            self._last_xid[gpu.uuid] = data
            action = self.recovery_action(gpu)
            if action is not None:  # NVML's verdict (its change also comes as an event; the later one wins)
                log.info("health: XID %d on %s: NVML's recovery action is %s", data, gpu_uuid, _action(action)[0])
                self._recovery_action_is(gpu, action)
                return
            if data in self.ignored_xids:
                log.info("health: ignoring XID %d on %s", data, gpu_uuid)
                return
            kind, value = "xid", str(data)
        elif event_type & DOUBLE_BIT_ECC:
            kind, value = "ecc", "double-bit"
        else:
            log.info("health: event 0x%x on %s (data %d), not acted on", event_type, gpu_uuid, data)
            return
        devices = self._affected(gpu, gi_id, ci_id)
        log.warning("health: %s %s on %s (gi %d ci %d): tainting %s", kind, value, gpu_uuid, gi_id, ci_id, devices)
        self._add(Incident(kind, gpu.uuid, frozenset(devices), value, "NoSchedule"))

    def recovery_action(self, gpu: GpuInfo) -> int | None:
        """The GPU's recovery action as NVML reports it; None where the driver reports none (before R565)."""
        try:
            handle = self.lib.nvmlDeviceGetHandleByUUID(gpu.uuid)
            (value,) = self.lib.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        except pynvml.NVMLError as err:
            log.info("health: recovery action of %s: %s", gpu.uuid, describe(err))
            return None
        if value.nvmlReturn != pynvml.NVML_SUCCESS:
            return None
        return int(value.value.uiVal)

    def _recovery_action_is(self, gpu: GpuInfo, action: int) -> None:
        """The GPU's recovery action now: its incident (one per GPU) follows it, and ends when it is none."""
        name, effect = _action(action)
        devices = frozenset(self._gpu_devices(gpu))  # a reset or reboot takes the whole GPU, partitions included
        with self._lock:
            before = next((i for i in self._incidents if i.recovery is not None and i.gpu_uuid == gpu.uuid), None)
            if before is not None and (before.recovery, before.effect) == (name, effect):
                return
            self._incidents = [i for i in self._incidents if i is not before]
            if effect is not None:
                value = self._last_xid.get(gpu.uuid)
                self._incidents.append(
                    Incident("xid", gpu.uuid, devices, None if value is None else str(value), effect, recovery=name)
                )
        if effect is not None:
            log.warning("health: GPU %s needs %s: tainting %s %s", gpu.uuid, name, sorted(devices), effect)
            self._event("Warning", "GpuNeedsRecovery", f"GPU {gpu.uuid} (minor {gpu.minor}) needs {name} "
                        f"(NVML recovery action): its devices are tainted {effect}")  # fmt: skip
        elif before is not None:
            log.info("health: GPU %s recovered (recovery action %s): taint removed", gpu.uuid, name)
            self._event("Normal", "GpuRecovered", f"GPU {gpu.uuid} (minor {gpu.minor}) recovered: NVML's recovery "
                        f"action is {name} again, its {before.recovery} taint is removed")  # fmt: skip
        else:
            return
        self._changed()

    def _event(self, event_type: str, reason: str, message: str) -> None:
        _hook("on_event", self.on_event, event_type, reason, message)

    def _count_xid(self, gpu: GpuInfo | None, gpu_uuid: str, xid: int, gi_id: int, ci_id: int) -> None:
        if self.on_xid is None:
            return
        uuid = gpu_uuid
        if gpu is not None and gi_id != GPU_LEVEL:
            uuid = self._mig_uuid(gpu, gi_id, ci_id) or gpu_uuid
        _hook("on_xid", self.on_xid, uuid, xid)

    def _carved(self, gpu: GpuInfo, gi_id: int, ci_id: int) -> Any:
        """The checkpoint's prepared device whose live MIG instance has these ids (CI GPU_LEVEL: any), or None."""
        for claim in list(self.plugin.checkpoint.claims.values()):
            for d in claim.devices:
                mig = d.mig
                if (
                    mig is not None
                    and mig.parent_uuid == gpu.uuid
                    and mig.gi_id == gi_id
                    and ci_id in (mig.ci_id, GPU_LEVEL)
                ):
                    return d
        return None

    def _mig_uuid(self, gpu: GpuInfo, gi_id: int, ci_id: int) -> str | None:
        """The UUID of the MIG device with this GPU instance (and compute instance, unless GPU_LEVEL)."""
        carved = self._carved(gpu, gi_id, ci_id)
        if carved is not None:
            return str(carved.mig.uuid)
        try:
            parent = self.lib.nvmlDeviceGetHandleByUUID(gpu.uuid)
            for index in range(int(self.lib.nvmlDeviceGetMaxMigDeviceCount(parent))):
                try:
                    mig_handle = self.lib.nvmlDeviceGetMigDeviceHandleByIndex(parent, index)
                except pynvml.NVMLError:
                    continue  # no MIG device at this index
                if self.lib.nvmlDeviceGetGpuInstanceId(mig_handle) == gi_id and ci_id in (
                    self.lib.nvmlDeviceGetComputeInstanceId(mig_handle),
                    GPU_LEVEL,
                ):
                    return as_text(self.lib.nvmlDeviceGetUUID(mig_handle))
        except pynvml.NVMLError as err:
            log.info("health: MIG devices of %s: %s", gpu.uuid, describe(err))
        return None

    def _gpu_devices(self, gpu: GpuInfo) -> set[str]:
        return {n for n, e in self.plugin.catalog.items() if e.gpu.uuid == gpu.uuid}

    def _affected(self, gpu: GpuInfo, gi_id: int, ci_id: int) -> set[str]:
        if gi_id == GPU_LEVEL:
            return self._gpu_devices(gpu)
        name = self._mig_device(gpu, gi_id, ci_id)
        entry = self.plugin.catalog.get(name) if name else None
        if name is None or entry is None:
            log.warning("health: no MIG device of %s has GI %d CI %d: tainting the whole GPU", gpu.uuid, gi_id, ci_id)
            return self._gpu_devices(gpu)
        return {name} | {n for n, e in self.plugin.catalog.items() if conflicts(entry, e)}

    def _mig_device(self, gpu: GpuInfo, gi_id: int, ci_id: int) -> str | None:
        """The published name of the partition with this live instance: checkpoint first, then NVML."""
        carved = self._carved(gpu, gi_id, ci_id)
        if carved is not None:
            return str(carved.device)
        try:
            handle = self.lib.nvmlDeviceGetHandleByUUID(gpu.uuid)
            info = self.lib.nvmlGpuInstanceGetInfo(self.lib.nvmlDeviceGetGpuInstanceById(handle, gi_id))
        except pynvml.NVMLError as err:
            log.info("health: GPU instance %d of %s: %s", gi_id, gpu.uuid, describe(err))
            return None
        for name, entry in self.plugin.catalog.items():
            if (
                entry.gpu.uuid == gpu.uuid
                and entry.profile is not None
                and entry.profile.id == info.profileId
                and entry.placement_start == info.placement.start
            ):
                return name
        return None

    def _add(self, incident: Incident) -> None:
        """A new XID/ECC incident, or a repeat of one: then merged into it and moved last (the latest seen)."""
        with self._lock:
            same = next((i for i in self._incidents if i.cause == incident.cause), None)
            if same is not None:
                self._incidents.remove(same)
                same.count += 1
                same.last_seen = incident.time_added
                incident = same
            self._incidents.append(incident)
        self._changed()

    def _changed(self) -> None:
        _hook("on_change", self.on_change)

    def _set_lost(self, gpu: GpuInfo, lost: bool) -> None:
        with self._lock:
            if lost == (gpu.uuid in self._lost):
                return
            if lost:
                self._lost.add(gpu.uuid)
                devices = frozenset(self._gpu_devices(gpu))
                self._incidents.append(Incident("gpu-lost", gpu.uuid, devices, None, "NoExecute"))
            else:
                self._lost.discard(gpu.uuid)
                self._incidents = [i for i in self._incidents if not (i.kind == "gpu-lost" and i.gpu_uuid == gpu.uuid)]
        log.warning("health: GPU %s (minor %d) %s", gpu.uuid, gpu.minor, "is lost" if lost else "answers again")
        self._changed()

    def _set_unmonitored(self, gpu: GpuInfo, reason: str) -> None:
        with self._lock:
            if gpu.uuid in self._unmonitored:
                return
            self._unmonitored.add(gpu.uuid)
            devices = frozenset(self._gpu_devices(gpu))
            self._incidents.append(Incident("unmonitored", gpu.uuid, devices, reason, "None"))
        log.warning("health: GPU %s is not monitored: %s", gpu.uuid, reason)
        self._changed()

    # ----- the thread -----------------------------------------------------------------------------------
    def probe(self) -> None:
        """Ask every GPU something cheap: GPU_IS_LOST marks it lost, an answer clears a loss."""
        for gpu in self.plugin.inventory.gpus:
            try:
                self.lib.nvmlDeviceGetUUID(self.lib.nvmlDeviceGetHandleByIndex(gpu.index))
            except pynvml.NVMLError as e:
                if error_code(e) == pynvml.NVML_ERROR_GPU_IS_LOST:
                    self._set_lost(gpu, True)
                continue
            self._set_lost(gpu, False)

    def _register(self) -> None:
        """(Re)create the event set with every GPU that is neither lost nor unmonitored."""
        with self._lock:
            wanted = frozenset(
                g.uuid for g in self.plugin.inventory.gpus if g.uuid not in self._lost | self._unmonitored
            )
        if self._event_set is not None and wanted == self._registered:
            return
        # The new set first, then what the old one queued meanwhile: an event between freeing one set and creating
        # the next would be in neither (an XID on another GPU just as one is lost). One that comes in the moment
        # both exist is handled twice, which taints nothing more.
        old, self._event_set = self._event_set, None
        try:
            self._event_set = self.lib.nvmlEventSetCreate()
        finally:
            if old is not None:
                self._drain(old)
                self._free_set(old)
        registered: set[str] = set()
        for gpu in self.plugin.inventory.gpus:
            if gpu.uuid not in wanted:
                continue
            try:
                handle = self.lib.nvmlDeviceGetHandleByIndex(gpu.index)
                supported = self.lib.nvmlDeviceGetSupportedEventTypes(handle)
                if not supported & XID:
                    self._set_unmonitored(gpu, "xid-events-not-supported")
                    continue
                self.lib.nvmlDeviceRegisterEvents(handle, WANTED_EVENTS & supported, self._event_set)
                registered.add(gpu.uuid)
                if supported & RECOVERY and (action := self.recovery_action(gpu)) is not None:
                    self._recovery_action_is(gpu, action)  # what it needed before we listened (a daemon restart)
            except pynvml.NVMLError as e:
                code = error_code(e)
                if code == pynvml.NVML_ERROR_NOT_SUPPORTED:
                    self._set_unmonitored(gpu, "events-not-supported")
                elif code == pynvml.NVML_ERROR_GPU_IS_LOST:
                    self._set_lost(gpu, True)
                else:
                    log.warning("health: cannot register events on %s: %s", gpu.uuid, describe(e))
        # GPUs found lost or unmonitored just now are no longer wanted; others that failed are retried next pass
        with self._lock:
            now_wanted = frozenset(u for u in wanted if u not in self._lost | self._unmonitored)
        self._registered = now_wanted if registered == now_wanted else frozenset({""})

    def _free(self) -> None:
        if self._event_set is not None:
            self._free_set(self._event_set)
            self._event_set = None

    def _free_set(self, event_set: Any) -> None:
        try:
            self.lib.nvmlEventSetFree(event_set)
        except pynvml.NVMLError as e:
            log.info("health: freeing the event set: %s", describe(e))

    def _run(self) -> None:
        self.lib.nvmlInit()
        try:
            while not self._stop.is_set():
                try:
                    self.step()
                except Exception:
                    log.exception("health: monitor pass failed")
                    self._stop.wait(self.wait_ms / 1000)
        finally:
            self._free()
            self.lib.nvmlShutdown()

    def step(self) -> None:
        """One pass: probe lost GPUs, (re)register, wait once for an event and handle it."""
        if self.lost():
            self.probe()
        self._register()
        self.ready.set()
        if not self._wanted_any():
            self._stop.wait(self.wait_ms / 1000)  # nothing to wait on: just probe again later
            return
        try:
            event = self.lib.nvmlEventSetWait(self._event_set, self.wait_ms)
        except pynvml.NVMLError as e:
            code = error_code(e)
            if code == pynvml.NVML_ERROR_TIMEOUT:
                return
            if code == pynvml.NVML_ERROR_GPU_IS_LOST:
                self.probe()  # which one; it is then left out of the event set
                return
            log.warning("health: waiting for events: %s", describe(e))
            self._stop.wait(min(1.0, self.wait_ms / 1000))
            return
        self._handle(event)

    def _handle(self, event: Any) -> None:
        try:
            gpu_uuid = self.lib.nvmlDeviceGetUUID(event.device)
        except pynvml.NVMLError as e:
            log.warning("health: event 0x%x from an unnamed GPU: %s", event.eventType, describe(e))
            return
        self.handle_event(
            gpu_uuid, int(event.eventType), int(event.eventData), int(event.gpuInstanceId), int(event.computeInstanceId)
        )

    def _drain(self, event_set: Any) -> None:
        """Handle what is queued in `event_set` already (its GPUs' events stop at a lost one)."""
        for _ in range(MAX_DRAINED):
            try:
                event = self.lib.nvmlEventSetWait(event_set, 0)
            except pynvml.NVMLError:  # timeout: nothing queued; GPU_IS_LOST: the rest was that GPU's
                return
            self._handle(event)

    def _wanted_any(self) -> bool:
        with self._lock:
            return any(g.uuid not in self._lost | self._unmonitored for g in self.plugin.inventory.gpus)


def _action(action: int) -> tuple[str, Effect | None]:
    return RECOVERY_ACTIONS.get(action, UNKNOWN_ACTION)


def _hook(name: str, hook: Callable[..., None] | None, *args: Any) -> None:
    """Call one of the monitor's hooks: its failure is logged, never the monitor's."""
    if hook is None:
        return
    try:
        hook(*args)
    except Exception:
        log.exception("health: %s failed", name)
