"""The primitives every simulated-hardware state file uses: an exclusive lock that holds across threads and
processes, an atomic replace, so other processes see the old or the new content, never half of it, and the file's
identity, which every replace changes (readers keep what they parsed while it stays the same)."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def locked(lock_path: Path, thread_lock: threading.Lock | threading.RLock) -> Iterator[None]:
    """flock locks belong to open file descriptions, so the thread lock keeps threads of one process apart too."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with thread_lock, open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def replace_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def file_identity(path: Path) -> tuple[int, ...]:
    """Changes with every `replace_text` (a new inode); raises FileNotFoundError."""
    st = os.stat(path)
    return (st.st_ino, st.st_mtime_ns, st.st_size, st.st_ctime_ns)
