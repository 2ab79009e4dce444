"""NVIDIA's own DRA driver (gpu-kubelet-plugin v0.5.0, built from its Go module) publishes ResourceSlices for our
simulated GPUs, through the simulated libnvidia-ml, against a real kube-apiserver (the primary version); ours are
published for the same machine, Node and server, and the two pools are compared device by device, attribute by
attribute, capacity by capacity and counter by counter (tests/slice_compare.py).

Modes compared: NVIDIA's default (whole GPUs, and the MIG devices that exist on a GPU with MIG on) with our `static`;
its `DynamicMIG` gate (every MIG partition, carved at prepare, with shared counters) with our `partitionable`; its
`ConsumableShares` gate (`--consumable-shares` memory, N or unlimited) with our `shared` (by memory, `--replicas N`,
unlimited); its `DRAListTypeAttributes` gate with our `--numa-node-form list` (numaNode as a list, against an API
server with that gate on). Machines: the simulated DGX H100, DGX H200 and the mixed machine in every mode but the list
form (in the static and shared modes the H200 and the mixed machine carry MIG devices made before either driver
starts, as an admin, mig-parted or the GPU Operator leaves them); the DGX A100 (MIG off), DGX B200 and GB200 NVL72
tray under dynamic MIG, the tray in the static mode too; the list form on dgx-h100-snc2 (sub-NUMA clustering) and the
mixed machine.

Every difference is fixed in our driver or listed in KNOWN with its reason; the test fails on a difference KNOWN does
not name and on an entry of KNOWN that no longer occurs. docs/comparison.md carries the table as measured (its
generated section; DRA_WRITE_DOCS=1 rewrites it). NVIDIA's Fabric Manager partitioning is out of the comparison (its
bindings are a NOT_SUPPORTED stand-in, scripts/build-nvidia-tools.sh), as are its VFIO passthrough devices (no
simulated vfio-pci binding).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dra_driver.nvml.discovery import discover
from dra_driver.plugin.grpc.kubelet import KubeletHarness
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.builder import NumaNodeForm, PublishMode, build_slices
from dra_driver.slices.limits import parse_minor
from tests.cluster.controlplane import ControlPlane
from tests.nvidia_driver import DRIVER as NVIDIA_DRIVER
from tests.nvidia_driver import NvidiaKubeletPlugin
from tests.simhelpers import create_full_ci, create_gi
from tests.slice_compare import Difference, Pool, differences, pool_of
from tests.test_allocbench import build_allocbench, run_go

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "comparison.md"
NODE = "nvidia-slices-node"
PARALLEL_CASES = 3
OURS = "gpu.dra-driver.dev"
STATIC, DYNAMIC, SHARED = "static", "dynamic MIG", "consumable shares"

# MIG devices made before the static runs: NVML index -> (GPU instance profile id, placement start, size, CI slices)
_H200_MIG = {
    0: [(19, 0, 1, 1), (14, 2, 2, 2), (9, 4, 4, 3)],  # 1g.18gb, 2g.35gb, 3g.71gb
    5: [(5, 0, 4, 4), (15, 6, 2, 1)],  # 4g.71gb, 1g.35gb
}
_MIXED_MIG = {
    0: [(19, 0, 1, 1), (9, 4, 4, 3)],  # the A100 80GB that has MIG on: 1g.10gb, 3g.40gb
    2: [(5, 0, 4, 4), (15, 6, 2, 1)],  # an H100, MIG switched on: 4g.40gb, 1g.20gb
}


@dataclass(frozen=True)
class Case:
    machine: str
    mode: str  # STATIC or DYNAMIC
    mig: dict[int, list[tuple[int, int, int, int]]] = field(default_factory=dict)
    shares: str = "disabled"  # NVIDIA's --consumable-shares (SHARED): memory, unlimited or N
    numa_list: bool = False  # numaNode in list form: NVIDIA's DRAListTypeAttributes gate, our --numa-node-form list

    @property
    def id(self) -> str:
        mode = {STATIC: "static", DYNAMIC: "dynamic", SHARED: f"shares-{self.shares}"}[self.mode]
        return f"{self.machine}-{mode}" + ("-numa-list" if self.numa_list else "")

    @property
    def nvidia_gates(self) -> dict[str, bool]:
        gates = {DYNAMIC: {"DynamicMIG": True}, SHARED: {"ConsumableShares": True}}.get(self.mode, {})
        return {**gates, "DRAListTypeAttributes": True} if self.numa_list else gates

    @property
    def our_mode(self) -> PublishMode:
        return {DYNAMIC: PublishMode.PARTITIONABLE, SHARED: PublishMode.SHARED}.get(self.mode, PublishMode.STATIC)

    @property
    def our_replicas(self) -> int | None:
        """Our `--replicas` for NVIDIA's --consumable-shares: by memory (None), unlimited (0) or N."""
        if self.mode != SHARED or self.shares == "memory":
            return None
        return 0 if self.shares == "unlimited" else int(self.shares)

    @property
    def ours_described(self) -> str:
        if self.numa_list:
            return f"`{self.our_mode.value}` `--numa-node-form list`"
        if self.mode != SHARED:
            return f"`{self.our_mode.value}`"
        replicas = {None: "", 0: " `--replicas unlimited`"}.get(self.our_replicas, f" `--replicas {self.our_replicas}`")
        return f"`{self.our_mode.value}`{replicas}"

    @property
    def nvidia_described(self) -> str:
        made = " + MIG devices made before" if self.mig else ""
        if self.numa_list:
            return f"default + `DRAListTypeAttributes`{made}"
        if self.mode == DYNAMIC:
            return "`DynamicMIG`"
        if self.mode == SHARED:
            return f"`ConsumableShares`, `--consumable-shares={self.shares}`{made}"
        return f"default{made}"


CASES = [
    Case("dgx-h100", STATIC),
    Case("dgx-h100", DYNAMIC),
    Case("dgx-h200", STATIC, _H200_MIG),
    Case("dgx-h200", DYNAMIC),
    Case("mixed", STATIC, _MIXED_MIG),
    Case("mixed", DYNAMIC),
    Case("dgx-a100", DYNAMIC),  # Ampere with MIG off: whole GPUs only, no counters (MIG needs a reset)
    Case("dgx-b200", DYNAMIC),
    Case("gb200-nvl72-tray", STATIC),
    Case("gb200-nvl72-tray", DYNAMIC),
    Case("dgx-h100", SHARED, shares="memory"),
    Case("dgx-h200", SHARED, _H200_MIG, shares="4"),
    Case("mixed", SHARED, _MIXED_MIG, shares="unlimited"),
    # against an API server with DRAListTypeAttributes on (the list form is refused without it)
    Case("dgx-h100-snc2", STATIC, numa_list=True),
    Case("mixed", STATIC, _MIXED_MIG, numa_list=True),
]


@dataclass(frozen=True)
class Known:
    """A difference the comparison measures, and why it stays: `names` (attributes, capacities, counters) of
    `aspect` on devices or counter sets of `kinds`, in `mode`."""

    mode: str
    aspect: str
    names: tuple[str, ...]
    kinds: tuple[str, ...]
    theirs: str
    ours: str
    reason: str

    def matches(self, mode: str, d: Difference) -> bool:
        return mode == self.mode and d.aspect == self.aspect and d.name in self.names and d.kind in self.kinds


_ENGINES = ("multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines")
_COUNTERS = ("multiprocessors", "copy-engines", "decoders", "encoders", "jpeg-engines", "ofa-engines", "memory")
_COUNTERS_REASON = (
    "with a counter per memory slice, every combination of partitions the slices admit also fits the totals of "
    "multiprocessors, memory and most engines, so those counters never refuse anything and only cost the scheduler "
    "a check per device; ours counts the capacities that can refuse a combination (binding_capacities: `ofaEngines` "
    "on Hopper and Blackwell, `jpegEngines` on A100, a second `+me` partition), each at the most any legal "
    "combination consumes, not the largest single profile (which can refuse a layout the GPU accepts). The set "
    "refuses exactly what a counter per capacity would (tests/test_slices.py)"
)

KNOWN: tuple[Known, ...] = (
    Known(
        DYNAMIC,
        "capacity",
        _ENGINES,
        ("gpu",),
        "the whole GPU carries its largest MIG profile's engines and multiprocessors",
        "the whole GPU carries its memory only, as in every mode",
        "NVML reports engines and multiprocessors per MIG instance, not for a whole GPU with MIG off; NVIDIA copies "
        "the largest profile's, so a selector on them matches whole GPUs only under DynamicMIG. Ours describe the "
        "whole GPU the same in every mode (CEL on partitions: the MIG devices' own capacities, which are the same)",
    ),
    Known(
        DYNAMIC,
        "capacity",
        ("memory",),
        ("gpu",),
        "the largest MIG profile's memory (H100: 81152Mi)",
        "the GPU's memory as NVML reports it (H100: 81559Mi)",
        "the whole GPU handed out whole has all its memory, not the 7g instance's; ours is the same value in every "
        "mode, so `capacity.memory` selects the same GPUs whatever the mode",
    ),
    Known(
        DYNAMIC,
        "counter",
        _COUNTERS,
        ("gpu-N-counter-set",),
        "one counter per MIG capacity (its largest single-profile value) plus one per memory slice",
        "one counter per memory slice, plus the MIG capacities that can refuse a layout the slices allow",
        _COUNTERS_REASON,
    ),
    Known(
        DYNAMIC,
        "consumption",
        _COUNTERS,
        ("gpu", "mig"),
        "each device consumes every capacity counter",
        "each device consumes its memory slices and the binding capacities",
        "the counters it consumes are the counter set's (previous row)",
    ),
    Known(
        DYNAMIC,
        "layout",
        ("slices",),
        ("pool",),
        "one slice per GPU, its whole device first, also for a GPU without a counter set (the L40S, no MIG; the A100 "
        "with MIG off)",
        "one slice of every whole GPU with a counter set, then one slice of partitions per GPU; the GPUs without one "
        "share a slice",
        "the scheduler tries a node's slices in name order and evaluates a class's CEL on every device not in use: "
        "with the whole GPUs first, a whole-GPU claim skips the GPUs in use without evaluating CEL on their "
        "partitions (bench/bench_scheduler.py: 8.9 against 4.2 pods/s at 50% of the GPUs in use on 100 nodes); "
        "GPUs without counters beside each other, which the API allows, make fewer slices",
    ),
    Known(
        DYNAMIC,
        "order",
        ("devices",),
        ("pool",),
        "by name (the whole GPU, then 1g partitions from placement 0 up)",
        "the whole GPU, then large partitions first, high placements first",
        "the scheduler takes the first device that matches: offering high placements first keeps slice 0, which "
        "4g and 7g partitions need, free the longest (NVIDIA's own default placement does the same for 1g)",
    ),
    *(
        Known(
            mode,
            "attribute",
            ("nvlinkClusterUUID", "nvlinkClique"),
            ("gpu",) if mode == STATIC else ("gpu", "mig"),
            "none: the NVLink domain is its ComputeDomain driver's (IMEX channels), not an attribute of a GPU",
            "the GPU's NVLink fabric cluster and `<cluster>.<clique>` (NVML's fabric info), MIG devices their GPU's",
            "a claim for several GPUs of one NVL72 clique (`matchAttribute: nvlinkClique`), and the node label "
            "`gpu.clique` for pod affinity, need them (docs/resourceslices.md, Topology)",
        )
        for mode in (STATIC, DYNAMIC)
    ),
    Known(
        SHARED,
        "capacity policy",
        ("memory.validRange.min",),
        ("gpu", "mig"),
        "by memory: at least 1Mi; with shares: 0 to the whole memory, in 1Mi steps",
        "by memory: at least 1Gi; with shares: no range (a claim takes what it asks for, 0 by default)",
        "a claim for a few MiB of a GPU is a unit mistake (`memory: 16` is 16 bytes) or one that cannot run: a "
        "CUDA context alone takes hundreds of MiB; with shares, memory is not what is shared, and a claim that asks "
        "for some gets what it asks for",
    ),
    Known(
        SHARED,
        "capacity policy",
        ("memory.validRange.max", "memory.validRange.step"),
        ("gpu", "mig"),
        "the range ends at the device's memory; with shares, in 1Mi steps",
        "no maximum; with shares, no steps",
        "the device's memory bounds what its claims take together anyway (a request above it fits no device either "
        "way); the step rounds a request up, which only matters where there is a range",
    ),
    Known(
        SHARED,
        "capacity policy",
        ("shares.validRange.max", "shares.validRange.step"),
        ("gpu", "mig"),
        "a claim may take 1 to N of the N shares",
        "a claim takes exactly one share",
        "time-slicing gives a claim that holds two shares no more time than one that holds one, so we refuse it as the "
        "device plugin's time-slicing does (`failRequestsGreaterThanOne`) rather than let a claim believe it did",
    ),
    Known(
        SHARED,
        "capacity policy",
        tuple(f"{c}.default" for c in (*_ENGINES, *(f"memorySlice{i}" for i in range(8)))),
        ("mig",),
        "a shared MIG device's engines, multiprocessors and memory slices have no request policy",
        "default 0: a claim that does not ask for them takes none",
        "the scheduler gives a claim that does not ask for a capacity without a request policy all of it "
        "(k8s.io/dynamic-resource-allocation structured fillEmptyRequest), so with NVIDIA's slices the first claim "
        "on a shared MIG device takes all its multiprocessors and no second claim fits: the MIG device is not shared "
        "(measured with the scheduler's allocator: three claims on the mixed machine's 3g.40gb, unlimited shares, "
        "place one on NVIDIA's slices, three on ours). Those capacities describe the partition; no claim splits them",
    ),
)


@dataclass
class Measured:
    case: Case
    theirs: Pool
    ours: Pool
    diffs: list[Difference]
    warnings: list[str]  # what NVIDIA's plugin logged as warnings and errors
    theirs_slices: list[dict[str, Any]]  # as the server has them
    ours_slices: list[dict[str, Any]]


def _make_mig(sim: SimulatedNvml, mig: dict[int, list[tuple[int, int, int, int]]]) -> None:
    for index, instances in mig.items():
        dev = sim.nvmlDeviceGetHandleByIndex(index)
        if sim.nvmlDeviceGetMigMode(dev)[0] == 0:
            sim.nvmlDeviceSetMigMode(dev, 1)
        for profile_id, start, size, ci_slices in instances:
            create_full_ci(sim, create_gi(sim, dev, profile_id, start, size), ci_slices)


def _ours(
    cp: ControlPlane, sim: SimulatedNvml, node: str, node_uid: str, minor: int, case: Case
) -> list[dict[str, Any]]:
    """Ours for the same machine, Node and server, created on the server and read back from it (what it keeps)."""
    slices = build_slices(
        discover(sim, sim.sysfs_root),
        node_name=node,
        node_uid=node_uid,
        k8s_version=f"1.{minor}",
        mode=case.our_mode,
        replicas=case.our_replicas,
        numa_form=NumaNodeForm.LIST if case.numa_list else NumaNodeForm.SCALAR,
    )
    selector = f"--field-selector=spec.driver={OURS},spec.nodeName={node}"
    items = [s.to_api() for s in slices]
    for item in items:
        cp.create(item)
    try:
        on_server: list[dict[str, Any]] = cp.kubectl_json("get", "resourceslices", selector)["items"]
        assert len(on_server) == len(slices)
        return on_server
    finally:
        cp.delete("resourceslices", field_selector=selector.removeprefix("--field-selector="), wait=120)


def _measure(cp: ControlPlane, case: Case, node: str, node_uid: str, minor: int, work: Path) -> Measured:
    sim = SimulatedNvml(case.machine, work / f"{case.id}-machine")
    sim.nvmlInit()
    _make_mig(sim, case.mig)
    plugin_dir = work / f"{case.id}-plugin"
    gates, shares = case.nvidia_gates, case.shares
    with NvidiaKubeletPlugin(cp, sim, node, plugin_dir, feature_gates=gates, consumable_shares=shares) as plugin:
        theirs_slices = plugin.wait_published()
        warnings = plugin.warnings()
    # After NVIDIA's plugin has run: under DynamicMIG it destroys MIG devices no claim holds at start.
    ours_slices = _ours(cp, sim, node, node_uid, minor, case)
    theirs, ours = pool_of(NVIDIA_DRIVER, theirs_slices), pool_of(OURS, ours_slices)
    # NVIDIA publishes the devices of its single static slice in Go map order (cmd/gpu-kubelet-plugin driver.go
    # ranges over its allocatable map): a new order each run, so the order is compared under DynamicMIG only,
    # where it sorts them.
    diffs = differences(theirs, ours, order=case.mode == DYNAMIC)
    return Measured(case, theirs, ours, diffs, warnings, theirs_slices, ours_slices)


@pytest.fixture(scope="module")
def measured(
    control_plane: ControlPlane, list_attributes_cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Measured]]:
    """Every case measured: on the session's control plane, or, for the list form, on one with DRAListTypeAttributes.
    A few cases at a time, each on a Node of its own: most of a case is waiting for NVIDIA's plugin to publish."""
    work = tmp_path_factory.mktemp("nvidia-slices")
    minors = {id(cp): parse_minor(cp.server_version()) for cp in (control_plane, list_attributes_cluster)}
    jobs = [(list_attributes_cluster if c.numa_list else control_plane, c) for c in CASES]
    jobs.sort(key=lambda job: job[1].numa_list)  # the session's control plane first, as the table lists them

    def one(cp: ControlPlane, case: Case, node: str) -> Measured:
        uid = cp.create_node(node, labels={"nvidia.com/gpu.present": "true"})
        try:
            return _measure(cp, case, node, uid, minors[id(cp)], work)
        finally:
            cp.delete_node(node)

    with ThreadPoolExecutor(max_workers=PARALLEL_CASES) as pool:
        futures = [pool.submit(one, cp, case, f"{NODE}-{i}") for i, (cp, case) in enumerate(jobs)]
        yield {case.id: future.result() for (_, case), future in zip(jobs, futures, strict=True)}


def _unexplained(m: Measured) -> list[Difference]:
    return [d for d in m.diffs if not any(k.matches(m.case.mode, d) for k in KNOWN)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_nvidia_publishes_what_we_publish_but_for_the_known_differences(
    measured: dict[str, Measured], case: Case
) -> None:
    m = measured[case.id]
    sim_gpus = {name.split("-mig-")[0] for name in m.theirs.devices}
    assert sim_gpus == {name.split("-mig-")[0] for name in m.ours.devices}, "NVIDIA's plugin saw other GPUs"
    assert m.theirs.devices and set(m.theirs.devices) == set(m.ours.devices)
    if case.mig:
        assert any(d.kind.startswith("mig") and "uuid" in d.attributes for d in m.theirs.devices.values())
    if case.numa_list:  # the list form, as NVIDIA's plugin reads it from the simulated sysfs (upstream's code)
        lists = [d.attributes.get("resource.kubernetes.io/numaNode") for d in m.theirs.devices.values()]
        assert all(a is None or a[0] == "ints" for a in lists) and any(a for a in lists)
        if case.machine == "dgx-h100-snc2":  # sub-NUMA clustering: a GPU's node and its socket's other half
            assert all(a is not None and len(a[1]) == 2 for a in lists), lists
    unexplained = _unexplained(m)
    assert not unexplained, "differences KNOWN does not list:\n" + "\n".join(str(d) for d in unexplained[:40])


def test_nvidia_plugin_warns_only_where_a_real_machine_would(measured: dict[str, Measured]) -> None:
    """Its warnings name what a simulated machine lacks (before NVIDIA_DRA_SYSFS_ROOT: every GPU's PCIe root and
    NUMA node): none but the expected ones."""
    unexpected = [
        f"{cid}: {w}"
        for cid, m in measured.items()
        for w in m.warnings
        if not any(re.match(p, w) for p in EXPECTED_WARNINGS)
    ]
    assert not unexpected, "\n".join(unexpected)
    seen = {p for m in measured.values() for w in m.warnings for p in EXPECTED_WARNINGS if re.match(p, w)}
    assert seen == set(EXPECTED_WARNINGS), f"expected warnings no longer logged: {set(EXPECTED_WARNINGS) - seen}"


def _claims_for_one_mig_device(driver: str, profile: str, count: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A DeviceClass for `driver`'s MIG devices of `profile`, and `count` claims for one such device each (as the API
    server stores them: defaults filled in, the Go allocator does not default)."""
    cls = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"mig-{driver}"},
        "spec": {"selectors": [{"cel": {"expression": (
            f"device.driver == '{driver}' && device.attributes['{driver}'].type == 'mig' && "
            f"device.attributes['{driver}'].profile == '{profile}'"
        )}}]},
    }  # fmt: skip
    claims = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"share-{i}", "namespace": "default", "uid": f"uid-share-{i}"},
            "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
                "deviceClassName": f"mig-{driver}", "allocationMode": "ExactCount", "count": 1}}]}},
        }
        for i in range(count)
    ]  # fmt: skip
    return cls, claims


def test_a_shared_mig_device_takes_one_claim_in_nvidias_slices_several_in_ours(measured: dict[str, Measured]) -> None:
    """The last KNOWN row, measured: the 1.37 scheduler's own allocator (k8s.io/dynamic-resource-allocation/structured
    through tools/allocbench) places three claims that ask for nothing but the mixed machine's one 3g.40gb MIG
    device, shared without a limit (NVIDIA's --consumable-shares=unlimited, our --replicas unlimited): all three on
    ours; on NVIDIA's the first takes all of the device's multiprocessors and engines, and the others find no room."""
    m = measured["mixed-shares-unlimited"]
    placed: dict[str, list[str | None]] = {}
    for driver, slices in ((NVIDIA_DRIVER, m.theirs_slices), (OURS, m.ours_slices)):
        cls, claims = _claims_for_one_mig_device(driver, "3g.40gb", 3)
        inp = {"slices": slices, "classes": [cls], "claims": claims, "nodes": [slices[0]["spec"]["nodeName"]]}
        results, _ = run_go(build_allocbench(), inp)
        placed[driver] = [r["devices"][0]["device"] if r.get("devices") else None for r in results]
        if driver == NVIDIA_DRIVER:
            consumed = results[0]["devices"][0]["consumedCapacity"]
            assert consumed["multiprocessors"] == m.theirs.devices[placed[driver][0] or ""].capacity["multiprocessors"]
    device = "gpu-1-mig-3g40gb-9-4"
    assert placed == {NVIDIA_DRIVER: [device, None, None], OURS: [device, device, device]}


def test_nvidia_plugin_registers_with_a_kubelet_stand_in(control_plane: ControlPlane, tmp_path: Path) -> None:
    """What the kubelet's plugin watcher does with it (dra_driver/plugin/grpc/kubelet.py plays it over the real
    sockets): GetInfo on gpu.nvidia.com-reg.sock, the answer validated as the kubelet validates it, the verdict
    reported, then the empty NodePrepareResources its own liveness probe makes. A claim's prepare needs what the
    simulated machine lacks (docs/comparison.md): the GPUs' device nodes where nvcdi looks for them."""
    sim = SimulatedNvml("dgx-h100", tmp_path / "machine")
    sim.nvmlInit()
    node = f"{NODE}-registration"
    uid = control_plane.create_node(node)
    try:
        with (
            NvidiaKubeletPlugin(control_plane, sim, node, tmp_path / "plugin") as plugin,
            KubeletHarness(plugin.registry_dir, NVIDIA_DRIVER) as kubelet,
        ):
            plugin.wait_published()
            info = kubelet.register()
            assert info.name == NVIDIA_DRIVER and info.type == "DRAPlugin"
            assert {"v1.DRAPlugin", "v1beta1.DRAPlugin"} <= set(info.supported_versions)
            assert Path(info.endpoint) == plugin.plugins_dir / NVIDIA_DRIVER / "dra.sock"
            assert len(kubelet.prepare_raw([]).claims) == 0
            assert plugin.alive() and plugin.warnings() == []
            owners = {o["uid"] for s in plugin.slices() for o in s["metadata"]["ownerReferences"]}
            assert owners == {uid}
    finally:
        control_plane.delete_node(node)


def test_every_known_difference_still_occurs(measured: dict[str, Measured]) -> None:
    stale = []
    for k in KNOWN:
        seen = {d.name for m in measured.values() for d in m.diffs if k.matches(m.case.mode, d)}
        if seen != set(k.names):
            stale.append(f"{k.mode} {k.aspect}: listed {sorted(k.names)}, measured {sorted(seen)}")
    assert not stale, "entries of KNOWN that no longer (all) occur:\n" + "\n".join(stale)


_DEVICE_ASPECTS = ("attribute", "capacity", "capacity policy", "consumption", "device field")
# What NVIDIA's plugin may log as a warning or error on the simulated machines (a pattern, and why it is right there);
# anything else means the simulated machine lacks something a real one has.
EXPECTED_WARNINGS: dict[str, str] = {
    r"^W nvlib\.go:\d+\] GPU gpu-4-GPU-[0-9a-f-]+: hardware does not support MIG - skipping DynamicMIG$": (
        "the mixed machine's L40S has no MIG"
    ),
}
BEGIN = "<!-- BEGIN measured by tests/test_nvidia_slices.py (DRA_WRITE_DOCS=1 rewrites it) -->"
END = "<!-- END measured -->"


def render(measured: dict[str, Measured]) -> str:
    """The doc's generated section: what was compared, then every known difference with where it was seen."""
    lines = [
        BEGIN,
        "",
        "| machine | NVIDIA v0.5.0 | this driver | devices | counter sets | devices identical in every attribute, "
        "capacity, request policy and counter |",
        "|---|---|---|---|---|---|",
    ]
    for case in CASES:
        m = measured[case.id]
        odd = {d.where.split(" of ")[0] for d in m.diffs if d.aspect in _DEVICE_ASPECTS}
        lines.append(
            f"| {case.machine} | {case.nvidia_described} | {case.ours_described} | {len(m.theirs.devices)} | "
            f"{len(m.theirs.counter_sets)} | {len(set(m.theirs.devices) - odd)} |"
        )
    lines += ["", "| mode | what differs | NVIDIA v0.5.0 | this driver | why | seen on |", "|---|---|---|---|---|---|"]
    for k in KNOWN:
        seen = sorted({m.case.machine for m in measured.values() if any(k.matches(m.case.mode, d) for d in m.diffs)})
        names = ", ".join(f"`{n}`" for n in k.names)
        what = f"{k.aspect} {names}" + ("" if k.kinds == ("pool",) else f" ({'/'.join(k.kinds)})")
        lines.append(f"| {k.mode} | {what} | {k.theirs} | {k.ours} | {k.reason} | {', '.join(seen)} |")
    lines += ["", END]
    return "\n".join(lines)


def test_the_comparison_doc_is_the_measured_table(
    measured: dict[str, Measured], report_table: Callable[[str, str], None]
) -> None:
    section = render(measured)
    report_table("NVIDIA's ResourceSlices beside ours (docs/comparison.md)", section)
    doc = DOC.read_text()
    assert BEGIN in doc and END in doc, f"{DOC} has no generated section"
    head, rest = doc.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    expected = head + section + tail
    if doc != expected and os.environ.get("DRA_WRITE_DOCS") == "1":
        DOC.write_text(expected)
        return
    assert doc == expected, "docs/comparison.md's measured table is stale: rerun with DRA_WRITE_DOCS=1"
