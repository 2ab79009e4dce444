"""The committed gRPC modules (dra_driver/plugin/grpc/generated/) are what scripts/gen_protos.py writes from proto/,
and the runtime dependencies allow no grpcio or protobuf older than the generated code accepts."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ROOT / "dra_driver" / "plugin" / "grpc" / "generated"
# the calls the generated code makes at import to refuse an older runtime
PROTOBUF_GENCODE = re.compile(
    r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.\w+,\s*(\d+),\s*(\d+),\s*(\d+),\s*'([^']*)'"
)
GRPC_GENERATED = re.compile(r"^GRPC_GENERATED_VERSION = '([\d.]+)'$", re.M)


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def _floor(requirement: str) -> tuple[int, ...]:
    """The ``>=`` or ``==`` version of a requirement of pyproject.toml's [project] dependencies or dev extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name = re.split(r"[<>=!~;\[ ]", requirement)[0]
    for req in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
        if re.split(r"[<>=!~;\[ ]", req)[0] == name:
            found = re.search(r"(?:>=|==)\s*([\d.]+)", req)
            assert found, req
            return _version(found[1])
    raise AssertionError(f"{name} is not a dependency")


def test_the_committed_modules_are_what_the_script_generates() -> None:
    gen = _generator()
    pinned = ".".join(map(str, _floor("grpcio-tools")))
    installed = importlib.metadata.version("grpcio-tools")
    assert installed == pinned, f"grpcio-tools {installed} is installed; the dev extra pins {pinned}"
    diff = gen.differences(gen.generated(), gen.on_disk())
    assert not diff, "stale generated modules, run: python scripts/gen_protos.py\n" + "\n".join(diff)


def test_the_script_refuses_a_proto_it_does_not_list(tmp_path: Path) -> None:
    gen = _generator()
    for rel in gen.PROTOS:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / "proto" / rel).read_text())
    (tmp_path / "extra.proto").write_text('syntax = "proto3";\n')
    with pytest.raises(SystemExit, match=r"extra\.proto"):
        gen.generated(tmp_path)


def test_the_runtime_floors_admit_no_runtime_the_generated_code_refuses() -> None:
    gencode = set()
    grpc_generated = set()
    for path in sorted(GENERATED.glob("*_pb2.py")):
        m = PROTOBUF_GENCODE.search(path.read_text())
        assert m, path
        gencode.add(_version(f"{m[1]}.{m[2]}.{m[3]}"))
    for path in sorted(GENERATED.glob("*_pb2_grpc.py")):
        m = GRPC_GENERATED.search(path.read_text())
        assert m, path
        grpc_generated.add(_version(m[1]))
    assert gencode and grpc_generated
    assert _floor("protobuf") >= max(gencode)
    assert _floor("grpcio") >= max(grpc_generated)
