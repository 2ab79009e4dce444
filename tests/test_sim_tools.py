"""The simulated driver tools as real processes (dra_driver.simulator.tools): nvidia-smi's argument forms, outputs
and exit codes, compute modes shared with the simulator's NVML, and the MPS control daemon's life: start, settings,
quit, refusals, the client without a daemon, exit when its pipe directory goes; no process left behind."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_driver.cdi.devnodes import CharDevice, gpu_nodes, mig_cap_nodes
from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.simulator.tools import state_dir_of
from dra_driver.simulator.tools.state import SharingState, pid_alive
from tests.sharing_helpers import daemon_pids, no_daemon_left, wait_gone
from tests.simhelpers import create_full_ci, create_gi, nvml_code

TIMEOUT_S = 30


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimulatedNvml]:
    sim = SimulatedNvml("dgx-h100", tmp_path / "gpu")
    sim.nvmlInit()
    with no_daemon_left(sim.state_dir):
        yield sim
    assert daemon_pids(sim.state_dir) == []


def tool(sim: SimulatedNvml, name: str, *args: str, stdin: str | None = None, **env: str) -> Any:
    return subprocess.run(
        [str(sim.driver_root / "usr" / "bin" / name), *args],
        env={**os.environ, **env},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def smi(sim: SimulatedNvml, *args: str) -> Any:
    return tool(sim, "nvidia-smi", *args)


def mps_env(tmp_path: Path, visible: str) -> dict[str, str]:
    return {
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log"),
        "CUDA_VISIBLE_DEVICES": visible,
    }


def control(sim: SimulatedNvml, env: dict[str, str], *args: str, stdin: str | None = None) -> Any:
    return tool(sim, "nvidia-cuda-mps-control", *args, stdin=stdin, **env)


def mig_device(sim: SimulatedNvml, index: int) -> str:
    dev = sim.nvmlDeviceGetHandleByIndex(index)
    sim.nvmlDeviceSetMigMode(dev, pynvml.NVML_DEVICE_MIG_ENABLE)
    create_full_ci(sim, create_gi(sim, dev, 19, 0, 1), 1)
    return str(sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetMigDeviceHandleByIndex(dev, 0)))


# ----- nvidia-smi -----------------------------------------------------------------------------------------------
def test_compute_mode_set_by_nvidia_smi_is_what_nvml_and_queries_answer(sim: SimulatedNvml) -> None:
    gpu = sim.gpu_uuids[2]
    handle = sim.nvmlDeviceGetHandleByUUID(gpu)
    assert sim.nvmlDeviceGetComputeMode(handle) == pynvml.NVML_COMPUTEMODE_DEFAULT
    done = smi(sim, "-i", gpu, "-c", "EXCLUSIVE_PROCESS")
    bus = sim.nvmlDeviceGetPciInfo(handle).busId
    assert (done.returncode, done.stdout) == (0, f"Set compute mode to EXCLUSIVE_PROCESS for GPU {bus}.\nAll done.\n")
    assert sim.nvmlDeviceGetComputeMode(handle) == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    query = smi(sim, "--query-gpu=index,uuid,compute_mode", "--format=csv", "-i", gpu)
    assert query.returncode == 0 and query.stdout == f"index, uuid, compute_mode\n2, {gpu}, Exclusive_Process\n"
    assert smi(sim, "-c", "2", "--id=2").returncode == 0  # numbers, long options, any order
    assert smi(sim, "--query-gpu=compute_mode", "--format=csv,noheader", "-i", "2").stdout == "Prohibited\n"
    sim.nvmlDeviceSetComputeMode(handle, pynvml.NVML_COMPUTEMODE_DEFAULT)  # NVML's setter: the same state
    assert smi(sim, "--query-gpu=compute_mode", "--format=csv,noheader", "-i", gpu).stdout == "Default\n"
    others = smi(sim, "--query-gpu=compute_mode", "--format=csv,noheader").stdout.splitlines()
    assert others == ["Default"] * 8  # without -i: every GPU, none of the others touched
    with pytest.raises(pynvml.NVMLError) as e:
        sim.nvmlDeviceSetComputeMode(handle, 1)  # EXCLUSIVE_THREAD is gone from current drivers
    assert nvml_code(e) == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_time_slice_of_a_gpu(sim: SimulatedNvml) -> None:
    gpu = sim.gpu_uuids[4]
    done = smi(sim, "compute-policy", "-i", gpu, "--set-timeslice", "3")
    assert done.returncode == 0 and "time slice to 3" in done.stdout
    assert SharingState(sim.state_dir).timeslice(gpu) == 3
    assert smi(sim, "compute-policy", "--set-timeslice=1", "-i", "4").returncode == 0
    assert SharingState(sim.state_dir).timeslice(gpu) == 1
    assert SharingState(sim.state_dir).timeslice(sim.gpu_uuids[3]) == 0


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["compute-policy", "-i", "GPU-00000000-0000-0000-0000-000000000000", "--set-timeslice", "1"], 6, "No devices"),
        (["-i", "GPU-00000000-0000-0000-0000-000000000000", "-c", "DEFAULT"], 6, "No devices were found"),
        (["-i", "9", "--query-gpu=compute_mode", "--format=csv"], 6, "No devices were found"),
        (["compute-policy", "-i", "0", "--set-timeslice", "4"], 2, "valid values are 0"),
        (["compute-policy", "-i", "0"], 2, "Invalid combination of input arguments"),
        (["-i", "0", "-c", "EXCLUSIVE_THREAD"], 2, "Invalid combination of input arguments"),
        (["-i", "0", "-c"], 2, "Invalid combination of input arguments"),
        (["--frobnicate"], 2, "Invalid combination of input arguments"),
        (["--query-gpu=compute_mode", "--format=json"], 2, "not a valid format"),
        (["--query-gpu=fan.speed", "--format=csv"], 2, 'Field "fan.speed" is not a valid field'),
    ],
)
def test_nvidia_smi_refuses_like_the_real_one(sim: SimulatedNvml, args: list[str], code: int, words: str) -> None:
    done = smi(sim, *args)
    assert done.returncode == code and words in done.stdout, done
    assert SharingState(sim.state_dir).read()["timeslice"] == {}
    assert SharingState(sim.state_dir).read()["compute_mode"] == {}


def test_mig_devices_have_no_compute_mode_or_time_slice_of_their_own(sim: SimulatedNvml) -> None:
    mig = mig_device(sim, 1)
    assert smi(sim, "-i", mig, "-c", "EXCLUSIVE_PROCESS").returncode == 3
    assert smi(sim, "compute-policy", "-i", mig, "--set-timeslice", "2").returncode == 3
    handle = sim.nvmlDeviceGetHandleByUUID(mig)
    with pytest.raises(pynvml.NVMLError) as e:
        sim.nvmlDeviceSetComputeMode(handle, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    assert nvml_code(e) == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert smi(sim, "-i", sim.gpu_uuids[1], "-c", "PROHIBITED").returncode == 0  # the parent GPU takes one
    assert sim.nvmlDeviceGetComputeMode(handle) == pynvml.NVML_COMPUTEMODE_PROHIBITED  # its MIG devices run under it


def test_a_lost_gpu_fails_with_exit_15(sim: SimulatedNvml) -> None:
    sim.set_gpu_lost(6)
    done = smi(sim, "compute-policy", "-i", sim.gpu_uuids[6], "--set-timeslice", "0")
    assert done.returncode == 15 and "GPU is lost" in done.stdout
    assert smi(sim, "-i", "6", "-c", "DEFAULT").returncode == 15


def test_the_state_directory_is_found_from_the_script_path(tmp_path: Path) -> None:
    assert state_dir_of(str(tmp_path / "node" / "driver-root" / "usr" / "bin" / "nvidia-smi")) == tmp_path / "node"
    root = tmp_path / "other" / "driver-root"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")  # a merged /usr: /bin is a link
    assert state_dir_of(str(root / "bin" / "nvidia-smi")) == (tmp_path / "other").resolve()


def test_without_a_simulated_machine_nvidia_smi_finds_no_driver(tmp_path: Path) -> None:
    sim = SimulatedNvml("dgx-h100", tmp_path / "gpu")
    (sim.state_dir / "nvml-state.json").unlink()
    assert smi(sim, "-L").returncode == 9


# ----- nvidia-smi in a container ---------------------------------------------------------------------------------
# A container's view without a container runtime: a chroot with a shell, the driver root's nvidia-smi where the CDI
# spec mounts it, and exactly the device nodes the claim's CDI spec gives (devnodes, as the plugin computes them).
needs_chroot = pytest.mark.skipif(os.geteuid() != 0, reason="a chroot with device nodes needs root")
SHELLS = {
    "busybox": ["/bin/busybox"],
    "dash": ["/bin/dash", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"],
}


def container(sim: SimulatedNvml, tmp_path: Path, shell: str, nodes: list[CharDevice]) -> Path:
    root = tmp_path / f"rootfs-{shell}"
    files = SHELLS[shell]
    if not all(Path(f).exists() for f in files):
        pytest.skip(f"{shell} is not installed here")
    for f in files:
        (root / f.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, root / f.lstrip("/"))
    (root / "bin" / "sh").symlink_to(Path(files[0]).name)
    (root / "usr" / "bin").mkdir(parents=True)
    shutil.copy(sim.driver_root / "usr" / "bin" / "nvidia-smi", root / "usr" / "bin" / "nvidia-smi")
    for n in nodes:
        path = root / n.path.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(n.major, n.minor))
    return root


def smi_in(root: Path, *args: str) -> Any:
    return subprocess.run(
        ["chroot", str(root), "/usr/bin/nvidia-smi", *args], capture_output=True, text=True, timeout=TIMEOUT_S
    )


@needs_chroot
@pytest.mark.parametrize("shell", list(SHELLS))
def test_in_a_container_nvidia_smi_lists_the_devices_whose_nodes_it_has(
    sim: SimulatedNvml, tmp_path: Path, shell: str
) -> None:
    mig = mig_device(sim, 1)
    handle = sim.nvmlDeviceGetHandleByUUID(mig)
    gi, ci = sim.nvmlDeviceGetGpuInstanceId(handle), sim.nvmlDeviceGetComputeInstanceId(handle)
    dev = sim.nvmlDeviceGetHandleByIndex(1)
    create_full_ci(sim, create_gi(sim, dev, 19, 1, 1), 1)  # a second MIG device the container does not get
    nodes = gpu_nodes(sim.proc_root, 5) + gpu_nodes(sim.proc_root, 1)[:1] + mig_cap_nodes(sim.proc_root, 1, gi, ci)
    root = container(sim, tmp_path, shell, nodes)
    listed = smi_in(root, "-L")
    assert (listed.returncode, listed.stdout) == (
        0,
        f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {sim.gpu_uuids[1]})\n"
        f"  MIG 1g.10gb     Device  0: (UUID: {mig})\n"
        f"GPU 1: NVIDIA H100 80GB HBM3 (UUID: {sim.gpu_uuids[5]})\n",
    ), listed
    table = smi_in(root)
    assert table.returncode == 0 and "Driver Version: 550.54.15" in table.stdout, table
    assert [line[46:62] for line in table.stdout.splitlines() if " On  |" in line] == [
        sim.spec.gpus[i].pci_bus_id for i in (1, 5)
    ]
    assert "MIG devices:" in table.stdout and all(len(line) == 91 for line in table.stdout.splitlines() if line)
    query = smi_in(root, "--query-gpu=index, uuid,pci.bus_id", "--format=csv,noheader")
    assert query.stdout.splitlines()[1].startswith(f"1, {sim.gpu_uuids[5]}, 00000000:"), query
    assert smi_in(root, "--query-gpu=fan.speed", "--format=csv").returncode == 2
    assert smi_in(root, "--frobnicate").returncode == 2
    # the script holds the machine as it is when a container starts: a MIG device made since shows in a new one
    known = {sim.nvmlDeviceGetGpuInstanceId(sim.nvmlDeviceGetMigDeviceHandleByIndex(dev, i)) for i in range(2)}
    create_full_ci(sim, create_gi(sim, dev, 19, 2, 1), 1)
    later = [sim.nvmlDeviceGetMigDeviceHandleByIndex(dev, i) for i in range(3)]
    (new,) = [h for h in later if sim.nvmlDeviceGetGpuInstanceId(h) not in known]
    caps = mig_cap_nodes(sim.proc_root, 1, sim.nvmlDeviceGetGpuInstanceId(new), sim.nvmlDeviceGetComputeInstanceId(new))
    fresh = smi_in(container(sim, tmp_path / "later", shell, nodes + caps), "-L").stdout.splitlines()
    assert len(fresh) == 4 and sum(sim.nvmlDeviceGetUUID(new) in line for line in fresh) == 1, fresh


@needs_chroot
def test_in_a_container_without_gpus_nvidia_smi_fails_as_the_real_one(sim: SimulatedNvml, tmp_path: Path) -> None:
    bare = smi_in(container(sim, tmp_path / "bare", "busybox", []), "-L")
    assert bare.returncode == 9 and "couldn't communicate with the NVIDIA driver" in bare.stdout, bare
    control_only = [n for n in gpu_nodes(sim.proc_root, 0) if n.path != "/dev/nvidia0"]
    none = smi_in(container(sim, tmp_path / "ctl", "busybox", control_only))
    assert (none.returncode, none.stdout) == (6, "No devices were found\n")


# ----- the MPS control daemon -----------------------------------------------------------------------------------
def _fds_of(pid: int) -> dict[int, str]:
    base = Path(f"/proc/{pid}/fd")
    return {int(fd): os.readlink(base / fd) for fd in os.listdir(base)}


def test_mps_daemon_lifecycle(sim: SimulatedNvml, tmp_path: Path) -> None:
    gpus = sim.gpu_uuids[3:5]
    env = mps_env(tmp_path, ",".join(gpus))
    (tmp_path / "pipe").mkdir()
    began = time.monotonic()
    started = control(sim, env, "-d")
    assert started.returncode == 0, started
    assert time.monotonic() - began < TIMEOUT_S / 2  # -d returns once the daemon listens
    pid = int((tmp_path / "pipe" / "nvidia-cuda-mps-control.pid").read_text())
    assert pid_alive(pid) and daemon_pids(sim.state_dir) == [pid]
    assert os.getsid(pid) == pid  # detached: a session of its own, stdio on /dev/null, nothing else inherited
    fds = _fds_of(pid)
    assert [fds[i] for i in (0, 1, 2)] == [os.devnull] * 3
    assert all(t.startswith(("socket:", "/dev/null")) or t.endswith(".pid") for t in fds.values()), fds
    assert (tmp_path / "pipe" / "control").is_socket()
    (daemon,) = SharingState(sim.state_dir).daemons().values()
    assert daemon["pid"] == pid and daemon["visible"] == gpus
    assert daemon["compute_modes"] == dict.fromkeys(gpus, "Default")
    assert "Starting control daemon using socket" in (tmp_path / "log" / "control.log").read_text()

    settings = "set_default_active_thread_percentage 25\nget_default_active_thread_percentage\n"
    settings += f"set_default_device_pinned_mem_limit 1 2G\nget_default_device_pinned_mem_limit {gpus[1]}\n"
    done = control(sim, env, stdin=settings)
    assert (done.returncode, done.stdout) == (0, "25.0\n25.0\n2G\n"), done
    (daemon,) = SharingState(sim.state_dir).daemons().values()
    assert daemon["active_thread_percentage"] == 25.0 and daemon["pinned_mem_limits"] == {"1": "2G"}
    assert daemon["commands"] == ["set_default_active_thread_percentage 25", "set_default_device_pinned_mem_limit 1 2G"]
    for bad, words in [
        ("frobnicate", "Unrecognized command: frobnicate"),
        ("set_default_device_pinned_mem_limit 2 1G", "Invalid device '2'"),
        ("set_default_device_pinned_mem_limit 0 lots", "Invalid memory limit"),
        ("set_default_active_thread_percentage 0", "Invalid active thread percentage"),
    ]:
        refused = control(sim, env, stdin=bad + "\n")
        assert refused.returncode == 1 and words in refused.stderr, refused

    again = control(sim, env, "-d")
    assert again.returncode == 1 and "An instance of this daemon is already running" in again.stderr
    assert daemon_pids(sim.state_dir) == [pid]

    quit_ = control(sim, env, stdin="quit\n")
    assert quit_.returncode == 0, quit_
    assert SharingState(sim.state_dir).read()["mps"] == {}  # gone from the state before the client returns
    assert sorted(p.name for p in (tmp_path / "pipe").iterdir()) == []  # socket and pid file removed
    assert wait_gone(pid)
    after = control(sim, env, stdin="get_server_list\n")
    assert after.returncode == 1 and "Cannot find MPS control daemon process" in after.stderr
    calls = [c for c in SharingState(sim.state_dir).calls if c["argv"][0].endswith("nvidia-cuda-mps-control")]
    assert calls[0]["argv"][1:] == ["-d"] and calls[0]["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(gpus)
    assert calls[-2]["input"] == "quit\n" and calls[-2]["returncode"] == 0


def test_mps_client_without_a_daemon(sim: SimulatedNvml, tmp_path: Path) -> None:
    env = mps_env(tmp_path, sim.gpu_uuids[0])
    for _ in range(2):  # no pipe directory, then an empty one
        done = control(sim, env, stdin="quit\n")
        assert done.returncode == 1 and "Cannot find MPS control daemon process" in done.stderr
        (tmp_path / "pipe").mkdir(exist_ok=True)
    assert control(sim, env).returncode == 1  # no command: still says there is no daemon


@pytest.mark.parametrize(
    ("visible", "make_pipe", "words"),
    [
        ("GPU-00000000-0000-0000-0000-000000000000", True, "no such devices GPU-00000000"),
        (None, False, "Failed to open pipe directory"),
    ],
)
def test_mps_daemon_refuses_to_start(
    sim: SimulatedNvml, tmp_path: Path, visible: str | None, make_pipe: bool, words: str
) -> None:
    if make_pipe:
        (tmp_path / "pipe").mkdir()
    done = control(sim, mps_env(tmp_path, visible or sim.gpu_uuids[0]), "-d")
    assert done.returncode == 1 and words in done.stderr, done
    assert daemon_pids(sim.state_dir) == [] and SharingState(sim.state_dir).read()["mps"] == {}
    assert control(sim, mps_env(tmp_path, ""), "-x").returncode == 1  # and no unknown option


def test_mps_daemon_exits_when_its_pipe_directory_is_removed(sim: SimulatedNvml, tmp_path: Path) -> None:
    env = mps_env(tmp_path, "")  # no CUDA_VISIBLE_DEVICES value: every GPU
    (tmp_path / "pipe").mkdir()
    assert control(sim, env, "-d").returncode == 0
    (daemon,) = SharingState(sim.state_dir).daemons().values()
    assert daemon["visible"] == sim.gpu_uuids
    shutil.rmtree(tmp_path / "pipe")
    assert wait_gone(daemon["pid"])
    assert SharingState(sim.state_dir).read()["mps"] == {}
    assert "its pipe directory was removed" in (tmp_path / "log" / "control.log").read_text()


def test_a_killed_daemon_leaves_a_stale_socket_that_the_next_one_replaces(sim: SimulatedNvml, tmp_path: Path) -> None:
    env = mps_env(tmp_path, sim.gpu_uuids[7])
    (tmp_path / "pipe").mkdir()
    assert control(sim, env, "-d").returncode == 0
    first = int((tmp_path / "pipe" / "nvidia-cuda-mps-control.pid").read_text())
    os.kill(first, signal.SIGKILL)
    assert wait_gone(first)
    assert (tmp_path / "pipe" / "control").exists() and SharingState(sim.state_dir).daemons() == {}
    assert control(sim, env, stdin="quit\n").returncode == 1  # the socket is there, nobody listens
    assert control(sim, env, "-d").returncode == 0  # the lock went with the killed process
    (daemon,) = SharingState(sim.state_dir).daemons().values()
    assert daemon["pid"] != first
    os.kill(daemon["pid"], signal.SIGTERM)  # SIGTERM: a clean exit
    assert wait_gone(daemon["pid"]) and SharingState(sim.state_dir).read()["mps"] == {}
    assert not (tmp_path / "pipe" / "control").exists()


def test_mps_daemon_in_the_foreground(sim: SimulatedNvml, tmp_path: Path) -> None:
    env = {**os.environ, **mps_env(tmp_path, sim.gpu_uuids[0])}
    (tmp_path / "pipe").mkdir()
    script = str(sim.driver_root / "usr" / "bin" / "nvidia-cuda-mps-control")
    proc = subprocess.Popen([script, "-f"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not SharingState(sim.state_dir).daemons():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        (daemon,) = SharingState(sim.state_dir).daemons().values()
        assert daemon["pid"] == proc.pid and daemon["foreground"] is True
        assert control(sim, mps_env(tmp_path, ""), "-d").returncode == 1  # one daemon per pipe directory
        assert control(sim, mps_env(tmp_path, ""), stdin="quit\n").returncode == 0
        _, err = proc.communicate(timeout=TIMEOUT_S)
        assert proc.returncode == 0 and "Starting control daemon" in err and "Exit (quit)" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT_S)
