"""Reading DT_SONAME, class and machine from ELF objects (dra_driver.cdi.elf), checked against binutils' readelf."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from dra_driver.cdi.elf import EM_386, EM_AARCH64, EM_PPC64, EM_X86_64, ElfError, ElfInfo, read_elf
from dra_driver.simulator.elf import host_machine, shared_object

_MACHINES = {"Advanced Micro Devices X86-64": EM_X86_64, "AArch64": EM_AARCH64, "Intel 80386": EM_386}
needs_readelf = pytest.mark.skipif(shutil.which("readelf") is None, reason="binutils' readelf is not installed")


def _readelf(*args: str) -> str:
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, timeout=30).stdout


def _host_libraries(limit: int = 60) -> list[Path]:
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
    paths = sorted({Path(line.split(" => ")[1]).resolve() for line in out.splitlines() if " => " in line})
    return [p for p in paths if p.is_file()][:limit]


@needs_readelf
def test_soname_class_and_machine_agree_with_readelf_on_host_libraries() -> None:
    libraries = _host_libraries()
    assert len(libraries) >= 10, "expected a populated ld.so.cache on the test host"
    for lib in libraries:
        info = read_elf(lib)
        dynamic, header = _readelf("-d", str(lib)), _readelf("-h", str(lib))
        soname = re.search(r"Library soname: \[(.*)\]", dynamic)
        assert info.soname == (soname.group(1) if soname else None), lib
        assert f"ELF{info.bits}" in header, lib
        machine = re.search(r"Machine:\s+(.*)", header)
        assert machine is not None
        assert _MACHINES.get(machine.group(1).strip(), info.machine) == info.machine, lib


def _read_bytes(tmp_path: Path, data: bytes) -> ElfInfo:
    path = tmp_path / "lib.so"
    path.write_bytes(data)
    return read_elf(path)


def test_a_simulated_library_reads_back(tmp_path: Path) -> None:
    info = _read_bytes(tmp_path, shared_object("libcuda.so.1"))
    assert (info.soname, info.bits, info.little_endian, info.machine) == ("libcuda.so.1", 64, True, host_machine())


def test_soname_is_read_through_program_headers_without_section_headers(tmp_path: Path) -> None:
    data = bytearray(shared_object("libnvidia-ml.so.1"))
    (loaded,) = struct.unpack_from("<Q", data, 0x40 + 0x20)  # p_filesz of PT_LOAD: .shstrtab and headers follow
    struct.pack_into("<Q", data, 0x28, 0)  # e_shoff
    struct.pack_into("<HH", data, 0x3C, 0, 0)  # e_shnum, e_shstrndx
    (tmp_path / "stripped.so").write_bytes(bytes(data[:loaded]))
    assert "There are no sections" in _readelf("-S", str(tmp_path / "stripped.so"))
    assert read_elf(tmp_path / "stripped.so").soname == "libnvidia-ml.so.1"


def _elf32_big_endian(soname: bytes, machine: int) -> bytes:
    """A hand-made 32-bit big-endian object: header, PT_LOAD at vaddr 0x1000, PT_DYNAMIC, strings."""
    ehdr = struct.Struct(">16sHHIIIIIHHHHHH")
    phdr = struct.Struct(">IIIIIIII")  # p_type, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_flags, p_align
    phoff = ehdr.size
    strtab_off = phoff + 2 * phdr.size
    strtab = b"\0" + soname + b"\0"
    dyn_off = strtab_off + len(strtab) + (-(strtab_off + len(strtab)) % 4)
    base = 0x1000
    # DT_SONAME, DT_STRTAB, DT_STRSZ, DT_NULL
    dynamic = struct.pack(">iIiIiIiI", 14, 1, 5, base + strtab_off, 10, len(strtab), 0, 0)
    size = dyn_off + len(dynamic)
    ident = b"\x7fELF" + bytes([1, 2, 1]) + bytes(9)
    out = bytearray(size)
    out[0 : ehdr.size] = ehdr.pack(ident, 3, machine, 1, 0, phoff, 0, 0, ehdr.size, phdr.size, 2, 40, 0, 0)
    out[phoff : phoff + phdr.size] = phdr.pack(1, 0, base, base, size, size, 5, 0x1000)
    out[phoff + phdr.size : strtab_off] = phdr.pack(2, dyn_off, base + dyn_off, 0, len(dynamic), len(dynamic), 6, 4)
    out[strtab_off : strtab_off + len(strtab)] = strtab
    out[dyn_off:size] = dynamic
    return bytes(out)


@needs_readelf
def test_32_bit_big_endian_objects(tmp_path: Path) -> None:
    path = tmp_path / "libbe.so.1.0"
    path.write_bytes(_elf32_big_endian(b"libbe.so.1", EM_PPC64))
    info = read_elf(path)
    assert (info.bits, info.little_endian, info.machine, info.soname) == (32, False, EM_PPC64, "libbe.so.1")
    assert "Library soname: [libbe.so.1]" in _readelf("-d", str(path))  # our hand-made file is valid to binutils


def test_object_without_soname(tmp_path: Path) -> None:
    data = bytearray(shared_object("libx.so.1"))
    at = data.find(struct.pack("<qQ", 14, 1))  # the DT_SONAME entry becomes DT_DEBUG (21)
    struct.pack_into("<q", data, at, 21)
    (tmp_path / "libx.so.1").write_bytes(bytes(data))
    assert read_elf(tmp_path / "libx.so.1").soname is None


def test_non_elf_and_damaged_files_raise_a_clear_error(tmp_path: Path) -> None:
    script = tmp_path / "libc.so"
    script.write_text("/* GNU ld script */\nGROUP ( /lib/x86_64-linux-gnu/libc.so.6 )\n")
    with pytest.raises(ElfError, match="not an ELF file"):
        read_elf(script)
    (tmp_path / "empty.so").write_bytes(b"")
    with pytest.raises(ElfError, match="not an ELF file"):
        read_elf(tmp_path / "empty.so")
    truncated = tmp_path / "truncated.so.1"
    truncated.write_bytes(shared_object("libt.so.1")[:200])  # ends inside the program headers' targets
    with pytest.raises(ElfError, match=r"truncated\.so\.1: truncated"):
        read_elf(truncated)
    with pytest.raises(FileNotFoundError):
        read_elf(tmp_path / "absent.so")


def test_the_writer_refuses_what_it_cannot_build(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="invalid soname"):
        shared_object("dir/libx.so.1")
    with pytest.raises(ValueError, match="unsupported e_machine"):
        shared_object("libx.so.1", machine=EM_PPC64)
    assert _read_bytes(tmp_path, shared_object("liba.so.1", machine=EM_AARCH64)).machine == EM_AARCH64
