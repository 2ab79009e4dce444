"""Prepare and unprepare latency through the real kubelet sockets, ours vs the Go reference plugin (tools/refplugin on
k8s.io/dynamic-resource-allocation/kubeletplugin), against one control plane and with the same kubelet client
(dra_driver.plugin.grpc.kubelet), runs interleaved (each side first, second and last in turn).

A third side, the Python floor (bench/floor_plugin.py), is our gRPC servers and API client around the Go plugin's
minimal prepare (read the claim, write a small CDI spec): what Python, grpcio and our client cost before our driver
does anything, so that each of our figures can be read against both.

Ours: `python -m dra_driver plugin --sim dgx-h100 --mode partitionable` as a real process. Go: refplugin with the
helper's defaults (gRPC calls serialized, as in the example driver) and client-go's rate limiter off (ours has none).
Claims are created allocated (status written, no scheduler) just before each round: a whole GPU, or a MIG 1g.10gb
partition (ours carves it in the simulator, whose state is kept on /dev/shm; the Go plugin writes the same CDI spec
either way). At 1 caller a round is 8 prepares one after the other, then 8 unprepares; with many callers, all
prepares at once, then all unprepares at once: 16 MIG partitions, but 8 whole GPUs (the node has 8, and ours
refuses a GPU another claim holds). Also: each side's CPU per call over the whole load, RSS idle and after load
(VmRSS, 1 s after start-up and 2 s after the last call), start to gRPC serving (registration answered) and start to
slices published (the node's pool complete in the API server). Our package's bytecode is compiled first, as an
install compiles it.

Run: python bench/bench_prepare.py [--quick] [--rounds N] [--starts N]. Prints one table.
"""

from __future__ import annotations

import argparse
import compileall
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cpu_s, pctl, ratio, rss_mb

from dra_driver.plugin.grpc.generated import pluginregistration_v1_pb2, pluginregistration_v1_pb2_grpc
from dra_driver.plugin.types import ClaimRef
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME as DRIVER
from tests.cluster.controlplane import ControlPlane
from tests.daemon_zygote import die_with_parent
from tests.kubelet_harness import KubeletHarness
from tests.test_publisher import api_client
from tests.test_refplugin import (
    RefPlugin,
    allocated_claims,
    build_refplugin,
    delete_claims,
    short_registry_dir,
)

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 60.0
GPUS = 8


class Ours:
    """Our daemon as a process, the socket layout the same as RefPlugin's."""

    name = "ours"

    def __init__(self, root: Path, kubeconfig: Path, node: str, sim_state: Path | None = None) -> None:
        self.root = root
        self.registry_dir = short_registry_dir("ours")
        self.args = [sys.executable, "-m", "dra_driver", "plugin", "--sim", "dgx-h100", "--sim-state",
                     str(sim_state or root / "gpu"), "--mode", "partitionable", "--k8s-version", "1.36",
                     "--node-name", node, "--kubeconfig", str(kubeconfig), "--plugin-dir", str(root / "plugin"),
                     "--registry-dir", str(self.registry_dir), "--cdi-root", str(root / "cdi")]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        self.root.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        t0 = time.monotonic()
        with (self.root / "daemon.log").open("ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                         preexec_fn=die_with_parent)  # fmt: skip
        return t0

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(20)
        self.proc = None


class Floor(Ours):
    """bench/floor_plugin.py: our gRPC servers and API client around the Go plugin's minimal prepare."""

    name = "floor"

    def __init__(self, root: Path, kubeconfig: Path, node: str) -> None:
        self.root = root
        self.registry_dir = short_registry_dir("floor")
        self.args = [sys.executable, str(ROOT / "bench" / "floor_plugin.py"), "--node-name", node,
                     "--kubeconfig", str(kubeconfig), "--plugin-dir", str(root / "plugin"),
                     "--registry-dir", str(self.registry_dir), "--cdi-root", str(root / "cdi")]  # fmt: skip
        self.proc = None


Plugin = Ours | RefPlugin
SIDES = ("ours", "floor", "go")


def order(n: int) -> tuple[str, ...]:
    """The sides in the order of round (or start) `n`: each goes first, second and last in turn."""
    k = n % len(SIDES)
    return SIDES[k:] + SIDES[:k]


def pool_complete(api: Any, node: str) -> bool:
    from kubernetes import client

    items = client.CustomObjectsApi(api).list_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.nodeName={node}"
    )["items"]
    mine = [s for s in items if s["spec"]["driver"] == DRIVER]
    return bool(mine) and all(s["spec"]["pool"]["resourceSliceCount"] == len(mine) for s in mine)


def delete_slices(cp: ControlPlane, node: str) -> None:
    cp.kubectl("delete", "resourceslices", "--field-selector", f"spec.nodeName={node}", "--wait=true", check=False)


def get_info_answered(kubelet: KubeletHarness) -> None:
    """GetInfo on the registration socket, as the kubelet calls it when the socket appears. A raw call that waits for
    the connection: KubeletHarness.get_info's channel_ready_future adds ~0.2 s of Python polling on this machine."""
    target = f"unix:{kubelet.registration_sockets()[0]}"
    with grpc.insecure_channel(target) as channel:
        stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
        stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=START_TIMEOUT_S, wait_for_ready=True)


def start_plugin(plugin: Plugin, api: Any, node: str) -> tuple[KubeletHarness, float, float]:
    """Start and register; (kubelet, seconds to serving, seconds to the pool published)."""
    t0 = plugin.start()
    kubelet = KubeletHarness(plugin.registry_dir, DRIVER)
    deadline = t0 + START_TIMEOUT_S
    while not kubelet.registration_sockets():  # a cheap poll: a failed gRPC connect backs off for a second
        proc = plugin.proc
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{node}: plugin exited with {proc.returncode} at start")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{node}: no registration socket within {START_TIMEOUT_S} s")
        time.sleep(0.002)
    get_info_answered(kubelet)
    serving = time.monotonic() - t0
    kubelet.register(timeout=START_TIMEOUT_S)
    while not pool_complete(api, node):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{node}: slices not published within {START_TIMEOUT_S} s")
        time.sleep(0.01)
    return kubelet, serving, time.monotonic() - t0


def devices_for(kind: str, count: int) -> list[list[str]]:
    if kind == "gpu":
        return [[f"gpu-{k % GPUS}"] for k in range(count)]
    return [[f"gpu-{k % GPUS}-mig-1g10gb-19-{k // GPUS}"] for k in range(count)]


def timed_calls(call: Callable[[ClaimRef], str], claims: list[ClaimRef], concurrent: bool) -> list[float]:
    """Seconds per call; raises on any error answered."""
    times: list[float] = [0.0] * len(claims)
    errors: list[str] = []
    barrier = threading.Barrier(len(claims)) if concurrent else None

    def one(i: int) -> None:
        if barrier is not None:
            barrier.wait()
        t = time.perf_counter()
        err = call(claims[i])
        times[i] = time.perf_counter() - t
        if err:
            errors.append(f"{claims[i].name}: {err}")

    if concurrent:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(claims))]
        for th in threads:
            th.start()
        for th in threads:
            th.join(CALL_TIMEOUT_S * 2)
    else:
        for i in range(len(claims)):
            one(i)
    if errors:
        raise RuntimeError("; ".join(errors[:4]))
    return times


Samples = Callable[[tuple[str, str], list[float]], None]


def measure_starts(
    cp: ControlPlane,
    api: Any,
    nodes: dict[str, str],
    make: Callable[[str, int], Plugin],
    running: dict[str, tuple[Plugin, KubeletHarness]],
    starts: int,
    add: Samples,
) -> None:
    """Start each side `starts` times (interleaved, the pool deleted first); the last ones keep running."""
    for n in range(starts):
        for side in order(n):
            if side in running:
                old, old_kubelet = running.pop(side)
                old_kubelet.close()
                old.stop()
            delete_slices(cp, nodes[side])
            plugin = make(side, n)
            kubelet, serving, published = start_plugin(plugin, api, nodes[side])
            running[side] = (plugin, kubelet)
            add((side, "serving"), [serving])
            add((side, "published"), [published])
    time.sleep(1.0)  # idle: let start-up garbage settle
    for side, (plugin, _) in running.items():
        assert plugin.proc is not None
        add((side, "rss idle"), [rss_mb(plugin.proc.pid)])


def measure_calls(
    api: Any, nodes: dict[str, str], running: dict[str, tuple[Plugin, KubeletHarness]], rounds: int, add: Samples
) -> None:
    seq = 0
    for r in range(rounds):
        sides = order(r)
        for kind in ("gpu", "mig"):
            for callers in (1, GPUS if kind == "gpu" else 16):
                claims = {}
                for side in sides:
                    seq += 1
                    devices = devices_for(kind, max(callers, GPUS))
                    claims[side] = allocated_claims(api, nodes[side], devices, f"b{seq}")
                for side in sides:
                    kubelet = running[side][1]

                    def prep(c: ClaimRef, k: KubeletHarness = kubelet) -> str:
                        return k.prepare([c], timeout=CALL_TIMEOUT_S)[c.uid].error

                    def unprep(c: ClaimRef, k: KubeletHarness = kubelet) -> str:
                        return k.unprepare([c], timeout=CALL_TIMEOUT_S)[c.uid]

                    add((side, f"prepare {kind} {callers}"), timed_calls(prep, claims[side], callers > 1))
                    add((side, f"unprepare {kind} {callers}"), timed_calls(unprep, claims[side], callers > 1))
                for side in sides:
                    delete_claims(api, claims[side])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a few seconds of load: 2 rounds, 1 start each")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--starts", type=int, default=3)
    args = parser.parse_args()
    rounds, starts = (2, 1) if args.quick else (args.rounds, args.starts)
    # as an install does (pip compiles a wheel's modules): else each start of ours compiles what changed since the
    # bytecode was last written, and never writes it where PYTHONDONTWRITEBYTECODE is set
    compileall.compile_dir(ROOT / "dra_driver", quiet=1)
    binary = build_refplugin()
    samples: dict[tuple[str, str], list[float]] = {}

    def add(key: tuple[str, str], values: list[float]) -> None:
        samples.setdefault(key, []).extend(values)

    # The simulated GPUs' state on a memory file system where there is one, as the default state directory
    # ($XDG_RUNTIME_DIR) is and a GPU's state is (the driver's memory): on this machine's ext4, replacing the state
    # file at every simulated MIG change cost more than the rest of our MIG prepare. Both sides' CDI specs, and our
    # checkpoint, stay on the disk.
    memory_fs = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with ControlPlane() as cp, tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory(dir=memory_fs) as gpus:
        api = api_client(cp.kubeconfig)
        cp.kubectl("apply", "-f", "-", input='{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", '
                   '"metadata": {"name": "bench.dra-driver.dev"}, "spec": {"selectors": [{"cel": {"expression": '
                   f'"device.driver == \'{DRIVER}\'"}}}}]}}}}')  # fmt: skip
        nodes = {side: f"bench-{side}" for side in SIDES}
        for node in nodes.values():
            cp.create_node(node)

        def make(side: str, n: int) -> Plugin:
            root = Path(tmp) / f"{side}-{n}"
            if side == "ours":
                return Ours(root, cp.kubeconfig, nodes[side], sim_state=Path(gpus) / f"{side}-{n}")
            if side == "floor":
                return Floor(root, cp.kubeconfig, nodes[side])
            return RefPlugin(binary, root, cp.kubeconfig, nodes[side], "--kube-api-qps=-1")

        running: dict[str, tuple[Plugin, KubeletHarness]] = {}
        try:
            measure_starts(cp, api, nodes, make, running, starts, add)
            cpu_before = {side: cpu_s(plugin.proc.pid) for side, (plugin, _) in running.items() if plugin.proc}
            measure_calls(api, nodes, running, rounds, add)
            for side, (plugin, _) in running.items():
                assert plugin.proc is not None
                calls = sum(len(v) for (s, key), v in samples.items() if s == side and "prepare " in key)
                add((side, "cpu per call"), [(cpu_s(plugin.proc.pid) - cpu_before[side]) / calls])
            time.sleep(2.0)  # settled, as for the idle figure (ours trims its heap a second after the last call)
            for side, (plugin, _) in running.items():
                assert plugin.proc is not None
                add((side, "rss load"), [rss_mb(plugin.proc.pid)])
        finally:
            for plugin, kubelet in running.values():
                kubelet.close()
                plugin.stop()

    def row(label: str, key: str, scale: float, unit: str, stat: Callable[[list[float]], float]) -> None:
        ours, floor, go = (stat(samples.get((side, key), [])) for side in SIDES)
        print(
            f"| {label} | {ours * scale:.1f} {unit} | {floor * scale:.1f} {unit} | {go * scale:.1f} {unit} | "
            f"{ratio(ours, go)} | {ratio(floor, go)} |"
        )

    print(f"rounds {rounds}, starts {starts}; samples per latency row (each side): "
          f"{len(samples.get(('ours', 'prepare gpu 1'), []))} at 1 caller, "
          f"{len(samples.get(('ours', 'prepare mig 16'), []))} at 16")  # fmt: skip
    print("| figure | ours | Python floor | Go reference plugin | ours / Go | floor / Go |")
    print("|---|---|---|---|---|---|")
    for kind, label in (("gpu", "whole GPU"), ("mig", "MIG 1g")):
        for callers in (1, GPUS if kind == "gpu" else 16):
            for op in ("prepare", "unprepare"):
                key = f"{op} {kind} {callers}"
                row(f"{op} p50, {label}, {callers} caller(s)", key, 1000, "ms", lambda v: pctl(v, 50))
                row(f"{op} p99, {label}, {callers} caller(s)", key, 1000, "ms", lambda v: pctl(v, 99))
    row("CPU per call during the load (all threads, prepares and unprepares)", "cpu per call", 1000, "ms",
        lambda v: v[-1])  # fmt: skip
    row("RSS idle", "rss idle", 1, "MB", lambda v: v[-1])
    row("RSS after load", "rss load", 1, "MB", lambda v: v[-1])
    row("start to gRPC serving (median of starts)", "serving", 1000, "ms", lambda v: pctl(v, 50))
    row("start to slices published (median of starts)", "published", 1, "s", lambda v: pctl(v, 50))


if __name__ == "__main__":
    main()
