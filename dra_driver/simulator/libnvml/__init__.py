"""The simulated libnvidia-ml.so.1 (native/libnvml, docs/simulated-libnvml.md): the Python half.

The C library answers NVML's C API from the simulator's state by forwarding each call to a server process
(`server.py`) that runs `SimulatedNvml` on the machine's state directory, the same files the Python simulator and the
driver use. The library finds that directory as the nearest ancestor of its own file holding `libnvml.conf`, which
names the Python interpreters (with their dra_driver package) that can run the server; `libnvml-machine.json` holds
the machine the server simulates. Both are written here, by every `SimulatedNvml` of the machine.

    <state>/libnvml.conf          python<TAB>interpreter<TAB>package directory, a line per candidate
    <state>/libnvml-machine.json  the MachineSpec
    <state>/libnvml.sock          the server's socket
    <state>/libnvml.lock          flock: one server starts at a time, and none stops while one starts
    <state>/libnvml-server.log    the server's output
    <state>/libnvml-persistenced.lock, .log   the machine's simulated nvidia-persistenced (persistenced.py): held
                                  while it runs (its pid inside), its output
    <state>/driver-root/run/nvidia-persistenced/socket   where it listens, handing each connection to the server:
                                  a container's library reaches the machine there (the CDI spec mounts it)

Both hold a client to `Limits`: connections at once (in all, and per process), the time a request may take to
arrive, and the time a connection may stay idle.

Kept light (no pydantic, no pynvml): the simulated nvidia-persistenced imports this package and lives as long as
the machine.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import dra_driver

if TYPE_CHECKING:
    from dra_driver.simulator.catalog import MachineSpec

CONF_NAME = "libnvml.conf"
MACHINE_NAME = "libnvml-machine.json"
SOCKET_NAME = "libnvml.sock"
LOCK_NAME = "libnvml.lock"
LOG_NAME = "libnvml-server.log"
STATE_ENV = "DRA_DRIVER_LIBNVML_STATE"  # names the state directory where the library cannot find it from its path
PERSISTENCED_LOCK_NAME = "libnvml-persistenced.lock"
PERSISTENCED_LOG_NAME = "libnvml-persistenced.log"
PERSISTENCED_SOCKET = "run/nvidia-persistenced/socket"  # in the driver root; a CDI spec mounts it at /<this>
DRIVER_ROOT_NAME = "driver-root"
_SUN_PATH_MAX = 107  # sockaddr_un.sun_path holds 108 bytes with the NUL
# Requests that are not NVML functions (native/libnvml/libnvml.c sends the first, the simulated nvidia-persistenced
# the second): a connection's first request, "client=<the calling process's random token>", with a container's
# device nodes (O_PATH descriptors, SCM_RIGHTS) where the server cannot see the caller's process; and a container's
# connection handed to the server (its descriptor, SCM_RIGHTS), whose peer the server then asks the kernel about.
HELLO_FUNCTION = "simnvmlHello"
HANDOFF_FUNCTION = "simnvmlHandoff"
MAGIC = 0x314D564E  # "NVM1", a request's first u32 (wire.py)
_MAX_CANDIDATES = 4

_CONF_HEADER = (
    "# The simulated libnvidia-ml of this machine starts its server (dra_driver.simulator.libnvml.server) with the\n"
    "# first Python below whose interpreter and dra_driver package exist where it runs (docs/simulated-libnvml.md).\n"
)


@dataclass(frozen=True)
class Limits:
    """What one client can hold of the server or the simulated nvidia-persistenced: each field is read from
    $DRA_DRIVER_LIBNVML_<FIELD> where that is set (the tests shorten them)."""

    max_connections: int = 256  # open at once, each with its thread; more are closed as they come
    max_client_connections: int = 64  # of one process (by its peer credentials); the library pools 16
    request_s: float = 10.0  # for a whole request to arrive from its first byte, and for an answer to be taken
    connection_idle_s: float = 300.0  # a connection with no request is closed (the library reconnects)

    @classmethod
    def from_env(cls) -> Limits:
        values: dict[str, float | int] = {}
        for f in fields(cls):
            text = os.environ.get(f"DRA_DRIVER_LIBNVML_{f.name.upper()}")
            if text:
                values[f.name] = float(text) if f.type == "float" else int(text)
        return cls(**values)  # type: ignore[arg-type]


def peer_pid(sock: socket.socket) -> int:
    """The pid of the process that connected `sock` (its peer credentials, from the kernel), as this process's pid
    namespace numbers it: 0 when that process is not in it (the peer is in a sibling namespace, or gone)."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return 0
    return int(struct.unpack("3i", creds)[0])


def _python_candidates(text: str) -> list[tuple[str, str]]:
    pairs = []
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) == 3 and fields[0] == "python":
            pairs.append((fields[1], fields[2]))
    return pairs


def _write_if_changed(path: Path, text: str) -> None:
    try:
        if path.read_text() == text:
            return
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_conf(state_dir: Path, spec: MachineSpec, *, python: str = sys.executable) -> None:
    """Name `python` (with this process's dra_driver package) first among the server's interpreters, keeping the
    others already named (a host and a container may share the state directory, each with its own Python), and
    record the machine."""
    state_dir.mkdir(parents=True, exist_ok=True)
    own = (python, str(Path(dra_driver.__file__).resolve().parent))
    try:
        known = _python_candidates((state_dir / CONF_NAME).read_text())
    except (FileNotFoundError, UnicodeDecodeError):
        known = []
    pairs = known if own in known else [own, *known][:_MAX_CANDIDATES]
    _write_if_changed(state_dir / CONF_NAME, _CONF_HEADER + "".join(f"python\t{py}\t{pkg}\n" for py, pkg in pairs))
    _write_if_changed(state_dir / MACHINE_NAME, spec.model_dump_json(indent=1) + "\n")


def read_machine(state_dir: Path) -> MachineSpec:
    from dra_driver.simulator.catalog import MachineSpec

    return MachineSpec.model_validate_json((state_dir / MACHINE_NAME).read_bytes())


def persistenced_socket(state_dir: Path) -> Path:
    """The driver root's persistenced socket, where the machine's simulated nvidia-persistenced listens."""
    return state_dir / DRIVER_ROOT_NAME / PERSISTENCED_SOCKET


def socket_address(path: Path) -> tuple[str, int | None]:
    """The address to bind or connect `path` by, and a directory descriptor to close afterwards: a path longer than
    sun_path allows is reached through /proc/self/fd/<descriptor of its directory>, as the library does."""
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        return str(path), None
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{path.name}", fd


def connect(path: Path, timeout: float | None = None) -> socket.socket:
    """A stream connection to the socket at `path`, however long the path (socket_address); OSError if nobody
    listens there. `timeout` bounds the connect only."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    address, fd = socket_address(path)
    try:
        sock.settimeout(timeout)
        sock.connect(address)
        sock.settimeout(None)
        return sock
    except OSError:
        sock.close()
        raise
    finally:
        if fd is not None:
            os.close(fd)


def bind_listener(listener: socket.socket, path: Path, mode: int | None = None) -> int:
    """Listen on `path` (whatever was there replaced: its owner is gone or being replaced), chmod `mode` when given;
    the socket file's inode, by which the listener sees it replaced later."""
    path.unlink(missing_ok=True)
    address, fd = socket_address(path)
    try:
        listener.bind(address)
    finally:
        if fd is not None:
            os.close(fd)
    if mode is not None:
        os.chmod(path, mode)
    listener.listen(128)
    return os.stat(path).st_ino


def accept_until(
    listener: socket.socket, should_stop: Callable[[], bool], serve: Callable[[socket.socket], None]
) -> None:
    """Each connection handed to `serve` (which must not block), until `should_stop` says so (asked once a second
    while no connection comes, and while connections cannot be taken: out of descriptors, they wait in the
    backlog)."""
    listener.settimeout(1.0)
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if should_stop():
                return
            continue
        except OSError as e:  # EMFILE, ENFILE, ENOMEM, ECONNABORTED: not this listener's end
            if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED):
                raise
            time.sleep(0.1)
            if should_stop():
                return
            continue
        conn.settimeout(None)
        serve(conn)
