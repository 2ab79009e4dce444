"""ResourceSlice generation: layouts and limits per Kubernetes minor, counters, names, modes."""

from __future__ import annotations

import itertools
import json
import random

import pynvml
import pytest

from dra_driver.api.slice import Device, DeviceTaint, ResourceSlice
from dra_driver.nvml.discovery import discover
from dra_driver.nvml.inventory import GpuInfo, Inventory, MigProfile, Placement
from dra_driver.slices import attributes as A
from dra_driver.slices.builder import PublishMode, SliceLimitError, build_slices
from dra_driver.slices.limits import limits_for, parse_minor
from dra_driver.slices.naming import GpuRef, MigRef, mig_device_name, parse_device_name
from tests.simhelpers import create_gi


def _inventory(sim_factory, machine: str) -> Inventory:
    sim = sim_factory(machine)
    return discover(sim, sim.sysfs_root)


def _devices(slices: list[ResourceSlice]) -> list[Device]:
    return [d for s in slices for d in s.spec.devices or []]


def _qty(v: str) -> int:
    for i, suffix in enumerate(("Ki", "Mi", "Gi", "Ti"), start=1):
        if v.endswith(suffix):
            return int(v[: -len(suffix)]) * 1024**i
    return int(v)


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_dgx_h200_fits_the_limits(sim_factory, version: str) -> None:
    inv = _inventory(sim_factory, "dgx-h200")
    slices = build_slices(inv, node_name="node-a", k8s_version=version)
    devices = _devices(slices)
    assert len(devices) == 8 * (1 + 7 + 7 + 4 + 3 + 2 + 1 + 1)  # whole GPU + every profile x placement
    assert sum(len(s.spec.shared_counters or []) for s in slices) == 8
    if version == "1.34":
        assert len(slices) == 8  # one slice per GPU with its counter set and devices
        assert all(s.spec.shared_counters and s.spec.devices for s in slices)
    else:
        assert len(slices) == 10  # counter sets alone, then the whole GPUs, then one slice per GPU's partitions
        assert slices[0].spec.devices is None and len(slices[0].spec.shared_counters or []) == 8
        assert all(s.spec.shared_counters is None for s in slices[1:])
        assert [d.name for d in slices[1].spec.devices or []] == [f"gpu-{i}" for i in range(8)]
        for i, s in enumerate(slices[2:]):
            assert {d.name.split("-mig-")[0] for d in s.spec.devices or []} == {f"gpu-{i}"}
    assert {s.spec.pool.resource_slice_count for s in slices} == {len(slices)}
    assert {s.spec.pool.name for s in slices} == {"node-a"}
    assert len({s.metadata.name for s in slices}) == len(slices)


@pytest.mark.parametrize("machine", ["dgx-h100", "mixed", "dgx-b200", "gb200-nvl72-tray"])
def test_slice_names_sort_as_the_devices_should_be_tried(sim_factory, machine: str) -> None:
    """1.36's allocator tries a node's slices in name order: the counter sets, then every whole GPU, then the
    partitions (a whole-GPU claim meets no partition of a GPU in use before a free GPU), however many slices."""
    slices = build_slices(_inventory(sim_factory, machine), node_name="n", k8s_version="1.37")
    tried = [d for s in sorted(slices, key=lambda s: s.metadata.name) for d in s.spec.devices or []]
    assert tried == [d for s in slices for d in s.spec.devices or []]  # the name order is the built order
    carved = {d.name.split("-mig-")[0] for d in tried if "-mig-" in d.name}
    wholes = [i for i, d in enumerate(tried) if d.name in carved]
    partitions = [i for i, d in enumerate(tried) if "-mig-" in d.name]
    assert carved and max(wholes) < min(partitions)  # every whole GPU with partitions before any partition
    assert len({len(s.metadata.name) for s in slices}) == 1  # indices as wide as the last


def test_output_is_deterministic_across_processes_and_state_dirs(sim_factory) -> None:
    a = [s.to_api() for s in build_slices(_inventory(sim_factory, "dgx-h100"), node_name="n")]
    b = [s.to_api() for s in build_slices(_inventory(sim_factory, "dgx-h100"), node_name="n")]
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_attributes_mirror_the_official_driver(sim_factory) -> None:
    inv = _inventory(sim_factory, "dgx-h100")
    devices = {d.name: d for d in _devices(build_slices(inv, node_name="n"))}
    gpu, mig = devices["gpu-3"], devices["gpu-3-mig-3g40gb-9-4"]
    g = inv.gpu_by_minor(3)
    assert {k: v.value() for k, v in gpu.attributes.items()} == {
        "type": "gpu",
        "uuid": g.uuid,
        "productName": "NVIDIA H100 80GB HBM3",
        "brand": "Nvidia",
        "architecture": "Hopper",
        "cudaComputeCapability": "9.0.0",
        "driverVersion": "550.54.15",
        "cudaDriverVersion": "12.4.0",
        "resource.kubernetes.io/pciBusID": "0000:61:00.0",
        "resource.kubernetes.io/pcieRoot": "pci0000:5b",
        "numaNode": 0,  # Kubernetes' own resource.kubernetes.io/numaNode from 1.37 on
    }
    assert gpu.attributes["cudaComputeCapability"].version == "9.0.0"  # typed as version, not string
    assert mig.attributes["type"].value() == "mig" and mig.attributes["profile"].value() == "3g.40gb"
    assert mig.attributes["parentUUID"].value() == g.uuid and "uuid" not in mig.attributes
    assert {k: v.value for k, v in mig.capacity.items()} == {
        "multiprocessors": "60",
        "copyEngines": "3",
        "decoders": "3",
        "encoders": "0",
        "jpegEngines": "3",
        "ofaEngines": "0",
        "memory": "40448Mi",
    }
    assert gpu.capacity["memory"].value == "81559Mi"


def test_device_names_parse_back_to_what_they_consume(sim_factory) -> None:
    inv = _inventory(sim_factory, "dgx-h200")
    for d in _devices(build_slices(inv, node_name="n")):
        ref = parse_device_name(d.name)
        if isinstance(ref, GpuRef):
            assert d.attributes["type"].value() == "gpu"
            continue
        assert isinstance(ref, MigRef)
        profile = inv.gpu_by_minor(ref.parent_minor).profile(ref.profile_id)
        assert d.attributes["profile"].value() == profile.name
        (consumption,) = d.consumes_counters or []
        slices = sorted(int(k.removeprefix("memory-slice-")) for k in consumption.counters if k.startswith("memory-"))
        assert slices == list(range(ref.placement_start, ref.placement_start + profile.memory_slices))
        assert consumption.counter_set == f"gpu-{ref.parent_minor}-counter-set"


@pytest.mark.parametrize("bad", ["gpu-", "gpu-x", "gpu-0-mig-1g10gb-19", "mig-1g10gb-19-0", "gpu-0-mig--19-0"])
def test_parse_rejects_foreign_names(bad: str) -> None:
    with pytest.raises(ValueError, match="not a device name of this driver"):
        parse_device_name(bad)


def test_plus_me_profile_name_is_a_dns_label() -> None:
    assert mig_device_name(0, "1g.10gb+me", 20, 3) == "gpu-0-mig-1g10gb-me-20-3"
    assert parse_device_name("gpu-0-mig-1g10gb-me-20-3") == MigRef(0, "1g10gb-me", 20, 3)


def test_whole_gpu_consumes_every_counter(sim_factory) -> None:
    slices = build_slices(_inventory(sim_factory, "dgx-h100"), node_name="n", k8s_version="1.34")
    for s in slices:
        (counter_set,) = s.spec.shared_counters or []
        whole = next(d for d in s.spec.devices or [] if d.attributes["type"].value() == "gpu")
        (consumed,) = whole.consumes_counters or []
        assert consumed.counters == counter_set.counters


@pytest.mark.parametrize("machine", ["dgx-h100", "dgx-a100", "dgx-h200", "dgx-b200"])
def test_every_layout_the_gpu_accepts_fits_the_counters(sim_factory, machine: str) -> None:
    """Oracle: the simulator (NVML rules). Any set of partitions it lets us create together must fit the
    published counters, and any two partitions sharing a memory slice must not."""
    sim = sim_factory(machine)
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    if sim.nvmlDeviceSetMigMode(dev, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_ERROR_RESET_REQUIRED:
        sim.reset_gpu(0)
    inv = discover(sim, sim.sysfs_root)
    slices = build_slices(inv, node_name="n", k8s_version="1.35")
    counters = {k: _qty(c.value) for k, c in (slices[0].spec.shared_counters or [])[0].counters.items()}
    partitions = [d for d in _devices(slices) if d.name.startswith("gpu-0-mig-")]
    rng = random.Random(7)
    largest_layout = 0
    for _ in range(60):
        chosen: list[Device] = []
        for d in rng.sample(partitions, len(partitions)):
            ref = parse_device_name(d.name)
            assert isinstance(ref, MigRef)
            size = inv.gpus[0].profile(ref.profile_id).memory_slices
            try:
                create_gi(sim, dev, ref.profile_id, ref.placement_start, size)
            except pynvml.NVMLError:
                continue
            chosen.append(d)
        used: dict[str, int] = {}
        for d in chosen:
            for k, v in (d.consumes_counters or [])[0].counters.items():
                used[k] = used.get(k, 0) + _qty(v.value)
        assert all(used[k] <= counters[k] for k in used), (sorted(d.name for d in chosen), used, counters)
        largest_layout = max(largest_layout, len(chosen))
        sim.reset_gpu(0)
    assert largest_layout >= 4  # the random layouts did combine several partitions
    for a, b in itertools.combinations(partitions, 2):
        ca, cb = (a.consumes_counters or [])[0].counters, (b.consumes_counters or [])[0].counters
        shared = {k for k in ca if k.startswith("memory-slice")} & set(cb)
        # two partitions sharing a memory slice would need 2 of a counter that holds 1
        assert all(_qty(ca[k].value) + _qty(cb[k].value) > counters[k] for k in shared), (a.name, b.name)


@pytest.mark.parametrize("machine", ["dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72-tray", "mixed"])
def test_the_published_counters_admit_exactly_what_every_counter_would(sim_factory, machine: str) -> None:
    """Only the capacity counters that bind are published (slices.counters.binding_capacities): brute force over
    every combination of a GPU's partitions with disjoint memory slices, each is admitted by the published counters
    if and only if it is admitted by a counter for every capacity (each at its legal maximum, counter_totals)."""
    from dra_driver.slices.counters import counter_totals, profile_capacities

    sim = sim_factory(machine)
    dev = sim.nvmlDeviceGetHandleByIndex(0)
    if sim.nvmlDeviceSetMigMode(dev, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_ERROR_RESET_REQUIRED:
        sim.reset_gpu(0)  # Ampere: MIG on demand needs MIG on
    inv = discover(sim, sim.sysfs_root)
    slices = build_slices(inv, node_name="n", k8s_version="1.37", mode=PublishMode.PARTITIONABLE)
    gpu = inv.gpus[0]
    counter_set = next(
        c for s in slices for c in s.spec.shared_counters or [] if c.name.endswith(f"-{gpu.minor}-counter-set")
    )
    published = {k: _qty(c.value) for k, c in counter_set.counters.items()}
    assert len(published) < len(A.MIG_CAPACITIES) + 8  # fewer than a counter per capacity and memory slice
    totals = counter_totals(gpu.mig_profiles)
    partitions = []  # (first memory slice, slices, published consumption, every capacity)
    for d in _devices(slices):
        ref = parse_device_name(d.name)
        if isinstance(ref, MigRef) and ref.parent_minor == gpu.minor:
            profile = gpu.profile(ref.profile_id)
            consumed = {k: _qty(v.value) for k, v in (d.consumes_counters or [])[0].counters.items()}
            partitions.append((ref.placement_start, profile.memory_slices, consumed, profile_capacities(profile)))
    partitions.sort(key=lambda p: p[0])
    checked = refused = 0

    def walk(i: int, free_from: int, chosen: list[tuple[int, int, dict[str, int], dict[str, int]]]) -> None:
        nonlocal checked, refused
        if i == len(partitions):
            full = all(sum(p[3][c] for p in chosen) <= totals[c] for c in A.MIG_CAPACITIES)
            ours = all(sum(p[2].get(k, 0) for p in chosen) <= v for k, v in published.items())
            assert full == ours, [p[:2] for p in chosen]
            checked, refused = checked + 1, refused + (not full)
            return
        walk(i + 1, free_from, chosen)
        start, size = partitions[i][:2]
        if start >= free_from:  # sorted by start: disjoint from everything chosen
            walk(i + 1, start + size, [*chosen, partitions[i]])

    walk(0, 0, [])
    assert checked > 1000 and refused > 0, (checked, refused)  # the counters that remain do refuse something


def test_counters_cover_the_largest_layout_sum() -> None:
    """Seven 1g instances need more copy engines than any single profile has on this synthetic part."""

    def profile(pid: int, enum: int, name: str, c: int, m: int, starts: list[int], ce: int, mib: int) -> MigProfile:
        return MigProfile(
            enum=enum,
            id=pid,
            name=name,
            driver_name=name,
            compute_slices=c,
            memory_slices=m,
            instance_count=len(starts),
            multiprocessors=10 * c,
            copy_engines=ce,
            decoders=0,
            encoders=0,
            jpeg_engines=0,
            ofa_engines=0,
            memory_mib=mib,
            placements=tuple(Placement(start=s, size=m) for s in starts),
        )

    profiles = (
        profile(19, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, "1g.10gb", 1, 1, list(range(7)), 2, 10240),
        profile(0, pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, "7g.80gb", 7, 8, [0], 8, 81920),
    )
    from dra_driver.slices.counters import counter_totals

    totals = counter_totals(profiles)
    assert totals["copyEngines"] == 14  # 7 x 2, more than the 7g's 8
    assert totals["multiprocessors"] == 70
    assert totals["memory"] == 81920 << 20


def _synthetic_gpu(minor: int, n_profiles: int) -> GpuInfo:
    profiles = tuple(
        MigProfile(
            enum=pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
            id=100 + i,
            name=f"1g.{i + 1}gb",
            driver_name="x",
            compute_slices=1,
            memory_slices=1,
            instance_count=7,
            multiprocessors=1,
            copy_engines=1,
            decoders=0,
            encoders=0,
            jpeg_engines=0,
            ofa_engines=0,
            memory_mib=1024,
            placements=tuple(Placement(start=s, size=1) for s in range(7)),
        )
        for i in range(n_profiles)
    )
    return GpuInfo(
        index=minor,
        minor=minor,
        uuid=f"GPU-{minor}",
        product_name="Synthetic",
        brand="Nvidia",
        architecture="Hopper",
        cuda_compute_capability="9.0",
        pci_bus_id=f"0000:{minor + 1:02x}:00.0",
        pcie_root=None,
        pci_device_id=0,
        memory_bytes=80 << 30,
        mig_capable=True,
        mig_enabled=False,
        mig_pending=False,
        virtualized=False,
        mig_toggle_needs_reset=False,
        mig_profiles=profiles,
    )


def test_past_the_134_device_limit_is_a_clear_error() -> None:
    # 19 profiles x 7 placements + 1 = 134 devices share one counter set; 1.34 cannot split them.
    inv = Inventory(driver_version="550.54.15", cuda_driver_version="12.4", gpus=(_synthetic_gpu(0, 19),))
    with pytest.raises(SliceLimitError, match=r"GPU 0: 134 devices .* Kubernetes 1\.34 slice holds at most 128"):
        build_slices(inv, node_name="n", k8s_version="1.34")
    slices = build_slices(inv, node_name="n", k8s_version="1.35")  # 1.35+ splits them over slices of 64
    assert [len(s.spec.devices or []) for s in slices] == [0, 1, 64, 64, 5]  # the whole GPU, then its partitions


def test_more_than_eight_gpus_need_two_counter_slices_from_135() -> None:
    inv = Inventory(
        driver_version="550.54.15", cuda_driver_version="12.4", gpus=tuple(_synthetic_gpu(m, 1) for m in range(10))
    )
    slices = build_slices(inv, node_name="n", k8s_version="1.36")
    assert [len(s.spec.shared_counters or []) for s in slices[:2]] == [8, 2]
    assert len(slices) == 13  # then one of the ten whole GPUs, then each GPU's partitions
    assert [s.metadata.name for s in slices][-2:] == ["n-gpu.dra-driver.dev-11", "n-gpu.dra-driver.dev-12"]
    assert slices[2].metadata.name == "n-gpu.dra-driver.dev-02"  # names sort as the slices are laid out


def test_taint_limits_differ_by_version(sim_factory) -> None:
    inv = _inventory(sim_factory, "dgx-h100")
    taints = {"gpu-0": [DeviceTaint(key=f"example.com/t{i}", effect="NoSchedule") for i in range(5)]}
    with pytest.raises(SliceLimitError, match=r"device gpu-0: taints: 5 exceeds the Kubernetes 1\.34 limit of 4"):
        build_slices(inv, node_name="n", k8s_version="1.34", taints=taints)
    slices = build_slices(inv, node_name="n", k8s_version="1.35", taints=taints)
    assert len(next(d for d in _devices(slices) if d.name == "gpu-0").taints or []) == 5
    with pytest.raises(KeyError, match="unknown device gpu-99"):
        build_slices(inv, node_name="n", taints={"gpu-99": []})


def test_too_many_attributes_is_a_clear_error(sim_factory, monkeypatch) -> None:
    from dra_driver.slices import devices as devices_module

    original = devices_module._common_attributes

    def bloated(inv, gpu):  # type: ignore[no-untyped-def]
        attrs = original(inv, gpu)
        attrs.update({f"extra{i}": devices_module.DeviceAttribute(int=i) for i in range(20)})
        return attrs

    monkeypatch.setattr(devices_module, "_common_attributes", bloated)
    with pytest.raises(
        SliceLimitError, match=r"attributes and capacities: \d+ exceeds the Kubernetes 1\.35 limit of 32"
    ):
        build_slices(_inventory(sim_factory, "dgx-h100"), node_name="n")


def test_gpus_mode_has_no_counters(sim_factory) -> None:
    slices = build_slices(_inventory(sim_factory, "dgx-h200"), node_name="n", mode=PublishMode.GPUS)
    assert len(slices) == 1
    assert [d.name for d in _devices(slices)] == [f"gpu-{i}" for i in range(8)]
    assert all(d.consumes_counters is None for d in _devices(slices)) and slices[0].spec.shared_counters is None


def test_static_mode_publishes_existing_mig_devices(sim_factory) -> None:
    sim = sim_factory("mixed")
    a100 = sim.nvmlDeviceGetHandleByIndex(0)  # MIG already on, minor 1
    from tests.simhelpers import create_full_ci

    uuids = set()
    for pid, start, size, slices in [(9, 4, 4, 3), (14, 0, 2, 2)]:
        gi = create_gi(sim, a100, pid, start, size)
        uuids.add(sim.nvmlDeviceGetUUID(sim.nvmlComputeInstanceGetInfo(create_full_ci(sim, gi, slices)).device))
    inv = discover(sim, sim.sysfs_root)
    devices = {d.name: d for d in _devices(build_slices(inv, node_name="n", mode=PublishMode.STATIC))}
    assert set(devices) == {"gpu-0", "gpu-2", "gpu-3", "gpu-4", "gpu-1-mig-2g20gb-14-0", "gpu-1-mig-3g40gb-9-4"}
    assert {devices[n].attributes["uuid"].value() for n in devices if "mig" in n} == uuids
    # each memory slice the placement occupies, as NVIDIA's driver publishes an existing MIG device's
    slices_of = {n: sorted(k for k in devices[n].capacity if k.startswith("memorySlice")) for n in devices}
    assert slices_of["gpu-1-mig-3g40gb-9-4"] == [f"memorySlice{i}" for i in (4, 5, 6, 7)]
    assert slices_of["gpu-1-mig-2g20gb-14-0"] == ["memorySlice0", "memorySlice1"] and slices_of["gpu-0"] == []
    assert devices["gpu-1-mig-2g20gb-14-0"].capacity["memorySlice1"].value == "1"
    whole_only = {d.name for d in _devices(build_slices(inv, node_name="n", mode=PublishMode.GPUS))}
    assert whole_only == {"gpu-0", "gpu-2", "gpu-3", "gpu-4"}


def test_partitionable_mode_on_a_mixed_node(sim_factory) -> None:
    inv = _inventory(sim_factory, "mixed")
    slices = build_slices(inv, node_name="n", k8s_version="1.35")
    names = {d.name for d in _devices(slices)}
    assert "gpu-1" not in names  # Ampere with MIG on cannot be handed out whole
    assert any(n.startswith("gpu-1-mig-") for n in names)
    assert "gpu-0" in names and not any(n.startswith("gpu-0-mig-") for n in names)  # Ampere, MIG off
    assert "gpu-4" in names and not any(n.startswith("gpu-4-mig-") for n in names)  # L40S: no MIG
    sets = [c.name for s in slices for c in s.spec.shared_counters or []]
    assert sets == ["gpu-1-counter-set", "gpu-2-counter-set", "gpu-3-counter-set"]
    plain = [d for d in _devices(slices) if d.name in ("gpu-0", "gpu-4")]
    assert all(d.consumes_counters is None for d in plain)


def test_placements_offered_high_first(sim_factory) -> None:
    slices = build_slices(_inventory(sim_factory, "dgx-h100"), node_name="n", k8s_version="1.35")
    order = [d.name for d in slices[2].spec.devices or [] if "-mig-1g10gb-19-" in d.name]
    assert order == [f"gpu-0-mig-1g10gb-19-{s}" for s in (6, 5, 4, 3, 2, 1, 0)]


def test_driver_name_is_configurable_and_validated(sim_factory) -> None:
    inv = _inventory(sim_factory, "dgx-h100")
    assert A.DEFAULT_DRIVER_NAME != "gpu.nvidia.com"
    assert {s.spec.driver for s in build_slices(inv, node_name="n", driver="gpu.example.com")} == {"gpu.example.com"}
    with pytest.raises(SliceLimitError, match="driver name 'GPU_Example' is not a DNS subdomain"):
        build_slices(inv, node_name="n", driver="GPU_Example")


@pytest.mark.parametrize(("version", "minor"), [("1.34", 34), ("v1.35.2", 35), ("1.36.0-rc.1", 36), ("1.37", 37)])
def test_version_parsing(version: str, minor: int) -> None:
    assert parse_minor(version) == minor
    assert limits_for(version).minor == minor


@pytest.mark.parametrize("bad", ["1.33", "2.0", "latest"])
def test_unsupported_versions_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=r"not supported|invalid Kubernetes version"):
        limits_for(bad)


@pytest.mark.parametrize("newer", ["1.38", "v1.38.0", "1.39.0-alpha.1"])
def test_a_minor_newer_than_known_gets_the_newest_layout_with_one_line_saying_so(sim_factory, newer: str) -> None:
    from dra_driver.slices.limits import MAX_MINOR, newer_than_known

    assert limits_for(newer) == limits_for(f"1.{MAX_MINOR}")
    inv = _inventory(sim_factory, "dgx-h100")
    for mode in (PublishMode.STATIC, PublishMode.PARTITIONABLE):
        got = build_slices(inv, node_name="n", mode=mode, k8s_version=newer)
        assert got == build_slices(inv, node_name="n", mode=mode, k8s_version=f"1.{MAX_MINOR}")
    line = newer_than_known(newer)
    assert line is not None and f"is newer than this driver knows (1.34..1.{MAX_MINOR})" in line
    assert f"publishing the 1.{MAX_MINOR} layout" in line
    assert newer_than_known(f"v1.{MAX_MINOR}.2") is None


@pytest.mark.parametrize(
    ("machine", "version", "name", "expected"),
    [
        ("dgx-h100", "1.36", "numaNode", [0, 0, 0, 0, 1, 1, 1, 1]),
        ("dgx-h100", "1.37", "resource.kubernetes.io/numaNode", [0, 0, 0, 0, 1, 1, 1, 1]),
        ("dgx-a100", "1.35", "numaNode", [3, 3, 1, 1, 7, 7, 5, 5]),
        ("mixed", "1.37", "resource.kubernetes.io/numaNode", [0, 0, 1, 1, None]),  # the L40S: numa_node -1
    ],
)
def test_numa_node_is_read_from_sysfs_and_named_as_the_version_names_it(
    sim_factory, machine: str, version: str, name: str, expected: list[int | None]
) -> None:
    inv = _inventory(sim_factory, machine)
    devices = _devices(build_slices(inv, node_name="n", k8s_version=version, mode=PublishMode.PARTITIONABLE))
    other = "numaNode" if name != "numaNode" else "resource.kubernetes.io/numaNode"
    assert not any(other in d.attributes for d in devices)
    by_gpu: dict[str, set[int | None]] = {}
    for d in devices:
        attr = d.attributes.get(name)
        by_gpu.setdefault(d.name.split("-mig-")[0], set()).add(attr.int_ if attr else None)
    assert all(len(values) == 1 for values in by_gpu.values()), by_gpu  # a MIG device is on its parent's node
    minors = sorted(by_gpu, key=lambda n: int(n.removeprefix("gpu-")))
    by_minor = {g.minor: g for g in inv.gpus}
    assert [by_gpu[n].pop() for n in minors] == [expected[by_minor[int(n[4:])].index] for n in minors]


def test_gpus_in_an_nvlink_fabric_carry_its_cluster_and_clique(sim_factory, tmp_path) -> None:
    from dra_driver.simulator.nvml import SimulatedNvml

    sim = SimulatedNvml("gb200-nvl72-tray", tmp_path / "tray")
    sim.place_in_fabric("a3c53a39-8c2f-4a3e-9d57-000000000072", 3)
    inv = discover(sim, sim.sysfs_root)
    devices = _devices(build_slices(inv, node_name="n", k8s_version="1.36", mode=PublishMode.PARTITIONABLE))
    assert len(devices) > 4  # whole GPUs and their MIG placements: every one carries its GPU's fabric
    for d in devices:
        assert d.attributes["nvlinkClusterUUID"].string == "a3c53a39-8c2f-4a3e-9d57-000000000072"
        assert d.attributes["nvlinkClique"].string == "a3c53a39-8c2f-4a3e-9d57-000000000072.3"
    h100 = _devices(build_slices(_inventory(sim_factory, "dgx-h100"), node_name="n"))
    assert not any("nvlinkClique" in d.attributes for d in h100)  # NOT_SUPPORTED off a fabric: nothing published


def test_an_allowlist_of_mig_profiles_publishes_only_their_partitions(sim_factory) -> None:
    """A DGX H100 with whole GPUs, 1g.10gb and 3g.40gb: 8 + 8 x (7 + 2) devices instead of 208; each GPU's counter
    set is the same as with every profile (it describes the GPU), and the order is the same."""
    inv = _inventory(sim_factory, "dgx-h100")
    every = build_slices(inv, node_name="n", k8s_version="1.37")
    some = build_slices(inv, node_name="n", k8s_version="1.37", mig_profiles=frozenset({"1g.10gb", "3g.40gb"}))
    kept = _devices(some)
    assert len(_devices(every)) == 208 and len(kept) == 80
    assert {d.attributes["profile"].string for d in kept if "profile" in d.attributes} == {"1g.10gb", "3g.40gb"}
    assert [d.name for d in kept] == [d.name for d in _devices(every) if d in kept]
    assert [s.spec.shared_counters for s in some if s.spec.shared_counters] == [
        s.spec.shared_counters for s in every if s.spec.shared_counters
    ]
    assert len(_devices(build_slices(inv, node_name="n", k8s_version="1.37", mig_profiles=frozenset()))) == 8
    with pytest.raises(ValueError, match="migProfiles apply to mode partitionable only, not static"):
        build_slices(inv, node_name="n", k8s_version="1.37", mode=PublishMode.STATIC, mig_profiles=frozenset({"x"}))
