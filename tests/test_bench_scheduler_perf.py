"""bench/bench_scheduler_perf.py runs the kube-scheduler's own DRA benchmark (scheduler_perf) on upstream's cases and
on bench/scheduler_perf/performance-config.yaml: that config and its templates are what the harness can load (every
template exists, every parameter is defined, every claim names a class the case creates), the slices in them are
valid for the API and are what our builder publishes today, and the parser reads what the harness writes (a sample
captured from a real run, tests/data/scheduler_perf/). One real workload runs when the binary is built."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from dra_driver.api.slice import ResourceSlice
from dra_driver.slices.limits import limits_for
from dra_driver.slices.validation import validate_pool
from tests.loadscript import load_script

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "scheduler_perf"
# The keys scheduler_perf's strict YAML decoding accepts (scheduler_perf.go testCase, Workload; operations.go ops).
CASE_KEYS = {"name", "featureGates", "workloadTemplate", "workloads", "labels", "metricsCollectorConfig"}
WORKLOAD_KEYS = {"name", "params", "labels", "threshold", "featureGates"}
OPCODES = {"createNodes", "createAny", "allocResourceClaims", "createPods"}


@pytest.fixture(scope="module")
def perf() -> ModuleType:
    return load_script(ROOT / "bench" / "bench_scheduler_perf.py")


def go_render(text: str, env: dict[str, Any]) -> str:
    """The subset of text/template (with scheduler_perf's JSON and Mod) that bench/scheduler_perf's templates use."""
    variables: dict[str, str] = {}

    def action(m: re.Match[str]) -> str:
        a = m.group(1).strip()
        if v := re.fullmatch(r"\$(\w+) := \(or \.(\w+) nil\) \| JSON", a):
            variables[v[1]] = json.dumps(env.get(v[2]))
            return ""
        if v := re.fullmatch(r"\$(\w+)", a):
            return variables[v[1]]
        if v := re.fullmatch(r"\.(\w+)", a):
            return str(env[v[1]])
        if v := re.fullmatch(r"Mod \.Index (\d+)", a):
            return str(env["Index"] % int(v[1]))
        raise AssertionError(f"template action the harness may not render like this: {a}")

    return re.sub(r"\{\{(.*?)\}\}", action, text)


def resolve(template_params: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """operations.go resolveTemplateParams: "$name" from the workload, "$name|default" with a YAML default."""
    out = {}
    for key, value in template_params.items():
        if isinstance(value, str) and value.startswith("$"):
            name, _, default = value[1:].partition("|")
            assert name in params or "|" in value, f"parameter {name} undefined"
            value = params[name] if name in params else yaml.safe_load(default)
        out[key] = value
    return out


def test_the_config_is_current_and_loadable(perf: ModuleType) -> None:
    """What --regenerate writes now, in the shape scheduler_perf decodes strictly, with every path and parameter."""
    text = perf.CONFIG.read_text()
    assert yaml.safe_load(text) == yaml.safe_load(perf.config_text()), "rerun bench_scheduler_perf.py --regenerate"
    assert "&id" not in text  # no YAML anchors: each workload spelled out
    cases = yaml.safe_load(text)
    assert len({c["name"] for c in cases}) == len(cases)
    for case in cases:
        assert set(case) <= CASE_KEYS, case["name"]
        assert case["featureGates"]["DynamicResourceAllocation"] is True
        ops = case["workloadTemplate"]
        assert {op["opcode"] for op in ops} <= OPCODES
        assert sum(1 for op in ops if op.get("collectMetrics")) == 1
        paths = [op.get("templatePath") or op.get("nodeTemplatePath") or op.get("podTemplatePath") for op in ops]
        for path in filter(None, paths):
            assert (perf.HERE / path).is_file(), f"{case['name']}: {path}"
        names = [w["name"] for w in case["workloads"]]
        assert len(set(names)) == len(names) and "fast" in names
        for w in case["workloads"]:
            assert set(w) <= WORKLOAD_KEYS
            for op in ops:
                for key in ("countParam", "steadyStateParam", "durationParam"):
                    if key in op:
                        assert op[key][1:] in w["params"], f"{case['name']}/{w['name']}: {op[key]}"
                resolve(op.get("templateParams") or {}, w["params"])


def test_every_object_renders_and_claims_name_the_cases_classes_and_templates(perf: ModuleType) -> None:
    """Render each op's template as the harness does (for each workload's parameters, index 0): valid YAML of the
    kind expected; each claim's class is a DeviceClass the case creates, each pod's claim template one it creates."""
    rendered: dict[str, Any] = {}  # the same template and parameters in several workloads: parsed once
    for case in yaml.safe_load(perf.CONFIG.read_text()):
        for w in case["workloads"]:
            objects: list[dict[str, Any]] = []
            for op in case["workloadTemplate"]:
                path = op.get("templatePath") or op.get("nodeTemplatePath") or op.get("podTemplatePath")
                if path:
                    env = {**resolve(op.get("templateParams") or {}, w["params"]), "Index": 0, "Count": 1}
                    key = json.dumps([path, env])
                    if key not in rendered:
                        rendered[key] = yaml.safe_load(go_render((perf.HERE / path).read_text(), env))
                    obj = rendered[key]
                    assert obj["apiVersion"] and obj["kind"], path
                    objects.append(obj)
            kinds = {o["kind"] for o in objects}
            assert {"Node", "ResourceSlice", "DeviceClass", "ResourceClaimTemplate", "Pod"} <= kinds, case["name"]
            classes = {o["metadata"]["name"] for o in objects if o["kind"] == "DeviceClass"}
            templates = {o["metadata"]["name"] for o in objects if o["kind"] == "ResourceClaimTemplate"}
            for o in objects:
                if o["kind"] in ("ResourceClaim", "ResourceClaimTemplate"):
                    spec = o["spec"] if o["kind"] == "ResourceClaim" else o["spec"]["spec"]
                    for r in spec["devices"]["requests"]:
                        assert r["exactly"]["deviceClassName"] in classes, (case["name"], w["name"], r)
            pods = [o for o in objects if o["kind"] == "Pod"]
            for pod in pods:
                for claim in pod["spec"]["resourceClaims"]:
                    assert claim["resourceClaimTemplateName"] in templates, (case["name"], claim)
            nodes = [o for o in objects if o["kind"] == "Node"]
            assert all(s["spec"]["nodeName"] == nodes[0]["metadata"]["name"] for s in objects
                       if s["kind"] == "ResourceSlice")  # fmt: skip


def test_the_mix_pods_cycle_through_four_claim_templates(perf: ModuleType) -> None:
    text = (perf.TEMPLATES / "pod-with-mix-claim-template.yaml").read_text()
    names = [yaml.safe_load(go_render(text, {"Index": i}))["spec"]["resourceClaims"][0] for i in range(5)]
    assert [n["resourceClaimTemplateName"] for n in names] == ["mix-0", "mix-1", "mix-2", "mix-3", "mix-0"]


@pytest.mark.parametrize("key", ["static", "partitionable", "nvidia-default", "nvidia-dynamicmig"])
def test_the_slice_templates_are_valid_for_the_api(perf: ModuleType, key: str) -> None:
    """Each node's slices (two nodes rendered): valid ResourceSlices within 1.37's limits, one pool per node named
    after it, with unique object names across nodes; a DGX H100's 8 GPUs (and, with MIG, 200 partitions)."""
    layout = next(lay for lay in perf.LAYOUTS if lay.key == key)
    paths = perf.slice_templates(layout)
    assert paths, f"no templates for {key}"
    names: set[str] = set()
    for index in (0, 41):
        docs = [yaml.safe_load(perf.render(p.read_text(), index)) for p in paths]
        slices = [ResourceSlice.model_validate(d) for d in docs]
        validate_pool(slices, limits_for(37))
        node = f"dgx-h100-{index}"
        assert all(d["spec"]["nodeName"] == node and d["spec"]["pool"]["name"] == node for d in docs)
        assert all(d["spec"]["pool"]["resourceSliceCount"] == len(docs) for d in docs)
        names |= {d["metadata"]["name"] for d in docs}
        devices = [dev for d in docs for dev in d["spec"].get("devices") or []]
        assert len(devices) == (208 if layout.mig else 8)
        assert perf.devices_per_node(layout.case) == len(devices)
    assert len(names) == 2 * len(paths)


@pytest.mark.parametrize("key", ["static", "partitionable"])
def test_our_slice_templates_are_what_the_builder_publishes(perf: ModuleType, key: str) -> None:
    layout = next(lay for lay in perf.LAYOUTS if lay.key == key)
    assert [p.read_text() for p in perf.slice_templates(layout)] == perf.our_templates(layout), (
        "rerun bench_scheduler_perf.py --regenerate"
    )


def test_nvidias_slices_say_how_they_were_captured(perf: ModuleType) -> None:
    for key in ("nvidia-default", "nvidia-dynamicmig"):
        layout = next(lay for lay in perf.LAYOUTS if lay.key == key)
        for path in perf.slice_templates(layout):
            head = path.read_text().split("apiVersion:", 1)[0]
            assert "--capture-nvidia" in head and "gpu-kubelet-plugin" in head, path
            assert yaml.safe_load(perf.render(path.read_text(), 0))["spec"]["driver"] == perf.NVIDIA_DRIVER


def test_the_client_limits_stated_are_scheduler_perfs(perf: ModuleType) -> None:
    """The limits line quotes scheduler_perf's client QPS and Burst: read them from the pinned source."""
    util = perf.upstream_dir_for(perf.K8S_VERSION).parent / "util.go"
    if not util.is_file():
        pytest.skip(f"k8s.io/kubernetes {perf.K8S_VERSION} is not in the module cache ({util})")
    text = util.read_text()
    assert f"cfg.QPS = {perf.CLIENT_QPS}.0" in text and f"cfg.Burst = {perf.CLIENT_BURST}" in text


def test_the_parser_reads_a_real_runs_output(perf: ModuleType, tmp_path: Path) -> None:
    """Files and a result line as the harness wrote them for Static/fast (captured from a real run)."""
    sample = json.loads((DATA / "result.json").read_text())
    for name, text in sample["files"].items():
        (tmp_path / name).write_text(text)
    r = perf.read_results(tmp_path, "Static", "fast")
    assert r is not None
    assert (r.average, r.perc50, r.perc90, r.scheduled, r.prefilter_ms, r.filter_ms) == tuple(sample["expected"])
    assert r.scheduled and r.prefilter_ms > 0 and r.filter_ms > 0
    assert math.isclose(r.attempt_ms, 63.56732113333333)  # scheduler_scheduling_attempt_duration_seconds, scheduled
    stats = perf.parse_bench_output(sample["stdout"])[("Static", "fast")]  # the same, to four digits
    assert math.isclose(stats["Average"], r.average, rel_tol=1e-3) and math.isclose(
        stats["Perc90"], r.perc90, rel_tol=1e-3
    )
    assert perf.read_results(tmp_path, "Static", "empty_500nodes") is None


def test_the_quickest_real_case_runs(perf: ModuleType, tmp_path: Path) -> None:
    """Static/fast (one DGX H100 node, 2 pods in flight for 3 s) through the real harness, when it is built."""
    binary = perf.built_binary(check=True)
    if binary is None:
        pytest.skip("scheduler_perf's binary is not built: scripts/build-scheduler-perf.sh (--check says so)")
    try:
        perf.etcd_dir()
    except RuntimeError as e:
        pytest.skip(str(e))
    r = perf.run_workload(binary, perf.HERE, "Static", "fast", 120, tmp_path / "fast.log")
    assert r.average > 0 and r.perc50 > 0 and (r.scheduled or 0) >= 1, r
    assert r.seconds < 60


def test_nvidias_classes_are_bench_schedulers(perf: ModuleType) -> None:
    for path, text in perf.nvidia_class_templates().items():
        assert path.read_text() == text, "rerun bench_scheduler_perf.py --regenerate"


def test_a_workload_below_upstreams_ci_threshold_still_has_its_result(perf: ModuleType) -> None:
    """Upstream's 500-node workloads carry perf-dash thresholds (e.g. 64 pods/s) that a small machine misses: the
    harness fails the workload but records its results (real log lines); anything else still fails the run."""
    log = json.loads((DATA / "result.json").read_text())["threshold_log"]
    assert perf.threshold_failures(log) == (64.0, False)
    assert perf.threshold_failures(log + "    util.go:116: FATAL ERROR:\n        start apiserver: x\n")[1]
    assert perf.threshold_failures("PASS\n") == (None, False)
