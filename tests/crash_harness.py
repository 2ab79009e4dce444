"""Crash recovery of the node daemon as a real process: kill it at a step, restart it, retry as the kubelet
would, and check what is left on the (simulated) node.

Shared by tests/test_crash_recovery_real.py (a SIGKILL at every named step, `dra_driver.claimstate.crashpoints`)
and bench/bench_crash_soak.py (SIGKILLs from outside at random moments).

The daemon is `python -m dra_driver plugin --sim dgx-h100` in partitionable mode, with a simulator state directory
this process reads too (MIG instances, time slices, MPS daemons), its claims in a real API server, and the kubelet
played over its real sockets (`KubeletHarness`). The invariants checked after every restart and retry:

- (a) mig: the MIG instances on the simulated GPUs are exactly those of PrepareCompleted checkpoint entries,
  same GPU-instance id, compute-instance id, UUID, profile and placement;
- (b) cdi: one CDI spec file per prepared claim, none other, and no temp file of an interrupted write;
- (c) idempotent: a repeated prepare of a prepared claim answers the same CDI ids, which its spec defines;
- (d) others: claims prepared after the restart are intact (MIG device, UUID, spec) after the retry;
- (e) clean: after unpreparing everything, no MIG instance, CDI spec, checkpoint entry, MPS directory, simulated
  MPS daemon or time slice is left, and MIG mode is back to the machine's default on every GPU;
- (f) sharing: time slices set and MPS daemons running for exactly the prepared claims that ask for them;
- (g) checkpoint: its entries are exactly the prepared claims, all PrepareCompleted;
- retry / prepare / unprepare: the kubelet's calls succeed.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid as uuidlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pynvml

from dra_driver.claimstate import crashpoints
from dra_driver.claimstate.steps import ALL_POINTS, PREPARE_POINTS, RECOVERY_POINTS, TEARDOWN_POINTS
from dra_driver.plugin.grpc.kubelet import PrepareAnswer
from dra_driver.plugin.socket_identity import socket_id
from dra_driver.plugin.types import ClaimRef
from dra_driver.sharing import DriverRootRunner
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.simulator.tools.state import SharingState
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME
from tests.cluster.controlplane import KubectlError
from tests.daemon_zygote import Zygote, ZygoteChild
from tests.kubelet_harness import KubeletHarness
from tests.processes import die_with_parent
from tests.sharing_helpers import stop_daemons

DRIVER = DEFAULT_DRIVER_NAME
MACHINE = "dgx-h100"
CONFIG_API = "gpu.resource.dra-driver.dev/v1alpha1"
COMPLETED = "PrepareCompleted"
REPO_ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 20.0
_MIG_NAME = re.compile(r"^gpu-(\d+)-mig-.+-(\d+)-(\d+)$")  # gpu-<minor>-mig-<profile>-<profile id>-<start>


# ----- claims ---------------------------------------------------------------------------------------------------
def _config(kind: str, sharing: dict[str, Any], requests: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "source": "FromClaim",
        "requests": list(requests),
        "opaque": {"driver": DRIVER, "parameters": {"apiVersion": CONFIG_API, "kind": kind, "sharing": sharing}},
    }


def time_slicing(interval: str, requests: Sequence[str] = ()) -> dict[str, Any]:
    return _config("GpuConfig", {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}, requests)


def mps(percentage: int, pinned: str | None = None, *, kind: str = "GpuConfig", requests: Sequence[str] = ()) -> dict:
    config: dict[str, Any] = {"defaultActiveThreadPercentage": percentage}
    if pinned is not None:
        config["defaultPinnedDeviceMemoryLimit"] = pinned
    return _config(kind, {"strategy": "MPS", "mpsConfig": config}, requests)


@dataclass(frozen=True)
class ClaimSpec:
    """A claim of the harness: its devices (one request each, r0, r1, ...) and opaque configs."""

    key: str
    devices: tuple[str, ...]
    config: tuple[dict[str, Any], ...] = ()
    timeslice: int | None = None  # the nvidia-smi interval its whole GPUs get (None: not time-sliced)
    mps: bool = False  # one MPS control daemon for the claim


def mig_placement(device: str) -> tuple[int, int, int] | None:
    """(GPU minor, profile id, placement start) of a MIG device name; None for a whole GPU."""
    m = _MIG_NAME.match(device)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


# The claims the daemon is crashed on. All of them (and OTHERS) fit on the node at once: gpu-0 holds 1g@0, 1g@1,
# 2g@2, 2g@4 and 1g@6 (7 compute slices), so the soak can prepare any subset.
SCENARIOS: tuple[ClaimSpec, ...] = (
    ClaimSpec("gpu", ("gpu-1",)),
    ClaimSpec("mig", ("gpu-0-mig-1g10gb-19-0",)),
    ClaimSpec("mig-pair", ("gpu-0-mig-1g10gb-19-1", "gpu-0-mig-2g20gb-14-2")),
    ClaimSpec("timeslice", ("gpu-2",), (time_slicing("Long"),), timeslice=3),
    ClaimSpec(
        "mps",
        ("gpu-3", "gpu-4-mig-1g10gb-19-0"),
        (mps(50, "1Gi", requests=["r0"]), mps(50, kind="MigDeviceConfig", requests=["r1"])),
        mps=True,
    ),
)
# Prepared after a restart and before the retry: MIG partitions of gpu-0 of the sizes the scenarios use, so they
# get the GPU-instance ids an interrupted claim had (per-size id pools, handed out in order).
OTHERS: tuple[ClaimSpec, ...] = (
    ClaimSpec("other-mig", ("gpu-0-mig-1g10gb-19-6",)),
    ClaimSpec("other-mig-2g", ("gpu-0-mig-2g20gb-14-4",)),
)
ALL_SPECS: dict[str, ClaimSpec] = {s.key: s for s in (*SCENARIOS, *OTHERS)}


@dataclass(frozen=True)
class RecoverySetup:
    """What a start-up recovery finds: `key`'s `op` interrupted at `step`, plus an orphan MIG device (gpu-7),
    an orphan CDI spec and an orphan MPS directory with its daemon."""

    name: str
    key: str
    op: str  # "prepare" or "unprepare"
    step: str


RECOVERY_SETUPS: tuple[RecoverySetup, ...] = (
    RecoverySetup("recover/mig-pair", "mig-pair", "prepare", "prepare.cdi-written:1"),
    RecoverySetup("recover/mps", "mps", "prepare", "prepare.sharing-applied:1"),
    RecoverySetup("recover/mig-unprep", "mig", "unprepare", "unprepare.mig-destroyed:1"),
)
ORPHAN_GPU = 7  # index and minor of the GPU that gets an orphan MIG device


class ClusterClaims:
    """The harness's DeviceClasses and allocated ResourceClaims in a real API server (created once, reused by every
    trial: a claim is unprepared at the end of each trial)."""

    def __init__(self, cp: Any, node: str, prefix: str) -> None:
        self.cp = cp
        self.node = node
        self.prefix = prefix
        self.gpu_class = f"{prefix}-gpu"
        self.mig_class = f"{prefix}-mig"
        self.names: list[str] = []

    def _class(self, name: str, type_: str) -> dict[str, Any]:
        expr = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{type_}'"
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expr}}]},
        }

    def claim_object(self, spec: ClaimSpec, name: str) -> dict[str, Any]:
        requests = [
            {
                "name": f"r{i}",
                "exactly": {"deviceClassName": self.mig_class if mig_placement(d) else self.gpu_class},
            }
            for i, d in enumerate(spec.devices)
        ]
        results = [
            {"request": f"r{i}", "driver": DRIVER, "pool": self.node, "device": d} for i, d in enumerate(spec.devices)
        ]
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": requests}},
            "status": {"allocation": {"devices": {"results": results, "config": list(spec.config)}}},
        }

    def create(self, specs: Iterable[ClaimSpec]) -> dict[str, ClaimRef]:
        """Create the classes and one allocated claim per spec; their refs by spec key."""
        self.cp.apply(self._class(self.gpu_class, "gpu"), self._class(self.mig_class, "mig"))
        refs: dict[str, ClaimRef] = {}
        for key, obj in ((s.key, self.claim_object(s, f"{self.prefix}-{s.key}")) for s in specs):
            name = obj["metadata"]["name"]
            self.names.append(name)
            created = self.cp.create_allocated(obj)
            refs[key] = ClaimRef(namespace="default", name=name, uid=created["metadata"]["uid"])
        return refs

    def delete(self) -> None:
        with contextlib.suppress(KubectlError):  # best effort, after the trials
            self.cp.delete("resourceclaim", *self.names)
        with contextlib.suppress(KubectlError):
            self.cp.delete("deviceclass", self.gpu_class, self.mig_class)


# ----- the daemon -----------------------------------------------------------------------------------------------
class DaemonDied(RuntimeError):
    """The daemon went away during a call (the kill the trial asked for, or a crash)."""


class DaemonNode:
    """One simulated node and its daemon process, restarted at will. Every daemon traces the steps it reaches to
    its own file; `starts` counts the processes started."""

    def __init__(
        self,
        root: Path,
        kubeconfig: Path,
        node_name: str,
        zygote: Zygote | None = None,
        driver_root: Path = REPO_ROOT,
    ) -> None:
        self.root = root
        self.zygote = zygote  # None: `python -m dra_driver` for every start
        self.driver_root = driver_root  # whose dra_driver the daemon runs (the zygote's, with one)
        self.kubeconfig = kubeconfig
        self.node_name = node_name
        self.state = root / "gpu"
        self.plugin_dir = root / "plugin"
        self.cdi_root = root / "cdi"
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        # AF_UNIX paths are short: the registry lives under /tmp, not under the (long) test directory.
        self.registry_dir = Path(f"/tmp/dra-crash-{os.getpid()}-{uuidlib.uuid4().hex[:6]}")
        self.proc: subprocess.Popen[bytes] | ZygoteChild | None = None
        self.kubelet: KubeletHarness | None = None
        self.crash_at: str | None = None
        self.trace: Path | None = None
        self.log: Path | None = None
        self.starts = 0
        self.start_seconds: list[float] = []
        self._sim: SimulatedNvml | None = None

    # -- process
    @property
    def reg_socket(self) -> Path:
        return self.registry_dir / f"{DRIVER}-reg.sock"

    def arguments(self) -> list[str]:
        """`dra-driver` arguments of this node's daemon."""
        return ["plugin", "--sim", MACHINE, "--sim-state", str(self.state),
                "--mode", "partitionable", "--node-name", self.node_name, "--kubeconfig", str(self.kubeconfig),
                "--plugin-dir", str(self.plugin_dir), "--registry-dir", str(self.registry_dir),
                "--cdi-root", str(self.cdi_root),
                "--feature-gates", "DeviceMetadata=true"]  # its steps' crash points too  # fmt: skip

    def start(self, crash_at: str | None = None, *, expect_death: bool = False) -> bool:
        """Start a daemon (armed to kill itself at `crash_at`) and register with it; False when it died before
        it served (a crash in start-up recovery: `expect_death`)."""
        self.stop()
        self.starts += 1
        n = self.starts
        self.trace = self.logs / f"trace-{n:03d}.txt"
        self.log = self.logs / f"daemon-{n:03d}.log"
        path = os.pathsep.join(filter(None, [str(self.driver_root), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, crashpoints.TRACE_ENV: str(self.trace), "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
        env.pop(crashpoints.CRASH_AT_ENV, None)
        if crash_at:
            env[crashpoints.CRASH_AT_ENV] = crash_at
        self.crash_at = crash_at
        stale = socket_id(self.reg_socket)
        began = time.monotonic()
        if self.zygote is not None:
            self.proc = self.zygote.spawn(self.arguments(), env, self.log, self.driver_root)
        else:
            with open(self.log, "wb") as out:
                self.proc = subprocess.Popen([sys.executable, "-m", "dra_driver", *self.arguments()], stdout=out,
                                             stderr=subprocess.STDOUT, env=env, cwd=self.driver_root,
                                             preexec_fn=die_with_parent)  # fmt: skip
        deadline = began + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                if expect_death:
                    return False
                raise RuntimeError(f"daemon exited with {self.proc.returncode} at start:\n{self.log_tail()}")
            current = socket_id(self.reg_socket)
            if current is not None and current != stale:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"daemon did not serve within {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}")
            time.sleep(0.02)
        self.kubelet = KubeletHarness(self.registry_dir, DRIVER)
        try:
            self.kubelet.register(timeout=START_TIMEOUT_S)
        except Exception:
            if self.proc.poll() is not None and expect_death:
                return False
            raise
        self.start_seconds.append(time.monotonic() - began)
        return True

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout: float = EXIT_TIMEOUT_S) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL from outside."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=EXIT_TIMEOUT_S)

    def stop(self, *, graceful: bool = False) -> None:
        """Stop the current daemon, if any. It is idle (no call in flight): SIGKILL by default, since a SIGTERM
        takes about 4.5 s (the health monitor's thread is joined); `graceful`: SIGTERM, SIGKILL if it lingers."""
        if self.kubelet is not None:
            self.kubelet.close()
            self.kubelet = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=EXIT_TIMEOUT_S)
        self.proc = None

    def ensure(self, crash_at: str | None = None) -> None:
        """A daemon armed with exactly `crash_at` (None: unarmed) is running."""
        if not (self.alive() and self.crash_at == crash_at and self.kubelet is not None):
            self.start(crash_at)

    def close(self) -> None:
        self.stop()
        stop_daemons(self.state)  # MPS daemons are processes of their own: a failed trial may leave some
        shutil.rmtree(self.registry_dir, ignore_errors=True)

    def wipe(self) -> None:
        """Stop the daemon and forget the node's state (after a failed trial, so the next starts clean)."""
        self.stop()
        for d in (self.state, self.plugin_dir, self.cdi_root, self.registry_dir):
            shutil.rmtree(d, ignore_errors=True)
        self._sim = None

    def log_tail(self, lines: int = 25) -> str:
        if self.log is None or not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").rstrip().splitlines()[-lines:])

    def trace_lines(self) -> list[str]:
        if self.trace is None or not self.trace.exists():
            return []
        return [line for line in self.trace.read_text().splitlines() if line]

    # -- kubelet calls: None when the daemon died during the call
    def _call(self, fn: Callable[[], Any]) -> Any:
        if self.kubelet is None:
            raise DaemonDied("no daemon is serving")
        try:
            return fn()
        except grpc.RpcError as e:
            if self.wait_exit(EXIT_TIMEOUT_S if self.crash_at else 2.0) is not None:
                raise DaemonDied(f"daemon exited with {self.proc.returncode if self.proc else '?'}") from e
            raise

    def prepare(self, refs: list[ClaimRef]) -> dict[str, PrepareAnswer]:
        return self._call(lambda: self.kubelet.prepare(refs))  # type: ignore[union-attr]

    def unprepare(self, refs: list[ClaimRef]) -> dict[str, str]:
        return self._call(lambda: self.kubelet.unprepare(refs))  # type: ignore[union-attr]

    # -- what is on the node
    @property
    def sim(self) -> SimulatedNvml:
        if self._sim is None:
            self._sim = SimulatedNvml(MACHINE, self.state)
        return self._sim

    def gpu_uuid(self, minor: int) -> str:
        return self.sim.gpu_uuids[self.sim.minors.index(minor)]

    def checkpoint_claims(self) -> dict[str, Any]:
        """The checkpoint's claims by uid ({} without a checkpoint); raises ValueError on an unreadable file."""
        path = self.plugin_dir / "checkpoint.json"
        if not path.exists():
            return {}
        doc = json.loads(path.read_text())
        return dict(doc["data"].get("claims") or {})

    def mig_instances(self) -> list[dict[str, Any]]:
        """Every GPU instance now, with its compute instances."""
        state = self.sim.store.read()
        out = []
        for index, gpu in enumerate(state.gpus):
            for gi in gpu.gpu_instances:
                out.append(
                    {
                        "gpu_uuid": self.sim.gpu_uuids[index],
                        "minor": self.sim.minors[index],
                        "gi_id": gi.id,
                        "profile_id": gi.profile_id,
                        "start": gi.start,
                        "cis": [(ci.id, ci.uuid) for ci in gi.compute_instances],
                    }
                )
        return out

    def cdi_files(self) -> list[str]:
        return sorted(p.name for p in self.cdi_root.glob("*.json")) if self.cdi_root.is_dir() else []

    def sharing_state(self) -> dict[str, Any]:
        state = SharingState(self.state)
        data = state.read()
        data["mps"] = state.daemons()  # the daemons that run (a killed one leaves its record)
        return data

    def mps_dirs(self) -> list[str]:
        root = self.plugin_dir / "mps"
        return sorted(p.name for p in root.iterdir()) if root.is_dir() else []

    # -- leftovers for start-up recovery
    def inject_orphans(self) -> str:
        """An orphan MIG device on gpu-7 (1g@0), an orphan CDI spec and an orphan MPS directory whose (simulated)
        daemon runs: what an older, crashed process or an operator left. Returns the orphan claim uid."""
        orphan = f"orphan-{uuidlib.uuid4()}"
        sim = self.sim
        sim.nvmlInit()
        try:
            handle = sim.nvmlDeviceGetHandleByIndex(ORPHAN_GPU)
            if not sim.nvmlDeviceGetMigMode(handle)[0]:
                sim.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE)
            placement = pynvml.c_nvmlGpuInstancePlacement_t(0, 1)
            gi = sim.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 19, ctypes.byref(placement))
            info = sim.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
            sim.nvmlGpuInstanceCreateComputeInstance(gi, info.id)
        finally:
            sim.nvmlShutdown()
        self.cdi_root.mkdir(parents=True, exist_ok=True)
        (self.cdi_root / f"k8s.{DRIVER}-claim_{orphan}.json").write_text(
            json.dumps({"cdiVersion": "0.6.0", "kind": f"k8s.{DRIVER}/claim", "devices": []})
        )
        pipe = self.plugin_dir / "mps" / orphan / "pipe"
        pipe.mkdir(parents=True)
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_VISIBLE_DEVICES": self.gpu_uuid(5)}
        started = DriverRootRunner(sim.driver_root).run(["nvidia-cuda-mps-control", "-d"], env=env)
        if started.returncode != 0:
            raise RuntimeError(f"orphan MPS daemon did not start: {started.stderr}")
        return orphan


# ----- invariants -----------------------------------------------------------------------------------------------
@dataclass
class Failure:
    trial: str
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.trial}] {self.invariant}: {self.detail}"


@dataclass
class Answer:
    """What the kubelet got from a successful prepare of a claim."""

    cdi_ids: dict[str, tuple[str, ...]]  # device -> CDI ids
    mig_uuids: dict[str, str] = field(default_factory=dict)  # device -> MIG UUID in the checkpoint right after


def _answer_ids(result: PrepareAnswer) -> dict[str, tuple[str, ...]]:
    return {d.device: tuple(d.cdi_device_ids) for d in result.devices}


class Checker:
    """Runs the kubelet's calls for a trial and checks the invariants; failures accumulate in `failures`."""

    def __init__(self, node: DaemonNode, refs: dict[str, ClaimRef]) -> None:
        self.node = node
        self.refs = refs
        self.by_uid = {r.uid: k for k, r in refs.items()}
        self.failures: list[Failure] = []
        self.answers: dict[str, Answer] = {}  # key -> last successful prepare's answer (prepared claims)
        self.trial = ""

    def fail(self, invariant: str, detail: str) -> None:
        self.failures.append(Failure(self.trial, invariant, detail))

    def _name(self, uid: str) -> str:
        return self.by_uid.get(uid, uid)

    # -- kubelet calls
    def prepare(self, keys: Sequence[str], what: str = "prepare") -> bool:
        """Prepare `keys` in one call; record the answers. False (and a failure) if any claim failed."""
        refs = [self.refs[k] for k in keys]
        return self.record(keys, self.node.prepare(refs), what)

    def record(self, keys: Sequence[str], out: dict[str, PrepareAnswer], what: str = "prepare") -> bool:
        """Take note of a prepare's answers (and of the MIG UUIDs the checkpoint has for them now)."""
        ok = True
        claims = None
        for k in keys:
            result = out.get(self.refs[k].uid)
            if result is None or result.error:
                self.fail(what, f"prepare of {k} failed: {result.error if result else 'no answer'}")
                ok = False
                continue
            if claims is None:
                claims = self._checkpoint_or_fail()
            entry = (claims or {}).get(self.refs[k].uid) or {}
            migs = {d.get("device"): (d.get("mig") or {}).get("uuid") for d in entry.get("devices") or []}
            self.answers[k] = Answer(_answer_ids(result), {d: u for d, u in migs.items() if u})
        return ok

    def unprepare(self, keys: Sequence[str], what: str = "unprepare") -> bool:
        refs = [self.refs[k] for k in keys]
        out = self.node.unprepare(refs)
        ok = True
        for k, r in zip(keys, refs, strict=True):
            error = out.get(r.uid, "no answer")
            if error:
                self.fail(what, f"unprepare of {k} failed: {error}")
                ok = False
            else:
                self.answers.pop(k, None)
        return ok

    def _checkpoint_or_fail(self) -> dict[str, Any] | None:
        try:
            return self.node.checkpoint_claims()
        except (ValueError, KeyError, TypeError) as e:
            self.fail("g checkpoint", f"unreadable checkpoint: {e}")
            return None

    # -- invariants
    def check_recovered(self) -> None:
        """Right after a restart: whatever the checkpoint holds is PrepareCompleted and matches the node."""
        claims = self._checkpoint_or_fail()
        if claims is None:
            return
        unfinished = {self._name(u): e.get("state") for u, e in claims.items() if e.get("state") != COMPLETED}
        if unfinished:
            self.fail("g checkpoint", f"after start-up recovery, entries not PrepareCompleted: {unfinished}")
        self._check_node(claims, {self._name(u) for u, e in claims.items() if e.get("state") == COMPLETED})

    def check_prepared(self, expected: set[str], others: Sequence[str] = ()) -> None:
        """Exactly `expected` (keys) are prepared, consistently on every side; `others` are intact."""
        claims = self._checkpoint_or_fail()
        if claims is None:
            return
        states = {self._name(u): e.get("state") for u, e in claims.items()}
        if states != dict.fromkeys(expected, COMPLETED):
            self.fail("g checkpoint", f"entries {sorted(states.items())}, expected {sorted(expected)} completed")
        self._check_node(claims, expected)
        # (d) the other claims kept their MIG devices
        live = {ci_uuid for g in self.node.mig_instances() for _, ci_uuid in g["cis"]}
        for k in others:
            answer = self.answers.get(k)
            entry = claims.get(self.refs[k].uid) or {}
            recorded = {d.get("device"): (d.get("mig") or {}).get("uuid") for d in entry.get("devices") or []}
            for device, mig_uuid in (answer.mig_uuids if answer else {}).items():
                if mig_uuid not in live:
                    self.fail("d others", f"{k}'s MIG device {device} ({mig_uuid}) is gone from the GPU")
                if recorded.get(device) != mig_uuid:
                    self.fail("d others", f"{k}'s {device} recorded as {recorded.get(device)}, was {mig_uuid}")
        # (c) a repeated prepare answers the same ids
        keys = sorted(expected)
        if keys:
            before = self.node.mig_instances()
            out = self.node.prepare([self.refs[k] for k in keys])
            if self.node.mig_instances() != before:
                self.fail("c idempotent", "a repeated prepare of prepared claims changed the MIG devices")
            for k in keys:
                result = out.get(self.refs[k].uid)
                if result is None or result.error:
                    self.fail("c idempotent", f"repeated prepare of {k} failed: {result.error if result else '-'}")
                elif k in self.answers and _answer_ids(result) != self.answers[k].cdi_ids:
                    self.fail("c idempotent", f"{k}: {_answer_ids(result)} now, {self.answers[k].cdi_ids} before")

    def _check_node(self, claims: dict[str, Any], prepared: set[str]) -> None:
        """(a) MIG, (b) CDI, (f) sharing against the checkpoint's completed entries and the prepared keys."""
        node = self.node
        completed = {u: e for u, e in claims.items() if e.get("state") == COMPLETED}
        # (a) MIG devices: exactly the completed entries', same ids and UUIDs, at the device's placement
        owned: dict[tuple[str, int], tuple[int, str, str, str]] = {}
        for u, e in completed.items():
            for d in e.get("devices") or []:
                mig, device = d.get("mig"), str(d.get("device"))
                if mig and not d.get("released") and not d.get("admin_access"):
                    where = (mig["parent_uuid"], mig["gi_id"])
                    if where in owned:
                        self.fail("a mig", f"{self._name(u)}'s {device} and {owned[where][3]}'s {owned[where][2]} "
                                  f"both record GPU instance {where[1]} of {where[0]}")  # fmt: skip
                    owned[where] = (mig["ci_id"], mig["uuid"], device, self._name(u))
                elif mig_placement(device) and not d.get("admin_access"):
                    self.fail("a mig", f"{self._name(u)} is completed but records no MIG device for {device}")
        live = {(g["gpu_uuid"], g["gi_id"]): g for g in node.mig_instances()}
        for where, g in sorted(live.items()):
            have = owned.get(where)
            shape = f"GPU instance {g['gi_id']} (profile {g['profile_id']} at {g['start']}) on gpu-{g['minor']}"
            if have is None:
                self.fail("a mig", f"{shape} with compute instances {g['cis']}: no completed claim owns it")
                continue
            ci_id, mig_uuid, device, owner = have
            if g["cis"] != [(ci_id, mig_uuid)]:
                self.fail("a mig", f"{shape} of {owner}/{device} has {g['cis']}, checkpoint says {(ci_id, mig_uuid)}")
            place = mig_placement(device)
            if place and (place[0], place[1], place[2]) != (g["minor"], g["profile_id"], g["start"]):
                self.fail("a mig", f"{shape} is recorded for {owner}'s {device}")
        for where, (_, mig_uuid, device, owner) in sorted(owned.items()):
            if where not in live:
                self.fail("a mig", f"{owner}'s {device} ({mig_uuid}, GPU instance {where[1]}) does not exist")
        # (b) CDI specs: one per prepared claim; no temp file of an interrupted write; device metadata (mounted by
        # the spec) for exactly the prepared claims
        metadata_dir = node.plugin_dir / "dra-device-metadata"
        with_metadata = {p.name.rsplit("_", 1)[-1] for p in metadata_dir.iterdir()} if metadata_dir.is_dir() else set()
        if with_metadata != {self.refs[k].uid for k in prepared if k in self.refs}:
            self.fail(
                "b cdi", f"device metadata of {sorted(map(self._name, with_metadata))}, prepared: {sorted(prepared)}"
            )
        files = node.cdi_files()
        temp = sorted(p.name for p in node.cdi_root.glob(".*.tmp")) if node.cdi_root.is_dir() else []
        if temp:
            self.fail("b cdi", f"temp files of interrupted writes left: {temp}")
        uids = {self.refs[k].uid: k for k in prepared if k in self.refs}
        for name in files:
            owners = [k for u, k in uids.items() if u in name]
            if not owners:
                self.fail("b cdi", f"CDI spec {name} belongs to no prepared claim")
        for u, k in uids.items():
            mine = [f for f in files if u in f]
            if len(mine) != 1:
                self.fail("b cdi", f"{k} has {len(mine)} CDI spec files ({mine})")
            elif k in self.answers:
                defined = self._spec_devices(node.cdi_root / mine[0])
                for ids in self.answers[k].cdi_ids.values():
                    for cdi_id in ids:
                        if cdi_id.split("=", 1)[-1] not in defined:
                            self.fail("c idempotent", f"{k}: CDI id {cdi_id} is not defined in {mine[0]}")
        # (f) sharing: time slices and MPS daemons of exactly the prepared claims that ask for them
        sharing = node.sharing_state()
        want_slices = {}
        want_mps: dict[str, set[str]] = {}
        for k in prepared:
            spec = ALL_SPECS.get(k)
            if spec is None:
                continue
            if spec.timeslice is not None:
                for d in spec.devices:
                    if not mig_placement(d):
                        want_slices[node.gpu_uuid(int(d.split("-")[1]))] = spec.timeslice
            if spec.mps:
                entry = completed.get(self.refs[k].uid) or {}
                migs = {d.get("device"): (d.get("mig") or {}).get("uuid") for d in entry.get("devices") or []}
                want_mps[self.refs[k].uid] = {
                    str(migs.get(d)) if mig_placement(d) else node.gpu_uuid(int(d.split("-")[1])) for d in spec.devices
                }
        slices = {u: v for u, v in sharing["timeslice"].items() if v}
        if slices != want_slices:
            self.fail("f sharing", f"time slices {slices}, expected {want_slices}")
        daemons: dict[str, set[str]] = {}
        mps_root = node.plugin_dir / "mps"
        for pipe, daemon in sharing["mps"].items():
            owner = Path(pipe).relative_to(mps_root).parts[0] if Path(pipe).is_relative_to(mps_root) else pipe
            if owner in daemons:
                self.fail("f sharing", f"two MPS daemons for claim {self._name(owner)}")
            daemons[owner] = set(daemon.get("visible") or [])
        if daemons != want_mps:
            got = {self._name(u): sorted(v) for u, v in daemons.items()}
            want = {self._name(u): sorted(v) for u, v in want_mps.items()}
            self.fail("f sharing", f"MPS daemons {got}, expected {want}")
        dirs = set(node.mps_dirs())
        if dirs != set(want_mps):
            got_dirs = sorted(self._name(d) for d in dirs)
            self.fail("f sharing", f"MPS directories {got_dirs}, expected {sorted(self._name(u) for u in want_mps)}")

    @staticmethod
    def _spec_devices(path: Path) -> set[str]:
        try:
            return {str(d.get("name")) for d in json.loads(path.read_text()).get("devices") or []}
        except (OSError, ValueError):
            return set()

    def check_clean(self) -> None:
        """(e) after everything is unprepared."""
        node = self.node
        claims = self._checkpoint_or_fail()
        left = []
        if claims:
            left.append(f"checkpoint entries {sorted((self._name(u), e.get('state')) for u, e in claims.items())}")
        migs = node.mig_instances()
        if migs:
            left.append("MIG instances " + ", ".join(f"gpu-{g['minor']}/gi{g['gi_id']}{g['cis']}" for g in migs))
        if node.cdi_files():
            left.append(f"CDI specs {node.cdi_files()}")
        metadata_dir = node.plugin_dir / "dra-device-metadata"
        if metadata_dir.is_dir() and any(metadata_dir.iterdir()):
            left.append(f"device metadata {sorted(p.name for p in metadata_dir.iterdir())}")
        if node.mps_dirs():
            left.append(f"MPS directories {[self._name(d) for d in node.mps_dirs()]}")
        state = node.sim.store.read()
        changed = [
            f"gpu-{node.sim.minors[i]}"
            for i, g in enumerate(state.gpus)
            if bool(g.mig_current) != node.sim.spec.gpus[i].mig_enabled
        ]
        if changed:
            left.append(f"MIG mode switched from the machine's default on {changed}")
        sharing = node.sharing_state()
        if sharing["mps"]:
            left.append(f"MPS daemons {sorted(sharing['mps'])}")
        if any(sharing["timeslice"].values()):
            left.append(f"time slices {sharing['timeslice']}")
        if left:
            self.fail("e clean", "; ".join(left))


# ----- trials ---------------------------------------------------------------------------------------------------
def parse_step(target: str) -> tuple[str, int]:
    name, _, nth = target.partition(":")
    return name, int(nth or 1)


def occurrences(lines: Sequence[str], prefix: str) -> list[str]:
    """`step:n` for each time a step with this prefix was reached, in order."""
    seen: Counter[str] = Counter()
    out = []
    for line in lines:
        if line.startswith(prefix):
            seen[line] += 1
            out.append(f"{line}:{seen[line]}")
    return out


@dataclass
class ScenarioReport:
    name: str
    reached: dict[str, list[str]] = field(default_factory=dict)  # "prepare"/"unprepare"/"recover" -> step:n
    trials: int = 0
    crashed: list[str] = field(default_factory=list)  # step:n where a trial's daemon died as asked
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0

    def steps(self, phase: str) -> set[str]:
        return {parse_step(s)[0] for s in self.reached.get(phase, [])}


class CrashMatrix:
    """A SIGKILL at every step a scenario reaches: the scenario is run once to learn the steps (trace file), then
    once per step:n with the daemon armed to kill itself there."""

    def __init__(
        self, node: DaemonNode, refs: dict[str, ClaimRef], log: Callable[[str], None] = lambda _: None
    ) -> None:
        self.node = node
        self.checker = Checker(node, refs)
        self.log = log
        self.reports: list[ScenarioReport] = []
        self.other_keys = [s.key for s in OTHERS]

    # -- helpers
    def _trial(self, report: ScenarioReport, trial: str, body: Callable[[], None]) -> None:
        """Run one trial; any failure (or error) leaves a clean node for the next one."""
        report.trials += 1
        c = self.checker
        c.trial = f"{report.name} {trial}"
        before = len(c.failures)
        try:
            body()
        except Exception as e:
            c.fail("error", f"{type(e).__name__}: {e}\n{self.node.log_tail(15)}")
        new = c.failures[before:]
        report.failures.extend(new)
        for f in new:
            self.log(f"FAIL {f}")
        if new:
            c.answers.clear()
            self.node.wipe()

    def _expect_kill(self, report: ScenarioReport, target: str) -> None:
        """The daemon armed at `target` must have killed itself there."""
        rc = self.node.wait_exit(EXIT_TIMEOUT_S)
        if rc is None:
            self.checker.fail("crash", f"the daemon armed at {target} did not die (step not reached)")
            return
        last = (self.node.trace_lines() or ["(none)"])[-1]
        if rc != -signal.SIGKILL or last != parse_step(target)[0]:
            self.checker.fail("crash", f"armed at {target}: exit {rc}, last step traced {last}")
        report.crashed.append(target)

    def _interrupt(self, key: str, op: str, target: str) -> None:
        """`op` of `key` on a daemon armed at `target` (the kubelet gets no answer)."""
        self.node.ensure(target)
        ref = self.checker.refs[key]
        with contextlib.suppress(DaemonDied):
            if op == "prepare":
                self.node.prepare([ref])
            else:
                self.node.unprepare([ref])
        self.checker.answers.pop(key, None)

    def _retry_and_check(self, key: str, op: str) -> None:
        """After the kill: restart, prepare the other claims, retry `op` of `key`, check, unprepare all, check."""
        c = self.checker
        self.node.ensure(None)
        c.check_recovered()
        c.prepare(self.other_keys, "prepare others")
        if op == "prepare":
            c.prepare([key], "retry")
            expected = {key, *self.other_keys}
        else:
            c.unprepare([key], "retry")
            expected = set(self.other_keys)
        c.check_prepared(expected, self.other_keys)
        c.unprepare(sorted(expected | {key}), "final unprepare")
        c.check_clean()

    # -- scenarios
    def run_scenario(self, spec: ClaimSpec) -> ScenarioReport:
        began = time.monotonic()
        report = ScenarioReport(spec.key)
        self.reports.append(report)
        c, key = self.checker, spec.key

        def dry_run() -> None:  # prepare and unprepare once with the others around; learn the steps
            self.node.ensure(None)
            mark = len(self.node.trace_lines())
            c.prepare([key], "prepare")
            report.reached["prepare"] = occurrences(self.node.trace_lines()[mark:], "prepare.")
            c.prepare(self.other_keys, "prepare others")
            c.check_prepared({key, *self.other_keys}, self.other_keys)
            mark = len(self.node.trace_lines())
            c.unprepare([key], "unprepare")
            report.reached["unprepare"] = occurrences(self.node.trace_lines()[mark:], "unprepare.")
            c.check_prepared(set(self.other_keys), self.other_keys)
            c.unprepare(self.other_keys, "final unprepare")
            c.check_clean()

        def prepare_trial(target: str) -> None:
            self._interrupt(key, "prepare", target)
            self._expect_kill(report, target)
            self._retry_and_check(key, "prepare")

        def unprepare_trial(target: str) -> None:
            self.node.ensure(None)
            if c.prepare([key], "setup prepare"):
                self._interrupt(key, "unprepare", target)
                self._expect_kill(report, target)
                self._retry_and_check(key, "unprepare")

        self._trial(report, "dry run", dry_run)
        for target in report.reached.get("prepare", []):
            self._trial(report, f"kill at {target}", lambda t=target: prepare_trial(t))  # type: ignore[misc]
        for target in report.reached.get("unprepare", []):
            self._trial(report, f"kill at {target}", lambda t=target: unprepare_trial(t))  # type: ignore[misc]
        report.seconds = time.monotonic() - began
        self.log(f"{spec.key}: {report.trials} trials, {len(report.failures)} failures, {report.seconds:.0f} s")
        return report

    # -- start-up recovery
    def _leftovers(self, setup: RecoverySetup) -> None:
        """Interrupt `setup.op` of its claim at `setup.step`, then add orphans (the daemon is down after)."""
        if setup.op == "unprepare":
            self.node.ensure(None)
            if not self.checker.prepare([setup.key], "setup prepare"):
                return
        self._interrupt(setup.key, setup.op, setup.step)
        if self.node.wait_exit(EXIT_TIMEOUT_S) is None:
            self.log(f"{setup.name}: setup step {setup.step} not reached")
        self.node.stop()
        self.node.inject_orphans()

    def recovery(self, setup: RecoverySetup) -> ScenarioReport:
        began = time.monotonic()
        report = ScenarioReport(setup.name)
        self.reports.append(report)

        def dry_run() -> None:
            self._leftovers(setup)
            self.node.start(None)
            report.reached["recover"] = occurrences(self.node.trace_lines(), "recover.")
            self._retry_and_check(setup.key, setup.op)

        def trial(target: str) -> None:
            self._leftovers(setup)
            if self.node.start(target, expect_death=True):
                self.checker.fail("crash", f"the daemon armed at {target} served (step not reached)")
            else:
                self._expect_kill(report, target)
            self._retry_and_check(setup.key, setup.op)

        self._trial(report, "dry run", dry_run)
        for target in report.reached.get("recover", []):
            self._trial(report, f"kill at {target}", lambda t=target: trial(t))  # type: ignore[misc]
        report.seconds = time.monotonic() - began
        self.log(f"{setup.name}: {report.trials} trials, {len(report.failures)} failures, {report.seconds:.0f} s")
        return report

    def failures(self) -> list[Failure]:
        return [f for r in self.reports for f in r.failures]


def reached_steps(reports: Sequence[ScenarioReport]) -> set[str]:
    return {parse_step(s)[0] for r in reports for steps in r.reached.values() for s in steps}


def summary_table(reports: Sequence[ScenarioReport], nodes: Sequence[DaemonNode], seconds: float | None = None) -> str:
    """Scenario, steps reached per phase, trials, kills, failures, time; then what no scenario reached and the
    failures."""
    phases = ("prepare", "unprepare", "recover")
    rows: list[tuple[str, ...]] = [
        ("scenario", "prepare", "unprepare", "recovery", "trials", "killed", "failures", "seconds")
    ]
    for r in reports:
        steps = [str(len(r.steps(p))) if p in r.reached else "-" for p in phases]
        rows.append((r.name, *steps, str(r.trials), str(len(r.crashed)), str(len(r.failures)), f"{r.seconds:.0f}"))
    failures = [f for r in reports for f in r.failures]
    rows.append(
        (
            "total",
            *(str(len({s for r in reports for s in r.steps(p)})) for p in phases),
            str(sum(r.trials for r in reports)),
            str(sum(len(r.crashed) for r in reports)),
            str(len(failures)),
            f"{seconds:.0f}" if seconds is not None else "",
        )
    )
    lines = format_table(rows, total=True)
    missing = [s for s in ALL_POINTS if s not in reached_steps(reports)]
    lines.append(
        "prepare/unprepare/recovery: distinct steps reached (of "
        f"{len(PREPARE_POINTS)}/{len(TEARDOWN_POINTS)}/{len(RECOVERY_POINTS)}); "
        "killed: trials whose daemon died at its step; seconds: wall time (scenarios run in parallel)"
    )
    lines.append("steps not reached by any scenario: " + (", ".join(missing) if missing else "none"))
    serve = statistics.median([t for n in nodes for t in n.start_seconds] or [0.0])
    lines.append(f"daemon starts: {sum(n.starts for n in nodes)}, median time to serve {serve:.2f} s")
    if failures:
        lines.append(f"failures ({len(failures)}):")
        lines.extend(f"  {f}" for f in failures)
    return "\n".join(lines)


def run_matrix(
    cp: Any,
    root: Path,
    node_prefix: str,
    *,
    only: set[str] | None = None,
    workers: int = 2,
    driver_root: Path = REPO_ROOT,
    zygote: bool = True,
    log: Callable[[str], None] = lambda _: None,
) -> tuple[list[ScenarioReport], list[DaemonNode]]:
    """Every scenario and recovery setup (or those named in `only`), on `workers` nodes in parallel (each its
    own Node object, pool, claims, simulated GPUs and daemon); reports in the order of SCENARIOS, RECOVERY_SETUPS."""
    jobs: list[tuple[str, ClaimSpec | RecoverySetup]] = [(s.key, s) for s in SCENARIOS]
    jobs += [(r.name, r) for r in RECOVERY_SETUPS]
    jobs = [j for j in jobs if not only or j[0] in only]
    order = [name for name, _ in jobs]
    # longest first: the scenarios with more devices reach more steps
    queue = sorted(jobs, key=lambda j: -(len(j[1].devices) * 10 if isinstance(j[1], ClaimSpec) else 5))
    lock = threading.Lock()
    reports: dict[str, ScenarioReport] = {}
    nodes: list[DaemonNode] = []
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        name = f"{node_prefix}-{index}"
        suffix = uuidlib.uuid4().hex[:6]
        claims = ClusterClaims(cp, name, f"{node_prefix}-{index}-{suffix}")
        spawner = Zygote(driver_root) if zygote else None
        node = DaemonNode(root / name, cp.kubeconfig, name, spawner, driver_root)
        with lock:
            nodes.append(node)
        try:
            cp.create_node(name)
            matrix = CrashMatrix(node, claims.create(ALL_SPECS.values()), log)
            while True:
                with lock:
                    if not queue:
                        return
                    _, job = queue.pop(0)
                report = matrix.run_scenario(job) if isinstance(job, ClaimSpec) else matrix.recovery(job)
                with lock:
                    reports[report.name] = report
        except BaseException as e:
            errors.append(e)
        finally:
            node.close()
            if spawner is not None:
                spawner.close()
            claims.delete()
            with contextlib.suppress(KubectlError):
                cp.delete("resourceslices", field_selector=f"spec.nodeName={name}")
            cp.delete_node(name)

    threads = [threading.Thread(target=worker, args=(i,), name=f"crash-{i}") for i in range(max(1, workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [reports[n] for n in order if n in reports], nodes


def format_table(rows: Sequence[Sequence[str]], *, total: bool = False) -> list[str]:
    """Columns padded to fit: the first left-aligned, the rest right-aligned; rules under the head (and above a
    total row)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in rows
    ]
    rule = "-" * len(lines[0])
    lines.insert(1, rule)
    if total:
        lines.insert(len(lines) - 1, rule)
    return lines


def crash_points_wired() -> bool:
    """Whether the driver calls the crash-point hook at all (some module other than crashpoints names it)."""
    package = REPO_ROOT / "dra_driver"
    return any(
        "crashpoints" in p.read_text(errors="replace") for p in package.rglob("*.py") if p.name != "crashpoints.py"
    )
