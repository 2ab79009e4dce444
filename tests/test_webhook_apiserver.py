"""The webhook behind the REAL kube-apiserver of tests/cluster (a control plane of this module's own, serving
resource.k8s.io v1, v1beta1 and v1beta2): the server runs in this process on 127.0.0.1 with a certificate from a
throwaway CA, registered by a ValidatingWebhookConfiguration with `clientConfig.url` and that CA as caBundle (what
envtest does). Claims and templates made with kubectl in each version: an invalid config of ours is refused with
our message, a valid one and another driver's invalid one are created, and a claim made before the webhook
existed can still be labelled (its finalizer removed)."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from dra_driver.claimstate.config import CONFIG_API_VERSION
from dra_driver.webhook.server import REVIEW_PATH, WebhookServer
from tests.cluster.controlplane import ControlPlane, KubectlError, issue_cert, make_ca
from tests.polling import wait_until
from tests.test_webhook_review import BAD_STRATEGY, DRIVER, GOOD, claim_spec, config_error, entry

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command makes the test CA")

NAMESPACE = "webhook-test"
HOOK = f"resourceclaims.config.{DRIVER}"
VERSIONS = ("v1", "v1beta1", "v1beta2")


@dataclass
class LocalWebhook:
    """The webhook served from this process, as the API server reaches it."""

    server: WebhookServer
    url: str
    ca_bundle: str  # base64 PEM, as clientConfig.caBundle takes it
    registry: CollectorRegistry

    def reviews(self, kind: str, result: str) -> float:
        labels = {"kind": kind, "result": result}
        return self.registry.get_sample_value("dra_driver_webhook_reviews_total", labels) or 0.0


def start_local_webhook(directory: Path) -> LocalWebhook:
    make_ca(directory, "webhook-apiserver-test-ca")
    issue_cert(directory, "tls", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    registry = CollectorRegistry()
    server = WebhookServer(
        DRIVER, directory / "tls.crt", directory / "tls.key", address="127.0.0.1", port=0, registry=registry
    ).start()
    bundle = base64.b64encode((directory / "ca.crt").read_bytes()).decode()
    return LocalWebhook(server, f"https://127.0.0.1:{server.port}{REVIEW_PATH}", bundle, registry)


def served_versions(cp: ControlPlane) -> list[str]:
    served = set(cp.kubectl("api-versions").stdout.split())
    return [v for v in VERSIONS if f"resource.k8s.io/{v}" in served]


def claim(name: str, version: str, configs: list[dict[str, Any]], kind: str = "ResourceClaim") -> dict[str, Any]:
    spec = claim_spec(version, configs)
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": kind,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec if kind == "ResourceClaim" else {"spec": spec},
    }


def create(cp: ControlPlane, obj: dict[str, Any], *extra: str) -> str:
    """Empty when created, else kubectl's error."""
    proc = cp.kubectl("create", *extra, "-f", "-", input=json.dumps(obj), check=False)
    return "" if proc.returncode == 0 else proc.stderr.strip()


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """A control plane of its own (the shared one's binaries) serving every version the webhook takes: v1beta1 is
    off by default. No controllers: nothing here needs them."""
    runtime_config = {f"resource.k8s.io/{v}": True for v in VERSIONS}
    with ControlPlane(bin_dir=control_plane.bin_dir, runtime_config=runtime_config, controllers=()) as cp:
        yield cp


@pytest.fixture(scope="module")
def webhook(cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalWebhook]:
    cp = cluster
    hook = start_local_webhook(tmp_path_factory.mktemp("webhook-pki"))
    cp.create_namespace(NAMESPACE)
    # made before the webhook exists: the UPDATE test must still be able to change its metadata
    assert create(cp, claim("before-webhook", "v1", [entry(BAD_STRATEGY)])) == ""
    rules = [{"apiGroups": ["resource.k8s.io"], "apiVersions": list(VERSIONS), "operations": ["CREATE", "UPDATE"],
              "resources": ["resourceclaims", "resourceclaimtemplates"], "scope": "Namespaced"}]  # fmt: skip
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "webhook-apiserver-test"},
        "webhooks": [
            {
                "name": HOOK,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
                "rules": rules,
                "clientConfig": {"url": hook.url, "caBundle": hook.ca_bundle},
            }
        ],
    }
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(config))
    probe = claim("probe", "v1", [entry(BAD_STRATEGY)])
    wait_until(
        "the API server to call the webhook", lambda: "denied the request" in create(cp, probe, "--dry-run=server")
    )
    try:
        yield hook
    finally:
        hook.server.stop()


@pytest.mark.parametrize("version", VERSIONS)
def test_an_invalid_config_is_refused_with_our_message(
    cluster: ControlPlane, webhook: LocalWebhook, version: str
) -> None:
    if version not in served_versions(cluster):
        pytest.skip(f"resource.k8s.io/{version} is not served by this API server")
    bad_mig = {**GOOD, "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}}}
    error = create(cluster, claim(f"bad-{version}", version, [entry(GOOD), entry(BAD_STRATEGY), entry(bad_mig)]))
    assert f'admission webhook "{HOOK}" denied the request: ' in error, error
    assert f"spec.devices.config[1].opaque.parameters: {config_error(BAD_STRATEGY)}" in error
    assert f"spec.devices.config[2].opaque.parameters: {config_error(bad_mig)}" in error
    assert "a time-slice interval cannot be set on MIG devices" in error
    template = claim(f"bad-{version}", version, [entry(BAD_STRATEGY)], kind="ResourceClaimTemplate")
    error = create(cluster, template)
    assert f"spec.spec.devices.config[0].opaque.parameters: {config_error(BAD_STRATEGY)}" in error, error
    with pytest.raises(KubectlError):
        cluster.kubectl("get", "resourceclaim", f"bad-{version}", "-n", NAMESPACE)


@pytest.mark.parametrize("version", VERSIONS)
def test_valid_configs_and_other_drivers_configs_are_created(
    cluster: ControlPlane, webhook: LocalWebhook, version: str
) -> None:
    if version not in served_versions(cluster):
        pytest.skip(f"resource.k8s.io/{version} is not served by this API server")
    mig = {"apiVersion": CONFIG_API_VERSION, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}
    configs = [entry(GOOD), entry(mig, requests=["gpu"]), entry(BAD_STRATEGY, driver="gpu.other.example.com")]
    allowed = webhook.reviews("ResourceClaim", "allowed")
    assert create(cluster, claim(f"good-{version}", version, configs)) == ""
    assert webhook.reviews("ResourceClaim", "allowed") == allowed + 1  # it was asked, and said yes
    template = claim(f"good-{version}", version, configs, kind="ResourceClaimTemplate")
    assert create(cluster, template) == ""
    stored = cluster.kubectl_json("get", f"resourceclaims.{version}.resource.k8s.io", f"good-{version}",
                                        "-n", NAMESPACE)  # fmt: skip
    assert [c["opaque"]["driver"] for c in stored["spec"]["devices"]["config"]] == [
        DRIVER,
        DRIVER,
        "gpu.other.example.com",
    ]


def test_a_claim_made_before_the_webhook_can_still_be_updated(cluster: ControlPlane, webhook: LocalWebhook) -> None:
    """Its (invalid) spec cannot change, so an UPDATE only touches metadata: refusing it would keep its finalizer."""
    allowed, denied = webhook.reviews("ResourceClaim", "allowed"), webhook.reviews("ResourceClaim", "denied")
    cluster.kubectl("label", "resourceclaim", "before-webhook", "-n", NAMESPACE, "checked=later")
    patch = json.dumps({"metadata": {"finalizers": ["example.com/test"]}})
    cluster.kubectl("patch", "resourceclaim", "before-webhook", "-n", NAMESPACE, "--type=merge", "-p", patch)
    cluster.kubectl("patch", "resourceclaim", "before-webhook", "-n", NAMESPACE, "--type=merge",
                          "-p", json.dumps({"metadata": {"finalizers": None}}))  # fmt: skip
    assert webhook.reviews("ResourceClaim", "allowed") == allowed + 3  # each update was reviewed, and allowed
    assert webhook.reviews("ResourceClaim", "denied") == denied
    obj = cluster.kubectl_json("get", "resourceclaim", "before-webhook", "-n", NAMESPACE)
    assert obj["metadata"]["labels"] == {"checked": "later"} and not obj["metadata"].get("finalizers")
