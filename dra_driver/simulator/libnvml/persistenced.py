"""The simulated nvidia-persistenced of a machine: how the simulated libnvidia-ml in a container reaches its machine
(docs/simulated-libnvml.md, "In a container").

A CDI spec made from a simulated driver root bind-mounts the root's `run/nvidia-persistenced/socket` at
`/run/nvidia-persistenced/socket` (as NVIDIA's does on a real node, where NVML talks to nvidia-persistenced), and
nothing else of the machine's state directory. This daemon listens on that socket and hands each connection, at its
first byte, to the machine's server (`<state>/libnvml.sock`) as a descriptor (SCM_RIGHTS), starting the server when
nobody listens there, as the library does (under `<state>/libnvml.lock`): so the server keeps its life on the host
(it leaves when idle) and a container's library still finds one. None of a container's bytes pass through here: the
server reads who is at the other end of the connection from the kernel (its peer credentials), and answers with
that process's devices only; nothing the container sends can make it the host.

A bind mount holds the socket's inode, which only the process that bound it can serve: the daemon therefore lives
as long as the machine, as nvidia-persistenced lives as long as a node's driver. It leaves when the state directory is
gone, when its socket is removed or replaced, or on SIGTERM (`stop`). One per machine: it holds
`<state>/libnvml-persistenced.lock` (its pid inside) while it runs. Containers started before it hold the inode it
replaced, which nobody serves (as on a real node they would not see a nvidia-persistenced started after them). It
holds a connection only until its first byte, for `Limits.request_s` at most, and `Limits.max_connections` of them
at once.

Started by `start` (what `SimulatedNvml.start_persistenced` and the driver root's `usr/bin/nvidia-persistenced`
call): detached, it is nobody's child. Light: socket handling only, no pynvml, no simulator.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import dra_driver
from dra_driver.simulator.libnvml import (
    HANDOFF_FUNCTION,
    LOCK_NAME,
    LOG_NAME,
    MAGIC,
    PERSISTENCED_LOCK_NAME,
    PERSISTENCED_LOG_NAME,
    SOCKET_NAME,
    Limits,
    accept_until,
    bind_listener,
    connect,
    persistenced_socket,
)

READY_TIMEOUT_S = 120.0  # a cold Python start on a loaded machine, as the library allows its server
HANDOFF_TIMEOUT_S = 30.0  # for the server to take a connection and say so
_HANDOFF = HANDOFF_FUNCTION.encode()
HANDOFF_FRAME = struct.pack("<IIH", 4 + 2 + len(_HANDOFF) + 2, MAGIC, len(_HANDOFF)) + _HANDOFF + struct.pack("<H", 0)
_WARN_EVERY_S = 10.0
_ENV_DROPPED = ("LD_PRELOAD", "PYTHONHOME", "PYTHONPATH", "PYTHONSTARTUP")

log = logging.getLogger("dra_driver.simulator.libnvml.persistenced")


def _connect(path: Path, timeout: float | None = None) -> socket.socket | None:
    try:
        return connect(path, timeout)
    except OSError:
        return None


def _python_command(module: str, *args: str) -> list[str]:
    """This interpreter running `module`'s main(argv) with this process's dra_driver first on sys.path."""
    package_parent = str(Path(dra_driver.__file__).resolve().parent.parent)
    code = f"import sys; sys.path.insert(0, sys.argv[1]); from {module} import main; sys.exit(main(sys.argv[2:]))"
    return [sys.executable, "-c", code, package_parent, *args]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _ENV_DROPPED}


def _wait_closed(fd: int, timeout: float) -> None:
    """Until the write end of the pipe `fd` reads from is closed everywhere (the started process listens, or died)."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if readable and not os.read(fd, 64):
                return
    finally:
        os.close(fd)


def _spawn(command: list[str], log_path: Path) -> None:
    """Run `command` detached with a pipe's write end as `--ready-fd`; return once it closed that end."""
    read_end, write_end = os.pipe()
    try:
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                [*command, "--ready-fd", str(write_end)],
                pass_fds=(write_end,),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                cwd="/",
                env=_clean_env(),
                start_new_session=True,
            )
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    _wait_closed(read_end, READY_TIMEOUT_S)
    threading.Thread(target=proc.wait, daemon=True).start()  # reaped when it leaves; a daemon: no zombie


# ----- the relay ---------------------------------------------------------------------------------------------------
class Relay:
    def __init__(self, state_dir: Path, limits: Limits | None = None) -> None:
        self.state_dir = state_dir
        self.path = persistenced_socket(state_dir)
        self.server_path = state_dir / SOCKET_NAME
        self.limits = limits or Limits.from_env()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._inode = 0
        self._lock = threading.Lock()
        self._pending = 0
        self._handoff_lock = threading.Lock()  # one handoff at a time: one connection to the server, one spawn
        self._warned = 0.0

    def listen(self) -> None:
        """Replace whatever inode is at the socket's path (the driver root's stand-in, a dead daemon's socket)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._inode = bind_listener(self.listener, self.path, 0o666)  # as the stand-in: any container user may connect

    def run(self) -> None:
        accept_until(self.listener, self._should_stop, self._take)

    def _take(self, conn: socket.socket) -> None:
        with self._lock:
            full = self._pending >= self.limits.max_connections
            if not full:
                self._pending += 1
        if not full:
            try:
                threading.Thread(target=self._hand_over, args=(conn,), daemon=True).start()
                return
            except RuntimeError:  # no thread to be had: as full
                self._done()
        now = time.monotonic()
        if now - self._warned > _WARN_EVERY_S:
            self._warned = now
            log.warning("refused a connection: %d wait for their first byte", self.limits.max_connections)
        conn.close()

    def _done(self) -> None:
        with self._lock:
            self._pending -= 1

    def _should_stop(self) -> bool:
        if not self.state_dir.is_dir():
            log.info("state directory %s is gone: leaving", self.state_dir)
            return True
        try:
            if os.stat(self.path).st_ino != self._inode:
                log.info("%s was replaced: leaving", self.path)
                return True
        except FileNotFoundError:
            log.info("%s was removed: leaving", self.path)
            return True
        return False

    def _server(self) -> socket.socket | None:
        """A connection to the machine's server, started when nobody listens (the library's protocol: under the
        start lock, which the server takes too before it leaves)."""
        sock = _connect(self.server_path)
        if sock is not None:
            return sock
        with open(self.state_dir / LOCK_NAME, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            sock = _connect(self.server_path)
            if sock is None:
                log.info("starting the server of %s", self.state_dir)
                command = _python_command("dra_driver.simulator.libnvml.server", "--state", str(self.state_dir))
                _spawn(command, self.state_dir / LOG_NAME)
                sock = _connect(self.server_path)
        if sock is None:
            log.error("no server for %s (see %s)", self.state_dir, self.state_dir / LOG_NAME)
        return sock

    def _hand_over(self, client: socket.socket) -> None:
        """At the client's first byte (one that only checks that someone listens starts no server), hand the
        connection itself to the server; then it is the server's alone (a client it refuses sees its connection
        closed, and the library tries again)."""
        try:
            client.settimeout(self.limits.request_s)
            try:
                first = client.recv(1, socket.MSG_PEEK)  # left for the server to read
            except OSError:  # TimeoutError included: a client that says nothing is not held
                first = b""
            if not first:
                return
            with self._handoff_lock:
                server = self._server()
                if server is None:
                    return
                with server:
                    server.settimeout(HANDOFF_TIMEOUT_S)
                    socket.send_fds(server, [HANDOFF_FRAME], [client.fileno()])
                    (size,) = struct.unpack("<I", server.recv(4, socket.MSG_WAITALL))
                    (code,) = struct.unpack_from("<i", server.recv(size, socket.MSG_WAITALL))
            if code != 0:
                log.info("the server did not take a connection (NVML error %d)", code)
        except (OSError, struct.error) as e:
            log.debug("handoff failed: %s", e)
        finally:
            client.close()
            self._done()


# ----- starting and stopping ---------------------------------------------------------------------------------------
def running(state_dir: Path) -> int | None:
    """The pid of the machine's simulated nvidia-persistenced, None when none runs."""
    try:
        fd = os.open(state_dir / PERSISTENCED_LOCK_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None  # nobody holds it
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        return int(text) if text.isdigit() else None
    finally:
        os.close(fd)


def start(state_dir: Path) -> None:
    """Start the machine's simulated nvidia-persistenced unless it runs; return once it listens."""
    state_dir = Path(state_dir)
    if running(state_dir) is not None:
        return
    command = _python_command("dra_driver.simulator.libnvml.persistenced", "--state", str(state_dir), "--daemonize")
    _spawn(command, state_dir / PERSISTENCED_LOG_NAME)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while running(state_dir) is None:  # another starter's daemon may still be binding
        if time.monotonic() > deadline:
            log_path = state_dir / PERSISTENCED_LOG_NAME
            raise RuntimeError(f"the simulated nvidia-persistenced did not start (see {log_path})")
        time.sleep(0.02)


def stop(state_dir: Path, timeout: float = 30.0) -> None:
    """Stop the machine's simulated nvidia-persistenced, if it runs; return once it left."""
    deadline = time.monotonic() + timeout
    while (pid := running(Path(state_dir))) is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if time.monotonic() > deadline:
            raise TimeoutError(f"the simulated nvidia-persistenced of {state_dir} (pid {pid}) did not leave")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dra_driver.simulator.libnvml.persistenced", description=__doc__)
    parser.add_argument("--state", type=Path, required=True, help="the simulated machine's state directory")
    parser.add_argument("--ready-fd", type=int, help="closed once the socket listens (or another daemon does)")
    parser.add_argument("--daemonize", action="store_true", help="fork: the caller's child leaves at once")
    args = parser.parse_args(argv)
    if args.daemonize and os.fork() != 0:
        os._exit(0)  # the caller reaps this one; the daemon is reparented
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(process)d %(message)s")
    lock = os.open(args.state / PERSISTENCED_LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        log.info("another simulated nvidia-persistenced serves %s", args.state)
        return 0
    os.ftruncate(lock, 0)  # a pid left by one killed: not this one's until it listens
    relay = Relay(args.state)
    relay.listen()
    os.ftruncate(lock, 0)
    os.pwrite(lock, f"{os.getpid()}\n".encode(), 0)  # `running` names it from now on: it listens
    log.info("nvidia-persistenced (simulated) of %s listening on %s", args.state, relay.path)
    if args.ready_fd is not None:
        os.close(args.ready_fd)
    try:
        relay.run()
    finally:
        os.ftruncate(lock, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
