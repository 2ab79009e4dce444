"""An HTTP/1.1 server that bounds what one client can hold: the base of every HTTP endpoint the driver serves
(metrics, the webhook, the health admin socket).

The standard library's threading server gives every connection a thread and a descriptor, with no limit, and its
socket timeouts are per read: a client that sends its request line or headers a byte at a time, or just connects
and waits, holds both for ever, and about a thousand of them exhaust a process's descriptors (every prepare then
fails with "Too many open files"). Here:

- at most ``max_connections`` connections, and ``max_per_peer`` from one address; when full, the connection that
  has waited longest for a request (new or kept alive: closing it is what HTTP lets a server do at any time) is
  closed to make room, else the one whose request has taken longest, if over ``pressure_s`` (a slow client's, as
  real requests take milliseconds), else the newcomer is closed at once;
- a request's line, headers and body must arrive within ``request_timeout_s`` of its first byte, whatever the
  pace (one deadline, not one per read), and its line and headers within ``max_head`` bytes;
- a kept-alive connection waits ``idle_timeout_s`` for its next request;
- an answer must be taken within ``request_timeout_s``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import socketserver
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    max_connections: int = 32
    max_per_peer: int = 8  # a Unix socket's peers have no address: there it is max_connections
    request_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0
    max_head: int = 32 * 1024  # request line and headers (http.client alone allows 100 lines of 64 KiB)
    pressure_s: float = 1.0  # when full, a request older than this gives way to a new connection


class HeadTooLarge(OSError):
    """The request line and headers went past their byte budget."""


class _DeadlineReader(io.RawIOBase):
    """The connection's reads, each given what is left of one deadline, and at most `budget` bytes in all."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.deadline = float("inf")
        self.budget = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request deadline passed")
        if self.budget <= 0:
            raise HeadTooLarge("request head too large")
        view = memoryview(buffer)[: self.budget]
        self._sock.settimeout(left)
        n = self._sock.recv_into(view)
        self.budget -= n
        return n


class BoundedHandler(BaseHTTPRequestHandler):
    """A handler whose reads and writes keep the server's limits; `read_body(n)` reads a body within them."""

    server: BoundedHTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive

    def setup(self) -> None:
        super().setup()
        self._reader = _DeadlineReader(self.connection)
        self._buffered = io.BufferedReader(self._reader, 8192)
        self.rfile = self._buffered

    def handle_one_request(self) -> None:
        limits = self.server.limits
        self._reader.deadline, self._reader.budget = time.monotonic() + limits.idle_timeout_s, 1
        try:
            first = self._buffered.peek(1)
        except OSError:  # TimeoutError included
            first = b""
        if not first:  # idle past its time, closed by the client, or closed to make room
            self.close_connection = True
            return
        self.server.mark(busy=True)
        self._reader.deadline = time.monotonic() + limits.request_timeout_s
        self._reader.budget = limits.max_head
        try:
            super().handle_one_request()  # a request past its deadline: a TimeoutError it closes the connection on
        except HeadTooLarge:
            self.close_connection = True
            self._plain_error(431, "request line and headers too large")
        finally:
            self.server.mark(busy=False)

    def _plain_error(self, status: int, message: str) -> None:
        with contextlib.suppress(OSError):
            self.send_error(status, message)

    def read_body(self, length: int) -> bytes:
        """The body's `length` bytes by the request's deadline (TimeoutError; ConnectionError if the client left
        first). The caller bounds `length`."""
        self._reader.budget = max(self._reader.budget, length)
        data = self.rfile.read(length) if length else b""
        if len(data) < length:
            raise ConnectionError("the client closed the connection mid-body")
        return data

    def send_response(self, code: int, message: str | None = None) -> None:
        # the answer has the request's time again to be taken (sendall's timeout is for the whole call)
        self.connection.settimeout(self.server.limits.request_timeout_s)
        super().send_response(code, message)


class _Conn:
    """One connection as the server counts it."""

    __slots__ = ("accepted", "busy", "closed", "peer", "since", "sock")

    def __init__(self, peer: str, accepted: socket.socket) -> None:
        self.accepted = accepted  # its key in the server's table
        self.peer, self.sock, self.busy, self.closed = peer, accepted, False, False
        self.since = time.monotonic()  # of its waiting, or of its request


class BoundedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with `Limits` (see the module's docstring); its handler must be a BoundedHandler.
    `wrap(request)` may replace the accepted socket (TLS) before the handler gets it."""

    daemon_threads = True  # a kept-alive idle connection must not hold up the process's exit
    block_on_close = False
    request_queue_size = 128  # listen backlog (socketserver's 5 drops a burst's SYNs: a second's retry each)

    def __init__(
        self, address: Any, handler: type[BoundedHandler], limits: Limits, *, listener: socket.socket | None = None
    ) -> None:
        """`listener`: a socket already listening on `address` (another process's, handed over), served as it is."""
        if isinstance(address, tuple):  # an IP address and port (a Unix socket's server sets AF_UNIX itself)
            self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.limits = limits
        self._lock = threading.Lock()
        self._open: dict[socket.socket, _Conn] = {}  # by the accepted socket
        self._local = threading.local()  # the connection of the thread serving it
        super().__init__(address, handler, bind_and_activate=listener is None)
        if listener is not None:
            self.socket.close()
            self.socket = listener
            name = listener.getsockname()
            self.server_address = name
            self.server_name, self.server_port = str(name[0]), int(name[1])

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # not HTTPServer's: its getfqdn() is a DNS lookup at start
        name = self.server_address
        self.server_name = str(name[0]) if isinstance(name, tuple) else str(name)
        self.server_port = int(name[1]) if isinstance(name, tuple) else 0

    def connections(self) -> int:
        with self._lock:
            return len(self._open)

    def mark(self, *, busy: bool) -> None:
        """The calling thread's connection is in a request (busy) or waiting for one."""
        conn: _Conn | None = getattr(self._local, "conn", None)
        if conn is not None:
            with self._lock:
                conn.busy, conn.since = busy, time.monotonic()

    def _admit(self, request: socket.socket, peer: str) -> bool:
        """Room for a connection from `peer`, made by closing the oldest waiting one (of that peer when it has its
        share) if need be; False when every connection in the way is in a request."""
        limits = self.limits
        per_peer = limits.max_per_peer if peer else limits.max_connections
        with self._lock:
            mine = [c for c in self._open.values() if c.peer == peer]
            if len(mine) >= per_peer:
                candidates = mine
            elif len(self._open) >= limits.max_connections:
                candidates = list(self._open.values())
            else:
                candidates = []
            if candidates:
                victim = self._victim(candidates)
                if victim is None:
                    return False
                self._close(victim)
            self._open[request] = _Conn(peer, request)
            return True

    def _victim(self, candidates: list[_Conn]) -> _Conn | None:
        waiting = [c for c in candidates if not c.busy]
        if waiting:
            return min(waiting, key=lambda c: c.since)
        slow = [c for c in candidates if time.monotonic() - c.since > self.limits.pressure_s]
        return min(slow, key=lambda c: c.since) if slow else None

    def _close(self, conn: _Conn) -> None:
        """(under the lock) Wake the connection's thread, which then closes it: counted out from now."""
        del self._open[conn.accepted]
        if not conn.closed:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)  # the descriptor's, under any TLS layer

    def process_request(self, request: Any, client_address: Any) -> None:
        peer = str(client_address[0]) if isinstance(client_address, tuple) else ""
        if not self._admit(request, peer):
            log.debug("%d connections open, all in a request: closing the one from %s", len(self._open), peer)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._lock:
            self._local.conn = self._open.get(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)
            self._local.conn = None

    def shutdown_request(self, request: Any) -> None:
        self._forget(request)  # before its descriptor is closed (and its number reused)
        super().shutdown_request(request)

    def _forget(self, request: Any) -> None:
        with self._lock:
            conn = self._open.pop(request, None) or getattr(self._local, "conn", None)
            if conn is not None:
                conn.closed = True

    def wrap(self, request: socket.socket) -> socket.socket | None:
        """The socket the handler talks over (None: drop the connection); TLS servers wrap it here."""
        return request

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(self.limits.request_timeout_s)
        conn = self.wrap(request)
        if conn is None:
            return
        record: _Conn | None = getattr(self._local, "conn", None)
        if record is not None:
            with self._lock:
                record.sock = conn
        try:
            super().finish_request(conn, client_address)
        finally:
            if conn is not request:
                with self._lock:
                    if record is not None:
                        record.closed = True
                conn.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s ended with an error", client_address, exc_info=True)
