"""Node labels: computed from the inventory of every simulated machine, and applied to a real API server."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dra_driver.labels import apply_node_labels, label_value, node_labels
from dra_driver.nvml.discovery import discover
from dra_driver.simulator.catalog import machine
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME

D = DEFAULT_DRIVER_NAME
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

EXPECTED = {
    "dgx-a100": ("NVIDIA-A100-SXM4-40GB", "8", "40960", "ampere", "true", "8", "0"),
    "dgx-h100": ("NVIDIA-H100-80GB-HBM3", "8", None, "hopper", "true", "9", "0"),
    "dgx-h200": (None, "8", None, "hopper", "true", "9", "0"),
    "dgx-b200": (None, "8", None, "blackwell", "true", "10", "0"),
    "mixed": ("mixed", "5", None, "mixed", "true", "8", "0"),
    "gb200-nvl72-tray": ("NVIDIA-GB200", "4", None, "blackwell", "true", "10", "0"),
}


def inventory(machine_name: str, tmp_path: Path) -> Any:
    sim = SimulatedNvml(machine_name, tmp_path / machine_name)
    return discover(sim, sim.sysfs_root)


@pytest.mark.parametrize("machine_name", sorted(EXPECTED))
def test_labels_of_each_simulated_machine(machine_name: str, tmp_path: Path) -> None:
    inv = inventory(machine_name, tmp_path)
    labels = node_labels(inv, D)
    product, count, memory, family, mig, major, minor = EXPECTED[machine_name]
    assert labels[f"{D}/gpu.present"] == "true"
    assert labels[f"{D}/gpu.count"] == count == str(len(machine(machine_name).gpus))
    if product:
        assert labels[f"{D}/gpu.product"] == product
    assert labels[f"{D}/gpu.memory"] == (memory or str(min(g.memory_bytes for g in inv.gpus) >> 20))
    assert labels[f"{D}/gpu.family"] == family
    assert labels[f"{D}/gpu.mig.capable"] == mig
    assert (labels[f"{D}/gpu.compute.major"], labels[f"{D}/gpu.compute.minor"]) == (major, minor)
    assert labels[f"{D}/cuda.driver.major"] == inv.cuda_driver_version.split(".")[0]
    for key, value in labels.items():
        assert key.startswith(f"{D}/") and _VALUE.match(value) and len(value) <= 63, (key, value)


def test_mixed_node_takes_the_smallest_gpu(tmp_path: Path) -> None:
    inv = inventory("mixed", tmp_path)
    labels = node_labels(inv, D)
    assert labels[f"{D}/gpu.memory"] == str(min(g.memory_bytes for g in inv.gpus) >> 20)
    assert labels[f"{D}/gpu.compute.major"] == "8"  # the A100s (8.0) are the oldest


def test_label_value_sanitising() -> None:
    assert label_value("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert label_value(" (weird)  name/x ") == "weird-name-x"
    assert label_value("Ada Lovelace") == "Ada-Lovelace"
    long = label_value("A" * 62 + " -x")
    assert len(long) <= 63 and _VALUE.match(long)
    assert label_value("---") == ""


def test_no_gpus() -> None:
    from dra_driver.nvml.inventory import Inventory

    labels = node_labels(Inventory(driver_version="1", cuda_driver_version="12.4", gpus=()), D)
    assert labels == {f"{D}/gpu.present": "false", f"{D}/gpu.count": "0"}


def test_apply_refuses_foreign_keys() -> None:
    with pytest.raises(ValueError):
        apply_node_labels(object(), "n", {f"{D}/gpu.count": "1", "other.io/x": "y"})
    with pytest.raises(ValueError):
        apply_node_labels(object(), "n", {})  # no domain to infer


def test_apply_node_labels_against_the_api_server(control_plane: Any, tmp_path: Path) -> None:
    from dra_driver.kube import connect

    name = "labels-node-1"
    control_plane.create_node(
        name, labels={"team.example.com/owner": "ml", f"{D}/stale-key": "1", "nvidia.com/gpu.present": "true"}
    )
    try:
        api = connect(control_plane.kubeconfig)

        def node_labels_now() -> dict[str, str]:
            return dict(control_plane.kubectl_json("get", "node", name)["metadata"]["labels"])

        before = node_labels_now()
        labels = node_labels(inventory("dgx-h100", tmp_path), D)
        patch = apply_node_labels(api, name, labels)
        assert patch[f"{D}/stale-key"] is None
        now = node_labels_now()
        ours = {k: v for k, v in now.items() if k.startswith(f"{D}/")}
        assert ours == labels  # added, and the stale one of ours removed
        assert {k: v for k, v in now.items() if not k.startswith(f"{D}/")} == {
            k: v for k, v in before.items() if not k.startswith(f"{D}/")
        }  # others (including NVIDIA's own domain and kubernetes.io/hostname) untouched

        assert apply_node_labels(api, name, labels) == {}  # nothing to change: no patch

        control_plane.kubectl("label", "node", name, "team.example.com/extra=1")  # someone else adds one
        updated = {**labels, f"{D}/gpu.count": "7"}
        del updated[f"{D}/gpu.family"]
        patch = apply_node_labels(api, name, updated)
        assert patch == {f"{D}/gpu.count": "7", f"{D}/gpu.family": None}
        now = node_labels_now()
        assert {k: v for k, v in now.items() if k.startswith(f"{D}/")} == updated
        assert now["team.example.com/extra"] == "1" and now["team.example.com/owner"] == "ml"

        apply_node_labels(api, name, {}, domain=D)  # e.g. the driver is being removed
        now = node_labels_now()
        assert not [k for k in now if k.startswith(f"{D}/")]
        assert now["nvidia.com/gpu.present"] == "true" and now["team.example.com/extra"] == "1"
    finally:
        control_plane.delete_node(name)


def test_a_node_in_an_nvlink_fabric_is_labelled_with_its_cluster_and_clique(tmp_path: Path) -> None:
    trays = []
    for i, clique in enumerate((1, 1, 2)):
        sim = SimulatedNvml("gb200-nvl72-tray", tmp_path / f"tray-{i}")
        sim.place_in_fabric("a3c53a39-8c2f-4a3e-9d57-000000000072", clique)
        trays.append(node_labels(discover(sim, sim.sysfs_root), D))
    cluster = "a3c53a39-8c2f-4a3e-9d57-000000000072"
    assert {t[f"{D}/gpu.nvlink-cluster"] for t in trays} == {cluster}
    assert [t[f"{D}/gpu.clique"] for t in trays] == [f"{cluster}.1", f"{cluster}.1", f"{cluster}.2"]
    assert f"{D}/gpu.clique" not in node_labels(inventory("dgx-h100", tmp_path), D)  # no NVLink fabric there
