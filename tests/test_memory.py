"""dra_driver.memory: freed heap goes back to the kernel, and the arena cap is taken (glibc)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest

PROGRAM = textwrap.dedent(
    """
    import sys
    from dra_driver import memory

    def rss_mb():
        with open("/proc/self/status") as f:
            return int(f.read().split("VmRSS:")[1].split()[0]) // 1024

    assert memory.limit_arenas()
    blocks = [bytearray(100_000) for _ in range(2000)]  # below the mmap threshold: on the heap
    keep = bytearray(100_000)  # above them, so free() alone cannot shrink the heap
    del blocks
    before = rss_mb()
    memory.trim()
    print(before, rss_mb())
    """
)


def test_trim_hands_freed_heap_back_to_the_kernel() -> None:
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, check=True)
    before, after = map(int, out.stdout.split())
    assert before - after > 150, (before, after)  # ~200 MB were freed but still resident


def test_memory_is_trimmed_once_after_each_burst_of_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon ticks every second with the driver's call count: a trim on the first quiet tick after calls,
    none while calls go on or while nothing happens."""
    from dra_driver import memory

    trims: list[int] = []
    monkeypatch.setattr(memory, "trim", lambda: trims.append(1) or True)
    idle = memory.TrimWhenIdle(calls=4)
    ticks = [4, 4, 9, 30, 30, 30, 31, 31]  # quiet since start; a burst; quiet; one more call; quiet
    assert [idle.tick(c) for c in ticks] == [False, False, False, False, True, False, False, True]
    assert len(trims) == 2


def test_the_catalog_of_a_dgx_h100_holds_its_208_devices_in_well_under_a_megabyte(tmp_path: Path) -> None:
    """The daemon keeps its catalog for its whole life: as pydantic models, a DGX H100's devices (every MIG
    placement) took megabytes; as JSON they stay under one. Selectors still see the device as published."""
    from dra_driver.nvml.discovery import discover
    from dra_driver.plugin.catalog import build_catalog
    from dra_driver.simulator.nvml import SimulatedNvml
    from dra_driver.slices.devices import PublishMode, gpu_devices

    sim = SimulatedNvml("dgx-h100", tmp_path / "gpu")
    sim.nvmlInit()
    inventory = discover(sim, sim.sysfs_root)
    build_catalog(inventory, PublishMode.PARTITIONABLE)  # modules and caches loaded
    gc.collect()
    tracemalloc.start()
    try:
        catalog = build_catalog(inventory, PublishMode.PARTITIONABLE)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(catalog) == 208
    assert held < 1_000_000, held
    mode = PublishMode.PARTITIONABLE
    published = {d.name: d for g in inventory.gpus for d in gpu_devices(inventory, g, mode).devices}
    entry = catalog["gpu-3-mig-1g10gb-19-2"]
    assert json.loads(entry.device_json) == published[entry.name].to_api()
    assert (entry.device_type, entry.multiple_allocations) == ("mig", False)
    cel = entry.cel_device("gpu.dra-driver.dev")
    assert cel is entry.cel_device("gpu.dra-driver.dev")  # converted once
