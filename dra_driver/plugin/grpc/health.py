"""The standard gRPC health service, ``grpc.health.v1.Health`` (Check and Watch), from grpcio-health-checking.

:class:`HealthServicer` keeps a status per service name ("" stands for the server as a whole): Check answers
NOT_FOUND for a name it does not know, Watch streams every change, and ``enter_graceful_shutdown()`` marks every
service NOT_SERVING and ignores later updates. :func:`check` is the client side (``dra-driver probe``).

Its Watch streams hold no server thread, and they stay open until their client or the server ends them: a server
stopping with a Watch open waits out its grace period for it (the kubelet and ``dra-driver probe`` only call Check).
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import HealthServicer as HealthServicer

UNKNOWN: int = health_pb2.HealthCheckResponse.UNKNOWN
SERVING: int = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN: int = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

# A name of the registration socket's health service: SERVING once the kubelet has reported this instance registered
# (NotifyRegistrationStatus), NOT_SERVING until then, after a rejection and while the socket is bound again. The
# kubelet registers a socket up to a second after it appears (its plugin manager's reconcile period): readiness that
# waited only for the sockets let a rolling update remove the old pod before the kubelet knew the new one.
KUBELET_REGISTRATION = "kubelet-registration"


def check(channel: grpc.Channel, service: str = "", timeout: float = 5.0) -> int:
    """Client side: call Check and return the status number (raises grpc.RpcError, e.g. NOT_FOUND)."""
    response = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=timeout
    )
    status: int = response.status
    return status
