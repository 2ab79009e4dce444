"""A simulated NVIDIA driver root: the user-space files a data-center driver installs, laid out as on a Debian-
family host, so CDI discovery reads a real tree (versioned libraries that glibc loads, soname and `.so` links, an
ld.so.cache, the binaries, the GSP firmware, the persistenced socket). libnvidia-ml is the simulated NVML library
(native/libnvml, docs/simulated-libnvml.md) where scripts/build-libnvml.sh has built it: it answers the NVML C API
from the state of the machine whose state directory holds the root; the other libraries are stand-ins.

    usr/lib/<multiarch>/libcuda.so.<ver>, libcuda.so.1 -> libcuda.so.<ver>, libcuda.so -> libcuda.so.1, ...
    etc/ld.so.cache, etc/ld.so.conf, etc/ld.so.conf.d/<multiarch>.conf
    usr/bin/nvidia-smi, nvidia-cuda-mps-control, nvidia-cuda-mps-server, nvidia-debugdump, nvidia-persistenced
    lib/firmware/nvidia/<ver>/gsp_ga10x.bin, gsp_tu10x.bin
    run/nvidia-persistenced/socket

The binaries are shell scripts running `dra_driver.simulator.tools.main(<name>, argv)` with a Python that has
the package (all five: the tools module answers "unsupported" for the ones it does not simulate). The simulated
machine's state directory is the parent of the driver root. Where that directory is out of reach (the script
bind-mounted into a container by a CDI spec), `nvidia-smi` answers in shell alone (data/nvidia-smi-view.sh) from
the container's device nodes and a table of the machine's devices kept in the script (`write_nvidia_smi`).

Calling it again rewrites only what differs (each file through a temp file and a rename), so concurrent callers
never see a half-written file; a second version installed into the same root lies next to the first, its links
and the cache taking over, as a driver upgrade leaves it.
"""

from __future__ import annotations

import os
import platform
import re
import stat
import sys
import threading
from pathlib import Path

import dra_driver
from dra_driver.cdi.driverfiles import resolve_in_root
from dra_driver.cdi.elf import ElfError, read_elf
from dra_driver.cdi.ldcache import CacheEntry, flags_for, libcmp, serialize
from dra_driver.simulator.elf import shared_object
from dra_driver.simulator.libnvml.build import built_library

_MULTIARCH = {"x86_64": "x86_64-linux-gnu", "amd64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}
# name -> soname ("" = the versioned file name, as for libnvidia-gpucomp) and whether a `.so` dev link exists;
# a subset of what the data-center driver's .run installer puts in the library directory.
_LIBRARIES: dict[str, tuple[str, bool]] = {
    "libcuda": ("libcuda.so.1", True),
    "libcudadebugger": ("libcudadebugger.so.1", False),
    "libnvidia-ml": ("libnvidia-ml.so.1", True),
    "libnvidia-ptxjitcompiler": ("libnvidia-ptxjitcompiler.so.1", True),
    "libnvidia-nvvm": ("libnvidia-nvvm.so.4", True),
    "libnvidia-cfg": ("libnvidia-cfg.so.1", True),
    "libnvidia-gpucomp": ("", False),
    "libnvidia-opencl": ("libnvidia-opencl.so.1", False),
    "libnvidia-allocator": ("libnvidia-allocator.so.1", True),
    "libnvidia-encode": ("libnvidia-encode.so.1", True),
    "libnvcuvid": ("libnvcuvid.so.1", True),
    "libnvidia-opticalflow": ("libnvidia-opticalflow.so.1", True),
}
TOOLS = ("nvidia-smi", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nvidia-debugdump", "nvidia-persistenced")
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
# A shell script, not a Python one: the plugin's container and the host may share one simulated root (a hostPath),
# each with its own Python. Every writer adds its interpreter and its dra_driver package directory; the first pair
# present where the script runs wins.
_TOOL_SCRIPT = """#!/bin/sh
# Simulated {tool} (dra_driver.simulator.tools), run with the first Python that has dra_driver here.
try() {{
  py=$1 pkg=$2
  shift 2
  if [ -x "$py" ] && [ -d "$pkg" ]; then
    exec "$py" -c 'import sys, dra_driver.simulator.tools as t; sys.exit(t.main(sys.argv[1], sys.argv[2:]))' \\
      {tool} "$self" "$@"
  fi
}}
self=$0
{view}{candidates}
echo "{tool} (simulated): no Python with the dra_driver package on this machine" >&2
exit 127
"""
_CANDIDATE = re.compile(r'^try "([^"]+)" "([^"]+)" "\$@"$', re.MULTILINE)
_MAX_CANDIDATES = 4
SMI = "nvidia-smi"
_SMI_VIEW = (Path(__file__).parent / "data" / "nvidia-smi-view.sh").read_text()


def _tool_script(path: Path, tool: str, python: str, smi_table: str = "") -> bytes:
    """The script for `tool` naming `python` (and this process's dra_driver) plus the pairs already in it;
    nvidia-smi's with `smi_table`."""
    own = (python, str(Path(dra_driver.__file__).resolve().parent))
    try:
        known = _CANDIDATE.findall(path.read_text())
    except (FileNotFoundError, UnicodeDecodeError):
        known = []
    pairs = known if own in known else [own, *known][:_MAX_CANDIDATES]
    lines = "\n".join(f'try "{py}" "{pkg}" "$@"' for py, pkg in pairs)
    view = _SMI_VIEW.replace("@DEVICES@\n", smi_table) if tool == SMI else ""
    return _TOOL_SCRIPT.format(tool=tool, view=view, candidates=lines).encode()


def write_nvidia_smi(root: Path, smi_table: str, *, tool_python: str = sys.executable) -> None:
    """Rewrite the root's nvidia-smi with `smi_table`, the devices it shows in a container: lines `driver|...`,
    `gpu|...`, `mig|...` as data/nvidia-smi-view.sh reads them. Callers serialise their writes (the simulator
    writes under its state lock), so the last table written is the machine's."""
    path = root / "usr" / "bin" / SMI
    _write(path, _tool_script(path, SMI, tool_python, smi_table), 0o755)


def multiarch() -> str:
    """The host's Debian multiarch triplet: the simulated libraries are the host's machine, so is their dir."""
    arch = platform.machine().lower()
    if arch not in _MULTIARCH:
        raise RuntimeError(f"no simulated driver root for machine {arch!r}")
    return _MULTIARCH[arch]


def library_dir(root: Path) -> Path:
    return root / "usr" / "lib" / multiarch()


def ensure_driver_root(
    root: Path, driver_version: str, *, tool_python: str = sys.executable, smi_table: str | None = ""
) -> Path:
    """Create or update the driver root at `root` for `driver_version`; returns `root`. `smi_table`: the devices
    nvidia-smi shows in a container (`write_nvidia_smi`); None leaves nvidia-smi to a caller that writes it under
    its own lock (a table written here, unlocked, could overwrite a newer one)."""
    if not driver_version or "/" in driver_version:
        raise ValueError(f"invalid driver version {driver_version!r}")
    libdir = library_dir(root)
    libdir.mkdir(parents=True, exist_ok=True)
    for base, (soname, dev_link) in _LIBRARIES.items():
        versioned = f"{base}.so.{driver_version}"
        _write(libdir / versioned, _library_bytes(base, soname or versioned), 0o644)
        if soname:
            _symlink(libdir / soname, versioned)
            if dev_link:
                _symlink(libdir / f"{base}.so", soname)
    for tool in TOOLS:
        if tool == SMI:
            if smi_table is not None:
                write_nvidia_smi(root, smi_table, tool_python=tool_python)
            continue
        path = root / "usr" / "bin" / tool
        _write(path, _tool_script(path, tool, tool_python), 0o755)
    for name in FIRMWARE:
        blob = f"simulated GSP firmware {name} of NVIDIA driver {driver_version}\n".encode()
        _write(root / "lib" / "firmware" / "nvidia" / driver_version / name, blob, 0o644)
    _socket(root / "run" / "nvidia-persistenced" / "socket")
    triplet = multiarch()
    _write(root / "etc" / "ld.so.conf", b"include /etc/ld.so.conf.d/*.conf\n", 0o644)
    conf = f"# Multiarch support\n/usr/local/lib/{triplet}\n/lib/{triplet}\n/usr/lib/{triplet}\n"
    _write(root / "etc" / "ld.so.conf.d" / f"{triplet}.conf", conf.encode(), 0o644)
    dirs = [f"/usr/local/lib/{triplet}", f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib", "/usr/lib"]
    _write(root / "etc" / "ld.so.cache", serialize(ldconfig_entries(root, dirs)), 0o644)
    return root


def _library_bytes(base: str, soname: str) -> bytes:
    """libnvidia-ml: the simulated NVML library (dra_driver.simulator.libnvml) where it is built, which answers the
    NVML C API from the state of the machine whose driver root it lies in; every other library, and libnvidia-ml
    where none is built, a stand-in that the dynamic loader maps but that has no symbols."""
    if base == "libnvidia-ml":
        built = built_library()
        if built is not None:
            return built.read_bytes()
    return shared_object(soname)


def ldconfig_entries(root: Path, dirs: list[str]) -> list[CacheEntry]:
    """What `ldconfig -r root` caches for these directories (glibc elf/ldconfig.c search_dir), hwcap
    subdirectories aside: per soname one entry `<dir>/<soname>`, a file preferred to a link, the newer name to the
    older; a `.so` dev link is cached under its own name."""
    entries: list[CacheEntry] = []
    seen_dirs: set[str] = set()
    for d in dirs:
        real_dir = resolve_in_root(root, d)
        if real_dir is None or real_dir in seen_dirs or not (root / real_dir.lstrip("/")).is_dir():
            continue
        seen_dirs.add(real_dir)
        chosen: dict[str, tuple[str, bool, int]] = {}  # soname -> (file name, is link, flags)
        for name in os.listdir(root / real_dir.lstrip("/")):
            found = _library(root, f"{real_dir}/{name}", name)
            if found is None:
                continue
            soname, is_link, flags = found
            old = chosen.get(soname)
            if old is None or (not is_link and old[1]) or (is_link == old[1] and libcmp(old[0], name) < 0):
                chosen[soname] = (name, is_link, flags)
        entries += [CacheEntry(so, flags, f"{d}/{so}") for so, (_, _, flags) in sorted(chosen.items())]
    return entries


def _library(root: Path, path: str, name: str) -> tuple[str, bool, int] | None:
    """(cache key, is a link, flags) of one directory entry, or None when ldconfig skips it."""
    if ".so" not in name:
        return None
    full = root / path.lstrip("/")
    is_link = full.is_symlink()
    real = resolve_in_root(root, path)
    if real is None or not (is_link or full.is_file()) or not (root / real.lstrip("/")).is_file():
        return None
    try:
        elf = read_elf(root / real.lstrip("/"))
        flags = flags_for(elf)
    except (ElfError, ValueError, OSError):
        return None  # not a library this machine's ldconfig would cache
    soname = elf.soname or name
    if is_link and name != soname and not (name.endswith(".so") and soname.startswith(name)):
        is_link = False  # a link that is neither the soname nor the dev link counts as the library itself
    return (name if is_link else soname), is_link, flags


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def _write(path: Path, data: bytes, mode: int) -> None:
    try:
        st = path.lstat()
        if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == mode and path.read_bytes() == data:
            return
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    try:
        tmp.write_bytes(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _symlink(path: Path, target: str) -> None:
    if path.is_symlink() and os.readlink(path) == target:
        return
    tmp = _tmp(path)
    try:
        os.symlink(target, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _socket(path: Path) -> None:
    """A socket inode as a daemon that bound it leaves behind (nobody listens: connecting is refused)."""
    try:
        if stat.S_ISSOCK(path.lstat().st_mode):
            return
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    try:
        os.mknod(tmp, stat.S_IFSOCK | 0o666)  # no privilege needed for sockets, unlike device nodes
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
