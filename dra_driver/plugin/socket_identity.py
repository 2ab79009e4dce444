"""Which socket file is ours: two instances of the daemon (a rolling update) may bind the same path in turn, and each
must remove only the file it bound. Standard library only: the CLI's health client imports it without gRPC."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

# (st_dev, st_ino, st_ctime_ns): inode numbers are reused once a file is deleted, the ctime tells a later file apart
SocketId = tuple[int, int, int]


def socket_id(path: Path) -> SocketId | None:
    """The identity of the file at ``path``; None if there is none."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def remove_own_socket(path: Path, ours: SocketId | None) -> bool:
    """Remove the socket file we bound (identity ``ours``); leave one that replaced it (another instance serves it
    now). True when removed."""
    current = socket_id(path)
    if current is None:
        return False
    if current != ours:
        log.info("leaving %s: not the socket this process bound, another instance serves it now", path)
        return False
    path.unlink(missing_ok=True)
    return True
