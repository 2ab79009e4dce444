"""Persistent state of a simulated machine: MIG mode and the GPU/compute instances that exist.

Like a real GPU, the state outlives the process that changed it: every change is written to a JSON file
under an exclusive file lock, so separate processes (the driver, a test, the CLI) see the same GPUs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from pydantic import BaseModel

from dra_driver.simulator.catalog import MachineSpec
from dra_driver.simulator.lockedfile import file_identity, locked, replace_text

STATE_VERSION = 1


class ComputeInstanceState(BaseModel):
    id: int
    profile_id: int
    start: int
    size: int
    uuid: str


class GpuInstanceState(BaseModel):
    id: int
    profile_id: int
    start: int
    size: int
    compute_instances: list[ComputeInstanceState] = []


class GpuProcess(BaseModel):
    """A process that holds the GPU (a CUDA context): its pid and start time (/proc/<pid>/stat field 22), so that
    another process that got the pid later is not taken for it."""

    pid: int
    start_time: int


class GpuState(BaseModel):
    mig_current: int = 0
    mig_pending: int = 0
    lost: bool = False
    gpu_instances: list[GpuInstanceState] = []
    recovery_action: int = 0  # NVML_GPU_RECOVERY_ACTION_*: what the driver asks for after an XID
    processes: list[GpuProcess] = []


class FabricState(BaseModel):
    """Where the machine's GPUs sit in their NVLink fabric: the cluster (an NVL72 rack's NVLink domain) and the
    clique (the GPUs that can reach each other over NVLink) inside it."""

    cluster_uuid: str
    clique_id: int


class MachineState(BaseModel):
    version: int = STATE_VERSION
    machine: str
    gpus: list[GpuState]
    fabric: FabricState | None = None  # machines with nvlink_fabric; None: not placed yet (the default placement)


def initial_state(spec: MachineSpec) -> MachineState:
    gpus = [GpuState(mig_current=int(g.mig_enabled), mig_pending=int(g.mig_enabled)) for g in spec.gpus]
    return MachineState(machine=spec.name, gpus=gpus)


class StateStore:
    """Reads are served from a cache that is refreshed when the file changes; writes hold the lock."""

    def __init__(
        self, directory: Path, spec: MachineSpec, on_commit: Callable[[MachineState], None] | None = None
    ) -> None:
        self.directory = directory
        self.path = directory / "nvml-state.json"
        self._lock_path = directory / "nvml-state.lock"
        self._spec = spec
        self._thread_lock = threading.RLock()
        self._cached: MachineState | None = None
        self._cached_stat: tuple[int, ...] | None = None
        self._on_commit = on_commit
        directory.mkdir(parents=True, exist_ok=True)
        with self._locked():
            if not self.path.exists():
                self._write(initial_state(spec))
            state = self._load()
            if on_commit is not None:
                on_commit(state)
        if state.machine != spec.name or len(state.gpus) != len(spec.gpus):
            raise ValueError(
                f"simulator state {self.path} belongs to machine {state.machine!r} with {len(state.gpus)} GPUs, "
                f"not {spec.name!r}; use another state directory or delete the file"
            )

    def _load(self) -> MachineState:
        stat = file_identity(self.path)
        if self._cached is None or stat != self._cached_stat:
            self._cached = MachineState.model_validate_json(self.path.read_bytes())
            self._cached_stat = stat
        return self._cached

    def _write(self, state: MachineState) -> None:
        replace_text(self.path, state.model_dump_json(indent=1))
        self._cached = state
        self._cached_stat = file_identity(self.path)

    def _locked(self) -> AbstractContextManager[None]:
        return locked(self._lock_path, self._thread_lock)

    def read(self) -> MachineState:
        """The current state. Callers must not modify it."""
        with self._thread_lock:
            return self._load()

    @contextmanager
    def mutate(self) -> Iterator[MachineState]:
        """Yield a private copy of the state; it is written back only if the block raises nothing."""
        with self._locked():
            # Parsed afresh: another process may have written within the same mtime tick, and the copy is private
            # (cheaper than a deep copy of the cached state).
            state = MachineState.model_validate_json(self.path.read_bytes())
            yield state
            self._write(state)
            if self._on_commit is not None:
                self._on_commit(state)  # still under the lock: derived files match the state
