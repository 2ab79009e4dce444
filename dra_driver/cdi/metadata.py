"""Device metadata (KEP-5304): per claim request, a file with each allocated device's attributes, bind-mounted
read-only into the containers that get the request's devices, as k8s.io/dynamic-resource-allocation v0.37.2's
kubelet plugin helper writes it (kubeletplugin/metadata.go) and its `devicemetadata` package reads it.

- In the container:
  /var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json,
  or .../resourceclaimtemplates/<pod claim name>/<request>/... for a claim made from a template (its
  `resource.kubernetes.io/pod-claim-name` annotation): api/metadata's layout, which consumers build from the pod spec.
- On the host: <plugin dir>/dra-device-metadata/<namespace>_<name>_<uid>/<request>/metadata.json. Upstream's
  directory has no uid; ours has it so that a claim recreated under the same name never shares files with its
  predecessor, and orphans are found by uid as CDI specs are.
- The file: the same DeviceMetadata object encoded once per version, newest first (v1beta1, then v1alpha1 for
  consumers built against 1.36), each as the scheme's pretty JSON serializer writes it followed by a newline: the
  bytes upstream's writer makes (tests/test_device_metadata.py compares them through tools/metadatadecode).

Written atomically (a temp name, then a rename): a container never mounts half a file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from dra_driver.files import replace_file

GROUP = "metadata.resource.k8s.io"
VERSIONS = ("v1beta1", "v1alpha1")  # newest first; upstream requires the newest, older ones keep older readers
KIND = "DeviceMetadata"
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
CLAIMS_SUBDIR = "resourceclaims"
TEMPLATES_SUBDIR = "resourceclaimtemplates"
FILE_SUFFIX = "-metadata.json"
HOST_SUBDIR = "dra-device-metadata"
HOST_FILE = "metadata.json"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
MAX_ATTRIBUTES = 32  # upstream's validation (+k8s:maxProperties=32)


class DeviceDoc(TypedDict):
    driver: str
    pool: str
    name: str
    attributes: NotRequired[dict[str, dict[str, Any]]]


class RequestDoc(TypedDict):
    name: str
    devices: NotRequired[list[DeviceDoc]]


class ObjectMetaDoc(TypedDict):
    name: str
    namespace: str
    uid: str
    generation: int


# Go's field order (the JSON keys of a versioned DeviceMetadata, TypeMeta first): the bytes must match upstream's.
class DeviceMetadataDoc(TypedDict):
    kind: str
    apiVersion: str
    metadata: ObjectMetaDoc
    podClaimName: NotRequired[str]
    requests: list[RequestDoc]


@dataclass(frozen=True)
class ClaimInfo:
    namespace: str
    name: str
    uid: str
    pod_claim_name: str | None  # set for a claim made from a ResourceClaimTemplate


@dataclass(frozen=True)
class MetadataDevice:
    pool: str
    name: str
    attributes: Mapping[str, Mapping[str, Any]]  # as in the ResourceSlice: name -> {"string": ...} etc.


def base_request(request: str) -> str:
    """The request of a `<request>/<subrequest>` result (firstAvailable): the file is per request."""
    return request.split("/", 1)[0]


def document(
    driver: str, claim: ClaimInfo, request: str, devices: Sequence[MetadataDevice], version: str, generation: int = 1
) -> DeviceMetadataDoc:
    """One request's metadata in `version` (v1alpha1 and v1beta1 have the same fields). `request` keeps its
    subrequest, as upstream records it."""
    docs: list[DeviceDoc] = []
    for d in devices:
        doc: DeviceDoc = {"driver": driver, "pool": d.pool, "name": d.name}
        if d.attributes:
            doc["attributes"] = {k: dict(v) for k, v in sorted(d.attributes.items())}  # Go sorts map keys
        docs.append(doc)
    req: RequestDoc = {"name": request}
    if docs:
        req["devices"] = docs
    meta: ObjectMetaDoc = {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid, "generation": generation}
    if claim.pod_claim_name:  # Go's order: podClaimName between metadata and requests
        return {
            "kind": KIND,
            "apiVersion": f"{GROUP}/{version}",
            "metadata": meta,
            "podClaimName": claim.pod_claim_name,
            "requests": [req],
        }
    return {"kind": KIND, "apiVersion": f"{GROUP}/{version}", "metadata": meta, "requests": [req]}


def _go_json(value: object) -> str:
    """encoding/json's output through json.Indent with two spaces: HTML characters and U+2028/9 escaped."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def encode_stream(
    driver: str, claim: ClaimInfo, request: str, devices: Sequence[MetadataDevice], versions: Sequence[str] = VERSIONS
) -> bytes:
    """The file's content: the object once per version, in `versions`' order, each followed by a newline."""
    return b"".join((_go_json(document(driver, claim, request, devices, v)) + "\n").encode() for v in versions)


def container_path(driver: str, claim: ClaimInfo, request: str) -> str:
    """Where the container sees a request's file (api/metadata's ResourceClaimFilePath and
    ResourceClaimTemplateFilePath)."""
    req = base_request(request)
    if claim.pod_claim_name:
        return f"{CONTAINER_DIR}/{TEMPLATES_SUBDIR}/{claim.pod_claim_name}/{req}/{driver}{FILE_SUFFIX}"
    return f"{CONTAINER_DIR}/{CLAIMS_SUBDIR}/{claim.name}/{req}/{driver}{FILE_SUFFIX}"


class MetadataStore:
    """The metadata files of this node's claims under `<plugin dir>/dra-device-metadata`."""

    def __init__(self, plugin_dir: Path, driver: str) -> None:
        self.root = plugin_dir / HOST_SUBDIR
        self.driver = driver

    def claim_dir(self, namespace: str, name: str, uid: str) -> Path:
        return self.root / f"{namespace}_{name}_{uid}"  # none of the three contains "_"

    def file(self, namespace: str, name: str, uid: str, request: str) -> Path:
        return self.claim_dir(namespace, name, uid) / base_request(request) / HOST_FILE

    def write(self, claim: ClaimInfo, requests: Mapping[str, Sequence[MetadataDevice]]) -> dict[str, Path]:
        """A file per request (`requests`: request as allocated -> its devices); returns each request's host path."""
        paths: dict[str, Path] = {}
        for request, devices in requests.items():
            final = self.file(claim.namespace, claim.name, claim.uid, request)
            tmp = final.with_name(f".{HOST_FILE}.tmp")
            # 0644: read by the container's user, whoever it is
            replace_file(final, tmp, encode_stream(self.driver, claim, request, devices), 0o644)
            paths[request] = final
        return paths

    def exists(self, namespace: str, name: str, uid: str) -> bool:
        return self.claim_dir(namespace, name, uid).is_dir()

    def remove(self, namespace: str, name: str, uid: str) -> bool:
        """The claim's directory, with whatever an interrupted write left in it."""
        path = self.claim_dir(namespace, name, uid)
        if not os.path.lexists(path):
            return False
        with contextlib.suppress(FileNotFoundError):  # removed meanwhile: done all the same
            shutil.rmtree(path)
        return True

    def claim_uids(self) -> dict[str, Path]:
        """uid -> directory, for every claim that has metadata here."""
        if not self.root.is_dir():
            return {}
        return {p.name.rsplit("_", 1)[-1]: p for p in self.root.iterdir() if p.is_dir() and "_" in p.name}


__all__ = [
    "ClaimInfo",
    "MetadataDevice",
    "MetadataStore",
    "container_path",
    "document",
    "encode_stream",
]
