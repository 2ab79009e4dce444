"""Discovery through the NVML layer: the same code runs over pynvml and over the simulator."""

from __future__ import annotations

import pynvml
import pytest

from dra_driver.nvml.api import real_nvml
from dra_driver.nvml.discovery import DiscoveryError, cuda_version_string, discover
from dra_driver.nvml.pcie import normalize_bus_id
from dra_driver.simulator.catalog import machine, machine_names, product
from tests.simhelpers import create_full_ci, create_gi


@pytest.mark.parametrize("name", machine_names())
def test_inventory_matches_machine_definition(sim_factory, name: str) -> None:
    sim = sim_factory(name)
    inv = discover(sim, sim.sysfs_root)
    spec = machine(name)
    assert len(inv.gpus) == len(spec.gpus)
    assert inv.driver_version == spec.driver_version
    for gpu, g in zip(inv.gpus, spec.gpus, strict=True):
        prod = product(g.product)
        assert gpu.product_name == prod.name
        assert gpu.memory_bytes == prod.memory_mib << 20
        assert gpu.pci_bus_id == normalize_bus_id(g.pci_bus_id)
        assert gpu.pcie_root == g.pcie_root
        assert gpu.uuid.startswith("GPU-")
        assert gpu.mig_enabled == g.mig_enabled
        assert {(p.id, p.name) for p in gpu.mig_profiles} == {(p.id, p.name) for p in prod.mig_profiles}
        for p in gpu.mig_profiles:
            assert p.name == p.driver_name  # formula agrees with what the driver reports
            assert [pl.start for pl in p.placements] == prod.mig_profiles[
                [q.id for q in prod.mig_profiles].index(p.id)
            ].placements
    assert len({g.uuid for g in inv.gpus}) == len(inv.gpus)


def test_mixed_node_details(sim_factory) -> None:
    sim = sim_factory("mixed")
    inv = discover(sim, sim.sysfs_root)
    assert [(g.index, g.minor) for g in inv.gpus[:2]] == [(0, 1), (1, 0)]  # minor is not the NVML index
    a100_on, a100_off, h100, _, l40s = inv.gpus
    assert a100_on.mig_enabled and a100_on.mig_toggle_needs_reset and a100_on.architecture == "Ampere"
    assert not a100_off.mig_enabled and a100_off.mig_capable
    assert not h100.mig_toggle_needs_reset and h100.architecture == "Hopper"
    assert not l40s.mig_capable and l40s.mig_profiles == () and l40s.architecture == "Ada Lovelace"
    assert inv.gpu_by_minor(0) is a100_off
    assert h100.cuda_compute_capability == "9.0" and inv.cuda_driver_version == "12.4"


def test_existing_mig_devices_are_discovered(sim_factory) -> None:
    sim = sim_factory("dgx-h100")
    dev = sim.nvmlDeviceGetHandleByIndex(2)
    sim.nvmlDeviceSetMigMode(dev, pynvml.NVML_DEVICE_MIG_ENABLE)
    gi = create_gi(sim, dev, 9, 4, 4)
    ci = create_full_ci(sim, gi, 3)
    mig_uuid = sim.nvmlDeviceGetUUID(sim.nvmlComputeInstanceGetInfo(ci).device)
    inv = discover(sim, sim.sysfs_root)
    (inst,) = inv.gpus[2].mig_instances
    assert inst.uuid == mig_uuid
    assert (inst.profile_id, inst.profile_name, inst.placement.start, inst.placement.size) == (9, "3g.40gb", 4, 4)
    assert inst.gpu_instance_id == sim.nvmlGpuInstanceGetInfo(gi).id
    assert inst.multiprocessors == 60
    assert inv.gpus[2].mig_enabled and not inv.gpus[1].mig_enabled


def test_discovery_changes_nothing(sim_factory) -> None:
    sim = sim_factory("mixed")
    before = sim.store.path.read_bytes()
    discover(sim, sim.sysfs_root)
    assert sim.store.path.read_bytes() == before


def test_real_backend_without_driver_is_a_clear_error() -> None:
    # This machine has no NVIDIA driver: the real pynvml fails to load libnvidia-ml.
    with pytest.raises(DiscoveryError, match=r"cannot initialise NVML: .*--sim MACHINE"):
        discover(real_nvml())


def test_lost_gpu_is_a_discovery_error(sim_factory) -> None:
    sim = sim_factory("dgx-h100")
    sim.set_gpu_lost(5)
    with pytest.raises(DiscoveryError, match="GPU 5"):
        discover(sim, sim.sysfs_root)


@pytest.mark.parametrize(("raw", "bdf"), [("00000000:1B:00.0", "0000:1b:00.0"), ("00000001:C3:00.1", "0001:c3:00.1")])
def test_bus_id_normalisation(raw: str, bdf: str) -> None:
    assert normalize_bus_id(raw) == bdf


def test_cuda_version_string() -> None:
    assert cuda_version_string(12040) == "12.4"
    assert cuda_version_string(13000) == "13.0"
