"""A fork server for the simulated `nvidia-smi` and `nvidia-cuda-mps-control` on the host: a tool's process start
(pydantic, the product catalog and the simulator imported anew) costs about 0.8 s on 2 cores, its work 0.05 s, and
the sharing code calls them a few times per claim. Opt-in (`ENV`=1, which the tests set): pods never have it, so the
driver in a container runs the tools as before, and so does a process without it.

The client (the tool's script, `run`) hands its argv, environment, working directory, umask and standard streams
(SCM_RIGHTS) to a server that has everything imported; the server forks a child that runs the tool in that context,
tells the client the child's pid (the client forwards its signals), and then its wait status, which the client exits
with. A client killed midway takes its child with it (the server sees the connection close). The server is started
by the first client that finds none (which then runs the tool itself), one per context a child inherits from it
(uid, namespaces, cgroup, interpreter, the simulator's code) whatever the machine, and leaves when idle. Where
anything fails before a child exists, the client runs the tool directly, so nothing runs twice.

The start of the MPS control daemon is not served (`served`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ENV = "DRA_SIM_TOOL_SERVER"
IDLE_S = 20.0
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_HEADER = struct.Struct("!I")
_PACKAGE = Path(__file__).resolve().parents[2]  # the dra_driver package directory


def _code_version() -> int:
    """The newest change to the simulator's code and data: a server never serves code older than the client's."""
    newest = 0
    for directory, _dirs, files in os.walk(_PACKAGE / "simulator"):
        for name in files:
            with contextlib.suppress(OSError):
                newest = max(newest, os.stat(os.path.join(directory, name)).st_mtime_ns)
    return newest


def _context() -> str:
    """What a forked child inherits from its server rather than from its client."""
    parts = [str(os.getuid()), str(os.getgid()), sys.executable, str(_PACKAGE), str(_code_version())]
    for ns in ("mnt", "pid", "net", "ipc", "uts", "user", "cgroup"):
        try:
            parts.append(os.readlink(f"/proc/self/ns/{ns}"))
        except OSError:
            parts.append("-")
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/self/cgroup").read_text())
    return "\n".join(parts)


def socket_path() -> Path:
    key = hashlib.sha256(_context().encode()).hexdigest()[:24]
    return Path(tempfile.gettempdir()) / "dra-sim-tools" / f"{key}.sock"


# ----- the client -----------------------------------------------------------------------------------------------
def served(tool: str, argv: list[str]) -> bool:
    """nvidia-smi, and nvidia-cuda-mps-control's commands; not the start of its daemon (`-d`, `-f`), which tests and
    the simulator's state know by its command line (tools.state), and a forked child's is the server's."""
    if tool == "nvidia-smi":
        return True
    return tool == "nvidia-cuda-mps-control" and not {"-d", "-f"} & set(argv[1:])


def run(tool: str, argv: list[str], state_dir: Path) -> int | None:
    """The tool's exit code, run by the server; None when it did not run there (no server: one is started for the
    next call), so the caller runs it itself."""
    if not served(tool, argv) or os.environ.get(ENV) != "1":
        return None
    try:
        for fd in (0, 1, 2):
            os.fstat(fd)
    except OSError:
        return None  # a closed standard stream: nothing to hand over
    path = socket_path()
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(2.0)
        conn.connect(str(path))
    except OSError:
        conn.close()
        _start_server(path)
        return None
    with conn:
        request = json.dumps(
            {
                "tool": tool,
                "argv": argv,
                "state": str(state_dir),
                "cwd": os.getcwd(),
                "env": dict(os.environ),
                "umask": _umask(),
            }
        ).encode()
        try:
            socket.send_fds(conn, [_HEADER.pack(len(request)) + request], [0, 1, 2])
            conn.settimeout(None)
            reader = conn.makefile("rb")
            pid = int(reader.readline().split(b" ")[1])
        except (OSError, ValueError, IndexError):
            return None  # no child was made: run it here
        for sig in _FORWARDED:
            signal.signal(sig, lambda s, _f: _forward(pid, s))
        line = reader.readline()
    try:
        status = int(line.split(b" ")[1])
    except (ValueError, IndexError):
        print(f"{tool} (simulated): the tool server went away", file=sys.stderr)
        return 1
    if os.WIFSIGNALED(status):  # die as the child did
        died_of = os.WTERMSIG(status)
        signal.signal(died_of, signal.SIG_DFL)
        os.kill(os.getpid(), died_of)
    return os.waitstatus_to_exitcode(status)


def _forward(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, sig)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _start_server(path: Path) -> None:
    import subprocess

    with contextlib.suppress(OSError):
        subprocess.Popen(
            [sys.executable, "-c", "import sys; from dra_driver.simulator.tools.forkserver import serve; "
             "sys.exit(serve(sys.argv[1]))", str(path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, cwd="/",
        )  # fmt: skip


# ----- the server -----------------------------------------------------------------------------------------------
class _Child:
    def __init__(self, pid: int, pidfd: int, conn: socket.socket) -> None:
        self.pid, self.pidfd, self.conn = pid, pidfd, conn
        self.client_gone = False


def serve(path_arg: str) -> int:
    path = Path(path_arg)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another server runs or starts
    signal.signal(signal.SIGTERM, lambda _s, _f: sys.exit(0))  # still unlink the socket
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    inode = os.stat(path).st_ino
    _preload()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, _Child] = {}
    last = time.monotonic()
    try:
        while True:
            for key, _ in selector.select(timeout=1.0):
                last = time.monotonic()
                if key.fileobj is listener:
                    _accept(listener, selector, children)
                elif isinstance(key.fileobj, socket.socket):  # the client went away (or spoke out of turn)
                    child = key.data
                    selector.unregister(child.conn)
                    child.client_gone = True
                    _forward(child.pid, signal.SIGKILL)
                else:
                    _reap(selector, children, key.data)
            if not children and (time.monotonic() - last > IDLE_S or not _still_ours(path, inode)):
                return 0
    finally:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == inode:
                path.unlink()
        listener.close()
        with contextlib.suppress(OSError):  # under the lock: a server starting now finds it gone and starts anew
            os.unlink(f"{path}.lock")
        os.close(lock)


def _preload() -> None:
    """What a child would otherwise import: the reason for the server."""
    from dra_driver.simulator import catalog, nvml  # noqa: F401
    from dra_driver.simulator.tools import mps, smi  # noqa: F401

    for key in catalog.product_keys():
        catalog.product(key)
    catalog.machine_names()
    catalog.recovery_catalog()


def _still_ours(path: Path, inode: int) -> bool:
    try:
        return os.stat(path).st_ino == inode
    except OSError:
        return False


def _accept(listener: socket.socket, selector: selectors.BaseSelector, children: dict[int, _Child]) -> None:
    conn, _ = listener.accept()
    fds: list[int] = []
    try:
        conn.settimeout(5.0)
        data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
        if len(data) < _HEADER.size or len(fds) != 3:
            raise ValueError("incomplete request")
        (size,) = _HEADER.unpack_from(data)
        body = data[_HEADER.size :]
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                raise ValueError("incomplete request")
            body += chunk
        request = json.loads(body)
        pid = os.fork()
        if pid == 0:
            _child(request, fds)  # never returns
    except (OSError, ValueError):
        conn.close()
        for fd in fds:
            os.close(fd)
        return
    for fd in fds:
        os.close(fd)
    child = _Child(pid, os.pidfd_open(pid), conn)
    children[child.pidfd] = child
    selector.register(child.pidfd, selectors.EVENT_READ, child)
    try:
        conn.settimeout(None)
        conn.sendall(f"pid {pid}\n".encode())
    except OSError:  # the client is gone: so is its child
        child.client_gone = True
        _forward(pid, signal.SIGKILL)
        return
    selector.register(conn, selectors.EVENT_READ, child)


def _reap(selector: selectors.BaseSelector, children: dict[int, _Child], child: _Child) -> None:
    _, status = os.waitpid(child.pid, 0)
    selector.unregister(child.pidfd)
    os.close(child.pidfd)
    del children[child.pidfd]
    if not child.client_gone:
        selector.unregister(child.conn)
        with contextlib.suppress(OSError):
            child.conn.sendall(f"status {status}\n".encode())
    child.conn.close()


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """The forked child: the client's streams, directory, umask and environment, then the tool."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's handler is not the tool's
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, 65536)  # the server's sockets, lock and selector, the received descriptors
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        os.environ.clear()
        os.environ.update(request["env"])
        from dra_driver.simulator.tools import run_directly

        code = run_directly(str(request["tool"]), [str(a) for a in request["argv"]], Path(request["state"]))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
