"""The node daemon killed (SIGKILL, from `dra_driver.claimstate.crashpoints`) at every step of prepare, unprepare and
start-up recovery, as a real process against a real control plane; restarted, the kubelet's call retried over the
real sockets, and the node checked (tests/crash_harness.py lists the invariants).

Each scenario runs once unarmed to learn, from the trace file, which steps it reaches (and how often), then once
per step:n with the daemon armed to kill itself there. The summary table is printed (`-s`), shown in the
terminal summary and written to `<tmp>/dra-crash-recovery/summary.txt`. DRA_CRASH_SCENARIOS=mig,recover/mps
runs only the named scenarios (while debugging; the coverage assertion is skipped then). The scenarios are shared
out to DRA_CRASH_WORKERS (default 2) nodes, each with its own daemon, crashed in parallel. The daemons are forked
from a process that imported the daemon's modules once (tests/daemon_zygote.py), so they serve sooner;
DRA_CRASH_NO_ZYGOTE=1 starts each as `python -m dra_driver plugin` instead. DRA_CRASH_DRIVER_ROOT=<dir> runs the
daemon from another copy of the package (to check that the test catches a driver's bugs).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from dra_driver.claimstate import steps
from tests.crash_harness import REPO_ROOT, crash_points_wired, reached_steps, run_matrix, summary_table

WORKERS = int(os.environ.get("DRA_CRASH_WORKERS", "2"))  # nodes (each a daemon) crashed in parallel
SUMMARY = Path(tempfile.gettempdir()) / "dra-crash-recovery" / "summary.txt"


@pytest.mark.timeout(900)
def test_daemon_recovers_from_a_kill_at_every_step(control_plane, tmp_path: Path, report_table) -> None:
    only = {s for s in os.environ.get("DRA_CRASH_SCENARIOS", "").split(",") if s}
    driver_root = Path(os.environ.get("DRA_CRASH_DRIVER_ROOT") or REPO_ROOT)
    began = time.monotonic()
    # A short root: pytest's tmp_path (longer under pytest-xdist) would push the daemons' sockets past AF_UNIX's
    # 107 bytes. Kept on failure, for the daemon logs.
    root = Path(tempfile.mkdtemp(prefix="crash-"))
    reports, nodes = run_matrix(
        control_plane,
        root,
        "crash-node",
        only=only,
        workers=WORKERS,
        driver_root=driver_root,
        zygote=os.environ.get("DRA_CRASH_NO_ZYGOTE") != "1",
    )
    seconds = time.monotonic() - began
    table = f"crash recovery of the node daemon ({seconds:.0f} s, {WORKERS} node(s) in parallel)\n"
    table += summary_table(reports, nodes, seconds)
    print("\n" + table)
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(table + "\n")
    (tmp_path / "summary.txt").write_text(table + "\n")
    report_table("crash recovery (real daemon)", table)

    failures = [f for r in reports for f in r.failures]
    logs = ", ".join(str(n.logs) for n in nodes)
    assert not failures, f"{len(failures)} invariant failures after kills (daemon logs under {logs}):\n{table}"
    shutil.rmtree(root, ignore_errors=True)
    if crash_points_wired() and not only:
        missing = [s for s in steps.ALL_POINTS if s not in reached_steps(reports)]
        assert not missing, (
            f"crash points never reached by any scenario: {', '.join(missing)} "
            "(the driver calls crashpoints.reached for some steps but not these, or no scenario gets there)"
        )
