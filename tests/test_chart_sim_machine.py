"""deploy/helm/dra-driver with nvml.simulator.machineLabel: one DaemonSet for a cluster of different simulated
machines. Each node's plugin reads the label at start (`--sim-machine-label`), and its state directory and the driver
root its CDI specs name are those of the machine chosen (`{machine}`, which the plugin fills in); without the label
the chart names nvml.simulator.machine, as before. Rendered with `helm template` (tests/test_helm_chart.py's helm)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.cli import build_parser
from dra_driver.simulator.nodemachine import for_machine
from tests.test_helm_chart import CHART, NAMESPACE, Helm, _host_paths, _plugin, _render, _run, helm

__all__ = ["helm"]  # the fixture, shared with tests/test_helm_chart.py

LABEL = "sim.gpu.dra-driver.dev/machine"
SIM = ("--set", "nvml.backend=simulator")
WITH_LABEL = (*SIM, "--set", f"nvml.simulator.machineLabel={LABEL}")
STATE_MOUNT = "/var/lib/dra-driver/sim"


def _args(helm: Helm, *values: str) -> list[str]:
    args = _plugin(_render(helm, *values))["c"]["args"]
    assert isinstance(args, list)
    return [str(a) for a in args]


def _sim_args(args: list[str]) -> list[str]:
    return [a for a in args if a.startswith(("--sim", "--host-driver-root"))]


def test_the_label_reaches_the_plugin(helm: Helm) -> None:
    args = _args(helm, *WITH_LABEL)
    assert _sim_args(args) == [
        "--sim=dgx-h100",  # a node without the label
        f"--sim-machine-label={LABEL}",
        f"--sim-state={STATE_MOUNT}/{{machine}}",
        f"--host-driver-root={STATE_MOUNT}/{{machine}}/driver-root",
        "--sim-persistenced",
    ]
    assert args[0] == "plugin"


def test_without_the_label_the_machine_is_named(helm: Helm) -> None:
    for values in (SIM, (*SIM, "--set", "nvml.simulator.machineLabel=")):
        args = _args(helm, *values)
        assert _sim_args(args) == [
            "--sim=dgx-h100",  # the chart's default machine
            f"--sim-state={STATE_MOUNT}/dgx-h100",
            f"--host-driver-root={STATE_MOUNT}/dgx-h100/driver-root",
            "--sim-persistenced",
        ]
        assert not [a for a in args if "machine-label" in a or "{machine}" in a]


def test_another_default_machine_and_state_host_path(helm: Helm) -> None:
    values = ("--set", "nvml.simulator.machine=dgx-b200", "--set", "nvml.simulator.stateHostPath=/srv/sim/")
    labelled = _args(helm, *WITH_LABEL, *values)
    assert "--sim=dgx-b200" in labelled
    assert f"--sim-state={STATE_MOUNT}/{{machine}}" in labelled  # the mount inside the pod does not move
    assert "--host-driver-root=/srv/sim/{machine}/driver-root" in labelled  # the host's path, cleaned
    plain = _args(helm, *SIM, *values)
    assert f"--sim-state={STATE_MOUNT}/dgx-b200" in plain
    assert "--host-driver-root=/srv/sim/dgx-b200/driver-root" in plain
    assert not [a for a in plain if "machine-label" in a]


def test_the_real_backend_ignores_the_label(helm: Helm) -> None:
    args = _args(helm, "--set", f"nvml.simulator.machineLabel={LABEL}")
    assert "--nvml" in args
    assert not [a for a in args if a.startswith("--sim") or "{machine}" in a]


@pytest.mark.parametrize("machine", ["dgx-h100", "dgx-b200"])
def test_each_machines_state_is_in_the_mounted_host_directory(helm: Helm, machine: str) -> None:
    """What the plugin makes of the rendered args: its state in the sim-state mount, in the host directory the CDI
    specs' driver root names."""
    p = _plugin(_render(helm, *WITH_LABEL, "--set", "nvml.simulator.stateHostPath=/srv/sim"))
    args = build_parser().parse_args(p["c"]["args"])
    assert args.sim == "dgx-h100" and args.sim_machine_label == LABEL
    mount = Path(p["mounts"]["sim-state"]["mountPath"])
    host = Path(_host_paths(p["pod"])["sim-state"])
    assert (mount, host) == (Path(STATE_MOUNT), Path("/srv/sim"))
    state, host_root = for_machine(args.sim_state, machine), for_machine(args.host_driver_root, machine)
    assert state is not None and host_root is not None
    assert state.relative_to(mount) == Path(machine)
    assert host_root == host / state.relative_to(mount) / "driver-root"


def test_lint_is_clean_with_the_label(helm: Helm) -> None:
    out = _run(helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE, *WITH_LABEL).stdout
    assert "0 chart(s) failed" in out, out


def _values() -> dict[str, Any]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(values, dict)
    return values


def test_the_label_is_off_by_default() -> None:
    simulator = _values()["nvml"]["simulator"]
    assert simulator["machineLabel"] == "" and simulator["machine"] == "dgx-h100"
