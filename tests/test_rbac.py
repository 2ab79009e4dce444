"""deploy/rbac.yaml: the node daemon's service account can publish its own node's pool and write the device health
of its own node's claims, and nothing more."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from dra_driver.controller.publisher import Publisher
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME
from tests.test_publisher import Desired

ROOT = Path(__file__).resolve().parent.parent


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
    cp.kubectl("apply", "-f", "-", input=json.dumps(pod))
    return str(
        cp.kubectl(
            "create", "token", "dra-driver", "-n", "dra-driver", "--bound-object-kind", "Pod",
            "--bound-object-name", pod_name,
        ).stdout.strip()
    )  # fmt: skip


def test_service_account_publishes_only_its_own_node(control_plane, tmp_path: Path) -> None:
    cp = control_plane
    cp.kubectl("apply", "-f", str(ROOT / "deploy" / "rbac.yaml"))
    for node in ("rbac-a", "rbac-b"):
        cp.create_node(node)
    token = _bound_token(cp, "daemon-a", "rbac-a")
    api = _token_client(cp, token)
    own = Publisher(
        api, node_name="rbac-a", driver=DEFAULT_DRIVER_NAME, desired=Desired("dgx-h100", "rbac-a", tmp_path / "a")
    )
    assert own.sync_once() is True  # allowed: its own node's pool
    assert len(cp.kubectl_json("get", "resourceslices", "--field-selector", "spec.nodeName=rbac-a")["items"]) == 9
    other = Publisher(
        api, node_name="rbac-b", driver=DEFAULT_DRIVER_NAME, desired=Desired("dgx-h100", "rbac-b", tmp_path / "b")
    )
    with pytest.raises(ApiException) as denied:
        other.sync_once()
    assert denied.value.status == 403 and "may only write ResourceSlices of node rbac-a" in denied.value.body
    admin_slice = Desired("dgx-a100", "rbac-b", tmp_path / "c")(1, None)[0].to_api()
    cp.kubectl("create", "-f", "-", input=json.dumps(admin_slice))
    from kubernetes import client

    objects = client.CustomObjectsApi(api)
    with pytest.raises(ApiException) as delete_denied:
        objects.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", admin_slice["metadata"]["name"])
    assert delete_denied.value.status == 403
    with pytest.raises(ApiException) as secrets:
        client.CoreV1Api(api).list_namespaced_secret("dra-driver")
    assert secrets.value.status == 403  # RBAC: nothing beyond what the role grants
    cp.kubectl(
        "delete", "resourceslices", "--field-selector", "spec.driver=" + DEFAULT_DRIVER_NAME, "--ignore-not-found"
    )


def test_service_account_writes_device_health_only_of_its_own_nodes_claims(control_plane) -> None:
    from dra_driver.health.claim_status import FIELD_MANAGER
    from dra_driver.plugin.claims import KubeClaimSource
    from tests.plugin_helpers import claim
    from tests.test_plugin_apiserver import _create

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
        return _create(cp, c)

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
            with pytest.raises(ApiException) as denied:
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
        with pytest.raises(ApiException) as binding:  # status patch does not extend to scheduling fields
            client.ResourceV1Api(api).patch_namespaced_resource_claim_status(
                own["metadata"]["name"], "default", reservation
            )
        message = json.loads(binding.value.body)["message"]
        assert binding.value.status == 422 and 'requires resource="resourceclaims/binding"' in message
        assert "reservedFor" not in cp.kubectl_json("get", "resourceclaim", own["metadata"]["name"])["status"]
    finally:
        for c in (own, other):
            cp.kubectl("delete", "resourceclaim", c["metadata"]["name"], "--wait=false")
