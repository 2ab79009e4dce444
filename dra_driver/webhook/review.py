"""An AdmissionReview v1 request in, its response out: the opaque configs of our driver in a ResourceClaim or a
ResourceClaimTemplate (resource.k8s.io v1, v1beta1, v1beta2) are decoded as prepare decodes them on the node.

A config that prepare would refuse is refused here, with prepare's own ConfigError text after the field path
(`spec.devices.config[1].opaque.parameters: invalid GpuConfig: ...`); every such config is listed. Other drivers'
configs, other kinds and other operations are allowed. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dra_driver.api import GROUP
from dra_driver.claimstate.config import ConfigError, decode

REVIEW_API_VERSION: Final = "admission.k8s.io/v1"
VERSIONS: Final = ("v1", "v1beta1", "v1beta2")
# Where each kind keeps its ResourceClaimSpec. `devices.config[]` ({requests, opaque {driver, parameters}}) has the
# same layout in all three versions; only the requests differ (v1beta1 inlines what v1beta2 and v1 put in `exactly`).
SPEC_PATHS: Final = {"ResourceClaim": ("spec",), "ResourceClaimTemplate": ("spec", "spec")}
OTHER_KIND: Final = "other"  # the metric label of every kind this webhook does not check


class MalformedReview(ValueError):
    """The body is no AdmissionReview v1 request with a uid: there is nothing to answer."""


class _Object(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class _Kind(_Object):
    group: str = ""
    version: str
    kind: str


class _Request(_Object):
    uid: str = Field(min_length=1)
    kind: _Kind
    operation: str = ""
    sub_resource: str = Field(default="", alias="subResource")
    namespace: str = ""
    name: str = ""  # empty for a claim made from a template: the API server generates it later
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = Field(default=None, alias="oldObject")


class _Review(_Object):
    api_version: Literal["admission.k8s.io/v1"] = Field(alias="apiVersion")
    kind: Literal["AdmissionReview"]
    request: _Request


@dataclass(frozen=True)
class Verdict:
    """The answer to one review; `kind` is ResourceClaim, ResourceClaimTemplate or `OTHER_KIND` (for metrics)."""

    uid: str
    kind: str
    allowed: bool
    code: int = 200
    message: str = ""
    warnings: tuple[str, ...] = ()
    subject: str = ""  # namespace/name, for the log

    @property
    def result(self) -> str:
        return "allowed" if self.allowed else "denied"

    def response(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"uid": self.uid, "allowed": self.allowed}
        if not self.allowed:
            reason = "Invalid" if self.code == 422 else "BadRequest"
            answer["status"] = {"code": self.code, "reason": reason, "message": self.message}
        if self.warnings:
            answer["warnings"] = list(self.warnings)
        return {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "response": answer}


class _MalformedObject(ValueError):
    pass


def review(body: Any, driver: str) -> dict[str, Any]:
    """The AdmissionReview response to `body` (a decoded JSON AdmissionReview request); MalformedReview when
    `body` is no such request."""
    return judge(body, driver).response()


def judge(body: Any, driver: str) -> Verdict:
    """`review` before it becomes JSON: the server also counts and logs the verdict."""
    try:
        request = _Review.model_validate(body).request
    except ValidationError as e:
        why = "; ".join(f"{'.'.join(map(str, err['loc'])) or '<root>'}: {err['msg']}" for err in e.errors())
        raise MalformedReview(f"not an {REVIEW_API_VERSION} AdmissionReview request: {why}") from None
    return replace(_decide(request, driver), subject=f"{request.namespace}/{request.name or '(name to generate)'}")


def _decide(request: _Request, driver: str) -> Verdict:
    gvk = request.kind
    if gvk.group != GROUP or gvk.kind not in SPEC_PATHS:
        return Verdict(request.uid, OTHER_KIND, True)
    if gvk.version not in VERSIONS:  # a future version may move the configs: let it through, but say so
        note = (
            f"{GROUP}/{gvk.version} {gvk.kind}: opaque configs of {driver} not checked (known: {', '.join(VERSIONS)})"
        )
        return Verdict(request.uid, gvk.kind, True, warnings=(note,))
    if request.operation not in ("CREATE", "UPDATE") or request.sub_resource:
        return Verdict(request.uid, gvk.kind, True)
    if request.object is None:
        return Verdict(request.uid, gvk.kind, False, 400, f"{request.operation} {gvk.kind}: the request has no object")
    path = SPEC_PATHS[gvk.kind]
    try:
        field, configs = _configs(request.object, path)
        if request.operation == "UPDATE" and _unchanged(request.old_object, path, configs):
            # the spec is immutable, so this is a metadata update (a finalizer's removal): never block it, even
            # for a claim made before this webhook was installed
            return Verdict(request.uid, gvk.kind, True)
    except _MalformedObject as e:
        return Verdict(request.uid, gvk.kind, False, 400, f"malformed {gvk.kind}: {e}")
    problems = problems_of(configs, field, driver)
    if problems:
        return Verdict(request.uid, gvk.kind, False, 422, "; ".join(problems))
    return Verdict(request.uid, gvk.kind, True)


def problems_of(configs: list[Any], field: str, driver: str) -> list[str]:
    """One line per config entry of `driver` that prepare would refuse, each starting with its field path."""
    problems: list[str] = []
    for i, entry in enumerate(configs):
        at = f"{field}[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{at}: expected an object, got {_json_type(entry)}")
            continue
        opaque = entry.get("opaque")
        if opaque is None:
            continue
        if not isinstance(opaque, dict):
            problems.append(f"{at}.opaque: expected an object, got {_json_type(opaque)}")
            continue
        if opaque.get("driver") != driver:
            continue
        parameters = opaque.get("parameters")
        if not isinstance(parameters, dict):
            problems.append(f"{at}.opaque.parameters: expected an object, got {_json_type(parameters)}")
            continue
        try:
            decode(parameters)
        except ConfigError as e:
            problems.append(f"{at}.opaque.parameters: {e}")
    return problems


def _configs(obj: dict[str, Any], path: tuple[str, ...]) -> tuple[str, list[Any]]:
    """The field path of `<spec>.devices.config` and its entries ([] where a level is absent)."""
    keys = (*path, "devices", "config")
    node: Any = obj
    for depth, key in enumerate(keys):
        if not isinstance(node, dict):
            raise _MalformedObject(f"{'.'.join(keys[:depth])}: expected an object, got {_json_type(node)}")
        node = node.get(key)
        if node is None:
            return ".".join(keys), []
    if not isinstance(node, list):
        raise _MalformedObject(f"{'.'.join(keys)}: expected a list, got {_json_type(node)}")
    return ".".join(keys), node


def _unchanged(old: dict[str, Any] | None, path: tuple[str, ...], configs: list[Any]) -> bool:
    if old is None:
        return False
    try:
        return _configs(old, path)[1] == configs
    except _MalformedObject:
        return False


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
