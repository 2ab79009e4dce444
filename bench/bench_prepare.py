"""Prepare and unprepare latency through the real kubelet sockets, ours vs the Go reference plugin (tools/refplugin on
k8s.io/dynamic-resource-allocation/kubeletplugin), against one control plane and with the same kubelet client
(dra_driver.plugin.grpc.kubelet), runs interleaved (each side first, second and last in turn).

A third side, the Python floor (bench/floor_plugin.py), is our gRPC servers and API client around the Go plugin's
minimal prepare (read the claim, write a small CDI spec): what Python, grpcio and our client cost before our driver
does anything, so that each of our figures can be read against both.

A fourth side, NVIDIA's own kubelet plugin (gpu-kubelet-plugin v0.5.0, built from its Go module; tests/nvidia_driver.py)
with its DynamicMIG gate (whole GPUs and every MIG partition, carved at prepare, as ours in `partitionable`) and its
chart's log verbosity (4), on a simulated dgx-h100 of its own whose driver root holds the simulated libnvidia-ml, given
the device nodes and /proc files a real node's kernel driver gives it (root: mknod and a mount namespace). Its NVML
calls are answered by the simulated library's server, a Python process of the simulator: its latencies include that
round trip, its RSS and CPU do not include the server. Where NVIDIA's side cannot give a figure the table says n/a,
with the reason below it.

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
import contextlib
import math
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
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME as DRIVER
from tests.cluster.controlplane import ControlPlane
from tests.daemon_zygote import die_with_parent
from tests.kubelet_harness import KubeletHarness
from tests.nvidia_driver import DRIVER as NVIDIA_DRIVER
from tests.nvidia_driver import NvidiaKubeletPlugin
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


class Nvidia:
    """NVIDIA's gpu-kubelet-plugin (tests/nvidia_driver.py) as a bench side: DynamicMIG, the chart's verbosity."""

    name = "nvidia"
    driver = NVIDIA_DRIVER

    def __init__(self, cp: ControlPlane, root: Path, node: str, sim_state: Path) -> None:
        self.plugin = NvidiaKubeletPlugin(cp, SimulatedNvml("dgx-h100", sim_state), node, root,
                                          feature_gates={"DynamicMIG": True}, verbosity=4, node_files=True)  # fmt: skip
        self.registry_dir = self.plugin.registry_dir

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.plugin.proc

    def start(self) -> float:
        t0 = time.monotonic()
        self.plugin.start()
        return t0

    def stop(self) -> None:
        self.plugin.cleanup()


Plugin = Ours | RefPlugin | Nvidia
SIDES = ("ours", "floor", "go", "nvidia")
LABELS = {"ours": "ours", "floor": "Python floor", "go": "Go reference plugin", "nvidia": "NVIDIA gpu-kubelet-plugin"}


def driver_of(side: str) -> str:
    return NVIDIA_DRIVER if side == "nvidia" else DRIVER


def order(n: int, sides: tuple[str, ...] = SIDES) -> tuple[str, ...]:
    """The sides in the order of round (or start) `n`: each goes first, second and last in turn."""
    k = n % len(sides)
    return sides[k:] + sides[:k]


def pool_complete(api: Any, node: str, driver: str = DRIVER) -> bool:
    from kubernetes import client

    items = client.CustomObjectsApi(api).list_cluster_custom_object(
        "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.nodeName={node}"
    )["items"]
    mine = [s for s in items if s["spec"]["driver"] == driver]
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


def start_plugin(plugin: Plugin, api: Any, node: str, driver: str = DRIVER) -> tuple[KubeletHarness, float, float]:
    """Start and register; (kubelet, seconds to serving, seconds to the pool published)."""
    t0 = plugin.start()
    kubelet = KubeletHarness(plugin.registry_dir, driver)
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
    while not pool_complete(api, node, driver):
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
# (side, figure) -> why that side has no such figure (the table's n/a, with the reason as a footnote)
Unavailable = dict[tuple[str, str], str]


def measure_starts(
    cp: ControlPlane,
    api: Any,
    nodes: dict[str, str],
    make: Callable[[str, int], Plugin],
    running: dict[str, tuple[Plugin, KubeletHarness]],
    starts: int,
    add: Samples,
    sides: tuple[str, ...] = SIDES,
) -> None:
    """Start each side `starts` times (interleaved, the pool deleted first); the last ones keep running."""
    for n in range(starts):
        for side in order(n, sides):
            if side in running:
                old, old_kubelet = running.pop(side)
                old_kubelet.close()
                old.stop()
            delete_slices(cp, nodes[side])
            plugin = make(side, n)
            kubelet, serving, published = start_plugin(plugin, api, nodes[side], driver_of(side))
            running[side] = (plugin, kubelet)
            add((side, "serving"), [serving])
            add((side, "published"), [published])
    time.sleep(1.0)  # idle: let start-up garbage settle
    for side, (plugin, _) in running.items():
        assert plugin.proc is not None
        add((side, "rss idle"), [rss_mb(plugin.proc.pid)])


# NVIDIA's errors the bench knows, and what they mean
NVIDIA_KNOWN = {
    "failed maybeDisableMigMode": (
        "v0.5.0 fails to unprepare the first of two MIG devices on one GPU (here 16 1g partitions on 8 GPUs): after "
        "destroying it, it decides whether to switch MIG off from the MIG mode it read at start (off, under "
        "DynamicMIG), so it sees no other MIG device and switches MIG off under the other one, which NVML refuses "
        "(in use); the kubelet's retry succeeds once the GPU's last MIG device is gone"
    ),
}


def nvidia_reason(error: BaseException) -> str:
    text = str(error)
    known = next((why for marker, why in NVIDIA_KNOWN.items() if marker in text), None)
    return f"{LABELS['nvidia']}: {known or text.splitlines()[0][:300]}"


def retry_unprepare(kubelet: KubeletHarness, claims: list[ClaimRef], attempts: int = 3) -> None:
    """Unprepare again what an error left prepared, as the kubelet retries (in order, a few times)."""
    for _ in range(attempts):
        left = []
        for c in claims:
            with contextlib.suppress(grpc.RpcError):
                if kubelet.unprepare([c], timeout=CALL_TIMEOUT_S)[c.uid]:
                    left.append(c)
        if not left:
            return
        claims = left
    raise RuntimeError(f"{len(claims)} claims still not unprepared after {attempts} retries: {claims[0].name}")


def measure_calls(
    api: Any,
    nodes: dict[str, str],
    running: dict[str, tuple[Plugin, KubeletHarness]],
    rounds: int,
    add: Samples,
    unavailable: Unavailable,
    sides: tuple[str, ...] = SIDES,
) -> None:
    """Each round: for a whole GPU and a MIG 1g, at 1 caller and at 8/16, every side prepares then unprepares its
    own claims, the sides in turn. A call NVIDIA's side answers with an error makes that figure n/a (its first error
    is the footnote) and its claims are unprepared again as the kubelet would retry; after a failed prepare that
    workload is not run again on its side, after a failed unprepare it is (for the prepare figure). Any other side's
    error ends the bench."""
    seq = 0
    for r in range(rounds):
        for kind in ("gpu", "mig"):
            for callers in (1, GPUS if kind == "gpu" else 16):
                now = [side for side in order(r, sides) if (side, f"prepare {kind} {callers}") not in unavailable]
                claims = {}
                for side in now:
                    seq += 1
                    devices = devices_for(kind, max(callers, GPUS))
                    claims[side] = allocated_claims(api, nodes[side], devices, f"b{seq}", driver=driver_of(side))
                for side in now:
                    kubelet = running[side][1]

                    def prep(c: ClaimRef, k: KubeletHarness = kubelet) -> str:
                        return k.prepare([c], timeout=CALL_TIMEOUT_S)[c.uid].error

                    def unprep(c: ClaimRef, k: KubeletHarness = kubelet) -> str:
                        return k.unprepare([c], timeout=CALL_TIMEOUT_S)[c.uid]

                    keys = [(side, f"{op} {kind} {callers}") for op in ("prepare", "unprepare")]
                    try:
                        add(keys[0], timed_calls(prep, claims[side], callers > 1))
                    except (RuntimeError, grpc.RpcError) as e:
                        if side != "nvidia":
                            raise
                        for key in keys:
                            unavailable[key] = nvidia_reason(e)
                        retry_unprepare(kubelet, claims[side])
                        continue
                    try:
                        times = timed_calls(unprep, claims[side], callers > 1)
                        if keys[1] not in unavailable:
                            add(keys[1], times)
                        else:
                            add((side, "uncounted calls"), [len(times)])
                    except (RuntimeError, grpc.RpcError) as e:
                        if side != "nvidia":
                            raise
                        unavailable[keys[1]] = nvidia_reason(e)
                        add((side, "uncounted calls"), [len(claims[side])])
                        retry_unprepare(kubelet, claims[side])
                for side in now:
                    delete_claims(api, claims[side])


RATIOS = (("ours", "go"), ("floor", "go"), ("ours", "nvidia"))


def render(samples: dict[tuple[str, str], list[float]], unavailable: Unavailable, sides: tuple[str, ...]) -> list[str]:
    """The table: a column per side, the ratios of those present, then the n/a footnotes."""
    ratios = [(a, b) for a, b in RATIOS if a in sides and b in sides]
    names = {"ours": "ours", "floor": "floor", "go": "Go", "nvidia": "NVIDIA"}
    header = [LABELS[side] for side in sides] + [f"{names[a]} / {names[b]}" for a, b in ratios]
    lines = ["| figure | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    notes: dict[str, int] = {}

    def row(label: str, key: str, scale: float, unit: str, stat: Callable[[list[float]], float]) -> None:
        values = {
            side: math.nan if (side, key) in unavailable else stat(samples.get((side, key), [])) for side in sides
        }
        cells = []
        for side in sides:
            reason = unavailable.get((side, key))
            if reason is not None:
                mark = notes.setdefault(reason, len(notes) + 1)
                cells.append(f"n/a [{mark}]")
            elif math.isnan(values[side]):
                cells.append("-")
            else:
                cells.append(f"{values[side] * scale:.1f} {unit}")
        cells += [ratio(values[a], values[b]) for a, b in ratios]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    for kind, label in (("gpu", "whole GPU"), ("mig", "MIG 1g")):
        for callers in (1, GPUS if kind == "gpu" else 16):
            for op in ("prepare", "unprepare"):
                key = f"{op} {kind} {callers}"
                row(f"{op} p50, {label}, {callers} caller(s)", key, 1000, "ms", lambda v: pctl(v, 50))
                row(f"{op} p99, {label}, {callers} caller(s)", key, 1000, "ms", lambda v: pctl(v, 99))
    row("CPU per call during the load (all threads, prepares and unprepares)", "cpu per call", 1000, "ms",
        lambda v: v[-1] if v else math.nan)  # fmt: skip
    row("RSS idle", "rss idle", 1, "MB", lambda v: v[-1] if v else math.nan)
    row("RSS after load", "rss load", 1, "MB", lambda v: v[-1] if v else math.nan)
    row("start to gRPC serving (median of starts)", "serving", 1000, "ms", lambda v: pctl(v, 50))
    row("start to slices published (median of starts)", "published", 1, "s", lambda v: pctl(v, 50))
    lines += [f"[{mark}] {reason}" for reason, mark in notes.items()]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a few seconds of load: 2 rounds, 1 start each")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--sides", default=",".join(SIDES), help=f"which of {','.join(SIDES)} (default: all)")
    args = parser.parse_args()
    rounds, starts = (2, 1) if args.quick else (args.rounds, args.starts)
    wanted = set(args.sides.split(","))
    if wanted - set(SIDES):
        parser.error(f"unknown sides {sorted(wanted - set(SIDES))}: choose among {','.join(SIDES)}")
    sides = tuple(side for side in SIDES if side in wanted)
    unavailable: Unavailable = {}
    if "nvidia" in sides and os.geteuid() != 0:
        # its device nodes need mknod, its /proc/driver a mount namespace: a column of n/a, the reason once
        reason = f"{LABELS['nvidia']}: not run, it needs root (mknod for its device nodes, a mount namespace)"
        for key in [f"{op} {kind} {n}" for op in ("prepare", "unprepare") for kind, n in
                    (("gpu", 1), ("gpu", GPUS), ("mig", 1), ("mig", 16))] + [
                    "cpu per call", "rss idle", "rss load", "serving", "published"]:  # fmt: skip
            unavailable[("nvidia", key)] = reason
    run_sides = tuple(side for side in sides if (side, "serving") not in unavailable)
    # as an install does (pip compiles a wheel's modules): else each start of ours compiles what changed since the
    # bytecode was last written, and never writes it where PYTHONDONTWRITEBYTECODE is set
    compileall.compile_dir(ROOT / "dra_driver", quiet=1)
    binary = build_refplugin() if "go" in sides else None
    samples: dict[tuple[str, str], list[float]] = {}

    def add(key: tuple[str, str], values: list[float]) -> None:
        samples.setdefault(key, []).extend(values)

    # The simulated GPUs' state on a memory file system where there is one, as the default state directory
    # ($XDG_RUNTIME_DIR) is and a GPU's state is (the driver's memory): on this machine's ext4, replacing the state
    # file at every simulated MIG change cost more than the rest of our MIG prepare. The CDI specs, and the
    # checkpoints, stay on the disk.
    memory_fs = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with ControlPlane() as cp, tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory(dir=memory_fs) as gpus:
        api = api_client(cp.kubeconfig)
        cp.kubectl("apply", "-f", "-", input='{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", '
                   '"metadata": {"name": "bench.dra-driver.dev"}, "spec": {"selectors": [{"cel": {"expression": '
                   f'"device.driver == \'{DRIVER}\'"}}}}]}}}}')  # fmt: skip
        nodes = {side: f"bench-{side}" for side in run_sides}
        for node in nodes.values():
            cp.create_node(node)

        def make(side: str, n: int) -> Plugin:
            root = Path(tmp) / f"{side}-{n}"
            if side == "ours":
                return Ours(root, cp.kubeconfig, nodes[side], sim_state=Path(gpus) / f"{side}-{n}")
            if side == "floor":
                return Floor(root, cp.kubeconfig, nodes[side])
            if side == "nvidia":
                return Nvidia(cp, root, nodes[side], sim_state=Path(gpus) / f"{side}-{n}")
            assert binary is not None
            return RefPlugin(binary, root, cp.kubeconfig, nodes[side], "--kube-api-qps=-1")

        running: dict[str, tuple[Plugin, KubeletHarness]] = {}
        try:
            measure_starts(cp, api, nodes, make, running, starts, add, run_sides)
            cpu_before = {side: cpu_s(plugin.proc.pid) for side, (plugin, _) in running.items() if plugin.proc}
            measure_calls(api, nodes, running, rounds, add, unavailable, run_sides)
            for side, (plugin, _) in running.items():
                assert plugin.proc is not None
                calls = sum(len(v) for (s, key), v in samples.items() if s == side and "prepare " in key)
                calls += int(sum(samples.get((side, "uncounted calls"), [])))
                if calls:
                    add((side, "cpu per call"), [(cpu_s(plugin.proc.pid) - cpu_before[side]) / calls])
            time.sleep(2.0)  # settled, as for the idle figure (ours trims its heap a second after the last call)
            for side, (plugin, _) in running.items():
                assert plugin.proc is not None
                add((side, "rss load"), [rss_mb(plugin.proc.pid)])
        finally:
            for plugin, kubelet in running.values():
                kubelet.close()
                plugin.stop()

    print(f"rounds {rounds}, starts {starts}; samples per latency row (each side): "
          f"{len(samples.get((run_sides[0], 'prepare gpu 1'), []))} at 1 caller, "
          f"{len(samples.get((run_sides[0], 'prepare mig 16'), []))} at 16")  # fmt: skip
    print("\n".join(render(samples, unavailable, sides)))


if __name__ == "__main__":
    main()
