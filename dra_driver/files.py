"""Opening and writing the temp files the driver writes and then renames into place (CDI specs, the checkpoint):
bare file descriptors and string paths, as these writes happen at every state change under the node lock (a buffered
file object and pathlib's joins were a third of a write's CPU)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC


def open_new(path: str | Path, mode: int) -> int:
    """`path` opened for writing (created with `mode`, or truncated), as a file descriptor. Its directory is made
    only when the open finds it missing: not a mkdir per write, under the node lock, for a directory that exists."""
    try:
        return os.open(path, _CREATE, mode)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, _CREATE, mode)


def write_all(fd: int, data: bytes) -> None:
    """All of `data` (a write to a filling disk may be short before it fails with ENOSPC)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def replace_file(final: str | Path, tmp: str | Path, data: bytes, mode: int) -> None:
    """`data` written to `tmp`, then renamed over `final`: readers see the old file or the new one, never part of
    one; `tmp` is gone afterwards, also when the write fails (a full or read-only disk)."""
    try:
        fd = open_new(tmp, mode)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
