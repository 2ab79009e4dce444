"""Telemetry of a simulated machine: what its utilisation, temperature, power and ECC counters read.

The values live in `telemetry.json` in the simulator's state directory, next to the NVML state, so a test (or
another process) sets them from outside and the driver reads them through the pynvml functions
(`nvmlDeviceGetUtilizationRates`, `nvmlDeviceGetTemperature`, `nvmlDeviceGetPowerUsage`,
`nvmlDeviceGetTotalEccErrors`). Until something is set, every GPU reads the same deterministic idle values
(`GpuTelemetry()`'s defaults). A `workload` (dra_driver.simulator.workload) makes utilisation and memory in use
follow a profile over time instead; it applies to the GPU's MIG devices too, unless one has its own in `mig`.

    TelemetryStore(sim.state_dir).set(0, gpu_utilization=75, temperature_c=61)
    TelemetryStore(sim.state_dir).set(1, workload=Workload(profile="bursty", start=time.time(), period_s=4))
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dra_driver.simulator.lockedfile import file_identity, locked, replace_text
from dra_driver.simulator.workload import Workload

TELEMETRY_FILE = "telemetry.json"


class GpuTelemetry(BaseModel):
    """One GPU's readings. Defaults: an idle, cool GPU with no ECC errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    gpu_utilization: int = Field(default=0, ge=0, le=100, description="percent, nvmlUtilization_t.gpu")
    memory_utilization: int = Field(default=0, ge=0, le=100, description="percent, nvmlUtilization_t.memory")
    temperature_c: int = Field(default=34, ge=0, description="NVML_TEMPERATURE_GPU, degrees Celsius")
    power_mw: int = Field(default=72_000, ge=0, description="nvmlDeviceGetPowerUsage, milliwatts")
    ecc_corrected: int = Field(default=0, ge=0, description="volatile corrected (single-bit) ECC errors")
    ecc_uncorrected: int = Field(default=0, ge=0, description="volatile uncorrected (double-bit) ECC errors")
    ecc_corrected_aggregate: int = Field(default=0, ge=0, description="lifetime corrected ECC errors")
    ecc_uncorrected_aggregate: int = Field(default=0, ge=0, description="lifetime uncorrected ECC errors")
    workload: Workload | None = Field(default=None, description="when set, utilisation and memory follow it")


class MachineTelemetry(BaseModel):
    model_config = ConfigDict(extra="ignore")

    gpus: dict[int, GpuTelemetry] = {}  # by NVML index; absent: defaults
    mig: dict[str, Workload] = {}  # by MIG device UUID; absent: the parent GPU's workload


class TelemetryStore:
    """Read and set the telemetry of one simulated machine (by its state directory). Safe across processes."""

    def __init__(self, state_dir: Path | str) -> None:
        self.directory = Path(state_dir)
        self.path = self.directory / TELEMETRY_FILE
        self._lock_path = self.directory / "telemetry.lock"
        self._thread_lock = threading.RLock()
        self._cached: MachineTelemetry | None = None
        self._cached_stat: tuple[int, ...] | None = None

    def _load(self) -> MachineTelemetry:
        try:
            stat = file_identity(self.path)
        except FileNotFoundError:
            return MachineTelemetry()
        if self._cached is None or stat != self._cached_stat:
            self._cached = MachineTelemetry.model_validate_json(self.path.read_bytes())
            self._cached_stat = stat
        return self._cached

    def get(self, index: int) -> GpuTelemetry:
        """The readings of GPU `index` (NVML index). Callers must not modify the result."""
        with self._thread_lock:
            return self._load().gpus.get(index) or GpuTelemetry()

    def _locked(self) -> AbstractContextManager[None]:
        return locked(self._lock_path, self._thread_lock)

    def set(self, index: int, **values: Any) -> GpuTelemetry:
        """Set some readings of GPU `index` (field names of `GpuTelemetry`); the others keep their values."""
        with self._locked():
            self._cached_stat = None
            data = self._load().model_copy(deep=True)
            current = data.gpus.get(index) or GpuTelemetry()
            updated = GpuTelemetry.model_validate({**current.model_dump(), **values})
            data.gpus[index] = updated
            replace_text(self.path, data.model_dump_json(indent=1))
            return updated

    def workload(self, index: int, mig_uuid: str | None = None) -> Workload | None:
        """The profile GPU `index` (or its MIG device `mig_uuid`) follows; None: the fixed readings."""
        with self._thread_lock:
            data = self._load()
            if mig_uuid is not None and mig_uuid in data.mig:
                return data.mig[mig_uuid]
            gpu = data.gpus.get(index)
            return gpu.workload if gpu is not None else None

    def set_mig_workload(self, mig_uuid: str, workload: Workload | None) -> None:
        """Give one MIG device its own profile (None: back to its GPU's)."""
        with self._locked():
            self._cached_stat = None
            data = self._load().model_copy(deep=True)
            if workload is None:
                data.mig.pop(mig_uuid, None)
            else:
                data.mig[mig_uuid] = workload
            replace_text(self.path, data.model_dump_json(indent=1))

    def add_ecc_errors(self, index: int, *, corrected: int = 0, uncorrected: int = 0) -> GpuTelemetry:
        """ECC errors happen: both the volatile and the aggregate counters grow."""
        now = self.get(index)
        return self.set(
            index,
            ecc_corrected=now.ecc_corrected + corrected,
            ecc_uncorrected=now.ecc_uncorrected + uncorrected,
            ecc_corrected_aggregate=now.ecc_corrected_aggregate + corrected,
            ecc_uncorrected_aggregate=now.ecc_uncorrected_aggregate + uncorrected,
        )

    def reset(self, index: int | None = None) -> None:
        """Back to the defaults, for one GPU or all."""
        with self._locked():
            self._cached_stat = None
            data = self._load().model_copy(deep=True)
            if index is None:
                data.gpus.clear()
            else:
                data.gpus.pop(index, None)
            replace_text(self.path, data.model_dump_json(indent=1))
