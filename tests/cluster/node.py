"""A real Kubernetes node on this machine for end-to-end tests: containerd + runc + the kubelet against a
`ControlPlane`, everything on loopback.

Binaries: the kubelet from scripts/build-control-plane.sh (the same pinned Kubernetes module as the control plane),
containerd and the CNI plugins from scripts/build-node.sh, runc from Debian. Images come from tarballs imported into
containerd (`import_image`); every registry points at a dead loopback port, so no pull can leave the machine.

Settings that matter on this kind of machine: cgroup v1 with cgroupfs and
`failCgroupV1: false`; `restrict_oom_score_adj` (root here lacks CAP_SYS_RESOURCE, runc cannot lower oom_score_adj);
a bridge CNI network without gateway, masquerade or routes, so pods get an isolated eth0; the kubelet listens on
127.0.0.1 only; `makeIPTablesUtilChains: false`, so that the kubelet leaves the host's iptables alone
(tests.cluster.netfilter). `stop()` undoes everything the node did to the host: processes by PID (containers
included), mounts, network namespaces, cgroups, the bridge, the sysctls the kubelet sets and any iptables chain or rule
that appeared. `start()` first removes what a killed session's node left (`remove_killed_node_leftovers`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.cluster import netcheck, netfilter
from tests.cluster.controlplane import (
    DEFAULT_CONTROLLERS,
    REPO_ROOT,
    SERVICE_SUBNET,
    ControlPlane,
    ControlPlaneError,
    KubectlError,
    _Component,
    _tail,
    issue_cert,
    spawn_component,
)

# A control plane for a real node: its driver is a DaemonSet.
NODE_CONTROLLERS = (*DEFAULT_CONTROLLERS, "daemonset-controller")
NODE_BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-node.sh"
CONTAINERD_TOOLS = ("containerd", "ctr", "containerd-shim-runc-v2")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
K8S_NAMESPACE = "k8s.io"  # containerd namespace of the CRI plugin
BRIDGE = "dra-br0"
DEAD_REGISTRY = "http://127.0.0.1:9"  # discard port: nothing listens, every pull fails at once
# The kubelet writes these at start; stop() puts the host's values back.
KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops", "net/ipv4/ip_forward")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Host paths the kubelet and containerd create whatever their settings say (the device-plugin socket directory is
# fixed in the kubelet; go-cni locks in /etc/cni/net.d): stop() removes those that did not exist before start().
FIXED_HOST_PATHS = (
    Path("/var/lib/kubelet"),
    Path("/var/lib/kubelet/device-plugins"),
    Path("/etc/cni"),
    Path("/etc/cni/net.d"),
    Path("/var/log/containers"),  # the kubelet's symlinks to container logs (pod logs go to podLogsDir)
)
# The kubelet's device-plugin checkpoint, in that fixed directory. A session killed before stop() leaves it (and the
# directory) behind, and a new kubelet would restore the resources it names into its Node's capacity (nvidia.com/gpu
# from the device-plugin test): start() removes it.
DEVICE_PLUGIN_CHECKPOINT = Path("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")
NETNS_DIR = Path("/run/netns")
CNI_NETNS_PREFIX = "cni-"  # containerd's name for a pod sandbox's network namespace
# One node on a machine at a time (the kubelet's port, kubepods cgroups, the bridge and the address are the host's):
# a second start() waits for this lock (parallel test sessions queue instead of breaking each other).
NODE_LOCK = Path("/run/dra-test-node.lock")


class NodeError(ControlPlaneError):
    """The node failed to build, start or become Ready."""


def ensure_node_binaries(env: Mapping[str, str] | None = None) -> Path:
    """The directory with bin/{containerd,ctr,containerd-shim-runc-v2} and cni/{bridge,host-local,loopback}."""
    proc = subprocess.run(
        ["bash", str(NODE_BUILD_SCRIPT)], env=dict(os.environ if env is None else env), capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise NodeError(f"{NODE_BUILD_SCRIPT} failed (exit {proc.returncode}):\n{_tail(proc.stderr)}")
    return Path(proc.stdout.strip().splitlines()[-1])


def node_binaries_up_to_date() -> bool:
    return subprocess.run(["bash", str(NODE_BUILD_SCRIPT), "--check"], capture_output=True).returncode == 0


def runc_path() -> str | None:
    return shutil.which("runc") or next((p for p in ("/usr/sbin/runc", "/usr/bin/runc") if os.access(p, os.X_OK)), None)


def node_unavailable_reason() -> str | None:
    """Why a real node cannot run here (None when it can): root, runc, overlay and cgroups are needed."""
    if os.geteuid() != 0:
        return "a real node needs root (containerd, runc, mounts, cgroups)"
    if runc_path() is None:
        return "runc is not installed (Debian package runc)"
    if not (CGROUP_ROOT / "memory").is_dir() and not (CGROUP_ROOT / "cgroup.controllers").exists():
        return "no usable cgroup hierarchy under /sys/fs/cgroup"
    return None


def lock_host(timeout: float) -> int | None:
    """Take NODE_LOCK (no node of any session runs while it is held), waiting up to `timeout` seconds: the open
    descriptor (os.close releases it), or None when another node still held it."""
    fd = os.open(NODE_LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(0.5)


def remove_killed_node_leftovers() -> list[str]:
    """Remove what a node of a killed session left on the host network, as far as it is recognisably a node's: its
    address on lo (one of netcheck.NODE_IP_CANDIDATES), its CNI bridge, and the kubelet's iptables chains and the
    jumps to them (netfilter.remove_kubelet_leftovers: not while a kubelet runs in this network namespace). Only
    while holding NODE_LOCK, so that no node runs. Returns what it removed."""
    removed: list[str] = []
    shown = subprocess.run(["ip", "-o", "addr", "show", "dev", "lo"], capture_output=True, text=True).stdout
    for address in (f"{c}/32" for c in netcheck.NODE_IP_CANDIDATES if f" {c}/32 " in shown):
        if subprocess.run(["ip", "addr", "del", address, "dev", "lo"], capture_output=True).returncode == 0:
            removed.append(f"address {address} on lo")
    if subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True).returncode == 0:
        removed.append(f"link {BRIDGE}")
    removed += netfilter.remove_kubelet_leftovers()
    return removed


def _read_sysctl(name: str) -> str | None:
    try:
        return (Path("/proc/sys") / name).read_text().strip()
    except OSError:
        return None


def _mounts_under(*roots: Path) -> list[str]:
    """Mount points under `roots`, deepest first (so they can be unmounted in order)."""
    found: list[str] = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            target = line.split()[4].replace("\\040", " ")
            if any(target == str(r) or target.startswith(f"{r}/") for r in roots):
                found.append(target)
    return sorted(set(found), key=lambda t: t.count("/"), reverse=True)


def _process_cmdlines() -> Iterator[tuple[int, list[str]]]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if raw:
            yield int(entry.name), raw.rstrip(b"\0").decode(errors="replace").split("\0")


def _kill_and_wait(pids: Sequence[int], timeout: float = 10.0) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
            # a zombie whose parent is gone is reaped by init; its /proc entry stays until then
            try:
                if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                    break
            except OSError:
                break
            time.sleep(0.05)


class Node:
    """containerd + kubelet registered as Node `name` in `control_plane` (which must run with
    `service_accounts=True` for pods that talk to the API server). Use as a context manager or start()/stop()."""

    def __init__(
        self,
        control_plane: ControlPlane,
        *,
        name: str = "dra-node",
        images: Sequence[Path] = (),
        sandbox_image: str,
        work_dir: Path | None = None,
        kubelet_verbosity: int = 3,  # 3: "Registered DRA plugin" and the slice deletions are logged
        feature_gates: Mapping[str, bool] | None = None,
        start_timeout: float = 120.0,
        kubelet_config: Mapping[str, Any] | None = None,  # KubeletConfiguration fields over ours
    ) -> None:
        self.cp = control_plane
        self.name = name
        self.images = list(images)
        self.sandbox_image = sandbox_image
        self.kubelet_verbosity = kubelet_verbosity
        self.feature_gates = {**control_plane.feature_gates, **(feature_gates or {})}
        self.start_timeout = start_timeout
        self.kubelet_config = dict(kubelet_config or {})
        self.keep_work_dir = os.environ.get("DRA_K8S_KEEP") == "1"
        self._requested_work_dir = work_dir
        self._work: Path | None = None
        self._state: Path | None = None
        self._components: dict[str, _Component] = {}
        self._sysctls: dict[str, str | None] = {}
        self._netns_before: set[str] = set()
        self._created_host_paths: list[Path] = []
        self._added_node_ip = False
        self._host_before: dict[str, Any] = {}
        self._netfilter_before: netfilter.Snapshot | None = None
        # The Node's address (InternalIP: the kubelet refuses a loopback one, and the API server reaches the kubelet
        # by it), on lo, and its pods' subnet: chosen at start among addresses this machine neither has nor routes
        # (tests.cluster.netcheck; 192.0.2.1, once used here, is these machines' gateway).
        self.ip = ""
        self.pod_subnet = ""
        self.node_bin_dir: Path | None = None
        self.startup_seconds: float | None = None
        self._lock_fd: int | None = None
        self.lock_wait_timeout = float(os.environ.get("DRA_TEST_NODE_LOCK_TIMEOUT", "1800"))

    # -- paths ----------------------------------------------------------------------------------------

    @property
    def work_dir(self) -> Path:
        if self._work is None:
            raise NodeError("the node is not started")
        return self._work

    @property
    def kubelet_dir(self) -> Path:
        """The kubelet's --root-dir: plugins/ and plugins_registry/ are below it (the chart's kubeletDir)."""
        return self.work_dir / "kubelet"

    @property
    def state_dir(self) -> Path:
        """containerd's state directory (short path under /run: shim sockets live there)."""
        if self._state is None:
            raise NodeError("the node is not started")
        return self._state

    @property
    def containerd_socket(self) -> Path:
        return self.state_dir / "containerd.sock"

    @property
    def cdi_dir(self) -> Path:
        """The one CDI spec directory containerd reads (the chart's cdiRoot): nothing under the host's /etc/cdi or
        /var/run/cdi is read or written."""
        return self.work_dir / "cdi"

    @property
    def pod_logs_dir(self) -> Path:
        """Where the kubelet keeps container logs (`<namespace>_<pod>_<uid>/<container>/<restarts>.log`)."""
        return self.work_dir / "pod-logs"

    @property
    def kubelet_log(self) -> Path:
        return self.work_dir / "logs" / "kubelet.log"

    @property
    def containerd_log(self) -> Path:
        return self.work_dir / "logs" / "containerd.log"

    # -- lifecycle ------------------------------------------------------------------------------------

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> Node:
        reason = node_unavailable_reason()
        if reason is not None:
            raise NodeError(reason)
        self._acquire_host()
        began = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _acquire_host(self) -> None:
        fd = lock_host(self.lock_wait_timeout)
        if fd is None:
            raise NodeError(f"another test node holds {NODE_LOCK} (waited {self.lock_wait_timeout:.0f}s)")
        self._lock_fd = fd

    def _start(self) -> None:
        if self._requested_work_dir is not None:
            self._work = self._requested_work_dir
            self._work.mkdir(parents=True, exist_ok=True)
        else:
            # short: the kubelet's plugin sockets live below it (107 bytes at most, a pod UID in their names)
            self._work = Path(tempfile.mkdtemp(prefix="dn-"))
        self._state = Path(tempfile.mkdtemp(prefix="dn-", dir="/run"))
        (self.work_dir / "logs").mkdir(exist_ok=True)
        remove_killed_node_leftovers()  # we hold the lock: no node runs, what is there is a killed one's
        self._sysctls = {name: _read_sysctl(name) for name in KUBELET_SYSCTLS}
        self._netns_before = set(os.listdir(NETNS_DIR)) if NETNS_DIR.is_dir() else set()
        self._created_host_paths = [p for p in FIXED_HOST_PATHS if not p.exists()]
        DEVICE_PLUGIN_CHECKPOINT.unlink(missing_ok=True)  # another node's: none runs while this one holds the lock
        self._choose_addresses()
        self._netfilter_before = netfilter.snapshot()
        self._host_before = self._host_state()
        self.node_bin_dir = ensure_node_binaries()
        self._add_node_ip()
        deadline = time.monotonic() + self.start_timeout
        self._write_cni_config()
        self.cdi_dir.mkdir(exist_ok=True)
        self.start_containerd(deadline)
        for image in self.images:
            self.import_image(image)
        self._write_kubelet_config()
        self.start_kubelet()
        self.wait_ready(deadline)

    def stop(self) -> None:
        """Stop the kubelet, every container and containerd, then undo what they did to the host."""
        kubelet = self._components.pop("kubelet", None)
        if kubelet is not None:
            self._terminate(kubelet)
        if "containerd" in self._components and self._components["containerd"].process.poll() is None:
            with contextlib.suppress(Exception):
                self._stop_all_containers()
        containerd = self._components.pop("containerd", None)
        if containerd is not None:
            self._terminate(containerd)
        if self._state is not None:
            # shims outlive containerd by design; they and their containers are ours if they name our state dir
            shims = [pid for pid, argv in _process_cmdlines() if any(str(self._state) in a for a in argv)]
            _kill_and_wait(shims)
            self._kill_cgroup_processes()
        roots = [p for p in (self._work, self._state) if p is not None]
        for target in _mounts_under(*roots):
            subprocess.run(["umount", "-l", target], capture_output=True)
        if NETNS_DIR.is_dir():
            # containerd's (its pods' sandboxes: cni-<id>), not another test's namespace made meanwhile
            for ns in {n for n in os.listdir(NETNS_DIR) if n.startswith(CNI_NETNS_PREFIX)} - self._netns_before:
                subprocess.run(["umount", str(NETNS_DIR / ns)], capture_output=True)
                with contextlib.suppress(OSError):
                    (NETNS_DIR / ns).unlink()
        self._remove_cgroups()
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)
        if self._netfilter_before is not None:  # the kubelet leaves iptables alone; should anything have appeared
            netfilter.remove_added(self._netfilter_before)
            self._netfilter_before = None
        if self._added_node_ip:
            subprocess.run(["ip", "addr", "del", f"{self.ip}/32", "dev", "lo"], capture_output=True)
            self._added_node_ip = False
        for name, value in self._sysctls.items():
            if value is not None and _read_sysctl(name) != value:
                with contextlib.suppress(OSError):
                    (Path("/proc/sys") / name).write_text(value)
        self._sysctls = {}
        for path in self._created_host_paths:  # parents first: a child is gone with its parent
            shutil.rmtree(path, ignore_errors=True)
        self._created_host_paths = []
        if self._state is not None:
            shutil.rmtree(self._state, ignore_errors=True)
            self._state = None
        if self._work is not None and self._requested_work_dir is None and not self.keep_work_dir:
            shutil.rmtree(self._work, ignore_errors=True)
        self._work = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def _host_state(self) -> dict[str, Any]:
        """What a node may change on the host, as plain data (compared by `leftovers`)."""
        link = subprocess.run(["ip", "-o", "link", "show", BRIDGE], capture_output=True, text=True)
        lo = subprocess.run(["ip", "-o", "addr", "show", "dev", "lo"], capture_output=True, text=True).stdout
        return {
            "sysctls": {name: _read_sysctl(name) for name in KUBELET_SYSCTLS},
            "host paths": sorted(str(p) for p in FIXED_HOST_PATHS if p.exists()),
            "kubepods cgroups": sorted(str(t) for t in self._kubepods_cgroups()),
            "bridge": link.returncode == 0,
            "node ip on lo": bool(self.ip) and f" {self.ip}/" in lo,
            "netns": sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(CNI_NETNS_PREFIX))
            if NETNS_DIR.is_dir()
            else [],
            "ruleset": list(netfilter.ruleset()),
        }

    def leftovers(self, work_dir: Path, state_dir: Path) -> dict[str, Any]:
        """After `stop()`: everything that differs from the host before `start()` (empty when the node left nothing
        behind), plus processes, mounts and directories of the node's work and state directories."""
        after = self._host_state()
        diff: dict[str, Any] = {
            k: (self._host_before.get(k), v) for k, v in after.items() if self._host_before.get(k) != v
        }
        procs = [(pid, argv) for pid, argv in _process_cmdlines() if any(str(state_dir) in a for a in argv)]
        if procs:
            diff["processes"] = procs
        mounts = _mounts_under(work_dir, state_dir)
        if mounts:
            diff["mounts"] = mounts
        existing = [str(d) for d in (work_dir, state_dir) if d.exists()]
        if existing:
            diff["directories"] = existing
        return diff

    def _choose_addresses(self) -> None:
        """The node's address and its pods' subnet: the first candidates this machine neither has nor routes, and
        the control plane's service range checked the same way (NodeError naming the conflicts otherwise). A killed
        node's address is gone by now (remove_killed_node_leftovers)."""
        networks = netcheck.host_networks()
        try:
            self.ip = netcheck.choose("node address", netcheck.NODE_IP_CANDIDATES, networks)
            self.pod_subnet = netcheck.choose("pod subnet", netcheck.POD_SUBNET_CANDIDATES, networks, ours=[BRIDGE])
            netcheck.choose("service range", [SERVICE_SUBNET], networks)
        except netcheck.AddressConflict as e:
            raise NodeError(str(e)) from None

    def _add_node_ip(self) -> None:
        subprocess.run(["ip", "addr", "add", f"{self.ip}/32", "dev", "lo"], capture_output=True, check=True)
        self._added_node_ip = True

    def _terminate(self, comp: _Component, timeout: float = 20.0) -> None:
        if comp.process.poll() is None:
            comp.process.send_signal(signal.SIGTERM)
            try:
                comp.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                comp.process.kill()
                comp.process.wait(timeout=10)
        comp.log_file.close()

    def _stop_all_containers(self) -> None:
        for kind in ("tasks", "containers"):
            listed = self.ctr(kind, "ls", "-q", check=False).stdout.split()
            for cid in listed:
                if kind == "tasks":
                    self.ctr("tasks", "kill", "-a", "-s", "SIGKILL", cid, check=False)
                    self.ctr("tasks", "delete", "-f", cid, check=False)
                else:
                    self.ctr("containers", "delete", cid, check=False)

    def _kubepods_cgroups(self) -> list[Path]:
        """The kubelet's cgroup trees (cgroupfs driver): kubepods under each v1 hierarchy and under cgroup2."""
        trees = [CGROUP_ROOT / "kubepods"] if (CGROUP_ROOT / "cgroup.controllers").exists() else []
        if CGROUP_ROOT.is_dir():
            trees += [h / "kubepods" for h in CGROUP_ROOT.iterdir() if (h / "kubepods").is_dir()]
        return [t for t in trees if t.is_dir()]

    def _kill_cgroup_processes(self) -> None:
        pids: set[int] = set()
        for tree in self._kubepods_cgroups():
            for procs in tree.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(x) for x in procs.read_text().split())
        _kill_and_wait(sorted(pids))

    def _remove_cgroups(self) -> None:
        for tree in self._kubepods_cgroups():
            dirs = sorted((d for d in tree.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True)
            for d in [*dirs, tree]:
                with contextlib.suppress(OSError):
                    d.rmdir()

    # -- containerd -----------------------------------------------------------------------------------

    def _write_cni_config(self) -> None:
        cni = self.work_dir / "cni"
        (cni / "net.d").mkdir(parents=True, exist_ok=True)
        conflist = {
            "cniVersion": "1.0.0",
            "name": "dra-test",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    # No gateway, masquerade or route: pods reach nothing but each other; nothing leaves the machine.
                    "isGateway": False,
                    "ipMasq": False,
                    "hairpinMode": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.pod_subnet}]],
                        "dataDir": str(cni / "ipam"),
                    },
                }
            ],
        }
        (cni / "net.d" / "10-dra-test.conflist").write_text(json.dumps(conflist, indent=2))

    def _write_containerd_config(self) -> Path:
        assert self.node_bin_dir is not None
        work, state = self.work_dir / "containerd", self.state_dir
        hosts = work / "certs.d" / "_default"
        hosts.mkdir(parents=True, exist_ok=True)
        (hosts / "hosts.toml").write_text(f'server = "{DEAD_REGISTRY}"\n\n[host."{DEAD_REGISTRY}"]\n')
        runc = runc_path()
        cri_runtime = 'plugins."io.containerd.cri.v1.runtime"'
        config = f"""version = 4
root = "{work / "root"}"
state = "{state / "state"}"
imports = []  # never the host's /etc/containerd/conf.d
# NRI would open /var/run/nri/nri.sock; nothing here needs it
disabled_plugins = ["io.containerd.nri.v1.nri"]

[plugins."io.containerd.server.v1.grpc"]
  address = "{self.containerd_socket}"

[plugins."io.containerd.server.v1.ttrpc"]
  address = "{state / "containerd.sock.ttrpc"}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{work / "opt"}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{self.sandbox_image}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{work / "certs.d"}"

[{cri_runtime}]
  cdi_spec_dirs = ["{self.cdi_dir}"]
  # root here lacks CAP_SYS_RESOURCE: runc cannot lower a sandbox's oom_score_adj below its own
  restrict_oom_score_adj = true
  # pod network namespaces under the state directory, not /run/netns: stop() finds every one
  netns_mounts_under_state_dir = true
  [{cri_runtime}.containerd]
    default_runtime_name = "runc"
    [{cri_runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri_runtime}.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [{cri_runtime}.cni]
    bin_dirs = ["{self.node_bin_dir / "cni"}"]
    conf_dir = "{self.work_dir / "cni" / "net.d"}"
    use_internal_loopback = true

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
        path = work / "config.toml"
        path.write_text(config)
        return path

    def start_containerd(self, deadline: float) -> None:
        assert self.node_bin_dir is not None
        config = self._write_containerd_config()
        env = {"PATH": f"{self.node_bin_dir / 'bin'}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}
        comp = self._spawn("containerd", self.node_bin_dir / "bin" / "containerd", ["--config", str(config)], env)
        while time.monotonic() < deadline:
            if comp.process.poll() is not None:
                raise NodeError(f"containerd exited with {comp.process.returncode}:\n{comp.log_tail()}")
            if self.containerd_socket.exists() and self.ctr("version", check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise NodeError(f"containerd not serving within {self.start_timeout:.0f}s:\n{comp.log_tail()}")

    def ctr(self, *args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """`ctr -n k8s.io ARGS` against this node's containerd."""
        assert self.node_bin_dir is not None
        cmd = [str(self.node_bin_dir / "bin" / "ctr"), "--address", str(self.containerd_socket), "-n", K8S_NAMESPACE]
        proc = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def import_image(self, tarball: Path) -> None:
        """Import an OCI or Docker archive into the CRI namespace (no registry involved)."""
        self.ctr("images", "import", "--local", "--no-unpack=false", str(tarball), timeout=600)

    def image_names(self) -> list[str]:
        return self.ctr("images", "ls", "-q").stdout.split()

    # -- kubelet --------------------------------------------------------------------------------------

    def _write_kubelet_config(self) -> None:
        pki_dir = self.cp.pki.ca_cert.parent
        cert_name = f"node-{self.name}"
        if not (pki_dir / f"{cert_name}.crt").exists():
            issue_cert(
                pki_dir,
                cert_name,
                f"/O=system:nodes/CN=system:node:{self.name}",
                "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n",
            )
            (pki_dir / f"{cert_name}.key").chmod(0o600)
        # The test API server runs RBAC only (no Node authorizer): bind system:node to the nodes group.
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "dra-test-system-nodes"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}],
        }
        self.cp.apply(binding)
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "dra-test",
                    "cluster": {"server": self.cp.server, "certificate-authority": str(self.cp.pki.ca_cert)},
                }
            ],
            "users": [
                {
                    "name": self.name,
                    "user": {
                        "client-certificate": str(pki_dir / f"{cert_name}.crt"),
                        "client-key": str(pki_dir / f"{cert_name}.key"),
                    },
                }
            ],
            "contexts": [{"name": "node", "context": {"cluster": "dra-test", "user": self.name}}],
            "current-context": "node",
        }
        path = self.work_dir / "kubelet.kubeconfig"
        path.write_text(json.dumps(kubeconfig, indent=2))
        path.chmod(0o600)
        self.kubelet_dir.mkdir(exist_ok=True)
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.ip,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.cp.pki.ca_cert)},
            },
            "authorization": {"mode": "AlwaysAllow"},  # reachable from loopback only, by the test CA's clients
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "imageServiceEndpoint": f"unix://{self.containerd_socket}",
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
                "imagefs.inodesFree": "1%",
            },
            "featureGates": self.feature_gates,
            "serializeImagePulls": False,
            "registerNode": True,
            "resolvConf": "",
            "volumePluginDir": str(self.work_dir / "volume-plugins"),
            "podLogsDir": str(self.pod_logs_dir),
            "syncFrequency": "10s",
            "nodeStatusUpdateFrequency": "5s",
            "shutdownGracePeriod": "0s",
            # Otherwise the kubelet adds chains to the host's iptables (KUBE-FIREWALL jumped to from INPUT and OUTPUT,
            # KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY: tests.cluster.netfilter) and never removes them.
            "makeIPTablesUtilChains": False,
            **self.kubelet_config,
        }
        (self.work_dir / "kubelet.yaml").write_text(json.dumps(config, indent=2))

    def start_kubelet(self) -> None:
        args = [
            f"--config={self.work_dir / 'kubelet.yaml'}",
            f"--kubeconfig={self.work_dir / 'kubelet.kubeconfig'}",
            f"--root-dir={self.kubelet_dir}",
            f"--cert-dir={self.work_dir / 'kubelet-pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.ip}",
            f"--v={self.kubelet_verbosity}",
        ]
        assert self.node_bin_dir is not None
        env = {"PATH": f"{self.node_bin_dir / 'bin'}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}
        self._spawn("kubelet", self.cp.bin_dir / "kubelet", args, env, append=True)

    def stop_kubelet(self) -> None:
        comp = self._components.pop("kubelet", None)
        if comp is not None:
            self._terminate(comp)

    def restart_kubelet(self, timeout: float = 60.0) -> None:
        """Stop the kubelet (SIGTERM) and start it again with the same settings; wait for Node Ready."""
        self.stop_kubelet()
        self.start_kubelet()
        self.wait_ready(time.monotonic() + timeout)

    def wait_ready(self, deadline: float) -> None:
        kubelet = self._components["kubelet"]
        last = ""
        while time.monotonic() < deadline:
            if kubelet.process.poll() is not None:
                raise NodeError(f"kubelet exited with {kubelet.process.returncode}:\n{kubelet.log_tail()}")
            try:
                conditions = self.cp.kubectl_json("get", "node", self.name).get("status", {}).get("conditions", [])
                last = " ".join(c["status"] for c in conditions if c["type"] == "Ready")
            except KubectlError as e:
                last = e.stderr.strip()
            if last == "True":
                return
            time.sleep(0.2)
        raise NodeError(f"node {self.name} not Ready in time (last: {last}):\n{kubelet.log_tail()}")

    def kubelet_running(self) -> bool:
        comp = self._components.get("kubelet")
        return comp is not None and comp.process.poll() is None

    def _spawn(
        self, name: str, binary: Path, args: list[str], env: Mapping[str, str], *, append: bool = False
    ) -> _Component:
        comp = spawn_component(name, binary, args, env, self.work_dir, append=append)
        self._components[name] = comp
        return comp

    def log_tails(self) -> str:
        return "\n".join(f"--- {c.name} ({c.log_path})\n{c.log_tail()}" for c in self._components.values())
