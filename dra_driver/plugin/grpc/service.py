"""Servicers: the DRA node service (v1 and v1beta1) and plugin registration, translating gRPC <-> plugin types.

This layer never does device work: it turns requests into :class:`~dra_driver.plugin.types.ClaimRef` lists, calls
the :class:`~dra_driver.plugin.types.ClaimPreparer`, and turns its results into responses. Every claim of a request
gets an entry in the response; exceptions and missing or malformed results become per-claim errors, never a failed
RPC, so the kubelet retries just those claims.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from dra_driver.claimstate.context import CallContext, time_left
from dra_driver.plugin.failures import ClaimFailure
from dra_driver.plugin.grpc.generated import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from dra_driver.plugin.grpc.metrics import (
    ERROR_BUSY,
    ERROR_CLAIM,
    ERROR_DEADLINE,
    ERROR_INTERNAL,
    ERROR_INVALID_RESULT,
    ERROR_MISSING_RESULT,
    ERROR_PREPARER_EXCEPTION,
    ERROR_REGISTRATION_FAILED,
    RESULT_CLAIM_ERROR,
    RESULT_OK,
    RESULT_RPC_ERROR,
    PluginMetrics,
)
from dra_driver.plugin.types import ClaimPreparer, ClaimRef, PrepareResult

log = logging.getLogger(__name__)
T = TypeVar("T")

PLUGIN_TYPE = "DRAPlugin"  # PluginInfo.type of a DRA driver
DRA_SERVICE = "DRAPlugin"
REGISTRATION_SERVICE = "Registration"
# The DRA API versions served, newest first: their messages and their generated service code.
DRA_API_VERSIONS: tuple[tuple[ModuleType, ModuleType], ...] = (
    (dra_v1_pb2, dra_v1_pb2_grpc),
    (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
)
_NO_DEADLINE_S = 365 * 24 * 3600.0  # gRPC reports about 2**63 s remaining for a call without a deadline


def base_request_name(name: str) -> str:
    """``req/sub`` -> ``req``, as resourceclaim.BaseRequestRef does; other names unchanged."""
    return name.split("/", 1)[0]


def _exception_text(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _claim_error(failure: ClaimFailure) -> str:
    """The kubelet's error text for a failed claim (its kind and retryability go to metrics and logs, not to the
    kubelet, which retries every failed claim alike)."""
    return failure.message


def call_deadline(context: grpc.ServicerContext) -> float | None:
    """The call's deadline as a time.monotonic() value; None when the caller set none."""
    remaining: float | None = context.time_remaining()
    if remaining is None or remaining > _NO_DEADLINE_S:
        return None
    return time.monotonic() + remaining


@contextlib.contextmanager
def _instrument(metrics: PluginMetrics, method: str) -> Iterator[list[str]]:
    """Count, time and track one RPC; the body appends its result label to the yielded list (default ok)."""
    outcome: list[str] = []
    in_flight = metrics.in_flight.labels(method=method)
    in_flight.inc()
    start = time.perf_counter()
    try:
        yield outcome
    except BaseException:
        outcome.append(RESULT_RPC_ERROR)
        raise
    finally:
        in_flight.dec()
        metrics.duration.labels(method=method).observe(time.perf_counter() - start)
        metrics.requests.labels(method=method, result=outcome[-1] if outcome else RESULT_OK).inc()


class DRAService:
    """NodePrepareResources / NodeUnprepareResources for any DRA API version (they share their message shapes).

    ``serialize`` (default, like the Go kubeletplugin helper) lets only one prepare or unprepare call run at a time;
    a call gives up waiting for it at its deadline. ``max_concurrent_prepares`` bounds the prepare calls in progress:
    one more is refused at once (a waiting call would hold a server thread too), so that prepares stalled on the
    API server never take every thread and unprepares, which need no API, still run. ``max_concurrent_calls`` bounds
    prepares and unprepares together in the same way, so that calls waiting for the node's device lock (held by
    another process) never take the thread the health checks need.
    """

    def __init__(
        self,
        preparer: ClaimPreparer,
        metrics: PluginMetrics,
        serialize: bool = True,
        max_concurrent_prepares: int | None = None,
        max_concurrent_calls: int | None = None,
    ) -> None:
        self._preparer = preparer
        self._metrics = metrics
        self._lock = threading.Lock() if serialize else None
        self._max_prepares = max_concurrent_prepares
        self._prepare_slots = threading.BoundedSemaphore(max_concurrent_prepares) if max_concurrent_prepares else None
        self._max_calls = max_concurrent_calls
        self._call_slots = threading.BoundedSemaphore(max_concurrent_calls) if max_concurrent_calls else None

    @staticmethod
    def _claims(request: Any) -> list[ClaimRef]:
        claims: list[ClaimRef] = []
        seen: set[str] = set()
        for claim in request.claims:
            if claim.uid in seen:
                continue
            seen.add(claim.uid)
            claims.append(ClaimRef(namespace=claim.namespace, name=claim.name, uid=claim.uid))
        return claims

    def _call(
        self,
        method: str,
        verb: str,
        fn: Callable[[list[ClaimRef], CallContext], T],
        claims: list[ClaimRef],
        deadline: float | None = None,
    ) -> tuple[T | None, str]:
        """The preparer's answer, or the failure text every claim gets when it raised (never a crashed RPC)."""
        if self._call_slots is not None and not self._call_slots.acquire(blocking=False):
            self._metrics.error(method, ERROR_BUSY, len(claims))
            return None, (
                f"{verb} refused: {self._max_calls} prepares and unprepares are in progress, the other gRPC workers "
                "are kept for health checks (the kubelet retries)"
            )
        try:
            wait_s = -1.0 if deadline is None else max(0.0, time_left(deadline))
            if self._lock is not None and not self._lock.acquire(timeout=wait_s):
                self._metrics.error(method, ERROR_DEADLINE, len(claims))
                return None, f"{verb} not started: deadline exceeded waiting for another prepare or unprepare to finish"
            try:
                return fn(claims, CallContext(deadline)), ""
            except Exception as exc:
                log.exception("%s of claims %s failed", verb, [c.uid for c in claims])
                self._metrics.error(method, ERROR_PREPARER_EXCEPTION, len(claims))
                return None, f"{verb} failed: {_exception_text(exc)}"
            finally:
                if self._lock is not None:
                    self._lock.release()
        finally:
            if self._call_slots is not None:
                self._call_slots.release()

    def _prepare_claims(
        self, method: str, claims: list[ClaimRef], deadline: float | None
    ) -> tuple[dict[str, PrepareResult] | None, str]:
        if self._prepare_slots is not None and not self._prepare_slots.acquire(blocking=False):
            self._metrics.error(method, ERROR_BUSY, len(claims))
            return None, (
                f"prepare refused: {self._max_prepares} prepares are in progress, the other gRPC workers are kept "
                "for unprepares (the kubelet retries)"
            )
        try:
            return self._call(method, "prepare", self._preparer.prepare, claims, deadline)
        finally:
            if self._prepare_slots is not None:
                self._prepare_slots.release()

    def prepare(self, pb: ModuleType, request: Any, deadline: float | None = None) -> tuple[Message, bool]:
        """Handle NodePrepareResources with the messages of ``pb``; returns (response, all claims succeeded).
        ``deadline``: the call's (time.monotonic()), passed on to the preparer."""
        method = "NodePrepareResources"
        response: Any = pb.NodePrepareResourcesResponse()
        claims = self._claims(request)
        if not claims:
            return response, True
        results, failure = self._prepare_claims(method, claims, deadline)
        has_share_id = "share_id" in pb.Device.DESCRIPTOR.fields_by_name
        all_ok = True
        for claim in claims:
            entry = response.claims[claim.uid]  # creates the entry
            if failure:
                entry.error = failure
                all_ok = False
                continue
            result = results.get(claim.uid) if isinstance(results, dict) else None
            if result is None:
                entry.error = f"internal error: the driver returned no result for claim {claim.namespace}/{claim.name}"
                self._metrics.error(method, ERROR_MISSING_RESULT)
                all_ok = False
                continue
            try:
                if result.failure is not None:
                    entry.error = _claim_error(result.failure)
                    self._metrics.error(method, ERROR_CLAIM, kind=result.failure.kind)
                    all_ok = False
                    continue
                for device in result.devices:
                    pb_device = entry.devices.add(
                        request_names=[base_request_name(r) for r in device.requests],
                        pool_name=device.pool,
                        device_name=device.device,
                        cdi_device_ids=list(device.cdi_device_ids),
                    )
                    if device.share_id is not None:
                        if has_share_id:
                            pb_device.share_id = device.share_id
                        else:
                            log.debug("share ID %s of %s dropped: not in this API version", device.share_id, claim)
            except Exception as exc:
                log.exception("translating the prepare result of claim %s failed", claim.uid)
                entry.Clear()
                entry.error = f"internal error: invalid prepare result: {_exception_text(exc)}"
                self._metrics.error(method, ERROR_INVALID_RESULT)
                all_ok = False
                continue
            self._metrics.claim_prepared(claim.uid, len(entry.devices))
        return response, all_ok

    def unprepare(self, pb: ModuleType, request: Any, deadline: float | None = None) -> tuple[Message, bool]:
        """Handle NodeUnprepareResources with the messages of ``pb``; returns (response, all claims succeeded)."""
        method = "NodeUnprepareResources"
        response: Any = pb.NodeUnprepareResourcesResponse()
        claims = self._claims(request)
        if not claims:
            return response, True
        results, failure = self._call(method, "unprepare", self._preparer.unprepare, claims, deadline)
        all_ok = True
        for claim in claims:
            entry = response.claims[claim.uid]
            if failure:
                entry.error = failure
                all_ok = False
                continue
            if not isinstance(results, dict) or claim.uid not in results:
                entry.error = f"internal error: the driver returned no result for claim {claim.namespace}/{claim.name}"
                self._metrics.error(method, ERROR_MISSING_RESULT)
                all_ok = False
                continue
            result = results[claim.uid]
            if isinstance(result, ClaimFailure):
                entry.error = _claim_error(result)
                self._metrics.error(method, ERROR_CLAIM, kind=result.kind)
                all_ok = False
                continue
            if result is not None:  # not what the protocol allows: say so, rather than fail the whole call
                entry.error = f"internal error: invalid unprepare result {result!r}"
                self._metrics.error(method, ERROR_INVALID_RESULT)
                all_ok = False
                continue
            self._metrics.claim_unprepared(claim.uid)
        return response, all_ok

    def add_to_server(self, server: grpc.Server) -> None:
        """Serve the DRAPlugin service of every API version (:data:`DRA_API_VERSIONS`) on ``server``."""
        for pb, pb_grpc in DRA_API_VERSIONS:
            pb_grpc.add_DRAPluginServicer_to_server(DRAPluginServicer(self, pb), server)

    def call(
        self,
        method: str,
        pb: ModuleType,
        handle: Callable[[ModuleType, Any, float | None], tuple[Message, bool]],
        request: Any,
        context: grpc.ServicerContext,
    ) -> Message:
        """One instrumented RPC: ``handle(pb, request, deadline)``'s response; a bug in it is an INTERNAL status."""
        with _instrument(self._metrics, method) as outcome:
            try:
                response, ok = handle(pb, request, call_deadline(context))
            except Exception as exc:  # a bug in this layer: still answer with a status, not a crash
                log.exception("%s failed", method)
                self._metrics.error(method, ERROR_INTERNAL)
                context.abort(grpc.StatusCode.INTERNAL, f"{method}: {_exception_text(exc)}")
            outcome.append(RESULT_OK if ok else RESULT_CLAIM_ERROR)
            return response


class DRAPluginServicer:
    """The ``DRAPlugin`` service of one API version (the messages of ``pb``), served by a shared :class:`DRAService`."""

    def __init__(self, service: DRAService, pb: ModuleType) -> None:
        self._service = service
        self._pb = pb

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Message:
        return self._service.call("NodePrepareResources", self._pb, self._service.prepare, request, context)

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Message:
        return self._service.call("NodeUnprepareResources", self._pb, self._service.unprepare, request, context)


@dataclass(frozen=True)
class RegistrationStatus:
    """What the kubelet reported with NotifyRegistrationStatus."""

    plugin_registered: bool
    error: str
    received_at: float  # time.time()


class RegistrationService:
    """GetInfo / NotifyRegistrationStatus, as the Go kubeletplugin registrar answers them."""

    def __init__(
        self,
        driver_name: str,
        endpoint: str,
        supported_versions: list[str],
        metrics: PluginMetrics,
        on_status: Callable[[RegistrationStatus], None] | None = None,
    ) -> None:
        self._driver_name = driver_name
        self._endpoint = endpoint
        self._supported_versions = list(supported_versions)
        self._metrics = metrics
        self._on_status = on_status
        self._cond = threading.Condition()
        self._status: RegistrationStatus | None = None

    @property
    def status(self) -> RegistrationStatus | None:
        """The last status the kubelet reported, if any."""
        with self._cond:
            return self._status

    def wait_registered(self, timeout: float | None = None) -> bool:
        """Wait until the kubelet reports a successful registration; False on timeout or a failed one."""
        with self._cond:
            self._cond.wait_for(lambda: self._status is not None, timeout)
            return self._status is not None and self._status.plugin_registered

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Message:
        with _instrument(self._metrics, "GetInfo"):
            info: Message = pluginregistration_v1_pb2.PluginInfo(
                type=PLUGIN_TYPE,
                name=self._driver_name,
                endpoint=self._endpoint,
                supported_versions=self._supported_versions,
            )
            return info

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Message:
        method = "NotifyRegistrationStatus"
        with _instrument(self._metrics, method):
            status = RegistrationStatus(
                plugin_registered=bool(request.plugin_registered), error=str(request.error), received_at=time.time()
            )
            with self._cond:
                self._status = status
                self._cond.notify_all()
            if self._on_status is not None:
                try:
                    self._on_status(status)
                except Exception:
                    log.exception("registration status callback failed")
            if not status.plugin_registered:
                log.error("kubelet rejected the registration of %s: %s", self._driver_name, status.error)
                self._metrics.error(method, ERROR_REGISTRATION_FAILED)
                # like the Go helper, which returns an error (code Unknown) for a failed registration
                context.abort(grpc.StatusCode.UNKNOWN, f"failed registration process: {status.error}")
            log.info("registered %s with the kubelet", self._driver_name)
            response: Message = pluginregistration_v1_pb2.RegistrationStatusResponse()
            return response

    def add_to_server(self, server: grpc.Server) -> None:
        pluginregistration_v1_pb2_grpc.add_RegistrationServicer_to_server(self, server)
