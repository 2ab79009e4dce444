"""The prepared GPU-machine check, exercised here on simulated machines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver.nvml.discovery import discover
from dra_driver.simulator.catalog import machine_names, product
from tests.loadscript import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "device_check.py"


def _module():  # type: ignore[no-untyped-def]
    return load_script(SCRIPT)


@pytest.mark.parametrize("name", machine_names())
def test_simulated_hardware_matches_its_data_files(sim_factory, name: str) -> None:
    sim = sim_factory(name)
    mod = _module()
    for gpu in discover(sim, sim.sysfs_root).gpus:
        spec = mod.find_product(gpu)
        assert spec is not None
        assert mod.compare(gpu, spec) == []


def test_every_difference_is_reported(sim_factory) -> None:
    sim = sim_factory("dgx-h200")
    gpu = discover(sim, sim.sysfs_root).gpus[0]
    real = product("h200-sxm5-141gb")
    profiles = [p.model_copy(update={"memory_mib": 71000}) if p.name == "3g.71gb" else p for p in real.mig_profiles]
    profiles = [p for p in profiles if p.name != "1g.18gb+me"]
    altered = real.model_copy(update={"memory_mib": 143000, "mig_profiles": profiles})
    diffs = _module().compare(gpu, altered)
    assert "GPU 0 memory MiB: hardware 143771 != data file 143000" in diffs
    assert "GPU 0 profile 9 (3g.71gb) memory_mib: hardware 71168 != data file 71000" in diffs
    assert any("profile id 20 (1g.18gb+me) is on the GPU, not in the file" in d for d in diffs)


def test_script_runs_end_to_end_and_changes_nothing(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--sim",
            "mixed",
            "--sim-state",
            str(tmp_path / "s"),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no differences between hardware and data files" in out.stdout
    assert (tmp_path / "out" / "inventory.json").is_file() and (tmp_path / "out" / "slices.json").is_file()
    state = (tmp_path / "s" / "nvml-state.json").read_text()
    again = subprocess.run(
        [sys.executable, str(SCRIPT), "--sim", "mixed", "--sim-state", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and (tmp_path / "s" / "nvml-state.json").read_text() == state
