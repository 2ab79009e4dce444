"""dra_driver.kube: a request's timeout is a deadline for all of it (name lookup, connect, head, body), not a limit
per socket read, against a loopback server that trickles its answer, never pausing as long as the timeout; and
name lookups that hang end at the deadline too."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dra_driver.kube import KubeRest, rest
from dra_driver.kube.config import ClusterConfig
from dra_driver.plugin.claims import KubeClaimSource
from tests.loopback import serve_each

BYTE_EVERY_S = 0.2  # far less than any timeout below: a limit per read would never be reached
ENDLESS = b"a" * 100_000


class Trickle:
    """A server on loopback that reads a request's head, sends `head` at once, then `trickled` a byte every
    BYTE_EVERY_S seconds, on every connection, until closed."""

    def __init__(self, head: bytes, trickled: bytes) -> None:
        self.head, self.trickled = head, trickled
        self.stopped = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        serve_each(self.listener, self._serve)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(65536) or b"\r\n\r\n"
                conn.sendall(self.head)
                for i in range(len(self.trickled)):
                    if self.stopped.wait(BYTE_EVERY_S):
                        return
                    conn.sendall(self.trickled[i : i + 1])
            except OSError:
                return

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()


@pytest.fixture
def trickle() -> Iterator[Callable[[bytes, bytes], Trickle]]:
    servers: list[Trickle] = []

    def make(head: bytes, trickled: bytes) -> Trickle:
        servers.append(Trickle(head, trickled))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def _fails_within(seconds: float, fn: Callable[[], Any]) -> BaseException:
    """What `fn` raised; it must have ended (its thread free again) within `seconds`."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:
            raised.append(e)

    thread = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {time.monotonic() - start:.1f} s"
    assert raised, "no error"
    return raised[0]


SLACK_S = 0.8  # a loaded CI machine


def test_a_trickled_head_or_body_ends_at_the_requests_deadline(trickle: Callable[[bytes, bytes], Trickle]) -> None:
    slow_head = trickle(b"", b"HTTP/1.1 200 OK\r\nX-Pad: " + ENDLESS)
    slow_body = trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n", ENDLESS)
    for server in (slow_head, slow_body):
        per_call = KubeRest(ClusterConfig(server=server.url)).get
        own = KubeRest(ClusterConfig(server=server.url), timeout=1.0).get  # the client's own timeout, the same
        for get in (lambda: per_call("/version", timeout=1.0), lambda: own("/version")):  # noqa: B023
            assert isinstance(_fails_within(1.0 + SLACK_S, get), TimeoutError)


def test_a_watch_ends_at_its_deadline_however_its_answer_trickles(
    trickle: Callable[[bytes, bytes], Trickle], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head within the client's timeout; the events by the time the server should have ended the watch, and
    a little more."""
    path = "/apis/resource.k8s.io/v1/resourceclaims"
    slow_head = trickle(b"", b"HTTP/1.1 200 OK\r\nX-Pad: " + ENDLESS)
    client = KubeRest(ClusterConfig(server=slow_head.url), timeout=1.0)
    assert isinstance(_fails_within(1.0 + SLACK_S, lambda: client.watch(path, seconds=60)), TimeoutError)

    monkeypatch.setattr(rest, "WATCH_SLACK_S", 0.5, raising=False)
    slow_events = trickle(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffff\r\n", ENDLESS)
    client = KubeRest(ClusterConfig(server=slow_events.url), timeout=1.0)
    error = _fails_within(1.0 + 0.5 + SLACK_S, lambda: list(client.watch(path, seconds=1)))
    assert isinstance(error, TimeoutError)


def test_a_claim_read_for_the_kubelet_fails_at_its_deadline(trickle: Callable[[bytes, bytes], Trickle]) -> None:
    """A prepare's read gives its gRPC worker back when its time is up, however slowly the claim comes."""
    server = trickle(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1200\r\n\r\n", ENDLESS)
    source = KubeClaimSource(KubeRest(ClusterConfig(server=server.url)), request_timeout=10.0)
    error = _fails_within(1.0 + SLACK_S, lambda: source.get_claim("default", "claim", timeout=1.0))
    assert isinstance(error, TimeoutError)


def test_a_hung_name_lookup_ends_at_the_deadline_and_is_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    """getaddrinfo cannot be interrupted: the request stops waiting for it at its deadline, and requests that come
    while it still hangs wait for the same lookup instead of starting one each."""
    lookups: list[str] = []
    released = threading.Event()
    real = socket.getaddrinfo

    def hung(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "api.hung-dns.test":
            return real(host, *args, **kwargs)
        lookups.append(host)
        released.wait(10)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", hung)
    client = KubeRest(ClusterConfig(server="http://api.hung-dns.test:6443"))
    try:
        for _ in range(3):
            assert isinstance(_fails_within(0.5 + SLACK_S, lambda: client.get("/version", timeout=0.5)), TimeoutError)
        assert lookups == ["api.hung-dns.test"]
    finally:
        released.set()
