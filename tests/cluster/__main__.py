"""`python -m tests.cluster build` builds the control-plane binaries and prints their directory;
`python -m tests.cluster up` starts a control plane, prints its KUBECONFIG and runs until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from tests.cluster.controlplane import ControlPlane, ControlPlaneError, ensure_binaries


def _build(_: argparse.Namespace) -> int:
    began = time.monotonic()
    bin_dir = ensure_binaries()
    print(f"binaries ready in {time.monotonic() - began:.1f}s", file=sys.stderr)
    print(bin_dir)
    return 0


def _up(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    cp = ControlPlane(work_dir=args.work_dir, keep_work_dir=args.keep)
    try:
        cp.start()
        for name in args.node:
            print(f"node {name} uid={cp.create_node(name)}", file=sys.stderr)
        print(
            f"control plane ready in {cp.startup_seconds:.1f}s at {cp.server}; work dir {cp.work_dir}", file=sys.stderr
        )
        print(f"export KUBECONFIG={cp.kubeconfig}  # kubectl: {cp.bin_dir / 'kubectl'}", file=sys.stderr)
        print(cp.kubeconfig, flush=True)
        while not stop.wait(1.0):
            if not cp.running:
                print(f"a component exited:\n{cp.log_tails()}", file=sys.stderr)
                return 1
        print("stopping", file=sys.stderr)
        return 0
    finally:
        cp.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build (or find cached) binaries and print their directory").set_defaults(func=_build)
    up = sub.add_parser("up", help="start a control plane and print its kubeconfig path; Ctrl-C stops it")
    up.add_argument("--node", action="append", default=[], help="create a kubelet-less Ready Node (repeatable)")
    up.add_argument("--work-dir", type=Path, default=None, help="use this directory instead of a temporary one")
    up.add_argument("--keep", action="store_true", help="keep the work directory (logs, etcd data) on exit")
    up.set_defaults(func=_up)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ControlPlaneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
