"""PluginServer: the kubelet-facing gRPC servers of the DRA driver on their Unix sockets.

Layout (that of the Go kubeletplugin helper, ``k8s.io/dynamic-resource-allocation/kubeletplugin``):

- DRA service, v1 and v1beta1 on one server: ``<plugin_dir>/dra.sock`` (plugin_dir is usually
  ``/var/lib/kubelet/plugins/<driver>``);
- registration: ``<registry_dir>/<driver>-reg.sock`` (registry_dir is usually ``/var/lib/kubelet/plugins_registry``,
  which the kubelet watches).

Given the pod's UID (``pod_uid``, the helper's ``RollingUpdate(uid)`` option), the names carry it:
``<plugin_dir>/dra-<uid>.sock`` and ``<registry_dir>/<driver>-<uid>-reg.sock``. Two instances of the driver (the
old and the new pod of a DaemonSet rolling update with ``maxSurge``) then serve side by side, and the kubelet
(1.33 and later) registers both and may call either: the preparer must keep no state across calls that the other
instance could make stale (the :class:`~dra_driver.plugin.driver.Driver` serialises the two through a file lock and
reads the checkpoint again under it). Each instance removes only its own sockets when it stops. An older kubelet
keeps one endpoint per driver name and drops the driver when either instance deregisters: leave ``pod_uid`` empty
there.

Both servers also serve the standard ``grpc.health.v1.Health`` service. Given a device-health source, the DRA server
also serves the kubelet's ``v1alpha1.DRAResourceHealth`` (:mod:`.resource_health`), and the registration advertises
it. :meth:`PluginServer.start` starts the DRA server first and the registrar last, so the kubelet never learns of an
endpoint that is not there yet; :meth:`PluginServer.stop` stops them in the reverse order and removes the socket
files.

Without a pod UID two instances may serve the same paths for a while (a rolling update with surge before per-pod
names, or a container restarted while the old one still shuts down): each socket is bound under a temporary name
and renamed into place, so the newer instance atomically takes the path over, and an instance only ever removes a
socket file that is still the one it bound (gRPC itself unlinks the path it bound when it stops, which is why it
never binds the shared path). A watchdog binds a socket again when its file disappears.

At start, sockets of this driver left by an instance that did not stop cleanly (killed, force-deleted: a pod UID
the kubelet will never see again) are removed: only those with this driver's names whose connection is refused,
which on a Unix socket means that nothing listens on it any more.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import socket
import stat
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2_grpc
from prometheus_client import CollectorRegistry

from dra_driver.plugin.grpc import health
from dra_driver.plugin.grpc.generated import pluginregistration_v1_pb2
from dra_driver.plugin.grpc.metrics import PluginMetrics
from dra_driver.plugin.grpc.resource_health import DEFAULT_MAX_STREAMS, DeviceHealthSource, ResourceHealthServicer
from dra_driver.plugin.grpc.service import (
    DRA_API_VERSIONS,
    DRA_SERVICE,
    REGISTRATION_SERVICE,
    DRAService,
    RegistrationService,
)
from dra_driver.plugin.grpc.service import RegistrationStatus as RegistrationStatus
from dra_driver.plugin.socket_identity import DEFAULT_SOCKET_CHECK_INTERVAL_S as DEFAULT_SOCKET_CHECK_INTERVAL_S
from dra_driver.plugin.socket_identity import (
    SocketId,
    SocketWatchdog,
    place_socket,
    remove_own_socket,
    serve_again_if_gone,
)
from dra_driver.plugin.sockets import check_pod_uid, dra_socket_name, registrar_socket_name
from dra_driver.plugin.types import ClaimPreparer

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
MAX_UNIX_PATH = 107  # sun_path is 108 bytes including the terminating NUL
RESERVED_WORKERS = 2  # server threads prepares never take: for unprepares and health checks
HEALTH_WORKERS = 1  # server threads neither prepares nor unprepares take: the liveness probe's health checks
HANDSHAKE_TIMEOUT_S = 10.0  # a connection that has not spoken HTTP/2 by then is closed
CONNECTION_IDLE_S = 300.0  # a connection with no call open for this long gets a GOAWAY


_umask_lock = threading.Lock()

AddServicer = Callable[[grpc.Server], None]  # adds a servicer to a server (as the generated add_*_to_server do)


# what a Kubernetes pod UID looks like: only sockets named with one are ever removed as another instance's leftovers
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def _is_dead_socket(path: Path) -> bool:
    """True only if ``path`` is a socket whose connection is refused: nothing listens on it. A Unix socket with a
    listener never refuses (a full backlog makes connect() wait or fail with EAGAIN), so a live one is never taken
    for dead; anything else (a timeout, no permission) counts as alive."""
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            return False
    except OSError:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError as exc:
            return exc.errno == errno.ECONNREFUSED
    return False


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    with _umask_lock:
        old = os.umask(mask)
        try:
            yield
        finally:
            os.umask(old)


def _check_replaceable(path: Path) -> None:
    """Refuse to replace anything but a socket (one left behind, or another instance's)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(f"{path} exists and is not a socket")


def _tmp_name() -> str:
    """A private name to bind a socket under, beside its final path (the kubelet's plugin watcher ignores names
    that start with a dot)."""
    return f".tmp-{secrets.token_hex(4)}.sock"


class PluginServer:
    """The DRA node service and the registrar, serving a :class:`ClaimPreparer`.

    ``pod_uid`` (empty: none) puts the pod's UID in both socket names, so that two instances can serve side by side
    (see the module's docstring); ``plugin_socket_name`` and ``registrar_socket_filename`` override the names
    (the latter not together with ``pod_uid``, as in the Go helper).
    ``socket_mode`` is applied to both socket files (0o600 or 0o660 make sense; the kubelet runs as root).
    ``serialize`` lets only one prepare/unprepare call of this process run at a time, as the Go helper does by
    default; it does not reach another instance (the Go helper takes a file lock for that with rolling updates): a
    preparer served by two instances excludes itself across processes, as the Driver does.
    ``on_registration`` is called with every status the kubelet reports.
    At most ``max_workers - RESERVED_WORKERS`` prepare calls run at once (at least one): more are refused at once
    (waiting would hold a thread too), so that prepares stalled on the API server never leave an unprepare without a
    thread; prepares and unprepares together take at most ``max_workers - HEALTH_WORKERS``, so that the health
    checks are answered while they all wait for the node's device lock. ``device_health`` (None: not served) is
    what ``v1alpha1.DRAResourceHealth`` streams to the kubelet; call :meth:`device_health_changed` when it changes.
    At most ``max_health_streams`` streams are served at once, and as each holds a server thread for its life, that
    many more threads are kept from the prepares and unprepares. Every
    ``socket_check_interval_s`` (None: never) a socket file that is gone is bound again (the kubelet
    registers the plugin again when the registration socket reappears).
    """

    def __init__(
        self,
        preparer: ClaimPreparer,
        driver_name: str,
        plugin_dir: str | os.PathLike[str],
        registry_dir: str | os.PathLike[str],
        metrics_registry: CollectorRegistry | None = None,
        *,
        pod_uid: str = "",
        plugin_socket_name: str | None = None,
        registrar_socket_filename: str | None = None,
        socket_mode: int = 0o600,
        serialize: bool = True,
        max_workers: int = 32,  # threads are started on demand; prepares may wait for the device lock
        grace_period_s: float = 5.0,
        on_registration: Callable[[RegistrationStatus], None] | None = None,
        socket_check_interval_s: float | None = DEFAULT_SOCKET_CHECK_INTERVAL_S,
        device_health: DeviceHealthSource | None = None,
        max_health_streams: int = DEFAULT_MAX_STREAMS,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
        idle_timeout_s: float = CONNECTION_IDLE_S,
    ) -> None:
        if not driver_name:
            raise ValueError("driver_name is required")
        if socket_mode & ~0o777:
            raise ValueError(f"socket_mode {socket_mode:#o} is not a permission mode")
        if pod_uid and registrar_socket_filename:
            raise ValueError("pod_uid and registrar_socket_filename are mutually exclusive")  # as in the Go helper
        self._driver_name = driver_name
        self._pod_uid = check_pod_uid(pod_uid)
        self._plugin_dir = Path(plugin_dir)
        self._registry_dir = Path(registry_dir)
        self._dra_socket = (self._plugin_dir / (plugin_socket_name or dra_socket_name(pod_uid))).absolute()
        reg_name = registrar_socket_filename or registrar_socket_name(driver_name, pod_uid)
        self._reg_socket = (self._registry_dir / reg_name).absolute()
        for path in (self._dra_socket, self._reg_socket):
            # the socket is bound under a temporary name in the same directory first
            longest = max(len(os.fsencode(path)), len(os.fsencode(path.parent)) + 1 + len(_tmp_name()))
            if longest > MAX_UNIX_PATH:
                raise ValueError(
                    f"socket path {path} is too long for AF_UNIX: it, and a temporary name beside it, must fit in "
                    f"{MAX_UNIX_PATH} bytes"
                )
        self._socket_mode = socket_mode
        self._max_workers = max_workers
        # gRPC's own (C-core) limits on what a connection holds without a call: a client that never says HTTP/2
        # is dropped at the handshake timeout, a connection with no call open gets a GOAWAY once idle (a client,
        # the kubelet, just connects again for its next call; an open health stream is a call)
        self._grpc_options = [
            ("grpc.server_handshake_timeout_ms", int(handshake_timeout_s * 1000)),
            ("grpc.max_connection_idle_ms", int(idle_timeout_s * 1000)),
        ]
        self._grace_period_s = grace_period_s
        self._socket_check_interval_s = socket_check_interval_s
        self._metrics = PluginMetrics.for_registry(metrics_registry)
        self._resource_health = (
            ResourceHealthServicer(device_health, max_streams=max_health_streams) if device_health is not None else None
        )
        # every open health stream holds a server thread: keep those out of the prepares' share too
        stream_workers = self._resource_health.max_streams if self._resource_health is not None else 0
        self._dra = DRAService(
            preparer,
            self._metrics,
            serialize=serialize,
            max_concurrent_prepares=max(1, max_workers - RESERVED_WORKERS - stream_workers),
            max_concurrent_calls=max(1, max_workers - HEALTH_WORKERS - stream_workers),
        )
        self._registration = RegistrationService(
            driver_name,
            str(self._dra_socket),
            # like the Go helper: the optional health service is listed too (the kubelet ignores names it does not
            # know, and calls NodeWatchResources whether listed or not)
            [*SUPPORTED_VERSIONS, *([self._resource_health.service_name] if self._resource_health else [])],
            self._metrics,
            on_status=self._registration_reported,
        )
        self._on_registration = on_registration
        self._health = health.HealthServicer()
        self._health_names = [
            "",
            *(pb.DESCRIPTOR.services_by_name[DRA_SERVICE].full_name for pb, _ in DRA_API_VERSIONS),
            pluginregistration_v1_pb2.DESCRIPTOR.services_by_name[REGISTRATION_SERVICE].full_name,
            *([self._resource_health.service_name] if self._resource_health else []),
        ]
        self._lock = threading.Lock()
        self._dra_server: grpc.Server | None = None
        self._reg_server: grpc.Server | None = None
        self._services: dict[Path, list[AddServicer]] = {}
        self._socket_ids: dict[Path, SocketId | None] = {}  # what we bound, to remove only that
        self._watchdog: SocketWatchdog | None = None

    # -- properties

    @property
    def driver_name(self) -> str:
        return self._driver_name

    @property
    def pod_uid(self) -> str:
        """The pod UID in the socket names; "" if none."""
        return self._pod_uid

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
    def resource_health(self) -> ResourceHealthServicer | None:
        """The ``v1alpha1.DRAResourceHealth`` servicer; None without a device-health source."""
        return self._resource_health

    def device_health_changed(self) -> None:
        """Device health changed: the open NodeWatchResources streams send a new list. Safe from any thread."""
        if self._resource_health is not None:
            self._resource_health.notify()

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

    def _registration_reported(self, status: RegistrationStatus) -> None:
        state = health.SERVING if status.plugin_registered else health.NOT_SERVING
        self._health.set(health.KUBELET_REGISTRATION, state)
        if self._on_registration is not None:
            self._on_registration(status)

    # -- lifecycle

    def _serve(self, path: Path, services: list[AddServicer], name: str, *, replace: bool = True) -> grpc.Server:
        """Serve ``services`` (each adds its servicer to a server) on ``path``. With ``replace`` a socket there is
        replaced (atomically); without, a file that appeared there meanwhile is left alone and FileExistsError
        raised."""
        path.parent.mkdir(parents=True, exist_ok=True)
        _check_replaceable(path)
        self._services[path] = services
        if path == self._reg_socket:  # bound (again): not registered until the kubelet says so for this socket
            self._health.set(health.KUBELET_REGISTRATION, health.NOT_SERVING)
        # gRPC unlinks the path it bound when it stops, even if another instance's socket is there by then: bind a
        # private name, and move the file into place
        tmp = path.parent / _tmp_name()
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix=f"dra-grpc-{name}"),
            options=self._grpc_options,
        )
        for add in services:
            add(server)
        try:
            with _umask(0o777 & ~self._socket_mode):
                port = server.add_insecure_port(f"unix:{tmp}")
            if port == 0:
                raise OSError(f"cannot listen on {tmp}")
            os.chmod(tmp, self._socket_mode)
            server.start()
            self._socket_ids[path] = place_socket(tmp, path, replace=replace)
        except BaseException:
            server.stop(None)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        log.info("serving %s on %s", name, path)
        return server

    def _add_health(self, server: grpc.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)

    def start(self) -> None:
        """Start the DRA server, then the registrar. Raises if already started."""
        with self._lock:
            if self._dra_server is not None:
                raise RuntimeError("PluginServer already started")
            self._remove_dead_sockets()
            for name in self._health_names:
                self._health.set(name, health.SERVING)
            dra_services: list[AddServicer] = [self._dra.add_to_server]
            if self._resource_health is not None:
                self._resource_health.start()
                dra_services.append(self._resource_health.add_to_server)
            self._dra_server = self._serve(self._dra_socket, [*dra_services, self._add_health], "dra")
            try:
                self._reg_server = self._serve(
                    self._reg_socket, [self._registration.add_to_server, self._add_health], "registration"
                )
            except BaseException:
                self._stop_locked(0)
                raise
            if self._socket_check_interval_s:
                self._watchdog = SocketWatchdog("dra-socket-watchdog", self._socket_check_interval_s, self._check)
                self._watchdog.start()

    def stop(self, grace: float | None = None) -> None:
        """Stop the registrar, then the DRA server, and remove both socket files (if still ours). Idempotent."""
        with self._lock:
            watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.stop()
        with self._lock:
            self._stop_locked(self._grace_period_s if grace is None else grace)

    def _stop_locked(self, grace: float) -> None:
        self._health.enter_graceful_shutdown()
        if self._resource_health is not None:
            self._resource_health.stop()  # its streams would otherwise hold the server for the whole grace period
        # The registration socket goes first: the kubelet's plugin watcher drops this instance when it sees it go, so
        # fewer of its reconnects reach a DRA server that is closing (each is a warning in the kubelet's log).
        for server, path in ((self._reg_server, self._reg_socket), (self._dra_server, self._dra_socket)):
            try:
                remove_own_socket(path, self._socket_ids.pop(path, None))
            except OSError as exc:
                log.warning("cannot remove %s: %s", path, exc)
            if server is not None:
                server.stop(grace).wait()
        self._reg_server = None
        self._dra_server = None

    def _remove_dead_sockets(self) -> None:
        """Remove the sockets of this driver's other instances that nothing listens on any more (an instance that was
        killed leaves them, and with per-pod names no later instance binds that path again). Only this driver's
        names in its two directories, with a pod UID or none; this instance's own paths are replaced when bound."""
        driver = re.escape(self._driver_name)
        candidates = (
            (self._dra_socket.parent, re.compile(rf"dra(-{_UUID})?\.sock")),
            (self._reg_socket.parent, re.compile(rf"{driver}(-{_UUID})?-reg\.sock")),
        )
        for directory, pattern in candidates:
            try:
                names = sorted(os.listdir(directory))
            except OSError:  # not there yet: nothing left in it
                continue
            for name in names:
                path = directory / name
                if path in (self._dra_socket, self._reg_socket) or not pattern.fullmatch(name):
                    continue
                if not _is_dead_socket(path):
                    continue
                try:
                    path.unlink()
                except FileNotFoundError:
                    continue  # its own instance removed it meanwhile
                except OSError as exc:
                    log.warning("cannot remove %s, left by an instance that is gone: %s", path, exc)
                    continue
                log.warning("removed %s: nothing listens on it (left by an instance that did not stop cleanly)", path)

    # -- socket watchdog

    def _check(self) -> None:
        """Bind a socket whose file is gone again, the DRA socket first (the registrar advertises it). A path that
        exists is left alone: our socket, or another instance's, which serves it now."""
        with self._lock:
            if self._watchdog is None:  # stopping
                return
            if self._dra_server is not None:
                self._dra_server = self._rebind(self._dra_socket, "dra", self._dra_server)
            if self._reg_server is not None:
                self._reg_server = self._rebind(self._reg_socket, "registration", self._reg_server)

    def _rebind(self, path: Path, name: str, old: grpc.Server) -> grpc.Server:
        server = serve_again_if_gone(path, name, lambda: self._serve(path, self._services[path], name, replace=False))
        if server is None:
            return old
        old.stop(self._grace_period_s)  # in the background: calls on its connections finish, clients reconnect
        return server

    def __enter__(self) -> PluginServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
