"""Which socket file is ours: two instances of the daemon (a rolling update) may bind the same path in turn, and each
must remove only the file it bound; and a watchdog that binds a socket again when its file is deleted. Standard
library only: the CLI's health client imports it without gRPC."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)

DEFAULT_SOCKET_CHECK_INTERVAL_S = 5.0
_Server = TypeVar("_Server")

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


def place_socket(tmp: Path, path: Path, *, replace: bool) -> SocketId | None:
    """Move the socket bound at ``tmp`` to ``path``, and return its identity there. With ``replace`` a socket at
    ``path`` is replaced atomically; without, a file that appeared there meanwhile is left alone (FileExistsError)."""
    if replace:
        os.replace(tmp, path)
    else:
        os.link(tmp, path)  # fails if the path exists
        tmp.unlink()
    return socket_id(path)  # after the move: it changes the ctime


def serve_again_if_gone(path: Path, what: str, bind: Callable[[], _Server]) -> _Server | None:
    """If the socket file at ``path`` is gone (deleted by hand, or by a cleanup of the directory), serve ``what``
    on it again: ``bind()``, which must leave a file that appeared meanwhile alone (FileExistsError: another
    instance serves it now). The new server, or None when the file is there."""
    if socket_id(path) is not None:
        return None
    log.warning("%s was removed: serving %s on it again", path, what)
    try:
        return bind()
    except FileExistsError:
        log.info("%s was created meanwhile by another instance: leaving it", path)
        return None


class SocketWatchdog:
    """Calls ``check`` every ``interval`` seconds in a background thread, from `start()` until `stop()`; ``check``
    binds the sockets whose files are gone again (see `serve_again_if_gone`). Its errors are logged."""

    def __init__(self, name: str, interval: float, check: Callable[[], None]) -> None:
        self._check = check
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop, and wait for a check under way (unless called from the check itself)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._check()
            except Exception:
                log.exception("checking the sockets of %s failed", self._thread.name)
