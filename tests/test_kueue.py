"""Fair queueing end to end: a real Kueue (v0.17, built from its Go module) with DRA device-class quotas, on a
real control plane with the job controller and the scheduler, in front of one simulated 8-GPU node published by
this driver. Three teams share the node as docs/fair-queueing.md designs it (examples/kueue/*.yaml, applied as
they are). The test plays the kubelet where one would act: it confirms pod deletions and reports pods that
finished. Each step checks which Jobs Kueue admits and which wait, and that every admitted Job's pods really got
distinct GPUs from the scheduler.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.controller.publisher import Publisher
from dra_driver.nvml.discovery import discover
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME as D
from dra_driver.slices.builder import build_slices
from dra_driver.slices.devices import PublishMode
from tests.cluster.controlplane import ControlPlane
from tests.cluster.kueue import Kueue
from tests.polling import wait_for
from tests.test_publisher import api_client, pool_complete

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "kueue"
NODE = "dgx-1"
GPU_CLASS = yaml.safe_load((ROOT / "deviceclasses" / "gpu.yaml").read_text())["metadata"]["name"]
QUOTA = "whole-gpus"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
BIG_MEMORY = f"device.capacity['{D}'].memory.compareTo(quantity('80Gi')) >= 0"


def kueue_config() -> dict[str, Any]:
    return dict(yaml.safe_load((EXAMPLES / "kueue-config.yaml").read_text()))


class Kubelet(threading.Thread):
    """What the kubelet does that matters here: confirm deletions of pods bound to the node (grace period over,
    containers gone), so that their ResourceClaims are released."""

    def __init__(self, cp: ControlPlane) -> None:
        super().__init__(name="fake-kubelet", daemon=True)
        self.cp = cp
        self.stop = threading.Event()

    def run(self) -> None:
        from kubernetes import client

        core = client.CoreV1Api(api_client(self.cp.kubeconfig))
        while not self.stop.wait(0.3):
            try:
                for p in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}").items:
                    if p.metadata.deletion_timestamp is not None:
                        core.delete_namespaced_pod(p.metadata.name, p.metadata.namespace, grace_period_seconds=0)
            except Exception:  # the next pass retries
                pass


class Cluster:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    def apply(self, *docs: dict[str, Any]) -> None:
        self.cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))

    def job(self, ns: str, name: str, *, pods: int, gpus: int, queue: str | None = "gpu") -> None:
        """A Job of `pods` pods, each with a claim for `gpus` whole GPUs from a ResourceClaimTemplate."""
        template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": f"{name}-gpus", "namespace": ns},
                    "spec": {"spec": {"devices": {"requests": [
                        {"name": "gpus", "exactly": {"deviceClassName": GPU_CLASS, "count": gpus}}]}}}}  # fmt: skip
        self.apply(template, self._job(ns, name, pods, {"resourceClaimTemplateName": f"{name}-gpus"}, queue))

    @staticmethod
    def _job(ns: str, name: str, pods: int, source: dict[str, str], queue: str | None) -> dict[str, Any]:
        labels = {QUEUE_LABEL: queue} if queue else {}
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": name, "namespace": ns, "labels": labels},
                "spec": {"parallelism": pods, "completions": pods,
                         "template": {"spec": {
                             "restartPolicy": "Never",
                             "containers": [{"name": "c", "image": "registry.invalid/cuda",
                                             "resources": {"claims": [{"name": "gpus"}]}}],
                             "resourceClaims": [{"name": "gpus", **source}]}}}}  # fmt: skip

    def workload(self, ns: str, job: str) -> dict[str, Any]:
        items = self.cp.kubectl_json("get", "workloads.kueue.x-k8s.io", "-n", ns)["items"]
        for w in items:
            if any(o.get("name") == job for o in w["metadata"].get("ownerReferences", [])):
                return dict(w)
        raise LookupError(f"no Workload for Job {ns}/{job} yet")

    def conditions(self, ns: str, job: str) -> dict[str, dict[str, Any]]:
        return {c["type"]: c for c in self.workload(ns, job).get("status", {}).get("conditions", [])}

    def explain(self, jobs: list[tuple[str, str]]) -> str:
        """Each Job's suspend flag and its Workload's conditions, for failure messages."""
        lines = []
        for ns, job in jobs:
            try:
                conds = self.conditions(ns, job).values()
                said = {c["type"]: (c["status"], c.get("reason"), c.get("message")) for c in conds}
                lines.append(f"{ns}/{job}: suspend={self.suspended(ns, job)} {said}")
            except Exception as e:
                lines.append(f"{ns}/{job}: {e}")
        return "\n".join(lines)

    def admitted(self, ns: str, job: str) -> bool:
        return self.conditions(ns, job).get("Admitted", {}).get("status") == "True"

    def pending_message(self, ns: str, job: str) -> str:
        """The reason Kueue gives for not admitting it ("" while it has not said)."""
        conds = self.conditions(ns, job)
        if conds.get("Admitted", {}).get("status") == "True":
            return ""
        return str(conds.get("QuotaReserved", {}).get("message", ""))

    def suspended(self, ns: str, job: str) -> bool:
        return bool(self.cp.kubectl_json("get", "job", job, "-n", ns)["spec"].get("suspend"))

    def running_pods(self, ns: str, job: str) -> list[dict[str, Any]]:
        pods = self.cp.kubectl_json("get", "pods", "-n", ns, "-l", f"job-name={job}")["items"]
        return [
            p
            for p in pods
            if "deletionTimestamp" not in p["metadata"] and p["status"].get("phase") not in ("Succeeded", "Failed")
        ]

    def devices_of(self, ns: str, job: str) -> list[str]:
        """The GPUs the scheduler allocated to the Job's pods (once every pod is bound to the node)."""
        devices: list[str] = []
        for p in self.running_pods(ns, job):
            assert p["spec"].get("nodeName") == NODE, f"{p['metadata']['name']} is not bound"
            for s in p["status"]["resourceClaimStatuses"]:
                claim = self.cp.kubectl_json("get", "resourceclaim", s["resourceClaimName"], "-n", ns)
                devices += [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
        return devices

    def finish(self, ns: str, job: str) -> None:
        """Report the Job's pods as having run to completion, as their kubelet would."""
        for p in self.running_pods(ns, job):
            self.cp.kubectl("patch", "pod", p["metadata"]["name"], "-n", ns, "--subresource=status", "--type=merge",
                            "-p", '{"status": {"phase": "Succeeded"}}')  # fmt: skip

    def expect_usage(self, queue: str, total: int, borrowed: int) -> None:
        """Kueue reports this usage of the ClusterQueue (its status follows admissions a little later)."""
        try:
            wait_for(f"{queue} using {total} GPUs, {borrowed} borrowed", lambda: self.usage(queue) == (total, borrowed))
        except AssertionError as e:
            raise AssertionError(f"{e}; it reports {self.usage(queue)}") from None

    def usage(self, queue: str) -> tuple[int, int]:
        """(GPUs in use, of which borrowed) of a ClusterQueue, as Kueue reports it."""
        status = self.cp.kubectl_json("get", "clusterqueues.kueue.x-k8s.io", queue).get("status", {})
        for flavor in status.get("flavorsUsage", []):
            for r in flavor["resources"]:
                if r["name"] == QUOTA:
                    return int(r.get("total", 0)), int(r.get("borrowed", 0))
        return 0, 0


@pytest.fixture(scope="module")
def cluster(queueing_cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cp = queueing_cluster
    tmp = tmp_path_factory.mktemp("kueue")
    config = kueue_config()
    Kueue(
        cp,
        device_class_mappings=config["resources"]["deviceClassMappings"],
        frameworks=config["integrations"]["frameworks"],
        feature_gates=config["featureGates"],
    ).start()
    cp.kubectl("apply", "-f", str(ROOT / "deviceclasses" / "gpu.yaml"))
    uid = cp.create_node(NODE)
    sim = SimulatedNvml("dgx-h100", tmp / "gpu")
    inventory = discover(sim, sim.sysfs_root)
    publisher = Publisher(
        api_client(cp.kubeconfig),
        node_name=NODE,
        driver=D,
        desired=lambda g, u: build_slices(
            inventory, node_name=NODE, k8s_version="1.36", mode=PublishMode.GPUS, generation=g, node_uid=u or uid
        ),
    )
    publisher.start()
    kubelet = Kubelet(cp)
    kubelet.start()
    try:
        wait_for("the node's 8 GPUs published", lambda: pool_complete(cp, NODE, 1))
        cp.kubectl("apply", "-f", str(EXAMPLES / "queues.yaml"))
        yield Cluster(cp)
    finally:
        kubelet.stop.set()
        publisher.stop()


def test_three_teams_share_one_node_as_designed(cluster: Cluster) -> None:
    c = cluster

    def settle(*, admitted: list[tuple[str, str]], waiting: list[tuple[str, str]], timeout: float = 60) -> None:
        """Kueue admitted exactly these, the others wait with a reason, and admitted Jobs got their GPUs."""

        def done() -> bool:
            return all(c.admitted(ns, j) and not c.suspended(ns, j) for ns, j in admitted) and all(
                not c.admitted(ns, j) and c.suspended(ns, j) and c.pending_message(ns, j) for ns, j in waiting
            )

        try:
            wait_for(f"admitted {admitted}, waiting {waiting}", done, timeout)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{c.explain([*admitted, *waiting])}") from None

    # 1. research: the example Job (4 GPUs in one pod) is within its nominal quota.
    c.cp.kubectl("apply", "-f", str(EXAMPLES / "job.yaml"))
    settle(admitted=[("team-research", "pretrain")], waiting=[])
    # Kueue preempts the most recently admitted borrower first (step 5), by condition timestamps of one-second
    # resolution: let a second pass so that sweep's admission is strictly later than pretrain's.
    admitted_at = c.conditions("team-research", "pretrain")["Admitted"]["lastTransitionTime"]
    wait_for("the next second", lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") > admitted_at, 5)
    # 2. research again, 3 pods x 1 GPU: admitted by borrowing the idle training quota (inference lends nothing).
    c.job("team-research", "sweep", pods=3, gpus=1)
    settle(admitted=[("team-research", "pretrain"), ("team-research", "sweep")], waiting=[])
    c.expect_usage("research", 7, 3)
    # 3. research, 1 more GPU: the last GPU of the node is inference's, which it never lends.
    c.job("team-research", "eval", pods=1, gpus=1)
    settle(admitted=[("team-research", "sweep")], waiting=[("team-research", "eval")])
    assert "insufficient" in c.pending_message("team-research", "eval")
    # 4. inference gets its guaranteed GPU at once: nothing has to be preempted for it.
    c.job("team-inference", "serve", pods=1, gpus=1)
    settle(admitted=[("team-inference", "serve")], waiting=[("team-research", "eval")])
    wait_for("every admitted pod has its GPUs", lambda: len(all_devices(c)) == 8)
    assert sorted(all_devices(c)) == sorted(f"gpu-{i}" for i in range(8)), "each GPU allocated once"

    # 5. training reclaims its nominal quota: Kueue evicts the borrower (sweep, the most recently admitted), the
    #    kubelet confirms the pods' deletion, their GPUs are released and training's pods get them. research's
    #    1-GPU eval now fits in what training leaves idle; sweep waits.
    c.job("team-training", "finetune", pods=2, gpus=1)
    settle(
        admitted=[("team-training", "finetune"), ("team-research", "eval"), ("team-research", "pretrain")],
        waiting=[("team-research", "sweep")],
    )
    assert c.conditions("team-research", "sweep")["Evicted"]["reason"] == "Preempted"
    c.expect_usage("training", 2, 0)
    c.expect_usage("research", 5, 1)
    wait_for("pods of admitted Jobs have their GPUs", lambda: len(all_devices(c)) == 8, 90)
    assert len(set(all_devices(c))) == 8

    # 6. research's pretrain finishes: its 4 GPUs return to research's nominal quota, and sweep gets back in.
    c.finish("team-research", "pretrain")
    settle(admitted=[("team-research", "sweep"), ("team-research", "eval")], waiting=[])
    c.expect_usage("research", 4, 0)
    wait_for("sweep's pods have their GPUs", lambda: len(c.devices_of("team-research", "sweep")) == 3, 90)
    assert len(set(all_devices(c))) == len(all_devices(c)) == 7


def all_devices(c: Cluster) -> list[str]:
    jobs = c.cp.kubectl_json("get", "jobs", "-A")["items"]
    out: list[str] = []
    for j in jobs:
        ns, name = j["metadata"]["namespace"], j["metadata"]["name"]
        if not j["spec"].get("suspend"):
            pods = c.running_pods(ns, name)
            if any(
                p["spec"].get("nodeName") != NODE or "resourceClaimStatuses" not in p.get("status", {}) for p in pods
            ):
                return []  # not all placed yet
            out += c.devices_of(ns, name)
    return out


def test_what_kueue_0_17_cannot_count(cluster: Cluster) -> None:
    """Claims Kueue v0.17 cannot count are refused (inadmissible, with its reason), not admitted uncounted."""
    c = cluster
    ns = "team-inference"
    one_gpu = {"name": "gpus", "exactly": {"deviceClassName": GPU_CLASS}}
    shared = {"name": "shared", "namespace": ns}
    c.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": shared,
             "spec": {"devices": {"requests": [one_gpu]}}})  # fmt: skip
    c.apply(c._job(ns, "direct-claim", 1, {"resourceClaimName": "shared"}, "gpu"))
    c.apply({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
             "metadata": {"name": "big-memory", "namespace": ns},
             "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                 "deviceClassName": GPU_CLASS,
                 "selectors": [{"cel": {"expression": BIG_MEMORY}}],
             }}]}}}})  # fmt: skip
    c.apply(c._job(ns, "selector", 1, {"resourceClaimTemplateName": "big-memory"}, "gpu"))
    reasons: dict[str, str] = {}

    def inadmissible() -> bool:
        for job in ("direct-claim", "selector"):
            cond = c.conditions(ns, job).get("QuotaReserved", {})
            if cond.get("reason") != "Inadmissible":
                return False
            reasons[job] = cond["message"]
        return True

    wait_for("both inadmissible", inadmissible, 60)
    assert "CEL selectors are not supported" in reasons["selector"]
    assert reasons["direct-claim"], reasons
    assert c.suspended(ns, "direct-claim") and c.suspended(ns, "selector")
