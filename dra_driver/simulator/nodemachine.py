"""Which simulated machine a node stands for, when a cluster's nodes stand for different machines.

One DaemonSet runs every node's plugin with the same arguments; a simulated cluster of a DGX H100 and a DGX B200 (or
two trays of one rack) needs each node to pick its own. `plugin --sim-machine-label L` reads the node's label L at
start (its value is a machine of `dra-driver sim list`); a node without the label runs `--sim`. `{machine}` in
`--sim-state` and `--host-driver-root` then stands for the machine chosen, so each machine keeps its own state.
"""

from __future__ import annotations

from pathlib import Path

from dra_driver.kube.rest import ApiError, connect, path_of
from dra_driver.simulator.catalog import machine_names

LOOKUP_TIMEOUT_S = 10.0


class MachineLabelError(ValueError):
    """The node's label names no simulated machine, or the node could not be read."""


def machine_of_node(default: str, label: str, node_name: str, kubeconfig: Path | None) -> str:
    """The value of the Node's `label`, checked against the known machines; `default` when the Node has none."""
    try:
        node = connect(kubeconfig).get(path_of("", "v1", "nodes", node_name), timeout=LOOKUP_TIMEOUT_S)
    except (ApiError, OSError, ValueError) as e:  # ValueError: no kubeconfig and not in a pod
        raise MachineLabelError(f"cannot read Node {node_name} for its label {label}: {e}") from e
    value = str(((node.get("metadata") or {}).get("labels") or {}).get(label) or "")
    if not value:
        return default
    known = machine_names()
    if value not in known:
        raise MachineLabelError(
            f"Node {node_name} has {label}={value}, which is no simulated machine (known: {', '.join(known)})"
        )
    return value


def for_machine(path: Path | None, machine: str) -> Path | None:
    """`path` with `{machine}` replaced by the machine's name."""
    return None if path is None else Path(str(path).replace("{machine}", machine))
