"""NVIDIA's own tools (nvidia-ctk, nvidia-cdi-hook, nvidia-device-plugin, gpu-kubelet-plugin), built (cached) from
their Go modules by scripts/build-nvidia-tools.sh; skips without Go unless DRA_K8S_REQUIRE=1."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REQUIRE = os.environ.get("DRA_K8S_REQUIRE") == "1"
BUILD_SCRIPT = ROOT / "scripts" / "build-nvidia-tools.sh"


@functools.cache
def _built(name: str) -> Path:
    env = {**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/local/go/bin"}
    out = subprocess.run([str(BUILD_SCRIPT), name], capture_output=True, text=True, timeout=3600, env=env, check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    tools = dict(line.split("\t", 1) for line in out.stdout.splitlines() if "\t" in line)
    assert name in tools, f"scripts/build-nvidia-tools.sh built {sorted(tools)}, not {name}"
    return Path(tools[name])


def nvidia_tool(name: str) -> Path:
    """The built binary `name` (built on first use; a cold build takes minutes, the DRA kubelet plugin's most)."""
    if shutil.which("go") is None and not Path("/usr/local/go/bin/go").is_file():
        if REQUIRE:
            pytest.fail(f"DRA_K8S_REQUIRE=1 but no Go toolchain to build {name}")
        pytest.skip(f"no Go toolchain to build {name}")
    return _built(name)
