"""Time from publisher start to a dgx-h200 node's whole pool being visible through the API, and the API
requests it took; also a republish after a device change. Starts its own control plane (tests/cluster).

Run: python bench/bench_publisher.py [--runs N]. Prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry

from dra_driver.api.slice import DeviceTaint
from dra_driver.controller.metrics import PublisherMetrics
from dra_driver.controller.publisher import Publisher
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME
from tests.cluster.controlplane import ControlPlane
from tests.test_publisher import Desired, api_client


def visible(objects, node: str, generation: int, count: int) -> bool:  # type: ignore[no-untyped-def]
    items = objects.list_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.nodeName={node}"
    )["items"]
    return len(items) == count and all(o["spec"]["pool"]["generation"] == generation for o in items)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from kubernetes import client

    rows = []
    with ControlPlane() as cp, tempfile.TemporaryDirectory() as tmp:
        objects = client.CustomObjectsApi(api_client(cp.kubeconfig))
        for run in range(args.runs):
            node = f"bench-{run}"
            cp.create_node(node)
            desired = Desired("dgx-h200", node, Path(tmp) / node)
            pub = Publisher(
                api_client(cp.kubeconfig),
                node_name=node,
                driver=DEFAULT_DRIVER_NAME,
                desired=desired,
                metrics=PublisherMetrics(CollectorRegistry()),
            )
            t0 = time.perf_counter()
            pub.start()
            while not visible(objects, node, 1, 9):
                time.sleep(0.005)
            first = time.perf_counter() - t0
            requests_first = pub.stats.requests
            desired.taints = {"gpu-0": [DeviceTaint(key="gpu.dra-driver.dev/xid", value="48", effect="NoSchedule")]}
            t1 = time.perf_counter()
            pub.trigger()
            while not visible(objects, node, 2, 9):
                time.sleep(0.005)
            second = time.perf_counter() - t1
            time.sleep(0.5)  # let the watch events of our own writes settle before reading the counters
            pub.stop()
            rows.append((first, requests_first, second, pub.stats.requests - requests_first))
    print(f"dgx-h200 pool (9 slices, 208 devices) through a real kube-apiserver ({args.runs} runs)")
    print(f"{'':<24} {'median':>9} {'min':>9} {'max':>9}")
    for label, idx, scale, unit in (
        ("initial publish", 0, 1e3, "ms"),
        ("  API requests", 1, 1, ""),
        ("republish after change", 2, 1e3, "ms"),
        ("  API requests", 3, 1, ""),
    ):
        vals = [r[idx] * scale for r in rows]
        cells = "".join(f" {v:>7.0f}{unit:<2}" for v in (statistics.median(vals), min(vals), max(vals)))
        print(f"{label:<24}{cells}")


if __name__ == "__main__":
    main()
