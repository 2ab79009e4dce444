"""Writes the gRPC modules of the kubelet APIs, dra_driver/plugin/grpc/generated/, from the .proto files in proto/.

For each proto/<path>.proto listed in PROTOS, grpcio-tools' protoc writes ``<name>_pb2.py`` (messages),
``<name>_pb2.pyi`` (their types) and ``<name>_pb2_grpc.py`` (servicer base, ``add_<Service>Servicer_to_server`` and
client stub). The modules are committed and shipped in the wheel like any other source; tests/test_grpc_generated.py
fails while they differ from what this script writes, so they never go stale. The generated code names the
grpcio-tools version, so run it with the one pinned in the ``dev`` extra of pyproject.toml.

Each file is compiled under the name ``dra_driver/plugin/grpc/generated/<name>.proto``, so that the generated
``*_pb2_grpc`` modules import their ``*_pb2`` module by its place in this package. That name is only the file's name
in the protobuf descriptor pool; the proto packages, and so the services' names on the wire
(``/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/...``, ``/pluginregistration.Registration/...``), are those of the files.

Run: python scripts/gen_protos.py [--check]   (--check: write nothing, exit 1 if the committed modules differ)
"""

from __future__ import annotations

import argparse
import importlib.resources
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PACKAGE = "dra_driver/plugin/grpc/generated"
OUT = ROOT / PACKAGE

# proto/<path> -> module name prefix in the generated package
PROTOS = {
    "dra/v1/api.proto": "dra_v1",
    "dra/v1beta1/api.proto": "dra_v1beta1",
    "pluginregistration/v1/api.proto": "pluginregistration_v1",
    "dra-health/v1alpha1/api.proto": "dra_health_v1alpha1",
}
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")

INIT = '''"""gRPC modules of the kubelet APIs, generated from proto/ by scripts/gen_protos.py: do not edit.

| module | proto package | service |
| --- | --- | --- |
| ``dra_v1_pb2[_grpc]`` | ``k8s.io.kubelet.pkg.apis.dra.v1`` | ``DRAPlugin`` |
| ``dra_v1beta1_pb2[_grpc]`` | ``k8s.io.kubelet.pkg.apis.dra.v1beta1`` | ``DRAPlugin`` |
| ``pluginregistration_v1_pb2[_grpc]`` | ``pluginregistration`` | ``Registration`` |
| ``dra_health_v1alpha1_pb2[_grpc]`` | ``v1alpha1`` | ``DRAResourceHealth`` |
"""
'''


def _sources(proto_dir: Path) -> list[str]:
    found = sorted(str(p.relative_to(proto_dir)) for p in proto_dir.rglob("*.proto"))
    unlisted = [rel for rel in found if rel not in PROTOS]
    missing = [rel for rel in PROTOS if rel not in found]
    if unlisted or missing:
        raise SystemExit(
            f"gen_protos: {proto_dir} has {unlisted or 'no file'} not listed in PROTOS, lacks {missing or 'nothing'}"
        )
    return found


def generated(proto_dir: Path = PROTO_DIR) -> dict[str, bytes]:
    """What the generated package must hold: file name -> content."""
    from grpc_tools import protoc

    _sources(proto_dir)
    include = Path(str(importlib.resources.files("grpc_tools") / "_proto"))
    with tempfile.TemporaryDirectory(prefix="gen-protos-") as tmp:
        work = Path(tmp)
        staged = work / PACKAGE
        staged.mkdir(parents=True)
        for rel, name in PROTOS.items():
            shutil.copyfile(proto_dir / rel, staged / f"{name}.proto")
        args = [
            "grpc_tools.protoc",
            f"-I{work}",
            f"-I{include}",
            f"--python_out={work}",
            f"--pyi_out={work}",
            f"--grpc_python_out={work}",
            *(f"{PACKAGE}/{name}.proto" for name in PROTOS.values()),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"gen_protos: protoc failed: {' '.join(args)}")
        files = {"__init__.py": INIT.encode()}
        for name in PROTOS.values():
            for suffix in SUFFIXES:
                files[name + suffix] = (staged / (name + suffix)).read_bytes()
    return files


def on_disk(out: Path = OUT) -> dict[str, bytes]:
    """What the generated package holds now (caches aside)."""
    if not out.is_dir():
        return {}
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and p.suffix in (".py", ".pyi")}


def differences(want: dict[str, bytes], have: dict[str, bytes]) -> list[str]:
    return [
        f"{name}: {'missing' if name not in have else 'not generated' if name not in want else 'differs'}"
        for name in sorted(set(want) | set(have))
        if want.get(name) != have.get(name)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the modules are stale")
    args = parser.parse_args(argv)
    want = generated()
    diff = differences(want, on_disk())
    if args.check:
        for line in diff:
            print(f"{PACKAGE}/{line}", file=sys.stderr)
        return 1 if diff else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name in set(on_disk()) - set(want):
        (OUT / name).unlink()
    for name, data in want.items():
        if (OUT / name).is_file() and (OUT / name).read_bytes() == data:
            continue
        (OUT / name).write_bytes(data)
    print(f"{PACKAGE}: {len(diff)} file(s) written or removed" if diff else f"{PACKAGE}: up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
