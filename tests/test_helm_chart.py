"""deploy/helm/dra-driver: `helm lint` clean, the rendered objects right per value set (real NVML, simulator,
custom driver name, node labels), in step with deploy/rbac.yaml and deviceclasses/, and accepted by a real
kube-apiserver (`kubectl apply --dry-run=server`). On that server, too: the node-label RBAC and admission policy
with a pod-bound token, and the GPU-node taint with the DaemonSet's pods and the chart README's example workload
under the real scheduler. Helm is built from its Go module by scripts/build-helm.sh (cached)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.slices.devices import DEFAULT_MODE
from tests.cluster.controlplane import ControlPlane
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "dra-driver"
NAMESPACE = "gpu-system"
RELEASE = "gpu"
FULLNAME = "gpu-dra-driver"
DEFAULT_DRIVER = "gpu.dra-driver.dev"

REAL: tuple[str, ...] = ()
SIMULATOR = ("--set", "nvml.backend=simulator", "--set", "nvml.simulator.machine=mixed")
CUSTOM = (
    "--set",
    "driverName=gpu.example.com",
    "--set",
    "mode=static",
    "--set",
    "k8sVersion=1.36",
    "--set",
    "featureGates.MPSSupport=false",
    "--set",
    "kubeletDir=/var/snap/k8s/kubelet",
)
NODE_LABELS = ("--set", "nodeLabels.enabled=true")
API_SERVER_ENV = [
    {"name": "KUBERNETES_SERVICE_HOST", "value": "api.example.com"},
    {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
]
HOST_NETWORK = (  # a node without kube-proxy, whose kubelets predate per-pod socket names
    "--set",
    "hostNetwork=true",
    "--set-json",
    f"extraEnv={json.dumps(API_SERVER_ENV)}",
    "--set",
    "rollingUpdate.uniqueSockets=false",
)
NODE_CONFIGS = ("--set-json", 'nodeConfigs.configs={"mig-on-demand": {"mode": "partitionable"}}')
VALUE_SETS = {
    "node-configs": NODE_CONFIGS,
    "real": REAL,
    "simulator": SIMULATOR,
    "custom": CUSTOM,
    "node-labels": NODE_LABELS,
    "host-network": HOST_NETWORK,
}
SURGE = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
NO_SURGE = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
POD_UID_ENV = {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}
GPU_TOLERATION = {"key": f"{DEFAULT_DRIVER}/gpu", "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Helm:
    path: Path
    env: dict[str, str]  # HELM_*_HOME in a temporary directory: no ~/.config/helm or ~/.cache/helm side effects


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    env = dict(os.environ)
    if not shutil.which("go"):
        if not os.access("/usr/local/go/bin/go", os.X_OK):
            if os.environ.get("DRA_K8S_REQUIRE") == "1":
                pytest.fail("DRA_K8S_REQUIRE=1 but no Go toolchain to build helm")
            pytest.skip("no Go toolchain to build helm (scripts/build-helm.sh)")
        env["PATH"] = env.get("PATH", "") + os.pathsep + "/usr/local/go/bin"
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-helm.sh")], env=env, capture_output=True, text=True, timeout=3600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert os.access(path, os.X_OK), path
    home = tmp_path_factory.mktemp("helm-home")
    helm_env = {**os.environ, **{f"HELM_{k}_HOME": str(home / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}}
    return Helm(path, helm_env)


def _run(helm: Helm, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(helm.path), *args], env=helm.env, capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
    return proc


_TEMPLATES: dict[tuple[str, ...], str] = {}


def _template(helm: Helm, *values: str, release: str = RELEASE, namespace: str = NAMESPACE, fresh: bool = False) -> str:
    """`helm template`, rendered once per process for the same arguments (a helm run costs 0.3 s of CPU, and a
    third of the module's renders are of the chart's defaults); `fresh`: rendered again (the webhook's certificates
    are new on every render)."""
    args = ("template", release, str(CHART), "--namespace", namespace, *values)
    if fresh or args not in _TEMPLATES:
        _TEMPLATES[args] = _run(helm, *args).stdout
    return _TEMPLATES[args]


def _render(
    helm: Helm, *values: str, release: str = RELEASE, namespace: str = NAMESPACE, fresh: bool = False
) -> list[dict[str, Any]]:
    rendered = _template(helm, *values, release=release, namespace=namespace, fresh=fresh)
    return [d for d in yaml.safe_load_all(rendered) if d]


def _one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {[o['metadata']['name'] for o in objs if o['kind'] == kind]}"
    return found[0]


def _plugin(objs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = _one(objs, "DaemonSet", FULLNAME)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return {"pod": pod, "c": container, "mounts": {m["name"]: m for m in container["volumeMounts"]}}


def _host_paths(pod: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_lint_is_clean(helm: Helm, values: tuple[str, ...]) -> None:
    out = _run(helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *values).stdout
    assert "0 chart(s) failed" in out, out


def test_real_nvml_backend_is_privileged_with_host_mounts(helm: Helm) -> None:
    p = _plugin(_render(helm, *REAL))
    c, pod, mounts = p["c"], p["pod"], p["mounts"]
    assert c["command"] == ["dra-driver"]
    assert c["args"] == [
        "plugin",
        "--nvml",
        "--sysfs-root=/host/sys",
        "--proc-root=/host/proc",
        "--driver-root=/driver-root",
        "--host-driver-root=/",
        "--node-name=$(NODE_NAME)",
        f"--driver={DEFAULT_DRIVER}",
        "--mode=static",  # the chart's default on every version
        f"--plugin-dir=/var/lib/kubelet/plugins/{DEFAULT_DRIVER}",
        "--registry-dir=/var/lib/kubelet/plugins_registry",
        "--pod-uid=$(POD_UID)",
        "--cdi-root=/var/run/cdi",
        "--rediscover-seconds=60",
        "--ignored-xids=13,31,43,45,68,109",
        "--metrics-port=8080",
        "--metrics-address=$(POD_IP)",
    ]
    assert c["securityContext"] == {"privileged": True}
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["LD_LIBRARY_PATH"]["value"] == "/nvml-lib" and env["NVIDIA_VISIBLE_DEVICES"]["value"] == "void"
    assert "DRA_DRIVER_FEATURE_GATES" not in env
    assert _host_paths(pod) == {
        "plugin-dir": f"/var/lib/kubelet/plugins/{DEFAULT_DRIVER}",
        "registry-dir": "/var/lib/kubelet/plugins_registry",
        "cdi-root": "/var/run/cdi",
        "host-proc": "/proc",
        "host-sys": "/sys",
        "driver-root": "/",
    }
    assert mounts["plugin-dir"]["mountPath"] == f"/var/lib/kubelet/plugins/{DEFAULT_DRIVER}"  # same path as host
    assert mounts["registry-dir"]["mountPath"] == "/var/lib/kubelet/plugins_registry"
    assert mounts["cdi-root"]["mountPath"] == "/var/run/cdi"
    for name, path in (("host-proc", "/host/proc"), ("host-sys", "/host/sys"), ("driver-root", "/driver-root")):
        assert mounts[name] == {"name": name, "mountPath": path, "readOnly": True}
    assert not mounts["plugin-dir"].get("readOnly") and not mounts["cdi-root"].get("readOnly")
    (init,) = pod["initContainers"]
    assert "libnvidia-ml.so.1" in init["args"][0] and not init["securityContext"].get("privileged")
    assert {"key": f"{DEFAULT_DRIVER}/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["serviceAccountName"] == FULLNAME
    assert c["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]


def test_simulator_backend_is_unprivileged(helm: Helm) -> None:
    p = _plugin(_render(helm, *SIMULATOR))
    c, pod, mounts = p["c"], p["pod"], p["mounts"]
    assert c["args"][:6] == [
        "plugin",
        "--sim=mixed",
        "--sim-state=/var/lib/dra-driver/sim/mixed",
        "--host-driver-root=/var/lib/dra-driver/sim/mixed/driver-root",
        "--sim-persistenced",  # the pods' simulated libnvidia-ml reaches the machine through its socket
        "--node-name=$(NODE_NAME)",
    ]
    assert "--nvml" not in c["args"]
    assert not [a for a in c["args"] if a.startswith(("--proc-root", "--sysfs-root"))]  # the simulator has its own
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["readOnlyRootFilesystem"] is True
    assert "initContainers" not in pod
    assert not {"host-proc", "host-sys", "driver-root"} & set(mounts)
    assert _host_paths(pod)["sim-state"] == "/var/lib/dra-driver/sim"
    assert mounts["sim-state"]["mountPath"] == "/var/lib/dra-driver/sim"
    assert "LD_LIBRARY_PATH" not in {e["name"] for e in c["env"]}


def test_custom_driver_name_reaches_every_object(helm: Helm) -> None:
    objs = _render(helm, *CUSTOM)
    p = _plugin(objs)
    c, pod = p["c"], p["pod"]
    assert (
        "--driver=gpu.example.com" in c["args"] and "--mode=static" in c["args"] and "--k8s-version=1.36" in c["args"]
    )
    assert "--plugin-dir=/var/snap/k8s/kubelet/plugins/gpu.example.com" in c["args"]
    assert "--registry-dir=/var/snap/k8s/kubelet/plugins_registry" in c["args"]
    assert _host_paths(pod)["plugin-dir"] == "/var/snap/k8s/kubelet/plugins/gpu.example.com"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["DRA_DRIVER_FEATURE_GATES"] == "MPSSupport=false"
    assert env["DRA_DRIVER_HEALTH_SOCKET"] == "/var/snap/k8s/kubelet/plugins/gpu.example.com/health.sock"
    assert pod["tolerations"][0]["key"] == "gpu.example.com/gpu"
    classes = {o["metadata"]["name"]: o for o in objs if o["kind"] == "DeviceClass"}
    assert {"gpu.example.com", "mig.example.com", "gpu-timesliced.example.com", "mig-3g.40gb.gpu.example.com"} <= set(
        classes
    )
    text = yaml.safe_dump(list(classes.values()))
    assert "gpu.dra-driver.dev" not in text  # the opaque config API group (gpu.resource.dra-driver.dev) stays
    assert classes["gpu-timesliced.example.com"]["spec"]["config"][0]["opaque"]["driver"] == "gpu.example.com"


def test_rbac_and_admission_policy_match_deploy_rbac_yaml(helm: Helm) -> None:
    objs = _render(helm, *REAL)
    ref = {
        (o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text())
    }
    assert _one(objs, "ServiceAccount", FULLNAME)["metadata"]["namespace"] == NAMESPACE
    role = _one(objs, "ClusterRole", f"{FULLNAME}-node")
    assert role["rules"] == ref["ClusterRole", "dra-driver-node"]["rules"]
    binding = _one(objs, "ClusterRoleBinding", f"{FULLNAME}-node")
    assert binding["roleRef"]["name"] == f"{FULLNAME}-node"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    mps_role = _one(objs, "Role", f"{FULLNAME}-mps")
    assert mps_role["metadata"]["namespace"] == NAMESPACE
    assert mps_role["rules"] == ref["Role", "dra-driver-mps"]["rules"]
    assert _one(objs, "RoleBinding", f"{FULLNAME}-mps")["subjects"] == binding["subjects"]
    for policy in ("own-node-slices", "own-node-claim-status", "own-node-mps-pods"):
        vap = _one(objs, "ValidatingAdmissionPolicy", f"{FULLNAME}-{policy}")
        want = ref["ValidatingAdmissionPolicy", f"dra-driver-{policy}"]["spec"]
        assert vap["spec"]["matchConditions"] == [
            {
                "name": "is-driver-service-account",
                "expression": f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{FULLNAME}'",
            }
        ]
        assert {k: v for k, v in vap["spec"].items() if k != "matchConditions"} == {
            k: v for k, v in want.items() if k != "matchConditions"
        }
        vapb = _one(objs, "ValidatingAdmissionPolicyBinding", f"{FULLNAME}-{policy}")
        assert vapb["spec"] == {"policyName": f"{FULLNAME}-{policy}", "validationActions": ["Deny"]}
    custom = _one(_render(helm, *CUSTOM), "ValidatingAdmissionPolicy", f"{FULLNAME}-own-node-claim-status")
    assert {v["name"]: v["expression"] for v in custom["spec"]["variables"]}["driver"] == "'gpu.example.com'"
    assert not [o for o in objs if o["kind"] == "Namespace"]  # helm --create-namespace makes it


def test_device_classes_are_those_of_deviceclasses_dir(helm: Helm) -> None:
    rendered = {o["metadata"]["name"]: o["spec"] for o in _render(helm, *REAL) if o["kind"] == "DeviceClass"}
    on_disk = {}
    for path in sorted((ROOT / "deviceclasses").glob("*.yaml")):
        obj = yaml.safe_load(path.read_text())
        on_disk[obj["metadata"]["name"]] = obj["spec"]
    assert rendered == on_disk, "deviceClasses.migProfiles in values.yaml out of step with deviceclasses/"
    assert not [o for o in _render(helm, "--set", "deviceClasses.enabled=false") if o["kind"] == "DeviceClass"]


def test_device_plugin_resource_names_are_served_by_the_classes_and_each_can_be_switched_off(helm: Helm) -> None:
    def names(*values: str) -> dict[str, str | None]:
        classes = [o for o in _render(helm, *values) if o["kind"] == "DeviceClass"]
        return {o["metadata"]["name"]: o["spec"].get("extendedResourceName") for o in classes}

    default = names()
    assert default[DEFAULT_DRIVER] == "nvidia.com/gpu"
    assert default[f"mig-1g.10gb.{DEFAULT_DRIVER}"] == "nvidia.com/mig-1g.10gb"
    assert default[f"mig-1g.10gb-plus-me.{DEFAULT_DRIVER}"] == "nvidia.com/mig-1g.10gb.me"  # no '+' in a name
    assert default["gpu-timesliced.dra-driver.dev"] is None and default["mig.dra-driver.dev"] is None
    assert len({n for n in default.values() if n}) == len([n for n in default.values() if n])  # one class each
    no_gpu = names("--set", "deviceClasses.extendedResources.gpu=")
    assert no_gpu[DEFAULT_DRIVER] is None and no_gpu[f"mig-1g.10gb.{DEFAULT_DRIVER}"] == "nvidia.com/mig-1g.10gb"
    own = names("--set", "deviceClasses.extendedResources.migPrefix=example.com/partition-")
    assert own[f"mig-3g.40gb.{DEFAULT_DRIVER}"] == "example.com/partition-3g.40gb"
    assert {n for n in names("--set", "deviceClasses.extendedResources.migPrefix=").values() if n} == {"nvidia.com/gpu"}


def test_replicas_reach_the_daemon_in_shared_mode(helm: Helm) -> None:
    def replicas_args(*values: str) -> list[str]:
        return [a for a in _plugin(_render(helm, *values))["c"]["args"] if a.startswith("--replicas")]

    assert replicas_args() == [] and replicas_args("--set", "mode=shared") == []
    assert replicas_args("--set", "mode=shared", "--set", "replicas=4") == ["--replicas=4"]
    assert replicas_args("--set", "mode=shared", "--set", "replicas=unlimited") == ["--replicas=unlimited"]


def test_node_configs_reach_the_daemon_with_the_rbac_they_need(helm: Helm, tmp_path: Path) -> None:
    from dra_driver.controller.nodeconfig import load_configs

    assert not [o for o in _render(helm) if "node-configs" in o["metadata"]["name"]]
    assert not [a for a in _plugin(_render(helm))["c"]["args"] if a.startswith("--node-config")]
    configs = {"mig-on-demand": {"mode": "partitionable"}, "shared-4": {"mode": "shared", "replicas": 4}}
    objs = _render(helm, "--set-json", f"nodeConfigs.configs={json.dumps(configs)}")
    rendered = _one(objs, "ConfigMap", f"{FULLNAME}-node-configs")["data"]["configs.json"]
    (tmp_path / "configs.json").write_text(rendered)
    assert set(load_configs(tmp_path / "configs.json")) == set(configs)  # what the daemon reads
    plugin = _plugin(objs)
    assert "--node-configs=/etc/dra-driver/node-configs/configs.json" in plugin["c"]["args"]
    assert f"--node-config-label={DEFAULT_DRIVER}/config" in plugin["c"]["args"]
    assert plugin["mounts"]["node-configs"]["mountPath"] == "/etc/dra-driver/node-configs"
    assert any(v.get("configMap", {}).get("name") == f"{FULLNAME}-node-configs" for v in plugin["pod"]["volumes"])
    role = _one(objs, "ClusterRole", f"{FULLNAME}-node-configs")
    assert {(r["resources"][0], tuple(r["verbs"])) for r in role["rules"]} == {("nodes", ("get", "list", "watch"))}
    main_role = _one(
        objs, "ClusterRole", f"{FULLNAME}-node"
    )  # Events on the Node: health and node configurations alike
    assert ("events", ("create",)) in {(r["resources"][0], tuple(r["verbs"])) for r in main_role["rules"]}
    template = _one(objs, "DaemonSet", FULLNAME)["spec"]["template"]["metadata"]
    assert "checksum/node-configs" in template["annotations"]  # a changed configuration rolls the daemons
    label = _plugin(_render(helm, "--set-json", f"nodeConfigs.configs={json.dumps(configs)}",
                            "--set", "nodeConfigs.label=example.com/gpu-config"))["c"]["args"]  # fmt: skip
    assert "--node-config-label=example.com/gpu-config" in label


def test_numa_node_form_list_reaches_the_daemon(helm: Helm) -> None:
    """Scalar by default (no flag: the daemon's own default); list only when asked, for clusters with
    DRAListTypeAttributes on."""
    assert yaml.safe_load((CHART / "values.yaml").read_text())["numaNodeForm"] == "scalar"
    assert not [a for a in _plugin(_render(helm))["c"]["args"] if a.startswith("--numa-node-form")]
    assert "--numa-node-form=list" in _plugin(_render(helm, "--set", "numaNodeForm=list"))["c"]["args"]


@pytest.mark.parametrize("version", ["1.34.0", "1.36.3", "1.37.0"])
def test_the_charts_default_mode_is_static_on_every_version(helm: Helm, version: str) -> None:
    """The daemon's default (static) on every version: partitionable devices cost kube-scheduler several times what
    whole GPUs cost on 1.37 too (bench/bench_scheduler.py). `k8sVersion` stands for the cluster's version; an
    explicit `mode` wins."""
    assert yaml.safe_load((CHART / "values.yaml").read_text())["mode"] == ""
    assert DEFAULT_MODE.value == "static"
    for how in (("--kube-version", version), ("--set", f"k8sVersion={version}")):
        assert f"--mode={DEFAULT_MODE.value}" in _plugin(_render(helm, *how))["c"]["args"], how
    assert "--mode=gpus" in _plugin(_render(helm, "--kube-version", version, "--set", "mode=gpus"))["c"]["args"]


def test_mig_profiles_reach_the_daemon(helm: Helm) -> None:
    """`migProfiles` (partitionable only) becomes --mig-profiles; none by default."""
    assert yaml.safe_load((CHART / "values.yaml").read_text())["migProfiles"] == []
    assert not [a for a in _plugin(_render(helm, "--set", "mode=partitionable"))["c"]["args"] if "mig-profiles" in a]
    args = _plugin(_render(helm, "--set", "mode=partitionable", "--set-json", 'migProfiles=["1g.10gb","3g.40gb"]'))
    assert "--mig-profiles=1g.10gb,3g.40gb" in args["c"]["args"]


def test_bad_values_fail_the_render(helm: Helm) -> None:
    for values, message in (
        (("--set", "nvml.backend=fake"), "nvml.backend must be real or simulator"),
        (("--set", "mode=all"), "mode must be partitionable, static, gpus or shared"),
        (("--set-json", 'migProfiles=["1g.10gb"]'), "migProfiles apply to mode partitionable only, not static"),
        (("--set", "mode=partitionable", "--set-json", 'migProfiles=["1g"]'), 'migProfiles: "1g" is not a MIG'),
        (("--set", "driverName=GPU_Driver"), "driverName must be a DNS subdomain"),
        (("--kube-version", "1.33.0"), "kubeVersion"),
        (("--set", "replicas=4"), "replicas apply to mode shared only, not static"),
        (("--set", "mode=shared", "--set", "replicas=0"), "replicas must be a number from 1 to 1024 or unlimited"),
        (("--set", "mode=shared", "--set", "replicas=1025"), "replicas must be a number from 1 to 1024 or unlimited"),
        (("--set", "numaNodeForm=lists"), "numaNodeForm must be scalar or list"),
        (("--set", "numaNodeForm=list", "--kube-version", "1.35.4"), "numaNodeForm list needs list-type attributes"),
    ):
        proc = _run(helm, "template", RELEASE, str(CHART), *values, check=False)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_api_server_accepts_every_object(helm: Helm, control_plane: ControlPlane, values: tuple[str, ...]) -> None:
    manifest = _template(helm, *values)
    count = sum(1 for d in yaml.safe_load_all(manifest) if d)
    if control_plane.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
        control_plane.create_namespace(NAMESPACE)
    out = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest).stdout
    lines = [line for line in out.splitlines() if line.endswith("(server dry run)")]
    assert len(lines) == count, out


# ----- placement: the GPU-node taint and node labels ----------------------------------------------------------------


def test_ignored_xids_reach_the_daemon(helm: Helm) -> None:
    from dra_driver.health.monitor import DEFAULT_IGNORED_XIDS

    default = _plugin(_render(helm))["c"]["args"]
    assert f"--ignored-xids={','.join(map(str, sorted(DEFAULT_IGNORED_XIDS)))}" in default
    assert "--ignored-xids=13,79" in _plugin(_render(helm, "--set", "health.ignoredXids={13,79}"))["c"]["args"]
    assert "--ignored-xids=" in _plugin(_render(helm, "--set-json", "health.ignoredXids=[]"))["c"]["args"]


def test_metrics_listen_on_the_pod_ip_or_the_given_address(helm: Helm) -> None:
    # The endpoint has no authentication and the CLI's default is loopback: the chart names the address Prometheus
    # scrapes, the pod's IP, unless metrics.address says otherwise
    default = _plugin(_render(helm))["c"]
    assert default["args"][-2:] == ["--metrics-port=8080", "--metrics-address=$(POD_IP)"]
    env = {e["name"]: e for e in default["env"]}
    assert env["POD_IP"] == {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    everywhere = _plugin(_render(helm, "--set", "metrics.address=0.0.0.0", "--set", "metrics.port=9400"))["c"]
    assert everywhere["args"][-2:] == ["--metrics-port=9400", "--metrics-address=0.0.0.0"]
    assert "POD_IP" not in {e["name"] for e in everywhere["env"]}
    off = _plugin(_render(helm, "--set", "metrics.enabled=false"))["c"]
    assert not [a for a in off["args"] if a.startswith("--metrics")] and "ports" not in off
    assert "POD_IP" not in {e["name"] for e in off["env"]}


def test_daemonset_tolerates_the_gpu_node_taint(helm: Helm) -> None:
    assert _plugin(_render(helm))["pod"]["tolerations"] == [GPU_TOLERATION]  # by default, and nothing else
    extra = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    both = _plugin(_render(helm, "--set-json", f"tolerations=[{json.dumps(extra)}]"))["pod"]["tolerations"]
    assert both == [GPU_TOLERATION, extra]
    only_extra = _render(helm, "--set", "tolerateGpuTaint=false", "--set-json", f"tolerations=[{json.dumps(extra)}]")
    assert _plugin(only_extra)["pod"]["tolerations"] == [extra]
    assert "tolerations" not in _plugin(_render(helm, "--set", "tolerateGpuTaint=false"))["pod"]


def test_liveness_probe_checks_the_kubelet_sockets_the_plugin_serves(
    helm: Helm, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dra_driver.cli import build_parser
    from dra_driver.plugin.grpc import probe as probe_cli
    from dra_driver.plugin.sockets import plugin_sockets

    for values, driver, kubelet_dir in (
        (REAL, DEFAULT_DRIVER, "/var/lib/kubelet"),
        (CUSTOM, "gpu.example.com", "/var/snap/k8s/kubelet"),
    ):
        c = _plugin(_render(helm, *values))["c"]
        probe = c["livenessProbe"]
        command = probe["exec"]["command"]
        assert command == [
            "dra-driver",
            "probe",
            f"--driver={driver}",
            f"--plugin-dir={kubelet_dir}/plugins/{driver}",
            f"--registry-dir={kubelet_dir}/plugins_registry",
        ]
        assert command[2:] == [
            a for a in c["args"] if a.split("=")[0] in ("--driver", "--plugin-dir", "--registry-dir")
        ]
        # The probe finds this pod's sockets through $POD_UID, which the container has (the kubelet expands only
        # literal env values in an exec probe's command: `--pod-uid=$(POD_UID)` would be `--pod-uid=`).
        assert not [a for a in command if "$(" in a]
        assert POD_UID_ENV in c["env"] and "--pod-uid=$(POD_UID)" in c["args"]
        monkeypatch.setenv("POD_UID", "0b5e1a8c-3f2d-4c6e-9a71-2d4f6b8e0c13")
        args = build_parser().parse_args(command[1:])  # the CLI takes it
        assert args.func is probe_cli.run and args.pod_uid == "0b5e1a8c-3f2d-4c6e-9a71-2d4f6b8e0c13"
        assert [p.name for p in plugin_sockets(args.driver, args.plugin_dir, args.registry_dir, args.pod_uid)] == [
            "dra-0b5e1a8c-3f2d-4c6e-9a71-2d4f6b8e0c13.sock",
            f"{driver}-0b5e1a8c-3f2d-4c6e-9a71-2d4f6b8e0c13-reg.sock",
        ]
        assert probe["periodSeconds"] >= 10 and probe["failureThreshold"] >= 3
        assert probe["timeoutSeconds"] > 1 + 2 * args.timeout  # interpreter start, then both sockets
        # a slow start (discovery, the first API calls) is the startup probe's to wait out, checking often
        start = c["startupProbe"]
        assert start["exec"]["command"] == [*command, "--registered"] and start["periodSeconds"] <= 2
        assert (
            start["periodSeconds"] * start["failureThreshold"] >= 60
            and start["timeoutSeconds"] == probe["timeoutSeconds"]
        )
    tuned = _render(helm, "--set", "livenessProbe.periodSeconds=60", "--set", "livenessProbe.failureThreshold=5")
    assert {k: _plugin(tuned)["c"]["livenessProbe"][k] for k in ("periodSeconds", "failureThreshold")} == {
        "periodSeconds": 60,
        "failureThreshold": 5,
    }
    assert "livenessProbe" not in _plugin(_render(helm, "--set", "livenessProbe.enabled=false"))["c"]
    assert "startupProbe" not in _plugin(_render(helm, "--set", "startupProbe.enabled=false"))["c"]


def test_readiness_waits_for_the_registration_so_a_rolling_update_never_leaves_the_node_without_a_plugin(
    helm: Helm,
) -> None:
    """Ready once this pod's own sockets answer and the kubelet has registered it (the kubelet registers a new socket
    up to a second after it appears); liveness asks only that the sockets answer."""
    from dra_driver.cli import build_parser

    c = _plugin(_render(helm))["c"]
    ready = c["readinessProbe"]
    assert ready["exec"]["command"] == [*c["livenessProbe"]["exec"]["command"], "--registered"]
    assert build_parser().parse_args(ready["exec"]["command"][1:]).registered
    assert ready["failureThreshold"] == 1 and ready["initialDelaySeconds"] == 0  # first once the startup probe passed
    assert ready["periodSeconds"] >= 10  # an exec probe starts an interpreter: not every second
    assert "readinessProbe" not in _plugin(_render(helm, "--set", "readinessProbe.enabled=false"))["c"]


def _daemonset(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return _one(objs, "DaemonSet", FULLNAME)


def test_unique_sockets_surge_and_their_opt_out(helm: Helm) -> None:
    default = _render(helm)
    c = _plugin(default)["c"]
    assert POD_UID_ENV in c["env"]
    args = c["args"]
    assert args[args.index("--registry-dir=/var/lib/kubelet/plugins_registry") + 1] == "--pod-uid=$(POD_UID)"
    assert _daemonset(default)["spec"]["updateStrategy"] == SURGE
    assert _daemonset(_render(helm, *SIMULATOR))["spec"]["updateStrategy"] == SURGE

    off = _render(helm, "--set", "rollingUpdate.uniqueSockets=false")
    c = _plugin(off)["c"]
    assert "POD_UID" not in {e["name"] for e in c["env"]}  # the CLI's default: none, the plain names
    assert not [a for a in c["args"] + c["livenessProbe"]["exec"]["command"] if a.startswith("--pod-uid")]
    assert _daemonset(off)["spec"]["updateStrategy"] == NO_SURGE

    # a strategy of one's own replaces the default as a whole
    for values, wanted in (
        (("--set", "updateStrategy.type=OnDelete"), {"type": "OnDelete"}),
        (
            ("--set-json", 'updateStrategy={"rollingUpdate": {"maxSurge": "10%", "maxUnavailable": 0}}'),
            {"rollingUpdate": {"maxSurge": "10%", "maxUnavailable": 0}},
        ),
        (
            ("--set", "rollingUpdate.uniqueSockets=false", "--set-json", 'updateStrategy={"type": "OnDelete"}'),
            {"type": "OnDelete"},
        ),
    ):
        assert _daemonset(_render(helm, *values))["spec"]["updateStrategy"] == wanted, values


def test_socket_paths_with_a_pod_uid_must_fit_a_unix_socket(helm: Helm) -> None:
    from dra_driver.plugin.grpc.server import MAX_UNIX_PATH

    microk8s = ("--set", "kubeletDir=/var/snap/microk8s/common/var/lib/kubelet")
    proc = _run(helm, "template", RELEASE, str(CHART), *microk8s, check=False)
    assert proc.returncode != 0, proc.stdout
    assert "dra-<uid>.sock has 114 bytes, more than the 107" in proc.stderr, proc.stderr
    assert "set rollingUpdate.uniqueSockets=false" in proc.stderr
    c = _plugin(_render(helm, *microk8s, "--set", "rollingUpdate.uniqueSockets=false"))["c"]
    assert "--registry-dir=/var/snap/microk8s/common/var/lib/kubelet/plugins_registry" in c["args"]
    # the chart's limit is the plugin's: the longest name that renders is the longest the plugin can bind
    uid = "0b5e1a8c-3f2d-4c6e-9a71-2d4f6b8e0c13"
    for name_len, renders in ((27, True), (28, False)):  # /var/lib/kubelet/plugins_registry/<name>-<uid>-reg.sock
        name = "g" * (name_len - 6) + ".ex.io"
        proc = _run(helm, "template", RELEASE, str(CHART), "--set", f"driverName={name}", check=False)
        assert (proc.returncode == 0) is renders, (name_len, proc.stderr)
        longest = f"/var/lib/kubelet/plugins_registry/{name}-{uid}-reg.sock"
        assert (len(longest) <= MAX_UNIX_PATH) is renders


def test_proc_root_is_the_mounted_host_proc_for_the_real_backend(helm: Helm) -> None:
    from dra_driver.cli import build_parser

    p = _plugin(_render(helm, *REAL))
    args = build_parser().parse_args(p["c"]["args"])
    assert args.proc_root == Path(p["mounts"]["host-proc"]["mountPath"]) == Path("/host/proc")
    assert args.sysfs_root == Path(p["mounts"]["host-sys"]["mountPath"]) == Path("/host/sys")
    assert p["mounts"]["host-proc"]["readOnly"] is True
    sim = _plugin(_render(helm, *SIMULATOR))
    assert build_parser().parse_args(sim["c"]["args"]).proc_root == Path("/proc")  # unused: the simulator's own
    assert "host-proc" not in sim["mounts"]


def test_every_host_path_is_a_value(helm: Helm) -> None:
    paths = {"kubeletDir": "/k", "cdiRoot": "/c", "nvidiaDriverRoot": "/d", "hostProc": "/hp", "hostSys": "/hs"}
    values = [a for k, v in paths.items() for a in ("--set", f"{k}={v}")]
    assert _host_paths(_plugin(_render(helm, *values))["pod"]) == {
        "plugin-dir": f"/k/plugins/{DEFAULT_DRIVER}",
        "registry-dir": "/k/plugins_registry",
        "cdi-root": "/c",
        "host-proc": "/hp",
        "host-sys": "/hs",
        "driver-root": "/d",
    }
    sim = _plugin(_render(helm, *values, *SIMULATOR, "--set", "nvml.simulator.stateHostPath=/s"))
    assert _host_paths(sim["pod"]) == {
        "plugin-dir": f"/k/plugins/{DEFAULT_DRIVER}",
        "registry-dir": "/k/plugins_registry",
        "cdi-root": "/c",
        "sim-state": "/s",
    }
    assert sim["mounts"]["sim-state"]["mountPath"] == "/var/lib/dra-driver/sim"
    assert "--sim-state=/var/lib/dra-driver/sim/mixed" in sim["c"]["args"]


def test_host_network_and_extra_env(helm: Helm) -> None:
    default = _plugin(_render(helm))
    assert "hostNetwork" not in default["pod"] and "dnsPolicy" not in default["pod"]
    objs = _render(helm, *HOST_NETWORK)
    p = _plugin(objs)
    assert p["pod"]["hostNetwork"] is True and p["pod"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert p["c"]["env"][-2:] == API_SERVER_ENV  # appended: after (and so over) the chart's own
    assert [e for e in p["c"]["env"] if e["name"].startswith("KUBERNETES_")] == API_SERVER_ENV
    assert [e for e in default["c"]["env"] if e != POD_UID_ENV] == [e for e in p["c"]["env"] if e not in API_SERVER_ENV]
    # with hostNetwork the metrics port is a port of the node: the pod declares none (a declared one is a host port,
    # and the scheduler would keep the surge pod off the node), and the pod holding it hands it to the next one
    assert _daemonset(objs)["spec"]["updateStrategy"] == NO_SURGE  # uniqueSockets=false
    assert _daemonset(_render(helm, "--set", "hostNetwork=true"))["spec"]["updateStrategy"] == SURGE
    assert "ports" not in p["c"] and "--metrics-share-port" in p["c"]["args"]
    assert "ports" in default["c"] and "--metrics-share-port" not in default["c"]["args"]
    off = _plugin(_render(helm, *HOST_NETWORK, "--set", "metrics.enabled=false"))["c"]
    assert "--metrics-share-port" not in off["args"]


def _node_rules(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rules of every rendered ClusterRole that mention nodes."""
    return [r for o in objs if o["kind"] == "ClusterRole" for r in o["rules"] if "nodes" in r["resources"]]


def test_node_labels_value_toggles_the_flag_rbac_and_policy(helm: Helm) -> None:
    off = _render(helm)
    assert "--node-labels" not in _plugin(off)["c"]["args"]
    assert _node_rules(off) == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]  # no patch
    assert not [o for o in off if o["metadata"]["name"].endswith("node-labels")]

    on = _render(helm, *NODE_LABELS)
    args = _plugin(on)["c"]["args"]
    assert args[args.index("--ignored-xids=13,31,43,45,68,109") + 1] == "--node-labels"
    role = _one(on, "ClusterRole", f"{FULLNAME}-node-labels")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    binding = _one(on, "ClusterRoleBinding", f"{FULLNAME}-node-labels")
    assert binding["roleRef"]["name"] == f"{FULLNAME}-node-labels"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    vap = _one(on, "ValidatingAdmissionPolicy", f"{FULLNAME}-own-node-labels")["spec"]
    assert vap["matchConstraints"]["resourceRules"][0]["resources"] == ["nodes"]
    assert {v["name"]: v["expression"] for v in vap["variables"]}["prefix"] == f"'{DEFAULT_DRIVER}/'"
    vapb = _one(on, "ValidatingAdmissionPolicyBinding", f"{FULLNAME}-own-node-labels")
    assert vapb["spec"] == {"policyName": f"{FULLNAME}-own-node-labels", "validationActions": ["Deny"]}
    _plugin(on)["c"]["args"].remove("--node-labels")
    assert [o for o in on if not o["metadata"]["name"].endswith("node-labels")] == off  # nothing else changes

    custom = _render(helm, *NODE_LABELS, "--set", "driverName=gpu.example.com")
    vap = _one(custom, "ValidatingAdmissionPolicy", f"{FULLNAME}-own-node-labels")["spec"]
    assert {v["name"]: v["expression"] for v in vap["variables"]}["prefix"] == "'gpu.example.com/'"
    no_policy = _render(helm, *NODE_LABELS, "--set", "admissionPolicy.enabled=false")
    assert not [o for o in no_policy if o["kind"].startswith("ValidatingAdmissionPolicy")]
    assert _one(no_policy, "ClusterRole", f"{FULLNAME}-node-labels")
    no_rbac = _render(helm, *NODE_LABELS, "--set", "rbac.create=false")
    assert not [o for o in no_rbac if o["kind"].startswith("ClusterRole")]
    assert "--node-labels" in _plugin(no_rbac)["c"]["args"]  # the operator grants it some other way


def test_notes_say_how_to_taint_gpu_nodes(helm: Helm, control_plane: ControlPlane) -> None:
    env = {**helm.env, "KUBECONFIG": str(control_plane.kubeconfig)}  # install --dry-run asks the server's version
    # Even a client dry run refuses cluster-scoped objects that exist without Helm's ownership metadata (other tests
    # apply deviceclasses/ to this cluster): render no DeviceClasses, and a release name of this test's own.
    own = ("--set", "deviceClasses.enabled=false")

    def notes(*values: str) -> str:
        proc = subprocess.run([str(helm.path), "install", "notes-test", str(CHART), "-n", NAMESPACE,
                               "--dry-run=client", *own, *values], env=env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split("\nNOTES:\n", 1)[1]

    text = notes()
    assert "kubectl taint node <gpu-node> gpu.dra-driver.dev/gpu=present:NoSchedule" in text
    assert "- {key: gpu.dra-driver.dev/gpu, operator: Exists, effect: NoSchedule}" in text
    assert "The DaemonSet tolerates that taint" in text and "Node labels are on" not in text
    assert "WARNING" not in text  # static by default
    costly = notes("--set", "mode=partitionable", "--set", "k8sVersion=1.36")
    assert "WARNING: mode partitionable on Kubernetes 1.36" in costly and "grows with every node" in costly
    assert "gpu.dra-driver.dev/config=mig-on-demand" in costly
    on_137 = notes("--set", "mode=partitionable", "--set", "k8sVersion=1.37.2")
    assert "WARNING: mode partitionable on Kubernetes 1.37.2" in on_137 and "7 times fewer pods" in on_137
    assert "gpu.dra-driver.dev/config=mig-on-demand" in on_137
    assert "WARNING" not in notes("--set", "k8sVersion=1.36")
    text = notes("--set", "driverName=gpu.example.com", "--set", "tolerateGpuTaint=false", *NODE_LABELS)
    assert "gpu.example.com/gpu=present:NoSchedule" in text and "tolerateGpuTaint is false" in text
    assert "Node labels are on: each GPU node gets gpu.example.com/gpu.product" in text


def _readme_example() -> list[dict[str, Any]]:
    """The example GPU workload of the chart's README (the YAML block with the pod)."""
    blocks = re.findall(r"```yaml\n(.*?)```", (CHART / "README.md").read_text(), re.S)
    (example,) = [b for b in blocks if "kind: Pod" in b]
    return [d for d in yaml.safe_load_all(example) if d]


def test_gpu_node_taint_keeps_other_pods_off(helm: Helm, control_plane: ControlPlane, tmp_path: Path) -> None:
    """A GPU node tainted as the chart's README says: the DaemonSet's pod and the README's GPU workload (placed by
    its claim) go there under the real scheduler; a pod without the toleration, with or without a claim, does not."""
    from dra_driver.nvml.discovery import discover
    from dra_driver.simulator.nvml import SimulatedNvml
    from dra_driver.slices.builder import build_slices
    from dra_driver.slices.devices import PublishMode

    cp, node, ns = control_plane, "tainted-gpu-node", "taint-test"
    uid = cp.create_node(node)
    cp.kubectl("taint", "node", node, f"{DEFAULT_DRIVER}/gpu=present:NoSchedule")
    cp.create_namespace(ns)
    sim = SimulatedNvml("dgx-h100", tmp_path / "gpu")
    slices = build_slices(discover(sim, sim.sysfs_root), node_name=node, k8s_version="1.36", node_uid=uid,
                          mode=PublishMode.GPUS)  # fmt: skip
    cp.kubectl("apply", "-f", str(ROOT / "deviceclasses" / "gpu.yaml"))
    cp.apply(*(s.to_api() for s in slices))

    def scheduled_or_why(name: str) -> str:
        """'scheduled' once bound to the node, the scheduler's message while Unschedulable, else ''."""
        p = cp.kubectl_json("get", "pod", name, "-n", ns)
        if p["spec"].get("nodeName") == node:
            return "scheduled"
        cond = {c["type"]: c for c in p.get("status", {}).get("conditions", [])}.get("PodScheduled", {})
        return str(cond.get("message", "?")) if cond.get("reason") == "Unschedulable" else ""

    def create(obj: dict[str, Any]) -> None:
        cp.apply(obj, namespace=ns)

    try:
        # the DaemonSet's pod, placed on the node the way the DaemonSet controller does (node affinity by name)
        daemon_pod = _plugin(_render(helm, *SIMULATOR))["pod"]
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}  # fmt: skip
        create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "daemon"},
                "spec": {**daemon_pod, "affinity": affinity}})  # fmt: skip
        web = [{"name": "c", "image": "registry.invalid/web"}]
        plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "no-gpu"},
                 "spec": {"affinity": affinity, "containers": web}}  # fmt: skip
        create(plain)
        template, workload = _readme_example()
        assert workload["spec"]["tolerations"] == [GPU_TOLERATION]
        create(template)
        create(workload)
        without = {**workload, "metadata": {"name": "gpu-job-without-toleration"},
                   "spec": {k: v for k, v in workload["spec"].items() if k != "tolerations"}}  # fmt: skip
        create(without)

        assert wait_until("the DaemonSet pod", lambda: scheduled_or_why("daemon")) == "scheduled"
        assert wait_until("the README's GPU pod", lambda: scheduled_or_why(workload["metadata"]["name"])) == (
            "scheduled"
        )
        claim = cp.kubectl_json("get", "pod", workload["metadata"]["name"], "-n", ns)["status"]["resourceClaimStatuses"]
        allocation = cp.kubectl_json("get", "resourceclaim", claim[0]["resourceClaimName"], "-n", ns)["status"]
        assert allocation["allocation"]["devices"]["results"][0]["pool"] == node
        for name in ("no-gpu", "gpu-job-without-toleration"):
            why = wait_until(f"{name} unschedulable", lambda name=name: scheduled_or_why(name))
            assert "1 node(s) had untolerated taint(s)" in why, why
        assert cp.kubectl_json("get", "node", node)["spec"]["taints"] == [
            {"key": f"{DEFAULT_DRIVER}/gpu", "value": "present", "effect": "NoSchedule"}
        ]  # the node's only taint
    finally:
        cp.delete("pods", namespace=ns, grace_period=0, wait=120)
        cp.delete_namespace(ns, pods_first=False)
        cp.delete("resourceslices", wait=120, field_selector=f"spec.nodeName={node}")
        cp.delete_node(node)


def _token_client(cp: ControlPlane, token: str) -> Any:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = cp.server
    cfg.ssl_ca_cert = str(cp.work_dir / "pki" / "ca.crt")
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(cfg)


def test_node_label_policy_with_a_pod_bound_token(helm: Helm, control_plane: ControlPlane, tmp_path: Path) -> None:
    """nodeLabels.enabled on a real API server: the daemon's service account, with a token bound to its pod on node
    A, labels node A through dra_driver.labels; it may not label node B, touch a label outside the driver's domain,
    an annotation or a taint; without the chart's node-label binding it may not patch nodes at all."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from dra_driver.kube import ApiError
    from dra_driver.labels import apply_node_labels, node_labels
    from dra_driver.nvml.discovery import discover
    from dra_driver.simulator.nvml import SimulatedNvml

    cp, release, ns = control_plane, "labels", "labels-system"
    fullname, sa = "labels-dra-driver", "labels-dra-driver"
    kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
             "ValidatingAdmissionPolicyBinding"}  # fmt: skip
    objs = [o for o in _render(helm, *NODE_LABELS, release=release, namespace=ns) if o["kind"] in kinds]
    cp.create_namespace(ns)
    cp.apply(*objs, namespace=ns)
    foreign = {"team.example.com/owner": "ml", "nvidia.com/gpu.present": "true"}
    for node in ("labels-a", "labels-b"):
        cp.create_node(node, labels=foreign)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "daemon-a", "namespace": ns},
           "spec": {"nodeName": "labels-a", "serviceAccountName": sa,
                    "containers": [{"name": "plugin", "image": "registry.invalid/dra-driver:test"}]}}  # fmt: skip
    cp.apply(pod)
    token = cp.kubectl("create", "token", sa, "-n", ns, "--bound-object-kind", "Pod",
                       "--bound-object-name", "daemon-a").stdout.strip()  # fmt: skip
    token_client = _token_client(cp, token)
    core = client.CoreV1Api(token_client)

    def refused(node: str, patch: dict[str, Any], dry_run: bool = False) -> str:
        """The API server's refusal of this patch by the service account ('' when it is accepted)."""
        try:
            core.patch_node(node, patch, **({"dry_run": "All"} if dry_run else {}))
        except ApiException as e:
            assert e.status == 403, e
            return str(e.body)
        return ""

    def labels(node: str) -> dict[str, str]:
        return dict(cp.kubectl_json("get", "node", node)["metadata"]["labels"])

    try:
        # the policy is in force once it refuses a patch of a foreign label (admission runs on dry runs too)
        only_ours = f"may only change node labels under {DEFAULT_DRIVER}/"
        foreign_patch = {"metadata": {"labels": {"x.example.com/y": "1"}}}
        wait_until("the policy in force", lambda: only_ours in refused("labels-a", foreign_patch, dry_run=True))
        sim = SimulatedNvml("dgx-h100", tmp_path / "gpu")
        wanted = node_labels(discover(sim, sim.sysfs_root), DEFAULT_DRIVER)
        assert apply_node_labels(token_client, "labels-a", wanted)  # its own node: allowed
        assert {k: v for k, v in labels("labels-a").items() if k.startswith(f"{DEFAULT_DRIVER}/")} == wanted
        assert {k: labels("labels-a")[k] for k in foreign} == foreign

        with pytest.raises(ApiError) as other_node:
            apply_node_labels(token_client, "labels-b", wanted)
        assert other_node.value.status == 403 and "may only label node labels-a, not node labels-b" in str(
            other_node.value.body
        )
        for patch in (
            {"metadata": {"labels": {"team.example.com/owner": "web"}}},  # change someone else's label
            {"metadata": {"labels": {"nvidia.com/gpu.present": None}}},  # remove one
            {"metadata": {"labels": {"other.example.com/gpu": "1"}}},  # add one
            {"metadata": {"annotations": {"x.example.com/a": "1"}}},
            {"spec": {"taints": [{"key": "x.example.com/t", "effect": "NoSchedule"}]}},
            {"spec": {"unschedulable": True}},
        ):
            assert only_ours in refused("labels-a", patch), patch
        assert {k: labels("labels-a")[k] for k in foreign} == foreign
        assert not cp.kubectl_json("get", "node", "labels-a")["spec"].get("taints")
        # status cannot be written through the nodes resource: accepted, and nothing changes
        assert refused("labels-a", {"status": {"capacity": {"cpu": "1"}}}) == ""
        assert cp.kubectl_json("get", "node", "labels-a")["status"]["capacity"]["cpu"] == "100"
        # removing its own labels (the driver going away) is allowed
        apply_node_labels(token_client, "labels-a", {}, domain=DEFAULT_DRIVER)
        assert not [k for k in labels("labels-a") if k.startswith(f"{DEFAULT_DRIVER}/")]

        # without the node-labels binding (nodeLabels.enabled=false) RBAC refuses the patch outright
        cp.delete("clusterrolebinding", f"{fullname}-node-labels", missing_ok=False, wait=120)
        why = wait_until("RBAC refusal", lambda: refused("labels-a", {"metadata": {"labels": wanted}}, True))
        assert 'cannot patch resource \\"nodes\\"' in why or 'cannot patch resource "nodes"' in why, why
    finally:
        cp.delete("namespace", ns, missing_ok=False)
        for o in objs:
            if o["kind"] != "ServiceAccount":
                cp.delete(o["kind"].lower(), o["metadata"]["name"], wait=120)
        for node in ("labels-a", "labels-b"):
            cp.delete_node(node)


# ----- MPS control daemon pods (dra_driver.sharing.mps_deployment) -------------------------------------------------
MPS_SIM_PRIVILEGED = (*SIMULATOR, "--set", "mps.simulatorPrivileged=true")


def _mps_settings(p: dict[str, Any]) -> Any:
    from dra_driver.sharing.mps_deployment import PodSettings

    env = {e["name"]: e for e in p["c"]["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    return PodSettings.from_env({"DRA_DRIVER_MPS_DAEMON": env["DRA_DRIVER_MPS_DAEMON"]["value"]})


def test_mps_daemon_pods_get_the_plugins_image_unless_told_otherwise(helm: Helm) -> None:
    default = _mps_settings(_plugin(_render(helm)))
    assert default.image == _plugin(_render(helm))["c"]["image"] == "ghcr.io/dra-driver/dra-driver:0.1.0"
    assert default.image_pull_policy == "IfNotPresent" and default.priority_class_name == "system-node-critical"
    assert default.shm_size is None and default.image_pull_secrets == [] and not default.resources
    values = [
        *("--set", "mps.image.repository=registry.example.com/mps", "--set", "mps.image.tag=1.2"),
        *("--set", "mps.image.pullPolicy=Always", "--set", "mps.priorityClassName=gpu-critical"),
        *("--set", "mps.shmSize=8Gi", "--set", "mps.resources.requests.memory=64Mi"),
        *("--set-json", 'imagePullSecrets=[{"name": "regcred"}, {"name": "mirror"}]'),
    ]
    custom = _mps_settings(_plugin(_render(helm, *values)))
    assert (custom.image, custom.image_pull_policy) == ("registry.example.com/mps:1.2", "Always")
    assert custom.priority_class_name == "gpu-critical" and custom.shm_size == "8Gi"
    assert custom.image_pull_secrets == ["regcred", "mirror"] and custom.resources == {"requests": {"memory": "64Mi"}}
    assert _mps_settings(_plugin(_render(helm, "--set", "image.tag=2.0"))).image == "ghcr.io/dra-driver/dra-driver:2.0"


def test_plugin_dir_propagates_the_shm_tmpfs_to_the_host_when_privileged(helm: Helm) -> None:
    real, sim, sim_privileged = (_plugin(_render(helm, *v)) for v in (REAL, SIMULATOR, MPS_SIM_PRIVILEGED))
    for p in (real, sim_privileged):
        assert p["mounts"]["plugin-dir"]["mountPropagation"] == "Bidirectional"
        assert p["c"]["securityContext"] == {"privileged": True}
    assert "mountPropagation" not in sim["mounts"]["plugin-dir"]  # Bidirectional needs a privileged container
    assert sim["c"]["securityContext"]["privileged"] is False
    # the simulator stays a simulator: its own /proc, /sys and driver root
    assert not {"host-proc", "host-sys", "driver-root"} & set(sim_privileged["mounts"])
    assert "initContainers" not in sim_privileged["pod"] and "--nvml" not in sim_privileged["c"]["args"]


def test_driver_root_flags_name_the_same_directory_inside_and_on_the_host(helm: Helm) -> None:
    from dra_driver.cli import build_parser

    p = _plugin(_render(helm, "--set", "nvidiaDriverRoot=/run/nvidia/driver"))
    args = build_parser().parse_args(p["c"]["args"])
    assert args.driver_root == Path(p["mounts"]["driver-root"]["mountPath"]) == Path("/driver-root")
    assert args.host_driver_root == Path(_host_paths(p["pod"])["driver-root"]) == Path("/run/nvidia/driver")
    sim = _plugin(_render(helm, *SIMULATOR, "--set", "nvml.simulator.stateHostPath=/srv/sim/"))
    args = build_parser().parse_args(sim["c"]["args"])
    assert args.driver_root is None  # the simulated machine's own: <sim state>/driver-root
    mount, host = Path(sim["mounts"]["sim-state"]["mountPath"]), Path(_host_paths(sim["pod"])["sim-state"])
    assert args.sim_state.relative_to(mount) == Path("mixed")
    assert args.host_driver_root == host / args.sim_state.relative_to(mount) / "driver-root"
    assert str(args.host_driver_root) == "/srv/sim/mixed/driver-root"


def test_mps_role_lets_the_plugin_manage_pods_of_its_namespace_only(helm: Helm) -> None:
    objs = _render(helm)
    role = _one(objs, "Role", f"{FULLNAME}-mps")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "delete"]}]
    binding = _one(objs, "RoleBinding", f"{FULLNAME}-mps")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{FULLNAME}-mps"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    assert not [o for o in objs if o["kind"] == "ClusterRole" and "pods" in json.dumps(o["rules"])]
    _one(objs, "ValidatingAdmissionPolicy", f"{FULLNAME}-own-node-mps-pods")
    none = _render(helm, "--set", "rbac.create=false", "--set", "admissionPolicy.enabled=false")
    assert not [o for o in none if o["kind"] in ("Role", "RoleBinding", "ValidatingAdmissionPolicy")]


def test_mps_pod_policy_with_a_pod_bound_token(helm: Helm, control_plane: ControlPlane) -> None:
    """On a real API server, the plugin's service account with a token bound to its pod on node A creates and
    deletes the MPS daemon pods that dra_driver.sharing.mps_deployment builds from the chart's own settings, on node
    A only; not on node B, not with another image, command or extra container, and no other pod."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from dra_driver.sharing.mps_control_daemon import MpsSettings
    from dra_driver.sharing.mps_deployment import HostMount, MpsPods

    cp, release, ns = control_plane, "mps", "mps-system"
    sa = "mps-dra-driver"
    kinds = {"ServiceAccount", "Role", "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    rendered = _render(helm, release=release, namespace=ns)
    objs = [
        o for o in rendered if o["kind"] == "ServiceAccount" or (o["kind"] in kinds and "mps" in o["metadata"]["name"])
    ]
    assert {o["kind"] for o in objs} == kinds
    cp.create_namespace(ns)
    cp.apply(*objs, namespace=ns)
    for node in ("mps-a", "mps-b"):
        cp.create_node(node)
    plugin = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plugin-a", "namespace": ns},
              "spec": {"nodeName": "mps-a", "serviceAccountName": sa,
                       "containers": [{"name": "plugin", "image": "registry.invalid/dra-driver:test"}]}}  # fmt: skip
    cp.apply(plugin)
    token = cp.kubectl("create", "token", sa, "-n", ns, "--bound-object-kind", "Pod",
                       "--bound-object-name", "plugin-a").stdout.strip()  # fmt: skip
    api = _token_client(cp, token)
    core = client.CoreV1Api(api)
    (container,) = _one(rendered, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    settings = _mps_settings({"c": container})

    def pods(node: str) -> MpsPods:
        root = HostMount(Path("/"), Path("/driver-root"))
        return MpsPods(api, namespace=ns, node_name=node, driver=DEFAULT_DRIVER, settings=settings,
                       driver_root=Path("/driver-root"), mounts=[root])  # fmt: skip

    def body(node: str, uid: str = "c1") -> dict[str, Any]:
        return pods(node).manifest(uid, Path(f"/var/lib/kubelet/plugins/{DEFAULT_DRIVER}/mps/{uid}"), ["GPU-1"],
                                   MpsSettings(50))  # fmt: skip

    def refused(pod: dict[str, Any]) -> str:
        try:
            core.create_namespaced_pod(ns, pod, dry_run="All")
        except ApiException as e:
            assert e.status == 403, e
            return str(e.body)
        return ""

    try:
        wait_until(
            "the policy in force", lambda: "may only create or delete pods on node mps-a" in refused(body("mps-b"))
        )
        assert refused(body("mps-a")) == ""
        other_image = body("mps-a")
        other_image["spec"]["containers"][0]["image"] = "registry.invalid/anything:1"
        shell = body("mps-a")
        shell["spec"]["containers"][0]["command"] = ["sh", "-c", "id"]
        sidecar = body("mps-a")
        sidecar["spec"]["containers"].append({**sidecar["spec"]["containers"][0], "name": "second"})
        for pod in (other_image, shell, sidecar):
            assert "an MPS control daemon pod runs one container" in refused(pod)
        renamed = body("mps-a")
        renamed["metadata"]["name"] = "not-a-daemon"
        assert "may only create or delete MPS control daemon pods" in refused(renamed)

        core.create_namespaced_pod(ns, body("mps-a"))  # really, then the launcher lists and deletes it
        cp.apply(body("mps-b", "c2"))  # by an admin, on the other node
        assert pods("mps-a").list() == ["c1"]
        with pytest.raises(ApiException) as foreign:
            core.delete_namespaced_pod("mps-control-daemon-c2", ns)
        assert foreign.value.status == 403 and "not on node mps-b" in str(foreign.value.body)
        core.delete_namespaced_pod("mps-control-daemon-c1", ns)  # graceful: no kubelet here confirms it
        assert cp.kubectl_json("get", "pod", "mps-control-daemon-c1", "-n", ns)["metadata"]["deletionTimestamp"]
    finally:
        cp.delete("pods", namespace=ns, grace_period=0, wait=120)
        cp.delete("namespace", ns, missing_ok=False)
        for o in objs:
            if o["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
                cp.delete(o["kind"].lower(), o["metadata"]["name"], wait=120)
        for node in ("mps-a", "mps-b"):
            cp.delete_node(node)


def test_the_cdi_hook_path_reaches_the_plugin_only_when_set(helm: Helm) -> None:
    def plugin_args(*extra: str) -> list[str]:
        ds = _one(_render(helm, *REAL, *extra), "DaemonSet", FULLNAME)
        return list(next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "plugin")["args"])

    assert not [a for a in plugin_args() if a.startswith("--cdi-hook-path")]
    assert "--cdi-hook-path=/usr/bin/nvidia-cdi-hook" in plugin_args("--set", "cdi.hookPath=/usr/bin/nvidia-cdi-hook")
