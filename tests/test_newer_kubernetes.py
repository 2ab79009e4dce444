"""A Kubernetes minor newer than the driver knows (1.38 ships 2026-12-16): the node daemon, whose API server says it
is 1.38, publishes the newest layout it knows (1.37's), which the server accepts, and says so in one log line.

The API server is the real 1.37 one behind a small reverse proxy that answers GET /version as 1.38 and passes every
other request (watches included, streamed) through unchanged."""

from __future__ import annotations

import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from dra_driver.kube.rest import connect
from dra_driver.slices.limits import MAX_MINOR
from tests.polling import wait_for
from tests.test_publisher import pool, pool_complete

NODE = "newer-node"
NEWER = MAX_MINOR + 1


class _Proxy(BaseHTTPRequestHandler):
    server: _ProxyServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        upstream = http.client.HTTPSConnection(self.server.host, self.server.port, context=self.server.tls, timeout=600)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        upstream.request(self.command, self.path, body=body, headers=headers)
        resp = upstream.getresponse()
        if self.path.split("?")[0] == "/version" and resp.status == 200:
            info = json.loads(resp.read())
            info.update(minor=str(NEWER), gitVersion=f"v1.{NEWER}.0")
            data = json.dumps(info).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            upstream.close()
            return
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(k, v)
        self.send_header("Transfer-Encoding", "chunked")  # watches stream: pass each piece on as it comes
        self.end_headers()
        try:
            while chunk := resp.read1(65536):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        finally:
            upstream.close()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str, tls: ssl.SSLContext) -> None:
        url = urlsplit(upstream)
        self.host, self.port, self.tls = url.hostname or "127.0.0.1", url.port or 443, tls
        super().__init__(("127.0.0.1", 0), _Proxy)


@pytest.fixture
def newer_server(control_plane: Any, tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig for the proxy (plain HTTP on loopback: the proxy holds the admin's credentials)."""
    cp = control_plane
    tls = ssl.create_default_context(cafile=str(cp.pki.ca_cert))
    tls.load_cert_chain(str(cp.pki.client_cert), str(cp.pki.client_key))
    proxy = _ProxyServer(cp.server, tls)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "newer.kubeconfig"
    server = f"http://127.0.0.1:{proxy.server_address[1]}"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    try:
        yield kubeconfig
    finally:
        proxy.shutdown()
        proxy.server_close()


def test_a_newer_minor_gets_the_newest_layout_and_one_line(
    control_plane: Any, newer_server: Path, tmp_path: Path
) -> None:
    cp = control_plane
    assert connect(newer_server).version() == f"1.{NEWER}"
    cp.create_node(NODE)
    sockets = Path(f"/tmp/dra-newer-{os.getpid()}")
    cmd = [sys.executable, "-m", "dra_driver", "plugin", "--sim", "dgx-h100", "--mode", "partitionable",
           "--sim-state", str(tmp_path / "gpu"), "--node-name", NODE, "--kubeconfig", str(newer_server),
           "--plugin-dir", str(sockets / "plugin"), "--registry-dir", str(sockets / "registry"),
           "--cdi-root", str(tmp_path / "cdi")]  # fmt: skip
    daemon = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for("the pool published", lambda: bool(pool(cp, NODE)) and pool_complete(cp, NODE, len(pool(cp, NODE))))
        slices = pool(cp, NODE)
        devices = [d for s in slices for d in s["spec"].get("devices") or []]
        # 1.37's layout: the standard numaNode attribute, counter sets in slices of their own
        assert all(
            "resource.kubernetes.io/numaNode" in d.get("attributes", {}) for d in devices if "mig" not in d["name"]
        )
        assert any(s["spec"].get("sharedCounters") for s in slices)
    finally:
        daemon.send_signal(signal.SIGTERM)
        out, _ = daemon.communicate(timeout=60)
        cp.delete("resourceslices", wait=120, field_selector=f"spec.nodeName={NODE}")
        cp.delete_node(NODE)
    assert daemon.returncode == 0, out[-3000:]
    said = [line for line in out.splitlines() if "newer than this driver knows" in line]
    assert len(said) == 1, out[-3000:]
    assert f"Kubernetes 1.{NEWER} is newer than this driver knows" in said[0]
    assert f"publishing the 1.{MAX_MINOR} layout" in said[0]
    assert [line for line in out.splitlines() if "WARNING" in line.upper()] == said, out[-3000:]  # and no other
