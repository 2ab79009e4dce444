"""bench/bench_prepare.py --quick with our daemon and NVIDIA's gpu-kubelet-plugin side by side: the table has
NVIDIA's column (root: its device nodes and mount namespace), numeric in every row but its unprepare of 16 MIG
devices at once (two per GPU), which v0.5.0 fails (n/a, and the footnote says why), and its ratio to ours."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.libnvml_support import REQUIRE

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from bench_prepare import NVIDIA_KNOWN

ROOT = Path(__file__).resolve().parent.parent
NVIDIA = "NVIDIA gpu-kubelet-plugin"


def _table(out: str) -> tuple[list[str], list[list[str]], list[str]]:
    """(header, rows, footnotes) of the printed table."""
    lines = [line for line in out.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    notes = [line for line in out.splitlines() if re.match(r"^\[\d+\] ", line)]
    return header, rows, notes


@pytest.mark.skipif(os.geteuid() != 0 and not REQUIRE, reason="NVIDIA's side needs root (mknod, mount namespace)")
@pytest.mark.usefixtures("control_plane")  # skips where the control plane's binaries are not built
def test_quick_run_has_nvidias_column_with_numbers() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_prepare.py"), "--quick", "--sides", "ours,nvidia"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    header, rows, notes = _table(run.stdout)
    assert header == ["figure", "ours", NVIDIA, "ours / NVIDIA"]
    assert len(rows) == 21  # 16 latency rows, CPU per call, RSS twice, start to serving and to slices published
    number = re.compile(r"^\d+(\.\d+)? (ms|MB|s)$")
    not_numeric = {row[0]: row[2] for row in rows if not number.match(row[2])}
    assert not_numeric == {f"unprepare {p}, MIG 1g, 16 caller(s)": "n/a [1]" for p in ("p50", "p99")}, notes
    assert notes == [f"[1] {NVIDIA}: {NVIDIA_KNOWN['failed maybeDisableMigMode']}"]
    assert all(re.match(r"^\d+(\.\d+)?x$", row[3]) for row in rows if row[0] not in not_numeric), rows
