"""Prepares read DeviceClasses from a watch, and hold the device lock only for device changes."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from dra_driver.api.claim import ResourceClaim
from dra_driver.api.deviceclass import DeviceClass
from dra_driver.claimstate import checkpoint as checkpoint_module
from dra_driver.claimstate.checkpoint import Checkpoint, CheckpointedDevice, ClaimEntry, ClaimState, MpsRecord
from dra_driver.claimstate.context import CallContext
from dra_driver.plugin import driver as driver_module
from dra_driver.plugin.claims import KubeClaimSource
from dra_driver.plugin.class_cache import CachedClassSource, DeviceClassCache, KubeClassWatch
from dra_driver.plugin.driver import Driver, PluginSettings
from dra_driver.plugin.failures import FailureKind
from dra_driver.plugin.types import ClaimRef
from dra_driver.simulator.nvml import SimulatedNvml
from tests.plugin_helpers import DRIVER, GPU_CLASS, Node, claim, ref
from tests.test_publisher import api_client


def _wait(cond: Any, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.02)


class _Counting:
    """A ClaimSource wrapper that counts the reads that reach the API server."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.claim_gets = 0
        self.class_gets = 0

    def get_claim(self, namespace: str, name: str, *, timeout: float | None = None) -> ResourceClaim:
        self.claim_gets += 1
        got: ResourceClaim = self.inner.get_claim(namespace, name, timeout=timeout)
        return got

    def get_device_class(self, name: str, *, timeout: float | None = None) -> DeviceClass:
        self.class_gets += 1
        got: DeviceClass = self.inner.get_device_class(name, timeout=timeout)
        return got


class _FakeWatch:
    """A list, then watch events pushed by the test; `fail()` breaks the watch."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.cond = threading.Condition()
        self.broken = False
        self.lists = 0

    def list(self) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        if self.broken:
            raise ConnectionError("API server away")
        return list(self.items), "1"

    def watch(self, resource_version: str, stop: threading.Event) -> Iterator[tuple[str, dict[str, Any]]]:
        while not stop.is_set():
            with self.cond:
                self.cond.wait_for(lambda: self.events or self.broken or stop.is_set(), timeout=0.1)
                if self.broken:
                    raise ConnectionError("watch broken")
                pending, self.events = self.events, []
            yield from pending

    def push(self, kind: str, obj: dict[str, Any]) -> None:
        with self.cond:
            self.events.append((kind, obj))
            self.cond.notify_all()

    def fail(self) -> None:
        with self.cond:
            self.broken = True
            self.cond.notify_all()


def _cls(name: str, expression: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expression}}]}}


def test_the_class_cache_follows_the_watch_and_answers_nothing_out_of_sync() -> None:
    fake = _FakeWatch([_cls("a", "true")])
    cache = DeviceClassCache(fake, retry_s=0.05)
    assert cache.get("a") is None  # not listed yet: the caller GETs
    cache.start()
    try:
        _wait(lambda: cache.get("a") is not None)
        fake.push("MODIFIED", _cls("a", "false"))
        _wait(lambda: (c := cache.get("a")) is not None and c.expressions == ["false"])
        fake.push("ADDED", _cls("b", "true"))
        _wait(lambda: cache.get("b") is not None)
        fake.push("DELETED", _cls("b", "true"))
        _wait(lambda: cache.get("b") is None)
        fake.fail()  # a broken watch: nothing is answered from a cache that may be stale
        _wait(lambda: not cache.synced)
        assert cache.get("a") is None
        fake.broken = False  # the API server is back: relisted
        _wait(lambda: cache.get("a") is not None)
        assert fake.lists >= 2
    finally:
        cache.stop()


def test_the_class_cache_is_bounded() -> None:
    fake = _FakeWatch([_cls(f"c{i}", "true") for i in range(5)])
    cache = DeviceClassCache(fake, max_classes=3)
    cache.start()
    try:
        _wait(lambda: cache.synced)
        assert sum(cache.get(f"c{i}") is not None for i in range(5)) == 3
        fake.push("ADDED", _cls("c9", "true"))
        time.sleep(0.3)
        assert cache.get("c9") is None  # over the bound: read with a GET
    finally:
        cache.stop()


def test_prepares_of_one_class_read_it_from_the_cache_and_a_changed_class_rejects(tmp_path: Path) -> None:
    node = Node(tmp_path)
    counting = _Counting(node.source)
    fake = _FakeWatch([GPU_CLASS])
    cache = DeviceClassCache(fake)
    cache.start()
    claims = [claim([f"gpu-{i}"]) for i in range(4)]
    node.add(*claims)
    d = node.driver()
    d.claims = CachedClassSource(counting, cache)
    try:
        _wait(lambda: cache.synced)
        for c in claims[:3]:  # separate prepare calls, as the kubelet makes them
            assert d.prepare([ref(c)])[c["metadata"]["uid"]].error == ""
        assert counting.class_gets == 0 and counting.claim_gets == 3  # the claim is still read (its UID)
        fake.push("MODIFIED", _cls("gpu", "device.attributes['" + DRIVER + "'].type == 'mig'"))
        _wait(lambda: (c := cache.get("gpu")) is not None and "mig" in c.expressions[0])
        err = d.prepare([ref(claims[3])])[claims[3]["metadata"]["uid"]].error
        assert "no longer matches class gpu" in err
    finally:
        cache.stop()
        d.close()


def test_a_claim_is_read_and_rechecked_while_another_prepare_holds_the_device_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(tmp_path)
    c = claim(["gpu-1"], selectors=["device.attributes['" + DRIVER + "'].type == 'gpu'"])
    node.add(c)
    d = node.driver()
    checked = threading.Event()
    real = driver_module.check_selectors

    def check(*args: Any, **kwargs: Any) -> str | None:
        checked.set()
        return real(*args, **kwargs)

    monkeypatch.setattr(driver_module, "check_selectors", check)
    out: dict[str, Any] = {}
    with d._locked():  # another prepare carving a MIG device, say
        t = threading.Thread(target=lambda: out.update(d.prepare([ref(c)], CallContext(time.monotonic() + 60))))
        t.start()
        # before the lock was narrowed, the CEL re-check waited here for the lock
        assert checked.wait(20), "the claim's selector check waited for the device lock"
        assert t.is_alive()  # the device changes do wait
    t.join(60)
    assert out[c["metadata"]["uid"]].error == ""


def test_a_gpus_device_nodes_are_read_while_another_prepare_holds_the_device_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/proc/devices is read for the CDI spec before the lock: three system calls fewer while other prepares
    wait, each a chance for another thread to take the GIL from the lock's holder."""
    node = Node(tmp_path)
    c = claim(["gpu-2"])
    node.add(c)
    d = node.driver()
    read = threading.Event()
    real = driver_module.gpu_nodes

    def nodes(*args: Any) -> Any:
        read.set()
        return real(*args)

    monkeypatch.setattr(driver_module, "gpu_nodes", nodes)
    out: dict[str, Any] = {}
    with d._locked():
        t = threading.Thread(target=lambda: out.update(d.prepare([ref(c)], CallContext(time.monotonic() + 60))))
        t.start()
        assert read.wait(20), "the device nodes were read under the device lock"
        assert t.is_alive()
    t.join(60)
    assert out[c["metadata"]["uid"]].error == ""
    spec = json.loads(d.cdi.path(ref(c).uid).read_text())
    assert "/dev/nvidia2" in [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]


def test_a_prepared_claim_is_answered_even_if_its_class_no_longer_matches(tmp_path: Path) -> None:
    node = Node(tmp_path)
    c = claim(["gpu-1"])
    node.add(c)
    d = node.driver()
    uid = c["metadata"]["uid"]
    first = d.prepare([ref(c)])[uid]
    assert first.error == ""
    node.source.classes["gpu"] = _cls("gpu", "false")  # the class changed under a running container
    assert d.prepare([ref(c)])[uid] == first  # the kubelet's repeat gets the same answer, as before
    other = claim(["gpu-2"])
    node.add(other)
    assert "no longer matches class gpu" in d.prepare([ref(other)])[other["metadata"]["uid"]].error


def test_a_device_rediscovered_during_the_checks_is_refused_under_the_lock(tmp_path: Path) -> None:
    node = Node(tmp_path)
    c = claim(["gpu-1"])
    node.add(c)
    d = node.driver()
    checked = d._check(ResourceClaim.model_validate(c), {"gpu": DeviceClass.model_validate(GPU_CLASS)})
    d.catalog = {**d.catalog, "gpu-1": dataclasses.replace(checked[0].entry, placement_start=7)}
    with d._locked(), pytest.raises(Exception, match="changed while the claim was being prepared"):
        d._plan(checked)


def test_n_prepares_of_one_class_do_no_deviceclass_get_against_a_real_api_server(control_plane, tmp_path: Path) -> None:
    name = "perf-gpu"
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}}
    control_plane.apply({**body, "spec": GPU_CLASS["spec"]})
    pool = "perf-node"
    created = [control_plane.create_allocated(claim([f"gpu-{i}"], device_class=name, pool=pool)) for i in range(4)]
    refs = [ClaimRef(namespace="default", name=c["metadata"]["name"], uid=c["metadata"]["uid"]) for c in created]
    api = api_client(control_plane.kubeconfig)
    counting = _Counting(KubeClaimSource(api))
    cache = DeviceClassCache(KubeClassWatch(api, watch_seconds=5))
    cache.start()
    sim = SimulatedNvml("dgx-h100", tmp_path / "gpu")
    settings = PluginSettings(driver=DRIVER, pool=pool, plugin_dir=tmp_path / "plugin", cdi_root=tmp_path / "cdi")
    d = Driver(
        settings,
        sim,
        CachedClassSource(counting, cache),
        sysfs_root=sim.sysfs_root,
        proc_root=sim.proc_root,
        boot_id="b",
    )
    try:
        _wait(lambda: cache.get(name) is not None)
        for r in refs[:3]:
            assert d.prepare([r])[r.uid].error == ""
        assert counting.class_gets == 0
        # the class narrowed in the API server: the watch brings it, the next prepare is refused
        mig_only = {"selectors": [{"cel": {"expression": f"device.attributes['{DRIVER}'].type == 'mig'"}}]}
        control_plane.apply({**body, "spec": mig_only})
        _wait(lambda: (c := cache.get(name)) is not None and "mig" in c.expressions[0])
        assert f"no longer matches class {name}" in d.prepare([refs[3]])[refs[3].uid].error
        control_plane.delete("deviceclass", name, missing_ok=False, wait=120)
        _wait(lambda: cache.synced and cache.get(name) is None)
        assert f"retrieve device class {name}" in d.prepare([refs[3]])[refs[3].uid].error  # a GET: not found
        assert counting.class_gets == 1
    finally:
        cache.stop()
        d.unprepare(refs)
        d.close()
        for c in created:
            control_plane.delete("resourceclaim", c["metadata"]["name"], missing_ok=False)
        control_plane.delete("deviceclass", name, wait=120)


def test_a_plugin_process_reads_the_checkpoint_again_only_when_the_other_one_wrote_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two plugin processes on one node (a rolling update) share the checkpoint: each sees the other's claims, and
    neither parses the file again when nobody else wrote it."""
    node = Node(tmp_path)
    a, b = node.driver(), node.driver()
    x, y = claim(["gpu-1"]), claim(["gpu-1"])
    node.add(x, y)
    assert not a.prepare([ref(x)])[ref(x).uid].error
    assert "which claim" in b.prepare([ref(y)])[ref(y).uid].error  # b read a's write: gpu-1 is held
    loads = []
    original = Checkpoint._load
    monkeypatch.setattr(Checkpoint, "_load", lambda self: loads.append(1) or original(self))
    a.prepare([ref(x)])  # idempotent, a's own file: not read again
    assert loads == []
    assert a.unprepare([ref(x)]) == {ref(x).uid: None}
    assert not b.prepare([ref(y)])[ref(y).uid].error  # b reads a's unprepare
    assert loads == [1]


def test_a_checkpoint_write_that_failed_is_not_kept_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk fails a prepare's checkpoint writes and its undo's: what the plugin remembers is what the disk
    says, so once space is back the GPU is free for the next claim."""
    node = Node(tmp_path)
    d = node.driver()
    x, y, other = claim(["gpu-1"]), claim(["gpu-1"]), claim(["gpu-2"])
    node.add(x, y, other)
    assert not d.prepare([ref(other)])[ref(other).uid].error  # the checkpoint file exists
    real_replace = checkpoint_module.os.replace
    full = [True]

    def replace(src: Any, dst: Any) -> None:
        if full[0] and str(dst).endswith("checkpoint.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint_module.os, "replace", replace)
    result = d.prepare([ref(x)])[ref(x).uid]
    assert "No space left" in result.error
    assert result.failure is not None and result.failure.kind is FailureKind.IO
    full[0] = False
    assert not d.prepare([ref(y)])[ref(y).uid].error
    assert set(json.loads(d.checkpoint.path.read_text())["data"]["claims"]) == {ref(other).uid, ref(y).uid}


def test_checkpoint_saves_never_rename_over_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ext4 writes a file renamed over another back at once (auto_da_alloc): at every save on the node's
    disk, under the device lock. Saves unlink the old file first (the crash window: test_plugin_crash_safety)."""
    node = Node(tmp_path)
    d = node.driver()
    x, y = claim(["gpu-1"]), claim(["gpu-2"])
    node.add(x, y)
    real_replace = checkpoint_module.os.replace
    over: list[bool] = []

    def replace(src: Any, dst: Any) -> None:
        over.append(Path(dst).exists())
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint_module.os, "replace", replace)
    for c in (x, y):
        assert not d.prepare([ref(c)])[ref(c).uid].error
    assert d.unprepare([ref(x), ref(y)]) == {ref(x).uid: None, ref(y).uid: None}
    assert len(over) >= 4 and not any(over)


def _checked_claims(path: Path) -> dict[str, Any]:
    """The claims of the checkpoint file at `path`, its checksum verified as a start-up would."""
    data = checkpoint_module._decode(path, path.read_bytes())
    claims: dict[str, Any] = data["claims"]
    return claims


def test_a_save_encodes_only_the_claims_that_changed_since_the_last_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 8 claims prepared, encoding every claim at every save was most of a save's CPU, under the node lock."""
    node = Node(tmp_path)
    d = node.driver()
    claims = [claim([f"gpu-{i}"]) for i in range(8)]
    node.add(*claims)
    for c in claims[:7]:
        assert not d.prepare([ref(c)])[ref(c).uid].error
    real = checkpoint_module._canonical
    encoded: list[Any] = []

    def canonical(data: Any) -> bytes:
        encoded.append(data)
        return real(data)

    monkeypatch.setattr(checkpoint_module, "_canonical", canonical)
    assert not d.prepare([ref(claims[7])])[ref(claims[7]).uid].error
    entries = [e for e in encoded if isinstance(e, dict) and "uid" in e]
    # two saves (PrepareStarted, PrepareCompleted of a whole GPU), each encoding that claim only
    assert [e["uid"] for e in entries] == [ref(claims[7]).uid] * 2
    assert not any(isinstance(e, dict) and "claims" in e for e in encoded)  # never the whole data again
    assert set(_checked_claims(d.checkpoint.path)) == {ref(c).uid for c in claims}


def test_each_claim_is_written_as_it_was_when_last_put(tmp_path: Path) -> None:
    """A write re-encodes only the claim put (the driver puts the claim it changed, after each change); `save`
    writes every claim as it is now. Records are immutable: a change is a new record, written when it is put, so
    a write of one claim never carries (or loses) an unwritten change of another. The file is always a valid
    checkpoint of what was recorded."""
    path = tmp_path / "checkpoint.json"
    cp = Checkpoint(path, "boot")
    devices = [CheckpointedDevice(pool="n", device="gpu-0", sharing=MpsRecord(dir="/d", uuid="GPU-0"))]
    one = ClaimEntry(uid="u1", namespace="ns", name="ünï", state=ClaimState.PREPARE_STARTED, devices=devices)
    two = ClaimEntry.model_validate({"uid": "u2", "namespace": "ns", "name": "b", "state": "PrepareCompleted",
                                     "devices": [{"pool": "n", "device": "gpu-1", "future": {"x": 1}}]})  # fmt: skip
    cp.put(one)
    cp.put(two)
    assert one.devices[0].sharing is not None
    with pytest.raises(ValidationError):
        one.devices[0].sharing.applied = True  # type: ignore[misc]  # in place: refused
    applied = one.with_device(0, sharing=one.devices[0].sharing.model_copy(update={"applied": True}))
    cp.put(two)
    assert _checked_claims(path)["u1"]["devices"][0]["sharing"]["applied"] is False  # not put since
    cp.put(applied)
    assert _checked_claims(path)["u1"]["devices"][0]["sharing"]["applied"] is True
    cp.data.claims["u1"] = applied.with_state(ClaimState.PREPARE_COMPLETED).with_devices(released=True)
    cp.save()
    saved = _checked_claims(path)
    assert saved["u1"]["state"] == "PrepareCompleted" and saved["u1"]["devices"][0]["released"] is True
    assert saved["u2"]["devices"][0]["future"] == {"x": 1}  # a newer driver's field, kept
    cp.drop("u1")
    assert set(_checked_claims(path)) == {"u2"}
    again = Checkpoint(path, "boot")
    assert again.claims["u2"] == two
    again.put(ClaimEntry(uid="u3", namespace="ns", name="c", state=ClaimState.PREPARE_STARTED))
    for cp_ in (cp, again):  # each the canonical encoding of all it recorded, as a full encoding would have it
        cp_.refresh()
        expected = checkpoint_module._canonical(cp_.data.model_dump(mode="json"))
        assert json.loads(path.read_bytes())["data"] == json.loads(expected)
        assert hashlib.sha256(expected).hexdigest() == json.loads(path.read_bytes())["checksum"]
