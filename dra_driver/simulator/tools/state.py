"""What the simulated driver tools share on one simulated node: each GPU's time slice and compute mode, the MPS
control daemons that run, and a log of the tools' calls.

One JSON file, `<simulator state dir>/sharing-state.json`, rewritten atomically under a file lock, so nvidia-smi,
the MPS daemons, the simulator's NVML (compute mode) and tests in other processes all see the same values. It holds
what is live, however many claims came and went: every change drops the records of MPS daemons that are gone (killed
without cleaning up after themselves) and time slices and compute modes back at their defaults, and the log keeps
the latest KEEP_CALLS calls.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dra_driver.simulator.lockedfile import locked, replace_text

STATE_FILE = "sharing-state.json"
LOCK_FILE = "sharing-state.lock"
KEEP_CALLS = 50  # the log keeps the latest calls only (tests look at a claim's few)
KEEP_INPUT = 4096  # characters of a call's stdin kept in the log
KEEP_COMMANDS = 64  # an MPS daemon's latest commands kept in its record

# NVML's compute modes (pynvml NVML_COMPUTEMODE_*) and the names nvidia-smi's queries print for them
DEFAULT, PROHIBITED, EXCLUSIVE_PROCESS = 0, 2, 3
MODE_NAMES = {DEFAULT: "Default", PROHIBITED: "Prohibited", EXCLUSIVE_PROCESS: "Exclusive_Process"}

_THREAD_LOCK = threading.Lock()  # flock keeps processes apart; this, the threads of one process


def is_daemon(pid: int) -> bool:
    """Whether `pid` is a running MPS control daemon (not another process that got its pid since)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"nvidia-cuda-mps-control" in cmdline and pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie waiting to be reaped has)."""
    return process_start_time(pid) is not None


def pid_namespace() -> int:
    """This process's pid namespace (its inode): a pid recorded in another one says nothing here."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _live(data: dict[str, Any]) -> None:
    """Drop what no longer is: daemons that died here (a daemon of another pid namespace, e.g. a pod's, cannot be
    judged from this one and stays), and settings back at their defaults (what readers answer for an absent GPU)."""
    here = pid_namespace()
    data["mps"] = {
        pipe: d
        for pipe, d in data["mps"].items()
        if d.get("pid_namespace") != here or not here or is_daemon(int(d.get("pid", 0)))
    }
    data["timeslice"] = {uuid: v for uuid, v in data["timeslice"].items() if v}
    data["compute_mode"] = {uuid: v for uuid, v in data["compute_mode"].items() if v != DEFAULT}


def process_start_time(pid: int) -> int | None:
    """A live process's start time (/proc/<pid>/stat field 22: with the pid, what tells it from a later process
    that got the same pid); None when there is no such process, or it has exited (a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


class SharingState:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / STATE_FILE

    def read(self) -> dict[str, Any]:
        """{"timeslice": {gpu uuid: 0..3}, "compute_mode": {gpu uuid: NVML mode}, "mps": {pipe dir: daemon},
        "calls": [{argv, env, input, returncode}]}; GPUs never changed are absent (0 and Default)."""
        try:
            data: dict[str, Any] = json.loads(self.path.read_text())
        except FileNotFoundError:
            data = {}
        for key in ("timeslice", "compute_mode", "mps"):
            data.setdefault(key, {})
        data.setdefault("calls", [])
        return data

    @contextmanager
    def mutate(self) -> Iterator[dict[str, Any]]:
        """The state to change in place; written back when the block ends without an exception."""
        with locked(self.state_dir / LOCK_FILE, _THREAD_LOCK):
            data = self.read()
            yield data
            _live(data)
            replace_text(self.path, json.dumps(data, indent=1, sort_keys=True))

    # ----- readers ------------------------------------------------------------------------------------------
    def timeslice(self, gpu_uuid: str) -> int:
        return int(self.read()["timeslice"].get(gpu_uuid, 0))

    def compute_mode(self, gpu_uuid: str) -> int:
        return int(self.read()["compute_mode"].get(gpu_uuid, DEFAULT))

    def daemons(self) -> dict[str, dict[str, Any]]:
        """The MPS control daemons that run, by pipe directory (an entry whose process died is left out)."""
        return {pipe: d for pipe, d in self.read()["mps"].items() if is_daemon(int(d.get("pid", 0)))}

    @property
    def calls(self) -> list[dict[str, Any]]:
        return list(self.read()["calls"])

    # ----- writers ------------------------------------------------------------------------------------------
    def set_compute_mode(self, gpu_uuid: str, mode: int) -> None:
        with self.mutate() as data:
            data["compute_mode"][gpu_uuid] = mode

    def record_call(self, argv: list[str], env: Mapping[str, str], stdin: str | None, returncode: int) -> None:
        wanted = {k: v for k, v in env.items() if k.startswith("CUDA_") or k == "LD_PRELOAD"}
        with self.mutate() as data:
            kept = stdin if stdin is None else stdin[:KEEP_INPUT]
            call = {"argv": list(argv), "env": wanted, "input": kept, "returncode": returncode}
            data["calls"] = [*data["calls"], call][-KEEP_CALLS:]
