"""HTTP/1.1 client connections: what the REST client needs of http.client, for less CPU per request.

http.client parses every response's headers with the email package and wraps the socket in a new buffered file
per response; for a 1 KB ResourceClaim that was most of a GET's CPU in the daemon, read at every prepare. Here a
response is read from one buffer per connection: the status line, the headers as a dict, and a body framed as RFC
9112 section 6 says (no body for HEAD, 1xx, 204 and 304; chunked; Content-Length; else until the server closes).
An HTTP proxy is reached through a CONNECT tunnel. No compression (never asked for), no 100-continue (never sent).

A request has a deadline for all of it: the name lookup, connect, tunnel, TLS handshake, sending, the response's
head and body. Each socket operation gets the time left, never a timeout of its own, so a server that trickles its
answer cannot stretch a request past it.

Errors: a connection the server closed before a whole response came raises ConnectionResetError (the caller may
send again where that is safe); a response that breaks the protocol raises ProtocolError; a deadline that passes
raises TimeoutError, as socket timeouts do.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dra_driver.kube.dial import open_tcp, remaining

MAX_HEADER_BYTES = 256 * 1024  # the API server's own limit on request headers is 1 MiB; its responses are small
_READ = 65536
_NO_BODY_STATUS = frozenset({204, 304})


class ProtocolError(OSError):
    """The server's answer is not HTTP/1.x as this client reads it."""


@dataclass(frozen=True)
class Proxy:
    """An HTTP proxy that opens CONNECT tunnels; `headers` go with the CONNECT request (Proxy-Authorization)."""

    host: str
    port: int
    headers: tuple[tuple[str, str], ...] = ()


def _closed() -> ConnectionResetError:
    return ConnectionResetError("the API server closed the connection before a whole response")


class Response:
    """A response whose status and headers are read; the body is read with `read` (all of it) or `read1`."""

    def __init__(self, conn: Connection, status: int, reason: str, headers: dict[str, str], method: str) -> None:
        self.status, self.reason, self.headers = status, reason, headers
        self._conn = conn
        connection = headers.get("connection", "").lower()
        self.will_close = "close" in connection
        self._chunked = False
        self._left: int | None = 0  # bytes left in the body (chunked: in the current chunk); None: until close
        self._done = False
        tunnel = method == "CONNECT" and 200 <= status < 300  # what follows is the tunnel's
        if method == "HEAD" or status < 200 or status in _NO_BODY_STATUS or tunnel:
            self._done = True
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._chunked = True
        elif "content-length" in headers:
            try:
                self._left = int(headers["content-length"])
            except ValueError:
                raise ProtocolError(f"invalid Content-Length {headers['content-length']!r}") from None
            if self._left < 0:
                raise ProtocolError(f"invalid Content-Length {self._left}")
            self._done = self._left == 0
        else:
            self._left, self.will_close = None, True

    @property
    def complete(self) -> bool:
        """The whole body has been read."""
        return self._done

    def read(self) -> bytes:
        parts: list[bytes] = []
        while chunk := self.read1(_READ):
            parts.append(chunk)
        return b"".join(parts)

    def read1(self, limit: int = _READ) -> bytes:
        """Some of the body: what is buffered or one socket read's worth, at most `limit` bytes; b"" at its end."""
        if self._done:
            return b""
        conn = self._conn
        if self._chunked and self._left == 0:
            self._left = self._chunk_size()
            if self._left == 0:
                self._trailers()
                self._done = True
                return b""
        if not conn.buffer and not conn.fill():
            if self._left is None:  # framed by the close
                self._done = True
                return b""
            raise _closed()
        n = len(conn.buffer) if self._left is None else min(len(conn.buffer), self._left)
        n = min(n, limit)
        data = bytes(conn.buffer[:n])
        del conn.buffer[:n]
        if self._left is not None:
            self._left -= n
            if self._left == 0:
                if self._chunked:
                    if conn.line() != b"":
                        raise ProtocolError("a chunk does not end with CRLF")
                else:
                    self._done = True
        return data

    def _chunk_size(self) -> int:
        line = self._conn.line()
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise ProtocolError(f"invalid chunk size line {line[:40]!r}") from None
        if size < 0:
            raise ProtocolError(f"invalid chunk size {size}")
        return size

    def _trailers(self) -> None:
        while self._conn.line() != b"":
            pass


class Connection:
    """One keep-alive connection to host:port (TLS with `context`, through `proxy` if given), opened by its first
    request. TLS asks for `server_name` (default: `host`) and checks the certificate against it. `timeout`: the
    seconds a request given no deadline may take."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        context: ssl.SSLContext | None,
        timeout: float,
        server_name: str | None = None,
        proxy: Proxy | None = None,
    ) -> None:
        self.host, self.port, self.context, self.timeout = host, port, context, timeout
        self.server_name, self.proxy = server_name or host, proxy
        self.deadline = 0.0  # of the current request, a time.monotonic() value
        self.sock: socket.socket | None = None
        self.buffer = bytearray()
        default = 443 if context is not None else 80
        name = f"[{host}]" if ":" in host else host
        self._authority = f"{name}:{port}"
        self._host_header = name if port == default else self._authority

    def connect(self) -> None:
        where = self.proxy or self
        sock = open_tcp(where.host, where.port, self.deadline)
        try:
            if self.proxy is not None:
                self._tunnel(sock, self.proxy)
            if self.context is not None:
                sock.settimeout(remaining(self.deadline))  # the handshake's reads share it
                sock = self.context.wrap_socket(sock, server_hostname=self.server_name)
        except BaseException:
            sock.close()
            raise
        self.sock = sock

    def _tunnel(self, sock: socket.socket, proxy: Proxy) -> None:
        """Has the proxy on `sock` open a tunnel to host:port."""
        tunnel = Connection(self.host, self.port, context=None, timeout=self.timeout)
        tunnel.sock = sock
        try:
            tunnel.request("CONNECT", self._authority, None, {}, extra=proxy.headers, deadline=self.deadline)
            response = tunnel.getresponse("CONNECT")
        finally:
            tunnel.sock = None  # the socket stays open: it is the tunnel
        if not 200 <= response.status < 300:
            raise OSError(
                f"the proxy {proxy.host}:{proxy.port} refused a tunnel to {self._authority}: "
                f"{response.status} {response.reason}"
            )
        if tunnel.buffer:
            raise ProtocolError("the proxy sent data into the tunnel before the TLS handshake")

    def close(self) -> None:
        sock, self.sock = self.sock, None
        self.buffer.clear()
        if sock is not None:
            sock.close()

    def request(
        self,
        method: str,
        target: str,
        body: bytes | None,
        headers: Mapping[str, str],
        *,
        extra: Sequence[tuple[str, str]] = (),
        deadline: float | None = None,
    ) -> None:
        """Sends a request with `headers` and `extra` (fields that may repeat, as Impersonate-Group does); it and
        its response must be done by `deadline` (a time.monotonic() value; None: `timeout` from now)."""
        self.deadline = time.monotonic() + self.timeout if deadline is None else deadline
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self._host_header}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines += [f"{k}: {v}" for k, v in extra]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        if any("\n" in line or "\r" in line for line in lines):  # a header must not smuggle in another
            raise ValueError("a request line or header contains a line break")
        head = "\r\n".join(lines)
        if self.sock is None:
            self.connect()
        assert self.sock is not None
        data = memoryview(head.encode("latin-1") + b"\r\n\r\n" + (body or b""))
        while data:  # sendall on a TLS socket would give each of its writes the whole timeout
            self.sock.settimeout(remaining(self.deadline))
            data = data[self.sock.send(data) :]

    def getresponse(self, method: str) -> Response:
        while True:
            status, reason, headers = self._head()
            if 100 <= status < 200 and status != 101:  # interim (100 Continue, 103 Early Hints): the answer follows
                continue
            return Response(self, status, reason, headers, method)

    def fill(self) -> bool:
        """One socket read into the buffer; False when the server has closed the connection."""
        if self.sock is None:
            return False
        self.sock.settimeout(remaining(self.deadline))
        data = self.sock.recv(_READ)
        self.buffer += data
        return bool(data)

    def line(self) -> bytes:
        """The next CRLF-terminated line, without it."""
        return self._until(b"\r\n", "a line")

    def _until(self, end: bytes, what: str) -> bytes:
        """The buffered bytes up to `end` (read until it comes), consumed with it."""
        while (at := self.buffer.find(end)) < 0:
            if len(self.buffer) > MAX_HEADER_BYTES:
                raise ProtocolError(f"{what} longer than {MAX_HEADER_BYTES} bytes")
            if not self.fill():
                raise _closed()
        out = bytes(self.buffer[:at])
        del self.buffer[: at + len(end)]
        return out

    def _head(self) -> tuple[int, str, dict[str, str]]:
        head = self._until(b"\r\n\r\n", "response headers").decode("latin-1")
        status_line, *fields = head.split("\r\n")
        version, _, rest = status_line.partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        headers: dict[str, str] = {}
        for field in fields:
            name, sep, value = field.partition(":")
            if not sep:
                raise ProtocolError(f"invalid header line {field[:80]!r}")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        if version == "HTTP/1.0" and "keep-alive" not in headers.get("connection", "").lower():
            headers["connection"] = "close"  # HTTP/1.0 closes after each response unless it says otherwise
        return int(code), reason, headers
