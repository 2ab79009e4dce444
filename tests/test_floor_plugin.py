"""bench/floor_plugin.py, the Python floor of bench/bench_prepare.py (our gRPC servers and API client around the Go
reference plugin's minimal prepare): it registers through our kubelet client, prepares an allocated claim read from a
real API server (one CDI spec file, the CDI ids answered), refuses a replaced claim, unprepares (the file is gone)
and publishes its ResourceSlice of 8 devices, as the Go plugin does (tests/test_refplugin.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from dra_driver.plugin.types import ClaimRef
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME as DRIVER
from tests.cluster.controlplane import ControlPlane
from tests.kubelet_harness import KubeletHarness
from tests.processes import die_with_parent, stop
from tests.test_publisher import api_client
from tests.test_refplugin import allocated_claims, check_minimal_plugin, delete_claims, short_registry_dir

ROOT = Path(__file__).resolve().parent.parent


def test_floor_plugin_registers_prepares_and_unprepares(control_plane: ControlPlane, tmp_path: Path) -> None:
    node = "floor-node"
    control_plane.create_node(node)
    api = api_client(control_plane.kubeconfig)
    claims = allocated_claims(api, node, [["gpu-3"]], "floor-test")
    registry = short_registry_dir("floor-test")
    plugin_dir, cdi_root = tmp_path / "plugin", tmp_path / "cdi"
    args = [sys.executable, str(ROOT / "bench" / "floor_plugin.py"), "--node-name", node,
            "--kubeconfig", str(control_plane.kubeconfig), "--plugin-dir", str(plugin_dir),
            "--registry-dir", str(registry), "--cdi-root", str(cdi_root)]  # fmt: skip
    proc = subprocess.Popen(args, preexec_fn=die_with_parent)

    def refuses(replaced: ClaimRef) -> None:  # a per-claim error, as our daemon answers it
        assert "replaced" in kubelet.prepare([replaced])[replaced.uid].error

    try:
        with KubeletHarness(registry, DRIVER) as kubelet:
            check_minimal_plugin(kubelet, api, node, claims[0], plugin_dir, cdi_root, 8, refuses)
    finally:
        stop(proc, 20)
        shutil.rmtree(registry, ignore_errors=True)
        delete_claims(api, claims)
        control_plane.delete("resourceslices", wait=120, field_selector=f"spec.nodeName={node}", check=False)
        control_plane.delete_node(node)
