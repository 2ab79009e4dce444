"""The driver deployed on the real test node as users deploy it: its image built from deploy/Dockerfile
(scripts/build-driver-image.sh), imported into the node's containerd, and `helm upgrade --install` of
deploy/helm/dra-driver with the simulator enabled through chart values.

Two values exist for this node only: the test API server listens on 127.0.0.1 and there is no kube-proxy, so the
driver pod uses the host network and its in-cluster client is pointed at the API server with KUBERNETES_SERVICE_HOST
and _PORT (`hostNetwork`, `extraEnv`). Every host path the chart mounts points into the node's work directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.cluster.controlplane import REPO_ROOT, ControlPlaneError, _tail, free_port
from tests.cluster.logs import DriverLogs
from tests.cluster.node import Node
from tests.polling import wait_until

CHART = REPO_ROOT / "deploy" / "helm" / "dra-driver"
IMAGE_SCRIPT = REPO_ROOT / "scripts" / "build-driver-image.sh"
HELM_SCRIPT = REPO_ROOT / "scripts" / "build-helm.sh"
DRIVER_NAME = "gpu.dra-driver.dev"
# Chart values that replace the driver's pods one at a time: modules that change the node's configuration by upgrade
# use them, since during a surge the old and the new daemon both publish the pool, each its own configuration, until
# the old one exits (known, to be fixed in the publisher: the older instance should yield to a newer live one).
NO_SURGE_VALUES = (
    "--set-json",
    'updateStrategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}',
)
IMAGE_REPOSITORY = "ghcr.io/dra-driver/dra-driver"


def _script_output(script: Path, timeout: float) -> Path:
    env = dict(os.environ)
    env["PATH"] = env.get("PATH", "") + os.pathsep + "/usr/local/go/bin"
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise ControlPlaneError(f"{script} failed ({proc.returncode}):\n{_tail(proc.stderr)}")
    return Path(proc.stdout.strip().splitlines()[-1])


def driver_image() -> Path:
    """The driver image's OCI archive (built from deploy/Dockerfile by buildah; cached)."""
    return _script_output(IMAGE_SCRIPT, timeout=3600)


def helm_binary() -> Path:
    return _script_output(HELM_SCRIPT, timeout=3600)


def chart_version() -> str:
    for line in (CHART / "Chart.yaml").read_text().splitlines():
        if line.startswith("appVersion:"):
            return line.split(":", 1)[1].strip().strip('"')
    raise ControlPlaneError("no appVersion in Chart.yaml")


class DriverRelease:
    """`helm upgrade --install` of the chart on `node` (simulated GPUs of `machine`), and what the tests ask of it."""

    def __init__(
        self,
        node: Node,
        *,
        machine: str = "dgx-h100",
        mode: str = "partitionable",
        release: str = "dra-driver",
        namespace: str = "dra-driver",
        values: Sequence[str] = (),
    ) -> None:
        self.node = node
        self.cp = node.cp
        self.machine = machine
        self.mode = mode
        self.release = release
        self.namespace = namespace
        self.extra_values = list(values)
        self.helm = helm_binary()
        home = node.work_dir / "helm"
        self.helm_env = {
            **os.environ,
            **{f"HELM_{k}_HOME": str(home / k.lower()) for k in ("CACHE", "CONFIG", "DATA")},
            "KUBECONFIG": str(self.cp.kubeconfig),
        }
        self.metrics_port = free_port()
        self.sim_state = node.work_dir / "sim-state"
        # every container log of the release's namespace, kept from `install` on (tests.cluster.logs)
        self.log = DriverLogs(
            node.pod_logs_dir,
            node.kubelet_log,
            namespace,
            keep=Path(tempfile.mkdtemp(prefix=f"{release}-", dir=node.work_dir)) / "kept-logs",
            words=(DRIVER_NAME, "DRAResourceHealth", "WatchResources"),
        )

    @property
    def plugin_dir(self) -> Path:
        return self.node.kubelet_dir / "plugins" / DRIVER_NAME

    def values(self) -> list[str]:
        sets = {
            "nvml.backend": "simulator",
            "nvml.simulator.machine": self.machine,
            "nvml.simulator.stateHostPath": str(self.sim_state),
            "mode": self.mode,
            "kubeletDir": str(self.node.kubelet_dir),
            "cdiRoot": str(self.node.cdi_dir),
            "image.pullPolicy": "Never",
            "hostNetwork": "true",
            "metrics.port": str(self.metrics_port),
            "extraEnv[0].name": "KUBERNETES_SERVICE_HOST",
            "extraEnv[0].value": "127.0.0.1",
            "extraEnv[1].name": "KUBERNETES_SERVICE_PORT",
            "extraEnv[1].value": str(self.cp.api_port),
        }
        args: list[str] = []
        for key, value in sets.items():
            args += ["--set-string" if key.endswith(".value") else "--set", f"{key}={value}"]
        return [*args, *self.extra_values]

    def helm_cmd(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.helm), *args], env=self.helm_env, capture_output=True, text=True, timeout=timeout
        )
        if proc.returncode != 0:
            raise ControlPlaneError(f"helm {' '.join(args[:2])} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def install(self, *extra: str, timeout: float = 180.0, wait: bool = True) -> None:
        """Import the image (once per node), install or upgrade the release, and (with `wait`) wait until the
        DaemonSet is rolled out and the plugin registered: by a new pod, where the upgrade made one (until then the
        kubelet refuses to prepare the node's claims, and the new pod may publish its slices before that)."""
        self.log.start()
        reference = f"{IMAGE_REPOSITORY}:{chart_version()}"
        if reference not in self.node.image_names():
            self.node.import_image(driver_image())
        pods_before = {p["metadata"]["uid"] for p in self.pods()}
        registered = self.registrations()
        self.helm_cmd(
            "upgrade", "--install", self.release, str(CHART), "--namespace", self.namespace, "--create-namespace",
            *self.values(), *extra,
        )  # fmt: skip
        if wait:
            deadline = time.monotonic() + timeout
            self.wait_rollout(deadline)
            new_pod = any(p["metadata"]["uid"] not in pods_before for p in self.pods())
            self.wait_registered(deadline, registrations=registered + 1 if new_pod else max(registered, 1))

    def wait_rollout(self, deadline: float) -> None:
        """Until the DaemonSet's pods all run the current template and no old pod is left."""
        last: Any = None
        while time.monotonic() < deadline:
            ds = self.cp.kubectl_json("get", "daemonset", self.release, "-n", self.namespace)
            status = ds.get("status", {})
            desired = status.get("desiredNumberScheduled", -1)
            last = status
            if (
                status.get("observedGeneration") == ds["metadata"]["generation"]
                and desired >= 1
                and status.get("updatedNumberScheduled") == desired
                and status.get("numberAvailable") == desired
                and len(self.pods()) == desired
            ):
                return
            time.sleep(0.5)
        raise ControlPlaneError(f"DaemonSet {self.release} not rolled out in time: {last}\n{self.describe()}")

    def uninstall(self, timeout: float = 120.0) -> None:
        self.helm_cmd("uninstall", self.release, "--namespace", self.namespace, "--wait", timeout=timeout)
        deadline = time.monotonic() + timeout
        while self.pods() and time.monotonic() < deadline:
            time.sleep(0.5)

    def pods(self) -> list[dict[str, Any]]:
        listed = self.cp.kubectl_json("get", "pods", "-n", self.namespace, "-l", "app.kubernetes.io/name=dra-driver")
        return list(listed["items"])

    def ready_pod(self) -> dict[str, Any] | None:
        for pod in self.pods():
            if pod["metadata"].get("deletionTimestamp"):
                continue
            conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
            if conditions.get("Ready") == "True":
                return pod
        return None

    def wait_ready_pod(self, timeout: float = 60) -> dict[str, Any]:
        """The Ready driver pod, once there is one. After a container or kubelet restart the startup check passes
        again first, then the readiness check runs: a second or two without a Ready pod."""
        return dict(wait_until("a Ready driver pod", self.ready_pod, timeout=timeout))

    def slices(self) -> list[dict[str, Any]]:
        listed = self.cp.kubectl_json("get", "resourceslices", "--field-selector", f"spec.nodeName={self.node.name}")
        return [s for s in listed["items"] if s["spec"]["driver"] == DRIVER_NAME]

    def registrations(self) -> int:
        """How often the kubelet logged "Registered DRA plugin" for this driver (kubelet -v=3 or more)."""
        try:
            log = self.node.kubelet_log.read_text(errors="replace")
        except OSError:
            return 0
        return sum(1 for line in log.splitlines() if "Registered DRA plugin" in line and DRIVER_NAME in line)

    def wait_registered(self, deadline: float, *, registrations: int = 1) -> dict[str, Any]:
        """Wait until a driver pod is Ready, the kubelet registered the plugin `registrations` times in all, and
        the node's slices are published; return the pod."""
        last = ""
        while time.monotonic() < deadline:
            pod = self.ready_pod()
            seen = self.registrations()
            slices = self.slices()
            if pod is not None and seen >= registrations and slices:
                return pod
            last = f"ready pod: {pod is not None}, registrations: {seen}, slices: {len(slices)}"
            time.sleep(0.5)
        raise ControlPlaneError(f"driver not registered in time ({last}):\n{self.describe()}")

    def logs(self, pod: str | None = None, *, previous: bool = False) -> str:
        names = [pod] if pod else [p["metadata"]["name"] for p in self.pods()]
        out = []
        for name in names:
            args = ["logs", "-n", self.namespace, name, "--tail=200", *(["--previous"] if previous else [])]
            proc = self.cp.kubectl(*args, check=False)
            out.append(f"--- {name}\n{proc.stdout}{proc.stderr}")
        return "\n".join(out)

    def describe(self) -> str:
        pods = self.cp.kubectl("describe", "pods", "-n", self.namespace, check=False).stdout
        return f"{pods[-4000:]}\n{self.logs()}\n--- kubelet\n{_tail(self.node.kubelet_log.read_text(errors='replace'))}"

    def metrics(self) -> str:
        """The driver's Prometheus text (the pod is on the host network: the node's address)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://{self.node.ip}:{self.metrics_port}/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    def checkpoint_claims(self) -> dict[str, Any]:
        """The claims in the driver's checkpoint (by UID), as the driver last saved it on the host."""
        path = self.plugin_dir / "checkpoint.json"
        if not path.exists():
            return {}
        return dict(json.loads(path.read_text())["data"]["claims"])


def reset_for_next_module(node: Node) -> bool:
    """Whether the next test module can reuse `node` (see tests.cluster.fixtures.SharedNode): no prepared claim
    in a driver checkpoint on it and no CDI spec left. If so, the simulated GPUs' state and the plugin
    directories go, so the next module starts from GPUs as they left the factory and an empty checkpoint."""
    plugins = node.kubelet_dir / "plugins"
    for checkpoint in plugins.glob("*/checkpoint.json"):
        if json.loads(checkpoint.read_text())["data"]["claims"]:
            return False
    if any(node.cdi_dir.glob("*.json")) or any(node.cdi_dir.glob("*.yaml")):
        return False
    for directory in [node.work_dir / "sim-state", *(d for d in plugins.glob("*") if d.is_dir())]:
        shutil.rmtree(directory, ignore_errors=True)
    return True
