"""NVIDIA's own DRA driver (its gpu-kubelet-plugin, sigs.k8s.io/dra-driver-nvidia-gpu v0.5.0, built from its Go module
by scripts/build-nvidia-tools.sh) run as a host process against a real control plane (tests.cluster.controlplane), for
a Node the test created, on a simulated machine's driver root: it loads the simulated libnvidia-ml.so.1 from there, as
it loads the real one from the host's driver root, and publishes its ResourceSlices. There is no kubelet: its plugin
and registration sockets lie in temporary directories nobody connects to, so it prepares nothing (the kubelet would
call NodePrepareResources on the plugin socket once it had registered through the registration one).

What the plugin needs from the machine, and where it finds it here:
- `libnvidia-ml.so.1` under `--nvidia-driver-root` (its root.go searches the library directories of the root): the
  simulated machine's driver root, which holds the simulated library (docs/simulated-libnvml.md).
- sysfs for the standard attributes `resource.kubernetes.io/pcieRoot` and `numaNode` (k8s.io/dynamic-resource-
  allocation/deviceattribute): NVIDIA's own `NVIDIA_DRA_SYSFS_ROOT`, the alternate sysfs root its mock-NVML CI uses,
  pointed at the simulator's sysfs tree.
- `nvidia-cdi-hook`: copied at start from /usr/bin of its image unless `--nvidia-cdi-hook-path` names one; here the
  hook built from the container toolkit's module.
- the kubelet's registration directory (`--kubelet-registrar-directory-path`), which the kubelet creates: made here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dra_driver.simulator.nvml import SimulatedNvml
from tests.cluster.controlplane import ControlPlane
from tests.libnvml_support import simulated_library
from tests.nvidia_tools import nvidia_tool

DRIVER = "gpu.nvidia.com"
PLUGIN = "gpu-kubelet-plugin"
SYSFS_ROOT_ENV = "NVIDIA_DRA_SYSFS_ROOT"  # cmd/gpu-kubelet-plugin/numa.go and nvlib.go
_LOG_TAIL = 60
_KLOG_HEADER = re.compile(r"^([WE])\d{4} [\d:.]+\s+\d+ ")  # W1204 18:08:31.097335    4198 nvlib.go:338] ...


class NvidiaPluginError(RuntimeError):
    pass


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
    ) -> None:
        self.cp, self.sim, self.node, self.work_dir = cp, sim, node, work_dir
        self.feature_gates = dict(feature_gates or {})
        self.consumable_shares = consumable_shares
        self.verbosity = verbosity
        self.log_path = work_dir / f"{PLUGIN}.log"
        # The sockets' directories: a short path of their own (a Unix socket's path has at most 107 bytes, which a
        # pytest tmp_path can exceed), removed by `cleanup`.
        self.socket_dir = Path(tempfile.mkdtemp(prefix="nvidia-dra-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def plugins_dir(self) -> Path:
        return self.socket_dir / "plugins"  # the plugin's data (checkpoint) and DRA socket: <dir>/gpu.nvidia.com/

    @property
    def registry_dir(self) -> Path:
        return self.socket_dir / "plugins_registry"  # gpu.nvidia.com-reg.sock, where a kubelet would find it

    @property
    def cdi_root(self) -> Path:
        return self.work_dir / "cdi"

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
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.args(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.work_dir, start_new_session=True
            )
        return self

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)

    def cleanup(self) -> None:
        """Remove the socket directories (and the checkpoint in them); the work dir stays for its log."""
        self.stop()
        shutil.rmtree(self.socket_dir, ignore_errors=True)

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
        self.cp.kubectl(
            "delete",
            "resourceslices",
            f"--field-selector=spec.driver={DRIVER},spec.nodeName={self.node}",
            "--wait=true",
        )


def _complete(items: list[dict[str, Any]]) -> bool:
    if not items:
        return False
    pools = {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in items}
    return len(pools) == 1 and next(iter(pools))[1] == len(items)


def _versions(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(s["metadata"]["name"], s["metadata"]["resourceVersion"]) for s in items]
