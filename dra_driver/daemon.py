"""The node daemon: the kubelet plugin (claims) for this node, with its metrics endpoint.

Runs until SIGTERM/SIGINT, then removes its sockets. Publishing this node's ResourceSlices is the
controller's job (dra_driver/controller), started beside it.
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import start_http_server

from dra_driver.nvml.source import NvmlSource
from dra_driver.plugin.checkpoint import current_boot_id
from dra_driver.plugin.claims import KubeClaimSource
from dra_driver.plugin.driver import Driver, PluginSettings
from dra_driver.plugin.grpc.server import PluginServer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DaemonOptions:
    settings: PluginSettings
    registry_dir: Path
    kubeconfig: Path | None
    metrics_port: int | None


def kube_api_client(kubeconfig: Path | None) -> Any:
    from kubernetes import client, config

    if kubeconfig is not None:
        return config.new_client_from_config(config_file=str(kubeconfig))
    config.load_incluster_config()
    return client.ApiClient()


def run(options: DaemonOptions, source: NvmlSource, stop: threading.Event | None = None) -> None:
    stop = stop or threading.Event()
    claims = KubeClaimSource(kube_api_client(options.kubeconfig))
    driver = Driver(
        options.settings,
        source.lib,
        claims,
        sysfs_root=source.sysfs_root,
        proc_root=source.proc_root,
        boot_id=current_boot_id(),
    )
    # Prepares of different claims run in parallel: the driver serialises device changes itself.
    server = PluginServer(
        driver, options.settings.driver, options.settings.plugin_dir, options.registry_dir, serialize=False
    )
    if options.metrics_port is not None:
        start_http_server(options.metrics_port)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    log.info("plugin %s serving on %s", options.settings.driver, server.dra_socket_path)
    try:
        stop.wait()
    finally:
        server.stop()
        driver.close()
