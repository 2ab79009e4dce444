"""The DeviceClasses in deviceclasses/: accepted by a real kube-apiserver (which compiles their CEL), selecting
exactly the devices they describe, and the per-profile MIG classes in step with the product data."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dra_driver.cel import CelDevice, compile_selector
from dra_driver.claimstate.config import decode
from dra_driver.nvml.discovery import discover
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME
from dra_driver.slices.builder import build_slices
from tests.loadscript import load_script

ROOT = Path(__file__).resolve().parent.parent
CLASSES = sorted((ROOT / "deviceclasses").glob("*.yaml"))


def _generator():  # type: ignore[no-untyped-def]
    return load_script(ROOT / "scripts" / "gen_deviceclasses.py")


def test_every_class_is_accepted_by_the_api_server(control_plane) -> None:
    out = control_plane.kubectl("apply", "--dry-run=server", *[a for p in CLASSES for a in ("-f", str(p))])
    assert out.stdout.count("deviceclass.resource.k8s.io/") == len(CLASSES), out.stdout


def test_mig_profile_classes_match_the_product_data() -> None:
    on_disk = {p.name: p.read_text() for p in (ROOT / "deviceclasses").glob("mig-*.yaml")}
    assert on_disk == _generator().generated(), "run: python scripts/gen_deviceclasses.py"


@pytest.mark.parametrize("machine", ["mixed", "dgx-h200", "dgx-b200"])
def test_each_class_selects_its_devices(sim_factory, machine: str) -> None:
    sim = sim_factory(machine)
    slices = build_slices(discover(sim, sim.sysfs_root), node_name="n")
    devices = [(s.spec.driver, d) for s in slices for d in s.spec.devices or []]
    for path in CLASSES:
        cls = yaml.safe_load(path.read_text())
        selectors = [compile_selector(s["cel"]["expression"]) for s in cls["spec"]["selectors"]]
        chosen = {
            d.name
            for driver, d in devices
            if all(sel.matches(CelDevice.from_slice_device(driver, d.to_api())) for sel in selectors)
        }
        name = cls["metadata"]["name"]
        if name.startswith("mig-"):
            profile = name.removeprefix("mig-").removesuffix(f".{DEFAULT_DRIVER_NAME}").replace("-plus-", "+")
            expected = {
                d.name
                for _, d in devices
                if d.attributes.get("profile") is not None and d.attributes["profile"].value() == profile
            }
        else:
            kind = "mig" if name.startswith("mig.") else "gpu"
            expected = {d.name for _, d in devices if d.attributes["type"].value() == kind}
        assert chosen == expected, name
        for cfg in cls["spec"].get("config", []):
            decode(cfg["opaque"]["parameters"])  # the class's opaque config is valid for this driver
