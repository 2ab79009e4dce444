"""Keeps this node's ResourceSlice pool in the API server equal to what the slice builder says.

Writes follow the pool protocol the scheduler relies on: a content change bumps the pool generation, every
slice of the new generation is written (each carrying the new resourceSliceCount), and only then are slices
of older generations or beyond the new count deleted. A reader that sees a partly written new generation
finds fewer slices than resourceSliceCount and treats the pool as incomplete rather than misreading it.

A watch on the pool's slices repairs edits and deletions made behind our back (the kubelet deletes a
node's slices when it restarts); failures are retried with exponential backoff and full jitter. Each watch
window resumes where the last one ended (its last event's resourceVersion): a watch from the current state
replays every slice as ADDED, so restarting every window that way cost a full reconcile (a list and the slices
built) per node every WATCH_SECONDS, and the API server a dump of the pool. That resync happens every
RESYNC_WINDOWS windows instead, and after a broken or expired (410) watch.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from dra_driver.api import GROUP, VERSION
from dra_driver.api.slice import LIST_KINDS, ResourceSlice
from dra_driver.controller.metrics import PublisherMetrics
from dra_driver.kube.rest import ApiError, Watch, as_rest, path_of
from dra_driver.slices.limits import LIST_ATTRIBUTES_GATE

log = logging.getLogger(__name__)

PLURAL = "resourceslices"
WATCH_SECONDS = 30  # the server ends each watch after this
RESYNC_WINDOWS = 10  # every 10th window starts from the current state: a full reconcile every 5 minutes
SliceSource = Callable[[int, str | None], list[ResourceSlice]]  # (generation, node uid) -> desired slices


@dataclass
class PublisherStats:
    requests: int = 0
    writes: int = 0
    errors: int = 0
    syncs: int = 0
    by_verb: dict[str, int] = field(default_factory=dict)


_RACES = frozenset({404, 409})  # Not Found, Conflict: the pool changed under a write
_INVALID = 422


class ListAttributesRejected(ValueError):
    """The API server refused a slice with list attributes: without DRAListTypeAttributes it drops the list values
    and rejects the attributes left without one. The driver cannot see the cluster's gates, so it never falls back
    to the scalar form by itself (upstream's deviceattribute says the same): the operator chooses."""

    def __init__(self, slice_name: str, attributes: list[str], error: ApiError) -> None:
        super().__init__(
            f"the API server rejected ResourceSlice {slice_name}, whose attributes {', '.join(attributes)} are "
            f"lists: list-type attributes need the {LIST_ATTRIBUTES_GATE} feature gate on the kube-apiserver and "
            f"the kube-scheduler; turn it on there, or publish numaNode in scalar form (--numa-node-form scalar, the "
            f"chart's numaNodeForm: scalar). The API server said: {error.message}"
        )


def _list_attributes(obj: dict[str, Any]) -> list[str]:
    return sorted(
        {
            name
            for d in obj.get("spec", {}).get("devices") or []
            for name, value in (d.get("attributes") or {}).items()
            if any(k in value for k in LIST_KINDS)
        }
    )


QUIET_RACES = 3


def _content(obj: dict[str, Any]) -> dict[str, Any]:
    """What must match for a stored slice to count as published: its labels and annotations (the node's
    configuration), the spec without the generation, and without what the API server fills in itself (a taint's
    timeAdded), which would otherwise look like a difference on every pass and republish forever."""
    meta = obj.get("metadata", {})
    spec = dict(obj.get("spec", {}))
    pool = dict(spec.get("pool", {}))
    pool.pop("generation", None)
    spec["pool"] = pool
    if spec.get("devices"):
        spec["devices"] = [
            {**d, "taints": [{k: v for k, v in t.items() if k != "timeAdded"} for t in d["taints"]]}
            if d.get("taints")
            else d
            for d in spec["devices"]
        ]
    return {"metadata": {k: meta.get(k) or {} for k in ("labels", "annotations")}, "spec": spec}


class Publisher:
    def __init__(
        self,
        api_client: Any,
        *,
        node_name: str,
        driver: str,
        desired: SliceSource,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        metrics: PublisherMetrics | None = None,
    ) -> None:
        self._rest = as_rest(api_client)  # a KubeRest or an official-client ApiClient
        self._path = path_of(GROUP, VERSION, PLURAL)
        self.node_name = node_name
        self.driver = driver
        self._desired = desired
        self._selector = f"spec.driver={driver},spec.nodeName={node_name}"
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._current_watch: Watch | None = None
        self._threads: list[threading.Thread] = []
        self._backoff = (backoff_initial, backoff_max)
        self._node_uid: str | None = None
        self.stats = PublisherStats()
        self.metrics = metrics or PublisherMetrics()
        self.in_sync = threading.Event()
        self.last_error: str | None = None

    # ----- API calls, counted --------------------------------------------------------------------------------
    _METHODS: Final = {"get": "GET", "list": "GET", "create": "POST", "replace": "PUT", "delete": "DELETE"}

    def _call(self, verb: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Any:
        self.stats.requests += 1
        self.stats.by_verb[verb] = self.stats.by_verb.get(verb, 0) + 1
        self.metrics.api_requests.labels(verb=verb).inc()
        if verb in ("create", "replace", "delete"):
            self.stats.writes += 1
        return self._rest.request(self._METHODS[verb], path, query=query, body=body, timeout=10)

    def _list(self) -> list[dict[str, Any]]:
        got = self._call("list", self._path, query={"fieldSelector": self._selector})
        return list(got.get("items") or [])

    def _slice(self, name: str) -> str:
        return path_of(GROUP, VERSION, PLURAL, name)

    # ----- reconcile -----------------------------------------------------------------------------------------
    def sync_once(self) -> bool:
        """One reconcile pass. True when it changed something."""
        self.stats.syncs += 1
        if self._node_uid is None:
            node = self._call("get", path_of("", "v1", "nodes", self.node_name))
            self._node_uid = str(node["metadata"]["uid"])
        existing = self._list()
        generation = max((int(o["spec"]["pool"].get("generation", 0)) for o in existing), default=0)
        desired = [s.to_api() for s in self._desired(generation or 1, self._node_uid)]
        current = [o for o in existing if int(o["spec"]["pool"].get("generation", 0)) == generation]
        by_name = {o["metadata"]["name"]: o for o in existing}
        if len(current) == len(desired) == len(existing) and all(
            d["metadata"]["name"] in by_name and _content(by_name[d["metadata"]["name"]]) == _content(d)
            for d in desired
        ):
            return False
        new_generation = generation + 1
        for d in [s.to_api() for s in self._desired(new_generation, self._node_uid)]:
            name = d["metadata"]["name"]
            try:
                if name in by_name:
                    d["metadata"]["resourceVersion"] = by_name[name]["metadata"]["resourceVersion"]
                    self._call("replace", self._slice(name), d)
                else:
                    self._call("create", self._path, d)
            except ApiError as e:
                listed = _list_attributes(d)
                if e.status == _INVALID and listed:
                    raise ListAttributesRejected(name, listed, e) from e
                raise
            by_name.pop(name, None)
        for name in by_name:  # old generations and slices beyond the new count, after the new pool is complete
            self._call("delete", self._slice(name))
        self.metrics.devices.set(sum(len(d["spec"].get("devices") or []) for d in desired))
        self.metrics.generation.set(new_generation)
        log.info("published pool %s generation %d", self.node_name, new_generation)
        return True

    def trigger(self) -> None:
        """Reconcile soon (inventory or health changed)."""
        self.in_sync.clear()
        self._wake.set()

    def _loop(self) -> None:
        delay = self._backoff[0]
        races = 0  # writes in a row that found the pool changed under them
        while not self._stop.is_set():
            self._wake.clear()
            try:
                with self.metrics.duration.time():
                    changed = self.sync_once()
                self.metrics.publishes.labels(result="published" if changed else "unchanged").inc()
                self.last_error = None
                self.in_sync.set()
                delay, races = self._backoff[0], 0
                self._wake.wait()
            except (ApiError, OSError, ValueError) as e:  # API down, conflict, timeout: retry
                self.stats.errors += 1
                self.metrics.publishes.labels(result="error").inc()
                self.in_sync.clear()
                self.last_error = f"{type(e).__name__}: {getattr(e, 'reason', None) or e}"
                races = races + 1 if isinstance(e, ApiError) and e.status in _RACES else 0
                # a slice deleted or changed between the list and the write (a restarting kubelet wipes the
                # node's slices, at its start and again when the plugin registers): routine, the next pass lists
                # again; more than a few in a row, it is a problem. Refused list attributes need the operator: an
                # error, retried only so that the pool appears once the gate is on.
                quiet = 0 < races <= QUIET_RACES
                (log.error if isinstance(e, ListAttributesRejected) else log.info if quiet else log.warning)(
                    "publishing pool %s failed (%s); retrying", self.node_name, self.last_error
                )
                self._wake.wait(random.uniform(0, delay))  # full jitter
                delay = min(delay * 2, self._backoff[1])
            except Exception as e:  # connection errors, timeouts and the like
                self.stats.errors += 1
                self.metrics.publishes.labels(result="error").inc()
                self.in_sync.clear()
                self.last_error = f"{type(e).__name__}: {e}"
                log.warning("publishing pool %s failed (%s); retrying", self.node_name, self.last_error)
                self._wake.wait(random.uniform(0, delay))
                delay = min(delay * 2, self._backoff[1])

    def _watch(self) -> None:
        delay = self._backoff[0]
        version = ""  # where the next window resumes; "" starts from the current state (every slice ADDED)
        windows = 0
        while not self._stop.is_set():
            w: Watch | None = None
            if windows % RESYNC_WINDOWS == 0:
                version = ""
            windows += 1
            try:
                w = self._current_watch = self._rest.watch(
                    self._path, resource_version=version, seconds=WATCH_SECONDS, fieldSelector=self._selector
                )
                if self._stop.is_set():  # stop() ran before this watch existed
                    break
                for kind, obj in w:
                    if self._stop.is_set():
                        break
                    version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                    if kind in ("DELETED", "MODIFIED", "ADDED"):
                        self._wake.set()  # the reconcile compares content: our own writes cost one list
                delay = self._backoff[0]
            except Exception as e:  # broken, or 410 Gone (the version was compacted away): from the current state
                log.debug("watch of pool %s ended: %s", self.node_name, e)
                version = ""
                self._stop.wait(random.uniform(0, delay))
                delay = min(delay * 2, self._backoff[1])
            finally:
                if w is not None:
                    w.stop()

    def start(self) -> None:
        for target in (self._loop, self._watch):
            t = threading.Thread(target=target, name=f"publisher-{target.__name__}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        # Watch.stop() shuts the stream's socket down, so the watch thread does not sit out the server-side
        # timeout (30 s: as long as a pod's default grace period) before the daemon can remove its sockets.
        w = self._current_watch
        if w is not None:
            w.stop()
        for t in self._threads:
            t.join(timeout=35)
