"""tools/refplugin, the Go reference DRA kubelet plugin (k8s.io/dynamic-resource-allocation/kubeletplugin) that
bench/bench_prepare.py measures ours against: it builds, registers through our kubelet client, prepares an allocated
claim read from a real API server (one CDI spec file, the CDI ids answered), refuses a replaced claim, unprepares
(the file is gone) and publishes its fixed ResourceSlice. The helpers are bench_prepare.py's too.
Skipped without Go unless DRA_K8S_REQUIRE=1.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver.plugin.types import ClaimRef
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME as DRIVER
from tests.cluster.controlplane import ControlPlane
from tests.kubelet_harness import KubeletHarness
from tests.processes import die_with_parent, stop
from tests.test_allocbench import _build
from tests.test_publisher import api_client

NS = "default"
STOP_TIMEOUT_S = 10.0


def build_refplugin() -> Path:
    return _build("build-refplugin.sh")


def short_registry_dir(tag: str) -> Path:
    """AF_UNIX paths are short: registry directories live under /tmp, not under a (long) test directory."""
    path = Path(f"/tmp/dra-{tag}-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    path.mkdir(parents=True)
    return path


class RefPlugin:
    """The reference plugin as a process, with the Python daemon's socket layout under `root`."""

    def __init__(self, binary: Path, root: Path, kubeconfig: Path, node: str, *extra: str) -> None:
        self.root = root
        self.plugin_dir = root / "plugin"
        self.cdi_root = root / "cdi"
        self.registry_dir = short_registry_dir("ref")
        self.log = root / "refplugin.log"
        self.args = [str(binary), f"--driver={DRIVER}", f"--node-name={node}", f"--kubeconfig={kubeconfig}",
                     f"--plugin-dir={self.plugin_dir}", f"--registry-dir={self.registry_dir}",
                     f"--cdi-root={self.cdi_root}", *extra]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start the process; returns time.monotonic() of the start."""
        self.root.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        return t0

    def stop(self) -> None:
        if self.proc is None:
            return
        stop(self.proc, STOP_TIMEOUT_S)
        self.proc = None
        for sock in self.registry_dir.glob("*"):
            sock.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.registry_dir.rmdir()


def allocated_claims(
    api: Any,
    node: str,
    devices: Sequence[Sequence[str]],
    prefix: str,
    *,
    driver: str = DRIVER,
    device_class: str = "bench.dra-driver.dev",
) -> list[ClaimRef]:
    """One claim per entry, allocated on `node` (pool = node) to those devices of `driver`; status written directly
    (no scheduler), as the kubelet would find it."""
    from kubernetes import client

    objects = client.CustomObjectsApi(api)
    refs: list[ClaimRef] = []
    for i, names in enumerate(devices):
        name = f"{prefix}-{i}"
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [
                {"name": f"r{k}", "exactly": {"deviceClassName": device_class}} for k in range(len(names))]}},
        }  # fmt: skip
        created = objects.create_namespaced_custom_object("resource.k8s.io", "v1", NS, "resourceclaims", body)
        results = [{"request": f"r{k}", "driver": driver, "pool": node, "device": d} for k, d in enumerate(names)]
        created["status"] = {"allocation": {"devices": {"results": results}}}
        objects.replace_namespaced_custom_object_status("resource.k8s.io", "v1", NS, "resourceclaims", name, created)
        refs.append(ClaimRef(namespace=NS, name=name, uid=created["metadata"]["uid"]))
    return refs


def delete_claims(api: Any, refs: Sequence[ClaimRef]) -> None:
    from kubernetes import client

    objects = client.CustomObjectsApi(api)
    for ref in refs:
        with contextlib.suppress(client.ApiException):
            objects.delete_namespaced_custom_object("resource.k8s.io", "v1", ref.namespace, "resourceclaims", ref.name)


def published_devices(api: Any, node: str) -> int:
    from kubernetes import client

    items = client.CustomObjectsApi(api).list_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.nodeName={node}"
    )["items"]
    return sum(len(s["spec"].get("devices") or []) for s in items if s["spec"]["driver"] == DRIVER)


@contextlib.contextmanager
def running(plugin: RefPlugin) -> Iterator[RefPlugin]:
    plugin.start()
    try:
        yield plugin
    finally:
        plugin.stop()


def check_minimal_plugin(
    kubelet: KubeletHarness,
    api: Any,
    node: str,
    claim: ClaimRef,
    plugin_dir: Path,
    cdi_root: Path,
    devices: int,
    refuses_replaced: Callable[[ClaimRef], None],
) -> None:
    """What bench_prepare.py's two minimal plugins (Go's, and the Python floor) must do: register, prepare `claim`
    (allocated gpu-3: one CDI spec file, its CDI id answered), refuse a replaced claim (`refuses_replaced` asserts
    how), unprepare (the file is gone), and publish `devices` devices."""
    info = kubelet.register(timeout=30)
    assert info.name == DRIVER and info.endpoint == str(plugin_dir / "dra.sock")
    prepared = kubelet.prepare([claim])[claim.uid]
    assert prepared.error == ""
    cdi_id = f"k8s.{DRIVER}/claim={claim.uid}-gpu-3"
    assert [(d.device, d.pool, d.cdi_device_ids) for d in prepared.devices] == [("gpu-3", node, [cdi_id])]
    spec_file = cdi_root / f"k8s.{DRIVER}-claim_{claim.uid}.json"
    spec = json.loads(spec_file.read_text())
    assert [d["name"] for d in spec["devices"]] == [f"{claim.uid}-gpu-3"]

    refuses_replaced(ClaimRef(namespace=claim.namespace, name=claim.name, uid=str(uuid.uuid4())))

    assert kubelet.unprepare([claim]) == {claim.uid: ""}
    assert not spec_file.exists()
    deadline = time.monotonic() + 15
    while published_devices(api, node) != devices and time.monotonic() < deadline:
        time.sleep(0.1)
    assert published_devices(api, node) == devices


def test_refplugin_registers_prepares_and_unprepares(control_plane: ControlPlane, tmp_path: Path) -> None:
    binary = build_refplugin()
    node = "refplugin-node"
    control_plane.create_node(node)
    api = api_client(control_plane.kubeconfig)
    claims = allocated_claims(api, node, [["gpu-3"]], "refplugin-test")
    plugin = RefPlugin(binary, tmp_path, control_plane.kubeconfig, node, "--devices=4")

    def refuses(replaced: ClaimRef) -> None:
        with pytest.raises(grpc.RpcError, match="got replaced"):  # the helper fails the whole call
            kubelet.prepare([replaced])

    try:
        with running(plugin), KubeletHarness(plugin.registry_dir, DRIVER) as kubelet:
            check_minimal_plugin(kubelet, api, node, claims[0], plugin.plugin_dir, plugin.cdi_root, 4, refuses)
    finally:
        delete_claims(api, claims)
        control_plane.delete("resourceslices", wait=120, field_selector=f"spec.nodeName={node}", check=False)
        control_plane.delete_node(node)
