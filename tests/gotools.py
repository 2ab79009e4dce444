"""The project's Go tools, built (and cached) by their scripts/build-*.sh: one way for every test to get one, and to
skip without a Go toolchain (fail instead when DRA_K8S_REQUIRE=1, as in CI)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REQUIRE = os.environ.get("DRA_K8S_REQUIRE") == "1"


def run_build_script(script: str, *args: str, what: str | None = None, timeout: float = 3600) -> str:
    """The stdout of `scripts/<script> args...` (the built paths); skips (or fails under DRA_K8S_REQUIRE=1)
    without a Go toolchain, fails when the build does."""
    if shutil.which("go") is None and not Path("/usr/local/go/bin/go").is_file():
        if REQUIRE:
            pytest.fail(f"DRA_K8S_REQUIRE=1 but no Go toolchain to build {what or script}")
        pytest.skip(f"no Go toolchain to build {what or script}")
    env = {**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/local/go/bin"}
    out = subprocess.run(
        [str(ROOT / "scripts" / script), *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout


def built_binary(script: str, what: str | None = None) -> Path:
    """The binary a build script names on its last stdout line."""
    return Path(run_build_script(script, what=what).strip().splitlines()[-1])


def pinned(tool: str) -> str:
    """The Kubernetes library a tools/ module links, as its go.mod pins it (e.g. "dynamic-resource-allocation v0.37.2"),
    for the titles of the differential tests' summaries."""
    for line in (ROOT / "tools" / tool / "go.mod").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "k8s.io/dynamic-resource-allocation" and parts[1].startswith("v"):
            return f"dynamic-resource-allocation {parts[1]}"
    raise AssertionError(f"tools/{tool}/go.mod pins no k8s.io/dynamic-resource-allocation")
