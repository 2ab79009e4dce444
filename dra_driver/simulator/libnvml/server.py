"""The server behind the simulated libnvidia-ml: one process per simulated machine, started by the library itself
(native/libnvml/libnvml.c) when a process calls nvmlInit and nobody listens on <state>/libnvml.sock.

It runs one `SimulatedNvml` on the machine's state directory, so what it answers and changes is what the Python
simulator and the driver see (their state files are shared under their own locks), and answers each connection in a
thread of its own (a caller waiting in nvmlEventSetWait holds up nobody). A connection to <state>/libnvml.sock is the
host's and sees the whole machine. A container's connection reaches the server handed over by the machine's
simulated nvidia-persistenced (`persistenced.py`), and is answered with only the GPUs and MIG devices whose device
nodes the process that connected has (`view.py`): the kernel names that process (the connection's peer credentials),
and its nodes are read in its own mount namespace, whatever it says it has.

Each connection opens with `simnvmlHello`, naming its process by a random token: a process's connections share the
event sets it makes, and no other connection can use them (an event set's handle is a small counter, easily
guessed). A client is held to `Limits` (connections at once, a request's time, an idle connection's) and to sizes
(a request's, an array's): docs/simulator.md, "Limits".

It leaves when nobody has been connected for `--idle` seconds ($DRA_DRIVER_LIBNVML_IDLE_S, default 60), when its
state directory is gone, or when another server took its socket; it gives up the socket under <state>/libnvml.lock,
the lock the library starts servers under, so that a caller either reaches this server or starts the next one.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import re
import resource
import select
import socket
import struct
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from dra_driver.simulator.libnvml import (
    HANDOFF_FUNCTION,
    HELLO_FUNCTION,
    LOCK_NAME,
    SOCKET_NAME,
    Limits,
    accept_until,
    bind_listener,
    peer_pid,
    read_machine,
)
from dra_driver.simulator.libnvml.handlers import FUNCTIONS, Handler
from dra_driver.simulator.libnvml.view import ContainerView, call_in_view
from dra_driver.simulator.libnvml.wire import Arg, Out, WireError, decode_request, encode_answer, tokens
from dra_driver.simulator.lockedfile import locked
from dra_driver.simulator.nvml import KIND_EVENT_SET, SimulatedNvml, handle_ids

IDLE_ENV = "DRA_DRIVER_LIBNVML_IDLE_S"
DEFAULT_IDLE_S = 60.0
MAX_MESSAGE = 16 << 20  # the largest answer the library takes (libnvml.c's MAX_MESSAGE)
MAX_REQUEST = 64 << 10  # a name, a format and strings the library cuts at 4 KiB: refused beyond, before reading
MAX_NODE_FDS = 253  # SCM_MAX_FD: the most descriptors one message carries
WAIT_SLICE_MS = 200  # how often a waiting nvmlEventSetWait looks whether its caller is still there
EVENT_SETS_PER_CLIENT = 64  # more than NVML users make (one per watcher)
CLIENT_GRACE_S = 600.0  # a process's event sets outlive its last connection (closed idle, say) this long
MAX_LEFT_CLIENTS = 1024  # processes kept through that grace; the ones that left first go first
_EMPTY = ContainerView(frozenset(), frozenset())
_SUCCESS, _INVALID_ARGUMENT = int(pynvml.NVML_SUCCESS), int(pynvml.NVML_ERROR_INVALID_ARGUMENT)
_WAITS = frozenset({"nvmlEventSetWait", "nvmlEventSetWait_v2"})
_SET_CREATE, _SET_FREE = "nvmlEventSetCreate", "nvmlEventSetFree"
_TOKEN = re.compile(r"(?:^|\s)client=([0-9a-f]{16,64})(?:\s|$)")
_WARN_EVERY_S = 10.0  # what a client can make the server log is logged this often at most

log = logging.getLogger("dra_driver.simulator.libnvml.server")


class ClientGone(Exception):
    """The caller of a wait closed its connection."""


def _recv_exact(conn: socket.socket, n: int, deadline: float) -> bytes | None:
    """`n` bytes, None when the peer closed first; TimeoutError at `deadline`."""
    chunks, left = [], n
    while left:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        conn.settimeout(remaining)
        chunk = conn.recv(min(left, 1 << 16))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


@dataclass(eq=False)
class Client:
    """A calling process (its connections say the same token) or one connection that said none: what it holds."""

    key: tuple[int, str] | None = None
    event_sets: set[int] = field(default_factory=set)
    connections: int = 1
    left_at: float = 0.0


class Session:
    """What the server knows of one connection: its peer's pid (0: not in this pid namespace), whether it is a
    container's, and then the view of the machine it is answered with (None: the host's, everything)."""

    def __init__(
        self,
        conn: socket.socket | None = None,
        *,
        pid: int = 0,
        container: bool = False,
        view: ContainerView | None = None,
    ) -> None:
        self.conn = conn
        self.pid = pid
        self.container = container
        self.proven = not container or view is not None  # a container's view read by the server itself
        self.view: ContainerView | None = (view or _EMPTY) if container else None
        self.client = Client()
        self.requests = 0

    def connected(self) -> bool:
        """Whether the caller is still there: a connection waiting for its answer carries nothing, so readable
        means closed (or a client that sends ahead, which is left waiting)."""
        if self.conn is None:
            return True
        try:
            poller = select.poll()
            poller.register(self.conn, select.POLLIN)
            if not poller.poll(0):
                return True
            return self.conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except (OSError, ValueError):
            return False


class Server:
    def __init__(self, state_dir: Path, idle_s: float, limits: Limits | None = None) -> None:
        self.state_dir = state_dir
        self.socket_path = state_dir / SOCKET_NAME
        self.idle_s = idle_s
        self.limits = limits or Limits.from_env()
        self.sim = SimulatedNvml(read_machine(state_dir), state_dir)
        self.sim.nvmlInit()  # the callers' nvmlInit/nvmlShutdown are counted in their own processes
        self._lock = threading.Lock()
        self._sets_lock = threading.Lock()  # the simulator's event-set table is not safe for concurrent changes
        self._active = 0
        self._per_pid: Counter[int] = Counter()
        self._clients: dict[tuple[int, str], Client] = {}
        self._last = time.monotonic()
        self._reaped = 0.0
        self._warned: dict[str, tuple[float, int]] = {}
        self._inode = 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def listen(self) -> None:
        """Bind the socket: whoever started this server holds the start lock, so a socket file there is stale."""
        self._inode = bind_listener(self.listener, self.socket_path)

    def run(self) -> None:
        accept_until(self.listener, self._should_stop, self._start_serving)

    # ----- connections -----------------------------------------------------------------------------------------
    def _start_serving(self, conn: socket.socket) -> None:
        self._admit(conn, Session(conn, pid=peer_pid(conn)))

    def _admit(self, conn: socket.socket, session: Session) -> bool:
        """Serve `conn` in a thread of its own, or close it: at most `max_connections` at once, and
        `max_client_connections` of one process."""
        with self._lock:
            full = self._active >= self.limits.max_connections
            busy = session.pid > 0 and self._per_pid[session.pid] >= self.limits.max_client_connections
            if not (full or busy):
                self._active += 1
                self._per_pid[session.pid] += 1
        if full or busy:
            why = "connections" if full else f"connections of pid {session.pid}"
            self._warn("refused", "refused a connection: already %d %s", self.limits.max_connections, why)
            conn.close()
            return False
        try:
            threading.Thread(target=self._serve, args=(conn, session), daemon=True).start()
        except RuntimeError:  # no thread to be had: as full
            conn.close()
            self._leave(session)
            return False
        return True

    def _serve(self, conn: socket.socket, session: Session) -> None:
        try:
            while True:
                request = self._receive(conn, session)
                if request is None:
                    return
                body, fds = request
                try:
                    answer = self.dispatch(body, session, fds)
                finally:
                    _close_all(fds)
                if answer is None:
                    return
                if len(answer) > MAX_MESSAGE:  # more than the library takes: a bug here, answered as one
                    log.error("an answer of %d bytes, over %d", len(answer), MAX_MESSAGE)
                    answer = encode_answer(pynvml.NVML_ERROR_UNKNOWN, [])
                conn.settimeout(self.limits.request_s)  # a client that takes no answers is dropped
                conn.sendall(struct.pack("<I", len(answer)) + answer)
        except OSError as e:
            log.debug("connection closed: %s", e)
        finally:
            conn.close()
            self._leave(session)

    def _receive(self, conn: socket.socket, session: Session) -> tuple[bytes, list[int]] | None:
        """The next request and the descriptors that came with it (a handoff's connection, a container's nodes);
        None when the connection is over: closed, idle for `connection_idle_s`, a request larger than
        MAX_REQUEST or not whole within `request_s` of its first byte."""
        wanted = 1 if not session.container else (0 if session.proven else MAX_NODE_FDS)
        conn.settimeout(self.limits.connection_idle_s)
        try:
            if wanted:
                head, fds, _, _ = socket.recv_fds(conn, 4, wanted)
            else:
                head, fds = conn.recv(4), []
        except TimeoutError:
            log.debug("closing a connection (pid %d) idle for %.0f s", session.pid, self.limits.connection_idle_s)
            return None
        try:
            if not head:
                return None
            deadline = time.monotonic() + self.limits.request_s
            rest = _recv_exact(conn, 4 - len(head), deadline)
            if rest is None:
                return None
            (length,) = struct.unpack("<I", head + rest)
            if length > MAX_REQUEST:
                self._warn("size", "a request of %d bytes (pid %d), over %d: closing", length, session.pid, MAX_REQUEST)
                return None
            body = _recv_exact(conn, length, deadline)
        except TimeoutError:
            self._warn("slow", "a request (pid %d) slower than %.0f s: closing", session.pid, self.limits.request_s)
            body = None
        if body is None:
            _close_all(fds)
            return None
        return body, fds

    def _leave(self, session: Session) -> None:
        freed = None
        with self._lock:
            self._active -= 1
            self._per_pid[session.pid] -= 1
            if self._per_pid[session.pid] <= 0:
                del self._per_pid[session.pid]
            self._last = time.monotonic()
            client = session.client
            client.connections -= 1
            if client.connections <= 0:
                if client.key is None:
                    freed = client  # a connection's own sets go with it
                else:
                    client.left_at = time.monotonic()
        if freed is not None:
            self._free_sets(freed)
        self._reap()

    # ----- clients and their event sets ------------------------------------------------------------------------
    def _join(self, session: Session, token: str) -> None:
        """`session` belongs to the process that says `token` (and, where the kernel names it, has its pid)."""
        key = (session.pid, token)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = Client(key, connections=0)
            client.connections += 1
            session.client = client

    def _free_sets(self, client: Client) -> None:
        with self._sets_lock:
            for address in client.event_sets:
                with contextlib.suppress(pynvml.NVMLError):
                    self.sim.nvmlEventSetFree(ctypes.cast(ctypes.c_void_p(address), pynvml.c_nvmlEventSet_t))
            client.event_sets.clear()

    def _reap(self) -> None:
        """Free the event sets of processes gone for CLIENT_GRACE_S, and of the earliest gone beyond
        MAX_LEFT_CLIENTS (at most once a second)."""
        now = time.monotonic()
        with self._lock:
            if now - self._reaped < 1.0:
                return
            self._reaped = now
            left = sorted((c.left_at, key) for key, c in self._clients.items() if c.connections <= 0)
            expired = [key for at, key in left if now - at > CLIENT_GRACE_S]
            overflow = [key for _, key in left[: max(0, len(left) - MAX_LEFT_CLIENTS)]]
            gone = [self._clients.pop(key) for key in dict.fromkeys(expired + overflow)]
        for client in gone:
            self._free_sets(client)

    def _foreign_event_set(self, session: Session, letters: list[str], args: list[Arg]) -> bool:
        return any(
            letter == "h"
            and isinstance(arg, int)
            and handle_ids(arg)[0] == KIND_EVENT_SET
            and arg not in session.client.event_sets
            for letter, arg in zip(letters, args, strict=True)
        )

    def _sliced_wait(self, handler: Handler, session: Session) -> Handler:
        """nvmlEventSetWait in slices of WAIT_SLICE_MS, ending (ClientGone) once its caller has left."""

        def wait(sim: SimulatedNvml, event_set: int, out: Out, timeout_ms: int) -> None:
            deadline = time.monotonic() + timeout_ms / 1000
            while True:
                left_ms = max(0, int((deadline - time.monotonic()) * 1000))
                try:
                    handler(sim, event_set, out, min(left_ms, WAIT_SLICE_MS))
                    return
                except pynvml.NVMLError_Timeout:
                    if left_ms <= WAIT_SLICE_MS:
                        raise
                    if not session.connected():
                        raise ClientGone from None

        return wait

    # ----- requests --------------------------------------------------------------------------------------------
    def dispatch(self, body: bytes, session: Session | None = None, fds: list[int] | None = None) -> bytes | None:
        """One call on a connection: its answer frame's body; None when the connection is to be closed (its
        caller left while waiting). `fds` came with the request; those it keeps are taken off the list."""
        session = session or Session()
        fds = fds if fds is not None else []
        session.requests += 1
        try:
            req = decode_request(body)
        except (WireError, UnicodeDecodeError) as e:
            self._warn("decode", "undecodable request (pid %d): %s", session.pid, e)
            return encode_answer(pynvml.NVML_ERROR_UNKNOWN, [])
        outputs = req.outputs()
        if req.name == HELLO_FUNCTION and req.fmt == "s":
            return encode_answer(self._hello(req.args[0], session, fds), outputs)
        if req.name == HANDOFF_FUNCTION and req.fmt == "":
            return encode_answer(self._handoff(session, fds), outputs)
        entry = FUNCTIONS.get(req.name)
        if entry is None:
            self._warn("unmodelled", "%s is not modelled by this server", req.name)
            return encode_answer(pynvml.NVML_ERROR_NOT_SUPPORTED, outputs)
        fmt, handler = entry
        if fmt != req.fmt:
            log.error("%s: the library sends %r, the server expects %r", req.name, req.fmt, fmt)
            return encode_answer(pynvml.NVML_ERROR_UNKNOWN, outputs)
        if req.missing_pointer():
            return encode_answer(pynvml.NVML_ERROR_INVALID_ARGUMENT, outputs)
        letters = [letter for letter, _ in tokens(req.fmt)]
        if self._foreign_event_set(session, letters, req.args):
            return encode_answer(pynvml.NVML_ERROR_INVALID_ARGUMENT, outputs)  # not a set this caller was given
        if req.name in _WAITS:
            handler = self._sliced_wait(handler, session)
        try:
            self._call(req.name, letters, req.args, handler, session)
            code = pynvml.NVML_SUCCESS
        except ClientGone:
            return None
        except pynvml.NVMLError as e:
            code = int(e.value)
        except Exception:
            log.exception("%s failed", req.name)
            for out in outputs:
                out.data = None
            code = pynvml.NVML_ERROR_UNKNOWN
        return encode_answer(code, outputs)

    def _call(self, name: str, letters: list[str], args: list[Arg], handler: Handler, session: Session) -> None:
        def run() -> None:
            if session.view is None:
                handler(self.sim, *args)
            else:
                call_in_view(session.view, self.sim, name, letters, args, handler)

        if name not in (_SET_CREATE, _SET_FREE):
            run()
            return
        with self._sets_lock:
            sets = session.client.event_sets
            if name == _SET_CREATE and len(sets) >= EVENT_SETS_PER_CLIENT:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_MEMORY)
            run()
            if name == _SET_FREE:
                sets.discard(int(args[0]))  # type: ignore[arg-type]  # an `h`: an int
            else:
                out = args[0]
                assert isinstance(out, Out) and out.data is not None
                sets.add(int.from_bytes(out.data, "little"))

    def _hello(self, arg: Arg, session: Session, fds: list[int]) -> int:
        """A connection's first request: its process's token; in a container the server cannot look into, the
        device nodes it has, open."""
        if session.requests != 1 or not isinstance(arg, bytes):
            return _INVALID_ARGUMENT
        found = _TOKEN.search(arg.decode(errors="replace"))
        if found is not None:
            self._join(session, found.group(1))
        if session.container and not session.proven:
            view = session.view = ContainerView.of_nodes(fds)
            log.debug("a container (pid unseen): GPU minors %s, capability minors %s", *view.sorted())
        return _SUCCESS

    def _handoff(self, session: Session, fds: list[int]) -> int:
        """The simulated nvidia-persistenced hands over a container's connection: served from now on as that
        container's, with the device nodes of the process at its other end (its peer credentials)."""
        if session.container or len(fds) != 1:
            return _INVALID_ARGUMENT  # only the host hands over, one connection at a time
        fd = fds.pop()
        try:
            conn = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)
            return _INVALID_ARGUMENT
        if conn.family != socket.AF_UNIX or conn.type != socket.SOCK_STREAM:
            conn.close()
            return _INVALID_ARGUMENT
        pid = peer_pid(conn)
        view = ContainerView.of_process(pid) if pid > 0 else None
        if view is not None:
            log.debug("a container's connection, pid %d: GPU minors %s, capability minors %s", pid, *view.sorted())
        container = Session(conn, pid=pid, container=True, view=view)
        return _SUCCESS if self._admit(conn, container) else int(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)

    def _warn(self, key: str, message: str, *args: Any) -> None:
        """log.warning for what clients can cause, at most once per _WARN_EVERY_S per kind: the log is a file."""
        now = time.monotonic()
        with self._lock:
            last, skipped = self._warned.get(key, (0.0, 0))
            if now - last < _WARN_EVERY_S:
                self._warned[key] = (last, skipped + 1)
                return
            self._warned[key] = (now, 0)
        log.warning(message + (f" ({skipped} more like it not logged)" if skipped else ""), *args)

    # ----- leaving ---------------------------------------------------------------------------------------------
    def _should_stop(self) -> bool:
        self._reap()
        if not self.state_dir.is_dir():
            log.info("state directory %s is gone: leaving", self.state_dir)
            return True
        try:
            if os.stat(self.socket_path).st_ino != self._inode:
                log.info("another server took %s: leaving", self.socket_path)
                return True
        except FileNotFoundError:
            log.info("%s was removed: leaving", self.socket_path)
            return True
        with self._lock:
            if self._active or time.monotonic() - self._last < self.idle_s:
                return False
        with locked(self.state_dir / LOCK_NAME, threading.Lock()):
            with self._lock:
                if self._active:
                    return False
            readable, _, _ = select.select([self.listener], [], [], 0)
            if readable:
                return False  # a caller connected while we looked: serve it
            self.listener.close()
            try:
                if os.stat(self.socket_path).st_ino == self._inode:
                    self.socket_path.unlink()
            except FileNotFoundError:
                pass
        log.info("idle for %.0f s: leaving", self.idle_s)
        return True


def _raise_descriptor_limit() -> None:
    """Room for every connection the limits allow, and for a container's nodes while its first request is read."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 8192 if hard == resource.RLIM_INFINITY else min(hard, 8192)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dra_driver.simulator.libnvml.server", description=__doc__)
    parser.add_argument("--state", type=Path, required=True, help="the simulated machine's state directory")
    parser.add_argument("--ready-fd", type=int, help="closed once the socket listens (the library waits on it)")
    parser.add_argument("--idle", type=float, default=float(os.environ.get(IDLE_ENV) or DEFAULT_IDLE_S))
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(process)d %(message)s")
    _raise_descriptor_limit()
    server = Server(args.state, args.idle)
    server.listen()
    log.info("serving %s on %s (%s)", args.state, server.socket_path, server.limits)
    if args.ready_fd is not None:
        os.close(args.ready_fd)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
