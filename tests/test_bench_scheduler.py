"""bench/bench_scheduler.py measures each Kubernetes version with what that version's users get: the slice layout
the driver publishes for it, and a NUMA constraint on the attribute name it publishes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dra_driver.api.slice import ResourceSlice
from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME
from dra_driver.slices.devices import PublishMode
from dra_driver.slices.limits import limits_for
from dra_driver.slices.validation import validate_pool
from tests.cluster.controlplane import ControlPlane
from tests.test_allocbench import fleet

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_scheduler", ROOT / "bench" / "bench_scheduler.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("minor", [34, 35, 36, 37])
def test_the_fleet_has_the_layout_and_names_of_the_version_it_is_measured_on(
    bench: ModuleType, tmp_path: Path, minor: int
) -> None:
    _, slices = fleet(1, tmp_path, PublishMode.PARTITIONABLE, f"v1.{minor}.0")
    validate_pool([ResourceSlice.model_validate(s) for s in slices], limits_for(minor))
    both = [s for s in slices if s["spec"].get("sharedCounters") and s["spec"].get("devices")]
    assert bool(both) == (minor == 34)  # 1.34 keeps a GPU's counter set beside its devices; later minors may not
    claim, _ = bench.claim_and_pod(0, "gpu", bench.FOUR_NUMA, minor)
    (constraint,) = claim["spec"]["devices"]["constraints"]
    name = constraint["matchAttribute"].removeprefix(f"{DEFAULT_DRIVER_NAME}/")  # as the slices spell our own
    gpus = [d for s in slices for d in s["spec"].get("devices") or [] if d["attributes"]["type"]["string"] == "gpu"]
    assert gpus and all(name in d["attributes"] for d in gpus), constraint


@pytest.mark.parametrize(("mode", "devices"), [(PublishMode.STATIC, 8), (PublishMode.PARTITIONABLE, 208)])
def test_nvidias_slices_are_captured_once_and_replicated_per_node(
    bench: ModuleType, control_plane: ControlPlane, tmp_path: Path, mode: PublishMode, devices: int
) -> None:
    """The side "NVIDIA's slices": what its plugin publishes for one simulated dgx-h100 (default gates beside our
    static, DynamicMIG beside partitionable), renamed for each bench node."""
    names, slices = bench.nvidia_fleet(control_plane, 2, mode, tmp_path)
    assert names == ["node-000", "node-001"]
    for name in names:
        mine = [s for s in slices if s["spec"]["nodeName"] == name]
        assert mine and all(s["spec"]["pool"]["name"] == name for s in mine)
        assert all(s["spec"]["driver"] == bench.NVIDIA_DRIVER for s in mine)
        assert all(s["spec"]["pool"]["resourceSliceCount"] == len(mine) for s in mine)
        assert sum(len(s["spec"].get("devices") or []) for s in mine) == devices
        assert bool([s for s in mine if s["spec"].get("sharedCounters")]) == (mode == PublishMode.PARTITIONABLE)
    assert len({s["metadata"]["name"] for s in slices}) == len(slices)
    assert all(set(s["metadata"]) == {"name"} for s in slices)  # no uid, owner or version of the captured ones
    assert bench.nvidia_fleet(control_plane, 1, mode, tmp_path / "again")[1] == [
        s for s in slices if s["spec"]["nodeName"] == "node-000"
    ]  # captured once per server version and layout


@pytest.mark.usefixtures("control_plane")  # skips where the control plane's binaries are not built
def test_nvidias_slices_schedule_a_tiny_run(bench: ModuleType, tmp_path: Path) -> None:
    """A row of NVIDIA's DynamicMIG slices: the MIG mix (1g.10gb, whole GPUs, 3g.40gb) bound on two nodes."""
    r = bench.run_layout(PublishMode.PARTITIONABLE, "MIG mix", 2, 4, tmp_path, nvidia=True)
    assert (r["layout"], r["devices"], r["bound"], r["pods"]) == ("NVIDIA DynamicMIG", 208, 4, 4)
