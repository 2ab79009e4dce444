"""The `dra-driver` command's entry point. `probe`, which the kubelet runs in the driver's container every few
seconds (the chart's startup, liveness and readiness checks), goes straight to its module: the rest of the CLI imports
the whole driver (pydantic models, the Kubernetes client), more than twice the probe's own CPU time
(bench/bench_probe.py)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["probe"]:
        from dra_driver.plugin.grpc import probe

        return probe.main(args[1:])
    from dra_driver import cli

    return cli.main(args)


if __name__ == "__main__":
    sys.exit(main())
