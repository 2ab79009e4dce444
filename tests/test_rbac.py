"""deploy/rbac.yaml: the node daemon's service account can publish its own node's pool and nothing more."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_service_account_publishes_only_its_own_node(control_plane, tmp_path: Path) -> None:
    cp = control_plane
    cp.kubectl("apply", "-f", str(ROOT / "deploy" / "rbac.yaml"))
    for node in ("rbac-a", "rbac-b"):
        cp.create_node(node)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "daemon-a", "namespace": "dra-driver"},
        "spec": {
            "nodeName": "rbac-a",
            "serviceAccountName": "dra-driver",
            "containers": [{"name": "plugin", "image": "registry.invalid/dra-driver:test"}],
        },
    }
    cp.kubectl("apply", "-f", "-", input=json.dumps(pod))
    token = cp.kubectl(
        "create",
        "token",
        "dra-driver",
        "-n",
        "dra-driver",
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        "daemon-a",
    ).stdout.strip()
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
