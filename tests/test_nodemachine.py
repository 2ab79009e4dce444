"""dra_driver/simulator/nodemachine.py: `plugin --sim M --sim-machine-label L` runs the simulated machine the Node's
label L names (M without the label), refuses a label naming no machine or a Node it cannot read, and `{machine}` in
--sim-state and --host-driver-root stands for the machine chosen. The API server is a stub: only the Node's GET."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import dra_driver.daemon
import dra_driver.simulator.nodemachine as nodemachine
from dra_driver.cli import build_parser, main
from dra_driver.kube.rest import ApiError
from dra_driver.nvml.source import NvmlSource
from dra_driver.simulator.catalog import machine_names
from dra_driver.simulator.nodemachine import MachineLabelError, for_machine, machine_of_node

LABEL = "sim.gpu.dra-driver.dev/machine"
KUBECONFIG = Path("/etc/dra/kubeconfig")


class _Api:
    """connect(kubeconfig): records the kubeconfig and the GETs, answers each with `node` or raises `error`."""

    def __init__(self, node: dict[str, Any] | None = None, error: BaseException | None = None) -> None:
        self.node, self.error = node, error
        self.kubeconfigs: list[Path | None] = []
        self.gets: list[tuple[str, dict[str, Any]]] = []

    def connect(self, kubeconfig: Path | None = None) -> _Api:
        self.kubeconfigs.append(kubeconfig)
        return self

    def get(self, path: str, **kwargs: Any) -> Any:
        self.gets.append((path, kwargs))
        if self.error is not None:
            raise self.error
        return self.node


def _node(name: str, labels: dict[str, str] | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "uid": "0f0e", "resourceVersion": "7"}
    if labels is not None:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "Node", "metadata": metadata, "status": {}}


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> _Api:
    stub = _Api()
    monkeypatch.setattr(nodemachine, "connect", stub.connect)
    return stub


def test_the_catalog_knows_the_machines_used_here() -> None:
    assert {"dgx-h100", "dgx-b200", "dgx-a100"} <= set(machine_names())


@pytest.mark.parametrize("machine", ["dgx-b200", "dgx-a100", "gb200-nvl72-tray"])
def test_the_label_names_the_machine(api: _Api, machine: str) -> None:
    api.node = _node("worker2", {"kubernetes.io/hostname": "worker2", LABEL: machine})
    assert machine_of_node("dgx-h100", LABEL, "worker2", KUBECONFIG) == machine
    assert api.kubeconfigs == [KUBECONFIG]
    assert api.gets == [("/api/v1/nodes/worker2", {"timeout": nodemachine.LOOKUP_TIMEOUT_S})]
    assert 0 < nodemachine.LOOKUP_TIMEOUT_S <= 60


def test_the_service_account_when_no_kubeconfig(api: _Api) -> None:
    api.node = _node("worker", {LABEL: "dgx-b200"})
    assert machine_of_node("dgx-h100", LABEL, "worker", None) == "dgx-b200"
    assert api.kubeconfigs == [None]


def test_only_the_label_asked_for(api: _Api) -> None:
    api.node = _node("worker", {"other.example.com/machine": "dgx-b200", LABEL: "dgx-a100"})
    assert machine_of_node("dgx-h100", LABEL, "worker", KUBECONFIG) == "dgx-a100"
    assert machine_of_node("dgx-h100", "other.example.com/machine", "worker", KUBECONFIG) == "dgx-b200"


@pytest.mark.parametrize(
    "labels",
    [
        {"kubernetes.io/hostname": "worker"},  # other labels only
        {},
        None,  # a Node without metadata.labels
        {LABEL: ""},  # the label, empty
    ],
)
def test_without_the_label_the_default(api: _Api, labels: dict[str, str] | None) -> None:
    api.node = _node("worker", labels)
    assert machine_of_node("dgx-h100", LABEL, "worker", KUBECONFIG) == "dgx-h100"
    assert machine_of_node("mixed", LABEL, "worker", KUBECONFIG) == "mixed"


def test_a_node_without_metadata_has_no_label(api: _Api) -> None:
    api.node = {"apiVersion": "v1", "kind": "Node"}
    assert machine_of_node("dgx-h100", LABEL, "worker", KUBECONFIG) == "dgx-h100"


@pytest.mark.parametrize("value", ["dgx-z900", "DGX-B200", "dgx-b200 ", "{machine}"])
def test_a_label_naming_no_machine_is_refused(api: _Api, value: str) -> None:
    api.node = _node("worker2", {LABEL: value})
    with pytest.raises(MachineLabelError) as info:
        machine_of_node("dgx-h100", LABEL, "worker2", KUBECONFIG)
    message = str(info.value)
    assert f"{LABEL}={value}" in message and "worker2" in message
    assert ", ".join(machine_names()) in message  # every known machine, listed
    assert isinstance(info.value, ValueError)  # the CLI's error path (dra-driver: error: ..., exit 1)


@pytest.mark.parametrize(
    "error",
    [
        ApiError("GET", "/api/v1/nodes/worker2", 403, "Forbidden", '{"kind":"Status","message":"nodes is forbidden"}'),
        ApiError("GET", "/api/v1/nodes/worker2", 404, "Not Found", '{"message":"nodes \\"worker2\\" not found"}'),
        ConnectionRefusedError(111, "Connection refused"),
        TimeoutError("timed out"),
        OSError("no route to host"),
    ],
    ids=["forbidden", "not-found", "refused", "timeout", "oserror"],
)
def test_a_node_that_cannot_be_read_is_an_error(api: _Api, error: BaseException) -> None:
    api.error = error
    with pytest.raises(MachineLabelError) as info:
        machine_of_node("dgx-h100", LABEL, "worker2", KUBECONFIG)
    message = str(info.value)
    assert "worker2" in message and LABEL in message and str(error) in message
    assert info.value.__cause__ is error


def test_other_errors_are_not_hidden(api: _Api) -> None:
    api.error = RuntimeError("a bug")
    with pytest.raises(RuntimeError, match="a bug"):
        machine_of_node("dgx-h100", LABEL, "worker2", KUBECONFIG)


def test_the_node_name_is_quoted_in_the_path(api: _Api) -> None:
    api.node = _node("a/b", {})
    machine_of_node("dgx-h100", LABEL, "a/b", KUBECONFIG)
    assert api.gets[0][0] == "/api/v1/nodes/a%2Fb"


def test_for_machine() -> None:
    assert for_machine(None, "dgx-b200") is None
    assert for_machine(Path("/var/lib/dra-driver/sim/{machine}"), "dgx-b200") == Path(
        "/var/lib/dra-driver/sim/dgx-b200"
    )
    assert for_machine(Path("/s/{machine}/driver-root/{machine}"), "dgx-h100") == Path(
        "/s/dgx-h100/driver-root/dgx-h100"
    )
    assert for_machine(Path("/var/lib/dra-driver/sim/mixed"), "dgx-b200") == Path("/var/lib/dra-driver/sim/mixed")
    assert for_machine(Path("relative/{machine}"), "dgx-a100") == Path("relative/dgx-a100")


# the plugin subcommand


def test_the_plugin_takes_the_option() -> None:
    args = build_parser().parse_args(["plugin", "--sim", "dgx-h100", "--sim-machine-label", LABEL, "--node-name", "n"])
    assert args.sim_machine_label == LABEL and args.sim == "dgx-h100"
    assert build_parser().parse_args(["plugin", "--sim", "dgx-h100", "--node-name", "n"]).sim_machine_label is None


def _plugin_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "plugin", "--sim", "dgx-h100", "--node-name", "worker2", "--plugin-dir", str(tmp_path / "p"),
        "--kubeconfig", str(KUBECONFIG),
        "--sim-state", str(tmp_path / "sim" / "{machine}"),
        "--host-driver-root", str(tmp_path / "host" / "{machine}" / "driver-root"),
        *extra,
    ]  # fmt: skip


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[NvmlSource]:
    """The source each `plugin` run hands the daemon (which is not started)."""
    sources: list[NvmlSource] = []
    monkeypatch.setattr(dra_driver.daemon, "run", lambda options, source: sources.append(source))
    monkeypatch.setenv("DRA_DRIVER_SIM_STATE", str(tmp_path / "default-state"))
    return sources


def test_the_plugin_runs_the_labelled_machine(api: _Api, ran: list[NvmlSource], tmp_path: Path) -> None:
    api.node = _node("worker2", {LABEL: "dgx-b200"})
    assert main(_plugin_args(tmp_path, "--sim-machine-label", LABEL)) == 0
    assert api.kubeconfigs == [KUBECONFIG] and api.gets[0][0] == "/api/v1/nodes/worker2"
    (source,) = ran
    assert source.description.startswith("simulated dgx-b200 ")
    assert str(tmp_path / "sim" / "dgx-b200") in source.description
    assert source.host_driver_root == tmp_path / "host" / "dgx-b200" / "driver-root"
    source.lib.nvmlInit()
    try:
        assert "B200" in source.lib.nvmlDeviceGetName(source.lib.nvmlDeviceGetHandleByIndex(0))
    finally:
        source.lib.nvmlShutdown()
    assert (tmp_path / "sim" / "dgx-b200").is_dir() and not (tmp_path / "sim" / "{machine}").exists()


def test_the_plugin_without_the_label_runs_sim(api: _Api, ran: list[NvmlSource], tmp_path: Path) -> None:
    api.node = _node("worker2", {})
    assert main(_plugin_args(tmp_path, "--sim-machine-label", LABEL)) == 0
    (source,) = ran
    assert source.description.startswith("simulated dgx-h100 ")
    assert source.host_driver_root == tmp_path / "host" / "dgx-h100" / "driver-root"
    assert (tmp_path / "sim" / "dgx-h100").is_dir() and not (tmp_path / "sim" / "{machine}").exists()


def test_the_plugin_without_the_option_reads_no_node(api: _Api, ran: list[NvmlSource], tmp_path: Path) -> None:
    api.node = _node("worker2", {LABEL: "dgx-b200"})
    assert main(_plugin_args(tmp_path)) == 0
    assert api.gets == []
    (source,) = ran
    assert source.description.startswith("simulated dgx-h100 ")  # --sim; {machine} still stands for it
    assert source.host_driver_root == tmp_path / "host" / "dgx-h100" / "driver-root"


def test_the_plugin_refuses_a_label_naming_no_machine(
    api: _Api, ran: list[NvmlSource], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api.node = _node("worker2", {LABEL: "dgx-z900"})
    assert main(_plugin_args(tmp_path, "--sim-machine-label", LABEL)) == 1
    assert ran == []
    err = capsys.readouterr().err
    assert err.startswith("dra-driver: error: ") and f"{LABEL}=dgx-z900" in err and "dgx-b200" in err
    assert not (tmp_path / "sim").exists()


def test_the_plugin_stops_when_the_node_cannot_be_read(
    api: _Api, ran: list[NvmlSource], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api.error = ApiError("GET", "/api/v1/nodes/worker2", 403, "Forbidden", '{"message":"nodes is forbidden"}')
    assert main(_plugin_args(tmp_path, "--sim-machine-label", LABEL)) == 1
    assert ran == []
    assert "cannot read Node worker2" in capsys.readouterr().err
