"""The ResourceSlice publisher against a real kube-apiserver (tests/cluster)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from dra_driver.api.slice import DeviceTaint, ResourceSlice
from dra_driver.controller import publisher as publisher_module
from dra_driver.controller.metrics import PublisherMetrics
from dra_driver.controller.publisher import Publisher
from dra_driver.nvml.discovery import discover
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME
from dra_driver.slices.builder import build_slices
from tests.polling import wait_for

# a DGX H100's pool, partitionable on 1.37: the counter sets, the whole GPUs, each GPU's partitions
DGX_H100_SLICES = 10


def api_client(kubeconfig: Path) -> Any:
    from kubernetes import config

    return config.new_client_from_config(config_file=str(kubeconfig))


class Desired:
    """The slices a node should publish; tests change the taints to simulate a device change."""

    def __init__(self, machine: str, node: str, state: Path) -> None:
        sim = SimulatedNvml(machine, state)
        self.inventory = discover(sim, sim.sysfs_root)
        self.node = node
        self.taints: dict[str, list[DeviceTaint]] = {}

    def __call__(self, generation: int, node_uid: str | None) -> list[ResourceSlice]:
        return build_slices(
            self.inventory,
            node_name=self.node,
            k8s_version="1.36",
            generation=generation,
            node_uid=node_uid,
            taints=self.taints,
        )


def pool(cp: Any, node: str) -> list[dict[str, Any]]:
    items = cp.kubectl_json("get", "resourceslices", "--field-selector", f"spec.nodeName={node}")
    return sorted(items["items"], key=lambda o: o["metadata"]["name"])


def pool_complete(cp: Any, node: str, slices: int, generation: int | None = None) -> bool:
    items = pool(cp, node)
    gens = {o["spec"]["pool"]["generation"] for o in items}
    return (
        len(items) == slices
        and len(gens) == 1
        and (generation is None or gens == {generation})
        and all(o["spec"]["pool"]["resourceSliceCount"] == slices for o in items)
    )


@pytest.fixture
def node_publisher(control_plane, tmp_path: Path) -> Iterator[Callable[..., tuple[Publisher, Desired]]]:
    started: list[Publisher] = []

    def start(node: str, machine: str = "dgx-h200") -> tuple[Publisher, Desired]:
        control_plane.create_node(node)
        desired = Desired(machine, node, tmp_path / node)
        pub = Publisher(
            api_client(control_plane.kubeconfig),
            node_name=node,
            driver=DEFAULT_DRIVER_NAME,
            desired=desired,
            backoff_initial=0.2,
            backoff_max=2.0,
            metrics=PublisherMetrics(CollectorRegistry()),
        )
        pub.start()
        started.append(pub)
        return pub, desired

    yield start
    for pub in started:
        pub.stop()
        control_plane.delete("resourceslices", wait=120, field_selector=f"spec.nodeName={pub.node_name}")
        control_plane.delete_node(pub.node_name)


def test_initial_publish(control_plane, node_publisher) -> None:
    pub, _ = node_publisher("pub-initial")
    wait_for("pool published", lambda: pool_complete(control_plane, "pub-initial", DGX_H100_SLICES, 1))
    items = pool(control_plane, "pub-initial")
    assert sum(len(o["spec"].get("devices") or []) for o in items) == 208
    node_uid = control_plane.kubectl_json("get", "node", "pub-initial")["metadata"]["uid"]
    assert all(o["metadata"]["ownerReferences"][0]["uid"] == node_uid for o in items)
    writes = pub.stats.writes
    pub.trigger()
    wait_for("resync", lambda: pub.in_sync.is_set())
    time.sleep(1)
    assert pub.stats.writes == writes  # nothing changed: no write


def test_stop_interrupts_the_watch(control_plane, node_publisher) -> None:
    """stop() must not sit out the watch's 30 s server timeout: the kubelet's grace period is as long."""
    pub, _ = node_publisher("pub-stop")
    wait_for("pool published", lambda: pool_complete(control_plane, "pub-stop", DGX_H100_SLICES, 1))
    time.sleep(1)  # the watch is established and idle: nothing will arrive on it for 30 s
    began = time.monotonic()
    pub.stop()
    assert time.monotonic() - began < 10
    assert not any(t.is_alive() for t in pub._threads)


def test_each_watch_window_resumes_where_the_last_ended(control_plane, node_publisher, monkeypatch) -> None:
    """A watch from the current state replays every slice as ADDED: a full reconcile (a list, the slices built)
    per window, per node. Windows resume from the last event's resourceVersion; every RESYNC_WINDOWS-th starts
    afresh, and a change made behind the publisher's back between windows is still seen and repaired."""
    monkeypatch.setattr(publisher_module, "WATCH_SECONDS", 1)
    monkeypatch.setattr(publisher_module, "RESYNC_WINDOWS", 1000)
    pub, _ = node_publisher("pub-resume")
    wait_for("pool published", lambda: pool_complete(control_plane, "pub-resume", DGX_H100_SLICES, 1))
    time.sleep(1.5)  # the first window (from the current state) has ended
    syncs = pub.stats.syncs
    time.sleep(4)  # four more windows of one second
    assert pub.stats.syncs == syncs, "a watch window that resumed replayed the pool"
    name = pool(control_plane, "pub-resume")[0]["metadata"]["name"]
    control_plane.delete("resourceslice", name, missing_ok=False, wait=120)
    wait_for("slice restored", lambda: pool_complete(control_plane, "pub-resume", DGX_H100_SLICES))
    assert pub.stats.syncs > syncs


def test_device_change_bumps_the_generation(control_plane, node_publisher) -> None:
    pub, desired = node_publisher("pub-change")
    wait_for("pool published", lambda: pool_complete(control_plane, "pub-change", DGX_H100_SLICES, 1))
    desired.taints = {"gpu-3": [DeviceTaint(key="gpu.dra-driver.dev/xid", value="79", effect="NoExecute")]}
    pub.trigger()
    wait_for("generation 2", lambda: pool_complete(control_plane, "pub-change", DGX_H100_SLICES, 2))
    gpu3 = [
        d for o in pool(control_plane, "pub-change") for d in o["spec"].get("devices") or [] if d["name"] == "gpu-3"
    ]
    assert gpu3[0]["taints"][0]["effect"] == "NoExecute" and "timeAdded" in gpu3[0]["taints"][0]


def test_slices_deleted_behind_its_back_are_restored(control_plane, node_publisher) -> None:
    _pub, _ = node_publisher("pub-repair")
    wait_for("pool published", lambda: pool_complete(control_plane, "pub-repair", DGX_H100_SLICES, 1))
    # what the kubelet does when it restarts: delete every slice of the node
    control_plane.delete("resourceslices", wait=120, field_selector="spec.nodeName=pub-repair")
    wait_for("pool restored", lambda: pool_complete(control_plane, "pub-repair", DGX_H100_SLICES))
    victim = pool(control_plane, "pub-repair")[3]["metadata"]["name"]
    control_plane.kubectl(
        "patch", "resourceslice", victim, "--type=json", "-p", '[{"op": "remove", "path": "/spec/devices/0"}]'
    )
    wait_for(
        "edit repaired",
        lambda: (
            pool_complete(control_plane, "pub-repair", DGX_H100_SLICES)
            and sum(len(o["spec"].get("devices") or []) for o in pool(control_plane, "pub-repair")) == 208
        ),
    )


def test_a_pool_changed_between_list_and_write_is_routine_a_few_times_in_a_row_then_a_warning(
    control_plane, node_publisher, monkeypatch, caplog
) -> None:
    """A kubelet that restarts wipes the node's slices, maybe between the publisher's list and its writes: the
    write gets 404, the next pass lists again. That is logged at INFO a few times in a row; more is a WARNING."""
    pub, desired = node_publisher("pub-race")
    wait_for("pool published", lambda: pool_complete(control_plane, "pub-race", DGX_H100_SLICES, 1))
    listed = Publisher._list
    races = [0]
    budget = [0]
    change: list[dict[str, list[DeviceTaint]]] = []  # the inventory change a racing list makes
    stale: list[dict[str, Any]] = []

    def racing_list(self: Publisher) -> list[dict[str, Any]]:
        """The pool as listed, deleted right after; the same stale list again while `budget` lasts. The first
        racing list also makes the change, so that the pass it belongs to writes: a change made by the test could
        be taken up by a pass already under way (woken by the watch), leaving nothing to write after the race."""
        items = stale or listed(self)
        if self.node_name == "pub-race" and races[0] < budget[0]:
            if change:
                desired.taints = change.pop()  # sync_once builds the desired pool after its list
            stale[:] = items if budget[0] > 1 else []
            control_plane.delete("resourceslices", wait=120, field_selector="spec.nodeName=pub-race")
            races[0] += 1  # after the delete: the waits below must not take the pool from before it for the new one
            return items
        stale.clear()
        return listed(self)

    def failures(level: int) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == publisher_module.__name__ and r.levelno == level
                and "failed" in r.getMessage()]  # fmt: skip

    caplog.set_level(logging.INFO, logger=publisher_module.__name__)
    monkeypatch.setattr(Publisher, "_list", racing_list)
    change.append({"gpu-3": [DeviceTaint(key="gpu.dra-driver.dev/xid", value="79", effect="NoExecute")]})
    budget[0] = 1
    pub.trigger()
    wait_for(
        "pool republished after the race",
        lambda: races[0] == 1 and pool_complete(control_plane, "pub-race", DGX_H100_SLICES),
    )
    assert len(failures(logging.INFO)) == 1 and "Not Found" in failures(logging.INFO)[0]
    assert failures(logging.WARNING) == []
    change.append({})
    budget[0] = 2 + publisher_module.QUIET_RACES  # one more than is routine, in a row
    pub.trigger()
    wait_for("pool republished after more in a row", lambda: races[0] == budget[0]
             and pool_complete(control_plane, "pub-race", DGX_H100_SLICES))  # fmt: skip
    assert len(failures(logging.INFO)) == 1 + publisher_module.QUIET_RACES and len(failures(logging.WARNING)) == 1


def test_two_publishers_two_nodes(control_plane, node_publisher) -> None:
    node_publisher("pub-a", "dgx-h100")
    node_publisher("pub-b", "dgx-a100")
    wait_for(
        "both pools",
        lambda: pool_complete(control_plane, "pub-a", DGX_H100_SLICES) and pool_complete(control_plane, "pub-b", 1),
    )
    assert {o["spec"]["nodeName"] for o in pool(control_plane, "pub-a")} == {"pub-a"}
    assert len(pool(control_plane, "pub-b")[0]["spec"]["devices"]) == 8  # A100s with MIG off: whole GPUs


def test_api_server_stopped_and_restarted_mid_publish(control_plane, node_publisher) -> None:
    pub, desired = node_publisher("pub-outage")
    wait_for("pool published", lambda: pool_complete(control_plane, "pub-outage", DGX_H100_SLICES, 1))
    control_plane.stop_apiserver()
    try:
        desired.taints = {"gpu-5": [DeviceTaint(key="gpu.dra-driver.dev/lost", effect="NoExecute")]}
        pub.trigger()
        wait_for("a failed attempt", lambda: pub.stats.errors > 0, timeout=30)
        assert not pub.in_sync.is_set() and pub.last_error
    finally:
        control_plane.start_apiserver()
    wait_for(
        "republished after the outage",
        lambda: pool_complete(control_plane, "pub-outage", DGX_H100_SLICES, 2),
        timeout=90,
    )
    tainted = [d for o in pool(control_plane, "pub-outage") for d in o["spec"].get("devices") or [] if d.get("taints")]
    assert [d["name"] for d in tainted] == ["gpu-5"]
