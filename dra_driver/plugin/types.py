"""What the kubelet-facing gRPC layer and the claim-preparing core exchange: plain data, no gRPC types."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict

from dra_driver.claimstate.context import NO_DEADLINE, CallContext
from dra_driver.plugin.failures import ClaimFailure


class ClaimRef(BaseModel):
    """A claim as the kubelet names it in NodePrepareResources / NodeUnprepareResources."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    name: str
    uid: str


class PreparedDevice(BaseModel):
    requests: list[str]  # request names (subrequest suffix stripped); empty means all requests
    pool: str
    device: str
    cdi_device_ids: list[str]
    share_id: str | None = None


class PrepareResult(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a stray `error=` string is refused: dropped, it would read as success

    devices: list[PreparedDevice] = []
    failure: ClaimFailure | None = None  # set: this claim failed; the kubelet retries it

    @property
    def error(self) -> str:
        """The failure's message, "" on success: for logs and tests (the gRPC layer makes the kubelet's text)."""
        return "" if self.failure is None else self.failure.message


class ClaimPreparer(Protocol):
    """Implemented by the plugin core; called by the gRPC servers (v1 and v1beta1 alike).

    Both calls are idempotent and must return an entry for every claim they were given.
    """

    def prepare(self, claims: list[ClaimRef], call: CallContext = NO_DEADLINE) -> dict[str, PrepareResult]:
        """`call`: the request's context; a claim that cannot be prepared by its deadline should get an error."""
        ...

    def unprepare(self, claims: list[ClaimRef], call: CallContext = NO_DEADLINE) -> dict[str, ClaimFailure | None]:
        """claim UID -> its failure (None on success). A claim that cannot be unprepared by the call's deadline
        should get a failure, with nothing changed for it."""
        ...
