"""The node daemon's and the webhook's HTTP endpoints under slow, idle and hostile clients (issue 39): floods of
idle connections and of requests whose headers drip in, against the metrics endpoint of a daemon whose descriptor
limit is low (256, as low as the hard limit lets nothing raise it) and against the webhook, while claims are
prepared and unprepared through the kubelet's socket. Every prepare succeeds, and both endpoints keep answering
well-behaved clients."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from dra_driver.slices.attributes import DEFAULT_DRIVER_NAME as DRIVER
from dra_driver.webhook.server import REVIEW_PATH, WebhookServer
from tests.cluster.controlplane import free_port
from tests.kubelet_harness import KubeletHarness
from tests.plugin_helpers import GPU_CLASS, claim, ref
from tests.polling import wait_for
from tests.test_publisher import pool_complete
from tests.test_webhook_server import REVIEW, _client_context, _connect, _post, dripping, pki  # noqa: F401 (pki: the fixture)

NODE = "hostile-node"
NOFILE = 256
IDLE = 600  # connections that connect and send nothing: more than the daemon's descriptors
DRIPPING = 40  # requests whose request line and headers arrive a byte every 0.2 s


def _limit_descriptors() -> None:  # in the daemon's process, before it starts: soft = hard, so it stays
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def _idle(address: tuple[str, int], count: int) -> list[socket.socket]:
    """Up to `count` connections that send nothing, one after another as a client would open them; it stops
    after three in a row that the server does not take within a second (its backlog full)."""
    held: list[socket.socket] = []
    failures = 0
    while len(held) < count and failures < 3:
        try:
            held.append(socket.create_connection(address, timeout=1))
            failures = 0
        except OSError:
            failures += 1
    return held


def _scrape(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            return resp.status == 200 and b"dra_driver_prepare" in resp.read()
    except OSError:
        return False


def test_floods_on_metrics_and_webhook_fail_no_prepare(control_plane, tmp_path: Path, pki: Path) -> None:  # noqa: F811
    cp = control_plane
    cp.create_node(NODE)
    sockets = Path(f"/tmp/dra-hostile-{os.getpid()}")
    port = free_port()
    cmd = [sys.executable, "-m", "dra_driver", "plugin", "--sim", "dgx-a100", "--mode", "static",
           "--sim-state", str(tmp_path / "gpu"), "--node-name", NODE, "--kubeconfig", str(cp.kubeconfig),
           "--plugin-dir", str(sockets / "plugin"), "--registry-dir", str(sockets / "registry"),
           "--cdi-root", str(tmp_path / "cdi"), "--metrics-port", str(port)]  # fmt: skip
    daemon = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=_limit_descriptors
    )
    webhook = WebhookServer(DRIVER, pki / "tls.crt", pki / "tls.key", address="127.0.0.1", port=0).start()
    kubelet = KubeletHarness(sockets / "registry", DRIVER)
    held: list[socket.socket] = []
    floods = contextlib.ExitStack()  # the dripping clients, stopped at the end
    try:
        wait_for("pool published", lambda: pool_complete(cp, NODE, 1, 1), timeout=60)
        kubelet.register()
        cp.apply({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "hostile-gpu"},
                  "spec": GPU_CLASS["spec"]})  # fmt: skip
        tls = _client_context(pki)
        floods.enter_context(dripping(DRIPPING, lambda: socket.create_connection(("127.0.0.1", port), timeout=10),
                                      b"GET /metrics HTTP/1.1\r\n"))  # fmt: skip
        floods.enter_context(dripping(DRIPPING, lambda: tls.wrap_socket(
            socket.create_connection(("127.0.0.1", webhook.port), timeout=10), server_hostname="127.0.0.1"),
            f"POST {REVIEW_PATH} HTTP/1.1\r\n".encode()))  # fmt: skip
        held = _idle(("127.0.0.1", port), IDLE) + _idle(("127.0.0.1", webhook.port), IDLE // 4)
        time.sleep(1.5)  # the drippers are in their requests, and older than the servers' pressure_s

        for i in range(12):  # prepares and unprepares go on, each on a GPU of its own
            c = cp.create_allocated(claim([f"gpu-{i % 8}"], name=f"hostile-{i}", device_class="hostile-gpu",
                                          pool=NODE))  # fmt: skip
            c_ref = ref(c)
            result = kubelet.prepare([c_ref])[c_ref.uid]
            assert result.error == "", f"prepare {i} under the flood: {result.error}"
            assert kubelet.unprepare([c_ref]) == {c_ref.uid: ""}
            cp.delete("resourceclaims", c_ref.name)
            if i % 4 == 0:  # well-behaved clients are answered meanwhile
                started = time.monotonic()
                assert _scrape(port), "the metrics endpoint did not answer a scrape under the flood"
                assert _post(_connect(webhook, pki), REVIEW)[0] == 200
                assert time.monotonic() - started < 5
        assert daemon.poll() is None
    finally:
        floods.close()
        for s in held:
            s.close()
        kubelet.close()
        webhook.stop()
        daemon.send_signal(signal.SIGTERM)
        out, _ = daemon.communicate(timeout=60)
        cp.delete("resourceslices", wait=120, field_selector=f"spec.nodeName={NODE}")
        cp.delete_node(NODE)
    assert daemon.returncode == 0, out[-3000:]
    assert "Too many open files" not in out, out[-3000:]
