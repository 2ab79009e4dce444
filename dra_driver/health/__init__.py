"""Device health: NVML events and lost GPUs as ResourceSlice device taints (`monitor.py`), the operator's admin
endpoint (`admin.py`) and the health of prepared claims' devices in their status (`claim_status.py`).

Nothing is imported here: the daemon starts health only once it serves the kubelet, and `dra-driver plugin` must
not load it before (start-up time)."""
