"""A Docker daemon of the tests' own, for kind: started by hand, stopped by its PID, and kept off the host's network.

dockerd by default turns on IP forwarding, sets the iptables FORWARD policy to DROP, adds NAT rules and a `docker0`
bridge; none of that may happen to this machine (tests leave the host's addresses, routes, iptables and sysctls as
they found them). So this daemon runs with iptables, ip6tables, IP forwarding, masquerading and the default bridge off,
its own socket, exec root and data root (images survive between runs, under the project's cache), its own containerd,
and an address pool chosen among subnets the host neither has nor routes (tests/cluster/netcheck.py). kind's nodes
then share one user-defined network, whose bridge is the only thing that appears on the host while a cluster exists;
Docker's embedded DNS (nodes join the control plane by its container name) works without the daemon's iptables.

Containers that ask for every capability (`--privileged`, as kind's nodes do) get those the daemon itself holds: on
a machine whose root lacks one (CAP_SYS_RESOURCE on these), runc would refuse them all, so the daemon's runtime is
runc behind tests/cluster/runc_caps.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.cluster import netcheck
from tests.cluster.controlplane import ControlPlaneError, _tail
from tests.cluster.node import NODE_LOCK, lock_host

CACHE = Path(os.environ.get("DRA_DRIVER_CACHE", Path.home() / ".cache" / "dra-driver"))
EXEC_ROOT = Path("/run/dra-driver-docker")
SOCKET = EXEC_ROOT / "docker.sock"
RUNC_WRAPPER = Path(__file__).with_name("runc_caps.py")
FREEZER_ROOT = Path("/sys/fs/cgroup/freezer/docker")  # dockerd's cgroupfs parent on a cgroup v1 host
# Candidates for the nodes' network, in order; the first the host neither has nor routes is taken.
BRIDGE = "dra-kind0"  # the nodes' network's bridge on the host (tests/cluster/kind.py)
SUBNET_CANDIDATES = ("198.19.32.0/24", "198.51.100.128/25", "203.0.113.128/25")
DOCKERD_PACKAGE = "docker.io"  # Debian's daemon (.ci/run installs it without starting it)


def unavailable_reason() -> str | None:
    """Why the tests' Docker cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return "the tests' Docker daemon needs root"
    for binary in ("dockerd", "docker", "runc"):
        if shutil.which(binary) is None:
            return f"{binary} is not installed (Debian packages {DOCKERD_PACKAGE} and runc)"
    return None


def thaw_frozen(root: Path = FREEZER_ROOT) -> list[str]:
    """Thaws every frozen cgroup v1 freezer group under `root` (the containers' cgroups); returns their paths.

    runc freezes a container's cgroup while it changes the cgroup's settings (cgroup v1, systemd driver) and thaws it
    after; a runc killed in between (a node container stopped under its kubelet) leaves the group frozen, and a frozen
    task cannot die: the node's container then survives `docker rm -f` ("did not receive an exit event").
    """
    thawed: list[str] = []
    if not root.is_dir():
        return thawed
    for state in root.rglob("freezer.state"):
        try:
            if state.read_text().strip() != "THAWED":
                state.write_text("THAWED")
                thawed.append(str(state.parent))
        except OSError:
            continue  # the group went away meanwhile
    return thawed


class Docker:
    """The tests' dockerd. `env` is what a `docker` or `kind` command needs to talk to it."""

    def __init__(self, *, data_root: Path | None = None, exec_root: Path = EXEC_ROOT) -> None:
        self.data_root = data_root or CACHE / "docker" / "data"
        self.exec_root = exec_root
        self.socket = exec_root / "docker.sock"
        self.log_path = CACHE / "docker" / "dockerd.log"
        self.subnet = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock_fd: int | None = None  # NODE_LOCK, from start() to stop()

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["DOCKER_HOST"] = f"unix://{self.socket}"
        return env

    def docker(self, *args: str, timeout: float = 120, check: bool = True, input: bytes | None = None) -> str:
        proc = subprocess.run(
            ["docker", *args], env=self.env, capture_output=True, timeout=timeout, input=input, check=False
        )
        if check and proc.returncode != 0:
            raise ControlPlaneError(
                f"docker {' '.join(args)} failed ({proc.returncode}): {_tail(proc.stderr.decode())}"
            )
        return proc.stdout.decode()

    def _daemon_config(self) -> dict[str, object]:
        return {
            "hosts": [f"unix://{self.socket}"],
            "exec-root": str(self.exec_root),
            "data-root": str(self.data_root),
            "pidfile": str(self.exec_root / "dockerd.pid"),
            # the host's network as it was: no iptables rules, no forwarding, no NAT, no docker0
            "iptables": False,
            "ip6tables": False,
            "ip-forward": False,
            "ip-masq": False,
            "bridge": "none",
            "default-address-pools": [{"base": self.subnet, "size": int(self.subnet.split("/")[1])}],
            "runtimes": {"dra-runc": {"path": str(RUNC_WRAPPER)}},
            "default-runtime": "dra-runc",
            "storage-driver": "overlay2",
            "log-level": "warn",
        }

    def start(self, *, lock_wait: float = 600) -> None:
        """Start the daemon, once no test node runs on this host: kind's nodes run kubelets that set the same host
        sysctls as the real node's (tests/cluster/node.py, NODE_LOCK), and one daemon of the tests runs at a time
        (its exec root is fixed). The lock is held until stop()."""
        reason = unavailable_reason()
        if reason:
            raise ControlPlaneError(reason)
        self._lock_fd = lock_host(lock_wait)
        if self._lock_fd is None:
            raise ControlPlaneError(f"another test node holds {NODE_LOCK} (waited {lock_wait:.0f} s)")
        try:
            self._start()
        except BaseException:
            self._unlock()
            raise

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _start(self) -> None:
        self.stop_leftover()
        # the nodes' bridge of an earlier, killed run is ours (the daemon restores its network; delete removes it)
        self.subnet = netcheck.choose("Docker network", SUBNET_CANDIDATES, netcheck.host_networks(), ours=(BRIDGE,))
        self.exec_root.mkdir(parents=True, exist_ok=True)
        self.data_root.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        config = self.exec_root / "daemon.json"
        config.write_text(json.dumps(self._daemon_config(), indent=1))
        # dockerd finds its containerd, shim and docker-proxy on PATH; Debian puts docker-proxy in /usr/sbin
        env = dict(os.environ)
        env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin:" + env.get("PATH", "")
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                ["dockerd", "--config-file", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ControlPlaneError(f"dockerd exited ({self._proc.returncode}): {_tail(self.log_path.read_text())}")
            if self.socket.exists() and self.docker("version", check=False, timeout=10):
                return
            time.sleep(0.2)
        self.stop()
        raise ControlPlaneError(f"dockerd did not answer within 60 s: {_tail(self.log_path.read_text())}")

    def remove_containers(self) -> None:
        """Every container of this daemon, removed (kind's nodes of a cluster nobody deleted)."""
        ids = self.docker("ps", "-aq", check=False, timeout=30).split()
        if ids:
            thaw_frozen()
            self.docker("rm", "-f", "-v", *ids, check=False, timeout=120)

    def stop(self) -> None:
        """Stops the daemon after removing its containers (kind's clusters are deleted before)."""
        if self._proc is not None and self._proc.poll() is None:
            self.remove_containers()
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.stop_leftover()
        with open("/proc/self/mountinfo") as f:  # its containers' network namespaces are mounted there until they go
            mounted = any(f" {self.exec_root}/" in line for line in f)
        if not mounted:
            shutil.rmtree(self.exec_root, ignore_errors=True)
        self._unlock()

    def stop_leftover(self) -> None:
        """A daemon of an earlier, killed run (its pidfile names it) and its containerd are stopped."""
        pidfile = self.exec_root / "dockerd.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            cmdline = b""
        if b"dockerd" in cmdline:
            self.remove_containers()
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
                time.sleep(0.2)
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
        pidfile.unlink(missing_ok=True)
