"""GPU telemetry as Prometheus metrics, attributed to the DRA claims holding each device (docs/telemetry.md)."""

from dra_driver.telemetry.collector import GpuCollector, PodOf, register_gpu_metrics

__all__ = ["GpuCollector", "PodOf", "register_gpu_metrics"]
