"""Protobuf message modules for the kubelet APIs, generated from ``proto/*.proto`` with grpcio-tools at build time.

Nothing generated is committed. Building the package (a wheel, an sdist's wheel, or ``pip install -e .``) runs the
``build_py`` hook in ``setup.py``, which calls :func:`write_stubs`: ``grpc_tools.protoc`` (a build requirement, with
the include files bundled in grpc_tools) compiles ``proto/*.proto`` into ``dra_driver/plugin/grpc/_stubs/`` in the
source tree (gitignored), from where the wheel ships it as package data and an editable install sees it in place.
A stub directory holds:

- ``<path>_pb2.py`` for every ``<path>.proto`` (protoc writes ``-`` in a path as ``_``: ``dra_health/v1alpha1/``);
- ``proto/<path>.proto``: copies of the sources they were generated from;
- ``manifest.json``, written last: the sha256 of the sources (all of them together, and each one), of each generated
  module, the grpcio-tools version and the protobuf version the code was generated for (the generated modules check
  at import that the protobuf runtime is not older: that is the floor of the ``protobuf`` runtime dependency).

On first use in a process, :func:`load` checks the shipped stubs (:func:`check_stubs`) against the ``.proto``
sources: those of the source checkout (``proto/`` at the repository root, or ``DRA_DRIVER_PROTO_DIR``) where there
are any, else the copies shipped beside the stubs (an installed wheel). If they match, the modules are loaded from
their files under private names (``dra_driver.plugin.grpc._generated.*``); no stub directory is ever put on
``sys.path``. If they do not (a ``.proto`` edited since the last ``pip install -e .``, or a checkout used without
installing it), the sources are compiled as a fallback, if grpcio-tools is importable (it is in the ``dev`` extra),
into a content-keyed cache (:func:`generate`: ``<cache>/<hash>/`` is built in a temporary directory beside it and
renamed into place atomically, so concurrent processes never see a half-written tree). Without grpcio-tools a stale or
missing stub directory is a :class:`ProtoGenerationError` naming the fix.

Only ``*_pb2`` message modules are generated. The servers and clients are built from the service descriptors in
those modules (see :mod:`dra_driver.plugin.grpc.rpc`), which needs no ``*_pb2_grpc`` module: those import their
``*_pb2`` module by an absolute, top-level name (``from dra.v1 import api_pb2``) that would only resolve with the stub
directory on ``sys.path``. For the same reason generation fails if one ``.proto`` imports another of ours (only
``google/protobuf/*`` imports, served by the protobuf runtime, are allowed).

``setup.py`` loads this file by path, without importing the package: it must import nothing outside the standard
library at module level.

Environment (for development; an installed package needs neither):

- ``DRA_DRIVER_PROTO_DIR``: the ``.proto`` sources to check the stubs against and to compile from (default:
  ``proto/`` at the repository root, found relative to this file, which is where it is for an editable install or a
  source checkout; an installed wheel has none there and checks its stubs against the copies it ships).
- ``DRA_DRIVER_PROTO_CACHE``: cache directory of the fallback (default: ``$XDG_CACHE_HOME/dra-driver/grpc-stubs``,
  then ``~/.cache/dra-driver/grpc-stubs``, then ``<tmp>/dra-driver-grpc-stubs-<uid>``; the first writable one wins).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.resources
import importlib.util
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

# Relative to the proto directory; also the file names the descriptors get in the protobuf descriptor pool.
DRA_V1_PROTO = "dra/v1/api.proto"
DRA_V1BETA1_PROTO = "dra/v1beta1/api.proto"
REGISTRATION_PROTO = "pluginregistration/v1/api.proto"
HEALTH_PROTO = "health/v1/health.proto"
DRA_HEALTH_PROTO = "dra-health/v1alpha1/api.proto"
PROTO_FILES: tuple[str, ...] = (DRA_V1_PROTO, DRA_V1BETA1_PROTO, REGISTRATION_PROTO, HEALTH_PROTO, DRA_HEALTH_PROTO)

STUBS_DIRNAME = "_stubs"  # in this package: the stubs generated at build time
MANIFEST_NAME = "manifest.json"
SOURCES_DIRNAME = "proto"  # in a stub directory: copies of the sources
MANIFEST_FORMAT = 1

_MODULE_PREFIX = "dra_driver.plugin.grpc._generated"
_PACKAGE_DIR = Path(__file__).resolve().parent
# the call the generated code makes at import: ValidateProtobufRuntimeVersion(domain, major, minor, patch, suffix, ...)
_GENCODE_VERSION = re.compile(
    r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.\w+,\s*(\d+),\s*(\d+),\s*(\d+),\s*'([^']*)'"
)
_IMPORT = re.compile(r"^(?:from\s+(\S+)\s+import\s+\S+|import\s+(\S+))", re.MULTILINE)
_lock = threading.Lock()
_loaded: Protos | None = None
log = logging.getLogger(__name__)


class ProtoGenerationError(RuntimeError):
    """The stubs are missing or stale and could not be (re)generated, or the sources could not be compiled."""


@dataclass(frozen=True)
class Protos:
    """The generated message modules."""

    dra_v1: ModuleType
    dra_v1beta1: ModuleType
    registration: ModuleType
    health: ModuleType
    dra_health: ModuleType  # v1alpha1.DRAResourceHealth
    stub_dir: Path  # where the generated files are


def package_stub_dir() -> Path:
    """Where the stubs generated at build time are (inside this package; it may not exist in a source checkout)."""
    return _PACKAGE_DIR / STUBS_DIRNAME


def _checkout_proto_dir() -> Path:
    # dra_driver/plugin/grpc -> repository root
    return _PACKAGE_DIR.parents[2] / "proto"


def proto_dir() -> Path:
    """Directory holding the .proto sources of a source checkout (it does not exist for an installed wheel)."""
    env = os.environ.get("DRA_DRIVER_PROTO_DIR")
    if env:
        return Path(env)
    return _checkout_proto_dir()


def _missing(source_dir: Path) -> list[str]:
    return [rel for rel in PROTO_FILES if not (source_dir / rel).is_file()]


def source_dir() -> Path | None:
    """The .proto sources to check the stubs against and compile from; None where there are none (a wheel)."""
    src = proto_dir()
    missing = _missing(src)
    if not missing:
        return src
    if "DRA_DRIVER_PROTO_DIR" in os.environ or len(missing) < len(PROTO_FILES):
        raise ProtoGenerationError(
            f"proto sources not found under {src} (missing {', '.join(missing)}); set DRA_DRIVER_PROTO_DIR"
        )
    return None


def grpc_tools_include_dir() -> Path:
    """The well-known protos (google/protobuf/*.proto) bundled with grpcio-tools."""
    return Path(str(importlib.resources.files("grpc_tools") / "_proto"))


def have_grpc_tools() -> bool:
    """Whether grpcio-tools is importable here (needed only to generate stubs)."""
    return importlib.util.find_spec("grpc_tools") is not None


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_sources(source_dir: Path) -> dict[str, bytes]:
    return {rel: (source_dir / rel).read_bytes() for rel in PROTO_FILES}


def _sources_digest(sources: dict[str, bytes], extra: bytes = b"") -> str:
    h = hashlib.sha256()
    for rel in PROTO_FILES:
        h.update(rel.encode() + b"\0")
        h.update(sources[rel] + b"\0")
    h.update(extra)
    return h.hexdigest()


def sources_hash(source_dir: Path) -> str:
    """sha256 of the sources and their paths (what a stub directory's manifest records)."""
    return _sources_digest(_read_sources(source_dir))


def cache_key(source_dir: Path) -> str:
    """Hash of the sources, their paths and the code generator and runtime versions."""
    versions = f"grpcio-tools={_version('grpcio-tools')};protobuf={_version('protobuf')}"
    return _sources_digest(_read_sources(source_dir), versions.encode())[:24]


def read_manifest(stub_dir: Path) -> dict[str, Any] | None:
    """The manifest of a stub directory; None if it has none (missing, or not completely written)."""
    try:
        manifest = json.loads((stub_dir / MANIFEST_NAME).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ProtoGenerationError(f"cannot read {stub_dir / MANIFEST_NAME}: {exc}") from exc
    return manifest if isinstance(manifest, dict) else None


def check_stubs(stub_dir: Path, sources: Path | None) -> str | None:
    """Why the stubs in ``stub_dir`` cannot be used for the ``.proto`` files in ``sources``; None if they can.

    ``sources`` None: check them against the copies of the sources in ``stub_dir`` (an installed wheel).
    """
    if not stub_dir.is_dir():
        return f"there are no generated stubs at {stub_dir}"
    try:
        manifest = read_manifest(stub_dir)
    except ProtoGenerationError as exc:
        return str(exc)
    if manifest is None:
        return f"{stub_dir / MANIFEST_NAME} is missing (the stubs were not completely generated)"
    if manifest.get("format") != MANIFEST_FORMAT:
        return f"{stub_dir / MANIFEST_NAME} has format {manifest.get('format')!r}, not {MANIFEST_FORMAT}"
    src = sources if sources is not None else stub_dir / SOURCES_DIRNAME
    missing = _missing(src)
    if missing:
        return f"proto sources not found under {src} (missing {', '.join(missing)})"
    recorded = str(manifest.get("sources_sha256"))
    actual = sources_hash(src)
    if actual != recorded:
        return (
            f"the stubs in {stub_dir} were generated from other .proto sources than those in {src} "
            f"(sha256 {recorded[:12]}, now {actual[:12]})"
        )
    modules = manifest.get("modules")
    for rel in PROTO_FILES:
        path = _pb2_path(stub_dir, rel)
        try:
            data = path.read_bytes()
        except OSError:
            return f"{path} is missing"
        if not isinstance(modules, dict) or modules.get(rel) != _sha256(data):
            return f"{path} differs from what was generated (sha256 not the one in {MANIFEST_NAME})"
    return None


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


def gencode_version(module_source: str) -> str | None:
    """The protobuf version a generated module was generated for (it refuses an older runtime); None if unknown."""
    m = _GENCODE_VERSION.search(module_source)
    return f"{m[1]}.{m[2]}.{m[3]}{m[4]}" if m else None


def _check_imports(path: Path, text: str) -> None:
    for m in _IMPORT.finditer(text):
        module = m[1] or m[2]
        if module != "google.protobuf" and not module.startswith("google.protobuf."):
            raise ProtoGenerationError(
                f"{path} imports {module}: a generated module may only import google.protobuf (the stubs are loaded "
                "by file under private names, so imports between our .proto files cannot be resolved)"
            )


def build_stub_tree(source_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Generate a complete stub directory in ``out_dir`` (empty or new): modules, source copies, manifest (last).

    Returns the manifest.
    """
    missing = _missing(source_dir)
    if missing:
        raise ProtoGenerationError(f"proto sources not found under {source_dir} (missing {', '.join(missing)})")
    sources = _read_sources(source_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # compile exactly the bytes that are recorded (the files could change while this runs)
    staged = out_dir / SOURCES_DIRNAME
    for rel, data in sources.items():
        (staged / rel).parent.mkdir(parents=True, exist_ok=True)
        (staged / rel).write_bytes(data)
    compile_protos(staged, out_dir)
    modules: dict[str, str] = {}
    gencode: set[str | None] = set()
    for rel in PROTO_FILES:
        path = _pb2_path(out_dir, rel)
        data = path.read_bytes()
        text = data.decode()
        _check_imports(path, text)
        gencode.add(gencode_version(text))
        modules[rel] = _sha256(data)
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "sources_sha256": _sources_digest(sources),
        "sources": {rel: _sha256(data) for rel, data in sources.items()},
        "modules": modules,
        "grpcio_tools": _version("grpcio-tools"),
        "protobuf_gencode": gencode.pop() if len(gencode) == 1 else None,
    }
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def write_stubs(source_dir: Path, out_dir: Path | None = None) -> dict[str, Any]:
    """Generate the stubs for ``source_dir`` into ``out_dir`` (default: :func:`package_stub_dir`); the build hook.

    Nothing is rewritten if ``out_dir`` already holds the stubs of these sources made by this grpcio-tools version.
    Otherwise the new tree is built beside it and swapped in. Returns the manifest.
    """
    out = out_dir if out_dir is not None else package_stub_dir()
    if check_stubs(out, source_dir) is None:
        manifest = read_manifest(out)
        if manifest is not None and manifest.get("grpcio_tools") == _version("grpcio-tools"):
            return manifest
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".stubs-tmp-", dir=out.parent))
    old: Path | None = None
    try:
        manifest = build_stub_tree(source_dir, tmp)
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp made it 0700
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=".stubs-old-", dir=out.parent))
            os.rename(out, old / out.name)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return manifest


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


def generate(source_dir: Path | None = None) -> Path:
    """The fallback: make sure stubs for the sources exist in the cache (compiling them); return their directory."""
    src = source_dir or proto_dir()
    missing = _missing(src)
    if missing:
        raise ProtoGenerationError(
            f"proto sources not found under {src} (missing {', '.join(missing)}); set DRA_DRIVER_PROTO_DIR"
        )
    root = _writable_root()
    final = root / cache_key(src)
    if check_stubs(final, src) is None:
        return final
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        build_stub_tree(src, tmp)
        if final.exists() and check_stubs(final, src) is not None:
            shutil.rmtree(final, ignore_errors=True)  # incomplete, of an older layout, or edited by hand
        try:
            os.rename(tmp, final)
        except OSError:
            if check_stubs(final, src) is not None:  # not just lost a race against another process
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def locate_stubs(shipped: Path | None = None) -> Path:
    """The stub directory :func:`load` uses: the shipped one if it matches the sources, else a fresh one (fallback).

    ``shipped`` defaults to :func:`package_stub_dir`.
    """
    shipped = shipped if shipped is not None else package_stub_dir()
    sources = source_dir()
    problem = check_stubs(shipped, sources)
    if problem is None:
        return shipped
    if sources is None:
        raise ProtoGenerationError(
            f"the gRPC message stubs of this dra-driver installation are unusable: {problem}. Reinstall dra-driver "
            "from a wheel built from its sources (pip install <checkout>, which generates them with grpcio-tools at "
            "build time), or set DRA_DRIVER_PROTO_DIR to the .proto sources and install grpcio-tools"
        )
    if not have_grpc_tools():
        raise ProtoGenerationError(
            f"{problem}. Regenerate the stubs: `pip install -e .` (or `pip install .`) in the repository generates "
            "them at build time; or install grpcio-tools (pip install grpcio-tools) to have them compiled at first use"
        )
    log.info("%s: compiling the gRPC stubs from %s instead", problem, sources)
    return generate(sources)


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
    """Find (or, as a fallback, generate) and import the message modules; cached for the life of the process."""
    global _loaded
    with _lock:
        if _loaded is None:
            path = locate_stubs()
            _loaded = Protos(
                dra_v1=_load_module("dra_v1_api_pb2", _pb2_path(path, DRA_V1_PROTO)),
                dra_v1beta1=_load_module("dra_v1beta1_api_pb2", _pb2_path(path, DRA_V1BETA1_PROTO)),
                registration=_load_module("pluginregistration_v1_api_pb2", _pb2_path(path, REGISTRATION_PROTO)),
                health=_load_module("health_v1_health_pb2", _pb2_path(path, HEALTH_PROTO)),
                dra_health=_load_module("dra_health_v1alpha1_api_pb2", _pb2_path(path, DRA_HEALTH_PROTO)),
                stub_dir=path,
            )
        return _loaded
