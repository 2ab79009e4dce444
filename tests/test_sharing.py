"""Sharing applied at prepare: time-slice intervals and a per-claim MPS control daemon, undone at unprepare,
after a failure and after a crash (dra_driver.sharing)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from dra_driver.cdi.spec import spec_file_name
from dra_driver.plugin import driver as driver_module
from dra_driver.plugin.checkpoint import ClaimState
from dra_driver.plugin.driver import Driver
from dra_driver.sharing import CommandResult, RealRunner, SharingManager, SimulatedRunner, default_runner
from dra_driver.sharing.simulated import STATE_FILE
from tests.plugin_helpers import DRIVER, Node, claim, ref
from tests.test_cdi import _validate, cdivalidate  # noqa: F401  (the session fixture that builds the validator)

CONFIG_API = "gpu.resource.dra-driver.dev/v1alpha1"


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
    """Wraps a runner; `fail(argv, input)` may return a result to answer instead, or raise (a crash)."""

    def __init__(self, inner: SimulatedRunner) -> None:
        self.inner = inner
        self.fail: Any = None
        self.after: Any = None

    def run(self, argv: list[str], *, env: Any = None, input: str | None = None) -> CommandResult:
        if self.fail is not None and (answer := self.fail(argv, input)) is not None:
            return answer  # type: ignore[no-any-return]
        result = self.inner.run(argv, env=env, input=input)
        if self.after is not None:
            self.after(argv, input)
        return result


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


@pytest.fixture
def runner(node: Node) -> SimulatedRunner:
    return SimulatedRunner.for_simulator(node.sim)


def start(node: Node, runner: Any) -> Driver:
    return node.driver(sharing_runner=runner)


def uid(c: dict[str, Any]) -> str:
    return str(c["metadata"]["uid"])


def spec(node: Node, c: dict[str, Any]) -> dict[str, Any]:
    return json.loads((node.cdi_root / spec_file_name(DRIVER, uid(c))).read_text())  # type: ignore[no-any-return]


def mps_root(node: Node) -> Path:
    return node.plugin_dir / "mps"


def assert_nothing_left(node: Node, d: Driver, runner: SimulatedRunner) -> None:
    assert node.cdi_files() == [] and d.checkpoint.claims == {} and node.mig_instances() == []
    assert all(runner.timeslice(u) == 0 for u in node.sim.gpu_uuids)
    assert runner.daemons() == {}
    assert not mps_root(node).exists() or list(mps_root(node).iterdir()) == []


# ----- time-slicing ---------------------------------------------------------------------------------------------
def test_time_slice_is_set_recorded_and_reset(node: Node, runner: SimulatedRunner) -> None:
    c = claim(["gpu-3"], config=[time_slicing("Long")])
    node.add(c)
    d = start(node, runner)
    assert d.prepare([ref(c)])[uid(c)].error == ""
    gpu = d.inventory.gpu_by_minor(3).uuid
    assert runner.calls[-1]["argv"] == ["nvidia-smi", "compute-policy", "-i", gpu, "--set-timeslice", "3"]
    assert runner.timeslice(gpu) == 3
    # the state lives in a file under the simulator's state directory: another process sees it
    assert (node.sim.state_dir / STATE_FILE).exists()
    assert SimulatedRunner.for_simulator(node.sim).timeslice(gpu) == 3
    record = d.checkpoint.claims[uid(c)].devices[0].sharing
    assert record == {"strategy": "TimeSlicing", "gpuUuid": gpu, "interval": 3, "applied": True}
    saved = json.loads((node.plugin_dir / "checkpoint.json").read_text())
    assert saved["data"]["claims"][uid(c)]["devices"][0]["sharing"] == record
    again = d.prepare([ref(c)])[uid(c)]  # idempotent: no second command
    assert again.error == "" and len(runner.calls) == 1
    assert d.unprepare([ref(c)]) == {uid(c): ""}
    assert runner.calls[-1]["argv"] == ["nvidia-smi", "compute-policy", "-i", gpu, "--set-timeslice", "0"]
    assert_nothing_left(node, d, runner)


def test_time_slicing_without_interval_means_default_and_mig_devices_get_none(
    node: Node, runner: SimulatedRunner
) -> None:
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
    assert [call["argv"] for call in runner.calls] == [
        ["nvidia-smi", "compute-policy", "-i", gpu0, "--set-timeslice", "0"]
    ]
    assert d.checkpoint.claims[uid(part)].devices[0].sharing is None
    assert d.checkpoint.claims[uid(plain)].devices[0].sharing is None
    assert all(e == "" for e in d.unprepare([ref(whole), ref(part), ref(plain)]).values())
    assert_nothing_left(node, d, runner)


def test_an_unknown_gpu_uuid_is_a_per_claim_error_and_changes_nothing(node: Node) -> None:
    sim_runner = SimulatedRunner.for_simulator(node.sim)
    gone = node.sim.gpu_uuids[1]  # nvidia-smi no longer sees this GPU (NVML still lists it)
    runner = SimulatedRunner(node.sim.state_dir, lambda u: u != gone and sim_runner.known(u))
    both = claim(["gpu-0", "gpu-1"], config=[time_slicing("Short")])
    shared = claim(["gpu-1"], config=[mps(50)])
    fine = claim(["gpu-2"], config=[time_slicing("Medium")])
    node.add(both, shared, fine)
    d = start(node, runner)
    results = d.prepare([ref(both), ref(shared), ref(fine)])
    assert "set time slice of GPU " + gone in results[uid(both)].error
    assert "exited with 6: No devices were found" in results[uid(both)].error
    assert "start MPS control daemon" in results[uid(shared)].error
    assert "no such devices " + gone in results[uid(shared)].error
    assert results[uid(both)].devices == [] and results[uid(shared)].devices == []
    assert results[uid(fine)].error == ""  # the other claim of the same call is not affected
    gpu0 = node.sim.gpu_uuids[0]
    assert [c["argv"][-1] for c in runner.calls if gpu0 in c["argv"]] == ["1", "0"]  # set, then reset
    assert runner.timeslice(gpu0) == 0 and runner.timeslice(gone) == 0
    assert set(d.checkpoint.claims) == {uid(fine)}
    assert node.cdi_files() == [spec_file_name(DRIVER, uid(fine))]
    assert list(mps_root(node).iterdir()) == [] and runner.daemons() == {}
    d.unprepare([ref(fine)])
    assert_nothing_left(node, d, runner)


def test_a_reset_that_fails_keeps_the_claim_for_the_kubelet_to_retry(node: Node, runner: SimulatedRunner) -> None:
    c = claim(["gpu-0"], config=[time_slicing("Long")])
    node.add(c)
    wrapped = Recording(runner)
    d = start(node, wrapped)
    assert d.prepare([ref(c)])[uid(c)].error == ""
    wrapped.fail = lambda argv, _: CommandResult(argv, 15, "", "GPU is lost") if argv[-1] == "0" else None
    assert "GPU is lost" in d.unprepare([ref(c)])[uid(c)]
    assert uid(c) in d.checkpoint.claims and node.cdi_files() != []
    wrapped.fail = None
    assert d.unprepare([ref(c)]) == {uid(c): ""}
    assert_nothing_left(node, d, runner)


# ----- MPS ------------------------------------------------------------------------------------------------------
def test_mps_daemon_directories_and_cdi_edits(node: Node, runner: SimulatedRunner) -> None:
    c = claim(["gpu-4", "gpu-5"], config=[mps(50, "10Gi")])
    node.add(c)
    d = start(node, runner)
    assert d.prepare([ref(c)])[uid(c)].error == ""
    root = mps_root(node) / uid(c)
    assert sorted(p.name for p in root.iterdir()) == ["log", "pipe", "shm"]
    uuids = [d.inventory.gpu_by_minor(m).uuid for m in (4, 5)]
    daemon_call, settings_call = runner.calls
    assert daemon_call["argv"] == ["nvidia-cuda-mps-control", "-d"]
    assert daemon_call["env"] == {
        "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(root / "log"),
        "CUDA_VISIBLE_DEVICES": ",".join(uuids),
    }
    assert settings_call["argv"] == ["nvidia-cuda-mps-control"]
    assert settings_call["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(root / "pipe")
    assert runner.daemons() == {
        str(root / "pipe"): {
            "visible": uuids,
            "log": str(root / "log"),
            "commands": [
                "set_default_active_thread_percentage 50",
                "set_default_device_pinned_mem_limit 0 10240M",
                "set_default_device_pinned_mem_limit 1 10240M",
            ],
        }
    }
    edits = spec(node, c)["containerEdits"]
    assert edits["env"] == [f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]
    assert edits["mounts"] == [
        {"hostPath": str(root / "pipe"), "containerPath": "/tmp/nvidia-mps", "options": ["rbind", "rw"]},
        {"hostPath": str(root / "shm"), "containerPath": "/dev/shm", "options": ["rbind", "rw"]},
    ]
    records = [dev.sharing for dev in d.checkpoint.claims[uid(c)].devices]
    assert records == [{"strategy": "MPS", "dir": str(root), "uuid": u, "applied": True} for u in uuids]
    assert d.unprepare([ref(c)]) == {uid(c): ""}
    assert runner.calls[-1]["input"] == "quit\n"
    assert not root.exists()
    assert_nothing_left(node, d, runner)


def test_mps_on_a_mig_device_and_per_request_configs(node: Node, runner: SimulatedRunner) -> None:
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
    (daemon,) = runner.daemons().values()
    assert daemon["visible"] == [second.mig.uuid] and daemon["commands"] == []
    assert len(runner.calls) == 1  # no settings to send
    assert d.unprepare([ref(c)]) == {uid(c): ""}
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
    node: Node, runner: SimulatedRunner, configs: list[dict[str, Any]], message: str
) -> None:
    c = claim(["gpu-0", "gpu-1"], config=configs)
    node.add(c)
    d = start(node, runner)
    assert message in d.prepare([ref(c)])[uid(c)].error
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
    node: Node, runner: SimulatedRunner, config: dict[str, Any], words: list[str]
) -> None:
    # r0 has a valid setting that must not be applied either: the claim fails as a whole, before any change
    c = claim(["gpu-0", "gpu-1"], config=[time_slicing("Long", requests=["r0"]), config])
    node.add(c)
    d = start(node, runner)
    error = d.prepare([ref(c)])[uid(c)].error
    assert error and all(w in error for w in words), error
    assert runner.calls == []
    assert_nothing_left(node, d, runner)


def test_pinned_limits_at_the_bounds_are_sent_to_mps(node: Node, runner: SimulatedRunner) -> None:
    c = claim(["gpu-0", "gpu-1"], config=[mps(pinned="1Mi", requests=["r0"]), mps(pinned="1Ti", requests=["r1"])])
    node.add(c)
    d = start(node, runner)
    assert d.prepare([ref(c)])[uid(c)].error == ""
    (daemon,) = runner.daemons().values()
    assert daemon["commands"] == [
        "set_default_device_pinned_mem_limit 0 1M",
        "set_default_device_pinned_mem_limit 1 1048576M",
    ]
    assert d.unprepare([ref(c)]) == {uid(c): ""}
    assert_nothing_left(node, d, runner)


def test_admin_access_devices_ignore_sharing(node: Node, runner: SimulatedRunner) -> None:
    owner = claim(["gpu-0"], config=[time_slicing("Long")])
    admin = claim(["gpu-0"], config=[time_slicing("Short")])
    admin["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    node.add(owner, admin)
    d = start(node, runner)
    assert d.prepare([ref(owner)])[uid(owner)].error == ""
    assert d.prepare([ref(admin)])[uid(admin)].error == ""
    assert d.unprepare([ref(admin)]) == {uid(admin): ""}
    assert runner.timeslice(node.sim.gpu_uuids[0]) == 3  # the owner's setting stays
    d.unprepare([ref(owner)])
    assert_nothing_left(node, d, runner)


# ----- crashes and recovery -------------------------------------------------------------------------------------
def _crash_at_spec(monkeypatch: pytest.MonkeyPatch, wrapped: Recording) -> None:
    def crash(*args: Any, **kwargs: Any) -> Any:
        raise Killed

    monkeypatch.setattr(driver_module, "claim_spec", crash)


def _crash_after_time_slice(monkeypatch: pytest.MonkeyPatch, wrapped: Recording) -> None:
    def after(argv: list[str], _: str | None) -> None:
        if "--set-timeslice" in argv:
            raise Killed  # the GPU changed, the checkpoint says "not applied yet"

    wrapped.after = after


def _crash_after_daemon_start(monkeypatch: pytest.MonkeyPatch, wrapped: Recording) -> None:
    def after(argv: list[str], _: str | None) -> None:
        if argv[1:] == ["-d"]:
            raise Killed

    wrapped.after = after


@pytest.mark.parametrize("crash", [_crash_at_spec, _crash_after_time_slice, _crash_after_daemon_start])
def test_recovery_after_a_crash_in_the_middle_of_prepare(
    node: Node, runner: SimulatedRunner, monkeypatch: pytest.MonkeyPatch, crash: Any
) -> None:
    c = claim(
        ["gpu-5", "gpu-6"],
        config=[time_slicing("Medium", requests=["r0"]), mps(25, "1Gi", requests=["r1"])],
    )
    node.add(c)
    wrapped = Recording(runner)
    d = start(node, wrapped)
    crash(monkeypatch, wrapped)
    with pytest.raises(Killed):
        d.prepare([ref(c)])
    assert d.checkpoint.claims[uid(c)].state is ClaimState.PREPARE_STARTED
    assert runner.timeslice(node.sim.gpu_uuids[5]) == 2  # changed, then the process died
    if crash is not _crash_after_time_slice:
        assert len(runner.daemons()) == 1 and (mps_root(node) / uid(c) / "pipe").is_dir()
    monkeypatch.undo()
    restarted = start(node, runner)  # a new process: recovery runs at start
    assert_nothing_left(node, restarted, runner)
    result = restarted.prepare([ref(c)])[uid(c)]  # the kubelet's retry succeeds
    assert result.error == ""
    assert runner.timeslice(node.sim.gpu_uuids[5]) == 2 and len(runner.daemons()) == 1
    restarted.unprepare([ref(c)])
    assert_nothing_left(node, restarted, runner)


def test_recovery_removes_mps_directories_nobody_owns(node: Node, runner: SimulatedRunner) -> None:
    kept = claim(["gpu-0"], config=[mps()])
    node.add(kept)
    start(node, runner).prepare([ref(kept)])
    orphan = mps_root(node) / "orphan-uid"
    (orphan / "pipe").mkdir(parents=True)
    runner.run(
        ["nvidia-cuda-mps-control", "-d"],
        env={"CUDA_MPS_PIPE_DIRECTORY": str(orphan / "pipe"), "CUDA_VISIBLE_DEVICES": node.sim.gpu_uuids[1]},
    )
    (mps_root(node) / "half-made").mkdir()  # no pipe dir: nothing to stop
    d = start(node, runner)
    assert sorted(p.name for p in mps_root(node).iterdir()) == [uid(kept)]
    assert list(runner.daemons()) == [str(mps_root(node) / uid(kept) / "pipe")]
    d.unprepare([ref(kept)])
    assert_nothing_left(node, d, runner)


def test_the_default_runner_of_the_simulator_is_the_simulated_one(node: Node) -> None:
    c = claim(["gpu-7"], config=[time_slicing("Short")])
    node.add(c)
    d = node.driver()  # no runner given
    assert d.prepare([ref(c)])[uid(c)].error == ""
    assert SimulatedRunner.for_simulator(node.sim).timeslice(node.sim.gpu_uuids[7]) == 1
    assert isinstance(default_runner(object()), RealRunner)
    d.unprepare([ref(c)])


# ----- the real runner, against stand-in binaries ---------------------------------------------------------------
def test_real_runner_runs_configured_binaries_with_env_and_stdin(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    script = f"""#!/bin/sh
echo "$(basename "$0") $* pipe=$CUDA_MPS_PIPE_DIRECTORY visible=$CUDA_VISIBLE_DEVICES path=${{PATH:+set}}" >> {log}
if [ -t 0 ]; then :; else cat >> {log}; fi
[ "$3" = "GPU-bad" ] && {{ echo "No devices were found"; exit 6; }}
exit 0
"""
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("nvidia-smi", "nvidia-cuda-mps-control"):
        (tools / name).write_text(script)
        (tools / name).chmod(stat.S_IRWXU)
    from dra_driver.plugin.checkpoint import CheckpointedDevice
    from dra_driver.plugin.config import decode
    from dra_driver.sharing import SharingError, Target

    manager = SharingManager(
        RealRunner(),
        tmp_path / "plugin",
        nvidia_smi=str(tools / "nvidia-smi"),
        mps_control=str(tools / "nvidia-cuda-mps-control"),
    )

    def target(uuid: str, sharing: dict[str, Any]) -> Target:
        config = decode({"apiVersion": CONFIG_API, "kind": "GpuConfig", "sharing": sharing})
        return Target(CheckpointedDevice(pool="p", device="gpu-0"), config, uuid, False)

    saves: list[int] = []
    ts = target("GPU-a", {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})
    assert manager.apply("claim-1", [ts], lambda: saves.append(1)) is None and saves == [1, 1]
    shared = target("GPU-b", {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 10}})
    edits = manager.apply("claim-2", [shared], lambda: None)
    assert edits is not None and edits.mounts is not None and len(edits.mounts) == 2
    lines = log.read_text().splitlines()
    pipe = tmp_path / "plugin" / "mps" / "claim-2" / "pipe"
    assert lines[0] == "nvidia-smi compute-policy -i GPU-a --set-timeslice 3 pipe= visible= path=set"
    assert lines[1] == f"nvidia-cuda-mps-control -d pipe={pipe} visible=GPU-b path=set"
    assert lines[-1] == "set_default_active_thread_percentage 10"
    with pytest.raises(SharingError, match="exited with 6: No devices were found"):
        manager.apply("claim-3", [target("GPU-bad", {"strategy": "TimeSlicing"})], lambda: None)
    manager.undo("claim-2", [shared.record])
    assert not pipe.parent.exists() and log.read_text().splitlines()[-1] == "quit"
    missing = SharingManager(RealRunner(), tmp_path / "plugin", nvidia_smi=str(tmp_path / "nope"))
    with pytest.raises(SharingError, match="nope"):
        missing.apply("claim-4", [target("GPU-a", {"strategy": "TimeSlicing"})], lambda: None)
    assert os.environ.get("CUDA_MPS_PIPE_DIRECTORY") is None  # the plugin's own environment is left alone


# ----- the official CDI validator -------------------------------------------------------------------------------
def test_specs_with_mps_mounts_pass_the_official_validator(
    node: Node,
    runner: SimulatedRunner,
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
    assert len(files) == 3 and sum("mounts" in f.read_text() for f in files) == 2
    out = _validate(cdivalidate, *files)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(": ok") == 3
