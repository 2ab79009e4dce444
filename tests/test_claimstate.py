"""The claim state layer: the step table is what prepare, teardown and recovery run (a traced prepare and unprepare
reach exactly the table's crash points, in its order), every step that changes the node declares its record, and
the checkpoint converts an older format version explicitly."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver.claimstate import checkpoint as checkpoint_module
from dra_driver.claimstate import crashpoints, steps
from dra_driver.claimstate.checkpoint import (
    CHECKPOINT_VERSION,
    Checkpoint,
    CheckpointVersionError,
    ClaimState,
    MpsRecord,
    TimeSlicingRecord,
)
from dra_driver.plugin import features, machine
from tests.plugin_helpers import Node, claim, ref
from tests.test_sharing import mps


def test_each_table_has_one_handler_per_step_in_its_order() -> None:
    for table, handlers in (
        (steps.PREPARE, machine._PREPARE),
        (steps.TEARDOWN, machine._TEARDOWN),
        (steps.RECOVERY, machine._RECOVERY),
    ):
        assert tuple(handlers) == table


def test_every_step_that_changes_the_node_declares_its_record_and_crash_points() -> None:
    assert len(set(steps.ALL_POINTS)) == len(steps.ALL_POINTS)  # a crash point names one place
    for step in steps.PREPARE + steps.TEARDOWN:
        assert step.record_before or step.record_after, step.name
        assert step.points, step.name
        if step.record_before:  # the intent's crash point: written, nothing changed yet
            assert "intent" in step.points, step.name
    for step in steps.PREPARE:
        assert step.undo, step.name
    assert all(p.startswith(f"{s.phase}.") for s in steps.PREPARE + steps.TEARDOWN + steps.RECOVERY for p in
               s.points.values())  # fmt: skip


def test_a_claim_using_every_step_reaches_the_tables_crash_points_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A MIG partition carved with an MPS daemon and device metadata on: every prepare step and every teardown step
    applies, and the trace (what the crash tests kill at) is the table's crash points, one write per record."""
    trace = tmp_path / "trace"
    monkeypatch.setenv(crashpoints.TRACE_ENV, str(trace))
    node = Node(tmp_path / "node")
    c = claim(["gpu-6-mig-3g40gb-9-0"], device_class="mig", config=[mps(kind="MigDeviceConfig")])
    node.add(c)
    d = node.driver(feature_gates={**features.DEFAULTS, "DeviceMetadata": True})
    writes: list[str] = []
    put = Checkpoint.put
    monkeypatch.setattr(Checkpoint, "put", lambda self, entry: writes.append(entry.state) or put(self, entry))
    assert d.prepare([ref(c)])[ref(c).uid].error == ""
    reached = trace.read_text().split()
    start = reached.index(steps.PREPARE_POINTS[0])
    assert reached[start:] == list(steps.PREPARE_POINTS)
    # a write per record: started, the MIG device, sharing's intent and applied, completed
    assert writes == ["PrepareStarted"] * 4 + ["PrepareCompleted"]
    trace.write_text("")
    writes.clear()
    assert d.unprepare([ref(c)]) == {ref(c).uid: None}
    assert trace.read_text().split() == list(steps.TEARDOWN_POINTS)
    assert writes == ["UnprepareStarted"] * 3  # started, sharing cleared, released; then the entry dropped
    assert d.checkpoint.claims == {} and node.mig_instances() == [] and node.cdi_files() == []


def _v2_file(path: Path, data: dict[str, Any]) -> None:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    doc = {"version": 2, "checksum": hashlib.sha256(canonical).hexdigest(), "data": data}
    path.write_text(json.dumps(doc))


def test_a_version_2_checkpoint_is_converted_and_written_back_as_the_current_version(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    device = {"pool": "n", "device": "gpu-0", "future": 1}
    claims = {
        "a": {"uid": "a", "namespace": "ns", "name": "a", "state": "PrepareCompleted", "devices": [{**device,
              "sharing": {"strategy": "TimeSlicing", "gpuUuid": "GPU-0", "interval": 3,
                          "computeMode": "Exclusive_Process", "applied": True}}]},
        "b": {"uid": "b", "namespace": "ns", "name": "b", "state": "PrepareStarted", "devices": [{**device,
              "device": "gpu-1", "sharing": {"strategy": "MPS", "dir": "/m/b", "uuid": "GPU-1", "applied": False}}]},
    }  # fmt: skip
    _v2_file(path, {"boot_id": "boot", "claims": claims})
    cp = Checkpoint(path, "boot")
    assert cp.claims["a"].devices[0].sharing == TimeSlicingRecord(
        gpu_uuid="GPU-0", interval=3, compute_mode="Exclusive_Process", applied=True
    )
    assert cp.claims["b"].devices[0].sharing == MpsRecord(dir="/m/b", uuid="GPU-1")
    assert cp.claims["a"].state is ClaimState.PREPARE_COMPLETED
    cp.save()
    doc = json.loads(path.read_text())
    assert doc["version"] == CHECKPOINT_VERSION == 3
    saved = doc["data"]["claims"]["a"]["devices"][0]
    assert saved["sharing"]["gpu_uuid"] == "GPU-0" and saved["future"] == 1  # an unknown field kept
    assert Checkpoint(path, "boot").claims == cp.claims


def test_a_version_no_release_wrote_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    data = {"boot_id": "boot", "claims": {}}
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    path.write_text(json.dumps({"version": 1, "checksum": hashlib.sha256(canonical).hexdigest(), "data": data}))
    before = path.read_bytes()
    with pytest.raises(CheckpointVersionError, match="format version 1, which no release wrote"):
        Checkpoint(path, "boot")
    assert path.read_bytes() == before
    assert checkpoint_module._UPGRADES  # every version from the oldest converted one up has its conversion
    assert set(checkpoint_module._UPGRADES) == set(range(min(checkpoint_module._UPGRADES), CHECKPOINT_VERSION))
