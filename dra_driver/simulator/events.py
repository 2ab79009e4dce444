"""NVML events of a simulated machine: XID errors and ECC errors, injected by a test or an operator tool.

Like the GPU state (`state.py`), events outlive the process that injected them: they are appended to a log in
`<state dir>/nvml-events.json` under a file lock, so a driver process sees what another process injected.
Each event has a sequence number; an event set remembers the last number it has seen (events that happened
before the set was created are not delivered, as on a real GPU) and returns the next event of a device it
registered, of a type it registered for. The log keeps the last `MAX_EVENTS` events.

Which event types a GPU supports is part of the same file (`set_supported`), so a test can make a GPU look like
one whose driver cannot deliver XID events.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from pathlib import Path

import pynvml
from pydantic import BaseModel

from dra_driver.simulator.lockedfile import file_identity, locked, replace_text

MAX_EVENTS = 1000
GPU_LEVEL = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of an event that is not about a MIG device
SUPPORTED_EVENT_TYPES = (
    pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeSingleBitEccError | pynvml.nvmlEventTypeDoubleBitEccError
)


class SimEvent(BaseModel):
    seq: int
    gpu: int
    event_type: int
    data: int = 0
    gi_id: int = GPU_LEVEL
    ci_id: int = GPU_LEVEL


class EventLog(BaseModel):
    next_seq: int = 1
    events: list[SimEvent] = []
    supported: dict[int, int] = {}  # gpu index -> supported event mask, when not SUPPORTED_EVENT_TYPES


class EventStore:
    def __init__(self, directory: Path) -> None:
        self.path = directory / "nvml-events.json"
        self._lock_path = directory / "nvml-events.lock"
        self._thread_lock = threading.RLock()
        self._cached: tuple[tuple[int, ...], EventLog] | None = None
        directory.mkdir(parents=True, exist_ok=True)

    def _locked(self) -> AbstractContextManager[None]:
        return locked(self._lock_path, self._thread_lock)

    def _load(self) -> EventLog:
        try:
            return EventLog.model_validate_json(self.path.read_bytes())
        except FileNotFoundError:
            return EventLog()

    def _write(self, log: EventLog) -> None:
        replace_text(self.path, log.model_dump_json())

    def read(self) -> EventLog:
        """The log as last written (callers must not modify it). An event wait polls this: while the file is the
        one read last (every write replaces it), no lock and no parse, so that waiting costs next to nothing, as
        NVML's does."""
        try:
            identity = file_identity(self.path)
        except FileNotFoundError:
            return EventLog()
        cached = self._cached
        if cached is not None and cached[0] == identity:
            return cached[1]
        with self._locked():
            log = self._load()
            identity = file_identity(self.path)
        self._cached = (identity, log)
        return log

    def append(self, gpu: int, event_type: int, data: int, gi_id: int, ci_id: int) -> int:
        with self._locked():
            log = self._load()
            seq = log.next_seq
            log.events.append(SimEvent(seq=seq, gpu=gpu, event_type=event_type, data=data, gi_id=gi_id, ci_id=ci_id))
            log.events = log.events[-MAX_EVENTS:]
            log.next_seq = seq + 1
            self._write(log)
            return seq

    def set_supported(self, gpu: int, mask: int | None) -> None:
        with self._locked():
            log = self._load()
            if mask is None:
                log.supported.pop(gpu, None)
            else:
                log.supported[gpu] = mask
            self._write(log)

    def supported(self, gpu: int, default: int = SUPPORTED_EVENT_TYPES) -> int:
        return int(self.read().supported.get(gpu, default))

    def last_seq(self) -> int:
        return self.read().next_seq - 1


class EventSetState:
    """One `nvmlEventSetCreate()` of this process: what it registered and how far it has read."""

    def __init__(self, cursor: int) -> None:
        self.cursor = cursor
        self.masks: dict[int, int] = {}  # gpu index -> registered event types

    def next_event(self, log: EventLog) -> SimEvent | None:
        for e in log.events:
            if e.seq > self.cursor and self.masks.get(e.gpu, 0) & e.event_type:
                self.cursor = e.seq
                return e
        return None
