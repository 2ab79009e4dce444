"""The plugin reading ResourceClaims and DeviceClasses from a real kube-apiserver (replaces the stand-in)."""

from __future__ import annotations

import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dra_driver.plugin.claims import KubeClaimSource
from dra_driver.plugin.driver import Driver, PluginSettings
from dra_driver.plugin.grpc.server import PluginServer
from dra_driver.plugin.types import ClaimRef
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.devices import PublishMode
from tests.kubelet_harness import KubeletHarness
from tests.plugin_helpers import DRIVER, GPU_CLASS, MIG_CLASS, claim, ref
from tests.test_publisher import api_client

NODE = "plugin-api-node"


def test_prepare_with_claims_from_the_api_server(control_plane, tmp_path: Path) -> None:
    for cls in (GPU_CLASS, MIG_CLASS):
        name = f"api-{cls['metadata']['name']}"
        control_plane.apply(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": cls["spec"],
            }
        )
    whole = claim(["gpu-1"], device_class="api-gpu", pool=NODE)
    mig = claim(["gpu-2-mig-1g10gb-19-6"], device_class="api-mig", pool=NODE)
    created = [control_plane.create_allocated(c) for c in (whole, mig)]
    refs = [
        ClaimRef(namespace=c["metadata"]["namespace"], name=c["metadata"]["name"], uid=c["metadata"]["uid"])
        for c in created
    ]
    sim = SimulatedNvml("dgx-h100", tmp_path / "gpu")
    settings = PluginSettings(
        driver=DRIVER,
        pool=NODE,
        plugin_dir=tmp_path / "plugin",
        cdi_root=tmp_path / "cdi",
        mode=PublishMode.PARTITIONABLE,
    )
    source = KubeClaimSource(api_client(control_plane.kubeconfig))
    d = Driver(settings, sim, source, sysfs_root=sim.sysfs_root, proc_root=sim.proc_root, boot_id="b")
    try:
        out = d.prepare(refs)
        assert all(r.error == "" for r in out.values()), out
        assert len(list((tmp_path / "cdi").glob("*.json"))) == 2
        stale = refs[0].model_copy(update={"uid": "00000000-0000-0000-0000-000000000000"})
        assert "got replaced" in d.prepare([stale])[stale.uid].error
        missing = ClaimRef(namespace="default", name="does-not-exist", uid="u")
        assert "retrieve claim default/does-not-exist" in d.prepare([missing])["u"].error
        assert d.unprepare(refs) == {r.uid: None for r in refs}
        assert not list((tmp_path / "cdi").glob("*.json"))
    finally:
        d.close()
        for c in created:
            control_plane.delete("resourceclaim", c["metadata"]["name"], missing_ok=False)


def test_a_stopped_api_server_costs_prepares_their_deadline_and_unprepares_nothing(
    control_plane, tmp_path: Path
) -> None:
    """SIGSTOP on the real kube-apiserver: prepares answer with per-claim errors before the kubelet's deadline, an
    unprepare (no API read) goes through meanwhile, and the retry succeeds once the server is back."""
    cp = control_plane
    gpu_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "api-gpu"}}
    cp.apply({**gpu_class, "spec": GPU_CLASS["spec"]})
    prepared, waiting = (cp.create_allocated(claim([d], device_class="api-gpu", pool=NODE)) for d in ("gpu-3", "gpu-4"))
    sim = SimulatedNvml("dgx-h100", tmp_path / "gpu")
    settings = PluginSettings(driver=DRIVER, pool=NODE, plugin_dir=tmp_path / "plugin", cdi_root=tmp_path / "cdi")
    d = Driver(settings, sim, KubeClaimSource(api_client(cp.kubeconfig), request_timeout=10), sysfs_root=sim.sysfs_root,
               proc_root=sim.proc_root, boot_id="b")  # fmt: skip
    sockets = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # AF_UNIX paths are short
    server = PluginServer(d, DRIVER, sockets / "plugin", sockets / "registry", serialize=False, max_workers=8,
                          grace_period_s=0)  # fmt: skip
    server.start()
    deadline_s = 5.0
    try:
        with KubeletHarness(sockets / "registry", DRIVER) as kubelet, ThreadPoolExecutor(8) as pool:
            kubelet.register()
            assert kubelet.prepare([ref(prepared)])[prepared["metadata"]["uid"]].error == ""
            with cp.apiserver_paused():
                start = time.monotonic()
                calls = [pool.submit(kubelet.prepare, [ref(waiting)], timeout=deadline_s) for _ in range(8)]
                time.sleep(0.5)  # the prepares are reading from the stopped server
                t = time.monotonic()
                assert kubelet.unprepare([ref(prepared)], timeout=2) == {prepared["metadata"]["uid"]: ""}
                assert time.monotonic() - t < 2
                results = [r for f in calls for r in f.result().values()]  # no call failed as a whole
                assert time.monotonic() - start < deadline_s
            assert all(r.error and not r.devices for r in results), results
            assert any("timed out" in r.error.lower() for r in results), [r.error for r in results]
            assert kubelet.prepare([ref(waiting)])[waiting["metadata"]["uid"]].error == ""  # the kubelet's retry
            assert kubelet.unprepare([ref(waiting)]) == {waiting["metadata"]["uid"]: ""}
    finally:
        server.stop(grace=0)
        d.close()
        shutil.rmtree(sockets, ignore_errors=True)
        for c in (prepared, waiting):
            cp.delete("resourceclaim", c["metadata"]["name"], missing_ok=False)
