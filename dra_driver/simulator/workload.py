"""Workload profiles of simulated devices: utilisation and memory in use as deterministic functions of time.

A profile is set per GPU (and optionally per MIG device, by UUID) in the simulator's `telemetry.json`
(`dra_driver.simulator.telemetry`); NVML's utilisation and memory readings then follow it, so a test knows in
advance exactly how busy each device was over any stretch of time.

- ``busy``: 95 % utilisation, 80 % of the memory in use, all the time.
- ``bursty``: a square wave of period ``period_s``: 90 % utilisation for the first ``duty`` of each period,
  0 % for the rest (phase 0 at ``start``); half the memory in use throughout (the job keeps its allocations).
- ``idle``: 0 % utilisation and no memory in use (the device is held, nothing runs on it).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class Profile(StrEnum):
    BUSY = "busy"
    BURSTY = "bursty"
    IDLE = "idle"


BUSY_UTILIZATION = 95
BURST_UTILIZATION = 90
_MEMORY_FRACTION = {Profile.BUSY: 0.8, Profile.BURSTY: 0.5, Profile.IDLE: 0.0}


class Workload(BaseModel):
    """A device's profile. `start` is a Unix time: the phase origin of a bursty wave."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: Profile
    start: float = 0.0
    period_s: float = Field(default=60.0, gt=0)
    duty: float = Field(default=0.5, ge=0, le=1, description="busy fraction of each bursty period")

    def busy_at(self, now: float) -> bool:
        if self.profile is Profile.BURSTY:
            phase = ((now - self.start) % self.period_s) / self.period_s
            return phase < self.duty
        return self.profile is Profile.BUSY

    def utilization(self, now: float) -> int:
        """Percent busy at `now` (nvmlUtilization_t.gpu)."""
        if not self.busy_at(now):
            return 0
        return BUSY_UTILIZATION if self.profile is Profile.BUSY else BURST_UTILIZATION

    def memory_used(self, total: int) -> int:
        """Bytes in use of `total`."""
        return int(total * _MEMORY_FRACTION[self.profile])
