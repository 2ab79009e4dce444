"""A kind cluster built offline: the project's kind config (deploy/kind-config.yaml) on the project's node image
(scripts/build-kind-node-image.sh), in the tests' own Docker (tests/cluster/docker.py).

`kind create cluster` does what it does for users: one container per node, kubeadm init and join, the config's
feature gates, runtime config and containerd patches. What the tests add to the project's config:
  - the nodes: one control plane and the workers asked for, each worker labelled with the simulated machine it stands
    for (the chart's per-node simulator, `nvml.simulator.machineLabel`);
  - the pod network: the image's own (dra-kind-cni, deploy/kind/node/) in place of kindnetd, which is not on the Go
    module proxy, so `disableDefaultCNI`;
  - kubeadm skips CoreDNS (no registry serves its image and nothing here resolves names);
  - the kubelets log at verbosity 3, as the real node's (the DRA plugins they register and unregister);
  - the nodes' own Docker network (KIND_EXPERIMENTAL_DOCKER_NETWORK), IPv4 only, on a subnet the host does not route.
The kubelets of the nodes set the same global sysctls as the real node's; they are put back on delete.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.controlplane import REPO_ROOT, ControlPlaneError, _tail
from tests.cluster.docker import BRIDGE, Docker, thaw_frozen
from tests.cluster.driver import _script_output
from tests.cluster.node import KUBELET_SYSCTLS, _read_sysctl

KIND_CONFIG = REPO_ROOT / "deploy" / "kind-config.yaml"
IMAGE_SCRIPT = REPO_ROOT / "scripts" / "build-kind-node-image.sh"
TOOLS_SCRIPT = REPO_ROOT / "scripts" / "build-kind-tools.sh"
NETWORK = "dra-kind"
MACHINE_LABEL = "sim.gpu.dra-driver.dev/machine"


def kind_tools() -> Path:
    """The bin directory of kind, kubeadm, kube-proxy and crictl (scripts/build-kind-tools.sh; cached)."""
    return _script_output(TOOLS_SCRIPT, timeout=3600)


def node_image_dir() -> Path:
    """The node image's rootfs and import settings (scripts/build-kind-node-image.sh; cached)."""
    return _script_output(IMAGE_SCRIPT, timeout=3600)


def ensure_node_image(docker: Docker) -> str:
    """The node image in `docker` (imported once per build: Docker's data root is kept in the cache)."""
    built = node_image_dir()
    ref = (built / "ref").read_text().strip()
    if docker.docker("image", "inspect", ref, check=False, timeout=30).strip() in ("", "[]"):
        changes = [line for line in (built / "import-changes").read_text().splitlines() if line.strip()]
        args = ["import"]
        for change in changes:
            args += ["--change", change]
        docker.docker(*args, str(built / "rootfs.tar"), ref, timeout=900)
        # the images of earlier builds (about 600 MiB each) go: Docker's data root is kept between runs
        repository = ref.rsplit(":", 1)[0]
        for old in docker.docker("images", "--format", "{{.Repository}}:{{.Tag}}", repository).split():
            if old != ref:
                docker.docker("rmi", old, check=False)
    return ref


def cluster_config(workers: Mapping[str, str], *, base: Path = KIND_CONFIG) -> dict[str, Any]:
    """The project's kind config with the tests' nodes (worker name -> simulated machine) and pod network."""
    config: dict[str, Any] = yaml.safe_load(base.read_text())
    config["nodes"] = [{"role": "control-plane"}] + [
        {"role": "worker", "labels": {MACHINE_LABEL: machine}} for machine in workers.values()
    ]
    networking = dict(config.get("networking") or {})
    networking.update({"disableDefaultCNI": True, "ipFamily": "ipv4", "kubeProxyMode": "iptables"})
    config["networking"] = networking
    patches = list(config.get("kubeadmConfigPatches") or [])
    patches.append("kind: InitConfiguration\nskipPhases:\n  - addon/coredns\n")
    # as the real node's kubelet: at 3 it logs each DRA plugin it registers and unregisters, with how many it holds
    patches.append("kind: KubeletConfiguration\nlogging:\n  verbosity: 3\n")
    config["kubeadmConfigPatches"] = patches
    return config


class KindCluster:
    """`kind create cluster` of `name` with workers `workers` (name-ordered kind node names -> machine)."""

    def __init__(self, docker: Docker, *, name: str = "dra", machines: Sequence[str] = ("dgx-h100", "dgx-b200")):
        self.docker = docker
        self.name = name
        self.machines = list(machines)
        self.workers = [f"{name}-worker" + (str(i + 1) if i else "") for i in range(len(machines))]
        self.control_plane = f"{name}-control-plane"
        self.kind = kind_tools() / "kind"
        self.workdir = Path(tempfile.mkdtemp(prefix="dra-kind-"))
        self.kubeconfig = self.workdir / "kubeconfig"
        self._sysctls: dict[str, str | None] = {}

    @property
    def nodes(self) -> list[str]:
        return [self.control_plane, *self.workers]

    @property
    def env(self) -> dict[str, str]:
        env = self.docker.env
        env["KIND_EXPERIMENTAL_DOCKER_NETWORK"] = NETWORK
        env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def run_kind(self, *args: str, timeout: float = 600, input: str | None = None) -> str:
        proc = subprocess.run(
            [str(self.kind), *args], env=self.env, capture_output=True, text=True, timeout=timeout, input=input
        )
        if proc.returncode != 0:
            raise ControlPlaneError(f"kind {' '.join(args)} failed ({proc.returncode}):\n{_tail(proc.stderr, 60)}")
        return proc.stdout

    def create(self, *, wait: str = "5m") -> None:
        image = ensure_node_image(self.docker)
        self.delete()  # a cluster of an earlier, killed run
        if not self.docker.docker("network", "ls", "-q", "--filter", f"name=^{NETWORK}$").strip():
            self.docker.docker(
                "network", "create", "--driver", "bridge", "--subnet", self.docker.subnet,
                "-o", f"com.docker.network.bridge.name={BRIDGE}", "-o", "com.docker.network.driver.mtu=1500", NETWORK,
            )  # fmt: skip
        self._sysctls = {name: _read_sysctl(name) for name in KUBELET_SYSCTLS}
        config = self.workdir / "kind-config.yaml"
        config.write_text(yaml.safe_dump(cluster_config(dict(zip(self.workers, self.machines, strict=True)))))
        self.run_kind(
            "create", "cluster", "--name", self.name, "--image", image, "--config", str(config),
            "--kubeconfig", str(self.kubeconfig), "--wait", wait, "--retain",
            timeout=900,
        )  # fmt: skip

    def delete(self) -> None:
        if self.name in self.run_kind("get", "clusters", timeout=60).split():
            thaw_frozen()
            self.run_kind("delete", "cluster", "--name", self.name, "--kubeconfig", str(self.kubeconfig), timeout=300)
        self.docker.docker("network", "rm", NETWORK, check=False, timeout=60)
        for name, value in self._sysctls.items():
            if value is not None and _read_sysctl(name) != value:
                (Path("/proc/sys") / name).write_text(value)
        self._sysctls = {}

    def kubectl(self, *args: str, timeout: float = 120, input: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            ["docker", "exec", "-i", self.control_plane, "kubectl", "--kubeconfig=/etc/kubernetes/admin.conf", *args],
            env=self.env, capture_output=True, text=True, timeout=timeout, input=input,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {_tail(proc.stderr)}")
        return proc.stdout

    def node_exec(self, node: str, *cmd: str, timeout: float = 120, check: bool = True) -> str:
        proc = subprocess.run(
            ["docker", "exec", node, *cmd], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise ControlPlaneError(f"{node}: {' '.join(cmd)} failed ({proc.returncode}): {_tail(proc.stderr)}")
        return proc.stdout

    def logs(self, node: str) -> str:
        return self.node_exec(node, "journalctl", "--no-pager", "-b", check=False, timeout=60)
