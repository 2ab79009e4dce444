"""The node daemon: this node's ResourceSlice publisher and its kubelet plugin, in one process.

Runs until SIGTERM/SIGINT, then removes its sockets. GPUs are rediscovered periodically; when what the node
should publish changes (a GPU appears or disappears, a UUID or driver version changes), the pool is republished.
Device health (`dra_driver.health`): NVML events become device taints in the pool, the devices of prepared claims
get a `DeviceHealthy` condition in the claims' status, and operators read and clear incidents through
`<plugin dir>/health.sock` (`dra-driver health status|clear`), and the kubelet reads every published device's
health from the plugin's `v1alpha1.DRAResourceHealth` stream. Every XID is counted in the GPU metrics.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import resource
import signal
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY

from dra_driver import memory
from dra_driver.claimstate.checkpoint import current_boot_id
from dra_driver.claimstate.context import CallContext
from dra_driver.health.monitor import DEFAULT_IGNORED_XIDS, HealthMonitor, publishable
from dra_driver.kube.rest import KubeRest, connect
from dra_driver.nvml.discovery import DiscoveryError, discover
from dra_driver.nvml.source import NvmlSource
from dra_driver.plugin.claims import KubeClaimSource
from dra_driver.plugin.class_cache import CachedClassSource, DeviceClassCache, KubeClassWatch
from dra_driver.plugin.driver import Driver, PluginSettings
from dra_driver.plugin.grpc.resource_health import DeviceHealthSource, DeviceState, states_from_taints
from dra_driver.plugin.grpc.server import PluginServer
from dra_driver.sharing.mps_deployment import from_environment as mps_from_environment
from dra_driver.slices.devices import NumaNodeForm
from dra_driver.slices.limits import newer_than_known

if TYPE_CHECKING:  # imported when the daemon serves (_run_served), not before
    from dra_driver.api.slice import DeviceTaint, ResourceSlice
    from dra_driver.controller.nodeconfig import NodeConfigurator

log = logging.getLogger(__name__)

API_TIMEOUT_SECONDS = 10.0  # claim reads and status writes: never hang a thread on the API server
IDLE_TRIM_S = 1.0  # after a second without prepares or unprepares, freed heap goes back to the kernel
POD_LOOKUP_TIMEOUT_SECONDS = 2.0  # the `pod` label's claim reads happen during a scrape


@dataclass(frozen=True)
class DaemonOptions:
    settings: PluginSettings
    registry_dir: Path
    kubeconfig: Path | None
    metrics_port: int | None
    k8s_version: str | None = None  # None: ask the API server
    rediscover_seconds: float = 60.0
    node_labels: bool = False  # label the Node with GPU facts (needs `patch` on nodes; not in deploy/rbac.yaml)
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS  # XIDs counted in the metrics but never tainting
    metrics_address: str = "127.0.0.1"  # the endpoint has no authentication: loopback unless asked otherwise
    metrics_share_port: bool = False  # the node's port, handed to the next pod of a rolling update (hostNetwork)
    pod_uid: str = ""  # in the kubelet socket names, for rolling updates with surge ("": dra.sock, <driver>-reg.sock)
    replicas: int | None = None  # shared mode: claims per GPU (slices.devices.check_replicas)
    node_configs: Path | None = None  # named configurations a node label chooses from (controller.nodeconfig)
    node_config_label: str = ""  # that label; "" with node_configs: <driver>/config
    numa_form: NumaNodeForm = NumaNodeForm.SCALAR  # list: needs DRAListTypeAttributes on the cluster


def raise_descriptor_limit() -> None:
    """The soft limit on open files up to the hard one, as Go programs do at start (a container's soft limit is
    often 1024): the servers bound their own connections (dra_driver.httpserver), and headroom keeps a burst of
    them from failing a prepare. Nothing here uses select(), whose sets end at descriptor 1023."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def run(options: DaemonOptions, source: NvmlSource, stop: threading.Event | None = None) -> None:
    """Serves the kubelet as soon as the driver has recovered (or has left recovery for later: another process
    holds the node's device lock); the publisher, health and telemetry start after (their modules are imported
    only then): start to serving is what a restarted plugin's prepares wait for."""
    stop = stop or threading.Event()
    memory.limit_arenas()  # before any thread starts: see dra_driver.memory
    raise_descriptor_limit()
    settings = options.settings
    api = connect(options.kubeconfig)  # no official client: it would cost start-up time (dra_driver.kube)
    # MPS daemons in pods of their own and tmpfs shm, as the chart configures them (else the plugin's children)
    mps_pods, shm = mps_from_environment(
        api,
        source.lib,
        node_name=settings.pool,
        driver=settings.driver,
        driver_root=source.driver_root,
        host_driver_root=source.host_driver_root,
    )
    # DeviceClasses from a watch, not a GET per claim (why that is safe: dra_driver.plugin.class_cache)
    classes = DeviceClassCache(KubeClassWatch(api))
    driver = Driver(
        settings,
        source.lib,
        # a stalled API server must not stall prepares
        CachedClassSource(KubeClaimSource(api, request_timeout=API_TIMEOUT_SECONDS), classes),
        sysfs_root=source.sysfs_root,
        proc_root=source.proc_root,
        boot_id=current_boot_id(),
        driver_root=source.driver_root,
        host_driver_root=source.host_driver_root,
        mps_launcher=mps_pods,
        shm=shm,
    )
    with ExitStack() as cleanup:  # stops what was started, last started first; the driver (NVML) last
        cleanup.callback(driver.close)
        classes.start()
        cleanup.callback(classes.stop)
        taints: list[Callable[[], dict[str, list[DeviceTaint]]]] = [dict]  # the health monitor's, once it exists

        def device_health() -> dict[str, DeviceState]:
            return states_from_taints(driver.catalog, taints[0]())

        # Prepares of different claims run in parallel: the driver serialises device changes itself.
        server = PluginServer(
            driver,
            settings.driver,
            settings.plugin_dir,
            options.registry_dir,
            pod_uid=options.pod_uid,
            serialize=False,
            device_health=DeviceHealthSource(settings.pool, device_health),
        )
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        server.start()
        cleanup.callback(server.stop)
        log.info("plugin %s serving on %s", settings.driver, server.dra_socket_path)
        _run_served(options, source, stop, api, driver, server, taints, cleanup)


def _run_served(
    options: DaemonOptions,
    source: NvmlSource,
    stop: threading.Event,
    api: KubeRest,
    driver: Driver,
    server: PluginServer,
    taints: list[Callable[[], dict[str, list[DeviceTaint]]]],
    cleanup: ExitStack,
) -> None:
    """What runs beside the kubelet plugin: telemetry, node labels, device health, the pool's publisher; then
    rediscovery until `stop`. Each part started registers its stop in `cleanup`."""
    from dra_driver.plugin import selectors

    selectors.warm_up()  # the CEL environment, before the first prepare needs it
    from dra_driver.controller.nodeconfig import NodeLabelWatch
    from dra_driver.controller.publisher import Publisher
    from dra_driver.health.admin import SOCKET_NAME, HealthAdminServer
    from dra_driver.health.claim_status import ClaimStatusReporter
    from dra_driver.health.device_data import device_data_source
    from dra_driver.kube.events import node_event_poster
    from dra_driver.labels import apply_node_labels, node_labels
    from dra_driver.slices.builder import build_slices, check_numa_form
    from dra_driver.telemetry import ReservedPods, register_gpu_metrics

    settings = options.settings
    version = options.k8s_version or api.version(timeout=API_TIMEOUT_SECONDS)
    newer = newer_than_known(version)
    if newer is not None:
        log.warning("%s", newer)
    check_numa_form(options.numa_form, version)  # a version without list attributes: stop here, not at every publish
    # Per-GPU and per-MIG telemetry on the metrics endpoint; `pod` from the claims' status.reservedFor.
    pods = ReservedPods(KubeClaimSource(api, request_timeout=POD_LOOKUP_TIMEOUT_SECONDS).get_claim)
    collector = register_gpu_metrics(REGISTRY, source.lib, driver, pod_of=pods)

    def label_node() -> None:
        if not options.node_labels:
            return
        try:
            apply_node_labels(api, settings.pool, node_labels(driver.inventory, settings.driver))
        except Exception as e:  # labels are a convenience: never stop the node daemon for them
            log.warning("labelling node %s failed: %s", settings.pool, e)

    label_node()

    # Device health: taints from NVML events (dra_driver.health); a change republishes the pool and rewrites the
    # device status of the prepared claims it concerns, and the kubelet's health streams get a new device list.
    # Every XID is counted in the telemetry.
    def health_changed() -> None:
        publisher.trigger()
        claim_status.trigger()
        server.device_health_changed()

    health = HealthMonitor(
        source.lib,
        driver,
        settings.driver,
        ignored_xids=options.ignored_xids,
        on_change=health_changed,
        on_xid=collector.record_xid,
        on_event=node_event_poster(api, settings.pool, settings.driver),  # a GPU that needs recovery, or recovered
    )
    claim_status = ClaimStatusReporter(
        KubeClaimSource(api, request_timeout=API_TIMEOUT_SECONDS),
        settings.driver,
        lambda: list(driver.checkpoint.claims.values()),
        health.taints,
        data=device_data_source(source.lib, lambda: driver.inventory, lambda: driver.catalog),
    )
    driver.on_prepared = claim_status.trigger  # a prepared claim's devices are described in its status at once
    admin = HealthAdminServer(health, settings.plugin_dir / SOCKET_NAME)

    def device_taints() -> dict[str, list[DeviceTaint]]:
        published = driver.catalog  # a device of an older inventory is not tainted
        return {n: t for n, t in publishable(health.taints(), version).items() if n in published}

    configurator = _node_configurator(options, api, driver, lambda: publisher.trigger())

    def desired(generation: int, node_uid: str | None) -> list[ResourceSlice]:
        selection = configurator.current if configurator is not None else None
        return build_slices(
            driver.inventory,
            node_name=settings.pool,
            driver=settings.driver,
            k8s_version=version,
            mode=driver.settings.mode,  # the node configuration's, once one is applied
            replicas=selection.config.replicas if selection is not None else options.replicas,
            mig_profiles=driver.settings.mig_profiles,  # as the mode: the node configuration's, once applied
            numa_form=options.numa_form,
            taints=device_taints(),
            generation=generation,
            node_uid=node_uid,
            labels={f"{settings.driver}/config": selection.name} if selection is not None else None,
            annotations={f"{settings.driver}/config-refused": selection.refused}
            if selection is not None and selection.refused
            else None,
        )

    desired(1, None)  # fail now, not in the background, if this node cannot be expressed in this version
    publisher = Publisher(api, node_name=settings.pool, driver=settings.driver, desired=desired)
    if options.metrics_port is not None:
        from dra_driver.metricsserver import METRICS_HANDOFF_SOCKET, SharedPortMetrics, serve_metrics

        if options.metrics_share_port:
            handoff = settings.plugin_dir / METRICS_HANDOFF_SOCKET
            shared = SharedPortMetrics(options.metrics_port, options.metrics_address, handoff).start()
            cleanup.callback(shared.stop)
        else:
            metrics = serve_metrics(options.metrics_port, options.metrics_address)
            cleanup.callback(metrics.server_close)
            cleanup.callback(metrics.shutdown)
    for part in (publisher, health, claim_status, admin):
        part.start()
        cleanup.callback(part.stop)
    if configurator is not None:
        label_watch = NodeLabelWatch(api, settings.pool, _config_label(options), configurator.label_changed)
        label_watch.start()
        cleanup.callback(label_watch.stop)
    taints[0] = health.taints
    server.device_health_changed()
    log.info("plugin %s publishing pool %s for Kubernetes %s", settings.driver, settings.pool, version)
    publisher.in_sync.wait(timeout=10)  # start-up's garbage (discovery, the first slices) exists by then
    _release_garbage()
    next_discovery = time.monotonic() + options.rediscover_seconds
    idle = memory.TrimWhenIdle(driver.calls)
    calls = driver.calls
    while not stop.wait(min(IDLE_TRIM_S, max(0.0, next_discovery - time.monotonic()))):
        idle.tick(driver.calls)
        if configurator is not None and driver.calls != calls:  # claims came or went: a refused one may fit now
            calls = driver.calls
            configurator.retry()
        if time.monotonic() < next_discovery:
            continue
        next_discovery = time.monotonic() + options.rediscover_seconds
        if rediscover(driver, source):
            publisher.trigger()
            server.device_health_changed()  # the device list changed
            label_node()
        _release_garbage()


def _config_label(options: DaemonOptions) -> str:
    return options.node_config_label or f"{options.settings.driver}/config"


def _node_configurator(
    options: DaemonOptions, api: KubeRest, driver: Driver, republish: Callable[[], None]
) -> NodeConfigurator | None:
    """The node configuration the label chooses (None without --node-configs): it switches the plugin's mode and
    republishes."""
    if options.node_configs is None:
        return None
    from dra_driver.controller.nodeconfig import NodeConfig, NodeConfigurator, load_configs
    from dra_driver.kube.events import node_event_poster

    configurator: NodeConfigurator | None = None

    def switch(config: NodeConfig) -> list[str]:
        assert configurator is not None
        shared_changes = config.replicas != configurator.current.config.replicas
        blockers = driver.reconfigure(
            config.mode, shared_changes=shared_changes, mig_profiles=config.mig_profiles, call=CallContext.within(30)
        )
        if not blockers:  # new MPS claims only: a running control daemon keeps the settings it started with
            driver.sharing.mps_defaults = config.mps
        return blockers

    default = NodeConfig(
        mode=options.settings.mode, replicas=options.replicas, mig_profiles=options.settings.mig_profiles
    )
    post = node_event_poster(api, options.settings.pool, options.settings.driver)
    configurator = NodeConfigurator(load_configs(options.node_configs), default, switch, republish, post)
    return configurator


def _release_garbage() -> None:
    gc.collect()
    memory.trim()


def rediscover(driver: Driver, source: NvmlSource) -> bool:
    """Look at the GPUs again; True when the published devices would change."""
    try:
        inventory = discover(source.lib, source.sysfs_root)
    except DiscoveryError as e:  # e.g. a GPU fell off the bus: keep publishing what we had
        log.warning("rediscovery failed: %s", e)
        return False
    return driver.refresh_inventory(inventory)
