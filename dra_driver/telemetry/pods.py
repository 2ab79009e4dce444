"""The `pod` label of the GPU metrics: the pods a ResourceClaim is reserved for, read from the API server.

The scheduler lists the pods using a claim in its ``status.reservedFor``. `ReservedPods` is the collector's
``pod_of(namespace, claim)`` hook: it reads the claim (``get`` on resourceclaims, which the node daemon already
has) and keeps the answer for `ttl` seconds, so a scrape does not ask the API server for every device every time.
A failure (API server down, claim gone, no permission) answers "" and is kept for `error_ttl` seconds: a scrape
never fails because of it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dra_driver.api.claim import ResourceClaim

log = logging.getLogger(__name__)

GetClaim = Callable[[str, str], ResourceClaim]

DEFAULT_TTL = 30.0
DEFAULT_ERROR_TTL = 10.0
_PURGE_ABOVE = 1024  # cached claims before expired entries are dropped


@dataclass(frozen=True)
class _Cached:
    pods: str
    expires: float


class ReservedPods:
    """``pod_of(namespace, claim)``: the names of the pods in the claim's status.reservedFor, comma-separated and
    sorted ("" when none or on error), cached."""

    def __init__(
        self,
        get_claim: GetClaim,
        *,
        ttl: float = DEFAULT_TTL,
        error_ttl: float = DEFAULT_ERROR_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.get_claim = get_claim
        self.ttl = ttl
        self.error_ttl = error_ttl
        self.clock = clock
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], _Cached] = {}

    def __call__(self, namespace: str, claim: str) -> str:
        key = (namespace, claim)
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and hit.expires > now:
            return hit.pods
        try:
            pods, ttl = ",".join(self.get_claim(namespace, claim).status.reserved_pods()), self.ttl
        except Exception as e:  # never fail a scrape
            log.debug("pods of claim %s/%s: %s", namespace, claim, e)
            pods, ttl = "", self.error_ttl
        with self._lock:
            if len(self._cache) >= _PURGE_ABOVE:
                self._cache = {k: v for k, v in self._cache.items() if v.expires > now}
            self._cache[key] = _Cached(pods, now + ttl)
        return pods
