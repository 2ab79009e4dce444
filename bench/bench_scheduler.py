"""What our slices cost the real kube-scheduler: pods with claims scheduled per second on simulated dgx-h100 nodes
(Node objects and ResourceSlices created through the API, no daemons, no kubelets), for each publish layout, each in a
control plane of its own (tests/cluster), with the scheduler's own metrics scraped from its /metrics.

Layouts: partitionable (our default: 8 GPUs + every MIG placement, with counters), static (MIG off on this machine:
whole GPUs, no counters), gpus (whole GPUs only). Workloads: whole-GPU claims on every layout, and a MIG mix
(1g.10gb and 3g.40gb partitions and whole GPUs) where the layout offers MIG. Each pod has one claim; all pods are
created at once and timed until every one is bound (spec.nodeName set).

With --extended: whole GPUs asked for by a claim of the pod's, and by `nvidia.com/gpu: 1` in its limits as written
for NVIDIA's device plugin (the scheduler creates the claim), side by side on the static and partitionable layouts.

NVIDIA's slices: for the static and partitionable layouts, the same workload on the slices NVIDIA's own kubelet
plugin (gpu-kubelet-plugin v0.5.0, tests/nvidia_driver.py) publishes for one simulated dgx-h100 node with its default
gates (whole GPUs, no counters: beside our static) and with DynamicMIG (whole GPUs and every MIG partition with
counters: beside our partitionable), captured once per Kubernetes version from the real plugin against that version's
API server and replicated for every bench node (node and pool renamed), with NVIDIA's chart's DeviceClasses
(gpu.nvidia.com, mig.nvidia.com; a MIG profile selected in the claim's request). Rows `NVIDIA default` and
`NVIDIA DynamicMIG`, each run right after ours for the same layout (`--no-nvidia` leaves them out).

With --numa: pods with one claim of four whole GPUs, with and without `matchAttribute` on the GPUs' NUMA node
(`numaNode`: a DGX H100 has four GPUs per NUMA node), two pods per node, on the static layout.

Each Kubernetes version (`--k8s`: the primary one and each of the matrix by default) in control planes of its own.

Run: python bench/bench_scheduler.py [--quick | --extended | --numa | --layouts L,...] [--nodes N]
[--pods-per-node K | --pods P] [--k8s primary,v1.36.3] [--no-nvidia]. Prints one table.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME, numa_node_attribute
from dra_driver.slices.devices import PublishMode
from dra_driver.slices.limits import parse_minor
from tests.cluster.controlplane import (
    LAYOUT_GATES,
    ControlPlane,
    layout_runtime_config,
    matrix_versions,
    primary_version,
)
from tests.test_allocbench import class_name, classes, fleet
from tests.test_publisher import api_client

NVIDIA_DRIVER = "gpu.nvidia.com"  # tests/nvidia_driver.py's, not imported: it needs the simulator's library build
# NVIDIA's gates for its counterpart of each of our layouts, and the name of its rows
NVIDIA_LAYOUTS = {
    PublishMode.STATIC: ({}, "NVIDIA default"),
    PublishMode.PARTITIONABLE: ({"DynamicMIG": True}, "NVIDIA DynamicMIG"),
}
NVIDIA_WORKLOADS = ("whole GPUs", "MIG mix")  # claims that say what they want in NVIDIA's attributes too
_CAPTURE_NODE = "nvidia-capture"
_captured: dict[tuple[str, PublishMode], str] = {}  # (server version, layout) -> one node's slices, NODE-NAME in them

NS = "default"
SCHEDULE_TIMEOUT_S = 600.0
WORKLOADS = {"whole GPUs": ("gpu",), "MIG mix": ("mig-1g.10gb", "gpu", "mig-3g.40gb", "mig-1g.10gb")}
# Pods as written for NVIDIA's device plugin: the resource in limits, no claim; the scheduler makes one per pod from
# the class whose extendedResourceName it is (deviceclasses/gpu.yaml, mig-*.yaml).
EXTENDED = "nvidia.com/gpu in limits"
WORKLOADS[EXTENDED] = ("gpu",)
FOUR, FOUR_NUMA = "4 GPUs", "4 GPUs on one NUMA node"
WORKLOADS[FOUR] = WORKLOADS[FOUR_NUMA] = ("gpu",)
METRICS = {
    "attempt": ("scheduler_scheduling_attempt_duration_seconds", {"result": "scheduled"}),
    "prefilter": ("scheduler_plugin_execution_duration_seconds", {"plugin": "DynamicResources",
                                                                   "extension_point": "PreFilter"}),
    "filter": ("scheduler_plugin_execution_duration_seconds", {"plugin": "DynamicResources",
                                                                "extension_point": "Filter"}),
}  # fmt: skip


def create_nodes(api: Any, names: list[str]) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    capacity = {"cpu": "100", "memory": "1000Gi", "pods": "5000"}
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet-less bench node"}

    def one(name: str) -> None:
        core.create_node({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
        status = {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [ready]}}
        core.patch_node_status(name, status)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, names))


def create_all(api: Any, plural: str, items: list[dict[str, Any]], namespaced: bool) -> None:
    from kubernetes import client

    objects = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)

    def one(obj: dict[str, Any]) -> None:
        if plural == "pods":
            core.create_namespaced_pod(NS, obj)
        elif namespaced:
            objects.create_namespaced_custom_object("resource.k8s.io", "v1", NS, plural, obj)
        else:
            objects.create_cluster_custom_object("resource.k8s.io", "v1", plural, obj)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, items))


def extended_resource_pod(i: int, resource: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i:05d}"},
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/x",
                                     "resources": {"limits": {resource: "1"}}}]}}  # fmt: skip


def claim_and_pod(i: int, cls: str, workload: str, minor: int) -> tuple[dict[str, Any], dict[str, Any]]:
    name = f"p{i:05d}"
    exactly: dict[str, Any] = {"deviceClassName": class_name(cls)}
    devices: dict[str, Any] = {"requests": [{"name": "r", "exactly": exactly}]}
    if workload in (FOUR, FOUR_NUMA):
        exactly["count"] = 4
    if workload == FOUR_NUMA:
        numa = numa_node_attribute(minor)  # 1.37's standard name, our domain's before
        devices["constraints"] = [{"matchAttribute": numa if "/" in numa else f"{DEFAULT_DRIVER_NAME}/{numa}"}]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"containers": [{"name": "c", "image": "registry.invalid/x",
                                    "resources": {"claims": [{"name": "g"}]}}],
                    "resourceClaims": [{"name": "g", "resourceClaimName": name}]}}  # fmt: skip
    return claim, pod


def nvidia_classes() -> list[dict[str, Any]]:
    """NVIDIA's chart's DeviceClasses for GPUs (deployments/helm/.../deviceclass-gpu.yaml, deviceclass-mig.yaml)."""
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": f"{kind}.nvidia.com"},
         "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{NVIDIA_DRIVER}' && "
                                                       f"device.attributes['{NVIDIA_DRIVER}'].type == '{kind}'"}}]}}
        for kind in ("gpu", "mig")
    ]  # fmt: skip


def nvidia_claim(claim: dict[str, Any], cls: str) -> dict[str, Any]:
    """The same claim for NVIDIA's slices: its class, and a MIG profile as a selector of the request."""
    (request,) = claim["spec"]["devices"]["requests"]
    exactly = request["exactly"]
    if cls == "gpu":
        exactly["deviceClassName"] = "gpu.nvidia.com"
    else:
        profile = cls.removeprefix("mig-")
        exactly["deviceClassName"] = "mig.nvidia.com"
        exactly["selectors"] = [{"cel": {"expression": f"device.attributes['{NVIDIA_DRIVER}'].profile == '{profile}'"}}]
    for constraint in claim["spec"]["devices"].get("constraints") or []:
        constraint["matchAttribute"] = constraint["matchAttribute"].replace(DEFAULT_DRIVER_NAME, NVIDIA_DRIVER)
    return claim


def capture_nvidia_slices(cp: ControlPlane, mode: PublishMode, work: Path) -> str:
    """The slices NVIDIA's plugin publishes for one simulated dgx-h100 node with the gates of its counterpart of
    `mode`, against `cp`'s API server (once per server version and layout): as JSON with the node's name (and so its
    pool's) written NODE-NAME, and without what the server set (names, uids, owner, versions)."""
    from dra_driver.simulator.nvml import SimulatedNvml
    from tests.nvidia_driver import NvidiaKubeletPlugin

    key = (cp.server_version(), mode)
    if key not in _captured:
        gates, _ = NVIDIA_LAYOUTS[mode]
        sim = SimulatedNvml("dgx-h100", work / f"nvidia-{mode.value}" / "machine")
        cp.create_node(_CAPTURE_NODE)
        try:
            with NvidiaKubeletPlugin(cp, sim, _CAPTURE_NODE, work / f"nvidia-{mode.value}" / "plugin",
                                     feature_gates=gates) as plugin:  # fmt: skip
                published = plugin.wait_published()
        finally:
            cp.delete_node(_CAPTURE_NODE)
        stripped = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                     "metadata": {"name": f"NODE-NAME-{NVIDIA_DRIVER}-{i}"}, "spec": s["spec"]}
                    for i, s in enumerate(published)]  # fmt: skip
        _captured[key] = json.dumps(stripped).replace(f'"{_CAPTURE_NODE}"', '"NODE-NAME"')
    return _captured[key]


def nvidia_fleet(cp: ControlPlane, nodes: int, mode: PublishMode, work: Path) -> tuple[list[str], list[Any]]:
    """Node names and NVIDIA's slices for that many nodes, as `fleet` gives ours: one node's, renamed."""
    names = [f"node-{i:03d}" for i in range(nodes)]
    one = capture_nvidia_slices(cp, mode, work)
    return names, [s for name in names for s in json.loads(one.replace("NODE-NAME", name))]


def bound(api: Any) -> int:
    from kubernetes import client

    pods = client.CoreV1Api(api).list_namespaced_pod(NS).items
    return sum(1 for p in pods if p.spec.node_name)


class Metrics:
    """The scheduler's /metrics, read with a service account token allowed to (delegated authn/authz)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.url = f"https://127.0.0.1:{cp.scheduler_port}/metrics"
        rbac = [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bench-metrics", "namespace": NS}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "bench-metrics"},
             "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "bench-metrics"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "bench-metrics"},
             "subjects": [{"kind": "ServiceAccount", "name": "bench-metrics", "namespace": NS}]},
        ]  # fmt: skip
        cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac}))
        self.token = cp.kubectl("create", "token", "bench-metrics", "-n", NS).stdout.strip()
        self.context = ssl.create_default_context()
        self.context.check_hostname = False
        self.context.verify_mode = ssl.CERT_NONE  # the scheduler's self-signed serving cert, loopback only

    def read(self) -> dict[str, tuple[float, float]]:
        """(sum, count) of each histogram in METRICS."""
        request = urllib.request.Request(self.url, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=30, context=self.context) as response:
            text = response.read().decode()
        out: dict[str, tuple[float, float]] = {}
        for key, (name, labels) in METRICS.items():
            total = count = 0.0
            for line in text.splitlines():
                if not line.startswith((name + "_sum{", name + "_count{")):
                    continue
                head, value = line.rsplit(" ", 1)
                if all(f'{k}="{v}"' in head for k, v in labels.items()):
                    if head.startswith(name + "_sum"):
                        total += float(value)
                    else:
                        count += float(value)
            out[key] = (total, count)
        return out


def run_layout(
    mode: PublishMode,
    workload: str,
    nodes: int,
    pods: int,
    tmp: Path,
    version: str | None = None,
    nvidia: bool = False,
) -> dict[str, Any]:
    """One row: our slices for `mode` (the layout that version's users get), or with `nvidia` NVIDIA's for its
    counterpart (NVIDIA_LAYOUTS), on `nodes` nodes, `pods` pods of `workload`, in a control plane of its own."""
    k8s_version = version or primary_version()
    if nvidia and (mode not in NVIDIA_LAYOUTS or workload not in NVIDIA_WORKLOADS):
        raise ValueError(f"no NVIDIA counterpart of {mode.value} with {workload}")

    kinds = WORKLOADS[workload]
    # a version of the matrix with the gates its users turn on for these layouts (alpha before 1.36)
    with ControlPlane(version=version, feature_gates=LAYOUT_GATES if version else None,
                      runtime_config=layout_runtime_config(version)) as cp:  # fmt: skip
        server = cp.server_version()
        if nvidia:  # captured before the clock and the bench nodes: its plugin publishes for a node of its own
            names, slices = nvidia_fleet(cp, nodes, mode, tmp)
        else:
            names, slices = fleet(nodes, tmp, mode, k8s_version)
        api = api_client(cp.kubeconfig)
        metrics = Metrics(cp)
        create_nodes(api, names)
        create_all(api, "deviceclasses", nvidia_classes() if nvidia else classes(), namespaced=False)
        t = time.monotonic()
        create_all(api, "resourceslices", slices, namespaced=False)
        publish_s = time.monotonic() - t
        if workload == EXTENDED:
            to_create = [extended_resource_pod(i, "nvidia.com/gpu") for i in range(pods)]
        else:
            pairs = [claim_and_pod(i, kinds[i % len(kinds)], workload, parse_minor(k8s_version)) for i in range(pods)]
            if nvidia:
                pairs = [(nvidia_claim(c, kinds[i % len(kinds)]), p) for i, (c, p) in enumerate(pairs)]
            create_all(api, "resourceclaims", [c for c, _ in pairs], namespaced=True)
            to_create = [p for _, p in pairs]
        time.sleep(2.0)  # the scheduler's informers catch up with the slices and claims before the clock starts
        before = metrics.read()
        t0 = time.monotonic()
        create_all(api, "pods", to_create, namespaced=True)
        created_s = time.monotonic() - t0
        done = 0
        while time.monotonic() - t0 < SCHEDULE_TIMEOUT_S:
            done = bound(api)
            if done == pods:
                break
            time.sleep(0.2)
        elapsed = time.monotonic() - t0
        after = metrics.read()
    devices = sum(len(s["spec"].get("devices") or []) for s in slices) // nodes
    mean = {}
    for key in METRICS:
        d_sum, d_count = after[key][0] - before[key][0], after[key][1] - before[key][1]
        mean[key] = (1000 * d_sum / d_count if d_count else float("nan"), int(d_count))
    layout = NVIDIA_LAYOUTS[mode][1] if nvidia else mode.value
    return {"kubernetes": server, "layout": layout, "workload": workload, "devices": devices,
            "slices": len(slices) // nodes, "pods": pods, "bound": done, "seconds": elapsed, "create_s": created_s,
            "publish_s": publish_s, "mean": mean}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="20 nodes, 1 pod per node, whole GPUs on two layouts")
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--pods-per-node", type=int, default=1)
    parser.add_argument("--pods", type=int, help="this many pods in all instead (a slow layout on many nodes)")
    parser.add_argument("--k8s", default=",".join(["primary", *matrix_versions()]),
                        help="comma-separated Kubernetes versions: primary (tools/k8sbins/go.mod) and versions of "
                             "the matrix (tools/k8sbins/versions/); default: all")  # fmt: skip
    parser.add_argument("--layouts", help="comma-separated layouts (partitionable,static,gpus) for whole GPUs only")
    parser.add_argument("--extended", action="store_true",
                        help=f"whole GPUs asked for by a claim vs by {EXTENDED}, on the static and partitionable "
                             "layouts")  # fmt: skip
    parser.add_argument("--no-nvidia", action="store_true",
                        help="leave out the rows of NVIDIA's slices (its default gates beside static, DynamicMIG "
                             "beside partitionable)")  # fmt: skip
    parser.add_argument(
        "--numa", action="store_true", help="four-GPU claims with and without matchAttribute on numaNode, two per node"
    )
    args = parser.parse_args()
    nodes, per_node = (20, 1) if args.quick else (args.nodes, args.pods_per_node)
    cases = [(PublishMode.PARTITIONABLE, "whole GPUs"), (PublishMode.GPUS, "whole GPUs")]
    if args.numa:
        per_node = 2  # four GPUs each: a DGX H100 full
        cases = [(PublishMode.STATIC, FOUR), (PublishMode.STATIC, FOUR_NUMA)]
    elif args.extended:
        cases = [(m, w) for m in (PublishMode.STATIC, PublishMode.PARTITIONABLE) for w in ("whole GPUs", EXTENDED)]
    elif args.layouts:
        cases = [(PublishMode(m), "whole GPUs") for m in args.layouts.split(",")]
    elif not args.quick:
        cases = [(PublishMode.PARTITIONABLE, "whole GPUs"), (PublishMode.PARTITIONABLE, "MIG mix"),
                 (PublishMode.STATIC, "whole GPUs"), (PublishMode.GPUS, "whole GPUs")]  # fmt: skip
    pods = args.pods or nodes * per_node
    versions = [None if v == "primary" else v for v in args.k8s.split(",")]
    made = f" (made by the scheduler for the {EXTENDED} workload)" if args.extended else ""
    print(
        f"{nodes} nodes (dgx-h100), {pods} pods, one claim per pod{made}, "
        "each Kubernetes version and layout in a control plane of its own"
    )
    print("| kubernetes | layout | workload | devices/node | slices/node | pods bound | seconds | pods/s "
          "| attempt ms (n) | DRA PreFilter ms (n) | DRA Filter ms (n) | slices created in s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for version in versions:
            runs = []
            for mode, workload in cases:  # NVIDIA's slices right after ours for the same layout and workload
                runs.append((mode, workload, False))
                if not args.no_nvidia and mode in NVIDIA_LAYOUTS and workload in NVIDIA_WORKLOADS:
                    runs.append((mode, workload, True))
            for mode, workload, nvidia in runs:  # a row as soon as it is measured: a layout takes minutes
                r = run_layout(mode, workload, nodes, pods, Path(tmp), version, nvidia=nvidia)
                m = r["mean"]
                print(f"| {r['kubernetes']} | {r['layout']} | {r['workload']} | {r['devices']} | {r['slices']} "
                      f"| {r['bound']}/{r['pods']} "
                      f"| {r['seconds']:.1f} | {r['bound'] / r['seconds']:.1f} "
                      f"| {m['attempt'][0]:.1f} ({m['attempt'][1]}) | {m['prefilter'][0]:.2f} ({m['prefilter'][1]}) "
                      f"| {m['filter'][0]:.2f} ({m['filter'][1]}) | {r['publish_s']:.1f} |", flush=True)  # fmt: skip
    print(
        "attempt: scheduler_scheduling_attempt_duration_seconds{result=scheduled}, mean; DRA PreFilter/Filter: "
        "scheduler_plugin_execution_duration_seconds{plugin=DynamicResources}, mean of the sampled cycles"
    )


if __name__ == "__main__":
    main()
