"""Inventory -> the devices and counter sets of one GPU, for each publishing mode."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from dra_driver.api.quantity import binary_quantity, count_quantity
from dra_driver.api.slice import (
    CapacityRange,
    CapacityRequestPolicy,
    Counter,
    CounterSet,
    Device,
    DeviceAttribute,
    DeviceCapacity,
    DeviceCounterConsumption,
)
from dra_driver.nvml.inventory import GpuInfo, Inventory, MigProfile
from dra_driver.nvml.migprofile import parse_profile_name
from dra_driver.slices import attributes as A
from dra_driver.slices.counters import binding_capacities, counter_totals, memory_slice_count, profile_capacities
from dra_driver.slices.naming import counter_set_name, gpu_device_name, mig_device_name

log = logging.getLogger(__name__)


class PublishMode(StrEnum):
    PARTITIONABLE = "partitionable"  # whole GPUs + every MIG partition, carved at prepare (KEP-4815)
    STATIC = "static"  # whole GPUs with MIG off + the MIG devices that already exist; no counters
    GPUS = "gpus"  # whole GPUs only; no counters
    SHARED = "shared"  # whole GPUs that several claims share, each taking part of the memory (consumable capacity)


class NumaNodeForm(StrEnum):
    """How the NUMA node attribute is published (k8s.io/dynamic-resource-allocation's deviceattribute.AttributeForm).

    The list form needs DRAListTypeAttributes (alpha, off by default in 1.36 and 1.37) on the API server and the
    scheduler; a driver cannot see the cluster's gates, so the operator chooses, and an API server without the gate
    rejects the slices (the publisher says so) rather than the driver falling back by itself."""

    SCALAR = "scalar"  # `int`: the GPU's own NUMA node
    LIST = "list"  # `ints`: its own node first, then its socket's nodes as close to it (sub-NUMA clustering)


# The daemon's default and the chart's on every version: MIG partitions carved on demand cost the kube-scheduler
# several times what whole GPUs cost (on 1.37, 100 nodes, half the GPUs in use: 7x; before 1.37 more with every
# partitionable node; bench/bench_scheduler.py, docs/resourceslices.md), so they are opt-in, as NVIDIA's DynamicMIG
# is; static publishes whole GPUs and the MIG devices an admin created.
DEFAULT_MODE: Final = PublishMode.STATIC


@dataclass
class GpuDevices:
    """What one GPU contributes to the pool."""

    minor: int
    devices: list[Device] = field(default_factory=list)
    counter_set: CounterSet | None = None


def _quantity(capacity: str, value: int) -> str:
    return binary_quantity(value) if capacity == A.CAP_MEMORY else count_quantity(value)


def _common_attributes(inv: Inventory, gpu: GpuInfo) -> dict[str, DeviceAttribute]:
    attrs = {
        A.ATTR_PRODUCT_NAME: DeviceAttribute(string=gpu.product_name),
        A.ATTR_BRAND: DeviceAttribute(string=gpu.brand),
        A.ATTR_ARCHITECTURE: DeviceAttribute(string=gpu.architecture),
        A.ATTR_CUDA_COMPUTE_CAPABILITY: DeviceAttribute(version=A.semver(gpu.cuda_compute_capability)),
        A.ATTR_DRIVER_VERSION: DeviceAttribute(version=A.semver(inv.driver_version)),
        A.ATTR_CUDA_DRIVER_VERSION: DeviceAttribute(version=A.semver(inv.cuda_driver_version)),
        A.ATTR_PCI_BUS_ID: DeviceAttribute(string=gpu.pci_bus_id),
    }
    if gpu.pcie_root:
        attrs[A.ATTR_PCIE_ROOT] = DeviceAttribute(string=gpu.pcie_root)
    if gpu.numa_node is not None:
        attrs[A.ATTR_NUMA_NODE] = DeviceAttribute(int_=gpu.numa_node)  # named and formed by publish_attributes
    if gpu.fabric_cluster is not None and gpu.fabric_clique is not None:
        attrs[A.ATTR_NVLINK_CLUSTER] = DeviceAttribute(string=gpu.fabric_cluster)
        attrs[A.ATTR_NVLINK_CLIQUE] = DeviceAttribute(string=A.clique_id(gpu.fabric_cluster, gpu.fabric_clique))
    return attrs


def publish_attributes(devices: list[Device], gpu: GpuInfo, minor: int, numa_form: NumaNodeForm) -> None:
    """The NUMA node attribute of one GPU's devices, in place: named as the Kubernetes minor names it (the list form
    too: before 1.37 it stays in our domain), and in the form asked for."""
    name = A.numa_node_attribute(minor)
    for device in devices:
        attr = device.attributes.pop(A.ATTR_NUMA_NODE, None)
        if attr is None:
            continue
        if numa_form is NumaNodeForm.LIST and gpu.numa_node is not None:
            attr = DeviceAttribute(ints=[gpu.numa_node, *gpu.numa_peers])
        device.attributes[name] = attr


def _whole_gpu(inv: Inventory, gpu: GpuInfo) -> Device:
    attrs = {
        A.ATTR_TYPE: DeviceAttribute(string=A.TYPE_GPU),
        A.ATTR_UUID: DeviceAttribute(string=gpu.uuid),
        **_common_attributes(inv, gpu),
    }
    return Device(
        name=gpu_device_name(gpu.minor),
        attributes=attrs,
        capacity={A.CAP_MEMORY: DeviceCapacity(value=binary_quantity(gpu.memory_bytes))},
    )


def _mig_attributes(gpu: GpuInfo, profile_name: str, common: dict[str, DeviceAttribute]) -> dict[str, DeviceAttribute]:
    """`common`: the GPU's _common_attributes, built once for all its partitions (their values are never changed in
    place, only replaced)."""
    return {
        A.ATTR_TYPE: DeviceAttribute(string=A.TYPE_MIG),
        A.ATTR_PARENT_UUID: DeviceAttribute(string=gpu.uuid),
        A.ATTR_PROFILE: DeviceAttribute(string=profile_name),
        **common,
    }


def _capacities(profile: MigProfile) -> dict[str, DeviceCapacity]:
    return {k: DeviceCapacity(value=_quantity(k, v)) for k, v in profile_capacities(profile).items()}


def _counted(bind: tuple[str, ...], values: dict[str, int]) -> dict[str, Counter]:
    """The capacity counters of `values` that bind (`bind`: counters.binding_capacities), by counter name."""
    return {A.counter_name(k): Counter(value=_quantity(k, v)) for k, v in values.items() if v and k in bind}


def _counter_set(gpu: GpuInfo, bind: tuple[str, ...]) -> CounterSet:
    counters = _counted(bind, counter_totals(gpu.mig_profiles))
    for s in range(memory_slice_count(gpu.mig_profiles)):
        counters[A.memory_slice_counter(s)] = Counter(value="1")
    return CounterSet(name=counter_set_name(gpu.minor), counters=counters)


def _partition_order(profile: MigProfile, start: int) -> tuple[int, int, int]:
    # The scheduler takes the first matching device of a slice. Offering high placements first keeps
    # slice 0, which 4g and 7g partitions need, free the longest (NVIDIA's own default placement does
    # the same for 1g instances).
    return (-profile.memory_slices, -start, profile.id)


MigProfiles = frozenset[str] | None  # the MIG profiles a partitionable node publishes; None: every one


def parse_mig_profiles(value: str | list[str] | tuple[str, ...] | None) -> MigProfiles:
    """The allowlist as a user writes it: `1g.10gb,3g.40gb` (a flag) or a list (the chart's `migProfiles`); empty or
    None: every profile. ValueError for a name that is no MIG profile name (`<n>g.<m>gb`, with `+me` or `-me`)."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    names = [str(n).strip() for n in items if str(n).strip()]
    for name in names:
        parse_profile_name(name)  # ValueError naming what is wrong
    return frozenset(names) or None


def check_mig_profiles(mig_profiles: MigProfiles, mode: PublishMode) -> None:
    """ValueError where an allowlist of MIG profiles is given for a mode that carves none."""
    if mig_profiles is not None and mode is not PublishMode.PARTITIONABLE:
        raise ValueError(f"migProfiles apply to mode {PublishMode.PARTITIONABLE.value} only, not {mode.value}")


def _partitionable(inv: Inventory, gpu: GpuInfo, mig_profiles: MigProfiles = None) -> GpuDevices:
    group = GpuDevices(minor=gpu.minor)
    dynamic = gpu.mig_capable and not gpu.virtualized and (gpu.mig_enabled or not gpu.mig_toggle_needs_reset)
    if not dynamic:
        # No MIG, a vGPU guest, or Ampere with MIG off (switching it on needs a GPU reset): whole GPU only,
        # and no counter set (the API rejects an empty one).
        group.devices.append(_whole_gpu(inv, gpu))
        return group
    # once per GPU: the caches below are keyed by the profiles, and comparing pydantic models costs (a third of a
    # partitionable pool's build when it was looked up per device)
    bind = binding_capacities(gpu.mig_profiles)
    counter_set = _counter_set(gpu, bind)
    group.counter_set = counter_set
    if not (gpu.mig_enabled and gpu.mig_toggle_needs_reset):  # Ampere with MIG on cannot be handed out whole
        whole = _whole_gpu(inv, gpu)
        whole.consumes_counters = [
            DeviceCounterConsumption(counter_set=counter_set.name, counters=dict(counter_set.counters))
        ]
        group.devices.append(whole)
    # an allowlist leaves out the other profiles' partitions: fewer devices for the scheduler to read on every node
    # it tries (bench/bench_scheduler.py --mig-profiles); the counter set still describes the whole GPU
    partitions = sorted(
        (
            (p, pl.start)
            for p in gpu.mig_profiles
            for pl in p.placements
            if mig_profiles is None or p.name in mig_profiles
        ),
        key=lambda item: _partition_order(*item),
    )
    common = _common_attributes(inv, gpu)
    for profile, start in partitions:
        consumed = _counted(bind, profile_capacities(profile))
        for s in range(start, start + profile.memory_slices):
            consumed[A.memory_slice_counter(s)] = Counter(value="1")
        group.devices.append(
            Device(
                name=mig_device_name(gpu.minor, profile.name, profile.id, start),
                attributes=_mig_attributes(gpu, profile.name, common),
                capacity=_capacities(profile),
                consumes_counters=[DeviceCounterConsumption(counter_set=counter_set.name, counters=consumed)],
            )
        )
    return group


def _static(inv: Inventory, gpu: GpuInfo, include_mig: bool) -> GpuDevices:
    group = GpuDevices(minor=gpu.minor)
    if not gpu.mig_enabled:
        group.devices.append(_whole_gpu(inv, gpu))
        return group
    if not include_mig:
        log.warning("GPU %d has MIG enabled; not published in whole-GPU mode", gpu.minor)
        return group
    common = _common_attributes(inv, gpu)
    for inst in sorted(gpu.mig_instances, key=lambda i: (i.placement.start, i.gpu_instance_id)):
        profile = gpu.profile(inst.profile_id)
        attrs = _mig_attributes(gpu, profile.name, common)
        attrs[A.ATTR_UUID] = DeviceAttribute(string=inst.uuid)
        capacity = _capacities(profile)
        for s in range(inst.placement.start, inst.placement.start + inst.placement.size):
            capacity[A.memory_slice_capacity(s)] = DeviceCapacity(value="1")
        group.devices.append(
            Device(
                name=mig_device_name(gpu.minor, profile.name, profile.id, inst.placement.start),
                attributes=attrs,
                capacity=capacity,
            )
        )
    return group


SHARED_MEMORY_MIN, SHARED_MEMORY_STEP = 1 << 30, 1 << 20  # at least 1 GiB per claim, in MiB steps
UNLIMITED_REPLICAS: Final = 0  # shared mode: any number of claims per GPU, as the device plugin's sharing has none
MAX_REPLICAS: Final = 1024


def parse_replicas(value: str | int) -> int:
    """A number of replicas as a user writes it (the chart's `replicas`, `--replicas`): 1 or more, or `unlimited`
    (UNLIMITED_REPLICAS); ValueError otherwise."""
    if value == "unlimited":
        return UNLIMITED_REPLICAS
    if isinstance(value, bool) or not isinstance(value, int | str):  # true or 4.5 are no counts
        raise ValueError(f"{value!r} is not a number of replicas or 'unlimited'")
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number of replicas or 'unlimited'") from None
    if n < 1:
        raise ValueError(f"replicas must be 1 or more, or 'unlimited'; not {n}")
    return n


def check_replicas(replicas: int | None, mode: PublishMode) -> None:
    """ValueError unless `replicas` (None: share by memory; 0: unlimited; N: N claims per GPU) fits `mode`."""
    if replicas is None:
        return
    if mode is not PublishMode.SHARED:
        raise ValueError(f"replicas apply to mode {PublishMode.SHARED.value} only, not {mode.value}")
    if not UNLIMITED_REPLICAS <= replicas <= MAX_REPLICAS:
        raise ValueError(f"replicas must be from 1 to {MAX_REPLICAS}, or unlimited; not {replicas}")


def _shared(inv: Inventory, gpu: GpuInfo, replicas: int | None) -> GpuDevices:
    """Devices that several claims may hold at once (KEP-5075 consumable capacity): the whole GPU, or, with MIG on,
    each MIG device that exists (as `static` publishes them).

    By memory (`replicas` None): the scheduler keeps the sum of the claims' `memory` requests within the device's
    memory; a claim that asks for no memory gets all of it, so it holds the device alone. With replicas, as the device
    plugin's time-slicing: a claim that asks for nothing takes no memory and one of `replicas` shares (a capacity
    of its own, one share per claim at most, as `failRequestsGreaterThanOne`), or, unlimited, no share at all;
    a claim may still ask for memory, which is then kept within the device's. A MIG device's other capacities
    (multiprocessors, engines) are taken by no claim: they describe the partition, they are not split."""
    group = _static(inv, gpu, include_mig=True)
    for device in group.devices:
        _share(device, replicas)
    return group


def _share(device: Device, replicas: int | None) -> None:
    device.allow_multiple_allocations = True
    for name, capacity in device.capacity.items():
        if name == A.CAP_MEMORY and replicas is None:
            capacity.request_policy = CapacityRequestPolicy(
                default=capacity.value,
                valid_range=CapacityRange(
                    min=binary_quantity(SHARED_MEMORY_MIN), step=binary_quantity(SHARED_MEMORY_STEP)
                ),
            )
        else:
            capacity.request_policy = CapacityRequestPolicy(default="0")
    if replicas:
        one = count_quantity(1)
        device.capacity[A.CAP_SHARES] = DeviceCapacity(
            value=count_quantity(replicas),
            request_policy=CapacityRequestPolicy(default=one, valid_range=CapacityRange(min=one, max=one)),
        )


def gpu_devices(
    inv: Inventory, gpu: GpuInfo, mode: PublishMode, replicas: int | None = None, mig_profiles: MigProfiles = None
) -> GpuDevices:
    """What `gpu` publishes in `mode`; `mig_profiles` limits the partitions of the partitionable mode (the other
    modes publish the MIG devices an admin made, whatever their profile)."""
    if mode is PublishMode.PARTITIONABLE:
        return _partitionable(inv, gpu, mig_profiles)
    if mode is PublishMode.SHARED:
        return _shared(inv, gpu, replicas)
    return _static(inv, gpu, include_mig=mode is PublishMode.STATIC)
