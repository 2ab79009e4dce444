"""bench/floor_plugin.py, the Python floor of bench/bench_prepare.py (our gRPC servers and API client around the Go
reference plugin's minimal prepare): it registers through our kubelet client, prepares an allocated claim read from a
real API server (one CDI spec file, the CDI ids answered), refuses a replaced claim, unprepares (the file is gone)
and publishes its ResourceSlice of 8 devices, as the Go plugin does."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from dra_driver.plugin.types import ClaimRef
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME as DRIVER
from tests.cluster.controlplane import ControlPlane
from tests.daemon_zygote import die_with_parent
from tests.kubelet_harness import KubeletHarness
from tests.test_publisher import api_client
from tests.test_refplugin import allocated_claims, delete_claims, published_devices, short_registry_dir

ROOT = Path(__file__).resolve().parent.parent


def test_floor_plugin_registers_prepares_and_unprepares(control_plane: ControlPlane, tmp_path: Path) -> None:
    node = "floor-node"
    control_plane.create_node(node)
    api = api_client(control_plane.kubeconfig)
    claims = allocated_claims(api, node, [["gpu-3"]], "floor-test")
    registry = short_registry_dir("floor-test")
    cdi_root = tmp_path / "cdi"
    args = [sys.executable, str(ROOT / "bench" / "floor_plugin.py"), "--node-name", node,
            "--kubeconfig", str(control_plane.kubeconfig), "--plugin-dir", str(tmp_path / "plugin"),
            "--registry-dir", str(registry), "--cdi-root", str(cdi_root)]  # fmt: skip
    proc = subprocess.Popen(args, preexec_fn=die_with_parent)
    try:
        with KubeletHarness(registry, DRIVER) as kubelet:
            info = kubelet.register(timeout=30)
            assert info.name == DRIVER and info.endpoint == str(tmp_path / "plugin" / "dra.sock")
            (claim,) = claims
            prepared = kubelet.prepare([claim])[claim.uid]
            assert prepared.error == ""
            cdi_id = f"k8s.{DRIVER}/claim={claim.uid}-gpu-3"
            assert [(d.device, d.pool, d.cdi_device_ids) for d in prepared.devices] == [("gpu-3", node, [cdi_id])]
            spec_file = cdi_root / f"k8s.{DRIVER}-claim_{claim.uid}.json"
            spec = json.loads(spec_file.read_text())
            assert [d["name"] for d in spec["devices"]] == [f"{claim.uid}-gpu-3"]

            replaced = ClaimRef(namespace=claim.namespace, name=claim.name, uid=str(uuid.uuid4()))
            assert "replaced" in kubelet.prepare([replaced])[replaced.uid].error

            assert kubelet.unprepare([claim]) == {claim.uid: ""}
            assert not spec_file.exists()
            deadline = time.monotonic() + 15
            while published_devices(api, node) != 8 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert published_devices(api, node) == 8
    finally:
        proc.terminate()
        proc.wait(20)
        shutil.rmtree(registry, ignore_errors=True)
        delete_claims(api, claims)
        control_plane.kubectl("delete", "resourceslices", "--field-selector", f"spec.nodeName={node}", check=False)
        control_plane.delete_node(node)
