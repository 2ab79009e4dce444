"""The tmpfs on a claim's MPS `shm` directory (`/dev/shm` of its containers and of its daemon), as NVIDIA's driver
mounts it: `rw,nosuid,nodev,noexec`, half of the node's MemTotal unless a size is given.

mount(2) and umount2(2) through libc: the image needs no mount(8), and a system call on a tmpfs cannot hang the way
a helper process can. Crash-safe: `mount` leaves an existing tmpfs as it is, `unmount` takes a path that is not a
mount point (never mounted, unmounted already) as done, and both read the truth from /proc/self/mountinfo rather
than from what was recorded. The plugin's container needs CAP_SYS_ADMIN, and a plugin directory mounted with
Bidirectional propagation for the host (the workloads, the daemon pod) to see the mount.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_RELATIME = 0x2, 0x4, 0x8, 0x200000
MNT_DETACH = 0x2
FALLBACK_SIZE = 64 << 20  # NVIDIA's fallback (65536k) when MemTotal cannot be read
_SIZE = re.compile(r"^([1-9][0-9]*)(?:([kmgt])i?)?\Z", re.IGNORECASE)
_ESCAPE = re.compile(r"\\([0-7]{3})")


class TmpfsError(OSError):
    """A tmpfs could not be mounted or unmounted."""


@dataclass(frozen=True)
class MountEntry:
    mount_point: str
    fs_type: str
    source: str
    options: str  # per-superblock options (size=..., mode=...)


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def mounts(mountinfo: Path = Path("/proc/self/mountinfo")) -> list[MountEntry]:
    """The mounts of this process's mount namespace, in mount order (see proc(5))."""
    out = []
    for line in mountinfo.read_text().splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
        except ValueError:
            continue
        out.append(MountEntry(_unescape(fields[4]), fields[sep + 1], _unescape(fields[sep + 2]), fields[sep + 3]))
    return out


def mount_at(path: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> MountEntry | None:
    """The topmost mount on `path` itself (not on a parent), or None."""
    target = os.path.realpath(path)
    found = [m for m in mounts(mountinfo) if m.mount_point == target]
    return found[-1] if found else None


def default_size(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Half of MemTotal in bytes (NVIDIA's choice), FALLBACK_SIZE when it cannot be read."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 // 2
    except (OSError, ValueError, IndexError):
        pass
    log.warning("MemTotal not found in %s: MPS shm tmpfs size %d bytes", meminfo, FALLBACK_SIZE)
    return FALLBACK_SIZE


def parse_size(text: str) -> int:
    """A tmpfs size in bytes: a number with an optional k, m, g or t, as mount(8) takes it, or as a Kubernetes
    binary quantity (8Gi); both are powers of 1024, as tmpfs counts."""
    match = _SIZE.match(text.strip())
    if match is None:
        raise ValueError(f"tmpfs size {text!r}: expected a number with an optional k/m/g/t, as 8g or 8Gi")
    return int(match.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[(match.group(2) or "").lower()]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def mount_tmpfs(path: Path, size: int, mountinfo: Path = Path("/proc/self/mountinfo")) -> bool:
    """A tmpfs of `size` bytes on `path` (an existing directory); False when one is there already (left as is)."""
    existing = mount_at(path, mountinfo)
    if existing is not None and existing.fs_type == "tmpfs":
        return False
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RELATIME
    data = f"size={size},mode=1777".encode()
    if _libc().mount(b"shm", os.fsencode(path), b"tmpfs", ctypes.c_ulong(flags), data) != 0:
        err = ctypes.get_errno()
        raise TmpfsError(err, f"mount tmpfs on {path}: {os.strerror(err)}")
    return True


def unmount(path: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> int:
    """Unmount every tmpfs stacked on `path`; how many. A busy one is detached (it goes when its last user does)."""
    count = 0
    while (entry := mount_at(path, mountinfo)) is not None and entry.fs_type == "tmpfs":
        libc = _libc()
        if libc.umount2(os.fsencode(path), 0) != 0:
            err = ctypes.get_errno()
            if err in (errno.EINVAL, errno.ENOENT):  # gone meanwhile
                return count
            if err != errno.EBUSY or libc.umount2(os.fsencode(path), MNT_DETACH) != 0:
                err = err if err != errno.EBUSY else ctypes.get_errno()
                raise TmpfsError(err, f"unmount {path}: {os.strerror(err)}")
            log.warning("tmpfs on %s is busy: detached, it goes when its last user does", path)
        count += 1
    return count


class ShmMounter:
    """Mounts and unmounts the shm tmpfs of MPS claims. With `required` (real GPUs) a mount that fails is an error;
    without (the simulator in an unprivileged pod), the directory stays a plain one, with one warning."""

    def __init__(
        self, *, required: bool, size: int | None = None, mountinfo: Path = Path("/proc/self/mountinfo")
    ) -> None:
        self.required = required
        self.size = size
        self.mountinfo = mountinfo
        self._warned = False

    def mount(self, path: Path) -> bool:
        """True: a tmpfs is on `path` (mounted now or before); False: fell back to the plain directory."""
        try:
            mount_tmpfs(path, self.size or default_size(), self.mountinfo)
            return True
        except TmpfsError as e:
            if self.required or e.errno != errno.EPERM:
                raise
            if not self._warned:
                log.warning("%s: no privilege to mount; MPS shm directories stay plain directories", e)
                self._warned = True
            return False

    def unmount(self, path: Path) -> None:
        if path.is_dir():
            unmount(path, self.mountinfo)
