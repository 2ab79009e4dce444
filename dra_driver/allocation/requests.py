"""Per-claim request data: one entry per request, or one per subrequest of a firstAvailable request."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from dra_driver.allocation.pools import PoolDevice
from dra_driver.api.claim import DeviceSubRequest, ResourceClaim
from dra_driver.api.deviceclass import DeviceClass

MAX_RESULTS = 32  # AllocationResultsMaxSize


@dataclass
class RequestData:
    claim_index: int
    request_index: int
    sub_index: int  # -1 when not a subrequest
    request: str  # the request's name
    sub: str  # the subrequest's name, "" if none
    spec: DeviceSubRequest
    device_class: DeviceClass
    num_devices: int = 0
    all_devices: list[PoolDevice] | None = None
    selected_sub: int = 0

    @property
    def full_name(self) -> str:
        return f"{self.request}/{self.sub}" if self.sub else self.request

    @cached_property  # the allocator's search asks millions of times
    def key(self) -> tuple[int, int, int]:
        return (self.claim_index, self.request_index, self.sub_index)

    @cached_property
    def admin(self) -> bool:
        return bool(self.spec.admin_access)


@dataclass
class ClaimData:
    claim: ResourceClaim
    alternatives: list[list[RequestData]] = field(default_factory=list)  # per request: exactly or subrequests
