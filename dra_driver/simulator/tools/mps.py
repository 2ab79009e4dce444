"""The simulated `nvidia-cuda-mps-control`: starts the control daemon (tools.mpsd) and is its client.

- `-d`: start the daemon in the background (fork, setsid, stdio on /dev/null) and return once it listens on
  `<CUDA_MPS_PIPE_DIRECTORY>/control` (default /tmp/nvidia-mps); 1 if one already runs there, the pipe directory
  is missing or a CUDA_VISIBLE_DEVICES device is unknown. `-f`: the same daemon in the foreground (a container's
  main process), logging to stderr too. Logs go to CUDA_MPS_LOG_DIRECTORY (default /var/log/nvidia-mps).
- no argument: the client; each stdin line is a command for the daemon, its replies are printed; 1 with
  "Cannot find MPS control daemon process" when none listens, 1 when a command fails.
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from dra_driver.simulator.tools.mpsd import SOCKET_NAME, Daemon, StartError, visible_devices
from dra_driver.simulator.tools.state import SharingState

DEFAULT_PIPE_DIR, DEFAULT_LOG_DIR = "/tmp/nvidia-mps", "/var/log/nvidia-mps"
NO_DAEMON = "Cannot find MPS control daemon process"
START_TIMEOUT_S = 10.0  # -d: how long the daemon may take to listen
CONNECT_TIMEOUT_S, REPLY_TIMEOUT_S = 5.0, 10.0  # the client, per command


# ----- starting -------------------------------------------------------------------------------------------------
def start(state_dir: Path, env: Mapping[str, str], *, background: bool) -> int:
    pipe = os.path.abspath(env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR)
    log_dir = os.path.abspath(env.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIR)
    try:
        if not os.path.isdir(pipe):
            raise StartError(f"Failed to open pipe directory {pipe}: No such file or directory")
        visible, modes = visible_devices(state_dir, env.get("CUDA_VISIBLE_DEVICES"))
    except StartError as e:
        print(e, file=sys.stderr)
        return 1
    daemon = Daemon(state_dir, pipe, log_dir, visible, modes, foreground=not background)
    if not background:
        try:
            daemon.open()
        except (StartError, OSError) as e:
            print(e, file=sys.stderr)
            return 1
        return daemon.serve()
    read_fd, write_fd = os.pipe()
    if os.fork() == 0:
        _run_detached(daemon, read_fd, write_fd)  # never returns
    os.close(write_fd)
    message = _wait_ready(read_fd)
    if message == "ok":
        return 0
    print(message, file=sys.stderr)
    return 1


def _run_detached(daemon: Daemon, read_fd: int, write_fd: int) -> None:
    """The forked child: a session of its own, no inherited descriptors but the readiness pipe."""
    code = 1
    try:
        os.close(read_fd)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, write_fd)
        os.closerange(write_fd + 1, 65536)
        try:
            daemon.open()
        except (StartError, OSError) as e:
            os.write(write_fd, str(e).encode())
            return
        os.write(write_fd, b"ok")
        os.close(write_fd)
        code = daemon.serve()
    finally:
        os._exit(code)


def _wait_ready(read_fd: int) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    data = b""
    try:
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([read_fd], [], [], left)
            if not ready:
                break
            chunk = os.read(read_fd, 4096)
            if not chunk:
                return data.decode(errors="replace") or "The control daemon exited while starting"
            data += chunk
        return f"The control daemon did not start within {START_TIMEOUT_S:g}s"
    finally:
        os.close(read_fd)


# ----- the client -----------------------------------------------------------------------------------------------
def send(pipe: str, line: str) -> tuple[bool, str] | None:
    """The daemon's answer to one command; None when no daemon listens in `pipe`."""
    try:
        os.chdir(pipe)  # connect by name: AF_UNIX paths are short
    except OSError:
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(CONNECT_TIMEOUT_S)
        try:
            s.connect(SOCKET_NAME)
        except OSError:
            return None
        s.settimeout(REPLY_TIMEOUT_S)
        try:
            s.sendall(line.encode() + b"\n")
            s.shutdown(socket.SHUT_WR)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        except OSError as e:
            return False, f"No answer from the MPS control daemon: {e}"
    if not data:
        return (True, "") if not line else (False, "The MPS control daemon closed the connection")
    reply = json.loads(data)
    return bool(reply["ok"]), str(reply["out"])


def client(env: Mapping[str, str], stdin: str) -> int:
    pipe = os.path.abspath(env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR)
    commands = [line.strip() for line in stdin.splitlines() if line.strip()] or [""]  # "": only check it listens
    code = 0
    for line in commands:
        reply = send(pipe, line)
        if reply is None:
            print(NO_DAEMON, file=sys.stderr)
            return 1
        ok, text = reply
        if text:
            print(text, file=sys.stdout if ok else sys.stderr)
        code = code if ok else 1
    return code


def main(state_dir: Path, argv: list[str]) -> int:
    args = argv[1:]
    stdin: str | None = None
    if args in (["-d"], ["-f"]):
        code = start(state_dir, os.environ, background=args == ["-d"])
    elif args:
        print(f"Usage: {os.path.basename(argv[0])} [-d | -f]", file=sys.stderr)
        code = 1
    else:
        stdin = sys.stdin.read()
        code = client(os.environ, stdin)
    SharingState(state_dir).record_call(argv, os.environ, stdin, code)
    return code
