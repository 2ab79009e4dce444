"""The simulated libnvidia-ml (native/libnvml, dra_driver/simulator/libnvml): its exports, its C conventions, one
machine state shared with the Python simulator and the driver in both directions, several processes at once, and a
process that needs nothing but the library's path."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_driver.cli import build_parser
from dra_driver.nvml.discovery import discover
from dra_driver.simulator.driverroot import ensure_driver_root, library_dir
from dra_driver.simulator.libnvml import (
    CONF_NAME,
    LOG_NAME,
    PERSISTENCED_LOG_NAME,
    SOCKET_NAME,
    STATE_ENV,
    connect,
    persistenced,
    persistenced_socket,
)
from dra_driver.simulator.libnvml.build import SOURCE_DIR
from dra_driver.simulator.libnvml.handlers import FUNCTIONS
from dra_driver.simulator.libnvml.server import Server, Session
from dra_driver.simulator.libnvml.view import ContainerView
from dra_driver.simulator.libnvml.wire import decode_answer, request_bytes
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.simulator.procfs import ci_cap_minor, gi_cap_minor
from dra_driver.simulator.source import open_source, serve_containers
from tests.libnvml_support import (
    Call,
    GoExecutor,
    Var,
    address,
    built_library,
    gonvmlprobe_binary,
    pynvml_on,
    simulated_library,
)
from tests.simhelpers import create_full_ci, create_gi

SUCCESS, UNINITIALIZED, INVALID_ARGUMENT = 0, 1, 2
NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, INSUFFICIENT_SIZE, DRIVER_NOT_LOADED = 3, 4, 6, 7, 9
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _short_lived_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRA_DRIVER_LIBNVML_IDLE_S", "5")
    monkeypatch.delenv(STATE_ENV, raising=False)


def _names(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line and not line.startswith("#")]


def _forwarded() -> dict[str, str]:
    """name -> format of every FORWARD(...) line of native/libnvml/functions.c."""
    text = (SOURCE_DIR / "functions.c").read_text()
    return dict(re.findall(r"^FORWARD\((nvml\w+), \"([^\"]*)\"", text, re.MULTILINE))


def _uint() -> ctypes.c_uint:
    return ctypes.c_uint(0)


# ----- the exports ---------------------------------------------------------------------------------------------
def test_every_function_go_nvml_declares_is_exported(tmp_path: Path) -> None:
    names = _names(SOURCE_DIR / "nvml_functions.txt")
    assert len(names) >= 400 and {"nvmlInit_v2", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2"} <= set(names)
    lib = ctypes.CDLL(str(built_library()))
    missing = [n for n in names if not hasattr(lib, n)]
    assert missing == []
    if shutil.which("nm"):
        out = subprocess.run(["nm", "-D", "--defined-only", str(built_library())], capture_output=True, text=True)
        exported = {line.split()[-1] for line in out.stdout.splitlines()}
        assert exported == set(names)  # and nothing else: the library's own helpers stay hidden


def test_the_library_and_the_server_agree_on_every_modelled_function() -> None:
    forwarded = _forwarded()
    names = set(_names(SOURCE_DIR / "nvml_functions.txt"))
    assert set(forwarded) <= names
    assert {n: f for n, (f, _) in FUNCTIONS.items() if n != "nvmlInitWithFlags"} == forwarded
    assert FUNCTIONS["nvmlInitWithFlags"][0] == "u"  # sent by libnvml.c's nvmlInit*, not a FORWARD line
    assert len(forwarded) >= 60


def test_unmodelled_functions_answer_not_supported(tmp_path: Path) -> None:
    sim = SimulatedNvml("dgx-h100", tmp_path / "m")
    lib = ctypes.CDLL(str(simulated_library(sim)))
    modelled = set(_forwarded()) | {"nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString"}
    stubs = [n for n in _names(SOURCE_DIR / "nvml_functions.txt") if n not in modelled]
    assert len(stubs) > 300
    # A stub touches none of its arguments, so calling it without any is safe.
    assert {n: getattr(lib, n)() for n in stubs} == dict.fromkeys(stubs, UNINITIALIZED)
    assert lib.nvmlInit_v2() == SUCCESS
    try:
        assert {n: getattr(lib, n)() for n in stubs} == dict.fromkeys(stubs, NOT_SUPPORTED)
    finally:
        assert lib.nvmlShutdown() == SUCCESS


def test_the_stub_log_names_every_unmodelled_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sim = SimulatedNvml("dgx-h100", tmp_path / "m")
    lib = ctypes.CDLL(str(simulated_library(sim)))
    log = tmp_path / "stubs.log"
    monkeypatch.setenv("DRA_DRIVER_LIBNVML_STUB_LOG", str(log))
    assert lib.nvmlDeviceGetFanSpeed() == UNINITIALIZED  # before nvmlInit: not a call NVML would answer
    assert lib.nvmlInit_v2() == SUCCESS
    try:
        assert lib.nvmlDeviceGetFanSpeed() == NOT_SUPPORTED and lib.nvmlDeviceGetVbiosVersion() == NOT_SUPPORTED
        count = _uint()
        assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == SUCCESS  # modelled: not noted
    finally:
        assert lib.nvmlShutdown() == SUCCESS
    assert log.read_text() == "nvmlDeviceGetFanSpeed\nnvmlDeviceGetVbiosVersion\n"


# ----- C conventions ---------------------------------------------------------------------------------------------
ERROR_STRINGS = {
    0: "Success",
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    6: "Not Found",
    7: "Insufficient Size",
    9: "Driver Not Loaded",
    10: "Timeout",
    15: "GPU is lost",
    16: "GPU requires reset",
    19: "In use by another client",
    23: "Insufficient Resources",
    999: "Unknown Error",
    12345: "Unknown Error",
}


def test_c_conventions(tmp_path: Path) -> None:
    sim = SimulatedNvml("dgx-h100", tmp_path / "m")
    lib = ctypes.CDLL(str(simulated_library(sim)))
    lib.nvmlErrorString.restype = ctypes.c_char_p
    assert {code: lib.nvmlErrorString(code).decode() for code in ERROR_STRINGS} == ERROR_STRINGS  # without init
    count = _uint()
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == UNINITIALIZED
    assert lib.nvmlShutdown() == UNINITIALIZED
    assert lib.nvmlInit_v2() == SUCCESS
    assert lib.nvmlInitWithFlags(0) == SUCCESS  # counted: two shutdowns to go
    dev = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == SUCCESS
    assert lib.nvmlDeviceGetCount_v2(None) == INVALID_ARGUMENT
    assert lib.nvmlDeviceGetHandleByUUID(None, ctypes.byref(dev)) == INVALID_ARGUMENT
    assert lib.nvmlDeviceGetHandleByIndex_v2(0, None) == INVALID_ARGUMENT
    assert lib.nvmlDeviceGetName(None, ctypes.create_string_buffer(96), 96) == INVALID_ARGUMENT
    small = ctypes.create_string_buffer(b"unchanged", 10)
    assert lib.nvmlDeviceGetName(dev, small, 10) == INSUFFICIENT_SIZE
    assert small.value == b"unchanged"  # nothing written
    name = ctypes.create_string_buffer(96)
    assert lib.nvmlDeviceGetName(dev, name, 96) == SUCCESS and name.value == b"NVIDIA H100 80GB HBM3"
    # The array convention: NULL asks for the count; too small an array is INSUFFICIENT_SIZE with the count set.
    assert lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, 19, None, ctypes.byref(count)) == SUCCESS
    assert count.value == 7
    few = (pynvml.c_nvmlGpuInstancePlacement_t * 2)()
    count.value = 2
    assert lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, 19, few, ctypes.byref(count)) == INSUFFICIENT_SIZE
    assert count.value == 7
    assert lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, 19, few, None) == INVALID_ARGUMENT
    # A versioned struct with a version the library does not know.
    info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
    info.version = 0x09000098
    assert lib.nvmlDeviceGetGpuInstanceProfileInfoV(dev, 0, ctypes.byref(info)) == INVALID_ARGUMENT
    memory = pynvml.c_nvmlMemory_v2_t()
    memory.version = 0x01000028
    assert lib.nvmlDeviceGetMemoryInfo_v2(dev, ctypes.byref(memory)) == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    assert lib.nvmlShutdown() == SUCCESS
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == SUCCESS  # one reference left
    assert lib.nvmlShutdown() == SUCCESS
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == UNINITIALIZED


def test_wire_format_errors_are_answered_not_fatal(tmp_path: Path) -> None:
    SimulatedNvml("mixed", tmp_path / "m")
    server = Server(tmp_path / "m", 60.0)  # dispatch alone: no socket listens, no process
    body = request_bytes("nvmlDeviceGetCount", "o8", b"\x01")[4:]  # the library's "o4" is the server's format
    assert int.from_bytes(server.dispatch(body)[:4], "little", signed=True) == pynvml.NVML_ERROR_UNKNOWN
    body = request_bytes("nvmlDeviceGetNotAThing", "o4", b"\x01")[4:]
    assert int.from_bytes(server.dispatch(body)[:4], "little", signed=True) == NOT_SUPPORTED
    assert int.from_bytes(server.dispatch(b"junk")[:4], "little", signed=True) == pynvml.NVML_ERROR_UNKNOWN
    body = request_bytes("nvmlDeviceGetCount", "o4", b"\x01")[4:]
    answer = server.dispatch(body)
    assert answer == (0).to_bytes(4, "little") + b"\x01\x00" + (4).to_bytes(4, "little") + (5).to_bytes(4, "little")


# ----- one machine state, seen from every side ------------------------------------------------------------------
def _enable_mig(lib: Any, dev: Any) -> None:
    assert lib.nvmlDeviceSetMigMode(dev, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_SUCCESS


def test_mig_made_through_the_library_is_seen_by_the_simulator_and_the_driver(tmp_path: Path) -> None:
    state = tmp_path / "m"
    sim = SimulatedNvml("dgx-h100", state)
    with pynvml_on(simulated_library(sim)) as lib:
        lib.nvmlInit()
        try:
            dev = lib.nvmlDeviceGetHandleByIndex(2)
            _enable_mig(lib, dev)
            gi = create_gi(lib, dev, 9, 4, 4)  # 3g.40gb at 4:4
            ci = create_full_ci(lib, gi, 3)
            mig = lib.nvmlComputeInstanceGetInfo(ci).device
            mig_uuid = lib.nvmlDeviceGetUUID(mig)
            via_library = discover(lib, sim.sysfs_root)  # the driver's discovery, through the C API
        finally:
            lib.nvmlShutdown()
    other = SimulatedNvml("dgx-h100", state)  # another process's view of the same machine
    other.nvmlInit()
    assert other.nvmlDeviceGetMigMode(other.nvmlDeviceGetHandleByIndex(2)) == [1, 1]
    assert other.nvmlDeviceGetUUID(other.nvmlDeviceGetHandleByUUID(mig_uuid)) == mig_uuid
    gpu = other.store.read().gpus[2]
    assert [(g.profile_id, g.start, [c.uuid for c in g.compute_instances]) for g in gpu.gpu_instances] == [
        (9, 4, [mig_uuid])
    ]
    via_simulator = discover(other, sim.sysfs_root)
    assert via_library == via_simulator
    instances = via_simulator.gpus[2].mig_instances
    assert [(m.uuid, m.profile_id, m.placement.start) for m in instances] == [(mig_uuid, 9, 4)]
    assert f"|{mig_uuid}|" in (sim.driver_root / "usr" / "bin" / "nvidia-smi").read_text()  # files derived from state


def test_mig_made_by_the_simulator_is_seen_and_destroyed_through_go_nvml(tmp_path: Path) -> None:
    probe = gonvmlprobe_binary()
    sim = SimulatedNvml("mixed", tmp_path / "m")
    sim.nvmlInit()
    dev = sim.nvmlDeviceGetHandleByIndex(0)  # an A100-80GB with MIG on
    gi = create_gi(sim, dev, 14, 2, 2)
    ci = create_full_ci(sim, gi, 2)
    mig_uuid = sim.nvmlDeviceGetUUID(sim.nvmlComputeInstanceGetInfo(ci).device)
    go = GoExecutor(sim, probe, simulated_library(sim))
    try:
        d = Var("d")
        steps = [
            Call("nvmlInit"),
            Call("nvmlDeviceGetHandleByIndex", (0,), save="d"),
            Call("nvmlDeviceGetMigDeviceHandleByIndex", (d, 0), save="mig"),
            Call("nvmlDeviceGetUUID", (Var("mig"),)),
            Call("nvmlDeviceGetGpuInstanceId", (Var("mig"),), save="gi_id"),
            Call("nvmlDeviceGetGpuInstanceById", (d, Var("gi_id")), save="gi"),
            Call("nvmlGpuInstanceGetComputeInstanceById", (Var("gi"), 0), save="ci"),
            Call("nvmlComputeInstanceDestroy", (Var("ci"),)),
            Call("nvmlGpuInstanceDestroy", (Var("gi"),)),
            Call("nvmlShutdown"),
        ]
        results = [go.call(s) for s in steps]
    finally:
        go.close()
    assert [rc for rc, _ in results] == [SUCCESS] * len(steps)
    assert results[3][1] == mig_uuid
    assert sim.store.read().gpus[0].gpu_instances == []
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # the simulator's handle went stale
        sim.nvmlGpuInstanceGetInfo(gi)


_WORKER = textwrap.dedent(
    """
    import ctypes, sys, time
    from pathlib import Path
    import pynvml
    lib = ctypes.CDLL(sys.argv[1])
    start, go = int(sys.argv[2]), Path(sys.argv[3])
    while not go.exists():
        time.sleep(0.005)
    assert lib.nvmlInit_v2() == 0
    d0, d1 = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(d0)) == 0
    assert lib.nvmlDeviceGetHandleByIndex_v2(1, ctypes.byref(d1)) == 0
    status = ctypes.c_int()
    assert lib.nvmlDeviceSetMigMode(d0, 1, ctypes.byref(status)) == 0
    assert lib.nvmlDeviceSetMigMode(d1, 1, ctypes.byref(status)) == 0
    gi = ctypes.c_void_p()
    for s in (start, start + 1):  # 1g.10gb instances: each worker its own slices
        p = pynvml.c_nvmlGpuInstancePlacement_t(s, 1)
        assert lib.nvmlDeviceCreateGpuInstanceWithPlacement(d0, 19, ctypes.byref(p), ctypes.byref(gi)) == 0
    full = pynvml.c_nvmlGpuInstancePlacement_t(0, 8)  # every worker wants all of GPU 1
    print(lib.nvmlDeviceCreateGpuInstanceWithPlacement(d1, 0, ctypes.byref(full), ctypes.byref(gi)))
    assert lib.nvmlShutdown() == 0
    """
)


def test_several_processes_at_once_share_one_server_and_one_machine(tmp_path: Path) -> None:
    sim = SimulatedNvml("dgx-h100", tmp_path / "m")
    library = simulated_library(sim)
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(library), str(start), str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for start in (0, 2, 4)
    ]
    time.sleep(0.5)  # all of them waiting: none has started a server
    assert not (sim.state_dir / SOCKET_NAME).exists()
    go.touch()
    outs = [w.communicate(timeout=180) for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0], [err for _, err in outs]
    codes = sorted(int(out.strip()) for out, _ in outs)
    assert codes == [SUCCESS, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES]
    state = sim.store.read()
    assert sorted(g.start for g in state.gpus[0].gpu_instances) == [0, 1, 2, 3, 4, 5]
    assert [(g.profile_id, g.start) for g in state.gpus[1].gpu_instances] == [(0, 0)]
    log = (sim.state_dir / LOG_NAME).read_text()
    assert log.count(" serving ") == 1, log  # one server for all three


def test_a_killed_server_is_replaced_on_the_next_call(tmp_path: Path) -> None:
    sim = SimulatedNvml("dgx-a100", tmp_path / "m")
    lib = ctypes.CDLL(str(simulated_library(sim)))
    count = _uint()
    assert lib.nvmlInit_v2() == SUCCESS
    try:
        first = int(re.findall(r" (\d+) serving ", (sim.state_dir / LOG_NAME).read_text())[-1])
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(first):
            time.sleep(0.05)
        assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == SUCCESS and count.value == 8  # pooled connection dead
        pids = [int(p) for p in re.findall(r" (\d+) serving ", (sim.state_dir / LOG_NAME).read_text())]
        assert len(pids) == 2 and pids[-1] != first
    finally:
        assert lib.nvmlShutdown() == SUCCESS


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_an_idle_server_leaves_and_the_next_caller_starts_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRA_DRIVER_LIBNVML_IDLE_S", "1")
    sim = SimulatedNvml("dgx-h200", tmp_path / "m")
    lib = ctypes.CDLL(str(simulated_library(sim)))
    assert lib.nvmlInit_v2() == SUCCESS and lib.nvmlShutdown() == SUCCESS  # the last shutdown closes connections
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (sim.state_dir / SOCKET_NAME).exists():
        time.sleep(0.1)
    assert not (sim.state_dir / SOCKET_NAME).exists()
    assert "leaving" in (sim.state_dir / LOG_NAME).read_text()
    assert lib.nvmlInit_v2() == SUCCESS
    assert lib.nvmlShutdown() == SUCCESS
    assert (sim.state_dir / LOG_NAME).read_text().count(" serving ") == 2


def test_a_forked_child_gets_its_own_connections(tmp_path: Path) -> None:
    sim = SimulatedNvml("dgx-b200", tmp_path / "m")
    code = textwrap.dedent(
        """
        import ctypes, os, sys
        lib = ctypes.CDLL(sys.argv[1])
        n = ctypes.c_uint()
        assert lib.nvmlInit_v2() == 0 and lib.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0  # a pooled connection
        pid = os.fork()
        if pid == 0:
            rc = lib.nvmlDeviceGetCount_v2(ctypes.byref(n))
            os._exit(0 if rc == 0 and n.value == 8 else 1)
        assert os.waitpid(pid, 0)[1] == 0
        assert lib.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0 and n.value == 8
        assert lib.nvmlShutdown() == 0
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(simulated_library(sim))], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_a_library_away_from_its_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver root of no simulated machine has a library that finds no machine: no driver, as NVML says; a copy
    elsewhere (a container's) is pointed at its machine by $DRA_DRIVER_LIBNVML_STATE."""
    bare = ensure_driver_root(tmp_path / "bare", "550.54.15")
    lib = ctypes.CDLL(str(library_dir(bare) / "libnvidia-ml.so.1"))
    assert lib.nvmlInit_v2() == DRIVER_NOT_LOADED
    sim = SimulatedNvml("mixed", tmp_path / "m")
    assert (sim.state_dir / CONF_NAME).is_file()
    copy = tmp_path / "elsewhere" / "libnvidia-ml.so.1"
    copy.parent.mkdir()
    shutil.copy(built_library(), copy)
    monkeypatch.setenv(STATE_ENV, str(sim.state_dir))
    lib = ctypes.CDLL(str(copy))
    count = _uint()
    assert lib.nvmlInit_v2() == SUCCESS
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == SUCCESS and count.value == 5
    assert lib.nvmlShutdown() == SUCCESS


def test_a_long_state_path_is_reached_through_its_directory(tmp_path: Path) -> None:
    """sockaddr_un holds 108 bytes: a deeper state directory is reached through /proc/self/fd."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    sim = SimulatedNvml("dgx-h100", deep)
    assert len(str(sim.state_dir / SOCKET_NAME)) > 108
    lib = ctypes.CDLL(str(simulated_library(sim)))
    count = _uint()
    assert lib.nvmlInit_v2() == SUCCESS
    assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == SUCCESS and count.value == 8
    assert lib.nvmlShutdown() == SUCCESS


def test_a_thread_waiting_for_events_holds_up_no_other(tmp_path: Path) -> None:
    """Connections are per call: a thread blocked in nvmlEventSetWait leaves the others their own."""
    sim = SimulatedNvml("dgx-h100", tmp_path / "m")
    lib = ctypes.CDLL(str(simulated_library(sim)))
    assert lib.nvmlInit_v2() == SUCCESS
    try:
        dev, event_set = ctypes.c_void_p(), ctypes.c_void_p()
        assert lib.nvmlDeviceGetHandleByIndex_v2(3, ctypes.byref(dev)) == SUCCESS
        assert lib.nvmlEventSetCreate(ctypes.byref(event_set)) == SUCCESS
        xid = pynvml.nvmlEventTypeXidCriticalError
        assert lib.nvmlDeviceRegisterEvents(dev, ctypes.c_ulonglong(xid), event_set) == SUCCESS
        waited: list[tuple[int, int, float]] = []

        def wait() -> None:
            data = pynvml.c_nvmlEventData_t()
            t0 = time.monotonic()
            rc = lib.nvmlEventSetWait_v2(event_set, ctypes.byref(data), 20000)
            waited.append((rc, int(data.eventData), time.monotonic() - t0))

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        name = ctypes.create_string_buffer(96)
        assert all(lib.nvmlDeviceGetName(dev, name, 96) == SUCCESS for _ in range(200))
        assert time.monotonic() - t0 < 10 and waiter.is_alive()
        sim.inject_event(3, xid, xid=48)
        waiter.join(timeout=30)
        assert [(rc, data) for rc, data, _ in waited] == [(SUCCESS, 48)]
        assert lib.nvmlEventSetFree(event_set) == SUCCESS
    finally:
        assert lib.nvmlShutdown() == SUCCESS


# ----- a container's view, and the simulated nvidia-persistenced that containers reach the machine through ----------
def _ask(server: Server, session: Session, name: str, fmt: str, fields: bytes) -> tuple[int, list[bytes | None]]:
    """One call on a connection: the return code and each output's bytes (None: not written)."""
    answer = server.dispatch(request_bytes(name, fmt, fields)[4:], session)
    assert answer is not None
    return decode_answer(answer)


def _text_field(text: str) -> bytes:
    return b"\x01" + struct.pack("<I", len(text)) + text.encode()


def _u64(data: bytes | None) -> int:
    assert data is not None
    return int.from_bytes(data, "little")


def test_a_containers_view_shows_only_its_devices(tmp_path: Path) -> None:
    """What the server answers on a container's connection, given the device nodes it found there (view.py)."""
    sim = SimulatedNvml("dgx-h100", tmp_path / "m")
    sim.nvmlInit()
    server = Server(sim.state_dir, 60.0)  # dispatch alone
    dev = sim.nvmlDeviceGetHandleByIndex(2)
    sim.nvmlDeviceSetMigMode(dev, 1)
    gi = create_gi(sim, dev, 9, 4, 4)
    mine = sim.nvmlComputeInstanceGetInfo(create_full_ci(sim, gi, 3)).device
    other = sim.nvmlComputeInstanceGetInfo(create_full_ci(sim, create_gi(sim, dev, 19, 0, 1), 1)).device
    gi_id = sim.nvmlGpuInstanceGetInfo(gi).id
    caps = [gi_cap_minor(sim.minors[2], gi_id), ci_cap_minor(sim.minors[2], gi_id, 0)]

    def session(gpus: set[int], caps: set[int]) -> Session:
        return Session(container=True, view=ContainerView(frozenset(gpus), frozenset(caps)))

    host, ctr = Session(), session({2, 6}, set(caps))
    assert _ask(server, host, "nvmlDeviceGetCount", "o4", b"\x01") == (SUCCESS, [struct.pack("<I", 8)])
    assert _ask(server, ctr, "nvmlDeviceGetCount", "o4", b"\x01") == (SUCCESS, [struct.pack("<I", 2)])
    code, (handle,) = _ask(server, ctr, "nvmlDeviceGetHandleByIndex", "u o8", struct.pack("<I", 1) + b"\x01")
    assert code == SUCCESS and handle is not None
    assert sim.nvmlDeviceGetUUID(ctypes.c_void_p(_u64(handle))) == sim.gpu_uuids[6]
    index = _ask(server, ctr, "nvmlDeviceGetIndex", "h o4", handle + b"\x01")
    assert index == (SUCCESS, [struct.pack("<I", 1)])
    assert _ask(server, ctr, "nvmlDeviceGetHandleByIndex", "u o8", struct.pack("<I", 2) + b"\x01")[0] == 2
    by_uuid = _ask(server, ctr, "nvmlDeviceGetHandleByUUID", "s o8", _text_field(sim.gpu_uuids[0]) + b"\x01")
    assert by_uuid == (NOT_FOUND, [None])
    gpu0 = struct.pack("<Q", address(sim.nvmlDeviceGetHandleByIndex(0)))
    assert _ask(server, ctr, "nvmlDeviceGetName", "h S", gpu0 + b"\x01" + struct.pack("<I", 96))[0] == 2
    # MIG: its own device only; no instance made or destroyed without the mig/config capability.
    parent = struct.pack("<Q", address(dev))
    code, (first,) = _ask(server, ctr, "nvmlDeviceGetMigDeviceHandleByIndex", "h u o8", parent + b"\0\0\0\0\x01")
    assert code == SUCCESS and _u64(first) == address(mine)
    second = _ask(server, ctr, "nvmlDeviceGetMigDeviceHandleByIndex", "h u o8", parent + b"\x01\0\0\0\x01")
    assert second == (NOT_FOUND, [None])
    theirs = _ask(server, ctr, "nvmlDeviceGetHandleByUUID", "s o8", _text_field(sim.nvmlDeviceGetUUID(other)) + b"\x01")
    assert theirs == (NOT_FOUND, [None])
    instances = _ask(
        server, ctr, "nvmlDeviceGetGpuInstances", "h u A8", parent + struct.pack("<I", 19) + b"\0\x01\0\0\0\0"
    )
    assert instances == (SUCCESS, [struct.pack("<I", 0), None])
    placement = struct.pack("<II", 1, 1)
    create = parent + struct.pack("<I", 19) + b"\x01" + placement + b"\x01"
    assert _ask(server, ctr, "nvmlDeviceCreateGpuInstanceWithPlacement", "h u B8 o8", create)[0] == NO_PERMISSION
    assert _ask(server, ctr, "nvmlDeviceSetMigMode", "h u o4", parent + b"\0\0\0\0\x01")[0] == NO_PERMISSION
    # With the mig/config capability (minor 1) a container may make instances; mig/monitor (2) shows them all.
    admin = session({2}, {1, 2, *caps})
    code, _ = _ask(server, admin, "nvmlDeviceCreateGpuInstanceWithPlacement", "h u B8 o8", create)
    assert code == SUCCESS
    both = _ask(server, admin, "nvmlDeviceGetMigDeviceHandleByIndex", "h u o8", parent + b"\x01\0\0\0\x01")
    assert both[0] == SUCCESS
    sim.nvmlShutdown()


def test_the_simulated_persistenced_relays_to_the_server(tmp_path: Path) -> None:
    """Started by the driver root's own nvidia-persistenced, once per machine; it starts the server for the first
    caller, answers through the socket a CDI spec mounts in containers, and leaves when stopped."""
    sim = SimulatedNvml("dgx-b200", tmp_path / "m")
    tool = sim.driver_root / "usr" / "bin" / "nvidia-persistenced"
    try:
        for _ in range(2):
            done = subprocess.run([str(tool), "--verbose"], capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
        pid = persistenced.running(sim.state_dir)
        assert pid is not None and _alive(pid)
        assert "listening" in (sim.state_dir / PERSISTENCED_LOG_NAME).read_text()
        sim.start_persistenced()
        assert persistenced.running(sim.state_dir) == pid  # one per machine
        assert not (sim.state_dir / SOCKET_NAME).exists()  # no server until a call
        # connect(): a pytest tmp path can be longer than sun_path; reached through its directory, as the library does
        with connect(persistenced_socket(sim.state_dir)) as conn:
            for frame in (
                request_bytes("simnvmlHello", "s", _text_field("client=0123456789abcdef gpus=3 caps=")),
                request_bytes("nvmlDeviceGetCount", "o4", b"\x01"),
            ):
                conn.sendall(frame)
                size = struct.unpack("<I", conn.recv(4, socket.MSG_WAITALL))[0]
                answer = conn.recv(size, socket.MSG_WAITALL)
            # A container's: this process's /dev has no GPU's node (the view is what it has, not what it says).
            nodes = [n for n in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", n)]
            assert answer == struct.pack("<iHi", SUCCESS, 1, 4) + struct.pack("<I", len(nodes))
        assert (sim.state_dir / LOG_NAME).read_text().count(" serving ") == 1
    finally:
        sim.stop_persistenced()
    assert persistenced.running(sim.state_dir) is None and not _alive(pid)


def test_the_plugin_starts_the_persistenced_only_when_asked(tmp_path: Path) -> None:
    """`plugin --sim M --sim-persistenced` calls serve_containers; real NVML, or no source, is left alone."""
    source = open_source("dgx-h100", tmp_path / "m")
    try:
        serve_containers(None)
        assert persistenced.running(tmp_path / "m") is None
        serve_containers(source)
        assert persistenced.running(tmp_path / "m") is not None
    finally:
        persistenced.stop(tmp_path / "m")
    args = build_parser().parse_args(["plugin", "--sim", "dgx-h100", "--sim-persistenced"])
    assert args.sim_persistenced and not build_parser().parse_args(["plugin", "--sim", "x"]).sim_persistenced
