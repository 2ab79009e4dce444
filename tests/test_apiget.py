"""tests.cluster.apiget answers `kubectl get -o json` in the test process: the same reads through kubectl and
through it give the same JSON and the same errors, on the real API server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.apiget import ApiError, ApiReader, parse_get
from tests.cluster.controlplane import ControlPlane, KubectlError
from tests.polling import wait_until

NS = "apiget"


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    cp = control_plane
    cp.kubectl("create", "namespace", NS)
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i}", "namespace": NS,
                                                                "labels": {"tier": "a" if i % 2 else "b"}}}
        for i in range(3)
    ]  # fmt: skip
    # bound to a node without a kubelet: no scheduler or kubelet changes it between the two reads of a test
    objects.append(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": NS},
         "spec": {"nodeName": "nowhere", "containers": [{"name": "c", "image": "busybox"}]}}
    )  # fmt: skip
    objects.append(
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "rc", "namespace": NS},
         "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "none"}}]}}}
    )  # fmt: skip
    cp.kubectl("create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    cp.create_node("apiget-node", labels={"tier": "a"})
    yield cp
    # gone before the next module: `simulate --kubeconfig` elsewhere lists every claim of the server; no kubelet ends
    # the pod, so it is forced
    cp.kubectl("delete", "pods", "--all", "-n", NS, "--grace-period=0", "--force")
    cp.kubectl("delete", "resourceclaims", "--all", "-n", NS, "--wait=true")
    cp.delete_namespace(NS, pods_first=False)
    cp.delete_node("apiget-node")


def reader(cp: ControlPlane) -> ApiReader:
    return ApiReader("127.0.0.1", cp.api_port, cp._client_ssl())


READS = [
    ("get", "pod", "p", "-n", NS),
    ("get", "po", "p", "--namespace", NS),
    ("get", "pods", "-n", NS),
    ("get", "configmaps", "-n", NS, "-l", "tier=a"),
    ("get", "configmap", "-A", "--selector", "tier=b"),
    ("get", "cm", "-n", NS, "--field-selector", "metadata.name=cm-2"),
    ("get", "node", "apiget-node"),
    ("get", "nodes", "-l", "tier=a"),
    ("get", "resourceclaim", "rc", "-n", NS),
    ("get", "resourceclaims.resource.k8s.io", "-n", NS),
    ("get", "resourceclaim", "rc", "-n", NS, "--show-managed-fields"),
    ("get", "ResourceClaim", "-n", NS),
    ("get", "namespace", NS),
]


@pytest.mark.parametrize("args", READS, ids=[" ".join(a[1:3]) + ("+mf" if "--show-managed-fields" in a else "")
                                             for a in READS])  # fmt: skip
def test_a_read_answers_what_kubectl_prints(cluster: ControlPlane, args: tuple[str, ...]) -> None:
    ours = reader(cluster).get((*args, "-o", "json"))
    theirs = json.loads(cluster.kubectl(*args, "-o", "json").stdout)
    assert ours is not None
    assert ours == theirs
    assert ("managedFields" in json.dumps(ours)) == ("--show-managed-fields" in args)


@pytest.mark.parametrize(
    "args",
    [("get", "pod", "missing", "-n", NS), ("get", "namespace", "missing")],
)
def test_a_refused_read_fails_as_kubectl_fails(cluster: ControlPlane, args: tuple[str, ...]) -> None:
    with pytest.raises(ApiError) as ours:
        reader(cluster).get((*args, "-o", "json"))
    theirs = cluster.kubectl(*args, "-o", "json", check=False)
    assert theirs.returncode == 1
    assert ours.value.message == theirs.stderr.strip()
    with pytest.raises(KubectlError) as through:
        cluster.kubectl_json(*args)
    assert through.value.returncode == 1 and through.value.stderr == ours.value.message


@pytest.mark.parametrize(
    "args",
    [
        ("get", "pods,configmaps", "-n", NS),
        ("get", "pod/p", "-n", NS),
        ("get", "pods", "-n", NS, "-o", "yaml"),
        ("get", "pods", "-n", NS, "-o", "jsonpath={.items}"),
        ("get", "pods", "--sort-by", ".metadata.name", "-o", "json"),
        ("get", "pod", "p", "-A", "-o", "json"),
        ("apply", "-f", "-", "-o", "json"),
        ("version", "-o", "json"),
    ],
)
def test_other_calls_are_left_to_kubectl(args: tuple[str, ...]) -> None:
    assert parse_get(args) is None


def test_an_unknown_resource_is_looked_up_again_then_left_to_kubectl(cluster: ControlPlane) -> None:
    r = reader(cluster)
    assert r.get(("get", "pods", "-n", NS, "-o", "json")) is not None  # discovery read once
    assert r.get(("get", "nosuchthings", "-o", "json")) is None
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.apiget.test"},
        "spec": {
            "group": "apiget.test",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "shortNames": ["gd"]},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": True, "storage": True,
                          "schema": {"openAPIV3Schema": {"type": "object"}}}],
        },
    }  # fmt: skip
    cluster.kubectl("create", "-f", "-", input=json.dumps(crd))
    try:
        cluster.kubectl("wait", "--for=condition=Established", "crd/gadgets.apiget.test", "--timeout=60s")
        # the CRD came after the first discovery: the name is looked up again (its storage may still be starting)
        assert wait_until("the new resource served", lambda: r.get(("get", "gd", "-n", NS, "-o", "json")),
                          tolerate_errors=True) == {
            "apiVersion": "v1", "items": [], "kind": "List", "metadata": {"resourceVersion": ""}
        }  # fmt: skip
    finally:
        cluster.kubectl("delete", "crd", "gadgets.apiget.test", "--wait=false")
