"""Build hook: generate the gRPC message stubs into the package before ``build_py`` collects it.

Everything else about the package is in pyproject.toml. ``build_py`` runs for a wheel (``pip install .``,
``pip wheel .``, a wheel built from the sdist) and for an editable install (``pip install -e .``, where setuptools'
own ``build_py`` copies nothing). Either way the stubs are written into the source tree, at
``dra_driver/plugin/grpc/_stubs/`` (gitignored): a wheel ships them from there as package data, an editable install
uses them in place. grpcio-tools comes from ``[build-system] requires``. See ``dra_driver/plugin/grpc/protos.py``.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTOS_PY = ROOT / "dra_driver" / "plugin" / "grpc" / "protos.py"


def _protos() -> ModuleType:
    """dra_driver/plugin/grpc/protos.py, loaded by path: importing the package would need its runtime dependencies."""
    name = "_dra_driver_build_protos"
    spec = importlib.util.spec_from_file_location(name, PROTOS_PY)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {PROTOS_PY}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def _protobuf_floor(requirements: list[str]) -> str | None:
    for req in requirements:
        m = re.match(r"\s*protobuf\s*(?:\[[^]]*\])?\s*([^;]*)", req, re.IGNORECASE)
        if m:
            floor = re.search(r">=\s*([\w.]+)", m[1])
            return floor[1] if floor else None
    return None


class BuildPyWithStubs(build_py):  # type: ignore[misc]
    """``build_py`` that first writes the stubs (skipped if those there are up to date)."""

    def run(self) -> None:
        protos = _protos()
        manifest = protos.write_stubs(ROOT / "proto", protos.package_stub_dir())
        # the generated code refuses a protobuf runtime older than the one it was generated for
        gencode = manifest.get("protobuf_gencode")
        floor = _protobuf_floor(list(self.distribution.install_requires or []))
        if gencode and (floor is None or _version_tuple(floor) < _version_tuple(gencode)):
            raise RuntimeError(
                f"grpcio-tools {manifest.get('grpcio_tools')} generated code for protobuf {gencode}, but the runtime "
                f"dependency allows protobuf {'>=' + floor if floor else '(any)'}: raise the protobuf floor in "
                "pyproject.toml [project] dependencies, or pin grpcio-tools lower in [build-system] requires"
            )
        super().run()


setup(cmdclass={"build_py": BuildPyWithStubs})
