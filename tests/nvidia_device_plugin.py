"""NVIDIA's device plugin (github.com/NVIDIA/k8s-device-plugin v0.19.0, built from its Go module by
scripts/build-nvidia-tools.sh) as a host process on a simulated machine's driver root, registered with the node's
kubelet: it loads the simulated libnvidia-ml.so.1 from that root, as its DaemonSet loads the host's from the root it
mounts, and serves `nvidia.com/gpu` on the kubelet's device-plugin socket directory, which the kubelet fixes at
/var/lib/kubelet/device-plugins (its `kubelet.sock` and the plugin's `nvidia-gpu.sock`).

Its configuration is the file format its Helm chart's `config.map` holds (api/config/v1): `version: v1`, `flags`,
and `sharing.timeSlicing.resources[].replicas` for time-slicing, with which each GPU is advertised `replicas` times
and up to that many containers get the same GPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from dra_driver.simulator.nvml import SimulatedNvml
from tests.libnvml_support import simulated_library
from tests.nvidia_tools import nvidia_tool
from tests.processes import stop

PLUGIN = "nvidia-device-plugin"
RESOURCE = "nvidia.com/gpu"
_KLOG_HEADER = re.compile(r"^([WE])\d{4} [\d:.]+\s+\d+ ")  # E1204 18:08:31.097335    4198 main.go:338] ...


def config(*, replicas: int = 1) -> dict[str, Any]:
    """The plugin's config file: whole GPUs by UUID in NVIDIA_VISIBLE_DEVICES (its default device-list strategy),
    every GPU replicated `replicas` times when more than one."""
    doc: dict[str, Any] = {
        "version": "v1",
        "flags": {
            "migStrategy": "none",
            "failOnInitError": True,
            "plugin": {"deviceListStrategy": ["envvar"], "deviceIDStrategy": "uuid", "passDeviceSpecs": False},
        },
    }
    if replicas > 1:
        doc["sharing"] = {"timeSlicing": {"resources": [{"name": RESOURCE, "replicas": replicas}]}}
    return doc


class NvidiaDevicePlugin:
    """One device-plugin process on `sim`'s driver root; `with` it: started on the way in, stopped on the way out."""

    def __init__(self, sim: SimulatedNvml, work_dir: Path, *, replicas: int = 1) -> None:
        self.sim, self.work_dir, self.replicas = sim, work_dir, replicas
        self.log_path = work_dir / f"{PLUGIN}.log"
        self.config_path = work_dir / "config.yaml"
        self._proc: subprocess.Popen[bytes] | None = None

    def args(self) -> list[str]:
        root = str(self.sim.driver_root)
        return [
            str(nvidia_tool(PLUGIN)),
            f"--config-file={self.config_path}",
            f"--driver-root={root}",
            f"--driver-root-ctr-path={root}",  # a host process sees the driver root where it lies
            "--device-discovery-strategy=nvml",
        ]

    def __enter__(self) -> NvidiaDevicePlugin:
        simulated_library(self.sim)  # the driver root holds the built library, not the stand-in
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(json.dumps(config(replicas=self.replicas)))  # YAML reads JSON
        env = {**os.environ, "DRA_DRIVER_LIBNVML_IDLE_S": "5"}  # the library's server leaves soon after the plugin
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.args(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.work_dir, start_new_session=True
            )
        return self

    def __exit__(self, *exc: object) -> None:
        proc, self._proc = self._proc, None
        stop(proc)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"

    def problems(self) -> list[str]:
        """The errors it logged (klog's E lines) and its warnings, without time stamps and pids."""
        return [_KLOG_HEADER.sub(r"\1 ", line) for line in self.log().splitlines() if _KLOG_HEADER.match(line)]
