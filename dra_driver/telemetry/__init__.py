"""GPU telemetry as Prometheus metrics, attributed to the DRA claims holding each device (docs/telemetry.md)."""

from dra_driver.telemetry.collector import GpuCollector, PodOf, register_gpu_metrics
from dra_driver.telemetry.pods import ReservedPods

__all__ = ["GpuCollector", "PodOf", "ReservedPods", "register_gpu_metrics"]
