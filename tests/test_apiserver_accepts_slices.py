"""The ResourceSlices we build are accepted, unchanged, by a real kube-apiserver of each supported minor (the primary
version with its DRA gates on, and each version of the matrix with its defaults), and the server's validation is
real: slices that break its rules are refused."""

from __future__ import annotations

import functools
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from dra_driver.api.slice import DeviceTaint, ResourceSlice
from dra_driver.health.monitor import INFORMATIONAL_EFFECT_MINOR, publishable
from dra_driver.nvml.discovery import discover
from dra_driver.nvml.inventory import Inventory
from dra_driver.simulator.catalog import machine_names
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.builder import PublishMode, build_slices
from dra_driver.slices.limits import limits_for, parse_minor
from tests.cluster.controlplane import (
    LAYOUT_GATES,
    ControlPlane,
    KubectlError,
    layout_runtime_config,
    matrix_versions,
)
from tests.cluster.scheduling import schedule_claim
from tests.test_allocbench import class_name, classes

NODE = "slice-test-node"


@pytest.fixture(scope="module", params=[None, *matrix_versions()], ids=lambda v: v or "primary")
def server(request: pytest.FixtureRequest, control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """The primary version's API server (the session's), then one of each version of the matrix."""
    if request.param is None:
        yield control_plane
        return
    runtime_config = layout_runtime_config(request.param)
    with ControlPlane(version=request.param, feature_gates=LAYOUT_GATES, runtime_config=runtime_config) as cp:
        yield cp


@pytest.fixture(scope="module")
def minor(server: ControlPlane) -> int:
    return parse_minor(server.server_version())


@pytest.fixture(scope="module")
def node(server: ControlPlane) -> Iterator[tuple[str, str]]:
    uid = server.create_node(NODE, labels={"nvidia.com/gpu.present": "true"})
    yield NODE, uid
    server.delete_node(NODE)


@functools.cache
def _inventory(machine: str) -> Inventory:
    """The machine as discovered, once per process: a simulated node and its discovery take 0.1 s, for each of the
    module's 250 tests otherwise."""
    with tempfile.TemporaryDirectory(prefix="accepts-") as tmp:
        sim = SimulatedNvml(machine, Path(tmp) / "sim")
        return discover(sim, sim.sysfs_root)


def _slices(machine: str, node: tuple[str, str], version: str, mode: PublishMode) -> list[ResourceSlice]:
    name, uid = node
    return build_slices(_inventory(machine), node_name=name, node_uid=uid, k8s_version=version, mode=mode)


def _server_slices(cp: ControlPlane, node_name: str) -> dict[str, Any]:
    listed = cp.kubectl_json("get", "resourceslices", f"--field-selector=spec.nodeName={node_name}")
    return {s["metadata"]["name"]: s for s in listed["items"]}


def _delete_slices(cp: ControlPlane, node_name: str) -> None:
    cp.delete("resourceslices", field_selector=f"spec.nodeName={node_name}")


def _differences(ours: Any, theirs: Any, path: str = "spec") -> list[str]:
    """Where the server's copy differs from what we sent (dropped, added or rewritten fields)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        out: list[str] = []
        for key in sorted(set(ours) | set(theirs)):
            if key not in ours or key not in theirs:
                out.append(f"{path}.{key}: sent {ours.get(key)!r}, server has {theirs.get(key)!r}")
            else:
                out += _differences(ours[key], theirs[key], f"{path}.{key}")
        return out
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        return [
            d for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) for d in _differences(a, b, f"{path}[{i}]")
        ]
    return [] if ours == theirs else [f"{path}: sent {ours!r}, server has {theirs!r}"]


def _apply_and_compare(
    cp: ControlPlane, slices: list[dict[str, Any]], node: tuple[str, str], what: str, *, table: bool = False
) -> None:
    """Create the pool, check the server kept every field as sent (`table`: and kubectl lists it), then delete it."""
    node_name = node[0]
    try:
        for ours in slices:
            try:
                cp.create(ours)
            except KubectlError as e:
                pytest.fail(f"the server rejected {what}: {e.stderr}")
        on_server = _server_slices(cp, node_name)
        assert sorted(on_server) == sorted(s["metadata"]["name"] for s in slices)
        for ours in slices:
            theirs = on_server[ours["metadata"]["name"]]
            assert len(theirs["spec"].get("devices", [])) == len(ours["spec"].get("devices", []))
            for device in theirs["spec"].get("devices", []):
                for taint in device.get("taints", []):
                    assert taint.pop("timeAdded")  # the server stamps taints that come without one
            assert _differences(ours["spec"], theirs["spec"]) == [], f"{what}: {ours['metadata']['name']}"
            assert theirs["metadata"]["ownerReferences"][0]["uid"] == node[1]
        if table:  # what a user sees of them
            listed = cp.kubectl("get", "resourceslices", f"--field-selector=spec.nodeName={node_name}")
            assert len(listed.stdout.strip().splitlines()) == len(slices) + 1  # header + one row per slice
    finally:
        _delete_slices(cp, node_name)
    assert _server_slices(cp, node_name) == {}


@pytest.mark.parametrize("mode", list(PublishMode), ids=str)
@pytest.mark.parametrize("behind", [0, 1], ids=["its-own-layout", "the-previous-minors"])
@pytest.mark.parametrize("machine", machine_names())
def test_server_accepts_our_slices(
    server: ControlPlane,
    minor: int,
    node: tuple[str, str],
    machine: str,
    behind: int,
    mode: PublishMode,
) -> None:
    """What the driver publishes for the server's minor, and for the minor before (a driver configured for an older
    control plane during an upgrade), back to 1.35: from 1.35 on servers refuse 1.34's layout and 1.34 refuses later
    ones (the test below)."""
    version = f"1.{max(minor - behind, min(minor, 35))}"
    slices = [s.to_api() for s in _slices(machine, node, version, mode)]
    _apply_and_compare(server, slices, node, f"{machine}/{version}/{mode}")


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute", "None"])
def test_server_keeps_device_taints(
    server: ControlPlane,
    minor: int,
    node: tuple[str, str],
    effect: Literal["None", "NoSchedule", "NoExecute"],
) -> None:
    inventory = _inventory("dgx-h200")
    taints = {"gpu-0": [DeviceTaint(key="example.com/unhealthy", value="xid-79", effect=effect)]}
    slices = build_slices(inventory, node_name=node[0], node_uid=node[1], k8s_version=minor, taints=taints)
    if effect == "None" and minor < INFORMATIONAL_EFFECT_MINOR:
        # before 1.35 the server knows no effect None, and the driver leaves such taints out
        assert publishable(taints, minor) == {}
        (tainted,) = [s.to_api() for s in slices if any(d.taints for d in s.spec.devices or [])]
        assert 'taints[0].effect: Unsupported value: "None"' in _refusal(server, tainted)
        return
    _apply_and_compare(server, [s.to_api() for s in slices], node, f"a {effect} taint", table=True)


def _partitionable_h200(node: tuple[str, str], version: str) -> list[dict[str, Any]]:
    return [s.to_api() for s in _slices("dgx-h200", node, version, PublishMode.PARTITIONABLE)]


def _refusal(cp: ControlPlane, obj: dict[str, Any]) -> str:
    """The server's message refusing `obj`, as kubectl prints it."""
    try:
        cp.create(obj)
    except KubectlError as e:
        return str(e.stderr)
    _delete_slices(cp, obj["spec"]["nodeName"])
    pytest.fail(f"the server accepted an invalid slice: {obj['metadata']['name']}")


def _at_the_limit(slices: list[dict[str, Any]], minor: int, beyond: bool) -> tuple[dict[str, Any], str]:
    """One slice at its minor's bound on devices that consume counters, the most that fit (`beyond`: one more), and
    the server's message for one past it. From 1.35: 64 such devices (their counter sets in slices of their own); 1.34
    bounds the counters those devices consume instead, 1024 in a slice (the sets in the slice itself), so the first
    GPU's whole-GPU device is repeated under new names until one more would pass it."""
    limits = limits_for(minor)
    if limits.max_device_counters_per_slice is None:
        n = limits.max_devices_with_advanced_features
        devices = [d for s in slices for d in s["spec"].get("devices", []) if d.get("consumesCounters")]
        assert len(devices) > n
        one = slices[1]
        one["spec"]["devices"] = devices[: n + beyond]
        return one, f"spec.devices: Too many: {n + 1}: must have at most {n} items"
    one = slices[0]

    def counted(device: dict[str, Any]) -> int:
        return sum(len(c["counters"]) for c in device.get("consumesCounters", []))

    heaviest = max(one["spec"]["devices"], key=counted)  # the whole GPU: the most counters per device
    devices: list[dict[str, Any]] = []
    bound = limits.max_device_counters_per_slice
    while sum(map(counted, devices)) + counted(heaviest) <= bound:
        devices.append(dict(heaviest, name=f"{heaviest['name']}-{len(devices)}"))
    if beyond:
        devices.append(dict(heaviest, name=f"{heaviest['name']}-{len(devices)}"))
    assert len(devices) <= limits.max_devices
    one["spec"]["devices"] = devices
    return one, f"the total number of counters in devices must not exceed {bound}"


def test_server_refuses_one_device_past_its_minors_bound(
    server: ControlPlane, minor: int, node: tuple[str, str]
) -> None:
    bad, message = _at_the_limit(_partitionable_h200(node, f"1.{minor}"), minor, beyond=True)
    bad["metadata"]["name"] = "too-many-devices"
    err = _refusal(server, bad)
    assert message in err, err


def test_server_accepts_a_slice_at_its_minors_bound(server: ControlPlane, minor: int, node: tuple[str, str]) -> None:
    """The control for the test above: the same slice one device shorter is fine."""
    ok, _ = _at_the_limit(_partitionable_h200(node, f"1.{minor}"), minor, beyond=False)
    ok["metadata"]["name"] = "just-enough-devices"
    try:
        server.create(ok)
    finally:
        _delete_slices(server, node[0])


def test_server_refuses_the_other_counter_layout(server: ControlPlane, minor: int, node: tuple[str, str]) -> None:
    """1.34 kept a GPU's counter set and devices in one slice; from 1.35 a slice holds only one of them, the devices
    consuming sets anywhere in the pool. Each server refuses the other's layout."""
    if minor == 34:
        slices = _partitionable_h200(node, "1.35")
        assert not slices[1]["spec"].get("sharedCounters") and slices[1]["spec"].get("devices")
        err = _refusal(server, slices[1])
        assert "must reference a counterSet defined in the ResourceSlice sharedCounters" in err, err
        return
    slices = _partitionable_h200(node, "1.34")
    assert slices[0]["spec"].get("sharedCounters") and slices[0]["spec"].get("devices")
    err = _refusal(server, slices[0])
    assert "only one of `sharedCounters` or `devices` is allowed" in err, err


def test_the_scheduler_of_each_minor_allocates_from_its_layout(
    server: ControlPlane, minor: int, node: tuple[str, str]
) -> None:
    """The minor's own kube-scheduler, with the gates the layouts use, allocates a whole GPU and a MIG partition on
    demand from the partitionable slices the driver publishes for it (1.34 with DRADeviceTaints also needs
    resource.k8s.io/v1alpha3: its scheduler waits for DeviceTaintRules, tests.cluster.controlplane)."""
    slices = [s.to_api() for s in _slices("dgx-h100", node, f"1.{minor}", PublishMode.PARTITIONABLE)]
    namespace = f"schedule-{minor}"
    server.apply(*classes(), *slices)
    server.create_namespace(namespace)
    time.sleep(3)  # the scheduler's informers see the new classes and slices (else a first Unschedulable)
    try:
        for name, cls in (("whole", "gpu"), ("small", "mig-1g.10gb")):
            request = {"name": "r", "exactly": {"deviceClassName": class_name(cls)}}
            claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
                     "spec": {"devices": {"requests": [request]}}}  # fmt: skip
            allocation = schedule_claim(server, claim, node[0], namespace, timeout=60)
            assert allocation, f"{cls} on 1.{minor}"
            (result,) = allocation["devices"]["results"]
            assert result["device"].startswith("gpu-") and ("-mig-" in result["device"]) == (cls != "gpu"), result
    finally:
        # no kubelet confirms a bound pod's end: force it, or the namespace waits for it
        server.delete("pods", namespace=namespace, grace_period=0, wait=120)
        server.delete_namespace(namespace, pods_first=False)
        server.delete("deviceclasses", *(c["metadata"]["name"] for c in classes()))
        _delete_slices(server, node[0])
