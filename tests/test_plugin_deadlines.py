"""A stalled API server must not stall the plugin: every API read has a timeout, a prepare honours the kubelet's
deadline, and prepares never take every gRPC worker, so unprepares still get through. Nor must another process that
holds the node's device lock: prepares and unprepares end at their deadline, the health checks keep a worker, and
start-up serves without waiting for the lock for ever."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dra_driver.api.claim import ResourceClaim
from dra_driver.api.deviceclass import DeviceClass
from dra_driver.cdi.spec import spec_file_name
from dra_driver.claimstate.context import CallContext
from dra_driver.plugin.claims import API_TIMEOUT_S, KubeClaimSource, StaticClaimSource
from dra_driver.plugin.driver import Driver
from dra_driver.plugin.failures import FailureKind
from dra_driver.plugin.grpc.kubelet import PrepareAnswer
from dra_driver.plugin.grpc.probe import probe_socket
from dra_driver.plugin.grpc.server import PluginServer
from tests.kubelet_harness import KubeletHarness
from tests.plugin_helpers import DRIVER, Node, claim, ref
from tests.polling import wait_until


class StalledClaims:
    """An API server that stops answering claim reads while `stalled` is set; a read waits as long as the timeout
    it is given (as the real client does), and forever without one."""

    def __init__(self, inner: StaticClaimSource) -> None:
        self.inner = inner
        self.stalled = threading.Event()
        self.released = threading.Event()
        self.waiting = 0
        self.timeouts: list[float | None] = []
        self._lock = threading.Lock()

    def get_claim(self, namespace: str, name: str, *, timeout: float | None = None) -> ResourceClaim:
        with self._lock:
            self.timeouts.append(timeout)
        if self.stalled.is_set():
            with self._lock:
                self.waiting += 1
            try:
                if not self.released.wait(timeout):
                    raise TimeoutError(f"read timed out (timeout={timeout})")
            finally:
                with self._lock:
                    self.waiting -= 1
        return self.inner.get_claim(namespace, name)

    def get_device_class(self, name: str, *, timeout: float | None = None) -> DeviceClass:
        return self.inner.get_device_class(name)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # AF_UNIX paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_prepares_honour_the_deadline_and_leave_workers_for_unprepares(tmp_path: Path, short_dir: Path) -> None:
    node = Node(tmp_path)
    prepared, waiting = claim(["gpu-0"]), [claim([f"gpu-{i % 8}"]) for i in range(10)]
    node.add(prepared, *waiting)
    source = node.source = StalledClaims(node.source)  # type: ignore[assignment]
    driver = node.driver()
    # as the daemon runs it (prepares of different claims in parallel), with 8 threads: 6 for prepares
    server = PluginServer(
        driver, DRIVER, short_dir / "plugins", short_dir / "registry", serialize=False, max_workers=8, grace_period_s=0
    )
    server.start()
    deadline_s = 4.0
    try:
        with KubeletHarness(short_dir / "registry", DRIVER) as kubelet, ThreadPoolExecutor(len(waiting)) as pool:
            kubelet.register()
            assert kubelet.prepare([ref(prepared)])[prepared["metadata"]["uid"]].error == ""
            source.stalled.set()
            start = time.monotonic()
            futures = [pool.submit(kubelet.prepare, [ref(c)], timeout=deadline_s) for c in waiting]
            wait_until("prepares blocked on the API server", lambda: source.waiting >= 6, timeout=deadline_s / 2)
            # an unprepare needs no API read: it must not wait for the stalled prepares
            t = time.monotonic()
            assert kubelet.unprepare([ref(prepared)], timeout=deadline_s / 2) == {prepared["metadata"]["uid"]: ""}
            assert time.monotonic() - t < 2.0  # the prepares block until 0.5 s before their deadline
            assert source.waiting >= 1 and not all(f.done() for f in futures)  # they were still blocked
            results: list[PrepareAnswer] = [r for f in futures for r in f.result().values()]  # no RPC failed
            took = time.monotonic() - start
            assert took < deadline_s  # answered before the kubelet gave up, not cut off by it
            assert len(results) == len(waiting)
            for r in results:
                assert r.error and not r.devices
                assert "timed out" in r.error or "deadline exceeded" in r.error or "prepares are in progress" in r.error
            assert any("timed out" in r.error for r in results)  # those that read: within the deadline
            assert all(t is not None and 0 < t < deadline_s for t in source.timeouts[1:])
            # the API server is back: the kubelet's retry succeeds
            source.stalled.clear()
            retry = waiting[0]
            assert kubelet.prepare([ref(retry)])[retry["metadata"]["uid"]].error == ""
    finally:
        source.released.set()
        server.stop(grace=0)


def test_prepare_past_its_deadline_reads_nothing_and_says_so(tmp_path: Path) -> None:
    node = Node(tmp_path)
    c = claim(["gpu-0"])
    node.add(c)
    source = node.source = StalledClaims(node.source)  # type: ignore[assignment]
    d = node.driver()
    result = d.prepare([ref(c)], CallContext(time.monotonic() - 1))[c["metadata"]["uid"]]
    error = result.error
    assert "deadline exceeded" in error and f"default/{c['metadata']['name']}" in error
    assert result.failure is not None and result.failure.kind is FailureKind.DEADLINE and result.failure.retryable
    assert source.timeouts == [] and node.cdi_files() == []


def test_every_api_read_has_a_timeout_bounded_by_the_deadline(tmp_path: Path) -> None:
    node = Node(tmp_path)
    a, b = claim(["gpu-0"]), claim(["gpu-1"])
    node.add(a, b)
    source = node.source = StalledClaims(node.source)  # type: ignore[assignment]
    d = node.driver()
    assert d.prepare([ref(a)])[a["metadata"]["uid"]].error == ""
    assert source.timeouts == [API_TIMEOUT_S]  # no deadline: the default
    d.prepare([ref(b)], CallContext(time.monotonic() + 3))
    (timeout,) = source.timeouts[1:]
    assert timeout is not None and 0 < timeout < 3


@pytest.fixture
def silent_api_server() -> Iterator[str]:
    """Like a SIGSTOPped kube-apiserver: connections are accepted (by the kernel), nothing is ever answered."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()
    for conn in accepted:
        conn.close()


def _elapsed(fn: Any) -> float:
    start = time.monotonic()
    with pytest.raises(Exception, match="timed out"):
        fn()
    return time.monotonic() - start


def test_kube_claim_source_gives_up_on_a_silent_api_server(silent_api_server: str) -> None:
    config = client.Configuration()
    config.host = silent_api_server
    source = KubeClaimSource(client.ApiClient(config), request_timeout=1.0)
    # one timeout for the whole read: a retry of a timed-out GET would start it over
    assert _elapsed(lambda: source.get_claim("default", "c")) < 1.8
    assert _elapsed(lambda: source.get_device_class("gpu")) < 1.8
    assert _elapsed(lambda: source.get_claim("default", "c", timeout=0.3)) < 0.9  # shorter per read
    assert _elapsed(lambda: source.get_claim("default", "c", timeout=30)) < 1.8  # never beyond request_timeout
    unbounded = KubeClaimSource(client.ApiClient(config))
    assert _elapsed(lambda: unbounded.get_claim("default", "c", timeout=0.3)) < 0.9


# ----- the node's device lock, held by another process (the other pod of a rolling update, stalled) ------------
@contextlib.contextmanager
def node_lock_held(node: Node) -> Iterator[None]:
    """Another process holds the node's device lock (`<plugin dir>/pu.lock`) until the block ends."""
    node.plugin_dir.mkdir(parents=True, exist_ok=True)
    hold = "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); "
    hold += "sys.stdin.read()"
    lock = node.plugin_dir / "pu.lock"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline() == b"held\n"
        yield
    finally:
        holder.stdin.close()  # it exits, and the lock goes with it
        holder.wait(10)


def _prepared(tmp_path: Path) -> tuple[Node, Driver, dict[str, Any]]:
    """A node with a driver and a claim it prepared."""
    node = Node(tmp_path)
    c = claim(["gpu-0"])
    node.add(c)
    d = node.driver()
    assert d.prepare([ref(c)])[c["metadata"]["uid"]].error == ""
    return node, d, c


def test_an_unprepare_waiting_on_a_held_node_lock_ends_at_its_deadline(tmp_path: Path) -> None:
    node, d, c = _prepared(tmp_path)
    uid = c["metadata"]["uid"]
    with node_lock_held(node):
        start = time.monotonic()
        failure = d.unprepare([ref(c)], CallContext(start + 1.5))[uid]
        assert time.monotonic() - start < 1.5  # answered before the caller gives up
        assert failure is not None and failure.kind is FailureKind.LOCK_TIMEOUT and failure.retryable
        error = failure.message
        assert "deadline exceeded waiting for the node's device lock" in error and "nothing was changed" in error
        assert uid in d.checkpoint.claims and node.cdi_files() != []  # nothing was changed
    assert d.unprepare([ref(c)], CallContext(time.monotonic() + 5)) == {uid: None}  # the kubelet's retry
    assert uid not in d.checkpoint.claims and node.cdi_files() == []


def test_while_another_process_holds_the_node_lock_the_plugin_still_answers(tmp_path: Path, short_dir: Path) -> None:
    node = Node(tmp_path)
    prepared, new = [claim([f"gpu-{i}"]) for i in range(6)], claim(["gpu-7"])
    node.add(*prepared, new)
    driver = node.driver()
    workers = 6
    server = PluginServer(driver, DRIVER, short_dir / "plugins", short_dir / "registry", serialize=False,
                          max_workers=workers, grace_period_s=0, socket_check_interval_s=None)  # fmt: skip
    server.start()
    deadline_s = 3.0
    try:
        with KubeletHarness(short_dir / "registry", DRIVER) as kubelet, ThreadPoolExecutor(2 * workers) as pool:
            kubelet.register()
            for c in prepared:
                assert kubelet.prepare([ref(c)])[c["metadata"]["uid"]].error == ""
            with node_lock_held(node):
                start = time.monotonic()
                # the kubelet's retries: more unprepares than the server has threads, each waiting for the lock
                unprepares = [pool.submit(kubelet.unprepare, [ref(c)], timeout=deadline_s) for c in 2 * prepared]
                time.sleep(0.5)
                probed = probe_socket(server.dra_socket_path, timeout=1.0)
                assert probed.ok, probed  # the liveness probe
                result = kubelet.prepare([ref(new)], timeout=deadline_s)[new["metadata"]["uid"]]
                assert result.error and not result.devices  # an answer, not the kubelet's own timeout
                errors = [e for f in unprepares for e in f.result().values()]  # every call was answered
                assert time.monotonic() - start < deadline_s + 1
                assert len(errors) == 2 * len(prepared) and all(errors)
                assert any("deadline exceeded waiting for the node's device lock" in e for e in errors)
            assert len(driver.checkpoint.claims) == len(prepared)  # nothing was changed
            # the lock is free again: the retries succeed
            assert kubelet.unprepare([ref(c) for c in prepared]) == {c["metadata"]["uid"]: "" for c in prepared}
    finally:
        server.stop(grace=0)


def test_start_up_serves_while_another_process_holds_the_node_lock(tmp_path: Path) -> None:
    node, first, c = _prepared(tmp_path)
    first.close()
    orphan = node.cdi_root / spec_file_name(DRIVER, "left-by-a-crash")  # recovery removes it
    orphan.write_text("{}")
    with node_lock_held(node):
        started: list[Driver] = []
        start = threading.Thread(target=lambda: started.append(node.driver(startup_lock_wait_s=0.5)), daemon=True)
        start.start()
        start.join(timeout=10)
        assert started, "start-up still waits for the node's device lock"
        (d,) = started
        assert not d.recovered and orphan.exists()
        uid = c["metadata"]["uid"]
        failure = d.unprepare([ref(c)], CallContext(time.monotonic() + 1))[uid]
        assert failure is not None and "deadline exceeded" in failure.message and failure.retryable
    wait_until("start-up recovery, once the lock is free", lambda: d.recovered, timeout=10)
    assert uid in d.checkpoint.claims and not orphan.exists()  # a prepared claim is kept, the orphan spec removed
    assert d.unprepare([ref(c)], CallContext(time.monotonic() + 5)) == {uid: None}
    d.close()


def test_a_prepare_whose_deadline_passes_between_steps_stops_there_and_undoes_the_steps_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Carving takes most of the time left: the next step does not start, the MIG device is destroyed again and the
    kubelet gets a retryable deadline failure before it gives up."""
    from dra_driver.plugin import machine

    node = Node(tmp_path)
    c = claim(["gpu-1-mig-1g10gb-19-0"], device_class="mig")
    node.add(c)
    d = node.driver()
    carve = machine.create_mig_device

    def slow_carve(*args: Any) -> Any:
        time.sleep(1.2)
        return carve(*args)

    monkeypatch.setattr(machine, "create_mig_device", slow_carve)
    start = time.monotonic()
    result = d.prepare([ref(c)], CallContext(start + 1.5))[c["metadata"]["uid"]]
    assert time.monotonic() - start < 1.5
    assert result.failure is not None and result.failure.kind is FailureKind.DEADLINE and result.failure.retryable
    assert "deadline exceeded before step apply-sharing" in result.error
    assert d.checkpoint.claims == {} and node.mig_instances() == [] and node.cdi_files() == []
    monkeypatch.setattr(machine, "create_mig_device", carve)
    assert d.prepare([ref(c)], CallContext(time.monotonic() + 5))[c["metadata"]["uid"]].error == ""  # the retry


def test_a_sharing_command_that_hangs_ends_at_the_deadline_and_the_prepare_is_undone(tmp_path: Path) -> None:
    from dra_driver.claimstate.checkpoint import ClaimState
    from dra_driver.sharing import CommandResult, DriverRootRunner
    from dra_driver.simulator.tools.state import SharingState
    from tests.test_sharing import time_slicing

    node = Node(tmp_path)

    class HangingTimeSlice:
        """nvidia-smi as the driver root has it, but setting a time slice hangs until the runner kills it."""

        def __init__(self) -> None:
            self.inner = DriverRootRunner(node.sim.driver_root)
            self.timeouts: list[float | None] = []

        def run(self, argv: list[str], *, env: Any = None, input: Any = None, timeout: Any = None) -> CommandResult:
            if "--set-timeslice" in argv and argv[-1] != "0":
                self.timeouts.append(timeout)
                time.sleep(timeout)
                return CommandResult(list(argv), 124, "", f"timed out after {timeout:g}s")
            return self.inner.run(argv, env=env, input=input, timeout=timeout)

    runner = HangingTimeSlice()
    c = claim(["gpu-1"], config=[time_slicing("Long")])
    node.add(c)
    d = node.driver(sharing_runner=runner)
    start = time.monotonic()
    result = d.prepare([ref(c)], CallContext(start + 2))[c["metadata"]["uid"]]
    assert time.monotonic() - start < 2
    (timeout,) = runner.timeouts
    assert timeout is not None and timeout <= 1.5  # what was left of the call, not nvidia-smi's own minute
    assert result.failure is not None and result.failure.kind is FailureKind.SHARING and "timed out" in result.error
    # the undo's own commands found no time left: what may be set is recorded, for the kubelet's next call
    uid = c["metadata"]["uid"]
    entry = d.checkpoint.claims[uid]
    assert entry.state is ClaimState.UNPREPARE_STARTED and entry.devices[0].sharing is not None
    assert "undoing the prepare failed too (deadline exceeded" in result.error and node.cdi_files() == []
    assert d.unprepare([ref(c)], CallContext(time.monotonic() + 5)) == {uid: None}
    assert (
        d.checkpoint.claims == {} and SharingState(node.sim.state_dir).timeslice(entry.devices[0].sharing.gpu_uuid) == 0
    )


def test_an_mps_stop_waits_until_the_calls_deadline_less_the_answer_margin_and_no_longer(tmp_path: Path) -> None:
    """Every MPS launcher takes the caller's own deadline and measures it with `time_left` (as the daemon-set
    launcher's API calls do): the stop's wait ends with the answer margin kept once, not twice, and at most
    MPS_STOP_TIMEOUT_S from now."""
    from dra_driver.claimstate.context import DEADLINE_MARGIN_S, time_left
    from dra_driver.sharing import CommandResult, SharingManager
    from dra_driver.sharing.manager import MPS_STOP_TIMEOUT_S
    from dra_driver.sharing.mps_launch import LocalMps

    class Recording:
        def __init__(self) -> None:
            self.timeouts: list[float | None] = []

        def run(self, argv: list[str], *, env: Any = None, input: Any = None, timeout: Any = None) -> CommandResult:
            self.timeouts.append(timeout)
            return CommandResult(list(argv), 0, "", "")

    class RecordingLauncher(LocalMps):
        def __init__(self, runner: Recording) -> None:
            super().__init__(runner)
            self.waits: list[float | None] = []

        def stop(self, claim_uid: str, mps_dir: Path, deadline: float | None = None) -> None:
            self.waits.append(None if deadline is None else time_left(deadline))
            super().stop(claim_uid, mps_dir, deadline)

    runner = Recording()
    launcher = RecordingLauncher(runner)
    manager = SharingManager(runner, tmp_path / "plugin", mps=launcher)
    directory = tmp_path / "plugin" / "mps" / "uid-1"
    for seconds_to_deadline, waited in ((10.0, 10.0 - DEADLINE_MARGIN_S), (300.0, MPS_STOP_TIMEOUT_S)):
        runner.timeouts.clear()
        launcher.waits.clear()
        (directory / "pipe").mkdir(parents=True, exist_ok=True)
        manager._stop_mps("uid-1", directory, CallContext(time.monotonic() + seconds_to_deadline))
        for measured in (*launcher.waits, *runner.timeouts):
            assert measured is not None and waited - 0.2 < measured <= waited, (seconds_to_deadline, measured)
        assert len(runner.timeouts) == 1


def test_a_deadline_within_a_limit_is_the_callers_when_nearer(tmp_path: Path) -> None:
    from dra_driver.claimstate.context import NO_DEADLINE, time_left

    near = CallContext(time.monotonic() + 5)
    assert near.deadline_within(40) == near.deadline
    far = CallContext(time.monotonic() + 500)
    assert 39.8 < time_left(far.deadline_within(40)) <= 40
    assert 39.8 < time_left(NO_DEADLINE.deadline_within(40)) <= 40
