"""Sharing applied at prepare: time-slice intervals, compute modes and a per-claim MPS control daemon, undone at
unprepare, after a failure and after a crash (dra_driver.sharing), through the simulated driver tools run as real
processes from the simulated driver root (dra_driver.simulator.tools)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_driver.cdi.spec import spec_file_name
from dra_driver.claimstate.checkpoint import ClaimState, MpsRecord, TimeSlicingRecord
from dra_driver.plugin import machine
from dra_driver.plugin.driver import Driver
from dra_driver.plugin.failures import FailureKind
from dra_driver.sharing import CommandResult, DriverRootRunner, RealRunner, SharingError, SharingManager, default_runner
from dra_driver.simulator.elf import shared_object
from dra_driver.simulator.tools.state import STATE_FILE, SharingState
from tests.plugin_helpers import DRIVER, Node, claim, ref
from tests.sharing_helpers import daemon_pids, no_daemon_left
from tests.test_cdi import _validate, cdivalidate  # noqa: F401  (the session fixture that builds the validator)

CONFIG_API = "gpu.resource.dra-driver.dev/v1alpha1"
EXCLUSIVE = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS


class Killed(BaseException):  # like SIGKILL: no except-block runs
    pass


def cfg(sharing: dict[str, Any], *, kind: str = "GpuConfig", requests: list[str] | None = None) -> dict[str, Any]:
    return {
        "source": "FromClaim",
        "requests": requests or [],
        "opaque": {"driver": DRIVER, "parameters": {"apiVersion": CONFIG_API, "kind": kind, "sharing": sharing}},
    }


def time_slicing(interval: str | None = None, **kw: Any) -> dict[str, Any]:
    sharing: dict[str, Any] = {"strategy": "TimeSlicing"}
    if interval is not None:
        sharing["timeSlicingConfig"] = {"interval": interval}
    return cfg(sharing, **kw)


def mps(percentage: int | None = None, pinned: str | None = None, **kw: Any) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if percentage is not None:
        config["defaultActiveThreadPercentage"] = percentage
    if pinned is not None:
        config["defaultPinnedDeviceMemoryLimit"] = pinned
    return cfg({"strategy": "MPS", "mpsConfig": config}, **kw)


class Recording:
    """The node's tools (its driver root's, real processes), recording each call as the manager makes it (tool
    name, its environment, stdin). `fail(argv, input)` may return a result to answer instead (the tool does not
    run) or raise; `after(argv, input)` runs once the tool did. Reads the tools' shared state."""

    def __init__(self, node: Node) -> None:
        self.inner = DriverRootRunner(node.sim.driver_root)
        self.state = SharingState(node.sim.state_dir)
        self.calls: list[dict[str, Any]] = []
        self.fail: Any = None
        self.after: Any = None

    def run(
        self, argv: list[str], *, env: Any = None, input: str | None = None, timeout: float | None = None
    ) -> CommandResult:
        self.calls.append({"argv": list(argv), "env": dict(env or {}), "input": input})
        if self.fail is not None and (answer := self.fail(argv, input)) is not None:
            return answer  # type: ignore[no-any-return]
        result = self.inner.run(argv, env=env, input=input, timeout=timeout)
        if self.after is not None:
            self.after(argv, input)
        return result

    def timeslice(self, uuid: str) -> int:
        return self.state.timeslice(uuid)

    def mode(self, uuid: str) -> int:
        return self.state.compute_mode(uuid)

    def daemons(self) -> dict[str, dict[str, Any]]:
        return self.state.daemons()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    node = Node(tmp_path)
    with no_daemon_left(node.sim.state_dir):
        yield node


@pytest.fixture
def runner(node: Node) -> Recording:
    return Recording(node)


def start(node: Node, runner: Any) -> Driver:
    return node.driver(sharing_runner=runner)


def uid(c: dict[str, Any]) -> str:
    return str(c["metadata"]["uid"])


def spec(node: Node, c: dict[str, Any]) -> dict[str, Any]:
    return json.loads((node.cdi_root / spec_file_name(DRIVER, uid(c))).read_text())  # type: ignore[no-any-return]


def mps_root(node: Node) -> Path:
    return node.plugin_dir / "mps"


def query(uuid: str) -> list[str]:
    return ["nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader", "-i", uuid]


def set_slice(uuid: str, interval: int) -> list[str]:
    return ["nvidia-smi", "compute-policy", "-i", uuid, "--set-timeslice", str(interval)]


def set_mode(uuid: str, mode: str) -> list[str]:
    return ["nvidia-smi", "-i", uuid, "-c", mode]


def assert_nothing_left(node: Node, d: Driver, runner: Recording) -> None:
    assert node.cdi_files() == [] and d.checkpoint.claims == {} and node.mig_instances() == []
    assert all(runner.timeslice(u) == 0 for u in node.sim.gpu_uuids)
    assert all(runner.mode(u) == pynvml.NVML_COMPUTEMODE_DEFAULT for u in node.sim.gpu_uuids)
    assert runner.daemons() == {} and daemon_pids(node.sim.state_dir) == []
    assert not mps_root(node).exists() or list(mps_root(node).iterdir()) == []


# ----- time-slicing ---------------------------------------------------------------------------------------------
def test_time_slice_is_set_recorded_and_reset(node: Node, runner: Recording) -> None:
    c = claim(["gpu-3"], config=[time_slicing("Long")])
    node.add(c)
    d = start(node, runner)
    assert d.prepare([ref(c)])[uid(c)].error == ""
    gpu = d.inventory.gpu_by_minor(3).uuid
    assert [call["argv"] for call in runner.calls] == [query(gpu), set_slice(gpu, 3)]  # Default already: no -c
    assert runner.timeslice(gpu) == 3
    # the tools ran as processes: their state is a file under the simulator's state directory
    assert (node.sim.state_dir / STATE_FILE).exists()
    tool_calls = [c["argv"] for c in runner.state.calls]
    assert tool_calls[-1] == [str(node.sim.driver_root / "usr" / "bin" / "nvidia-smi"), *set_slice(gpu, 3)[1:]]
    record = d.checkpoint.claims[uid(c)].devices[0].sharing
    assert record == TimeSlicingRecord(gpu_uuid=gpu, interval=3, compute_mode="Default", applied=True)
    saved = json.loads((node.plugin_dir / "checkpoint.json").read_text())
    assert saved["data"]["claims"][uid(c)]["devices"][0]["sharing"] == record.model_dump()
    again = d.prepare([ref(c)])[uid(c)]  # idempotent: no command
    assert again.error == "" and len(runner.calls) == 2
    assert d.unprepare([ref(c)]) == {uid(c): None}
    assert [call["argv"] for call in runner.calls[2:]] == [set_slice(gpu, 0)]
    assert_nothing_left(node, d, runner)


def test_time_slicing_sets_compute_mode_default_and_restores_the_mode_found(node: Node, runner: Recording) -> None:
    gpu = node.sim.gpu_uuids[1]
    runner.state.set_compute_mode(gpu, EXCLUSIVE)  # an administrator's choice, before the claim
    c = claim(["gpu-1"], config=[time_slicing("Medium")])
    node.add(c)
    d = start(node, runner)
    assert d.prepare([ref(c)])[uid(c)].error == ""
    assert [call["argv"] for call in runner.calls] == [query(gpu), set_mode(gpu, "DEFAULT"), set_slice(gpu, 2)]
    handle = node.sim.nvmlDeviceGetHandleByUUID(gpu)
    assert node.sim.nvmlDeviceGetComputeMode(handle) == pynvml.NVML_COMPUTEMODE_DEFAULT  # NVML sees what was set
    record = d.checkpoint.claims[uid(c)].devices[0].sharing
    assert record is not None and record.compute_mode == "Exclusive_Process"
    assert d.unprepare([ref(c)]) == {uid(c): None}
    assert [call["argv"] for call in runner.calls[3:]] == [set_slice(gpu, 0), set_mode(gpu, "EXCLUSIVE_PROCESS")]
    assert node.sim.nvmlDeviceGetComputeMode(handle) == EXCLUSIVE
    runner.state.set_compute_mode(gpu, pynvml.NVML_COMPUTEMODE_DEFAULT)
    assert_nothing_left(node, d, runner)


def test_time_slicing_without_interval_means_default_and_mig_devices_get_none(node: Node, runner: Recording) -> None:
    whole = claim(["gpu-0"], config=[time_slicing()])
    part = claim(
        ["gpu-1-mig-1g10gb-19-0"], device_class="mig", config=[cfg({"strategy": "TimeSlicing"}, kind="MigDeviceConfig")]
    )
    plain = claim(["gpu-2"])
    node.add(whole, part, plain)
    d = start(node, runner)
    results = d.prepare([ref(whole), ref(part), ref(plain)])
    assert all(r.error == "" for r in results.values()), results
    gpu0 = d.inventory.gpu_by_minor(0).uuid
    assert [call["argv"] for call in runner.calls] == [query(gpu0), set_slice(gpu0, 0)]
    assert d.checkpoint.claims[uid(part)].devices[0].sharing is None
    assert d.checkpoint.claims[uid(plain)].devices[0].sharing is None
    assert all(e is None for e in d.unprepare([ref(whole), ref(part), ref(plain)]).values())
    assert_nothing_left(node, d, runner)


def test_a_gpu_nvidia_smi_cannot_find_is_a_per_claim_error_and_changes_nothing(node: Node, runner: Recording) -> None:
    gone = node.sim.gpu_uuids[1]  # nvidia-smi no longer sees this GPU (NVML still lists it)
    runner.fail = lambda argv, _: CommandResult(argv, 6, "No devices were found\n", "") if gone in argv else None
    both = claim(["gpu-0", "gpu-1"], config=[time_slicing("Short")])
    shared = claim(["gpu-1"], config=[mps(50)])
    fine = claim(["gpu-2"], config=[time_slicing("Medium")])
    node.add(both, shared, fine)
    d = start(node, runner)
    results = d.prepare([ref(both), ref(shared), ref(fine)])
    for c in (both, shared):
        failure = results[uid(c)].failure
        assert failure is not None and failure.kind is FailureKind.SHARING
        assert f"read compute mode of GPU {gone}" in results[uid(c)].error
        assert "exited with 6: No devices were found" in results[uid(c)].error
        assert results[uid(c)].devices == []
    assert results[uid(fine)].error == ""  # the other claim of the same call is not affected
    gpu0 = node.sim.gpu_uuids[0]
    assert [c["argv"] for c in runner.calls if gpu0 in c["argv"]] == [query(gpu0)]  # read before any change
    assert runner.timeslice(gpu0) == 0 and runner.timeslice(gone) == 0
    assert set(d.checkpoint.claims) == {uid(fine)}
    assert node.cdi_files() == [spec_file_name(DRIVER, uid(fine))]
    assert not mps_root(node).exists() and runner.daemons() == {}  # no MPS directory was even made
    d.unprepare([ref(fine)])
    assert_nothing_left(node, d, runner)


def test_a_set_that_fails_midway_is_undone(node: Node, runner: Recording) -> None:
    second = node.sim.gpu_uuids[1]
    runner.fail = lambda argv, _: CommandResult(argv, 15, "GPU is lost\n", "") if argv == set_slice(second, 1) else None
    c = claim(["gpu-0", "gpu-1"], config=[time_slicing("Short")])
    node.add(c)
    d = start(node, runner)
    assert "exited with 15: GPU is lost" in d.prepare([ref(c)])[uid(c)].error
    first = node.sim.gpu_uuids[0]
    assert [c["argv"][-1] for c in runner.calls if first in c["argv"] and "compute-policy" in c["argv"]] == ["1", "0"]
    assert_nothing_left(node, d, runner)


def test_a_reset_that_fails_keeps_the_claim_for_the_kubelet_to_retry(node: Node, runner: Recording) -> None:
    c = claim(["gpu-0"], config=[time_slicing("Long")])
    node.add(c)
    d = start(node, runner)
    assert d.prepare([ref(c)])[uid(c)].error == ""
    runner.fail = lambda argv, _: CommandResult(argv, 15, "GPU is lost", "") if argv[-1] == "0" else None
    failure = d.unprepare([ref(c)])[uid(c)]
    assert failure is not None and "GPU is lost" in failure.message and failure.kind is FailureKind.SHARING
    assert uid(c) in d.checkpoint.claims and node.cdi_files() != []
    runner.fail = None
    assert d.unprepare([ref(c)]) == {uid(c): None}
    assert_nothing_left(node, d, runner)


# ----- MPS ------------------------------------------------------------------------------------------------------
def test_mps_daemon_directories_and_cdi_edits(node: Node, runner: Recording) -> None:
    c = claim(["gpu-4", "gpu-5"], config=[mps(50, "10Gi")])
    node.add(c)
    d = start(node, runner)
    assert d.prepare([ref(c)])[uid(c)].error == ""
    root = mps_root(node) / uid(c)
    assert sorted(p.name for p in root.iterdir()) == ["log", "pipe", "shm"]
    uuids = [d.inventory.gpu_by_minor(m).uuid for m in (4, 5)]
    *smi_calls, daemon_call, settings_call = runner.calls
    assert [call["argv"] for call in smi_calls] == [query(u) for u in uuids] + [
        set_mode(u, "EXCLUSIVE_PROCESS") for u in uuids
    ]  # before the daemon starts
    assert daemon_call["argv"] == ["nvidia-cuda-mps-control", "-d"]
    assert daemon_call["env"] == {
        "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(root / "log"),
        "CUDA_VISIBLE_DEVICES": ",".join(uuids),
    }
    assert settings_call["argv"] == ["nvidia-cuda-mps-control"]
    assert settings_call["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(root / "pipe")
    (pipe, daemon), = runner.daemons().items()  # fmt: skip
    assert pipe == str(root / "pipe") and daemon_pids(node.sim.state_dir) == [daemon["pid"]]
    assert daemon["visible"] == uuids and daemon["log"] == str(root / "log")
    assert daemon["compute_modes"] == dict.fromkeys(uuids, "Exclusive_Process")  # what the daemon found
    assert daemon["commands"] == [
        "set_default_active_thread_percentage 50",
        "set_default_device_pinned_mem_limit 0 10240M",
        "set_default_device_pinned_mem_limit 1 10240M",
    ]
    assert (root / "log" / "control.log").is_file()
    edits = spec(node, c)["containerEdits"]
    assert edits["env"] == [f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]
    assert edits["mounts"][-2:] == [  # after the driver's files
        {"hostPath": str(root / "pipe"), "containerPath": "/tmp/nvidia-mps", "options": ["rbind", "rw"]},
        {"hostPath": str(root / "shm"), "containerPath": "/dev/shm", "options": ["rbind", "rw"]},
    ]
    records = [dev.sharing for dev in d.checkpoint.claims[uid(c)].devices]
    assert records == [
        MpsRecord(dir=str(root), uuid=u, gpu_uuid=u, compute_mode="Default", applied=True) for u in uuids
    ]
    before = len(runner.calls)
    assert d.unprepare([ref(c)]) == {uid(c): None}
    quit_, *restores = runner.calls[before:]
    assert quit_["input"] == "quit\n" and [r["argv"] for r in restores] == [set_mode(u, "DEFAULT") for u in uuids]
    assert not root.exists()
    assert_nothing_left(node, d, runner)


def test_mps_on_a_mig_device_and_per_request_configs(node: Node, runner: Recording) -> None:
    c = claim(
        ["gpu-6-mig-3g40gb-9-0", "gpu-6-mig-3g40gb-9-4"],
        device_class="mig",
        config=[mps(kind="MigDeviceConfig", requests=["r1"])],
    )
    node.add(c)
    d = start(node, runner)
    assert d.prepare([ref(c)])[uid(c)].error == ""
    first, second = d.checkpoint.claims[uid(c)].devices
    assert first.sharing is None and second.mig is not None and second.sharing is not None
    assert isinstance(second.sharing, MpsRecord)
    assert second.sharing.gpu_uuid is None and second.sharing.compute_mode is None  # a MIG device: not its GPU's
    (daemon,) = runner.daemons().values()
    assert daemon["visible"] == [second.mig.uuid] and daemon["commands"] == []
    # the GPU's compute mode is left alone: it is every MIG device's on that GPU (NVIDIA's plugin does the same)
    assert [call["argv"] for call in runner.calls] == [["nvidia-cuda-mps-control", "-d"]]
    assert runner.mode(node.sim.gpu_uuids[6]) == pynvml.NVML_COMPUTEMODE_DEFAULT
    assert d.unprepare([ref(c)]) == {uid(c): None}
    assert_nothing_left(node, d, runner)


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ([mps(50, requests=["r0"]), mps(60, requests=["r1"])], "need the same defaultActiveThreadPercentage"),
        ([mps(pinned="lots")], "defaultPinnedDeviceMemoryLimit: 'lots'"),
        ([mps(pinned="1Ki")], "'1Ki' is out of range (allowed: 1Mi to 1Ti)"),
    ],
)
def test_mps_settings_that_cannot_be_applied_are_refused_before_any_change(
    node: Node, runner: Recording, configs: list[dict[str, Any]], message: str
) -> None:
    c = claim(["gpu-0", "gpu-1"], config=configs)
    node.add(c)
    d = start(node, runner)
    result = d.prepare([ref(c)])[uid(c)]
    assert message in result.error
    assert result.failure is not None and result.failure.kind is FailureKind.INVALID_CONFIG
    assert runner.calls == []
    assert_nothing_left(node, d, runner)


def _mps_raw(**mps_config: Any) -> dict[str, Any]:
    return cfg({"strategy": "MPS", "mpsConfig": mps_config}, requests=["r1"])


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (_mps_raw(defaultPinnedDeviceMemoryLimit="1e30"), ["defaultPinnedDeviceMemoryLimit", "'1e30'", "1Mi", "1Ti"]),
        (_mps_raw(defaultPinnedDeviceMemoryLimit="2Ti"), ["defaultPinnedDeviceMemoryLimit", "'2Ti'", "1Mi", "1Ti"]),
        (_mps_raw(defaultPinnedDeviceMemoryLimit="-1Gi"), ["defaultPinnedDeviceMemoryLimit", "'-1Gi'", "1Ti"]),
        (_mps_raw(defaultPinnedDeviceMemoryLimit="1Ki"), ["defaultPinnedDeviceMemoryLimit", "'1Ki'", "1Mi"]),
        # Kubernetes refuses a quantity with a trailing newline; "$" alone would accept it as 1Gi
        (
            _mps_raw(defaultPinnedDeviceMemoryLimit="1Gi\n"),
            ["defaultPinnedDeviceMemoryLimit", "'1Gi\\n'", "quantities must match"],
        ),
        # an exponent this large takes minutes and gigabytes to evaluate exactly: refused before evaluating
        (_mps_raw(defaultPinnedDeviceMemoryLimit="1e999999999"), ["defaultPinnedDeviceMemoryLimit", "1Ti"]),
        (_mps_raw(defaultPinnedDeviceMemoryLimit="1" * 100 + "Mi"), ["defaultPinnedDeviceMemoryLimit", "1Ti"]),
        (
            _mps_raw(defaultActiveThreadPercentage=0),
            ["defaultActiveThreadPercentage", "0 is out of range", "from 1 to 100"],
        ),
        (_mps_raw(defaultActiveThreadPercentage=101), ["defaultActiveThreadPercentage", "101", "from 1 to 100"]),
        (_mps_raw(defaultActiveThreadPercentage=-5), ["defaultActiveThreadPercentage", "-5", "from 1 to 100"]),
        (_mps_raw(defaultActiveThreadPercentage=1e30), ["defaultActiveThreadPercentage", "1e+30", "from 1 to 100"]),
        (_mps_raw(defaultActiveThreadPercentage=50.5), ["defaultActiveThreadPercentage", "50.5", "from 1 to 100"]),
        # not numbers: JSON's true and "50" are not integers (NVIDIA's Go types refuse them too)
        (_mps_raw(defaultActiveThreadPercentage=True), ["defaultActiveThreadPercentage", "True", "from 1 to 100"]),
        (_mps_raw(defaultActiveThreadPercentage="50"), ["defaultActiveThreadPercentage", "'50'", "from 1 to 100"]),
        (
            cfg({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": 3}}, requests=["r1"]),
            ["timeSlicingConfig.interval", "'Default', 'Short', 'Medium' or 'Long'", "got 3"],
        ),
    ],
)
def test_out_of_range_numbers_in_the_config_fail_the_claim_and_change_nothing(
    node: Node, runner: Recording, config: dict[str, Any], words: list[str]
) -> None:
    # r0 has a valid setting that must not be applied either: the claim fails as a whole, before any change
    c = claim(["gpu-0", "gpu-1"], config=[time_slicing("Long", requests=["r0"]), config])
    node.add(c)
    d = start(node, runner)
    error = d.prepare([ref(c)])[uid(c)].error
    assert error and all(w in error for w in words), error
    assert runner.calls == []
    assert_nothing_left(node, d, runner)


def test_pinned_limits_at_the_bounds_are_sent_to_mps(node: Node, runner: Recording) -> None:
    c = claim(["gpu-0", "gpu-1"], config=[mps(pinned="1Mi", requests=["r0"]), mps(pinned="1Ti", requests=["r1"])])
    node.add(c)
    d = start(node, runner)
    assert d.prepare([ref(c)])[uid(c)].error == ""
    (daemon,) = runner.daemons().values()
    assert daemon["commands"] == [
        "set_default_device_pinned_mem_limit 0 1M",
        "set_default_device_pinned_mem_limit 1 1048576M",
    ]
    assert d.unprepare([ref(c)]) == {uid(c): None}
    assert_nothing_left(node, d, runner)


def test_admin_access_devices_set_no_sharing_and_refuse_a_setting_of_their_own(node: Node, runner: Recording) -> None:
    owner = claim(["gpu-0"], config=[time_slicing("Long")])
    admin = claim(["gpu-0"])
    admin["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    asking = claim(["gpu-0"], config=[time_slicing("Short")])
    asking["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    node.add(owner, admin, asking)
    d = start(node, runner)
    assert d.prepare([ref(owner)])[uid(owner)].error == ""
    calls = len(runner.calls)
    assert d.prepare([ref(admin)])[uid(admin)].error == ""
    refused = d.prepare([ref(asking)])[uid(asking)]
    assert "admin access uses the device as the claim that holds it set it up" in refused.error
    assert refused.failure is not None and refused.failure.kind is FailureKind.INVALID_CONFIG
    assert uid(asking) not in d.checkpoint.claims
    assert d.unprepare([ref(admin)]) == {uid(admin): None}
    assert len(runner.calls) == calls  # the admin's prepare and unprepare ran no tool
    assert runner.timeslice(node.sim.gpu_uuids[0]) == 3  # the owner's setting stays
    d.unprepare([ref(owner)])
    assert_nothing_left(node, d, runner)


# ----- crashes and recovery -------------------------------------------------------------------------------------
def _crash_at_spec(monkeypatch: pytest.MonkeyPatch, runner: Recording) -> None:
    def crash(*args: Any, **kwargs: Any) -> Any:
        raise Killed

    monkeypatch.setattr(machine, "claim_spec", crash)


def _crash_after_time_slice(monkeypatch: pytest.MonkeyPatch, runner: Recording) -> None:
    def after(argv: list[str], _: str | None) -> None:
        if "--set-timeslice" in argv:
            raise Killed  # the GPU changed, the checkpoint says "not applied yet"

    runner.after = after


def _crash_after_daemon_start(monkeypatch: pytest.MonkeyPatch, runner: Recording) -> None:
    def after(argv: list[str], _: str | None) -> None:
        if argv[1:] == ["-d"]:
            raise Killed  # a real daemon runs, nothing says it is up

    runner.after = after


@pytest.mark.parametrize("crash", [_crash_at_spec, _crash_after_time_slice, _crash_after_daemon_start])
def test_recovery_after_a_crash_in_the_middle_of_prepare(
    node: Node, runner: Recording, monkeypatch: pytest.MonkeyPatch, crash: Any
) -> None:
    runner.state.set_compute_mode(node.sim.gpu_uuids[5], pynvml.NVML_COMPUTEMODE_PROHIBITED)  # to be restored
    c = claim(
        ["gpu-5", "gpu-6"],
        config=[time_slicing("Medium", requests=["r0"]), mps(25, "1Gi", requests=["r1"])],
    )
    node.add(c)
    d = start(node, runner)
    crash(monkeypatch, runner)
    with pytest.raises(Killed):
        d.prepare([ref(c)])
    assert d.checkpoint.claims[uid(c)].state is ClaimState.PREPARE_STARTED
    assert runner.timeslice(node.sim.gpu_uuids[5]) == 2  # changed, then the process died
    assert runner.mode(node.sim.gpu_uuids[5]) == pynvml.NVML_COMPUTEMODE_DEFAULT
    if crash is not _crash_after_time_slice:
        assert len(runner.daemons()) == 1 and (mps_root(node) / uid(c) / "pipe").is_dir()
        assert runner.mode(node.sim.gpu_uuids[6]) == EXCLUSIVE
    monkeypatch.undo()
    runner.after = None
    restarted = start(node, runner)  # a new process: recovery runs at start
    assert runner.mode(node.sim.gpu_uuids[5]) == pynvml.NVML_COMPUTEMODE_PROHIBITED  # the mode found, back
    runner.state.set_compute_mode(node.sim.gpu_uuids[5], pynvml.NVML_COMPUTEMODE_DEFAULT)
    assert_nothing_left(node, restarted, runner)
    result = restarted.prepare([ref(c)])[uid(c)]  # the kubelet's retry succeeds
    assert result.error == ""
    assert runner.timeslice(node.sim.gpu_uuids[5]) == 2 and len(runner.daemons()) == 1
    restarted.unprepare([ref(c)])
    assert_nothing_left(node, restarted, runner)


def test_recovery_removes_mps_directories_nobody_owns(node: Node, runner: Recording) -> None:
    kept = claim(["gpu-0"], config=[mps()])
    node.add(kept)
    start(node, runner).prepare([ref(kept)])
    orphan = mps_root(node) / "orphan-uid"
    (orphan / "pipe").mkdir(parents=True)
    started = runner.run(
        ["nvidia-cuda-mps-control", "-d"],
        env={"CUDA_MPS_PIPE_DIRECTORY": str(orphan / "pipe"), "CUDA_VISIBLE_DEVICES": node.sim.gpu_uuids[1]},
    )
    assert started.returncode == 0 and len(daemon_pids(node.sim.state_dir)) == 2
    (mps_root(node) / "half-made").mkdir()  # no pipe dir: nothing to stop
    d = start(node, runner)
    assert sorted(p.name for p in mps_root(node).iterdir()) == [uid(kept)]
    assert list(runner.daemons()) == [str(mps_root(node) / uid(kept) / "pipe")]
    d.unprepare([ref(kept)])
    assert_nothing_left(node, d, runner)


def test_the_default_runner_takes_the_tools_of_the_simulated_driver_root(node: Node) -> None:
    c = claim(["gpu-7"], config=[time_slicing("Short")])
    node.add(c)
    d = node.driver()  # no runner given
    assert d.prepare([ref(c)])[uid(c)].error == ""
    state = SharingState(node.sim.state_dir)
    assert state.timeslice(node.sim.gpu_uuids[7]) == 1
    assert state.calls[-1]["argv"][0] == str(node.sim.driver_root / "usr" / "bin" / "nvidia-smi")
    real = default_runner(object())  # pynvml: the host's driver root
    assert isinstance(real, DriverRootRunner) and str(real.driver_root) in ("/driver-root", "/")
    d.unprepare([ref(c)])


# ----- the driver root runner, against stand-in tools -----------------------------------------------------------
def test_driver_root_runner_finds_tools_and_preloads_the_root_libraries(tmp_path: Path) -> None:
    root = tmp_path / "root"
    log = tmp_path / "log.txt"
    script = f"""#!/bin/sh
echo "$(basename "$0") $* preload=$LD_PRELOAD pipe=$CUDA_MPS_PIPE_DIRECTORY path=${{PATH:+set}}" >> {log}
if [ -t 0 ]; then :; else cat >> {log}; fi
[ "$2" = "GPU-bad" ] && {{ echo "No devices were found"; exit 6; }}
[ "$1" = "sleep" ] && sleep 30
exit 0
"""
    (root / "opt" / "nvidia").mkdir(parents=True)
    (root / "usr" / "bin").mkdir(parents=True)
    for name in ("nvidia-smi", "nvidia-cuda-mps-control"):
        (root / "opt" / "nvidia" / name).write_text(script)
        (root / "opt" / "nvidia" / name).chmod(stat.S_IRWXU)
        # an absolute link, as a GPU Operator root has them: resolved inside the root, never on this host
        (root / "usr" / "bin" / name).symlink_to(f"/opt/nvidia/{name}")
    libdir = root / "usr" / "lib64"
    libdir.mkdir(parents=True)
    for soname in ("libnvidia-ml.so.1", "libcuda.so.1"):
        (libdir / soname).write_bytes(shared_object(soname))
    runner = DriverRootRunner(root)
    done = runner.run(["nvidia-smi", "compute-policy", "-i", "GPU-a", "--set-timeslice", "3"])
    assert done.returncode == 0 and done.args[0] == str(root / "opt" / "nvidia" / "nvidia-smi")
    assert runner.run(["nvidia-smi", "-i", "GPU-bad"]).returncode == 6
    runner.run(["nvidia-cuda-mps-control"], env={"CUDA_MPS_PIPE_DIRECTORY": "/p"}, input="quit\n")
    lines = log.read_text().splitlines()
    nvml = f"{libdir}/libnvidia-ml.so.1"
    assert lines[0] == f"nvidia-smi compute-policy -i GPU-a --set-timeslice 3 preload={nvml} pipe= path=set"
    assert lines[-2] == f"nvidia-cuda-mps-control  preload={libdir}/libcuda.so.1:{nvml} pipe=/p path=set"
    assert lines[-1] == "quit"
    assert os.environ.get("CUDA_MPS_PIPE_DIRECTORY") is None  # the plugin's own environment is left alone
    slow = DriverRootRunner(root, inner=RealRunner(1))
    assert slow.run(["nvidia-smi", "sleep"]).returncode == 124  # every call is time-bound
    manager = SharingManager(DriverRootRunner(tmp_path / "empty"), tmp_path / "plugin")
    with pytest.raises(SharingError, match="nvidia-smi not found in driver root"):
        manager.smi.compute_mode("GPU-a")


# ----- the official CDI validator -------------------------------------------------------------------------------
def test_specs_with_mps_mounts_pass_the_official_validator(
    node: Node,
    runner: Recording,
    cdivalidate: Path,  # noqa: F811
) -> None:
    claims = [
        claim(["gpu-0", "gpu-1"], config=[mps(50, "2Gi")]),
        claim(["gpu-2-mig-1g10gb-19-6"], device_class="mig", config=[mps(kind="MigDeviceConfig")]),
        claim(["gpu-3"], config=[time_slicing("Long")]),
    ]
    node.add(*claims)
    d = start(node, runner)
    results = d.prepare([ref(c) for c in claims])
    assert all(r.error == "" for r in results.values()), results
    files = sorted(node.cdi_root.glob("*.json"))
    assert len(files) == 3 and sum("/tmp/nvidia-mps" in f.read_text() for f in files) == 2
    out = _validate(cdivalidate, *files)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(": ok") == 3


def test_the_nodes_mps_defaults_fill_what_a_claim_leaves_out(node: Node, runner: Recording) -> None:
    """A node configuration's MPS defaults (controller.nodeconfig): a claim that sets its own keeps it."""
    from dra_driver.claimstate.config import MpsConfig

    own, bare = claim(["gpu-0"], config=[mps(percentage=30)]), claim(["gpu-1"], config=[mps()])
    node.add(own, bare)
    d = start(node, runner)
    d.sharing.mps_defaults = MpsConfig.model_validate(
        {"defaultActiveThreadPercentage": 60, "defaultPinnedDeviceMemoryLimit": "2Gi"}
    )
    assert all(r.error == "" for r in d.prepare([ref(own), ref(bare)]).values())
    commands = {pipe.split("/")[-2]: daemon["commands"] for pipe, daemon in runner.daemons().items()}
    assert commands[uid(own)] == [
        "set_default_active_thread_percentage 30",
        "set_default_device_pinned_mem_limit 0 2048M",
    ]
    assert commands[uid(bare)] == [
        "set_default_active_thread_percentage 60",
        "set_default_device_pinned_mem_limit 0 2048M",
    ]
    assert all(e is None for e in d.unprepare([ref(own), ref(bare)]).values())
    assert_nothing_left(node, d, runner)
