"""tests.cluster.logs: the driver's container logs are kept past their pods, and a clean run is told from one with
problems."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from tests.cluster.logs import DriverLogs
from tests.polling import wait_until


def cri(text: str, stream: str = "stderr") -> str:
    return f"2026-12-04T00:00:00.000000000Z {stream} F {text}\n"


def jline(level: str, msg: str) -> str:
    return cri(json.dumps({"time": "t", "level": level, "logger": "dra_driver.x", "msg": msg}))


def setup(tmp_path: Path) -> tuple[DriverLogs, Path, Path]:
    pod_logs, kubelet = tmp_path / "pod-logs", tmp_path / "kubelet.log"
    pod_logs.mkdir()
    kubelet.write_text('E1204 00:00:00.0 1 x.go:1] "before the release" driver="gpu.example.com"\n')
    logs = DriverLogs(pod_logs, kubelet, "drv", keep=tmp_path / "kept", words=["gpu.example.com"], interval=0.05)
    return logs, pod_logs, kubelet


def test_a_deleted_pods_log_is_kept_with_what_was_written_after(tmp_path: Path) -> None:
    logs, pod_logs, _ = setup(tmp_path)
    logs.start()
    container = pod_logs / "drv_driver-abc_uid1" / "plugin"
    container.mkdir(parents=True)
    (pod_logs / "other_pod_uid2" / "c").mkdir(parents=True)
    (pod_logs / "other_pod_uid2" / "c" / "0.log").write_text(jline("ERROR", "not the driver's namespace"))
    with (container / "0.log").open("a") as writer:
        writer.write(jline("INFO", "started"))
        writer.flush()
        wait_until("the log kept", lambda: logs.driver_lines(), timeout=10, interval=0.05)
        shutil.rmtree(pod_logs / "drv_driver-abc_uid1")  # the kubelet removes a deleted pod's logs
        writer.write(jline("WARNING", 'shutting "down"'))
    logs.stop()
    assert logs.driver_lines() == [
        'drv_driver-abc_uid1/plugin: {"time": "t", "level": "INFO", "logger": "dra_driver.x", "msg": "started"}',
        'drv_driver-abc_uid1/plugin: {"time": "t", "level": "WARNING", "logger": "dra_driver.x", '
        '"msg": "shutting \\"down\\""}',
    ]
    assert len(logs.problems()) == 1 and "shutting" in logs.problems()[0]


def test_problems_are_warnings_bare_lines_and_the_kubelets_w_and_e_lines_about_the_driver(tmp_path: Path) -> None:
    logs, pod_logs, kubelet = setup(tmp_path)
    logs.start()
    container = pod_logs / "drv_driver-abc_uid1" / "plugin"
    container.mkdir(parents=True)
    (container / "0.log").write_text(
        jline("INFO", "fine")
        + jline("ERROR", "prepare failed")
        + cri("Traceback (most recent call last):")
        + cri("")
        + jline("WARNING", "MIG instance busy, retrying")
    )
    with kubelet.open("a") as f:
        f.write('I1204 00:00:01.0 1 x.go:1] "Registered DRA plugin" pluginName="gpu.example.com"\n')
        f.write('W1204 00:00:02.0 1 x.go:1] "slow" pluginName="gpu.example.com"\n')
        f.write('E1204 00:00:03.0 1 x.go:1] "another plugin" pluginName="nic.example.com"\n')
    time.sleep(0.2)
    logs.stop()
    problems = logs.problems()
    assert [p.split(": ", 1)[0] for p in problems] == ["drv_driver-abc_uid1/plugin"] * 3 + ["kubelet"]
    assert "prepare failed" in problems[0] and "Traceback" in problems[1] and "slow" in problems[3]
    logs.expect(r"MIG instance busy", r'"slow" pluginName')
    assert len(logs.problems()) == 2


def test_what_every_stop_of_a_driver_pod_causes_is_routine_and_other_containers_may_log_plain_text(
    tmp_path: Path,
) -> None:
    logs, pod_logs, kubelet = setup(tmp_path)
    logs.start()
    daemon = pod_logs / "drv_mps-control-daemon-x_uid3" / "mps-control-daemon"
    daemon.mkdir(parents=True)
    (daemon / "0.log").write_text(cri("[2026-12-04 00:00:00.1 Control 7] Cmd:quit", "stdout")
                                  + cri("[2026-12-04 00:00:00.2 Control 7] ERROR: server exited"))  # fmt: skip
    with kubelet.open("a") as f:
        f.write(
            "W1204 00:00:01.0 1 logging.go:55] [core] grpc: addrConn.createTransport failed to connect to {Addr: "
            '"/k/plugins/gpu.example.com/dra.sock"}. Err: connection error: desc = "transport: Error while '
            'dialing: dial unix /k/plugins/gpu.example.com/dra.sock: connect: connection refused"\n'
        )
        f.write(  # accepted by the closing server's backlog, then closed: seen in a rolling update with surge
            "W1204 00:00:01.5 1 logging.go:55] [core] grpc: addrConn.createTransport failed to connect to {Addr: "
            '"/k/plugins/gpu.example.com/dra-1.sock"}. Err: connection error: desc = "transport: failed to write '
            'client preface: write unix @->/k/plugins/gpu.example.com/.tmp-a4.sock: write: broken pipe"\n'
        )
        f.write(
            'E1204 00:00:02.0 1 remote_runtime.go:636] "ExecSync cmd from runtime service failed" err="rpc '
            'error: code = Canceled desc = context canceled" cmd=["dra-driver","probe","gpu.example.com"]\n'
        )
        for code, gone in (  # kubelet 1.37: a probe started as the container stopped or containerd removed it
            ("NotFound", 'failed to create exec \\"98f3db5b\\": container not created: not found'),
            ("NotFound", "failed to load task: no running task found: not found"),
            ("Unknown", 'failed to create exec \\"aa73cb8f\\": cannot exec in a stopped state'),
            ("Unknown", 'failed to create exec \\"73fcbb0a\\": cannot exec in a deleted state'),  # as it is removed
            (
                "Unknown",
                'failed to start exec \\"13286885\\": OCI runtime exec failed: exec failed: cannot exec in a '
                "stopped container",
            ),  # runc's word, the container stopped between create and start of the exec
            (
                "Unknown",
                'failed to start exec \\"f30f3200\\": OCI runtime exec failed: exec failed: unable to start container '
                "process: error executing setns process: exit status 1",
            ),  # runc joining the namespaces of a container whose init exited meanwhile (a surge's old pod)
            ("Unknown", "container is in CONTAINER_EXITED state"),  # a rolling update's old pod, once exited
            ("Unknown", 'failed to create exec \\"6a54b319\\": ttrpc: closed'),  # its shim going as it is killed
        ):
            f.write(
                'E1204 00:00:02.5 1 remote_runtime.go:724] "ExecSync cmd from runtime service failed" err="rpc '
                f'error: code = {code} desc = failed to exec in container: {gone}" containerID="536e" '
                'cmd=["dra-driver","probe","--driver=gpu.example.com"]\n'
            )
        f.write(
            'E1204 00:00:03.0 1 remote_runtime.go:636] "ExecSync cmd from runtime service failed" err="rpc '
            'error: code = DeadlineExceeded" cmd=["dra-driver","probe","--driver=gpu.example.com"]\n'
        )
    time.sleep(0.2)
    logs.stop()
    problems = logs.problems()
    assert len(problems) == 2, problems
    assert "ERROR: server exited" in problems[0] and "DeadlineExceeded" in problems[1]


def test_the_keeper_never_recreates_a_removed_work_dir(tmp_path: Path) -> None:
    """`up --real-node` removes the node's work dir, where the kept logs live, while the keeper may still run: it must
    not put the directory back (CI found `/tmp/dn-*/dra-driver-*/kept-logs/...` left behind)."""
    pod_logs, kubelet = tmp_path / "pod-logs", tmp_path / "kubelet.log"
    pod_logs.mkdir()
    kubelet.write_text("")
    work = tmp_path / "work"
    logs = DriverLogs(pod_logs, kubelet, "drv", keep=work / "release" / "kept-logs", words=["x"], interval=0.05)
    logs.start()
    shutil.rmtree(work)  # the node stops first
    container = pod_logs / "drv_driver-abc_uid1" / "plugin"
    container.mkdir(parents=True)
    (container / "0.log").write_text(jline("INFO", "a log that appears after the work dir went"))
    time.sleep(0.3)
    logs.stop()
    assert not work.exists()


def test_a_previous_releases_pod_still_on_the_node_is_not_this_releases(tmp_path: Path) -> None:
    """The node is shared by test modules: a driver pod of the module before may still be terminating (its log
    directory still there) when the next module installs. Its lines are not this release's (CI found a previous
    module's injected XID reported as a problem of the next)."""
    logs, pod_logs, _ = setup(tmp_path)
    old = pod_logs / "drv_driver-old_uid0" / "plugin"
    old.mkdir(parents=True)
    with (old / "0.log").open("a") as writer:
        writer.write(jline("WARNING", "the previous module's fault"))
        writer.flush()
        logs.start()
        new = pod_logs / "drv_driver-new_uid1" / "plugin"
        new.mkdir(parents=True)
        (new / "0.log").write_text(jline("INFO", "this release"))
        writer.write(jline("WARNING", "still the previous module's pod"))
        time.sleep(0.3)
    logs.stop()
    assert logs.driver_lines() == [
        'drv_driver-new_uid1/plugin: {"time": "t", "level": "INFO", "logger": "dra_driver.x", "msg": "this release"}'
    ]
    assert logs.problems() == []
