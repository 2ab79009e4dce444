"""NVIDIA's own DRA driver (its gpu-kubelet-plugin, sigs.k8s.io/dra-driver-nvidia-gpu v0.5.0, built from its Go module
by scripts/build-nvidia-tools.sh) run as a host process against a real control plane (tests.cluster.controlplane), for
a Node the test created, on a simulated machine's driver root: it loads the simulated libnvidia-ml.so.1 from there, as
it loads the real one from the host's driver root, and publishes its ResourceSlices. Without a kubelet, its plugin
and registration sockets lie in temporary directories where a test's kubelet stand-in (dra_driver.plugin.grpc.kubelet)
registers it and calls NodePrepareResources, as the kubelet would; on the real node (`kubelet_dir=`, `cdi_root=`) they
lie where the real kubelet finds them, and its CDI specs where containerd reads them (tests/test_real_nvidia_dra.py).

What the plugin needs from the machine, and where it finds it here:
- `libnvidia-ml.so.1` under `--nvidia-driver-root` (its root.go searches the library directories of the root): the
  simulated machine's driver root, which holds the simulated library (docs/simulated-libnvml.md).
- sysfs for the standard attributes `resource.kubernetes.io/pcieRoot` and `numaNode` (k8s.io/dynamic-resource-
  allocation/deviceattribute): NVIDIA's own `NVIDIA_DRA_SYSFS_ROOT`, the alternate sysfs root its mock-NVML CI uses,
  pointed at the simulator's sysfs tree.
- `nvidia-cdi-hook`: copied at start from /usr/bin of its image unless `--nvidia-cdi-hook-path` names one; here the
  hook built from the container toolkit's module.
- the kubelet's registration directory (`--kubelet-registrar-directory-path`), which the kubelet creates: made here.

To prepare a claim (`NvidiaKubeletPlugin(..., node_files=True)`, root only) it needs what the kernel driver gives a
real node, which a simulated machine keeps elsewhere or lacks:
- the device nodes (`/dev/nvidia<minor>`, `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`, `nvidia-modeset`, and
  `nvidia-caps/nvidia-cap<N>`): nvcdi builds a GPU's CDI device from them under its dev root, which is the driver
  root when that has a `dev/` directory (cmd/gpu-kubelet-plugin root.go getDevRoot), else the host's `/`. Made here
  with mknod under `<driver root>/dev` (`make_device_nodes`, `machine_device_nodes`), with the majors and minors of
  the simulated `/proc`. The `nvidia-caps` nodes are made as a real node has them but not read: a MIG device's
  capability nodes go into its spec as `type: c` without a host path, for the runtime to make in the container.
- for a MIG device, its capabilities' minors from the fixed path `/proc/driver/nvidia/capabilities`, and the
  `nvidia-caps` major from `/proc/devices` (internal/common/nvcaps.go): the plugin runs in a private mount namespace
  (`unshare -m`) where the simulated machine's `/proc/driver` is bind-mounted over `/proc/driver`, and over
  `/proc/devices` the host's with the simulated driver's majors added (`node_proc_devices`: the simulated file lists
  only the NVIDIA majors and no `Block devices:` section, which the plugin's parser requires after them). Without
  either its MIG prepare fails writing the CDI spec (no such capability file; "error parsing '/proc/devices'").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from dra_driver.cdi.devnodes import CharDevice, char_majors, gpu_nodes
from dra_driver.simulator.nvml import SimulatedNvml
from tests.cluster.controlplane import ControlPlane
from tests.libnvml_support import simulated_library
from tests.nvidia_tools import nvidia_tool
from tests.processes import stop

DRIVER = "gpu.nvidia.com"
PLUGIN = "gpu-kubelet-plugin"
SYSFS_ROOT_ENV = "NVIDIA_DRA_SYSFS_ROOT"  # cmd/gpu-kubelet-plugin/numa.go and nvlib.go
_LOG_TAIL = 60
_KLOG_HEADER = re.compile(r"^([WE])\d{4} [\d:.]+\s+\d+ ")  # W1204 18:08:31.097335    4198 nvlib.go:338] ...
CDI_VENDOR = f"k8s.{DRIVER}"  # its claim specs' kind: k8s.gpu.nvidia.com/claim
# nvidia-modeset.ko's node: wherever that module is loaded (the GPU Operator's driver loads it), nvcdi adds it to
# every spec's common edits; CUDA never opens it.
MODESET = CharDevice("/dev/nvidia-modeset", 195, 254, 0o666)


class NvidiaPluginError(RuntimeError):
    pass


def make_device_nodes(dev: Path, nodes: Iterable[CharDevice]) -> None:
    """The device nodes the kernel driver makes, under `dev` (a dev root's `dev/`; nvcdi accepts only character
    devices there): mknod, which needs root. Nodes already there are kept."""
    for node in nodes:
        path = dev / node.path.removeprefix("/dev/")
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(path, node.file_mode | stat.S_IFCHR, os.makedev(node.major, node.minor))
        os.chmod(path, node.file_mode)


def gpu_minors(sim: SimulatedNvml) -> list[int]:
    """The simulated machine's GPU minors, in NVML index order."""
    sim.nvmlInit()
    try:
        return [
            sim.nvmlDeviceGetMinorNumber(sim.nvmlDeviceGetHandleByIndex(i)) for i in range(sim.nvmlDeviceGetCount())
        ]
    finally:
        sim.nvmlShutdown()


def mig_cap_device_nodes(sim: SimulatedNvml) -> list[CharDevice]:
    """`/dev/nvidia-caps/nvidia-cap<N>` for every MIG capability the kernel lists (`/proc/driver/nvidia-caps/
    mig-minors`: config, monitor, and every GPU instance and compute instance each GPU could have), as
    `nvidia-modprobe -f` makes them on a real node (world-readable, 0444; config and monitor 0400)."""
    caps_major = char_majors(sim.proc_root)["nvidia-caps"]
    nodes = []
    for line in (sim.proc_root / "driver" / "nvidia-caps" / "mig-minors").read_text().splitlines():
        name, minor = line.split()
        mode = 0o400 if name in ("config", "monitor") else 0o444
        nodes.append(CharDevice(f"/dev/nvidia-caps/nvidia-cap{minor}", caps_major, int(minor), mode))
    return nodes


def machine_device_nodes(
    sim: SimulatedNvml, minors: Iterable[int] | None = None, *, modeset: bool = True, mig_caps: bool = True
) -> list[CharDevice]:
    """What a node with the simulated machine's driver loaded has in `/dev`: each GPU's `nvidia<minor>` (all the
    machine's GPUs unless `minors` says which), `nvidiactl`, the UVM nodes, `nvidia-modeset` and the MIG capability
    nodes; majors and minors as the simulated `/proc` says (dra_driver.cdi.devnodes)."""
    nodes: dict[str, CharDevice] = {}
    for minor in gpu_minors(sim) if minors is None else minors:
        nodes.update((n.path, n) for n in gpu_nodes(sim.proc_root, minor))
    if modeset:
        nodes[MODESET.path] = MODESET
    if mig_caps:
        nodes.update((n.path, n) for n in mig_cap_device_nodes(sim))
    return list(nodes.values())


def node_proc_devices(sim: SimulatedNvml, host: Path = Path("/proc/devices")) -> str:
    """`/proc/devices` as a node with the simulated machine's driver loaded has it: the host's character and block
    devices, with the simulated NVIDIA majors (dra_driver/simulator/procfs.py) in place of any of the same name."""
    simulated = char_majors(sim.proc_root)
    text = host.read_text()
    chars, _, blocks = text.partition("Block devices:")
    lines = [line for line in chars.splitlines()[1:] if line.strip() and line.split()[-1] not in simulated]
    lines += [f"{major:3d} {name}" for name, major in simulated.items()]
    lines.sort(key=lambda line: int(line.split()[0]))
    return "Character devices:\n" + "\n".join(lines) + "\n\nBlock devices:" + blocks


def node_namespace(sim: SimulatedNvml, work_dir: Path) -> list[str]:
    """The command prefix that runs a command in a private mount namespace (root) where `/proc/driver` is the
    simulated machine's and `/proc/devices` lists its majors (node_proc_devices), as the kernel driver shows them
    on a real node. `unshare` and `sh` exec the command: its pid is the process's."""
    devices = work_dir / "proc-devices"
    devices.write_text(node_proc_devices(sim))
    script = 'mount --bind "$0" /proc/driver && mount --bind "$1" /proc/devices && shift && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(sim.proc_root / "driver"),
            str(devices)]  # fmt: skip


class NvidiaKubeletPlugin:
    """One gpu-kubelet-plugin process for `node` on `sim`'s machine; `start()` then `stop()`, or `with` it: started
    on the way in; stopped, its slices deleted and its work dir removed (unless DRA_K8S_KEEP=1) on the way out."""

    def __init__(
        self,
        cp: ControlPlane,
        sim: SimulatedNvml,
        node: str,
        work_dir: Path,
        *,
        feature_gates: Mapping[str, bool] | None = None,
        consumable_shares: str = "disabled",
        verbosity: int = 4,
        node_files: bool = False,
        kubelet_dir: Path | None = None,
        cdi_root: Path | None = None,
    ) -> None:
        self.cp, self.sim, self.node, self.work_dir = cp, sim, node, work_dir
        # On a real node: the kubelet's root dir (its plugins/ and plugins_registry/, where it finds the plugin) and
        # the container runtime's CDI directory, instead of directories of its own that nobody reads.
        self.kubelet_dir, self._cdi_root = kubelet_dir, cdi_root
        self.feature_gates = dict(feature_gates or {})
        self.consumable_shares = consumable_shares
        self.verbosity = verbosity
        # Give it what a real node's kernel driver gives it (the device nodes, /proc/driver, /proc/devices), as it
        # needs to prepare claims: root only.
        self.node_files = node_files
        self.log_path = work_dir / f"{PLUGIN}.log"
        # The sockets' directories: a short path of their own (a Unix socket's path has at most 107 bytes, which a
        # pytest tmp_path can exceed), removed by `cleanup`.
        self.socket_dir = Path(tempfile.mkdtemp(prefix="nvidia-dra-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def plugins_dir(self) -> Path:
        # the plugin's data (checkpoint) and DRA socket: <dir>/gpu.nvidia.com/
        return (self.kubelet_dir or self.socket_dir) / "plugins"

    @property
    def registry_dir(self) -> Path:
        # gpu.nvidia.com-reg.sock, where a kubelet would find it
        return (self.kubelet_dir or self.socket_dir) / "plugins_registry"

    @property
    def cdi_root(self) -> Path:
        return self._cdi_root or self.work_dir / "cdi"

    def args(self) -> list[str]:
        driver_root = str(self.sim.driver_root)
        args = [
            str(nvidia_tool(PLUGIN)),
            f"--node-name={self.node}",
            "--image-name=unused.invalid/dra-driver-nvidia-gpu:v0.5.0",  # required; only MPS Deployments use it
            f"--kubeconfig={self.cp.kubeconfig}",
            f"--cdi-root={self.cdi_root}",
            f"--nvidia-driver-root={driver_root}",
            f"--container-driver-root={driver_root}",  # a host process sees the host's driver root where it lies
            f"--nvidia-cdi-hook-path={nvidia_tool('nvidia-cdi-hook')}",
            f"--kubelet-plugins-directory-path={self.plugins_dir}",
            f"--kubelet-registrar-directory-path={self.registry_dir}",
            f"--consumable-shares={self.consumable_shares}",
            f"-v={self.verbosity}",
        ]
        if self.feature_gates:
            gates = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))
            args.append(f"--feature-gates={gates}")
        return args

    def __enter__(self) -> NvidiaKubeletPlugin:
        try:
            return self.start()
        except BaseException:
            self.__exit__()  # the socket directory goes also when the plugin cannot start
            raise

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
        self.delete_slices()
        if os.environ.get("DRA_K8S_KEEP") != "1":
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def start(self) -> NvidiaKubeletPlugin:
        simulated_library(self.sim)  # the driver root holds the built library, not the stand-in
        for d in (self.work_dir, self.plugins_dir, self.registry_dir, self.cdi_root):
            d.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            SYSFS_ROOT_ENV: str(self.sim.sysfs_root),
            "DRA_DRIVER_LIBNVML_IDLE_S": "5",  # the simulated library's server leaves soon after the plugin
        }
        env.pop("KUBECONFIG", None)
        command = self.args()
        if self.node_files:
            make_device_nodes(self.sim.driver_root / "dev", machine_device_nodes(self.sim))
            command = [*node_namespace(self.sim, self.work_dir), *command]
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.work_dir, start_new_session=True
            )
        return self

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The plugin's process (in its namespace: `unshare` and `sh` exec it, so the pid is the plugin's)."""
        return self._proc

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        stop(proc)

    def cleanup(self) -> None:
        """Remove the socket directories (and the checkpoint in them), on a kubelet's only the plugin's own; the work
        dir stays for its log."""
        self.stop()
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        if self.kubelet_dir is not None:
            shutil.rmtree(self.plugins_dir / DRIVER, ignore_errors=True)
            (self.registry_dir / f"{DRIVER}-reg.sock").unlink(missing_ok=True)

    def log_tail(self, lines: int = _LOG_TAIL) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def warnings(self) -> list[str]:
        """The warnings and errors it logged (klog's W and E lines), without their time stamps and pids."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        return [_KLOG_HEADER.sub(r"\1 ", line) for line in text.splitlines() if _KLOG_HEADER.match(line)]

    def claim_spec_path(self, claim_uid: str) -> Path:
        """The CDI spec it writes for a prepared claim: a transient spec of kind k8s.gpu.nvidia.com/claim."""
        return self.cdi_root / f"{CDI_VENDOR}-claim_{claim_uid}.yaml"

    def claim_spec(self, claim_uid: str) -> dict[str, Any]:
        """That spec, parsed (YAML)."""
        doc: dict[str, Any] = yaml.safe_load(self.claim_spec_path(claim_uid).read_text())
        return doc

    def slices(self) -> list[dict[str, Any]]:
        """Its ResourceSlices on the server, by name."""
        listed = self.cp.kubectl_json(
            "get", "resourceslices", f"--field-selector=spec.driver={DRIVER},spec.nodeName={self.node}"
        )
        items: list[dict[str, Any]] = listed["items"]
        return sorted(items, key=lambda s: s["metadata"]["name"])

    def wait_published(self, timeout: float = 120.0, settle: float = 2.0) -> list[dict[str, Any]]:
        """Its complete pool (every slice of one generation, as many as resourceSliceCount says), unchanged for
        `settle` seconds; fails with the log's tail when the process ends or the pool does not appear."""
        deadline = time.monotonic() + timeout
        last: list[dict[str, Any]] | None = None
        since = 0.0
        while time.monotonic() < deadline:
            if not self.alive():
                raise NvidiaPluginError(f"{PLUGIN} exited before publishing:\n{self.log_tail()}")
            items = self.slices()
            if _complete(items):
                if last is not None and _versions(items) == _versions(last):
                    if time.monotonic() - since >= settle:
                        return items
                else:
                    last, since = items, time.monotonic()
            else:
                last = None
            time.sleep(0.5)
        raise NvidiaPluginError(f"{PLUGIN} published no complete pool in {timeout:.0f} s:\n{self.log_tail()}")

    def delete_slices(self) -> None:
        """What a stopped plugin leaves: the kubelet (or the next start) removes a node's slices; here the test."""
        self.cp.delete("resourceslices", wait=120, field_selector=f"spec.driver={DRIVER},spec.nodeName={self.node}")


def _complete(items: list[dict[str, Any]]) -> bool:
    if not items:
        return False
    pools = {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in items}
    return len(pools) == 1 and next(iter(pools))[1] == len(items)


def _versions(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(s["metadata"]["name"], s["metadata"]["resourceVersion"]) for s in items]


def claim_spec_edits(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A claim spec's container edits in a form to compare with another driver's: `common` (the spec-wide edits)
    and `devices` (each CDI device's own edits, by its name), each as CDI writes them (deviceNodes, mounts, hooks,
    env; absent fields left out), in JSON types."""
    plain: dict[str, Any] = json.loads(json.dumps(spec))
    return {
        "kind": plain.get("kind"),
        "cdiVersion": plain.get("cdiVersion"),
        "common": plain.get("containerEdits") or {},
        "devices": {d["name"]: d.get("containerEdits") or {} for d in plain.get("devices") or []},
    }
