"""The one-command cluster as a user runs it: `python -m tests.cluster up --real-node` in a subprocess (control plane,
a real node on this machine, the driver deployed from its image by its Helm chart), then kubectl and
`dra-driver demo --kubeconfig` against what it printed, then SIGTERM: it exits 0 and leaves nothing behind."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from tests.cluster.controlplane import REPO_ROOT
from tests.cluster.driver import DRIVER_NAME

# Another session's real node makes `up` wait for the machine (tests/cluster/node.py NODE_LOCK): give it time, and
# make `up` give up (and say so) before this test's own timeout.
LOCK_WAIT = 900
READY_TIMEOUT = LOCK_WAIT + 600  # a cold driver image build counts too
pytestmark = pytest.mark.timeout(READY_TIMEOUT + 600)


def _lines(stream: IO[str], into: queue.Queue[str | None]) -> None:
    for line in stream:
        into.put(line.rstrip("\n"))
    into.put(None)


class Up:
    """The `up --real-node` subprocess: its stdout lines as they come, its stderr in a file."""

    def __init__(self, log: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG" and not k.startswith("KUBERNETES_SERVICE_")}
        env["DRA_TEST_NODE_LOCK_TIMEOUT"] = str(LOCK_WAIT)
        self.log = log
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.cluster", "up", "--real-node"],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        self.stdout: queue.Queue[str | None] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=_lines, args=(self.proc.stdout, self.stdout), daemon=True).start()

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_kubeconfig(self, timeout: float) -> Path:
        """The path `up` prints on stdout once everything is ready."""
        try:
            line = self.stdout.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no KUBECONFIG line in {timeout:.0f}s:\n{self.stderr()[-6000:]}") from None
        assert line is not None, f"up exited ({self.proc.wait()}) before it was ready:\n{self.stderr()[-6000:]}"
        return Path(line)

    def printed(self, pattern: str) -> str:
        found = re.search(pattern, self.stderr(), re.MULTILINE)
        assert found, f"{pattern!r} not in up's output:\n{self.stderr()}"
        return found.group(1)

    def terminate(self, timeout: float = 180.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)


@pytest.fixture
def up(node_binaries: Path, no_shared_node: None, tmp_path: Path) -> Iterator[Up]:
    """`node_binaries`: skipped where a real node cannot run here (root, runc, cgroups), the binaries built first."""
    u = Up(tmp_path / "up.stderr")
    try:
        yield u
    finally:
        if u.proc.poll() is None:
            u.proc.send_signal(signal.SIGTERM)
            try:
                u.proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                u.proc.kill()  # its children die with it (PR_SET_PDEATHSIG); the host may keep leftovers
                u.proc.wait()


def _processes_naming(*paths: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(p in argv for p in paths):
            found.append(f"{entry.name}: {argv[:200]}")
    return found


def _dra_driver() -> list[str]:
    script = Path(sys.executable).parent / "dra-driver"  # what `pip install` put next to the interpreter
    return [str(script)] if script.exists() else [sys.executable, "-m", "dra_driver"]


def test_up_real_node_runs_the_demo_and_cleans_up(up: Up) -> None:
    began = time.monotonic()
    kubeconfig = up.wait_kubeconfig(READY_TIMEOUT)
    ready = time.monotonic() - began
    assert up.printed(r"^export KUBECONFIG=(\S+)$") == str(kubeconfig)
    kubectl = Path(up.printed(r"^kubectl: (\S+)$"))
    helm = Path(up.printed(r"^helm: (\S+)$"))
    assert kubectl.is_file() and helm.is_file()
    node_work, node_state = up.printed(r"work dir (/\S+), state"), up.printed(r", state (/\S+)$")
    cp_work = up.printed(r"cluster work dir (\S+)$")
    assert node_state.startswith("/run/dn-"), node_state

    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    slices = subprocess.run(
        [str(kubectl), "get", "resourceslices", "--no-headers"], env=env, capture_output=True, text=True, timeout=60
    )
    assert slices.returncode == 0, slices.stderr
    rows = [line.split() for line in slices.stdout.splitlines()]
    assert len(rows) == 10, slices.stdout  # a DGX H100, partitionable: counter sets, whole GPUs, 8 GPUs' partitions
    assert {(r[1], r[2], r[3]) for r in rows} == {("dra-node", DRIVER_NAME, "dra-node")}, slices.stdout
    released = subprocess.run([str(helm), "list", "-A"], env=env, capture_output=True, text=True, timeout=60)
    assert "dra-driver" in released.stdout and "deployed" in released.stdout, released.stdout + released.stderr

    demo = subprocess.run(
        [*_dra_driver(), "demo", "--kubeconfig", str(kubeconfig)], capture_output=True, text=True, timeout=300
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    out = demo.stdout
    assert "on 1 node(s): dra-node" in out, out
    assert "4 pods Running on dra-node" in out, out
    table = [row for row in (line.split() for line in out.splitlines()) if row[2:3] == ["dra-node"]]
    assert len(table) == 6 and all(row[4] == "Running" for row in table), out  # six devices of four claims
    assert all(row[5].startswith(f"k8s.{DRIVER_NAME}/claim=") and row[6] == "(Healthy)" for row in table), out
    assert "why is claim nine-gpus Pending?" in out and "wants 9" in out
    assert "pods Running" in out.splitlines()[-1], out

    stopping = time.monotonic()
    assert up.terminate() == 0, up.stderr()[-6000:]
    stopped = time.monotonic() - stopping
    assert "stopping" in up.stderr()
    for path in (node_work, node_state, cp_work):
        assert not Path(path).exists(), f"{path} left behind"
    assert _processes_naming(node_work, node_state, cp_work) == []
    print(f"up --real-node ready in {ready:.0f}s (lock waits included), stopped in {stopped:.1f}s")
