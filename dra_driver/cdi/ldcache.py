"""glibc's /etc/ld.so.cache: read it (to find a driver root's libraries the way its dynamic loader would) and
write it (the simulator's driver root), in the "glibc-ld.so.cache1.1" format of glibc >= 2.2, possibly hidden
behind the pre-2.2 "ld.so-1.7.0" table as older ldconfigs wrote it (glibc elf/cache.c, sysdeps/generic/dl-cache.h).

Layout: header (48 bytes) | entries (24 bytes each) | strings | extension directory. String offsets count
from the start of the new header.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cmp_to_key
from pathlib import Path

from dra_driver.cdi.elf import EM_386, EM_AARCH64, EM_PPC64, EM_X86_64, ElfInfo

_OLD_MAGIC = b"ld.so-1.7.0\0"
_NEW_MAGIC = b"glibc-ld.so.cache1.1"
_OLD_HEADER = 16  # magic[12], nlibs
_OLD_ENTRY = 12  # flags, key, value
_EXTENSION_MAGIC = 0xEAA42174
_TAG_GENERATOR = 0
_ENDIAN_LITTLE, _ENDIAN_BIG = 2, 3

FLAG_TYPE_MASK = 0x00FF
FLAG_ELF = 0x0001
FLAG_ELF_LIBC6 = 0x0003
FLAG_ARCH_MASK = 0xFF00
FLAG_X8664_LIB64 = 0x0300
FLAG_POWERPC_LIB64 = 0x0500
FLAG_X8664_LIBX32 = 0x0800
FLAG_AARCH64_LIB64 = 0x0A00
# What `ldconfig -p` prints for the flags (glibc elf/cache.c print_entry), for the ones a GPU node can have.
_TYPE_NAMES = {0x0000: "libc4", 0x0001: "ELF", 0x0002: "libc5", 0x0003: "libc6"}
_ARCH_NAMES = {
    0x0000: "",
    FLAG_X8664_LIB64: ",x86-64",
    FLAG_POWERPC_LIB64: ",64bit",
    FLAG_X8664_LIBX32: ",x32",
    0x0900: ",hard-float",
    FLAG_AARCH64_LIB64: ",AArch64",
}
_BITS_64 = {FLAG_X8664_LIB64, FLAG_AARCH64_LIB64, FLAG_POWERPC_LIB64}
_BITS_32 = {0x0000, FLAG_X8664_LIBX32, 0x0900}
_DIGITS = frozenset("0123456789")


class LdCacheError(ValueError):
    """Not an ld.so.cache, or a damaged one."""


@dataclass(frozen=True)
class CacheEntry:
    soname: str  # the key the loader looks up: libcuda.so.1
    flags: int
    path: str  # where it is, as seen inside the root the cache belongs to
    hwcap: int = 0

    @property
    def bits(self) -> int | None:
        """32 or 64 for ELF entries of a known ABI, None otherwise (the toolkit skips those too)."""
        if not self.flags & FLAG_TYPE_MASK & FLAG_ELF:
            return None
        arch = self.flags & FLAG_ARCH_MASK
        return 64 if arch in _BITS_64 else 32 if arch in _BITS_32 else None


def describe_flags(flags: int) -> str:
    """The flags as `ldconfig -p` shows them, e.g. "libc6,x86-64"."""
    kind = _TYPE_NAMES.get(flags & FLAG_TYPE_MASK, "unknown")
    arch = flags & FLAG_ARCH_MASK
    return kind + _ARCH_NAMES.get(arch, f",{arch}")


def flags_for(elf: ElfInfo) -> int:
    """The flags ldconfig records for a library (glibc sysdeps/unix/sysv/linux/*/readelflib.c)."""
    if elf.machine in (EM_X86_64, EM_386) and elf.bits == 32:
        return FLAG_ELF_LIBC6 | (FLAG_X8664_LIBX32 if elf.machine == EM_X86_64 else 0)
    arch = {EM_X86_64: FLAG_X8664_LIB64, EM_AARCH64: FLAG_AARCH64_LIB64, EM_PPC64: FLAG_POWERPC_LIB64}.get(elf.machine)
    if arch is None or elf.bits != 64:
        raise ValueError(f"no ld.so.cache flags for e_machine {elf.machine} ({elf.bits}-bit)")
    return FLAG_ELF_LIBC6 | arch


def libcmp(a: str, b: str) -> int:
    """glibc's _dl_cache_libcmp: runs of digits compare as numbers, so libfoo.so.10 sorts after libfoo.so.9."""
    i = j = 0
    while i < len(a):
        if a[i] in _DIGITS:
            if j >= len(b) or b[j] not in _DIGITS:
                return 1
            i2, j2 = i, j
            while i2 < len(a) and a[i2] in _DIGITS:
                i2 += 1
            while j2 < len(b) and b[j2] in _DIGITS:
                j2 += 1
            va, vb = int(a[i:i2]), int(b[j:j2])
            if va != vb:
                return va - vb
            i, j = i2, j2
        elif j < len(b) and b[j] in _DIGITS:
            return -1
        elif j >= len(b) or a[i] != b[j]:
            return ord(a[i]) - (ord(b[j]) if j < len(b) else 0)
        else:
            i += 1
            j += 1
    return 0 - (ord(b[j]) if j < len(b) else 0)


def parse(data: bytes) -> list[CacheEntry]:
    """The entries in file order (the loader's binary-search order)."""
    start = 0
    if data.startswith(_OLD_MAGIC):
        if len(data) < _OLD_HEADER:
            raise LdCacheError("truncated ld.so.cache header")
        (nlibs,) = struct.unpack_from("<I", data, len(_OLD_MAGIC))
        start = (_OLD_HEADER + nlibs * _OLD_ENTRY + 7) & ~7  # the new table follows, 8-byte aligned
        if not data.startswith(_NEW_MAGIC, start):
            raise LdCacheError("old-format ld.so.cache (glibc < 2.2) without the new format: not supported")
    elif not data.startswith(_NEW_MAGIC):
        raise LdCacheError("not an ld.so.cache (no glibc-ld.so.cache1.1 magic)")
    if len(data) < start + 48:
        raise LdCacheError("truncated ld.so.cache header")
    order = ">" if data[start + 28] == _ENDIAN_BIG else "<"
    (nlibs,) = struct.unpack_from(order + "I", data, start + 20)
    entry = struct.Struct(order + "iIIIQ")
    table_end = start + 48 + nlibs * entry.size
    if table_end > len(data):
        raise LdCacheError(f"ld.so.cache claims {nlibs} entries but is only {len(data)} bytes")
    entries = []
    for i in range(nlibs):
        flags, key, value, _osversion, hwcap = entry.unpack_from(data, start + 48 + i * entry.size)
        entries.append(CacheEntry(_string(data, start + key), flags, _string(data, start + value), hwcap))
    return entries


def _string(data: bytes, at: int) -> str:
    end = data.find(b"\0", at)
    if at >= len(data) or end < 0:
        raise LdCacheError(f"string at offset {at} is outside the ld.so.cache")
    return data[at:end].decode("utf-8", errors="surrogateescape")


def read_cache(path: Path) -> list[CacheEntry]:
    """Raises OSError when the file cannot be read and LdCacheError when it is not a valid cache."""
    try:
        return parse(path.read_bytes())
    except LdCacheError as e:
        raise LdCacheError(f"{path}: {e}") from None


def _compare(e1: CacheEntry, e2: CacheEntry) -> int:
    """ldconfig's order (elf/cache.c compare): names descending by libcmp, then flags descending."""
    res = libcmp(e2.soname, e1.soname)
    if res == 0:
        return (e2.flags > e1.flags) - (e2.flags < e1.flags)
    return res


def serialize(entries: list[CacheEntry], generator: str = "dra-driver simulator") -> bytes:
    """A new-format cache with ldconfig's entry order (ld.so binary-searches it) and a generator extension.

    Entries that compare equal keep their given order, as ldconfig's insertion does; hwcap entries (glibc-hwcaps
    subdirectories) are not supported.
    """
    if any(e.hwcap for e in entries):
        raise ValueError("hwcap entries are not supported")
    ordered = sorted(entries, key=cmp_to_key(_compare))
    header_size = 48 + len(ordered) * 24
    strings = bytearray()
    offsets: dict[str, int] = {}

    def intern(s: str) -> int:
        if s not in offsets:
            offsets[s] = header_size + len(strings)
            strings.extend(s.encode("utf-8", errors="surrogateescape") + b"\0")
        return offsets[s]

    table = b"".join(struct.pack("<iIIIQ", e.flags, intern(e.soname), intern(e.path), 0, 0) for e in ordered)
    extension_offset = (header_size + len(strings) + 3) & ~3
    gen = generator.encode()
    ext = struct.pack("<II", _EXTENSION_MAGIC, 1) + struct.pack(
        "<IIII", _TAG_GENERATOR, 0, extension_offset + 24, len(gen)
    )
    header = _NEW_MAGIC + struct.pack("<IIB3xI12x", len(ordered), len(strings), _ENDIAN_LITTLE, extension_offset)
    body = header + table + bytes(strings)
    return body + bytes(extension_offset - len(body)) + ext + gen
