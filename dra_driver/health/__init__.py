"""Device health: NVML events and lost GPUs as ResourceSlice device taints (see `monitor.py`), and the operator's
admin endpoint (`admin.py`)."""

from dra_driver.health.admin import HealthAdminServer
from dra_driver.health.monitor import DEFAULT_IGNORED_XIDS, HealthMonitor, UnknownDeviceError, publishable

__all__ = ["DEFAULT_IGNORED_XIDS", "HealthAdminServer", "HealthMonitor", "UnknownDeviceError", "publishable"]
