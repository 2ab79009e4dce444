"""Character-device facts a CDI spec needs, read from the kernel's /proc (or a simulator's copy of it).

MIG devices have no host device nodes of their own: a container needs its parent's `/dev/nvidia<minor>` plus
`/dev/nvidia-caps/nvidia-cap<N>` for the GPU instance and the compute instance, where N is the
`DeviceFileMinor` of `/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>[/ci<C>]/access`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

NVIDIA_FRONTEND_MAJOR = 195  # fixed by the NVIDIA driver; /dev/nvidiactl is minor 255
NVIDIACTL_MINOR = 255


class DevNodeError(RuntimeError):
    pass


@dataclass(frozen=True)
class CharDevice:
    path: str
    major: int
    minor: int
    file_mode: int


def _read(path: str) -> str:
    """A small /proc file's text: open, read to the end, close (a text-mode open adds five system calls, at every
    prepare)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def char_majors(proc_root: Path) -> dict[str, int]:
    """`/proc/devices` character section: name -> major."""
    majors: dict[str, int] = {}
    path = os.path.join(proc_root, "devices")
    try:
        text = _read(path)
    except (OSError, UnicodeDecodeError) as e:
        raise DevNodeError(f"cannot read {path}: {e}") from e
    for line in text.split("Block devices:")[0].splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            majors[parts[1]] = int(parts[0])
    return majors


def _major(majors: dict[str, int], name: str) -> int:
    if name not in majors:
        raise DevNodeError(f"no {name!r} character device in /proc/devices: is the NVIDIA driver loaded?")
    return majors[name]


def _capability(path: Path) -> tuple[int, int]:
    try:
        fields = dict(line.split(":", 1) for line in _read(str(path)).splitlines() if ":" in line)
        return int(fields["DeviceFileMinor"]), int(fields.get("DeviceFileMode", "292"))
    except (OSError, KeyError, ValueError) as e:
        raise DevNodeError(f"cannot read MIG capability {path}: {e}") from e


def gpu_nodes(proc_root: Path, minor: int) -> list[CharDevice]:
    majors = char_majors(proc_root)
    uvm = _major(majors, "nvidia-uvm")
    nvidia = majors.get("nvidia-frontend", majors.get("nvidia", NVIDIA_FRONTEND_MAJOR))
    return [
        CharDevice(f"/dev/nvidia{minor}", nvidia, minor, 0o666),
        CharDevice("/dev/nvidiactl", nvidia, NVIDIACTL_MINOR, 0o666),
        CharDevice("/dev/nvidia-uvm", uvm, 0, 0o666),
        CharDevice("/dev/nvidia-uvm-tools", uvm, 1, 0o666),
    ]


def mig_cap_nodes(proc_root: Path, parent_minor: int, gi_id: int, ci_id: int) -> list[CharDevice]:
    caps_major = _major(char_majors(proc_root), "nvidia-caps")
    base = proc_root / "driver" / "nvidia" / "capabilities" / f"gpu{parent_minor}" / "mig" / f"gi{gi_id}"
    nodes = []
    for path in (base / "access", base / f"ci{ci_id}" / "access"):
        minor, mode = _capability(path)
        nodes.append(CharDevice(f"/dev/nvidia-caps/nvidia-cap{minor}", caps_major, minor, mode))
    return nodes
