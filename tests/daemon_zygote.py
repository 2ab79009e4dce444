"""Start node daemons fast: a process that has imported the daemon's modules once forks one child per daemon.

Much of a daemon's start is imports (pydantic models, gRPC, the generated protobuf modules). The crash tests start a
daemon well over a hundred times, so they fork it from this "zygote" instead: the child is a separate process that runs
exactly `dra-driver <argv>` (`dra_driver.cli.main`) with its own environment, log file and pid, and dies by SIGKILL like
any other; only the imports are shared.

Run as `python tests/daemon_zygote.py` (the `Zygote` class does); it speaks one JSON object a line on stdin/stdout:
{"op": "spawn", "argv": [...], "env": {...}, "log": path, "cwd": path} -> {"pid": n};
{"op": "wait", "pid": n, "timeout": s} -> {"status": returncode or null} (negative: killed by that signal).
It creates no thread and no gRPC object before forking, and dies with its parent (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Pre-exec (or first thing in a child): get SIGKILL when the parent dies, so no daemon outlives a test. The
    zygote's own copy of tests.processes.die_with_parent: it runs as a script with another driver root on its path,
    where no `tests` package need be."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def preload() -> None:
    """Import what `dra-driver plugin --sim` imports (only that: module-level side effects stay those of a daemon),
    and build the pure data every daemon builds the same: the CEL environment (once it serves) and the simulator's
    product files."""
    import dra_driver.cli
    import dra_driver.controller.publisher
    import dra_driver.daemon
    import dra_driver.labels
    import dra_driver.plugin.class_cache
    import dra_driver.plugin.grpc.server
    import dra_driver.plugin.selectors
    import dra_driver.simulator.catalog
    import dra_driver.simulator.nvml
    import dra_driver.slices.builder
    import dra_driver.telemetry  # the daemon imports it once it serves

    dra_driver.plugin.selectors.warm_up()
    dra_driver.simulator.catalog.machine_names()


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become `dra-driver <argv>`; never returns."""
    rc = 1
    try:
        die_with_parent()
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        os.chdir(request.get("cwd") or os.getcwd())
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["dra-driver", *request["argv"]]
        from dra_driver.cli import main

        rc = main(request["argv"])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        rc = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(rc)


def _status(raw: int) -> int:
    return -os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)


def serve() -> None:
    die_with_parent()
    preload()
    assert threading.active_count() == 1, "the zygote must not fork with threads running"
    reaped: dict[int, int] = {}  # a status is answered again to a second wait
    for line in sys.stdin:
        request = json.loads(line)
        reply: dict[str, Any]
        if request["op"] == "spawn":
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                _child(request)
            reply = {"pid": pid}
        elif request["op"] == "wait":
            deadline = time.monotonic() + float(request.get("timeout") or 0)
            status = reaped.get(int(request["pid"]))
            while status is None:
                try:
                    done, raw = os.waitpid(int(request["pid"]), os.WNOHANG)
                except ChildProcessError:
                    break
                if done:
                    status = reaped[done] = _status(raw)
                    break
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.005)
            reply = {"status": status}
        else:
            reply = {"error": f"unknown op {request['op']!r}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


class Zygote:
    """The client: starts `python tests/daemon_zygote.py` and forks daemons through it."""

    def __init__(self, driver_root: Path) -> None:
        """`driver_root`: the directory whose `dra_driver` package the daemons run."""
        self._lock = threading.Lock()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(driver_root), os.environ.get("PYTHONPATH")])),
        }
        self._proc = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=driver_root,
            env=env,
            preexec_fn=die_with_parent,
        )

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the daemon zygote exited with {self._proc.poll()}")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def spawn(self, argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> ZygoteChild:
        pid = int(self._ask({"op": "spawn", "argv": argv, "env": env, "log": str(log), "cwd": str(cwd)})["pid"])
        return ZygoteChild(self, pid)

    def wait(self, pid: int, timeout: float) -> int | None:
        status = self._ask({"op": "wait", "pid": pid, "timeout": timeout})["status"]
        return None if status is None else int(status)

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


class ZygoteChild:
    """A daemon forked by the zygote, with the parts of `subprocess.Popen` the harness uses."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.wait(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            status = self.zygote.wait(self.pid, 3600 if timeout is None else timeout)
            self.returncode = status if self.returncode is None else self.returncode
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"daemon {self.pid}", timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    serve()
