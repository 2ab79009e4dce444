"""The server behind the simulated libnvidia-ml: one process per simulated machine, started by the library itself
(native/libnvml/libnvml.c) when a process calls nvmlInit and nobody listens on <state>/libnvml.sock.

It runs one `SimulatedNvml` on the machine's state directory, so what it answers and changes is what the Python
simulator and the driver see (their state files are shared under their own locks), and answers each connection in a
thread of its own (a caller waiting in nvmlEventSetWait holds up nobody). A connection from a container (the
library there reaches this server through the machine's simulated nvidia-persistenced, `persistenced.py`) opens
with the container's device nodes, and is answered with only that container's GPUs and MIG devices (`view.py`).
It leaves when nobody has been connected
for `--idle` seconds ($DRA_DRIVER_LIBNVML_IDLE_S, default 60), when its state directory is gone, or when another
server took its socket; it gives up the socket under <state>/libnvml.lock, the lock the library starts servers under,
so that a caller either reaches this server or starts the next one.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import socket
import struct
import sys
import threading
import time
from pathlib import Path

import pynvml

from dra_driver.simulator.libnvml import LOCK_NAME, SOCKET_NAME, accept_until, bind_listener, read_machine
from dra_driver.simulator.libnvml.handlers import FUNCTIONS
from dra_driver.simulator.libnvml.view import VIEW_FORMAT, VIEW_FUNCTION, ContainerView, call_in_view
from dra_driver.simulator.libnvml.wire import WireError, decode_request, encode_answer, tokens
from dra_driver.simulator.lockedfile import locked
from dra_driver.simulator.nvml import SimulatedNvml

IDLE_ENV = "DRA_DRIVER_LIBNVML_IDLE_S"
DEFAULT_IDLE_S = 60.0
MAX_MESSAGE = 16 << 20

log = logging.getLogger("dra_driver.simulator.libnvml.server")


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = conn.recv(min(left, 1 << 16))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class Session:
    """What the server knows of one connection: a container's view, or None (the host: everything)."""

    def __init__(self) -> None:
        self.view: ContainerView | None = None


class Server:
    def __init__(self, state_dir: Path, idle_s: float) -> None:
        self.state_dir = state_dir
        self.socket_path = state_dir / SOCKET_NAME
        self.idle_s = idle_s
        self.sim = SimulatedNvml(read_machine(state_dir), state_dir)
        self.sim.nvmlInit()  # the callers' nvmlInit/nvmlShutdown are counted in their own processes
        self._lock = threading.Lock()
        self._active = 0
        self._last = time.monotonic()
        self._inode = 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    def listen(self) -> None:
        """Bind the socket: whoever started this server holds the start lock, so a socket file there is stale."""
        self._inode = bind_listener(self.listener, self.socket_path)

    def run(self) -> None:
        accept_until(self.listener, self._should_stop, self._start_serving)

    def _start_serving(self, conn: socket.socket) -> None:
        with self._lock:
            self._active += 1
        threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        session = Session()
        try:
            while True:
                head = _recv_exact(conn, 4)
                if head is None:
                    return
                (length,) = struct.unpack("<I", head)
                body = _recv_exact(conn, length) if length <= MAX_MESSAGE else None
                if body is None:
                    return
                answer = self.dispatch(body, session)
                conn.sendall(struct.pack("<I", len(answer)) + answer)
        except OSError as e:
            log.debug("connection closed: %s", e)
        finally:
            conn.close()
            with self._lock:
                self._active -= 1
                self._last = time.monotonic()

    def dispatch(self, body: bytes, session: Session | None = None) -> bytes:
        """One call on a connection: its answer frame's body."""
        try:
            req = decode_request(body)
        except (WireError, UnicodeDecodeError) as e:
            log.error("undecodable request: %s", e)
            return encode_answer(pynvml.NVML_ERROR_UNKNOWN, [])
        outputs = req.outputs()
        if req.name == VIEW_FUNCTION and req.fmt == VIEW_FORMAT and isinstance(req.args[0], bytes):
            seen = ContainerView.parse(req.args[0].decode(errors="replace"))
            if session is not None:
                session.view = seen
            log.debug("a container's connection: GPU minors %s, capability minors %s", seen.gpu_minors, seen.cap_minors)
            return encode_answer(pynvml.NVML_SUCCESS, outputs)
        entry = FUNCTIONS.get(req.name)
        if entry is None:
            log.warning("%s is not modelled by this server", req.name)
            return encode_answer(pynvml.NVML_ERROR_NOT_SUPPORTED, outputs)
        fmt, handler = entry
        if fmt != req.fmt:
            log.error("%s: the library sends %r, the server expects %r", req.name, req.fmt, fmt)
            return encode_answer(pynvml.NVML_ERROR_UNKNOWN, outputs)
        if req.missing_pointer():
            return encode_answer(pynvml.NVML_ERROR_INVALID_ARGUMENT, outputs)
        view = session.view if session is not None else None
        try:
            if view is None:
                handler(self.sim, *req.args)
            else:
                letters = [letter for letter, _ in tokens(req.fmt)]
                call_in_view(view, self.sim, req.name, letters, req.args, handler)
            code = pynvml.NVML_SUCCESS
        except pynvml.NVMLError as e:
            code = int(e.value)
        except Exception:
            log.exception("%s failed", req.name)
            for out in outputs:
                out.data = None
            code = pynvml.NVML_ERROR_UNKNOWN
        return encode_answer(code, outputs)

    def _should_stop(self) -> bool:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dra_driver.simulator.libnvml.server", description=__doc__)
    parser.add_argument("--state", type=Path, required=True, help="the simulated machine's state directory")
    parser.add_argument("--ready-fd", type=int, help="closed once the socket listens (the library waits on it)")
    parser.add_argument("--idle", type=float, default=float(os.environ.get(IDLE_ENV) or DEFAULT_IDLE_S))
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(process)d %(message)s")
    server = Server(args.state, args.idle)
    server.listen()
    log.info("serving %s on %s", args.state, server.socket_path)
    if args.ready_fd is not None:
        os.close(args.ready_fd)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
