"""The NVIDIA driver's user-space files under a driver root, and the CDI edits that give them to a container.

What is taken follows NVIDIA Container Toolkit's nvcdi (pkg/nvcdi/driver-nvml.go, internal/discover,
pkg/lookup): every `*.so.<driver version>` in the directories that hold the driver's libraries (found through
the root's ld.so.cache, else the standard library directories), the binaries nvidia-smi & co., the GSP firmware
`lib/firmware/nvidia/<version>/gsp*.bin` and the persistenced/fabricmanager sockets where present.

Two driver versions side by side (an upgrade in progress, a leftover): only files of `driver_version` (the
kernel module's, from NVML) are taken, found by name rather than through `libcuda.so.1`, and the container's
`libcuda.so.1` always names that version even where the root's own link points to the other one: user-space
libraries of another version than the kernel module fail at cuInit.

Symlinks are resolved inside the root (as if it were `/`), so an absolute link in a GPU Operator root at
/run/nvidia/driver never escapes to the host's files. Nothing here raises for a missing or damaged file: it is
left out with a warning (logged, and kept in `DriverFiles.warnings`).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import posixpath
import stat
from dataclasses import dataclass
from pathlib import Path

from dra_driver.cdi.elf import ElfError, read_elf
from dra_driver.cdi.ldcache import LdCacheError, read_cache
from dra_driver.cdi.spec import ContainerEdits, Hook, Mount

log = logging.getLogger(__name__)

FILE_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
SOCKET_MOUNT_OPTIONS = ("nosuid", "nodev", "rbind", "rprivate", "noexec")  # writable: clients connect()
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
OPTIONAL_BINARIES = ("nvidia-imex", "nvidia-imex-ctl")  # only on IMEX (multi-node NVLink) systems
BINARY_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
LIBRARY_DIRS = (  # searched when the root has no usable ld.so.cache (nvcdi's list)
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/aarch64-linux-gnu/nvidia/current",
)
SOCKETS = ("nvidia-persistenced/socket", "nvidia-fabricmanager/socket")
SOCKET_DIRS = ("/run", "/var/run")
LDCACHE = "/etc/ld.so.cache"
_MAX_LINK_HOPS = 40  # the kernel's limit


@dataclass(frozen=True)
class Symlink:
    link: str  # where the loader looks, inside the root: /usr/lib/x86_64-linux-gnu/libcuda.so.1
    target: str  # what the link names, as nvidia-cdi-hook create-symlinks writes it: libcuda.so.550.54.15


@dataclass(frozen=True)
class DriverLibrary:
    path: str  # the versioned file inside the root, symlinks resolved
    soname: str | None
    links: tuple[Symlink, ...] = ()


@dataclass(frozen=True)
class DriverFile:
    path: str  # where the container sees it: the path found inside the root
    resolved: str  # the file it is, symlinks resolved inside the root (what is bind-mounted)


@dataclass(frozen=True)
class DriverFiles:
    driver_version: str
    libraries: tuple[DriverLibrary, ...] = ()
    binaries: tuple[DriverFile, ...] = ()
    firmware: tuple[DriverFile, ...] = ()
    sockets: tuple[DriverFile, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def library_dirs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(posixpath.dirname(lib.path) for lib in self.libraries))


def resolve_in_root(root: Path, path: str) -> str | None:
    """`path` (absolute, inside `root`) with every symlink resolved as if `root` were `/`; None when it does not
    exist, a link dangles or links loop."""
    pending = [p for p in path.split("/") if p][::-1]
    done: list[str] = []
    hops = 0
    while pending:
        part = pending.pop()
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        here = root.joinpath(*done, part)
        if here.is_symlink():
            hops += 1
            if hops > _MAX_LINK_HOPS:
                return None
            target = os.readlink(here)
            if target.startswith("/"):
                done = []
            pending.extend([p for p in target.split("/") if p][::-1])
            continue
        if not os.path.lexists(here):
            return None
        done.append(part)
    return "/" + "/".join(done)


def _listdir(root: Path, path: str, warnings: list[str]) -> list[str]:
    """The sorted names in `path` inside the root; none, with a warning, where it cannot be listed."""
    try:
        return sorted(os.listdir(_on(root, path)))
    except OSError as e:
        warnings.append(f"cannot list {path}: {e.strerror}")
        return []


def _on(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def _mode(root: Path, path: str) -> int | None:
    try:
        return _on(root, path).lstat().st_mode
    except OSError:
        return None


def discover_driver_files(driver_root: Path, driver_version: str, *, kernel_release: str | None = None) -> DriverFiles:
    """The files of `driver_version` under `driver_root` (as this process sees it: the plugin may mount the host's
    driver root elsewhere). `kernel_release` picks the firmware search paths (default: the running kernel's)."""
    if not driver_root.is_dir():
        files = DriverFiles(
            driver_version, warnings=(f"{driver_root} is not a directory: no driver files for containers",)
        )
    else:
        warnings: list[str] = []
        dirs = _library_dirs(driver_root, driver_version, warnings)
        libraries = tuple(_libraries(driver_root, dirs, driver_version, warnings))
        binaries = tuple(_binaries(driver_root, warnings))
        release = os.uname().release if kernel_release is None else kernel_release
        firmware = tuple(_firmware(driver_root, driver_version, release, warnings))
        files = DriverFiles(
            driver_version, libraries, binaries, firmware, tuple(_sockets(driver_root)), tuple(warnings)
        )
    for w in files.warnings:
        log.warning("driver files under %s: %s", driver_root, w)
    return files


def _library_dirs(root: Path, version: str, warnings: list[str]) -> list[str]:
    """Directories holding `lib*.so.<version>`: those of the root's ld.so.cache entries, else the standard ones."""
    suffix = f".so.{version}"

    def holding(candidates: list[str]) -> list[str]:
        found: dict[str, None] = {}
        for d in candidates:
            real = resolve_in_root(root, d)
            if real is None or real in found or not stat.S_ISDIR(_mode(root, real) or 0):
                continue
            try:
                names = os.listdir(_on(root, real))
            except OSError as e:
                warnings.append(f"cannot list {real}: {e.strerror}")
                continue
            if any(n.startswith("lib") and n.endswith(suffix) for n in names):
                found[real] = None
        return list(found)

    try:
        entries = read_cache(_on(root, resolve_in_root(root, LDCACHE) or LDCACHE))
    except FileNotFoundError:
        warnings.append(f"no {LDCACHE}: searching the standard library directories")
    except (OSError, LdCacheError) as e:
        warnings.append(f"cannot read {LDCACHE} ({e}): searching the standard library directories")
    else:
        candidates: dict[str, None] = {}
        for entry in entries:
            if entry.bits != 64:
                continue
            candidates[posixpath.dirname(entry.path)] = None
            real = resolve_in_root(root, entry.path)
            if real is not None:
                candidates[posixpath.dirname(real)] = None
        dirs = holding(list(candidates))
        if dirs:
            return dirs
        warnings.append(f"{LDCACHE} lists no library of driver {version}: searching the standard library directories")
    dirs = holding(list(LIBRARY_DIRS))
    if not dirs:
        warnings.append(f"no library of driver {version} (lib*{suffix}) found")
    return dirs


def _libraries(root: Path, dirs: list[str], version: str, warnings: list[str]) -> list[DriverLibrary]:
    suffix = f".so.{version}"
    libraries: list[DriverLibrary] = []
    seen: set[str] = set()
    linked: set[str] = set()
    foreign: list[str] = []  # "link -> file" where the root's soname link names another version
    for d in dirs:
        names = _listdir(root, d, warnings)
        for name in names:
            if not name.endswith(suffix):
                continue
            real = resolve_in_root(root, f"{d}/{name}")
            if real is None:
                warnings.append(f"{d}/{name} is a dangling symlink: left out")
                continue
            if real in seen or not stat.S_ISREG(_mode(root, real) or 0):
                continue
            seen.add(real)
            soname = _soname(root, real, warnings)
            links = [s for s in _links(root, real, soname, foreign) if s.link not in linked]
            linked.update(s.link for s in links)
            libraries.append(DriverLibrary(real, soname, tuple(links)))
    if foreign:
        warnings.append(
            f"{len(foreign)} soname links point to another driver version (e.g. {foreign[0]}): containers get the "
            f"libraries of {version}, the running driver"
        )
    return libraries


def _soname(root: Path, path: str, warnings: list[str]) -> str | None:
    try:
        return read_elf(_on(root, path)).soname
    except (ElfError, OSError) as e:
        warnings.append(f"cannot read the soname of {path} ({e}): mounted without its links")
        return None


def _links(root: Path, path: str, soname: str | None, foreign: list[str]) -> list[Symlink]:
    """The links a container needs to this library (nvcdi's WithDriverDotSoSymlinks): its soname link and `.so`
    link where the root has them, plus the links applications assume (libcuda.so)."""
    d, name = posixpath.split(path)
    links: list[Symlink] = []

    def add(link: str, target: str) -> None:
        if link != name and all(s.link != f"{d}/{link}" for s in links):
            links.append(Symlink(f"{d}/{link}", target))

    if fnmatch.fnmatchcase(name, "libcuda.so.*.*"):
        add("libcuda.so", "libcuda.so.1")  # many applications dlopen("libcuda.so")
    elif fnmatch.fnmatchcase(name, "libGLX_nvidia.so.*.*"):
        add("libGLX_indirect.so.0", name)  # GLVND's indirect GLX
    elif fnmatch.fnmatchcase(name, "libnvidia-opticalflow.so.*.*"):
        add("libnvidia-opticalflow.so", "libnvidia-opticalflow.so.1")
    if soname is None:
        return links
    if soname != name and _is_link(root, f"{d}/{soname}"):
        add(soname, name)
        points_to = resolve_in_root(root, f"{d}/{soname}")
        if points_to is not None and points_to != path:
            foreign.append(f"{d}/{soname} -> {points_to}")
    so_link = _dot_so(soname)
    if so_link and so_link != soname and _is_link(root, f"{d}/{so_link}"):
        add(so_link, soname)
    return links


def _is_link(root: Path, path: str) -> bool:
    return stat.S_ISLNK(_mode(root, path) or 0)


def _dot_so(name: str) -> str | None:
    """libcuda.so.1 -> libcuda.so; None for a name without `.so`."""
    while True:
        stem, ext = posixpath.splitext(name)
        if ext == ".so":
            return name
        if not ext:
            return None
        name = stem


def _binaries(root: Path, warnings: list[str]) -> list[DriverFile]:
    found: list[DriverFile] = []
    for name in BINARIES + OPTIONAL_BINARIES:
        for d in BINARY_DIRS:
            real = resolve_in_root(root, f"{d}/{name}")
            mode = None if real is None else _mode(root, real)
            if real is not None and mode is not None and stat.S_ISREG(mode) and mode & 0o111:
                found.append(DriverFile(f"{d}/{name}", real))
                break
        else:
            if name in BINARIES:
                warnings.append(f"{name} not found (searched {', '.join(BINARY_DIRS)})")
    return found


def _firmware(root: Path, version: str, kernel_release: str, warnings: list[str]) -> list[DriverFile]:
    """gsp*.bin of this version in the kernel's firmware search path (drivers/base/firmware_loader)."""
    search = (
        f"/lib/firmware/updates/{kernel_release}",
        "/lib/firmware/updates",
        f"/lib/firmware/{kernel_release}",
        "/lib/firmware",
    )
    found: list[DriverFile] = []
    seen: set[str] = set()
    for base in search:
        d = f"{base}/nvidia/{version}"
        real_dir = resolve_in_root(root, d)
        if real_dir is None or not stat.S_ISDIR(_mode(root, real_dir) or 0):
            continue
        listed = _listdir(root, real_dir, warnings)
        for name in listed:
            if not fnmatch.fnmatchcase(name, "gsp*.bin"):
                continue
            real = resolve_in_root(root, f"{real_dir}/{name}")
            if real is None:
                warnings.append(f"{d}/{name} is a dangling symlink: left out")
            elif real not in seen and stat.S_ISREG(_mode(root, real) or 0):
                seen.add(real)
                found.append(DriverFile(f"{d}/{name}", real))
    if not found:
        warnings.append(f"no GSP firmware for driver {version} (nvidia/{version}/gsp*.bin): fine without GSP")
    return found


def _sockets(root: Path) -> list[DriverFile]:
    found: list[DriverFile] = []
    for name in SOCKETS:
        for d in SOCKET_DIRS:
            real = resolve_in_root(root, f"{d}/{name}")
            mode = None if real is None else _mode(root, real)
            if real is not None and mode is not None and not stat.S_ISDIR(mode):
                found.append(DriverFile(f"{d}/{name}", real))
                break
        else:
            log.debug("no %s under %s (its daemon does not run there)", name, root)
    return found


def _hook_args(hook_path: str, name: str) -> list[str]:
    base = posixpath.basename(hook_path)
    return [base, "hook", name] if base == "nvidia-ctk" else [base, name]  # nvidia-ctk nests the hooks


def common_edits(files: DriverFiles, host_driver_root: Path | str, *, hook_path: str | None = None) -> ContainerEdits:
    """Mounts of the driver's files: hostPath is `host_driver_root` (where the *host* sees the driver root, e.g.
    /run/nvidia/driver while this plugin reads it at /driver-root) + the file, containerPath the file's path
    inside the root.

    Without `hook_path`, each library's soname and `.so` links become more bind mounts of the versioned file, so
    the container's loader finds `libcuda.so.1` in the library directory without running ldconfig (the
    directory must be in the image's search path: the multiarch directories of Debian-family images, /usr/lib64
    of RPM-family ones). With `hook_path` (an nvidia-cdi-hook or nvidia-ctk on the host), NVIDIA's
    `create-symlinks` and `update-ldcache` createContainer hooks do that instead, as nvcdi specs do.
    """
    root = str(host_driver_root)

    def mount(container_path: str, resolved: str, options: tuple[str, ...]) -> Mount:
        host_path = posixpath.join(root, resolved.lstrip("/"))
        return Mount(host_path=host_path, container_path=container_path, options=list(options))

    mounts = [mount(lib.path, lib.path, FILE_MOUNT_OPTIONS) for lib in files.libraries]
    if hook_path is None:
        mounts += [mount(s.link, lib.path, FILE_MOUNT_OPTIONS) for lib in files.libraries for s in lib.links]
    mounts += [mount(f.path, f.resolved, SOCKET_MOUNT_OPTIONS) for f in files.sockets]
    mounts += [mount(f.path, f.resolved, FILE_MOUNT_OPTIONS) for f in files.firmware + files.binaries]
    unique: dict[str, Mount] = {}
    for m in mounts:
        unique.setdefault(m.container_path, m)  # one mount per path: the first wins
    hooks: list[Hook] = []
    env: list[str] = []
    if hook_path is not None:
        hook_env = ["NVIDIA_CTK_DEBUG=false"]
        links = [f"{s.target}::{s.link}" for lib in files.libraries for s in lib.links]
        if links:
            args = _hook_args(hook_path, "create-symlinks") + [a for x in links for a in ("--link", x)]
            hooks.append(Hook(hook_name="createContainer", path=hook_path, args=args, env=hook_env))
        if files.library_dirs:
            folders = [a for d in files.library_dirs for a in ("--folder", d)]
            args = _hook_args(hook_path, "update-ldcache") + folders
            hooks.append(Hook(hook_name="createContainer", path=hook_path, args=args, env=hook_env))
            env.append(f"NVIDIA_CTK_LIBCUDA_DIR={':'.join(files.library_dirs)}")  # read by NVIDIA's hooks only
    return ContainerEdits(env=env or None, mounts=list(unique.values()) or None, hooks=hooks or None)
