"""deploy/rbac.yaml: the node daemon's service account can publish its own node's pool and write the device health
of its own node's claims, and nothing more."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from dra_driver.controller.publisher import Publisher
from dra_driver.kube import ApiError
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME
from tests.polling import wait_until
from tests.test_publisher import Desired

ROOT = Path(__file__).resolve().parent.parent

# the driver's own client (dra_driver.kube) and the official one, which the tests use to try what the driver never does
API_ERRORS = (ApiError, ApiException)


def _token_client(cp, token: str):  # type: ignore[no-untyped-def]
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = cp.server
    cfg.ssl_ca_cert = str(cp.work_dir / "pki" / "ca.crt")
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(cfg)


def _bound_token(cp, pod_name: str, node: str) -> str:  # type: ignore[no-untyped-def]
    """A token of the driver's service account bound to a pod on `node`, as the kubelet gives the daemon."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": "dra-driver"},
        "spec": {
            "nodeName": node,
            "serviceAccountName": "dra-driver",
            "containers": [{"name": "plugin", "image": "registry.invalid/dra-driver:test"}],
        },
    }
    cp.apply(pod)
    return str(
        cp.kubectl(
            "create", "token", "dra-driver", "-n", "dra-driver", "--bound-object-kind", "Pod",
            "--bound-object-name", pod_name,
        ).stdout.strip()
    )  # fmt: skip


def _in_force(what: str, denied_dry_run: Callable[[], object]) -> None:
    """An admission policy is in force a while after it is applied: the API server compiles policies from its
    informers about once a second. Wait until the dry run of a write it denies is denied (403); a dry run changes
    nothing while the policy is not in force yet."""

    def denied() -> bool:
        try:
            denied_dry_run()
        except ApiException as e:
            if e.status != 403:
                raise
            return True
        return False

    wait_until(what, denied)


def test_service_account_publishes_only_its_own_node(control_plane, tmp_path: Path) -> None:
    cp = control_plane
    cp.kubectl("apply", "-f", str(ROOT / "deploy" / "rbac.yaml"))
    for node in ("rbac-a", "rbac-b"):
        cp.create_node(node)
    token = _bound_token(cp, "daemon-a", "rbac-a")
    api = _token_client(cp, token)
    from kubernetes import client

    objects = client.CustomObjectsApi(api)
    probe = Desired("dgx-a100", "rbac-b", tmp_path / "probe")(1, None)[0].to_api()
    _in_force(
        "the slice policy denies another node's slices",
        lambda: objects.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", probe, dry_run="All"),
    )
    own = Publisher(
        api, node_name="rbac-a", driver=DEFAULT_DRIVER_NAME, desired=Desired("dgx-h100", "rbac-a", tmp_path / "a")
    )
    assert own.sync_once() is True  # allowed: its own node's pool
    assert len(cp.kubectl_json("get", "resourceslices", "--field-selector", "spec.nodeName=rbac-a")["items"]) == 10
    other = Publisher(
        api, node_name="rbac-b", driver=DEFAULT_DRIVER_NAME, desired=Desired("dgx-h100", "rbac-b", tmp_path / "b")
    )
    with pytest.raises(API_ERRORS) as denied:
        other.sync_once()
    assert denied.value.status == 403 and "may only write ResourceSlices of node rbac-a" in denied.value.body
    admin_slice = Desired("dgx-a100", "rbac-b", tmp_path / "c")(1, None)[0].to_api()
    cp.create(admin_slice)
    with pytest.raises(API_ERRORS) as delete_denied:
        objects.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", admin_slice["metadata"]["name"])
    assert delete_denied.value.status == 403
    foreign_pool = Desired("dgx-a100", "rbac-b", tmp_path / "d")(1, None)[0].to_api()
    foreign_pool["metadata"]["name"] = "rbac-a-claims-rbac-b"
    foreign_pool["spec"]["nodeName"] = "rbac-a"  # on its own node, but node rbac-b's pool
    with pytest.raises(API_ERRORS) as pool_denied:
        objects.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", foreign_pool)
    assert pool_denied.value.status == 403 and "may only write the pool rbac-a, not rbac-b" in pool_denied.value.body
    with pytest.raises(API_ERRORS) as secrets:
        client.CoreV1Api(api).list_namespaced_secret("dra-driver")
    assert secrets.value.status == 403  # RBAC: nothing beyond what the role grants
    cp.delete("resourceslices", wait=120, field_selector="spec.driver=" + DEFAULT_DRIVER_NAME)


def test_service_account_writes_device_health_only_of_its_own_nodes_claims(control_plane) -> None:
    from dra_driver.health.claim_status import FIELD_MANAGER
    from dra_driver.plugin.claims import KubeClaimSource
    from tests.plugin_helpers import claim

    cp = control_plane
    cp.kubectl("apply", "-f", str(ROOT / "deploy" / "rbac.yaml"))
    for node in ("rbac-status-a", "rbac-status-b"):
        cp.create_node(node)
    api = _token_client(cp, _bound_token(cp, "daemon-status-a", "rbac-status-a"))
    claims = KubeClaimSource(api)

    def allocated(node: str) -> dict[str, Any]:
        """A claim the scheduler allocated on `node`: gpu-0 of this driver and a device of another driver."""
        c = claim(["gpu-0", "nic-0"], pool=node)
        c["status"]["allocation"]["devices"]["results"][1]["driver"] = "nic.example.com"
        c["status"]["allocation"]["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}  # fmt: skip
        return cp.create_allocated(c)

    def apply(c: dict[str, Any], node: str, driver: str = DEFAULT_DRIVER_NAME, device: str = "gpu-0") -> None:
        condition = {"type": "DeviceHealthy", "status": "False", "reason": "XID", "message": "XID 79",
                     "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
        m = c["metadata"]
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": m["name"], "namespace": m["namespace"], "uid": m["uid"]},
                "status": {"devices": [{"driver": driver, "pool": node, "device": device,
                                        "conditions": [condition]}]}}  # fmt: skip
        claims.apply_claim_status(m["namespace"], m["name"], body, FIELD_MANAGER)

    own, other = allocated("rbac-status-a"), allocated("rbac-status-b")
    try:
        apply(own, "rbac-status-a")  # allowed: this driver's device of a claim on its own node
        status = cp.kubectl_json("get", "resourceclaim", own["metadata"]["name"])["status"]
        assert [(d["device"], d["conditions"][0]["reason"]) for d in status["devices"]] == [("gpu-0", "XID")]
        for denied_write, driver in (
            (lambda: apply(other, "rbac-status-b"), DEFAULT_DRIVER_NAME),  # another node's claim
            (lambda: apply(own, "rbac-status-a", driver="nic.example.com", device="nic-0"), "nic.example.com"),
        ):
            with pytest.raises(API_ERRORS) as denied:
                denied_write()
            # The API server reports the missing permission as a forbidden field of an invalid object.
            message = json.loads(denied.value.body)["message"]
            assert denied.value.status == 422, message
            assert 'changing status.devices requires resource="resourceclaims/driver"' in message
            assert f'resourceclaims.resource.k8s.io "{driver}" is forbidden' in message
        status = cp.kubectl_json("get", "resourceclaim", own["metadata"]["name"])["status"]
        assert [d["device"] for d in status["devices"]] == ["gpu-0"]
        assert "devices" not in cp.kubectl_json("get", "resourceclaim", other["metadata"]["name"])["status"]
        from kubernetes import client

        reservation = {"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}}
        with pytest.raises(API_ERRORS) as binding:  # status patch does not extend to scheduling fields
            client.ResourceV1Api(api).patch_namespaced_resource_claim_status(
                own["metadata"]["name"], "default", reservation
            )
        message = json.loads(binding.value.body)["message"]
        assert binding.value.status == 422 and 'requires resource="resourceclaims/binding"' in message
        assert "reservedFor" not in cp.kubectl_json("get", "resourceclaim", own["metadata"]["name"])["status"]
    finally:
        for c in (own, other):
            cp.delete("resourceclaim", c["metadata"]["name"], missing_ok=False)


def test_claim_status_policy_confines_status_writes_without_granular_authorization(ungranular_status_cluster) -> None:
    """Kubernetes 1.34 and 1.35 authorize a claim status write with `patch` on resourceclaims/status alone, for
    every field of every claim; the admission policy of deploy/rbac.yaml confines the daemon of node A to the
    status.devices entries of this driver and pool A, in claims allocated devices of that pool."""
    from kubernetes import client

    from dra_driver.health.claim_status import FIELD_MANAGER
    from dra_driver.plugin.claims import KubeClaimSource
    from tests.plugin_helpers import claim

    cp = ungranular_status_cluster
    cp.kubectl("apply", "-f", str(ROOT / "deploy" / "rbac.yaml"))
    node_a, node_b = "legacy-a", "legacy-b"
    for node in (node_a, node_b):
        cp.create_node(node)
    api = _token_client(cp, _bound_token(cp, "daemon-legacy-a", node_a))
    claims, resource = KubeClaimSource(api), client.ResourceV1Api(api)
    nic = {"driver": "nic.example.com", "pool": node_a, "device": "nic-0", "data": {"mac": "02:00:00:00:00:01"}}

    def allocated(node: str) -> dict[str, Any]:
        """Allocated on `node`: gpu-0 of this driver; nic-0 and nic-1 of another driver, which wrote nic-0's entry."""
        c = claim(["gpu-0", "nic-0", "nic-1"], pool=node)
        for result in c["status"]["allocation"]["devices"]["results"][1:]:
            result["driver"] = "nic.example.com"
        c["status"]["allocation"]["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}  # fmt: skip
        c["status"]["devices"] = [{**nic, "pool": node}]
        return cp.create_allocated(c)

    def body(c: dict[str, Any], node: str, driver: str = DEFAULT_DRIVER_NAME, device: str = "gpu-0") -> dict[str, Any]:
        condition = {"type": "DeviceHealthy", "status": "False", "reason": "XID", "message": "XID 79",
                     "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
        m = c["metadata"]
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": m["name"], "namespace": m["namespace"], "uid": m["uid"]},
                "status": {"devices": [{"driver": driver, "pool": node, "device": device,
                                        "conditions": [condition]}]}}  # fmt: skip

    def status(c: dict[str, Any]) -> dict[str, Any]:
        return cp.kubectl_json("get", "resourceclaim", c["metadata"]["name"])["status"]  # type: ignore[no-any-return]

    def forbidden(write: Any) -> str:
        with pytest.raises(API_ERRORS) as denied:
            write()
        assert denied.value.status == 403, denied.value.body
        return str(json.loads(denied.value.body)["message"])

    own, other = allocated(node_a), allocated(node_b)
    try:
        own_name, other_name = own["metadata"]["name"], other["metadata"]["name"]

        _in_force(
            "the claim status policy denies another node's claim",
            lambda: client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
                "resource.k8s.io", "v1", "default", "resourceclaims", other_name, body(other, node_b),
                field_manager=FIELD_MANAGER, force=True, dry_run="All", _content_type="application/apply-patch+yaml",
            ),
        )  # fmt: skip
        before = status(own)
        claims.apply_claim_status("default", own_name, body(own, node_a), FIELD_MANAGER)  # its own entry: allowed
        after = status(own)
        assert {(d["driver"], d["device"]): d.get("conditions") or [] for d in after["devices"]} == {
            (DEFAULT_DRIVER_NAME, "gpu-0"): body(own, node_a)["status"]["devices"][0]["conditions"],
            ("nic.example.com", "nic-0"): [],
        }
        assert after["allocation"] == before["allocation"] and [d for d in after["devices"] if d["device"] == "nic-0"]

        message = forbidden(
            lambda: claims.apply_claim_status("default", other_name, body(other, node_b), FIELD_MANAGER)
        )
        assert f"claims allocated devices of {DEFAULT_DRIVER_NAME} on node {node_a}" in message, message
        for write in (  # another driver's entries: one added, one changed, one removed
            lambda: claims.apply_claim_status("default", own_name, body(own, node_a, "nic.example.com", "nic-1"), "x"),
            lambda: claims.apply_claim_status("default", own_name, body(own, node_a, "nic.example.com", "nic-0"), "x"),
            lambda: resource.patch_namespaced_resource_claim_status(
                own_name, "default", {"status": {"devices": [d for d in after["devices"] if d["device"] == "gpu-0"]}}
            ),
        ):
            message = forbidden(write)
            assert f"only change status.devices entries of driver {DEFAULT_DRIVER_NAME} and pool {node_a}" in message
        reservation = {"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}}
        message = forbidden(lambda: resource.patch_namespaced_resource_claim_status(own_name, "default", reservation))
        assert "may not change status.reservedFor" in message, message
        message = forbidden(  # deallocate it
            lambda: resource.patch_namespaced_resource_claim_status(
                own_name, "default", {"status": {"allocation": None}}
            )
        )
        assert "may not change status.allocation" in message, message
        assert status(own) == after
        assert [{k: v for k, v in d.items() if v is not None} for d in status(other)["devices"]] == [
            {**nic, "pool": node_b}
        ]
    finally:
        for c in (own, other):
            cp.delete("resourceclaim", c["metadata"]["name"], missing_ok=False)


def test_service_account_keeps_the_deviceclass_cache_in_sync(control_plane, caplog) -> None:
    """The daemon lists and watches DeviceClasses (plugin/class_cache.py): without both verbs the cache never
    syncs, logs a warning every few seconds and every prepare reads its classes with a GET."""
    from dra_driver.plugin.class_cache import DeviceClassCache, KubeClassWatch

    cp = control_plane
    cp.kubectl("apply", "-f", str(ROOT / "deploy" / "rbac.yaml"))
    cp.create_node("rbac-classes")
    api = _token_client(cp, _bound_token(cp, "daemon-classes", "rbac-classes"))
    cache = DeviceClassCache(KubeClassWatch(api, watch_seconds=5), retry_s=0.2)
    name = "rbac-cache.example.com"
    cache.start()
    try:
        wait_until("the cache synced", lambda: cache.synced, timeout=20)
        cp.apply({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}})  # fmt: skip
        wait_until("the new class seen through the watch", lambda: cache.get(name) is not None, timeout=20)
    finally:
        cache.stop()
        cp.delete("deviceclass", name, wait=120)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
