"""DeviceClasses read through a list+watch cache instead of a GET per prepared claim.

Why a cached class is safe enough: the kube-scheduler allocated the claim against DeviceClasses from its own
informer, which is exactly as eventually consistent as this watch; the plugin's re-check of class selectors
(`Driver._check`) is defence in depth (the Go kubeletplugin helper does no such re-check at all). A class
changed in the last watch lag (milliseconds) can be seen at its previous version, the version the scheduler
may have allocated against too; a cache that is not in sync (not yet listed, watch broken, list over the
size bound) answers nothing and the caller GETs, so a stale class is never kept past a failed watch. Claims
are not cached: a claim is prepared moments after its allocation is written, when a watch may not have
delivered it yet, and its UID must match the kubelet's; a GET is the only answer that is always current.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from dra_driver.api import GROUP, VERSION
from dra_driver.api.claim import ResourceClaim
from dra_driver.api.deviceclass import DeviceClass
from dra_driver.kube import listwatch
from dra_driver.kube.rest import as_rest, path_of
from dra_driver.plugin.claims import ClaimSource

WATCH_SECONDS = 300  # each watch ends after this; the next round relists (the resync)
LIST_TIMEOUT_S = 10.0
MAX_CLASSES = 1024  # bounded memory: a cluster with more classes reads the rest with GETs
RETRY_S = 5.0


class ClassWatch(Protocol):
    """A list of DeviceClasses and a watch from its resourceVersion (the API server, or a stand-in in tests)."""

    def list(self) -> tuple[list[dict[str, Any]], str]: ...

    def watch(self, resource_version: str, stop: threading.Event) -> Any:
        """Iterates (event type, object) until the watch window ends; raises on a broken watch."""
        ...


class KubeClassWatch:
    """List and watch deviceclasses through `dra_driver.kube` (`api`: a KubeRest or an official-client ApiClient),
    every call with a timeout."""

    def __init__(self, api: Any, watch_seconds: int = WATCH_SECONDS) -> None:
        self._rest = as_rest(api)
        self._seconds = watch_seconds
        self._path = path_of(GROUP, VERSION, "deviceclasses")

    def list(self) -> tuple[list[dict[str, Any]], str]:
        return listwatch.list_at(self._rest, self._path, LIST_TIMEOUT_S)

    def watch(self, resource_version: str, stop: threading.Event) -> Any:
        # an ERROR event (410 Gone: too old a version) raises: the caller relists
        return listwatch.watch_from(self._rest, self._path, resource_version, self._seconds, stop)


class DeviceClassCache:
    """The cluster's DeviceClasses, kept by a background list+watch; `get` answers None when not in sync."""

    def __init__(self, source: ClassWatch, max_classes: int = MAX_CLASSES, retry_s: float = RETRY_S) -> None:
        self._source = source
        self._max = max_classes
        self._retry_s = retry_s
        self._lock = threading.Lock()
        self._classes: dict[str, DeviceClass] = {}
        self._synced = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="deviceclass-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        # a watch blocked in a read ends at its server-side timeout: the thread is a daemon, not waited for long
        if self._thread is not None:
            self._thread.join(timeout=0.1)

    @property
    def synced(self) -> bool:
        return self._synced

    def get(self, name: str) -> DeviceClass | None:
        with self._lock:
            return self._classes.get(name) if self._synced else None

    def _run(self) -> None:
        # out of sync (the API server away), prepares read their classes with GETs until the next list succeeds
        listwatch.run(
            "deviceclass cache (prepares read classes directly meanwhile)",
            self._source.list,
            self._source.watch,
            self._replace,
            self._apply,
            self._set_unsynced,
            self._stop,
            self._retry_s,
        )

    def _set_unsynced(self) -> None:
        with self._lock:
            self._synced, self._classes = False, {}

    def _replace(self, items: list[dict[str, Any]]) -> None:
        classes = {}
        for obj in items[: self._max]:
            c = DeviceClass.model_validate(obj)
            classes[c.metadata.name] = c
        with self._lock:
            self._classes, self._synced = classes, True

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        if kind not in ("ADDED", "MODIFIED", "DELETED"):  # BOOKMARK
            return
        c = DeviceClass.model_validate(obj)
        with self._lock:
            if kind == "DELETED":
                self._classes.pop(c.metadata.name, None)
            elif c.metadata.name in self._classes or len(self._classes) < self._max:
                self._classes[c.metadata.name] = c


class CachedClassSource:
    """A ClaimSource whose DeviceClasses come from `cache` when it has them, else from `inner` (a GET)."""

    def __init__(self, inner: ClaimSource, cache: DeviceClassCache) -> None:
        self.inner = inner
        self.cache = cache

    def get_claim(self, namespace: str, name: str, *, timeout: float | None = None) -> ResourceClaim:
        return self.inner.get_claim(namespace, name, timeout=timeout)

    def get_device_class(self, name: str, *, timeout: float | None = None) -> DeviceClass:
        cached = self.cache.get(name)
        return cached if cached is not None else self.inner.get_device_class(name, timeout=timeout)
