"""Device health: NVML events and lost GPUs as ResourceSlice device taints (see `monitor.py`)."""

from dra_driver.health.monitor import DEFAULT_IGNORED_XIDS, HealthMonitor, publishable

__all__ = ["DEFAULT_IGNORED_XIDS", "HealthMonitor", "publishable"]
