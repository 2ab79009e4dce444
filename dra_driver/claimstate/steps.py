"""The steps of a claim's prepare, teardown (unprepare, a failed prepare, recovery) and the plugin's start-up
recovery, each declared once: what it changes on the node, what the checkpoint records about it and when, its crash
points and what undoes it. The driver runs these tables in order (dra_driver.plugin.driver binds one handler to
each step and checks that every step has one); sharing records its step through `ClaimRecord`; the crash tests kill
the process at every crash point; docs/architecture.md is generated from them (scripts/gen_architecture.py).

Every step that changes the node has a record that tells recovery what may exist: written before the change when
the change cannot be found without it (sharing's intent, with the compute mode found), after it when the node
itself can be searched (a MIG device carved but not yet recorded is found by its profile and placement). A step
that does not apply to a claim (no MIG device, no sharing) is skipped with its records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from dra_driver.claimstate import crashpoints
from dra_driver.claimstate.checkpoint import Checkpoint, ClaimEntry, ClaimState

Slot = Literal["intent", "done", "recorded"]  # the crash point after the record before / the change / the record after


class Phase(StrEnum):
    PREPARE = "prepare"
    TEARDOWN = "unprepare"  # an unprepare; also a failed prepare's undo and recovery's undo of a claim
    RECOVER = "recover"


@dataclass(frozen=True, eq=False)  # identity: a step is its declaration (and a key of the driver's handlers)
class Step:
    phase: Phase
    name: str
    changes: str  # on the node
    record_before: str = ""  # written before the change ("": none)
    record_after: str = ""  # written after it ("": none)
    points: dict[Slot, str] = field(default_factory=dict)  # crash point names by slot
    undo: str = ""  # the teardown step that undoes it

    def at(self, slot: Slot) -> None:
        """This step reached `slot`: a crash point (a test may kill the process here)."""
        crashpoints.reached(self.points[slot])


# ----- prepare -------------------------------------------------------------------------------------------------------
STARTED = Step(
    Phase.PREPARE,
    "record-started",
    "nothing yet (every check is done: the claim, its classes, selectors, configs, other claims' devices)",
    record_after="the claim's entry, PrepareStarted, with its devices",
    points={"recorded": "prepare.started-recorded"},
    undo="remove-cdi (the entry is dropped last)",
)
CARVE_MIG = Step(
    Phase.PREPARE,
    "carve-mig",
    "a MIG device (GPU and compute instance) per partition allocated in partitionable mode, MIG on if it was off; "
    "a whole GPU's MIG off if it is on with no instance left",
    record_after="the device's `mig`: its UUID and ids (one not yet recorded is found by profile and placement)",
    points={"done": "prepare.mig-created", "recorded": "prepare.mig-recorded"},
    undo="destroy-mig, restore-mig-mode",
)
APPLY_SHARING = Step(
    Phase.PREPARE,
    "apply-sharing",
    "compute mode and time slice of whole GPUs; the claim's MPS control daemon, its directory and shm tmpfs",
    record_before="each device's `sharing` (TimeSlicing or MPS, applied: false), with the compute mode found",
    record_after="`sharing.applied`: true",
    points={
        "intent": "prepare.sharing-intent-recorded",
        "done": "prepare.sharing-applied",
        "recorded": "prepare.sharing-recorded",
    },
    undo="undo-sharing",
)
WRITE_METADATA = Step(
    Phase.PREPARE,
    "write-metadata",
    "the claim's device metadata (KEP-5304; feature gate DeviceMetadata): a file per request with its devices' "
    "attributes, each written atomically (temp file, rename), for the CDI spec to mount",
    record_after="none: its directory is named by the claim's namespace, name and uid, which record-started recorded",
    points={"done": "prepare.metadata-written"},
    undo="remove-metadata",
)
WRITE_CDI = Step(
    Phase.PREPARE,
    "write-cdi",
    "the claim's CDI spec (atomically: temp file, rename)",
    record_after="PrepareCompleted: the claim is answered as prepared from now on",
    points={"done": "prepare.cdi-written", "recorded": "prepare.completed-recorded"},
    undo="remove-cdi",
)
PREPARE: tuple[Step, ...] = (STARTED, CARVE_MIG, APPLY_SHARING, WRITE_METADATA, WRITE_CDI)

# ----- teardown ------------------------------------------------------------------------------------------------------
UNPREPARE_STARTED = Step(
    Phase.TEARDOWN,
    "record-unprepare-started",
    "nothing yet",
    record_after="UnprepareStarted: never answered as prepared again",
    points={"recorded": "unprepare.started-recorded"},
)
UNDO_SHARING = Step(
    Phase.TEARDOWN,
    "undo-sharing",
    "the MPS daemon stopped, its tmpfs and directory removed; time slice and compute mode restored, unless another "
    "claim holds them",
    record_after="each device's `sharing` cleared",
    points={"done": "unprepare.sharing-undone", "recorded": "unprepare.sharing-recorded"},
)
DESTROY_MIG = Step(
    Phase.TEARDOWN,
    "destroy-mig",
    "each MIG device the claim carved, once its recorded UUID is checked (ids are reused); an admin's never",
    record_after="`released` on every device",
    points={"done": "unprepare.mig-destroyed", "recorded": "unprepare.released-recorded"},
)
RESTORE_MIG_MODE = Step(
    Phase.TEARDOWN,
    "restore-mig-mode",
    "MIG off again on a GPU the claim's partitions were carved on, where no instance is left (Hopper and later)",
    record_after="none: decided from the GPU itself, so repeating it is harmless",
    points={"done": "unprepare.mig-mode-restored"},
)
REMOVE_METADATA = Step(
    Phase.TEARDOWN,
    "remove-metadata",
    "the claim's device metadata directory (whatever the feature gate says now: it may have been on at prepare)",
    record_after="none: found by the claim's namespace, name and uid, so repeating it is harmless",
    points={"done": "unprepare.metadata-removed"},
)
REMOVE_CDI = Step(
    Phase.TEARDOWN,
    "remove-cdi",
    "the claim's CDI spec",
    record_after="the claim's entry dropped",
    points={"done": "unprepare.cdi-removed", "recorded": "unprepare.dropped"},
)
TEARDOWN: tuple[Step, ...] = (
    UNPREPARE_STARTED,
    UNDO_SHARING,
    DESTROY_MIG,
    RESTORE_MIG_MODE,
    REMOVE_METADATA,
    REMOVE_CDI,
)

# ----- start-up recovery ---------------------------------------------------------------------------------------------
RECOVERY_STARTED = Step(
    Phase.RECOVER,
    "load",
    "nothing: the checkpoint is read (under the node lock)",
    points={"done": "recover.started"},
)
UNDO_INTERRUPTED = Step(
    Phase.RECOVER,
    "undo-interrupted",
    "the teardown of each claim not PrepareCompleted, and of each that lost its MIG device or CDI spec",
    record_after="as the teardown records",
    points={"done": "recover.claim-torn-down"},
)
REMOVE_ORPHAN_MPS = Step(
    Phase.RECOVER,
    "remove-orphan-mps",
    "MPS daemons and directories of claims the checkpoint does not hold",
)
DESTROY_ORPHAN_MIG = Step(
    Phase.RECOVER,
    "destroy-orphan-mig",
    "MIG devices no claim recorded (partitionable mode); MIG off where none is left",
    points={"done": "recover.orphan-mig-destroyed"},
)
REMOVE_ORPHAN_CDI = Step(
    Phase.RECOVER,
    "remove-orphan-cdi",
    "CDI specs no claim holds, and temp files of interrupted writes",
    points={"done": "recover.orphan-cdi-removed"},
)
REMOVE_ORPHAN_METADATA = Step(
    Phase.RECOVER,
    "remove-orphan-metadata",
    "device metadata directories no claim of the checkpoint holds (one of another boot's claims)",
)
RECOVERY: tuple[Step, ...] = (
    RECOVERY_STARTED,
    UNDO_INTERRUPTED,
    REMOVE_ORPHAN_MPS,
    DESTROY_ORPHAN_MIG,
    REMOVE_ORPHAN_CDI,
    REMOVE_ORPHAN_METADATA,
)

_ORDER: tuple[Slot, ...] = ("intent", "done", "recorded")


def crash_points(steps: tuple[Step, ...]) -> tuple[str, ...]:
    """The crash points of `steps`, in the order a call reaches them."""
    return tuple(s.points[slot] for s in steps for slot in _ORDER if slot in s.points)


PREPARE_POINTS = crash_points(PREPARE)
TEARDOWN_POINTS = crash_points(TEARDOWN)
RECOVERY_POINTS = crash_points(RECOVERY)
ALL_POINTS = PREPARE_POINTS + TEARDOWN_POINTS + RECOVERY_POINTS


class ClaimRecord:
    """A claim's entry as the checkpoint holds it. Every change of the entry is written through `record`, and the
    step's crash point follows the write; the entry's state changes nowhere else."""

    def __init__(self, checkpoint: Checkpoint, entry: ClaimEntry) -> None:
        self.checkpoint = checkpoint
        self.entry = entry

    def record(self, step: Step, slot: Slot, entry: ClaimEntry) -> None:
        self.checkpoint.put(entry)
        self.entry = entry
        step.at(slot)

    def record_state(self, step: Step, state: ClaimState) -> None:
        self.record(step, "recorded", self.entry.with_state(state))

    def drop(self, step: Step) -> None:
        self.checkpoint.drop(self.entry.uid)
        step.at("recorded")
