"""Liveness check of a running plugin: its DRA socket and its registration socket both answer a
``grpc.health.v1.Health/Check`` with SERVING. ``dra-driver probe`` runs it (the Helm chart's livenessProbe).

A socket file that is gone, one nobody listens on (a daemon that died), or a server too busy to answer within the
timeout all fail the check: the kubelet would not reach the plugin either. With a pod UID (a plugin started with
``--pod-uid``, for rolling updates) it checks that instance's own sockets, ``dra-<uid>.sock`` and
``<driver>-<uid>-reg.sock``, not those of another pod of the driver on the same node.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path

import grpc

from dra_driver.plugin.grpc import health
from dra_driver.plugin.grpc.server import dra_socket_name, registrar_socket_name

_STATUS_NAMES = {
    health.UNKNOWN: "UNKNOWN",
    health.SERVING: "SERVING",
    health.NOT_SERVING: "NOT_SERVING",
    health.SERVICE_UNKNOWN: "SERVICE_UNKNOWN",
}
_NO_ANSWER = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@dataclass(frozen=True)
class ProbeResult:
    socket: Path
    ok: bool
    detail: str  # SERVING, or what is wrong

    def __str__(self) -> str:
        return f"{self.socket}: {self.detail}"


def plugin_sockets(driver: str, plugin_dir: Path, registry_dir: Path, pod_uid: str = "") -> list[Path]:
    """The sockets a plugin started with these directories and pod UID ("": none) serves (as ``dra-driver plugin``
    lays them out)."""
    return [plugin_dir / dra_socket_name(pod_uid), registry_dir / registrar_socket_name(driver, pod_uid)]


def probe_socket(path: Path, timeout: float) -> ProbeResult:
    """Check the server as a whole (health service name "") on ``path``."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return ProbeResult(path, False, "does not exist")
    except OSError as exc:
        return ProbeResult(path, False, f"cannot stat: {exc.strerror}")
    if not stat.S_ISSOCK(mode):
        return ProbeResult(path, False, "is not a socket")
    try:
        with grpc.insecure_channel(f"unix:{path}") as channel:
            status = health.check(channel, timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        what = f"no answer within {timeout:g} s" if code in _NO_ANSWER else "health check failed"
        return ProbeResult(path, False, f"{what} ({code.name}: {details})")
    return ProbeResult(path, status == health.SERVING, _STATUS_NAMES.get(status, f"status {status}"))


def probe(sockets: list[Path], timeout: float) -> list[ProbeResult]:
    return [probe_socket(path, timeout) for path in sockets]
