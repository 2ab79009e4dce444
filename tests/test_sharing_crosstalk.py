"""No cross-talk between claims that hold one whole GPU at once (consumable capacity, `mode=shared`): a claim's
time slice, compute mode or MPS daemon is neither overwritten nor undone by another claim's prepare or unprepare
(dra_driver.sharing.conflicts). The manager runs the simulated tools as real processes and is given the other
claims as the plugin's checkpoint holds them, as the driver passes them."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_driver.claimstate.checkpoint import (
    Checkpoint,
    CheckpointedDevice,
    ClaimEntry,
    ClaimState,
    MpsRecord,
    TimeSlicingRecord,
)
from dra_driver.claimstate.config import decode
from dra_driver.claimstate.steps import APPLY_SHARING, STARTED, WRITE_CDI, ClaimRecord, Slot, Step
from dra_driver.sharing import SharingConflict, SharingManager, Target
from dra_driver.sharing.conflicts import Wanted, check
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.simulator.tools.state import SharingState
from tests.sharing_helpers import daemon_pids, no_daemon_left

API = "gpu.resource.dra-driver.dev/v1alpha1"
DEFAULT, EXCLUSIVE = pynvml.NVML_COMPUTEMODE_DEFAULT, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
GPU = 2  # the shared GPU


class Killed(BaseException):
    pass


def time_slicing(interval: str) -> dict[str, Any]:
    return {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}


def mps(percentage: int) -> dict[str, Any]:
    return {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": percentage}}


class Node:
    """The sharing manager over a simulated node, with a checkpoint, driven as the plugin drives it."""

    def __init__(self, tmp: Path) -> None:
        self.sim = SimulatedNvml("dgx-h100", tmp / "gpu")
        self.manager = SharingManager.at_driver_root(self.sim.driver_root, tmp / "plugin")
        self.checkpoint = Checkpoint(tmp / "checkpoint.json", "boot")
        self.state = SharingState(self.sim.state_dir)
        self.uuid = self.sim.gpu_uuids[GPU]

    def others(self, uid: str) -> list[ClaimEntry]:
        return [e for e in self.checkpoint.claims.values() if e.uid != uid]

    def entry(self, name: str) -> ClaimEntry:
        return next(e for e in self.checkpoint.claims.values() if e.name == name)

    def prepare(self, name: str, sharing: dict[str, Any] | None, *, record: type[ClaimRecord] = ClaimRecord) -> str:
        """'' or the claim's error; a failed claim is undone and dropped, as the driver does."""
        uid = str(uuidlib.uuid4())
        device = CheckpointedDevice(pool="node", device=f"gpu-{GPU}", share_id=uid[:8])
        entry = ClaimEntry(uid=uid, namespace="default", name=name, state=ClaimState.PREPARE_STARTED, devices=[device])
        claim = record(self.checkpoint, entry)
        claim.record(STARTED, "recorded", entry)
        config = decode({"apiVersion": API, "kind": "GpuConfig", "sharing": sharing}) if sharing else None
        try:
            self.manager.apply(claim, [Target(0, device.device, False, config, self.uuid, False)], self.others(uid))
        except SharingConflict as e:
            self.unprepare(name)
            return str(e)
        claim.record_state(WRITE_CDI, ClaimState.PREPARE_COMPLETED)
        return ""

    def unprepare(self, name: str) -> None:
        entry = self.entry(name)
        self.manager.undo(ClaimRecord(self.checkpoint, entry), self.others(entry.uid))
        self.checkpoint.drop(entry.uid)

    def calls(self, *words: str) -> list[list[str]]:
        return [c["argv"][1:] for c in self.state.calls if all(w in c["argv"] for w in words)]

    def mode(self) -> int:
        return int(self.sim.nvmlDeviceGetComputeMode(self.sim.nvmlDeviceGetHandleByUUID(self.uuid)))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    node = Node(tmp_path)
    node.sim.nvmlInit()
    with no_daemon_left(node.sim.state_dir):
        yield node
    assert daemon_pids(node.sim.state_dir) == []


def test_a_second_claim_asking_for_another_interval_is_refused(node: Node) -> None:
    assert node.prepare("a", time_slicing("Long")) == ""
    error = node.prepare("b", time_slicing("Short"))
    assert f"GPU gpu-{GPU} ({node.uuid}) is time-sliced with interval Long for claim default/a" in error
    assert "this claim asks for Short" in error
    assert node.state.timeslice(node.uuid) == 3 and list(node.checkpoint.claims) == [node.entry("a").uid]
    assert node.calls("--set-timeslice", "1") == []  # refused before any change
    node.unprepare("a")
    assert node.state.timeslice(node.uuid) == 0


@pytest.mark.parametrize("last", ["a", "b"])
def test_claims_asking_for_the_same_interval_share_it_until_the_last_one_goes(node: Node, last: str) -> None:
    node.state.set_compute_mode(node.uuid, EXCLUSIVE)  # an administrator's choice, from before the claims
    assert node.prepare("a", time_slicing("Long")) == ""
    assert node.mode() == DEFAULT
    assert node.prepare("b", time_slicing("Long")) == ""
    assert node.entry("b").devices[0].sharing == TimeSlicingRecord(
        gpu_uuid=node.uuid, interval=3, compute_mode="Exclusive_Process", applied=True
    )
    node.unprepare("b" if last == "a" else "a")
    assert node.state.timeslice(node.uuid) == 3 and node.mode() == DEFAULT  # the other claim still runs with it
    assert node.calls("--set-timeslice", "0") == [] and node.calls("-c", "EXCLUSIVE_PROCESS") == []
    node.unprepare(last)
    assert node.state.timeslice(node.uuid) == 0 and node.mode() == EXCLUSIVE  # the mode the first claim found


def test_a_claim_without_a_sharing_config_runs_under_the_time_slice_and_changes_nothing(node: Node) -> None:
    assert node.prepare("plain", None) == ""
    assert node.prepare("a", time_slicing("Medium")) == ""  # in either order
    assert node.prepare("plain-2", None) == ""
    node.unprepare("plain-2")
    assert node.state.timeslice(node.uuid) == 2
    node.unprepare("a")
    assert node.state.timeslice(node.uuid) == 0
    node.unprepare("plain")
    assert node.state.calls[-1]["argv"][1:] == ["compute-policy", "-i", node.uuid, "--set-timeslice", "0"]


def test_mps_is_refused_on_a_gpu_another_claim_holds(node: Node) -> None:
    assert node.prepare("a", time_slicing("Long")) == ""
    error = node.prepare("b", mps(50))
    assert f"MPS needs GPU gpu-{GPU} ({node.uuid}) to itself, but claim default/a holds it" in error
    assert "(time-slicing interval Long)" in error
    assert node.state.daemons() == {} and node.mode() == DEFAULT and node.state.timeslice(node.uuid) == 3
    assert not (node.manager.plugin_dir / "mps").exists() or list((node.manager.plugin_dir / "mps").iterdir()) == []
    node.unprepare("a")
    assert node.prepare("plain", None) == ""
    assert "claim default/plain holds it (no sharing setting)" in node.prepare("b", mps(50))
    node.unprepare("plain")


def test_no_claim_joins_a_gpu_that_runs_another_claims_mps_daemon(node: Node) -> None:
    assert node.prepare("a", mps(30)) == ""
    before = node.state.daemons()
    (daemon,) = before.values()
    assert node.mode() == EXCLUSIVE
    for name, sharing in [("b", time_slicing("Short")), ("c", mps(60)), ("d", None)]:
        error = node.prepare(name, sharing)
        assert "runs the MPS control daemon of claim default/a, which needs the GPU to itself" in error, name
    assert node.state.daemons() == before
    assert daemon["active_thread_percentage"] == 30.0 and node.mode() == EXCLUSIVE  # untouched by the refusals
    assert node.state.timeslice(node.uuid) == 0
    node.unprepare("a")
    assert node.state.daemons() == {} and node.mode() == DEFAULT
    assert node.prepare("b", time_slicing("Short")) == ""  # once the daemon is gone
    node.unprepare("b")


def test_a_crash_while_joining_a_shared_gpu_is_undone_without_touching_the_other_claim(node: Node) -> None:
    assert node.prepare("a", time_slicing("Long")) == ""

    class CrashAfterIntent(ClaimRecord):
        def record(self, step: Step, slot: Slot, entry: ClaimEntry) -> None:
            super().record(step, slot, entry)
            if step is APPLY_SHARING and slot == "intent":
                raise Killed  # the intent is on disk, then the plugin dies

    with pytest.raises(Killed):
        node.prepare("b", time_slicing("Long"), record=CrashAfterIntent)
    restarted = Checkpoint(node.checkpoint.path, "boot")  # what the next process reads
    b = next(e for e in restarted.claims.values() if e.name == "b")
    assert b.devices[0].sharing is not None and b.devices[0].sharing.applied is False
    node.checkpoint = restarted
    node.unprepare("b")  # start-up recovery undoes it, with the checkpoint's other claims
    assert node.state.timeslice(node.uuid) == 3
    node.unprepare("a")
    assert node.state.timeslice(node.uuid) == 0


def test_devices_with_admin_access_or_released_hold_nothing() -> None:
    def entry(name: str, **device: Any) -> ClaimEntry:
        d = CheckpointedDevice(pool="p", device="gpu-0", **device)
        return ClaimEntry(uid=name, namespace="ns", name=name, state=ClaimState.PREPARE_COMPLETED, devices=[d])

    mps_record = MpsRecord(dir="/x", uuid="GPU-0", gpu_uuid="GPU-0", applied=True)
    released = entry("gone", sharing=mps_record, released=True)
    admin = entry("admin", admin_access=True)
    check([Wanted("gpu-0", "GPU-0", "MPS")], [released, admin])
    with pytest.raises(SharingConflict, match="claim ns/live"):
        check([Wanted("gpu-0", "GPU-0", "MPS")], [entry("live", sharing=mps_record)])
