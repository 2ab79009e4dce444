"""What the real kube-scheduler decides for one claim: a pod that uses it is created on a node, and the claim's
allocation is read back, or the pod's Unschedulable condition."""

from __future__ import annotations

import time
from typing import Any

from tests.cluster.controlplane import ControlPlane


def schedule_claim(
    cp: ControlPlane, claim: dict[str, Any], node: str, namespace: str, timeout: float = 30
) -> dict[str, Any] | None:
    """Create `claim` in `namespace` and a pod using it on `node`: the allocation the scheduler wrote, or None once
    the pod is Unschedulable."""
    name = claim["metadata"]["name"]
    claim = {**claim, "metadata": {**claim["metadata"], "namespace": namespace}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
           "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{"name": "c", "image": "registry.invalid/x",
                                    "resources": {"claims": [{"name": "gpus"}]}}],
                    "resourceClaims": [{"name": "gpus", "resourceClaimName": name}]}}  # fmt: skip
    cp.apply(claim, pod)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cp.kubectl_json("get", "resourceclaim", name, "-n", namespace)
        if got.get("status", {}).get("allocation"):
            return dict(got["status"]["allocation"])
        p = cp.kubectl_json("get", "pod", name, "-n", namespace)
        conditions = {c["type"]: c for c in p.get("status", {}).get("conditions", [])}
        if conditions.get("PodScheduled", {}).get("reason") == "Unschedulable":
            return None
        time.sleep(0.3)
    raise AssertionError(f"the scheduler neither allocated nor refused {name} in {timeout} s")
