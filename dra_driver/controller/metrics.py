"""Prometheus metrics of ResourceSlice publishing."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram


class PublisherMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else CollectorRegistry() if _registered() else REGISTRY
        self.publishes = Counter(
            "dra_driver_publish_total",
            "Pool reconciliations by result (published, unchanged, error)",
            ["result"],
            registry=registry,
        )
        self.duration = Histogram(
            "dra_driver_publish_duration_seconds", "Time of one pool reconciliation", registry=registry
        )
        self.api_requests = Counter(
            "dra_driver_publish_api_requests_total", "API requests made while publishing", ["verb"], registry=registry
        )
        self.devices = Gauge("dra_driver_published_devices", "Devices in the published pool", registry=registry)
        self.generation = Gauge("dra_driver_pool_generation", "Generation of the published pool", registry=registry)


def _registered() -> bool:
    # A second publisher in one process (tests) must not re-register the global collectors.
    return "dra_driver_publish_total" in REGISTRY._names_to_collectors
