"""The structured allocator against documented kube-scheduler semantics (synthetic slices and simulated DGX nodes)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from dra_driver.allocation.allocator import AllocationError, Allocator
from dra_driver.allocation.simulate import simulate
from dra_driver.cel.features import KUBERNETES_1_36, KUBERNETES_1_37
from dra_driver.nvml.discovery import discover
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.builder import build_slices

D = "gpu.dra-driver.dev"
NODE_A = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}


def node_slices(machine: str, root: Path, version: str = "1.35") -> list[dict[str, Any]]:
    sim = SimulatedNvml(machine, root / machine)
    return [s.to_api() for s in build_slices(discover(sim, sim.sysfs_root), node_name="node-a", k8s_version=version)]


@pytest.fixture(scope="module")
def h100(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return node_slices("dgx-h100", tmp_path_factory.mktemp("h100"))


def cls(name: str, *exprs: str, config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": e}} for e in exprs]}
    if config:
        spec["config"] = config
    return {"kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


GPU = cls("gpu", f"device.driver == '{D}' && device.attributes['{D}'].type == 'gpu'")
MIG = cls("mig", f"device.driver == '{D}' && device.attributes['{D}'].type == 'mig'")
ANY = cls("any")


def req(name: str, klass: str = "gpu", count: int | None = None, *sel: str, **extra: Any) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": klass, **extra}
    if count is not None:
        exactly["count"] = count
    if sel:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in sel]
    return {"name": name, "exactly": exactly}


def claim(name: str, *requests: dict[str, Any], **devices: Any) -> dict[str, Any]:
    return {
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"devices": {"requests": list(requests), **devices}},
    }


def profile(p: str) -> str:
    return f"device.attributes['{D}'].profile == '{p}'"


def parent_of(slices: list[dict[str, Any]], gpu: str) -> str:
    for s in slices:
        for d in s["spec"].get("devices") or []:
            if d["name"] == gpu:
                return f"device.attributes['{D}'].parentUUID == '{d['attributes']['uuid']['string']}'"
    raise AssertionError(gpu)


def devices_of(allocation: dict[str, Any]) -> list[str]:
    return [r["device"] for r in allocation["devices"]["results"]]


def one(slices: list[dict[str, Any]], classes: list[dict[str, Any]], *claims: dict[str, Any], **kw: Any) -> Any:
    return simulate(slices, classes, list(claims), kw.pop("node", "node-a"), **kw).outcomes


# ---- synthetic slices -------------------------------------------------------------------------------------------


def dev(name: str, **extra: Any) -> dict[str, Any]:
    attrs = extra.pop("attributes", {})
    return {"name": name, "attributes": {k: {"string": v} for k, v in attrs.items()}, **extra}


def rslice(
    devices: list[dict[str, Any]],
    pool: str = "p",
    gen: int = 1,
    count: int = 1,
    name: str = "s",
    **where: Any,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": D,
        "pool": {"name": pool, "generation": gen, "resourceSliceCount": count},
        "devices": devices,
    }
    spec.update(where or {"nodeName": "node-a"})
    return {"kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


# ---- partitionable devices on a simulated DGX H100 ----------------------------------------------------------------


def test_two_3g_fill_a_gpu_then_4g_does_not_fit(h100: list[dict[str, Any]]) -> None:
    on_gpu0 = parent_of(h100, "gpu-0")
    a = claim("two-3g", req("mig", "mig", 2, profile("3g.40gb"), on_gpu0))
    b = claim("one-4g", req("mig", "mig", 1, profile("4g.40gb"), on_gpu0))
    first, second = one(h100, [MIG], a, b)
    assert sorted(devices_of(first.allocation)) == ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4"]
    assert first.allocation["nodeSelector"] == NODE_A
    assert second.allocation is None
    (exp,) = second.explanations
    (rx,) = exp.requests
    assert rx.available == 0 and rx.candidates == 1
    (what,) = rx.counters
    assert "gpu-0-counter-set" in what and "memory-slice-" in what and rx.counters[what] == 1
    assert "not enough devices for request(s) mig" in exp.reason


def test_4g_and_3g_share_a_gpu_but_a_second_4g_does_not(h100: list[dict[str, Any]]) -> None:
    on_gpu0 = parent_of(h100, "gpu-0")
    c = claim("mix", req("a", "mig", 1, profile("4g.40gb"), on_gpu0), req("b", "mig", 1, profile("3g.40gb"), on_gpu0))
    (ok,) = one(h100, [MIG], c)
    assert devices_of(ok.allocation) == ["gpu-0-mig-4g40gb-5-0", "gpu-0-mig-3g40gb-9-4"]
    c2 = claim("two-4g", req("a", "mig", 2, profile("4g.40gb"), on_gpu0))
    (bad,) = one(h100, [MIG], c2)
    assert bad.allocation is None


def test_whole_gpu_blocks_all_its_partitions(h100: list[dict[str, Any]]) -> None:
    taken = {"devices": {"results": [{"request": "r", "driver": D, "pool": "node-a", "device": "gpu-0"}]}}
    c = claim("any-mig-on-gpu0", req("mig", "mig", 1, parent_of(h100, "gpu-0")))
    (out,) = one(h100, [MIG], c, allocated=[taken])
    assert out.allocation is None
    (rx,) = out.explanations[0].requests
    assert rx.candidates == 25 and rx.available == 0
    assert sum(rx.counters.values()) == 25
    assert all("gpu-0-counter-set" in k for k in rx.counters)
    text = out.explanations[0].lines()[1]
    assert "25 candidates on node-a, 25 blocked" in text
    # ... and a partition blocks the whole GPU.
    mig_taken = {
        "devices": {"results": [{"request": "r", "driver": D, "pool": "node-a", "device": "gpu-3-mig-1g10gb-19-0"}]}
    }
    (gpus,) = one(h100, [GPU], claim("all-gpus", req("g", "gpu", 8)), allocated=[mig_taken])
    assert gpus.allocation is None
    assert "counter" in " ".join(gpus.explanations[0].requests[0].counters)


def test_partitions_fill_gpus_in_slice_order_and_stop_at_seven_1g_per_gpu(h100: list[dict[str, Any]]) -> None:
    on_gpu0 = parent_of(h100, "gpu-0")
    seven = claim("seven", req("m", "mig", 7, profile("1g.10gb"), on_gpu0))
    eight = claim("eight", req("m", "mig", 8, profile("1g.10gb"), on_gpu0))
    (ok,) = one(h100, [MIG], seven)
    assert len(set(devices_of(ok.allocation))) == 7
    (bad,) = one(h100, [MIG], eight)
    assert bad.allocation is None


def test_all_mode_and_config_sources(h100: list[dict[str, Any]]) -> None:
    gpu = cls(
        "gpu",
        GPU["spec"]["selectors"][0]["cel"]["expression"],
        config=[{"opaque": {"driver": D, "parameters": {"sharing": "time-slicing"}}}],
    )
    c = claim(
        "all",
        req("g", "gpu", None, allocationMode="All"),
        config=[{"requests": ["g"], "opaque": {"driver": D, "parameters": {"x": 1}}}],
    )
    (out,) = one(h100, [gpu], c)
    assert devices_of(out.allocation) == [f"gpu-{i}" for i in range(8)]
    assert out.allocation["devices"]["config"] == [  # both for the claim's only request: no request named (1.37)
        {"source": "FromClass", "opaque": {"driver": D, "parameters": {"sharing": "time-slicing"}}},
        {"source": "FromClaim", "opaque": {"driver": D, "parameters": {"x": 1}}},
    ]
    # All mode needs every matching device: one in use makes it fail.
    taken = {"devices": {"results": [{"request": "r", "driver": D, "pool": "node-a", "device": "gpu-5"}]}}
    (blocked,) = one(h100, [GPU], c, allocated=[taken])
    assert blocked.allocation is None
    # ... and at least one device.
    (none,) = one(
        h100,
        [GPU],
        claim(
            "all-h200",
            req(
                "g", "gpu", None, "device.attributes['gpu.dra-driver.dev'].productName == 'H200'", allocationMode="All"
            ),
        ),
    )
    assert none.allocation is None


def test_claim_config_is_added_once_and_names_no_request_when_it_covers_all_since_1_37(
    h100: list[dict[str, Any]],
) -> None:
    opaque = {"driver": D, "parameters": {"x": 1}}
    c = claim("two", req("a"), req("b"), config=[{"requests": ["a", "b"], "opaque": opaque}])
    for release, configs in (
        (KUBERNETES_1_37, [{"source": "FromClaim", "opaque": opaque}]),
        (KUBERNETES_1_36, [{"source": "FromClaim", "requests": ["a", "b"], "opaque": opaque}] * 2),
    ):
        (result,) = Allocator(h100, [GPU], features=release).allocate([c], "node-a") or ()
        assert result.to_api()["devices"]["config"] == configs, release


def test_first_available_falls_back_to_the_next_subrequest(h100: list[dict[str, Any]]) -> None:
    c = claim(
        "prio",
        {
            "name": "r",
            "firstAvailable": [
                {"name": "nine-gpus", "deviceClassName": "gpu", "count": 9},
                {
                    "name": "big-mig",
                    "deviceClassName": "mig",
                    "selectors": [{"cel": {"expression": profile("7g.80gb")}}],
                },
                {"name": "small-mig", "deviceClassName": "mig"},
            ],
        },
        config=[{"requests": ["r/big-mig"], "opaque": {"driver": D, "parameters": {"p": 1}}}],
    )
    (out,) = one(h100, [GPU, MIG], c)
    (result,) = out.allocation["devices"]["results"]
    assert result["request"] == "r/big-mig" and result["device"] == "gpu-0-mig-7g80gb-0-0"
    assert out.allocation["devices"]["config"] == [
        {"source": "FromClaim", "opaque": {"driver": D, "parameters": {"p": 1}}}
    ]
    # The first subrequest wins when it fits.
    c["spec"]["devices"]["requests"][0]["firstAvailable"][0]["count"] = 2
    (first,) = one(h100, [GPU, MIG], c)
    assert [r["request"] for r in first.allocation["devices"]["results"]] == ["r/nine-gpus"] * 2
    assert "config" not in first.allocation["devices"]


def test_cel_runtime_errors_abort_allocation(h100: list[dict[str, Any]]) -> None:
    bad_class = cls("broken", f"device.attributes['{D}'].noSuchAttribute == 'x'")
    alloc = Allocator(h100, [bad_class, GPU])
    # since 1.37 the message names the device, and a missing key gets a hint
    at = f"on device {D}/node-a/gpu-0: CEL runtime error: no such key: noSuchAttribute. consider using CEL optional"
    with pytest.raises(AllocationError, match=rf"^class broken: selector #0 {at}"):
        alloc.allocate([claim("c", req("r", "broken"))], "node-a")
    with pytest.raises(AllocationError, match=r"^claim ns/c: selector #1 on device [^:]+: CEL runtime error: "):
        alloc.allocate([claim("c", req("r", "gpu", 1, "true", f"device.attributes['{D}'].nope > 1"))], "node-a")
    (out,) = one(h100, [bad_class], claim("c", req("r", "broken")))
    assert out.allocation is None and out.error and out.error.startswith("class broken: selector #0 on device")
    old = Allocator(h100, [bad_class], features=KUBERNETES_1_36)
    with pytest.raises(
        AllocationError, match=r"^class broken: selector #0: CEL runtime error: no such key: [a-zA-Z]+$"
    ):
        old.allocate([claim("c", req("r", "broken"))], "node-a")


def test_explanation_counts_selector_rejections(h100: list[dict[str, Any]]) -> None:
    (out,) = one(
        h100, [GPU], claim("c", req("gpu", "gpu", 1, f"device.attributes['{D}'].productName == 'NVIDIA B200'"))
    )
    (rx,) = out.explanations[0].requests
    assert rx.considered == 208
    assert [(s.source, s.index, s.count) for s in rx.selectors] == [("class", 0, 200), ("claim", 0, 8)]
    text = out.explanations[0].lines()[1].strip()
    assert text.startswith(
        "request gpu (wants 1 device(s)): 208 devices considered: 200 rejected by class gpu selector #0"
    )
    assert "8 rejected by claim ns/c selector #0" in text


def test_match_attribute_product_name_on_mixed_node(tmp_path: Path) -> None:
    slices = node_slices("mixed", tmp_path)
    products: dict[str, int] = {}
    for s in slices:
        for d in s["spec"].get("devices") or []:
            if d["attributes"]["type"]["string"] == "gpu":
                p = d["attributes"]["productName"]["string"]
                products[p] = products.get(p, 0) + 1
    largest = max(products.values())
    same = [{"matchAttribute": f"{D}/productName"}]
    (ok,) = one(slices, [GPU], claim("same", req("a", "gpu", largest - 1), req("b", "gpu", 1), constraints=same))
    names = {r["device"] for r in ok.allocation["devices"]["results"]}
    got = {
        d["attributes"]["productName"]["string"]
        for s in slices
        for d in s["spec"].get("devices") or []
        if d["name"] in names
    }
    assert len(got) == 1 and len(names) == largest
    (bad,) = one(slices, [GPU], claim("too-many", req("a", "gpu", largest), req("b", "gpu", 1), constraints=same))
    assert bad.allocation is None
    assert bad.explanations[0].failed_constraint == f"constraint #0 (matchAttribute {D}/productName over all requests)"
    # Without the constraint the same claim fits (there are more GPUs than the largest group).
    (free,) = one(slices, [GPU], claim("free", req("a", "gpu", largest), req("b", "gpu", 1)))
    assert free.allocation is not None


def test_combined_slices_of_1_34(tmp_path: Path) -> None:
    slices = node_slices("dgx-h100", tmp_path, "1.34")
    on_gpu0 = parent_of(slices, "gpu-0")
    (a, b) = one(
        slices,
        [MIG],
        claim("a", req("m", "mig", 1, profile("7g.80gb"), on_gpu0)),
        claim("b", req("m", "mig", 1, on_gpu0)),
    )
    assert devices_of(a.allocation) == ["gpu-0-mig-7g80gb-0-0"] and b.allocation is None


# ---- synthetic: taints, admin access, capacity, pools, nodes ------------------------------------------------------


def test_taints_and_tolerations() -> None:
    noschedule = {"key": "health", "value": "bad", "effect": "NoSchedule"}
    s = rslice([dev("d0", taints=[noschedule]), dev("d1", taints=[{"key": "x", "effect": "None"}])])
    (out,) = one([s], [ANY], claim("c", req("r", "any")))
    assert devices_of(out.allocation) == ["d1"]  # d0 tainted; effect None does not block
    (two,) = one([s], [ANY], claim("c", req("r", "any", 2)))
    assert two.allocation is None
    assert two.explanations[0].requests[0].tainted == {"health=bad:NoSchedule": 1}
    tol = [{"key": "health", "operator": "Equal", "value": "bad", "effect": "NoSchedule"}]
    (tolerated,) = one([s], [ANY], claim("c", req("r", "any", 1, tolerations=tol)))
    (result,) = tolerated.allocation["devices"]["results"]
    assert result["device"] == "d0" and result["tolerations"] == tol
    for wrong in ({"key": "health", "value": "good"}, {"key": "health", "operator": "Exists", "effect": "NoExecute"}):
        (nope,) = one([s], [ANY], claim("c", req("r", "any", 1, tolerations=[wrong])))
        assert devices_of(nope.allocation) == ["d1"]
    (exists,) = one([s], [ANY], claim("c", req("r", "any", 2, tolerations=[{"operator": "Exists"}])))
    assert devices_of(exists.allocation) == ["d0", "d1"]
    noexec = rslice([dev("d0", taints=[{"key": "k", "effect": "NoExecute"}])])
    assert one([noexec], [ANY], claim("c", req("r", "any")))[0].allocation is None


def test_a_mode_or_operator_of_a_newer_api_is_read_and_refused_as_the_scheduler_refuses_it() -> None:
    """The models take any allocationMode and toleration operator (the plugin reads claims it does not allocate):
    the allocator refuses a mode it does not know, and an operator it does not know tolerates nothing."""
    s = rslice([dev("d0", taints=[{"key": "k", "value": "1", "effect": "NoSchedule"}]), dev("d1")])
    with pytest.raises(AllocationError, match=r"^claim ns/c, request r: unsupported count mode Some$"):
        Allocator([s], [ANY]).allocate([claim("c", req("r", "any", None, allocationMode="Some"))], "node-a")
    (greater,) = one([s], [ANY], claim("c", req("r", "any", 2, tolerations=[{"key": "k", "operator": "Gt"}])))
    assert greater.allocation is None
    (empty,) = one([s], [ANY], claim("c", req("r", "any", 2, tolerations=[{"operator": "", "value": "1"}])))
    assert devices_of(empty.allocation) == ["d0", "d1"]  # an empty operator is Equal


def test_admin_access_may_use_allocated_devices() -> None:
    s = rslice([dev("d0"), dev("d1")])
    taken = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": D, "pool": "p", "device": "d0"},
                        {"request": "r", "driver": D, "pool": "p", "device": "d1"},
                    ]
                }
            }
        }
    }
    (normal,) = one([s], [ANY], claim("c", req("r", "any")), allocated=[taken])
    assert normal.allocation is None and normal.explanations[0].requests[0].in_use == 2
    (admin,) = one([s], [ANY], claim("c", req("r", "any", 2, adminAccess=True)), allocated=[taken])
    assert admin.allocation["devices"]["results"] == [
        {"request": "r", "driver": D, "pool": "p", "device": "d0", "adminAccess": True},
        {"request": "r", "driver": D, "pool": "p", "device": "d1", "adminAccess": True},
    ]
    # An admin-access allocation does not make the device unavailable to others.
    (after,) = one([s], [ANY], claim("c", req("r", "any")), allocated=[admin.allocation])
    assert devices_of(after.allocation) == ["d0"]
    # But admin access cannot take the same device twice in one claim.
    (twice,) = one([s], [ANY], claim("c", req("r", "any", 3, adminAccess=True)))
    assert twice.allocation is None


def shared_slice() -> dict[str, Any]:
    policy = {"default": "1Gi", "validRange": {"min": "1Gi", "max": "40Gi", "step": "1Gi"}}
    return rslice(
        [
            dev(
                "shared",
                attributes={"uuid": "u0"},
                allowMultipleAllocations=True,
                capacity={
                    "memory": {"value": "40Gi", "requestPolicy": policy},
                    "cores": {"value": "8", "requestPolicy": {"default": "1"}},
                },
            ),
            dev("exclusive", attributes={"uuid": "u1"}, capacity={"memory": {"value": "16Gi"}}),
        ]
    )


def test_consumable_capacity_and_share_ids() -> None:
    ids = (f"share-{i}" for i in itertools.count())
    mem = {"capacity": {"requests": {"memory": "10.5Gi"}}}
    claims = [claim(f"c{i}", req("r", "any", 1, "device.allowMultipleAllocations", **mem)) for i in range(4)]
    outs = one([shared_slice()], [ANY], *claims, share_id=lambda: next(ids))
    assert [o.allocated for o in outs] == [True, True, True, False]
    first = outs[0].allocation["devices"]["results"][0]
    # validRange rounds 10.5Gi up to 11Gi; an unrequested capacity without a default is consumed whole.
    assert first == {
        "request": "r",
        "driver": D,
        "pool": "p",
        "device": "shared",
        "shareID": "share-0",
        "consumedCapacity": {"memory": "11Gi", "cores": "1"},
    }
    # Without a policy default, an unrequested capacity is consumed whole: one share takes all 8 cores.
    whole = shared_slice()
    del whole["spec"]["devices"][0]["capacity"]["cores"]["requestPolicy"]
    pair = one([whole], [ANY], *claims[:2])
    assert [o.allocated for o in pair] == [True, False]
    assert pair[0].allocation["devices"]["results"][0]["consumedCapacity"]["cores"] == "8"
    assert outs[3].explanations[0].requests[0].capacity  # memory of the shared device is exhausted
    # The exclusive device only satisfies requests up to its capacity, and records no consumedCapacity.
    (big,) = one(
        [shared_slice()],
        [ANY],
        claim(
            "c",
            req(
                "r",
                "any",
                1,
                "device.attributes['gpu.dra-driver.dev'].uuid == 'u1'",
                capacity={"requests": {"memory": "17Gi"}},
            ),
        ),
    )
    assert big.allocation is None
    (small,) = one(
        [shared_slice()],
        [ANY],
        claim(
            "c",
            req(
                "r",
                "any",
                1,
                "device.attributes['gpu.dra-driver.dev'].uuid == 'u1'",
                capacity={"requests": {"memory": "16Gi"}},
            ),
        ),
    )
    assert small.allocation["devices"]["results"] == [{"request": "r", "driver": D, "pool": "p", "device": "exclusive"}]


def test_all_mode_on_a_shared_device_with_too_little_left_fails_since_1_37() -> None:
    """1.37's `All` lists every device whose capacity could fit the request, so a shared device another claim has
    half consumed fails it; 1.36 left that device out and allocated the others."""
    half = claim(
        "half", req("r", "any", 1, "device.allowMultipleAllocations", capacity={"requests": {"memory": "21Gi"}})
    )
    every = claim("all", req("r", "any", None, allocationMode="All", capacity={"requests": {"memory": "21Gi"}}))
    slices = [shared_slice()]
    slices[0]["spec"]["devices"][1]["capacity"]["memory"]["value"] = "32Gi"  # the exclusive device fits 21Gi too
    for release, got in ((KUBERNETES_1_37, None), (KUBERNETES_1_36, ["exclusive"])):
        alloc = Allocator(slices, [ANY], features=release)
        (first,) = alloc.allocate([half], "node-a") or ()
        alloc.state.add(first.to_api())
        results = alloc.allocate([every], "node-a")
        assert (results and devices_of(results[0].to_api())) == got, release


def test_a_device_taint_rule_without_a_selector_taints_nothing_since_1_37() -> None:
    rule = {
        "kind": "DeviceTaintRule",
        "metadata": {"name": "r"},
        "spec": {"taint": {"key": "k", "effect": "NoSchedule"}},
    }
    wanted = [claim("c", req("r", "any"))]
    for release, allocated in ((KUBERNETES_1_37, True), (KUBERNETES_1_36, False)):
        alloc = Allocator([rslice([dev("d0")])], [ANY], taint_rules=[rule], features=release)
        assert (alloc.allocate(wanted, "node-a") is not None) == allocated, release


def test_distinct_attribute_compares_every_device_since_1_37() -> None:
    """1.37's distinctAttribute keeps every device's value; 1.36's kept one per request, its last device's, so a
    request's third device was only kept apart from its second."""
    devices = [dev(f"d{i}", attributes={"model": v}) for i, v in enumerate("aba")]
    wanted = [claim("c", req("r", "any", 3), constraints=[{"distinctAttribute": f"{D}/model"}])]
    for release, got in ((KUBERNETES_1_37, None), (KUBERNETES_1_36, ["d0", "d1", "d2"])):
        results = Allocator([rslice(devices)], [ANY], features=release).allocate(wanted, "node-a")
        assert (results and devices_of(results[0].to_api())) == got, release


def test_distinct_attribute_keeps_shared_device_apart() -> None:
    # One request never gets one device twice, shared or not (upstream searches on after the device it picked,
    # as tools/allocbench shows); two requests of one claim may each take a share of it.
    (once,) = one([shared_slice()], [ANY], claim("once", req("r", "any", 2, "device.allowMultipleAllocations")))
    assert once.allocation is None
    shared = "device.allowMultipleAllocations"
    two = claim("two", req("a", "any", 1, shared), req("b", "any", 1, shared))
    (same,) = one([shared_slice()], [ANY], two)
    assert devices_of(same.allocation) == ["shared", "shared"]  # one shared device, two shares
    results = same.allocation["devices"]["results"]
    assert results[0]["shareID"] != results[1]["shareID"]
    two["spec"]["devices"]["constraints"] = [{"distinctAttribute": f"{D}/uuid"}]
    (apart,) = one([shared_slice()], [ANY], two)
    assert apart.allocation is None
    assert apart.explanations[0].failed_constraint == f"constraint #0 (distinctAttribute {D}/uuid over all requests)"
    (mixed,) = one(
        [shared_slice()], [ANY], claim("mixed", req("r", "any", 2), constraints=[{"distinctAttribute": f"{D}/uuid"}])
    )
    assert devices_of(mixed.allocation) == ["shared", "exclusive"]


def test_pools_generation_incomplete_and_node_visibility() -> None:
    old = rslice([dev("old")], gen=1, count=1, name="old")
    new = rslice([dev("new")], gen=2, count=2, name="new")  # incomplete: 1 of 2 slices at generation 2
    (out,) = one([old, new], [ANY], claim("c", req("r", "any", 1)))
    assert devices_of(out.allocation) == ["new"]  # only the highest generation counts
    with pytest.raises(
        AllocationError, match=r"asks for all devices, but resource pool .*/p is currently being updated"
    ):
        Allocator([old, new], [ANY]).allocate([claim("c", req("r", "any", None, allocationMode="All"))], "node-a")
    other = rslice([dev("b0")], pool="pb", name="b", nodeName="node-b")
    (on_a,) = one([other], [ANY], claim("c", req("r", "any")))
    assert on_a.allocation is None
    (anywhere,) = one([other, old], [ANY], claim("c", req("r", "any", 2)), node=None)
    assert anywhere.allocation is None
    (on_b,) = one([other], [ANY], claim("c", req("r", "any")), node=None)
    assert on_b.node == "node-b"
    assert on_b.allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-b"]
    everywhere = rslice([dev("net")], pool="net", name="n", allNodes=True)
    (net,) = one([everywhere], [ANY], claim("c", req("r", "any")))
    assert "nodeSelector" not in net.allocation
    zone = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]}
    zonal = rslice([dev("z")], pool="z", name="z", nodeSelector=zone)
    from dra_driver.allocation.pools import Node

    (z1,) = one([zonal], [ANY], claim("c", req("r", "any")), node=Node("node-a", {"zone": "z1"}))
    assert z1.allocation["nodeSelector"] == zone
    (z2,) = one([zonal], [ANY], claim("c", req("r", "any")), node=Node("node-a", {"zone": "z2"}))
    assert z2.allocation is None


def test_claims_of_one_pod_are_allocated_together() -> None:
    s = rslice([dev("d0"), dev("d1")])
    a, b = claim("a", req("r", "any", 1)), claim("b", req("r", "any", 2))
    outs = one([s], [ANY], a, b, together=True)
    assert [o.allocated for o in outs] == [False, False]
    assert "fits on its own" in outs[1].explanations[0].reason
    seq = one([s], [ANY], a, b)
    assert [o.allocated for o in seq] == [True, False]


def test_backtracking_finds_the_solution_a_greedy_pick_misses() -> None:
    s = rslice(
        [
            dev("d0", attributes={"model": "x"}),
            dev("d1", attributes={"model": "y"}),
            dev("d2", attributes={"model": "y"}),
        ]
    )
    c = claim("c", req("a", "any", 1), req("b", "any", 1), constraints=[{"matchAttribute": f"{D}/model"}])
    (out,) = one([s], [ANY], c)
    assert devices_of(out.allocation) == ["d1", "d2"]


def test_the_claim_limit_is_checked_per_request_since_1_37() -> None:
    big = claim("big", req("a", "any", 20), req("b", "any", 20))
    for release, message in (
        (KUBERNETES_1_37, "claim ns/big, request b: adding 20 devices exceeds the claim limit of 32, with 20 already"),
        (KUBERNETES_1_36, "claim ns/big: number of requested devices 40 exceeds the claim limit of 32"),
    ):
        with pytest.raises(AllocationError, match=f"^{message}"):
            Allocator([rslice([dev("d0")])], [ANY], features=release).allocate([big], "node-a")
