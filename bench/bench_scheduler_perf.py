"""The kube-scheduler's own DRA benchmark, scheduler_perf (k8s.io/kubernetes/test/integration/scheduler_perf/dra at
the version pinned in tools/k8sbins/go.mod, built by scripts/build-scheduler-perf.sh), on this machine: first on
upstream's own cases, then on ours (bench/scheduler_perf/performance-config.yaml), where each node's ResourceSlices
are our slices for a simulated DGX H100 (static and partitionable layouts) or NVIDIA's (its default gates and
DynamicMIG), so that our pods/s sit beside upstream's measured the same way on the same machine.

What scheduler_perf does per workload (one process each here): starts etcd (from PATH, on a Unix socket), an
in-process kube-apiserver, the scheduler and the resourceclaim controller in the same process, creates the Nodes and
ResourceSlices from templates (createNodes, createAny with .Index per node), allocates the `initClaims` claims
directly with the structured allocator (allocResourceClaims: the cluster's share of GPUs in use before the clock),
then creates pods with a claim from a ResourceClaimTemplate and samples pods scheduled per second
(SchedulingThroughput: the average and percentiles of the 1 s samples). Steady state: `measurePods` pods in flight,
each replaced as soon as it is scheduled, for `duration`; otherwise all pods at once until every one is scheduled.
BenchmarkPerfScheduling pins the "incubating" structured allocator (dra_test.go), the one a v1.37 scheduler picks
with the default gates.

Upstream's 500-node workloads carry thresholds for its CI machines (perf-dash); below one the harness fails the
workload but records its results, which are reported with a note.

Run: python bench/bench_scheduler_perf.py [--quick] [--cases upstream,ours,nvidia,<layout>] [--nodes 100,500]
[--workloads REGEX] [--timeout S] [--logs DIR] [--list]; --regenerate rewrites the templates and config from our
builder; --capture-nvidia captures NVIDIA's slices anew (needs the control plane and NVIDIA's plugin built).
Prints one markdown table (a row as soon as it is measured).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HERE = ROOT / "bench" / "scheduler_perf"
CONFIG = HERE / "performance-config.yaml"
TEMPLATES = HERE / "templates"
SLICES = TEMPLATES / "slices"
BUILD_SCRIPT = ROOT / "scripts" / "build-scheduler-perf.sh"
K8S_VERSION = "v1.37.2"  # the slices' layout is this version's; the binary's is tools/k8sbins/go.mod's
NODE = "dgx-h100-{{.Index}}"  # upstream's node template names its nodes by .Index too
TOPIC = "dra"  # BenchmarkPerfScheduling's topic: the name of its data-items file
BENCH = "BenchmarkPerfScheduling"
GPUS_PER_NODE = 8
IN_FLIGHT = 10  # upstream's steady-state cases keep 10 pods in flight for 10 s
DURATION = "10s"
# scheduler_perf's client config (test/integration/scheduler_perf/util.go mustSetupCluster), shared by the test
# client, the scheduler and the resourceclaim controller: checked against the source by the tests.
CLIENT_QPS, CLIENT_BURST = 5000, 5000
# Upstream's cases run first: its SteadyState ("empty/half/full") and 5000-pod burst, 500 nodes of 10 devices.
UPSTREAM_CASE = "SchedulingWithResourceClaimTemplate"
UPSTREAM_WORKLOADS = ("empty_500nodes", "half_500nodes", "full_500nodes", "5000pods_500nodes")
UPSTREAM_QUICK = ("empty_100nodes",)  # its "fast" is over before the first 1 s sample: no throughput
NVIDIA_DRIVER = "gpu.nvidia.com"
NVIDIA_NOTE = (
    "Captured by bench/bench_scheduler_perf.py --capture-nvidia: bench.bench_scheduler.capture_nvidia_slices ran\n"
    "NVIDIA's gpu-kubelet-plugin (sigs.k8s.io/dra-driver-nvidia-gpu v0.5.0, tests/nvidia_driver.py) for one simulated\n"
    "dgx-h100 node against kube-apiserver {server} with the gates {gates}; what it published, the node's name\n"
    "(and so its pool's) replaced by the bench node's. Data: rerun --capture-nvidia to refresh, do not edit."
)


@dataclass(frozen=True)
class Layout:
    key: str  # the slice templates' file prefix
    case: str  # the test case's name in our config
    ours: bool
    mig: bool  # publishes MIG partitions to allocate (a MIG workload and the MIG mix)


LAYOUTS = (
    Layout("static", "Static", True, False),
    Layout("partitionable", "Partitionable", True, True),
    Layout("nvidia-default", "NvidiaDefault", False, False),
    Layout("nvidia-dynamicmig", "NvidiaDynamicMIG", False, True),
)
OUR_CLASS_FILES = ("gpu", "mig-1g.10gb", "mig-3g.40gb")
MIX = ("1g.10gb", "gpu", "3g.40gb", "1g.10gb")  # bench_scheduler.py's MIG mix, one claim template each, by pod index


def _our_class(profile: str) -> str:
    from tests.test_allocbench import class_name

    return class_name("gpu" if profile == "gpu" else f"mig-{profile}")


def request(layout: Layout, profile: str) -> dict[str, Any]:
    """deviceClassName and selectors of a request for a whole GPU ("gpu") or a MIG profile, in the layout's classes
    (NVIDIA's: one class for every MIG profile, the profile in a selector, as bench_scheduler.nvidia_claim)."""
    if layout.ours:
        return {"deviceClassName": _our_class(profile)}
    if profile == "gpu":
        return {"deviceClassName": "gpu.nvidia.com"}  # bench_scheduler.nvidia_classes()
    cel = f"device.attributes['{NVIDIA_DRIVER}'].profile == '{profile}'"
    return {"deviceClassName": "mig.nvidia.com", "selectors": [{"cel": {"expression": cel}}]}


def slice_templates(layout: Layout) -> list[Path]:
    return sorted(SLICES.glob(f"{layout.key}-*.yaml"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))


def class_templates(layout: Layout) -> list[str]:
    """DeviceClass templates, relative to bench/scheduler_perf: ours are deviceclasses/*.yaml as shipped."""
    if layout.ours:
        return [f"../../deviceclasses/{name}.yaml" for name in OUR_CLASS_FILES]
    return ["templates/deviceclass-nvidia-gpu.yaml", "templates/deviceclass-nvidia-mig.yaml"]


def render(template: str, index: int) -> str:
    """What scheduler_perf's text/template makes of our generated templates: they use nothing but .Index."""
    out = template.replace("{{.Index}}", str(index))
    if "{{" in out:
        raise ValueError(f"template action other than {{{{.Index}}}}: {out[out.index('{{') :][:80]}")
    return out


def slice_template(doc: dict[str, Any], header: str) -> str:
    """One slice of a node as a template: NODE-NAME (the node's, its pool's and the slice's name) by .Index."""
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)
    comment = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return comment + body.replace("NODE-NAME", NODE)


def _write_slices(prefix: str, texts: list[str]) -> None:
    for old in SLICES.glob(f"{prefix}-*.yaml"):
        old.unlink()
    SLICES.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(texts):
        (SLICES / f"{prefix}-{i}.yaml").write_text(text)


def our_slices(mode: str) -> list[dict[str, Any]]:
    """One simulated dgx-h100's slices from our builder for the layout `mode`, the node's name NODE-NAME."""
    from dra_driver.slices.devices import PublishMode
    from tests.test_allocbench import _node_slices

    with tempfile.TemporaryDirectory() as tmp:
        return list(json.loads(_node_slices(PublishMode(mode), tmp, K8S_VERSION)))


def our_templates(layout: Layout) -> list[str]:
    """The slice templates of one of our layouts, as --regenerate writes them (the tests compare)."""
    header = (
        f"Generated by bench/bench_scheduler_perf.py --regenerate: our slice builder's {layout.key} layout\n"
        f"for a simulated dgx-h100 (tests.test_allocbench._node_slices, Kubernetes {K8S_VERSION}); do not edit."
    )
    return [slice_template(doc, header) for doc in our_slices(layout.key)]


def regenerate_ours() -> None:
    for layout in LAYOUTS:
        if layout.ours:
            _write_slices(layout.key, our_templates(layout))
    for path, text in nvidia_class_templates().items():
        path.write_text(text)
    CONFIG.write_text(config_text())


def capture_nvidia() -> None:
    """NVIDIA's slices and classes, captured from its plugin against our control plane (minutes); committed data."""
    from bench.bench_scheduler import NVIDIA_LAYOUTS, capture_nvidia_slices
    from dra_driver.slices.devices import PublishMode
    from tests.cluster.controlplane import ControlPlane

    keys = {PublishMode.STATIC: "nvidia-default", PublishMode.PARTITIONABLE: "nvidia-dynamicmig"}
    with tempfile.TemporaryDirectory() as tmp, ControlPlane() as cp:
        server = cp.server_version()
        for mode, key in keys.items():
            gates = NVIDIA_LAYOUTS[mode][0] or "(none: its defaults)"
            header = NVIDIA_NOTE.format(server=server, gates=gates)
            docs = json.loads(capture_nvidia_slices(cp, mode, Path(tmp)))
            _write_slices(key, [slice_template(doc, header) for doc in docs])


def nvidia_class_templates() -> dict[Path, str]:
    from bench.bench_scheduler import nvidia_classes

    out = {}
    for cls in nvidia_classes():
        kind = cls["metadata"]["name"].split(".", 1)[0]
        note = "# NVIDIA's chart's DeviceClass, as bench.bench_scheduler.nvidia_classes() writes it; do not edit.\n"
        out[TEMPLATES / f"deviceclass-nvidia-{kind}.yaml"] = note + yaml.safe_dump(cls, sort_keys=False, width=120)
    return out


# ---- our performance-config.yaml


def _claim_params(req: dict[str, Any], name: str = "test-claim-template") -> dict[str, Any]:
    return {"name": name, **req}


def _setup_ops(layout: Layout) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = [
        {"opcode": "createNodes", "nodeTemplatePath": "templates/node-dgx-h100.yaml", "countParam": "$nodes"}
    ]
    for path in slice_templates(layout):  # one createAny per slice of a node, as upstream's Partitionable case
        ops.append({"opcode": "createAny", "templatePath": str(path.relative_to(HERE)), "countParam": "$nodes"})
    ops += [{"opcode": "createAny", "templatePath": path} for path in class_templates(layout)]
    return ops


def _workloads(layout: Layout) -> list[dict[str, Any]]:
    gpu = request(layout, "gpu")

    def steady(name: str, nodes: int, init: int, req: dict[str, Any], labels: list[str]) -> dict[str, Any]:
        params = {"nodes": nodes, "initClaims": init, "measurePods": IN_FLIGHT, "steadyState": True,
                  "duration": DURATION, **req}  # fmt: skip
        return {"name": name, "labels": labels, "params": params}

    # seconds: the throughput collector's first sample comes after 1 s, so even this one is steady for 3 s
    fast = {"nodes": 1, "initClaims": 2, "measurePods": 2, "steadyState": True, "duration": "3s", **gpu}
    out = [{"name": "fast", "labels": ["integration-test", "short"], "params": fast}]
    for nodes in (100, 500):
        gpus = nodes * GPUS_PER_NODE
        labels = ["performance"] if nodes == 500 else []
        # in use before the clock: none, half, 90 %, and as upstream's "full" all but the 10 pods in flight
        for tag, init in (("empty", 0), ("half", gpus // 2), ("90pct", gpus * 9 // 10), ("full", gpus - IN_FLIGHT)):
            out.append(steady(f"{tag}_{nodes}nodes", nodes, init, gpu, list(labels)))
    # as upstream's 5000pods_500nodes: half the GPUs allocated, then pods all at once: 500 (to 62.5 %) on every
    # layout, the other half (to 100 %) where MIG placements are not published: with them the scheduler slows
    # as the nodes fill (1.5 pods/s at 75 %, this machine) and the harness gives up after 10 minutes.
    bursts = (500,) if layout.mig else (500, 2000)
    for pods in bursts:
        out.append({"name": f"{2000 + pods}pods_500nodes", "labels": ["performance"],
                    "params": {"nodes": 500, "initClaims": 2000, "measurePods": pods, "steadyState": False,
                               "duration": "0s", **gpu}})  # fmt: skip
    if layout.mig:
        out.append(steady("mig1g_empty_500nodes", 500, 0, request(layout, "1g.10gb"), ["performance"]))
    return out


def _test_case(layout: Layout) -> dict[str, Any]:
    gates = {"DynamicResourceAllocation": True}
    if layout.key.endswith(("partitionable", "dynamicmig")):
        gates["DRAPartitionableDevices"] = True
    req = {"deviceClassName": "$deviceClassName", "selectors": "$selectors|"}  # upstream's "none" default
    ops = [
        *_setup_ops(layout),
        {"opcode": "createAny", "templatePath": "templates/resourceclaim.yaml", "namespace": "init",
         "countParam": "$initClaims", "templateParams": req},
        {"opcode": "allocResourceClaims", "namespace": "init"},
        {"opcode": "createAny", "templatePath": "templates/resourceclaimtemplate.yaml", "namespace": "test",
         "templateParams": {"name": "test-claim-template", **req}},
        {"opcode": "createPods", "namespace": "test", "countParam": "$measurePods", "steadyStateParam": "$steadyState",
         "durationParam": "$duration", "podTemplatePath": "templates/pod-with-claim-template.yaml",
         "collectMetrics": True},
    ]  # fmt: skip
    return {"name": layout.case, "featureGates": gates, "workloadTemplate": ops, "workloads": _workloads(layout)}


def _mix_case(layout: Layout) -> dict[str, Any]:
    """Pods i asks for MIX[i % 4] (a 1g.10gb, a whole GPU, a 3g.40gb, a 1g.10gb), all at once on an empty cluster:
    the pod template picks its claim template by .Index, which only the burst mode varies."""
    ops = _setup_ops(layout)
    for i, profile in enumerate(MIX):
        params = _claim_params(request(layout, profile), f"mix-{i}")
        ops.append({"opcode": "createAny", "templatePath": "templates/resourceclaimtemplate.yaml",
                    "namespace": "test", "templateParams": params})  # fmt: skip
    ops.append({"opcode": "createPods", "namespace": "test", "countParam": "$measurePods",
                "podTemplatePath": "templates/pod-with-mix-claim-template.yaml", "collectMetrics": True})  # fmt: skip
    workloads = [
        {"name": "fast", "labels": ["integration-test", "short"], "params": {"nodes": 1, "measurePods": 8}},
        {"name": "mix_1000pods_500nodes", "labels": ["performance"], "params": {"nodes": 500, "measurePods": 1000}},
    ]
    gates = {"DynamicResourceAllocation": True, "DRAPartitionableDevices": True}
    return {"name": f"{layout.case}MIGMix", "featureGates": gates, "workloadTemplate": ops, "workloads": workloads}


def config() -> list[dict[str, Any]]:
    cases = [_test_case(layout) for layout in LAYOUTS]
    return cases + [_mix_case(layout) for layout in LAYOUTS if layout.mig]


def config_text() -> str:
    header = (
        "# scheduler_perf test cases (k8s.io/kubernetes/test/integration/scheduler_perf: BenchmarkPerfScheduling\n"
        "# of its dra package, run in this directory): upstream's SchedulingWithResourceClaimTemplate on simulated\n"
        "# DGX H100 nodes (upstream's node shape), whose ResourceSlices are ours (Static, Partitionable) or NVIDIA's\n"
        "# (NvidiaDefault, NvidiaDynamicMIG), one createAny per slice of a node (.Index: the node).\n"
        "# Generated by bench/bench_scheduler_perf.py --regenerate; do not edit.\n"
    )
    return header + yaml.safe_dump(config(), sort_keys=False, width=120)


# ---- running the binary and reading its results


NAN = float("nan")


@dataclass
class Result:
    case: str
    workload: str
    average: float
    perc50: float
    perc90: float
    scheduled: int | None  # pods the throughput collector saw scheduled (its progress samples), if any
    prefilter_ms: float = NAN  # DynamicResources' PreFilter and Filter (one node), mean of the sampled calls
    filter_ms: float = NAN
    attempt_ms: float = NAN  # a successful scheduling attempt, mean
    seconds: float = 0.0  # the whole workload: setup, allocation, measurement, teardown
    below_threshold: float | None = None  # upstream's threshold for the "dra" topic (perf-dash CI) it fell below
    load: float = NAN  # the machine's 1-minute load average when the workload started


def _case_workload(name: str) -> tuple[str, str]:
    """The data items' Name label: [BenchmarkPerfScheduling/]<case>/<workload>/<namespace>."""
    parts = name.split("/")
    if parts[0].startswith("Benchmark"):
        parts = parts[1:]
    return parts[0], parts[1]


def parse_data_items(data: dict[str, Any]) -> dict[tuple[str, str], dict[str, float]]:
    """(case, workload) -> SchedulingThroughput's Average, Perc50, ... from a data-items JSON file, with
    DynamicResources' PreFilter and Filter means as "PreFilter" and "Filter" and a successful scheduling attempt's
    as "attempt" (milliseconds)."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    plugin: dict[tuple[str, str], dict[str, float]] = {}
    for item in data.get("dataItems") or []:
        labels = item.get("labels") or {}
        if "Name" not in labels or not item.get("data"):
            continue
        key = _case_workload(labels["Name"])
        if labels.get("Metric") == "SchedulingThroughput":
            out[key] = {k: float(v) for k, v in item["data"].items()}
        elif labels.get("Metric") == "scheduler_plugin_execution_duration_seconds" and (
            labels.get("plugin") == "DynamicResources" and labels.get("extension_point") in ("PreFilter", "Filter")
        ):
            plugin.setdefault(key, {})[labels["extension_point"]] = float(item["data"]["Average"])
        elif labels.get("Metric") == "scheduler_scheduling_attempt_duration_seconds" and (
            labels.get("result") == "scheduled"
        ):
            plugin.setdefault(key, {})["attempt"] = float(item["data"]["Average"])
    for key, stats in out.items():
        stats.update(plugin.get(key, {}))
    return out


_BENCH_LINE = re.compile(rf"^{BENCH}/(?P<case>[^/\s]+)/(?P<workload>[^\s]+?)(-\d+)?\s+\d+\s+(?P<metrics>.*)$")


def parse_bench_output(text: str) -> dict[tuple[str, str], dict[str, float]]:
    """(case, workload) -> SchedulingThroughput's statistics from the benchmark's result lines (b.ReportMetric)."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for line in text.splitlines():
        m = _BENCH_LINE.match(line.strip())
        if not m:
            continue
        fields = m["metrics"].split()
        stats = {
            unit.split("/", 1)[1]: float(value)
            for value, unit in zip(fields[::2], fields[1::2], strict=False)
            if unit.startswith("SchedulingThroughput/")
        }
        if stats:
            out[(m["case"], m["workload"])] = stats
    return out


_THRESHOLD = re.compile(r'expected "SchedulingThroughput" "Average" to be higher: got [0-9.]+, want (?P<want>[0-9.]+)')


def threshold_failures(log: str) -> tuple[float | None, bool]:
    """(the threshold it fell below, whether anything else failed): a workload with a `threshold` (upstream's, for
    its CI machines) fails when its average is lower, with its results recorded all the same (executor.go
    stopCollectingMetrics: tCtx.Errorf)."""
    errors = re.findall(r"ERROR:\s*\n\s*(.*)", log)
    wants = [float(m["want"]) for e in errors if (m := _THRESHOLD.search(e))]
    other = len(errors) > len(wants) or "FATAL ERROR" in log or "panic:" in log
    return (wants[0] if wants else None), other


def parse_progress(text: str) -> int | None:
    """Pods scheduled while measured: the last progress sample's count (the .dat file: seconds, completed, ...)."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    return int(lines[-1][1]) if lines else None


def read_results(data_dir: Path, case: str, workload: str) -> Result | None:
    stats: dict[str, float] | None = None
    for path in sorted(data_dir.glob(f"{BENCH}_benchmark_{TOPIC}_*.json")):
        stats = parse_data_items(json.loads(path.read_text())).get((case, workload), stats)
    if stats is None:
        return None
    dats = sorted(data_dir.glob(f"{case}_{workload}_{TOPIC}_*.dat"))
    scheduled = parse_progress(dats[-1].read_text()) if dats else None
    return Result(
        case, workload, stats["Average"], stats["Perc50"], stats["Perc90"], scheduled,
        stats.get("PreFilter", NAN), stats.get("Filter", NAN), stats.get("attempt", NAN),
    )  # fmt: skip


def built_binary(check: bool = False) -> Path | None:
    """The benchmark binary, built unless `check` (then None while it is not built)."""
    args = [str(BUILD_SCRIPT), *(["--check"] if check else [])]
    env = {**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/local/go/bin"}
    out = subprocess.run(args, capture_output=True, text=True, timeout=3600, env=env, check=False)
    if out.returncode == 3 and check:
        return None
    if out.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT.name} failed: {out.stderr[-2000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def k8s_cache() -> Path:
    """scripts/build-control-plane.sh's cache: binaries by version, the module cache."""
    return Path(os.environ.get("DRA_K8S_CACHE", Path.home() / ".cache" / "dra-driver" / "k8s"))


def etcd_dir() -> Path:
    """The directory of the control plane's etcd (scripts/build-control-plane.sh), which scheduler_perf runs."""
    path = k8s_cache() / K8S_VERSION / "bin"
    if not (path / "etcd").is_file():
        raise RuntimeError(f"no etcd in {path}: run scripts/build-control-plane.sh")
    return path


def upstream_dir_for(version: str) -> Path:
    """Upstream's dra directory (its performance-config.yaml and templates) in the module cache."""
    module = k8s_cache() / "gomodcache" / "k8s.io" / f"kubernetes@{version}"
    return module / "test" / "integration" / "scheduler_perf" / "dra"


def upstream_dir(binary: Path) -> Path:
    path = upstream_dir_for(binary.parent.parent.name)  # <cache>/<version>/scheduler-perf/dra.test
    if not (path / "performance-config.yaml").is_file():
        raise RuntimeError(f"no upstream config at {path}")
    return path


def run_workload(binary: Path, cwd: Path, case: str, workload: str, timeout: float, log: Path) -> Result:
    """One workload in a process of its own; its stdout and stderr (the harness's log) go to `log`."""
    with tempfile.TemporaryDirectory(prefix="schedperf-") as data:
        env = {k: v for k, v in os.environ.items() if k != "ARTIFACTS"}  # ARTIFACTS: per-test log files instead
        env["PATH"] = f"{etcd_dir()}:{env.get('PATH', '')}"
        env["KUBE_CACHE_MUTATION_DETECTOR"] = "false"  # as upstream's README runs the benchmarks
        cmd = [
            str(binary), "-test.run=^$", f"-test.bench=^{BENCH}$/^{case}$/^{workload}$", "-test.benchtime=1x",
            f"-test.timeout={int(timeout) + 60}s", "-perf-scheduling-label-filter=", f"-data-items-dir={data}",
        ]  # fmt: skip
        # its etcd's data, the apiserver's certificates and the test's temp dirs: removed with `data`, also when
        # it is killed
        env["TMPDIR"] = str(Path(data) / "tmp")
        Path(env["TMPDIR"]).mkdir()
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        with log.open("w") as out:
            # a process group of its own: a timeout kills its etcd too
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                returncode = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"{case}/{workload}: no result in {timeout:.0f} s (log: {log})") from None
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        seconds = time.monotonic() - t0
        for path in Path(data).iterdir():  # the harness's data items and progress, beside the log
            if path.is_file():
                shutil.copy(path, log.with_name(f"{log.stem}.{path.name}"))
        result = read_results(Path(data), case, workload)
        if result is None:  # fall back to the result line (a data-items file is written at the end only)
            stats = parse_bench_output(log.read_text(errors="replace")).get((case, workload))
            if stats:
                result = Result(case, workload, stats["Average"], stats["Perc50"], stats["Perc90"], None)
        text = log.read_text(errors="replace")
        threshold, other = threshold_failures(text)
        if returncode != 0 and (other or threshold is None or result is None):
            raise RuntimeError(f"{case}/{workload}: exit {returncode}\n{text[-3000:]}")
        if result is None:  # passed, but every pod was scheduled before the collector's first 1 s sample
            result = Result(case, workload, NAN, NAN, NAN, None)
        result.seconds = seconds
        result.below_threshold = threshold
        result.load = load
        return result


def workload_params(config_path: Path, case: str, workload: str) -> dict[str, Any]:
    for tc in yaml.safe_load(config_path.read_text()):
        if tc["name"] == case:
            for w in tc["workloads"]:
                if w["name"] == workload:
                    return dict(w.get("params") or {})
    raise KeyError(f"{config_path}: no {case}/{workload}")


def devices_per_node(case: str) -> int:
    """Upstream's: 10 (resourceslice-basic-devices.yaml's numDevices); ours: counted in the layout's templates."""
    for layout in LAYOUTS:
        if case in (layout.case, f"{layout.case}MIGMix"):
            docs = [yaml.safe_load(render(p.read_text(), 0)) for p in slice_templates(layout)]
            return sum(len(d["spec"].get("devices") or []) for d in docs)
    return 10


def row(result: Result, params: dict[str, Any], label: str) -> str:
    nodes = int(params.get("nodes", params.get("nodesWithDRA", 0)))
    init = int(params.get("initClaims", 0))
    devices = devices_per_node(result.case)
    if params.get("steadyState"):
        seen = f"{result.scheduled} in " if result.scheduled is not None else ""
        pods = f"{seen}{params['duration']} ({params['measurePods']} in flight)"
    else:
        pods = str(params["measurePods"])
    # the share of whole devices in use: upstream's 10 per node, a DGX H100's 8 GPUs (not its MIG placements)
    whole = devices if result.case == UPSTREAM_CASE else GPUS_PER_NODE
    share = f"{init} ({100 * init / (nodes * whole):.0f} %)" if nodes and init else str(init)
    note = f" below upstream's CI threshold {result.below_threshold:g}" if result.below_threshold else ""
    return (
        f"| {label} | {result.case}/{result.workload} | {nodes} | {share} | {pods} | {devices} "
        f"| {result.average:.1f} | {result.perc50:.1f} | {result.perc90:.1f} "
        f"| {result.attempt_ms:.1f} | {result.prefilter_ms:.2f} | {result.filter_ms:.2f} | {result.seconds:.0f} "
        f"| {result.load:.1f} |{note} |"
    )


HEADER = (
    "| config | case | nodes | claims allocated before (share of GPUs) | pods measured | devices/node "
    "| pods/s average | p50 | p90 | attempt ms | DRA PreFilter ms | DRA Filter ms | workload wall s | load before "
    "| note |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def limits_line(binary: Path) -> str:
    return (
        f"scheduler_perf ({binary.name}, k8s.io/kubernetes {binary.parent.parent.name}, BenchmarkPerfScheduling: "
        "incubating allocator): kube-apiserver, etcd (Unix socket), the scheduler and the resourceclaim controller "
        f"in one process on this machine ({os.cpu_count()} CPUs, load average before: "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}); every client QPS {CLIENT_QPS}, Burst {CLIENT_BURST} "
        "(scheduler_perf/util.go mustSetupCluster), so no client rate limit binds; SchedulingThroughput: pods "
        "scheduled per 1 s sample while measured, average and percentiles of the samples; attempt: "
        "scheduler_scheduling_attempt_duration_seconds{result=scheduled}, mean; DRA PreFilter/Filter: "
        "scheduler_plugin_execution_duration_seconds{plugin=DynamicResources}, mean of the sampled calls (Filter: "
        "one node)."
    )


def selected(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(config label, case, workload) to run, upstream's first."""
    groups = set(args.cases.split(","))
    out: list[tuple[str, str, str]] = []
    if "upstream" in groups:
        names = UPSTREAM_QUICK if args.quick else UPSTREAM_WORKLOADS
        if args.workloads:
            names = tuple(w for w in (*UPSTREAM_WORKLOADS, *UPSTREAM_QUICK) if re.fullmatch(args.workloads, w))
        out += [("upstream", UPSTREAM_CASE, w) for w in names]
    nodes = [int(n) for n in args.nodes.split(",")]
    ours: list[tuple[str, str, str]] = []
    cases = config()
    # each workload on every layout in turn, NVIDIA's right after ours: load that drifts hits both alike
    order = [lay.case for lay in sorted(LAYOUTS, key=lambda lay: (lay.mig, not lay.ours))]
    order += [f"{case}MIGMix" for case in order]
    cases.sort(key=lambda tc: order.index(tc["name"]))
    for tc in cases:
        key = next(lay.key for lay in LAYOUTS if tc["name"] in (lay.case, f"{lay.case}MIGMix"))
        if not ({"ours", key} & groups if key in ("static", "partitionable") else {"nvidia", key} & groups):
            continue
        for w in tc["workloads"]:
            name = w["name"]
            if args.quick:
                keep = name == "fast"
            elif args.workloads:
                keep = bool(re.fullmatch(args.workloads, name))
            else:
                keep = name != "fast" and int(w["params"]["nodes"]) in nodes and not name.startswith("full_")
            if keep:
                ours.append(("ours" if key in ("static", "partitionable") else "NVIDIA's", tc["name"], name))
    names = [w["name"] for tc in cases for w in tc["workloads"]]
    return out + sorted(ours, key=lambda run: names.index(run[2]))  # stable: the case order within a workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="only the tiny 'fast' workloads (seconds each)")
    parser.add_argument("--cases", default="upstream,ours,nvidia",
                        help="comma-separated: upstream, ours, nvidia, or one layout (static, partitionable, "
                             "nvidia-default, nvidia-dynamicmig)")  # fmt: skip
    parser.add_argument("--nodes", default="500", help="node counts of our workloads to run (100,500)")
    parser.add_argument("--workloads", help="regex of workload names instead (e.g. 'empty_500nodes|mix_.*')")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per workload")
    parser.add_argument("--logs", type=Path, help="keep each workload's log here")
    parser.add_argument("--list", action="store_true", help="print the workloads it would run, run none")
    parser.add_argument("--regenerate", action="store_true", help="rewrite our slice templates and the config")
    parser.add_argument("--capture-nvidia", action="store_true", help="capture NVIDIA's slices anew (minutes)")
    args = parser.parse_args()
    if args.capture_nvidia:
        capture_nvidia()
    if args.regenerate or args.capture_nvidia:
        regenerate_ours()
        print(f"wrote {HERE.relative_to(ROOT)}")
        return
    runs = selected(args)
    if args.list:
        print("\n".join(f"{label}: {case}/{workload}" for label, case, workload in runs))
        return
    binary = built_binary()
    assert binary is not None
    upstream = upstream_dir(binary)
    print(limits_line(binary))
    print(HEADER, flush=True)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="schedperf-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    failed = []
    for label, case, workload in runs:  # a row as soon as it is measured
        cwd = upstream if label == "upstream" else HERE
        try:
            r = run_workload(binary, cwd, case, workload, args.timeout, logs / f"{case}_{workload}.log")
        except RuntimeError as e:
            failed.append(str(e))
            print(f"| {label} | {case}/{workload} | failed: {str(e).splitlines()[0]} ||||||||||||", flush=True)
            continue
        print(row(r, workload_params(cwd / "performance-config.yaml", case, workload), label), flush=True)
    print(f"logs: {logs}" + ("" if args.logs else " (removed)"))
    if not args.logs:
        shutil.rmtree(logs, ignore_errors=True)
    for f in failed:
        print(f, file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
