"""Rolling updates with surge: two instances of the driver on one node, each with its pod's UID in its socket names
(``dra-<uid>.sock``, ``<driver>-<uid>-reg.sock``, as the Go helper's ``RollingUpdate(uid)`` names them), both
registered with the kubelet; and the liveness probe of each checking its own sockets."""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from dra_driver.plugin.grpc.kubelet import PrepareAnswer
from dra_driver.plugin.grpc.server import PluginServer
from dra_driver.plugin.sockets import dra_socket_name, plugin_sockets, registrar_socket_name
from dra_driver.plugin.types import PrepareResult
from tests.kubelet_harness import KubeletHarness
from tests.test_grpc_plugin import DRIVER, FakePreparer, _serving, claim, gpu

OLD_UID = "0b5e1a8c-3f2d-4c6e-9a71-2d4f6b8e0c13"
NEW_UID = "7f3c9d21-84ab-4e5f-b062-c1d3e5f7a9b4"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: pytest's tmp_path can exceed the 107-byte AF_UNIX limit."""
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _dirs(short_dir: Path) -> tuple[Path, Path]:
    return short_dir / "plugins" / DRIVER, short_dir / "plugins_registry"


def _server(
    preparer: FakePreparer,
    short_dir: Path,
    pod_uid: str = "",
    plugin_socket_name: str | None = None,
    registrar_socket_filename: str | None = None,
) -> PluginServer:
    return PluginServer(
        preparer,
        DRIVER,
        *_dirs(short_dir),
        CollectorRegistry(),
        pod_uid=pod_uid,
        plugin_socket_name=plugin_socket_name,
        registrar_socket_filename=registrar_socket_filename,
        grace_period_s=0,
    )


def _one_tick_later() -> None:
    """File times come from a coarse clock (a jiffy): let the next socket be visibly newer."""
    time.sleep(0.05)


def _dead_socket(path: Path) -> None:
    """A socket file nobody listens on: what a killed instance leaves."""
    path.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()


def test_socket_names_with_and_without_a_pod_uid(short_dir: Path) -> None:
    assert registrar_socket_name(DRIVER) == f"{DRIVER}-reg.sock" and dra_socket_name() == "dra.sock"  # unchanged
    assert registrar_socket_name(DRIVER, OLD_UID) == f"{DRIVER}-{OLD_UID}-reg.sock"
    assert dra_socket_name(OLD_UID) == f"dra-{OLD_UID}.sock"
    plugin_dir, registry_dir = _dirs(short_dir)
    plain, per_pod = _server(FakePreparer(), short_dir), _server(FakePreparer(), short_dir, OLD_UID)
    assert plain.pod_uid == "" and plain.dra_socket_path == plugin_dir / "dra.sock"
    assert plain.registration_socket_path == registry_dir / f"{DRIVER}-reg.sock"
    assert per_pod.pod_uid == OLD_UID and per_pod.dra_socket_path == plugin_dir / f"dra-{OLD_UID}.sock"
    assert per_pod.registration_socket_path == registry_dir / f"{DRIVER}-{OLD_UID}-reg.sock"
    # the probe checks the same paths
    assert plugin_sockets(DRIVER, plugin_dir, registry_dir) == [plain.dra_socket_path, plain.registration_socket_path]
    assert plugin_sockets(DRIVER, plugin_dir, registry_dir, OLD_UID) == [
        per_pod.dra_socket_path,
        per_pod.registration_socket_path,
    ]
    # explicit names: the DRA socket's wins over the UID; the registration socket's excludes it (as in the Go helper)
    assert _server(FakePreparer(), short_dir, OLD_UID, plugin_socket_name="x.sock").dra_socket_path.name == "x.sock"
    with pytest.raises(ValueError, match="mutually exclusive"):
        _server(FakePreparer(), short_dir, OLD_UID, registrar_socket_filename="legacy-reg.sock")
    for bad in ("a/b", "../x", ".hidden", "a b", "x\0y"):
        with pytest.raises(ValueError, match="cannot be part of a socket name"):
            _server(FakePreparer(), short_dir, bad)


def test_two_instances_with_pod_uids_serve_and_register_side_by_side(short_dir: Path) -> None:
    """The old and the new pod of a surge both serve and are both registered; stopping the old one leaves the new
    one's sockets, which still answer the kubelet."""
    old, new = FakePreparer(), FakePreparer()
    old.prepare_results = {"uid-1": PrepareResult(devices=[gpu(1)])}
    new.prepare_results = {"uid-1": PrepareResult(devices=[gpu(1)]), "uid-2": PrepareResult(devices=[gpu(2)])}
    a, b = _server(old, short_dir, OLD_UID), _server(new, short_dir, NEW_UID)
    with a:
        _one_tick_later()
        with b:
            paths = [a.dra_socket_path, a.registration_socket_path, b.dra_socket_path, b.registration_socket_path]
            assert len(set(paths)) == 4 and all(_serving(p) for p in paths)
            with KubeletHarness(_dirs(short_dir)[1], DRIVER) as kubelet:
                # the kubelet sees both, the newest first (it prefers the plugin that registered last)
                assert kubelet.registration_sockets() == [b.registration_socket_path, a.registration_socket_path]
            with (
                KubeletHarness(_dirs(short_dir)[1], DRIVER) as to_a,
                KubeletHarness(_dirs(short_dir)[1], DRIVER) as to_b,
            ):
                assert to_a.register(socket=a.registration_socket_path).endpoint == str(a.dra_socket_path)
                assert to_b.register(socket=b.registration_socket_path).endpoint == str(b.dra_socket_path)
                assert a.wait_registered(timeout=1) and b.wait_registered(timeout=1)
                # a claim prepared by one instance is unprepared by the other: each call goes where it was sent
                assert to_a.prepare([claim(1)]) == {"uid-1": PrepareAnswer(devices=[gpu(1)])}
                assert to_b.unprepare([claim(1)]) == {"uid-1": ""}
                assert old.prepared == [[claim(1)]] and new.unprepared == [[claim(1)]]

                a.stop()  # the old pod goes
                assert not a.dra_socket_path.exists() and not a.registration_socket_path.exists()
                for path in (b.dra_socket_path, b.registration_socket_path):
                    assert _serving(path)
                assert to_b.prepare([claim(2)]) == {"uid-2": PrepareAnswer(devices=[gpu(2)])}
            with KubeletHarness(_dirs(short_dir)[1], DRIVER) as kubelet:
                assert kubelet.registration_sockets() == [b.registration_socket_path]
                assert kubelet.register().endpoint == str(b.dra_socket_path)  # what a restarted kubelet finds
        assert not b.dra_socket_path.exists() and not b.registration_socket_path.exists()


def test_without_pod_uids_two_instances_take_turns_on_one_path(short_dir: Path) -> None:
    """Without per-pod names the kubelet can see only one of two instances: the newer takes the path over."""
    a, b = _server(FakePreparer(), short_dir), _server(FakePreparer(), short_dir)
    with a, b:
        assert a.registration_socket_path == b.registration_socket_path
        with KubeletHarness(_dirs(short_dir)[1], DRIVER) as kubelet:
            assert kubelet.registration_sockets() == [b.registration_socket_path]


def test_an_instance_without_a_pod_uid_beside_one_with(short_dir: Path) -> None:
    """An upgrade that turns per-pod names on: the old pod's plain names and the new pod's coexist."""
    old, new = _server(FakePreparer(), short_dir), _server(FakePreparer(), short_dir, NEW_UID)
    with old:
        _one_tick_later()
        with new:
            for path in (old.dra_socket_path, old.registration_socket_path):
                assert _serving(path)  # not taken for a dead leftover
            with KubeletHarness(_dirs(short_dir)[1], DRIVER) as kubelet:
                assert kubelet.registration_sockets() == [new.registration_socket_path, old.registration_socket_path]
            old.stop()
            assert _serving(new.dra_socket_path) and _serving(new.registration_socket_path)


def test_dead_sockets_of_gone_instances_are_removed_at_start(short_dir: Path) -> None:
    plugin_dir, registry_dir = _dirs(short_dir)
    gone = str(uuid.uuid4())
    dead = [
        plugin_dir / f"dra-{gone}.sock",
        registry_dir / f"{DRIVER}-{gone}-reg.sock",
        plugin_dir / "dra.sock",  # an instance from before per-pod names, killed
        registry_dir / f"{DRIVER}-reg.sock",
    ]
    kept = [
        registry_dir / f"other.example.com-{gone}-reg.sock",  # another driver's
        registry_dir / f"{DRIVER}-not-a-pod-uid-reg.sock",
        plugin_dir / "health.sock",
    ]
    for path in dead + kept:
        _dead_socket(path)
    (plugin_dir / f"dra-{uuid.uuid4()}.sock").write_text("not a socket")
    alive = _server(FakePreparer(), short_dir, OLD_UID)
    with alive, _server(FakePreparer(), short_dir, NEW_UID) as new:
        assert not [p for p in dead if p.exists()]
        assert all(p.exists() for p in kept)
        assert len(list(plugin_dir.glob("dra-*.sock"))) == 3  # the live instances' and the regular file
        for path in (alive.dra_socket_path, alive.registration_socket_path, new.registration_socket_path):
            assert _serving(path)  # a live instance's sockets are never taken for leftovers


def _probe(short_dir: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    from dra_driver import entry

    plugin_dir, registry_dir = _dirs(short_dir)
    argv = ["probe", f"--driver={DRIVER}", f"--plugin-dir={plugin_dir}", f"--registry-dir={registry_dir}"]
    code = entry.main([*argv, "--timeout=2", *extra])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_probe_checks_the_sockets_of_its_pod_uid(
    short_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POD_UID", raising=False)
    with _server(FakePreparer(), short_dir, OLD_UID) as srv:
        code, out = _probe(short_dir, capsys, f"--pod-uid={OLD_UID}")
        assert code == 0, out
        assert f"{srv.dra_socket_path}: SERVING" in out and f"{srv.registration_socket_path}: SERVING" in out
        code, out = _probe(short_dir, capsys, f"--pod-uid={NEW_UID}")  # another pod's: not there
        assert code != 0 and f"dra-{NEW_UID}.sock: does not exist" in out, out
        code, out = _probe(short_dir, capsys)  # no UID: the plain names, not this instance's
        assert code != 0 and f"{_dirs(short_dir)[0] / 'dra.sock'}: does not exist" in out, out
        # the default comes from $POD_UID, as in the Helm chart's pod (an exec probe cannot expand $(POD_UID))
        monkeypatch.setenv("POD_UID", OLD_UID)
        code, out = _probe(short_dir, capsys)
        assert code == 0 and f"{srv.dra_socket_path}: SERVING" in out, out
        code, out = _probe(short_dir, capsys, "--pod-uid=")  # explicitly off
        assert code != 0 and "dra.sock: does not exist" in out, out
    code, out = _probe(short_dir, capsys, "--pod-uid=a/b")
    assert code != 0 and "cannot be part of a socket name" in out, out


def test_plugin_takes_the_pod_uid_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dra_driver import cli, daemon

    seen: list[daemon.DaemonOptions] = []
    monkeypatch.setattr(daemon, "run", lambda options, source: seen.append(options))
    monkeypatch.setattr(cli, "open_source", lambda *args: None)
    argv = ["plugin", "--sim=dgx-a100", "--node-name=n", "--plugin-dir=/tmp/x", "--kubeconfig=/dev/null"]
    monkeypatch.delenv("POD_UID", raising=False)
    assert cli.main(argv) == 0 and seen[-1].pod_uid == ""
    monkeypatch.setenv("POD_UID", OLD_UID)
    assert cli.main(argv) == 0 and seen[-1].pod_uid == OLD_UID
    assert cli.main([*argv, f"--pod-uid={NEW_UID}"]) == 0 and seen[-1].pod_uid == NEW_UID
    assert cli.main([*argv, "--pod-uid=../x"]) == 1 and len(seen) == 3  # refused before anything starts
    assert "cannot be part of a socket name" in capsys.readouterr().err
