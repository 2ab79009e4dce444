"""Liveness check of a running plugin: its DRA socket and its registration socket both answer a
``grpc.health.v1.Health/Check`` with SERVING. ``dra-driver probe`` runs it (the Helm chart's livenessProbe).

A socket file that is gone, one nobody listens on (a daemon that died), or a server too busy to answer within the
timeout all fail the check: the kubelet would not reach the plugin either. With a pod UID (a plugin started with
``--pod-uid``, for rolling updates) it checks that instance's own sockets, ``dra-<uid>.sock`` and
``<driver>-<uid>-reg.sock``, not those of another pod of the driver on the same node. With ``--registered`` (the
chart's startup and readiness checks) it also requires that the kubelet has registered that instance: the
registration socket's health service ``kubelet-registration`` (:data:`health.KUBELET_REGISTRATION`) is SERVING.

The kubelet runs the check every few seconds in the driver's container, so it imports gRPC's health client and the
socket names, never the plugin: ``dra-driver probe`` is dispatched here before the rest of the CLI is imported
(:func:`dra_driver.entry.main`), less than half the CPU time of a command that loads the driver.
"""

from __future__ import annotations

import argparse
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from dra_driver.plugin.grpc import health
from dra_driver.plugin.sockets import DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR, add_pod_uid_argument, plugin_sockets
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME

_STATUS_NAMES = {
    health.UNKNOWN: "UNKNOWN",
    health.SERVING: "SERVING",
    health.NOT_SERVING: "NOT_SERVING",
    health.SERVICE_UNKNOWN: "SERVICE_UNKNOWN",
}
HELP = "liveness check: the plugin's kubelet sockets answer a gRPC health check"
_NO_ANSWER = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@dataclass(frozen=True)
class ProbeResult:
    socket: Path
    ok: bool
    detail: str  # SERVING, or what is wrong

    def __str__(self) -> str:
        return f"{self.socket}: {self.detail}"


def probe_socket(path: Path, timeout: float, service: str = "") -> ProbeResult:
    """Check health service ``service`` ("": the server as a whole) on ``path``."""
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
            status = health.check(channel, service, timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        what = f"no answer within {timeout:g} s" if code in _NO_ANSWER else "health check failed"
        return ProbeResult(path, False, f"{what} ({code.name}: {details})")
    return ProbeResult(path, status == health.SERVING, _STATUS_NAMES.get(status, f"status {status}"))


def probe(sockets: list[Path], timeout: float, registered: bool = False) -> list[ProbeResult]:
    """Each socket serving; with ``registered``, then the registration (the last socket) confirmed by the kubelet."""
    results = [probe_socket(path, timeout) for path in sockets]
    if registered and all(r.ok for r in results):
        r = probe_socket(sockets[-1], timeout, health.KUBELET_REGISTRATION)
        detail = "registered by the kubelet" if r.ok else f"not registered by the kubelet ({r.detail})"
        results.append(ProbeResult(r.socket, r.ok, detail))
    return results


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`dra-driver probe`'s arguments (dra_driver.cli builds the same subcommand from them for its help)."""
    p.add_argument("--driver", default=DEFAULT_DRIVER_NAME, help="driver name (for the default socket paths)")
    p.add_argument("--plugin-dir", type=Path, help=f"as given to `plugin` (default {DEFAULT_PLUGINS_DIR}/<driver>)")
    p.add_argument("--registry-dir", type=Path, default=DEFAULT_REGISTRY_DIR)
    add_pod_uid_argument(p, "as given to `plugin`: check the sockets of the plugin with this pod UID")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for each socket's answer")
    p.add_argument(
        "--registered",
        action="store_true",
        help="also require that the kubelet has registered the plugin (readiness: a rolling update waits for it)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print each socket's state; 0 when both serve."""
    plugin_dir = args.plugin_dir or DEFAULT_PLUGINS_DIR / args.driver
    try:
        sockets = plugin_sockets(args.driver, plugin_dir, args.registry_dir, args.pod_uid)
    except ValueError as e:  # a pod UID that cannot name a socket
        print(f"dra-driver: error: {e}", file=sys.stderr)
        return 1
    results = probe(sockets, args.timeout, args.registered)
    for r in results:
        print(r if r.ok else f"dra-driver: error: {r}", file=sys.stdout if r.ok else sys.stderr)
    return 0 if all(r.ok for r in results) else 1


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="dra-driver probe", description=HELP)
    add_arguments(parser)
    return run(parser.parse_args(argv))
