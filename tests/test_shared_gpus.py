"""Sharing one GPU between several claims through consumable capacity (`--mode shared`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.allocation.simulate import simulate
from dra_driver.api.slice import CapacityRequestPolicy, DeviceCapacity
from dra_driver.nvml.discovery import discover
from dra_driver.plugin.failures import FailureKind
from dra_driver.slices.builder import PublishMode, SliceLimitError, build_slices
from tests.plugin_helpers import GPU_CLASS, Node, ref


def _claim(name: str, memory: str | None) -> dict:
    exactly: dict = {"deviceClassName": "gpu", "count": 1}
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}  # fmt: skip


def test_shared_gpus_are_published_with_a_memory_request_policy(sim_factory) -> None:
    sim = sim_factory("dgx-h100")
    slices = build_slices(discover(sim, sim.sysfs_root), node_name="n", mode=PublishMode.SHARED)
    devices = [d for s in slices for d in s.spec.devices or []]
    assert len(devices) == 8 and all(d.allow_multiple_allocations for d in devices)
    memory = devices[0].capacity["memory"]
    assert memory.value == "81559Mi" and memory.request_policy is not None
    assert memory.request_policy.default == "81559Mi"  # a claim that asks for nothing gets the whole GPU
    assert memory.request_policy.valid_range is not None and memory.request_policy.valid_range.min == "1Gi"


def test_a_request_policy_without_multiple_allocations_is_refused(sim_factory, monkeypatch) -> None:
    from dra_driver.slices import devices as devices_module

    original = devices_module._whole_gpu

    def bad(inv, gpu):  # type: ignore[no-untyped-def]
        d = original(inv, gpu)
        d.capacity["memory"] = DeviceCapacity(value="1Gi", request_policy=CapacityRequestPolicy(default="1Gi"))
        return d

    monkeypatch.setattr(devices_module, "_whole_gpu", bad)
    sim = sim_factory("dgx-h100")
    with pytest.raises(SliceLimitError, match="requestPolicy but allowMultipleAllocations is off"):
        build_slices(discover(sim, sim.sysfs_root), node_name="n", mode=PublishMode.GPUS)


def _shared_node(tmp_path: Path, replicas: int | None = None) -> tuple[Node, list[dict]]:
    """A simulated dgx-h100 node and its shared-mode slices."""
    node = Node(tmp_path)
    sim = node.sim
    sim.nvmlInit()
    slices = [s.to_api() for s in build_slices(discover(sim, sim.sysfs_root), node_name="node-a",
                                               mode=PublishMode.SHARED, replicas=replicas)]  # fmt: skip
    return node, slices


def _allocate(node: Node, slices: list[dict], claims: list[dict]) -> list[dict]:
    """The claims allocated by our allocator on the node's slices, added to the node: each claim's first result."""
    report = simulate(slices, [GPU_CLASS], claims, node="node-a")
    for c, o in zip(claims, report.outcomes, strict=True):
        c["status"] = {"allocation": o.allocation}
    node.add(*claims)
    return [o.allocation["devices"]["results"][0] for o in report.outcomes if o.allocation]


def test_claims_share_a_gpu_and_each_is_prepared(tmp_path: Path) -> None:
    node, slices = _shared_node(tmp_path)
    claims = [_claim("a", "40Gi"), _claim("b", "30Gi"), _claim("c", "20Gi")]
    results = _allocate(node, slices, claims)
    assert len(results) == 3
    assert results[0]["device"] == results[1]["device"] != results[2]["device"]  # 40+30 fit one GPU, +20 does not
    assert all(r.get("shareID") for r in results)
    d = node.driver(mode=PublishMode.SHARED)
    out = d.prepare([ref(c) for c in claims])
    assert all(r.error == "" for r in out.values()), out
    assert out["uid-a"].devices[0].share_id == results[0]["shareID"]
    assert out["uid-a"].devices[0].device == out["uid-b"].devices[0].device  # two claims hold one GPU
    assert len(node.cdi_files()) == 3
    assert all(e is None for e in d.unprepare([ref(c) for c in claims]).values()) and node.cdi_files() == []


def _timesliced(c: dict, interval: str) -> dict:
    params = {"apiVersion": "gpu.resource.dra-driver.dev/v1alpha1", "kind": "GpuConfig",
              "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}}  # fmt: skip
    c["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClaim", "requests": [], "opaque": {"driver": "gpu.dra-driver.dev", "parameters": params}}
    ]
    return c


def test_two_claims_on_one_gpu_never_overwrite_or_reset_each_others_time_slice(tmp_path: Path) -> None:
    """Through the plugin (the checkpoint says who else holds the GPU): A Long, then B Short is refused naming A,
    C Long shares A's setting; unpreparing C leaves Long to A, unpreparing A resets the GPU to Default."""
    from dra_driver.simulator.tools.state import SharingState

    node = Node(tmp_path)
    sim = node.sim
    sim.nvmlInit()
    slices = [s.to_api() for s in build_slices(discover(sim, sim.sysfs_root), node_name="node-a",
                                               mode=PublishMode.SHARED)]  # fmt: skip
    claims = [_claim(n, "10Gi") for n in ("a", "b", "c")]
    report = simulate(slices, [GPU_CLASS], claims, node="node-a")
    for c, o in zip(claims, report.outcomes, strict=True):
        c["status"] = {"allocation": o.allocation}
    a, b, c = _timesliced(claims[0], "Long"), _timesliced(claims[1], "Short"), _timesliced(claims[2], "Long")
    gpu = {x["status"]["allocation"]["devices"]["results"][0]["device"] for x in (a, b, c)}
    assert len(gpu) == 1  # first fit: all three on one GPU
    node.add(a, b, c)
    d = node.driver(mode=PublishMode.SHARED)
    uuid = sim.gpu_uuids[int(gpu.pop().removeprefix("gpu-"))]
    state = SharingState(sim.state_dir)
    assert d.prepare([ref(a)])["uid-a"].error == ""
    assert state.timeslice(uuid) == 3  # Long
    result = d.prepare([ref(b)])["uid-b"]
    assert result.failure is not None and result.failure.kind is FailureKind.SHARING and result.failure.retryable
    refused = result.error
    assert "default/a" in refused or "uid-a" in refused, refused
    assert "Long" in refused and state.timeslice(uuid) == 3
    assert len(node.cdi_files()) == 1  # B left nothing behind
    assert d.prepare([ref(c)])["uid-c"].error == ""
    assert d.unprepare([ref(c)])["uid-c"] is None and state.timeslice(uuid) == 3  # A still runs with Long
    assert d.unprepare([ref(a)])["uid-a"] is None and state.timeslice(uuid) == 0  # the last one leaves: Default
    assert node.cdi_files() == []


def test_replicas_publish_shares_and_take_no_memory_unless_asked(sim_factory) -> None:
    sim = sim_factory("dgx-h100")
    inv = discover(sim, sim.sysfs_root)
    (device, *_) = [d for s in build_slices(inv, node_name="n", mode=PublishMode.SHARED, replicas=4)
                    for d in s.spec.devices or []]  # fmt: skip
    assert device.allow_multiple_allocations
    shares, memory = device.capacity["shares"], device.capacity["memory"]
    assert shares.value == "4" and shares.request_policy is not None
    assert shares.request_policy.default == "1" and shares.request_policy.valid_range is not None
    assert (shares.request_policy.valid_range.min, shares.request_policy.valid_range.max) == ("1", "1")
    assert memory.value == "81559Mi" and memory.request_policy == CapacityRequestPolicy(default="0")
    (unlimited, *_) = [d for s in build_slices(inv, node_name="n", mode=PublishMode.SHARED, replicas=0)
                       for d in s.spec.devices or []]  # fmt: skip
    assert "shares" not in unlimited.capacity and unlimited.capacity["memory"].request_policy == memory.request_policy
    for mode, replicas in ((PublishMode.STATIC, 4), (PublishMode.SHARED, -1), (PublishMode.SHARED, 1025)):
        with pytest.raises(ValueError, match="replicas"):
            build_slices(inv, node_name="n", mode=mode, replicas=replicas)


def test_replicas_put_that_many_claims_on_a_gpu_each_prepared(tmp_path: Path) -> None:
    """As the device plugin's `replicas: 4`: four claims that ask for nothing share the first GPU, the fifth goes
    to the next one; a claim may still ask for memory, kept within the GPU's."""
    node, slices = _shared_node(tmp_path, replicas=4)
    claims = [_claim(f"r{i}", None) for i in range(5)]
    devices = [r["device"] for r in _allocate(node, slices, claims)]
    assert devices == ["gpu-0"] * 4 + ["gpu-1"], devices
    d = node.driver(mode=PublishMode.SHARED)
    out = d.prepare([ref(c) for c in claims])
    assert all(r.error == "" for r in out.values()), out
    assert len({r.devices[0].share_id for r in out.values()}) == 5 and len(node.cdi_files()) == 5
    assert all(e is None for e in d.unprepare([ref(c) for c in claims]).values()) and node.cdi_files() == []
    big = [_claim("big", "70Gi"), _claim("more", "15Gi")]  # 85Gi: more than one 80 GB GPU
    placed = simulate(slices, [GPU_CLASS], big, node="node-a").outcomes
    assert [o.allocation["devices"]["results"][0]["device"] for o in placed] == ["gpu-0", "gpu-1"]


def test_replicas_share_an_admins_mig_device_too(tmp_path: Path) -> None:
    """With MIG on, shared mode publishes the MIG devices that exist, each for `replicas` claims; they are prepared
    as they are and left in place when the claims go."""
    from tests.plugin_helpers import MIG_CLASS
    from tests.simhelpers import create_full_ci, create_gi

    node = Node(tmp_path)
    sim = node.sim
    sim.nvmlInit()
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    sim.nvmlDeviceSetMigMode(handle, 1)
    create_full_ci(sim, create_gi(sim, handle, 19, 0, 1), 1)
    slices = [s.to_api() for s in build_slices(discover(sim, sim.sysfs_root), node_name="node-a",
                                               mode=PublishMode.SHARED, replicas=2)]  # fmt: skip
    (mig,) = [d for s in slices for d in s["spec"].get("devices") or [] if "mig" in d["name"]]
    assert mig["allowMultipleAllocations"] and mig["capacity"]["shares"]["value"] == "2"
    assert all(c["requestPolicy"] == {"default": "0"} for n, c in mig["capacity"].items() if n != "shares")
    claims = [_claim(f"m{i}", None) for i in range(3)]
    for c in claims:
        c["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "mig"
    report = simulate(slices, [GPU_CLASS, MIG_CLASS], claims, node="node-a")
    placed = [o.allocation["devices"]["results"][0]["device"] if o.allocation else None for o in report.outcomes]
    assert placed == [mig["name"], mig["name"], None]  # two shares, one MIG device
    for c, o in zip(claims[:2], report.outcomes, strict=False):
        c["status"] = {"allocation": o.allocation}
    node.add(*claims[:2])
    d = node.driver(mode=PublishMode.SHARED)
    out = d.prepare([ref(c) for c in claims[:2]])
    assert all(r.error == "" for r in out.values()), out
    assert all(e is None for e in d.unprepare([ref(c) for c in claims[:2]]).values())
    assert node.mig_instances() == [(0, 19, 0)] and node.cdi_files() == []
