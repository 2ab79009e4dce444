"""The kubelet's device-health stream (v1alpha1.DRAResourceHealth/NodeWatchResources) over the real DRA socket."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from dra_driver.api.slice import DeviceTaint
from dra_driver.claimstate.context import NO_DEADLINE, CallContext
from dra_driver.plugin.grpc import health
from dra_driver.plugin.grpc.generated import dra_health_v1alpha1_pb2
from dra_driver.plugin.grpc.kubelet import PrepareAnswer
from dra_driver.plugin.grpc.resource_health import (
    HEALTHY,
    UNHEALTHY,
    UNKNOWN,
    DeviceHealthSource,
    DeviceState,
    ResourceHealthServicer,
    states_from_taints,
    watch_resources,
)
from dra_driver.plugin.grpc.server import RESERVED_WORKERS, SUPPORTED_VERSIONS, PluginServer
from dra_driver.plugin.types import ClaimRef, PrepareResult
from tests.kubelet_harness import KubeletHarness
from tests.polling import wait_until
from tests.test_grpc_plugin import FakePreparer, claim, gpu

DRIVER = "gpu.nvidia.com"
NODE = "node-a"
SERVICE = "v1alpha1.DRAResourceHealth"


class Devices:
    """A mutable device-health source."""

    def __init__(self, *names: str) -> None:
        self.lock = threading.Lock()
        self.unhealthy: set[str] = set()
        self.names = list(names)
        self.server: PluginServer | None = None

    def __call__(self) -> dict[str, DeviceState]:
        with self.lock:
            return {n: DeviceState(n not in self.unhealthy, "xid" if n in self.unhealthy else "") for n in self.names}

    def set(self, name: str, healthy: bool) -> None:
        with self.lock:
            (self.unhealthy.discard if healthy else self.unhealthy.add)(name)
        assert self.server is not None
        self.server.device_health_changed()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _server(short_dir: Path, devices: Devices, preparer: Any = None, **kwargs: Any) -> PluginServer:
    srv = PluginServer(
        preparer or FakePreparer(),
        DRIVER,
        short_dir / "plugins" / DRIVER,
        short_dir / "plugins_registry",
        CollectorRegistry(),
        device_health=DeviceHealthSource(NODE, devices),
        **kwargs,
    )
    devices.server = srv
    return srv


@pytest.fixture
def devices() -> Devices:
    return Devices("gpu-0", "gpu-1", "gpu-1-mig-1g.10gb-0")


@pytest.fixture
def server(short_dir: Path, devices: Devices) -> Iterator[PluginServer]:
    srv = _server(short_dir, devices, grace_period_s=0)
    srv.start()
    yield srv
    srv.stop(grace=0)


@pytest.fixture
def kubelet(server: PluginServer, short_dir: Path) -> Iterator[KubeletHarness]:
    with KubeletHarness(short_dir / "plugins_registry", DRIVER) as harness:
        harness.register()
        yield harness


def _health(response: Any) -> dict[str, int]:
    assert {d.device.pool_name for d in response.devices} <= {NODE}
    return {d.device.device_name: d.health for d in response.devices}


def _streams(server: PluginServer) -> int:
    assert server.resource_health is not None
    return server.resource_health.streams


def test_first_list_then_a_new_one_on_every_change(kubelet: KubeletHarness, devices: Devices) -> None:
    stream = kubelet.watch_resources(timeout=30)
    try:
        first = next(stream)
        assert _health(first) == {"gpu-0": HEALTHY, "gpu-1": HEALTHY, "gpu-1-mig-1g.10gb-0": HEALTHY}
        entry = first.devices[0]
        assert abs(entry.last_updated_time - time.time()) < 60
        assert entry.health_check_timeout_seconds == 30
        devices.set("gpu-1", False)
        devices.set("gpu-1-mig-1g.10gb-0", False)
        got = next(stream)
        while _health(got)["gpu-1-mig-1g.10gb-0"] != UNHEALTHY:  # the two changes may come as one list or two
            got = next(stream)
        assert _health(got) == {"gpu-0": HEALTHY, "gpu-1": UNHEALTHY, "gpu-1-mig-1g.10gb-0": UNHEALTHY}
        assert next(d.message for d in got.devices if d.device.device_name == "gpu-1") == "xid"
        devices.set("gpu-1", True)
        devices.set("gpu-1-mig-1g.10gb-0", True)
        got = next(stream)
        while set(_health(got).values()) != {HEALTHY}:
            got = next(stream)
    finally:
        stream.cancel()


def test_lists_are_resent_before_the_kubelet_times_them_out(short_dir: Path, devices: Devices) -> None:
    servicer = ResourceHealthServicer(DeviceHealthSource(NODE, devices), resend_interval_s=0.2)
    server = grpc.server(ThreadPoolExecutor(4))
    servicer.add_to_server(server)
    sock = short_dir / "h.sock"
    server.add_insecure_port(f"unix:{sock}")
    server.start()
    try:
        with grpc.insecure_channel(f"unix:{sock}") as channel:
            stream = watch_resources(channel, timeout=30)
            start = time.monotonic()
            for _ in range(3):
                next(stream)
            assert time.monotonic() - start < 5
            stream.cancel()
    finally:
        server.stop(0).wait()


def test_registration_and_health_check_list_the_service(kubelet: KubeletHarness, server: PluginServer) -> None:
    assert kubelet.info is not None
    # the Go helper lists it after the DRA services; the kubelet picks the first DRA service it knows
    assert kubelet.info.supported_versions == [*SUPPORTED_VERSIONS, SERVICE]
    with grpc.insecure_channel(f"unix:{server.dra_socket_path}") as channel:
        assert health.check(channel, SERVICE) == health.SERVING


def test_cancel_ends_the_stream_on_the_server(kubelet: KubeletHarness, server: PluginServer) -> None:
    stream = kubelet.watch_resources(timeout=30)
    next(stream)
    assert _streams(server) == 1
    stream.cancel()
    # the stream's generator returned (its server thread is free again), without waiting for the next resend
    wait_until("the stream to end on the server", lambda: _streams(server) == 0, timeout=5, interval=0.02)


def test_extra_streams_are_refused(kubelet: KubeletHarness, server: PluginServer) -> None:
    open_ = [kubelet.watch_resources(timeout=30) for _ in range(2)]
    try:
        for s in open_:
            next(s)
        with pytest.raises(grpc.RpcError) as err:
            next(kubelet.watch_resources(timeout=30))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        for s in open_:
            s.cancel()
    wait_until("the streams to end", lambda: _streams(server) == 0, timeout=5, interval=0.02)
    stream = kubelet.watch_resources(timeout=30)
    assert len(next(stream).devices) == 3
    stream.cancel()


def test_server_stop_ends_an_open_stream_quickly(short_dir: Path, devices: Devices) -> None:
    srv = _server(short_dir, devices, grace_period_s=30)  # the grace period must not be waited out
    srv.start()
    with KubeletHarness(short_dir / "plugins_registry", DRIVER) as kubelet:
        kubelet.register()
        stream = kubelet.watch_resources(timeout=30)
        next(stream)
        start = time.monotonic()
        srv.stop()
        assert time.monotonic() - start < 5
        with pytest.raises((StopIteration, grpc.RpcError)):
            next(stream)
    assert _streams(srv) == 0


def test_prepares_and_unprepares_work_while_streams_are_open(short_dir: Path, devices: Devices) -> None:
    release = threading.Event()
    started: list[ClaimRef] = []

    class Slow(FakePreparer):
        def prepare(self, claims: list[ClaimRef], call: CallContext = NO_DEADLINE) -> dict[str, PrepareResult]:
            started.extend(claims)
            release.wait(10)
            return super().prepare(claims)

    preparer = Slow()
    preparer.prepare_results = {f"uid-{n}": PrepareResult(devices=[gpu(n)]) for n in range(1, 4)}
    max_workers = RESERVED_WORKERS + 2 + 1  # one prepare, two health streams, two reserved
    srv = _server(short_dir, devices, preparer, serialize=False, max_workers=max_workers, grace_period_s=0)
    with srv, KubeletHarness(short_dir / "plugins_registry", DRIVER) as kubelet, ThreadPoolExecutor(2) as pool:
        kubelet.register()
        streams = [kubelet.watch_resources(timeout=30) for _ in range(2)]
        try:
            for s in streams:
                next(s)
            first = pool.submit(kubelet.prepare, [claim(1)])
            wait_until("the first prepare to run", lambda: started, timeout=10, interval=0.02)
            # the streams and the stalled prepare hold their threads: another prepare is refused, not queued
            assert "prepare refused" in kubelet.prepare([claim(2)], timeout=5)["uid-2"].error
            assert kubelet.unprepare([claim(3)], timeout=5) == {"uid-3": ""}
            release.set()
            assert first.result(timeout=10) == {"uid-1": PrepareAnswer(devices=[gpu(1)])}
            assert kubelet.prepare([claim(2)], timeout=5) == {"uid-2": PrepareAnswer(devices=[gpu(2)])}
            devices.set("gpu-0", False)
            for s in streams:
                got = next(s)
                while _health(got)["gpu-0"] != UNHEALTHY:
                    got = next(s)
        finally:
            release.set()
            for s in streams:
                s.cancel()


def test_without_a_source_the_service_is_not_served(short_dir: Path) -> None:
    srv = PluginServer(
        FakePreparer(), DRIVER, short_dir / "plugins" / DRIVER, short_dir / "plugins_registry", CollectorRegistry()
    )
    with srv, KubeletHarness(short_dir / "plugins_registry", DRIVER) as kubelet:
        info = kubelet.register()
        assert SERVICE not in info.supported_versions
        with pytest.raises(grpc.RpcError) as err:
            next(kubelet.watch_resources(timeout=30))
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_states_from_taints() -> None:
    xid = DeviceTaint(key=f"{DRIVER}/xid", value="79", effect="NoSchedule", time_added="2026-01-01T00:00:00Z")
    unmonitored = DeviceTaint(key=f"{DRIVER}/unmonitored", value="events-not-supported", effect="None")
    lost = DeviceTaint(key=f"{DRIVER}/gpu-lost", value=None, effect="NoExecute")
    got = states_from_taints(
        ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], {"gpu-1": [xid], "gpu-2": [unmonitored], "gpu-3": [lost, unmonitored]}
    )
    assert got == {
        "gpu-0": DeviceState(True),
        "gpu-1": DeviceState(False, f"{DRIVER}/xid=79:NoSchedule"),
        "gpu-2": DeviceState(None, f"{DRIVER}/unmonitored=events-not-supported:None"),
        "gpu-3": DeviceState(False, f"{DRIVER}/gpu-lost:NoExecute, {DRIVER}/unmonitored=events-not-supported:None"),
    }


def test_snapshot_maps_unknown_and_truncates_messages() -> None:
    servicer = ResourceHealthServicer(
        DeviceHealthSource(NODE, lambda: {"b": DeviceState(None), "a": DeviceState(False, "x" * 2000)})
    )
    response: Any = servicer.snapshot()
    assert [(d.device.pool_name, d.device.device_name, d.health) for d in response.devices] == [
        (NODE, "a", UNHEALTHY),
        (NODE, "b", UNKNOWN),
    ]
    assert len(response.devices[0].message) == 1024 and response.devices[0].message.endswith("...")
    assert dra_health_v1alpha1_pb2.HealthStatus.Name(UNKNOWN) == "UNKNOWN"


class _Call:
    """The servicer's side of one call: active until its termination callbacks run (when gRPC has sent its status)."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []
        self.active = True

    def is_active(self) -> bool:
        return self.active

    def add_callback(self, callback: Any) -> bool:
        self.callbacks.append(callback)
        return True

    def terminate(self) -> None:
        self.active = False
        for callback in self.callbacks:
            callback()


def test_stop_returns_once_the_ended_streams_are_over() -> None:
    """The server's stop cancels every call still open (the kubelet logs a cancelled stream as an error), so the
    servicer's stop waits until the streams it ended are over, their OK status sent (gRPC's termination callback),
    and no longer than its bound. A loaded machine let the cancel win (a .ci/run failed
    test_server_stop_ends_an_open_stream_cleanly)."""
    servicer = ResourceHealthServicer(DeviceHealthSource(NODE, Devices("a")), resend_interval_s=60)
    call = _Call()
    stream = servicer.NodeWatchResources(None, call)
    next(stream)
    ended = threading.Thread(target=lambda: list(stream))
    ended.start()
    stopped = threading.Event()
    stopper = threading.Thread(target=lambda: (servicer.stop(), stopped.set()))
    stopper.start()
    ended.join(5)
    assert not ended.is_alive() and servicer.streams == 0  # the stream ended
    assert not stopped.wait(0.3)  # its call is not over yet: stop waits
    call.terminate()
    assert stopped.wait(5)
    began = time.monotonic()
    servicer.start()
    lost = servicer.NodeWatchResources(None, _Call())  # a call whose termination never comes
    next(lost)
    servicer.stop(wait_s=0.2)
    assert 0.15 < time.monotonic() - began < 3  # bounded


def test_server_stop_ends_an_open_stream_cleanly(short_dir: Path, devices: Devices) -> None:
    """The kubelet takes a stream that ends with status OK (io.EOF) as a clean end and logs it at -v=2; any other
    status is "Error receiving from WatchResources stream" at level E (pkg/kubelet/cm/dra/manager.go). A driver
    that stops (an update, a restart) must end its streams the clean way, with the server's default grace period
    and without one."""
    for grace in (None, 0.0):
        srv = _server(short_dir, devices)
        srv.start()
        with KubeletHarness(short_dir / "plugins_registry", DRIVER) as kubelet:
            kubelet.register()
            stream = kubelet.watch_resources(timeout=30)
            next(stream)
            srv.stop(grace)
            with pytest.raises(StopIteration):  # not grpc.RpcError
                while True:
                    next(stream)
            assert stream.code() == grpc.StatusCode.OK, grace


_KUBELET_PROCESS = """
import sys
import grpc
from dra_driver.plugin.grpc.resource_health import watch_resources
channel = grpc.insecure_channel("unix:" + sys.argv[1])
stream = watch_resources(channel, timeout=60)
next(stream)
print("watching", flush=True)
sys.stdin.read()
"""


def test_a_kubelet_that_dies_frees_its_stream_for_the_restarted_one(short_dir: Path, devices: Devices) -> None:
    """A kubelet that is killed never cancels its stream: its connection just closes. The daemon must notice at
    once, or a kubelet restarted twice within a resend interval would find every stream slot taken (refused with
    RESOURCE_EXHAUSTED: an error in its log, and no health until a slot frees)."""
    srv = _server(short_dir, devices, grace_period_s=0)
    with srv:
        assert srv.resource_health is not None and srv.resource_health.max_streams == 2
        kubelets = [
            subprocess.Popen(
                [sys.executable, "-c", _KUBELET_PROCESS, str(srv.dra_socket_path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        try:
            for k in kubelets:
                assert k.stdout is not None and k.stdout.readline() == "watching\n"
            assert _streams(srv) == 2
            for k in kubelets:
                k.kill()
                k.wait(10)
            # well before the next resend (10 s), which would otherwise be the first write to fail
            wait_until("the dead kubelets' streams to end", lambda: _streams(srv) == 0, timeout=3, interval=0.02)
            with KubeletHarness(short_dir / "plugins_registry", DRIVER) as kubelet:
                kubelet.register()
                streams = [kubelet.watch_resources(timeout=30) for _ in range(2)]
                try:
                    assert [len(next(s).devices) for s in streams] == [3, 3]
                finally:
                    for s in streams:
                        s.cancel()
        finally:
            for k in kubelets:
                k.kill()
                k.wait(10)
