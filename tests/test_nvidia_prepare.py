"""NVIDIA's own DRA driver (gpu-kubelet-plugin v0.5.0, built from its Go module; tests/nvidia_driver.py) prepares and
unprepares claims on a simulated DGX H100 through the kubelet's gRPC (dra_driver.plugin.grpc.kubelet plays the
kubelet over its real sockets), against a real kube-apiserver: a whole GPU with its default gates, and a MIG
partition carved on demand under its DynamicMIG gate. The claims are created allocated (status written, no scheduler).

To prepare, it needs what the kernel driver gives a real node: the device nodes under its dev root (the driver root's
`dev/`, made with mknod) and, for MIG, the simulated `/proc/driver` and the driver's majors in `/proc/devices`, in a
private mount namespace around the plugin (NvidiaKubeletPlugin(node_files=True)); root only.

Checked: the CDI device ids prepare returns, the CDI spec it writes (the device nodes: a GPU's own, the control and
UVM nodes, and for a MIG device its parent's node plus the two capability nodes whose minors the simulated /proc
gives its GPU and compute instance; its environment), that the MIG device exists in the simulator (SimulatedNvml on
the same state) at the placement the claim names while prepared and is gone after unprepare, and that the plugin
logs no warning. `nvidia_claim_edits` records the spec NVIDIA writes for each case, normalized (driver root and claim
UID replaced), for comparisons with ours and with a real node.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_driver.cdi.devnodes import char_majors, gpu_nodes, mig_cap_nodes
from dra_driver.nvml.discovery import discover
from dra_driver.plugin.grpc.kubelet import KubeletHarness
from dra_driver.plugin.types import ClaimRef
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.naming import gpu_device_name, mig_device_name
from tests.cluster.controlplane import ControlPlane
from tests.libnvml_support import REQUIRE
from tests.nvidia_driver import (
    CDI_VENDOR,
    DRIVER,
    MODESET,
    NvidiaKubeletPlugin,
    claim_spec_edits,
    machine_device_nodes,
    node_proc_devices,
)
from tests.test_publisher import api_client
from tests.test_refplugin import allocated_claims, delete_claims

NODE = "nvidia-prepare-node"
MACHINE = "dgx-h100"
DEVICE_CLASS = "gpu.nvidia.com"  # the class NVIDIA's chart installs; the API server does not check it exists
DYNAMIC_MIG = {"DynamicMIG": True}
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 and not REQUIRE, reason="the device nodes need mknod, /proc/driver a mount namespace (root)"
)


@dataclass
class Node:
    cp: ControlPlane
    sim: SimulatedNvml
    plugin: NvidiaKubeletPlugin
    kubelet: KubeletHarness
    api: Any
    slices: list[dict[str, Any]]

    def claim(self, device: str, name: str) -> ClaimRef:
        (ref,) = allocated_claims(self.api, NODE, [[device]], name, driver=DRIVER, device_class=DEVICE_CLASS)
        return ref

    def published(self) -> dict[str, dict[str, Any]]:
        return {d["name"]: d for s in self.slices for d in s["spec"].get("devices") or []}


@contextlib.contextmanager
def nvidia_node(cp: ControlPlane, work: Path, gates: Mapping[str, bool] | None = None) -> Iterator[Node]:
    """NVIDIA's plugin on a simulated machine, its pool published and registered with the kubelet stand-in."""
    sim = SimulatedNvml(MACHINE, work / "machine")
    cp.create_node(NODE)
    try:
        with (
            NvidiaKubeletPlugin(cp, sim, NODE, work / "plugin", feature_gates=gates, node_files=True) as plugin,
            KubeletHarness(plugin.registry_dir, DRIVER) as kubelet,
        ):
            slices = plugin.wait_published()
            kubelet.register()
            yield Node(cp, sim, plugin, kubelet, api_client(cp.kubeconfig), slices)
    finally:
        cp.delete_node(NODE)


def nvidia_claim_edits(plugin: NvidiaKubeletPlugin, sim: SimulatedNvml, claim_uid: str) -> dict[str, Any]:
    """The container edits of the CDI spec NVIDIA's plugin wrote for a prepared claim (claim_spec_edits), with the
    simulated driver root written `<driver root>` and the claim's UID `<claim>`: what a comparison with our spec, or
    with the spec NVIDIA writes on a real node, reads."""
    edits = claim_spec_edits(plugin.claim_spec(claim_uid))
    return _normalized(edits, {str(sim.driver_root): "<driver root>", claim_uid: "<claim>"})


def _normalized(value: Any, replace: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        for old, new in replace.items():
            value = value.replace(old, new)
        return value
    if isinstance(value, list):
        return [_normalized(v, replace) for v in value]
    if isinstance(value, dict):
        return {_normalized(k, replace): _normalized(v, replace) for k, v in value.items()}
    return value


def _nodes(edits: Mapping[str, Any]) -> set[tuple[str, int, int]]:
    return {(n["path"], n.get("major", 0), n.get("minor", 0)) for n in edits.get("deviceNodes") or []}


def _env(edits: Mapping[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in edits.get("env") or [])


def test_node_files_are_the_simulated_machines(tmp_path: Path) -> None:
    """The device nodes and /proc/devices given to NVIDIA's plugin say what the simulated /proc says (no root)."""
    sim = SimulatedNvml(MACHINE, tmp_path / "machine")
    nodes = {n.path: n for n in machine_device_nodes(sim)}
    for minor in range(8):
        assert all(nodes[n.path] == n for n in gpu_nodes(sim.proc_root, minor))
    caps = [n for n in nodes.values() if n.path.startswith("/dev/nvidia-caps/")]
    assert len(caps) == 2 + 8 * 15 * 9  # config, monitor, then 15 GPU instances x (1 + 8 compute instances) per GPU
    assert nodes[MODESET.path] == MODESET
    text = node_proc_devices(sim)
    assert "\nBlock devices:" in text  # NVIDIA's parser (internal/common/nvcaps.go) wants the section after
    assert char_majors_of(text) == {**char_majors_of(Path("/proc/devices").read_text()), **char_majors(sim.proc_root)}


def char_majors_of(text: str) -> dict[str, int]:
    lines = (line.split() for line in text.split("Block devices:")[0].splitlines())
    return {p[1]: int(p[0]) for p in lines if len(p) == 2 and p[0].isdigit()}


@needs_root
def test_nvidia_prepares_and_unprepares_a_whole_gpu(control_plane: ControlPlane, tmp_path: Path) -> None:
    with nvidia_node(control_plane, tmp_path) as node:
        device = gpu_device_name(2)
        assert device in node.published()
        claim = node.claim(device, "nvidia-whole")
        try:
            answer = node.kubelet.prepare([claim])[claim.uid]
            assert answer.error == ""
            (prepared,) = answer.devices
            cdi_id = f"{CDI_VENDOR}/claim={claim.uid}-{device}"
            assert (prepared.pool, prepared.device, prepared.cdi_device_ids) == (NODE, device, [cdi_id])
            spec = node.plugin.claim_spec(claim.uid)
            assert spec["kind"] == f"{CDI_VENDOR}/claim"
            edits = nvidia_claim_edits(node.plugin, node.sim, claim.uid)
            (name,) = edits["devices"]
            assert name == f"<claim>-{device}"
            own, common = edits["devices"][name], edits["common"]
            # The GPU's own node in its device's edits; nvidiactl, the UVM nodes and nvidia-modeset for every
            # device (the spec-wide edits): together the nodes our claim spec gives the GPU, and nvidia-modeset.
            expected = {(n.path, n.major, n.minor) for n in gpu_nodes(node.sim.proc_root, 2)}
            assert _nodes(own) == {("/dev/nvidia2", 195, 2)}
            assert _nodes(own) | _nodes(common) == expected | {(MODESET.path, MODESET.major, MODESET.minor)}
            assert all(n["hostPath"] == "<driver root>" + n["path"] for n in own["deviceNodes"])
            assert _env(common).get("NVIDIA_VISIBLE_DEVICES") == "void"
            assert "NVIDIA_VISIBLE_DEVICES" not in _env(own)
            assert common.get("mounts")  # the driver's libraries and binaries
            unprepared = node.kubelet.unprepare([claim])
            assert unprepared == {claim.uid: ""}
            assert not node.plugin.claim_spec_path(claim.uid).exists()
        finally:
            delete_claims(node.api, [claim])
        assert node.plugin.alive() and node.plugin.warnings() == []


@needs_root
def test_nvidia_carves_a_mig_partition_on_demand_and_destroys_it_at_unprepare(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    with nvidia_node(control_plane, tmp_path, DYNAMIC_MIG) as node:
        gpu, start = 1, 3
        device = mig_device_name(gpu, "1g.10gb", 19, start)
        assert device in node.published()
        claim = node.claim(device, "nvidia-mig")
        try:
            answer = node.kubelet.prepare([claim])[claim.uid]
            assert answer.error == ""
            (prepared,) = answer.devices
            assert prepared.device == device
            assert prepared.cdi_device_ids == [f"{CDI_VENDOR}/claim={claim.uid}-{device}"]
            # The simulator shows the GPU instance NVIDIA created, at the placement the claim names.
            inventory = discover(node.sim, node.sim.sysfs_root)
            parent = next(g for g in inventory.gpus if g.minor == gpu)
            assert parent.mig_enabled
            (mig,) = parent.mig_instances
            assert (mig.profile_name, mig.profile_id, mig.placement.start) == ("1g.10gb", 19, start)
            assert all(not g.mig_instances for g in inventory.gpus if g.minor != gpu)
            edits = nvidia_claim_edits(node.plugin, node.sim, claim.uid)
            (name,) = edits["devices"]
            assert name == f"<claim>-{device}"
            own, common = edits["devices"][name], edits["common"]
            caps = mig_cap_nodes(node.sim.proc_root, gpu, mig.gpu_instance_id, mig.compute_instance_id)
            assert _nodes(own) == {(f"/dev/nvidia{gpu}", 195, gpu)} | {(n.path, n.major, n.minor) for n in caps}
            expected = {(n.path, n.major, n.minor) for n in gpu_nodes(node.sim.proc_root, gpu) + caps}
            assert _nodes(own) | _nodes(common) == expected | {(MODESET.path, MODESET.major, MODESET.minor)}
            assert _env(common).get("NVIDIA_VISIBLE_DEVICES") == "void"
            unprepared = node.kubelet.unprepare([claim])
            assert unprepared == {claim.uid: ""}
            assert not node.plugin.claim_spec_path(claim.uid).exists()
            after = discover(node.sim, node.sim.sysfs_root)
            assert all(not g.mig_instances for g in after.gpus)
        finally:
            delete_claims(node.api, [claim])
        assert node.plugin.alive() and node.plugin.warnings() == []


@needs_root
def test_nvidia_fails_to_unprepare_the_first_of_two_mig_devices_on_one_gpu(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """A bug of v0.5.0 (and of its main branch since): after destroying a MIG device it decides whether to switch the
    GPU's MIG mode off from the mode it read at start (off, under DynamicMIG: it switches every GPU's MIG off then),
    so it sees no other MIG device and switches MIG off under the GPU's other one, which NVML refuses (in use); the
    unprepare fails, and the kubelet's retry succeeds once the GPU's last MIG device is gone. Bench_prepare's 16
    MIG devices at once (two per GPU) meet it."""
    with nvidia_node(control_plane, tmp_path, DYNAMIC_MIG) as node:
        first, second = (
            node.claim(mig_device_name(5, "1g.10gb", 19, start), f"nvidia-two-{start}") for start in (0, 1)
        )
        try:
            for claim in (first, second):
                assert node.kubelet.prepare([claim])[claim.uid].error == ""
            (parent,) = (g for g in discover(node.sim, node.sim.sysfs_root).gpus if g.minor == 5)
            assert sorted(m.placement.start for m in parent.mig_instances) == [0, 1]
            error = node.kubelet.unprepare([first])[first.uid]
            assert "failed maybeDisableMigMode" in error and "In use by another client" in error, error
            (parent,) = (g for g in discover(node.sim, node.sim.sysfs_root).gpus if g.minor == 5)
            assert [m.placement.start for m in parent.mig_instances] == [1]  # its own is gone, the other one stays
            assert node.kubelet.unprepare([second]) == {second.uid: ""}
            assert node.kubelet.unprepare([first]) == {first.uid: ""}  # the kubelet's retry
            assert all(not g.mig_instances for g in discover(node.sim, node.sim.sysfs_root).gpus)
        finally:
            delete_claims(node.api, [first, second])
        warnings = node.plugin.warnings()
        assert len(warnings) == 2 and all(re.match(p, w) for p, w in zip(_TWO_MIG_WARNINGS, warnings, strict=True)), (
            warnings
        )


# What it logs at that failed unprepare: NVML's activation status (Success: the refusal is the return code), then
# the error.
_TWO_MIG_WARNINGS = (
    r"^W nvlib\.go:\d+\] SetMigMode activationStatus \(device gpu-5-GPU-[0-9a-f-]+\): Success$",
    r"^W device_state\.go:\d+\] Error deleting MIG device gpu-5-mig-1g10gb-19-0: failed maybeDisableMigMode: "
    r"error disabling MIG mode for device gpu-5-GPU-[0-9a-f-]+: In use by another client$",
)
