"""Protobuf message modules for the kubelet APIs, generated from ``proto/*.proto`` with grpcio-tools on first use.

Nothing generated is committed. On first use in a process, :func:`load` hashes the ``.proto`` sources together with
the grpcio-tools and protobuf versions, and looks for ``<cache>/<hash>/``. If it is missing, ``grpc_tools.protoc``
(with the include files bundled in grpc_tools) compiles the sources into a fresh temporary directory beside it, which
is then renamed into place atomically, so concurrent processes never see a half-written tree. The modules are then
loaded from their files under private names (``dra_driver.plugin.grpc._generated.*``); the cache directory is never
put on ``sys.path``.

Only ``*_pb2`` message modules are generated. The servers and clients are built from the service descriptors in
those modules (see :mod:`dra_driver.plugin.grpc.rpc`), which needs no ``*_pb2_grpc`` module: those import their
``*_pb2`` module by an absolute, top-level name (``from dra.v1 import api_pb2``) that would only resolve with the
cache directory on ``sys.path``.

Environment:

- ``DRA_DRIVER_PROTO_DIR``: where the ``.proto`` sources are (default: ``proto/`` at the repository root, found
  relative to this file, which is where it is for an editable install or a source checkout).
- ``DRA_DRIVER_PROTO_CACHE``: cache directory (default: ``$XDG_CACHE_HOME/dra-driver/grpc-stubs``, then
  ``~/.cache/dra-driver/grpc-stubs``, then ``<tmp>/dra-driver-grpc-stubs-<uid>``; the first writable one wins).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.resources
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

# Relative to the proto directory; also the file names the descriptors get in the protobuf descriptor pool.
DRA_V1_PROTO = "dra/v1/api.proto"
DRA_V1BETA1_PROTO = "dra/v1beta1/api.proto"
REGISTRATION_PROTO = "pluginregistration/v1/api.proto"
HEALTH_PROTO = "health/v1/health.proto"
DRA_HEALTH_PROTO = "dra-health/v1alpha1/api.proto"
PROTO_FILES: tuple[str, ...] = (DRA_V1_PROTO, DRA_V1BETA1_PROTO, REGISTRATION_PROTO, HEALTH_PROTO, DRA_HEALTH_PROTO)

_MODULE_PREFIX = "dra_driver.plugin.grpc._generated"
_COMPLETE_MARKER = ".complete"
_lock = threading.Lock()
_loaded: Protos | None = None


class ProtoGenerationError(RuntimeError):
    """The .proto sources could not be found or compiled."""


@dataclass(frozen=True)
class Protos:
    """The generated message modules."""

    dra_v1: ModuleType
    dra_v1beta1: ModuleType
    registration: ModuleType
    health: ModuleType
    dra_health: ModuleType  # v1alpha1.DRAResourceHealth
    stub_dir: Path  # where the generated files are


def proto_dir() -> Path:
    """Directory holding the .proto sources."""
    env = os.environ.get("DRA_DRIVER_PROTO_DIR")
    if env:
        return Path(env)
    # dra_driver/plugin/grpc/protos.py -> repository root
    return Path(__file__).resolve().parents[3] / "proto"


def grpc_tools_include_dir() -> Path:
    """The well-known protos (google/protobuf/*.proto) bundled with grpcio-tools."""
    return Path(str(importlib.resources.files("grpc_tools") / "_proto"))


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def cache_key(source_dir: Path) -> str:
    """Hash of the sources, their paths and the code generator and runtime versions."""
    h = hashlib.sha256()
    for rel in PROTO_FILES:
        h.update(rel.encode() + b"\0")
        h.update((source_dir / rel).read_bytes() + b"\0")
    h.update(f"grpcio-tools={_version('grpcio-tools')};protobuf={_version('protobuf')}".encode())
    return h.hexdigest()[:24]


def _cache_roots() -> list[Path]:
    env = os.environ.get("DRA_DRIVER_PROTO_CACHE")
    if env:
        return [Path(env)]
    roots: list[Path] = []
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        roots.append(Path(xdg) / "dra-driver" / "grpc-stubs")
    with contextlib.suppress(RuntimeError, KeyError):  # no home directory
        roots.append(Path.home() / ".cache" / "dra-driver" / "grpc-stubs")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    roots.append(Path(tempfile.gettempdir()) / f"dra-driver-grpc-stubs-{uid}")
    return roots


def _writable_root() -> Path:
    errors: list[str] = []
    for root in _cache_roots():
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            errors.append(f"{root}: {exc}")
            continue
        if os.access(root, os.W_OK | os.X_OK):
            return root
        errors.append(f"{root}: not writable")
    raise ProtoGenerationError("no writable cache directory for generated gRPC stubs: " + "; ".join(errors))


def compile_protos(source_dir: Path, out_dir: Path, files: tuple[str, ...] = PROTO_FILES) -> None:
    """Run grpc_tools.protoc on ``files`` (relative to ``source_dir``), writing ``*_pb2.py`` under ``out_dir``."""
    try:
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ProtoGenerationError("generating the gRPC stubs needs grpcio-tools (pip install grpcio-tools)") from exc
    args = [
        "grpc_tools.protoc",
        f"-I{source_dir}",
        f"-I{grpc_tools_include_dir()}",
        f"--python_out={out_dir}",
        *files,
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise ProtoGenerationError(f"grpc_tools.protoc failed with exit code {rc}: {' '.join(args)}")


def generate(source_dir: Path | None = None) -> Path:
    """Make sure the stubs for the current sources exist in the cache; return their directory."""
    src = source_dir or proto_dir()
    missing = [rel for rel in PROTO_FILES if not (src / rel).is_file()]
    if missing:
        raise ProtoGenerationError(
            f"proto sources not found under {src} (missing {', '.join(missing)}); set DRA_DRIVER_PROTO_DIR"
        )
    root = _writable_root()
    final = root / cache_key(src)
    if (final / _COMPLETE_MARKER).is_file():
        return final
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        compile_protos(src, tmp)
        (tmp / _COMPLETE_MARKER).write_text("ok\n")
        if final.exists() and not (final / _COMPLETE_MARKER).is_file():
            shutil.rmtree(final, ignore_errors=True)  # left incomplete by an older layout or a manual edit
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / _COMPLETE_MARKER).is_file():  # not just lost a race against another process
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _load_module(name: str, path: Path) -> ModuleType:
    full = f"{_MODULE_PREFIX}.{name}"
    spec = importlib.util.spec_from_file_location(full, path)
    if spec is None or spec.loader is None:
        raise ProtoGenerationError(f"cannot load generated module {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[full]
        raise
    return module


def _pb2_path(stub_dir: Path, rel: str) -> Path:
    # protoc's Python generator writes '-' in a path as '_' (dra-health/... -> dra_health/...)
    return stub_dir / (rel.removesuffix(".proto").replace("-", "_") + "_pb2.py")


def load() -> Protos:
    """Generate (if needed) and import the message modules; cached for the life of the process."""
    global _loaded
    with _lock:
        if _loaded is None:
            stub_dir = generate()
            _loaded = Protos(
                dra_v1=_load_module("dra_v1_api_pb2", _pb2_path(stub_dir, DRA_V1_PROTO)),
                dra_v1beta1=_load_module("dra_v1beta1_api_pb2", _pb2_path(stub_dir, DRA_V1BETA1_PROTO)),
                registration=_load_module("pluginregistration_v1_api_pb2", _pb2_path(stub_dir, REGISTRATION_PROTO)),
                health=_load_module("health_v1_health_pb2", _pb2_path(stub_dir, HEALTH_PROTO)),
                dra_health=_load_module("dra_health_v1alpha1_api_pb2", _pb2_path(stub_dir, DRA_HEALTH_PROTO)),
                stub_dir=stub_dir,
            )
        return _loaded
