"""No cross-talk between claims that hold one whole GPU at once (consumable capacity: `mode=shared`).

A GPU has one time slice and one compute mode, so a claim must never overwrite or undo another's:

- time-slicing: every claim on the GPU that asks for an interval asks for the same one; the first sets it, each
  records it, and it is reset only when the last claim holding it is unprepared (claims without a sharing config
  run under it too);
- MPS needs the GPU to itself (EXCLUSIVE_PROCESS leaves it to the daemon's server): refused on a GPU another claim
  holds, and no claim is prepared on a GPU where another claim's MPS daemon runs.

What the other claims hold is read from the checkpoint: the caller passes its entries (never this process's
memory, which a restart or the other plugin process of a rolling update would not share). Devices prepared with
admin access, and released ones, hold nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dra_driver.claimstate.checkpoint import ClaimEntry, TimeSlicingRecord
from dra_driver.sharing.nvsmi import SharingError

TIME_SLICE = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}  # nvidia-smi compute-policy --set-timeslice
INTERVAL_NAME = {n: name for name, n in TIME_SLICE.items()}


class SharingConflict(SharingError):
    """The claim's sharing settings would change those of another claim on the same GPU."""


@dataclass(frozen=True)
class Holding:
    """One device another claim holds; strategy, interval and the compute mode found before the first claim changed
    it are set where its sharing applies to the whole GPU `gpu_uuid`."""

    claim: str  # namespace/name, for errors
    device: str
    gpu_uuid: str | None = None
    strategy: str | None = None
    interval: int | None = None
    compute_mode: str | None = None

    def setting(self) -> str:
        if self.strategy == "TimeSlicing":
            return f"time-slicing interval {INTERVAL_NAME.get(self.interval or 0, self.interval)}"
        return "its MPS control daemon" if self.strategy == "MPS" else "no sharing setting"


@dataclass(frozen=True)
class Wanted:
    """What this claim asks of one whole GPU it holds (strategy None: nothing, it runs under what is set)."""

    device: str
    gpu_uuid: str
    strategy: str | None = None
    interval: int | None = None


def holdings(others: Iterable[ClaimEntry]) -> list[Holding]:
    out = []
    for entry in others:
        for d in entry.devices:
            if d.admin_access or d.released:
                continue
            s = d.sharing
            gpu = s.gpu_uuid if s is not None else None  # a MIG device's sharing leaves its GPU to others
            out.append(
                Holding(
                    claim=f"{entry.namespace}/{entry.name}",
                    device=d.device,
                    gpu_uuid=gpu,
                    strategy=s.strategy if s is not None and gpu else None,
                    interval=s.interval if isinstance(s, TimeSlicingRecord) else None,
                    compute_mode=s.compute_mode if s is not None and gpu else None,
                )
            )
    return out


def _on(h: Holding, w: Wanted) -> bool:
    return h.device == w.device or (h.gpu_uuid is not None and h.gpu_uuid == w.gpu_uuid)


def check(wanted: list[Wanted], others: Iterable[ClaimEntry]) -> None:
    """SharingConflict naming each other claim and its setting when `wanted` cannot go with what they hold."""
    held = holdings(others)
    problems: dict[tuple[str, str], str] = {}
    for w in wanted:
        for h in held:
            if not _on(h, w) or (w.device, h.claim) in problems:
                continue
            gpu = f"GPU {w.device} ({w.gpu_uuid})"
            if h.strategy == "MPS":
                problems[w.device, h.claim] = (
                    f"{gpu} runs the MPS control daemon of claim {h.claim}, which needs the GPU to itself"
                )
            elif w.strategy == "MPS":
                problems[w.device, h.claim] = f"MPS needs {gpu} to itself, but claim {h.claim} holds it ({h.setting()})"
            elif w.strategy == "TimeSlicing" and h.strategy == "TimeSlicing" and h.interval != w.interval:
                problems[w.device, h.claim] = (
                    f"{gpu} is time-sliced with interval {INTERVAL_NAME.get(h.interval or 0)} for claim {h.claim}; "
                    f"this claim asks for {INTERVAL_NAME.get(w.interval or 0)} (claims sharing a GPU must ask for "
                    "the same interval)"
                )
    if problems:
        raise SharingConflict("; ".join(problems.values()))


def holders(gpu_uuid: str, others: Iterable[ClaimEntry]) -> list[Holding]:
    """The other claims' settings on this GPU (those that keep it from being reset)."""
    return [h for h in holdings(others) if h.gpu_uuid == gpu_uuid and h.strategy is not None]


def found_mode(gpu_uuid: str, others: Iterable[ClaimEntry]) -> str | None:
    """The compute mode the first claim on this GPU found, as another holder recorded it (None: no holder did)."""
    return next((h.compute_mode for h in holders(gpu_uuid, others) if h.compute_mode), None)
