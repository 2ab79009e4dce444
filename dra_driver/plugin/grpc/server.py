"""PluginServer: the kubelet-facing gRPC servers of the DRA driver on their Unix sockets.

Layout (defaults of the Go kubeletplugin helper):

- DRA service, v1 and v1beta1 on one server: ``<plugin_dir>/dra.sock`` (plugin_dir is usually
  ``/var/lib/kubelet/plugins/<driver>``);
- registration: ``<registry_dir>/<driver>-reg.sock`` (registry_dir is usually ``/var/lib/kubelet/plugins_registry``,
  which the kubelet watches).

Both servers also serve the standard ``grpc.health.v1.Health`` service. :meth:`PluginServer.start` starts the DRA
server first and the registrar last, so the kubelet never learns of an endpoint that is not there yet;
:meth:`PluginServer.stop` stops them in the reverse order and removes the socket files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry

from dra_driver.plugin.grpc import health, protos
from dra_driver.plugin.grpc.metrics import PluginMetrics
from dra_driver.plugin.grpc.service import DRA_SERVICE, REGISTRATION_SERVICE, DRAService, RegistrationService
from dra_driver.plugin.grpc.service import RegistrationStatus as RegistrationStatus
from dra_driver.plugin.types import ClaimPreparer

log = logging.getLogger(__name__)

DEFAULT_PLUGIN_SOCKET = "dra.sock"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
MAX_UNIX_PATH = 107  # sun_path is 108 bytes including the terminating NUL

_umask_lock = threading.Lock()


def registrar_socket_name(driver_name: str) -> str:
    return f"{driver_name}-reg.sock"


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    with _umask_lock:
        old = os.umask(mask)
        try:
            yield
        finally:
            os.umask(old)


def _remove_socket(path: Path) -> None:
    """Remove a socket file left behind; refuse to delete anything that is not a socket."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(f"{path} exists and is not a socket")
    path.unlink(missing_ok=True)


class PluginServer:
    """The DRA node service and the registrar, serving a :class:`ClaimPreparer`.

    ``socket_mode`` is applied to both socket files (0o600 or 0o660 make sense; the kubelet runs as root).
    ``serialize`` lets only one prepare/unprepare call run at a time, as the Go helper does by default.
    ``on_registration`` is called with every status the kubelet reports.
    """

    def __init__(
        self,
        preparer: ClaimPreparer,
        driver_name: str,
        plugin_dir: str | os.PathLike[str],
        registry_dir: str | os.PathLike[str],
        metrics_registry: CollectorRegistry | None = None,
        *,
        plugin_socket_name: str = DEFAULT_PLUGIN_SOCKET,
        registrar_socket_filename: str | None = None,
        socket_mode: int = 0o600,
        serialize: bool = True,
        max_workers: int = 8,
        grace_period_s: float = 5.0,
        on_registration: Callable[[RegistrationStatus], None] | None = None,
    ) -> None:
        if not driver_name:
            raise ValueError("driver_name is required")
        if socket_mode & ~0o777:
            raise ValueError(f"socket_mode {socket_mode:#o} is not a permission mode")
        self._driver_name = driver_name
        self._plugin_dir = Path(plugin_dir)
        self._registry_dir = Path(registry_dir)
        self._dra_socket = (self._plugin_dir / plugin_socket_name).absolute()
        reg_name = registrar_socket_filename or registrar_socket_name(driver_name)
        self._reg_socket = (self._registry_dir / reg_name).absolute()
        for path in (self._dra_socket, self._reg_socket):
            if len(os.fsencode(path)) > MAX_UNIX_PATH:
                raise ValueError(f"socket path {path} is longer than {MAX_UNIX_PATH} bytes, too long for AF_UNIX")
        self._socket_mode = socket_mode
        self._max_workers = max_workers
        self._grace_period_s = grace_period_s
        self._metrics = PluginMetrics.for_registry(metrics_registry)
        pb = protos.load()
        self._dra = DRAService(preparer, self._metrics, serialize=serialize)
        self._dra_modules = (pb.dra_v1, pb.dra_v1beta1)
        self._registration = RegistrationService(
            pb.registration,
            driver_name,
            str(self._dra_socket),
            list(SUPPORTED_VERSIONS),
            self._metrics,
            on_status=on_registration,
        )
        self._health = health.HealthServicer()
        self._health_names = [
            "",
            *(f"{m.DESCRIPTOR.package}.{DRA_SERVICE}" for m in self._dra_modules),
            f"{pb.registration.DESCRIPTOR.package}.{REGISTRATION_SERVICE}",
        ]
        self._lock = threading.Lock()
        self._dra_server: grpc.Server | None = None
        self._reg_server: grpc.Server | None = None

    # -- properties

    @property
    def driver_name(self) -> str:
        return self._driver_name

    @property
    def dra_socket_path(self) -> Path:
        """The DRA service socket (PluginInfo.endpoint)."""
        return self._dra_socket

    @property
    def registration_socket_path(self) -> Path:
        """The registrar socket in the kubelet's plugin registry directory."""
        return self._reg_socket

    @property
    def metrics(self) -> PluginMetrics:
        return self._metrics

    @property
    def health(self) -> health.HealthServicer:
        return self._health

    @property
    def registration_status(self) -> RegistrationStatus | None:
        """The last status the kubelet reported with NotifyRegistrationStatus."""
        return self._registration.status

    @property
    def running(self) -> bool:
        with self._lock:
            return self._dra_server is not None

    def wait_registered(self, timeout: float | None = None) -> bool:
        """Wait for the kubelet's NotifyRegistrationStatus; True if it reported success."""
        return self._registration.wait_registered(timeout)

    # -- lifecycle

    def _serve(self, path: Path, handlers: list[grpc.GenericRpcHandler], name: str) -> grpc.Server:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_socket(path)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix=f"dra-grpc-{name}"),
            handlers=handlers,
        )
        try:
            with _umask(0o777 & ~self._socket_mode):
                port = server.add_insecure_port(f"unix:{path}")
            if port == 0:
                raise OSError(f"cannot listen on {path}")
            os.chmod(path, self._socket_mode)
            server.start()
        except BaseException:
            server.stop(None)
            with contextlib.suppress(OSError):
                _remove_socket(path)
            raise
        log.info("serving %s on %s", name, path)
        return server

    def start(self) -> None:
        """Start the DRA server, then the registrar. Raises if already started."""
        with self._lock:
            if self._dra_server is not None:
                raise RuntimeError("PluginServer already started")
            for name in self._health_names:
                self._health.set(name, health.SERVING)
            health_handler = self._health.handler()
            dra_handlers = [self._dra.handler(m) for m in self._dra_modules]
            self._dra_server = self._serve(self._dra_socket, [*dra_handlers, health_handler], "dra")
            try:
                self._reg_server = self._serve(
                    self._reg_socket, [self._registration.handler(), health_handler], "registration"
                )
            except BaseException:
                self._stop_locked(0)
                raise

    def stop(self, grace: float | None = None) -> None:
        """Stop the registrar, then the DRA server, and remove both socket files. Idempotent."""
        with self._lock:
            self._stop_locked(self._grace_period_s if grace is None else grace)

    def _stop_locked(self, grace: float) -> None:
        self._health.enter_graceful_shutdown()
        for server, path in ((self._reg_server, self._reg_socket), (self._dra_server, self._dra_socket)):
            if server is not None:
                server.stop(grace).wait()
            try:
                _remove_socket(path)
            except OSError as exc:
                log.warning("cannot remove %s: %s", path, exc)
        self._reg_server = None
        self._dra_server = None

    def __enter__(self) -> PluginServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
