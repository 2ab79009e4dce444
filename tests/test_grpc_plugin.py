"""The kubelet-facing gRPC layer over real Unix sockets, driven by the kubelet harness and a fake ClaimPreparer."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.claimstate.context import NO_DEADLINE, CallContext
from dra_driver.plugin.failures import ClaimFailure, FailureKind
from dra_driver.plugin.grpc import health
from dra_driver.plugin.grpc.kubelet import PrepareAnswer
from dra_driver.plugin.grpc.server import SUPPORTED_VERSIONS, PluginServer
from dra_driver.plugin.types import ClaimRef, PreparedDevice, PrepareResult
from tests.kubelet_harness import KubeletHarness, RegistrationError
from tests.polling import wait_until

DRIVER = "gpu.nvidia.com"


class FakePreparer:
    """Returns canned results; records the claims it was given."""

    def __init__(self) -> None:
        self.prepare_results: dict[str, PrepareResult] = {}
        self.unprepare_results: dict[str, ClaimFailure] = {}
        self.prepare_error: Exception | None = None
        self.unprepare_error: Exception | None = None
        self.prepared: list[list[ClaimRef]] = []
        self.unprepared: list[list[ClaimRef]] = []

    def prepare(self, claims: list[ClaimRef], call: CallContext = NO_DEADLINE) -> dict[str, PrepareResult]:
        self.prepared.append(list(claims))
        if self.prepare_error is not None:
            raise self.prepare_error
        return {c.uid: self.prepare_results[c.uid] for c in claims if c.uid in self.prepare_results}

    def unprepare(self, claims: list[ClaimRef], call: CallContext = NO_DEADLINE) -> dict[str, ClaimFailure | None]:
        self.unprepared.append(list(claims))
        if self.unprepare_error is not None:
            raise self.unprepare_error
        return {c.uid: self.unprepare_results.get(c.uid) for c in claims}


def claim(n: int) -> ClaimRef:
    return ClaimRef(namespace="ns", name=f"claim-{n}", uid=f"uid-{n}")


def gpu(n: int, requests: list[str] | None = None, share_id: str | None = None) -> PreparedDevice:
    return PreparedDevice(
        requests=requests if requests is not None else ["gpu"],
        pool="node-a",
        device=f"gpu-{n}",
        cdi_device_ids=[f"k8s.{DRIVER}/gpu=gpu-{n}"],
        share_id=share_id,
    )


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: pytest's tmp_path can exceed the 107-byte AF_UNIX limit."""
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def preparer() -> FakePreparer:
    return FakePreparer()


@pytest.fixture
def server(preparer: FakePreparer, short_dir: Path, registry: CollectorRegistry) -> Iterator[PluginServer]:
    srv = PluginServer(
        preparer, DRIVER, short_dir / "plugins" / DRIVER, short_dir / "plugins_registry", metrics_registry=registry
    )
    srv.start()
    yield srv
    srv.stop(grace=0)


@pytest.fixture
def kubelet(server: PluginServer, short_dir: Path) -> Iterator[KubeletHarness]:
    with KubeletHarness(short_dir / "plugins_registry", DRIVER) as harness:
        harness.register()
        yield harness


def test_registration_handshake(server: PluginServer, short_dir: Path) -> None:
    assert server.registration_status is None
    with KubeletHarness(short_dir / "plugins_registry") as harness:
        sock = harness.find_registration_socket()
        assert sock == short_dir / "plugins_registry" / f"{DRIVER}-reg.sock" == server.registration_socket_path
        info = harness.register()
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(short_dir / "plugins" / DRIVER / "dra.sock") == str(server.dra_socket_path)
    assert info.supported_versions == ["v1.DRAPlugin", "v1beta1.DRAPlugin"] == list(SUPPORTED_VERSIONS)
    assert server.wait_registered(timeout=1)
    status = server.registration_status
    assert status is not None and status.plugin_registered and status.error == ""


def test_failed_registration_is_recorded_and_answered_with_an_error(server: PluginServer, short_dir: Path) -> None:
    harness = KubeletHarness(short_dir / "plugins_registry", DRIVER)
    with pytest.raises(grpc.RpcError) as err:
        harness.notify_registration_status(False, "version mismatch")
    assert err.value.code() == grpc.StatusCode.UNKNOWN
    assert "version mismatch" in (err.value.details() or "")
    status = server.registration_status
    assert status is not None and not status.plugin_registered and status.error == "version mismatch"
    assert not server.wait_registered(timeout=0.1)


def test_harness_rejects_a_missing_endpoint_and_tells_the_plugin(preparer: FakePreparer, short_dir: Path) -> None:
    # no socket watchdog: it would bind the deleted socket again
    dirs = (short_dir / "plugins" / DRIVER, short_dir / "plugins_registry")
    with PluginServer(preparer, DRIVER, *dirs, CollectorRegistry(), socket_check_interval_s=None) as server:
        server.dra_socket_path.unlink()
        with pytest.raises(RegistrationError, match="does not exist"):
            KubeletHarness(short_dir / "plugins_registry", DRIVER).register()
        status = server.registration_status
        assert status is not None and not status.plugin_registered and "does not exist" in status.error


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_prepare_and_unprepare(version: str, kubelet: KubeletHarness, preparer: FakePreparer) -> None:
    preparer.prepare_results = {
        "uid-1": PrepareResult(devices=[gpu(0), gpu(1, requests=[])]),
        "uid-2": PrepareResult(devices=[gpu(2, share_id="share-7")]),
    }
    got = kubelet.prepare([claim(1), claim(2)], version=version)
    assert preparer.prepared == [[claim(1), claim(2)]]
    assert got["uid-1"] == PrepareAnswer(devices=[gpu(0), gpu(1, requests=[])])
    # v1beta1 has no share_id field; v1 carries it with presence
    assert got["uid-2"] == PrepareAnswer(devices=[gpu(2, share_id="share-7" if version == "v1" else None)])
    raw = kubelet.prepare_raw([claim(1)], version=version)
    assert raw.DESCRIPTOR.full_name == f"k8s.io.kubelet.pkg.apis.dra.{version}.NodePrepareResourcesResponse"
    if version == "v1":
        assert not raw.claims["uid-1"].devices[0].HasField("share_id")

    assert kubelet.unprepare([claim(1), claim(2)], version=version) == {"uid-1": "", "uid-2": ""}
    assert preparer.unprepared == [[claim(1), claim(2)]]


def test_kubelet_prefers_v1(kubelet: KubeletHarness, preparer: FakePreparer) -> None:
    preparer.prepare_results = {"uid-1": PrepareResult(devices=[gpu(0)])}
    raw = kubelet.prepare_raw([claim(1)])
    assert raw.DESCRIPTOR.full_name == "k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesResponse"


def test_per_claim_errors(kubelet: KubeletHarness, preparer: FakePreparer) -> None:
    preparer.prepare_results = {
        "uid-1": PrepareResult(devices=[gpu(0)]),
        "uid-2": PrepareResult(devices=[gpu(1)], failure=ClaimFailure.of(FailureKind.DEVICE_IN_USE, "GPU-1 is busy")),
        # uid-3: no result at all
    }
    got = kubelet.prepare([claim(1), claim(2), claim(3)])
    assert set(got) == {"uid-1", "uid-2", "uid-3"}
    assert got["uid-1"] == PrepareAnswer(devices=[gpu(0)])
    assert got["uid-2"] == PrepareAnswer(error="GPU-1 is busy")  # devices of a failed claim are not sent
    assert "no result" in got["uid-3"].error and "ns/claim-3" in got["uid-3"].error

    preparer.unprepare_results = {"uid-2": ClaimFailure.of(FailureKind.SHARING, "still in use")}
    assert kubelet.unprepare([claim(1), claim(2)]) == {"uid-1": "", "uid-2": "still in use"}


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_preparer_exceptions_become_claim_errors(version: str, kubelet: KubeletHarness, preparer: FakePreparer) -> None:
    preparer.prepare_error = RuntimeError("NVML went away")
    got = kubelet.prepare([claim(1), claim(2)], version=version)
    assert set(got) == {"uid-1", "uid-2"}
    for result in got.values():
        assert result.devices == [] and "RuntimeError: NVML went away" in result.error

    preparer.unprepare_error = OSError("disk full")
    errors = kubelet.unprepare([claim(1), claim(2)], version=version)
    assert set(errors) == {"uid-1", "uid-2"}
    assert all("OSError: disk full" in e for e in errors.values())


def test_subrequest_names_are_stripped(kubelet: KubeletHarness, preparer: FakePreparer) -> None:
    preparer.prepare_results = {"uid-1": PrepareResult(devices=[gpu(0, requests=["gpu/mig-1g", "other", "x/y/z"])])}
    for version in ("v1", "v1beta1"):
        got = kubelet.prepare([claim(1)], version=version)
        assert got["uid-1"].devices[0].requests == ["gpu", "other", "x"]


def test_empty_and_duplicate_claims(kubelet: KubeletHarness, preparer: FakePreparer) -> None:
    assert kubelet.prepare([]) == {}
    assert kubelet.unprepare([]) == {}
    assert preparer.prepared == [] and preparer.unprepared == []
    preparer.prepare_results = {"uid-1": PrepareResult(devices=[gpu(0)])}
    assert set(kubelet.prepare([claim(1), claim(1)])) == {"uid-1"}
    assert preparer.prepared == [[claim(1)]]


@pytest.mark.parametrize("mode", [0o600, 0o660])
def test_socket_files_modes_dirs_and_removal(mode: int, preparer: FakePreparer, short_dir: Path) -> None:
    plugin_dir = short_dir / "a" / "b" / DRIVER
    registry_dir = short_dir / "c" / "registry"
    srv = PluginServer(preparer, DRIVER, plugin_dir, registry_dir, CollectorRegistry(), socket_mode=mode)
    assert srv.dra_socket_path == plugin_dir / "dra.sock"
    assert srv.registration_socket_path == registry_dir / f"{DRIVER}-reg.sock"
    old_umask = os.umask(0o022)
    try:
        srv.start()
    finally:
        os.umask(old_umask)
    try:
        for path in (srv.dra_socket_path, srv.registration_socket_path):
            st = path.lstat()
            assert stat.S_ISSOCK(st.st_mode)
            assert stat.S_IMODE(st.st_mode) == mode, f"{path}: {oct(st.st_mode)}"
        assert os.umask(0o022) == 0o022  # the umask was restored
    finally:
        srv.stop(grace=0)
    assert not srv.dra_socket_path.exists()
    assert not srv.registration_socket_path.exists()
    srv.stop()  # idempotent


def test_stale_socket_is_replaced_and_other_files_are_not(preparer: FakePreparer, short_dir: Path) -> None:
    plugin_dir = short_dir / "plugin"
    plugin_dir.mkdir()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(plugin_dir / "dra.sock"))
    stale.close()
    srv = PluginServer(preparer, DRIVER, plugin_dir, short_dir / "reg", CollectorRegistry())
    srv.start()
    try:
        with KubeletHarness(short_dir / "reg", DRIVER) as harness:
            harness.register()
            assert harness.unprepare([claim(1)]) == {"uid-1": ""}
    finally:
        srv.stop(grace=0)

    (plugin_dir / "dra.sock").write_text("not a socket")
    with pytest.raises(FileExistsError):
        PluginServer(preparer, DRIVER, plugin_dir, short_dir / "reg", CollectorRegistry()).start()
    assert not (short_dir / "reg" / f"{DRIVER}-reg.sock").exists()


def test_dra_server_starts_before_the_registrar(
    preparer: FakePreparer, short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = PluginServer(preparer, DRIVER, short_dir / "p", short_dir / "r", CollectorRegistry())
    order: list[tuple[str, bool]] = []
    real_serve = srv._serve

    def recording_serve(path: Path, handlers: list[grpc.GenericRpcHandler], name: str) -> grpc.Server:
        order.append((name, srv.dra_socket_path.exists()))
        return real_serve(path, handlers, name)

    monkeypatch.setattr(srv, "_serve", recording_serve)
    with srv:
        pass
    assert order == [("dra", False), ("registration", True)]


def test_too_long_socket_path_is_rejected(preparer: FakePreparer) -> None:
    with pytest.raises(ValueError, match="AF_UNIX"):
        PluginServer(preparer, DRIVER, "/tmp/" + "x" * 120, "/tmp/reg", CollectorRegistry())


def test_health_service(server: PluginServer) -> None:
    for path in (server.dra_socket_path, server.registration_socket_path):
        with grpc.insecure_channel(f"unix:{path}") as channel:
            assert health.check(channel) == health.SERVING
            assert health.check(channel, "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin") == health.SERVING
            assert health.check(channel, "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin") == health.SERVING
            assert health.check(channel, "pluginregistration.Registration") == health.SERVING
            with pytest.raises(grpc.RpcError) as err:
                health.check(channel, "no.such.Service")
            assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_watch_streams_changes(server: PluginServer) -> None:
    with grpc.insecure_channel(f"unix:{server.dra_socket_path}") as channel:
        watch = channel.unary_stream(
            "/grpc.health.v1.Health/Watch",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        stream = watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert next(stream).status == health.SERVING
        threading.Timer(0.1, server.health.set, args=("", health.NOT_SERVING)).start()
        assert next(stream).status == health.NOT_SERVING
        stream.cancel()


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics(kubelet: KubeletHarness, preparer: FakePreparer, registry: CollectorRegistry) -> None:
    preparer.prepare_results = {
        "uid-1": PrepareResult(devices=[gpu(0), gpu(1)]),
        "uid-2": PrepareResult(devices=[gpu(2)]),
        "uid-3": PrepareResult(failure=ClaimFailure.of(FailureKind.DEVICE_IN_USE, "busy")),
    }
    kubelet.prepare([claim(1), claim(2)])  # ok: 3 devices
    kubelet.prepare([claim(1)], version="v1beta1")  # repeated: still 3 devices
    kubelet.prepare([claim(3), claim(4)])  # claim error + missing result
    preparer.prepare_error = RuntimeError("boom")
    kubelet.prepare([claim(5)])
    kubelet.unprepare([claim(2)])  # uid-1 and its 2 devices left

    s = _samples(registry)
    prep, unprep = (("method", "NodePrepareResources"),), (("method", "NodeUnprepareResources"),)

    def req(method: tuple[tuple[str, str], ...], result: str) -> float:
        return s.get(("dra_driver_grpc_requests_total", (*method, ("result", result))), 0.0)

    def err(method: tuple[tuple[str, str], ...], kind: str, claim_kind: str = "") -> float:
        return s.get(("dra_driver_grpc_errors_total", (("kind", claim_kind), *method, ("type", kind))), 0.0)

    assert req(prep, "ok") == 2
    assert req(prep, "claim_error") == 2
    assert req(unprep, "ok") == 1
    assert s[("dra_driver_grpc_requests_total", (("method", "GetInfo"), ("result", "ok")))] == 1
    assert s[("dra_driver_grpc_requests_total", (("method", "NotifyRegistrationStatus"), ("result", "ok")))] == 1
    assert err(prep, "claim_error", "device_in_use") == 1
    assert err(prep, "missing_result") == 1
    assert err(prep, "preparer_exception") == 1
    assert s[("dra_driver_grpc_request_duration_seconds_count", prep)] == 4
    assert s[("dra_driver_grpc_request_duration_seconds_count", unprep)] == 1
    assert s[("dra_driver_grpc_requests_in_flight", prep)] == 0
    assert s[("dra_driver_prepared_devices", ())] == 2


def test_failed_registration_metrics(server: PluginServer, short_dir: Path, registry: CollectorRegistry) -> None:
    with pytest.raises(grpc.RpcError):
        KubeletHarness(short_dir / "plugins_registry", DRIVER).notify_registration_status(False, "no")
    s = _samples(registry)
    method = ("method", "NotifyRegistrationStatus")
    assert s[("dra_driver_grpc_requests_total", (method, ("result", "rpc_error")))] == 1
    assert s[("dra_driver_grpc_errors_total", (("kind", ""), method, ("type", "registration_failed")))] == 1


def test_claim_failures_are_counted_by_kind(
    kubelet: KubeletHarness, preparer: FakePreparer, registry: CollectorRegistry
) -> None:
    deadline = ClaimFailure.of(FailureKind.DEADLINE, "deadline exceeded before claim ns/claim-1 could be read")
    invalid = ClaimFailure.of(FailureKind.INVALID_CONFIG, "invalid GpuConfig")
    preparer.prepare_results = {"uid-1": PrepareResult(failure=deadline), "uid-2": PrepareResult(failure=invalid)}
    preparer.unprepare_results = {"uid-3": ClaimFailure.of(FailureKind.SHARING, "nvidia-smi exited with 15")}
    got = kubelet.prepare([claim(1), claim(2)])
    kubelet.prepare([claim(1)])
    assert {uid: r.error for uid, r in got.items()} == {"uid-1": deadline.message, "uid-2": "invalid GpuConfig"}
    assert kubelet.unprepare([claim(3)]) == {"uid-3": "nvidia-smi exited with 15"}

    s = _samples(registry)
    errors = {
        (labels["method"], labels["kind"]): value
        for (name, label_items), value in s.items()
        if name == "dra_driver_grpc_errors_total" and (labels := dict(label_items))["type"] == "claim_error"
    }
    assert errors == {
        ("NodePrepareResources", "deadline"): 2,
        ("NodePrepareResources", "invalid_config"): 1,
        ("NodeUnprepareResources", "sharing"): 1,
    }


def _serving(path: Path) -> bool:
    with grpc.insecure_channel(f"unix:{path}") as channel:
        return health.check(channel, timeout=2) == health.SERVING


def test_a_stopping_instance_leaves_the_sockets_of_the_one_that_replaced_it(short_dir: Path) -> None:
    # a rolling update with surge: the new pod binds the same paths while the old one still runs
    old, new = FakePreparer(), FakePreparer()
    new.prepare_results = {"uid-1": PrepareResult(devices=[gpu(1)])}
    dirs = (short_dir / "plugins" / DRIVER, short_dir / "plugins_registry")
    a = PluginServer(old, DRIVER, *dirs, CollectorRegistry(), grace_period_s=0)
    b = PluginServer(new, DRIVER, *dirs, CollectorRegistry(), grace_period_s=0)
    a.start()
    try:
        b.start()
        try:
            a.stop()
            for path in (b.dra_socket_path, b.registration_socket_path):
                assert stat.S_ISSOCK(path.lstat().st_mode) and _serving(path)
            with KubeletHarness(dirs[1], DRIVER) as kubelet:
                kubelet.register()
                assert kubelet.prepare([claim(1)]) == {"uid-1": PrepareAnswer(devices=[gpu(1)])}
            assert old.prepared == [] and new.prepared == [[claim(1)]]
            assert b.wait_registered(timeout=1)
        finally:
            b.stop(grace=0)
    finally:
        a.stop(grace=0)
    assert not b.dra_socket_path.exists() and not b.registration_socket_path.exists()  # its own: removed


def test_deleted_sockets_are_served_again(preparer: FakePreparer, short_dir: Path) -> None:
    preparer.prepare_results = {"uid-1": PrepareResult(devices=[gpu(1)])}
    registry_dir = short_dir / "plugins_registry"
    srv = PluginServer(
        preparer, DRIVER, short_dir / "plugins" / DRIVER, registry_dir, CollectorRegistry(), socket_check_interval_s=0.1
    )
    with srv, KubeletHarness(registry_dir, DRIVER) as kubelet:
        kubelet.register()
        srv.dra_socket_path.unlink()
        srv.registration_socket_path.unlink()
        for path in (srv.dra_socket_path, srv.registration_socket_path):
            wait_until(f"{path} is served again", lambda p=path: p.exists() and _serving(p), timeout=10)
        with KubeletHarness(registry_dir, DRIVER) as again:  # what the kubelet does when the socket reappears
            again.register()
            assert again.prepare([claim(1)]) == {"uid-1": PrepareAnswer(devices=[gpu(1)])}
        assert kubelet.unprepare([claim(1)]) == {"uid-1": ""}  # its connection to the old socket: reconnected
    assert not srv.dra_socket_path.exists() and not srv.registration_socket_path.exists()


def test_the_watchdog_leaves_sockets_another_instance_took_over(short_dir: Path) -> None:
    dirs = (short_dir / "plugins" / DRIVER, short_dir / "plugins_registry")
    a = PluginServer(FakePreparer(), DRIVER, *dirs, CollectorRegistry(), grace_period_s=0, socket_check_interval_s=0.05)
    b = PluginServer(FakePreparer(), DRIVER, *dirs, CollectorRegistry(), grace_period_s=0, socket_check_interval_s=None)
    with a, b:
        ids = {p: (p.lstat().st_dev, p.lstat().st_ino) for p in (b.dra_socket_path, b.registration_socket_path)}
        time.sleep(0.5)  # ten checks of `a`
        assert {p: (p.lstat().st_dev, p.lstat().st_ino) for p in ids} == ids


def _probe(short_dir: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    from dra_driver import entry

    argv = ["probe", f"--driver={DRIVER}", f"--plugin-dir={short_dir / 'plugins' / DRIVER}"]
    code = entry.main([*argv, f"--registry-dir={short_dir / 'plugins_registry'}", "--timeout=2", *extra])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_probe_passes_against_a_serving_plugin(server: PluginServer, short_dir: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, out = _probe(short_dir, capsys)
    assert code == 0, out
    assert str(server.dra_socket_path) in out and str(server.registration_socket_path) in out


def test_probe_fails_clearly(preparer: FakePreparer, short_dir: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, out = _probe(short_dir, capsys)  # nothing there
    assert code != 0 and f"{short_dir / 'plugins' / DRIVER / 'dra.sock'}: does not exist" in out, out
    srv = PluginServer(
        preparer, DRIVER, short_dir / "plugins" / DRIVER, short_dir / "plugins_registry", socket_check_interval_s=None
    )
    with srv:
        srv.registration_socket_path.unlink()
        code, out = _probe(short_dir, capsys)
        assert code != 0 and f"{srv.registration_socket_path}: does not exist" in out, out
        assert f"{srv.dra_socket_path}: SERVING" in out
        srv.health.set("", health.NOT_SERVING)
        code, out = _probe(short_dir, capsys)
        assert code != 0 and f"{srv.dra_socket_path}: NOT_SERVING" in out, out
    stale = socket.socket(socket.AF_UNIX)  # a socket file nobody listens on: a crashed daemon's
    stale.bind(str(srv.dra_socket_path))
    stale.close()
    code, out = _probe(short_dir, capsys)
    assert code != 0 and f"{srv.dra_socket_path}: no answer" in out, out


def test_probe_registered_waits_for_the_kubelets_registration(preparer: FakePreparer, short_dir: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The chart's startup and readiness check: serving sockets are not enough, the kubelet must have registered this
    instance (else a rolling update removes the old pod before the kubelet knows the new one)."""
    registry_dir = short_dir / "plugins_registry"
    srv = PluginServer(
        preparer, DRIVER, short_dir / "plugins" / DRIVER, registry_dir, CollectorRegistry(), socket_check_interval_s=0.1
    )
    with srv, KubeletHarness(registry_dir, DRIVER) as kubelet:
        assert _probe(short_dir, capsys)[0] == 0  # liveness: the sockets answer
        code, out = _probe(short_dir, capsys, "--registered")
        assert code != 0 and f"{srv.registration_socket_path}: not registered by the kubelet (NOT_SERVING)" in out, out
        kubelet.register()
        code, out = _probe(short_dir, capsys, "--registered")
        assert code == 0 and f"{srv.registration_socket_path}: registered by the kubelet" in out, out
        with pytest.raises(grpc.RpcError):  # a rejection: not registered any more
            kubelet.notify_registration_status(False, "version not supported")
        assert _probe(short_dir, capsys, "--registered")[0] != 0
        kubelet.register()
        assert _probe(short_dir, capsys, "--registered")[0] == 0
        srv.registration_socket_path.unlink()  # the kubelet drops the plugin; the socket is served again
        path = srv.registration_socket_path
        wait_until("the socket served again", lambda: path.exists() and _serving(path), timeout=10)
        code, out = _probe(short_dir, capsys, "--registered")
        assert code != 0 and "not registered by the kubelet" in out, out
        kubelet.register()
        assert _probe(short_dir, capsys, "--registered")[0] == 0


def test_the_probe_command_loads_grpc_but_not_the_driver(tmp_path: Path) -> None:
    """The kubelet runs `dra-driver probe` every few seconds: it must not pay for the CLI's imports (the driver's
    pydantic models, the Kubernetes client, the plugin's servers)."""
    heavy = ("dra_driver.cli", "dra_driver.plugin.grpc.server", "pydantic", "kubernetes")
    script = (
        "import sys; from dra_driver.entry import main; "
        f"rc = main(['probe', '--plugin-dir={tmp_path}', '--registry-dir={tmp_path}']); "
        f"print(rc, [m for m in {heavy!r} if m in sys.modules], 'grpc' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["1", "[]", "True"], proc.stdout + proc.stderr
    assert f"{tmp_path / 'dra.sock'}: does not exist" in proc.stderr


def test_the_call_deadline_reaches_the_preparer_and_bounds_the_wait_for_a_serialized_call(short_dir: Path) -> None:
    release = threading.Event()

    class Slow(FakePreparer):
        def __init__(self) -> None:
            super().__init__()
            self.deadlines: list[float | None] = []

        def prepare(self, claims: list[ClaimRef], call: CallContext = NO_DEADLINE) -> dict[str, PrepareResult]:
            self.deadlines.append(call.deadline)
            release.wait(10)
            return super().prepare(claims)

    slow = Slow()
    slow.prepare_results = {"uid-1": PrepareResult(devices=[gpu(1)])}
    dirs = (short_dir / "plugins" / DRIVER, short_dir / "plugins_registry")
    srv = PluginServer(slow, DRIVER, *dirs, CollectorRegistry(), serialize=True, grace_period_s=0)
    with srv, KubeletHarness(dirs[1], DRIVER) as kubelet, ThreadPoolExecutor(1) as pool:
        kubelet.register()
        try:
            first = pool.submit(kubelet.prepare, [claim(1)])  # the kubelet's 45 s
            wait_until("the first prepare to run", lambda: slow.deadlines)
            start = time.monotonic()
            got = kubelet.unprepare([claim(2)], timeout=1.5)
            assert time.monotonic() - start < 1.5  # answered, not cut off
            assert "deadline exceeded waiting for another prepare or unprepare" in got["uid-2"]
        finally:
            release.set()
        assert first.result() == {"uid-1": PrepareAnswer(devices=[gpu(1)])}
        (deadline,) = slow.deadlines
        assert deadline is not None and 30 < deadline - time.monotonic() <= 45


def test_silent_and_idle_connections_are_closed_and_calls_go_on(preparer: FakePreparer, short_dir: Path) -> None:
    """A client that connects and never speaks HTTP/2 is dropped at the handshake timeout; one that opened HTTP/2
    and makes no call gets a GOAWAY once idle; the kubelet's calls go on meanwhile (its next call connects again)."""
    dirs = (short_dir / "plugin", short_dir / "registry")
    srv = PluginServer(preparer, DRIVER, *dirs, CollectorRegistry(), socket_check_interval_s=None,
                       handshake_timeout_s=1.0, idle_timeout_s=2.0)  # fmt: skip
    preparer.prepare_results = {"uid-1": PrepareResult(devices=[gpu(0)])}

    def closed_by_server(s: socket.socket) -> bool:
        """True once the server closed `s` (end of stream or reset), False if it is still open at its timeout."""
        try:
            while s.recv(4096):
                pass
            return True
        except TimeoutError:
            return False
        except OSError:
            return True

    srv.start()
    try:
        path = str(dirs[0] / "dra.sock")
        silent = [socket.socket(socket.AF_UNIX) for _ in range(20)]
        for s in silent:
            s.connect(path)
            s.settimeout(6)
        idle = socket.socket(socket.AF_UNIX)
        idle.connect(path)
        idle.settimeout(8)
        idle.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # + SETTINGS
        with KubeletHarness(dirs[1], DRIVER) as kubelet:
            kubelet.register()
            assert kubelet.prepare([claim(1)])["uid-1"] == PrepareAnswer(devices=[gpu(0)])
            assert all(closed_by_server(s) for s in silent)
            assert closed_by_server(idle)
            time.sleep(2.5)  # the kubelet's connection is idle past the timeout too: its next call connects again
            assert kubelet.unprepare([claim(1)]) == {"uid-1": ""}
        for s in (*silent, idle):
            s.close()
    finally:
        srv.stop(grace=0)
