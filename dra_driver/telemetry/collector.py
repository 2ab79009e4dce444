"""A Prometheus collector reading GPU telemetry through NVML on every scrape.

The same code reads real GPUs (pynvml) and the simulator: it only calls `NvmlLibrary` functions. It relies on
the NVML session the plugin's `Driver` holds open for its lifetime (no nvmlInit/nvmlShutdown per scrape).

Metrics (gauges unless noted), per whole GPU and per MIG device that exists:

- ``dra_driver_gpu_up``: 1 when the GPU could be read on this scrape, 0 when reading it failed (for example
  ``NVML_ERROR_GPU_IS_LOST``); a GPU at 0 has no other series on that scrape, nor have its MIG devices.
  MIG devices get ``up`` too (1 whenever they are listed).
- ``dra_driver_gpu_utilization_ratio``: GPU busy time over NVML's last sample period, 0..1. GPUs only, and not
  on GPUs with MIG enabled (NVML does not report it there; MIG devices never have it).
- ``dra_driver_gpu_memory_used_bytes``, ``dra_driver_gpu_memory_total_bytes``: GPUs and MIG devices.
- ``dra_driver_gpu_share_ratio``: the fraction of its GPU a device is: 1 for a GPU, the GPU instance's compute
  slices over the GPU's (its largest profile's) for a MIG device, e.g. 3/7 for a 3g. It weighs MIG partitions in
  the GPU-hours recording rules (deploy/prometheus/rules.yaml).
- ``dra_driver_gpu_temperature_celsius``: GPU core (``NVML_TEMPERATURE_GPU``); GPUs only.
- ``dra_driver_gpu_power_watts``: board power draw; GPUs only.
- ``dra_driver_gpu_ecc_errors_total{type=corrected|uncorrected}`` (counter): volatile ECC error counts (since the
  driver last loaded, so a driver reload looks like a counter reset); GPUs only.
- ``dra_driver_gpu_xid_errors_total{xid}`` (counter): XID errors reported through `GpuCollector.record_xid`
  since this process started, labelled with the claim that held the device when the XID happened. The node
  daemon feeds it from `HealthMonitor.on_xid`: every XID event, ignored XIDs included. A series labelled with a
  claim lasts as long as that claim is in the plugin's checkpoint (prepared on this node): once it is unprepared,
  the series goes, so that the series never outnumber the live claims' (a series ending is a counter's end to
  Prometheus). Series of devices no claim held stay: there are only so many devices and XIDs.

A reading NVML does not support on a device (``NOT_SUPPORTED``, ``FUNCTION_NOT_FOUND``) is left out; any other
NVML error makes the whole GPU ``up 0`` for that scrape. A scrape never fails because of one GPU.

Labels: ``device`` (the DRA device name, ``gpu-<minor>`` or the MIG partition's name), ``uuid``, ``product``
(the GPU's product name; the parent's for a MIG device), and ``claim``, ``namespace``, ``pod`` of the
ResourceClaim prepared for the device on this node (from the plugin's checkpoint; empty when none). A device
several claims hold at once (shared or admin access) lists them comma-separated, sorted. ``pod`` comes from the
injectable ``pod_of(namespace, claim)`` hook; the default leaves it empty, the node daemon passes
`dra_driver.telemetry.pods.ReservedPods` (the claim's status.reservedFor, cached).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import pynvml
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from dra_driver.nvml.api import Handle, NvmlLibrary, as_text, describe, error_code
from dra_driver.nvml.inventory import GpuInfo
from dra_driver.slices.naming import gpu_device_name, mig_device_name

if TYPE_CHECKING:
    from dra_driver.plugin.driver import Driver

log = logging.getLogger(__name__)

PodOf = Callable[[str, str], str]  # (claim namespace, claim name) -> pod name, "" when unknown

LABELS = ("device", "uuid", "product", "claim", "namespace", "pod")
_OPTIONAL = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
_NO_MIG_DEVICE = (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT)


def no_pod(namespace: str, claim: str) -> str:
    return ""


@dataclass(frozen=True)
class _Holder:
    claim: str = ""
    namespace: str = ""
    pod: str = ""
    uids: frozenset[str] = frozenset()  # the claims' checkpoint keys: their XID series live as long as they do


@dataclass
class _XidSeries:
    count: int
    uids: frozenset[str]  # the claims it is labelled with; none: the device was not held


class _Families:
    """One scrape's metric families."""

    def __init__(self) -> None:
        def gauge(name: str, doc: str, unit: str = "") -> GaugeMetricFamily:
            return GaugeMetricFamily(f"dra_driver_gpu_{name}", doc, labels=LABELS, unit=unit)

        self.up = gauge("up", "1 when the GPU could be read through NVML on this scrape, 0 when it could not.")
        self.utilization = gauge("utilization_ratio", "GPU busy time over NVML's last sample period (0..1).")
        self.memory_used = gauge("memory_used_bytes", "Device memory in use (framebuffer), bytes.")
        self.memory_total = gauge("memory_total_bytes", "Device memory in total (framebuffer), bytes.")
        self.share = gauge("share_ratio", "The fraction of its GPU the device is (MIG: compute slices), 0..1.")
        self.temperature = gauge("temperature_celsius", "GPU core temperature, degrees Celsius.")
        self.power = gauge("power_watts", "GPU board power draw, watts.")
        self.ecc = CounterMetricFamily(
            "dra_driver_gpu_ecc_errors",
            "Volatile ECC memory errors since the NVIDIA driver loaded, by type (corrected, uncorrected).",
            labels=(*LABELS, "type"),
        )
        self.xid = CounterMetricFamily(
            "dra_driver_gpu_xid_errors",
            "XID errors reported for the device since this process started, by XID.",
            labels=(*LABELS, "xid"),
        )

    def all(self) -> list[Metric]:
        return [
            self.up,
            self.utilization,
            self.memory_used,
            self.memory_total,
            self.share,
            self.temperature,
            self.power,
            self.ecc,
            self.xid,
        ]


class _Skip(Exception):
    """A reading this device does not support."""


class GpuCollector(Collector):
    """Reads every GPU of `driver.inventory` (and their MIG devices) through `lib` when scraped."""

    def __init__(self, lib: NvmlLibrary, driver: Driver, pod_of: PodOf | None = None) -> None:
        self.lib = lib
        self.driver = driver
        self.pod_of: PodOf = pod_of or no_pod
        self._lock = threading.Lock()
        self._xids: dict[tuple[str, ...], _XidSeries] = {}  # by its labels' values

    # ----- attribution ------------------------------------------------------------------------------------
    def _holders(self) -> tuple[dict[str, _Holder], dict[str, tuple[str, str]], frozenset[str]]:
        """Device name -> the claims holding it; MIG UUID -> (device name, parent UUID); the UIDs of every claim
        prepared here. All from one read of the checkpoint, the one record of which claims live on this node."""
        by_device: dict[str, list[tuple[str, str, str]]] = {}
        mig_names: dict[str, tuple[str, str]] = {}
        checkpoint = getattr(self.driver, "checkpoint", None)
        entries = list(checkpoint.claims.values()) if checkpoint is not None else []
        for entry in entries:
            for d in entry.devices:
                by_device.setdefault(d.device, []).append((entry.namespace, entry.name, entry.uid))
                if d.mig is not None:
                    mig_names[d.mig.uuid] = (d.device, d.mig.parent_uuid)
        live = frozenset(entry.uid for entry in entries)
        return {device: self._holder(claims) for device, claims in by_device.items()}, mig_names, live

    def _holder(self, held_by: list[tuple[str, str, str]]) -> _Holder:
        unique = sorted({(namespace, name) for namespace, name, _ in held_by})
        pods: list[str] = []
        for namespace, name in unique:
            try:
                pod = self.pod_of(namespace, name)
            except Exception as e:  # a hook failing must not break the scrape
                log.debug("pod_of(%s, %s) failed: %s", namespace, name, e)
                pod = ""
            if pod:
                pods.append(pod)
        return _Holder(
            claim=",".join(name for _, name in unique),
            namespace=",".join(sorted({namespace for namespace, _ in unique})),
            pod=",".join(pods),
            uids=frozenset(uid for _, _, uid in held_by),
        )

    @staticmethod
    def _labels(device: str, uuid: str, product: str, holder: _Holder | None) -> list[str]:
        h = holder or _Holder()
        return [device, uuid, product, h.claim, h.namespace, h.pod]

    # ----- XIDs ---------------------------------------------------------------------------------------------
    def record_xid(self, gpu_uuid: str, xid: int) -> None:
        """An XID error happened on a GPU (or MIG device, by its MIG UUID). Counted under the claim holding the
        device now, so that a later claim on the same device does not inherit it."""
        holders, mig_names, live = self._holders()
        inventory = self.driver.inventory
        gpu = inventory.gpu_by_uuid(gpu_uuid)
        if gpu is not None:
            device, product = gpu_device_name(gpu.minor), gpu.product_name
        elif gpu_uuid in mig_names:
            device, parent_uuid = mig_names[gpu_uuid]
            parent = inventory.gpu_by_uuid(parent_uuid)
            product = parent.product_name if parent is not None else ""
        else:  # a MIG device no claim of this driver carved: named from its placement, as when scraped
            device, product = self._unclaimed_mig(gpu_uuid, mig_names)
        holder = holders.get(device) or _Holder()
        key = (*self._labels(device, gpu_uuid, product, holder), str(xid))
        with self._lock:
            # pruned here too, not only when scraped: a node nobody scrapes must not keep every claim's series
            self._prune(live)
            series = self._xids.setdefault(key, _XidSeries(0, holder.uids))
            series.count += 1
            series.uids = holder.uids  # the labels' claims now (a claim recreated under its old name: its new UID)

    def _prune(self, live: frozenset[str]) -> None:
        """Drop the XID series of claims no longer prepared here (called with the lock held)."""
        gone = [key for key, series in self._xids.items() if not series.uids <= live]
        for key in gone:
            del self._xids[key]

    def _unclaimed_mig(self, mig_uuid: str, mig_names: dict[str, tuple[str, str]]) -> tuple[str, str]:
        """(device name, product) of a MIG device by its UUID, through NVML; ("", "") when it cannot be found."""
        lib = self.lib
        try:
            mig = lib.nvmlDeviceGetHandleByUUID(mig_uuid)
            is_mig = lib.nvmlDeviceIsMigDeviceHandle(mig)  # a c_uint in pynvml
            if not int(getattr(is_mig, "value", is_mig)):
                return "", ""
            parent = lib.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
            parent_uuid = as_text(lib.nvmlDeviceGetUUID(parent))
            gpu = self.driver.inventory.gpu_by_uuid(parent_uuid)
            if gpu is None:
                log.debug("XID on %s: its GPU %s is not in the inventory", mig_uuid, parent_uuid)
                return "", ""
            return self._mig_name(parent, mig, gpu, mig_uuid, mig_names), gpu.product_name
        except pynvml.NVMLError as e:
            log.debug("XID on %s: no such MIG device: %s", mig_uuid, describe(e))
            return "", ""

    # ----- scraping -----------------------------------------------------------------------------------------
    def describe(self) -> Iterable[Metric]:
        return _Families().all()  # the names only: registering must not read the GPUs

    def collect(self) -> Iterator[Metric]:
        families = _Families()
        live: frozenset[str] | None
        try:
            holders, mig_names, live = self._holders()
        except Exception:  # never fail the scrape
            log.exception("reading the checkpoint for GPU metrics failed")
            holders, mig_names, live = {}, {}, None
        for gpu in list(self.driver.inventory.gpus):
            self._collect_gpu(families, gpu, holders, mig_names)
        with self._lock:
            if live is not None:  # an unreadable checkpoint says nothing of which claims are gone
                self._prune(live)
            xids = {key: series.count for key, series in self._xids.items()}
        for key, count in sorted(xids.items()):
            families.xid.add_metric(list(key), count)
        yield from families.all()

    def _optional(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except pynvml.NVMLError as e:
            if error_code(e) in _OPTIONAL:
                raise _Skip from e
            raise

    def _collect_gpu(
        self, families: _Families, gpu: GpuInfo, holders: dict[str, _Holder], mig_names: dict[str, tuple[str, str]]
    ) -> None:
        name = gpu_device_name(gpu.minor)
        labels = self._labels(name, gpu.uuid, gpu.product_name, holders.get(name))
        samples: list[tuple[GaugeMetricFamily | CounterMetricFamily, list[str], float]] = []

        def read(family: GaugeMetricFamily | CounterMetricFamily, lbls: list[str], fn: Callable[[], float]) -> None:
            with suppress(_Skip):
                samples.append((family, lbls, fn()))

        lib = self.lib
        try:
            h = lib.nvmlDeviceGetHandleByUUID(gpu.uuid)
            read(families.utilization, labels, lambda: self._optional(lib.nvmlDeviceGetUtilizationRates, h).gpu / 100)
            mem = self._optional(lib.nvmlDeviceGetMemoryInfo, h)
            samples += [
                (families.memory_used, labels, mem.used),
                (families.memory_total, labels, mem.total),
                (families.share, labels, 1.0),
            ]
            read(
                families.temperature,
                labels,
                lambda: self._optional(lib.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
            )
            read(families.power, labels, lambda: self._optional(lib.nvmlDeviceGetPowerUsage, h) / 1000)
            for type_name, error_type in (
                ("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            ):
                read(families.ecc, [*labels, type_name], partial(self._ecc, h, error_type))
            if gpu.mig_enabled or gpu.mig_capable:
                for mig_name, mig_uuid, mig_mem, share in self._mig_devices(h, gpu, mig_names):
                    mig_labels = self._labels(mig_name, mig_uuid, gpu.product_name, holders.get(mig_name))
                    samples += [
                        (families.up, mig_labels, 1),
                        (families.memory_used, mig_labels, mig_mem.used),
                        (families.memory_total, mig_labels, mig_mem.total),
                        (families.share, mig_labels, share),
                    ]
        except _Skip:  # memory info unsupported: treat like any read failure
            families.up.add_metric(labels, 0)
            log.debug("GPU %s: memory info not supported", name)
            return
        except Exception as e:
            families.up.add_metric(labels, 0)
            log.debug("GPU %s cannot be read: %s", name, describe(e))
            return
        families.up.add_metric(labels, 1)
        for family, lbls, value in samples:
            family.add_metric(lbls, float(value))

    def _ecc(self, h: Handle, error_type: int) -> float:
        return float(self._optional(self.lib.nvmlDeviceGetTotalEccErrors, h, error_type, pynvml.NVML_VOLATILE_ECC))

    def _mig_devices(
        self, parent: Handle, gpu: GpuInfo, mig_names: dict[str, tuple[str, str]]
    ) -> list[tuple[str, str, Any, float]]:
        """(device name, MIG UUID, memory info, share of the GPU) of each MIG device that exists on the GPU."""
        lib = self.lib
        try:
            count = int(lib.nvmlDeviceGetMaxMigDeviceCount(parent))
        except pynvml.NVMLError as e:
            if error_code(e) in _OPTIONAL:
                return []
            raise
        found: list[tuple[str, str, Any, float]] = []
        for i in range(count):
            try:
                mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(parent, i)
            except pynvml.NVMLError as e:
                if error_code(e) in (*_NO_MIG_DEVICE, *_OPTIONAL):
                    continue
                raise
            mig_uuid = as_text(lib.nvmlDeviceGetUUID(mig))
            mem = lib.nvmlDeviceGetMemoryInfo(mig)
            name = self._mig_name(parent, mig, gpu, mig_uuid, mig_names)
            found.append((name, mig_uuid, mem, self._mig_share(parent, mig, gpu, mem.total)))
        return found

    def _mig_share(self, parent: Handle, mig: Handle, gpu: GpuInfo, memory_total: int) -> float:
        """Compute slices of the MIG device's GPU instance over the GPU's; by memory where the profile is unknown."""
        lib = self.lib
        info = lib.nvmlGpuInstanceGetInfo(lib.nvmlDeviceGetGpuInstanceById(parent, lib.nvmlDeviceGetGpuInstanceId(mig)))
        whole = max((p.compute_slices for p in gpu.mig_profiles), default=0)
        try:
            slices = gpu.profile(info.profileId).compute_slices
        except KeyError:
            slices = 0
        if slices and whole:
            return slices / whole
        return memory_total / gpu.memory_bytes if gpu.memory_bytes else 0.0

    def _mig_name(
        self, parent: Handle, mig: Handle, gpu: GpuInfo, mig_uuid: str, mig_names: dict[str, tuple[str, str]]
    ) -> str:
        """The partition's DRA device name, from its GPU instance's profile and placement."""
        if mig_uuid in mig_names:
            return mig_names[mig_uuid][0]
        lib = self.lib
        gi_id = lib.nvmlDeviceGetGpuInstanceId(mig)
        info = lib.nvmlGpuInstanceGetInfo(lib.nvmlDeviceGetGpuInstanceById(parent, gi_id))
        try:
            profile_name = gpu.profile(info.profileId).name
        except KeyError:
            profile_name = f"profile-{info.profileId}"
        return mig_device_name(gpu.minor, profile_name, info.profileId, info.placement.start)


def register_gpu_metrics(
    registry: CollectorRegistry, lib: NvmlLibrary, driver: Driver, pod_of: PodOf | None = None
) -> GpuCollector:
    """Register the GPU telemetry collector in `registry`; returns it (its `record_xid` feeds the XID counter)."""
    collector = GpuCollector(lib, driver, pod_of)
    registry.register(collector)
    return collector
