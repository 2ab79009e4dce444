"""deploy/kind-config.yaml, the kind config users create their cluster from, and tests/cluster/kind.py's
cluster_config, which the tests' kind cluster is created from: the project's settings (feature gates, CDI in
containerd, the kubeadm patches of a cgroup v1 host) stay, the nodes are the tests' (each worker labelled with the
simulated machine it stands for), the pod network the node image's own, and CoreDNS skipped. No Docker, no kind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import kind
from tests.cluster.controlplane import REPO_ROOT

KIND_CONFIG = REPO_ROOT / "deploy" / "kind-config.yaml"
WORKERS = {"dra-worker": "dgx-h100", "dra-worker2": "dgx-b200"}


def _load(path: Path = KIND_CONFIG) -> dict[str, Any]:
    config = yaml.safe_load(path.read_text())
    assert isinstance(config, dict)
    return config


def _patches(config: dict[str, Any]) -> list[dict[str, Any]]:
    """kubeadmConfigPatches, each a YAML document in a string, parsed."""
    patches = config["kubeadmConfigPatches"]
    assert all(isinstance(p, str) for p in patches), patches
    return [yaml.safe_load(p) for p in patches]


def _of_kind(patches: list[dict[str, Any]], kind_name: str) -> list[dict[str, Any]]:
    return [p for p in patches if p.get("kind") == kind_name]


# the project's file


def test_the_projects_config_is_a_kind_cluster() -> None:
    config = _load()
    assert config["kind"] == "Cluster" and config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert kind.KIND_CONFIG == KIND_CONFIG


def test_the_feature_gates_of_the_drivers_features() -> None:
    gates = _load()["featureGates"]
    for gate in ("DRAPartitionableDevices", "DRADeviceTaints", "DRAConsumableCapacity", "DRAPrioritizedList"):
        assert gates[gate] is True, gate  # a YAML boolean, not the string "true"
    assert _load()["runtimeConfig"] == {"resource.k8s.io/v1beta2": "true"}


def test_containerd_has_cdi_on_with_the_plugins_spec_directory() -> None:
    (patch,) = _load()["containerdConfigPatches"]
    assert '[plugins."io.containerd.grpc.v1.cri"]' in patch
    settings = dict(line.strip().split(" = ", 1) for line in patch.splitlines() if " = " in line)
    assert settings["enable_cdi"] == "true"
    dirs = yaml.safe_load(settings["cdi_spec_dirs"])  # a TOML list of strings reads as a YAML flow sequence
    assert "/var/run/cdi" in dirs and "/etc/cdi" in dirs


def test_the_kubeadm_patches_for_a_cgroup_v1_host() -> None:
    patches = _patches(_load())
    (kubelet,) = _of_kind(patches, "KubeletConfiguration")
    assert kubelet["failCgroupV1"] is False
    for name in ("InitConfiguration", "JoinConfiguration"):
        (patch,) = _of_kind(patches, name)
        assert patch["nodeRegistration"]["ignorePreflightErrors"] == ["SystemVerification"], name
    assert {p["kind"] for p in patches} == {"KubeletConfiguration", "InitConfiguration", "JoinConfiguration"}


def test_the_projects_nodes() -> None:
    assert [n["role"] for n in _load()["nodes"]] == ["control-plane", "worker"]


# the tests' cluster


def test_the_tests_nodes_are_labelled_with_their_machines() -> None:
    config = kind.cluster_config(WORKERS)
    assert config["nodes"] == [
        {"role": "control-plane"},
        {"role": "worker", "labels": {"sim.gpu.dra-driver.dev/machine": "dgx-h100"}},
        {"role": "worker", "labels": {"sim.gpu.dra-driver.dev/machine": "dgx-b200"}},
    ]
    assert kind.MACHINE_LABEL == "sim.gpu.dra-driver.dev/machine"


@pytest.mark.parametrize(
    "workers",
    [{}, {"dra-worker": "mixed"}, {"a": "dgx-a100", "b": "dgx-h100", "c": "gb200-nvl72-tray"}],
    ids=["none", "one", "three"],
)
def test_one_worker_per_machine_in_order(workers: dict[str, str]) -> None:
    nodes = kind.cluster_config(workers)["nodes"]
    assert nodes[0] == {"role": "control-plane"}
    assert [n["role"] for n in nodes[1:]] == ["worker"] * len(workers)
    assert [n["labels"][kind.MACHINE_LABEL] for n in nodes[1:]] == list(workers.values())


def test_the_tests_pod_network() -> None:
    networking = kind.cluster_config(WORKERS)["networking"]
    assert networking["disableDefaultCNI"] is True
    assert networking["kubeProxyMode"] == "iptables"
    assert networking["ipFamily"] == "ipv4"


def test_the_projects_settings_stay() -> None:
    project = _load()
    config = kind.cluster_config(WORKERS)
    for key in ("kind", "apiVersion", "featureGates", "runtimeConfig", "containerdConfigPatches"):
        assert config[key] == project[key], key
    patches = config["kubeadmConfigPatches"]
    assert patches[: len(project["kubeadmConfigPatches"])] == project["kubeadmConfigPatches"]  # the same strings


def test_kubeadm_skips_coredns() -> None:
    project = _load()
    patches = _patches(kind.cluster_config(WORKERS))
    assert len(patches) == len(project["kubeadmConfigPatches"]) + 2
    assert patches[-2] == {"kind": "InitConfiguration", "skipPhases": ["addon/coredns"]}
    assert patches[-1] == {"kind": "KubeletConfiguration", "logging": {"verbosity": 3}}  # plugin registrations
    # kind merges patches of the same kind: the project's preflight patch is still there beside it
    inits = _of_kind(patches, "InitConfiguration")
    assert any(p.get("nodeRegistration", {}).get("ignorePreflightErrors") == ["SystemVerification"] for p in inits)
    assert _of_kind(patches, "KubeletConfiguration")[0]["failCgroupV1"] is False


def test_the_projects_file_is_read_not_changed() -> None:
    before = KIND_CONFIG.read_text()
    first = kind.cluster_config(WORKERS)
    second = kind.cluster_config(WORKERS)
    assert first == second  # a patch is not appended twice
    assert KIND_CONFIG.read_text() == before


def test_another_base(tmp_path: Path) -> None:
    base = tmp_path / "kind-config.yaml"
    base.write_text(
        "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\n"
        "networking:\n  apiServerPort: 6443\n  podSubnet: 10.244.0.0/16\n"
        "nodes:\n  - role: control-plane\n  - role: worker\n  - role: worker\n  - role: worker\n"
    )
    config = kind.cluster_config({"w": "dgx-b200"}, base=base)
    assert config["nodes"] == [
        {"role": "control-plane"},
        {"role": "worker", "labels": {kind.MACHINE_LABEL: "dgx-b200"}},
    ]
    assert config["networking"] == {
        "apiServerPort": 6443,  # the base's networking, kept
        "podSubnet": "10.244.0.0/16",
        "disableDefaultCNI": True,
        "ipFamily": "ipv4",
        "kubeProxyMode": "iptables",
    }
    assert config["kubeadmConfigPatches"] == [
        "kind: InitConfiguration\nskipPhases:\n  - addon/coredns\n",
        "kind: KubeletConfiguration\nlogging:\n  verbosity: 3\n",
    ]


def test_the_config_kind_is_given_is_yaml_of_the_same() -> None:
    config = kind.cluster_config(WORKERS)
    assert yaml.safe_load(yaml.safe_dump(config)) == config  # what KindCluster.create writes


def test_importing_kind_runs_nothing(tmp_path: Path) -> None:
    """tests.cluster.kind (and tests.cluster.docker under it) at import: no process, no socket, no Docker."""
    code = (
        "import socket, subprocess, os, sys\n"
        "def refuse(*a, **k):\n"
        "    raise AssertionError(f'at import: {a!r}')\n"
        "subprocess.Popen = refuse\n"
        "os.system = os.execv = os.execvp = os.fork = refuse\n"
        "socket.socket.connect = refuse\n"
        "import tests.cluster.kind\n"
        "assert 'tests.cluster.docker' in sys.modules\n"
        "print('imported')\n"
    )
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path), "DRA_DRIVER_CACHE": str(tmp_path / "cache")}  # no docker here
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "imported", proc.stderr
    assert not (tmp_path / "cache").exists()  # nothing built or created in the cache either
