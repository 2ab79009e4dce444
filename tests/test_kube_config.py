"""dra_driver.kube.config: every kubeconfig field is honoured or refused, never dropped: impersonation headers, the
TLS server name (a loopback TLS server whose certificate names a DNS name, not its IP), proxies (proxy-url and the
environment's, through a loopback CONNECT proxy), unknown fields; and a 401 re-reads the token once."""

from __future__ import annotations

import base64
import json
import select
import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from dra_driver.kube import ApiError, KubeRest, connect, in_cluster, load_kubeconfig
from dra_driver.kube.config import UnsupportedKubeconfig
from tests.cluster.controlplane import issue_cert, make_ca
from tests.loopback import serve_each

SERVER_NAME = "api.example.test"  # the only name in the test server's certificate: no IP address


class Recorder:
    """An HTTP server on loopback (TLS with `context`) that answers every GET with {"n": <count>} and records each
    request's headers; `accept` decides which Authorization is let in (401 otherwise)."""

    def __init__(self, context: ssl.SSLContext | None = None, accept: str | None = None) -> None:
        seen = self.seen = []  # type: list[list[tuple[str, str]]]

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(list(self.headers.items()))
                ok = accept is None or self.headers.get("Authorization") == accept
                body = json.dumps({"n": len(seen)} if ok else {"kind": "Status", "message": "Unauthorized"}).encode()
                self.send_response(200 if ok else 401)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if context is not None:
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ConnectProxy:
    """An HTTP proxy on loopback that opens CONNECT tunnels, every name resolving to 127.0.0.1 (so that only a
    request through it reaches api.example.test); records each CONNECT's head."""

    def __init__(self) -> None:
        self.heads: list[str] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        serve_each(self.listener, self._tunnel)

    def _tunnel(self, client: socket.socket) -> None:
        with client:
            head = b""
            while b"\r\n\r\n" not in head:
                head += client.recv(4096) or b"\r\n\r\n"
            self.heads.append(head.decode("latin-1"))
            port = int(head.split(b" ")[1].rsplit(b":", 1)[1])
            with socket.create_connection(("127.0.0.1", port)) as upstream:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                while True:
                    ready, _, _ = select.select([client, upstream], [], [], 10)
                    if not ready:
                        return
                    for sock in ready:
                        data = sock.recv(65536)
                        if not data:
                            return
                        (upstream if sock is client else client).sendall(data)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    make_ca(directory, "kube-config-test-ca")
    issue_cert(directory, "server", f"/CN={SERVER_NAME}", f"subjectAltName=DNS:{SERVER_NAME}\n")
    return directory


@pytest.fixture
def tls_server(pki: Path) -> Iterator[Recorder]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki / "server.crt", pki / "server.key")
    server = Recorder(context)
    server.sni = []  # type: ignore[attr-defined]
    context.sni_callback = lambda _sock, name, _ctx: server.sni.append(name)  # type: ignore[attr-defined]
    yield server
    server.close()


@pytest.fixture
def proxy() -> Iterator[ConnectProxy]:
    server = ConnectProxy()
    yield server
    server.close()


def _kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": cluster}], "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    return path


def test_impersonation_fields_become_impersonate_headers(tmp_path: Path) -> None:
    server = Recorder()
    try:
        user = {"token": "t", "as": "alice", "as-uid": "42", "as-groups": ["devs", "system:authenticated"],
                "as-user-extra": {"scopes": ["view", "edit"], "example.com/team": ["gpu"]}}  # fmt: skip
        path = _kubeconfig(tmp_path / "k", {"server": f"http://127.0.0.1:{server.port}"}, user)
        assert KubeRest(load_kubeconfig(path)).get("/version")["n"] == 1
        headers = [(k, v) for k, v in server.seen[0] if k.startswith("Impersonate-")]
        assert headers == [("Impersonate-User", "alice"), ("Impersonate-Uid", "42"),
                           ("Impersonate-Group", "devs"), ("Impersonate-Group", "system:authenticated"),
                           ("Impersonate-Extra-scopes", "view"), ("Impersonate-Extra-scopes", "edit"),
                           ("Impersonate-Extra-example.com%2Fteam", "gpu")]  # fmt: skip
    finally:
        server.close()
    with pytest.raises(ValueError, match="without as"):
        load_kubeconfig(_kubeconfig(tmp_path / "k", {"server": "http://127.0.0.1:1"}, {"as-groups": ["g"]}))


def test_unknown_or_unusable_fields_are_refused_by_name(tmp_path: Path) -> None:
    server = {"server": "https://127.0.0.1:6443"}
    refused = [
        ({**server, "frobnicate": True}, {}, "cluster field frobnicate"),
        (server, {"token": "t", "impersonate": "x"}, "user field impersonate"),
        (server, {"client-certificate": "c.crt"}, "client certificate without its key"),
        ({**server, "proxy-url": "socks5://127.0.0.1:1080"}, {}, "proxy-url.*only http://"),
        (server, {"exec": {"command": "x"}, "as": "alice"}, "impersonation with exec"),
    ]
    for cluster, user, message in refused:
        with pytest.raises(ValueError, match=message) as error:
            load_kubeconfig(_kubeconfig(tmp_path / "k", cluster, user))
        assert not isinstance(error.value, UnsupportedKubeconfig)  # not handed to the official client either
        with pytest.raises(ValueError, match=message):
            connect(tmp_path / "k")
    harmless = {**server, "disable-compression": True, "extensions": [{"name": "x", "extension": {}}]}
    assert load_kubeconfig(_kubeconfig(tmp_path / "k", harmless, {"token": "t"})).server == server["server"]


def test_tls_server_name_is_asked_for_and_checked(tmp_path: Path, pki: Path, tls_server: Recorder) -> None:
    """A server addressed by an IP that its certificate does not name: tls-server-name says what to expect."""
    cluster = {"server": f"https://127.0.0.1:{tls_server.port}", "certificate-authority": str(pki / "ca.crt")}
    without = KubeRest(load_kubeconfig(_kubeconfig(tmp_path / "k", cluster, {})))
    with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
        without.get("/version")
    named = _kubeconfig(tmp_path / "k", {**cluster, "tls-server-name": SERVER_NAME}, {})
    assert KubeRest(load_kubeconfig(named)).get("/version")["n"] == 1
    assert tls_server.sni == [None, SERVER_NAME]  # type: ignore[attr-defined]  # no SNI for an IP address
    wrong = _kubeconfig(tmp_path / "k", {**cluster, "tls-server-name": "other.example.test"}, {})
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        KubeRest(load_kubeconfig(wrong)).get("/version")


def test_proxy_url_tunnels_with_connect_and_credentials(
    tmp_path: Path, pki: Path, tls_server: Recorder, proxy: ConnectProxy
) -> None:
    """The API server's name is known to the proxy only: the connection can only have gone through it, TLS to
    the API server inside the tunnel."""
    cluster = {"server": f"https://{SERVER_NAME}:{tls_server.port}", "certificate-authority": str(pki / "ca.crt"),
               "proxy-url": proxy.url.replace("http://", "http://proxy%20user:s3cret@")}  # fmt: skip
    assert KubeRest(load_kubeconfig(_kubeconfig(tmp_path / "k", cluster, {}))).get("/version")["n"] == 1
    request_line, *fields = proxy.heads[0].split("\r\n")
    assert request_line == f"CONNECT {SERVER_NAME}:{tls_server.port} HTTP/1.1"
    credentials = base64.b64encode(b"proxy user:s3cret").decode()
    assert f"Proxy-Authorization: Basic {credentials}" in fields


def test_the_environments_proxy_unless_no_proxy_names_the_server(
    tmp_path: Path, pki: Path, tls_server: Recorder, proxy: ConnectProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = {"server": f"https://{SERVER_NAME}:{tls_server.port}", "certificate-authority": str(pki / "ca.crt")}
    path = _kubeconfig(tmp_path / "k", cluster, {})
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    assert KubeRest(load_kubeconfig(path)).get("/version")["n"] == 1
    assert len(proxy.heads) == 1
    monkeypatch.setenv("NO_PROXY", "10.0.0.0/8,.example.test")
    assert load_kubeconfig(path).proxy is None
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_bytes((pki / "ca.crt").read_bytes())
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "https_proxy": proxy.url}
    assert in_cluster(tmp_path, env=env).proxy is not None
    assert in_cluster(tmp_path, env={**env, "no_proxy": "10.96.0.0/12"}).proxy is None


def test_no_proxy_rules_as_go_has_them() -> None:
    from dra_driver.kube.proxy import bypassed, proxy_for

    env = {"HTTPS_PROXY": "proxy.corp:3128"}
    found = proxy_for("https://api.example.test:6443", None, env)
    assert found is not None and (found.host, found.port) == ("proxy.corp", 3128)
    assert proxy_for("http://api.example.test:6443", None, env) is None  # HTTP_PROXY for http://
    for host, port, no_proxy in [("127.0.0.1", 443, ""), ("localhost", 443, ""), ("::1", 443, ""),
                                 ("a.b.test", 443, "*"), ("a.b.test", 443, "b.test"), ("b.test", 443, "b.test"),
                                 ("a.b.test", 443, ".b.test"), ("a.b.test", 443, "*.b.test"),
                                 ("a.b.test", 6443, "x.test, b.test:6443"), ("10.1.2.3", 443, "10.0.0.0/8"),
                                 ("fd00::1", 443, "fd00::1"), ("fd00::1", 6443, "[fd00::1]:6443")]:  # fmt: skip
        assert bypassed(host, port, no_proxy), (host, port, no_proxy)
    for host, port, no_proxy in [("a.b.test", 443, ""), ("b.test", 443, ".b.test"), ("ab.test", 443, "b.test"),
                                 ("a.b.test", 443, "b.test:6443"), ("11.1.2.3", 443, "10.0.0.0/8")]:  # fmt: skip
        assert not bypassed(host, port, no_proxy), (host, port, no_proxy)


def test_a_401_reads_the_token_file_again_and_sends_once_more(tmp_path: Path, pki: Path) -> None:
    server = Recorder(accept="Bearer new")
    try:
        (tmp_path / "token").write_text("old\n")
        path = _kubeconfig(tmp_path / "k", {"server": f"http://127.0.0.1:{server.port}"}, {"tokenFile": "token"})
        config = load_kubeconfig(path)
        assert config.authorization() == "Bearer old"  # read, and kept for a minute
        (tmp_path / "token").write_text("new\n")  # the kubelet rotated it
        assert KubeRest(config).get("/version")["n"] == 2
        assert [dict(h)["Authorization"] for h in server.seen] == ["Bearer old", "Bearer new"]
        (tmp_path / "token").write_text("revoked\n")
        config = load_kubeconfig(path)
        with pytest.raises(ApiError) as refused:  # the token read again is the same: not sent again
            KubeRest(config).get("/version")
        assert refused.value.status == 401 and len(server.seen) == 3
    finally:
        server.close()
    (tmp_path / "token").write_text("old")
    (tmp_path / "ca.crt").write_bytes((pki / "ca.crt").read_bytes())
    config = in_cluster(tmp_path, env={"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"})
    (tmp_path / "token").write_text("new")
    config.reauthorize()  # what a 401 does: at once, not a minute after the last read
    assert config.authorization() == "Bearer new"
