"""Prometheus metrics of the kubelet-facing gRPC servers.

Metrics (all with the ``dra_driver_`` prefix):

- ``grpc_requests_total{method, result}``: RPCs handled. ``result`` is ``ok`` (every claim succeeded),
  ``claim_error`` (the RPC succeeded but at least one claim carries an error) or ``rpc_error`` (the RPC itself
  returned a gRPC error).
- ``grpc_request_duration_seconds{method}``: histogram of RPC handling time.
- ``grpc_requests_in_flight{method}``: RPCs being handled now.
- ``grpc_errors_total{method, type, kind}``: errors by type, see the ``ERROR_*`` constants; ``kind`` is the
  :class:`~dra_driver.plugin.failures.FailureKind` of a claim's failure (type ``claim_error``), empty otherwise.
- ``prepared_devices``: devices of the claims this process prepared and has not unprepared since, as reported
  in its prepare results (it starts at zero when the process starts).

``method`` is the bare RPC name (``NodePrepareResources``, ``GetInfo``, ...); the v1 and v1beta1 DRA services share
their series.
"""

from __future__ import annotations

import threading
import weakref

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

NAMESPACE = "dra_driver"

RESULT_OK = "ok"
RESULT_CLAIM_ERROR = "claim_error"
RESULT_RPC_ERROR = "rpc_error"

ERROR_CLAIM = "claim_error"  # the preparer returned an error for a claim
ERROR_PREPARER_EXCEPTION = "preparer_exception"  # the preparer raised; every claim of the call failed
ERROR_MISSING_RESULT = "missing_result"  # the preparer returned no entry for a claim
ERROR_INVALID_RESULT = "invalid_result"  # the preparer's entry could not be translated
ERROR_REGISTRATION_FAILED = "registration_failed"  # the kubelet reported plugin_registered=false
ERROR_INTERNAL = "internal"  # an unexpected exception in this layer
ERROR_BUSY = "busy"  # too many prepares at once: refused, to keep gRPC workers for unprepares
ERROR_DEADLINE = "deadline_exceeded"  # the call's deadline passed while it waited for another call

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 45.0, 90.0)


class PluginMetrics:
    """The metric objects, registered once per registry (see :meth:`for_registry`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "grpc_requests",
            "gRPC requests handled by the DRA kubelet plugin, by method and result.",
            ["method", "result"],
            namespace=NAMESPACE,
            registry=registry,
        )
        self.duration = Histogram(
            "grpc_request_duration_seconds",
            "Time spent handling gRPC requests of the DRA kubelet plugin.",
            ["method"],
            namespace=NAMESPACE,
            registry=registry,
            buckets=DURATION_BUCKETS,
        )
        self.in_flight = Gauge(
            "grpc_requests_in_flight",
            "gRPC requests of the DRA kubelet plugin being handled now.",
            ["method"],
            namespace=NAMESPACE,
            registry=registry,
        )
        self.errors = Counter(
            "grpc_errors",
            "Errors in the DRA kubelet plugin's gRPC layer, by method, type and the kind of a claim's failure.",
            ["method", "type", "kind"],
            namespace=NAMESPACE,
            registry=registry,
        )
        self.prepared_devices = Gauge(
            "prepared_devices",
            "Devices of claims prepared by this process and not unprepared since.",
            namespace=NAMESPACE,
            registry=registry,
        )
        self._lock = threading.Lock()
        self._devices_by_claim: dict[str, int] = {}

    def claim_prepared(self, uid: str, devices: int) -> None:
        """A claim was prepared successfully with this many devices (a repeated call replaces the count)."""
        with self._lock:
            self._devices_by_claim[uid] = devices
            self.prepared_devices.set(sum(self._devices_by_claim.values()))

    def claim_unprepared(self, uid: str) -> None:
        """A claim was unprepared successfully."""
        with self._lock:
            self._devices_by_claim.pop(uid, None)
            self.prepared_devices.set(sum(self._devices_by_claim.values()))

    def error(self, method: str, error_type: str, count: int = 1, kind: str = "") -> None:
        self.errors.labels(method=method, type=error_type, kind=kind).inc(count)

    @classmethod
    def for_registry(cls, registry: CollectorRegistry | None = None) -> PluginMetrics:
        """The metrics in ``registry`` (default: prometheus_client's global one), created on first use.

        Several servers in one process sharing a registry share the metric objects instead of failing on
        duplicate registration.
        """
        reg = REGISTRY if registry is None else registry
        with _by_registry_lock:
            metrics = _by_registry.get(reg)
            if metrics is None:
                metrics = cls(reg)
                _by_registry[reg] = metrics
            return metrics


_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, PluginMetrics] = weakref.WeakKeyDictionary()
_by_registry_lock = threading.Lock()
