"""Differential test of the simulated libnvidia-ml through its C API: on every simulated machine, one script of NVML
calls runs in lockstep three times, each on its own copy of the machine:

  - the Python simulator through pynvml's call surface (the reference: what the driver sees in simulation),
  - the C library through pynvml's own ctypes wrappers (what the driver calls on a real node),
  - the C library through NVIDIA's go-nvml (tools/gonvmlprobe: what NVIDIA's DRA driver, device plugin and container
    toolkit call),

and every call must return the same code and the same value: system and device queries, MIG mode, every GPU- and
compute-instance profile in each struct version, placements, instance creation and destruction at every placement,
MIG device handles and their attributes, events, telemetry, the board (persistence, display and ECC modes, serial,
board id, PCIe link, power limits, clocks, topology, the NVLink fabric), running processes, and the errors (invalid
profile or placement, insufficient resources, not found, in use, stale handles, MIG disabled, a lost GPU).
"""

from __future__ import annotations

import os
from pathlib import Path

import pynvml
import pytest

from dra_driver.nvml.migprofile import COMPUTE_INSTANCE_ENUM_BY_SLICES
from dra_driver.simulator.catalog import MachineSpec, ProductSpec, machine, machine_names, product
from dra_driver.simulator.nvml import SimulatedNvml
from tests.libnvml_support import (
    Call,
    Executor,
    GoExecutor,
    OutOfBand,
    PyExecutor,
    Step,
    Var,
    built_library,
    gonvmlprobe_binary,
    pynvml_on,
    run_script,
    simulated_library,
)

ENGINE_SHARED = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
XID = pynvml.nvmlEventTypeXidCriticalError


# The board (modes, identity, PCIe link, power limits): what a data-center GPU answers, from the product's data.
BOARD_QUERIES = (
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetDisplayMode",
    "nvmlDeviceGetDisplayActive",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetBoardId",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
)
PROCESS_QUERIES = (
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses",
)
CLOCK_QUERIES = ("nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetClockInfo")
CLOCKS = (pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM, pynvml.NVML_CLOCK_VIDEO)
FABRIC = ("6f1c6d3e-0000-4d39-9a4c-000000000072", 3)  # a rack's cluster UUID and clique, the same on each copy


def _device_queries(d: Var) -> list[Step]:
    return [
        Call(fn, (d,))
        for fn in (
            "nvmlDeviceGetName",
            "nvmlDeviceGetMinorNumber",
            "nvmlDeviceGetIndex",
            "nvmlDeviceGetPciInfo",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetMemoryInfo_v2",
            "nvmlDeviceGetBrand",
            "nvmlDeviceGetArchitecture",
            "nvmlDeviceGetCudaComputeCapability",
            "nvmlDeviceGetVirtualizationMode",
            "nvmlDeviceGetComputeMode",
            "nvmlDeviceGetMigMode",
            "nvmlDeviceGetMaxMigDeviceCount",
            "nvmlDeviceIsMigDeviceHandle",
            "nvmlDeviceGetAttributes",  # NOT_SUPPORTED on a whole GPU
            "nvmlDeviceGetGpuInstanceId",  # INVALID_ARGUMENT on a whole GPU
            "nvmlDeviceGetComputeInstanceId",
            "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
            "nvmlDeviceGetSupportedEventTypes",
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetPowerUsage",
            *BOARD_QUERIES,
            "nvmlDeviceGetGpuFabricInfo",  # NOT_SUPPORTED off an NVLink fabric
            "nvmlDeviceGetGpuFabricInfoV",
            "nvmlDeviceGetNumaNodeId",  # NOT_SUPPORTED: a GPU is no NUMA node of its own on these machines
            *PROCESS_QUERIES,
        )
    ] + [
        *(Call(fn, (d, clock)) for fn in CLOCK_QUERIES for clock in (*CLOCKS, 9)),
        Call("nvmlDeviceGetTopologyCommonAncestor", (d, d)),
        Call("nvmlDeviceGetTopologyCommonAncestor", (d, Var("d0"))),
        Call("nvmlDeviceGetTopologyCommonAncestor", (Var("d0"), d)),
        Call("nvmlDeviceGetTemperature", (d, pynvml.NVML_TEMPERATURE_GPU)),
        Call("nvmlDeviceGetTemperature", (d, 99)),
        Call("nvmlDeviceGetTotalEccErrors", (d, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC)),
        Call("nvmlDeviceGetTotalEccErrors", (d, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC)),
        Call("nvmlDeviceGetTotalEccErrors", (d, 7, pynvml.NVML_VOLATILE_ECC)),
        Call("nvmlDeviceGetGpuInstanceProfileInfo", (d, 0, 2)),
        Call("nvmlDeviceGetGpuInstancePossiblePlacements", (d, 19)),
    ]


def _enable_mig(i: int, d: Var, prod: ProductSpec) -> list[Step]:
    steps: list[Step] = [
        Call("nvmlDeviceSetMigMode", (d, pynvml.NVML_DEVICE_MIG_ENABLE)),
        Call("nvmlDeviceGetMigMode", (d,)),
    ]
    if prod.mig_toggle_needs_reset:
        steps += [OutOfBand("reset_gpu", (i,)), Call("nvmlDeviceGetMigMode", (d,))]
    return steps


def _mig_device(d: Var, mig: Var, tag: str) -> list[Step]:
    """Everything about the MIG device of a compute instance whose info was saved."""
    steps: list[Step] = [
        Call(fn, (mig,))
        for fn in (
            "nvmlDeviceIsMigDeviceHandle",
            "nvmlDeviceGetGpuInstanceId",
            "nvmlDeviceGetComputeInstanceId",
            "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
            "nvmlDeviceGetAttributes",
            "nvmlDeviceGetName",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetCudaComputeCapability",
            "nvmlDeviceGetArchitecture",
            "nvmlDeviceGetBrand",
            "nvmlDeviceGetComputeMode",
            "nvmlDeviceGetMinorNumber",  # INVALID_ARGUMENT: a MIG device has no minor of its own here
            "nvmlDeviceGetUtilizationRates",  # NOT_SUPPORTED on MIG devices
            "nvmlDeviceGetMigMode",
            *BOARD_QUERIES,  # NOT_SUPPORTED on MIG devices
            "nvmlDeviceGetGpuFabricInfo",
            "nvmlDeviceGetComputeRunningProcesses",  # none recorded per MIG device
        )
    ]
    steps += [Call("nvmlDeviceGetMaxClockInfo", (mig, pynvml.NVML_CLOCK_SM))]
    steps += [Call("nvmlDeviceGetTopologyCommonAncestor", (mig, d))]
    steps += [
        Call("nvmlDeviceGetUUID", (mig,), save=f"uuid{tag}"),
        Call("nvmlDeviceGetHandleByUUID", (Var(f"uuid{tag}"),)),
        Call("nvmlDeviceGetHandleByUUIDV", (Var(f"uuid{tag}"), pynvml.NVML_UUID_TYPE_BINARY)),
        Call("nvmlDeviceGetMaxMigDeviceCount", (d,)),
        Call("nvmlDeviceGetMigDeviceHandleByIndex", (d, 0)),
        Call("nvmlDeviceGetMigDeviceHandleByIndex", (d, 6)),  # NOT_FOUND: an empty index
        Call("nvmlDeviceGetMigDeviceHandleByIndex", (d, 7)),  # INVALID_ARGUMENT: past the maximum
    ]
    return steps


def _full_instance(i: int, d: Var, prod: ProductSpec, p_index: int, start: int, deep: bool) -> list[Step]:
    """A GPU instance of profile `p_index` at `start` with one compute instance spanning it, examined, then torn
    down; `deep`: also every compute-instance profile and the errors around it."""
    p = prod.mig_profiles[p_index]
    tag = f"{i}_{p.id}_{start}"
    gi, gii, ci, cii = Var(f"gi{tag}"), Var(f"gii{tag}"), Var(f"ci{tag}"), Var(f"cii{tag}")
    ce = COMPUTE_INSTANCE_ENUM_BY_SLICES[p.compute_slices]
    steps: list[Step] = [
        Call("nvmlDeviceCreateGpuInstanceWithPlacement", (d, p.id, start, p.memory_slices), save=gi.name),
        Call("nvmlGpuInstanceGetInfo", (gi,), save=gii.name),
        Call("nvmlDeviceGetGpuInstanceById", (d, Var(gii.name, "id"))),
        Call("nvmlDeviceGetGpuInstanceRemainingCapacity", (d, p.id)),
        Call("nvmlDeviceGetGpuInstances", (d, p.id, p.instance_count)),
        Call("nvmlDeviceCreateGpuInstanceWithPlacement", (d, p.id, start, p.memory_slices)),  # taken: INSUFFICIENT
    ]
    if deep:
        for enum in range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT + 1):
            steps += [
                Call("nvmlGpuInstanceGetComputeInstanceProfileInfo", (gi, enum, ENGINE_SHARED, v)) for v in (1, 2, 3)
            ]
        steps += [
            Call("nvmlGpuInstanceGetComputeInstanceProfileInfo", (gi, ce, 1, 2)),  # no such engine profile
            Call("nvmlGpuInstanceGetComputeInstancePossiblePlacements", (gi, ce)),
            Call("nvmlGpuInstanceGetComputeInstanceRemainingCapacity", (gi, ce)),
            Call("nvmlGpuInstanceGetComputeInstanceById", (gi, 0)),  # NOT_FOUND: none yet
        ]
    steps += [
        Call("nvmlGpuInstanceCreateComputeInstance", (gi, ce), save=ci.name),
        Call("nvmlComputeInstanceGetInfo", (ci,), save=cii.name),
    ]
    if deep:
        steps += [
            Call("nvmlGpuInstanceCreateComputeInstance", (gi, ce)),  # the GI is full: INSUFFICIENT_RESOURCES
            Call("nvmlGpuInstanceGetComputeInstanceRemainingCapacity", (gi, ce)),
            Call("nvmlGpuInstanceGetComputeInstances", (gi, ce, 1)),
            Call("nvmlGpuInstanceGetComputeInstanceById", (gi, Var(cii.name, "id"))),
            Call("nvmlGpuInstanceGetComputeInstanceById", (gi, 7)),
            *_mig_device(d, Var(cii.name, "device"), tag),
            Call("nvmlGpuInstanceDestroy", (gi,)),  # IN_USE: destroy the compute instances first
            Call("nvmlDeviceSetMigMode", (d, pynvml.NVML_DEVICE_MIG_DISABLE)),  # activation status IN_USE
        ]
    steps += [
        Call("nvmlComputeInstanceDestroy", (ci,)),
        Call("nvmlComputeInstanceDestroy", (ci,)),  # a stale handle: INVALID_ARGUMENT
        Call("nvmlGpuInstanceDestroy", (gi,)),
        Call("nvmlGpuInstanceGetInfo", (gi,)),  # stale
        Call("nvmlDeviceGetGpuInstanceById", (d, Var(gii.name, "id"))),  # NOT_FOUND
    ]
    return steps


def _sub_instances(i: int, d: Var, prod: ProductSpec) -> list[Step]:
    """Compute instances smaller than their GPU instance, on the largest profile: placed, defaulted, overlapping."""
    p = max(prod.mig_profiles, key=lambda q: (q.compute_slices, q.memory_slices))
    gi = Var(f"big{i}")
    one = COMPUTE_INSTANCE_ENUM_BY_SLICES[1]
    two = COMPUTE_INSTANCE_ENUM_BY_SLICES[2]
    steps: list[Step] = [
        Call("nvmlDeviceCreateGpuInstanceWithPlacement", (d, p.id, p.placements[0], p.memory_slices), save=gi.name),
        Call("nvmlGpuInstanceGetComputeInstancePossiblePlacements", (gi, one)),
        Call("nvmlGpuInstanceGetComputeInstancePossiblePlacements", (gi, two)),
        Call("nvmlGpuInstanceCreateComputeInstanceWithPlacement", (gi, one, 1, 1), save=f"c1_{i}"),
        Call("nvmlGpuInstanceCreateComputeInstanceWithPlacement", (gi, one, 1, 1)),  # taken
        Call("nvmlGpuInstanceCreateComputeInstanceWithPlacement", (gi, two, 1, 2)),  # misaligned: INVALID_ARGUMENT
        Call("nvmlGpuInstanceCreateComputeInstanceWithPlacement", (gi, two, 0, 1)),  # wrong size: INVALID_ARGUMENT
        Call("nvmlGpuInstanceCreateComputeInstanceWithPlacement", (gi, two, 0, 2)),  # overlaps slice 1
        Call("nvmlGpuInstanceCreateComputeInstanceWithPlacement", (gi, two, 2, 2), save=f"c2_{i}"),
        Call("nvmlGpuInstanceCreateComputeInstance", (gi, one), save=f"c3_{i}"),
        Call("nvmlComputeInstanceGetInfo", (Var(f"c3_{i}"),), save=f"c3i_{i}"),
        Call("nvmlGpuInstanceGetComputeInstanceRemainingCapacity", (gi, one)),
        Call("nvmlGpuInstanceGetComputeInstanceRemainingCapacity", (gi, two)),
        Call("nvmlGpuInstanceGetComputeInstances", (gi, one, 7)),
        Call("nvmlDeviceGetMigDeviceHandleByIndex", (d, 2)),
        Call("nvmlDeviceGetAttributes", (Var(f"c3i_{i}", "device"),)),
    ]
    for name in (f"c1_{i}", f"c2_{i}", f"c3_{i}"):
        steps.append(Call("nvmlComputeInstanceDestroy", (Var(name),)))
    steps.append(Call("nvmlGpuInstanceDestroy", (gi,)))
    return steps


def _default_placements(i: int, d: Var, prod: ProductSpec) -> list[Step]:
    """nvmlDeviceCreateGpuInstance without a placement, in the order the MIG guide shows failing: two 1g and a 2g
    land where a 3g can no longer go (Insufficient Resources)."""
    by_enum = {p.enum: p for p in prod.mig_profiles}
    first = [by_enum["1_SLICE"], by_enum["1_SLICE"], by_enum["2_SLICE"]]
    steps: list[Step] = []
    for n, p in enumerate(first):
        steps += [
            Call("nvmlDeviceCreateGpuInstance", (d, p.id), save=f"auto{i}_{n}"),
            Call("nvmlGpuInstanceGetInfo", (Var(f"auto{i}_{n}"),)),
        ]
    steps.append(Call("nvmlDeviceCreateGpuInstance", (d, by_enum["3_SLICE"].id)))
    steps += [Call("nvmlDeviceGetGpuInstanceRemainingCapacity", (d, p.id)) for p in prod.mig_profiles]
    steps += [Call("nvmlGpuInstanceDestroy", (Var(f"auto{i}_{n}"),)) for n in range(len(first))]
    return steps


def _mig_script(i: int, prod: ProductSpec) -> list[Step]:
    d = Var(f"d{i}")
    steps: list[Step] = [
        # MIG off (dgx machines start so): placements work, instances do not.
        Call("nvmlDeviceGetGpuInstancePossiblePlacements", (d, prod.mig_profiles[0].id)),
        Call("nvmlDeviceGetGpuInstanceRemainingCapacity", (d, prod.mig_profiles[0].id)),
        Call("nvmlDeviceCreateGpuInstance", (d, prod.mig_profiles[0].id)),
        Call("nvmlDeviceGetGpuInstanceById", (d, 1)),
        Call("nvmlDeviceGetMigDeviceHandleByIndex", (d, 0)),
        *_enable_mig(i, d, prod),
        Call("nvmlDeviceGetMaxMigDeviceCount", (d,)),
        Call("nvmlDeviceGetGpuInstanceById", (d, 1)),  # NOT_FOUND now
        Call("nvmlDeviceGetMigDeviceHandleByIndex", (d, 0)),
    ]
    for enum in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT + 1):
        steps += [Call("nvmlDeviceGetGpuInstanceProfileInfo", (d, enum, v)) for v in (1, 2, 3)]
    for p in prod.mig_profiles:
        steps += [
            Call("nvmlDeviceGetGpuInstanceProfileInfoById", (d, p.id, 2)),
            Call("nvmlDeviceGetGpuInstanceProfileInfoById", (d, p.id, 3)),
            Call("nvmlDeviceGetGpuInstancePossiblePlacements", (d, p.id)),
            Call("nvmlDeviceGetGpuInstanceRemainingCapacity", (d, p.id)),
            Call("nvmlDeviceGetGpuInstances", (d, p.id, p.instance_count)),
        ]
    bad = 99
    steps += [
        Call("nvmlDeviceGetGpuInstanceProfileInfoById", (d, bad, 2)),
        Call("nvmlDeviceGetGpuInstancePossiblePlacements", (d, bad)),
        Call("nvmlDeviceGetGpuInstanceRemainingCapacity", (d, bad)),
        Call("nvmlDeviceCreateGpuInstance", (d, bad)),
        Call("nvmlDeviceCreateGpuInstanceWithPlacement", (d, bad, 0, 1)),
    ]
    for n, p in enumerate(prod.mig_profiles):
        illegal = next((s for s in range(8) if s not in p.placements), None)
        if illegal is not None:
            steps.append(Call("nvmlDeviceCreateGpuInstanceWithPlacement", (d, p.id, illegal, p.memory_slices)))
        steps.append(Call("nvmlDeviceCreateGpuInstanceWithPlacement", (d, p.id, p.placements[0], p.memory_slices + 1)))
        for k, start in enumerate(p.placements):
            steps += _full_instance(i, d, prod, n, start, deep=k == 0)
    # Every slice taken by the smallest profile: nothing else fits, of any profile.
    one = next(p for p in prod.mig_profiles if p.enum == "1_SLICE")
    for start in one.placements:
        steps.append(Call("nvmlDeviceCreateGpuInstanceWithPlacement", (d, one.id, start, 1), save=f"m{i}_{start}"))
    steps += [Call("nvmlDeviceGetGpuInstances", (d, one.id, one.instance_count))]
    steps += [Call("nvmlDeviceGetGpuInstanceRemainingCapacity", (d, p.id)) for p in prod.mig_profiles]
    steps += [Call("nvmlDeviceCreateGpuInstance", (d, p.id)) for p in prod.mig_profiles]
    steps += [Call("nvmlGpuInstanceDestroy", (Var(f"m{i}_{start}"),)) for start in one.placements]
    steps += _sub_instances(i, d, prod)
    steps += _default_placements(i, d, prod)
    steps += [Call("nvmlDeviceSetMigMode", (d, pynvml.NVML_DEVICE_MIG_DISABLE)), Call("nvmlDeviceGetMigMode", (d,))]
    return steps


def _events(i: int) -> list[Step]:
    d, s = Var(f"d{i}"), Var(f"set{i}")
    return [
        Call("nvmlEventSetCreate", (), save=s.name),
        Call("nvmlDeviceRegisterEvents", (d, XID | pynvml.nvmlEventTypeDoubleBitEccError, s)),
        Call("nvmlDeviceRegisterEvents", (d, pynvml.nvmlEventTypePState, s)),  # unsupported type
        Call("nvmlEventSetWait", (s, 0)),  # TIMEOUT: nothing since the set was made
        OutOfBand("inject_event", (i, XID), {"xid": 79}),
        OutOfBand("inject_event", (i, pynvml.nvmlEventTypeDoubleBitEccError)),
        Call("nvmlEventSetWait", (s, 2000)),
        Call("nvmlEventSetWait", (s, 2000)),
        Call("nvmlEventSetWait", (s, 10)),
        Call("nvmlEventSetFree", (s,)),
    ]


def machine_script(spec: MachineSpec) -> list[Step]:
    n = len(spec.gpus)
    steps: list[Step] = [OutOfBand("place_in_fabric", FABRIC)] if spec.nvlink_fabric else []
    steps.append(OutOfBand("attach_process", (0, os.getpid())))  # this process holds GPU 0 on each copy
    steps += [
        Call("nvmlInit"),
        Call("nvmlSystemGetDriverVersion"),
        Call("nvmlSystemGetNVMLVersion"),
        Call("nvmlSystemGetCudaDriverVersion"),
        Call("nvmlSystemGetCudaDriverVersion_v2"),
        Call("nvmlDeviceGetCount"),
        Call("nvmlDeviceGetHandleByIndex", (n,)),
        Call("nvmlDeviceGetHandleByUUID", ("GPU-00000000-0000-0000-0000-000000000000",)),
        Call("nvmlDeviceGetHandleByUUIDV", ("GPU-00000000-0000-0000-0000-000000000000", pynvml.NVML_UUID_TYPE_BINARY)),
        Call("nvmlDeviceGetHandleByUUIDV", ("GPU-00000000-0000-0000-0000-000000000000", 7)),
        Call("nvmlDeviceGetHandleByPciBusId", ("0000:ff:1f.0",)),
        Call("nvmlDeviceGetHandleByPciBusId", ("not a bus id",)),
    ]
    steps.append(Call("nvmlDeviceGetHandleByIndex", (0,), save="d0"))  # the other end of topology queries
    for i, gpu in enumerate(spec.gpus):
        d = Var(f"d{i}")
        domain, bus, devfn = gpu.pci_bus_id.split(":")
        steps += [
            Call("nvmlDeviceGetHandleByIndex", (i,), save=d.name),
            Call("nvmlDeviceGetUUID", (d,), save=f"u{i}"),
            Call("nvmlDeviceGetHandleByUUID", (Var(f"u{i}"),)),
            Call("nvmlDeviceGetHandleByUUIDV", (Var(f"u{i}"), pynvml.NVML_UUID_TYPE_ASCII)),
            Call("nvmlDeviceGetHandleByUUIDV", (Var(f"u{i}"), pynvml.NVML_UUID_TYPE_BINARY)),
            Call("nvmlDeviceGetHandleByPciBusId", (gpu.pci_bus_id,)),
            Call("nvmlDeviceGetHandleByPciBusId", (f"{int(domain, 16):04x}:{bus.lower()}:{devfn}",)),
            Call("nvmlDeviceGetHandleByPciBusId", (f"{bus}:{devfn}",)),
            *_device_queries(d),
        ]
        if not product(gpu.product).mig_capable:
            steps.append(Call("nvmlDeviceSetMigMode", (d, pynvml.NVML_DEVICE_MIG_ENABLE)))  # NOT_SUPPORTED
    steps += [
        Call("nvmlDeviceSetComputeMode", (Var("d0"), pynvml.NVML_COMPUTEMODE_PROHIBITED)),
        Call("nvmlDeviceGetComputeMode", (Var("d0"),)),
        Call("nvmlDeviceSetComputeMode", (Var("d0"), 42)),
        Call("nvmlDeviceSetComputeMode", (Var("d0"), pynvml.NVML_COMPUTEMODE_DEFAULT)),
        *_events(0),
    ]
    done: set[str] = set()  # one GPU of each MIG-capable product covers its profile table
    for i, gpu in enumerate(spec.gpus):
        prod = product(gpu.product)
        if prod.mig_capable and gpu.product not in done:
            done.add(gpu.product)
            steps += _mig_script(i, prod)
    last = n - 1
    steps += [
        OutOfBand("set_gpu_lost", (last, True)),
        Call("nvmlDeviceGetName", (Var(f"d{last}"),)),
        Call("nvmlDeviceGetHandleByIndex", (last,)),
        OutOfBand("set_gpu_lost", (last, False)),
        Call("nvmlDeviceGetName", (Var(f"d{last}"),)),
        Call("nvmlShutdown"),
        Call("nvmlShutdown"),  # UNINITIALIZED
    ]
    return steps


@pytest.fixture(autouse=True)
def _short_lived_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRA_DRIVER_LIBNVML_IDLE_S", "5")


@pytest.mark.parametrize("name", machine_names())
def test_c_api_matches_the_python_simulator(name: str, tmp_path: Path) -> None:
    built_library()
    probe = gonvmlprobe_binary()
    spec = machine(name)
    ref = SimulatedNvml(spec, tmp_path / "reference")
    via_ctypes = SimulatedNvml(spec, tmp_path / "ctypes")
    via_go = SimulatedNvml(spec, tmp_path / "go")
    script = machine_script(spec)
    with pynvml_on(simulated_library(via_ctypes)) as lib:
        executors: list[Executor] = [
            PyExecutor(ref, ref, "simulator"),
            PyExecutor(via_ctypes, lib, "pynvml→C"),
            GoExecutor(via_go, probe, simulated_library(via_go)),
        ]
        try:
            differences, calls = run_script(executors, script)
        finally:
            for ex in executors:
                ex.close()
    assert not differences, f"{len(differences)} of {calls} calls differ:\n" + "\n".join(differences[:40])
    assert calls > 300
    # The three machines end where the script leaves them: the same MIG state.
    strip = [(g.mig_current, g.mig_pending, g.gpu_instances) for g in ref.store.read().gpus]
    for sim in (via_ctypes, via_go):
        assert [(g.mig_current, g.mig_pending, g.gpu_instances) for g in sim.store.read().gpus] == strip
