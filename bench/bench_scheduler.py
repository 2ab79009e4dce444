"""What our slices cost the real kube-scheduler: pods with claims scheduled per second on simulated dgx-h100 nodes
(Node objects and ResourceSlices created through the API, no daemons, no kubelets), for each publish layout, each in a
control plane of its own (tests/cluster), with the scheduler's own metrics scraped from its /metrics.

Layouts: static (MIG off on this machine: whole GPUs, no counters), partitionable (8 GPUs + every MIG placement,
with counters), shared (whole GPUs that claims share by memory: consumable capacity), gpus (whole GPUs only).
Workloads: whole-GPU claims on every layout, and a MIG mix (1g.10gb and 3g.40gb partitions and whole GPUs) where the
layout offers MIG. Each pod has one claim.

What caps the figure: kube-scheduler runs with its client limits raised (RAISED: `clientConnection` QPS and burst
5000; its defaults, 50 and 100, cap every layout near 16 pods/s at 100 nodes), read back from its /configz and
printed with every table; "as deployed" rows keep the defaults (SCHEDULER_DEFAULT_CLIENT) for the static and
partitionable layouts. The API server's limits are printed too. Each fill level's pods are created while
kube-scheduler is stopped (SIGSTOP) and timed from its SIGCONT to the last pod bound (a watch: no lists), so
neither this process's create rate nor a polling interval is in the figure.

Fill levels (`--fills`, default 0,50,90): as scheduler_perf's steady-state cases, that percentage of every node's GPUs
is allocated (claims written allocated, a whole GPU each; a GPU counts once anything on it is allocated) before the
level's pods; the levels run in turn in one control plane, each topping up what the pods of the level before took.

With --mig-profiles 1g.10gb,3g.40gb: the partitionable layout also with only those MIG profiles published (the
daemon's --mig-profiles, the chart's migProfiles).

With --profile SECONDS: a CPU profile of kube-scheduler (its /debug/pprof) over the first SECONDS of each
partitionable level, its top functions printed.

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

Run: python bench/bench_scheduler.py [--quick | --extended | --numa | --layouts L,...] [--nodes N,...]
[--pods-per-node K | --pods P] [--fills 0,50,90] [--k8s primary,v1.36.3] [--no-nvidia] [--no-as-deployed]
[--profile S]. Prints one table, then the limits in force.
"""

from __future__ import annotations

import argparse
import heapq
import http.client
import json
import math
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME, numa_node_attribute
from dra_driver.slices.devices import PublishMode
from dra_driver.slices.limits import parse_minor
from tests.cluster.controlplane import (
    LAYOUT_GATES,
    SCHEDULER_DEFAULT_CLIENT,
    ClientLimits,
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
# kube-scheduler's client limits for the measured rows: high enough that no layout here reaches them (a pod with a
# claim costs it a few writes: the claim's status, the binding, an event), as scheduler_perf runs its scheduler with
# no client limiter. The "as deployed" rows keep the defaults (SCHEDULER_DEFAULT_CLIENT) for the layouts below.
RAISED = ClientLimits(qps=5000, burst=5000)
AS_DEPLOYED_LAYOUTS = (PublishMode.STATIC, PublishMode.PARTITIONABLE)
FILLS = (0, 50, 90)  # percent of the cluster's GPUs allocated before the measured pods, as scheduler_perf's
# SteadyStateClusterResourceClaimTemplate's empty, half and full
APISERVER_LIMITS = (
    "kube-apiserver: --max-requests-inflight 400 and --max-mutating-requests-inflight 200 (its defaults), shared out "
    "by API Priority and Fairness; kube-scheduler and this bench authenticate as system:masters, whom APF's exempt "
    "FlowSchema serves without queueing or limit"
)
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


class Scheduler:
    """kube-scheduler's own HTTPS endpoints (/metrics, /configz, /debug/pprof), read with a service account token
    allowed to (its delegated authn/authz)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.url = f"https://127.0.0.1:{cp.scheduler_port}"
        rbac = [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bench-metrics", "namespace": NS}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "bench-metrics"},
             "rules": [{"nonResourceURLs": ["/metrics", "/configz", "/debug/pprof/*"], "verbs": ["get"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "bench-metrics"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "bench-metrics"},
             "subjects": [{"kind": "ServiceAccount", "name": "bench-metrics", "namespace": NS}]},
        ]  # fmt: skip
        cp.apply(*rbac)
        self.token = cp.kubectl("create", "token", "bench-metrics", "-n", NS).stdout.strip()
        self.context = ssl.create_default_context()
        self.context.check_hostname = False
        self.context.verify_mode = ssl.CERT_NONE  # the scheduler's self-signed serving cert, loopback only

    def get(self, path: str, timeout: float = 30.0) -> bytes:
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout, context=self.context) as response:
            return bytes(response.read())

    def config(self) -> dict[str, Any]:
        """The KubeSchedulerConfiguration in force, as the scheduler reports it (/configz), its keys as v1 spells
        them."""
        return configz_fields(json.loads(self.get("/configz"))["componentconfig"])

    def read(self) -> dict[str, tuple[float, float]]:
        """(sum, count) of each histogram in METRICS."""
        text = self.get("/metrics").decode()
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


def configz_fields(config: Any) -> Any:
    """/configz's keys as the versioned API spells them: 1.36 and 1.37 report `clientConnection.qps`, 1.35 and
    older their Go fields (`ClientConnection.QPS`)."""
    if isinstance(config, dict):
        return {(k.lower() if k.isupper() else k[:1].lower() + k[1:]): configz_fields(v) for k, v in config.items()}
    return [configz_fields(v) for v in config] if isinstance(config, list) else config


def limits_in_force(config: dict[str, Any]) -> str:
    """What caps the scheduler's pods/s besides its own work, from its /configz."""
    client = config["clientConnection"]
    return (f"QPS {client['qps']:g}, burst {client['burst']}, parallelism {config['parallelism']}, "
            f"percentageOfNodesToScore {config.get('percentageOfNodesToScore') or 'adaptive'}")  # fmt: skip


COMPATIBILITY_GATE = "DRADeviceCompatibilityGroups"  # KEP-5963, alpha in 1.37


def with_compatibility_groups(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our partitionable slices with device compatibility groups (KEP-5963) beside the counters: a whole GPU in group
    `whole` consuming one counter of its GPU's set (the API wants one), its partitions in group `mig` with their
    counters as before. A whole GPU and a partition of it then exclude each other by group, not by counters."""
    out = json.loads(json.dumps(slices))
    for s in out:
        for d in s["spec"].get("devices") or []:
            whole = d["attributes"]["type"]["string"] == "gpu"
            for c in d.get("consumesCounters") or []:
                if whole:
                    c["counters"] = dict(list(c["counters"].items())[:1])
                c["compatibilityGroups"] = ["whole" if whole else "mig"]
    return out


def gpu_groups(slices: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Per pool: each device's GPU, as the counter set it draws on (partitionable layouts) or its own name."""
    groups: dict[str, dict[str, str]] = {}
    for s in slices:
        pool = groups.setdefault(s["spec"]["pool"]["name"], {})
        for d in s["spec"].get("devices") or []:
            sets = sorted(c["counterSet"] for c in d.get("consumesCounters") or [])
            pool[d["name"]] = ",".join(sets) or d["name"]
    return groups


def whole_gpus(slices: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per pool: its whole-GPU devices with their driver, in the order published."""
    out: dict[str, list[dict[str, Any]]] = {}
    for s in slices:
        for d in s["spec"].get("devices") or []:
            if (d.get("attributes") or {}).get("type", {}).get("string") == "gpu":
                out.setdefault(s["spec"]["pool"]["name"], []).append({**d, "driver": s["spec"]["driver"]})
    return out


def fill_claims(
    slices: list[dict[str, Any]], allocated: list[dict[str, Any]], percent: int, start: int, device_class: str
) -> list[dict[str, Any]]:
    """Claims, each already allocated one whole GPU, that bring the cluster to `percent` of its GPUs in use (a GPU
    counts once any device on it is allocated: its whole device or a partition), as scheduler_perf's
    allocResourceClaims leaves a cluster before its steady-state pods; `allocated` are the results already in the
    cluster (the pods of a lower fill level, wherever the scheduler put them). Each claim goes to a node with the
    fewest GPUs in use (the first by name of those), on its first free GPU in the order published: the cluster fills
    evenly."""
    groups, gpus = gpu_groups(slices), whole_gpus(slices)
    used: dict[str, set[str]] = {pool: set() for pool in gpus}
    for r in allocated:
        used[r["pool"]].add(groups[r["pool"]][r["device"]])
    want = round(sum(map(len, gpus.values())) * percent / 100) - sum(map(len, used.values()))
    heap = [(len(used[pool]), pool) for pool in sorted(gpus) if len(used[pool]) < len(gpus[pool])]
    heapq.heapify(heap)
    claims = []
    while len(claims) < want and heap:
        count, pool = heapq.heappop(heap)
        d = next(d for d in gpus[pool] if groups[pool][d["name"]] not in used[pool])
        used[pool].add(groups[pool][d["name"]])
        if count + 1 < len(gpus[pool]):
            heapq.heappush(heap, (count + 1, pool))
        result: dict[str, Any] = {"request": "r", "driver": d["driver"], "pool": pool, "device": d["name"]}
        if d.get("allowMultipleAllocations"):  # a shared GPU taken whole: all of its memory, one share
            result["shareID"] = str(uuid.uuid4())
            result["consumedCapacity"] = {k: v["value"] for k, v in (d.get("capacity") or {}).items()}
        name = f"fill-{start + len(claims):05d}"
        selector = {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [pool]}]}]}  # fmt: skip
        claims.append({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": device_class}}]}},
            "status": {"allocation": {"devices": {"results": [result]}, "nodeSelector": selector}},
        })  # fmt: skip
    return claims


def free_gpus(slices: list[dict[str, Any]], allocated: list[dict[str, Any]]) -> int:
    """GPUs of the cluster on which nothing is allocated."""
    groups, gpus = gpu_groups(slices), whole_gpus(slices)
    used = {(r["pool"], groups[r["pool"]][r["device"]]) for r in allocated}
    return sum(1 for pool, devices in gpus.items() for d in devices if (pool, groups[pool][d["name"]]) not in used)


def allocated_results(cp: ControlPlane) -> list[dict[str, Any]]:
    claims = cp.api_call("GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")["items"]
    return [r for c in claims for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
        "results", [])]  # fmt: skip


def create_allocated(api: Any, claims: list[dict[str, Any]]) -> None:
    """Each claim created, then its allocation written through the status subresource, as the scheduler does."""
    from kubernetes import client

    objects = client.CustomObjectsApi(api)

    def one(claim: dict[str, Any]) -> None:
        body = {k: v for k, v in claim.items() if k != "status"}
        objects.create_namespaced_custom_object("resource.k8s.io", "v1", NS, "resourceclaims", body)
        name = claim["metadata"]["name"]
        objects.patch_namespaced_custom_object_status(
            "resource.k8s.io", "v1", NS, "resourceclaims", name, {"status": claim["status"]}
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, claims))


class BindWatch:
    """Watches the namespace's pods from `resource_version` on and notes when each of `names` is first seen bound
    (spec.nodeName set): one stream, no lists, so counting costs the 2-core machine next to nothing."""

    def __init__(self, cp: ControlPlane, names: set[str], resource_version: str, timeout: float) -> None:
        self.names, self.bound_at = names, dict[str, float]()
        self.done = threading.Event()
        context = ssl.create_default_context(cafile=str(cp.pki.ca_cert))
        context.load_cert_chain(str(cp.pki.client_cert), str(cp.pki.client_key))
        self.conn = http.client.HTTPSConnection("127.0.0.1", cp.api_port, context=context, timeout=timeout + 30)
        query = urllib.parse.urlencode({"watch": "1", "resourceVersion": resource_version,
                                        "timeoutSeconds": str(int(timeout) + 10)})  # fmt: skip
        self.conn.request("GET", f"/api/v1/namespaces/{NS}/pods?{query}")
        self.response = self.conn.getresponse()
        if self.response.status != 200:
            raise RuntimeError(f"watch of pods: {self.response.status} {self.response.read()[:300]!r}")
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while len(self.bound_at) < len(self.names):
                line = self.response.readline()
                if not line:
                    break
                event = json.loads(line)
                obj = event.get("object") or {}
                name = obj.get("metadata", {}).get("name")
                if name in self.names and name not in self.bound_at and obj.get("spec", {}).get("nodeName"):
                    self.bound_at[name] = time.monotonic()
        finally:
            self.done.set()

    def wait(self, timeout: float) -> None:
        self.done.wait(timeout)
        self.conn.close()


def apf_rejected(metrics: str) -> int:
    """Requests API Priority and Fairness rejected, from kube-apiserver's /metrics."""
    name = "apiserver_flowcontrol_rejected_requests_total{"
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(name)))


def list_resource_version(cp: ControlPlane) -> str:
    return str(cp.api_call("GET", f"/api/v1/namespaces/{NS}/pods", query={"limit": "1"})["metadata"]["resourceVersion"])


def profile_top(path: Path, nodecount: int = 25) -> str:
    """`go tool pprof -top` of a CPU profile (Go's profiles carry their function names)."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    out = subprocess.run([go, "tool", "pprof", "-top", f"-nodecount={nodecount}", str(path)],
                         capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    lines = out.stdout.splitlines()
    return "\n".join(lines[next(i for i, line in enumerate(lines) if line.startswith("Duration")) :])


def run_layout(
    mode: PublishMode,
    workload: str,
    nodes: int,
    pods: int,
    tmp: Path,
    version: str | None = None,
    nvidia: bool = False,
    fills: tuple[int, ...] = (0,),
    limits: ClientLimits = RAISED,
    profile_s: float = 0.0,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    mig_profiles: frozenset[str] | None = None,
    compatibility_groups: bool = False,
) -> list[dict[str, Any]]:
    """Rows for our slices for `mode` (the layout that version's users get), or with `nvidia` NVIDIA's for its
    counterpart (NVIDIA_LAYOUTS), on `nodes` nodes, in a control plane of its own whose kube-scheduler has client
    `limits`: for each fill level in turn (ascending), `pods` pods of `workload` scheduled on a cluster with that
    percentage of its GPUs allocated (fill_claims tops up what the pods of the level before took). Each level's pods
    are created while kube-scheduler is stopped (SIGSTOP) and timed from its SIGCONT to the last one bound, so
    neither this process's create rate nor the informers' catching up with the creates is in the figure. With
    `profile_s`, a CPU profile of the scheduler over that many seconds of each level's run is written to `tmp`. A
    level has `pods` pods, or as many as its free GPUs take. `on_row` gets each row as soon as it is measured (its
    `rejected` is the control plane's, once it is done)."""
    k8s_version = version or primary_version()
    if nvidia and (mode not in NVIDIA_LAYOUTS or workload not in NVIDIA_WORKLOADS):
        raise ValueError(f"no NVIDIA counterpart of {mode.value} with {workload}")
    if list(fills) != sorted(fills):
        raise ValueError(f"fill levels go up: {fills}")

    kinds = WORKLOADS[workload]
    rows = []
    # a version of the matrix with the gates its users turn on for these layouts (alpha before 1.36)
    gates = {**(LAYOUT_GATES if version else {}), **({COMPATIBILITY_GATE: True} if compatibility_groups else {})}
    with ControlPlane(version=version, feature_gates=gates or None,
                      runtime_config=layout_runtime_config(version), scheduler_client=limits) as cp:  # fmt: skip
        server = cp.server_version()
        if nvidia:  # captured before the clock and the bench nodes: its plugin publishes for a node of its own
            names, slices = nvidia_fleet(cp, nodes, mode, tmp)
        else:
            names, slices = fleet(nodes, tmp, mode, k8s_version, mig_profiles)
            if compatibility_groups:
                slices = with_compatibility_groups(slices)
        api = api_client(cp.kubeconfig)
        scheduler = Scheduler(cp)
        in_force = limits_in_force(scheduler.config())
        create_nodes(api, names)
        create_all(api, "deviceclasses", nvidia_classes() if nvidia else classes(), namespaced=False)
        t = time.monotonic()
        create_all(api, "resourceslices", slices, namespaced=False)
        publish_s = time.monotonic() - t
        made = measured = 0
        fill_class = "gpu.nvidia.com" if nvidia else class_name("gpu")
        for fill in fills:
            allocated = allocated_results(cp)
            topped = fill_claims(slices, allocated, fill, made, fill_class)
            made += len(topped)
            create_allocated(api, topped)
            # no more pods than the free GPUs take (a pod takes at most one, but for the four-GPU workloads): a
            # level whose pods cannot all be bound would measure the timeout
            free = free_gpus(slices, allocated + [r for c in topped for r in c["status"]["allocation"]["devices"][
                "results"]]) // (4 if workload in (FOUR, FOUR_NUMA) else 1)  # fmt: skip
            level = min(pods, free)
            first = measured  # pod names go on from the level before
            measured += level
            if workload == EXTENDED:
                to_create = [extended_resource_pod(first + i, "nvidia.com/gpu") for i in range(level)]
            else:
                pairs = [claim_and_pod(first + i, kinds[i % len(kinds)], workload, parse_minor(k8s_version))
                         for i in range(level)]  # fmt: skip
                if nvidia:
                    pairs = [(nvidia_claim(c, kinds[i % len(kinds)]), p) for i, (c, p) in enumerate(pairs)]
                create_all(api, "resourceclaims", [c for c, _ in pairs], namespaced=True)
                to_create = [p for _, p in pairs]
            time.sleep(2.0)  # the scheduler's informers catch up with the slices and claims before it is stopped
            before = scheduler.read()
            rv = list_resource_version(cp)
            with cp.paused("kube-scheduler"):
                t0 = time.monotonic()
                create_all(api, "pods", to_create, namespaced=True)
                created_s = time.monotonic() - t0
                watch = BindWatch(cp, {p["metadata"]["name"] for p in to_create}, rv, SCHEDULE_TIMEOUT_S)
                profiler = None
                if profile_s:  # asked while the scheduler is stopped: it starts profiling as it continues
                    out = tmp / f"profile-{mode.value}-{'nvidia-' if nvidia else ''}{fill}.pb.gz"
                    profiler = threading.Thread(target=lambda o=out: o.write_bytes(scheduler.get(
                        f"/debug/pprof/profile?seconds={profile_s:g}", timeout=profile_s + 60)))  # fmt: skip
                    profiler.start()
                    time.sleep(0.2)
                resumed = time.monotonic()
            watch.wait(SCHEDULE_TIMEOUT_S)
            if profiler:
                profiler.join()
            done = len(watch.bound_at)
            elapsed = (max(watch.bound_at.values()) - resumed) if done else math.nan
            after = scheduler.read()
            config = scheduler.config()["clientConnection"]
            mean = {}
            for key in METRICS:
                d_sum, d_count = after[key][0] - before[key][0], after[key][1] - before[key][1]
                mean[key] = (1000 * d_sum / d_count if d_count else math.nan, int(d_count))
            layout = NVIDIA_LAYOUTS[mode][1] if nvidia else mode.value
            if mig_profiles is not None:
                layout += f" ({', '.join(sorted(mig_profiles)) or 'no MIG'})"
            if compatibility_groups:
                layout += " + compatibility groups"
            rows.append({"kubernetes": server, "layout": layout,
                         "workload": workload, "fill": fill, "nodes": nodes,
                         "devices": sum(len(s["spec"].get("devices") or []) for s in slices) // nodes,
                         "slices": len(slices) // nodes, "pods": level, "bound": done, "seconds": elapsed,
                         "create_s": created_s, "publish_s": publish_s, "mean": mean, "limits": in_force,
                         "client": f"{config['qps']:g}/{config['burst']}"})  # fmt: skip
            if on_row:
                on_row(rows[-1])
        rejected = apf_rejected(cp.get_text("/metrics"))
    for r in rows:
        r["rejected"] = rejected
    return rows


# (layout, workload, NVIDIA's slices, scheduler client limits, fill levels, MIG profiles, compatibility groups)
Run = tuple[PublishMode, str, bool, ClientLimits, tuple[int, ...], frozenset[str] | None, bool]

COLUMNS = (
    "| kubernetes | nodes | layout | workload | GPUs in use before | devices/node | slices/node | pods bound "
    "| seconds | pods/s | attempt ms (n) | DRA PreFilter ms (n) | DRA Filter ms (n) | scheduler QPS/burst |"
)


def row_line(r: dict[str, Any]) -> str:
    m = r["mean"]
    rate = r["bound"] / r["seconds"] if r["bound"] and r["seconds"] > 0 else math.nan
    return (f"| {r['kubernetes']} | {r['nodes']} | {r['layout']} | {r['workload']} | {r['fill']}% | {r['devices']} "
            f"| {r['slices']} | {r['bound']}/{r['pods']} | {r['seconds']:.2f} | {rate:.1f} "
            f"| {m['attempt'][0]:.1f} ({m['attempt'][1]}) | {m['prefilter'][0]:.2f} ({m['prefilter'][1]}) "
            f"| {m['filter'][0]:.2f} ({m['filter'][1]}) | {r['client']} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true",
                        help="20 nodes, whole GPUs on static and partitionable, empty cluster only")  # fmt: skip
    parser.add_argument("--nodes", default="100", help="comma-separated node counts (default 100)")
    parser.add_argument("--pods-per-node", type=int, default=1)
    parser.add_argument("--pods", type=int, help="this many pods per fill level instead (a slow layout on many nodes)")
    parser.add_argument("--fills", default=",".join(map(str, FILLS)),
                        help="comma-separated percentages of the cluster's GPUs allocated before the measured pods "
                             f"(default {','.join(map(str, FILLS))})")  # fmt: skip
    parser.add_argument("--k8s", default=",".join(["primary", *matrix_versions()]),
                        help="comma-separated Kubernetes versions: primary (tools/k8sbins/go.mod) and versions of "
                             "the matrix (tools/k8sbins/versions/); default: all")  # fmt: skip
    parser.add_argument("--layouts", help="comma-separated layouts (partitionable,static,shared,gpus) for whole GPUs "
                                          "only")  # fmt: skip
    parser.add_argument("--extended", action="store_true",
                        help=f"whole GPUs asked for by a claim vs by {EXTENDED}, on the static and partitionable "
                             "layouts")  # fmt: skip
    parser.add_argument("--no-nvidia", action="store_true",
                        help="leave out the rows of NVIDIA's slices (its default gates beside static, DynamicMIG "
                             "beside partitionable)")  # fmt: skip
    parser.add_argument(
        "--no-as-deployed", action="store_true", help="leave out the rows with kube-scheduler's default client limits"
    )
    parser.add_argument("--mig-profiles", help="also the partitionable layout with only these MIG profiles published "
                                               "(comma-separated, e.g. 1g.10gb,3g.40gb)")  # fmt: skip
    parser.add_argument("--compatibility-groups", action="store_true",
                        help=f"also the partitionable layout with device compatibility groups ({COMPATIBILITY_GATE} "
                             "on the API server and scheduler)")  # fmt: skip
    parser.add_argument("--profile", type=float, default=0.0, metavar="SECONDS",
                        help="a CPU profile of kube-scheduler over the first SECONDS of each partitionable run, "
                             "its top functions printed")  # fmt: skip
    parser.add_argument(
        "--mix",
        action="store_true",
        help="the MIG mix workload only (partitionable, NVIDIA's DynamicMIG, --mig-profiles)",
    )
    parser.add_argument(
        "--numa", action="store_true", help="four-GPU claims with and without matchAttribute on numaNode, two per node"
    )
    args = parser.parse_args()
    node_counts = [20] if args.quick else [int(n) for n in args.nodes.split(",")]
    per_node = args.pods_per_node
    fills = (0,) if args.quick else tuple(int(f) for f in args.fills.split(","))
    whole = "whole GPUs"
    cases = [(PublishMode.STATIC, whole), (PublishMode.PARTITIONABLE, whole)]
    if args.numa:
        per_node, fills = 2, (0,)  # four GPUs each: a DGX H100 full
        cases = [(PublishMode.STATIC, FOUR), (PublishMode.STATIC, FOUR_NUMA)]
    elif args.extended:
        fills = (0,)
        cases = [(m, w) for m in (PublishMode.STATIC, PublishMode.PARTITIONABLE) for w in (whole, EXTENDED)]
    elif args.mix:
        cases = [(PublishMode.PARTITIONABLE, "MIG mix")]
    elif args.layouts:
        cases = [(PublishMode(m), whole) for m in args.layouts.split(",")]
    elif not args.quick:
        cases = [(PublishMode.STATIC, whole), (PublishMode.PARTITIONABLE, whole),
                 (PublishMode.PARTITIONABLE, "MIG mix"), (PublishMode.SHARED, whole)]  # fmt: skip
    versions = [None if v == "primary" else v for v in args.k8s.split(",")]
    made = f" (made by the scheduler for the {EXTENDED} workload)" if args.extended else ""
    print(f"dgx-h100 nodes (8 GPUs each), one claim per pod{made}, each Kubernetes version, node count, layout and "
          "workload in a control plane of its own; its fill levels in turn, each level's pods created while "
          "kube-scheduler is stopped and timed from its continuing to the last pod bound")  # fmt: skip
    print(COLUMNS)
    print("|---" * (COLUMNS.count("|") - 1) + "|", flush=True)
    in_force: dict[str, str] = {}
    rejected = 0
    with tempfile.TemporaryDirectory() as tmp:
        for version in versions:
            for nodes in node_counts:
                pods = args.pods or nodes * per_node
                runs: list[
                    tuple[PublishMode, str, bool, ClientLimits, tuple[int, ...], frozenset[str] | None, bool]
                ] = []
                for mode, workload in cases:  # NVIDIA's slices right after ours for the same layout and workload
                    runs.append((mode, workload, False, RAISED, fills, None, False))
                    if not args.no_nvidia and mode in NVIDIA_LAYOUTS and workload in NVIDIA_WORKLOADS:
                        runs.append((mode, workload, True, RAISED, fills, None, False))
                if args.mig_profiles is not None:  # the partitionable layout with fewer MIG profiles
                    allowed = frozenset(filter(None, args.mig_profiles.split(",")))
                    runs += [(mode, workload, False, RAISED, fills, allowed, False) for mode, workload in cases
                             if mode == PublishMode.PARTITIONABLE and (workload == whole or allowed)]  # fmt: skip
                if args.compatibility_groups:
                    runs += [(mode, workload, False, RAISED, fills, None, True) for mode, workload in cases
                             if mode == PublishMode.PARTITIONABLE]  # fmt: skip
                if not args.no_as_deployed:  # what a scheduler deployed as it comes measures: its client's limiter
                    runs += [(mode, workload, False, SCHEDULER_DEFAULT_CLIENT, (0,), None, False)
                             for mode, workload in cases
                             if mode in AS_DEPLOYED_LAYOUTS and workload in (whole, FOUR)]  # fmt: skip
                for mode, workload, nvidia, limits, levels, profiles, groups in runs:  # rows as soon as measured
                    profile = args.profile if mode == PublishMode.PARTITIONABLE and limits == RAISED else 0.0
                    rows = run_layout(mode, workload, nodes, pods, Path(tmp), version, nvidia=nvidia, fills=levels,
                                      limits=limits, profile_s=profile, mig_profiles=profiles,
                                      compatibility_groups=groups,
                                      on_row=lambda r: print(row_line(r), flush=True))  # fmt: skip
                    in_force.update((r["client"], r["limits"]) for r in rows)
                    rejected += rows[0]["rejected"]
                    if profile:
                        for out in sorted(Path(tmp).glob("profile-*.pb.gz")):
                            print(f"\nkube-scheduler CPU profile, {out.name}:\n{profile_top(out)}", flush=True)
                            out.unlink()
    for client, limits in in_force.items():
        print(f"scheduler client {client}: kube-scheduler's configuration in force (its /configz): {limits}")
    print(f"{APISERVER_LIMITS}; requests it rejected in these runs (apiserver_flowcontrol_rejected_requests_total): "
          f"{rejected}")  # fmt: skip
    print(
        "attempt: scheduler_scheduling_attempt_duration_seconds{result=scheduled}, mean; DRA PreFilter/Filter: "
        "scheduler_plugin_execution_duration_seconds{plugin=DynamicResources}, mean of the sampled cycles; "
        "GPUs in use before: the share of every node's GPUs allocated (whole, or any partition of it) before the "
        "level's pods"
    )


if __name__ == "__main__":
    main()
