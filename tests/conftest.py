"""Shared fixtures. The real control plane (tests/cluster) is a plugin so every test module can use it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.simulator.nvml import SimulatedNvml

pytest_plugins = ["tests.cluster.fixtures"]


@pytest.fixture
def sim_factory(tmp_path: Path) -> Iterator[object]:
    """Make a SimulatedNvml for a named machine with its own state directory, already initialised."""
    made: list[SimulatedNvml] = []

    def make(machine: str, state: Path | None = None) -> SimulatedNvml:
        sim = SimulatedNvml(machine, state or tmp_path / f"sim-{machine}-{len(made)}")
        sim.nvmlInit()
        made.append(sim)
        return sim

    yield make
