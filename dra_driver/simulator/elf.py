"""A minimal ELF64 shared object that glibc really loads (dlopen, ldconfig, readelf), written without a compiler.

It has no code and no symbols: it only has to be found, mapped and identified by its DT_SONAME, like a driver
library seen by the dynamic loader. Layout (one RW PT_LOAD maps the whole file at vaddr 0, so every vaddr equals
its file offset):

    ELF header | program headers | .hash | .dynsym | .dynstr | .dynamic | .shstrtab | section headers

The load segment is writable because glibc before 2.35 relocates the .dynamic entries in place. PT_GNU_STACK
is RW: without it glibc assumes an executable stack, which newer glibc refuses to dlopen.
"""

from __future__ import annotations

import platform
import struct

EM_X86_64 = 62
EM_AARCH64 = 183
_MACHINES = {"x86_64": EM_X86_64, "amd64": EM_X86_64, "aarch64": EM_AARCH64, "arm64": EM_AARCH64}
# The largest page size of the architecture: p_align must be a multiple of the running kernel's page size.
_PAGE_ALIGN = {EM_X86_64: 0x1000, EM_AARCH64: 0x10000}

_ET_DYN = 3
_PT_LOAD, _PT_DYNAMIC, _PT_GNU_STACK = 1, 2, 0x6474E551
_PF_W, _PF_R = 2, 4
_SHT_STRTAB, _SHT_DYNAMIC, _SHT_HASH, _SHT_DYNSYM = 3, 6, 5, 11
_SHF_WRITE, _SHF_ALLOC = 1, 2
_DT_NULL, _DT_HASH, _DT_STRTAB, _DT_SYMTAB, _DT_STRSZ, _DT_SYMENT, _DT_SONAME = 0, 4, 5, 6, 10, 11, 14

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM_SIZE = 24
_DYN = struct.Struct("<qQ")


def host_machine() -> int:
    """e_machine of the running host; the simulator only writes libraries this machine can load."""
    arch = platform.machine().lower()
    if arch not in _MACHINES:
        raise RuntimeError(f"no simulated ELF libraries for machine {arch!r} (x86_64 and aarch64 only)")
    return _MACHINES[arch]


def _align(n: int, to: int) -> int:
    return (n + to - 1) & ~(to - 1)


def shared_object(soname: str, machine: int | None = None) -> bytes:
    """The bytes of a loadable little-endian ELF64 shared object whose DT_SONAME is `soname`."""
    machine = host_machine() if machine is None else machine
    if machine not in _PAGE_ALIGN:
        raise ValueError(f"unsupported e_machine {machine}")
    if not soname or "\0" in soname or "/" in soname:
        raise ValueError(f"invalid soname {soname!r}")
    n_ph = 3
    hash_off = _align(_EHDR.size + n_ph * _PHDR.size, 8)
    hash_data = struct.pack("<IIII", 1, 1, 0, 0)  # nbucket=1, nchain=1 (the null symbol only), bucket, chain
    dynsym_off = hash_off + len(hash_data)
    dynsym = bytes(_SYM_SIZE)  # the mandatory null symbol
    dynstr_off = dynsym_off + len(dynsym)
    dynstr = b"\0" + soname.encode() + b"\0"
    dynamic_off = _align(dynstr_off + len(dynstr), 8)
    dyn_entries = [
        (_DT_SONAME, 1),
        (_DT_HASH, hash_off),
        (_DT_STRTAB, dynstr_off),
        (_DT_SYMTAB, dynsym_off),
        (_DT_STRSZ, len(dynstr)),
        (_DT_SYMENT, _SYM_SIZE),
        (_DT_NULL, 0),
    ]
    dynamic = b"".join(_DYN.pack(tag, val) for tag, val in dyn_entries)
    shstr_off = dynamic_off + len(dynamic)
    names = ["", ".hash", ".dynsym", ".dynstr", ".dynamic", ".shstrtab"]
    name_at: dict[str, int] = {}
    shstrtab = b""
    for name in names:
        name_at[name] = len(shstrtab)
        shstrtab += name.encode() + b"\0"
    sh_off = _align(shstr_off + len(shstrtab), 8)
    loaded = shstr_off  # everything up to .dynamic is mapped; .shstrtab and section headers are not needed
    alloc = _SHF_ALLOC
    sections = [
        (0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        (name_at[".hash"], _SHT_HASH, alloc, hash_off, hash_off, len(hash_data), 2, 0, 8, 4),
        (name_at[".dynsym"], _SHT_DYNSYM, alloc, dynsym_off, dynsym_off, len(dynsym), 3, 1, 8, _SYM_SIZE),
        (name_at[".dynstr"], _SHT_STRTAB, alloc, dynstr_off, dynstr_off, len(dynstr), 0, 0, 1, 0),
        (
            name_at[".dynamic"],
            _SHT_DYNAMIC,
            alloc | _SHF_WRITE,
            dynamic_off,
            dynamic_off,
            len(dynamic),
            3,
            0,
            8,
            _DYN.size,
        ),
        (name_at[".shstrtab"], _SHT_STRTAB, 0, 0, shstr_off, len(shstrtab), 0, 0, 1, 0),
    ]
    align = _PAGE_ALIGN[machine]
    phdrs = [
        _PHDR.pack(_PT_LOAD, _PF_R | _PF_W, 0, 0, 0, loaded, loaded, align),
        _PHDR.pack(_PT_DYNAMIC, _PF_R | _PF_W, dynamic_off, dynamic_off, dynamic_off, len(dynamic), len(dynamic), 8),
        _PHDR.pack(_PT_GNU_STACK, _PF_R | _PF_W, 0, 0, 0, 0, 0, 16),
    ]
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # ELFCLASS64, little-endian, EV_CURRENT, System V ABI
    ehdr = _EHDR.pack(
        ident, _ET_DYN, machine, 1, 0, _EHDR.size, sh_off, 0, _EHDR.size, _PHDR.size, n_ph, _SHDR.size, len(names), 5
    )
    out = bytearray(sh_off + len(sections) * _SHDR.size)
    for offset, blob in [
        (0, ehdr),
        (_EHDR.size, b"".join(phdrs)),
        (hash_off, hash_data),
        (dynsym_off, dynsym),
        (dynstr_off, dynstr),
        (dynamic_off, dynamic),
        (shstr_off, shstrtab),
        (sh_off, b"".join(_SHDR.pack(*s) for s in sections)),
    ]:
        out[offset : offset + len(blob)] = blob
    return bytes(out)
