"""The simulated node's driver tools, run as real processes: `nvidia-smi` (tools.smi),
`nvidia-cuda-mps-control` (tools.mps) and `nvidia-persistenced` (dra_driver.simulator.libnvml.persistenced).

Each is an executable script in the simulated driver root (dra_driver.simulator.driverroot writes them),
`<simulator state dir>/driver-root/usr/bin/<tool>`, that calls `main(tool, sys.argv)`; the simulator state
directory is found from the script's own path, so the tools need no configuration, as on a real node. Kept
light: the scripts import this module at every call.
"""

from __future__ import annotations

import sys
from pathlib import Path

DRIVER_ROOT_NAME = "driver-root"


def state_dir_of(script: str) -> Path:
    """`<state>/driver-root/usr/bin/<tool>` -> `<state>`."""
    path = Path(script).resolve()
    for parent in path.parents:
        if parent.name == DRIVER_ROOT_NAME:
            return parent.parent
    return path.parents[3]


def main(tool: str, argv: list[str]) -> int:
    state_dir = state_dir_of(argv[0])
    from dra_driver.simulator.tools import forkserver

    code = forkserver.run(tool, argv, state_dir)
    return run_directly(tool, argv, state_dir) if code is None else code


def run_directly(tool: str, argv: list[str], state_dir: Path) -> int:
    """The tool in this process (`main` hands nvidia-smi to a fork server where the tests ask for one)."""
    if tool == "nvidia-smi":
        from dra_driver.simulator.tools import smi

        return smi.main(state_dir, argv)
    if tool == "nvidia-cuda-mps-control":
        from dra_driver.simulator.tools import mps

        return mps.main(state_dir, argv)
    if tool == "nvidia-cuda-mps-server":
        # the control daemon starts servers on behalf of CUDA clients; it is not run by hand
        print(f"{tool}: this program is started by nvidia-cuda-mps-control", file=sys.stderr)
        return 1
    if tool == "nvidia-persistenced":
        # The daemon NVML talks to; here the way a container's simulated libnvidia-ml reaches its machine. Like the
        # real one it goes to the background (options are accepted and ignored); unlike it, a second start is a
        # no-op rather than an error.
        from dra_driver.simulator.libnvml import persistenced

        persistenced.start(state_dir)
        return 0
    print(f"{tool}: not supported by the simulated driver", file=sys.stderr)
    return 1
