"""The kubelet's device-health service, ``v1alpha1.DRAResourceHealth`` (KEP-4680), served on the DRA socket.

The kubelet (ResourceHealthStatus gate, beta and on in 1.36) opens one ``NodeWatchResources`` stream per registered
plugin, reopening it 5 s after it ends, and reports what it reads in the status of the pods using the devices. Each
message is the complete list of this node's devices (pool = node name) with their health; a stream gets one at once,
another whenever :meth:`ResourceHealthServicer.notify` says health changed, and one every ``resend_interval_s``
regardless: the kubelet takes a device it has heard nothing about for ``health_check_timeout_seconds`` (default
30 s) as UNKNOWN, so silence must never last that long.

Each open stream holds a gRPC server thread for its whole life. At most ``max_streams`` are served at once (more are
refused with RESOURCE_EXHAUSTED, the kubelet retries), and :class:`~dra_driver.plugin.grpc.server.PluginServer`
keeps that many threads out of the prepares' share. A stream ends as soon as its client cancels it (a callback wakes
it) and when :meth:`ResourceHealthServicer.stop` is called (the server stops), so it never holds up a shutdown.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message

from dra_driver.api.slice import DeviceTaint
from dra_driver.plugin.grpc.generated import dra_health_v1alpha1_pb2 as pb
from dra_driver.plugin.grpc.generated import dra_health_v1alpha1_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SERVICE = "DRAResourceHealth"

# HealthStatus
UNKNOWN = 0
HEALTHY = 1
UNHEALTHY = 2

DEFAULT_MAX_STREAMS = 2  # the kubelet keeps one; one more for an instance replacing it (kubelet restart, reconnect)
DEFAULT_RESEND_INTERVAL_S = 10.0
DEFAULT_HEALTH_CHECK_TIMEOUT_S = 30  # what we tell the kubelet: trust a status this long (three resends)
MAX_MESSAGE = 1024  # the kubelet truncates longer messages
# stop() waits this long at most for the streams it ended to be over, their OK status sent: the server's stop that
# follows cancels whatever is still open, and the kubelet logs a cancelled stream as an error
STOP_WAIT_S = 2.0


@dataclass(frozen=True)
class DeviceState:
    """The health of one device: ``healthy`` None means it cannot be determined (UNKNOWN)."""

    healthy: bool | None
    message: str = ""


@dataclass(frozen=True)
class DeviceHealthSource:
    """Where the service reads device health: the pool the devices are published in (the node name), and a
    callable returning ``{device name: DeviceState}`` for every device this node publishes."""

    pool: str
    devices: Callable[[], Mapping[str, DeviceState]]


def states_from_taints(devices: Iterable[str], taints: Mapping[str, list[DeviceTaint]]) -> dict[str, DeviceState]:
    """Health from the health monitor's taints: untainted is healthy; a device with a taint that has an effect is
    unhealthy; one whose only taints are informational (effect None: its GPU cannot deliver health events) is
    unknown. The message lists the taints (``key=value:effect``)."""
    out: dict[str, DeviceState] = {}
    for name in devices:
        ts = taints.get(name, [])
        if not ts:
            out[name] = DeviceState(True)
            continue
        message = ", ".join(f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}" for t in ts)
        healthy = None if all(t.effect == "None" for t in ts) else False
        out[name] = DeviceState(healthy, message)
    return out


class ResourceHealthServicer:
    """Serves ``NodeWatchResources`` from a :class:`DeviceHealthSource`."""

    def __init__(
        self,
        source: DeviceHealthSource,
        *,
        max_streams: int = DEFAULT_MAX_STREAMS,
        resend_interval_s: float = DEFAULT_RESEND_INTERVAL_S,
        health_check_timeout_s: int = DEFAULT_HEALTH_CHECK_TIMEOUT_S,
    ) -> None:
        if max_streams < 1:
            raise ValueError("max_streams must be at least 1")
        self._source = source
        self._max_streams = max_streams
        self._resend_interval_s = resend_interval_s
        self._timeout_s = health_check_timeout_s
        self._cond = threading.Condition()
        self._generation = 0  # bumped by notify()
        self._streams = 0
        self._calls = 0  # calls not yet terminated (their status sent or cancelled): outlive _streams by a moment
        self._stopped = False

    @property
    def service_name(self) -> str:
        """The full name the service is served under (``v1alpha1.DRAResourceHealth``)."""
        name: str = pb.DESCRIPTOR.services_by_name[SERVICE].full_name
        return name

    @property
    def max_streams(self) -> int:
        return self._max_streams

    @property
    def streams(self) -> int:
        """How many streams are being served now (each holds a server thread)."""
        with self._cond:
            return self._streams

    def notify(self) -> None:
        """Device health changed: every open stream sends a new list."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def start(self) -> None:
        """Accept streams (again, after :meth:`stop`)."""
        with self._cond:
            self._stopped = False

    def stop(self, wait_s: float = STOP_WAIT_S) -> None:
        """End every open stream now and refuse new ones (UNAVAILABLE) until :meth:`start`; return once the ended
        calls are over (at most `wait_s`)."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            while self._calls and (remaining := deadline - time.monotonic()) > 0:
                self._cond.wait(remaining)

    def snapshot(self) -> Message:
        """The complete device list, as sent on the streams."""
        states = self._source.devices()
        now = int(time.time())
        response: Any = pb.NodeWatchResourcesResponse()
        for name in sorted(states):
            state = states[name]
            health = UNKNOWN if state.healthy is None else HEALTHY if state.healthy else UNHEALTHY
            message = state.message if len(state.message) <= MAX_MESSAGE else state.message[: MAX_MESSAGE - 3] + "..."
            response.devices.add(
                device=pb.DeviceIdentifier(pool_name=self._source.pool, device_name=name),
                health=health,
                last_updated_time=now,
                health_check_timeout_seconds=self._timeout_s,
                message=message,
            )
        result: Message = response
        return result

    def _call_ended(self) -> None:
        """gRPC's callback at a call's termination: wakes its stream's wait, and stop()'s."""
        with self._cond:
            self._calls -= 1
            self._cond.notify_all()

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Message]:
        """NodeWatchResources: a list at once, then one on every change and every ``resend_interval_s``."""
        with self._cond:
            if self._stopped:
                context.abort(grpc.StatusCode.UNAVAILABLE, "the plugin is stopping")
            if self._streams >= self._max_streams:
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{self._streams} NodeWatchResources streams are open already (at most {self._max_streams})",
                )
            self._streams += 1
            self._calls += 1
        try:
            if not context.add_callback(self._call_ended):  # a cancelled or ended call wakes the wait below at once
                self._call_ended()  # over already: no callback will come
            while context.is_active():
                with self._cond:
                    seen = self._generation
                try:
                    snapshot = self.snapshot()
                except Exception as exc:
                    log.exception("reading device health failed")
                    context.abort(grpc.StatusCode.INTERNAL, f"reading device health failed: {exc}")
                yield snapshot
                deadline = time.monotonic() + self._resend_interval_s
                with self._cond:
                    while seen == self._generation and not self._stopped and context.is_active():
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._cond.wait(remaining)
                    if self._stopped:
                        return
        finally:
            with self._cond:
                self._streams -= 1
                self._cond.notify_all()

    def add_to_server(self, server: grpc.Server) -> None:
        """Serve ``NodeWatchResources`` on ``server`` (the DRA server)."""
        pb_grpc.add_DRAResourceHealthServicer_to_server(self, server)


def watch_resources(channel: grpc.Channel, timeout: float | None = None) -> Any:
    """Client side: open a NodeWatchResources stream (an iterator of responses that is also a grpc.Call: cancel()
    ends it)."""
    return pb_grpc.DRAResourceHealthStub(channel).NodeWatchResources(pb.NodeWatchResourcesRequest(), timeout=timeout)
