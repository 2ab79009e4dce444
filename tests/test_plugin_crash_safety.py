"""The plugin core under faults: interrupted unprepares with reused MIG ids, devices that vanished, read-only and
full CDI roots, checkpoints from another boot or a newer driver, one claim's exception in a batch, file modes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_driver.cdi.spec import spec_file_name
from dra_driver.cdi.store import CdiStore
from dra_driver.claimstate.checkpoint import CheckpointVersionError, ClaimState
from dra_driver.claimstate.context import CallContext
from dra_driver.nvml.mig import destroy_gpu_instance
from dra_driver.plugin.driver import Driver
from dra_driver.plugin.failures import FailureKind
from tests.plugin_helpers import DRIVER, Node, claim, ref
from tests.simhelpers import create_full_ci, create_gi

A_DEVICE, B_DEVICE = "gpu-0-mig-1g10gb-19-6", "gpu-0-mig-1g10gb-19-5"


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def _uid(c: dict[str, Any]) -> str:
    return str(c["metadata"]["uid"])


def _mig_uuids(node: Node) -> set[str]:
    """MIG UUIDs of every compute instance that exists on the simulated node."""
    found: set[str] = set()
    for i in range(node.sim.nvmlDeviceGetCount()):
        for j in range(node.sim.nvmlDeviceGetMaxMigDeviceCount(node.sim.nvmlDeviceGetHandleByIndex(i))):
            with contextlib.suppress(pynvml.NVMLError):
                parent = node.sim.nvmlDeviceGetHandleByIndex(i)
                found.add(node.sim.nvmlDeviceGetUUID(node.sim.nvmlDeviceGetMigDeviceHandleByIndex(parent, j)))
    return found


@contextlib.contextmanager
def _cdi_removal_fails(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The CDI spec cannot be removed (an I/O error), as when an unprepare is interrupted after the MIG device
    is destroyed."""

    def fail(self: CdiStore, claim_uid: str) -> bool:
        raise OSError(5, "Input/output error", str(self.path(claim_uid)))

    with monkeypatch.context() as m:
        m.setattr(CdiStore, "remove", fail)
        yield


def _interrupted_unprepare_then_b_reuses_the_id(node: Node, monkeypatch: pytest.MonkeyPatch) -> tuple[Driver, Any]:
    a, b = claim([A_DEVICE], device_class="mig"), claim([B_DEVICE], device_class="mig")
    node.add(a, b)
    d = node.driver()
    assert d.prepare([ref(a)])[_uid(a)].error == ""
    a_mig = d.checkpoint.claims[_uid(a)].devices[0].mig
    assert a_mig is not None
    with _cdi_removal_fails(monkeypatch):
        failure = d.unprepare([ref(a)])[_uid(a)]
        assert failure is not None and "Input/output error" in failure.message
        assert failure.kind is FailureKind.IO and failure.retryable
    assert a_mig.uuid not in _mig_uuids(node)  # A's GPU instance is destroyed, its unprepare did not finish
    assert d.prepare([ref(b)])[_uid(b)].error == ""
    b_mig = d.checkpoint.claims[_uid(b)].devices[0].mig
    assert b_mig is not None and b_mig.gi_id == a_mig.gi_id  # NVML reused A's GPU instance id for B
    return d, (a, b, b_mig)


def test_retried_unprepare_never_destroys_a_device_that_reuses_the_id(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    d, (a, b, b_mig) = _interrupted_unprepare_then_b_reuses_the_id(node, monkeypatch)
    assert d.unprepare([ref(a)]) == {_uid(a): None}  # the kubelet's retry
    assert b_mig.uuid in _mig_uuids(node)  # B's partition survives
    assert node.mig_instances() == [(0, 19, 5)] and node.cdi_files() == [spec_file_name(DRIVER, _uid(b))]
    restarted = node.driver()  # and a restart keeps it too
    assert restarted.prepare([ref(b)])[_uid(b)].devices[0].cdi_device_ids == [
        f"k8s.{DRIVER}/claim={_uid(b)}-{B_DEVICE}"
    ]
    assert b_mig.uuid in _mig_uuids(node)


def test_prepare_after_an_interrupted_unprepare_carves_the_device_again(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    d, (a, _, b_mig) = _interrupted_unprepare_then_b_reuses_the_id(node, monkeypatch)
    result = d.prepare([ref(a)])[_uid(a)]  # a stale entry must not answer success with a device that is gone
    assert result.error == "" and result.devices[0].cdi_device_ids == [f"k8s.{DRIVER}/claim={_uid(a)}-{A_DEVICE}"]
    a_mig = d.checkpoint.claims[_uid(a)].devices[0].mig
    assert a_mig is not None and a_mig.uuid in _mig_uuids(node) and b_mig.uuid in _mig_uuids(node)
    assert d.checkpoint.claims[_uid(a)].state is ClaimState.PREPARE_COMPLETED
    assert node.mig_instances() == [(0, 19, 5), (0, 19, 6)]


def _destroy_behind_the_drivers_back(node: Node, gpu: int, gi_id: int) -> None:
    """An operator (or a crashed cleanup) destroys the GPU instance, compute instances first."""
    assert destroy_gpu_instance(node.sim, node.sim.nvmlDeviceGetHandleByIndex(gpu), gi_id, "test")


def test_a_prepared_claim_whose_mig_device_vanished_is_prepared_again(node: Node) -> None:
    c = claim([A_DEVICE], device_class="mig")
    node.add(c)
    d = node.driver()
    first = d.prepare([ref(c)])[_uid(c)]
    old = d.checkpoint.claims[_uid(c)].devices[0].mig
    assert old is not None
    node.sim.nvmlInit()
    _destroy_behind_the_drivers_back(node, 0, old.gi_id)
    again = d.prepare([ref(c)])[_uid(c)]
    new = d.checkpoint.claims[_uid(c)].devices[0].mig
    assert again.error == "" and again.devices == first.devices  # same CDI ids
    assert new is not None and new.uuid != old.uuid and new.uuid in _mig_uuids(node)
    spec = json.loads((node.cdi_root / spec_file_name(DRIVER, _uid(c))).read_text())
    assert spec["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={new.uuid}"]


def test_startup_undoes_a_prepared_claim_whose_mig_device_vanished(node: Node) -> None:
    c, kept = claim([A_DEVICE], device_class="mig"), claim([B_DEVICE], device_class="mig")
    node.add(c, kept)
    d = node.driver()
    assert d.prepare([ref(c), ref(kept)])[_uid(c)].error == ""
    mig = d.checkpoint.claims[_uid(c)].devices[0].mig
    assert mig is not None
    d.close()
    node.sim.nvmlInit()
    _destroy_behind_the_drivers_back(node, 0, mig.gi_id)
    restarted = node.driver()
    assert _uid(c) not in restarted.checkpoint.claims  # not left to answer success with a dead device
    assert node.cdi_files() == [spec_file_name(DRIVER, _uid(kept))]
    assert restarted.checkpoint.claims[_uid(kept)].state is ClaimState.PREPARE_COMPLETED
    assert restarted.prepare([ref(c)])[_uid(c)].error == "" and node.mig_instances() == [(0, 19, 5), (0, 19, 6)]


# ----- read-only and full CDI roots (real tmpfs mounts: root only) --------------------------------------------
@pytest.fixture
def cdi_mount(node: Node) -> Iterator[Path]:
    node.cdi_root.mkdir(parents=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(node.cdi_root)], check=True)
    try:
        yield node.cdi_root
    finally:
        subprocess.run(["umount", "-l", str(node.cdi_root)], check=False)


def _remount(path: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True)


def test_failed_prepare_on_a_read_only_cdi_root_releases_everything(node: Node, cdi_mount: Path) -> None:
    c = claim([A_DEVICE], device_class="mig")
    node.add(c)
    d = node.driver()
    _remount(cdi_mount, "ro")
    result = d.prepare([ref(c)])[_uid(c)]
    assert "Read-only file system" in result.error
    assert result.failure is not None and result.failure.kind is FailureKind.IO and result.failure.retryable
    assert _uid(c) not in d.checkpoint.claims and node.mig_instances() == []
    assert node.sim.store.read().gpus[0].mig_current == 0
    _remount(cdi_mount, "rw")
    assert d.prepare([ref(c)])[_uid(c)].error == ""


def test_unprepare_on_a_read_only_cdi_root_frees_the_devices_and_finishes_later(node: Node, cdi_mount: Path) -> None:
    a, b = claim([A_DEVICE], device_class="mig"), claim([A_DEVICE], device_class="mig")
    node.add(a, b)
    d = node.driver()
    assert d.prepare([ref(a)])[_uid(a)].error == ""
    _remount(cdi_mount, "ro")
    failure = d.unprepare([ref(a)])[_uid(a)]
    assert failure is not None and "Read-only file system" in failure.message and failure.kind is FailureKind.IO
    assert node.mig_instances() == []  # the partition is free although the spec could not go
    assert all(dev.released for dev in d.checkpoint.claims[_uid(a)].devices)
    _remount(cdi_mount, "rw")
    assert d.prepare([ref(b)])[_uid(b)].error == ""  # another claim gets the same partition
    assert d.unprepare([ref(a)]) == {_uid(a): None}  # the kubelet's retry finishes the job
    assert node.cdi_files() == [spec_file_name(DRIVER, _uid(b))] and node.mig_instances() == [(0, 19, 6)]


def test_full_cdi_root_leaves_no_temp_file_and_recovery_removes_old_ones(node: Node, cdi_mount: Path) -> None:
    c = claim(["gpu-1"])
    node.add(c)
    d = node.driver()
    with contextlib.suppress(OSError), open(cdi_mount / "filler", "wb") as f:  # fill the 64 KiB tmpfs
        f.write(b"x" * 65536)
        f.flush()
    error = d.prepare([ref(c)])[_uid(c)].error
    assert "No space left on device" in error
    assert sorted(p.name for p in cdi_mount.iterdir()) == ["filler"]
    assert _uid(c) not in d.checkpoint.claims
    (cdi_mount / "filler").unlink()
    crashed = cdi_mount / f".{spec_file_name(DRIVER, 'crashed-uid')}.tmp"  # a crash in the middle of a write
    crashed.write_text("{")
    foreign = cdi_mount / ".other-vendor.json.tmp"
    foreign.write_text("{")
    node.driver()
    assert not crashed.exists() and foreign.exists()  # ours only


# ----- checkpoint from another boot, from a newer driver ------------------------------------------------------
def test_checkpoint_from_another_boot_leaves_mig_off(node: Node) -> None:
    c = claim([A_DEVICE], device_class="mig")
    node.add(c)
    node.driver(boot_id="boot-1").prepare([ref(c)])
    assert node.sim.store.read().gpus[0].mig_current == 1
    node.driver(boot_id="boot-2")
    assert node.mig_instances() == [] and node.cdi_files() == []
    assert node.sim.store.read().gpus[0].mig_current == 0  # Hopper: MIG off again, as an unprepare leaves it


def test_a_checkpoint_torn_by_a_node_crash_is_set_aside_after_the_reboot(node: Node) -> None:
    """Checkpoint writes are not fsynced: only a crash of the node can tear one, and then the node reboots. An
    unreadable checkpoint written before this boot is a previous boot's: moved aside, the plugin starts with no
    claims (a MIG device the old claim carved is gone with the reboot; here the simulator still has it, and the
    orphan sweep removes it). One written during this boot is still refused (test_plugin_driver)."""
    c = claim([A_DEVICE], device_class="mig")
    node.add(c)
    node.driver(boot_id="boot-1").prepare([ref(c)])
    path = node.plugin_dir / "checkpoint.json"
    path.write_bytes(path.read_bytes()[:40])  # the power went while the page cache was written back
    os.utime(path, (1_000_000, 1_000_000))  # 1970: before this boot
    d = node.driver(boot_id="boot-2")
    assert d.checkpoint.claims == {}
    assert (node.plugin_dir / "checkpoint.json.previous-boot").read_bytes().startswith(b'{"version"')
    assert node.mig_instances() == [] and node.cdi_files() == []


_KILLED_AFTER_UNLINK = """
import json, os, signal, sys
from pathlib import Path
from dra_driver.claimstate import checkpoint
from tests.plugin_helpers import Node, ref
node = Node(Path(sys.argv[1]))
c = json.loads(sys.argv[2])
node.add(c)
d = node.driver()
real = os.replace
def replace(src, dst):
    completed = open(src, "rb").read().count(b'"PrepareCompleted"') == 2  # the save of the second claim's
    if str(dst).endswith("checkpoint.json") and not os.path.exists(dst) and completed:
        os.kill(os.getpid(), signal.SIGKILL)  # the old file is unlinked, the new one not yet renamed
    real(src, dst)
checkpoint.os.replace = replace
d.prepare([ref(c)])
"""


def test_a_save_killed_between_its_unlink_and_its_rename_is_completed_at_the_next_start(
    node: Node, tmp_path: Path
) -> None:
    """A save unlinks the old file before renaming the new one over its name (ext4 writes a file renamed over
    another back at once). A process killed in between leaves only the temp file, complete: the next start adopts
    it, so the claim whose PrepareCompleted it holds is prepared, not an orphan."""
    first, second = claim([A_DEVICE], device_class="mig"), claim(["gpu-3"])
    node.add(first, second)
    node.driver().prepare([ref(first)])
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    args = [sys.executable, "-c", _KILLED_AFTER_UNLINK, str(tmp_path), json.dumps(second)]
    proc = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    assert not (node.plugin_dir / "checkpoint.json").exists()
    d = node.driver()
    assert {u: e.state for u, e in d.checkpoint.claims.items()} == {
        _uid(first): ClaimState.PREPARE_COMPLETED,
        _uid(second): ClaimState.PREPARE_COMPLETED,
    }
    assert (node.plugin_dir / "checkpoint.json").exists() and not (node.plugin_dir / ".checkpoint.json.tmp").exists()
    assert len(node.cdi_files()) == 2
    assert d.unprepare([ref(first), ref(second)]) == {_uid(first): None, _uid(second): None}
    assert node.mig_instances() == [] and node.cdi_files() == []


def test_a_temp_file_torn_with_no_checkpoint_beside_it_is_an_interrupted_first_write(node: Node) -> None:
    node.plugin_dir.mkdir(parents=True)
    (node.plugin_dir / ".checkpoint.json.tmp").write_bytes(b'{"version":2,"checks')
    c = claim(["gpu-0"])
    node.add(c)
    d = node.driver()
    assert d.checkpoint.claims == {} and not (node.plugin_dir / ".checkpoint.json.tmp").exists()
    assert d.prepare([ref(c)])[_uid(c)].error == ""


def _rewrite(path: Path, edit: Any) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    canonical = json.dumps(doc["data"], sort_keys=True, separators=(",", ":"))
    doc["checksum"] = hashlib.sha256(canonical.encode()).hexdigest()
    path.write_text(json.dumps(doc))


def test_checkpoint_of_a_newer_format_is_refused_and_left_alone(node: Node) -> None:
    c = claim(["gpu-0"])
    node.add(c)
    node.driver().prepare([ref(c)])
    path = node.plugin_dir / "checkpoint.json"
    _rewrite(path, lambda doc: doc.update(version=99))
    before = path.read_bytes()
    with pytest.raises(CheckpointVersionError, match="format version 99, written by a newer driver"):
        node.driver()
    assert path.read_bytes() == before


def test_fields_of_a_newer_driver_are_written_back_unchanged(node: Node) -> None:
    first, second = claim(["gpu-0"]), claim(["gpu-1"])
    node.add(first, second)
    node.driver().prepare([ref(first)])
    path = node.plugin_dir / "checkpoint.json"

    def add_fields(doc: dict[str, Any]) -> None:
        doc["data"]["futureField"] = {"x": 1}
        doc["data"]["claims"][_uid(first)]["alsoNew"] = [1, 2]
        doc["data"]["claims"][_uid(first)]["devices"][0]["deviceNew"] = "kept"

    _rewrite(path, add_fields)
    assert node.driver().prepare([ref(second)])[_uid(second)].error == ""  # rewrites the checkpoint
    data = json.loads(path.read_text())["data"]
    assert data["futureField"] == {"x": 1} and data["claims"][_uid(first)]["alsoNew"] == [1, 2]
    assert data["claims"][_uid(first)]["devices"][0]["deviceNew"] == "kept"


# ----- batches, other drivers, file modes ------------------------------------------------------------------------
def test_one_claims_nvml_error_in_unprepare_stays_that_claims(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    good, lost = claim(["gpu-2-mig-1g10gb-19-6"], device_class="mig"), claim([A_DEVICE], device_class="mig")
    node.add(good, lost)
    d = node.driver()
    assert all(r.error == "" for r in d.prepare([ref(good), ref(lost)]).values())
    lost_gpu = d.inventory.gpu_by_minor(0).uuid
    real = node.sim.nvmlDeviceGetHandleByUUID

    def handle(uuid: str | bytes) -> Any:
        if uuid == lost_gpu:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return real(uuid)

    monkeypatch.setattr(node.sim, "nvmlDeviceGetHandleByUUID", handle)
    out = d.unprepare([ref(lost), ref(good)])
    failure = out[_uid(lost)]
    assert out[_uid(good)] is None and failure is not None and "GPU is lost" in failure.message
    assert failure.kind is FailureKind.MIG and not failure.retryable  # a lost GPU is back only after a reset
    assert node.mig_instances() == [(0, 19, 6)]


def test_a_claim_allocated_only_to_another_driver_gets_no_entry_and_no_spec(node: Node) -> None:
    c = claim(["gpu-0"], driver="other.example.com")
    node.add(c)
    d = node.driver()
    result = d.prepare([ref(c)])[_uid(c)]
    assert result.error == "" and result.devices == []
    assert _uid(c) not in d.checkpoint.claims and node.cdi_files() == []


def test_lock_and_checkpoint_are_private(node: Node) -> None:
    c = claim(["gpu-0"])
    node.add(c)
    node.driver().prepare([ref(c)])
    for name in ("pu.lock", "checkpoint.json"):
        assert stat.S_IMODE((node.plugin_dir / name).stat().st_mode) == 0o600, name


def test_orphan_sweep_keeps_a_device_that_reuses_a_released_id(node: Node) -> None:
    """Recovery's ownership check goes by MIG UUID, not by GPU instance id."""
    c = claim([A_DEVICE], device_class="mig")
    node.add(c)
    node.driver().prepare([ref(c)])
    path = node.plugin_dir / "checkpoint.json"
    data = json.loads(path.read_text())["data"]
    gi_id = data["claims"][_uid(c)]["devices"][0]["mig"]["gi_id"]
    node.sim.nvmlInit()
    _destroy_behind_the_drivers_back(node, 0, gi_id)
    dev = node.sim.nvmlDeviceGetHandleByIndex(0)
    create_full_ci(node.sim, create_gi(node.sim, dev, 19, 6, 1), 1)  # same id and placement, another device
    d = node.driver()
    assert _uid(c) not in d.checkpoint.claims  # its own device is gone: undone
    assert node.mig_instances() == []  # the impostor nobody recorded is an orphan


def test_a_held_node_lock_ends_the_wait_at_the_deadline(node: Node) -> None:
    import fcntl
    import time

    c = claim(["gpu-0"])
    node.add(c)
    d = node.driver()
    with open(node.plugin_dir / "pu.lock") as other:  # another plugin process holds the lock, stalled
        fcntl.flock(other, fcntl.LOCK_EX)
        start = time.monotonic()
        result = d.prepare([ref(c)], CallContext(start + 1.5))[_uid(c)]
        assert "deadline exceeded waiting for the node's device lock" in result.error
        assert result.failure is not None and result.failure.kind is FailureKind.LOCK_TIMEOUT
        assert time.monotonic() - start < 1.5 and node.cdi_files() == []
    assert d.prepare([ref(c)], CallContext(time.monotonic() + 5))[_uid(c)].error == ""


def test_start_up_switches_off_a_mig_mode_a_crash_left_on(node: Node) -> None:
    """Killed between destroying the last partition and switching MIG off: the next start finishes the job."""
    node.sim.nvmlInit()
    node.sim.nvmlDeviceSetMigMode(node.sim.nvmlDeviceGetHandleByIndex(3), pynvml.NVML_DEVICE_MIG_ENABLE)
    node.driver()
    assert node.sim.store.read().gpus[3].mig_current == 0
