"""NVIDIA's own tools (nvidia-ctk, nvidia-cdi-hook, nvidia-device-plugin, gpu-kubelet-plugin), built (cached) from
their Go modules by scripts/build-nvidia-tools.sh; skips without Go unless DRA_K8S_REQUIRE=1."""

from __future__ import annotations

import functools
from pathlib import Path

from tests.gotools import run_build_script


@functools.cache
def nvidia_tool(name: str) -> Path:
    """The built binary `name` (built on first use; a cold build takes minutes, the DRA kubelet plugin's most)."""
    out = run_build_script("build-nvidia-tools.sh", name, what=name)
    tools = dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)
    assert name in tools, f"scripts/build-nvidia-tools.sh built {sorted(tools)}, not {name}"
    return Path(tools[name])
