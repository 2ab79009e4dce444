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
        self.apply(*self._gpu_job(ns, name, pods, gpus, queue))

    @classmethod
    def _gpu_job(
        cls, ns: str, name: str, pods: int, gpus: int, queue: str | None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The ResourceClaimTemplate for `gpus` whole GPUs and the Job whose pods claim from it."""
        template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": f"{name}-gpus", "namespace": ns},
                    "spec": {"spec": {"devices": {"requests": [
                        {"name": "gpus", "exactly": {"deviceClassName": GPU_CLASS, "count": gpus}}]}}}}  # fmt: skip
        return template, cls._job(ns, name, pods, {"resourceClaimTemplateName": f"{name}-gpus"}, queue)

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


# Topology-aware scheduling: GB200 NVL72 compute trays (4 GPUs each) of one NVLink fabric, two cliques of two trays,
# labelled as the node daemon labels them (`--node-labels`). Kueue v0.17 places a job's pods in one topology domain
# from node labels, counting what node.status.allocatable holds: DRA devices are not there, so each pod asks for a
# whole tray's CPU beside its claim for the tray's four GPUs (one pod per tray), and the scheduler allocates the GPUs.
FABRIC = "5f0c2c0e-7a1b-4c7e-9e6f-0000000000bb"
TRAYS = {"tray-a0": 1, "tray-a1": 1, "tray-b0": 2, "tray-b1": 2}  # node -> clique
CLIQUE_LABEL = f"{D}/gpu.clique"
TRAY_CPU = "100"  # ControlPlane.create_node's allocatable CPU


@pytest.fixture(scope="module")
def trays(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The trays' Nodes and slices, a Topology (clique, then host), a ResourceFlavor of the fabric's nodes and a
    queue for it; yields the namespace."""
    from dra_driver.labels import node_labels

    cp, ns = cluster.cp, "team-topology"
    tmp = tmp_path_factory.mktemp("trays")
    slices: list[dict[str, Any]] = []
    for node, clique in TRAYS.items():
        sim = SimulatedNvml("gb200-nvl72-tray", tmp / node)
        sim.place_in_fabric(FABRIC, clique)
        inventory = discover(sim, sim.sysfs_root)
        uid = cp.create_node(node, labels=node_labels(inventory, D))
        slices += [s.to_api() for s in build_slices(inventory, node_name=node, k8s_version="1.37",
                                                    mode=PublishMode.GPUS, node_uid=uid)]  # fmt: skip
    cluster.apply(
        *slices,
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology", "metadata": {"name": "nvlink"},
         "spec": {"levels": [{"nodeLabel": CLIQUE_LABEL}, {"nodeLabel": "kubernetes.io/hostname"}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "nvl72"},
         "spec": {"nodeLabels": {f"{D}/gpu.nvlink-cluster": FABRIC}, "topologyName": "nvlink"}},
        # The GPUs' quota in a flavor without a topology: Kueue v0.17 checks a TAS flavor's every resource against
        # node.status.allocatable when it admits, where DRA devices are not (so a TAS-flavored GPU never fits).
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "nvl72-gpus"},
         "spec": {"nodeLabels": {f"{D}/gpu.nvlink-cluster": FABRIC}}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "topology"},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                  "resourceGroups": [
                      {"coveredResources": ["cpu"], "flavors": [
                          {"name": "nvl72", "resources": [{"name": "cpu", "nominalQuota": "1000"}]}]},
                      {"coveredResources": ["whole-gpus"], "flavors": [
                          {"name": "nvl72-gpus", "resources": [{"name": "whole-gpus", "nominalQuota": 64}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "nvl72", "namespace": ns},
         "spec": {"clusterQueue": "topology"}},
    )  # fmt: skip
    yield ns
    for node in TRAYS:
        cp.delete("resourceslices", wait=120, field_selector=f"spec.nodeName={node}")


def clique_job(c: Cluster, ns: str, name: str, pods: int) -> None:
    """`pods` pods, each a whole tray (its CPU and a claim for its four GPUs), all in one NVLink clique."""
    template, job = c._gpu_job(ns, name, pods, 4, "nvl72")
    pod = job["spec"]["template"]
    pod["metadata"] = {"annotations": {"kueue.x-k8s.io/podset-required-topology": CLIQUE_LABEL}}
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": TRAY_CPU}
    c.apply(template, job)


def placed(c: Cluster, ns: str, job: str, pods: int) -> None:
    """Wait until the Job's `pods` pods are bound to trays."""
    try:
        wait_for(f"{job} placed", lambda: len(got := cliques_of(c, ns, job)) == pods and "" not in got, 60)
    except AssertionError as e:
        pods_now = [(p["metadata"]["name"], p["spec"].get("nodeName"), p["spec"].get("nodeSelector"),
                     p["status"].get("conditions")) for p in c.running_pods(ns, job)]  # fmt: skip
        raise AssertionError(f"{e}\n{c.explain([(ns, job)])}\n{pods_now}") from None


def cliques_of(c: Cluster, ns: str, job: str) -> list[str]:
    """The clique label of each node the Job's pods are bound to ("" for a pod not bound yet)."""
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in c.cp.kubectl_json("get", "nodes")["items"]}
    return [nodes.get(p["spec"].get("nodeName", ""), {}).get(CLIQUE_LABEL, "") for p in c.running_pods(ns, job)]


def test_a_multi_node_job_lands_in_one_nvlink_clique_or_waits(cluster: Cluster, trays: str) -> None:
    """Kueue's topology-aware scheduling on the driver's clique label: a three-tray job waits while every tray is
    free, as no clique has three trays; a two-tray job is admitted into one clique and the scheduler binds its pods
    there, each with its tray's four GPUs; a second one fills the other clique."""
    c, ns = cluster, trays
    clique_job(c, ns, "too-big", 3)
    try:  # the largest clique holds two trays
        wait_for("too-big refused", lambda: "allows to fit only 2 out of 3" in c.pending_message(ns, "too-big"), 60)
    except AssertionError as e:
        raise AssertionError(f"{e}: {c.explain([(ns, 'too-big')])}") from None
    assert 'topology "nvlink"' in c.pending_message(ns, "too-big")
    assert c.suspended(ns, "too-big") and c.running_pods(ns, "too-big") == []
    clique_job(c, ns, "first", 2)
    placed(c, ns, "first", 2)
    assert len(set(cliques_of(c, ns, "first"))) == 1, c.explain([(ns, "first")])
    clique_job(c, ns, "second", 2)
    placed(c, ns, "second", 2)
    assert len(set(cliques_of(c, ns, "second"))) == 1
    assert set(cliques_of(c, ns, "first")) != set(cliques_of(c, ns, "second"))  # the other clique
    for job in ("first", "second"):  # each pod got its tray's four GPUs, on the node it is bound to
        for p in c.running_pods(ns, job):
            (status,) = p["status"]["resourceClaimStatuses"]
            claim = c.cp.kubectl_json("get", "resourceclaim", status["resourceClaimName"], "-n", ns)
            results = claim["status"]["allocation"]["devices"]["results"]
            assert len(results) == 4 and {r["pool"] for r in results} == {p["spec"]["nodeName"]}
    assert c.suspended(ns, "too-big")
