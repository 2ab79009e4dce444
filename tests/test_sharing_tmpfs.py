"""dra_driver.sharing.tmpfs: real tmpfs mounts on MPS shm directories (root with CAP_SYS_ADMIN, as this test host
and the privileged plugin), crash-safe mount and unmount read from /proc/self/mountinfo, and the unprivileged
fallback (run under capsh without CAP_SYS_ADMIN)."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.sharing import tmpfs
from dra_driver.sharing.tmpfs import ShmMounter, TmpfsError, default_size, mount_at, mounts, parse_size


def _can_mount(tmp: Path) -> bool:
    target = tmp / "probe"
    target.mkdir()
    try:
        tmpfs.mount_tmpfs(target, 1 << 20)
    except TmpfsError:
        return False
    tmpfs.unmount(target)
    return True


@pytest.fixture
def shm(tmp_path: Path) -> Iterator[Path]:
    if not _can_mount(tmp_path):
        pytest.skip("mounting a tmpfs needs CAP_SYS_ADMIN")
    path = tmp_path / "mps" / "claim" / "shm"
    path.mkdir(parents=True)
    yield path
    while (m := mount_at(path)) is not None and m.fs_type == "tmpfs":  # whatever a failed test left
        subprocess.run(["umount", "-l", str(path)], timeout=30, check=False)


def test_mountinfo_is_parsed_with_its_escapes(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "45 27 0:40 / /var/lib/with\\040space/shm rw,nosuid shared:7 - tmpfs shm rw,size=1024k,mode=1777\n"
        "46 45 0:41 / /var/lib/with\\040space/shm rw master:3 - tmpfs shm rw,size=2048k\n"
    )
    got = mounts(info)
    assert [m.mount_point for m in got] == ["/", "/var/lib/with space/shm", "/var/lib/with space/shm"]
    assert (got[1].fs_type, got[1].source, got[1].options) == ("tmpfs", "shm", "rw,size=1024k,mode=1777")
    assert mount_at(Path("/var/lib/with space/shm"), info) == got[2]  # the topmost of two stacked mounts
    assert mount_at(Path("/var/lib"), info) is None


def test_size_is_half_of_memtotal_or_given(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384000 kB\nMemFree:         1000 kB\n")
    assert default_size(meminfo) == 16384000 * 1024 // 2
    meminfo.write_text("garbage\n")
    assert default_size(meminfo) == tmpfs.FALLBACK_SIZE
    assert default_size(tmp_path / "missing") == tmpfs.FALLBACK_SIZE
    assert [parse_size(s) for s in ("4096", "64k", "512m", "8g", "8Gi", "1Ti", "2M")] == [
        4096, 64 << 10, 512 << 20, 8 << 30, 8 << 30, 1 << 40, 2 << 20,
    ]  # fmt: skip
    for bad in ("", "0", "1.5g", "8GB", "-1", "10%"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_mount_is_a_real_tmpfs_once_and_unmount_takes_it_away(shm: Path) -> None:
    assert tmpfs.mount_tmpfs(shm, 8 << 20) is True
    entry = mount_at(shm)
    assert entry is not None and entry.fs_type == "tmpfs"
    assert "size=8192k" in entry.options and shm.stat().st_mode & 0o7777 == 0o1777  # any user's segments, sticky
    line = next(x for x in Path("/proc/self/mountinfo").read_text().splitlines() if f" {shm} " in x)
    assert {"nosuid", "nodev", "noexec"} <= set(line.split()[5].split(","))
    (shm / "segment").write_bytes(b"x" * 4096)
    assert os.statvfs(shm).f_blocks * os.statvfs(shm).f_frsize == 8 << 20  # the tmpfs's size, not the disk's
    assert tmpfs.mount_tmpfs(shm, 8 << 20) is False  # a retried prepare: no second, stacked tmpfs
    assert [m.mount_point for m in mounts()].count(str(shm)) == 1
    assert tmpfs.unmount(shm) == 1
    assert mount_at(shm) is None and shm.is_dir() and not (shm / "segment").exists()
    assert tmpfs.unmount(shm) == 0  # unmounted already (a crash after the unmount, before it was recorded)


def test_unmount_removes_stacked_mounts_and_detaches_a_busy_one(shm: Path) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "shm", str(shm)], check=True, timeout=30)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "shm", str(shm)], check=True, timeout=30)
    assert tmpfs.unmount(shm) == 2 and mount_at(shm) is None
    tmpfs.mount_tmpfs(shm, 1 << 20)
    user = subprocess.Popen(["sleep", "60"], cwd=shm)  # a process still inside: EBUSY
    try:
        assert tmpfs.unmount(shm) == 1
        assert mount_at(shm) is None  # detached; it goes when the process does
    finally:
        user.kill()
        user.wait(timeout=30)


def test_mounter_falls_back_to_a_plain_directory_without_privilege_only_when_allowed(tmp_path: Path) -> None:
    capsh = shutil.which("capsh")
    if capsh is None or os.geteuid() != 0:
        pytest.skip("needs root and capsh to drop CAP_SYS_ADMIN")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    script = textwrap.dedent(
        """
        import logging, sys
        from pathlib import Path
        from dra_driver.sharing.tmpfs import ShmMounter, TmpfsError
        logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s")
        lenient = ShmMounter(required=False, size=1 << 20)
        print("lenient", lenient.mount(Path(sys.argv[1])), lenient.mount(Path(sys.argv[2])))
        try:
            ShmMounter(required=True, size=1 << 20).mount(Path(sys.argv[1]))
        except TmpfsError as e:
            print("strict", e.errno)
        """
    )
    proc = subprocess.run(
        [
            capsh,
            "--drop=cap_sys_admin",
            "--",
            "-c",
            'exec "$@"',
            "sh",
            sys.executable,
            "-c",
            script,
            str(tmp_path / "a"),
            str(tmp_path / "b"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "lenient False False" in lines and f"strict {errno.EPERM}" in lines
    assert sum("no privilege to mount" in line for line in lines) == 1  # one warning, not one per claim


def test_mounter_mounts_and_unmounts(shm: Path, caplog: pytest.LogCaptureFixture) -> None:
    mounter = ShmMounter(required=True, size=2 << 20)
    with caplog.at_level(logging.WARNING):
        assert mounter.mount(shm) is True and mounter.mount(shm) is True
    entry = mount_at(shm)
    assert entry is not None and "size=2048k" in entry.options and not caplog.records
    mounter.unmount(shm)
    assert mount_at(shm) is None
    mounter.unmount(shm)
    mounter.unmount(shm.parent / "gone")  # a claim directory removed already
