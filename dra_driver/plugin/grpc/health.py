"""The standard gRPC health service (``grpc.health.v1.Health``: Check and Watch), served from our own messages.

The messages come from ``proto/health/v1/health.proto`` (wire-compatible with grpc.health.v1, in a private package,
see there), so grpcio-health-checking is not needed. Service name "" stands for the server as a whole.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
from google.protobuf.message import Message

from dra_driver.plugin.grpc import protos, rpc

SERVICE_NAME = "grpc.health.v1.Health"

UNKNOWN = 0
SERVING = 1
NOT_SERVING = 2
SERVICE_UNKNOWN = 3


class HealthServicer:
    """Keeps a status per service name and answers Check and Watch."""

    def __init__(self, watch_poll_s: float = 1.0) -> None:
        self._pb = protos.load().health
        self._cond = threading.Condition()
        self._status: dict[str, int] = {}
        self._shutdown = False
        self._watch_poll_s = watch_poll_s

    def set(self, service: str, status: int) -> None:
        """Set the status of ``service`` ("" for the whole server)."""
        with self._cond:
            if self._shutdown:
                return
            self._status[service] = status
            self._cond.notify_all()

    def get(self, service: str) -> int | None:
        with self._cond:
            return self._status.get(service)

    def enter_graceful_shutdown(self) -> None:
        """Mark every service NOT_SERVING, ignore later updates and end the Watch streams."""
        with self._cond:
            for name in self._status:
                self._status[name] = NOT_SERVING
            self._shutdown = True
            self._cond.notify_all()

    def _response(self, status: int) -> Message:
        response: Message = self._pb.HealthCheckResponse(status=status)
        return response

    def check(self, request: Any, context: grpc.ServicerContext) -> Message:
        status = self.get(request.service)
        if status is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return self._response(status if status is not None else UNKNOWN)

    def watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Message]:
        last: int | None = None
        while context.is_active():
            with self._cond:
                status = self._status.get(request.service, SERVICE_UNKNOWN)
                shutdown = self._shutdown
                if status == last and not shutdown:
                    self._cond.wait(self._watch_poll_s)
                    continue
            if status != last:
                last = status
                yield self._response(status)
            if shutdown:
                return

    def handler(self) -> grpc.GenericRpcHandler:
        """The generic handler to add to a server."""
        request_cls = rpc.message_class(self._pb, "HealthCheckRequest")
        response_cls = rpc.message_class(self._pb, "HealthCheckResponse")
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Check": grpc.unary_unary_rpc_method_handler(
                    self.check,
                    request_deserializer=request_cls.FromString,
                    response_serializer=response_cls.SerializeToString,
                ),
                "Watch": grpc.unary_stream_rpc_method_handler(
                    self.watch,
                    request_deserializer=request_cls.FromString,
                    response_serializer=response_cls.SerializeToString,
                ),
            },
        )


def check(channel: grpc.Channel, service: str = "", timeout: float = 5.0) -> int:
    """Client side: call Check and return the status number (raises grpc.RpcError, e.g. NOT_FOUND)."""
    pb = protos.load().health
    request_cls = rpc.message_class(pb, "HealthCheckRequest")
    response_cls = rpc.message_class(pb, "HealthCheckResponse")
    call = channel.unary_unary(
        f"/{SERVICE_NAME}/Check",
        request_serializer=request_cls.SerializeToString,
        response_deserializer=response_cls.FromString,
    )
    response = call(pb.HealthCheckRequest(service=service), timeout=timeout)
    status: int = response.status
    return status
