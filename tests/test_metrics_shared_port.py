"""The metrics port on the node's network during a rolling update (dra_driver/metricsserver.py: SharedPortMetrics):
the pod holding the listening socket hands it to the next one, both serve the one queue, and the old one leaves
without a refused or reset scrape; beside an older version that hands nothing over, the new pod binds the port once it
is free instead of failing; a listener of another address is not taken."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter

from dra_driver.metricsserver import SharedPortMetrics, serve_metrics
from tests.polling import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def registry(name: str) -> CollectorRegistry:
    r = CollectorRegistry()
    Counter(f"dra_driver_{name}", "which process answered", registry=r).inc()
    return r


def scrape(port: int) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


class Scraper:
    """Scrapes back to back from two threads (below the endpoint's 4 connections per peer, whose bookkeeping lags a
    closed connection by a moment): which server answered, and every failure."""

    def __init__(self, port: int, threads: int = 2) -> None:
        self.port, self.seen, self.failed = port, [], []  # type: int, list[str], list[str]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                body = scrape(self.port)
                self.seen.append("old" if "dra_driver_old" in body else "new" if "dra_driver_new" in body else "?")
            except OSError as e:
                self.failed.append(repr(e))

    def __enter__(self) -> Scraper:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)


def test_two_pods_share_the_port_and_the_old_one_leaves_without_a_failed_scrape(tmp_path: Path) -> None:
    port, handoff = free_port(), tmp_path / "metrics-handoff.sock"
    old = SharedPortMetrics(port, "127.0.0.1", handoff, registry("old")).start()
    assert not old.handed_over  # the first pod binds the port itself
    new: SharedPortMetrics | None = None
    try:
        with Scraper(port) as scraper:
            time.sleep(0.3)
            new = SharedPortMetrics(port, "127.0.0.1", handoff, registry("new")).start()
            assert new.handed_over and new.server is not None  # the old pod's listener, served at once
            wait_until("both answering", lambda: {"old", "new"} <= set(scraper.seen[-200:]), timeout=10)
            old.stop()
            answered = len(scraper.seen)
            wait_until("only the new one answering", lambda: len(scraper.seen) > answered + 100, timeout=10)
        assert not scraper.failed, scraper.failed[:5]
        assert set(scraper.seen[answered + 20 :]) == {"new"}
        assert handoff.exists()  # the new pod's, for the pod after it
    finally:
        old.stop()
        if new is not None:
            new.stop()
    assert not handoff.exists()  # the last pod leaves no socket file


def test_beside_a_version_that_hands_nothing_over_the_new_pod_binds_once_the_port_is_free(tmp_path: Path) -> None:
    port = free_port()
    plain = serve_metrics(port, "127.0.0.1", registry("old"))  # an older pod: no handoff socket
    shared = SharedPortMetrics(port, "127.0.0.1", tmp_path / "metrics-handoff.sock", registry("new")).start()
    try:
        assert shared.server is None  # refused for now: not an error, the plugin goes on
        assert "dra_driver_old" in scrape(port)
        plain.shutdown()
        plain.server_close()
        wait_until("the new pod serving", lambda: shared.server is not None, timeout=5)
        assert "dra_driver_new" in scrape(port)
    finally:
        shared.stop()


def test_a_listener_on_another_address_is_not_taken_over(tmp_path: Path) -> None:
    # a pod with a network of its own would hand over a socket of its own address: the next one binds its own
    port, handoff = free_port(), tmp_path / "metrics-handoff.sock"
    other = SharedPortMetrics(port, "127.0.0.2", handoff, registry("old")).start()
    mine = SharedPortMetrics(port, "127.0.0.1", handoff, registry("new")).start()
    try:
        assert not mine.handed_over and mine.server is not None
        assert mine.server.server_address[:2] == ("127.0.0.1", port)
        assert "dra_driver_new" in scrape(port)
    finally:
        mine.stop()
        other.stop()


def test_without_sharing_a_taken_port_still_fails_at_once() -> None:
    port = free_port()
    plain = serve_metrics(port, "127.0.0.1", registry("old"))
    try:
        try:
            serve_metrics(port, "127.0.0.1", registry("new"))
        except OSError as e:
            assert "in use" in str(e)
        else:
            raise AssertionError("a second plain server bound a taken port")
    finally:
        plain.shutdown()
        plain.server_close()
