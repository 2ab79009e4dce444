"""Discovering the driver's user-space files under a driver root and turning them into CDI edits
(dra_driver.cdi.driverfiles), on simulated driver roots laid out as a host's `/` and as the GPU Operator's
/run/nvidia/driver."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dra_driver.cdi.devnodes import CharDevice, gpu_nodes, mig_cap_nodes
from dra_driver.cdi.driverfiles import (
    FILE_MOUNT_OPTIONS,
    SOCKET_MOUNT_OPTIONS,
    DriverFiles,
    common_edits,
    discover_driver_files,
    resolve_in_root,
)
from dra_driver.cdi.ldcache import serialize
from dra_driver.cdi.spec import ContainerEdits, Hook, Mount, claim_spec
from dra_driver.cdi.store import CdiStore
from dra_driver.nvml.discovery import discover as discover_gpus
from dra_driver.simulator.driverroot import ensure_driver_root, ldconfig_entries, library_dir, multiarch
from dra_driver.simulator.nvml import SimulatedNvml
from tests.libnvml_support import REQUIRE, simulated_library
from tests.nvidia_driver import MODESET as NVIDIA_MODESET
from tests.nvidia_driver import make_device_nodes
from tests.nvidia_tools import nvidia_tool
from tests.simhelpers import create_full_ci, create_gi
from tests.test_cdi import _validate, cdivalidate  # noqa: F401  (the session fixture that builds the validator)

V550, V570 = "550.54.15", "570.124.06"
LIB = f"/usr/lib/{multiarch()}"
KERNEL = "6.1.0-test"


def discover(root: Path, version: str = V550) -> DriverFiles:
    return discover_driver_files(root, version, kernel_release=KERNEL)


def names(paths: list[str] | tuple[str, ...]) -> list[str]:
    return sorted(os.path.basename(p) for p in paths)


def test_discovers_a_simulated_driver_root(tmp_path: Path) -> None:
    files = discover(ensure_driver_root(tmp_path / "root", V550))
    assert files.warnings == ()
    libs = {lib.path: lib for lib in files.libraries}
    assert f"{LIB}/libcuda.so.{V550}" in libs and f"{LIB}/libnvidia-ml.so.{V550}" in libs
    assert all(p.endswith(f".so.{V550}") for p in libs)
    cuda = libs[f"{LIB}/libcuda.so.{V550}"]
    assert cuda.soname == "libcuda.so.1"
    assert {(s.link, s.target) for s in cuda.links} == {
        (f"{LIB}/libcuda.so.1", f"libcuda.so.{V550}"),
        (f"{LIB}/libcuda.so", "libcuda.so.1"),
    }
    assert libs[f"{LIB}/libnvidia-gpucomp.so.{V550}"].links == ()  # soname == file name, no .so link on the host
    assert libs[f"{LIB}/libcudadebugger.so.{V550}"].links[0].link == f"{LIB}/libcudadebugger.so.1"
    assert len(libs[f"{LIB}/libcudadebugger.so.{V550}"].links) == 1  # the host has no libcudadebugger.so
    assert files.library_dirs == (LIB,)
    assert [b.path for b in files.binaries] == [
        "/usr/bin/nvidia-smi",
        "/usr/bin/nvidia-debugdump",
        "/usr/bin/nvidia-persistenced",
        "/usr/bin/nvidia-cuda-mps-control",
        "/usr/bin/nvidia-cuda-mps-server",
    ]
    assert [f.path for f in files.firmware] == [
        f"/lib/firmware/nvidia/{V550}/gsp_ga10x.bin",
        f"/lib/firmware/nvidia/{V550}/gsp_tu10x.bin",
    ]
    assert [s.path for s in files.sockets] == ["/run/nvidia-persistenced/socket"]


def test_mounts_for_a_host_root(tmp_path: Path) -> None:
    root = ensure_driver_root(tmp_path / "root", V550)
    edits = common_edits(discover(root), "/")
    mounts = {m.container_path: m for m in edits.mounts or []}
    lib = mounts[f"{LIB}/libcuda.so.{V550}"]
    assert (lib.host_path, lib.options) == (f"{LIB}/libcuda.so.{V550}", list(FILE_MOUNT_OPTIONS))
    # no hook: the soname and .so links are bind mounts of the versioned file itself
    assert mounts[f"{LIB}/libcuda.so.1"].host_path == f"{LIB}/libcuda.so.{V550}"
    assert mounts[f"{LIB}/libcuda.so"].host_path == f"{LIB}/libcuda.so.{V550}"
    assert mounts["/run/nvidia-persistenced/socket"].options == list(SOCKET_MOUNT_OPTIONS)
    assert mounts[f"/lib/firmware/nvidia/{V550}/gsp_ga10x.bin"].options == list(FILE_MOUNT_OPTIONS)
    assert mounts["/usr/bin/nvidia-smi"].host_path == "/usr/bin/nvidia-smi"
    assert edits.hooks is None and edits.env is None
    assert len(mounts) == len(edits.mounts or [])  # one mount per container path


def test_gpu_operator_root_seen_at_another_path_by_the_plugin(tmp_path: Path) -> None:
    """The host has the driver at /run/nvidia/driver; the plugin container mounts it at /driver-root."""
    host = tmp_path / "host"
    ensure_driver_root(host / "run" / "nvidia" / "driver", V550)
    plugin_view = tmp_path / "driver-root"
    plugin_view.symlink_to(host / "run" / "nvidia" / "driver")
    files = discover(plugin_view)
    assert files.warnings == ()
    edits = common_edits(files, Path("/run/nvidia/driver"))
    for m in edits.mounts or []:
        assert m.host_path.startswith("/run/nvidia/driver/"), m
        assert not m.container_path.startswith("/run/nvidia/driver"), m
        assert os.path.lexists(host / m.host_path.lstrip("/")), m.host_path  # the host really has it there
    mounts = {m.container_path: m.host_path for m in edits.mounts or []}
    assert mounts[f"{LIB}/libcuda.so.1"] == f"/run/nvidia/driver{LIB}/libcuda.so.{V550}"
    assert mounts["/usr/bin/nvidia-smi"] == "/run/nvidia/driver/usr/bin/nvidia-smi"


def test_absolute_symlinks_resolve_inside_the_root(tmp_path: Path) -> None:
    """A usrmerge root (/lib -> /usr/lib) whose cache lists /lib paths, and an absolute binary link: nothing may
    resolve to the plugin's own / (which has no such files, or worse, other ones)."""
    root = ensure_driver_root(tmp_path / "root", V550)
    (root / "lib" / multiarch()).parent.mkdir(parents=True, exist_ok=True)
    (root / "lib" / multiarch()).symlink_to(f"/usr/lib/{multiarch()}")  # absolute, meant inside the root
    entries = ldconfig_entries(root, [f"/lib/{multiarch()}"])
    assert entries and all(e.path.startswith(f"/lib/{multiarch()}/") for e in entries)
    (root / "etc" / "ld.so.cache").write_bytes(serialize(entries))
    smi = root / "usr" / "bin" / "nvidia-smi"
    smi.rename(root / "usr" / "bin" / "nvidia-smi.real")
    smi.symlink_to("/usr/bin/nvidia-smi.real")
    files = discover(root)
    assert files.warnings == ()
    assert files.library_dirs == (LIB,)
    smi_file = next(b for b in files.binaries if b.path == "/usr/bin/nvidia-smi")
    assert smi_file.resolved == "/usr/bin/nvidia-smi.real"
    assert resolve_in_root(root, f"/lib/{multiarch()}/libcuda.so.1") == f"{LIB}/libcuda.so.{V550}"
    assert resolve_in_root(root, "/lib/../../../../etc/passwd") is None  # `..` stops at the root


def test_without_ldcache_the_standard_directories_are_searched(tmp_path: Path) -> None:
    root = ensure_driver_root(tmp_path / "root", V550)
    expected = discover(root).libraries
    (root / "etc" / "ld.so.cache").unlink()
    files = discover(root)
    assert files.libraries == expected
    assert any("no /etc/ld.so.cache" in w for w in files.warnings)
    (root / "etc" / "ld.so.cache").write_bytes(b"garbage" * 20)
    files = discover(root)
    assert files.libraries == expected
    assert any("cannot read /etc/ld.so.cache" in w for w in files.warnings)


def test_a_custom_library_directory_is_found_only_through_the_cache(tmp_path: Path) -> None:
    root = ensure_driver_root(tmp_path / "root", V550)
    (root / "opt" / "nvidia").mkdir(parents=True)
    library_dir(root).rename(root / "opt" / "nvidia" / "lib")
    (root / "etc" / "ld.so.cache").write_bytes(serialize(ldconfig_entries(root, ["/opt/nvidia/lib"])))
    files = discover(root)
    assert files.library_dirs == ("/opt/nvidia/lib",) and len(files.libraries) >= 10
    (root / "etc" / "ld.so.cache").unlink()
    files = discover(root)
    assert files.libraries == ()
    assert any(f"no library of driver {V550}" in w for w in files.warnings)


def test_missing_and_damaged_files_are_left_out_with_warnings(tmp_path: Path) -> None:
    root = ensure_driver_root(tmp_path / "root", V550)
    lib = library_dir(root)
    shutil.rmtree(root / "lib" / "firmware")
    (root / "usr" / "bin" / "nvidia-debugdump").unlink()
    (root / "run" / "nvidia-persistenced" / "socket").unlink()
    (lib / f"libnvidia-dangling.so.{V550}").symlink_to(f"libnvidia-gone.so.{V550}")
    (lib / f"libnvidia-text.so.{V550}").write_text("not ELF\n")
    (lib / "libnvidia-cfg.so.1").unlink()
    (lib / "libnvidia-cfg.so.1").symlink_to("nowhere")  # a dangling soname link: still a link to replace
    files = discover(root)
    text = "\n".join(files.warnings)
    assert "no GSP firmware" in text and "nvidia-debugdump not found" in text
    assert f"libnvidia-dangling.so.{V550} is a dangling symlink" in text
    assert f"libnvidia-text.so.{V550}" in text and "not an ELF file" in text
    assert files.firmware == () and files.sockets == ()
    libs = {os.path.basename(lib.path): lib for lib in files.libraries}
    assert f"libnvidia-dangling.so.{V550}" not in libs
    assert libs[f"libnvidia-text.so.{V550}"].links == ()  # mounted as found, without links
    assert f"{LIB}/libnvidia-cfg.so.1" in {s.link for s in libs[f"libnvidia-cfg.so.{V550}"].links}
    assert "nvidia-debugdump" not in names([b.path for b in files.binaries])
    edits = common_edits(files, "/")
    assert all(os.path.exists(root / m.host_path.lstrip("/")) for m in edits.mounts or [])


def test_firmware_is_searched_where_the_kernel_looks(tmp_path: Path) -> None:
    root = ensure_driver_root(tmp_path / "root", V550)
    updates = root / "lib" / "firmware" / "updates" / KERNEL / "nvidia"
    updates.mkdir(parents=True)
    (root / "lib" / "firmware" / "nvidia" / V550).rename(updates / V550)
    assert [f.path for f in discover(root).firmware] == [
        f"/lib/firmware/updates/{KERNEL}/nvidia/{V550}/gsp_ga10x.bin",
        f"/lib/firmware/updates/{KERNEL}/nvidia/{V550}/gsp_tu10x.bin",
    ]
    other_kernel = discover_driver_files(root, V550, kernel_release="5.15.0-other")
    assert other_kernel.firmware == () and any("no GSP firmware" in w for w in other_kernel.warnings)


def test_a_missing_driver_root_gives_no_edits(tmp_path: Path) -> None:
    files = discover(tmp_path / "absent")
    assert files.libraries == () and "is not a directory" in files.warnings[0]
    assert common_edits(files, "/") == ContainerEdits()


def test_two_driver_versions_side_by_side(tmp_path: Path) -> None:
    root = ensure_driver_root(tmp_path / "root", V550)
    ensure_driver_root(root, V570)  # libcuda.so.1 etc. now point to 570
    old = discover(root, V550)
    assert old.libraries and all(lib.path.endswith(f".so.{V550}") for lib in old.libraries)
    assert [f.path for f in old.firmware] == [
        f"/lib/firmware/nvidia/{V550}/gsp_ga10x.bin",
        f"/lib/firmware/nvidia/{V550}/gsp_tu10x.bin",
    ]
    assert len(old.warnings) == 1 and "point to another driver version" in old.warnings[0]
    edits = common_edits(old, "/")
    assert not [m for m in edits.mounts or [] if V570 in m.host_path]  # never a file of the other driver
    mounts = {m.container_path: m.host_path for m in edits.mounts or []}
    assert mounts[f"{LIB}/libcuda.so.1"] == f"{LIB}/libcuda.so.{V550}"
    hooked = common_edits(old, "/", hook_path="/usr/bin/nvidia-cdi-hook")
    assert f"libcuda.so.{V550}::{LIB}/libcuda.so.1" in ((hooked.hooks or [])[0].args or [])
    new = discover(root, V570)
    assert new.warnings == () and all(lib.path.endswith(f".so.{V570}") for lib in new.libraries)


def test_hook_mode_emits_nvidia_cdi_hook_calls(tmp_path: Path) -> None:
    files = discover(ensure_driver_root(tmp_path / "root", V550))
    edits = common_edits(files, "/run/nvidia/driver", hook_path="/usr/local/nvidia/bin/nvidia-cdi-hook")
    assert [m.container_path for m in edits.mounts or []].count(f"{LIB}/libcuda.so.1") == 0  # the hook makes it
    symlinks, ldcache = edits.hooks or []
    assert symlinks.hook_name == "createContainer" and symlinks.path == "/usr/local/nvidia/bin/nvidia-cdi-hook"
    assert symlinks.env == ["NVIDIA_CTK_DEBUG=false"]
    args = symlinks.args or []
    assert args[:2] == ["nvidia-cdi-hook", "create-symlinks"]
    links = args[3::2]
    assert args[2::2] == ["--link"] * len(links)
    assert f"libcuda.so.1::{LIB}/libcuda.so" in links and f"libcuda.so.{V550}::{LIB}/libcuda.so.1" in links
    assert f"libnvidia-ml.so.1::{LIB}/libnvidia-ml.so" in links
    assert ldcache.args == ["nvidia-cdi-hook", "update-ldcache", "--folder", LIB]
    assert edits.env == [f"NVIDIA_CTK_LIBCUDA_DIR={LIB}"]
    ctk = common_edits(files, "/", hook_path="/usr/bin/nvidia-ctk")
    assert [(h.args or [])[:3] for h in ctk.hooks or []] == [
        ["nvidia-ctk", "hook", "create-symlinks"],
        ["nvidia-ctk", "hook", "update-ldcache"],
    ]


def test_claim_spec_puts_common_edits_at_spec_level_before_visible_devices() -> None:
    common = ContainerEdits(
        env=["A=1"],
        mounts=[Mount(host_path="/h/libcuda.so.1", container_path="/c/libcuda.so.1", options=["ro"])],
        hooks=[Hook(hook_name="createContainer", path="/usr/bin/nvidia-cdi-hook", args=["nvidia-cdi-hook"])],
    )
    node = CharDevice(path="/dev/nvidia0", major=195, minor=0, file_mode=0o666)
    spec = claim_spec("gpu.example.com", "uid-1", {"gpu-0": [node]}, ["GPU-a"], common=common)
    assert spec.container_edits is not None
    assert spec.container_edits.env == ["A=1", "NVIDIA_VISIBLE_DEVICES=GPU-a"]
    assert spec.container_edits.mounts == common.mounts and spec.container_edits.hooks == common.hooks
    assert common.env == ["A=1"]  # the shared common edits are not modified
    plain = claim_spec("gpu.example.com", "uid-1", {"gpu-0": [node]}, ["GPU-a"])
    assert json.loads(plain.to_json())["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-a"]}
    with pytest.raises(ValueError, match="not absolute"):
        Hook(hook_name="createContainer", path="nvidia-cdi-hook")


@pytest.mark.parametrize("hook_path", [None, "/usr/bin/nvidia-cdi-hook"])
def test_specs_with_driver_files_pass_the_official_validator(
    tmp_path: Path,
    cdivalidate: Path,  # noqa: F811
    hook_path: str | None,
) -> None:
    files = discover(ensure_driver_root(tmp_path / "root", V550))
    common = common_edits(files, "/run/nvidia/driver", hook_path=hook_path)
    node = CharDevice(path="/dev/nvidia0", major=195, minor=0, file_mode=0o666)
    spec = claim_spec("gpu.example.com", "0f1e-uid", {"gpu-0": [node]}, ["GPU-a"], common=common)
    path = CdiStore(tmp_path / "cdi", "gpu.example.com").write("0f1e-uid", spec)
    out = _validate(cdivalidate, path)
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(path.read_text())
    assert len(doc["containerEdits"]["mounts"]) == len(common.mounts or []) >= 20
    assert ("hooks" in doc["containerEdits"]) == (hook_path is not None)


def _unshare_works() -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


_LOAD = """
import ctypes, sys
try:
    ctypes.CDLL(sys.argv[1])
except OSError as e:
    print("FAILED", e)
    sys.exit(3)
print(next(line.split()[-1] for line in open("/proc/self/maps") if sys.argv[1] in line))
"""


def _load_in_container(tmp_path: Path, mounts: list[Mount], library: str) -> subprocess.CompletedProcess[str]:
    """Bind-mount each CDI mount under a fake container root in a private mount namespace (as the runtime
    does), then dlopen `library` by name from the container's library directory."""
    ctr = tmp_path / "ctr"
    lines = ["set -e"]
    for m in mounts:
        target = ctr / m.container_path.lstrip("/")
        lines += [f"mkdir -p {shlex.quote(str(target.parent))}", f": > {shlex.quote(str(target))}"]
        lines.append(f"mount --bind {shlex.quote(m.host_path)} {shlex.quote(str(target))}")
    libdir = ctr / LIB.lstrip("/")
    lines.append(
        f"LD_LIBRARY_PATH={shlex.quote(str(libdir))} {shlex.quote(sys.executable)} -c {shlex.quote(_LOAD)} {library}"
    )
    return subprocess.run(["unshare", "-rm", "sh", "-c", "\n".join(lines)], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not _unshare_works(), reason="no unprivileged mount namespaces (unshare -rm) on this host")
def test_the_container_loader_finds_libcuda_through_the_soname_mount(tmp_path: Path) -> None:
    root = ensure_driver_root(tmp_path / "root", V550)
    edits = common_edits(discover(root), root)  # the test process sees the host root where it is
    mounts = edits.mounts or []
    ctr_lib = tmp_path / "ctr" / LIB.lstrip("/")
    for name in ("libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1"):
        out = _load_in_container(tmp_path, mounts, name)
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.strip() == str(ctr_lib / name)
    only_versioned = [m for m in mounts if not m.container_path.endswith((".so.1", ".so"))]
    out = _load_in_container(tmp_path, only_versioned, "libcuda.so.1")  # without the soname mount: not found
    assert out.returncode == 3 and "libcuda.so.1" in out.stdout


HOOK = "/usr/local/nvidia/bin/nvidia-cdi-hook"
MODESET = (NVIDIA_MODESET.path, NVIDIA_MODESET.major, NVIDIA_MODESET.minor)


def _nvidia_ctk_generate(sim: SimulatedNvml, dev_root: Path, out: Path, *, mig: bool) -> dict[str, Any]:
    env = {**os.environ, "DRA_DRIVER_LIBNVML_IDLE_S": "5"}  # the library's server leaves soon after
    # The toolkit reads MIG capability minors from the fixed path /proc/driver/nvidia-caps/mig-minors: in a private
    # mount namespace the simulated machine's /proc/driver is put there.
    in_namespace = [
        "unshare",
        "-m",
        "sh",
        "-c",
        'mount --bind "$0" /proc/driver && exec "$@"',
        str(sim.proc_root / "driver"),
    ]
    gen = subprocess.run(
        [
            *(in_namespace if mig else []),
            str(nvidia_tool("nvidia-ctk")),
            "cdi",
            "generate",
            "--mode=nvml",  # enumerates the GPUs through the driver root's libnvidia-ml: the simulated one
            f"--driver-root={sim.driver_root}",
            f"--dev-root={dev_root}",
            f"--nvidia-cdi-hook-path={HOOK}",
            "--device-name-strategy=uuid",
            "--no-all-device",
            "--format=json",
            f"--output={out}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert gen.returncode == 0, gen.stderr
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def _hook_args(hooks: list[dict[str, Any]], name: str) -> list[list[str]]:
    return [h["args"] for h in hooks if h["args"][1] == name]


@pytest.mark.skipif(
    os.geteuid() != 0 and not REQUIRE, reason="the device nodes nvidia-ctk looks for need mknod, MIG a mount (root)"
)
@pytest.mark.parametrize("mig", [False, True], ids=["whole-gpus", "mig"])
def test_matches_nvidia_ctk_on_a_simulated_node(tmp_path: Path, mig: bool) -> None:
    """`nvidia-ctk cdi generate` (NVIDIA's container toolkit, built from its Go module) on a simulated machine, whose
    GPUs and MIG devices it enumerates through the simulated libnvidia-ml, against our edits for the same root: the
    same device nodes per device, libraries, binaries, firmware, socket and symlinks, and every difference named."""
    sim = SimulatedNvml("dgx-h100", tmp_path / "machine")
    simulated_library(sim)  # the driver root holds the built library, not the stand-in
    sim.nvmlInit()
    try:
        if mig:  # GPU 2 split into a 3g.40gb and a 1g.10gb device
            dev = sim.nvmlDeviceGetHandleByIndex(2)
            sim.nvmlDeviceSetMigMode(dev, 1)
            create_full_ci(sim, create_gi(sim, dev, 9, 4, 4), 3)
            create_full_ci(sim, create_gi(sim, dev, 19, 0, 1), 1)
        inventory = discover_gpus(sim, sim.sysfs_root)
    finally:
        sim.nvmlShutdown()
    # What our claim specs give each device: the GPU's nodes, and for a MIG device its parent's plus its two
    # capability nodes. NVIDIA lists a GPU in MIG mode only through its MIG devices (we hand one out whole only
    # after switching MIG off).
    ours_nodes = {g.uuid: gpu_nodes(sim.proc_root, g.minor) for g in inventory.gpus if not g.mig_instances}
    for g in inventory.gpus:
        for m in g.mig_instances:
            caps = mig_cap_nodes(sim.proc_root, g.minor, m.gpu_instance_id, m.compute_instance_id)
            ours_nodes[m.uuid] = gpu_nodes(sim.proc_root, g.minor) + caps
    assert len(ours_nodes) == (9 if mig else 8)
    dev_root = tmp_path / "machine"  # nvidia-ctk looks under <dev root>/dev
    all_nodes = [gpu_nodes(sim.proc_root, g.minor) for g in inventory.gpus] + list(ours_nodes.values())
    make_device_nodes(dev_root / "dev", [n for nodes in all_nodes for n in nodes] + [NVIDIA_MODESET])

    spec = _nvidia_ctk_generate(sim, dev_root, tmp_path / "nvidia.json", mig=mig)
    theirs = spec["containerEdits"]
    ours = common_edits(
        discover_driver_files(sim.driver_root, sim.spec.driver_version), sim.driver_root, hook_path=HOOK
    )

    # Devices: exactly the machine's GPUs and MIG devices, each with the nodes our claim spec gives it. NVIDIA puts
    # nvidiactl and the UVM nodes in the spec-wide edits, we in each device's (a claim spec has only its own
    # devices): the same nodes in a container. NVIDIA adds /dev/nvidia-modeset, a display driver node CUDA never
    # opens.
    assert sorted(d["name"] for d in spec["devices"]) == sorted(ours_nodes)
    shared = {(n["path"], n["major"], n.get("minor", 0)) for n in theirs["deviceNodes"]}
    for device in spec["devices"]:
        edits = device["containerEdits"]
        nodes = {(n["path"], n["major"], n.get("minor", 0)) for n in edits["deviceNodes"]} | shared
        assert nodes - {MODESET} == {(n.path, n.major, n.minor) for n in ours_nodes[device["name"]]}
        assert all(n["hostPath"] == str(dev_root) + n["path"] for n in edits["deviceNodes"])
        # A per-GPU (not MIG) createRuntime hook of this toolkit release: it applies the container's
        # NVIDIA_GPU_MEMORY_LIMIT to its cgroup (cgroup v2 only). Our memory limits for shared GPUs are MPS's pinned
        # device memory limits (dra_driver/sharing), so we add no such hook.
        limit_args = ["nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", str(sim.driver_root), "--gpu-id"]
        limits = {
            "hookName": "createRuntime",
            "path": HOOK,
            "args": [*limit_args, device["name"]],
            "env": ["NVIDIA_CTK_DEBUG=false"],
        }
        assert edits.get("hooks", []) == ([limits] if device["name"].startswith("GPU-") else [])
    assert MODESET in shared

    # Mounts: the same libraries, binaries, firmware and persistenced socket, same host paths, same options. NVIDIA
    # adds /dev/null at /var/run/nvidia-container-devices/void with NVIDIA_VISIBLE_DEVICES=void, so that the legacy
    # nvidia-container-runtime hook injects nothing more; our claim specs set NVIDIA_VISIBLE_DEVICES to the
    # claim's device UUIDs instead (claim_spec).
    void = {
        "hostPath": "/dev/null",
        "containerPath": "/var/run/nvidia-container-devices/void",
        "options": ["ro", "nosuid", "nodev", "bind"],
    }
    assert void in theirs["mounts"]
    assert sorted((m["hostPath"], m["containerPath"], m["options"]) for m in theirs["mounts"] if m != void) == sorted(
        (m.host_path, m.container_path, m.options) for m in ours.mounts or []
    )
    assert sorted(theirs["env"]) == sorted([*(ours.env or []), "NVIDIA_VISIBLE_DEVICES=void"])

    # Hooks: the same soname and .so links and ldcache folders. NVIDIA also links GBM's backend to
    # libnvidia-allocator (graphics buffer allocation for Wayland/EGL, not used by CUDA), and calls three hooks of
    # recent toolkit releases that we leave out because the hook binary on a node may predate them and an unknown
    # hook fails the container's creation: enable-cuda-compat (CUDA forward-compatibility libraries of the image),
    # disable-device-node-modification (stops NVML in the container from creating device nodes) and
    # update-application-profile (the driver's graphics application profiles).
    our_hooks = [h.model_dump(by_alias=True, exclude_none=True) for h in ours.hooks or []]
    assert {h["hookName"] for h in theirs["hooks"]} == {h["hookName"] for h in our_hooks} == {"createContainer"}
    assert all(h["path"] == HOOK for h in theirs["hooks"] + our_hooks)
    gbm = f"../libnvidia-allocator.so.1::{LIB}/gbm/nvidia-drm_gbm.so"
    their_links = _links(_hook_args(theirs["hooks"], "create-symlinks"))
    assert their_links - {gbm} == _links(_hook_args(our_hooks, "create-symlinks"))
    assert gbm in their_links
    assert _hook_args(theirs["hooks"], "update-ldcache") == _hook_args(our_hooks, "update-ldcache")
    assert [args[1] for args in (h["args"] for h in theirs["hooks"])] == [
        "create-symlinks",  # the GBM link
        "create-symlinks",
        "enable-cuda-compat",
        "update-ldcache",
        "disable-device-node-modification",
        "update-application-profile",
    ]
    assert [h["args"][1] for h in our_hooks] == ["create-symlinks", "update-ldcache"]


def _links(hook_args: list[list[str]]) -> set[str]:
    return {args[i + 1] for args in hook_args for i, a in enumerate(args[:-1]) if a == "--link"}
