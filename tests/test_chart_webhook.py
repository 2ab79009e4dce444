"""deploy/helm/dra-driver, templates/webhook.yaml: nothing when webhook.enabled is false (the default); when true a
locked-down Deployment of `dra-driver webhook`, its Service, a TLS Secret whose certificate is for the Service's DNS
name and signed by the caBundle's CA, and a ValidatingWebhookConfiguration. On the real API server: every object is
accepted (`kubectl apply --dry-run=server`), an upgrade keeps the certificate (`lookup` of the Secret), and the
configuration's rules and matchConditions send exactly the claims with a config of our driver to the webhook."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.webhook.server import HEALTH_PATH, REVIEW_PATH
from tests.cluster.controlplane import ControlPlane
from tests.polling import wait_until
from tests.test_helm_chart import CHART, FULLNAME, NAMESPACE, RELEASE, Helm, _one, _render, _run, _template, helm
from tests.test_webhook_apiserver import create, start_local_webhook
from tests.test_webhook_review import BAD_STRATEGY, DRIVER, GOOD, entry

__all__ = ["helm"]  # the fixture, shared with tests/test_helm_chart.py

ENABLED = ("--set", "webhook.enabled=true")
NAME = f"{FULLNAME}-webhook"
SERVICE_DNS = f"{NAME}.{NAMESPACE}.svc"
KINDS = {"Secret", "Service", "Deployment", "ValidatingWebhookConfiguration"}


def _webhook_objects(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["metadata"]["name"].startswith(NAME)]


def _openssl(*args: str, input: bytes | None = None) -> str:
    proc = subprocess.run(["openssl", *args], input=input, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode()


def test_disabled_by_default(helm: Helm) -> None:
    objs = _render(helm)
    assert _webhook_objects(objs) == []
    assert not [o for o in objs if o["kind"] == "ValidatingWebhookConfiguration"]
    assert _webhook_objects(_render(helm, *ENABLED, "--set", "webhook.enabled=false")) == []


def test_lint_is_clean_with_the_webhook(helm: Helm) -> None:
    out = _run(helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *ENABLED).stdout
    assert "0 chart(s) failed" in out, out


def test_the_deployment_is_locked_down_and_the_service_finds_it(helm: Helm) -> None:
    objs = _render(helm, *ENABLED, "--set", "driverName=gpu.example.com", "--set", "webhook.port=9443")
    assert {o["kind"] for o in _webhook_objects(objs)} == KINDS
    deployment = _one(objs, "Deployment", NAME)
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["dra-driver"]
    assert c["args"] == ["webhook", "--tls-cert=/tls/tls.crt", "--tls-key=/tls/tls.key", "--port=9443",
                         "--driver=gpu.example.com"]  # fmt: skip
    assert c["ports"] == [{"name": "https", "containerPort": 9443, "protocol": "TCP"}]
    probe = c["readinessProbe"]["httpGet"]
    assert probe == {"path": HEALTH_PATH, "port": "https", "scheme": "HTTPS"}
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False  # it reads no API object
    assert deployment["spec"]["replicas"] == 2
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels
    daemonset_selector = _one(objs, "DaemonSet", FULLNAME)["spec"]["selector"]["matchLabels"]
    assert not daemonset_selector.items() <= labels.items(), "the DaemonSet would take in the webhook's pods"
    service = _one(objs, "Service", NAME)
    assert service["spec"]["selector"] == labels
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}]
    secret = _one(objs, "Secret", f"{NAME}-tls")
    assert pod["volumes"] == [{"name": "tls", "secret": {"secretName": secret["metadata"]["name"]}}]
    assert not [o for o in objs if o["kind"] in ("ClusterRole", "Role") and "webhook" in o["metadata"]["name"]]


def test_the_webhook_configuration(helm: Helm) -> None:
    objs = _render(helm, *ENABLED)
    config = _one(objs, "ValidatingWebhookConfiguration", NAME)
    hooks = {h["name"]: h for h in config["webhooks"]}
    assert set(hooks) == {f"resourceclaims.config.{DRIVER}", f"resourceclaimtemplates.config.{DRIVER}"}
    for resource in ("resourceclaims", "resourceclaimtemplates"):
        hook = hooks[f"{resource}.config.{DRIVER}"]
        assert hook["rules"] == [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1", "v1beta1", "v1beta2"],
                                  "operations": ["CREATE", "UPDATE"], "resources": [resource],
                                  "scope": "Namespaced"}]  # fmt: skip
        assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
        assert hook["failurePolicy"] == "Fail" and hook["timeoutSeconds"] == 5
        assert hook["clientConfig"]["service"] == {
            "name": NAME,
            "namespace": NAMESPACE,
            "port": 443,
            "path": REVIEW_PATH,
        }
        (condition,) = hook["matchConditions"]
        assert f"c.opaque.driver == '{DRIVER}'" in condition["expression"]
    ignore = _render(helm, *ENABLED, "--set", "webhook.failurePolicy=Ignore", "--set", "webhook.timeoutSeconds=2")
    hook = _one(ignore, "ValidatingWebhookConfiguration")["webhooks"][0]
    assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Ignore", 2)
    proc = _run(
        helm, "template", RELEASE, str(CHART), *ENABLED, "--set", "webhook.failurePolicy=Sometimes", check=False
    )
    assert proc.returncode != 0 and "webhook.failurePolicy must be Fail or Ignore" in proc.stderr


def test_the_certificate_is_for_the_service_and_signed_by_the_ca_bundle(helm: Helm, tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command reads the certificates")
    objs = _render(helm, *ENABLED)
    data = {k: base64.b64decode(v) for k, v in _one(objs, "Secret", f"{NAME}-tls")["data"].items()}
    assert _one(objs, "Secret", f"{NAME}-tls")["type"] == "kubernetes.io/tls"
    bundles = {h["clientConfig"]["caBundle"] for h in _one(objs, "ValidatingWebhookConfiguration")["webhooks"]}
    assert {base64.b64decode(b) for b in bundles} == {data["ca.crt"]}
    sans = _openssl("x509", "-noout", "-ext", "subjectAltName", input=data["tls.crt"])
    assert f"DNS:{SERVICE_DNS}" in sans.split("\n", 1)[1].replace(" ", "").strip().split(","), sans  # what it dials
    (tmp_path / "ca.crt").write_bytes(data["ca.crt"])
    (tmp_path / "tls.crt").write_bytes(data["tls.crt"])
    assert "tls.crt: OK" in _openssl("verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt"))
    key_pub = _openssl("pkey", "-pubout", input=data["tls.key"])
    assert key_pub == _openssl("x509", "-noout", "-pubkey", input=data["tls.crt"]), "the key is not the cert's"


def test_cert_manager_instead(helm: Helm) -> None:
    objs = _render(helm, *ENABLED, "--set", "webhook.tls.certManager.enabled=true")
    assert {o["kind"] for o in _webhook_objects(objs)} == {"Issuer", "Certificate", "Service", "Deployment",
                                                            "ValidatingWebhookConfiguration"}  # fmt: skip
    certificate = _one(objs, "Certificate", NAME)["spec"]
    assert certificate["secretName"] == f"{NAME}-tls" and SERVICE_DNS in certificate["dnsNames"]
    assert certificate["issuerRef"] == {"kind": "Issuer", "name": NAME}
    config = _one(objs, "ValidatingWebhookConfiguration", NAME)
    assert config["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/{NAME}"}
    assert all("caBundle" not in h["clientConfig"] for h in config["webhooks"])
    issuer = ("--set", "webhook.tls.certManager.issuerRef.kind=ClusterIssuer", "--set",
              "webhook.tls.certManager.issuerRef.name=my-ca")  # fmt: skip
    objs = _render(helm, *ENABLED, "--set", "webhook.tls.certManager.enabled=true", *issuer)
    assert not [o for o in objs if o["kind"] == "Issuer"]
    assert _one(objs, "Certificate")["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "my-ca"}


def test_the_api_server_accepts_every_webhook_object(helm: Helm, control_plane: ControlPlane) -> None:
    manifest = _template(helm, *ENABLED)
    count = sum(1 for d in yaml.safe_load_all(manifest) if d)
    if control_plane.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
        control_plane.create_namespace(NAMESPACE)
    out = control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest).stdout
    assert len([line for line in out.splitlines() if line.endswith("(server dry run)")]) == count, out
    assert f"validatingwebhookconfiguration.admissionregistration.k8s.io/{NAME} created (server dry run)" in out


def test_an_upgrade_keeps_the_certificate(helm: Helm, control_plane: ControlPlane) -> None:
    """`lookup` finds the Secret of the earlier install: the same CA and certificate, not a new pair per upgrade."""
    namespace = "webhook-chart-upgrade"
    control_plane.create_namespace(namespace)
    try:
        first = _render(helm, *ENABLED, namespace=namespace)
        secret = _one(first, "Secret", f"{NAME}-tls")
        control_plane.kubectl("create", "-f", "-", input=yaml.safe_dump(secret))
        env = {**helm.env, "KUBECONFIG": str(control_plane.kubeconfig)}
        proc = subprocess.run([str(helm.path), "template", RELEASE, str(CHART), "-n", namespace, *ENABLED,
                               "--dry-run=server"], env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        again = [d for d in yaml.safe_load_all(proc.stdout) if d]
        assert _one(again, "Secret", f"{NAME}-tls")["data"] == secret["data"]
        bundle = secret["data"]["ca.crt"]
        assert {h["clientConfig"]["caBundle"] for h in _one(again, "ValidatingWebhookConfiguration")["webhooks"]} == {
            bundle
        }
        fresh = _render(helm, *ENABLED, namespace=namespace, fresh=True)  # no cluster to look in: a new pair
        assert _one(fresh, "Secret", f"{NAME}-tls")["data"]["ca.crt"] != bundle
    finally:
        control_plane.delete("namespace", namespace, missing_ok=False)


def test_the_rules_and_match_conditions_on_the_real_api_server(
    helm: Helm, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """The chart's configuration pointed at an in-process webhook: a claim or template with a bad config of ours is
    refused; one with only another driver's config, or none, is created without the webhook being asked."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command makes the test CA")
    cp, namespace = control_plane, "webhook-chart-rules"
    hook = start_local_webhook(tmp_path)
    config = _one(_render(helm, *ENABLED), "ValidatingWebhookConfiguration", NAME)
    config["metadata"]["name"] = "webhook-chart-rules-test"
    for h in config["webhooks"]:
        h["clientConfig"] = {"url": hook.url, "caBundle": hook.ca_bundle}
        # this test's namespace only: the other tests of the shared cluster never reach this webhook
        h["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    cp.create_namespace(namespace)
    try:
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(config))

        def obj(name: str, configs: list[dict[str, Any]], kind: str = "ResourceClaim") -> dict[str, Any]:
            spec = {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}], "config": configs}
            }
            meta = {"name": name, "namespace": namespace}
            return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": meta,
                    "spec": spec if kind == "ResourceClaim" else {"spec": spec}}  # fmt: skip

        def refused(o: dict[str, Any]) -> bool:
            return "denied the request" in create(cp, o, "--dry-run=server")

        wait_until("the API server to call the chart's webhook", lambda: refused(obj("probe", [entry(BAD_STRATEGY)])))
        assert refused(obj("bad", [entry(GOOD), entry(BAD_STRATEGY)], kind="ResourceClaimTemplate"))
        assert create(cp, obj("good", [entry(GOOD)])) == ""
        asked = sum(
            hook.reviews(k, r) for k in ("ResourceClaim", "ResourceClaimTemplate") for r in ("allowed", "denied")
        )
        assert create(cp, obj("other", [entry(BAD_STRATEGY, driver="gpu.other.example.com")])) == ""
        assert create(cp, obj("none", [])) == ""
        assert create(cp, obj("none", [], kind="ResourceClaimTemplate")) == ""
        after = sum(
            hook.reviews(k, r) for k in ("ResourceClaim", "ResourceClaimTemplate") for r in ("allowed", "denied")
        )
        assert after == asked, "the matchConditions let claims without a config of ours through to the webhook"
    finally:
        cp.delete("validatingwebhookconfiguration", "webhook-chart-rules-test", wait=120)
        cp.delete("namespace", namespace, missing_ok=False)
        hook.server.stop()
