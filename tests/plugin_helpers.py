"""Building allocated ResourceClaims and a Driver over a simulated node, for the plugin tests."""

from __future__ import annotations

import uuid as uuidlib
from pathlib import Path
from typing import Any

from dra_driver.plugin.claims import StaticClaimSource
from dra_driver.plugin.driver import STARTUP_LOCK_WAIT_S, Driver, PluginSettings
from dra_driver.plugin.types import ClaimRef
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME
from dra_driver.slices.devices import PublishMode

DRIVER = DEFAULT_DRIVER_NAME
NODE = "node-a"
GPU_CLASS = {
    "metadata": {"name": "gpu"},
    "spec": {
        "selectors": [
            {"cel": {"expression": f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'"}}
        ]
    },
}
MIG_CLASS = {
    "metadata": {"name": "mig"},
    "spec": {
        "selectors": [
            {"cel": {"expression": f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig'"}}
        ]
    },
}


def claim(
    devices: list[str],
    *,
    name: str | None = None,
    device_class: str = "gpu",
    selectors: list[str] | None = None,
    config: list[dict[str, Any]] | None = None,
    pool: str = NODE,
    driver: str = DRIVER,
) -> dict[str, Any]:
    """A claim with one request per device, allocated to exactly those devices."""
    name = name or f"claim-{uuidlib.uuid4().hex[:8]}"
    requests = [
        {
            "name": f"r{i}",
            "exactly": {
                "deviceClassName": device_class,
                "selectors": [{"cel": {"expression": e}} for e in selectors or []],
            },
        }
        for i in range(len(devices))
    ]
    results = [{"request": f"r{i}", "driver": driver, "pool": pool, "device": d} for i, d in enumerate(devices)]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": str(uuidlib.uuid4())},
        "spec": {"devices": {"requests": requests}},
        "status": {"allocation": {"devices": {"results": results, "config": config or []}}},
    }


def ref(c: dict[str, Any]) -> ClaimRef:
    m = c["metadata"]
    return ClaimRef(namespace=m["namespace"], name=m["name"], uid=m["uid"])


class Node:
    """A simulated node with its plugin state directories; `driver()` starts (or restarts) the plugin core."""

    def __init__(self, tmp_path: Path, machine: str = "dgx-h100") -> None:
        self.tmp = tmp_path
        self.sim = SimulatedNvml(machine, tmp_path / "gpu")
        self.source = StaticClaimSource(classes=[GPU_CLASS, MIG_CLASS])
        self.plugin_dir = tmp_path / "plugins" / DRIVER
        self.cdi_root = tmp_path / "cdi"

    def add(self, *claims: dict[str, Any]) -> None:
        for c in claims:
            self.source.claims[(c["metadata"]["namespace"], c["metadata"]["name"])] = c

    def driver(
        self,
        boot_id: str = "boot-1",
        sharing_runner: Any = None,
        startup_lock_wait_s: float = STARTUP_LOCK_WAIT_S,
        **settings: Any,
    ) -> Driver:
        """Start the plugin core on this node; `settings` override PluginSettings fields (mode, feature_gates)."""
        fields = {"driver": DRIVER, "pool": NODE, "plugin_dir": self.plugin_dir, "cdi_root": self.cdi_root,
                  "mode": PublishMode.PARTITIONABLE, **settings}  # fmt: skip
        return Driver(
            PluginSettings(**fields),
            self.sim,
            self.source,
            sysfs_root=self.sim.sysfs_root,
            proc_root=self.sim.proc_root,
            boot_id=boot_id,
            sharing_runner=sharing_runner,
            driver_root=self.sim.driver_root,  # CDI specs with the simulated driver's libraries, as in production
            startup_lock_wait_s=startup_lock_wait_s,
        )

    def mig_instances(self) -> list[tuple[int, int, int]]:
        """(gpu index, profile id, placement start) of every GPU instance that exists now."""
        state = self.sim.store.read()
        return sorted((i, gi.profile_id, gi.start) for i, g in enumerate(state.gpus) for gi in g.gpu_instances)

    def cdi_files(self) -> list[str]:
        return sorted(p.name for p in self.cdi_root.glob("*.json")) if self.cdi_root.exists() else []
