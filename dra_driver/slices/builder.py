"""Inventory -> the ResourceSlices of this node's pool, laid out for the target Kubernetes minor."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from dra_driver.api.meta import ObjectMeta, OwnerReference
from dra_driver.api.slice import CounterSet, Device, DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec
from dra_driver.nvml.inventory import Inventory
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME
from dra_driver.slices.devices import (
    GpuDevices,
    MigProfiles,
    NumaNodeForm,
    PublishMode,
    check_mig_profiles,
    check_replicas,
    gpu_devices,
    publish_attributes,
)
from dra_driver.slices.limits import LIST_ATTRIBUTES_GATE, LIST_ATTRIBUTES_MINOR, SliceLimits, limits_for
from dra_driver.slices.naming import gpu_device_name
from dra_driver.slices.validation import SliceLimitError, uses_advanced_features, validate_pool

__all__ = ["NumaNodeForm", "PublishMode", "SliceLimitError", "build_slices"]

log = logging.getLogger(__name__)
CONSUMABLE_CAPACITY_BETA = 36  # the minor from which DRAConsumableCapacity is on by default


def _chunks(items: list[Device], size: int) -> list[list[Device]]:
    return [items[i : i + size] for i in range(0, len(items), size)] or [[]]


def _device_chunk_size(devices: list[Device], limits: SliceLimits) -> int:
    return limits.max_devices_with_advanced_features if uses_advanced_features(devices) else limits.max_devices


def _layout(groups: list[GpuDevices], limits: SliceLimits) -> list[tuple[list[Device], list[CounterSet]]]:
    """(devices, counter sets) per slice, in a deterministic order."""
    partitioned = [g for g in groups if g.counter_set is not None]
    plain = [d for g in groups if g.counter_set is None for d in g.devices]
    out: list[tuple[list[Device], list[CounterSet]]] = []
    if limits.counters_in_own_slice:
        # <= 1.34: a device may only consume counters of its own slice, so a GPU's partitions cannot be split.
        for g in partitioned:
            assert g.counter_set is not None
            if len(g.devices) > _device_chunk_size(g.devices, limits):
                raise SliceLimitError(
                    f"GPU {g.minor}: {len(g.devices)} devices share one counter set but a Kubernetes "
                    f"1.{limits.minor} slice holds at most {_device_chunk_size(g.devices, limits)}"
                )
            out.append((g.devices, [g.counter_set]))
    else:
        # >= 1.35: counter sets in slices of their own, devices in others. Every whole GPU with partitions comes
        # first, then each GPU's partitions (GPUs without any after, as before): the scheduler's allocator tries a
        # node's devices in slice-name order (1.36+), checking "in use" before it evaluates a class's CEL on a
        # device, so a whole-GPU claim on a node whose first GPUs are taken skips them at no cost instead of
        # evaluating CEL on each of their partitions first (bench/bench_scheduler.py: 50% and 90% of GPUs in use).
        sets = [g.counter_set for g in partitioned if g.counter_set is not None]
        per_slice = limits.max_counter_sets_per_slice or len(sets)
        out += [([], sets[i : i + per_slice]) for i in range(0, len(sets), per_slice)]
        firsts = [g.devices[0] for g in partitioned if g.devices and g.devices[0].name == gpu_device_name(g.minor)]
        if firsts:
            out += [(chunk, []) for chunk in _chunks(firsts, _device_chunk_size(firsts, limits))]
        for g in partitioned:
            rest = [d for d in g.devices if d.name != gpu_device_name(g.minor)]
            if rest:
                out += [(chunk, []) for chunk in _chunks(rest, _device_chunk_size(rest, limits))]
    if plain:
        out += [(chunk, []) for chunk in _chunks(plain, _device_chunk_size(plain, limits))]
    return out


def check_numa_form(numa_form: NumaNodeForm, k8s_version: str | int) -> None:
    """SliceLimitError when the Kubernetes version has no list attributes for the list form of numaNode."""
    limits = limits_for(k8s_version)
    if numa_form is NumaNodeForm.LIST and not limits.list_attributes:
        raise SliceLimitError(
            f"numaNode in list form needs list-type attributes ({LIST_ATTRIBUTES_GATE}), which Kubernetes "
            f"1.{limits.minor} does not have (alpha from 1.{LIST_ATTRIBUTES_MINOR}): publish it in scalar form"
        )


def build_slices(
    inventory: Inventory,
    *,
    node_name: str,
    driver: str = DEFAULT_DRIVER_NAME,
    k8s_version: str | int = "1.35",
    mode: PublishMode = PublishMode.PARTITIONABLE,  # the full layout; the daemon's default is DEFAULT_MODE
    replicas: int | None = None,  # shared mode: None by memory, 0 unlimited, N claims per GPU (check_replicas)
    mig_profiles: MigProfiles = None,  # partitionable mode: the MIG profiles published (None: every one)
    numa_form: NumaNodeForm = NumaNodeForm.SCALAR,
    taints: Mapping[str, list[DeviceTaint]] | None = None,
    generation: int = 1,
    node_uid: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> list[ResourceSlice]:
    """The complete pool for this node. Pure: the same inputs give the same slices.

    Raises SliceLimitError when the pool cannot be expressed within the version's limits; nothing is
    ever dropped silently.
    """
    limits = limits_for(k8s_version)
    check_replicas(replicas, mode)
    check_mig_profiles(mig_profiles, mode)
    if mode is PublishMode.SHARED and limits.minor < CONSUMABLE_CAPACITY_BETA:
        # Before 1.36 DRAConsumableCapacity is alpha: an API server without the gate drops allowMultipleAllocations
        # and the request policy, and the GPUs would be handed out whole.
        log.warning("shared mode needs the DRAConsumableCapacity feature gate on Kubernetes 1.%d", limits.minor)
    check_numa_form(numa_form, limits.minor)
    gpus = sorted(inventory.gpus, key=lambda g: g.minor)
    groups = [gpu_devices(inventory, gpu, mode, replicas, mig_profiles) for gpu in gpus]
    for gpu, group in zip(gpus, groups, strict=True):
        publish_attributes(group.devices, gpu, limits.minor, numa_form)
    for name, device_taints in (taints or {}).items():
        device = next((d for g in groups for d in g.devices if d.name == name), None)
        if device is None:
            raise KeyError(f"cannot taint unknown device {name}")
        device.taints = list(device_taints) or None
    layout = _layout(groups, limits)
    owner = (
        [OwnerReference(api_version="v1", kind="Node", name=node_name, uid=node_uid, controller=True)]
        if node_uid
        else None
    )
    slices = [
        ResourceSlice(
            metadata=ObjectMeta(
                # as wide as the last index: name order is the order the scheduler tries them in (1.36+)
                name=f"{node_name}-{driver}-{i:0{len(str(len(layout) - 1))}d}",
                labels=dict(labels) if labels else None,
                annotations=dict(annotations) if annotations else None,
                owner_references=owner,
            ),
            spec=ResourceSliceSpec(
                driver=driver,
                pool=ResourcePool(name=node_name, generation=generation, resource_slice_count=len(layout)),
                node_name=node_name,
                devices=devices if devices or not counter_sets else None,
                shared_counters=counter_sets or None,
            ),
        )
        for i, (devices, counter_sets) in enumerate(layout)
    ]
    validate_pool(slices, limits)
    return slices
