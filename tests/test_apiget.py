"""tests.cluster.apiget answers `kubectl get -o json` in the test process: the same reads through kubectl and
through it give the same JSON and the same errors, on the real API server."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.apiget import ApiError, ApiReader, parse_get
from tests.cluster.controlplane import ControlPlane, KubectlError, make_pki
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
    ("get", "cm", "--namespace=" + NS, "--field-selector=metadata.name=cm-1", "--selector=tier=a"),
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
        ("get", "pods", "--sort-by=.metadata.name", "-o", "json"),
        ("get", "pods", "--output=yaml"),
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


def test_reads_go_on_across_an_api_server_restart(cluster: ControlPlane) -> None:
    """The thread's kept-alive connection dies with the server (TLS EOF on its next request): the first read after
    a restart succeeds on a new connection, and a read while the server is down fails as kubectl fails."""
    assert cluster.kubectl_json("get", "namespace", NS)["metadata"]["name"] == NS
    cluster.stop_apiserver()
    cluster.start_apiserver()
    assert cluster.kubectl_json("get", "namespace", NS)["metadata"]["name"] == NS
    cluster.stop_apiserver()
    try:
        with pytest.raises(KubectlError) as down:
            cluster.kubectl_json("get", "namespace", NS)
        assert "Unable to connect to the server" in down.value.stderr
        with pytest.raises(KubectlError, match="Unable to connect to the server"):
            cluster.pod_log("p", NS)
        assert cluster.pod_log("p", NS, check=False) == ""
    finally:
        cluster.start_apiserver()
    assert cluster.kubectl_json("get", "namespace", NS)["metadata"]["name"] == NS


def test_a_connection_dropped_without_tls_close_is_replaced(tmp_path: Any) -> None:
    """A server killed between two reads drops the TCP connection without TLS's close_notify: the next request on
    the kept-alive connection ends in SSLEOFError (seen in CI after the session's API server restarted). The read
    is made again on a new connection; a second failure, on that new connection, is the caller's."""
    pki = make_pki(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(pki.serving_cert, pki.serving_key)
    client_ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    body = json.dumps({"kind": "Namespace", "metadata": {"name": "x"}}).encode()
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    def serve(connections: int) -> None:
        for _ in range(connections):
            raw, _ = listener.accept()
            conn = server_ctx.wrap_socket(raw, server_side=True)
            conn.recv(65536)
            conn.sendall(answer)
            raw_fd = conn.detach()  # the TCP connection ends with no TLS close_notify, as when a process is killed
            socket.socket(fileno=raw_fd).close()

    thread = threading.Thread(target=serve, args=(2,), daemon=True)
    thread.start()
    r = ApiReader("127.0.0.1", port, client_ctx)
    assert r.request("/api/v1/namespaces/x") == (200, {"kind": "Namespace", "metadata": {"name": "x"}})
    time.sleep(0.2)  # the server's end of the first connection is gone
    assert r.request("/api/v1/namespaces/x")[0] == 200  # on a second connection
    thread.join(5)
    listener.close()
    with pytest.raises(OSError):
        r.request("/api/v1/namespaces/x")  # the dead kept-alive one, then nothing listening: refused


# ----- writes: ControlPlane.apply/create/delete/patch against what kubectl does with the same objects
def _stored(cp: ControlPlane, kind: str, name: str) -> dict[str, Any]:
    """The fields a test cares about: what kubectl and the in-process write both set."""
    obj = cp.kubectl_json("get", kind, name, "-n", NS)
    return {"labels": obj["metadata"].get("labels"), "data": obj.get("data"), "spec": obj.get("spec")}


def test_apply_creates_then_updates_as_kubectl_apply_does(cluster: ControlPlane) -> None:
    def config_map(name: str, tier: str, data: dict[str, str]) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "data": data,
                "metadata": {"name": name, "namespace": NS, "labels": {"tier": tier}}}  # fmt: skip

    for tier, data in (("a", {"k": "1"}), ("b", {"k": "2", "l": "3"})):  # created, then changed
        cluster.kubectl("apply", "-f", "-", input=json.dumps(config_map("by-kubectl", tier, data)))
        cluster.apply({"apiVersion": "v1", "kind": "List", "items": [config_map("in-process", tier, data)]})
        assert _stored(cluster, "configmap", "in-process") == _stored(cluster, "configmap", "by-kubectl")
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "applied"},
             "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "none"}}]}}}  # fmt: skip
    (stored,) = cluster.apply(claim, namespace=NS)  # a namespaced object without one takes the call's
    assert stored["metadata"]["namespace"] == NS and stored["metadata"]["uid"]
    assert _stored(cluster, "resourceclaim", "applied")["spec"]["devices"]["requests"][0]["name"] == "r"


def test_create_answers_the_stored_object_and_a_refusal_as_kubectl(cluster: ControlPlane) -> None:
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "created", "namespace": NS}}
    created = cluster.create(obj)
    assert (
        created["metadata"]["uid"] == cluster.kubectl_json("get", "configmap", "created", "-n", NS)["metadata"]["uid"]
    )
    with pytest.raises(KubectlError) as refused:
        cluster.create(obj)
    assert refused.value.stderr == 'Error from server (AlreadyExists): configmaps "created" already exists'
    with pytest.raises(KubectlError, match="resource mapping not found"):
        cluster.create({"apiVersion": "v1", "kind": "NoSuchKind", "metadata": {"name": "x"}})


def test_patch_merges_into_the_object_and_its_status(cluster: ControlPlane) -> None:
    cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "patched", "namespace": NS},
                    "data": {"a": "1"}})  # fmt: skip
    cluster.patch("cm", "patched", {"data": {"b": "2"}}, namespace=NS)
    cluster.patch("configmap", "patched", [{"op": "remove", "path": "/data/a"}], namespace=NS, type="json")
    assert _stored(cluster, "configmap", "patched")["data"] == {"b": "2"}
    results = [{"request": "r", "driver": "gpu.example.com", "pool": "p", "device": "d"}]
    cluster.patch("resourceclaim", "rc", {"status": {"allocation": {"devices": {"results": results}}}},
                  namespace=NS, subresource="status")  # fmt: skip
    assert cluster.kubectl_json("get", "resourceclaim", "rc", "-n", NS)["status"]["allocation"]["devices"]["results"]
    cluster.patch("resourceclaim", "rc", {"status": None}, namespace=NS, subresource="status")


def test_delete_by_name_or_selector_waits_when_asked(cluster: ControlPlane) -> None:
    for i in range(3):
        cluster.create({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": f"del-{i}", "namespace": NS, "labels": {"del": str(i % 2)}}})  # fmt: skip
    cluster.delete("configmap", "del-0", namespace=NS, wait=30)
    assert "(NotFound)" in _refusal(cluster, "configmap", "del-0")
    cluster.delete("cm", namespace=NS, label_selector="del=1", wait=30)
    assert "(NotFound)" in _refusal(cluster, "configmap", "del-1")
    assert cluster.kubectl_json("get", "configmap", "del-2", "-n", NS)["metadata"]["name"] == "del-2"
    cluster.delete("configmap", "del-0", namespace=NS)  # already gone: as --ignore-not-found
    with pytest.raises(KubectlError) as refused:
        cluster.delete("configmap", "del-0", namespace=NS, missing_ok=False)
    assert refused.value.stderr == 'Error from server (NotFound): configmaps "del-0" not found'
    cluster.delete("configmap", "del-2", namespace=NS)


def test_a_delete_of_several_names_deletes_all_it_can_then_fails_as_kubectl(cluster: ControlPlane) -> None:
    """kubectl without --ignore-not-found deletes every name it can, then fails for the missing ones."""
    for name in ("several-by-kubectl", "several-in-process"):
        cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS}})
    by_kubectl = cluster.kubectl("delete", "configmap", "absent", "several-by-kubectl", "-n", NS, check=False)
    assert by_kubectl.returncode != 0
    with pytest.raises(KubectlError) as refused:
        cluster.delete("configmap", "absent", "several-in-process", namespace=NS, missing_ok=False, wait=30)
    assert (
        refused.value.stderr
        == by_kubectl.stderr.strip()
        == 'Error from server (NotFound): configmaps "absent" not found'
    )
    for name in ("several-by-kubectl", "several-in-process"):
        assert "(NotFound)" in _refusal(cluster, "configmap", name)


def _refusal(cp: ControlPlane, kind: str, name: str) -> str:
    with pytest.raises(KubectlError) as refused:
        cp.kubectl_json("get", kind, name, "-n", NS)
    return str(refused.value.stderr)


def test_a_delete_waits_for_the_object_it_deleted_not_for_its_name(cluster: ControlPlane) -> None:
    """As kubectl: an object of the same name made meanwhile (a publisher restoring its slices) is another object;
    one still there (a finalizer holds it) makes the wait time out."""
    held = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "held", "namespace": NS, "finalizers": ["apiget.test/hold"]}}  # fmt: skip
    first = cluster.create(held)["metadata"]["uid"]
    with pytest.raises(KubectlError, match="timed out waiting for the deletion of configmap held"):
        cluster.delete("configmap", "held", namespace=NS, wait=1)

    def release_and_make_again() -> None:
        time.sleep(0.5)
        cluster.patch("configmap", "held", {"metadata": {"finalizers": None}}, namespace=NS)
        cluster.create({**held, "metadata": {"name": "held", "namespace": NS}})

    again = threading.Thread(target=release_and_make_again)
    again.start()
    cluster.delete("configmap", "held", namespace=NS, wait=30)
    again.join()
    assert cluster.kubectl_json("get", "configmap", "held", "-n", NS)["metadata"]["uid"] != first
    cluster.delete("configmap", "held", namespace=NS, wait=30)
