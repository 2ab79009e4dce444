"""dra_driver.webhook.review: AdmissionReviews of ResourceClaims and ResourceClaimTemplates in every served
version; our driver's invalid configs refused with prepare's own text, all of them; the rest allowed; a malformed
review is a clear error, never a crash."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from dra_driver.claimstate.config import CONFIG_API_VERSION, ConfigError, decode
from dra_driver.webhook.review import OTHER_KIND, MalformedReview, judge, review
from tests.plugin_helpers import DRIVER, Node, claim, ref

VERSIONS = ("v1", "v1beta1", "v1beta2")
KINDS = {"ResourceClaim": "spec", "ResourceClaimTemplate": "spec.spec"}
CASES = [(v, k) for v in VERSIONS for k in KINDS]
IDS = [f"{k}-{v}" for v, k in CASES]

GOOD = {"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}}
BAD_STRATEGY = {"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "Sometimes"}}
BAD_EXTRA = {"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig", "extra": 1}
BAD_API = {"apiVersion": "v9", "kind": "GpuConfig"}
MIG_INTERVAL = {
    "apiVersion": CONFIG_API_VERSION,
    "kind": "MigDeviceConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
}
BAD_PERCENTAGE = {
    "apiVersion": CONFIG_API_VERSION,
    "kind": "GpuConfig",
    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}},
}


def config_error(parameters: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as e:
        decode(parameters)
    return str(e.value)


def entry(parameters: Any, driver: str = DRIVER, requests: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"opaque": {"driver": driver, "parameters": parameters}}
    if requests:
        out["requests"] = requests
    return out


def claim_spec(version: str, configs: list[Any]) -> dict[str, Any]:
    """A ResourceClaimSpec as `version` lays it out (v1beta1 has the request's fields inline)."""
    request: dict[str, Any] = {"name": "gpu"}
    if version == "v1beta1":
        request["deviceClassName"] = DRIVER
    else:
        request["exactly"] = {"deviceClassName": DRIVER}
    return {"devices": {"requests": [request], "config": configs}}


def resource(kind: str, version: str, configs: list[Any]) -> dict[str, Any]:
    spec = claim_spec(version, configs)
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": kind,
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": spec if kind == "ResourceClaim" else {"spec": spec},
    }


def admission(
    obj: dict[str, Any] | None,
    *,
    kind: str = "ResourceClaim",
    version: str = "v1",
    group: str = "resource.k8s.io",
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002",
) -> dict[str, Any]:
    plural = kind.lower() + "s"
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": plural},
        "requestKind": {"group": group, "version": version, "kind": kind},
        "name": "c",
        "namespace": "ns",
        "operation": operation,
        "userInfo": {"username": "admin"},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def answer(body: Any) -> dict[str, Any]:
    out = review(body, DRIVER)
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    response: dict[str, Any] = out["response"]
    assert response["uid"] == body["request"]["uid"]
    return response


@pytest.mark.parametrize(("version", "kind"), CASES, ids=IDS)
def test_valid_configs_and_other_drivers_configs_are_allowed(version: str, kind: str) -> None:
    configs = [
        entry(GOOD),
        entry({"apiVersion": CONFIG_API_VERSION, "kind": "MigDeviceConfig"}, requests=["gpu"]),
        entry(BAD_STRATEGY, driver="gpu.nvidia.com"),  # not ours: not our business
        {"requests": ["gpu"]},  # no opaque config at all
    ]
    obj = resource(kind, version, configs)
    assert answer(admission(obj, kind=kind, version=version)) == {
        "uid": admission(None)["request"]["uid"],
        "allowed": True,
    }


@pytest.mark.parametrize(("version", "kind"), CASES, ids=IDS)
def test_an_invalid_config_is_denied_with_its_path_and_the_config_error(version: str, kind: str) -> None:
    obj = resource(kind, version, [entry(GOOD), entry(BAD_STRATEGY)])
    response = answer(admission(obj, kind=kind, version=version))
    assert response["allowed"] is False
    assert response["status"]["code"] == 422 and response["status"]["reason"] == "Invalid"
    expected = f"{KINDS[kind]}.devices.config[1].opaque.parameters: {config_error(BAD_STRATEGY)}"
    assert response["status"]["message"] == expected
    assert expected.startswith(
        f"{KINDS[kind]}.devices.config[1].opaque.parameters: invalid GpuConfig: sharing.strategy"
    )


def test_every_invalid_config_is_listed() -> None:
    configs = [
        entry(BAD_API),
        entry(GOOD),
        entry(BAD_EXTRA, requests=["gpu"]),
        entry(BAD_STRATEGY, driver="other.example.com"),
        entry(MIG_INTERVAL),
        entry(BAD_PERCENTAGE),
    ]
    verdict = judge(admission(resource("ResourceClaim", "v1", configs)), DRIVER)
    assert not verdict.allowed and verdict.result == "denied" and verdict.kind == "ResourceClaim"
    assert verdict.subject == "ns/c"  # for the log
    assert verdict.message.split("; spec.") == [
        f"spec.devices.config[0].opaque.parameters: {config_error(BAD_API)}",
        f"devices.config[2].opaque.parameters: {config_error(BAD_EXTRA)}",
        f"devices.config[4].opaque.parameters: {config_error(MIG_INTERVAL)}",
        f"devices.config[5].opaque.parameters: {config_error(BAD_PERCENTAGE)}",
    ]
    assert "a time-slice interval cannot be set on MIG devices" in verdict.message
    assert "0 is out of range (allowed: an integer from 1 to 100)" in verdict.message


@pytest.mark.parametrize(
    ("parameters", "devices", "device_class"),
    [
        (BAD_STRATEGY, ["gpu-0"], "gpu"),
        (BAD_EXTRA, ["gpu-0"], "gpu"),
        (BAD_API, ["gpu-0"], "gpu"),
        (BAD_PERCENTAGE, ["gpu-0"], "gpu"),
        (MIG_INTERVAL, ["gpu-0-mig-1g10gb-19-0"], "mig"),
    ],
    ids=["strategy", "extra-field", "api-version", "mps-percentage", "mig-interval"],
)
def test_the_message_is_the_one_prepare_gives_on_the_node(
    tmp_path: Path, parameters: dict[str, Any], devices: list[str], device_class: str
) -> None:
    node = Node(tmp_path)
    configs = [entry(parameters)]
    allocated = claim(
        devices, device_class=device_class, config=[{"source": "FromClaim", **copy.deepcopy(c)} for c in configs]
    )
    node.add(allocated)
    prepared = node.driver().prepare([ref(allocated)])[allocated["metadata"]["uid"]]
    assert prepared.error, "prepare accepted the config"
    response = answer(admission(resource("ResourceClaim", "v1", configs)))
    assert response["status"]["message"] == f"spec.devices.config[0].opaque.parameters: {prepared.error}"


def test_configs_naming_requests_and_mig_configs_without_interval_are_allowed() -> None:
    mig = {"apiVersion": CONFIG_API_VERSION, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}
    configs = [entry(mig, requests=["gpu"]), entry(GOOD, requests=["gpu"])]
    assert answer(admission(resource("ResourceClaim", "v1beta2", configs), version="v1beta2"))["allowed"] is True


def test_an_update_that_keeps_the_configs_is_allowed_even_if_they_are_invalid() -> None:
    """Specs are immutable: an UPDATE is a metadata change (a finalizer's removal) and must never be blocked, even
    for a claim made before the webhook was installed; a changed config list is checked."""
    old = resource("ResourceClaim", "v1", [entry(BAD_STRATEGY)])
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = []
    assert answer(admission(new, operation="UPDATE", old=old))["allowed"] is True
    changed = resource("ResourceClaim", "v1", [entry(BAD_STRATEGY), entry(BAD_API)])
    response = answer(admission(changed, operation="UPDATE", old=old))
    assert response["allowed"] is False and "config[1]" in response["status"]["message"]
    assert answer(admission(new, operation="UPDATE", old=None))["allowed"] is False  # nothing to compare with


@pytest.mark.parametrize(
    "body",
    [
        admission({"kind": "Pod"}, kind="Pod", group=""),
        admission({"kind": "DeviceClass"}, kind="DeviceClass"),
        admission(resource("ResourceClaim", "v1", [entry(BAD_STRATEGY)]), operation="DELETE"),
        admission(resource("ResourceClaim", "v1", [entry(BAD_STRATEGY)]), group="example.com"),
    ],
    ids=["pod", "device-class", "delete", "other-group"],
)
def test_other_kinds_and_operations_are_allowed(body: dict[str, Any]) -> None:
    assert answer(body)["allowed"] is True


def test_a_status_update_is_allowed() -> None:
    body = admission(resource("ResourceClaim", "v1", [entry(BAD_STRATEGY)]), operation="UPDATE")
    body["request"]["subResource"] = "status"
    assert answer(body)["allowed"] is True


def test_an_unknown_version_is_allowed_with_a_warning() -> None:
    verdict = judge(admission(resource("ResourceClaim", "v2", [entry(BAD_STRATEGY)]), version="v2"), DRIVER)
    assert verdict.allowed and verdict.kind == "ResourceClaim"
    (warning,) = verdict.response()["response"]["warnings"]
    assert "resource.k8s.io/v2 ResourceClaim" in warning and "not checked" in warning


def test_other_kinds_have_their_own_metric_label() -> None:
    assert judge(admission({"kind": "Pod"}, kind="Pod", group=""), DRIVER).kind == OTHER_KIND


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (None, "not an admission.k8s.io/v1 AdmissionReview request"),
        ([], "valid dictionary"),
        ("review", "valid dictionary"),
        ({}, "apiVersion: Field required"),
        (
            {**admission(None), "apiVersion": "admission.k8s.io/v1beta1"},
            "apiVersion: Input should be 'admission.k8s.io/v1'",
        ),
        ({**admission(None), "kind": "Status"}, "kind: Input should be 'AdmissionReview'"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "request: Field required"),
        (
            {**admission(None), "request": {"kind": {"version": "v1", "kind": "ResourceClaim"}}},
            "request.uid: Field required",
        ),
        (
            {**admission(None), "request": {**admission(None)["request"], "uid": ""}},
            "request.uid: String should have at least 1",
        ),
        (
            {**admission(None), "request": {**admission(None)["request"], "uid": 7}},
            "request.uid: Input should be a valid string",
        ),
        ({**admission(None), "request": {**admission(None)["request"], "kind": "ResourceClaim"}}, "request.kind"),
        ({**admission(None), "request": {**admission(None)["request"], "object": [1]}}, "request.object"),
    ],
    ids=[
        "null",
        "list",
        "string",
        "empty",
        "v1beta1",
        "status",
        "no-request",
        "no-uid",
        "empty-uid",
        "int-uid",
        "kind-string",
        "object-list",
    ],
)
def test_a_malformed_review_is_a_clear_error(body: Any, words: str) -> None:
    with pytest.raises(MalformedReview) as e:
        review(body, DRIVER)
    assert words in str(e.value)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (None, "CREATE ResourceClaim: the request has no object"),
        ({"spec": []}, "malformed ResourceClaim: spec: expected an object, got list"),
        ({"spec": {"devices": "all"}}, "malformed ResourceClaim: spec.devices: expected an object, got string"),
        (
            {"spec": {"devices": {"config": {"opaque": {}}}}},
            "malformed ResourceClaim: spec.devices.config: expected a list, got object",
        ),
    ],
)
def test_a_malformed_object_is_denied_as_a_bad_request(obj: Any, message: str) -> None:
    response = answer(admission(obj))
    assert response["allowed"] is False
    assert response["status"] == {"code": 400, "reason": "BadRequest", "message": message}


def test_malformed_config_entries_are_listed_as_problems() -> None:
    configs = [7, {"opaque": "x"}, entry(None), entry([1]), entry(BAD_API), {"opaque": None}, {"requests": ["gpu"]}]
    response = answer(admission(resource("ResourceClaim", "v1", configs)))
    assert response["status"]["message"].split("; ") == [
        "spec.devices.config[0]: expected an object, got number",
        "spec.devices.config[1].opaque: expected an object, got string",
        "spec.devices.config[2].opaque.parameters: expected an object, got null",
        "spec.devices.config[3].opaque.parameters: expected an object, got list",
        f"spec.devices.config[4].opaque.parameters: {config_error(BAD_API)}",
    ]


def test_a_claim_without_devices_or_configs_is_allowed() -> None:
    assert answer(admission({"spec": {}}))["allowed"] is True
    assert answer(admission({"spec": {"devices": {"requests": []}}}))["allowed"] is True
    template = {"spec": {"metadata": {"labels": {"a": "b"}}}}
    assert answer(admission(template, kind="ResourceClaimTemplate"))["allowed"] is True
