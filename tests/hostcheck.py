"""pytest plugin (registered from tests/conftest.py): a test session leaves the host's network as it found it.

The controlling process (not a pytest-xdist worker) takes a snapshot of the host (tests.hoststate: addresses, routes,
links, the iptables/nftables ruleset, forwarding and the kubelet's sysctls) when the session starts, and another at
its end, once every worker, and with it every real node, has finished. Any difference is printed, and a session that
would have passed exits 1.

Snapshots are taken holding the real node's lock (tests/cluster/node.py NODE_LOCK), so that no session's node is in
one; while another session's node keeps it (DRA_HOST_CHECK_LOCK_WAIT seconds at the start, 5 by default, and ten
times that at the end) the check is off for this session, and says so. At the start, with the lock held, what a
killed session's node left is removed first (node.remove_killed_node_leftovers), which a node start would remove
anyway and would otherwise show as a difference.

DRA_HOST_CHECK=0 turns the check off. DRA_HOST_CHECK_NETNS=NAME checks that network namespace instead of the host,
without the lock or the removal (for tests of this plugin).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from tests import hoststate
from tests.cluster.node import lock_host, remove_killed_node_leftovers

SECTION = "host network check"


@dataclass
class _Check:
    before: hoststate.HostState | None = None
    off: str | None = None  # why there is no check this session
    removed: tuple[str, ...] = ()


_check = _Check()


def _controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")  # pytest-xdist sets it in its workers


def _newline(reporter: Any) -> None:
    """End the progress line (`-q` leaves `[100%]` open at the session's end)."""
    if reporter._tw.width_of_current_line:
        reporter.line("")


def _write(config: pytest.Config, line: str, **markup: bool) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        _newline(reporter)
        reporter.write_line(line, **markup)


def _snapshot(netns: str | None, wait: float, *, clean: bool) -> hoststate.HostState | None:
    """The snapshot, holding the node lock (None when another node held it for `wait` seconds)."""
    if netns is not None:
        return hoststate.capture(netns)
    fd = lock_host(wait)
    if fd is None:
        return None
    try:
        if clean:
            _check.removed = tuple(remove_killed_node_leftovers())
        return hoststate.capture()
    finally:
        os.close(fd)


def _wait() -> float:
    return float(os.environ.get("DRA_HOST_CHECK_LOCK_WAIT", "5"))


def pytest_sessionstart(session: pytest.Session) -> None:
    global _check
    if not _controller(session.config):
        return
    _check = _Check()
    netns = os.environ.get("DRA_HOST_CHECK_NETNS") or None
    if os.environ.get("DRA_HOST_CHECK") == "0":
        _check.off = "DRA_HOST_CHECK=0"
    elif netns is None and os.geteuid() != 0:
        _check.off = "not root (the ruleset and the node lock need it)"
    else:
        try:
            _check.before = _snapshot(netns, _wait(), clean=True)
        except (OSError, RuntimeError, ValueError) as e:
            _check.off = f"no snapshot at the start: {e}"
        else:
            if _check.before is None:
                _check.off = "another session's real node held the host at the start"
    if _check.removed:
        _write(session.config, f"{SECTION}: removed a killed session's node leftovers: {'; '.join(_check.removed)}")


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own, which waits for its workers to go
def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _controller(session.config) or _check.off == "DRA_HOST_CHECK=0":
        return
    if _check.before is None:
        _write(session.config, f"{SECTION}: off ({_check.off})", yellow=True)
        return
    netns = os.environ.get("DRA_HOST_CHECK_NETNS") or None
    try:
        after = _snapshot(netns, 10 * _wait(), clean=False)
    except (OSError, RuntimeError, ValueError) as e:
        _write(session.config, f"{SECTION}: no snapshot at the end: {e}", yellow=True)
        return
    if after is None:
        _write(session.config, f"{SECTION}: skipped (a real node held the host at the end)", yellow=True)
        return
    differences = hoststate.diff(_check.before, after)
    if not differences:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    where = f"network namespace {netns}" if netns else "the host"
    if reporter is not None:
        _newline(reporter)
        reporter.write_sep("=", f"{SECTION}: this session changed {where}", red=True, bold=True)
        for line in differences:
            reporter.write_line(line)
    else:
        sys.stderr.write("".join(f"{SECTION}: {line}\n" for line in [f"this session changed {where}", *differences]))
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
