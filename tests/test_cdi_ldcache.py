"""ld.so.cache reading and writing (dra_driver.cdi.ldcache), checked differentially against glibc's own ldconfig:
caches ldconfig builds over a tree read back as `ldconfig -p` prints them, and caches we write print the same."""

from __future__ import annotations

import os
import random
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from dra_driver.cdi.ldcache import (
    CacheEntry,
    LdCacheError,
    describe_flags,
    libcmp,
    parse,
    read_cache,
    serialize,
)
from dra_driver.simulator.driverroot import multiarch
from dra_driver.simulator.elf import shared_object

LDCONFIG = shutil.which("ldconfig") or next(
    (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.access(p, os.X_OK)), None
)
needs_ldconfig = pytest.mark.skipif(LDCONFIG is None, reason="glibc's ldconfig is not installed")
_LINE = re.compile(r"^\t(\S+) \(([^)]*)\) => (.*)$")


def ldconfig_listing(cache: Path) -> list[tuple[str, str, str]]:
    """(soname, flags text, path) as `ldconfig -p -C cache` prints them, in file order."""
    assert LDCONFIG is not None
    out = subprocess.run([LDCONFIG, "-p", "-C", str(cache)], capture_output=True, text=True, timeout=30, check=True)
    return [(m[1], m[2], m[3]) for m in map(_LINE.match, out.stdout.splitlines()) if m]


def listing(entries: list[CacheEntry]) -> list[tuple[str, str, str]]:
    return [(e.soname, describe_flags(e.flags), e.path) for e in entries]


def ldconfig_build(root: Path, cache: str = "/etc/ld.so.cache", *extra: str) -> Path:
    """Run the real ldconfig over `root` (its etc/ld.so.conf), links untouched; the cache path is inside root."""
    assert LDCONFIG is not None
    subprocess.run(
        [LDCONFIG, "-X", "-r", str(root), "-C", cache, "-f", "/etc/ld.so.conf", *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return root / cache.lstrip("/")


def tricky_tree(root: Path) -> None:
    """Libraries exercising ldconfig's rules: numeric order, links vs files, dev links, odd links, no soname,
    non-ELF and dangling entries, and one soname in two directories."""
    lib = root / "usr" / "lib" / multiarch()
    opt = root / "opt" / "vendor" / "lib"
    for d in (lib, opt):
        d.mkdir(parents=True)
    for name, soname in [
        ("libfoo.so.9", "libfoo.so.9"),
        ("libfoo.so.10", "libfoo.so.10"),
        ("libbar.so.1.2.3", "libbar.so.1"),
        ("libbar.so.1.3.0", "libbar.so.1"),
        ("libcuda.so.550.54.15", "libcuda.so.1"),
        ("libnvidia-gpucomp.so.550.54.15", "libnvidia-gpucomp.so.550.54.15"),
    ]:
        (lib / name).write_bytes(shared_object(soname))
    (opt / "libfoo.so.9").write_bytes(shared_object("libfoo.so.9"))
    (opt / "libvendor.so.3").write_bytes(shared_object("libvendor.so.3"))
    for link, target in [
        ("libbar.so.1", "libbar.so.1.3.0"),
        ("libbar.so", "libbar.so.1"),
        ("libodd.so.2", "libbar.so.1.2.3"),  # neither the soname nor a dev link: counts as a library file
        ("libcuda.so.1", "libcuda.so.550.54.15"),
        ("libcuda.so", "libcuda.so.1"),
        ("libgone.so.1", "libgone.so.1.0"),  # dangling
    ]:
        os.symlink(target, lib / link)
    data = bytearray(shared_object("libnosoname.so.5"))
    struct.pack_into("<q", data, data.find(struct.pack("<qQ", 14, 1)), 21)  # DT_SONAME -> DT_DEBUG
    (lib / "libnosoname.so.5").write_bytes(bytes(data))
    (lib / "libtext.so.1").write_text("not a library\n")
    (root / "etc").mkdir()
    (root / "etc" / "ld.so.conf").write_text(f"/usr/lib/{multiarch()}\n/opt/vendor/lib\n")


@needs_ldconfig
def test_reads_the_host_cache_as_ldconfig_prints_it() -> None:
    host = Path("/etc/ld.so.cache")
    if not host.is_file():
        pytest.skip("the host has no /etc/ld.so.cache")
    entries = read_cache(host)
    assert entries, "empty host cache"
    assert listing(entries) == ldconfig_listing(host)


@needs_ldconfig
@pytest.mark.parametrize("fmt", ["new", "compat"])
def test_reads_caches_ldconfig_builds_over_a_tree(tmp_path: Path, fmt: str) -> None:
    tricky_tree(tmp_path)
    cache = ldconfig_build(tmp_path, "/etc/ld.so.cache", "-c", fmt)  # compat: the pre-2.2 table in front
    if fmt == "compat":
        assert cache.read_bytes().startswith(b"ld.so-1.7.0")
    entries = read_cache(cache)
    assert listing(entries) == ldconfig_listing(cache)
    names = [e.soname for e in entries]
    assert names.index("libfoo.so.10") < names.index("libfoo.so.9")  # descending, numbers as numbers
    assert names.count("libfoo.so.9") == 2 and "libtext.so.1" not in names and "libgone.so.1" not in names
    assert {"libcuda.so", "libcuda.so.1", "libbar.so", "libbar.so.1", "libnosoname.so.5"} <= set(names)
    assert "libodd.so.2" not in names  # cached under its target's soname
    assert all(e.bits == 64 for e in entries)


@needs_ldconfig
def test_old_format_only_caches_are_refused_clearly(tmp_path: Path) -> None:
    tricky_tree(tmp_path)
    cache = ldconfig_build(tmp_path, "/etc/old.cache", "-c", "old")
    with pytest.raises(LdCacheError, match=r"old-format ld\.so\.cache"):
        read_cache(cache)


@needs_ldconfig
def test_written_caches_print_the_same_in_ldconfig(tmp_path: Path) -> None:
    tricky_tree(tmp_path)
    real = ldconfig_build(tmp_path)
    entries = read_cache(real)
    shuffled = entries[:]
    random.Random(7).shuffle(shuffled)
    ours = tmp_path / "ours.cache"
    ours.write_bytes(serialize(shuffled))  # the writer must restore ldconfig's order: ld.so binary-searches it
    assert ldconfig_listing(ours) == ldconfig_listing(real)
    assert read_cache(ours) == entries
    out = subprocess.run([LDCONFIG or "", "-p", "-C", str(ours)], capture_output=True, text=True, timeout=30).stdout
    assert out.rstrip().endswith("Cache generated by: dra-driver simulator")


def test_libcmp_orders_numbers_as_numbers() -> None:
    assert libcmp("libfoo.so.10", "libfoo.so.9") > 0
    assert libcmp("libfoo.so.9", "libfoo.so.10") < 0
    assert libcmp("libfoo.so.1", "libfoo.so.1") == 0
    assert libcmp("libfoo.so", "libfoo.so.1") < 0
    assert libcmp("libfoo.so.1", "libfoo.so") > 0
    assert libcmp("liba.so", "libb.so") < 0
    assert libcmp("lib2.so", "liba.so") > 0  # a digit sorts after any non-digit


def test_damaged_caches_raise_ldcache_errors(tmp_path: Path) -> None:
    good = serialize([CacheEntry("libcuda.so.1", 0x0303, "/usr/lib/libcuda.so.1")])
    assert parse(good) == [CacheEntry("libcuda.so.1", 0x0303, "/usr/lib/libcuda.so.1")]
    with pytest.raises(LdCacheError, match=r"not an ld\.so\.cache"):
        parse(b"hello world" * 10)
    with pytest.raises(LdCacheError, match="truncated"):
        parse(good[:30])
    with pytest.raises(LdCacheError, match="claims"):
        parse(good[:20] + struct.pack("<I", 1000) + good[24:])
    broken = bytearray(good)
    struct.pack_into("<I", broken, 48 + 4, 1 << 20)  # the key's string offset points past the end
    with pytest.raises(LdCacheError, match="outside"):
        parse(bytes(broken))
    (tmp_path / "bad").write_bytes(b"\0" * 100)
    with pytest.raises(LdCacheError, match=re.escape(str(tmp_path / "bad"))):
        read_cache(tmp_path / "bad")


def test_flags_descriptions_and_bits() -> None:
    assert describe_flags(0x0303) == "libc6,x86-64"
    assert describe_flags(0x0A03) == "libc6,AArch64"
    assert describe_flags(0x0003) == "libc6"
    assert CacheEntry("a", 0x0303, "/a").bits == 64
    assert CacheEntry("a", 0x0003, "/a").bits == 32
    assert CacheEntry("a", 0x0000, "/a").bits is None  # libc4 (a.out), not ELF
