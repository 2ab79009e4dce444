"""A real Prometheus for tests: Debian's `prometheus` binary, run by the test on loopback with its own config,
storage in a temporary directory, a fast scrape and rule evaluation interval, and the given rule files.

    with PrometheusServer(tmp_path / "prom", targets=["127.0.0.1:8080"], rules_text=rules_yaml()) as prom:
        prom.wait_scraped(1)
        prom.url  # http://127.0.0.1:<port>

Never started through systemd: the package's service (if the host's policy let it start) is left alone.
Without the binary, `require_prometheus()` skips the test, or fails it under DRA_K8S_REQUIRE=1 (.ci/run).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
import yaml

from tests.polling import wait_for, wait_until
from tests.processes import stop


def require_prometheus() -> str:
    path = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)
    if path is None:
        if os.environ.get("DRA_K8S_REQUIRE") == "1":
            pytest.fail("DRA_K8S_REQUIRE=1 but Prometheus is not installed (apt-get install prometheus)")
        pytest.skip("Prometheus is not installed (Debian: apt-get install prometheus)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusServer:
    def __init__(
        self, workdir: Path, targets: list[str], *, rules_text: str | None = None, interval: str = "1s"
    ) -> None:
        self.binary = require_prometheus()
        self.workdir = workdir
        self.targets = targets
        self.rules_text = rules_text
        self.interval = interval
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def _config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "scrape_configs": [
                {
                    "job_name": "dra-driver",
                    "scrape_timeout": self.interval,
                    "static_configs": [{"targets": self.targets}],
                }
            ],
        }
        if self.rules_text is not None:
            (self.workdir / "rules.yaml").write_text(self.rules_text)
            config["rule_files"] = [str(self.workdir / "rules.yaml")]
        return config

    def start(self) -> PrometheusServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(self._config()))
        log = (self.workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                "--storage.tsdb.retention.time=1h",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        wait_until("Prometheus ready", self._ready, timeout=30)
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"Prometheus exited: {self.log()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def log(self) -> str:
        path = self.workdir / "prometheus.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as r:
            return json.loads(r.read())

    def targets_up(self) -> int:
        active = self.get("/api/v1/targets")["data"]["activeTargets"]
        return sum(1 for t in active if t["health"] == "up")

    def wait_scraped(self, count: int, timeout: float = 30) -> None:
        wait_for(f"{count} target(s) scraped", lambda: self.targets_up() >= count, timeout=timeout)

    def stop(self) -> None:
        if self.proc is None:
            return
        stop(self.proc, timeout=15)
        self.proc = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self.stop()


class MetricsWatch:
    """Scrapes `scrape` back to back in a thread until stopped: how many answered, and the errors of those that
    did not."""

    def __init__(self, scrape: Callable[[], str]) -> None:
        self.scrape = scrape
        self.answered, self.failed = 0, []  # type: int, list[str]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scrapes", daemon=True)

    def start(self) -> MetricsWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if "dra_driver_" in self.scrape():
                    self.answered += 1
                else:
                    self.failed.append("an answer without the driver's metrics")
            except OSError as e:
                self.failed.append(str(e))
            self._stop.wait(0.05)

    def stop(self) -> tuple[int, list[str]]:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.answered, self.failed
