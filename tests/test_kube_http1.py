"""dra_driver.kube.http1 against a scripted server: every way HTTP/1.x frames a body (Content-Length, chunked with
extensions and trailers, until close, none), answers cut into pieces at every byte boundary that matters, interim
responses, keep-alive reuse, and the errors (closed early, broken protocol, a header that would smuggle another).
The REST client on top of it against the real API server: tests/test_kube_rest.py."""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Iterator

import pytest

from dra_driver.kube.http1 import Connection, ProtocolError


class Scripted:
    """A server on loopback that answers each request on one connection with the next scripted answer, sent in
    the given pieces (each piece a separate send, so that the client sees them in separate reads); `None` closes
    the connection instead. Records the requests' heads and bodies."""

    def __init__(self, answers: list[list[bytes] | None]) -> None:
        self.answers = answers
        self.requests: list[tuple[str, bytes]] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            buffer = b""
            for answer in self.answers:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                text = head.decode("latin-1")
                length = next((int(line.split(":")[1]) for line in text.split("\r\n")
                               if line.lower().startswith("content-length:")), 0)  # fmt: skip
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                self.requests.append((text, buffer[:length]))
                buffer = buffer[length:]
                if answer is None:
                    return
                for piece in answer:
                    conn.sendall(piece)
                    threading.Event().wait(0.005)  # separate reads on the client's side

    def connection(self) -> Connection:
        return Connection("127.0.0.1", self.port, context=None, timeout=5)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def scripted() -> Iterator[list[Scripted]]:
    servers: list[Scripted] = []
    yield servers
    for s in servers:
        s.close()


def serve(servers: list[Scripted], *answers: list[bytes] | None) -> Connection:
    server = Scripted(list(answers))
    servers.append(server)
    return server.connection()


def pieces(data: bytes, *cuts: int) -> list[bytes]:
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def test_content_length_bodies_on_one_kept_alive_connection(scripted: list[Scripted]) -> None:
    first = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{"kind":"a"}\n'
    second = b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nX-A: 1\r\nX-A: 2\r\n\r\n{}"
    conn = serve(scripted, pieces(first, 5, 40, len(first) - 3), pieces(second, len(second) - 1))
    conn.request("GET", "/a", None, {"Accept": "application/json"})
    r = conn.getresponse("GET")
    assert (r.status, r.reason, r.headers["content-type"]) == (200, "OK", "application/json")
    assert r.read() == b'{"kind":"a"}\n' and r.complete and not r.will_close
    sock = conn.sock
    conn.request("POST", "/b", b'{"x":1}', {})
    r = conn.getresponse("POST")
    assert (r.status, r.reason, r.read(), r.headers["x-a"]) == (201, "Created", b"{}", "1, 2")
    assert conn.sock is sock  # the same connection
    server = scripted[0]
    assert server.requests[0][0].startswith("GET /a HTTP/1.1\r\nHost: 127.0.0.1:")
    assert "Accept: application/json" in server.requests[0][0]
    assert "Content-Length: 7" in server.requests[1][0] and server.requests[1][1] == b'{"x":1}'


def test_chunked_bodies_with_extensions_and_trailers_cut_anywhere(scripted: list[Scripted]) -> None:
    body = b"4;ext=1\r\nWiki\r\n6\r\npedia \r\nE\r\nin \r\n\r\nchunks.\r\n0\r\nTrailer: x\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    whole = head + body
    answers = [pieces(whole, cut) for cut in range(1, len(whole))]
    conn = serve(scripted, *answers)
    for _ in answers:
        conn.request("GET", "/", None, {})
        r = conn.getresponse("GET")
        assert r.read() == b"Wikipedia in \r\n\r\nchunks." and r.complete and not r.will_close


def test_read1_streams_a_chunked_body_as_it_comes(scripted: list[Scripted]) -> None:
    """A watch: each event as soon as its chunk arrives, never waiting for the next."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    conn = serve(scripted, [head, b"3\r\nabc\r\n", b"2\r\nde\r\n", b"0\r\n\r\n"])
    conn.request("GET", "/watch", None, {})
    r = conn.getresponse("GET")
    got = []
    while chunk := r.read1(65536):
        got.append(chunk)
    assert got == [b"abc", b"de"] and r.complete


def test_a_body_framed_by_the_close_and_http_1_0(scripted: list[Scripted]) -> None:
    conn = serve(scripted, [b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n", b"until ", b"the end"])
    conn.request("GET", "/", None, {})
    r = conn.getresponse("GET")
    assert r.will_close
    scripted[0].listener.close()
    scripted[0].thread.join(5)  # the server closed the connection after its answer
    assert r.read() == b"until the end" and r.complete


def test_no_body_for_head_204_304_and_interim_responses(scripted: list[Scripted]) -> None:
    conn = serve(
        scripted,
        [b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"],  # HEAD: the length of what GET would answer
        [b"HTTP/1.1 204 No Content\r\n\r\n"],
        [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n"],
        [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"],
    )
    for method, status in (("HEAD", 200), ("DELETE", 204), ("GET", 304), ("GET", 200)):
        conn.request(method, "/", None, {})
        r = conn.getresponse(method)
        assert r.status == status
        assert r.read() == (b"ok" if status == 200 and method == "GET" else b"") and r.complete


def test_a_server_that_closes_early_or_breaks_the_protocol(scripted: list[Scripted]) -> None:
    conn = serve(scripted, None)
    conn.request("GET", "/", None, {})
    with pytest.raises(ConnectionResetError):  # no answer at all
        conn.getresponse("GET")
    conn = serve(scripted, [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"], None)
    conn.request("GET", "/", None, {})
    r = conn.getresponse("GET")
    conn.request("GET", "/next", None, {})  # the server closes on this one, before the body's end
    with pytest.raises(ConnectionResetError):
        r.read()
    for bad in (b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 2000 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
                b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"):  # fmt: skip
        conn = serve(scripted, [bad])
        conn.request("GET", "/", None, {})
        with pytest.raises(ProtocolError):
            conn.getresponse("GET").read()


def test_a_header_value_cannot_smuggle_another_header_or_request(scripted: list[Scripted]) -> None:
    conn = serve(scripted, [b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"])
    with pytest.raises(ValueError, match="line break"):
        conn.request("GET", "/", None, {"Authorization": "Bearer x\r\nX-Evil: 1"})
    with pytest.raises(ValueError, match="line break"):
        conn.request("GET", "/ HTTP/1.1\r\nHost: evil\r\n\r\nGET /", None, {})
    conn.request("GET", "/", None, {})  # nothing was sent before
    assert conn.getresponse("GET").status == 200
    assert [head.split("\r\n")[0] for head, _ in scripted[0].requests] == ["GET / HTTP/1.1"]
