"""dra_driver.kube: the daemon's own REST client against a real API server, configured every way a node daemon is
(kubeconfig with files, with inline data, with a token or a token file, the pod's service account, a kubeconfig
only the official client understands), its errors and its watch. That the daemon never imports the official
client: tests/test_perf_startup.py."""

from __future__ import annotations

import base64
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.kube import ApiError, KubeRest, connect, in_cluster, load_kubeconfig, path_of
from dra_driver.kube.config import UnsupportedKubeconfig
from tests.cluster.controlplane import ControlPlane, primary_version

NS = "kube-rest"


def _write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _kubeconfig(cp: ControlPlane, cluster: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": cp.server, **cluster}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


@pytest.fixture(scope="module")
def token(control_plane: ControlPlane) -> Iterator[str]:
    """A service account token that may read deviceclasses and nothing else."""
    cp = control_plane
    cp.create_namespace(NS)
    cp.kubectl("create", "serviceaccount", "reader", "-n", NS)
    cp.kubectl("create", "clusterrole", "kube-rest-reader", "--verb=get,list", "--resource=deviceclasses")
    cp.kubectl("create", "clusterrolebinding", "kube-rest-reader", "--clusterrole=kube-rest-reader",
               f"--serviceaccount={NS}:reader")  # fmt: skip
    yield cp.kubectl("create", "token", "reader", "-n", NS).stdout.strip()
    cp.delete("namespace", NS, missing_ok=False)
    cp.kubectl("delete", "clusterrolebinding,clusterrole", "kube-rest-reader")


def test_a_kubeconfig_with_files_relative_to_it(control_plane: ControlPlane, tmp_path: Path) -> None:
    pki = control_plane.pki
    for name, src in (("ca.crt", pki.ca_cert), ("client.crt", pki.client_cert), ("client.key", pki.client_key)):
        (tmp_path / name).write_bytes(src.read_bytes())
    user = {"client-certificate": "client.crt", "client-key": "client.key"}
    path = _write(tmp_path / "kubeconfig", _kubeconfig(control_plane, {"certificate-authority": "ca.crt"}, user))
    rest = KubeRest(load_kubeconfig(path))
    assert rest.version() == primary_version().removeprefix("v").rsplit(".", 1)[0]
    assert rest.get(path_of("", "v1", "namespaces", "default"))["metadata"]["name"] == "default"


def test_a_kubeconfig_with_inline_data_leaves_no_key_file_behind(control_plane: ControlPlane, tmp_path: Path) -> None:
    pki = control_plane.pki
    path = _write(tmp_path / "kubeconfig", _kubeconfig(
        control_plane, {"certificate-authority-data": _b64(pki.ca_cert)},
        {"client-certificate-data": _b64(pki.client_cert), "client-key-data": _b64(pki.client_key)}))  # fmt: skip
    before = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("dra-kube-*"))
    rest = KubeRest(load_kubeconfig(path))
    assert set(Path(os.environ.get("TMPDIR", "/tmp")).glob("dra-kube-*")) == before  # the key was loaded and deleted
    assert rest.get(path_of("", "v1", "namespaces", "default"))["metadata"]["name"] == "default"


def test_token_auth_and_the_api_servers_refusal(control_plane: ControlPlane, token: str, tmp_path: Path) -> None:
    ca = {"certificate-authority": str(control_plane.pki.ca_cert)}
    rest = KubeRest(load_kubeconfig(_write(tmp_path / "k", _kubeconfig(control_plane, ca, {"token": token}))))
    assert rest.get(path_of("resource.k8s.io", "v1", "deviceclasses"))["kind"] == "DeviceClassList"
    with pytest.raises(ApiError) as refused:
        rest.get(path_of("", "v1", "nodes"))
    assert refused.value.status == 403
    assert f'User "system:serviceaccount:{NS}:reader" cannot list resource "nodes"' in refused.value.message
    with pytest.raises(ApiError) as missing:
        rest.get(path_of("resource.k8s.io", "v1", "deviceclasses", "no-such-class"))
    assert missing.value.status == 404 and 'deviceclasses.resource.k8s.io "no-such-class" not found' in str(
        missing.value
    )


def test_a_token_file_is_read_again_when_it_rotates(
    control_plane: ControlPlane, token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dra_driver.kube import config as config_module

    (tmp_path / "token").write_text("not-a-token\n")
    ca = {"certificate-authority": str(control_plane.pki.ca_cert)}
    rest = KubeRest(load_kubeconfig(_write(tmp_path / "k", _kubeconfig(control_plane, ca, {"tokenFile": "token"}))))
    with pytest.raises(ApiError) as unauthorized:
        rest.get(path_of("resource.k8s.io", "v1", "deviceclasses"))
    assert unauthorized.value.status == 401
    (tmp_path / "token").write_text(token + "\n")  # the kubelet rotated it
    monkeypatch.setattr(config_module, "TOKEN_REREAD_S", 0.0)
    assert rest.get(path_of("resource.k8s.io", "v1", "deviceclasses"))["kind"] == "DeviceClassList"


def test_in_cluster_configuration_from_the_service_account_files(
    control_plane: ControlPlane, token: str, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(token)
    (tmp_path / "ca.crt").write_bytes(control_plane.pki.ca_cert.read_bytes())
    port = control_plane.server.rsplit(":", 1)[1]
    config = in_cluster(tmp_path, env={"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port})
    assert config.server == control_plane.server
    assert KubeRest(config).get(path_of("resource.k8s.io", "v1", "deviceclasses"))["kind"] == "DeviceClassList"
    with pytest.raises(ValueError, match="not running in a pod"):
        in_cluster(tmp_path, env={})
    assert in_cluster(
        tmp_path, env={"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    ).server == ("https://[fd00::1]:443")


def test_an_exec_kubeconfig_goes_through_the_official_client(
    control_plane: ControlPlane, token: str, tmp_path: Path
) -> None:
    """Exec credential plugins (EKS, GKE) are the official client's business: connect() hands such a kubeconfig
    to it, and the token it gets is sent."""
    plugin = tmp_path / "credential-plugin"
    credential = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"token": token}}  # fmt: skip
    plugin.write_text(f"#!/bin/sh\necho '{json.dumps(credential)}'\n")
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    exec_user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin),
                          "interactiveMode": "Never"}}  # fmt: skip
    path = _write(tmp_path / "k", _kubeconfig(control_plane, {"certificate-authority": str(control_plane.pki.ca_cert)},
                                              exec_user))  # fmt: skip
    with pytest.raises(UnsupportedKubeconfig):
        load_kubeconfig(path)
    rest = connect(path)
    assert rest.get(path_of("resource.k8s.io", "v1", "deviceclasses"))["kind"] == "DeviceClassList"
    with pytest.raises(ApiError) as refused:
        rest.get(path_of("", "v1", "nodes"))
    assert refused.value.status == 403  # the token is the service account's, not an admin's


def test_watch_events_and_stop_from_another_thread(control_plane: ControlPlane) -> None:
    rest = connect(control_plane.kubeconfig)
    classes = path_of("resource.k8s.io", "v1", "deviceclasses")
    version = rest.get(classes)["metadata"]["resourceVersion"]
    watch = rest.watch(classes, resource_version=version, seconds=300)
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def consume() -> None:
        for kind, obj in watch:
            seen.append((kind, obj["metadata"]["name"]))
        done.set()

    threading.Thread(target=consume, daemon=True).start()
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "kube-rest-watch"}}
    rest.request("POST", classes, body=body)
    rest.request("DELETE", path_of("resource.k8s.io", "v1", "deviceclasses", "kube-rest-watch"))
    deadline = time.monotonic() + 10
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seen[:2] == [("ADDED", "kube-rest-watch"), ("DELETED", "kube-rest-watch")]
    start = time.monotonic()
    watch.stop()  # the server would end it only after 300 s
    assert done.wait(5)
    assert time.monotonic() - start < 2
    for _ in range(20):  # the stopped watch's connection, events unread, is never reused for another request
        assert rest.get(classes)["kind"] == "DeviceClassList"


def test_an_error_event_ends_the_watch_with_its_status() -> None:
    """What the API server sends for a resourceVersion that was compacted away: the caller relists."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from dra_driver.kube.config import ClusterConfig

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            added = {"type": "ADDED", "object": {"metadata": {"name": "a"}}}
            gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                                "message": "too old resource version: 1 (42)"}}  # fmt: skip
            self.wfile.write((json.dumps(added) + "\n" + json.dumps(gone) + "\n").encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rest = KubeRest(ClusterConfig(server=f"http://127.0.0.1:{server.server_address[1]}"))
        seen = []
        with pytest.raises(ApiError) as gone:
            for kind, obj in rest.watch("/apis/resource.k8s.io/v1/deviceclasses", resource_version="1", seconds=5):
                seen.append((kind, obj["metadata"]["name"]))
        assert seen == [("ADDED", "a")]
        assert gone.value.status == 410 and "too old resource version" in gone.value.message
    finally:
        server.shutdown()


def test_a_silent_api_server_times_out_once_without_retries() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        from dra_driver.kube.config import ClusterConfig

        rest = KubeRest(ClusterConfig(server=f"http://127.0.0.1:{listener.getsockname()[1]}"))
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="timed out"):
            rest.get("/version", timeout=0.5)
        assert time.monotonic() - start < 1.2  # one timeout, not four
    finally:
        listener.close()


class _KeepAlive:
    """An HTTP/1.1 server on loopback that keeps connections open; `close_after_answer` closes each one a moment
    after its first answer (an idle timeout), `hang_up_on_second` closes it on its second request without an
    answer (the server went away just as the request came). Records what it received."""

    def __init__(self, *, close_after_answer: bool = False, hang_up_on_second: bool = False) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        received = self.received = []  # type: list[str]

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            served = 0

            def handle_one_request(self) -> None:
                if hang_up_on_second and self.served == 1:
                    self.rfile.readline()  # the request line arrives; no answer
                    self.close_connection = True
                    return
                super().handle_one_request()
                self.served += 1
                if close_after_answer:
                    time.sleep(0.05)
                    self.close_connection = True

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                received.append(f"{self.command} {self.path}")
                body = json.dumps({"kind": "Status", "n": len(received)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        from dra_driver.kube.config import ClusterConfig

        self.rest = KubeRest(ClusterConfig(server=f"http://127.0.0.1:{self.server.server_address[1]}"))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_connection_the_server_closed_while_idle_is_not_used() -> None:
    """The API server closes keep-alive connections idle for 90 s: the next request, even a POST, which is never
    sent twice, goes out on a new connection instead of failing."""
    server = _KeepAlive(close_after_answer=True)
    try:
        assert server.rest.get("/a")["n"] == 1
        time.sleep(0.3)  # the server has closed it
        assert server.rest.request("POST", "/b", body={"x": 1})["n"] == 2
        assert server.received == ["GET /a", "POST /b"]
    finally:
        server.close()


def test_a_reused_connection_that_fails_resends_only_what_is_safe_to_send_twice() -> None:
    server = _KeepAlive(hang_up_on_second=True)
    try:
        assert server.rest.get("/a")["n"] == 1
        assert server.rest.get("/b")["n"] == 2  # hung up on the reused connection: sent again on a new one
        assert server.rest.get("/c")["n"] == 3  # the new connection's first request
        with pytest.raises(ConnectionError):  # a POST the server may have acted on: never sent twice
            server.rest.request("POST", "/d", body={})
        assert server.received == ["GET /a", "GET /b", "GET /c"]
    finally:
        server.close()
