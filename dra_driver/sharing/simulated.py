"""A simulated nvidia-smi (compute-policy) and nvidia-cuda-mps-control for the NVML simulator.

State lives in `<simulator state dir>/sharing-state.json` (atomic rewrite under a file lock), so every process
on the simulated node sees the same time slices and MPS daemons. Unknown UUIDs are refused the way nvidia-smi
refuses them (exit 6, "No devices were found").
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dra_driver.sharing.runner import CommandResult
from dra_driver.simulator.lockedfile import locked, replace_text

STATE_FILE = "sharing-state.json"
_NO_DEVICES = 6  # nvidia-smi's exit code for "No devices were found"
_KEEP_CALLS = 1000  # the state file keeps the latest calls only


class SimulatedRunner:
    """`known(uuid)`: whether a GPU or MIG device with that UUID exists on the simulated node."""

    def __init__(self, state_dir: Path, known: Callable[[str], bool]) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / STATE_FILE
        self._lock_path = self.state_dir / "sharing-state.lock"
        self._thread_lock = threading.Lock()
        self.known = known

    @classmethod
    def for_simulator(cls, sim: Any) -> SimulatedRunner:
        """A runner next to a `SimulatedNvml` (its state directory, its GPU and MIG UUIDs)."""

        def known(uuid: str) -> bool:
            if uuid in sim.gpu_uuids:
                return True
            state = sim.store.read()
            return any(ci.uuid == uuid for g in state.gpus for gi in g.gpu_instances for ci in gi.compute_instances)

        return cls(sim.state_dir, known)

    # ----- state ------------------------------------------------------------------------------------------
    def read(self) -> dict[str, Any]:
        """{"timeslice": {uuid: n}, "mps": {pipe dir: {...}}, "calls": [{argv, env, input, returncode}]}"""
        try:
            data: dict[str, Any] = json.loads(self.path.read_text())
        except FileNotFoundError:
            data = {}
        data.setdefault("timeslice", {})
        data.setdefault("mps", {})
        data.setdefault("calls", [])
        return data

    @property
    def calls(self) -> list[dict[str, Any]]:
        return list(self.read()["calls"])

    def timeslice(self, uuid: str) -> int:
        """The GPU's current time-slice setting (0, Default, if never set)."""
        return int(self.read()["timeslice"].get(uuid, 0))

    def daemons(self) -> dict[str, dict[str, Any]]:
        """Running MPS control daemons by pipe directory."""
        return dict(self.read()["mps"])

    @contextmanager
    def _mutate(self) -> Iterator[dict[str, Any]]:
        with locked(self._lock_path, self._thread_lock):
            data = self.read()
            yield data
            replace_text(self.path, json.dumps(data, indent=1, sort_keys=True))

    # ----- commands ---------------------------------------------------------------------------------------
    def run(self, argv: list[str], *, env: Mapping[str, str] | None = None, input: str | None = None) -> CommandResult:
        env = dict(env or {})
        with self._mutate() as data:
            tool = os.path.basename(argv[0]) if argv else ""
            if tool == "nvidia-smi":
                rc, out, err = self._smi(data, argv[1:])
            elif tool == "nvidia-cuda-mps-control":
                rc, out, err = self._mps(data, argv[1:], env, input)
            else:
                rc, out, err = 127, "", f"{argv[0] if argv else '<empty>'}: command not found"
            data["calls"] = [*data["calls"], {"argv": list(argv), "env": env, "input": input, "returncode": rc}][
                -_KEEP_CALLS:
            ]
        return CommandResult(list(argv), rc, out, err)

    def _smi(self, data: dict[str, Any], args: list[str]) -> tuple[int, str, str]:
        if len(args) != 5 or args[0] != "compute-policy" or args[1] != "-i" or args[3] != "--set-timeslice":
            return 2, "", f"simulated nvidia-smi: unsupported arguments {args}"
        uuid, value = args[2], args[4]
        if not self.known(uuid):
            return _NO_DEVICES, "No devices were found\n", ""
        if value not in ("0", "1", "2", "3"):
            return 2, "", f'Invalid value "{value}" for --set-timeslice: expected 0, 1, 2 or 3\n'
        data["timeslice"][uuid] = int(value)
        return 0, f"Set timeslice to {value} for GPU {uuid}\n", ""

    def _mps(
        self, data: dict[str, Any], args: list[str], env: dict[str, str], stdin: str | None
    ) -> tuple[int, str, str]:
        pipe = env.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
        daemons: dict[str, Any] = data["mps"]
        if args == ["-d"]:
            if pipe in daemons:
                return 1, "", "An instance of this daemon is already running\n"
            if not Path(pipe).is_dir():
                return 1, "", f"Failed to open pipe directory {pipe}\n"
            visible = [u for u in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if u]
            unknown = [u for u in visible if not self.known(u)]
            if unknown:
                return 1, "", f"CUDA_VISIBLE_DEVICES: no such devices {','.join(unknown)}\n"
            daemons[pipe] = {"visible": visible, "log": env.get("CUDA_MPS_LOG_DIRECTORY"), "commands": []}
            (Path(pipe) / "control").write_text("")  # where the real daemon's control pipe would be
            return 0, "", ""
        if args:
            return 1, "", f"simulated nvidia-cuda-mps-control: unsupported arguments {args}\n"
        if pipe not in daemons:
            return 1, "", "Cannot find MPS control daemon process\n"
        for line in (stdin or "").splitlines():
            words = line.split()
            if not words:
                continue
            if words == ["quit"]:
                del daemons[pipe]
                (Path(pipe) / "control").unlink(missing_ok=True)
                break
            if (words[0] == "set_default_active_thread_percentage" and len(words) == 2) or (
                words[0] == "set_default_device_pinned_mem_limit" and len(words) == 3
            ):
                daemons[pipe]["commands"].append(line.strip())
                continue
            return 1, "", f"Unrecognized command: {line.strip()}\n"
        return 0, "", ""
