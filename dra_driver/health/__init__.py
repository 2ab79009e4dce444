"""Device health: NVML events and lost GPUs as ResourceSlice device taints (see `monitor.py`), the operator's
admin endpoint (`admin.py`) and the health of prepared claims' devices in their status (`claim_status.py`)."""

from dra_driver.health.admin import HealthAdminServer
from dra_driver.health.claim_status import ClaimStatusReporter
from dra_driver.health.monitor import DEFAULT_IGNORED_XIDS, HealthMonitor, UnknownDeviceError, publishable

__all__ = [
    "DEFAULT_IGNORED_XIDS",
    "ClaimStatusReporter",
    "HealthAdminServer",
    "HealthMonitor",
    "UnknownDeviceError",
    "publishable",
]
