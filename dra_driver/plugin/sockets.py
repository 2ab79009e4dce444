"""Where a plugin's kubelet sockets are (as the Go kubeletplugin helper names them), with no gRPC import:
`dra-driver probe`, which the chart runs in the driver's container every few seconds, needs only these names."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")  # a plugin's directory defaults to <this>/<driver>
DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")  # the kubelet watches it for registrations
DEFAULT_PLUGIN_SOCKET = "dra.sock"
POD_UID_ENV = "POD_UID"  # `plugin --pod-uid` and `probe --pod-uid` default (the Helm chart sets it: metadata.uid)

_POD_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def check_pod_uid(pod_uid: str) -> str:
    """``pod_uid`` if it can be part of a socket file name ("" too: no UID); ValueError otherwise."""
    if pod_uid and not _POD_UID.fullmatch(pod_uid):
        raise ValueError(f"pod UID {pod_uid!r} cannot be part of a socket name (letters, digits, '-', '_', '.')")
    return pod_uid


def registrar_socket_name(driver_name: str, pod_uid: str = "") -> str:
    """``<driver>-reg.sock``; with a pod UID ``<driver>-<uid>-reg.sock`` (as the Go helper names it)."""
    uid_part = f"-{check_pod_uid(pod_uid)}" if pod_uid else ""
    return f"{driver_name}{uid_part}-reg.sock"


def dra_socket_name(pod_uid: str = "") -> str:
    """``dra.sock``; with a pod UID ``dra-<uid>.sock`` (as the Go helper names it)."""
    return f"dra-{check_pod_uid(pod_uid)}.sock" if pod_uid else DEFAULT_PLUGIN_SOCKET


def plugin_sockets(driver: str, plugin_dir: Path, registry_dir: Path, pod_uid: str = "") -> list[Path]:
    """The sockets a plugin started with these directories and pod UID ("": none) serves (as ``dra-driver plugin``
    lays them out)."""
    return [plugin_dir / dra_socket_name(pod_uid), registry_dir / registrar_socket_name(driver, pod_uid)]


def add_pod_uid_argument(p: argparse.ArgumentParser, what: str) -> None:
    """`--pod-uid` of `plugin` and `probe`, defaulting to $POD_UID."""
    p.add_argument(
        "--pod-uid",
        default=os.environ.get(POD_UID_ENV, ""),
        help=f"{what} (default: ${POD_UID_ENV}); empty: dra.sock and <driver>-reg.sock",
    )
