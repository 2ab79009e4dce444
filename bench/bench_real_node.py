"""The real node (tests/cluster: control plane + containerd + runc + kubelet on this machine) with the driver deployed
from its image by its Helm chart, simulated GPUs:

1. pod create to Running, a pod with a one-GPU claim (from a ResourceClaimTemplate: the claim is created, allocated by
   the scheduler and prepared by the kubelet through the driver, its CDI spec applied by containerd) against the same
   pod without a claim: --pairs pairs, interleaved (claim, plain, claim, plain, ...), both pods deleted (and the
   generated claim gone) before the next pair. Times are taken here, from just before the create call to the watch
   event that shows the pod Running.
2. driver restart: the driver pod deleted --restarts times (the DaemonSet creates a new one); from the new pod's
   creation (its ADDED watch event) to its container started (the first watch event that shows it running), to
   the kubelet's "Registered DRA plugin" log line (the kubelet's own timestamp), and to the new driver's first
   publish of the node's slices (its `dra_driver_publish_total` counter, polled on its metrics port: `published`
   when it wrote slices, `unchanged` when the slices it found were already right).

Client limits: the kubelet's API client (`kubeAPIQPS`/`kubeAPIBurst`, 50/100 by default) and kube-scheduler's
(`clientConnection` QPS/burst, 50/100) could cap a figure; both run raised to 5000/5000 unless --as-deployed, and
the limits in force are printed with the table (the kubelet's from its /configz, the scheduler's from its own).

Run: python bench/bench_real_node.py [--pairs 20] [--restarts 5] [--machine dgx-h100] [--as-deployed]. Needs root
(a real node). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scheduler import Scheduler  # its scheduler client (/configz)

from tests.cluster import images
from tests.cluster.controlplane import SCHEDULER_DEFAULT_CLIENT, ClientLimits, ControlPlane
from tests.cluster.driver import DRIVER_NAME, DriverRelease
from tests.cluster.node import NODE_CONTROLLERS, Node, node_unavailable_reason

NS = "bench"
GPU_CLASS = DRIVER_NAME  # deviceclasses/gpu.yaml, installed by the chart
KLOG_TIME = re.compile(r"^[IWEF](\d{4}) (\d{2}:\d{2}:\d{2}\.\d{6})")


def workload_pod(name: str, *, claim: bool) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "show",
        "image": images.WORKLOAD_IMAGE,
        "imagePullPolicy": "Never",
        "command": [images.SHOW_DEVICES],
    }
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1,
        "automountServiceAccountToken": False,
        "tolerations": [{"key": f"{DRIVER_NAME}/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container],
    }
    if claim:
        container["resources"] = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def one_gpu_template() -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": GPU_CLASS}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def is_running(pod: Any) -> bool:
    return bool(pod.status and pod.status.phase == "Running")


def container_started(pod: Any) -> bool:
    statuses = (pod.status and pod.status.container_statuses) or []
    return any(s.state and s.state.running for s in statuses)


def is_ready(pod: Any) -> bool:
    conditions = (pod.status and pod.status.conditions) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


class Bench:
    def __init__(self, release: DriverRelease) -> None:
        from kubernetes import client, config

        self.release = release
        self.cp = release.cp
        self.node = release.node
        api = config.new_client_from_config(config_file=str(self.cp.kubeconfig))
        self.core = client.CoreV1Api(api)

    # -- 1. pod create to Running -----------------------------------------------------------------

    def create_to_running(self, name: str, *, claim: bool, timeout: float = 120.0) -> float:
        from kubernetes import watch

        body = workload_pod(name, claim=claim)
        began = time.perf_counter()
        created = self.core.create_namespaced_pod(NS, body)
        w = watch.Watch()
        try:
            for event in w.stream(
                self.core.list_namespaced_pod,
                NS,
                field_selector=f"metadata.name={name}",
                resource_version=created.metadata.resource_version,
                timeout_seconds=int(timeout),
            ):
                if is_running(event["object"]):
                    return time.perf_counter() - began
        finally:
            w.stop()
        described = self.cp.kubectl("describe", "pod", name, "-n", NS, check=False).stdout
        raise RuntimeError(f"pod {name} not Running within {timeout:.0f}s:\n{described[-3000:]}")

    def seen_devices(self, name: str) -> str:
        """The NVIDIA device nodes the workload printed (tests/cluster/images.py show-devices)."""
        deadline = time.monotonic() + 30
        while True:
            out = self.cp.kubectl("logs", "-n", NS, name, check=False).stdout.strip().splitlines()
            if out or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if not out:
            return "nothing (no output)"
        devices = [d["path"] for d in json.loads(out[-1])["devices"]]
        return ", ".join(devices) or "no NVIDIA device"

    def delete_and_wait(self, names: list[str], timeout: float = 120.0) -> None:
        for name in names:
            self.core.delete_namespaced_pod(name, NS)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pods = self.core.list_namespaced_pod(NS).items
            claims = self.cp.kubectl_json("get", "resourceclaims", "-n", NS)["items"]
            if not pods and not claims:
                return
            time.sleep(0.2)
        raise RuntimeError(f"pods or claims of namespace {NS} still there after {timeout:.0f}s")

    def pods(self, pairs: int) -> tuple[list[float], list[float]]:
        self.cp.kubectl("create", "namespace", NS)
        deadline = time.monotonic() + 60
        while self.cp.kubectl("get", "serviceaccount", "default", "-n", NS, check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("no default ServiceAccount in the bench namespace")
            time.sleep(0.2)
        self.cp.kubectl("apply", "-f", "-", input=json.dumps(one_gpu_template()))
        # one unmeasured pair first: the first container of an image, the first claim of the driver
        self.create_to_running("warm-claim", claim=True)
        self.create_to_running("warm-plain", claim=False)
        print(f"  warm-up: the claim pod's container sees {self.seen_devices('warm-claim')}", flush=True)
        self.delete_and_wait(["warm-claim", "warm-plain"])
        with_claim: list[float] = []
        plain: list[float] = []
        for i in range(pairs):
            with_claim.append(self.create_to_running(f"claim-{i}", claim=True))
            plain.append(self.create_to_running(f"plain-{i}", claim=False))
            self.delete_and_wait([f"claim-{i}", f"plain-{i}"])
            print(f"  pair {i + 1}/{pairs}: claim {with_claim[-1]:.2f} s, plain {plain[-1]:.2f} s", flush=True)
        return with_claim, plain

    # -- 2. driver restart ------------------------------------------------------------------------

    def registration_times(self) -> list[float]:
        """Wall-clock times of the kubelet's "Registered DRA plugin" lines for the driver (its klog timestamps)."""
        now = datetime.now()
        times = []
        for line in self.node.kubelet_log.read_text(errors="replace").splitlines():
            if "Registered DRA plugin" not in line or DRIVER_NAME not in line:
                continue
            m = KLOG_TIME.match(line)
            if m:
                stamp = datetime.strptime(f"{now.year}{m.group(1)} {m.group(2)}", "%Y%m%d %H:%M:%S.%f")
                times.append(stamp.timestamp())
        return times

    def publishes(self, since: float) -> dict[str, float]:
        """The driver's dra_driver_publish_total by result, from a driver process started after `since` ({} while
        none answers on the metrics port: the pods share the host's network)."""
        try:
            text = self.release.metrics()
        except OSError:
            return {}
        started = re.search(r"^process_start_time_seconds (\S+)$", text, re.MULTILINE)
        if started is None or float(started.group(1)) < since - 1:
            return {}
        found: dict[str, float] = {}
        for line in text.splitlines():
            m = re.match(r'^dra_driver_publish_total\{result="(\w+)"\} (\S+)$', line)
            if m:
                found[m.group(1)] = float(m.group(2))
        return found

    def restart(self, timeout: float = 180.0) -> Restart:
        from kubernetes import watch

        old = self.release.ready_pod()
        assert old is not None, "no Ready driver pod"
        old_name = old["metadata"]["name"]
        registered_before = len(self.registration_times())
        listed = self.core.list_namespaced_pod(self.release.namespace)
        events: queue.Queue[tuple[float, Any]] = queue.Queue()
        w = watch.Watch()

        def follow() -> None:
            try:
                for event in w.stream(
                    self.core.list_namespaced_pod,
                    self.release.namespace,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=int(timeout),
                ):
                    events.put((time.time(), event))
            except Exception as e:  # the watch was stopped
                events.put((time.time(), {"type": "ERROR", "object": e}))

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        r = Restart(deleted=time.time())
        self.core.delete_namespaced_pod(old_name, self.release.namespace)
        deadline = time.monotonic() + timeout
        try:
            while None in (r.created, r.started, r.registered, r.ready, r.synced):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"driver restart incomplete after {timeout:.0f}s: {r}\n{self.release.describe()}"
                    )
                try:
                    at, event = events.get(timeout=0.05)
                    pod = event["object"]
                    if event["type"] != "ERROR" and pod.metadata.name != old_name:
                        if r.created is None and event["type"] == "ADDED":
                            r.created = at
                        if r.started is None and container_started(pod):
                            r.started = at
                        if r.ready is None and is_ready(pod):
                            r.ready = at
                except queue.Empty:
                    pass
                if r.registered is None:
                    times = self.registration_times()
                    if len(times) > registered_before:
                        r.registered = times[registered_before]
                if r.started is not None and r.synced is None:
                    counts = self.publishes(since=r.deleted)
                    done = {k: v for k, v in counts.items() if k in ("published", "unchanged") and v > 0}
                    if done:
                        r.synced = time.time()
                        r.publish = ",".join(sorted(done))
        finally:
            w.stop()
        return r

    def restarts(self, count: int) -> list[Restart]:
        results = []
        for i in range(count):
            r = self.restart()
            results.append(r)
            print(
                f"  restart {i + 1}/{count}: created +{r.created_after:.2f} s, started +{r.started_after:.2f} s, "
                f"registered +{r.registered_after:.2f} s, slices +{r.synced_after:.2f} s ({r.publish})",
                flush=True,
            )
            # the next restart from a settled driver: Ready, registered and publishing
            self.release.wait_registered(time.monotonic() + 120, registrations=len(self.registration_times()))
        return results


@dataclass
class Restart:
    """Wall-clock times (time.time()) of one driver restart."""

    deleted: float
    created: float | None = None  # the new pod's ADDED event
    started: float | None = None  # its container running
    registered: float | None = None  # the kubelet's "Registered DRA plugin" line
    ready: float | None = None  # its Ready condition
    synced: float | None = None  # its first publish of the node's slices
    publish: str = field(default="")

    def _after_created(self, t: float | None) -> float:
        assert t is not None and self.created is not None
        return t - self.created

    @property
    def created_after(self) -> float:
        assert self.created is not None
        return self.created - self.deleted

    @property
    def started_after(self) -> float:
        return self._after_created(self.started)

    @property
    def registered_after(self) -> float:
        return self._after_created(self.registered)

    @property
    def ready_after(self) -> float:
        return self._after_created(self.ready)

    @property
    def synced_after(self) -> float:
        return self._after_created(self.synced)


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def machine_line() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({model or platform.machine()}), kernel {platform.release()}"


RAISED = ClientLimits(qps=5000, burst=5000)


def client_limits_line(node: Node) -> str:
    """The client limits in force, as the kubelet (its /configz, through the API server's node proxy) and
    kube-scheduler (its /configz) report them."""
    kubelet = json.loads(node.cp.get_text(f"/api/v1/nodes/{node.name}/proxy/configz"))["kubeletconfig"]
    scheduler = Scheduler(node.cp).config()["clientConnection"]
    return (
        f"client limits in force: kubelet kubeAPIQPS {kubelet['kubeAPIQPS']}, kubeAPIBurst {kubelet['kubeAPIBurst']}; "
        f"kube-scheduler QPS {scheduler['qps']:g}, burst {scheduler['burst']}"
    )


def report(
    args: argparse.Namespace, node: Node, with_claim: list[float], plain: list[float], rs: list[Restart]
) -> None:
    kubelet = subprocess.run([str(node.cp.bin_dir / "kubelet"), "--version"], capture_output=True, text=True)
    print()
    print(f"machine: {machine_line()}; {kubelet.stdout.strip()}, containerd + runc; simulated {args.machine}")
    print(client_limits_line(node))
    print()
    print("| measure | n | median | p90 | min | max |")
    print("|---|---:|---:|---:|---:|---:|")

    def row(label: str, values: list[float]) -> None:
        if not values:
            return
        cells = [statistics.median(values), p90(values), min(values), max(values)]
        print(f"| {label} | {len(values)} | " + " | ".join(f"{v:.2f} s" for v in cells) + " |")

    row("pod create → Running, one-GPU claim (template)", with_claim)
    row("pod create → Running, no claim", plain)
    if with_claim and plain:
        ratio = statistics.median(with_claim) / statistics.median(plain)
        extra = statistics.median(with_claim) - statistics.median(plain)
        print(f"| ratio of medians, claim / no claim | | {ratio:.2f}x (+{extra:.2f} s) | | | |")
    row("driver pod deleted → new pod created", [r.created_after for r in rs])
    row("new driver pod created → container started", [r.started_after for r in rs])
    row("new driver pod created → kubelet: Registered DRA plugin", [r.registered_after for r in rs])
    row("new driver pod created → slices published (or found right)", [r.synced_after for r in rs])
    row("new driver pod created → Ready (the chart has no readiness probe)", [r.ready_after for r in rs])
    row("driver pod deleted → plugin registered again", [r.created_after + r.registered_after for r in rs])
    if rs:
        outcomes = statistics.multimode(r.publish for r in rs)
        print(f"| first publish of the restarted driver | {len(rs)} | {', '.join(outcomes)} | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20, help="claim/plain pod pairs (default 20)")
    parser.add_argument("--restarts", type=int, default=5, help="driver pod deletions (default 5)")
    parser.add_argument("--machine", default="dgx-h100", help="simulated machine (default dgx-h100)")
    parser.add_argument(
        "--as-deployed", action="store_true", help="the kubelet's and kube-scheduler's default client limits (50/100)"
    )
    args = parser.parse_args()
    limits = SCHEDULER_DEFAULT_CLIENT if args.as_deployed else RAISED
    reason = node_unavailable_reason()
    if reason is not None:
        sys.exit(f"cannot run a real node here: {reason}")
    began = time.monotonic()
    with ControlPlane(service_accounts=True, controllers=NODE_CONTROLLERS, scheduler_client=limits) as cp:
        node = Node(cp, sandbox_image=images.PAUSE_IMAGE, images=[images.pause_image(), images.workload_image()],
                    kubelet_config={"kubeAPIQPS": limits.qps, "kubeAPIBurst": limits.burst})  # fmt: skip
        with node:
            release = DriverRelease(node, machine=args.machine)
            release.install()
            print(f"cluster, node and driver ready in {time.monotonic() - began:.0f} s", flush=True)
            bench = Bench(release)
            with_claim, plain = bench.pods(args.pairs) if args.pairs > 0 else ([], [])
            rs = bench.restarts(args.restarts)
            report(args, node, with_claim, plain, rs)


if __name__ == "__main__":
    main()
