"""Prometheus metrics of the admission webhook (served at GET /metrics of its own HTTPS port).

- ``dra_driver_webhook_reviews_total{kind, result}``: reviews answered. ``kind`` is ResourceClaim,
  ResourceClaimTemplate, ``other`` (not checked) or ``unknown`` (the body was no AdmissionReview); ``result`` is
  ``allowed``, ``denied`` or ``error`` (the review could not be answered: HTTP 4xx/5xx, the API server then applies
  the webhook's failurePolicy).
"""

from __future__ import annotations

import threading
import weakref

from prometheus_client import REGISTRY, CollectorRegistry, Counter

UNKNOWN_KIND = "unknown"
RESULT_ERROR = "error"


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.reviews = Counter(
            "reviews",
            "AdmissionReviews answered by the webhook, by the kind reviewed and the result.",
            ["kind", "result"],
            namespace="dra_driver_webhook",
            registry=registry,
        )

    def reviewed(self, kind: str, result: str) -> None:
        self.reviews.labels(kind=kind, result=result).inc()

    @classmethod
    def for_registry(cls, registry: CollectorRegistry | None = None) -> WebhookMetrics:
        """The metrics in `registry` (default: the global one), made once: several servers in one process (tests)
        share them instead of failing on a duplicate registration."""
        reg = REGISTRY if registry is None else registry
        with _lock:
            metrics = _by_registry.get(reg)
            if metrics is None:
                metrics = _by_registry[reg] = cls(reg)
            return metrics


_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, WebhookMetrics] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
