"""The plugin as the kubelet meets it: registration over the real sockets, then prepare/unprepare through
DRA v1 and v1beta1, carving MIG devices on the simulated GPUs and writing CDI specs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.cdi.spec import spec_file_name
from dra_driver.plugin.grpc.server import PluginServer
from tests.kubelet_harness import KubeletHarness
from tests.plugin_helpers import DRIVER, Node, claim, ref


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Node, KubeletHarness, CollectorRegistry]]:
    node = Node(tmp_path)
    driver = node.driver()
    registry = CollectorRegistry()
    # short paths: AF_UNIX socket paths are limited to 107 bytes
    sockets = Path(f"/tmp/dra-e2e-{tmp_path.name[-12:]}")
    server = PluginServer(driver, DRIVER, sockets / "plugin", sockets / "registry", registry, serialize=False)
    server.start()
    harness = KubeletHarness(sockets / "registry", DRIVER)
    try:
        harness.register()
        yield node, harness, registry
    finally:
        harness.close()
        server.stop()
        driver.close()


def test_kubelet_prepares_and_unprepares_through_the_sockets(stack) -> None:
    node, kubelet, registry = stack
    mig = claim(["gpu-0-mig-2g20gb-14-4", "gpu-0-mig-1g10gb-19-6"], device_class="mig")
    whole = claim(["gpu-7"])
    node.add(mig, whole)
    out = kubelet.prepare([ref(mig)])  # v1, as the kubelet prefers
    result = out[mig["metadata"]["uid"]]
    assert result.error == ""
    assert sorted(d.device for d in result.devices) == ["gpu-0-mig-1g10gb-19-6", "gpu-0-mig-2g20gb-14-4"]
    assert node.mig_instances() == [(0, 14, 4), (0, 19, 6)]
    out_beta = kubelet.prepare([ref(whole)], version="v1beta1")
    (dev,) = out_beta[whole["metadata"]["uid"]].devices
    assert dev.cdi_device_ids == [f"k8s.{DRIVER}/claim={whole['metadata']['uid']}-gpu-7"]
    spec = json.loads((node.cdi_root / spec_file_name(DRIVER, mig["metadata"]["uid"])).read_text())
    assert len(spec["devices"]) == 2
    assert kubelet.prepare([ref(mig)]) == out  # idempotent through the socket too
    assert kubelet.unprepare([ref(mig), ref(whole)]) == {mig["metadata"]["uid"]: "", whole["metadata"]["uid"]: ""}
    assert node.mig_instances() == [] and node.cdi_files() == []
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for s in f.samples
    }
    prepared = [
        v
        for (name, labels), v in samples.items()
        if name == "dra_driver_grpc_requests_total" and ("method", "NodePrepareResources") in labels
    ]
    assert sum(prepared) == 3


def test_errors_reach_the_kubelet_per_claim(stack) -> None:
    node, kubelet, _ = stack
    good, bad = claim(["gpu-1"]), claim(["gpu-42"])
    node.add(good, bad)
    out = kubelet.prepare([ref(good), ref(bad)])
    assert out[good["metadata"]["uid"]].error == ""
    assert "gpu-42 is not a device of this node" in out[bad["metadata"]["uid"]].error
    assert node.cdi_files() == [spec_file_name(DRIVER, good["metadata"]["uid"])]


def test_concurrent_kubelet_calls_leave_a_consistent_state(stack) -> None:
    node, kubelet, _ = stack
    devices = [f"gpu-{g}-mig-1g10gb-19-{s}" for g in range(2, 5) for s in range(7)]
    claims = [claim([devices[i % len(devices)]], device_class="mig") for i in range(40)]
    node.add(*claims)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda c: kubelet.prepare([ref(c)])[c["metadata"]["uid"]], claims))
    ok = [c for c, r in zip(claims, results, strict=True) if not r.error]
    assert len(ok) == len(devices)  # each partition went to exactly one claim
    assert len(node.mig_instances()) == len(devices) and len(node.cdi_files()) == len(devices)
    kubelet.unprepare([ref(c) for c in claims])
    assert node.mig_instances() == [] and node.cdi_files() == []
