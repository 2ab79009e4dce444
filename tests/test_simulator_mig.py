"""The simulator's MIG rules, exercised only through pynvml's call surface."""

from __future__ import annotations

import ctypes
import itertools
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from dra_driver.simulator.catalog import product
from dra_driver.simulator.nvml import SimulatedNvml
from tests.simhelpers import create_full_ci, create_gi, nvml_code

MIG_ON = pynvml.NVML_DEVICE_MIG_ENABLE


def _enable_mig(sim: SimulatedNvml, dev: object) -> None:
    status = sim.nvmlDeviceSetMigMode(dev, MIG_ON)
    if status == pynvml.NVML_ERROR_RESET_REQUIRED:
        sim.reset_gpu(sim.nvmlDeviceGetIndex(dev))
    assert sim.nvmlDeviceGetMigMode(dev) == [1, 1]


def _partitions(key: str) -> list[tuple[int, int, int, int]]:
    """(profile id, start, size, compute slices) for every profile x placement of a product."""
    return [(p.id, s, p.memory_slices, p.compute_slices) for p in product(key).mig_profiles for s in p.placements]


@pytest.mark.parametrize(("machine", "key"), [("dgx-h100", "h100-sxm5-80gb"), ("dgx-a100", "a100-sxm4-40gb")])
def test_every_placement_of_every_profile(sim_factory, machine: str, key: str) -> None:
    sim = sim_factory(machine)
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    _enable_mig(sim, dev)
    for profile_id, start, size, slices in _partitions(key):
        gi = create_gi(sim, dev, profile_id, start, size)
        info = sim.nvmlGpuInstanceGetInfo(gi)
        assert isinstance(info, pynvml.c_nvmlGpuInstanceInfo_t)
        assert (info.profileId, info.placement.start, info.placement.size) == (profile_id, start, size)
        ci = create_full_ci(sim, gi, slices)
        ci_info = sim.nvmlComputeInstanceGetInfo(ci)
        assert sim.nvmlDeviceGetUUID(ci_info.device).startswith("MIG-")
        sim.nvmlComputeInstanceDestroy(ci)
        sim.nvmlGpuInstanceDestroy(gi)


@pytest.mark.parametrize(("machine", "key"), [("dgx-h100", "h100-sxm5-80gb"), ("dgx-a100", "a100-sxm4-40gb")])
def test_illegal_placements_are_invalid_argument(sim_factory, machine: str, key: str) -> None:
    sim = sim_factory(machine)
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    _enable_mig(sim, dev)
    for p in product(key).mig_profiles:
        for start in range(8):
            if start in p.placements:
                continue
            with pytest.raises(pynvml.NVMLError_InvalidArgument):
                create_gi(sim, dev, p.id, start, p.memory_slices)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # wrong size for a legal start
            create_gi(sim, dev, p.id, p.placements[0], p.memory_slices + 1)


@pytest.mark.parametrize(("machine", "key"), [("dgx-h100", "h100-sxm5-80gb"), ("dgx-a100", "a100-sxm4-40gb")])
def test_overlap_rejection_for_every_pair(sim_factory, machine: str, key: str) -> None:
    """Oracle: two placements conflict iff their memory slices intersect, or the pair breaks an instance or
    compute-slice limit. A conflict must be INSUFFICIENT_RESOURCES (never ALREADY_EXISTS)."""
    sim = sim_factory(machine)
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    _enable_mig(sim, dev)
    limits = {p.id: p.instance_count for p in product(key).mig_profiles}
    parts = _partitions(key)
    checked = 0
    for a, b in itertools.product(parts, repeat=2):
        overlap = set(range(a[1], a[1] + a[2])) & set(range(b[1], b[1] + b[2]))
        conflict = bool(overlap) or (a[0] == b[0] and limits[a[0]] < 2) or a[3] + b[3] > 7
        first = create_gi(sim, dev, a[0], a[1], a[2])
        if conflict:
            with pytest.raises(pynvml.NVMLError) as err:
                create_gi(sim, dev, b[0], b[1], b[2])
            assert nvml_code(err) == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
        else:
            sim.nvmlGpuInstanceDestroy(create_gi(sim, dev, b[0], b[1], b[2]))
        sim.nvmlGpuInstanceDestroy(first)
        checked += 1
    assert checked == len(parts) ** 2


def test_instance_count_limit(sim_factory) -> None:
    sim = sim_factory("dgx-h100")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    _enable_mig(sim, dev)
    create_gi(sim, dev, 20, 0, 1)  # 1g.10gb+me: at most one per GPU
    assert sim.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, 20) == 0
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create_gi(sim, dev, 20, 3, 1)
    assert sim.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, 19) == 6


def test_destroy_order_gpu_instance_in_use_until_compute_instances_are_gone(sim_factory) -> None:
    sim = sim_factory("dgx-h100")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    _enable_mig(sim, dev)
    gi = create_gi(sim, dev, 9, 4, 4)  # 3g.40gb
    gi_id = sim.nvmlGpuInstanceGetInfo(gi).id
    ci = create_full_ci(sim, gi, 3)
    with pytest.raises(pynvml.NVMLError_InUse):
        sim.nvmlGpuInstanceDestroy(gi)
    assert sim.nvmlGpuInstanceGetInfo(sim.nvmlDeviceGetGpuInstanceById(dev, gi_id)).id == gi_id  # still there
    sim.nvmlComputeInstanceDestroy(ci)
    sim.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # stale handle
        sim.nvmlGpuInstanceGetInfo(gi)
    with pytest.raises(pynvml.NVMLError_NotFound):
        sim.nvmlDeviceGetGpuInstanceById(dev, gi_id)


def test_gpu_instance_ids_are_not_placements_nor_sequential(sim_factory) -> None:
    sim = sim_factory("dgx-h100")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    _enable_mig(sim, dev)
    ids = [sim.nvmlGpuInstanceGetInfo(create_gi(sim, dev, 19, s, 1)).id for s in range(7)]
    assert len(set(ids)) == 7
    assert all(0 <= i <= 14 for i in ids)
    assert ids != list(range(7)) and ids != sorted(ids)
    assert all(i != s for s, i in enumerate(ids))


def test_ids_depend_on_creation_order_not_on_placement(sim_factory) -> None:
    a, b = sim_factory("dgx-h100"), sim_factory("dgx-h100")
    da, db = a.nvmlDeviceGetHandleByIndex(0), b.nvmlDeviceGetHandleByIndex(0)
    _enable_mig(a, da)
    _enable_mig(b, db)
    a_first = a.nvmlGpuInstanceGetInfo(create_gi(a, da, 9, 0, 4)).id
    b_first = b.nvmlGpuInstanceGetInfo(create_gi(b, db, 9, 4, 4)).id
    b_second = b.nvmlGpuInstanceGetInfo(create_gi(b, db, 9, 0, 4)).id
    assert a_first == b_first  # same id for the first 3g, whatever its placement
    assert b_second != a_first  # the 3g at 0 gets another id when created second


def test_default_placement_reproduces_the_guides_ordering_failure(sim_factory) -> None:
    """MIG user guide: on an empty A100, `-cgi 19,19,14,9` fails on the 3g; creating 9 first works."""
    sim = sim_factory("dgx-a100")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    _enable_mig(sim, dev)
    made = [sim.nvmlDeviceCreateGpuInstance(dev, pid) for pid in (19, 19, 14)]
    starts = sorted(sim.nvmlGpuInstanceGetInfo(g).placement.start for g in made)
    assert starts == [0, 4, 6]
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        sim.nvmlDeviceCreateGpuInstance(dev, 9)
    for g in made:
        sim.nvmlGpuInstanceDestroy(g)
    for pid in (9, 19, 19, 14):
        sim.nvmlDeviceCreateGpuInstance(dev, pid)


def test_mig_mode_ampere_needs_reset(sim_factory) -> None:
    sim = sim_factory("dgx-a100")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceGetMigMode(dev) == [0, 0]
    assert sim.nvmlDeviceSetMigMode(dev, MIG_ON) == pynvml.NVML_ERROR_RESET_REQUIRED
    assert sim.nvmlDeviceGetMigMode(dev) == [0, 1]  # pending only
    with pytest.raises(pynvml.NVMLError_NotSupported):
        create_gi(sim, dev, 19, 0, 1)
    sim.reset_gpu(0)
    assert sim.nvmlDeviceGetMigMode(dev) == [1, 1]
    create_gi(sim, dev, 19, 0, 1)


def test_mig_mode_hopper_switches_at_once_and_refuses_while_in_use(sim_factory) -> None:
    sim = sim_factory("dgx-h100")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceSetMigMode(dev, MIG_ON) == pynvml.NVML_SUCCESS
    assert sim.nvmlDeviceGetMigMode(dev) == [1, 1]
    gi = create_gi(sim, dev, 0, 0, 8)
    assert sim.nvmlDeviceSetMigMode(dev, pynvml.NVML_DEVICE_MIG_DISABLE) == pynvml.NVML_ERROR_IN_USE
    assert sim.nvmlDeviceGetMigMode(dev) == [1, 1]
    sim.nvmlGpuInstanceDestroy(gi)
    assert sim.nvmlDeviceSetMigMode(dev, pynvml.NVML_DEVICE_MIG_DISABLE) == pynvml.NVML_SUCCESS
    assert sim.nvmlDeviceGetMigMode(dev) == [0, 0]


def test_mig_not_supported_on_gpu_without_mig(sim_factory) -> None:
    sim = sim_factory("mixed")
    l40s = sim.nvmlDeviceGetHandleByIndex(4)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetMigMode(l40s)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetGpuInstanceProfileInfo(l40s, 0)


def test_profile_enumeration_idiom(sim_factory) -> None:
    """Enum values the product lacks are NOT_SUPPORTED; past the last enum is INVALID_ARGUMENT."""
    sim = sim_factory("dgx-h100")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    info = sim.nvmlDeviceGetGpuInstanceProfileInfo(dev, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    assert isinstance(info, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t)
    assert (info.id, info.sliceCount, info.memorySizeMB) == (9, 3, 40448)  # id is not the enum value (2)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetGpuInstanceProfileInfo(dev, pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetGpuInstanceProfileInfo(dev, pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)


def test_possible_placements_use_pynvml_raw_ctypes_convention(sim_factory) -> None:
    sim = sim_factory("dgx-h100")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    count = ctypes.c_uint(0)
    sim.nvmlDeviceGetGpuInstancePossiblePlacements(dev, 15, None, ctypes.byref(count))
    assert count.value == 4
    small = (pynvml.c_nvmlGpuInstancePlacement_t * 2)()
    short = ctypes.c_uint(2)
    with pytest.raises(pynvml.NVMLError_InsufficientSize):
        sim.nvmlDeviceGetGpuInstancePossiblePlacements(dev, 15, small, ctypes.byref(short))
    array = (pynvml.c_nvmlGpuInstancePlacement_t * 4)()
    sim.nvmlDeviceGetGpuInstancePossiblePlacements(dev, 15, array, ctypes.byref(count))
    assert [(p.start, p.size) for p in array] == [(0, 2), (2, 2), (4, 2), (6, 2)]


def test_mig_device_handles_and_uuids(sim_factory) -> None:
    sim = sim_factory("dgx-h100")
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    _enable_mig(sim, dev)
    assert sim.nvmlDeviceGetMaxMigDeviceCount(dev) == 7
    with pytest.raises(pynvml.NVMLError_NotFound):
        sim.nvmlDeviceGetMigDeviceHandleByIndex(dev, 0)
    gi = create_gi(sim, dev, 14, 2, 2)
    ci = create_full_ci(sim, gi, 2)
    mig = sim.nvmlComputeInstanceGetInfo(ci).device
    first_uuid = sim.nvmlDeviceGetUUID(mig)
    assert first_uuid.startswith("MIG-") and first_uuid != sim.nvmlDeviceGetUUID(dev)
    assert sim.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    by_index = sim.nvmlDeviceGetMigDeviceHandleByIndex(dev, 0)
    assert sim.nvmlDeviceGetUUID(by_index) == first_uuid
    assert sim.nvmlDeviceGetGpuInstanceId(by_index) == sim.nvmlGpuInstanceGetInfo(gi).id
    assert sim.nvmlDeviceGetComputeInstanceId(by_index) == 0
    assert sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetHandleByUUID(first_uuid)) == first_uuid
    parent = sim.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert sim.nvmlDeviceGetUUID(parent) == sim.nvmlDeviceGetUUID(dev)
    attrs = sim.nvmlDeviceGetAttributes(mig)
    assert (attrs.multiprocessorCount, attrs.gpuInstanceSliceCount, attrs.memorySizeMB) == (32, 2, 20096)
    # usable memory of the MIG device depends on its placement, so it is not the profile's memorySizeMB
    assert sim.nvmlDeviceGetMemoryInfo(mig).total != 20096 << 20
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetAttributes(dev)
    sim.nvmlComputeInstanceDestroy(ci)
    sim.nvmlGpuInstanceDestroy(gi)
    gi = create_gi(sim, dev, 14, 2, 2)
    mig = sim.nvmlComputeInstanceGetInfo(create_full_ci(sim, gi, 2)).device
    assert sim.nvmlDeviceGetUUID(mig) != first_uuid  # re-created: new UUID


def test_calls_before_init_fail_uninitialized(tmp_path: Path) -> None:
    sim = SimulatedNvml("dgx-h100", tmp_path)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()
    sim.nvmlInit()
    assert sim.nvmlDeviceGetCount() == 8
    sim.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetHandleByIndex(0)


def test_lost_gpu(sim_factory) -> None:
    sim = sim_factory("dgx-h100")
    dev = sim.nvmlDeviceGetHandleByIndex(3)
    sim.set_gpu_lost(3)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetUUID(dev)
    sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetHandleByIndex(2))
    sim.set_gpu_lost(3, lost=False)
    sim.nvmlDeviceGetUUID(dev)


def test_unmodelled_pynvml_function_is_function_not_found(sim_factory) -> None:
    sim = sim_factory("dgx-h100")
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        sim.nvmlDeviceGetFanSpeed(sim.nvmlDeviceGetHandleByIndex(0))
    with pytest.raises(AttributeError):
        sim.not_an_nvml_function  # noqa: B018


def test_state_is_shared_between_instances_and_processes(tmp_path: Path) -> None:
    one = SimulatedNvml("dgx-h100", tmp_path)
    one.nvmlInit()
    dev = one.nvmlDeviceGetHandleByIndex(1)
    _enable_mig(one, dev)
    gi = create_gi(one, dev, 5, 0, 4)
    create_full_ci(one, gi, 4)

    two = SimulatedNvml("dgx-h100", tmp_path)
    two.nvmlInit()
    dev2 = two.nvmlDeviceGetHandleByIndex(1)
    assert two.nvmlDeviceGetMigMode(dev2) == [1, 1]
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        create_gi(two, dev2, 9, 0, 4)

    script = (
        "import sys, pynvml\n"
        "from dra_driver.simulator.nvml import SimulatedNvml\n"
        "s = SimulatedNvml('dgx-h100', sys.argv[1]); s.nvmlInit()\n"
        "d = s.nvmlDeviceGetHandleByIndex(1)\n"
        "print(s.nvmlGpuInstanceGetInfo(s.nvmlDeviceGetGpuInstanceById(d, 1)).profileId)\n"
        "h = s.nvmlDeviceGetMigDeviceHandleByIndex(d, 0)\n"
        "ci = s.nvmlGpuInstanceGetComputeInstanceById(s.nvmlDeviceGetGpuInstanceById(d, 1), 0)\n"
        "s.nvmlComputeInstanceDestroy(ci)\n"
        "s.nvmlGpuInstanceDestroy(s.nvmlDeviceGetGpuInstanceById(d, 1))\n"
    )
    gi_id = one.nvmlGpuInstanceGetInfo(gi).id
    out = subprocess.run(
        [sys.executable, "-c", script.replace("d, 1", f"d, {gi_id}"), str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "5"
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # destroyed by the other process
        one.nvmlGpuInstanceGetInfo(gi)
    create_gi(one, dev, 9, 0, 4)


def test_state_of_another_machine_is_refused(tmp_path: Path) -> None:
    SimulatedNvml("dgx-h100", tmp_path)
    with pytest.raises(ValueError, match="belongs to machine 'dgx-h100'"):
        SimulatedNvml("dgx-a100", tmp_path)


def test_the_fake_procfs_follows_every_instance_and_rebuilds_without_its_marker(sim_factory) -> None:
    """/proc/driver/nvidia/capabilities as the driver shows it: an access file per GPU and compute instance with
    its nvidia-cap minor, gone with the instance (its empty directories too); rebuilt from the tree when the
    record of what it shows is lost."""
    from dra_driver.simulator.procfs import ci_cap_minor, gi_cap_minor

    sim = sim_factory("dgx-h100")
    caps = sim.proc_root / "driver" / "nvidia" / "capabilities"

    def tree() -> dict[str, int]:
        return {
            str(p.relative_to(caps)): int(p.read_text().split("DeviceFileMinor: ")[1].split()[0])
            for p in sorted(caps.rglob("*"))
            if p.is_file()
        }

    dev = sim.nvmlDeviceGetHandleByIndex(2)
    _enable_mig(sim, dev)
    minor = sim.nvmlDeviceGetMinorNumber(dev)
    profiles = {p.name: p.id for p in product("h100-sxm5-80gb").mig_profiles}
    gi = create_gi(sim, dev, profiles["1g.10gb"], 3, 1)
    ci = create_full_ci(sim, gi, 1)
    gi_id, ci_id = sim.nvmlGpuInstanceGetInfo(gi).id, sim.nvmlComputeInstanceGetInfo(ci).id
    other = create_gi(sim, dev, profiles["2g.20gb"], 4, 2)
    other_id = sim.nvmlGpuInstanceGetInfo(other).id
    expected = {
        "mig/config": 1,
        "mig/monitor": 2,
        f"gpu{minor}/mig/gi{gi_id}/access": gi_cap_minor(minor, gi_id),
        f"gpu{minor}/mig/gi{gi_id}/ci{ci_id}/access": ci_cap_minor(minor, gi_id, ci_id),
        f"gpu{minor}/mig/gi{other_id}/access": gi_cap_minor(minor, other_id),
    }
    assert tree() == expected
    # /proc/driver/nvidia-caps/mig-minors names the same minor for every instance that can exist (NVIDIA's container
    # toolkit reads it): each access file's, and as many as 15 GIs of 8 CIs each allow on every GPU.
    listed = dict(line.split() for line in (sim.proc_root / "driver" / "nvidia-caps" / "mig-minors").open())
    assert all(
        listed[path.replace("mig/", "", 1) if path.startswith("gpu") else path[4:]] == str(m)
        for path, m in expected.items()
    )
    assert len(listed) == 2 + len(sim.minors) * 15 * 9 and listed["gpu7/gi14/ci7/access"] == str(ci_cap_minor(7, 14, 7))
    sim.nvmlComputeInstanceDestroy(ci)
    assert not (caps / f"gpu{minor}" / "mig" / f"gi{gi_id}" / f"ci{ci_id}").exists()  # its directory too
    sim.nvmlGpuInstanceDestroy(gi)
    assert not (caps / f"gpu{minor}" / "mig" / f"gi{gi_id}").exists()
    assert tree() == {k: v for k, v in expected.items() if f"gi{gi_id}/" not in k}
    (sim.proc_root / ".instances").unlink()  # lost: the next change reads the tree itself
    sim.nvmlGpuInstanceDestroy(other)
    assert tree() == {"mig/config": 1, "mig/monitor": 2}
    assert not (caps / f"gpu{minor}").exists() or not any((caps / f"gpu{minor}").rglob("access"))
