"""Soak of the node daemon: thousands of prepare/unprepare cycles through the kubelet's socket against one
long-running `python -m dra_driver plugin` process, with XIDs injected on the GPUs that hold claims. What the daemon
holds (RSS, descriptors, threads, metrics series) and what it writes (checkpoint, CDI specs, the simulator's state
files) is sampled with no claim held, and must level off. Starts its own control plane (tests/cluster); everything
is on loopback.

The node is a simulated dgx-h100 in partitionable mode (whole GPUs, and MIG partitions carved on demand). Each round
creates fresh allocated ResourceClaims in the API server (a new UID each, as pods' claims have), prepares them one
call each, injects XIDs on every device they hold, unprepares them one call each and deletes them; a cycle is one
claim prepared and unprepared. A round: 2 whole GPUs, 3 MIG partitions of one GPU (3 of a layout that fills it) and
1 time-sliced GPU, on GPUs drawn at random; every --mps-every rounds one MPS GPU besides (an MPS prepare starts a
control daemon: hundreds of ms).

XIDs: every held device gets one the daemon counts but never taints for (13, 31, 43, 45 in turn: the default ignore
list's application errors), a GPU-level event for a whole GPU, a MIG-level one (its GPU and compute instance ids) for
a partition; the round goes on once /metrics counts each under its claim. Every --taint-every rounds one XID that
does taint (94: the simulated R550 driver gives no recovery verdict, so the taint stays until cleared) lands on a held
whole GPU and is cleared as an operator would: `dra-driver health clear gpu-N --socket <plugin dir>/health.sock`.
The first round has an MPS claim and a tainting XID too, so every kind of metrics series exists after warm-up. The
simulator's bounded logs, its event log (the last 1,000 events: dra_driver.simulator.events.MAX_EVENTS) and its
tools' call log (the last 50: tools.state.KEEP_CALLS), are filled to their caps before the daemon starts, so their
size is a long-lived node's from the first sample. A kubelet health stream (NodeWatchResources) stays open
throughout, as the kubelet keeps one.

Sampled at the start and after the round that reaches each --sample-every cycles (so with no claim held): the
daemon's RSS, open descriptors and threads (/proc), its /metrics series (non-comment lines) and among them
dra_driver_gpu_xid_errors_total's, the checkpoint's size (<plugin dir>/checkpoint.json), the CDI directory's file
count, and the size of everything under the simulator's state directory (the biggest files are listed).

Judged (`judge`): the first quarter of the samples is warm-up; each quantity's mean over the last quarter may exceed
its mean over the second quarter by its tolerance (TOLERANCES, printed) at most, else the bench names it and exits 1; it
exits 1 as well when a kubelet call, an XID's count or an operator's clear fails.

Run: python bench/bench_soak.py [--cycles 2000] [--sample-every N] [--seed N] [--quick]. Prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid as uuidlib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pynvml

from dra_driver.plugin.socket_identity import socket_id
from dra_driver.plugin.types import ClaimRef
from dra_driver.sharing import DriverRootRunner
from dra_driver.simulator.events import MAX_EVENTS, EventLog, SimEvent
from dra_driver.simulator.lockedfile import replace_text
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.simulator.tools import forkserver
from dra_driver.simulator.tools import state as sharing_state
from dra_driver.simulator.tools.state import SharingState
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME
from tests.cluster.controlplane import ControlPlane, KubectlError
from tests.crash_harness import ClaimSpec, ClusterClaims, mig_placement, mps, time_slicing
from tests.kubelet_harness import KubeletHarness
from tests.processes import die_with_parent
from tests.sharing_helpers import stop_daemons

REPO_ROOT = Path(__file__).resolve().parent.parent
DRIVER = DEFAULT_DRIVER_NAME
MACHINE = "dgx-h100"
MODE = "partitionable"
NODE = "soak-node"
COUNTED_XIDS = (13, 31, 43, 45)  # on the daemon's default ignore list: counted, never tainting
TAINTING_XID = 94
WHOLE_PER_ROUND = 2
MIG_PER_ROUND = 3
TIMESLICED_PER_ROUND = 1
INTERVALS = ("Default", "Short", "Medium", "Long")
# MIG layouts that fill one H100 80GB (7 compute slices, 8 memory slices): a round claims 3 partitions of one of them.
MIG_LAYOUTS: tuple[tuple[str, ...], ...] = (
    ("1g10gb-19-0", "1g10gb-19-1", "2g20gb-14-2", "3g40gb-9-4"),
    ("2g20gb-14-0", "2g20gb-14-2", "2g20gb-14-4", "1g10gb-19-6"),
    ("4g40gb-5-0", "2g20gb-14-4", "1g10gb-19-6"),
    ("1g20gb-15-0", "1g20gb-15-2", "1g20gb-15-4", "1g10gb-19-6"),
)
START_TIMEOUT_S = 90.0
XID_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 120.0


# ----- what is sampled, and how it is judged --------------------------------------------------------------------
@dataclass(frozen=True)
class Quantity:
    key: str
    header: str
    decimals: int = 0


QUANTITIES: tuple[Quantity, ...] = (
    Quantity("rss_mb", "RSS MB", 1),
    Quantity("fds", "fds"),
    Quantity("threads", "threads"),
    Quantity("series", "metrics series"),
    Quantity("xid_series", "xid series"),
    Quantity("checkpoint_bytes", "checkpoint bytes"),
    Quantity("cdi_files", "CDI files"),
    Quantity("sim_state_bytes", "sim state bytes"),
)


@dataclass(frozen=True)
class Tolerance:
    """How much a quantity's last-quarter mean may exceed its second-quarter mean: `absolute`, or `relative` times
    the second-quarter mean where that is more."""

    absolute: float
    relative: float = 0.0
    why: str = ""

    def allowed(self, base: float) -> float:
        return max(self.absolute, self.relative * abs(base))


TOLERANCES: dict[str, Tolerance] = {
    "rss_mb": Tolerance(4.0, 0.0, "the allocator's arenas wobble by a few MB"),
    "fds": Tolerance(1.0, 0.0, "one keep-alive connection to the API server more or less"),
    "threads": Tolerance(1.0, 0.0, "one short-lived worker more or less"),
    "series": Tolerance(2.0, 0.0, "a counter's first result of another kind (e.g. a publish retry)"),
    "xid_series": Tolerance(0.0, 0.0, "no claim is held: none of the claims' series may stay"),
    "checkpoint_bytes": Tolerance(0.0, 0.0, "no claim is held: the checkpoint is back to empty"),
    "cdi_files": Tolerance(0.0, 0.0, "no claim is held: no spec may stay"),
    "sim_state_bytes": Tolerance(2048.0, 0.0, "field widths (sequence numbers, ids) vary by a few hundred bytes"),
}


@dataclass(frozen=True)
class Verdict:
    """One quantity's level after warm-up: the second and the last quarter's means of the samples."""

    key: str
    second: float
    last: float
    allowed: float

    @property
    def growth(self) -> float:
        return self.last - self.second

    @property
    def grew(self) -> bool:
        return self.growth > self.allowed + 1e-9

    def __str__(self) -> str:
        pct = f" ({self.growth / self.second:+.1%})" if self.second else ""
        return (
            f"{self.key}: {self.second:.6g} -> {self.last:.6g}, {self.growth:+.6g}{pct}, tolerance {self.allowed:.6g}"
        )


def quarters(n: int) -> tuple[slice, slice]:
    """The samples of the second quarter and of the last quarter of `n` samples (the first is warm-up); each at
    least one sample, the two never overlapping."""
    if n < 4:
        raise ValueError(f"{n} samples: at least 4 are needed to tell warm-up, second and last quarter apart")
    q = math.ceil(n / 4)
    second = slice(q, min(2 * q, n - q))
    return second, slice(n - q, n)


def judge(samples: Sequence[Mapping[str, float]], tolerances: Mapping[str, Tolerance]) -> list[Verdict]:
    """Each quantity of `tolerances`: its mean over the last quarter of `samples` (in order, taken alike, e.g. with no
    claim held) against its mean over the second quarter, the first quarter being warm-up. A quantity levels off
    when the last exceeds the second by no more than its tolerance (`Verdict.grew` is False); a drop always passes."""
    second, last = quarters(len(samples))
    verdicts = []
    for key, tolerance in tolerances.items():
        base = statistics.fmean(s[key] for s in samples[second])
        end = statistics.fmean(s[key] for s in samples[last])
        verdicts.append(Verdict(key, base, end, tolerance.allowed(base)))
    return verdicts


# ----- the table ------------------------------------------------------------------------------------------------
@dataclass
class Sample:
    cycles: int
    values: dict[str, float]
    files: dict[str, int] = field(default_factory=dict)  # the simulator's state files: path -> bytes


def markdown_table(samples: Sequence[Sample]) -> list[str]:
    head = ["cycles done", *(q.header for q in QUANTITIES)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in samples:
        cells = [str(s.cycles), *(f"{s.values[q.key]:.{q.decimals}f}" for q in QUANTITIES)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def biggest(files: Mapping[str, int], n: int = 6) -> str:
    top = sorted(files.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return ", ".join(f"{name} {size}" for name, size in top)


# ----- the node -------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prefill_logs(sim: SimulatedNvml) -> None:
    """The simulator's bounded logs at their caps, as on a node that ran for a while, so that their filling is not
    taken for growth: the event log (ignored XIDs; before the daemon starts, whose event set sees only later
    events) and the simulated tools' call log (nvidia-smi's compute-mode queries, as the sharing code makes)."""
    events = [
        SimEvent(
            seq=i + 1,
            gpu=i % len(sim.gpu_uuids),
            event_type=pynvml.nvmlEventTypeXidCriticalError,
            data=COUNTED_XIDS[i % len(COUNTED_XIDS)],
        )
        for i in range(MAX_EVENTS)
    ]
    replace_text(sim.events.path, EventLog(next_seq=MAX_EVENTS + 1, events=events).model_dump_json())
    runner = DriverRootRunner(sim.driver_root)
    smi = str(runner.tool("nvidia-smi"))
    sharing = SharingState(sim.state_dir)
    for i in range(getattr(sharing_state, "KEEP_CALLS", 50)):
        uuid = sim.gpu_uuids[i % len(sim.gpu_uuids)]
        argv = [smi, "--query-gpu=compute_mode", "--format=csv,noheader", "-i", uuid]
        sharing.record_call(argv, runner.environment("nvidia-smi"), None, 0)


class Daemon:
    """The node daemon as a process of its own, its directories, and the kubelet's side of its sockets."""

    def __init__(self, root: Path, kubeconfig: Path) -> None:
        self.root = root
        self.state = root / "gpu"
        self.plugin_dir = root / "plugin"
        self.cdi_root = root / "cdi"
        self.registry_dir = root / "registry"
        self.log = root / "daemon.log"
        self.kubeconfig = kubeconfig
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.kubelet = KubeletHarness(self.registry_dir, DRIVER)
        self.sim = SimulatedNvml(MACHINE, self.state)
        self.health_messages = 0
        self._stream: Any = None
        self._stream_thread: threading.Thread | None = None

    def start(self) -> float:
        """Start the daemon, wait until it serves, register as the kubelet and open a health stream; seconds."""
        prefill_logs(self.sim)
        cmd = [sys.executable, "-m", "dra_driver", "plugin", "--sim", MACHINE, "--sim-state", str(self.state),
               "--mode", MODE, "--node-name", NODE, "--kubeconfig", str(self.kubeconfig),
               "--plugin-dir", str(self.plugin_dir), "--registry-dir", str(self.registry_dir),
               "--cdi-root", str(self.cdi_root), "--metrics-port", str(self.metrics_port)]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1", forkserver.ENV: os.environ.get(forkserver.ENV, "1")}
        began = time.monotonic()
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT, preexec_fn=die_with_parent
            )
        reg = self.registry_dir / f"{DRIVER}-reg.sock"
        while socket_id(reg) is None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited with {self.proc.returncode} at start:\n{self.log_tail()}")
            if time.monotonic() - began > START_TIMEOUT_S:
                raise RuntimeError(f"the daemon did not serve within {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}")
            time.sleep(0.05)
        self.kubelet.register(timeout=START_TIMEOUT_S)
        seconds = time.monotonic() - began
        self._stream = self.kubelet.watch_resources()
        self._stream_thread = threading.Thread(target=self._read_stream, name="health-stream", daemon=True)
        self._stream_thread.start()
        return seconds

    def _read_stream(self) -> None:
        try:
            for _ in self._stream:
                self.health_messages += 1
        except Exception:  # cancelled at the end, or the daemon went away (seen by the calls)
            return

    def stop(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
        if self._stream_thread is not None:
            self._stream_thread.join(timeout=10)
        self.kubelet.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        stop_daemons(self.state)  # MPS control daemons are processes of their own

    def log_tail(self, lines: int = 25) -> str:
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").rstrip().splitlines()[-lines:])

    # -- what it holds and writes
    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30) as answer:
            return str(answer.read().decode())

    def sample(self, cycles: int) -> Sample:
        assert self.proc is not None
        pid = self.proc.pid
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kb = int(re.search(r"^VmRSS:\s+(\d+)", status, re.M)[1])  # type: ignore[index]
        threads = int(re.search(r"^Threads:\s+(\d+)", status, re.M)[1])  # type: ignore[index]
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        lines = [line for line in self.metrics().splitlines() if line and not line.startswith("#")]
        checkpoint = self.plugin_dir / "checkpoint.json"
        files = {
            str(p.relative_to(self.state)): p.stat().st_size
            for p in self.state.rglob("*")
            if p.is_file() and not p.is_symlink()
        }
        values = {
            "rss_mb": rss_kb * 1024 / 1e6,
            "fds": fds,
            "threads": threads,
            "series": len(lines),
            "xid_series": sum(1 for line in lines if line.startswith("dra_driver_gpu_xid_errors_total")),
            "checkpoint_bytes": checkpoint.stat().st_size if checkpoint.exists() else 0,
            "cdi_files": sum(1 for p in self.cdi_root.iterdir()) if self.cdi_root.is_dir() else 0,
            "sim_state_bytes": sum(files.values()),
        }
        return Sample(cycles, {k: float(v) for k, v in values.items()}, files)

    def gpu_index(self, minor: int) -> int:
        return self.sim.minors.index(minor)

    def mig_ids(self, device: str) -> tuple[int, int, int]:
        """(GPU index, GPU instance id, compute instance id) of a carved MIG partition, from the simulator."""
        placement = mig_placement(device)
        assert placement is not None, device
        minor, profile, start = placement
        index = self.gpu_index(minor)
        for gi in self.sim.store.read().gpus[index].gpu_instances:
            if gi.profile_id == profile and gi.start == start and gi.compute_instances:
                return index, gi.id, gi.compute_instances[0].id
        raise RuntimeError(f"{device} is prepared but its MIG instance does not exist")


# ----- the soak -------------------------------------------------------------------------------------------------
@dataclass
class Held:
    spec: ClaimSpec
    ref: ClaimRef


@dataclass
class Soak:
    daemon: Daemon
    cp: ControlPlane
    claims: ClusterClaims
    rng: random.Random
    mps_every: int
    taint_every: int
    rounds: int = 0
    cycles: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    xids: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    clears: int = 0
    seconds: dict[str, float] = field(default_factory=dict)  # time per part of a round

    def _specs(self) -> list[tuple[str, ClaimSpec]]:
        """This round's claims, on GPUs drawn at random: (kind, spec)."""
        gpus = self.rng.sample(range(8), 8)
        mig_gpu = gpus.pop()
        layout = self.rng.choice(MIG_LAYOUTS)
        specs = [("MIG", ClaimSpec("mig", (f"gpu-{mig_gpu}-mig-{p}",))) for p in self.rng.sample(layout, MIG_PER_ROUND)]
        specs += [("whole GPU", ClaimSpec("gpu", (f"gpu-{gpus.pop()}",))) for _ in range(WHOLE_PER_ROUND)]
        for _ in range(TIMESLICED_PER_ROUND):
            interval = self.rng.choice(INTERVALS)
            specs.append(("time-sliced", ClaimSpec("ts", (f"gpu-{gpus.pop()}",), (time_slicing(interval),))))
        if self.mps_every and (self.rounds - 1) % self.mps_every == 0:  # rounds 1, 1 + N, ...: the first has all
            config = (mps(self.rng.choice((25, 50, 100)), self.rng.choice((None, "1Gi"))),)
            specs.append(("MPS", ClaimSpec("mps", (f"gpu-{gpus.pop()}",), config, mps=True)))
        self.rng.shuffle(specs)
        return specs

    @contextlib.contextmanager
    def _timed(self, part: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self.seconds[part] = self.seconds.get(part, 0.0) + time.monotonic() - began

    def round(self) -> None:
        self.rounds += 1
        held: list[Held] = []  # every claim prepare was called for
        prepared: list[Held] = []  # those it prepared
        names: list[str] = []
        try:
            for kind, spec in self._specs():
                name = f"soak-{self.rounds}-{spec.key}-{uuidlib.uuid4().hex[:6]}"
                with self._timed("create"):
                    created = self.cp.create_allocated(self.claims.claim_object(spec, name))
                names.append(name)
                ref = ClaimRef(namespace="default", name=name, uid=created["metadata"]["uid"])
                with self._timed("prepare"):
                    answer = self.daemon.kubelet.prepare([ref], timeout=CALL_TIMEOUT_S)
                result = answer.get(ref.uid)
                if result is None or result.error:
                    self.failures.append(
                        f"round {self.rounds}: prepare of {spec.devices} ({kind}) failed: "
                        f"{result.error if result else 'no answer'}"
                    )
                else:
                    self.kinds[kind] += 1
                    prepared.append(Held(spec, ref))
                held.append(Held(spec, ref))  # unprepared whatever the answer, as the kubelet would
            with self._timed("XIDs"):
                self._inject(prepared)
        finally:
            for h in self.rng.sample(held, len(held)):
                with self._timed("unprepare"):
                    out = self.daemon.kubelet.unprepare([h.ref], timeout=CALL_TIMEOUT_S)
                error = out.get(h.ref.uid, "no answer")
                if error:
                    self.failures.append(f"round {self.rounds}: unprepare of {h.spec.devices} failed: {error}")
                self.cycles += 1
            if names:
                with self._timed("delete"):
                    self.cp.delete("resourceclaim", *names)

    def _inject(self, held: Sequence[Held]) -> None:
        """One counted XID on every held device, a tainting one every --taint-every rounds (cleared); wait until
        the metrics count each under its claim."""
        expected: Counter[tuple[str, str, int]] = Counter()  # (claim, device, xid)
        whole: list[tuple[Held, str]] = []
        for h in held:
            for device in h.spec.devices:
                xid = COUNTED_XIDS[sum(self.xids.values()) % len(COUNTED_XIDS)]
                if mig_placement(device) is None:
                    self.daemon.sim.inject_event(
                        self.daemon.gpu_index(int(device.split("-")[1])), pynvml.nvmlEventTypeXidCriticalError, xid=xid
                    )
                    whole.append((h, device))
                else:
                    index, gi, ci = self.daemon.mig_ids(device)
                    self.daemon.sim.inject_event(
                        index, pynvml.nvmlEventTypeXidCriticalError, xid=xid, gi_id=gi, ci_id=ci
                    )
                self.xids[xid] += 1
                expected[(h.ref.name, device, xid)] += 1
        tainted = None
        if self.taint_every and (self.rounds - 1) % self.taint_every == 0 and whole:
            h, device = self.rng.choice(whole)
            self.daemon.sim.inject_event(
                self.daemon.gpu_index(int(device.split("-")[1])), pynvml.nvmlEventTypeXidCriticalError, xid=TAINTING_XID
            )
            self.xids[TAINTING_XID] += 1
            expected[(h.ref.name, device, TAINTING_XID)] += 1
            tainted = device
        self._wait_counted(expected)
        if tainted is not None:
            self._clear(tainted)

    def _wait_counted(self, expected: Counter[tuple[str, str, int]]) -> None:
        deadline = time.monotonic() + XID_TIMEOUT_S
        while True:
            counted = xid_counts(self.daemon.metrics())
            missing = {k: n for k, n in expected.items() if counted.get(k, 0) < n}
            if not missing:
                return
            if time.monotonic() > deadline:
                self.failures.append(
                    f"round {self.rounds}: XIDs not counted under their claims within "
                    f"{XID_TIMEOUT_S:.0f} s: {sorted(missing)}"
                )
                return
            time.sleep(0.05)

    def _clear(self, device: str) -> None:
        cmd = [sys.executable, "-m", "dra_driver", "health", "clear", device, "--socket",
               str(self.daemon.plugin_dir / "health.sock")]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
        self.clears += 1
        if done.returncode != 0 or f"{device}: cleared" not in done.stdout:
            self.failures.append(
                f"round {self.rounds}: health clear {device}: exit {done.returncode}, "
                f"{(done.stdout + done.stderr).strip()}"
            )


_XID_LINE = re.compile(r"^dra_driver_gpu_xid_errors_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def xid_counts(metrics: str) -> dict[tuple[str, str, int], float]:
    """dra_driver_gpu_xid_errors_total by (claim, device, xid)."""
    out: dict[tuple[str, str, int], float] = {}
    for line in metrics.splitlines():
        m = _XID_LINE.match(line)
        if m:
            labels = dict(_LABEL.findall(m["labels"]))
            key = (labels.get("claim", ""), labels.get("device", ""), int(labels.get("xid", "0")))
            out[key] = out.get(key, 0.0) + float(m["value"])
    return out


def published_devices(cp: ControlPlane) -> set[str] | None:
    """The device names of the node's pool once every slice of it is published; None before."""
    items = cp.kubectl_json("get", "resourceslices", "--field-selector", f"spec.nodeName={NODE}")["items"]
    if not items:
        return None
    gens = {o["spec"]["pool"]["generation"] for o in items}
    if len(gens) != 1 or any(o["spec"]["pool"]["resourceSliceCount"] != len(items) for o in items):
        return None
    return {d["name"] for o in items for d in o["spec"].get("devices") or []}


def wait_published(cp: ControlPlane, timeout: float = START_TIMEOUT_S) -> set[str]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = published_devices(cp)
        except KubectlError:
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise RuntimeError(f"the pool of {NODE} was not published within {timeout:.0f} s")
        time.sleep(0.2)


# ----- main -----------------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    sample_every = args.sample_every or max(1, args.cycles // 20)
    samples: list[Sample] = []
    began = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="dra-soak-", dir="/tmp"))  # short: AF_UNIX paths
    try:
        with ControlPlane() as cp:
            cp.create_node(NODE)
            claims = ClusterClaims(cp, NODE, "soak")
            claims.create([])  # the DeviceClasses
            daemon = Daemon(root, cp.kubeconfig)
            try:
                serve_s = daemon.start()
                devices = wait_published(cp)
                wanted = {f"gpu-{g}-mig-{p}" for g in range(8) for layout in MIG_LAYOUTS for p in layout}
                if wanted - devices:
                    raise RuntimeError(f"the pool lacks MIG devices the soak claims: {sorted(wanted - devices)[:5]}")
                soak = Soak(daemon, cp, claims, rng, args.mps_every, args.taint_every)
                samples.append(daemon.sample(0))
                next_sample = sample_every
                while soak.cycles < args.cycles:
                    soak.round()
                    if daemon.proc is not None and daemon.proc.poll() is not None:
                        soak.failures.append(f"the daemon exited with {daemon.proc.returncode}:\n{daemon.log_tail()}")
                        break
                    if soak.cycles >= next_sample or soak.cycles >= args.cycles:
                        samples.append(daemon.sample(soak.cycles))
                        next_sample = (soak.cycles // sample_every + 1) * sample_every
                        print(
                            f"  {soak.cycles} cycles, {time.monotonic() - began:.0f} s, "
                            f"RSS {samples[-1].values['rss_mb']:.1f} MB, "
                            f"{len(soak.failures)} failures",
                            flush=True,
                        )
                    if len(soak.failures) > 20:
                        break
            finally:
                daemon.stop()
                cp.delete("resourceclaim", check=False)  # any a failed round left
                cp.delete("deviceclass", claims.gpu_class, claims.mig_class, check=False)
            log_tail = daemon.log_tail(10)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    seconds = time.monotonic() - began
    return report(args, seed, sample_every, samples, soak, serve_s, seconds, log_tail)


def report(
    args: argparse.Namespace,
    seed: int,
    sample_every: int,
    samples: Sequence[Sample],
    soak: Soak,
    serve_s: float,
    seconds: float,
    log_tail: str,
) -> int:
    mix = ", ".join(f"{n} {k}" for k, n in sorted(soak.kinds.items(), key=lambda kv: -kv[1]))
    xids = ", ".join(f"{x}: {n}" for x, n in sorted(soak.xids.items()))
    print(
        f"soak of the node daemon: {MACHINE}, {MODE} mode, {soak.cycles} cycles in {soak.rounds} rounds (seed {seed}), "
        f"{seconds:.0f} s; cycle mix: {mix}; XIDs injected: {sum(soak.xids.values())} ({xids}; {TAINTING_XID} "
        f"tainted and was cleared {soak.clears} times); sampled every {sample_every} cycles with no claim held; "
        f"daemon served in {serve_s:.2f} s; {soak.daemon.health_messages} health-stream messages"
    )
    print()
    print("\n".join(markdown_table(samples)))
    print()
    parts = ", ".join(f"{k} {v:.0f} s" for k, v in sorted(soak.seconds.items(), key=lambda kv: -kv[1]))
    print(f"time spent: {parts}")
    if samples:
        print(f"simulator state, biggest files at the start: {biggest(samples[0].files)}")
        print(f"simulator state, biggest files at the end:   {biggest(samples[-1].files)}")
    status = 0
    if len(samples) >= 4:
        verdicts = judge([s.values for s in samples], TOLERANCES)
        grew = [v for v in verdicts if v.grew]
        limits = [
            f"{k} {t.absolute:g}" + (f" or {t.relative:.0%}" if t.relative else "") for k, t in TOLERANCES.items()
        ]
        print(f"tolerances (last quarter's mean over the second's): {'; '.join(limits)}")
        if grew:
            status = 1
            for v in grew:
                print(f"GREW {v}")
        else:
            print("levelled off: every quantity within its tolerance after warm-up")
    else:
        status = 1
        print(f"GREW? only {len(samples)} samples: at least 4 are needed to judge (lower --sample-every)")
    if soak.failures:
        status = 1
        print(f"FAILURES ({len(soak.failures)}):")
        for f in soak.failures[:20]:
            print(f"  {f}")
        print(f"daemon log, last lines:\n{log_tail}")
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=2000, help="claims prepared and unprepared (default 2000)")
    parser.add_argument("--sample-every", type=int, default=0, help="cycles between samples (default cycles/20)")
    parser.add_argument("--mps-every", type=int, default=10, help="an MPS claim every N rounds (0: none)")
    parser.add_argument("--taint-every", type=int, default=10, help="a tainting XID, cleared, every N rounds (0: none)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    parser.add_argument("--quick", action="store_true", help="60 cycles sampled every 6, MPS and taint every 5 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.cycles, args.sample_every, args.mps_every, args.taint_every = 60, 6, 5, 5
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
