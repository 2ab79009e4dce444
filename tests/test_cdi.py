"""CDI specs written by the plugin, checked with the official CDI Go library (tools/cdivalidate)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dra_driver.cdi.devnodes import DevNodeError, char_majors, mig_cap_nodes
from dra_driver.cdi.spec import cdi_device_id, minimum_version, spec_file_name
from dra_driver.cdi.store import CdiStore
from tests.plugin_helpers import DRIVER, Node, claim, ref

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def cdivalidate() -> Path:
    out = subprocess.run(
        [str(ROOT / "scripts" / "build-cdi-validator.sh")], capture_output=True, text=True, timeout=900, check=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def _validate(tool: Path, *paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tool), *map(str, paths)], capture_output=True, text=True, timeout=60)


def test_specs_of_whole_gpus_and_mig_devices_pass_the_official_validator(tmp_path: Path, cdivalidate: Path) -> None:
    node = Node(tmp_path)
    claims = [
        claim(["gpu-0", "gpu-1"]),
        claim(["gpu-2-mig-1g10gb-19-6", "gpu-2-mig-3g40gb-9-0"], device_class="mig"),
        claim(["gpu-3-mig-1g10gb-me-20-2"], device_class="mig"),
    ]
    node.add(*claims)
    d = node.driver()
    results = d.prepare([ref(c) for c in claims])
    assert all(r.error == "" for r in results.values()), results
    files = sorted(node.cdi_root.glob("*.json"))
    assert len(files) == 3
    out = _validate(cdivalidate, *files)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(": ok") == 3

    for f in files:  # every claim's spec carries the driver's user-space files, once, at spec level
        spec = json.loads(f.read_text())
        mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
        version = d.inventory.driver_version
        lib = next(p for p in mounts if p.endswith(f"/libcuda.so.{version}")).rsplit("/", 1)[0]
        assert mounts[f"{lib}/libcuda.so.1"] == str(node.sim.driver_root) + f"{lib}/libcuda.so.{version}"
        assert f"{lib}/libnvidia-ml.so.1" in mounts and "/usr/bin/nvidia-smi" in mounts
        assert all("mounts" not in dev["containerEdits"] for dev in spec["devices"])


def test_a_driver_upgrade_under_the_plugin_changes_the_files_of_later_claims(tmp_path: Path) -> None:
    from dra_driver.simulator.driverroot import ensure_driver_root

    node = Node(tmp_path)
    d = node.driver()
    old = d.inventory.driver_version
    ensure_driver_root(node.sim.driver_root, "999.1.2")
    d.refresh_inventory(d.inventory.model_copy(update={"driver_version": "999.1.2"}))
    c = claim(["gpu-0"])
    node.add(c)
    assert d.prepare([ref(c)])[c["metadata"]["uid"]].error == ""
    spec = json.loads(next(node.cdi_root.glob("*.json")).read_text())
    paths = [m["containerPath"] for m in spec["containerEdits"]["mounts"]]
    assert any(p.endswith("libcuda.so.999.1.2") for p in paths)
    assert not any(p.endswith(f"libcuda.so.{old}") for p in paths)


def test_the_validator_rejects_what_runtimes_reject(tmp_path: Path, cdivalidate: Path) -> None:
    node = Node(tmp_path)
    c = claim(["gpu-0"])
    node.add(c)
    node.driver().prepare([ref(c)])
    spec_path = node.cdi_root / spec_file_name(DRIVER, c["metadata"]["uid"])
    good = json.loads(spec_path.read_text())
    cases = {
        "old-version.json": {**good, "cdiVersion": "0.3.0", "devices": [{**good["devices"][0], "name": "0abc-gpu-0"}]},
        "bad-kind.json": {**good, "kind": "no-class"},
        "unknown-field.json": {**good, "surprise": True},
        "empty-edits.json": {**good, "devices": [{"name": "x", "containerEdits": {}}]},
    }
    for name, doc in cases.items():
        (tmp_path / name).write_text(json.dumps(doc))
        assert _validate(cdivalidate, tmp_path / name).returncode == 1, name


def test_naming_and_minimum_version() -> None:
    assert spec_file_name(DRIVER, "1234") == f"k8s.{DRIVER}-claim_1234.json"
    assert cdi_device_id(DRIVER, "1234", "gpu-0") == f"k8s.{DRIVER}/claim=1234-gpu-0"
    from dra_driver.cdi.spec import CdiDevice, ContainerEdits

    def dev(n: str) -> CdiDevice:
        return CdiDevice(name=n, container_edits=ContainerEdits(env=["A=1"]))

    assert minimum_version([dev("abc-gpu-0")]) == "0.3.0"
    assert minimum_version([dev("abc"), dev("9f-gpu-0")]) == "0.5.0"


def test_store_writes_atomically_and_lists_only_its_own_specs(tmp_path: Path) -> None:
    store = CdiStore(tmp_path, DRIVER)
    (tmp_path / "other-vendor.json").write_text("{}")
    from dra_driver.cdi.spec import claim_spec

    store.write("uid-1", claim_spec(DRIVER, "uid-1", {"gpu-0": []}, ["GPU-x"]))
    assert store.claim_uids() == {"uid-1"}
    assert not list(tmp_path.glob(".*.tmp"))
    assert store.remove("uid-1") and not store.remove("uid-1")


def test_device_node_facts_come_from_proc(tmp_path: Path) -> None:
    (tmp_path / "devices").write_text(
        "Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-caps\n\nBlock devices:\n  8 sd\n"
    )
    assert char_majors(tmp_path) == {"mem": 1, "nvidia-frontend": 195, "nvidia-caps": 508}
    with pytest.raises(DevNodeError, match="cannot read MIG capability"):
        mig_cap_nodes(tmp_path, 0, 1, 0)
    gi = tmp_path / "driver/nvidia/capabilities/gpu3/mig/gi3"
    (gi / "ci3").mkdir(parents=True)
    (gi / "access").write_text("DeviceFileMinor: 435\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    (gi / "ci3" / "access").write_text("DeviceFileMinor: 439\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    nodes = mig_cap_nodes(tmp_path, 3, 3, 3)
    assert [(n.path, n.major, n.minor, n.file_mode) for n in nodes] == [
        ("/dev/nvidia-caps/nvidia-cap435", 508, 435, 292),
        ("/dev/nvidia-caps/nvidia-cap439", 508, 439, 292),
    ]
