"""numaNode in list form against a real kube-apiserver and kube-scheduler.

With DRAListTypeAttributes on (a control plane of its own) the server stores every machine's list-form slices as
published, and the scheduler matches the lists as sets: a claim for four GPUs with matchAttribute on numaNode lands
on dgx-h100-snc2 across the two NUMA nodes of one socket, while against the scalar form it cannot be satisfied;
`simulate` answers the same. With the gate off (the session's control plane, 1.37's defaults) the server rejects the
list form and the publisher says which gate is missing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.allocation.simulate import simulate
from dra_driver.api.slice import ResourceSlice
from dra_driver.cel import features as cel_features
from dra_driver.cel.features import Features
from dra_driver.controller.publisher import Publisher
from dra_driver.nvml.discovery import discover
from dra_driver.simulator.catalog import machine_names
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME as D
from dra_driver.slices.builder import NumaNodeForm, PublishMode, build_slices
from tests.cluster.controlplane import ControlPlane
from tests.cluster.scheduling import schedule_claim
from tests.polling import wait_for
from tests.test_apiserver_accepts_slices import _apply_and_compare, _refusal
from tests.test_list_attributes import CLASS, STANDARD, four_gpus_on_one_numa_node
from tests.test_publisher import api_client

NODE = "numa-list-node"
NS = "numa-list"


@pytest.fixture(scope="module")
def node(list_attributes_cluster: ControlPlane) -> Iterator[tuple[str, str]]:
    uid = list_attributes_cluster.create_node(NODE)
    yield NODE, uid
    list_attributes_cluster.delete_node(NODE)


def _slices(
    machine: str, tmp_path: Path, node: tuple[str, str], version: str, mode: PublishMode, form: NumaNodeForm
) -> list[ResourceSlice]:
    sim = SimulatedNvml(machine, tmp_path / "sim")
    name, uid = node
    return build_slices(
        discover(sim, sim.sysfs_root), node_name=name, node_uid=uid, k8s_version=version, mode=mode, numa_form=form
    )


@pytest.mark.parametrize("mode", list(PublishMode), ids=str)
@pytest.mark.parametrize("version", ["1.37", "1.36"])
@pytest.mark.parametrize("machine", machine_names())
def test_gated_server_stores_the_list_form_as_published(
    list_attributes_cluster: ControlPlane,
    node: tuple[str, str],
    tmp_path: Path,
    machine: str,
    version: str,
    mode: PublishMode,
) -> None:
    slices = [s.to_api() for s in _slices(machine, tmp_path, node, version, mode, NumaNodeForm.LIST)]
    assert any("ints" in a for s in slices for d in s["spec"].get("devices") or [] for a in d["attributes"].values())
    _apply_and_compare(list_attributes_cluster, slices, node, f"{machine}/{version}/{mode}/list")


def test_server_without_the_gate_rejects_the_list_form(control_plane: ControlPlane, tmp_path: Path) -> None:
    assert not control_plane.feature_gates.get("DRAListTypeAttributes")
    uid = control_plane.create_node(NODE)
    try:
        slices = [
            s.to_api()
            for s in _slices("dgx-h100-snc2", tmp_path, (NODE, uid), "1.37", PublishMode.GPUS, NumaNodeForm.LIST)
        ]
        err = _refusal(control_plane, slices[0])
        assert STANDARD in err and "must specify one of" in err, err  # the list dropped, no value left
    finally:
        control_plane.delete_node(NODE)


def test_the_publisher_names_the_missing_gate(control_plane: ControlPlane, tmp_path: Path) -> None:
    """What an operator sees when the list form meets an API server without DRAListTypeAttributes: an error that
    says to turn the gate on or go back to the scalar form, never a silent fallback."""
    control_plane.create_node(NODE)
    sim = SimulatedNvml("dgx-h100-snc2", tmp_path / "sim")
    inventory = discover(sim, sim.sysfs_root)

    def desired(generation: int, node_uid: str | None) -> Any:
        return build_slices(
            inventory,
            node_name=NODE,
            node_uid=node_uid,
            k8s_version="1.37",
            mode=PublishMode.GPUS,
            generation=generation,
            numa_form=NumaNodeForm.LIST,
        )

    publisher = Publisher(
        api_client(control_plane.kubeconfig), node_name=NODE, driver=D, desired=desired, backoff_max=1
    )
    publisher.start()
    try:
        wait_for("the publisher's error", lambda: publisher.last_error or None, timeout=30)
        error = publisher.last_error or ""
        assert "ListAttributesRejected" in error and "DRAListTypeAttributes" in error, error
        assert STANDARD in error and "--numa-node-form scalar" in error and "numaNodeForm: scalar" in error, error
        assert not publisher.in_sync.is_set()
        listed = control_plane.kubectl_json("get", "resourceslices", f"--field-selector=spec.nodeName={NODE}")
        assert listed["items"] == []  # nothing half-published, nothing in scalar form behind the operator's back
    finally:
        publisher.stop()
        control_plane.delete_node(NODE)


def _simulate(slices: list[dict[str, Any]], claim: dict[str, Any]) -> Any:
    previous = cel_features.active()
    cel_features.configure(Features(list_type_attributes=True))  # the cluster's gates
    try:
        (outcome,) = simulate(slices, [CLASS], [claim], node=NODE).outcomes
    finally:
        cel_features.configure(previous)
    return outcome


def test_four_gpus_on_one_numa_node_land_across_a_socket_s_sub_numa_nodes_only_in_list_form(
    list_attributes_cluster: ControlPlane, node: tuple[str, str], tmp_path: Path
) -> None:
    cp = list_attributes_cluster
    cp.apply(CLASS)
    cp.create_namespace(NS)
    nodes_of: dict[str, int] = {}
    try:
        for form, name in ((NumaNodeForm.LIST, "four-list"), (NumaNodeForm.SCALAR, "four-scalar")):
            slices = [
                s.to_api() for s in _slices("dgx-h100-snc2", tmp_path / form, node, "1.37", PublishMode.GPUS, form)
            ]
            for d in slices[0]["spec"]["devices"]:
                value = d["attributes"][STANDARD]
                nodes_of[d["name"]] = value["ints"][0] if "ints" in value else value["int"]
            cp.apply(*slices)
            time.sleep(1)  # the scheduler's informer sees the slices
            claim = four_gpus_on_one_numa_node(name)
            theirs = schedule_claim(cp, claim, NODE, NS, timeout=60)
            ours = _simulate(slices, claim)
            if form is NumaNodeForm.LIST:
                assert theirs is not None, "the scheduler did not place four GPUs on the list-form slices"
                devices = sorted(r["device"] for r in theirs["devices"]["results"])
                assert len(devices) == 4 and {nodes_of[d] for d in devices} in ({0, 1}, {2, 3}), devices
                assert ours.allocated and ours.allocation is not None
                assert {nodes_of[r["device"]] for r in ours.allocation["devices"]["results"]} in ({0, 1}, {2, 3})
            else:
                assert theirs is None, f"the scheduler placed four GPUs on scalar NUMA nodes: {theirs}"
                assert not ours.allocated
            cp.delete("pods", namespace=NS, grace_period=0, wait=120)
            cp.delete("resourceclaims", namespace=NS, wait=120)
            cp.delete("resourceslices", wait=120, field_selector=f"spec.nodeName={NODE}")
    finally:
        cp.delete("namespace", NS, missing_ok=False)
        cp.delete("resourceslices", wait=120, field_selector=f"spec.nodeName={NODE}")
