"""dra_driver.webhook.server: the real HTTPS server with certificates from a throwaway CA (openssl): reviews over
keep-alive connections, /healthz and /metrics, certificate rotation (a Secret volume's `..data` swap), bad requests,
stalled clients, the connection cap, and `dra-driver webhook` itself until SIGTERM."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from dra_driver.webhook import server as server_module
from dra_driver.webhook.server import HEALTH_PATH, REVIEW_PATH, WebhookServer
from dra_driver.webhook.tls import TlsError
from tests.cluster.controlplane import free_port, issue_cert, make_ca
from tests.polling import wait_until
from tests.test_webhook_review import BAD_STRATEGY, DRIVER, admission, entry, resource

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command makes the test CA")

LEAF = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n"
REVIEW = admission(resource("ResourceClaim", "v1", [entry(BAD_STRATEGY)]))


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    """ca.crt and a serving pair laid out as a Secret volume: tls.crt -> ..data/tls.crt, ..data -> ..v1/."""
    make_ca(tmp_path, "webhook-test-ca")
    _issue(tmp_path, "v1", "/CN=webhook-v1")
    (tmp_path / "..data").symlink_to("..v1")
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).symlink_to(f"..data/{name}")
    return tmp_path


def _issue(pki: Path, version: str, subject: str) -> None:
    issue_cert(pki, version, subject, LEAF)
    (pki / f"..{version}").mkdir()
    shutil.move(pki / f"{version}.crt", pki / f"..{version}" / "tls.crt")
    shutil.move(pki / f"{version}.key", pki / f"..{version}" / "tls.key")


def _swap(pki: Path, version: str) -> None:
    """What the kubelet does when the Secret changes: a new directory, then one atomic rename of ..data."""
    (pki / "..data_tmp").symlink_to(f"..{version}")
    os.replace(pki / "..data_tmp", pki / "..data")


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def webhook(pki: Path, registry: CollectorRegistry) -> Iterator[WebhookServer]:
    server = WebhookServer(DRIVER, pki / "tls.crt", pki / "tls.key", address="127.0.0.1", port=0, registry=registry)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _client_context(pki: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki / "ca.crt"))


def _connect(webhook: WebhookServer, pki: Path) -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection("127.0.0.1", webhook.port, context=_client_context(pki), timeout=10)


def _post(
    conn: http.client.HTTPSConnection, body: Any, content_type: str = "application/json", path: str = REVIEW_PATH
) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, body=data, headers={"Content-Type": content_type})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def _peer_subject(webhook: WebhookServer, pki: Path) -> str:
    with (
        socket.create_connection(("127.0.0.1", webhook.port), timeout=10) as raw,
        _client_context(pki).wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        cert = tls.getpeercert()
    assert cert is not None
    return str(dict(item[0] for item in cert["subject"])["commonName"])


def test_reviews_over_one_kept_alive_connection(webhook: WebhookServer, pki: Path) -> None:
    conn = _connect(webhook, pki)
    status, out = _post(conn, REVIEW)
    assert status == 200 and out["kind"] == "AdmissionReview"
    assert out["response"]["allowed"] is False and out["response"]["uid"] == REVIEW["request"]["uid"]
    assert out["response"]["status"]["message"].startswith(
        "spec.devices.config[0].opaque.parameters: invalid GpuConfig"
    )
    sock = conn.sock
    good = admission(resource("ResourceClaimTemplate", "v1beta2", []), kind="ResourceClaimTemplate", version="v1beta2")
    status, out = _post(conn, good)  # the API server's query string is ignored
    assert status == 200 and out["response"]["allowed"] is True
    assert conn.sock is sock, "the connection was not kept alive"
    conn.close()


def test_healthz_and_review_metrics(webhook: WebhookServer, pki: Path, registry: CollectorRegistry) -> None:
    conn = _connect(webhook, pki)
    conn.request("GET", HEALTH_PATH)
    response = conn.getresponse()
    assert response.status == 200 and response.read() == b"ok\n"
    _post(conn, REVIEW)
    _post(conn, REVIEW)
    _post(conn, admission({"kind": "Pod"}, kind="Pod", group=""))
    _post(conn, {"not": "a review"})
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()

    def count(kind: str, result: str) -> float | None:
        return registry.get_sample_value("dra_driver_webhook_reviews_total", {"kind": kind, "result": result})

    assert (count("ResourceClaim", "denied"), count("other", "allowed"), count("unknown", "error")) == (2.0, 1.0, 1.0)
    assert 'dra_driver_webhook_reviews_total{kind="ResourceClaim",result="denied"} 2.0' in text


def test_the_certificate_is_reloaded_when_the_secret_changes(webhook: WebhookServer, pki: Path) -> None:
    assert _peer_subject(webhook, pki) == "webhook-v1"
    kept = _connect(webhook, pki)
    assert _post(kept, REVIEW)[0] == 200
    _issue(pki, "v2", "/CN=webhook-v2")
    _swap(pki, "v2")
    assert _peer_subject(webhook, pki) == "webhook-v2"
    assert _post(kept, REVIEW)[0] == 200  # a connection made before keeps working
    # a writer that has replaced the certificate but not the key yet: the last good pair stays in use
    _issue(pki, "v3", "/CN=webhook-v3")
    (pki / "..v3" / "tls.key").write_bytes((pki / "..v1" / "tls.key").read_bytes())
    _swap(pki, "v3")
    assert _peer_subject(webhook, pki) == "webhook-v2"
    _swap(pki, "v1")
    assert _peer_subject(webhook, pki) == "webhook-v1"


def test_a_missing_or_broken_certificate_stops_the_start(pki: Path) -> None:
    with pytest.raises(TlsError, match="cannot load the TLS certificate"):
        WebhookServer(DRIVER, pki / "ca.crt", pki / "tls.key", address="127.0.0.1", port=0)
    with pytest.raises(TlsError, match="No such file"):
        WebhookServer(DRIVER, pki / "missing.crt", pki / "tls.key", address="127.0.0.1", port=0)


@pytest.mark.parametrize(
    ("path", "body", "content_type", "status", "words"),
    [
        ("/validate", REVIEW, "application/json", 404, f"POST {REVIEW_PATH}"),
        (REVIEW_PATH, REVIEW, "text/plain", 415, "expected application/json"),
        (REVIEW_PATH, b"{not json", "application/json", 400, "the body is not JSON"),
        (REVIEW_PATH, b"\xff\xfe", "application/json", 400, "the body is not JSON"),
        (REVIEW_PATH, b"[" * 100_000, "application/json", 400, "the body is not JSON"),
        (REVIEW_PATH, {"kind": "AdmissionReview"}, "application/json", 400, "apiVersion: Field required"),
    ],
    ids=["path", "content-type", "json", "utf8", "deep", "not-a-review"],
)
def test_bad_requests_get_a_clear_error(
    webhook: WebhookServer, pki: Path, path: str, body: Any, content_type: str, status: int, words: str
) -> None:
    conn = _connect(webhook, pki)
    got, out = _post(conn, body, content_type, path)
    assert got == status and words in out["error"], out
    conn.close()
    conn = _connect(webhook, pki)  # and the server still serves
    assert _post(conn, REVIEW)[0] == 200


def _raw(webhook: WebhookServer, pki: Path) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=10)
    return _client_context(pki).wrap_socket(raw, server_hostname="127.0.0.1")


def _read_response(tls: ssl.SSLSocket) -> tuple[int, bytes]:
    data = b""
    with contextlib.suppress(TimeoutError, ConnectionError):
        while chunk := tls.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def test_too_large_and_unsized_bodies_are_refused_unread(webhook: WebhookServer, pki: Path) -> None:
    with _raw(webhook, pki) as tls:
        size = server_module.MAX_BODY + 1
        tls.sendall(f"POST {REVIEW_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {size}\r\n\r\n".encode())  # fmt: skip
        status, body = _read_response(tls)
        assert status == 413 and b"the body must be 0 to" in body
    with _raw(webhook, pki) as tls:
        tls.sendall(f"POST {REVIEW_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n".encode())  # fmt: skip
        status, body = _read_response(tls)
        assert status == 411 and b"Content-Length is required" in body


def _server(pki: Path, **limits: Any) -> WebhookServer:
    bounded = dataclasses.replace(server_module.LIMITS, **limits)
    return WebhookServer(DRIVER, pki / "tls.crt", pki / "tls.key", address="127.0.0.1", port=0, limits=bounded)


def test_a_body_that_drips_in_is_cut_off(pki: Path) -> None:
    server = _server(pki, request_timeout_s=1.0).start()
    try:
        with _raw(server, pki) as tls:
            tls.sendall(f"POST {REVIEW_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        "Content-Length: 100\r\n\r\n{".encode())  # fmt: skip
            started = time.monotonic()
            for _ in range(3):  # one byte every 0.5 s: each read is in time, the whole body is not
                time.sleep(0.5)
                with contextlib.suppress(OSError):
                    tls.sendall(b" ")
            status, body = _read_response(tls)
            assert status == 408 and b"did not arrive within 1 s" in body
            assert time.monotonic() - started < 5
    finally:
        server.stop()


def test_a_request_line_and_headers_that_drip_in_are_cut_off(pki: Path) -> None:
    """One deadline from a request's first byte: a client sending a header byte every 0.3 s (each read in time)
    is cut off at it, as is one that sends half a request line and waits."""
    server = _server(pki, request_timeout_s=1.0).start()
    try:
        with _raw(server, pki) as dripping, _raw(server, pki) as waiting:
            waiting.sendall(b"POST /valid")
            dripping.sendall(f"POST {REVIEW_PATH} HTTP/1.1\r\nHost: x\r\n".encode())
            started = time.monotonic()
            closed = False
            for byte in b"X-Slow: " + b"a" * 20:
                time.sleep(0.3)
                try:
                    dripping.sendall(bytes([byte]))
                except OSError:
                    closed = True
                    break
                if time.monotonic() - started > 4:
                    break
            data = b""
            with contextlib.suppress(OSError):
                data = dripping.recv(4096)
            assert closed or data == b"" or b" 408 " in data, data
            assert time.monotonic() - started < 4, "the dripping headers held the connection past the deadline"
            waiting.settimeout(3)
            answer = b""
            with contextlib.suppress(OSError):
                answer = waiting.recv(4096)
            assert answer == b"" or b" 408 " in answer, answer
            assert time.monotonic() - started < 4, "half a request line held the connection past the deadline"
    finally:
        server.stop()


@contextlib.contextmanager
def dripping(count: int, connect: Callable[[], socket.socket], request_line: bytes) -> Iterator[None]:
    """`count` clients, each connected by `connect`, sending `request_line` then a header byte every 0.2 s until
    the block ends (or the server closes them)."""
    stop = threading.Event()

    def drip() -> None:
        with contextlib.suppress(OSError), connect() as sock:
            sock.sendall(request_line)
            while not stop.wait(0.2):
                sock.sendall(b"a")

    threads = [threading.Thread(target=drip, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)


def test_slow_and_idle_clients_do_not_lock_reviews_out(pki: Path) -> None:
    """More slow-header and idle clients than the server has connections: reviews still get through (the
    oldest idle connection, else the slowest request, makes room), and none of the flood's connections is kept
    past its deadline."""
    server = _server(pki, max_connections=16, max_per_peer=16, request_timeout_s=5.0).start()
    idle = [_raw(server, pki) for _ in range(20)]
    try:
        with dripping(20, lambda: _raw(server, pki), f"POST {REVIEW_PATH} HTTP/1.1\r\n".encode()):
            time.sleep(1.5)  # every dripper is in its request, older than the server's pressure_s
            for _ in range(5):
                started = time.monotonic()
                assert _post(_connect(server, pki), REVIEW)[0] == 200
                assert time.monotonic() - started < 3
            assert server._server.connections() <= 16
    finally:
        for tls in idle:
            tls.close()
        server.stop()


def test_an_integer_pythons_parser_refuses_is_a_400(webhook: WebhookServer, pki: Path) -> None:
    body = json.dumps(REVIEW).replace('"uid": ', '"big": ' + "9" * 5000 + ', "uid": ', 1).encode()
    assert b"9" * 5000 in body
    status, out = _post(_connect(webhook, pki), body)
    assert status == 400 and "not JSON this webhook can read" in out["error"] and "4300" in out["error"]


def test_stalled_handshakes_and_plain_http_do_not_block_others(webhook: WebhookServer, pki: Path) -> None:
    stalled = [socket.create_connection(("127.0.0.1", webhook.port), timeout=10) for _ in range(3)]
    try:
        with socket.create_connection(("127.0.0.1", webhook.port), timeout=10) as plain:
            plain.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                answer = plain.recv(1024)
            except ConnectionResetError:
                answer = b""
            assert b"200" not in answer  # no HTTP answer without TLS
        started = time.monotonic()
        assert _post(_connect(webhook, pki), REVIEW)[0] == 200
        assert time.monotonic() - started < 3
    finally:
        for s in stalled:
            s.close()


def test_at_the_cap_the_oldest_idle_connection_makes_room_and_busy_ones_do_not(pki: Path) -> None:
    server = _server(pki, max_connections=2, max_per_peer=2, pressure_s=30.0).start()
    try:
        oldest, newer = _raw(server, pki), _raw(server, pki)  # handshaken, idle: each holds a slot
        wait_until("two connections counted", lambda: server._server.connections() == 2, timeout=5)
        assert _post(_connect(server, pki), REVIEW)[0] == 200  # took the oldest's place
        assert oldest.recv(1) == b""  # closed by the server
        newer.close()
        busy = [_raw(server, pki) for _ in range(2)]
        for tls in busy:  # half a request each: busy, and younger than pressure_s
            tls.sendall(f"POST {REVIEW_PATH} HTTP/1.1\r\n".encode())
        wait_until("two requests in progress", lambda: server._server.connections() == 2, timeout=5)
        time.sleep(0.3)
        with pytest.raises((ssl.SSLError, OSError)):
            _raw(server, pki).recv(1)  # refused: nothing to close for it
        for tls in busy:
            tls.close()

        def serves() -> bool:
            try:
                return _post(_connect(server, pki), REVIEW)[0] == 200
            except (ssl.SSLError, OSError):
                return False

        wait_until("the server serves again once the connections are closed", serves, timeout=10)
    finally:
        server.stop()


def test_an_internal_error_is_a_500(webhook: WebhookServer, pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(body: Any, driver: str) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(server_module, "judge", broken)
    status, out = _post(_connect(webhook, pki), REVIEW)
    assert status == 500 and "internal error" in out["error"]


def test_the_cli_serves_until_sigterm(pki: Path, tmp_path: Path) -> None:
    port = free_port()
    args = ["--tls-cert", str(pki / "tls.crt"), "--tls-key", str(pki / "tls.key"), "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "dra_driver", "-v", "webhook", *args, "--bind", "127.0.0.1", "--driver", DRIVER],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def healthy() -> bool:
            try:
                conn = http.client.HTTPSConnection("127.0.0.1", port, context=_client_context(pki), timeout=2)
                conn.request("GET", HEALTH_PATH)
                return conn.getresponse().status == 200
            except OSError:
                return False

        wait_until("dra-driver webhook answers /healthz", healthy, timeout=30)
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=_client_context(pki), timeout=10)
        assert _post(conn, REVIEW)[1]["response"]["allowed"] is False
        proc.send_signal(signal.SIGTERM)
        assert healthy(), "it stopped serving at once: no grace for the Service to drop the pod"
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0, stderr
        assert f"validating {DRIVER} configs on https://127.0.0.1:{port}" in stderr
        assert "denied ResourceClaim ns/c" in stderr and "invalid GpuConfig" in stderr  # -v: denials are logged
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    missing = subprocess.run(
        [sys.executable, "-m", "dra_driver", "webhook", "--tls-cert", str(tmp_path / "no.crt"), "--tls-key", "k"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1 and missing.stderr.startswith("dra-driver: error:"), missing.stderr
