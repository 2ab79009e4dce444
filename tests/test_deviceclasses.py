"""The DeviceClasses in deviceclasses/: accepted by a real kube-apiserver (which compiles their CEL) and
selecting exactly the devices they describe."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dra_driver.cel import CelDevice, compile_selector
from dra_driver.nvml.discovery import discover
from dra_driver.slices.builder import build_slices

CLASSES = sorted((Path(__file__).resolve().parent.parent / "deviceclasses").glob("*.yaml"))
EXPECTED_TYPE = {"gpu.dra-driver.dev": "gpu", "mig.dra-driver.dev": "mig"}


def test_every_class_is_accepted_by_the_api_server(control_plane) -> None:
    for path in CLASSES:
        out = control_plane.kubectl("apply", "--dry-run=server", "-f", str(path))
        assert "created" in out.stdout or "configured" in out.stdout or "unchanged" in out.stdout, out


@pytest.mark.parametrize("path", CLASSES, ids=lambda p: p.stem)
def test_class_selects_its_devices(sim_factory, path: Path) -> None:
    cls = yaml.safe_load(path.read_text())
    sim = sim_factory("mixed")
    slices = build_slices(discover(sim, sim.sysfs_root), node_name="n")
    selectors = [compile_selector(s["cel"]["expression"]) for s in cls["spec"]["selectors"]]
    chosen = set()
    for s in slices:
        for d in s.spec.devices or []:
            dev = CelDevice.from_slice_device(s.spec.driver, d.to_api())
            if all(sel.matches(dev) for sel in selectors):
                chosen.add(str(d.attributes["type"].value()))
    assert chosen == {EXPECTED_TYPE[cls["metadata"]["name"]]}
