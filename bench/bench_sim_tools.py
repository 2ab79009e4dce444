"""The simulated driver tools per call: run as a process of their own (DRA_SIM_TOOL_SERVER=0, as a driver in a pod
runs them) and through the fork server (=1, as the tests' host processes do), side by side in one run on one
simulated dgx-h100: nvidia-smi's compute-mode query and set (what the sharing code calls a few times per claim) and
the MPS client's `get_default_active_thread_percentage` against a running control daemon.

Run: python bench/bench_sim_tools.py [--calls 20]. Prints a table (median and p90 wall time per call).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dra_driver.simulator.nvml import SimulatedNvml
from dra_driver.simulator.tools import forkserver
from tests.sharing_helpers import no_daemon_left


def timed(argv: list[str], served: bool, calls: int, stdin: str | None = None, **env: str) -> list[float]:
    environ = {**os.environ, forkserver.ENV: "1" if served else "0", **env}
    if served:  # the first call starts the server; wait until it serves
        subprocess.run(argv, input=stdin, capture_output=True, text=True, env=environ, check=False)
        deadline = time.monotonic() + 30
        while not forkserver.socket_path().exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # its imports done
    took = []
    for _ in range(calls):
        start = time.perf_counter()
        out = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=environ, check=False)
        took.append(time.perf_counter() - start)
        assert out.returncode == 0, out.stdout + out.stderr
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sim = SimulatedNvml("dgx-h100", Path(tmp) / "gpu")
        sim.nvmlInit()
        bin_dir = sim.driver_root / "usr" / "bin"
        uuid = sim.gpu_uuids[0]
        pipe = Path(tmp) / "pipe"
        pipe.mkdir()
        mps_env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_VISIBLE_DEVICES": uuid}
        cases = [
            ("nvidia-smi --query-gpu=compute_mode", [str(bin_dir / "nvidia-smi"), "--query-gpu=compute_mode",
                                                     "--format=csv,noheader", "-i", uuid], None, {}),
            ("nvidia-smi -c DEFAULT", [str(bin_dir / "nvidia-smi"), "-i", uuid, "-c", "DEFAULT"], None, {}),
            ("nvidia-cuda-mps-control (a command)", [str(bin_dir / "nvidia-cuda-mps-control")],
             "get_default_active_thread_percentage\n", mps_env),
        ]  # fmt: skip
        rows = []
        with no_daemon_left(sim.state_dir):
            started = subprocess.run(
                [str(bin_dir / "nvidia-cuda-mps-control"), "-d"], env={**os.environ, **mps_env}, check=False
            )
            assert started.returncode == 0
            for name, argv, stdin, env in cases:
                direct = timed(argv, False, args.calls, stdin, **env)
                served = timed(argv, True, args.calls, stdin, **env)
                rows.append((name, direct, served))
            subprocess.run([str(bin_dir / "nvidia-cuda-mps-control")], input="quit\n", env={**os.environ, **mps_env},
                           capture_output=True, text=True, check=False)  # fmt: skip
    print(f"{'call':<38} {'own process ms':>14} {'p90':>6} {'fork server ms':>14} {'p90':>6} {'ratio':>6}")
    for name, direct, served in rows:
        d, s = statistics.median(direct), statistics.median(served)
        print(f"{name:<38} {1000 * d:>14.0f} {1000 * p90(direct):>6.0f} {1000 * s:>14.0f} {1000 * p90(served):>6.0f} "
              f"{d / s:>5.1f}x")  # fmt: skip
    print(f"{args.calls} calls each, wall time per call from the caller (subprocess.run)")


def p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


if __name__ == "__main__":
    main()
