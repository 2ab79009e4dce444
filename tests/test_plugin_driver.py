"""The plugin core: prepare/unprepare with MIG carving, CDI specs, checkpoint, recovery, concurrency."""

from __future__ import annotations

import contextlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dra_driver.cdi.spec import spec_file_name
from dra_driver.claimstate.checkpoint import CheckpointCorruptError, ClaimState
from dra_driver.plugin import driver as driver_module
from dra_driver.plugin import machine
from dra_driver.plugin.failures import FailureKind
from dra_driver.simulator.procfs import ci_cap_minor, gi_cap_minor
from dra_driver.slices.devices import PublishMode
from tests.plugin_helpers import DRIVER, Node, claim, ref

CONFIG_API = "gpu.resource.dra-driver.dev/v1alpha1"


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def _spec(node: Node, uid: str) -> dict:
    return json.loads((node.cdi_root / spec_file_name(DRIVER, uid)).read_text())


def test_prepare_whole_gpu_writes_cdi_spec_and_is_idempotent(node: Node) -> None:
    c = claim(["gpu-3"])
    node.add(c)
    d = node.driver()
    uid = c["metadata"]["uid"]
    (result,) = d.prepare([ref(c)]).values()
    assert result.error == ""
    (dev,) = result.devices
    assert dev.device == "gpu-3" and dev.pool == "node-a" and dev.requests == ["r0"]
    assert dev.cdi_device_ids == [f"k8s.{DRIVER}/claim={uid}-gpu-3"]
    spec = _spec(node, uid)
    assert spec["kind"] == f"k8s.{DRIVER}/claim"
    assert spec["devices"][0]["name"] == f"{uid}-gpu-3"
    paths = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert paths == ["/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert spec["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={d.inventory.gpu_by_minor(3).uuid}"]
    assert d.checkpoint.claims[uid].state is ClaimState.PREPARE_COMPLETED
    mtime = (node.cdi_root / spec_file_name(DRIVER, uid)).stat().st_mtime_ns
    again = d.prepare([ref(c)])[uid]
    assert again == result
    assert (node.cdi_root / spec_file_name(DRIVER, uid)).stat().st_mtime_ns == mtime


def _admin_mig(node: Node, gpu: int = 0, profile_id: int = 19, start: int = 0) -> str:
    """A 1g MIG device an admin made (as `static` publishes them): its UUID."""
    from tests.simhelpers import create_full_ci, create_gi

    sim = node.sim
    sim.nvmlInit()
    handle = sim.nvmlDeviceGetHandleByIndex(gpu)
    sim.nvmlDeviceSetMigMode(handle, 1)
    gi = create_gi(sim, handle, profile_id, start, 1)
    ci = create_full_ci(sim, gi, 1)
    return str(sim.nvmlDeviceGetUUID(sim.nvmlComputeInstanceGetInfo(ci).device))


def test_an_admins_mig_device_is_used_as_it_is_in_static_mode_and_left_on_unprepare(node: Node) -> None:
    from dra_driver.slices.devices import PublishMode

    uuid = _admin_mig(node)
    c = claim(["gpu-0-mig-1g10gb-19-0"], device_class="mig")
    node.add(c)
    d = node.driver(mode=PublishMode.STATIC)
    uid = c["metadata"]["uid"]
    assert d.prepare([ref(c)])[uid].error == ""
    spec = _spec(node, uid)
    assert spec["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={uuid}"]
    caps = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"] if "nvidia-caps" in n["path"]]
    assert len(caps) == 2  # its GPU instance's and compute instance's capability nodes
    assert d.checkpoint.claims[uid].devices[0].mig is None  # not the driver's: nothing to destroy
    assert d.unprepare([ref(c)]) == {uid: None}
    assert node.mig_instances() == [(0, 19, 0)]  # still there, as the admin made it


def test_an_admins_mig_device_replaced_since_discovery_is_refused(node: Node) -> None:
    from dra_driver.nvml.mig import destroy_at
    from dra_driver.slices.devices import PublishMode

    _admin_mig(node)
    c = claim(["gpu-0-mig-1g10gb-19-0"], device_class="mig")
    node.add(c)
    d = node.driver(mode=PublishMode.STATIC)
    destroy_at(node.sim, d.inventory.gpu_by_minor(0).uuid, 19, 0)
    _admin_mig(node)  # the same placement again: another UUID
    result = d.prepare([ref(c)])[c["metadata"]["uid"]]
    error = result.error
    assert "gpu-0-mig-1g10gb-19-0" in error and "no longer exists" in error, error
    assert result.failure is not None and result.failure.kind is FailureKind.DEVICE_UNKNOWN
    assert not result.failure.retryable
    assert node.cdi_files() == []


def test_mig_partition_is_carved_and_destroyed(node: Node) -> None:
    c = claim(["gpu-2-mig-3g40gb-9-4"], device_class="mig")
    node.add(c)
    d = node.driver()
    uid = c["metadata"]["uid"]
    assert d.prepare([ref(c)])[uid].error == ""
    assert node.mig_instances() == [(2, 9, 4)]
    live = d.checkpoint.claims[uid].devices[0].mig
    assert live is not None and live.uuid.startswith("MIG-")
    spec = _spec(node, uid)
    nodes = {n["path"]: n for n in spec["devices"][0]["containerEdits"]["deviceNodes"]}
    gi_node = f"/dev/nvidia-caps/nvidia-cap{gi_cap_minor(2, live.gi_id)}"
    ci_node = f"/dev/nvidia-caps/nvidia-cap{ci_cap_minor(2, live.gi_id, live.ci_id)}"
    assert {"/dev/nvidia2", gi_node, ci_node} <= set(nodes)
    assert nodes[gi_node]["type"] == "c" and nodes[gi_node]["major"] == 511
    assert spec["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={live.uuid}"]
    assert d.unprepare([ref(c)]) == {uid: None}
    assert node.mig_instances() == []
    assert node.sim.store.read().gpus[2].mig_current == 0  # Hopper: MIG switched off again
    assert node.cdi_files() == [] and uid not in d.checkpoint.claims


def test_unknown_claim_unprepare_is_a_no_op_success(node: Node) -> None:
    c = claim(["gpu-0"])
    assert node.driver().unprepare([ref(c)]) == {c["metadata"]["uid"]: None}


def _assert_nothing_changed(node: Node, d: driver_module.Driver) -> None:
    assert node.mig_instances() == [] and node.cdi_files() == [] and d.checkpoint.claims == {}


@pytest.mark.parametrize(
    ("devices", "kwargs", "message", "kind"),
    [
        (["gpu-9"], {}, "device gpu-9 is not a device of this node", FailureKind.DEVICE_UNKNOWN),
        (["gpu-0-mig-3g40gb-9-2"], {"device_class": "mig"}, "not a device of this node", FailureKind.DEVICE_UNKNOWN),
        (["gpu-0"], {"pool": "node-b"}, "allocated from pool node-b, not this node's", FailureKind.DEVICE_UNKNOWN),
        (["gpu-0", "gpu-0-mig-1g10gb-19-3"], {}, "overlap", FailureKind.DEVICE_IN_USE),
        (
            ["gpu-0"],
            {"selectors": ["device.attributes['gpu.dra-driver.dev'].productName.startsWith('NVIDIA A100')"]},
            "no longer matches claim request r0: selector #0",
            FailureKind.SELECTOR_MISMATCH,
        ),
        (["gpu-0"], {"device_class": "mig"}, "no longer matches class mig: selector #0", FailureKind.SELECTOR_MISMATCH),
        (
            ["gpu-0"],
            {"selectors": ["device.attributes['gpu.dra-driver.dev'].nope == 1"]},
            "no such key",
            FailureKind.SELECTOR_MISMATCH,
        ),
        (["gpu-0"], {"device_class": "missing"}, "device class missing", FailureKind.NOT_FOUND),
        (
            ["gpu-0"],
            {
                "config": [
                    {
                        "source": "FromClaim",
                        "requests": [],
                        "opaque": {
                            "driver": DRIVER,
                            "parameters": {
                                "apiVersion": CONFIG_API,
                                "kind": "GpuConfig",
                                "sharing": {"strategy": "Sometimes"},
                            },
                        },
                    }
                ]
            },
            "invalid GpuConfig: sharing.strategy",
            FailureKind.INVALID_CONFIG,
        ),
        (
            ["gpu-0"],
            {
                "config": [
                    {
                        "source": "FromClaim",
                        "requests": [],
                        "opaque": {
                            "driver": DRIVER,
                            "parameters": {"apiVersion": CONFIG_API, "kind": "GpuConfig", "extra": 1},
                        },
                    }
                ]
            },
            "extra: Extra inputs are not permitted",
            FailureKind.INVALID_CONFIG,
        ),
        (
            ["gpu-0-mig-1g10gb-19-0"],
            {
                "device_class": "mig",
                "config": [
                    {
                        "source": "FromClass",
                        "requests": ["r0"],  # named: a claim-wide one skips MIG devices
                        "opaque": {"driver": DRIVER, "parameters": {"apiVersion": CONFIG_API, "kind": "GpuConfig"}},
                    }
                ],
            },
            "a GpuConfig cannot configure a mig device",
            FailureKind.INVALID_CONFIG,
        ),
        (
            ["gpu-0"],
            {
                "config": [
                    {
                        "source": "FromClaim",
                        "requests": [],
                        "opaque": {"driver": DRIVER, "parameters": {"apiVersion": "v9", "kind": "GpuConfig"}},
                    }
                ]
            },
            "unsupported apiVersion 'v9'",
            FailureKind.INVALID_CONFIG,
        ),
    ],
)
def test_bad_claims_get_a_clear_error_and_change_nothing(node: Node, devices, kwargs, message, kind) -> None:
    c = claim(devices, **kwargs)
    node.add(c)
    d = node.driver()
    result = d.prepare([ref(c)])[c["metadata"]["uid"]]
    assert message in result.error and result.devices == []
    # what the claim or its class says: the kubelet's retry gets the same answer
    assert result.failure is not None and result.failure.kind is kind and not result.failure.retryable
    _assert_nothing_changed(node, d)


def test_claim_level_errors(node: Node) -> None:
    d = node.driver()
    ghost = claim(["gpu-0"])
    missing = d.prepare([ref(ghost)])[ghost["metadata"]["uid"]]
    assert "retrieve claim default/" in missing.error
    assert missing.failure is not None and missing.failure.kind is FailureKind.NOT_FOUND
    replaced = claim(["gpu-0"])
    node.add(replaced)
    stale = ref(replaced).model_copy(update={"uid": "old-uid"})
    got = d.prepare([stale])["old-uid"]
    assert "got replaced" in got.error
    assert got.failure is not None and got.failure.kind is FailureKind.CLAIM_CHANGED
    unallocated = claim(["gpu-0"])
    unallocated["status"] = {}
    node.add(unallocated)
    got = d.prepare([ref(unallocated)])[unallocated["metadata"]["uid"]]
    assert "not allocated" in got.error
    assert got.failure is not None and got.failure.kind is FailureKind.CLAIM_CHANGED and not got.failure.retryable
    _assert_nothing_changed(node, d)


@pytest.mark.parametrize(
    ("read", "message"), [("get_claim", "retrieve claim default/"), ("get_device_class", "retrieve device class gpu")]
)
def test_api_server_down_is_a_per_claim_error(node: Node, monkeypatch, read: str, message: str) -> None:
    c = claim(["gpu-0"])
    node.add(c)
    d = node.driver()

    def down(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise ConnectionRefusedError("connection refused")

    monkeypatch.setattr(node.source, read, down)
    result = d.prepare([ref(c)])[c["metadata"]["uid"]]
    assert "connection refused" in result.error and message in result.error
    assert result.failure is not None and result.failure.kind is FailureKind.API_UNAVAILABLE
    assert result.failure.retryable
    _assert_nothing_changed(node, d)


def test_a_result_naming_no_request_of_the_claim_is_refused(node: Node) -> None:
    c = claim(["gpu-0"])
    c["status"]["allocation"]["devices"]["results"][0]["request"] = "gone"
    node.add(c)
    d = node.driver()
    result = d.prepare([ref(c)])[c["metadata"]["uid"]]
    assert "has no request 'gone'" in result.error
    assert result.failure is not None and result.failure.kind is FailureKind.CLAIM_CHANGED
    _assert_nothing_changed(node, d)


def test_a_node_without_the_nvidia_device_nodes_fails_the_claim(node: Node) -> None:
    c = claim(["gpu-0"])
    node.add(c)
    d = node.driver()
    (node.sim.proc_root / "devices").write_text("Character devices:\n  1 mem\n\nBlock devices:\n  8 sd\n")
    result = d.prepare([ref(c)])[c["metadata"]["uid"]]
    assert "is the NVIDIA driver loaded?" in result.error
    assert result.failure is not None and result.failure.kind is FailureKind.CDI and result.failure.retryable
    _assert_nothing_changed(node, d)


def test_a_bug_is_an_internal_failure_of_that_claim_logged_with_its_traceback(
    node: Node, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    c = claim(["gpu-0"])
    node.add(c)
    d = node.driver()

    def bug(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise ValueError("a bug")

    monkeypatch.setattr(machine, "claim_spec", bug)
    with caplog.at_level("WARNING", logger=driver_module.__name__):
        result = d.prepare([ref(c)])[c["metadata"]["uid"]]
    assert result.error == "ValueError: a bug"
    assert result.failure is not None and result.failure.kind is FailureKind.INTERNAL and not result.failure.retryable
    (record,) = [r for r in caplog.records if c["metadata"]["uid"] in r.getMessage()]
    assert record.levelname == "ERROR" and record.exc_info is not None
    assert "failed [internal, not retryable]: ValueError: a bug" in record.getMessage()
    _assert_nothing_changed(node, d)


def test_a_device_held_by_another_claim_is_refused(node: Node) -> None:
    first, second = (
        claim(["gpu-1-mig-3g40gb-9-0"], device_class="mig"),
        claim(["gpu-1-mig-4g40gb-5-0"], device_class="mig"),
    )
    whole = claim(["gpu-1"])
    node.add(first, second, whole)
    d = node.driver()
    assert d.prepare([ref(first)])[first["metadata"]["uid"]].error == ""
    assert "which claim" in d.prepare([ref(second)])[second["metadata"]["uid"]].error
    held = d.prepare([ref(whole)])[whole["metadata"]["uid"]]
    assert "which claim" in held.error
    assert held.failure is not None and held.failure.kind is FailureKind.DEVICE_IN_USE and held.failure.retryable
    assert node.mig_instances() == [(1, 9, 0)]


def test_a_partition_taken_outside_the_driver_is_reported(node: Node) -> None:
    from tests.simhelpers import create_gi

    d = node.driver()
    dev = node.sim.nvmlDeviceGetHandleByIndex(4)
    node.sim.nvmlDeviceSetMigMode(dev, 1)
    create_gi(node.sim, dev, 19, 5, 1)  # someone else carves a 1g at slice 5
    c = claim(["gpu-4-mig-2g20gb-14-4"], device_class="mig")
    node.add(c)
    result = d.prepare([ref(c)])[c["metadata"]["uid"]]
    assert "NVML_ERROR_INSUFFICIENT_RESOURCES" in result.error
    assert result.failure is not None and result.failure.kind is FailureKind.MIG
    assert node.mig_instances() == [(4, 19, 5)] and c["metadata"]["uid"] not in d.checkpoint.claims


def test_recovery_after_a_crash_in_the_middle_of_prepare(node: Node, monkeypatch) -> None:
    c = claim(["gpu-5-mig-1g10gb-19-6", "gpu-5-mig-2g20gb-14-0"], device_class="mig")
    node.add(c)
    d = node.driver()

    class Killed(BaseException):  # like SIGKILL: no except-block runs
        pass

    def crash(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise Killed

    monkeypatch.setattr(machine, "claim_spec", crash)
    with pytest.raises(Killed):
        d.prepare([ref(c)])
    assert len(node.mig_instances()) == 2  # carved, then the process died
    assert d.checkpoint.claims[c["metadata"]["uid"]].state is ClaimState.PREPARE_STARTED
    monkeypatch.undo()
    restarted = node.driver()  # a new process: recovery runs at start
    _assert_nothing_changed(node, restarted)
    assert node.sim.store.read().gpus[5].mig_current == 0
    assert restarted.prepare([ref(c)])[c["metadata"]["uid"]].error == ""  # the kubelet's retry succeeds


def test_recovery_destroys_instances_and_specs_nobody_owns(node: Node) -> None:
    from tests.simhelpers import create_full_ci, create_gi

    kept = claim(["gpu-6-mig-3g40gb-9-4"], device_class="mig")
    node.add(kept)
    node.driver().prepare([ref(kept)])
    dev = node.sim.nvmlDeviceGetHandleByIndex(6)
    create_full_ci(node.sim, create_gi(node.sim, dev, 14, 0, 2), 2)  # orphan: created, never recorded
    create_gi(node.sim, dev, 19, 2, 1)  # orphan GPU instance without compute instance
    (node.cdi_root / spec_file_name(DRIVER, "orphan-uid")).write_text("{}")
    d = node.driver()
    assert node.mig_instances() == [(6, 9, 4)]
    assert node.cdi_files() == [spec_file_name(DRIVER, kept["metadata"]["uid"])]
    assert d.checkpoint.claims[kept["metadata"]["uid"]].state is ClaimState.PREPARE_COMPLETED


def test_corrupt_checkpoint_is_reported_and_left_alone(node: Node) -> None:
    c = claim(["gpu-0"])
    node.add(c)
    node.driver().prepare([ref(c)])
    path = node.plugin_dir / "checkpoint.json"
    doc = json.loads(path.read_text())
    doc["data"]["claims"][c["metadata"]["uid"]]["name"] = "tampered"
    path.write_text(json.dumps(doc))
    before = path.read_bytes()
    with pytest.raises(CheckpointCorruptError, match="fails its checksum"):
        node.driver()
    path.write_text("{not json")
    with pytest.raises(CheckpointCorruptError, match="not a valid checkpoint file"):
        node.driver()
    assert before != path.read_bytes()  # we wrote the second corruption ourselves; the driver wrote nothing
    assert path.read_text() == "{not json"


def test_checkpoint_decoding_is_lenient_about_new_fields(node: Node) -> None:
    import hashlib

    c = claim(["gpu-0"])
    node.add(c)
    node.driver().prepare([ref(c)])
    path = node.plugin_dir / "checkpoint.json"
    doc = json.loads(path.read_text())
    doc["data"]["futureField"] = {"x": 1}
    doc["data"]["claims"][c["metadata"]["uid"]]["alsoNew"] = True
    doc["checksum"] = hashlib.sha256(
        json.dumps(doc["data"], sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    path.write_text(json.dumps(doc))
    assert c["metadata"]["uid"] in node.driver().checkpoint.claims


def test_a_reboot_forgets_prepared_claims(node: Node) -> None:
    c = claim(["gpu-0"])
    node.add(c)
    node.driver(boot_id="boot-1").prepare([ref(c)])
    assert node.driver(boot_id="boot-2").checkpoint.claims == {}


def test_class_then_claim_config_precedence(node: Node) -> None:
    from dra_driver.api.claim import DeviceAllocationConfiguration
    from dra_driver.claimstate.config import resolve

    def cfg(source: str, interval: str, requests: list[str] | None = None) -> DeviceAllocationConfiguration:
        return DeviceAllocationConfiguration.model_validate(
            {
                "source": source,
                "requests": requests or [],
                "opaque": {
                    "driver": DRIVER,
                    "parameters": {
                        "apiVersion": CONFIG_API,
                        "kind": "GpuConfig",
                        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
                    },
                },
            }
        )

    configs = [cfg("FromClaim", "Long"), cfg("FromClass", "Short"), cfg("FromClaim", "Medium", ["other"])]
    chosen = resolve(configs, DRIVER, "gpu", "gpu")
    assert chosen is not None and chosen.sharing is not None and chosen.sharing.time_slicing_config is not None
    assert chosen.sharing.time_slicing_config.interval == "Long"  # the claim's, applied after the class's
    assert resolve(configs[1:2] + configs[2:], DRIVER, "other/sub", "gpu").sharing.time_slicing_config.interval == (
        "Medium"
    )


def _gpu_config(kind: str = "GpuConfig", requests: list[str] | None = None, sharing: object = None) -> dict:
    parameters: dict = {"apiVersion": CONFIG_API, "kind": kind}
    if sharing is not None:
        parameters["sharing"] = sharing
    return {"source": "FromClaim", "requests": requests or [], "opaque": {"driver": DRIVER, "parameters": parameters}}


def test_a_claim_wide_config_applies_to_its_own_kind_of_device_only(node: Node) -> None:
    """NVIDIA's precedence: a config without requests configures the devices of its kind; a claim with a whole
    GPU and a MIG partition and one claim-wide GpuConfig is prepared, the GpuConfig on the GPU only."""
    from dra_driver.api.claim import DeviceAllocationConfiguration
    from dra_driver.claimstate.config import resolve

    time_slicing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
    configs = [DeviceAllocationConfiguration.model_validate(_gpu_config(sharing=time_slicing))]
    assert resolve(configs, DRIVER, "r1", "mig") is None
    chosen = resolve(configs, DRIVER, "r0", "gpu")
    assert chosen is not None and chosen.kind == "GpuConfig"
    mig_wide = [
        DeviceAllocationConfiguration.model_validate(_gpu_config("MigDeviceConfig", sharing={"strategy": "MPS"}))
    ]
    assert resolve(mig_wide, DRIVER, "r0", "gpu") is None

    c = claim(["gpu-1", "gpu-0-mig-1g10gb-19-0"], config=[_gpu_config()])
    c["spec"]["devices"]["requests"][1]["exactly"]["deviceClassName"] = "mig"
    node.add(c)
    result = node.driver().prepare([ref(c)])[c["metadata"]["uid"]]
    assert not result.error, result.error
    assert sorted(d.device for d in result.devices) == ["gpu-0-mig-1g10gb-19-0", "gpu-1"]


def test_a_config_naming_a_request_of_the_other_kind_is_still_an_error(node: Node) -> None:
    c = claim(["gpu-1", "gpu-0-mig-1g10gb-19-0"], config=[_gpu_config("MigDeviceConfig", requests=["r0"])])
    c["spec"]["devices"]["requests"][1]["exactly"]["deviceClassName"] = "mig"
    node.add(c)
    d = node.driver()
    result = d.prepare([ref(c)])[c["metadata"]["uid"]]
    assert "a MigDeviceConfig cannot configure a gpu device (use GpuConfig)" in (result.error or "")
    _assert_nothing_changed(node, d)


def test_an_invalid_claim_wide_config_fails_even_where_it_would_not_apply(node: Node) -> None:
    c = claim(["gpu-0-mig-1g10gb-19-0"], device_class="mig", config=[_gpu_config(sharing={"strategy": "Often"})])
    node.add(c)
    result = node.driver().prepare([ref(c)])[c["metadata"]["uid"]]
    assert "invalid GpuConfig: sharing.strategy" in (result.error or "")


def test_one_hundred_concurrent_prepares_leave_a_consistent_state(node: Node) -> None:
    """Claims race for 1g/2g partitions and whole GPUs; whatever wins, the GPU state, the checkpoint and the
    CDI specs must agree and no two prepared claims may overlap."""
    d = node.driver()
    candidates = [f"gpu-{g}-mig-1g10gb-19-{s}" for g in range(4) for s in range(7)]
    candidates += [f"gpu-{g}-mig-2g20gb-14-{s}" for g in range(4) for s in (0, 2, 4)] + ["gpu-6", "gpu-7"]
    claims = [
        claim(
            [candidates[i % len(candidates)]], device_class="mig" if "mig" in candidates[i % len(candidates)] else "gpu"
        )
        for i in range(100)
    ]
    node.add(*claims)
    barrier = threading.Barrier(16)

    def go(c):  # type: ignore[no-untyped-def]
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=5)
        return d.prepare([ref(c)])[c["metadata"]["uid"]]

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(go, claims))
    ok = [c for c, r in zip(claims, results, strict=True) if not r.error]
    assert ok and len(ok) < 100
    assert all(
        r.error and ("overlap" in r.error or "held" in r.error or "which claim" in r.error) for r in results if r.error
    )
    held = [d.catalog[c["status"]["allocation"]["devices"]["results"][0]["device"]] for c in ok]
    from dra_driver.plugin.catalog import conflicts

    assert not any(conflicts(a, b) for i, a in enumerate(held) for b in held[i + 1 :])
    completed = {uid for uid, e in d.checkpoint.claims.items() if e.state is ClaimState.PREPARE_COMPLETED}
    assert completed == {c["metadata"]["uid"] for c in ok} == set(d.checkpoint.claims)
    assert node.cdi_files() == sorted(spec_file_name(DRIVER, uid) for uid in completed)
    migs = sorted((int(h.name.split("-")[1]), h.profile.id, h.placement_start) for h in held if h.profile)
    assert node.mig_instances() == migs
    assert all(e is None for e in d.unprepare([ref(c) for c in ok]).values())
    assert node.mig_instances() == [] and node.cdi_files() == [] and d.checkpoint.claims == {}


def test_ampere_partitions_on_a_mig_enabled_a100(tmp_path: Path) -> None:
    node = Node(tmp_path, "mixed")
    c = claim(["gpu-1-mig-3g40gb-9-4"], device_class="mig")  # minor 1 = NVML index 0, MIG already on
    whole_ampere = claim(["gpu-0"])  # MIG off A100: whole GPU
    not_published = claim(["gpu-1"])  # an A100 with MIG on is not offered whole
    node.add(c, whole_ampere, not_published)
    d = node.driver()
    assert "not a device of this node" in d.prepare([ref(not_published)])[not_published["metadata"]["uid"]].error
    assert d.prepare([ref(c)])[c["metadata"]["uid"]].error == ""
    assert node.mig_instances() == [(0, 9, 4)]
    assert d.prepare([ref(whole_ampere)])[whole_ampere["metadata"]["uid"]].error == ""
    d.unprepare([ref(c)])
    assert node.sim.store.read().gpus[0].mig_current == 1  # Ampere: MIG stays on (switching needs a reset)


def test_an_nvml_error_of_one_claim_fails_only_that_claim(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    done, lost, good = claim(["gpu-2"]), claim(["gpu-3"]), claim(["gpu-4"])
    node.add(done, lost, good)
    d = node.driver()
    assert d.prepare([ref(done)])[done["metadata"]["uid"]].error == ""
    node.sim.set_gpu_lost(d.inventory.gpu_by_minor(3).index)  # every NVML call on it: NVMLError_GpuIsLost
    with caplog.at_level("WARNING", logger=driver_module.__name__):
        got = d.prepare([ref(done), ref(lost), ref(good)])
    assert got[done["metadata"]["uid"]].error == "" and got[done["metadata"]["uid"]].devices
    assert got[good["metadata"]["uid"]].error == "" and [x.device for x in got[good["metadata"]["uid"]].devices] == [
        "gpu-4"
    ]
    error = got[lost["metadata"]["uid"]].error
    assert "NVMLError" in error and "GPU is lost" in error, error
    failure = got[lost["metadata"]["uid"]].failure
    assert failure is not None and failure.kind is FailureKind.NVML and not failure.retryable
    (record,) = [r for r in caplog.records if lost["metadata"]["uid"] in r.getMessage()]
    assert record.levelname in ("WARNING", "ERROR") and record.exc_info is not None  # with the traceback
    assert "failed [nvml, not retryable]: NVMLError" in record.getMessage()
    assert lost["metadata"]["uid"] not in d.checkpoint.claims  # rolled back
    assert set(d.checkpoint.claims) == {done["metadata"]["uid"], good["metadata"]["uid"]}


def test_a_whole_gpu_whose_mig_instances_someone_else_made_is_refused_and_may_be_retried(node: Node) -> None:
    """MIG switched on and a partition made outside the driver after it started: the whole GPU cannot be handed
    out until that partition goes (a retry can succeed), and nothing is left behind."""
    c = claim(["gpu-0"])
    node.add(c)
    d = node.driver()
    _admin_mig(node)
    result = d.prepare([ref(c)])[c["metadata"]["uid"]]
    assert "GPU 0 has MIG enabled and cannot be handed out whole" in result.error
    assert result.failure is not None and result.failure.kind is FailureKind.MIG and result.failure.retryable
    assert node.cdi_files() == [] and c["metadata"]["uid"] not in d.checkpoint.claims
    assert node.mig_instances() == [(0, 19, 0)]  # not the driver's to destroy


def test_admin_access_to_a_partition_no_claim_carved_is_refused(node: Node) -> None:
    c = claim(["gpu-2-mig-3g40gb-9-4"], device_class="mig")
    c["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    node.add(c)
    d = node.driver()
    result = d.prepare([ref(c)])[c["metadata"]["uid"]]
    assert "admin access to gpu-2-mig-3g40gb-9-4: no claim has carved that MIG device" in result.error
    assert result.failure is not None and result.failure.kind is FailureKind.MIG
    assert node.mig_instances() == [] and node.cdi_files() == []


def test_a_device_rediscovered_between_its_check_and_the_lock_is_retried(node: Node, monkeypatch) -> None:
    """A rediscovery may replace the catalog while a prepare waits for the device lock: the device the claim was
    checked against is not the one published now, so the prepare stops, changes nothing, and the kubelet retries."""
    import dataclasses

    c = claim(["gpu-1"])
    node.add(c)
    d = node.driver()
    checked = driver_module.Driver._check

    def check_then_rediscover(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = checked(self, *args, **kwargs)
        self.catalog = {**self.catalog, "gpu-1": dataclasses.replace(self.catalog["gpu-1"], device_json=b"{}")}
        return out

    monkeypatch.setattr(driver_module.Driver, "_check", check_then_rediscover)
    result = d.prepare([ref(c)])[c["metadata"]["uid"]]
    assert "device gpu-1 changed while the claim was being prepared; retry" in result.error
    assert result.failure is not None and result.failure.kind is FailureKind.DEVICE_UNKNOWN
    assert result.failure.retryable and node.cdi_files() == []


def test_a_partition_of_a_profile_left_out_is_unknown_and_a_change_that_leaves_out_a_carved_one_waits(
    node: Node,
) -> None:
    """With an allowlist of MIG profiles the node neither publishes nor prepares another profile's partitions; a
    reconfiguration whose list leaves out a partition a claim holds is refused until that claim is gone."""
    d = node.driver(mig_profiles=frozenset({"1g.10gb", "3g.40gb"}))
    other = claim(["gpu-1-mig-2g20gb-14-0"], device_class="mig")
    node.add(other)
    result = d.prepare([ref(other)])[other["metadata"]["uid"]]
    assert result.failure is not None and result.failure.kind is FailureKind.DEVICE_UNKNOWN, result
    assert node.mig_instances() == [] and node.cdi_files() == []
    held = claim(["gpu-2-mig-3g40gb-9-4"], device_class="mig")
    node.add(held)
    assert d.prepare([ref(held)])[held["metadata"]["uid"]].error == ""
    blockers = d.reconfigure(PublishMode.PARTITIONABLE, shared_changes=False, mig_profiles=frozenset({"1g.10gb"}))
    assert blockers == [f"{held['metadata']['namespace']}/{held['metadata']['name']}: gpu-2-mig-3g40gb-9-4"]
    assert d.settings.mig_profiles == frozenset({"1g.10gb", "3g.40gb"})  # nothing changed
    assert d.reconfigure(PublishMode.PARTITIONABLE, shared_changes=False, mig_profiles=None) == []  # a wider list
    assert d.settings.mig_profiles is None and "gpu-1-mig-2g20gb-14-0" in d.catalog
    assert d.unprepare([ref(held)]) == {held["metadata"]["uid"]: None}
    assert node.mig_instances() == []
