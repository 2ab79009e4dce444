"""Shared by the tests of the simulated libnvidia-ml (tests/test_libnvml*.py): building it and the go-nvml probe,
pynvml's own ctypes wrappers pointed at it, and three executors of one call script (the Python simulator through
its pynvml surface, the C library through pynvml, the C library through go-nvml) whose answers compare as equal JSON.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_driver.simulator.driverroot import library_dir
from dra_driver.simulator.libnvml.build import build_library
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.simulator.structs import (
    c_nvmlComputeInstanceProfileInfo_v3_t,
    c_nvmlGpuInstanceProfileInfo_v3_t,
    nvmlComputeInstanceProfileInfo_v3,
    nvmlGpuInstanceProfileInfo_v3,
)
from tests.gotools import built_binary

ROOT = Path(__file__).resolve().parent.parent
REQUIRE = os.environ.get("DRA_K8S_REQUIRE") == "1"


@functools.cache
def built_library() -> Path:
    """native/libnvml built (cached) by scripts/build-libnvml.sh; skips without a C compiler unless required."""
    if shutil.which(os.environ.get("CC") or "cc") is None:
        if REQUIRE:
            pytest.fail("DRA_K8S_REQUIRE=1 but no C compiler to build the simulated libnvidia-ml")
        pytest.skip("no C compiler to build the simulated libnvidia-ml")
    return build_library()


@functools.cache
def gonvmlprobe_binary() -> Path:
    """tools/gonvmlprobe, built (cached) by scripts/build-gonvmlprobe.sh; skips without Go unless required."""
    return built_binary("build-gonvmlprobe.sh", "tools/gonvmlprobe")


def simulated_library(sim: SimulatedNvml) -> Path:
    """The libnvidia-ml.so.1 on the machine's driver root (the built library, not the stand-in)."""
    built = built_library()
    path = library_dir(sim.driver_root) / "libnvidia-ml.so.1"
    assert path.resolve().read_bytes() == built.read_bytes(), "the driver root does not hold the built library"
    return path


@contextmanager
def pynvml_on(library: Path) -> Iterator[Any]:
    """pynvml's own module functions (its ctypes wrappers, what the driver calls on a real node) calling `library`;
    pynvml's loader state is restored afterwards."""
    saved = (pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache), pynvml._nvmlLib_refcount)
    with pynvml.libLoadLock:
        pynvml.nvmlLib = ctypes.CDLL(str(library))
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
    try:
        yield pynvml
    finally:
        with pynvml.libLoadLock:
            pynvml.nvmlLib, pynvml._nvmlLib_refcount = saved[0], saved[2]
            pynvml._nvmlGetFunctionPointer_cache.clear()
            pynvml._nvmlGetFunctionPointer_cache.update(saved[1])


# ----- a call script and its executors ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Var:
    """An argument: a value an earlier call saved, or one field of it (a struct's `id`, `device`)."""

    name: str
    field: str | None = None


@dataclass(frozen=True)
class Call:
    fn: str
    args: tuple[Any, ...] = ()
    save: str | None = None


@dataclass
class OutOfBand:
    """What a person does to the machine, not an NVML call: a method of SimulatedNvml on each executor's machine."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


Step = Call | OutOfBand
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE of an unsigned long long
NO_SAVED_VALUE = -2  # a call whose argument an earlier, failed, call should have saved


def address(pointer: Any) -> int:
    return int(ctypes.cast(pointer, ctypes.c_void_p).value or 0)


def normalize(value: Any) -> Any:
    """JSON of what a call returned: handles as addresses, structs as {field: value}, char arrays as text."""
    if value is None or isinstance(value, bool | int | str):
        return int(value) if isinstance(value, bool) else value
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, ctypes._Pointer | ctypes.c_void_p):
        return address(value)
    if isinstance(value, ctypes._SimpleCData):
        return normalize(value.value)
    if isinstance(value, ctypes.Structure):
        return {name: normalize(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, list | tuple):
        return [normalize(v) for v in value]
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items()}
    if isinstance(value, pynvml.nvmlFriendlyObject):  # pynvml's process info: None is NVML_VALUE_NOT_AVAILABLE
        fields = vars(value)
        return {k: (NOT_AVAILABLE if v is None and k == "usedGpuMemory" else normalize(v)) for k, v in fields.items()}
    raise TypeError(f"cannot normalize {type(value).__name__}")


def fabric_info(info: Any) -> dict[str, Any]:
    """A GPU's fabric info as the differential test compares it (gonvmlprobe's `fabric`): the cluster UUID as text."""
    out = {
        "clusterUuid": str(uuid.UUID(bytes=bytes(info.clusterUuid))),
        "status": int(info.status),
        "cliqueId": int(info.cliqueId),
        "state": int(info.state),
    }
    if hasattr(info, "healthMask"):
        out["healthMask"] = int(info.healthMask)
    return out


class Executor:
    """Runs a script on one simulated machine; `sim` is that machine (for out-of-band steps)."""

    label = ""

    def __init__(self, sim: SimulatedNvml) -> None:
        self.sim = sim
        self.saved: dict[str, Any] = {}

    def call(self, step: Call) -> tuple[int, Any]:
        raise NotImplementedError

    def run(self, step: Step) -> tuple[int, Any]:
        if isinstance(step, OutOfBand):
            getattr(self.sim, step.method)(*step.args, **step.kwargs)
            return 0, None
        return self.call(step)

    def close(self) -> None:
        pass


class PyExecutor(Executor):
    """pynvml's call surface: `api` is a SimulatedNvml (the reference) or the pynvml module on the C library."""

    def __init__(self, sim: SimulatedNvml, api: Any, label: str) -> None:
        super().__init__(sim)
        self.api, self.label = api, label
        self.is_sim = isinstance(api, SimulatedNvml)

    def _arg(self, a: Any) -> Any:
        if isinstance(a, Var):
            v = self.saved[a.name]
            return getattr(v, a.field) if a.field else v
        return a

    def _raw(self, name: str, *args: Any) -> None:
        """A C function pynvml has no wrapper for (v3 structs), through pynvml's function table."""
        rc = pynvml._nvmlGetFunctionPointer(name)(*args)
        if rc != pynvml.NVML_SUCCESS:
            raise pynvml.NVMLError(rc)

    def _v3(self, name: str, struct: Any, version: int, *args: Any) -> Any:
        info = struct()
        info.version = version
        self._raw(name, *args, ctypes.byref(info))
        return info

    def _placements(self, method: str, elem: Any, handle: Any, profile_id: int) -> list[Any]:
        fn = getattr(self.api, method)
        count = ctypes.c_uint(0)
        fn(handle, profile_id, None, ctypes.byref(count))
        array = (elem * count.value)()
        if count.value:
            fn(handle, profile_id, array, ctypes.byref(count))
        return list(array[: count.value])

    def _instances(self, method: str, elem: Any, handle: Any, profile_id: int, n: int) -> list[Any]:
        array = (elem * n)()
        count = ctypes.c_uint(n)
        getattr(self.api, method)(handle, profile_id, array, ctypes.byref(count))
        return list(array[: count.value])

    def _invoke(self, fn: str, args: list[Any]) -> Any:
        api = self.api
        if fn == "nvmlDeviceGetMemoryInfo_v2":
            return api.nvmlDeviceGetMemoryInfo(args[0], version=pynvml.nvmlMemory_v2)
        if fn == "nvmlDeviceGetHandleByUUIDV":
            text, kind = args
            value = uuid.UUID(text[4:]).bytes if kind == pynvml.NVML_UUID_TYPE_BINARY else text.encode()
            return api.nvmlDeviceGetHandleByUUIDV(value, kind)
        if fn in ("nvmlDeviceGetHandleByUUID", "nvmlDeviceGetHandleByPciBusId") and not self.is_sim:
            return getattr(api, fn)(args[0].encode())
        if fn == "nvmlDeviceGetGpuInstanceProfileInfo":
            h, profile, version = args
            if version == 3 and not self.is_sim:
                return self._v3(
                    "nvmlDeviceGetGpuInstanceProfileInfoV",
                    c_nvmlGpuInstanceProfileInfo_v3_t,
                    nvmlGpuInstanceProfileInfo_v3,
                    h,
                    profile,
                )
            return api.nvmlDeviceGetGpuInstanceProfileInfo(h, profile, version=version)
        if fn == "nvmlDeviceGetGpuInstanceProfileInfoById":
            h, profile_id, version = args
            if self.is_sim:
                return api.nvmlDeviceGetGpuInstanceProfileInfoById(h, profile_id, version=version)
            if version == 2:
                return api.nvmlDeviceGetGpuInstanceProfileInfoById(h, profile_id)
            return self._v3(
                "nvmlDeviceGetGpuInstanceProfileInfoByIdV",
                c_nvmlGpuInstanceProfileInfo_v3_t,
                nvmlGpuInstanceProfileInfo_v3,
                h,
                profile_id,
            )
        if fn == "nvmlGpuInstanceGetComputeInstanceProfileInfo":
            gi, profile, engine, version = args
            if version == 3 and not self.is_sim:
                return self._v3(
                    "nvmlGpuInstanceGetComputeInstanceProfileInfoV",
                    c_nvmlComputeInstanceProfileInfo_v3_t,
                    nvmlComputeInstanceProfileInfo_v3,
                    gi,
                    profile,
                    engine,
                )
            return api.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, profile, engine, version=version)
        if fn == "nvmlDeviceGetGpuInstancePossiblePlacements":
            return self._placements(fn, pynvml.c_nvmlGpuInstancePlacement_t, *args)
        if fn == "nvmlGpuInstanceGetComputeInstancePossiblePlacements":
            return self._placements(fn, pynvml.c_nvmlComputeInstancePlacement_t, *args)
        if fn == "nvmlDeviceGetGpuInstances":
            return self._instances(fn, pynvml.c_nvmlGpuInstance_t, *args)
        if fn == "nvmlGpuInstanceGetComputeInstances":
            return self._instances(fn, pynvml.c_nvmlComputeInstance_t, *args)
        if fn == "nvmlDeviceCreateGpuInstanceWithPlacement":
            h, profile_id, start, size = args
            placement = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
            return api.nvmlDeviceCreateGpuInstanceWithPlacement(h, profile_id, ctypes.byref(placement))
        if fn == "nvmlGpuInstanceCreateComputeInstanceWithPlacement":
            gi, profile_id, start, size = args
            ci_placement = pynvml.c_nvmlComputeInstancePlacement_t(start, size)
            return api.nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, profile_id, ctypes.byref(ci_placement))
        if fn in ("nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfoV"):
            info = pynvml.c_nvmlGpuFabricInfo_t() if fn.endswith("Info") else pynvml.c_nvmlGpuFabricInfoV_t()
            if hasattr(info, "version"):
                info.version = pynvml.nvmlGpuFabricInfo_v2
            getattr(api, fn)(args[0], ctypes.byref(info))
            return fabric_info(info)
        if fn in (
            "nvmlDeviceGetCudaComputeCapability",
            "nvmlDeviceGetMigMode",
            "nvmlDeviceGetEccMode",
            "nvmlDeviceGetPowerManagementLimitConstraints",
        ):
            return list(getattr(api, fn)(*args))
        if fn in ("nvmlDeviceSetMigMode", "nvmlDeviceSetComputeMode", "nvmlEventSetFree") or fn.endswith("Destroy"):
            result = getattr(api, fn)(*args)
            return result if fn == "nvmlDeviceSetMigMode" else None
        return getattr(api, fn)(*args)

    def call(self, step: Call) -> tuple[int, Any]:
        try:
            args = [self._arg(a) for a in step.args]
        except KeyError:
            return NO_SAVED_VALUE, None
        try:
            result = self._invoke(step.fn, args)
        except pynvml.NVMLError as e:
            return int(e.value), None
        if step.save:
            self.saved[step.save] = result
        return 0, normalize(result)


class GoExecutor(Executor):
    """The C library through NVIDIA's go-nvml (tools/gonvmlprobe), one line of JSON a call."""

    label = "go-nvml"

    def __init__(self, sim: SimulatedNvml, probe: Path, library: Path) -> None:
        super().__init__(sim)
        self.proc = subprocess.Popen(
            [str(probe), str(library)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )

    @staticmethod
    def _arg(a: Any) -> Any:
        if isinstance(a, Var):
            return {"var": a.name, **({"field": a.field} if a.field else {})}
        return a

    def call(self, step: Call) -> tuple[int, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        request = {"fn": step.fn, "args": [self._arg(a) for a in step.args], "save": step.save or ""}
        self.proc.stdin.write(json.dumps(request) + "\n")
        line = self.proc.stdout.readline()
        assert line, f"gonvmlprobe exited ({self.proc.poll()}) at {step}"
        answer = json.loads(line)
        if answer.get("probe", "").startswith("no saved value"):
            return NO_SAVED_VALUE, None
        assert "probe" not in answer, f"gonvmlprobe: {answer['probe']} at {step}"
        return int(answer["rc"]), answer["value"] if answer["rc"] == 0 else None

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Renamer:
    """MIG UUIDs are random per creation: each executor's n-th new one becomes MIG#n."""

    seen: dict[str, str] = field(default_factory=dict)

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str) and value.startswith("MIG-"):
            return self.seen.setdefault(value, f"MIG#{len(self.seen)}")
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, dict):
            return {k: self(v) for k, v in value.items()}
        return value


def run_script(executors: list[Executor], script: list[Step]) -> tuple[list[str], int]:
    """Every step on every executor in lockstep; the differences from the first executor (the reference), and how
    many calls ran. Event-set handles are process-local numbers: only whether the call succeeded is compared."""
    renamers = [Renamer() for _ in executors]
    differences: list[str] = []
    calls = 0
    for step in script:
        results = []
        for ex, rename in zip(executors, renamers, strict=True):
            rc, value = ex.run(step)
            if isinstance(step, Call) and step.fn == "nvmlEventSetCreate":
                value = None
            results.append((rc, rename(value)))
        calls += isinstance(step, Call)
        ref = results[0]
        for ex, got in zip(executors[1:], results[1:], strict=True):
            if got != ref:
                differences.append(f"{step}: {executors[0].label} {ref} != {ex.label} {got}")
    return differences, calls
