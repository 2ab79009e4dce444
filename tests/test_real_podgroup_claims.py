"""Claims of a PodGroup (KEP-5729, `DRAWorkloadResourceClaims`, beta and off by default in 1.37) on the real node: a
control plane and a node of their own with the gate, `GenericWorkload` (the PodGroup API, which the gate depends on)
and `scheduling.k8s.io/v1beta1` served. A PodGroup names a ResourceClaimTemplate in spec.resourceClaims; the
resourceclaim controller makes one claim owned by the PodGroup, the scheduler reserves it for the PodGroup (reservedFor:
scheduling.k8s.io/podgroups, not the pods), and the kubelet prepares it for each member pod whose spec.schedulingGroup
names the group (resourceclaim.IsReservedForPod). The driver never reads reservedFor: it prepares the claim once and
unprepares it when the kubelet says the last pod on the node is gone, while the claim itself stays reserved for the
PodGroup.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.controlplane import ControlPlane
from tests.cluster.fixtures import SharedNode, start_node, stop_node
from tests.cluster.node import NODE_CONTROLLERS
from tests.polling import wait_until
from tests.test_real_pods import GPU, NS, Cluster, deployed, pod, req, template

pytestmark = pytest.mark.timeout(600)
GATES = {"GenericWorkload": True, "DRAWorkloadResourceClaims": True}
APIS = {"scheduling.k8s.io/v1beta1": True}


@pytest.fixture(scope="module")
def cluster(node_binaries: Any, shared_node: SharedNode) -> Iterator[Cluster]:
    shared_node.stop()  # one node on the host at a time; this one runs with the PodGroup gates
    cp = ControlPlane(feature_gates=GATES, runtime_config=APIS, service_accounts=True, controllers=NODE_CONTROLLERS)
    node = start_node(cp)
    try:
        with deployed(node) as c:
            yield c
    finally:
        stop_node(node)


def pod_group(name: str, claim_name: str, template_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "schedulingPolicy": {"basic": {}},
            "resourceClaims": [{"name": claim_name, "resourceClaimTemplateName": template_name}],
        },
    }


def member(name: str, group: str, template_name: str) -> dict[str, Any]:
    """A pod of `group` whose claim `gpu` matches the group's exactly (same name, same template): the group's."""
    p = pod(name, template_name=template_name)
    p["spec"]["schedulingGroup"] = {"podGroupName": group}
    return p


def test_pods_of_a_pod_group_share_its_claim_and_the_last_one_gone_unprepares_it(cluster: Cluster) -> None:
    cluster.apply(template("group-gpu", req("gpu", GPU)))
    # kubectl itself: the in-process apply knows each group's preferred version only (scheduling.k8s.io: v1)
    cluster.cp.kubectl("create", "-f", "-", input=json.dumps(pod_group("trainers", "gpu", "group-gpu")))
    names = ("trainer-0", "trainer-1")
    with cluster.pods_removed_after(*names):
        cluster.apply(*(member(n, "trainers", "group-gpu") for n in names))
        for n in names:
            cluster.wait_running(n)
        claims = [cluster.claims_of(n) for n in names]
        assert all(len(c) == 1 for c in claims), claims
        (first,), (second,) = claims
        assert first["metadata"]["uid"] == second["metadata"]["uid"]  # one claim, the group's
        group = cluster.cp.kubectl_json("get", "podgroup", "trainers", "-n", NS)
        (owner,) = first["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("PodGroup", "trainers", group["metadata"]["uid"])
        reserved = [(r.get("apiGroup", ""), r["resource"], r["name"]) for r in first["status"]["reservedFor"]]
        assert reserved == [("scheduling.k8s.io", "podgroups", "trainers")]  # the group, not its pods
        assert [s.name for s in cluster.claim_specs()] == [f"k8s.{GPU}-claim_{first['metadata']['uid']}.json"]
        seen = [cluster.check_sees_its_devices(n) for n in names]
        assert seen[0]["devices"] == seen[1]["devices"]
        uid = first["metadata"]["uid"]
        assert set(cluster.release.checkpoint_claims()) == {uid}

        # one member gone: the other still runs on the claim, which stays prepared
        cluster.cp.delete("pod", names[0], namespace=NS, wait=120)
        assert set(cluster.release.checkpoint_claims()) == {uid}
        assert len(cluster.claim_specs()) == 1
        assert cluster.cp.kubectl_json("get", "pod", names[1], "-n", NS)["status"]["phase"] == "Running"
    # the last member gone: unprepared, though the claim stays reserved for the PodGroup
    wait_until("the claim's CDI spec removed", lambda: cluster.claim_specs() == [], timeout=60)
    assert cluster.release.checkpoint_claims() == {}
    still = cluster.cp.kubectl_json("get", "resourceclaim", first["metadata"]["name"], "-n", NS)
    assert [r["resource"] for r in still["status"].get("reservedFor", [])] == ["podgroups"]
