"""A fake `/proc` with what the NVIDIA kernel driver exposes for MIG: `/proc/devices` majors, the
`driver/nvidia/capabilities` files whose `DeviceFileMinor` names the `/dev/nvidia-caps/nvidia-cap<N>` node of
each GPU instance and compute instance, and `driver/nvidia-caps/mig-minors`, the same numbers for every possible
instance (what NVIDIA's container toolkit reads). Regenerated from the simulator state on every change."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from dra_driver.simulator.mig_rules import MAX_GPU_INSTANCE_ID
from dra_driver.simulator.state import MachineState

NVIDIA_MAJOR, UVM_MAJOR, CAPS_MAJOR = 195, 510, 511
_ACCESS_MODE = 0o444  # the guide shows the access files world-readable
_CIS_PER_GI = 8


def gi_cap_minor(gpu_minor: int, gi: int) -> int:
    # /proc/driver/nvidia-caps/mig-minors: 15 GIs x (1 + 8 CIs) per GPU after `config` 1 and `monitor` 2.
    per_gi = 1 + _CIS_PER_GI
    return 3 + (MAX_GPU_INSTANCE_ID + 1) * per_gi * gpu_minor + per_gi * gi


def ci_cap_minor(gpu_minor: int, gi: int, ci: int) -> int:
    return gi_cap_minor(gpu_minor, gi) + 1 + ci


def mig_minors_text(gpu_minors: list[int]) -> str:
    """`/proc/driver/nvidia-caps/mig-minors`: the kernel lists every GPU minor it supports; those up to the
    machine's highest are enough for its devices."""
    lines = ["config 1", "monitor 2"]
    for gpu in range(max(gpu_minors, default=-1) + 1):
        for gi in range(MAX_GPU_INSTANCE_ID + 1):
            lines.append(f"gpu{gpu}/gi{gi}/access {gi_cap_minor(gpu, gi)}")
            lines += [f"gpu{gpu}/gi{gi}/ci{ci}/access {ci_cap_minor(gpu, gi, ci)}" for ci in range(_CIS_PER_GI)]
    return "".join(line + "\n" for line in lines)


def _cap_text(minor: int, mode: int) -> str:
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


Instances = list[tuple[int, list[tuple[int, list[int]]]]]  # (GPU minor, [(GI id, [CI ids])])


def _wanted(caps: str, instances: Instances) -> dict[str, str]:
    """Path -> content of every capability file. Plain strings, not pathlib: this runs on every MIG change, and
    pathlib's joins were most of a simulated MIG prepare's CPU."""
    wanted: dict[str, str] = {
        f"{caps}/mig/config": _cap_text(1, 0o400),
        f"{caps}/mig/monitor": _cap_text(2, _ACCESS_MODE),
    }
    for minor, gis in instances:
        for gi, cis in gis:
            gi_dir = f"{caps}/gpu{minor}/mig/gi{gi}"
            wanted[f"{gi_dir}/access"] = _cap_text(gi_cap_minor(minor, gi), _ACCESS_MODE)
            for ci in cis:
                wanted[f"{gi_dir}/ci{ci}/access"] = _cap_text(ci_cap_minor(minor, gi, ci), _ACCESS_MODE)
    return wanted


def write_fake_procfs(root: Path, state: MachineState, minors: list[int]) -> None:
    """Bring the tree in line with `state`, touching only the files that change (this runs on every MIG
    change, under the state lock)."""
    devices = root / "devices"
    if not devices.exists():
        root.mkdir(parents=True, exist_ok=True)
        devices.write_text(
            f"Character devices:\n{NVIDIA_MAJOR} nvidia-frontend\n{UVM_MAJOR} nvidia-uvm\n{CAPS_MAJOR} nvidia-caps\n"
        )
        (root / "driver" / "nvidia-caps").mkdir(parents=True, exist_ok=True)
        (root / "driver" / "nvidia-caps" / "mig-minors").write_text(mig_minors_text(minors))
    instances: Instances = [
        (m, [(gi.id, [ci.id for ci in gi.compute_instances]) for gi in g.gpu_instances])
        for g, m in zip(state.gpus, minors, strict=True)
    ]
    caps_path = root / "driver" / "nvidia" / "capabilities"
    caps = str(caps_path)
    marker = root / ".instances"  # the instances the tree shows: what exists, without walking the tree
    try:
        shown: Instances | None = [
            (m, [(gi, list(cis)) for gi, cis in gis]) for m, gis in json.loads(marker.read_text())
        ]
    except (OSError, ValueError, TypeError):
        shown = None
    if shown == instances:  # e.g. a MIG mode change
        return
    wanted = _wanted(caps, instances)
    if shown is not None:
        existing = set(_wanted(caps, shown))
    elif caps_path.exists():
        existing = {str(p) for p in caps_path.rglob("access")} | {str(p) for p in (caps_path / "mig").glob("*")}
    else:
        existing = set()
    for path in existing - wanted.keys():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        parent = os.path.dirname(path)
        while parent != caps and parent.startswith(caps):  # drop the now-empty gi/ci directories
            try:
                os.rmdir(parent)
            except OSError:  # not empty (or gone): the directories above it stay too
                break
            parent = os.path.dirname(parent)
    for path, text in wanted.items():
        if path not in existing:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
    marker.write_text(json.dumps(instances))
