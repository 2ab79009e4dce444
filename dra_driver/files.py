"""Opening the temp files the driver writes and then renames into place (CDI specs, the checkpoint)."""

from __future__ import annotations

import os
from pathlib import Path

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC


def open_new(path: Path, mode: int) -> int:
    """`path` opened for writing (created with `mode`, or truncated), as a file descriptor. Its directory is made
    only when the open finds it missing: not a mkdir per write, under the node lock, for a directory that exists."""
    try:
        return os.open(path, _CREATE, mode)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, _CREATE, mode)
