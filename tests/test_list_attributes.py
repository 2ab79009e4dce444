"""The list form of numaNode (`--numa-node-form list`): what the slices carry per Kubernetes minor, the limits that
list attributes bring (the lower device cap of ResourceSliceMaxDevicesWithAdvancedFeatures, 48 attribute values per
device, 64 bytes per string), and `simulate` with DRAListTypeAttributes on and off. The API server and the
kube-scheduler: tests/test_list_attributes_apiserver.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dra_driver.allocation.simulate import simulate
from dra_driver.api.meta import ObjectMeta
from dra_driver.api.slice import Device, DeviceAttribute, ResourcePool, ResourceSlice, ResourceSliceSpec
from dra_driver.cel import features as cel_features
from dra_driver.cel.features import Features
from dra_driver.nvml.discovery import discover
from dra_driver.nvml.inventory import Inventory
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME as D
from dra_driver.slices.builder import NumaNodeForm, PublishMode, SliceLimitError, build_slices
from dra_driver.slices.limits import limits_for
from dra_driver.slices.validation import validate_slice

STANDARD = "resource.kubernetes.io/numaNode"


def inventory(machine: str, tmp_path: Path) -> Inventory:
    sim = SimulatedNvml(machine, tmp_path / machine)
    return discover(sim, sim.sysfs_root)


def numa_attributes(slices: list[ResourceSlice], name: str) -> dict[str, Any]:
    return {d.name: d.attributes[name].to_api() for s in slices for d in s.spec.devices or [] if name in d.attributes}


def test_list_form_on_1_37_is_the_standard_attribute_with_the_socket_s_equidistant_nodes(tmp_path: Path) -> None:
    inv = inventory("dgx-h100-snc2", tmp_path)
    slices = build_slices(inv, node_name="n", k8s_version="1.37", mode=PublishMode.STATIC, numa_form=NumaNodeForm.LIST)
    got = numa_attributes(slices, STANDARD)
    assert got == {f"gpu-{i}": {"ints": [n, n ^ 1]} for i, n in enumerate([0, 0, 1, 1, 2, 2, 3, 3])}
    scalar = numa_attributes(build_slices(inv, node_name="n", k8s_version="1.37", mode=PublishMode.STATIC), STANDARD)
    assert scalar == {f"gpu-{i}": {"int": n} for i, n in enumerate([0, 0, 1, 1, 2, 2, 3, 3])}  # the default


def test_list_form_before_1_37_stays_in_our_domain_and_before_1_36_is_refused(tmp_path: Path) -> None:
    inv = inventory("dgx-a100", tmp_path)
    slices = build_slices(inv, node_name="n", k8s_version="1.36", mode=PublishMode.GPUS, numa_form=NumaNodeForm.LIST)
    assert numa_attributes(slices, STANDARD) == {}
    assert numa_attributes(slices, "numaNode")["gpu-0"] == {"ints": [3, 0, 1, 2]}  # NPS4: the socket's quarters
    with pytest.raises(SliceLimitError, match=r"DRAListTypeAttributes.*Kubernetes 1\.35 does not have"):
        build_slices(inv, node_name="n", k8s_version="1.35", numa_form=NumaNodeForm.LIST)


def test_every_device_of_a_gpu_carries_the_list_and_a_gpu_without_affinity_none(tmp_path: Path) -> None:
    inv = inventory("mixed", tmp_path)
    slices = build_slices(inv, node_name="n", k8s_version="1.37", numa_form=NumaNodeForm.LIST)
    devices = [d for s in slices for d in s.spec.devices or []]
    l40s = next(g for g in inv.gpus if g.numa_node is None)
    for d in devices:
        attr = d.attributes.get(STANDARD)
        if d.name == f"gpu-{l40s.minor}":
            assert attr is None  # numa_node -1: no attribute in either form
        else:
            assert attr is not None and attr.ints is not None and attr.int_ is None, d.name
    assert sum(1 for d in devices if d.attributes["type"].string == "mig") > 20  # MIG too


def _slice(devices: list[Device]) -> ResourceSlice:
    return ResourceSlice(
        metadata=ObjectMeta(name="s"),
        spec=ResourceSliceSpec(
            driver=D, pool=ResourcePool(name="p", generation=1, resource_slice_count=1), devices=devices
        ),
    )


def _devices(n: int, attribute: DeviceAttribute) -> list[Device]:
    return [Device(name=f"d{i}", attributes={"a": attribute}) for i in range(n)]


def test_a_list_attribute_is_an_advanced_feature_that_lowers_the_device_cap() -> None:
    limits = limits_for(37)
    validate_slice(_slice(_devices(128, DeviceAttribute(int_=1))), limits)
    validate_slice(_slice(_devices(64, DeviceAttribute(ints=[1, 2]))), limits)
    with pytest.raises(SliceLimitError, match=r"devices: 65 exceeds the Kubernetes 1\.37 limit of 64"):
        validate_slice(_slice(_devices(65, DeviceAttribute(ints=[1, 2]))), limits)


def test_list_items_count_against_48_values_and_each_string_against_64_bytes() -> None:
    limits = limits_for(37)
    validate_slice(_slice([Device(name="d", attributes={"a": DeviceAttribute(ints=list(range(48)))})]), limits)
    crowded = {"a": DeviceAttribute(ints=list(range(47))), "b": DeviceAttribute(string="x")}
    validate_slice(_slice([Device(name="d", attributes=crowded)]), limits)
    crowded["c"] = DeviceAttribute(bool_=True)
    with pytest.raises(SliceLimitError, match=r"attribute values .*: 49 exceeds .* 48"):
        validate_slice(_slice([Device(name="d", attributes=crowded)]), limits)
    validate_slice(_slice([Device(name="d", attributes={"a": DeviceAttribute(strings=["x" * 64])})]), limits)
    with pytest.raises(SliceLimitError, match="length of attribute a: 66 exceeds"):  # bytes, not characters
        validate_slice(_slice([Device(name="d", attributes={"a": DeviceAttribute(strings=["ok", "é" * 33])})]), limits)
    with pytest.raises(SliceLimitError, match="length of attribute a: 65 exceeds"):
        validate_slice(
            _slice([Device(name="d", attributes={"a": DeviceAttribute(versions=["1.0.0", "1" * 65])})]), limits
        )
    with pytest.raises(SliceLimitError, match="empty list"):
        validate_slice(_slice([Device(name="d", attributes={"a": DeviceAttribute(ints=[])})]), limits)
    with pytest.raises(SliceLimitError, match=r"is a list, which Kubernetes 1\.35 does not have"):
        validate_slice(_slice([Device(name="d", attributes={"a": DeviceAttribute(ints=[1])})]), limits_for(35))


def test_the_cli_flag_publishes_the_list_form(tmp_path: Path) -> None:
    args = ["inventory", "--sim", "dgx-h100-snc2", "--sim-state", str(tmp_path), "--k8s-version", "1.37", "-o", "json"]
    run = [sys.executable, "-m", "dra_driver", *args]
    listed = json.loads(subprocess.run([*run, "--numa-node-form", "list"], capture_output=True, check=True).stdout)
    (gpu0,) = [d for s in listed["items"] for d in s["spec"].get("devices") or [] if d["name"] == "gpu-0"]
    assert gpu0["attributes"][STANDARD] == {"ints": [0, 1]}
    bad = subprocess.run([*run[:-4], "--k8s-version", "1.35", "--numa-node-form", "list"], capture_output=True)
    assert bad.returncode != 0 and b"DRAListTypeAttributes" in bad.stderr


CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu"},
    "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{D}'"}}]},
}


def four_gpus_on_one_numa_node(name: str = "four") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [{"name": "g", "exactly": {"deviceClassName": "gpu", "count": 4}}],
                "constraints": [{"matchAttribute": STANDARD}],
            }
        },
    }


@pytest.mark.parametrize(
    ("form", "gate", "allocated"),
    [
        (NumaNodeForm.LIST, True, True),  # nodes 0 and 1 of socket 0 share node 0 (and 1): one intersection
        (NumaNodeForm.SCALAR, True, False),  # two GPUs per node: no four share one
        (NumaNodeForm.LIST, False, False),  # without the gate a list matches nothing
    ],
)
def test_simulate_matches_numa_lists_as_sets_with_the_gate_only(
    tmp_path: Path, form: NumaNodeForm, gate: bool, allocated: bool
) -> None:
    inv = inventory("dgx-h100-snc2", tmp_path)
    slices = [
        s.to_api() for s in build_slices(inv, node_name="n", k8s_version="1.37", mode=PublishMode.GPUS, numa_form=form)
    ]
    previous = cel_features.active()
    cel_features.configure(Features(list_type_attributes=gate))
    try:
        (outcome,) = simulate(slices, [CLASS], [four_gpus_on_one_numa_node()], node="n").outcomes
    finally:
        cel_features.configure(previous)
    assert outcome.allocated == allocated
    if allocated:
        assert outcome.allocation is not None
        got = sorted(r["device"] for r in outcome.allocation["devices"]["results"])
        assert got == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]  # socket 0's nodes 0 and 1


def test_the_builder_lays_list_form_devices_out_64_to_a_slice(tmp_path: Path) -> None:
    """Plain devices fill slices of 128; with a list attribute the API server allows 64 (advanced features)."""
    inv = inventory("dgx-h100-snc2", tmp_path)
    gpus = tuple(inv.gpus[i % 8].model_copy(update={"minor": i, "index": i}) for i in range(100))
    many = inv.model_copy(update={"gpus": gpus})
    scalar = build_slices(many, node_name="n", k8s_version="1.37", mode=PublishMode.GPUS)
    listed = build_slices(many, node_name="n", k8s_version="1.37", mode=PublishMode.GPUS, numa_form=NumaNodeForm.LIST)
    assert [len(s.spec.devices or []) for s in scalar] == [100]
    assert [len(s.spec.devices or []) for s in listed] == [64, 36]


def test_simulate_cli_follows_the_gate(tmp_path: Path) -> None:
    inv = inventory("dgx-h100-snc2", tmp_path)
    slices = build_slices(inv, node_name="n", k8s_version="1.37", mode=PublishMode.GPUS, numa_form=NumaNodeForm.LIST)
    files = {"slices": [s.to_api() for s in slices], "classes": [CLASS], "claims": [four_gpus_on_one_numa_node()]}
    args = []
    for kind, objects in files.items():
        (tmp_path / f"{kind}.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
        args += [f"--{kind}", str(tmp_path / f"{kind}.json")]
    for gate, code in (("true", 0), ("false", 3)):
        run = [
            sys.executable,
            "-m",
            "dra_driver",
            "simulate",
            *args,
            "--feature-gates",
            f"DRAListTypeAttributes={gate}",
        ]
        assert subprocess.run(run, capture_output=True).returncode == code, gate


def test_the_daemon_refuses_the_list_form_for_a_version_without_it_before_it_serves(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "dra_driver", "plugin", "--sim", "dgx-h100", "--sim-state", str(tmp_path / "s"),
           "--node-name", "n", "--plugin-dir", str(tmp_path / "p"), "--registry-dir", str(tmp_path / "r"),
           "--kubeconfig", "/dev/null", "--k8s-version", "1.35", "--numa-node-form", "list"]  # fmt: skip
    out = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "DRAListTypeAttributes" in out.stderr, out.stderr
    assert not (tmp_path / "p").exists()  # no socket, no recovery: it stopped at the option
