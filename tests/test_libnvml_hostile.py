"""Hostile and careless clients of the simulated libnvidia-ml's server and its simulated nvidia-persistenced
(dra_driver/simulator/libnvml, docs/simulator.md "Limits"): a container that claims devices it does not have, event
sets used from another connection, absurd sizes, abandoned waits, floods, stalls and idle connections; and the
simulator's sharing state, which keeps only live claims however many come and go."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import uuid as uuidlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_driver.simulator.libnvml import SOCKET_NAME, connect, persistenced, persistenced_socket
from dra_driver.simulator.libnvml.server import Server
from dra_driver.simulator.libnvml.wire import decode_answer, request_bytes
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.simulator.procfs import CAPS_MAJOR, NVIDIA_MAJOR, ci_cap_minor, gi_cap_minor
from dra_driver.simulator.tools.state import STATE_FILE, SharingState
from tests.libnvml_support import address
from tests.sharing_helpers import no_daemon_left, wait_gone
from tests.simhelpers import create_full_ci, create_gi

SUCCESS, INVALID_ARGUMENT, NO_PERMISSION, NOT_FOUND, TIMEOUT = 0, 2, 4, 6, 10
ROOT = Path(__file__).resolve().parent.parent
XID = pynvml.nvmlEventTypeXidCriticalError
EVENT_SET_KIND = 5  # dra_driver.simulator.nvml: an event set's address is kind << 40 | a counter
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces and mknod need root")


@pytest.fixture(autouse=True)
def _short_lived_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRA_DRIVER_LIBNVML_IDLE_S", "5")


# ----- talking to a server as a hostile client does: raw frames ---------------------------------------------------
def _text(text: str) -> bytes:
    return b"\x01" + struct.pack("<I", len(text)) + text.encode()


def _handle(address: int) -> bytes:
    return struct.pack("<Q", address)


def _read_answer(conn: socket.socket) -> tuple[int, list[bytes | None]]:
    head = conn.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        raise ConnectionError("the server closed the connection")
    (size,) = struct.unpack("<I", head)
    return decode_answer(conn.recv(size, socket.MSG_WAITALL))


def _call(conn: socket.socket, name: str, fmt: str, fields: bytes, timeout: float = 30) -> tuple[int, Any]:
    conn.settimeout(timeout)
    conn.sendall(request_bytes(name, fmt, fields))
    return _read_answer(conn)


def _closed_within(conn: socket.socket, seconds: float) -> bool:
    """Whether the server closes `conn` within `seconds` (what it sent meanwhile is read and dropped)."""
    deadline = time.monotonic() + seconds
    try:
        while (left := deadline - time.monotonic()) > 0:
            conn.settimeout(left)
            if conn.recv(1 << 16) == b"":
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return False


def _u32(data: bytes | None) -> int:
    assert data is not None
    return int.from_bytes(data, "little")


def _count(conn: socket.socket) -> int:
    code, (count,) = _call(conn, "nvmlDeviceGetCount", "o4", b"\x01")
    assert code == SUCCESS
    return _u32(count)


@contextmanager
def serving(sim: SimulatedNvml) -> Iterator[Server]:
    """The machine's server in this process (its limits from the environment), on <state>/libnvml.sock."""
    server = Server(sim.state_dir, 3600.0)
    server.listen()
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        (sim.state_dir / SOCKET_NAME).unlink(missing_ok=True)  # the server leaves within a second
        thread.join(10)
        server.listener.close()


def _active(server: Server) -> int:
    with server._lock:
        return server._active


def _wait_for(predicate: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# ----- 1. a container's view is what it has, not what it says -------------------------------------------------------
HOSTILE = textwrap.dedent(
    """
    import json, socket, struct, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from dra_driver.simulator.libnvml import connect
    from dra_driver.simulator.libnvml.wire import decode_answer, request_bytes
    ask = json.loads(sys.argv[2])

    def text(t):
        return b"\\x01" + struct.pack("<I", len(t)) + t.encode()

    def call(conn, name, fmt, fields):
        conn.sendall(request_bytes(name, fmt, fields))
        size = struct.unpack("<I", conn.recv(4, socket.MSG_WAITALL))[0]
        code, outs = decode_answer(conn.recv(size, socket.MSG_WAITALL))
        return code, [None if o is None else o.hex() for o in outs]

    seen = {}
    lie = ask["lie"]
    with connect(Path(ask["socket"]), 30) as conn:  # says it has every GPU, and the mig/config capability
        call(conn, "simnvmlContainerView", "s", text(lie))
        call(conn, "simnvmlHello", "s", text("client=" + "ab" * 16 + " " + lie))
        seen["count"] = call(conn, "nvmlDeviceGetCount", "o4", b"\\x01")
        seen["first"] = call(conn, "nvmlDeviceGetHandleByIndex", "u o8", struct.pack("<I", 0) + b"\\x01")
        seen["gpu0"] = call(conn, "nvmlDeviceGetHandleByUUID", "s o8", text(ask["gpu0_uuid"]) + b"\\x01")
        seen["destroy_theirs"] = call(conn, "nvmlGpuInstanceDestroy", "h", struct.pack("<Q", ask["theirs"]))
        seen["destroy_mine"] = call(conn, "nvmlGpuInstanceDestroy", "h", struct.pack("<Q", ask["mine"]))
    with connect(Path(ask["socket"]), 30) as conn:  # says nothing at all
        seen["silent_count"] = call(conn, "nvmlDeviceGetCount", "o4", b"\\x01")
    print(json.dumps(seen))
    """
)


@needs_root
def test_a_container_sees_only_the_devices_it_has_whatever_it_claims(tmp_path: Path) -> None:
    """A process whose /dev holds GPU 2 and one MIG device's capability nodes (another claim's MIG device is on the
    same GPU) reaches the machine through the persistenced socket, as a container does, and claims every GPU and the
    mig/config capability, or claims nothing: it sees GPU 2 and its own instance, and cannot destroy either
    claim's."""
    sim = SimulatedNvml("dgx-h100", tmp_path / "m")
    sim.nvmlInit()
    dev = sim.nvmlDeviceGetHandleByIndex(2)
    sim.nvmlDeviceSetMigMode(dev, 1)
    mine = create_gi(sim, dev, 9, 4, 4)
    create_full_ci(sim, mine, 3)
    theirs = create_gi(sim, dev, 19, 0, 1)
    create_full_ci(sim, theirs, 1)
    minor, gi_id = sim.minors[2], sim.nvmlGpuInstanceGetInfo(mine).id
    caps = [gi_cap_minor(minor, gi_id), ci_cap_minor(minor, gi_id, 0)]
    every_cap = ",".join(str(n) for n in range(1, 300))
    ask = {
        "socket": str(persistenced_socket(sim.state_dir)),
        "lie": f"gpus={','.join(str(m) for m in sim.minors)} caps={every_cap}",
        "gpu0_uuid": sim.gpu_uuids[0],
        "theirs": address(theirs),
        "mine": address(mine),
    }
    script = "\n".join(
        [
            "set -e",
            "mount -t tmpfs -o mode=755 dev /dev",
            "mknod -m 666 /dev/null c 1 3",
            f"mknod -m 666 /dev/nvidia{minor} c {NVIDIA_MAJOR} {minor}",
            "mkdir /dev/nvidia-caps",
            *(f"mknod -m 444 /dev/nvidia-caps/nvidia-cap{c} c {CAPS_MAJOR} {c}" for c in caps),
            f"exec {shlex.quote(sys.executable)} -c {shlex.quote(HOSTILE)} {shlex.quote(str(ROOT))} "
            f"{shlex.quote(json.dumps(ask))}",
        ]
    )
    sim.start_persistenced()
    try:
        done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=180)
    finally:
        sim.stop_persistenced()
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["count"] == [SUCCESS, [struct.pack("<I", 1).hex()]]  # not the 8 it claimed
    code, (first,) = seen["first"]
    assert code == SUCCESS and int.from_bytes(bytes.fromhex(first), "little") == address(dev)
    assert seen["gpu0"] == [NOT_FOUND, [None]]
    assert seen["destroy_theirs"][0] == INVALID_ARGUMENT  # another claim's instance: not one it can name
    assert seen["destroy_mine"][0] == NO_PERMISSION  # no mig/config node: it cannot destroy its own either
    assert seen["silent_count"] == [SUCCESS, [struct.pack("<I", 1).hex()]]  # no view sent: still its own
    sim.nvmlGpuInstanceGetInfo(theirs), sim.nvmlGpuInstanceGetInfo(mine)  # both still there


PROVE = textwrap.dedent(
    """
    import ctypes, json, os, socket, struct, sys
    sys.path.insert(0, sys.argv[1])
    from dra_driver.simulator.libnvml.wire import request_bytes
    ask = json.loads(sys.argv[2])
    SOCKET = "/run/nvidia-persistenced/socket"

    def text(t):
        return b"\\x01" + struct.pack("<I", len(t)) + t.encode()

    def call(conn, name, fmt, fields, fds=()):
        socket.send_fds(conn, [request_bytes(name, fmt, fields)], list(fds))
        size = struct.unpack("<I", conn.recv(4, socket.MSG_WAITALL))[0]
        answer = conn.recv(size, socket.MSG_WAITALL)
        code = struct.unpack_from("<i", answer)[0]
        return code, (struct.unpack_from("<I", answer, 10)[0] if len(answer) >= 14 else None)

    seen = {}
    lib = ctypes.CDLL(ask["library"])  # the library, truthful: its nodes, passed open
    count = ctypes.c_uint()
    seen["library"] = [lib.nvmlInit_v2(), lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), count.value]
    lib.nvmlShutdown()
    with socket.socket(socket.AF_UNIX) as conn:  # a liar: every GPU named, one GPU's node and /dev/null passed
        conn.connect(SOCKET)
        nodes = [os.open(f"/dev/nvidia{ask['minor']}", os.O_PATH), os.open("/dev/null", os.O_RDONLY)]
        call(conn, "simnvmlHello", "s", text("client=" + "cd" * 16 + " " + ask["lie"]), nodes)
        seen["liar"] = call(conn, "nvmlDeviceGetCount", "o4", b"\\x01")
        seen["destroy_theirs"] = call(conn, "nvmlGpuInstanceDestroy", "h", struct.pack("<Q", ask["theirs"]))
    with socket.socket(socket.AF_UNIX) as conn:  # says nothing, proves nothing
        conn.connect(SOCKET)
        seen["silent"] = call(conn, "nvmlDeviceGetCount", "o4", b"\\x01")
    print(json.dumps(seen))
    """
)


@needs_root
def test_a_container_the_server_cannot_see_proves_its_nodes(tmp_path: Path) -> None:
    """The simulated nvidia-persistenced and its server in a pid namespace of their own (as in a pod): the process
    at the other end of a container's connection has no pid there to look into, so the library passes its device
    nodes open and the server takes what they are; a liar that names every GPU and passes one GPU's node and
    /dev/null sees that one GPU, and one that passes nothing sees none."""
    from tests.libnvml_support import built_library

    sim = SimulatedNvml("dgx-h100", tmp_path / "m")
    sim.nvmlInit()
    dev = sim.nvmlDeviceGetHandleByIndex(2)
    sim.nvmlDeviceSetMigMode(dev, 1)
    theirs = create_gi(sim, dev, 19, 0, 1)
    library = tmp_path / "lib" / "libnvidia-ml.so.1"  # no libnvml.conf above it: it looks for the persistenced
    library.parent.mkdir()
    library.write_bytes(built_library().read_bytes())
    relay_code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from dra_driver.simulator.libnvml.persistenced import main"
    )
    relay_code += "; main(sys.argv[2:])"
    relay = subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            "--kill-child",
            sys.executable,
            "-c",
            relay_code,
            str(ROOT),
            "--state",
            str(sim.state_dir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert _wait_for(lambda: persistenced.running(sim.state_dir) is not None, 60), "the relay did not listen"
        ask = {
            "library": str(library),
            "minor": sim.minors[2],
            "lie": f"gpus={','.join(str(m) for m in sim.minors)} caps=1,2",
            "theirs": address(theirs),
        }
        script = "\n".join(
            [
                "set -e",
                "mount -t tmpfs -o mode=755 dev /dev",
                "mknod -m 666 /dev/null c 1 3",
                f"mknod -m 666 /dev/nvidia{sim.minors[2]} c {NVIDIA_MAJOR} {sim.minors[2]}",
                "mount -t tmpfs -o mode=755 run /run",
                "mkdir -p /run/nvidia-persistenced && : > /run/nvidia-persistenced/socket",
                f"mount --bind {shlex.quote(str(persistenced_socket(sim.state_dir)))} /run/nvidia-persistenced/socket",
                f"exec {shlex.quote(sys.executable)} -c {shlex.quote(PROVE)} {shlex.quote(str(ROOT))} "
                f"{shlex.quote(json.dumps(ask))}",
            ]
        )
        done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=180)
    finally:
        relay.kill()  # unshare --kill-child: the relay, pid 1 there, goes, and the server with its namespace
        relay.wait(30)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["library"] == [SUCCESS, SUCCESS, 1]
    assert seen["liar"] == [SUCCESS, 1]  # /dev/null is no GPU, and the other GPUs it named it did not pass
    assert seen["destroy_theirs"][0] == INVALID_ARGUMENT
    assert seen["silent"] == [SUCCESS, 0]
    sim.nvmlGpuInstanceGetInfo(theirs)  # still there


# ----- 2. event sets belong to their client ---------------------------------------------------------------------
def test_event_sets_belong_to_the_client_that_made_them(tmp_path: Path) -> None:
    sim = SimulatedNvml("dgx-h100", tmp_path / "m")
    sim.nvmlInit()
    gpu0 = _handle(address(sim.nvmlDeviceGetHandleByIndex(0)))
    with serving(sim) as server:
        owner, other = connect(server.socket_path, 10), connect(server.socket_path, 10)
        code, (made,) = _call(owner, "nvmlEventSetCreate", "o8", b"\x01")
        assert code == SUCCESS and made is not None
        assert _call(owner, "nvmlDeviceRegisterEvents", "h U h", gpu0 + struct.pack("<Q", XID) + made)[0] == SUCCESS
        # Another connection can neither wait on it, register on it, nor free it, nor any set it guesses.
        assert _call(other, "nvmlEventSetWait_v2", "h o32 u", made + b"\x01" + struct.pack("<I", 0))[0] == 2
        assert _call(other, "nvmlDeviceRegisterEvents", "h U h", gpu0 + struct.pack("<Q", XID) + made)[0] == 2
        guesses = [(EVENT_SET_KIND << 40) | n for n in range(1, 64)]
        assert {_call(other, "nvmlEventSetFree", "h", _handle(g))[0] for g in guesses} == {INVALID_ARGUMENT}
        assert _call(owner, "nvmlEventSetWait_v2", "h o32 u", made + b"\x01" + struct.pack("<I", 0))[0] == TIMEOUT
        # The library's connections of one process share their sets: they say so with the process's token.
        token = uuidlib.uuid4().hex
        first, second = connect(server.socket_path, 10), connect(server.socket_path, 10)
        for conn in (first, second):
            _call(conn, "simnvmlHello", "s", _text(f"client={token}"))
        code, (shared,) = _call(first, "nvmlEventSetCreate", "o8", b"\x01")
        assert code == SUCCESS and _call(second, "nvmlEventSetFree", "h", shared)[0] == SUCCESS
        # A set dies with the connection (or client) that made it: nothing is left behind by one that leaves.
        owner.close()
        assert _wait_for(lambda: not server.sim._event_sets, 5), "the closed connection's event set is still held"
        for conn in (other, first, second):
            conn.close()


# ----- 3. sizes a request sets are bounded -------------------------------------------------------------------------
ABSURD = textwrap.dedent(
    """
    import ctypes, resource, struct, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from dra_driver.simulator.libnvml.server import Server
    from dra_driver.simulator.libnvml.wire import request_bytes
    from dra_driver.simulator.nvml import SimulatedNvml
    sim = SimulatedNvml("dgx-h100", Path(sys.argv[2]))
    sim.nvmlInit()
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    sim.nvmlDeviceSetMigMode(dev, 1)
    server = Server(Path(sys.argv[2]), 60.0)
    size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), resource.RLIM_INFINITY))  # 1 GiB more, not 32
    address = ctypes.cast(dev, ctypes.c_void_p).value
    fields = struct.pack("<QI", address, 19) + b"\\x01\\x01" + struct.pack("<I", 0xFFFFFFFF)
    body = request_bytes("nvmlDeviceGetGpuInstancePossiblePlacements_v2", "h u A8", fields)[4:]
    print(server.dispatch(body).hex())
    """
)


def test_an_absurd_array_count_allocates_nothing(tmp_path: Path) -> None:
    """An array of 4 294 967 295 placements (32 GiB) asked for: the answer is NVML's (the placements there are,
    and their count), made without allocating what the count says; the server runs with 1 GiB of address space."""
    done = subprocess.run(
        [sys.executable, "-c", ABSURD, str(ROOT), str(tmp_path / "m")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    answer = bytes.fromhex(done.stdout.strip())
    code, n = struct.unpack_from("<iH", answer)
    assert (code, n) == (SUCCESS, 2), f"NVML error {code}: {done.stderr[-2000:]}"
    count_len, count = struct.unpack_from("<iI", answer, 6)
    (array_len,) = struct.unpack_from("<i", answer, 14)
    assert count_len == 4 and count == 7 and array_len == 7 * 8  # the 1g.10gb placements of an H100


def test_a_request_too_large_is_refused_before_it_is_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A request is a function name, its format and its arguments (strings of 4 KiB at most): a frame that says
    it holds 1 MiB is refused at its length, before any of it is read or allocated, and the log says why."""
    sim = SimulatedNvml("mixed", tmp_path / "m")
    with serving(sim) as server, connect(server.socket_path, 10) as conn:
        conn.sendall(struct.pack("<I", 1 << 20) + b"\0" * 1000)
        assert _closed_within(conn, 3), "a 1 MiB request is still being read"
    assert any("1048576" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


# ----- 4. a wait ends when its client goes ---------------------------------------------------------------------
def test_an_abandoned_wait_ends_when_its_client_goes(tmp_path: Path) -> None:
    sim = SimulatedNvml("dgx-h100", tmp_path / "m")
    sim.nvmlInit()
    gpu0 = _handle(address(sim.nvmlDeviceGetHandleByIndex(0)))
    with serving(sim) as server:
        conn = connect(server.socket_path, 10)
        _, (made,) = _call(conn, "nvmlEventSetCreate", "o8", b"\x01")
        assert _call(conn, "nvmlDeviceRegisterEvents", "h U h", gpu0 + struct.pack("<Q", XID) + made)[0] == SUCCESS
        conn.sendall(request_bytes("nvmlEventSetWait_v2", "h o32 u", made + b"\x01" + struct.pack("<I", 600_000)))
        time.sleep(0.5)  # the server waits
        assert _active(server) == 1
        conn.close()
        assert _wait_for(lambda: _active(server) == 0, 5), "the server still waits for a client that left"


# ----- 5. what one client can hold ---------------------------------------------------------------------------------
def test_connections_beyond_the_cap_are_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most DRA_DRIVER_LIBNVML_MAX_CONNECTIONS connections (and threads) at once; more are closed at once, and
    served again once others leave. One client (process) holds at most ..._MAX_CLIENT_CONNECTIONS of them."""
    monkeypatch.setenv("DRA_DRIVER_LIBNVML_MAX_CONNECTIONS", "8")
    sim = SimulatedNvml("mixed", tmp_path / "m")
    threads = threading.active_count()
    with serving(sim) as server:
        conns = [connect(server.socket_path, 10) for _ in range(20)]
        time.sleep(0.5)
        closed = [_closed_within(c, 0.2) for c in conns]
        assert closed.count(False) == 8, f"{closed.count(False)} connections served of 20, the cap is 8"
        assert threading.active_count() <= threads + 1 + 8  # the accept loop and a thread per connection
        for c in conns:
            c.close()
        assert _wait_for(lambda: _active(server) == 0, 5)
        with connect(server.socket_path, 10) as again:
            assert _count(again) == 5
    monkeypatch.setenv("DRA_DRIVER_LIBNVML_MAX_CONNECTIONS", "64")
    monkeypatch.setenv("DRA_DRIVER_LIBNVML_MAX_CLIENT_CONNECTIONS", "4")
    with serving(sim) as server:
        conns = [connect(server.socket_path, 10) for _ in range(10)]
        time.sleep(0.5)
        closed = [_closed_within(c, 0.2) for c in conns]
        assert closed.count(False) == 4, f"{closed.count(False)} connections of one process served, the cap is 4"
        other = subprocess.run(  # another process is another client
            [sys.executable, "-c", _COUNT_FROM_ANOTHER_PROCESS, str(ROOT), str(server.socket_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert other.returncode == 0 and other.stdout.strip() == "5", other.stderr
        for c in conns:
            c.close()


_COUNT_FROM_ANOTHER_PROCESS = textwrap.dedent(
    """
    import socket, struct, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from dra_driver.simulator.libnvml import connect
    from dra_driver.simulator.libnvml.wire import request_bytes
    with connect(Path(sys.argv[2]), 10) as conn:
        conn.settimeout(10)
        conn.sendall(request_bytes("nvmlDeviceGetCount", "o4", b"\\x01"))
        size = struct.unpack("<I", conn.recv(4, socket.MSG_WAITALL))[0]
        print(struct.unpack_from("<I", conn.recv(size, socket.MSG_WAITALL), 10)[0])
    """
)


def test_a_stalled_request_is_dropped_at_its_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request must arrive whole within DRA_DRIVER_LIBNVML_REQUEST_S of its first byte: half a length, or a
    length and half a body, and the connection is closed."""
    monkeypatch.setenv("DRA_DRIVER_LIBNVML_REQUEST_S", "1")
    sim = SimulatedNvml("mixed", tmp_path / "m")
    frame = request_bytes("nvmlDeviceGetCount", "o4", b"\x01")
    with serving(sim) as server:
        for part in (frame[:2], frame[: len(frame) - 3]):
            with connect(server.socket_path, 10) as conn:
                conn.sendall(part)
                t0 = time.monotonic()
                assert _closed_within(conn, 4), f"a stalled request ({len(part)} of {len(frame)} bytes) is held"
                assert time.monotonic() - t0 > 0.5
        with connect(server.socket_path, 10) as conn:  # a whole request within the deadline is answered
            assert _count(conn) == 5


def test_an_idle_connection_is_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection with no request for DRA_DRIVER_LIBNVML_CONNECTION_IDLE_S is closed (the library's pooled
    connections reconnect); one that keeps calling is not."""
    monkeypatch.setenv("DRA_DRIVER_LIBNVML_CONNECTION_IDLE_S", "1")
    sim = SimulatedNvml("mixed", tmp_path / "m")
    with serving(sim) as server, connect(server.socket_path, 10) as idle, connect(server.socket_path, 10) as busy:
        assert _count(idle) == 5
        for _ in range(6):
            time.sleep(0.3)
            assert _count(busy) == 5
        assert _closed_within(idle, 3), "an idle connection is still held"
        assert _wait_for(lambda: _active(server) == 1, 3)


def test_the_library_reconnects_when_its_idle_connections_are_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library's pooled connections, closed idle by the server, are made again at the next call; the event
    sets its process made outlive them."""
    import ctypes

    from tests.libnvml_support import simulated_library

    monkeypatch.setenv("DRA_DRIVER_LIBNVML_CONNECTION_IDLE_S", "1")  # the server the library starts inherits it
    sim = SimulatedNvml("dgx-h100", tmp_path / "m")
    lib = ctypes.CDLL(str(simulated_library(sim)))
    assert lib.nvmlInit_v2() == SUCCESS
    try:
        dev, event_set, count = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint()
        assert lib.nvmlDeviceGetHandleByIndex_v2(1, ctypes.byref(dev)) == SUCCESS
        assert lib.nvmlEventSetCreate(ctypes.byref(event_set)) == SUCCESS
        assert lib.nvmlDeviceRegisterEvents(dev, ctypes.c_ulonglong(XID), event_set) == SUCCESS
        time.sleep(2.5)  # every pooled connection closed by the server
        assert lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == SUCCESS and count.value == 8
        sim.nvmlInit()
        sim.inject_event(1, XID, xid=79)
        data = pynvml.c_nvmlEventData_t()
        assert lib.nvmlEventSetWait_v2(event_set, ctypes.byref(data), 10_000) == SUCCESS and data.eventData == 79
        assert lib.nvmlEventSetFree(event_set) == SUCCESS
    finally:
        assert lib.nvmlShutdown() == SUCCESS


def test_the_relay_drops_clients_that_send_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulated nvidia-persistenced holds a connection only until its first byte, for at most
    DRA_DRIVER_LIBNVML_REQUEST_S, and at most DRA_DRIVER_LIBNVML_MAX_CONNECTIONS of them at once."""
    monkeypatch.setenv("DRA_DRIVER_LIBNVML_REQUEST_S", "1")
    monkeypatch.setenv("DRA_DRIVER_LIBNVML_MAX_CONNECTIONS", "4")
    sim = SimulatedNvml("mixed", tmp_path / "m")
    sim.start_persistenced()
    try:
        conns = [connect(persistenced_socket(sim.state_dir), 10) for _ in range(10)]
        time.sleep(0.3)
        early = [_closed_within(c, 0.1) for c in conns]
        assert early.count(True) >= 6, f"{early.count(True)} of 10 silent connections refused, the cap is 4"
        assert all(_closed_within(c, 4) for c in conns), "a silent connection is held past the deadline"
        for c in conns:
            c.close()
    finally:
        sim.stop_persistenced()


# ----- 6. the sharing state keeps only live claims ------------------------------------------------------------------
def _sharing_claim(strategy: dict[str, Any], device: str) -> dict[str, Any]:
    from tests.plugin_helpers import DRIVER, claim

    params = {"apiVersion": "gpu.resource.dra-driver.dev/v1alpha1", "kind": "GpuConfig", "sharing": strategy}
    config = {"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": params}}
    return claim([device], config=[config])


def test_the_sharing_state_stays_bounded_as_claims_come_and_go(tmp_path: Path) -> None:
    """Time-sliced claims made and ended by the plugin: the simulator's sharing-state.json holds what is live (and
    a short log of the latest tool calls), not a record of every claim that ever was."""
    from dra_driver.sharing import DriverRootRunner
    from tests.plugin_helpers import Node, ref

    node = Node(tmp_path)
    driver = node.driver(sharing_runner=DriverRootRunner(node.sim.driver_root))
    path = node.sim.state_dir / STATE_FILE

    def cycle(n: int) -> None:
        for i in range(n):
            c = _sharing_claim({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}, f"gpu-{i % 8}")
            node.add(c)
            uid = str(c["metadata"]["uid"])
            assert driver.prepare([ref(c)])[uid].error == ""
            assert driver.unprepare([ref(c)]) == {uid: None}

    cycle(20)
    warm = path.stat().st_size
    cycle(40)
    assert path.stat().st_size <= warm * 1.05, f"{warm} bytes after 20 claims, {path.stat().st_size} after 60"


def test_dead_mps_daemons_leave_no_record(tmp_path: Path) -> None:
    """MPS control daemons killed without a word (a crash, a node that lost its pods): their records go with them
    at the next change of the sharing state."""
    sim = SimulatedNvml("dgx-h100", tmp_path / "m")
    control = sim.driver_root / "usr" / "bin" / "nvidia-cuda-mps-control"
    with no_daemon_left(sim.state_dir):
        for i in range(3):
            env = {
                **os.environ,
                "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / f"mps-{i}" / "pipe"),
                "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / f"mps-{i}" / "log"),
                "CUDA_VISIBLE_DEVICES": sim.gpu_uuids[i],
            }
            for d in ("pipe", "log"):
                (tmp_path / f"mps-{i}" / d).mkdir(parents=True)
            started = subprocess.run([str(control), "-d"], env=env, capture_output=True, text=True, timeout=120)
            assert started.returncode == 0, started.stderr
            (daemon,) = SharingState(sim.state_dir).daemons().values()
            os.kill(int(daemon["pid"]), signal.SIGKILL)
            assert wait_gone(int(daemon["pid"]))
    SharingState(sim.state_dir).set_compute_mode(sim.gpu_uuids[0], 0)  # any change
    data = json.loads((sim.state_dir / STATE_FILE).read_text())
    assert data["mps"] == {}, f"records of {len(data['mps'])} dead MPS daemons kept"
