"""Hand-written servers on loopback for the client tests: the accept loop they share."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def serve_each(listener: socket.socket, handle: Callable[[socket.socket], None]) -> None:
    """Accepts on `listener` in a daemon thread until it is closed, each connection handled by `handle` in a
    daemon thread of its own."""

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
