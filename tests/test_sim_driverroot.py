"""The simulated driver root (dra_driver.simulator.driverroot) and its libraries (dra_driver.simulator.elf): real
enough for glibc (dlopen, ldconfig) and binutils, idempotent, safe for concurrent callers."""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import dra_driver
from dra_driver.cdi.elf import read_elf
from dra_driver.cdi.ldcache import read_cache
from dra_driver.simulator.driverroot import TOOLS, ensure_driver_root, library_dir, multiarch
from dra_driver.simulator.elf import shared_object
from dra_driver.simulator.nvml import SimulatedNvml
from tests.test_cdi_ldcache import ldconfig_build, ldconfig_listing, needs_ldconfig

V550, V570 = "550.54.15", "570.124.06"
needs_readelf = pytest.mark.skipif(shutil.which("readelf") is None, reason="binutils' readelf is not installed")


def _tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of every entry but directories: a rewrite changes the inode (temp file + rename)."""
    return {
        str(p.relative_to(root)): (p.lstat().st_ino, p.lstat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if not stat.S_ISDIR(p.lstat().st_mode)
    }


def test_simulated_library_is_loadable_by_glibc(tmp_path: Path) -> None:
    path = tmp_path / "libsimtest.so.1.2.3"
    path.write_bytes(shared_object("libsimtest.so.1"))
    lib = ctypes.CDLL(str(path))  # dlopen: maps PT_LOAD, reads PT_DYNAMIC, checks PT_GNU_STACK
    assert lib._handle
    maps = Path("/proc/self/maps").read_text()
    assert str(path) in maps


@needs_readelf
def test_readelf_sees_soname_and_a_non_executable_stack(tmp_path: Path) -> None:
    path = tmp_path / "libsimtest.so.1.2.3"
    path.write_bytes(shared_object("libsimtest.so.1"))
    out = subprocess.run(["readelf", "-W", "-d", "-l", "-S", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "Warning" not in out.stderr + out.stdout, out.stderr
    assert "Library soname: [libsimtest.so.1]" in out.stdout
    stack = next(line for line in out.stdout.splitlines() if "GNU_STACK" in line)
    assert stack.split()[-2] == "RW", stack  # flags column: no E
    assert ".dynamic" in out.stdout and ".dynstr" in out.stdout


@needs_ldconfig
def test_real_ldconfig_caches_the_simulated_library_by_soname(tmp_path: Path) -> None:
    libdir = tmp_path / "usr" / "lib" / multiarch()
    libdir.mkdir(parents=True)
    (libdir / "libsimtest.so.1.2.3").write_bytes(shared_object("libsimtest.so.1"))
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "ld.so.conf").write_text(f"/usr/lib/{multiarch()}\n")
    cache = ldconfig_build(tmp_path)
    listing = ldconfig_listing(cache)
    flags = {"x86_64-linux-gnu": "libc6,x86-64", "aarch64-linux-gnu": "libc6,AArch64"}[multiarch()]
    assert listing == [("libsimtest.so.1", flags, f"/usr/lib/{multiarch()}/libsimtest.so.1")]


def test_driver_root_layout(tmp_path: Path) -> None:
    root = ensure_driver_root(tmp_path / "driver-root", V550, tool_python="/opt/py/bin/python3")
    lib = library_dir(root)
    assert lib == root / "usr" / "lib" / multiarch()
    assert read_elf(lib / f"libcuda.so.{V550}").soname == "libcuda.so.1"
    assert os.readlink(lib / "libcuda.so.1") == f"libcuda.so.{V550}"
    assert os.readlink(lib / "libcuda.so") == "libcuda.so.1"
    assert os.readlink(lib / "libnvidia-nvvm.so.4") == f"libnvidia-nvvm.so.{V550}"
    assert read_elf(lib / f"libnvidia-gpucomp.so.{V550}").soname == f"libnvidia-gpucomp.so.{V550}"
    assert not (lib / "libnvidia-gpucomp.so").exists()  # its soname is its file name: no links
    for tool in TOOLS:
        script = root / "usr" / "bin" / tool
        assert stat.S_IMODE(script.stat().st_mode) == 0o755
        text = script.read_text()
        assert text.startswith("#!/bin/sh\n") and f" {tool} " in text
        assert f'try "/opt/py/bin/python3" "{Path(dra_driver.__file__).resolve().parent}" "$@"' in text
    firmware = root / "lib" / "firmware" / "nvidia" / V550
    assert sorted(p.name for p in firmware.iterdir()) == ["gsp_ga10x.bin", "gsp_tu10x.bin"]
    assert stat.S_ISSOCK((root / "run" / "nvidia-persistenced" / "socket").lstat().st_mode)
    cached = {e.soname: e.path for e in read_cache(root / "etc" / "ld.so.cache")}
    assert cached["libcuda.so.1"] == f"/usr/lib/{multiarch()}/libcuda.so.1"
    assert cached["libnvidia-ml.so"] == f"/usr/lib/{multiarch()}/libnvidia-ml.so"
    assert f"libnvidia-gpucomp.so.{V550}" in cached


@needs_ldconfig
@pytest.mark.parametrize("versions", [[V550], [V550, V570]])
def test_our_ld_so_cache_is_what_ldconfig_builds(tmp_path: Path, versions: list[str]) -> None:
    root = tmp_path / "root"
    for v in versions:  # a second version installed next to the first, as an upgrade leaves it
        ensure_driver_root(root, v)
    ours = ldconfig_listing(root / "etc" / "ld.so.cache")
    real = ldconfig_listing(ldconfig_build(root, "/etc/ld.so.cache.real"))
    assert ours == real
    assert len(ours) >= 20


def test_ensure_is_idempotent_and_repairs_only_what_changed(tmp_path: Path) -> None:
    root = ensure_driver_root(tmp_path / "root", V550)
    before = _tree_state(root)
    ensure_driver_root(root, V550)
    assert _tree_state(root) == before
    lib = library_dir(root)
    (lib / "libcuda.so.1").unlink()
    (lib / f"libnvidia-ml.so.{V550}").write_bytes(b"truncated")
    (root / "usr" / "bin" / "nvidia-smi").chmod(0o644)
    ensure_driver_root(root, V550)
    after = _tree_state(root)
    changed = {k for k in after if after[k] != before.get(k)}
    ml = f"usr/lib/{multiarch()}/libnvidia-ml.so.{V550}"
    assert changed == {f"usr/lib/{multiarch()}/libcuda.so.1", ml, "usr/bin/nvidia-smi"}
    assert read_elf(root / ml).soname == "libnvidia-ml.so.1"
    assert stat.S_IMODE((root / "usr" / "bin" / "nvidia-smi").stat().st_mode) == 0o755


def test_concurrent_callers_build_one_consistent_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    code = "import sys; from pathlib import Path; from dra_driver.simulator.driverroot import ensure_driver_root; " + (
        "[ensure_driver_root(Path(sys.argv[1]), sys.argv[2]) for _ in range(5)]"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(root), V550]) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    assert not list(root.rglob("*.tmp"))
    before = _tree_state(root)
    ensure_driver_root(root, V550)
    assert _tree_state(root) == before  # the racing writers left exactly the final content


def test_a_second_version_takes_over_the_links_and_keeps_the_first(tmp_path: Path) -> None:
    root = ensure_driver_root(tmp_path / "root", V550)
    ensure_driver_root(root, V570)
    lib = library_dir(root)
    assert os.readlink(lib / "libcuda.so.1") == f"libcuda.so.{V570}"
    assert (lib / f"libcuda.so.{V550}").is_file()
    assert (root / "lib" / "firmware" / "nvidia" / V550 / "gsp_ga10x.bin").is_file()
    cached = {e.soname for e in read_cache(root / "etc" / "ld.so.cache")}
    assert {f"libnvidia-gpucomp.so.{V550}", f"libnvidia-gpucomp.so.{V570}"} <= cached


def test_simulated_nvml_has_a_driver_root_of_its_driver_version(tmp_path: Path) -> None:
    sim = SimulatedNvml("dgx-h100", tmp_path / "gpu")
    sim.nvmlInit()
    version = sim.nvmlSystemGetDriverVersion()
    assert sim.driver_root == tmp_path / "gpu" / "driver-root"
    assert read_elf(library_dir(sim.driver_root) / f"libcuda.so.{version}").soname == "libcuda.so.1"
    assert f'try "{sys.executable}" ' in (sim.driver_root / "usr" / "bin" / "nvidia-smi").read_text()


def test_invalid_versions_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="invalid driver version"):
        ensure_driver_root(tmp_path, "../550")


def test_a_root_shared_by_two_pythons_runs_its_tools_with_the_one_that_exists_here(tmp_path: Path) -> None:
    """The plugin's container and the host share a simulated root (a hostPath), each writing its own Python into
    the tool scripts: a script runs with the first interpreter whose dra_driver package exists where it runs."""
    root = tmp_path / "state" / "driver-root"
    ensure_driver_root(root, V550)  # this process: the one that can run the tools here
    ensure_driver_root(root, V550, tool_python=str(tmp_path / "container" / "python3"))  # not on this machine
    text = (root / "usr" / "bin" / "nvidia-debugdump").read_text()
    assert text.index("container/python3") < text.index(sys.executable)  # the last writer's comes first
    out = subprocess.run([root / "usr" / "bin" / "nvidia-debugdump"], capture_output=True, text=True, timeout=60)
    assert "not supported by the simulated driver" in out.stdout + out.stderr  # tools.main ran: a Python was found
    ensure_driver_root(root, V550)  # a writer already listed changes nothing: no rewrite back and forth
    assert (root / "usr" / "bin" / "nvidia-debugdump").read_text() == text
    only_elsewhere = tmp_path / "other" / "driver-root"
    ensure_driver_root(only_elsewhere, V550, tool_python=str(tmp_path / "container" / "python3"))
    tool = only_elsewhere / "usr" / "bin" / "nvidia-debugdump"
    out = subprocess.run([tool], capture_output=True, text=True, timeout=60)
    assert out.returncode == 127 and "no Python with the dra_driver package" in out.stderr
