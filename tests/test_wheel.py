"""The package works on its own: the wheel ships the gRPC message stubs generated at build time, and their sources.

The wheel is built (``pip wheel``, with build isolation: grpcio-tools comes from ``[build-system] requires``) from a
copy of the package sources without any generated stubs, then installed into a fresh virtual environment that has the
main one's packages except grpcio-tools (linked in one by one, so the install needs no download; pip resolves the
wheel's dependencies there with ``--no-index``). There, outside the repository and with no ``DRA_DRIVER_PROTO_DIR``,
the message modules load and the kubelet-facing servers serve. The unit tests below cover stale and missing stubs.
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

from dra_driver.plugin.grpc import protos

ROOT = Path(__file__).resolve().parents[1]
# what a build needs (the sdist's content: pyproject.toml, setup.py, MANIFEST.in)
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "proto", "dra_driver")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.py[co]", protos.STUBS_DIRNAME, ".stubs-*", "*.egg-info")
STUBS = "dra_driver/plugin/grpc/_stubs"
PROTO = ROOT / "proto"
BUILD_TIMEOUT_S = 240
# not linked into the fresh environment: the package itself (an editable install) and the stub generator
_NOT_LINKED = re.compile(r"^(dra_driver|__editable__|_dra_driver|grpc_tools|grpcio_tools)", re.IGNORECASE)


def _run(cmd: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _pb2(rel: str) -> str:
    return f"{STUBS}/{rel.removesuffix('.proto').replace('-', '_')}_pb2.py"


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
    assert not (src / STUBS).exists()
    dist = base / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w", str(dist), "."],
        cwd=src,
        timeout=BUILD_TIMEOUT_S,
    )
    (built,) = dist.glob("dra_driver-*.whl")
    return built


def test_the_wheel_ships_the_stubs_and_their_sources(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        manifest = json.loads(zf.read(f"{STUBS}/{protos.MANIFEST_NAME}"))
        (metadata_name,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(zf.read(metadata_name).decode())
    for rel in protos.PROTO_FILES:
        assert _pb2(rel) in names
        assert f"{STUBS}/{protos.SOURCES_DIRNAME}/{rel}" in names
        assert manifest["sources"][rel] == protos._sha256((PROTO / rel).read_bytes())
    assert manifest["sources_sha256"] == protos.sources_hash(PROTO)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]

    requires = metadata.get_all("Requires-Dist") or []
    runtime = [r for r in requires if "extra ==" not in r]
    assert not [r for r in runtime if r.lower().startswith("grpcio-tools")], runtime
    (protobuf,) = (r for r in runtime if re.match(r"protobuf\b", r))
    floor = re.search(r">=\s*([\d.]+)", protobuf)
    assert floor, protobuf
    # the generated modules refuse a protobuf runtime older than the one they were generated for
    version = [int(x) for x in floor[1].split(".")]
    assert manifest["protobuf_gencode"]
    assert version >= [int(x) for x in manifest["protobuf_gencode"].split(".")]


SNIPPET = r"""
import importlib.util, json, os, shutil, sys, sysconfig, tempfile
from pathlib import Path

assert importlib.util.find_spec("grpc_tools") is None, "grpc_tools is importable"
assert "DRA_DRIVER_PROTO_DIR" not in os.environ

import grpc
from dra_driver.plugin.grpc import PluginServer, health, protos
from dra_driver.plugin.grpc.kubelet import KubeletHarness
from dra_driver.plugin.types import ClaimRef, PreparedDevice, PrepareResult

pb = protos.load()
assert pb.stub_dir == protos.package_stub_dir(), pb.stub_dir
assert pb.stub_dir.is_relative_to(sysconfig.get_path("purelib")), pb.stub_dir
assert protos.source_dir() is None  # no checkout: checked against the copies it ships


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
    "stub_dir": str(pb.stub_dir),
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
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DRA_DRIVER_PROTO", "PYTHON"))}
    home = base / "home"
    home.mkdir()
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), PYTHONNOUSERSITE="1")
    yield venv, env


def test_the_installed_wheel_serves_without_grpc_tools_or_sources(installed: tuple[Path, dict[str, str]]) -> None:
    venv, env = installed
    work = Path(env["HOME"])
    out = _run([str(venv / "bin" / "python"), "-c", SNIPPET], cwd=work, timeout=120, env=env)
    result = json.loads(out.strip().splitlines()[-1])
    assert Path(result["stub_dir"]).is_relative_to(venv), result
    assert result["versions"] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert result["devices"] == ["gpu-0", "gpu-0"]
    assert result["unprepared"] == {"uid-1": ""}
    assert result["serving"] is True
    assert result["grpc_tools_loaded"] is False
    assert not (work / ".cache" / "dra-driver").exists()  # nothing compiled at run time

    help_text = _run([str(venv / "bin" / "dra-driver"), "--help"], cwd=work, timeout=60, env=env)
    assert "usage: dra-driver" in help_text


# -- stale and missing stubs (unit tests; they need grpcio-tools, which the dev extra has)


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    """Stubs generated from the repository's proto/ as the build does, in a directory of their own."""
    out = tmp_path / "pkg" / protos.STUBS_DIRNAME
    protos.write_stubs(PROTO, out)
    return out


@pytest.fixture
def changed_sources(tmp_path: Path) -> Path:
    changed = tmp_path / "proto"
    shutil.copytree(PROTO, changed)
    with (changed / protos.DRA_V1_PROTO).open("a") as f:
        f.write("\n// changed\n")
    return changed


@pytest.fixture
def no_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As for an installed wheel: no DRA_DRIVER_PROTO_DIR and no proto/ beside the package."""
    monkeypatch.delenv("DRA_DRIVER_PROTO_DIR", raising=False)
    monkeypatch.setattr(protos, "_checkout_proto_dir", lambda: tmp_path / "no-checkout" / "proto")


def test_written_stubs_record_their_sources(shipped: Path) -> None:
    assert protos.check_stubs(shipped, PROTO) is None
    assert protos.check_stubs(shipped, None) is None  # against the copies it carries
    manifest = protos.read_manifest(shipped)
    assert manifest is not None
    assert manifest["sources_sha256"] == protos.sources_hash(PROTO)
    assert manifest["protobuf_gencode"] == protos.gencode_version((shipped / "dra" / "v1" / "api_pb2.py").read_text())
    module = shipped / "dra" / "v1" / "api_pb2.py"
    mtime = module.stat().st_mtime_ns
    assert protos.write_stubs(PROTO, shipped) == manifest
    assert module.stat().st_mtime_ns == mtime  # up to date: not rewritten
    assert [p.name for p in shipped.parent.iterdir()] == [protos.STUBS_DIRNAME]  # no temporary directories left


def test_the_shipped_stubs_are_used_when_they_match(shipped: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRA_DRIVER_PROTO_DIR", raising=False)
    monkeypatch.setattr(protos, "generate", lambda *a: pytest.fail("compiled although the stubs are up to date"))
    assert protos.locate_stubs(shipped) == shipped


def test_stale_stubs_are_compiled_again_with_grpc_tools(
    shipped: Path, changed_sources: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRA_DRIVER_PROTO_DIR", str(changed_sources))
    monkeypatch.setenv("DRA_DRIVER_PROTO_CACHE", str(tmp_path / "cache"))
    assert "other .proto sources" in (protos.check_stubs(shipped, changed_sources) or "")
    fresh = protos.locate_stubs(shipped)
    assert fresh.parent == tmp_path / "cache"
    assert protos.check_stubs(fresh, changed_sources) is None


@pytest.mark.parametrize("damage", ["stale", "missing", "no-manifest", "edited"])
def test_unusable_stubs_without_grpc_tools_name_the_fix(
    damage: str, shipped: Path, changed_sources: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(protos, "have_grpc_tools", lambda: False)
    monkeypatch.setattr(protos, "generate", lambda *a: pytest.fail("compiled without grpcio-tools"))
    monkeypatch.delenv("DRA_DRIVER_PROTO_DIR", raising=False)
    expected = {
        "stale": "generated from other .proto sources",
        "missing": "no generated stubs",
        "no-manifest": "manifest.json is missing",
        "edited": "differs from what was generated",
    }[damage]
    if damage == "stale":
        monkeypatch.setenv("DRA_DRIVER_PROTO_DIR", str(changed_sources))
    elif damage == "missing":
        shutil.rmtree(shipped)
    elif damage == "no-manifest":
        (shipped / protos.MANIFEST_NAME).unlink()
    else:
        with (shipped / "health" / "v1" / "health_pb2.py").open("a") as f:
            f.write("# edited\n")
    with pytest.raises(protos.ProtoGenerationError, match=expected) as err:
        protos.locate_stubs(shipped)
    assert "pip install -e ." in str(err.value)
    assert "pip install grpcio-tools" in str(err.value)


@pytest.mark.usefixtures("no_checkout")
def test_an_installation_checks_its_stubs_against_the_sources_it_ships(shipped: Path) -> None:
    assert protos.source_dir() is None
    assert protos.locate_stubs(shipped) == shipped
    copy = shipped / protos.SOURCES_DIRNAME / protos.HEALTH_PROTO
    copy.write_text(copy.read_text() + "\n// changed\n")
    with pytest.raises(protos.ProtoGenerationError, match="Reinstall dra-driver") as err:
        protos.locate_stubs(shipped)
    assert "generated from other .proto sources" in str(err.value)


@pytest.mark.usefixtures("no_checkout")
def test_an_installation_without_stubs_says_so(tmp_path: Path) -> None:
    with pytest.raises(protos.ProtoGenerationError, match=r"no generated stubs.*Reinstall dra-driver"):
        protos.locate_stubs(tmp_path / "missing")


def test_an_incomplete_proto_dir_is_an_error(changed_sources: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (changed_sources / protos.HEALTH_PROTO).unlink()
    monkeypatch.setattr(protos, "_checkout_proto_dir", lambda: changed_sources)
    monkeypatch.delenv("DRA_DRIVER_PROTO_DIR", raising=False)
    with pytest.raises(protos.ProtoGenerationError, match=r"missing health/v1/health\.proto"):
        protos.source_dir()


def test_imports_between_generated_modules_are_refused(tmp_path: Path) -> None:
    allowed = "from google.protobuf import descriptor as _d\nimport google.protobuf\n"
    protos._check_imports(tmp_path / "ok_pb2.py", allowed)
    with pytest.raises(protos.ProtoGenerationError, match=r"imports dra\.v1"):
        protos._check_imports(tmp_path / "x_pb2.py", "from dra.v1 import api_pb2 as dra_dot_v1_dot_api__pb2\n")
