"""The simulated MPS control daemon's process: it takes its pipe directory (a lock on the pid file), listens on
`<pipe dir>/control`, answers one command per connection (a JSON reply: ok, text), logs to
`<log dir>/control.log`, and records itself, its settings and the compute modes it found in the sharing state.
It exits on `quit`, SIGTERM or SIGINT, or when its pipe directory is removed or replaced, each time removing its
socket, pid file and record (never a successor's).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import sys
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

import pynvml

from dra_driver.simulator.tools.devices import NoDriver, find_device, open_nvml
from dra_driver.simulator.tools.state import KEEP_COMMANDS, MODE_NAMES, SharingState, pid_namespace

SOCKET_NAME, PID_FILE, LOG_FILE = "control", "nvidia-cuda-mps-control.pid", "control.log"
ALREADY_RUNNING = "An instance of this daemon is already running"
REPLY_TIMEOUT_S = 10.0  # a client that connects and sends nothing holds the daemon this long at most
POLL_S = 0.2  # how soon the daemon notices a signal or its pipe directory gone
_PINNED = re.compile(r"^[1-9][0-9]*[MG]\Z")
_MAX_COMMAND = 4096


class StartError(Exception):
    pass


def visible_devices(state_dir: Path, value: str | None) -> tuple[list[str], dict[str, str]]:
    """CUDA_VISIBLE_DEVICES (unset: every GPU) and the compute mode of each device's GPU (a MIG device runs
    under its GPU's); StartError for a device the node does not have."""
    try:
        nvml = open_nvml(state_dir)
    except NoDriver as e:
        raise StartError(str(e)) from None
    if value is None or not value.strip():
        entries = [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
    else:
        entries = [v.strip() for v in value.split(",") if v.strip()]
    handles = {e: find_device(nvml, e) for e in entries}
    unknown = [e for e, h in handles.items() if h is None]
    if unknown:
        raise StartError(f"CUDA_VISIBLE_DEVICES: no such devices {','.join(unknown)}")
    try:
        modes = {e: MODE_NAMES[nvml.nvmlDeviceGetComputeMode(h)] for e, h in handles.items()}
    except pynvml.NVMLError as e:
        raise StartError(f"CUDA_VISIBLE_DEVICES: {e}") from None
    return entries, modes


class Daemon:
    def __init__(
        self, state_dir: Path, pipe: str, log_dir: str, visible: list[str], modes: dict[str, str], *, foreground: bool
    ) -> None:
        self.state = SharingState(state_dir)
        self.pipe, self.log_dir, self.visible, self.modes = pipe, log_dir, visible, modes
        self.foreground = foreground
        self.percentage = 100.0
        self.pinned: dict[str, str] = {}
        self.sock: socket.socket | None = None
        self.pid_fd: int | None = None
        self.ids: tuple[int, int, int, int] = (0, 0, 0, 0)  # pipe dir (dev, ino), socket (dev, ino)
        self.stopping: str | None = None
        self.cleaned = False

    def log(self, message: str) -> None:
        line = f"[{datetime.now():%Y-%m-%d %H:%M:%S.%f} Control {os.getpid()}] {message}\n"
        # a removed log directory must not stop the daemon
        with contextlib.suppress(OSError), open(os.path.join(self.log_dir, LOG_FILE), "a") as f:
            f.write(line)
        if self.foreground:
            sys.stderr.write(line)
            sys.stderr.flush()

    # ----- start ------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Take the pipe directory (StartError if another daemon has it), listen, record this daemon."""
        pid_path = os.path.join(self.pipe, PID_FILE)
        try:
            fd = os.open(pid_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StartError(f"Failed to open pipe directory {self.pipe}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StartError(ALREADY_RUNNING) from None
        self.pid_fd = fd
        os.makedirs(self.log_dir, exist_ok=True)
        os.chdir(self.pipe)  # AF_UNIX paths hold 107 bytes: bind by name, in the directory
        with contextlib.suppress(FileNotFoundError):
            os.unlink(SOCKET_NAME)  # left by a daemon that was killed: the lock says none runs
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(SOCKET_NAME)
        sock.listen(16)
        sock.settimeout(POLL_S)
        self.sock = sock
        here, bound = os.stat(self.pipe), os.stat(SOCKET_NAME)
        self.ids = (here.st_dev, here.st_ino, bound.st_dev, bound.st_ino)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        with self.state.mutate() as data:
            data["mps"][self.pipe] = {
                "pid": os.getpid(),
                "pid_namespace": pid_namespace(),  # where `pid` means this process
                "visible": self.visible,
                "log": self.log_dir,
                "compute_modes": self.modes,
                "commands": [],
                "active_thread_percentage": None,
                "pinned_mem_limits": {},
                "foreground": self.foreground,
            }
        self.log(f"Starting control daemon using socket {os.path.join(self.pipe, SOCKET_NAME)}")
        self.log(f"To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={self.pipe}")

    # ----- serve ------------------------------------------------------------------------------------------
    def serve(self) -> int:
        def stop(signum: int, _: FrameType | None) -> None:
            self.stopping = signal.Signals(signum).name

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        assert self.sock is not None
        while self.stopping is None:
            if not self._pipe_dir_is_ours():
                self.stopping = "its pipe directory was removed"
                break
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, InterruptedError):
                continue
            with conn:
                self._handle(conn)
        self.cleanup()
        self.log(f"Exit ({self.stopping})")
        return 0

    def _pipe_dir_is_ours(self) -> bool:
        try:
            st = os.stat(self.pipe)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.ids[:2]

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(REPLY_TIMEOUT_S)
        data = b""
        try:
            while b"\n" not in data and len(data) < _MAX_COMMAND:
                chunk = conn.recv(_MAX_COMMAND)
                if not chunk:
                    break
                data += chunk
        except OSError:
            return  # the client went away: nothing to answer
        line = data.decode(errors="replace").strip()
        if not line:
            return  # a client checking that the daemon listens
        self.log(f"Cmd:{line}")
        ok, text = self.command(line)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"ok": ok, "out": text}).encode())

    def command(self, line: str) -> tuple[bool, str]:
        words = line.split()
        name, args = words[0], words[1:]
        if name == "quit" and not args:
            self.stopping = "quit"
            self.cleanup()  # before the answer: when the client returns, the daemon is gone from the state
            return True, ""
        if name == "get_server_list" and not args:
            return True, ""  # no CUDA client has asked for a server
        if name == "get_default_active_thread_percentage" and not args:
            return True, f"{self.percentage:.1f}"
        if name == "set_default_active_thread_percentage" and len(args) == 1:
            try:
                value = float(args[0])
            except ValueError:
                value = -1.0
            if not 0 < value <= 100:
                return False, f"Invalid active thread percentage {args[0]!r}: expected a number above 0, up to 100"
            self.percentage = value
            self._record(line, active_thread_percentage=value)
            return True, f"{value:.1f}"
        if name in ("get_default_device_pinned_mem_limit", "set_default_device_pinned_mem_limit") and args:
            device = self._device(args[0])
            if device is None:
                return False, f"Invalid device {args[0]!r}: {len(self.visible)} devices are visible to this daemon"
            if name.startswith("get") and len(args) == 1:
                return True, self.pinned.get(device, "0")
            if name.startswith("set") and len(args) == 2:
                if not _PINNED.match(args[1]):
                    return False, f"Invalid memory limit {args[1]!r}: expected a number of MB or GB, as 512M or 2G"
                self.pinned[device] = args[1]
                self._record(line, pinned_mem_limits=dict(self.pinned))
                return True, ""
        return False, f"Unrecognized command: {line}"

    def _device(self, text: str) -> str | None:
        """A device argument (an index into CUDA_VISIBLE_DEVICES, or one of its UUIDs) as its index."""
        if text.isdigit() and int(text) < len(self.visible):
            return str(int(text))
        return str(self.visible.index(text)) if text in self.visible else None

    def _record(self, line: str, **settings: Any) -> None:
        with self.state.mutate() as data:
            entry = data["mps"].get(self.pipe)
            if entry is not None and entry.get("pid") == os.getpid():
                entry["commands"] = [*entry["commands"], line][-KEEP_COMMANDS:]
                entry.update(settings)

    def cleanup(self) -> None:
        """Remove this daemon's socket, pid file and record (not a successor's); safe to repeat."""
        if self.cleaned:
            return
        self.cleaned = True
        if self.sock is not None:
            self.sock.close()
        with contextlib.suppress(OSError):
            st = os.lstat(os.path.join(self.pipe, SOCKET_NAME))
            if (st.st_dev, st.st_ino) == self.ids[2:]:
                os.unlink(os.path.join(self.pipe, SOCKET_NAME))
        pid_path = os.path.join(self.pipe, PID_FILE)
        with contextlib.suppress(OSError):
            if self.pid_fd is not None and os.fstat(self.pid_fd).st_ino == os.stat(pid_path).st_ino:
                os.unlink(pid_path)
        if self.pid_fd is not None:
            os.close(self.pid_fd)  # releases the lock
        if not self.state.state_dir.is_dir():
            return  # the whole simulated node was removed: nothing to record, nothing to recreate
        with self.state.mutate() as data:
            entry = data["mps"].get(self.pipe)
            if entry is not None and entry.get("pid") == os.getpid():
                del data["mps"][self.pipe]
