"""A real Kueue manager (built from its Go module by scripts/build-kueue.sh) attached to a test control plane.

What an in-cluster install does with a Deployment, a Service and cert-manager, done on loopback instead:

- Kueue's CRDs and webhook configurations are read from the same module version the binary is built from
  (`go list -m` in tools/kueue), so they always match.
- The webhook server listens on 127.0.0.1 with a serving certificate from a throwaway CA (openssl), and every
  webhook's `clientConfig.service` is rewritten to `clientConfig.url` with that CA: what envtest does for
  Kueue's own integration tests. Internal cert management is off.
- The manager is a component of the control plane (`ControlPlane.spawn`), so it stops with it.

Only `v1beta2` objects are used: the CRD bases lack the conversion webhook patches.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.controlplane import (
    REPO_ROOT,
    ControlPlane,
    ControlPlaneError,
    KubectlError,
    free_port,
    issue_cert,
    make_ca,
)

BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-kueue.sh"
TOOL_DIR = REPO_ROOT / "tools" / "kueue"
NAMESPACE = "kueue-system"  # Kueue's default (apis/config/v1beta2/defaults.go)
# Kueue v0.17 names its DRA quota gate DynamicResourceAllocation (alpha, off); v0.18 renames it.
DEFAULT_FEATURE_GATES: dict[str, bool] = {"DynamicResourceAllocation": True, "VisibilityOnDemand": False}


def _cache() -> Path:
    return Path(os.environ.get("DRA_DRIVER_CACHE", str(Path.home() / ".cache" / "dra-driver")))


def _go() -> str:
    return shutil.which("go") or "/usr/local/go/bin/go"


def ensure_kueue() -> Path:
    """Build (or find in the cache) the pinned Kueue manager; its path."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ControlPlaneError(f"scripts/build-kueue.sh failed:\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def module_dir() -> Path:
    """The pinned Kueue module's source in the module cache (CRDs and webhook manifests ship in it)."""
    env = {**os.environ, "GOMODCACHE": str(_cache() / "gomod"), "GOFLAGS": "-mod=mod"}
    proc = subprocess.run(
        [_go(), "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kueue"],
        cwd=TOOL_DIR,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise ControlPlaneError(f"cannot locate the Kueue module: {proc.stderr.strip()}")
    return Path(proc.stdout.strip())


def _serving_cert(directory: Path) -> Path:
    """A CA and a 127.0.0.1 serving certificate in `directory` (tls.crt, tls.key: controller-runtime's names)."""
    make_ca(directory, "kueue-webhook-ca")
    san = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    issue_cert(directory, "tls", "/CN=127.0.0.1", san)
    return directory / "ca.crt"


def local_webhooks(manifests: Path, port: int, ca: Path) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, pointed at https://127.0.0.1:<port> instead of its Service."""
    bundle = base64.b64encode(ca.read_bytes()).decode()
    out: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(manifests.read_text()):
        if not doc:
            continue
        for hook in doc.get("webhooks", []):
            service = hook["clientConfig"].pop("service")
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{service.get('path', '/')}", "caBundle": bundle}
        out.append(doc)
    return out


class Kueue:
    """Kueue's manager on a running `ControlPlane` (which needs `job-controller` for batch Jobs)."""

    def __init__(
        self,
        cp: ControlPlane,
        *,
        device_class_mappings: Sequence[Mapping[str, Any]] = (),
        frameworks: Sequence[str] = ("batch/job",),
        feature_gates: Mapping[str, bool] | None = None,
        binary: Path | None = None,
        start_timeout: float = 120.0,
    ) -> None:
        self.cp = cp
        self.device_class_mappings = [dict(m) for m in device_class_mappings]
        self.frameworks = list(frameworks)
        self.feature_gates = {**DEFAULT_FEATURE_GATES, **(feature_gates or {})}
        self.binary = binary
        self.start_timeout = start_timeout
        self.webhook_port = 0
        self.version = ""

    def start(self) -> Kueue:
        deadline = time.monotonic() + self.start_timeout
        binary = self.binary or ensure_kueue()
        source = module_dir()
        self.version = source.name.split("@")[-1]
        work = self.cp.work_dir / "kueue"
        work.mkdir(exist_ok=True)
        cp = self.cp
        # CRDs are large: server-side apply keeps them out of the last-applied annotation's size limit.
        cp.kubectl("apply", "--server-side", "-f", str(source / "config/components/crd/bases"))
        cp.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        cp.create_namespace(NAMESPACE)

        ca = _serving_cert(work / "certs")
        self.webhook_port, health_port, metrics_port = free_port(), free_port(), free_port()
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port, "certDir": str(work / "certs")},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
            "integrations": {"frameworks": self.frameworks},
            "featureGates": self.feature_gates,
            "resources": {"deviceClassMappings": self.device_class_mappings},
        }
        config_path = work / "config.yaml"
        config_path.write_text(json.dumps(config, indent=2))
        comp = cp.spawn(
            "kueue",
            binary,
            [f"--config={config_path}", f"--kubeconfig={cp.kubeconfig}", "--zap-log-level=info"],
            # the metrics server's certificate (scripts/build-kueue.sh): the webhook's will do
            env={"KUEUE_METRICS_CERT_DIR": str(work / "certs")},
        )
        cp.wait_http(comp, f"http://127.0.0.1:{health_port}/readyz", deadline)
        hooks = local_webhooks(source / "config/components/webhook/manifests.yaml", self.webhook_port, ca)
        cp.apply(*hooks)
        self._wait_admits(deadline)
        return self

    def _wait_admits(self, deadline: float) -> None:
        """Until Kueue's own webhooks answer (a dry-run ResourceFlavor goes through its defaulting webhook)."""
        probe = json.dumps(
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "probe"}}
        )
        last = ""
        while time.monotonic() < deadline:
            try:
                self.cp.kubectl("create", "--dry-run=server", "-f", "-", input=probe)
                return
            except KubectlError as e:
                last = e.stderr
            time.sleep(0.3)
        raise ControlPlaneError(f"Kueue's webhooks do not answer: {last}\n{self.cp.log_tails()}")
