"""Device and counter-set names, and parsing a device name back to what it stands for.

Unprepare and crash rollback rely on the name alone, so every MIG device name carries the parent's minor
number, the GPU-instance profile id (NVML info.id) and the placement start, as the official driver's do:
`gpu-<minor>-mig-<profile without dots>-<profile id>-<placement start>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


def gpu_device_name(minor: int) -> str:
    return f"gpu-{minor}"


def _rfc1123(profile: str) -> str:
    s = re.sub(r"[^a-z0-9-]", "-", profile.lower().replace(".", ""))
    return s.strip("-")


def mig_device_name(parent_minor: int, profile_name: str, profile_id: int, placement_start: int) -> str:
    return f"gpu-{parent_minor}-mig-{_rfc1123(profile_name)}-{profile_id}-{placement_start}"


def counter_set_name(minor: int) -> str:
    return f"gpu-{minor}-counter-set"


@dataclass(frozen=True)
class GpuRef:
    minor: int


@dataclass(frozen=True)
class MigRef:
    parent_minor: int
    profile_token: str  # the profile name with dots removed; informational
    profile_id: int
    placement_start: int


_GPU_RE = re.compile(r"^gpu-(\d+)\Z")
_MIG_RE = re.compile(r"^gpu-(\d+)-mig-([a-z0-9][a-z0-9-]*?)-(\d+)-(\d+)\Z")


def parse_device_name(name: str) -> GpuRef | MigRef:
    if m := _GPU_RE.match(name):
        return GpuRef(int(m.group(1)))
    if m := _MIG_RE.match(name):
        return MigRef(int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4)))
    raise ValueError(f"{name!r} is not a device name of this driver (gpu-<minor> or gpu-<minor>-mig-...)")
