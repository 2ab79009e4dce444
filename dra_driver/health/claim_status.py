"""Device health in the status of the ResourceClaims prepared on this node (``status.devices[].conditions``).

For every claim the plugin prepared (its checkpoint), each device it holds from this driver and pool gets an
``AllocatedDeviceStatus`` entry with one condition, type ``DeviceHealthy``:

- ``False`` while the device carries an XID, ECC or gpu-lost taint; reason ``XID``, ``ECC`` or ``GPULost`` (the
  most severe: GPULost, ECC, XID), message naming what happened (the XID, since when, the taint);
- ``Unknown`` while it is only marked unmonitored (reason ``Unmonitored``): nothing can be said about it;
- ``True`` (reason ``Healthy``) once its taints are gone: recovered, or cleared by an operator.

With a `data` source (the node daemon's: `dra_driver.health.device_data`), every prepared claim gets its entries
at once, each with ``data`` describing the device (UUID, MIG profile and placement, compute mode, sharing, driver
and CUDA versions), rewritten when the data or the health changes. Without one, a claim gets entries only once one
of its devices is unhealthy (or at start, when a previous run left entries behind); then every change is written.
``lastTransitionTime`` changes only when the status does.

Writes are server-side apply on the status subresource under field manager ``dra-driver-health``: this driver
owns only its own entries (list-map key driver, pool, device, shareID), entries of other drivers and writers
stay. The apply carries the claim's UID (the API server refuses a different one), so a claim deleted and created
again under the same name is never written by mistake. Writes run in their own thread (`trigger()` from the
health monitor's `on_change`, and a periodic resync), never in the monitor's: a failure is logged and retried
on the next change or resync, with backoff.
RBAC: ``patch`` on ``resourceclaims/status`` and, with Kubernetes 1.36's granular status authorization,
``associated-node:patch`` on ``resourceclaims/driver`` for this driver's name.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from dra_driver.api import API_VERSION
from dra_driver.api.claim import ResourceClaim
from dra_driver.api.slice import DeviceTaint
from dra_driver.claimstate.checkpoint import CheckpointedDevice, ClaimEntry, ClaimState
from dra_driver.health.monitor import api_time_now

log = logging.getLogger(__name__)

CONDITION_TYPE = "DeviceHealthy"
FIELD_MANAGER = "dra-driver-health"
SEVERITY = ("gpu-lost", "ecc", "xid", "unmonitored")  # taint kinds, most severe first
REASONS = {"gpu-lost": "GPULost", "ecc": "ECC", "xid": "XID", "unmonitored": "Unmonitored"}


class ClaimStatusApi(Protocol):
    """What the reporter needs from the API server (`dra_driver.plugin.claims.KubeClaimSource`)."""

    def get_claim(self, namespace: str, name: str) -> ResourceClaim: ...

    def apply_claim_status(self, namespace: str, name: str, body: dict[str, Any], field_manager: str) -> None: ...


@dataclass(frozen=True)
class Condition:
    status: str  # True | False | Unknown
    reason: str
    message: str
    last_transition_time: str = ""

    def same(self, other: Condition) -> bool:
        return (self.status, self.reason, self.message) == (other.status, other.reason, other.message)

    def to_api(self) -> dict[str, str]:
        return {
            "type": CONDITION_TYPE,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": self.last_transition_time,
        }


Key = tuple[str, str, str | None]  # pool, device, shareID (the driver is always this one)
DeviceData = Callable[[ClaimEntry, CheckpointedDevice], dict[str, Any] | None]


@dataclass(frozen=True)
class Entry:
    """What this driver says of one device in a claim's status."""

    condition: Condition
    data: dict[str, Any] | None = None

    def same(self, other: Entry) -> bool:
        return self.condition.same(other.condition) and self.data == other.data


def _describe(kind: str, taint: DeviceTaint) -> str:
    since = f" since {taint.time_added}" if taint.time_added else ""
    what = {
        "xid": f"XID {taint.value}",
        "ecc": f"{taint.value or 'uncorrectable'} ECC error",
        "gpu-lost": "GPU lost (not answering NVML)",
        "unmonitored": f"not monitored ({taint.value})" if taint.value else "not monitored",
    }.get(kind, kind)
    shown = f"{taint.key}={taint.value}" if taint.value else taint.key
    return f"{what}{since} (taint {shown}:{taint.effect})"


def device_condition(device: str, taints: Iterable[DeviceTaint]) -> Condition:
    """The DeviceHealthy condition of a device with these taints (this driver's `<driver>/<kind>` keys)."""
    by_kind = {t.key.rsplit("/", 1)[-1]: t for t in taints}
    kinds = [k for k in SEVERITY if k in by_kind] + sorted(k for k in by_kind if k not in SEVERITY)
    if not kinds:
        return Condition("True", "Healthy", f"{device}: no health taint")
    worst = kinds[0]
    status = "Unknown" if worst == "unmonitored" else "False"
    reason = REASONS.get(worst, "Tainted")
    return Condition(status, reason, f"{device}: " + "; ".join(_describe(k, by_kind[k]) for k in kinds))


class ClaimStatusReporter:
    def __init__(
        self,
        api: ClaimStatusApi,
        driver_name: str,
        claims: Callable[[], Iterable[ClaimEntry]],
        taints: Callable[[], Mapping[str, list[DeviceTaint]]],
        *,
        resync_seconds: float = 30.0,
        retry_seconds: float = 5.0,
        clock: Callable[[], str] = api_time_now,
        data: DeviceData | None = None,
    ) -> None:
        self.api = api
        self.data = data
        self.driver_name = driver_name
        self.claims = claims
        self.taints = taints
        self.resync_seconds = resync_seconds
        self.retry_seconds = retry_seconds
        self.clock = clock
        self._applied: dict[str, dict[Key, Entry]] = {}  # claim uid -> what its status says now
        self._unverified: set[str] | None = None  # claims prepared before this process: read their status once
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sync_lock = threading.Lock()

    # ----- thread -----------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="claim-health-status", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def trigger(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                ok = self.sync_once()
            except Exception:
                log.exception("claim health status: sync failed")
                ok = False
            failures = 0 if ok else failures + 1
            delay = min(self.resync_seconds, self.retry_seconds * 2 ** min(failures - 1, 10)) if failures else None
            self._wake.wait(self.resync_seconds if delay is None else delay)
            self._wake.clear()

    # ----- one pass ---------------------------------------------------------------------------------------
    def sync_once(self) -> bool:
        """Write what changed; True when every claim's status is up to date."""
        with self._sync_lock:
            return self._sync()

    def _sync(self) -> bool:
        taints = self.taints()
        entries = [e for e in self.claims() if e.state is ClaimState.PREPARE_COMPLETED]
        live = {e.uid for e in entries}
        self._applied = {uid: v for uid, v in self._applied.items() if uid in live}
        if self._unverified is None:
            self._unverified = set(live)
        self._unverified &= live
        ok = True
        for entry in entries:
            try:
                self._sync_claim(entry, taints)
            except Exception as e:
                ok = False
                log.warning("claim %s/%s: writing device health failed: %s", entry.namespace, entry.name, e)
        return ok

    def _desired(self, entry: ClaimEntry, taints: Mapping[str, list[DeviceTaint]]) -> dict[Key, Entry]:
        return {
            (d.pool, d.device, d.share_id): Entry(
                device_condition(d.device, taints.get(d.device, [])), self.data(entry, d) if self.data else None
            )
            for d in entry.devices
        }

    def _sync_claim(self, entry: ClaimEntry, taints: Mapping[str, list[DeviceTaint]]) -> None:
        desired = self._desired(entry, taints)
        if not desired:
            return
        assert self._unverified is not None
        if entry.uid in self._unverified:  # a previous run may have written this claim: read what it says
            self._applied[entry.uid] = self._read(entry)
            self._unverified.discard(entry.uid)
        applied = self._applied.get(entry.uid, {})
        if not applied and self.data is None and all(e.condition.status == "True" for e in desired.values()):
            return  # healthy and never reported, nothing else to say: nothing to write
        if applied.keys() == desired.keys() and all(applied[k].same(e) for k, e in desired.items()):
            return
        now = self.clock()
        written: dict[Key, Entry] = {}
        for key, e in desired.items():
            before, c = applied.get(key), e.condition
            kept = before is not None and before.condition.status == c.status
            since = before.condition.last_transition_time if before is not None and kept else ""
            written[key] = Entry(Condition(c.status, c.reason, c.message, since or now), e.data)
        body = {
            "apiVersion": API_VERSION,
            "kind": "ResourceClaim",
            "metadata": {"name": entry.name, "namespace": entry.namespace, "uid": entry.uid},
            "status": {"devices": [self._entry(k, c) for k, c in sorted(written.items(), key=lambda kv: str(kv[0]))]},
        }
        try:
            self.api.apply_claim_status(entry.namespace, entry.name, body, FIELD_MANAGER)
        except Exception as e:
            if _gone(e):  # the claim is gone, or was replaced (another UID): nothing to write
                log.info(
                    "claim %s/%s (%s) is gone: not writing its device health", entry.namespace, entry.name, entry.uid
                )
                self._applied[entry.uid] = written
                return
            raise
        self._applied[entry.uid] = written
        log.info(
            "claim %s/%s: device health %s",
            entry.namespace,
            entry.name,
            ", ".join(f"{k[1]}={e.condition.status}({e.condition.reason})" for k, e in written.items()),
        )

    def _entry(self, key: Key, e: Entry) -> dict[str, Any]:
        pool, device, share_id = key
        out: dict[str, Any] = {"driver": self.driver_name, "pool": pool, "device": device}
        if share_id:
            out["shareID"] = share_id
        out["conditions"] = [e.condition.to_api()]
        if e.data is not None:
            out["data"] = e.data
        return out

    def _read(self, entry: ClaimEntry) -> dict[Key, Entry]:
        """Our DeviceHealthy conditions on the claim as the API server has it ({} when it was replaced)."""
        try:
            claim = self.api.get_claim(entry.namespace, entry.name)
        except Exception as e:
            if _status(e) == 404:
                return {}
            raise
        if claim.metadata.uid != entry.uid:
            return {}
        out: dict[Key, Entry] = {}
        for d in claim.status.devices:
            if d.driver != self.driver_name:
                continue
            for c in d.conditions:
                if c.type == CONDITION_TYPE:
                    condition = Condition(c.status, c.reason, c.message, c.last_transition_time)
                    out[(d.pool, d.device, d.share_id)] = Entry(condition, d.data)
        return out


def _status(e: BaseException) -> int | None:
    status = getattr(e, "status", None)
    return status if isinstance(status, int) else None


def _gone(e: BaseException) -> bool:
    """The claim does not exist (404), or exists under another UID: the API server refuses an apply whose
    metadata.uid differs (422, "metadata.uid: field is immutable")."""
    status = _status(e)
    return status == 404 or (status == 422 and '"field":"metadata.uid"' in str(getattr(e, "body", "") or ""))
