"""Our .proto files against the upstream ones of the k8s.io/kubelet Go module (Kubernetes 1.36).

The upstream module is fetched with ``go mod download`` into ``$HOME/.cache/dra-driver/gomod`` (reused across runs)
and its .proto files are compiled with grpc_tools.protoc into descriptor sets (gogoproto imports and options, which
only old releases carry, are stripped first). They must agree with the descriptors our servers use in packages,
services, methods, messages, fields (name, number, label, type, type name, proto3 optional) and enums.

Version: ``DRA_DRIVER_KUBELET_VERSION`` if set, else the newest v0.36.x the Go module proxy lists, else the newest
v0.36.x already in the cache. Without Go and without a cached copy the comparison is skipped.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from dra_driver.plugin.grpc.generated import (
    dra_health_v1alpha1_pb2,
    dra_v1_pb2,
    dra_v1beta1_pb2,
    pluginregistration_v1_pb2,
)

MODULE = "k8s.io/kubelet"
MINOR = "v0.36"
PROTO_DIR = Path(__file__).resolve().parent.parent / "proto"
DRA_V1_PROTO = "dra/v1/api.proto"
# ours (under proto/) -> upstream's (in the Go module), and the generated module our servers use
UPSTREAM_FILES = {
    DRA_V1_PROTO: "pkg/apis/dra/v1/api.proto",
    "dra/v1beta1/api.proto": "pkg/apis/dra/v1beta1/api.proto",
    "pluginregistration/v1/api.proto": "pkg/apis/pluginregistration/v1/api.proto",
    "dra-health/v1alpha1/api.proto": "pkg/apis/dra-health/v1alpha1/api.proto",
}
GENERATED: dict[str, ModuleType] = {
    DRA_V1_PROTO: dra_v1_pb2,
    "dra/v1beta1/api.proto": dra_v1beta1_pb2,
    "pluginregistration/v1/api.proto": pluginregistration_v1_pb2,
    "dra-health/v1alpha1/api.proto": dra_health_v1alpha1_pb2,
}
GO_TIMEOUT_S = 300


def _gomodcache() -> Path:
    return Path.home() / ".cache" / "dra-driver" / "gomod"


def _go() -> str | None:
    found = shutil.which("go")
    if found:
        return found
    default = Path("/usr/local/go/bin/go")
    return str(default) if default.is_file() else None


def _go_env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GOMODCACHE=str(_gomodcache()),
        GOFLAGS="-mod=mod",
        GOTOOLCHAIN="local",
        GO111MODULE="on",
        GOPATH=env.get("GOPATH", str(workdir / "gopath")),
        GOCACHE=env.get("GOCACHE", str(workdir / "gocache")),
    )
    return env


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))


def _cached_versions() -> list[str]:
    base = _gomodcache() / "k8s.io"
    found = [p.name.split("@", 1)[1] for p in base.glob("kubelet@v0.36.*")] if base.is_dir() else []
    return sorted((v for v in found if re.fullmatch(r"v0\.36\.\d+", v)), key=_version_key)


def _latest_on_proxy(go: str, workdir: Path) -> str | None:
    try:
        out = subprocess.run(
            [go, "list", "-m", "-versions", MODULE],
            cwd=workdir,
            env=_go_env(workdir),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    versions = [v for v in out.split()[1:] if re.fullmatch(r"v0\.36\.\d+", v)]
    return max(versions, key=_version_key) if versions else None


@pytest.fixture(scope="module")
def upstream_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The k8s.io/kubelet module source directory for Kubernetes 1.36."""
    workdir = tmp_path_factory.mktemp("gowork")
    go = _go()
    version = os.environ.get("DRA_DRIVER_KUBELET_VERSION")
    if not version and go:
        version = _latest_on_proxy(go, workdir)
    if not version:
        cached = _cached_versions()
        if not cached:
            pytest.skip(f"no Go toolchain or module proxy, and no cached {MODULE}@{MINOR}.x")
        version = cached[-1]
    cached_dir = _gomodcache() / f"{MODULE}@{version}"
    if (cached_dir / UPSTREAM_FILES[DRA_V1_PROTO]).is_file():
        return cached_dir
    if go is None:
        pytest.skip(f"{MODULE}@{version} is not cached and there is no Go toolchain to download it")
    result = subprocess.run(
        [go, "mod", "download", "-json", f"{MODULE}@{version}"],
        cwd=workdir,
        env=_go_env(workdir),
        capture_output=True,
        text=True,
        timeout=GO_TIMEOUT_S,
    )
    assert result.returncode == 0, f"go mod download failed: {result.stdout}{result.stderr}"
    return Path(json.loads(result.stdout)["Dir"])


_GOGO_IMPORT = re.compile(r'^[ \t]*import\s+"github\.com/gogo/protobuf/gogoproto/gogo\.proto"\s*;[ \t]*$', re.M)
_GOGO_FILE_OPTION = re.compile(r"^[ \t]*option\s+\(gogoproto\.[^;]*;[ \t]*$", re.M)
_GOGO_FIELD_OPTIONS = re.compile(r"\s*\[\s*\(gogoproto\.[^\]]*\]")


def strip_gogoproto(text: str) -> str:
    """Remove gogoproto imports and options (Kubernetes <= 1.34 protos carry them)."""
    text = _GOGO_IMPORT.sub("", text)
    text = _GOGO_FILE_OPTION.sub("", text)
    return _GOGO_FIELD_OPTIONS.sub("", text)


def compile_descriptor(source: Path, rel: str, out: Path) -> descriptor_pb2.FileDescriptorProto:
    """Compile one .proto (``source/rel``) with grpc_tools.protoc into a descriptor set; return its file."""
    from grpc_tools import protoc

    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{source}",
            f"-I{importlib.resources.files('grpc_tools') / '_proto'}",
            f"--descriptor_set_out={out}",
            rel,
        ]
    )
    assert rc == 0, f"protoc failed on {source / rel}"
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (fd,) = [f for f in fds.file if f.name == rel]
    return fd


def _fields(fields: Any) -> dict[str, tuple[Any, ...]]:
    # json_name is left out: protoc fills it in descriptor sets but not in generated code, and it follows the name
    return {f.name: (f.number, f.label, f.type, f.type_name, f.proto3_optional) for f in fields}


def _message(m: descriptor_pb2.DescriptorProto) -> dict[str, Any]:
    return {
        "fields": _fields(m.field),
        "nested": {n.name: _message(n) for n in m.nested_type},
        "enums": {e.name: {v.name: v.number for v in e.value} for e in m.enum_type},
        "oneofs": [o.name for o in m.oneof_decl],
        "map_entry": m.options.map_entry,
    }


def shape(fd: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """What must agree between our file and upstream's (not file names, comments or go_package)."""
    return {
        "syntax": fd.syntax,
        "package": fd.package,
        "dependencies": sorted(fd.dependency),
        "services": {
            s.name: {m.name: (m.input_type, m.output_type, m.client_streaming, m.server_streaming) for m in s.method}
            for s in fd.service
        },
        "messages": {m.name: _message(m) for m in fd.message_type},
        "enums": {e.name: {v.name: v.number for v in e.value} for e in fd.enum_type},
    }


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Readable differences between two shapes: ``path: ours != upstream``."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in a:
                out.append(f"{sub}: missing in ours")
            elif key not in b:
                out.append(f"{sub}: not upstream")
            else:
                out.extend(differences(a[key], b[key], sub))
        return out
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def ours(rel: str) -> descriptor_pb2.FileDescriptorProto:
    """The descriptor our servers actually use (from the generated module in dra_driver/plugin/grpc/generated/)."""
    return descriptor_pb2.FileDescriptorProto.FromString(GENERATED[rel].DESCRIPTOR.serialized_pb)


@pytest.mark.parametrize("rel", sorted(UPSTREAM_FILES))
def test_descriptors_match_upstream(rel: str, upstream_dir: Path, tmp_path: Path) -> None:
    upstream_rel = UPSTREAM_FILES[rel]
    src = tmp_path / "src"
    (src / upstream_rel).parent.mkdir(parents=True)
    (src / upstream_rel).write_text(strip_gogoproto((upstream_dir / upstream_rel).read_text()))
    theirs = compile_descriptor(src, upstream_rel, tmp_path / "upstream.pb")

    # our source compiled the same way agrees with what the runtime loaded
    mine = compile_descriptor(PROTO_DIR, rel, tmp_path / "ours.pb")
    assert shape(mine) == shape(ours(rel))

    diff = differences(shape(ours(rel)), shape(theirs))
    assert not diff, f"{rel} differs from {upstream_dir.name}/{upstream_rel}:\n" + "\n".join(diff)


def test_v1_device_share_id_is_proto3_optional() -> None:
    device = _message(next(m for m in ours(DRA_V1_PROTO).message_type if m.name == "Device"))
    number, label, type_, _, proto3_optional = device["fields"]["share_id"]
    assert (number, label, type_, proto3_optional) == (
        5,
        descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
        True,
    )


def test_comparison_catches_a_changed_field_number() -> None:
    fd = ours(DRA_V1_PROTO)
    changed = descriptor_pb2.FileDescriptorProto()
    changed.CopyFrom(fd)
    claim = next(m for m in changed.message_type if m.name == "Claim")
    next(f for f in claim.field if f.name == "uid").number = 4
    expected = "messages.Claim.fields.uid: (4, 1, 9, '', False) != (2, 1, 9, '', False)"
    assert differences(shape(changed), shape(fd)) == [expected]


def test_strip_gogoproto() -> None:
    text = (
        'syntax = "proto3";\nimport "github.com/gogo/protobuf/gogoproto/gogo.proto";\n'
        "option (gogoproto.goproto_stringer_all) = false;\n"
        'message Claim { string uid = 2 [(gogoproto.customname) = "UID"]; }\n'
    )
    assert strip_gogoproto(text) == 'syntax = "proto3";\n\n\nmessage Claim { string uid = 2; }\n'
