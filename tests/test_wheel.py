"""The package works on its own: the wheel ships the generated gRPC modules, and needs nothing to build them.

The wheel is built (``pip wheel``, with build isolation) from a copy of the package sources, then installed into a
fresh virtual environment that has the main one's packages except grpcio-tools (linked in one by one, so the install
needs no download; pip resolves the wheel's dependencies there with ``--no-index``). There, outside the repository,
the kubelet-facing servers serve.
"""

from __future__ import annotations

import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# what a build needs: neither proto/ nor grpcio-tools
SOURCES = ("pyproject.toml", "README.md", "dra_driver")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.py[co]", "*.egg-info")
GENERATED = "dra_driver/plugin/grpc/generated"
BUILD_TIMEOUT_S = 240
# not linked into the fresh environment: the package itself (an editable install) and the code generator
_NOT_LINKED = re.compile(r"^(dra_driver|__editable__|_dra_driver|grpc_tools|grpcio_tools)", re.IGNORECASE)


def _run(cmd: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=_IGNORE)
        else:
            shutil.copy2(ROOT / name, src / name)
    dist = base / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w", str(dist), "."],
        cwd=src,
        timeout=BUILD_TIMEOUT_S,
    )
    (built,) = dist.glob("dra_driver-*.whl")
    return built


def test_the_wheel_ships_the_generated_modules(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (metadata_name,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(zf.read(metadata_name).decode())
    committed = sorted(p.name for p in (ROOT / GENERATED).iterdir() if p.suffix in (".py", ".pyi"))
    assert [n for n in committed if n.endswith("_pb2_grpc.py")]
    for name in committed:
        assert f"{GENERATED}/{name}" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]

    requires = metadata.get_all("Requires-Dist") or []
    runtime = [r for r in requires if "extra ==" not in r]
    assert not [r for r in runtime if r.lower().startswith("grpcio-tools")], runtime
    assert [r for r in runtime if r.lower().startswith("grpcio-health-checking")], runtime


SNIPPET = r"""
import importlib.util, json, os, shutil, sys, sysconfig, tempfile
from pathlib import Path

assert importlib.util.find_spec("grpc_tools") is None, "grpc_tools is importable"

import grpc
import dra_driver.plugin.grpc.generated as generated
from dra_driver.plugin.grpc import health
from dra_driver.plugin.grpc.server import PluginServer
from dra_driver.plugin.grpc.kubelet import KubeletHarness
from dra_driver.plugin.types import ClaimRef, PreparedDevice, PrepareResult

generated_dir = Path(generated.__file__).parent
assert generated_dir.is_relative_to(sysconfig.get_path("purelib")), generated_dir


class Preparer:
    def prepare(self, claims, deadline=None):
        device = PreparedDevice(requests=["gpu"], pool="p", device="gpu-0", cdi_device_ids=[])
        return {c.uid: PrepareResult(devices=[device]) for c in claims}

    def unprepare(self, claims, deadline=None):
        return {c.uid: None for c in claims}


driver = "gpu.nvidia.com"
d = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
try:
    with PluginServer(Preparer(), driver, d / "plugins", d / "registry", grace_period_s=0) as server:
        with KubeletHarness(d / "registry", driver) as kubelet:
            info = kubelet.register()
            claim = ClaimRef(namespace="ns", name="c", uid="uid-1")
            v1 = kubelet.prepare([claim], version="v1")
            v1beta1 = kubelet.prepare([claim], version="v1beta1")
            unprepared = kubelet.unprepare([claim])
        with grpc.insecure_channel(f"unix:{server.dra_socket_path}") as channel:
            serving = health.check(channel) == health.SERVING
finally:
    shutil.rmtree(d, ignore_errors=True)
print(json.dumps({
    "generated_dir": str(generated_dir),
    "versions": sorted(info.supported_versions),
    "devices": [v1["uid-1"].devices[0].device, v1beta1["uid-1"].devices[0].device],
    "unprepared": unprepared,
    "serving": serving,
    "grpc_tools_loaded": "grpc_tools" in sys.modules,
}))
"""


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A fresh venv with the wheel installed, the main venv's other packages linked in, and no grpc_tools."""
    base = tmp_path_factory.mktemp("venv")
    venv = base / "v"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=base, timeout=120)
    python = venv / "bin" / "python"
    query = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = Path(_run([str(python), "-c", query], cwd=base, timeout=60).strip())
    main = Path(sysconfig.get_path("purelib"))
    assert main != purelib
    for entry in main.iterdir():
        if not _NOT_LINKED.match(entry.name):
            (purelib / entry.name).symlink_to(entry)
    # dependencies are resolved against what is there: --no-index fails if the wheel needs anything missing
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "-q", str(wheel)],
        cwd=base,
        timeout=180,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    home = base / "home"
    home.mkdir()
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), PYTHONNOUSERSITE="1")
    yield venv, env


def test_the_installed_wheel_serves_without_grpc_tools(installed: tuple[Path, dict[str, str]]) -> None:
    venv, env = installed
    work = Path(env["HOME"])
    out = _run([str(venv / "bin" / "python"), "-c", SNIPPET], cwd=work, timeout=120, env=env)
    result = json.loads(out.strip().splitlines()[-1])
    assert Path(result["generated_dir"]).is_relative_to(venv), result
    assert result["versions"] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert result["devices"] == ["gpu-0", "gpu-0"]
    assert result["unprepared"] == {"uid-1": ""}
    assert result["serving"] is True
    assert result["grpc_tools_loaded"] is False
    assert not (work / ".cache" / "dra-driver").exists()  # nothing compiled at run time

    help_text = _run([str(venv / "bin" / "dra-driver"), "--help"], cwd=work, timeout=60, env=env)
    assert "usage: dra-driver" in help_text
