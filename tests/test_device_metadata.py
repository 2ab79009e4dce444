"""Device metadata (KEP-5304) against upstream: the files prepare writes are read by k8s.io/dynamic-resource-
allocation v0.37.2's own decoder (devicemetadata.DecodeMetadataFromStream, through tools/metadatadecode), which must
find what we meant in every version of the stream (v1beta1, and v1alpha1 alone as a 1.36 consumer reads it), pass
upstream's validation, and re-encode to the same bytes as upstream's kubelet plugin helper writes. Also: the claim's
CDI spec mounts each request's file at api/metadata's container path, unprepare, a failed prepare and recovery
remove them, and nothing is written with the DeviceMetadata gate off (its default, as upstream's helper)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dra_driver.cdi.store import CdiStore
from dra_driver.plugin import features
from dra_driver.plugin.driver import Driver
from tests.gotools import built_binary
from tests.plugin_helpers import DRIVER, NODE, Node, claim, ref

ON = {**features.DEFAULTS, "DeviceMetadata": True}
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"  # api/metadata.ContainerDir
V1BETA1 = "metadata.resource.k8s.io/v1beta1"
V1ALPHA1 = "metadata.resource.k8s.io/v1alpha1"


@pytest.fixture(scope="module")
def decoder() -> Path:
    """tools/metadatadecode, built (cached) by scripts/build-metadatadecode.sh; skips without Go unless
    DRA_K8S_REQUIRE=1."""
    return built_binary("build-metadatadecode.sh", "tools/metadatadecode")


def upstream(decoder: Path, path: Path) -> dict[str, Any]:
    out = subprocess.run([decoder, path], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def published(d: Driver, device: str) -> dict[str, Any]:
    attributes: dict[str, Any] = json.loads(d.catalog[device].device_json)["attributes"]
    return attributes


def expected(c: dict[str, Any], request: str, devices: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """What we mean, as upstream's v1beta1 Go types encode it."""
    m = c["metadata"]
    doc: dict[str, Any] = {
        "kind": "DeviceMetadata",
        "apiVersion": V1BETA1,
        "metadata": {"name": m["name"], "namespace": m["namespace"], "uid": m["uid"], "generation": 1},
    }
    pod_claim_name = (m.get("annotations") or {}).get("resource.kubernetes.io/pod-claim-name")
    if pod_claim_name:
        doc["podClaimName"] = pod_claim_name
    doc["requests"] = [
        {
            "name": request,
            "devices": [{"driver": DRIVER, "pool": NODE, "name": n, "attributes": a} for n, a in devices],
        }
    ]
    return doc


def metadata_file(node: Node, c: dict[str, Any], request: str) -> Path:
    m = c["metadata"]
    return (
        node.plugin_dir / "dra-device-metadata" / f"{m['namespace']}_{m['name']}_{m['uid']}" / request / "metadata.json"
    )


def spec_mounts(node: Node, c: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """CDI device name -> its own mounts, in the claim's spec."""
    spec = json.loads(CdiStore(node.cdi_root, DRIVER).path(c["metadata"]["uid"]).read_text())
    return {dev["name"]: dev["containerEdits"].get("mounts", []) for dev in spec["devices"]}


def check_upstream_reads(decoder: Path, path: Path, want: dict[str, Any]) -> None:
    got = upstream(decoder, path)
    assert got["gvk"] == f"{V1BETA1}, Kind=DeviceMetadata"  # the newest first: what a 1.37 consumer uses
    assert got["decoded"] == want
    assert got["validation"] == ""
    # each version alone, as a consumer that knows only that one reads it (1.36's knows v1alpha1)
    assert [o["gvk"] for o in got["objects"]] == [f"{V1BETA1}, Kind=DeviceMetadata", f"{V1ALPHA1}, Kind=DeviceMetadata"]
    for o in got["objects"]:
        assert o["decoded"] == want and o["validation"] == ""
    assert got["reencoded"] == path.read_text()  # upstream's writer makes the same bytes


def test_a_whole_gpu_claim_is_read_by_upstreams_decoder_and_mounted(decoder: Path, tmp_path: Path) -> None:
    node = Node(tmp_path)
    c = claim(["gpu-1"], name="whole")
    node.add(c)
    d = node.driver(feature_gates=ON)
    assert d.prepare([ref(c)])[ref(c).uid].error == ""
    attributes = published(d, "gpu-1")
    assert "resource.kubernetes.io/pciBusID" in attributes and "uuid" in attributes
    path = metadata_file(node, c, "r0")
    check_upstream_reads(decoder, path, expected(c, "r0", [("gpu-1", attributes)]))
    mounts = spec_mounts(node, c)[f"{c['metadata']['uid']}-gpu-1"]
    assert mounts == [
        {
            "hostPath": str(path),
            "containerPath": f"{CONTAINER_DIR}/resourceclaims/whole/r0/{DRIVER}-metadata.json",
            "options": ["ro", "bind"],
        }
    ]
    assert path.stat().st_mode & 0o777 == 0o644
    assert d.unprepare([ref(c)]) == {ref(c).uid: None}
    assert not (node.plugin_dir / "dra-device-metadata").exists() or not any(
        (node.plugin_dir / "dra-device-metadata").iterdir()
    )


def test_a_carved_mig_device_from_a_template_carries_its_uuid(decoder: Path, tmp_path: Path) -> None:
    """A partition carved at prepare: its UUID, which no slice can publish, is added to what the slice has; the
    claim comes from a template, so the container path is keyed by the pod's claim name."""
    node = Node(tmp_path)
    device = "gpu-0-mig-1g10gb-19-0"
    c = claim([device], name="pod-abc-gpu-x7k2p", device_class="mig")
    c["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    node.add(c)
    d = node.driver(feature_gates=ON)
    assert d.prepare([ref(c)])[ref(c).uid].error == ""
    mig = d.checkpoint.claims[ref(c).uid].devices[0].mig
    assert mig is not None
    attributes = published(d, device)
    assert "uuid" not in attributes
    attributes["uuid"] = {"string": mig.uuid}
    path = metadata_file(node, c, "r0")
    check_upstream_reads(decoder, path, expected(c, "r0", [(device, attributes)]))
    (mount,) = spec_mounts(node, c)[f"{c['metadata']['uid']}-{device}"]
    assert mount["containerPath"] == f"{CONTAINER_DIR}/resourceclaimtemplates/gpu/r0/{DRIVER}-metadata.json"
    assert d.unprepare([ref(c)]) == {ref(c).uid: None}
    assert not path.parent.parent.exists()


def test_two_devices_of_one_request_and_a_subrequest(decoder: Path, tmp_path: Path) -> None:
    """One request with two GPUs: one file listing both, mounted once (by the first device); a firstAvailable
    subrequest: its file is the request's, its content names the subrequest, as upstream's."""
    node = Node(tmp_path)
    c = claim(["gpu-2", "gpu-3", "gpu-4"], name="three")
    c["spec"]["devices"]["requests"] = [
        {"name": "gpus", "exactly": {"deviceClassName": "gpu", "count": 2}},
        {"name": "one", "firstAvailable": [{"name": "any", "deviceClassName": "gpu"}]},
    ]
    results = c["status"]["allocation"]["devices"]["results"]
    for result, request in zip(results, ["gpus", "gpus", "one/any"], strict=True):
        result["request"] = request
    node.add(c)
    d = node.driver(feature_gates=ON)
    assert d.prepare([ref(c)])[ref(c).uid].error == ""
    pair = metadata_file(node, c, "gpus")
    want = expected(c, "gpus", [("gpu-2", published(d, "gpu-2")), ("gpu-3", published(d, "gpu-3"))])
    check_upstream_reads(decoder, pair, want)
    sub = metadata_file(node, c, "one")
    check_upstream_reads(decoder, sub, expected(c, "one/any", [("gpu-4", published(d, "gpu-4"))]))
    uid = c["metadata"]["uid"]
    mounts = spec_mounts(node, c)
    assert [m["containerPath"] for m in mounts[f"{uid}-gpu-2"]] == [
        f"{CONTAINER_DIR}/resourceclaims/three/gpus/{DRIVER}-metadata.json"
    ]
    assert mounts[f"{uid}-gpu-3"] == []
    assert [m["containerPath"] for m in mounts[f"{uid}-gpu-4"]] == [
        f"{CONTAINER_DIR}/resourceclaims/three/one/{DRIVER}-metadata.json"
    ]
    again = d.prepare([ref(c)])[ref(c).uid]  # idempotent: same answer, files kept
    assert again.error == "" and pair.exists()


def test_off_by_default_nothing_is_written_or_mounted(tmp_path: Path) -> None:
    node = Node(tmp_path)
    c = claim(["gpu-1"])
    node.add(c)
    d = node.driver()
    assert features.DEFAULTS["DeviceMetadata"] is False
    assert d.prepare([ref(c)])[ref(c).uid].error == ""
    assert not (node.plugin_dir / "dra-device-metadata").exists()
    assert all(m == [] for m in spec_mounts(node, c).values())


def test_a_failed_prepare_removes_the_files_it_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path)
    c = claim(["gpu-1"])
    node.add(c)
    d = node.driver(feature_gates=ON)

    def full(self: CdiStore, claim_uid: str, spec: Any) -> Path:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(CdiStore, "write", full)
        assert "No space left" in d.prepare([ref(c)])[ref(c).uid].error
    assert not metadata_file(node, c, "r0").parent.parent.exists()
    assert d.checkpoint.claims == {}


def test_recovery_removes_metadata_no_claim_owns(tmp_path: Path) -> None:
    """Another boot's claims: the checkpoint is forgotten, the plugin directory (and its metadata) is not."""
    node = Node(tmp_path)
    c = claim(["gpu-1"])
    node.add(c)
    d = node.driver(feature_gates=ON)
    assert d.prepare([ref(c)])[ref(c).uid].error == ""
    assert metadata_file(node, c, "r0").exists()
    d.close()
    node.driver(boot_id="boot-2", feature_gates=ON)
    assert not metadata_file(node, c, "r0").parent.parent.exists()
