"""Shared fixtures. The real control plane (tests/cluster) is a plugin so every test module can use it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.simulator.tools import forkserver

# tests.hostcheck: the session fails when it leaves the host's addresses, routes, ruleset or sysctls changed
pytest_plugins = ["tests.cluster.fixtures", "tests.hostcheck", "tests.netns"]  # netns: the `netns` fixture

# The simulated nvidia-smi that this session's processes run on the host goes through a fork server (0.2 s a call
# instead of 0.8 s); a driver in a pod never has it. DRA_SIM_TOOL_SERVER=0 runs every call as its own process.
os.environ.setdefault(forkserver.ENV, "1")


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


# Tables a test reports (crash recovery, CEL agreement), shown in the terminal summary. They travel as the report's
# user_properties, so they also reach the controller when pytest-xdist runs the tests in worker processes.
SUMMARY_PROPERTY = "summary-table"
_tables: list[tuple[str, str]] = []


@pytest.fixture
def report_table(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    def add(title: str, text: str) -> None:
        request.node.user_properties.append((SUMMARY_PROPERTY, (title, text)))

    return add


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _tables.extend(tuple(value) for name, value in report.user_properties if name == SUMMARY_PROPERTY)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for title, text in _tables:
        terminalreporter.section(title)
        for line in text.splitlines():
            terminalreporter.write_line(line)
