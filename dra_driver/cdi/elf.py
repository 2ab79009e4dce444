"""What the dynamic loader needs to know about a shared object: its class, machine and DT_SONAME.

Read through the program headers (PT_DYNAMIC, and PT_LOAD to map DT_STRTAB's address to a file offset), as
ld.so and ldconfig do, so a library stripped of section headers still reads. Only the headers and the dynamic
string are read, never the whole file: driver libraries are tens of megabytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

EM_386 = 3
EM_ARM = 40
EM_PPC64 = 21
EM_X86_64 = 62
EM_AARCH64 = 183

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_STRTAB, _DT_SONAME = 0, 5, 14
_MAX_DYNAMIC = 1 << 20  # a .dynamic larger than this is corrupt, not a library
_MAX_SONAME = 4096


class ElfError(ValueError):
    """The file is not an ELF object, or one too damaged to read."""


@dataclass(frozen=True)
class ElfInfo:
    bits: int  # 32 or 64 (EI_CLASS)
    little_endian: bool
    machine: int  # e_machine
    soname: str | None  # DT_SONAME; None when the object has none


@dataclass(frozen=True)
class _Layout:
    ehdr: struct.Struct  # from e_type on
    phdr: struct.Struct
    dyn: struct.Struct


def _layout(bits: int, order: str) -> _Layout:
    if bits == 64:
        return _Layout(
            struct.Struct(order + "HHIQQQIHHHHHH"), struct.Struct(order + "IIQQQQQQ"), struct.Struct(order + "qQ")
        )
    return _Layout(
        struct.Struct(order + "HHIIIIIHHHHHH"), struct.Struct(order + "IIIIIIII"), struct.Struct(order + "iI")
    )


def _read(f: BinaryIO, offset: int, size: int, what: str) -> bytes:
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise ElfError(f"truncated ELF file: {what} at offset {offset} runs past the end")
    return data


def read_elf(path: Path | str) -> ElfInfo:
    """Raises ElfError for a file that is not ELF (a linker script, a text stub) and OSError if unreadable."""
    with open(path, "rb") as f:
        ident = f.read(16)
        if len(ident) < 16 or ident[:4] != b"\x7fELF":
            raise ElfError(f"{path}: not an ELF file")
        if ident[4] not in (1, 2) or ident[5] not in (1, 2):
            raise ElfError(f"{path}: unknown ELF class {ident[4]} or data encoding {ident[5]}")
        bits = 64 if ident[4] == 2 else 32
        little = ident[5] == 1
        lay = _layout(bits, "<" if little else ">")
        try:
            return _parse(f, bits, little, lay)
        except ElfError as e:
            raise ElfError(f"{path}: {e}") from None


def _parse(f: BinaryIO, bits: int, little: bool, lay: _Layout) -> ElfInfo:
    fields = lay.ehdr.unpack(_read(f, 16, lay.ehdr.size, "ELF header"))
    machine, phoff, phentsize, phnum = fields[1], fields[4], fields[8], fields[9]
    if phnum and phentsize < lay.phdr.size:
        raise ElfError(f"program header entries of {phentsize} bytes are too small")
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: tuple[int, int] | None = None  # (offset, filesz)
    table = _read(f, phoff, phnum * phentsize, "program headers") if phnum else b""
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _align = _phdr(lay, table, i * phentsize, bits)
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    soname = None if dynamic is None else _soname(f, lay, dynamic, loads)
    return ElfInfo(bits=bits, little_endian=little, machine=machine, soname=soname)


def _phdr(lay: _Layout, table: bytes, at: int, bits: int) -> tuple[int, int, int, int, int, int, int, int]:
    v = lay.phdr.unpack_from(table, at)
    if bits == 64:  # p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align
        return v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
    # ELF32 order: p_type, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_flags, p_align
    return v[0], v[6], v[1], v[2], v[3], v[4], v[5], v[7]


def _soname(f: BinaryIO, lay: _Layout, dynamic: tuple[int, int], loads: list[tuple[int, int, int]]) -> str | None:
    offset, size = dynamic
    if size > _MAX_DYNAMIC:
        raise ElfError(f"dynamic segment of {size} bytes")
    data = _read(f, offset, size, "dynamic segment")
    strtab: int | None = None
    soname_at: int | None = None
    for at in range(0, size - lay.dyn.size + 1, lay.dyn.size):
        tag, value = lay.dyn.unpack_from(data, at)
        if tag == _DT_NULL:
            break
        if tag == _DT_STRTAB:
            strtab = value
        elif tag == _DT_SONAME:
            soname_at = value
    if soname_at is None:
        return None
    if strtab is None:
        raise ElfError("DT_SONAME without DT_STRTAB")
    file_offset = _file_offset(strtab, loads)
    f.seek(file_offset + soname_at)
    raw = f.read(_MAX_SONAME)
    end = raw.find(b"\0")
    if end < 0:
        raise ElfError("DT_SONAME string is not terminated")
    return raw[:end].decode("utf-8", errors="surrogateescape")


def _file_offset(vaddr: int, loads: list[tuple[int, int, int]]) -> int:
    for seg_vaddr, seg_offset, seg_filesz in loads:
        if seg_vaddr <= vaddr < seg_vaddr + seg_filesz:
            return seg_offset + (vaddr - seg_vaddr)
    raise ElfError(f"DT_STRTAB address {vaddr:#x} is in no PT_LOAD segment")
