"""tools/celeval's reference modes beyond the default verdicts: `-estimate` (the API server's compile-time cost
check of a new selector, the reference for our estimated cost) and `-bench` (Kubernetes' cold evaluation time,
read by bench/bench_cel.py). Skipped without Go unless DRA_K8S_REQUIRE=1, like the differential suite."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from dra_driver.cel.cost import MAX_COST
from tests.test_cel_differential import celeval  # noqa: F401  (the fixture: the built binary, shared)

DEVICE = {
    "driver": "gpu.example.com",
    "attributes": {"model": {"string": "H100"}},
    "capacity": {"memory": {"value": "80Gi"}},
}


def run(binary: Path, expressions: list[str], *flags: str) -> list[dict[str, Any]]:
    lines = [json.dumps({"id": str(i), "expression": e, "device": DEVICE}) for i, e in enumerate(expressions)]
    out = subprocess.run(
        [str(binary), *flags], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120, check=True
    )
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_estimate_gives_the_api_servers_verdict_and_max_cost(celeval: Path) -> None:  # noqa: F811
    ok, too_complex, bad = run(
        celeval,
        ["device.driver == 'x'", "lists.range(1000000).all(x, x >= 0)", "1 == 1.0"],
        "-estimate",
    )
    assert ok == {"id": "0", "outcome": "ok", "max_cost": 3}
    assert too_complex["outcome"] == "too_complex" and too_complex["message"] == "too complex, exceeds cost limit"
    assert too_complex["max_cost"] > MAX_COST
    assert bad["outcome"] == "compile_error" and "no matching overload for '_==_'" in bad["message"]
    assert "max_cost" not in bad


def test_bench_adds_ns_per_op_to_the_default_answer(celeval: Path) -> None:  # noqa: F811
    expressions = ['device.attributes["gpu.example.com"].model == "H100"', "1 == 1.0"]
    plain = run(celeval, expressions)
    timed = run(celeval, expressions, "-bench", "20")
    assert timed[0].pop("ns_per_op") > 0
    assert timed == plain  # the verdicts are the default mode's; no timing for a compile error
    assert plain[0] == {"id": "0", "outcome": "true", "cost": 5}
