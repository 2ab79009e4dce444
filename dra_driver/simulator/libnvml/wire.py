"""The wire format between the simulated libnvidia-ml (native/libnvml/libnvml.c) and its server, native byte order
(little-endian on every host the simulator supports).

A frame is a u32 length and that many bytes. A request:

    u32 magic "NVM1" | u16 n, name | u16 n, format | one field per format token

where the format is the C function's parameters (native/libnvml/libnvml.h): `h` u64 handle address, `u`/`i` u32,
`U` u64, `s` u8 present [u32 n, bytes], `B<n>` u8 present [n bytes], `o<n>` u8 present, `v` u8 present u32 version
word, `S` u8 present u32 buffer length, `A<n>` u8 array present u8 count present u32 count. An answer:

    i32 return code | u16 number of outputs | per output: i32 n (-1: leave the caller's memory alone), n bytes

with one output per `o`, `v` and `S` token and two per `A` (the count, then the array), in order. The bytes are the
C layout of what NVML writes there (a ctypes struct's `bytes()`), never longer than the caller's buffer.
"""

from __future__ import annotations

import ctypes
import re
import struct
from dataclasses import dataclass, field
from typing import Any

import pynvml

from dra_driver.simulator.libnvml import MAGIC

_TOKEN = re.compile(r"([huiUsBovSA])(\d*)")


class WireError(Exception):
    """A request the server cannot decode, or an answer a handler made that does not fit the C side's buffer."""


@dataclass
class Out:
    """`o<n>`: an output of `size` bytes (an integer of that width, a handle, a struct)."""

    present: bool
    size: int
    data: bytes | None = None

    def set(self, value: Any) -> None:
        if isinstance(value, int):
            data = value.to_bytes(self.size, "little", signed=value < 0)
        elif isinstance(value, ctypes._Pointer | ctypes.c_void_p | ctypes.Structure | ctypes.Array):
            data = bytes(value)
        else:
            raise WireError(f"cannot send {type(value).__name__} as an output")
        if len(data) != self.size:
            raise WireError(f"{type(value).__name__} has {len(data)} bytes, the C side expects {self.size}")
        self.data = data


@dataclass
class VersionedOut:
    """`v`: a versioned struct; `version` is the word the caller set, NVML_STRUCT_VERSION(size | version << 24)."""

    present: bool
    version: int
    data: bytes | None = None

    @property
    def struct_version(self) -> int:
        return self.version >> 24

    def set(self, value: ctypes.Structure) -> None:
        data = bytes(value)
        if len(data) != self.version & 0xFFFFFF:
            raise WireError(f"{type(value).__name__} has {len(data)} bytes, its version word says {self.version:#x}")
        self.data = data


@dataclass
class StrOut:
    """`S`: a string into a buffer of `length` bytes; too long a string is NVML_ERROR_INSUFFICIENT_SIZE."""

    present: bool
    length: int
    data: bytes | None = None

    def set(self, value: str | bytes) -> None:
        data = (value.encode() if isinstance(value, str) else value) + b"\0"
        if len(data) > self.length:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        self.data = data


@dataclass
class ArrayOut:
    """`A<n>`: NVML's array convention, an array of `count` elements of `elem_size` bytes (or NULL: how many?) and
    the count, which NVML sets to the number written, or needed."""

    array_present: bool
    count_present: bool
    count: int
    elem_size: int
    count_data: bytes | None = None
    data: bytes | None = None

    def set_count(self, count: int) -> None:
        self.count_data = struct.pack("<I", count)

    def set_items(self, data: bytes) -> None:
        if not self.array_present or len(data) > self.count * self.elem_size or len(data) % self.elem_size:
            raise WireError(f"{len(data)} bytes of {self.elem_size}-byte elements for an array of {self.count}")
        self.data = data


Arg = int | bytes | None | Out | VersionedOut | StrOut | ArrayOut


@dataclass
class Request:
    name: str
    fmt: str
    args: list[Arg] = field(default_factory=list)

    def outputs(self) -> list[Out | VersionedOut | StrOut | ArrayOut]:
        return [a for a in self.args if isinstance(a, Out | VersionedOut | StrOut | ArrayOut)]

    def missing_pointer(self) -> bool:
        """A NULL where NVML requires a pointer (every one but an array asked only for its count)."""
        for a in self.args:
            if isinstance(a, Out | VersionedOut | StrOut) and not a.present:
                return True
            if isinstance(a, ArrayOut) and not a.count_present:
                return True
        return any(a is None for a in self.args)


def tokens(fmt: str) -> list[tuple[str, int]]:
    found = []
    for part in fmt.split():
        m = _TOKEN.fullmatch(part)
        if m is None:
            raise WireError(f"bad format token {part!r} in {fmt!r}")
        found.append((m.group(1), int(m.group(2) or 0)))
    return found


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.off = data, 0

    def take(self, n: int) -> bytes:
        if self.off + n > len(self.data):
            raise WireError("truncated request")
        chunk = self.data[self.off : self.off + n]
        self.off += n
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int(struct.unpack("<H", self.take(2))[0])

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])


def decode_request(body: bytes) -> Request:
    r = _Reader(body)
    if r.u32() != MAGIC:
        raise WireError("not a simulated-libnvml request")
    name = r.take(r.u16()).decode()
    fmt = r.take(r.u16()).decode()
    req = Request(name, fmt)
    for letter, size in tokens(fmt):
        arg: Arg
        if letter == "h" or letter == "U":
            arg = r.u64()
        elif letter == "u":
            arg = r.u32()
        elif letter == "i":
            arg = int(struct.unpack("<i", r.take(4))[0])
        elif letter == "s":
            arg = r.take(r.u32()) if r.u8() else None
        elif letter == "B":
            arg = r.take(size) if r.u8() else None
        elif letter == "o":
            arg = Out(bool(r.u8()), size)
        elif letter == "v":
            present = bool(r.u8())
            arg = VersionedOut(present, r.u32())
        elif letter == "S":
            present = bool(r.u8())
            arg = StrOut(present, r.u32())
        else:  # "A"
            array_present, count_present = bool(r.u8()), bool(r.u8())
            arg = ArrayOut(array_present, count_present, r.u32(), size)
        req.args.append(arg)
    if r.off != len(body):
        raise WireError("trailing bytes in request")
    return req


def _blob(data: bytes | None) -> bytes:
    return struct.pack("<i", -1) if data is None else struct.pack("<i", len(data)) + data


def encode_answer(code: int, outputs: list[Out | VersionedOut | StrOut | ArrayOut]) -> bytes:
    blobs: list[bytes] = []
    for out in outputs:
        if isinstance(out, ArrayOut):
            blobs += [_blob(out.count_data), _blob(out.data)]
        else:
            blobs.append(_blob(out.data))
    return struct.pack("<iH", code, len(blobs)) + b"".join(blobs)


def decode_answer(answer: bytes) -> tuple[int, list[bytes | None]]:
    """An answer's return code and each output's bytes (None: not written), as the C side reads `encode_answer`'s
    (for tests)."""
    code, n = struct.unpack_from("<iH", answer)
    outputs: list[bytes | None] = []
    off = 6
    for _ in range(n):
        (size,) = struct.unpack_from("<i", answer, off)
        off += 4
        outputs.append(None if size < 0 else answer[off : off + size])
        off += max(size, 0)
    return code, outputs


def request_bytes(name: str, fmt: str, fields: bytes) -> bytes:
    """A request frame (the C side's encoding, for tests): `fields` already encoded per token."""
    body = struct.pack("<IH", MAGIC, len(name)) + name.encode() + struct.pack("<H", len(fmt)) + fmt.encode() + fields
    return struct.pack("<I", len(body)) + body
