"""bench/bench_soak.py: its judge of growth (a quantity that levels off after warm-up passes, one that keeps growing
fails, by its tolerance), and one --quick run of the real node daemon that levels off and prints its table."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.loadscript import load_script

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script(ROOT / "bench" / "bench_soak.py")


def series(values: list[float], key: str = "q") -> list[dict[str, float]]:
    return [{key: v} for v in values]


def test_a_quantity_that_levels_off_after_warm_up_passes(bench: ModuleType) -> None:
    # RSS: climbs during warm-up, then wobbles around a level
    rss = [60.0, 70.0, 75.0, 76.0, 77.5, 76.2, 77.9, 76.4, 77.0, 78.1, 76.8, 77.3]
    (verdict,) = bench.judge(series(rss), {"q": bench.Tolerance(4.0)})
    assert not verdict.grew, str(verdict)
    assert verdict.second == pytest.approx((76.0 + 77.5 + 76.2) / 3)  # samples 3..5 of 12
    assert verdict.last == pytest.approx((78.1 + 76.8 + 77.3) / 3)  # samples 9..11


def test_a_quantity_that_keeps_growing_fails_and_says_by_how_much(bench: ModuleType) -> None:
    fds = [15.0 + i for i in range(12)]  # one more descriptor every sample: a leak
    (verdict,) = bench.judge(series(fds, "fds"), {"fds": bench.Tolerance(1.0)})
    assert verdict.grew
    assert verdict.growth == pytest.approx(6.0)  # (24+25+26)/3 - (18+19+20)/3
    assert str(verdict).startswith("fds: 19 -> 25, +6") and "tolerance 1" in str(verdict)


def test_growth_within_tolerance_passes_and_a_drop_always_does(bench: ModuleType) -> None:
    tolerances = {"a": bench.Tolerance(0.0), "b": bench.Tolerance(2.0), "c": bench.Tolerance(0.0, 0.01)}
    samples = [{"a": 9.0 - i, "b": 100.0 + (i >= 6) * 2, "c": 1000.0 + (i >= 6) * 10 + (i >= 9) * 5} for i in range(12)]
    verdicts = {v.key: v for v in bench.judge(samples, tolerances)}
    assert not verdicts["a"].grew  # fell
    assert not verdicts["b"].grew and verdicts["b"].growth == 2.0  # exactly its tolerance
    assert verdicts["c"].allowed == pytest.approx(10.0)  # 1% of the second quarter's 1000
    assert verdicts["c"].grew  # +15: the last quarter went on climbing


def test_a_count_that_must_return_to_its_level_fails_on_one_more(bench: ModuleType) -> None:
    # CDI files with no claim held: one spec left behind in the second half is growth (tolerance 0)
    cdi = [0.0] * 6 + [1.0] * 6
    (verdict,) = bench.judge(series(cdi, "cdi_files"), {"cdi_files": bench.TOLERANCES["cdi_files"]})
    assert verdict.grew


@pytest.mark.parametrize("n", [4, 5, 7, 11, 21])
def test_quarters_leave_out_warm_up_and_never_overlap(bench: ModuleType, n: int) -> None:
    second, last = bench.quarters(n)
    q = -(-n // 4)
    assert second.start == q >= 1  # the first quarter is warm-up
    assert len(range(n)[second]) >= 1 and len(range(n)[last]) >= 1
    assert second.stop <= last.start and last.stop == n


def test_too_few_samples_cannot_be_judged(bench: ModuleType) -> None:
    with pytest.raises(ValueError, match="at least 4"):
        bench.judge(series([1.0, 2.0, 3.0]), {"q": bench.Tolerance(0.0)})


def test_every_sampled_quantity_has_a_stated_tolerance(bench: ModuleType) -> None:
    assert [q.key for q in bench.QUANTITIES] == list(bench.TOLERANCES)
    assert all(t.why for t in bench.TOLERANCES.values())


def test_xid_series_are_counted_by_claim_device_and_xid(bench: ModuleType) -> None:
    metrics = "\n".join(
        [
            "# HELP dra_driver_gpu_xid_errors_total XID errors",
            'dra_driver_gpu_xid_errors_total{device="gpu-1",uuid="GPU-1",product="H100",claim="c1",namespace="default",'
            'pod="",xid="13"} 2.0',
            'dra_driver_gpu_xid_errors_total{device="gpu-0-mig-1g10gb-19-0",uuid="MIG-x",product="H100",claim="c2",'
            'namespace="default",pod="",xid="43"} 1.0',
            'dra_driver_gpu_up{device="gpu-1",uuid="GPU-1",product="H100",claim="c1",namespace="default",pod=""} 1.0',
        ]
    )
    assert bench.xid_counts(metrics) == {("c1", "gpu-1", 13): 2.0, ("c2", "gpu-0-mig-1g10gb-19-0", 43): 1.0}


@pytest.mark.usefixtures("control_plane")  # skips where the control plane's binaries are not built
def test_quick_soak_levels_off_and_prints_its_table() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_soak.py"), "--quick", "--seed", "39"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    out = run.stdout
    assert run.returncode == 0, out[-4000:] + run.stderr[-3000:]
    header = next(line for line in out.splitlines() if line.startswith("soak of the node daemon:"))
    assert header.startswith("soak of the node daemon: dgx-h100, partitionable mode, ")
    mix = re.search(r"cycle mix: (.*?); XIDs injected: (\d+) \((.*?)\)", header)
    assert mix, header
    assert {k.split(" ", 1)[1] for k in mix[1].split(", ")} == {"MIG", "whole GPU", "time-sliced", "MPS"}, header
    assert int(mix[2]) >= 60 and "94: " in mix[3], header  # one counted XID per held device; a tainting one

    table = [line for line in out.splitlines() if line.startswith("|")]
    head = [c.strip() for c in table[0].strip("|").split("|")]
    assert head == ["cycles done", "RSS MB", "fds", "threads", "metrics series", "xid series", "checkpoint bytes",
                    "CDI files", "sim state bytes"]  # fmt: skip
    rows = [[float(c) for c in line.strip("|").split("|")] for line in table[2:]]
    assert len(rows) >= 8, table
    cycles = [r[0] for r in rows]
    assert cycles[0] == 0 and cycles == sorted(cycles) and cycles[-1] >= 60
    assert all(r[1] > 0 and r[2] > 0 and r[3] > 0 and r[4] > 0 for r in rows), table
    # sampled with no claim held: no claim's XID series, no CDI spec, the checkpoint back to the same size
    assert all(r[5] == 0 and r[7] == 0 for r in rows), table
    assert len({r[6] for r in rows[1:]}) == 1, table
    assert "levelled off: every quantity within its tolerance after warm-up" in out
    assert "GREW" not in out and "FAILURES" not in out
