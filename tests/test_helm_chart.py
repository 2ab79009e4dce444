"""deploy/helm/dra-driver: `helm lint` clean, the rendered objects right per value set (real NVML, simulator,
custom driver name), in step with deploy/rbac.yaml and deviceclasses/, and accepted by a real kube-apiserver
(`kubectl apply --dry-run=server`). Helm is built from its Go module by scripts/build-helm.sh (cached)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.controlplane import ControlPlane

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
VALUE_SETS = {"real": REAL, "simulator": SIMULATOR, "custom": CUSTOM}


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


def _template(helm: Helm, *values: str) -> str:
    return _run(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *values).stdout


def _render(helm: Helm, *values: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(_template(helm, *values)) if d]


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
        "--node-name=$(NODE_NAME)",
        f"--driver={DEFAULT_DRIVER}",
        "--mode=partitionable",
        f"--plugin-dir=/var/lib/kubelet/plugins/{DEFAULT_DRIVER}",
        "--registry-dir=/var/lib/kubelet/plugins_registry",
        "--cdi-root=/var/run/cdi",
        "--rediscover-seconds=60",
        "--metrics-port=8080",
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
    assert c["args"][:4] == [
        "plugin",
        "--sim=mixed",
        "--sim-state=/var/lib/dra-driver/sim/mixed",
        "--node-name=$(NODE_NAME)",
    ]
    assert "--nvml" not in c["args"]
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
    assert {e["name"]: e.get("value") for e in c["env"]}["DRA_DRIVER_FEATURE_GATES"] == "MPSSupport=false"
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
    vap = _one(objs, "ValidatingAdmissionPolicy", f"{FULLNAME}-own-node-slices")
    want = ref["ValidatingAdmissionPolicy", "dra-driver-own-node-slices"]["spec"]
    assert vap["spec"]["matchConditions"] == [
        {
            "name": "is-driver-service-account",
            "expression": f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{FULLNAME}'",
        }
    ]
    assert {k: v for k, v in vap["spec"].items() if k != "matchConditions"} == {
        k: v for k, v in want.items() if k != "matchConditions"
    }
    vapb = _one(objs, "ValidatingAdmissionPolicyBinding", f"{FULLNAME}-own-node-slices")
    assert vapb["spec"] == {"policyName": f"{FULLNAME}-own-node-slices", "validationActions": ["Deny"]}
    assert not [o for o in objs if o["kind"] == "Namespace"]  # helm --create-namespace makes it


def test_device_classes_are_those_of_deviceclasses_dir(helm: Helm) -> None:
    rendered = {o["metadata"]["name"]: o["spec"] for o in _render(helm, *REAL) if o["kind"] == "DeviceClass"}
    on_disk = {}
    for path in sorted((ROOT / "deviceclasses").glob("*.yaml")):
        obj = yaml.safe_load(path.read_text())
        on_disk[obj["metadata"]["name"]] = obj["spec"]
    assert rendered == on_disk, "deviceClasses.migProfiles in values.yaml out of step with deviceclasses/"
    assert not [o for o in _render(helm, "--set", "deviceClasses.enabled=false") if o["kind"] == "DeviceClass"]


def test_bad_values_fail_the_render(helm: Helm) -> None:
    for values, message in (
        (("--set", "nvml.backend=fake"), "nvml.backend must be real or simulator"),
        (("--set", "mode=all"), "mode must be partitionable, static, gpus or shared"),
        (("--set", "driverName=GPU_Driver"), "driverName must be a DNS subdomain"),
        (("--kube-version", "1.33.0"), "kubeVersion"),
    ):
        proc = _run(helm, "template", RELEASE, str(CHART), *values, check=False)
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_api_server_accepts_every_object(helm: Helm, control_plane: ControlPlane, values: tuple[str, ...]) -> None:
    manifest = _template(helm, *values)
    count = sum(1 for d in yaml.safe_load_all(manifest) if d)
    if control_plane.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
        control_plane.kubectl("create", "namespace", NAMESPACE)
    out = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest).stdout
    lines = [line for line in out.splitlines() if line.endswith("(server dry run)")]
    assert len(lines) == count, out
