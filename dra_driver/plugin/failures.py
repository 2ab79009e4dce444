"""Why one claim could not be prepared or unprepared, kept typed until the gRPC layer answers the kubelet.

The kind is what metrics and logs count failures by; `retryable` says whether the kubelet's retry (it retries every
failed claim) can succeed without anyone changing the claim, its class or the node. Only the gRPC layer turns a
failure into the kubelet's per-claim error text.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

import pynvml

from dra_driver.cdi.devnodes import DevNodeError
from dra_driver.claimstate.config import ConfigError
from dra_driver.claimstate.context import CallContext, DeadlineExceeded
from dra_driver.kube.rest import ApiError
from dra_driver.nvml.mig import MigError
from dra_driver.sharing import SharingError

if TYPE_CHECKING:  # types.py holds results that carry a ClaimFailure
    from dra_driver.plugin.types import ClaimRef


class FailureKind(StrEnum):
    API_UNAVAILABLE = "api_unavailable"  # the API server did not answer a read of the claim or its class in time
    NOT_FOUND = "not_found"  # the claim or a device class it uses does not exist
    CLAIM_CHANGED = "claim_changed"  # replaced (another UID), not allocated, or its results name no request of it
    INVALID_CONFIG = "invalid_config"  # its opaque config is invalid, or asks for sharing a feature gate turns off
    SELECTOR_MISMATCH = "selector_mismatch"  # a class or claim CEL selector no longer matches the device
    DEVICE_UNKNOWN = "device_unknown"  # not a device this node publishes (another pool, gone, changed)
    DEVICE_IN_USE = "device_in_use"  # overlaps a device another claim (or the claim itself) holds
    DEADLINE = "deadline"  # the caller's deadline came before the work could be done
    LOCK_TIMEOUT = "lock_timeout"  # the node's device lock was held by others until the deadline
    MIG = "mig"  # a MIG device could not be made, found or used
    SHARING = "sharing"  # time-slicing, compute mode or the MPS daemon could not be set up or undone
    CDI = "cdi"  # the device nodes a CDI spec needs could not be found (/proc/devices, MIG capabilities)
    IO = "io"  # the node's files (checkpoint, CDI spec) could not be read or written
    NVML = "nvml"  # an NVML error outside MIG handling, e.g. of a GPU that fell off the bus
    INTERNAL = "internal"  # anything else: a bug


# Whether the kubelet's retry can succeed, unless the place that finds the failure knows better: what waits on time,
# other claims or the node's state can clear; what the claim, its class or its config say does not change by itself.
_RETRYABLE: dict[FailureKind, bool] = {
    FailureKind.API_UNAVAILABLE: True,
    FailureKind.NOT_FOUND: False,
    FailureKind.CLAIM_CHANGED: False,
    FailureKind.INVALID_CONFIG: False,
    FailureKind.SELECTOR_MISMATCH: False,
    FailureKind.DEVICE_UNKNOWN: False,
    FailureKind.DEVICE_IN_USE: True,
    FailureKind.DEADLINE: True,
    FailureKind.LOCK_TIMEOUT: True,
    FailureKind.MIG: True,
    FailureKind.SHARING: True,
    FailureKind.CDI: True,
    FailureKind.IO: True,
    FailureKind.NVML: False,
    FailureKind.INTERNAL: False,
}


@dataclass(frozen=True)
class ClaimFailure:
    kind: FailureKind
    message: str  # the kubelet's error text for the claim
    retryable: bool

    @classmethod
    def of(cls, kind: FailureKind, message: str, *, retryable: bool | None = None) -> ClaimFailure:
        """A failure of `kind`, retryable as that kind usually is unless `retryable` says otherwise."""
        return cls(kind, message, _RETRYABLE[kind] if retryable is None else retryable)

    def describe(self) -> str:
        """`[kind, retryable]` for a log line."""
        return f"[{self.kind}, {'retryable' if self.retryable else 'not retryable'}]"


class PrepareError(RuntimeError):
    """A claim cannot be prepared; nothing was changed for it."""

    def __init__(self, kind: FailureKind, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.failure = ClaimFailure.of(kind, message, retryable=retryable)


class LockTimeout(PrepareError):
    """The node's device lock could not be had before the caller's deadline; nothing was changed."""

    def __init__(self, message: str) -> None:
        super().__init__(FailureKind.LOCK_TIMEOUT, message)


# What the errors of the steps of a prepare or unprepare stand for (PrepareError names its own kind)
_ERROR_KINDS: tuple[tuple[type[Exception], FailureKind], ...] = (
    (DeadlineExceeded, FailureKind.DEADLINE),
    (ConfigError, FailureKind.INVALID_CONFIG),
    (DevNodeError, FailureKind.CDI),
    (MigError, FailureKind.MIG),
    (SharingError, FailureKind.SHARING),
    (OSError, FailureKind.IO),
)
_UNEXPECTED = frozenset({FailureKind.NVML, FailureKind.INTERNAL})  # logged as errors, with their traceback


def failure_of(e: Exception) -> ClaimFailure:
    """The failure of a claim that `e` ended."""
    if isinstance(e, PrepareError):
        return e.failure
    if isinstance(e, MigError) and e.code == pynvml.NVML_ERROR_GPU_IS_LOST:  # off the bus: back only after a reset
        return ClaimFailure.of(FailureKind.MIG, str(e), retryable=False)
    for error, kind in _ERROR_KINDS:
        if isinstance(e, error):
            return ClaimFailure.of(kind, str(e))
    kind = FailureKind.NVML if isinstance(e, pynvml.NVMLError) else FailureKind.INTERNAL
    return ClaimFailure.of(kind, f"{type(e).__name__}: {e}")


def read_failure(message: str, e: Exception) -> ClaimFailure:
    """A failed read of a claim or device class: gone (a retry cannot help), or the API server did not answer."""
    gone = isinstance(e, LookupError) or (isinstance(e, ApiError) and e.status == 404)
    return ClaimFailure.of(FailureKind.NOT_FOUND if gone else FailureKind.API_UNAVAILABLE, message)


def late_failure(ref: ClaimRef, done: str) -> ClaimFailure:
    """The wait for the device locks used up the call's time: an answer after the work would come too late."""
    return ClaimFailure.of(
        FailureKind.DEADLINE,
        f"deadline exceeded before claim {ref.namespace}/{ref.name} could be {done}; nothing was changed",
    )


def logged(
    call: CallContext, verb: str, ref: ClaimRef, failure: ClaimFailure, error: Exception | None = None
) -> ClaimFailure:
    """Log a claim's failure with its kind (the traceback of an unexpected one); returns it."""
    unexpected = failure.kind in _UNEXPECTED
    call.log.log(
        logging.ERROR if unexpected else logging.WARNING,
        "%s %s/%s (%s) failed %s: %s",
        verb,
        ref.namespace,
        ref.name,
        ref.uid,
        failure.describe(),
        failure.message,
        exc_info=error if unexpected else None,
    )
    return failure
