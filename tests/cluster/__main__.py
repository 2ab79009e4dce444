"""`python -m tests.cluster build` builds the control-plane binaries and prints their directory;
`python -m tests.cluster up` starts a control plane, prints its KUBECONFIG and runs until Ctrl-C or SIGTERM;
`python -m tests.cluster up --real-node` adds a real node on this machine (containerd + runc + kubelet) and deploys
the driver on it from its image with its Helm chart, GPUs simulated: no GPU and no Docker needed (root is)."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from tests.cluster.controlplane import ControlPlane, ControlPlaneError, ensure_binaries


class _Interrupted(BaseException):
    """Ctrl-C or SIGTERM while starting up: tear down what is started so far (a BaseException, like
    KeyboardInterrupt, so that no `except Exception` on the way swallows it)."""


class _Signals:
    """SIGINT and SIGTERM: while starting, the first one interrupts the start-up (`_Interrupted`); afterwards they
    set `stop`. During the teardown they are ignored, so that it runs to its end."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.starting = True
        signal.signal(signal.SIGTERM, self._handler)
        signal.signal(signal.SIGINT, self._handler)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.stop.set()
        if self.starting:
            self.starting = False  # once: a second signal must not break the teardown of a half-started cluster
            raise _Interrupted(signal.Signals(signum).name)

    def started(self) -> None:
        self.starting = False

    def tearing_down(self) -> None:
        self.starting = False
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _build(_: argparse.Namespace) -> int:
    began = time.monotonic()
    bin_dir = ensure_binaries()
    print(f"binaries ready in {time.monotonic() - began:.1f}s", file=sys.stderr)
    print(bin_dir)
    return 0


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _up(args: argparse.Namespace) -> int:
    signals = _Signals()
    if args.real_node:
        return _up_real_node(args, signals)
    cp = ControlPlane(work_dir=args.work_dir, keep_work_dir=args.keep)
    try:
        cp.start()
        for name in args.node:
            _log(f"node {name} uid={cp.create_node(name)}")
        signals.started()
        _log(f"control plane ready in {cp.startup_seconds:.1f}s at {cp.server}; work dir {cp.work_dir}")
        _log(f"export KUBECONFIG={cp.kubeconfig}  # kubectl: {cp.bin_dir / 'kubectl'}")
        print(cp.kubeconfig, flush=True)
        return _run_until_stopped(signals, [("a component", lambda: cp.running, cp.log_tails)])
    except _Interrupted as e:
        _log(f"{e} while starting: stopping")
        return 1
    finally:
        signals.tearing_down()
        cp.stop()


def _run_until_stopped(signals: _Signals, watched: list[tuple[str, Callable[[], bool], Callable[[], str]]]) -> int:
    """Until Ctrl-C or SIGTERM (0), or until one of `watched` (name, alive, logs) is no longer alive (1)."""
    while not signals.stop.wait(1.0):
        for name, alive, logs in watched:
            if not alive():
                _log(f"{name} exited:\n{logs()}")
                return 1
    _log("stopping")
    return 0


def _node_lock_busy() -> bool:
    """Whether another real node holds the machine now (Node.start() then waits for it)."""
    from tests.cluster.node import NODE_LOCK

    try:
        fd = os.open(NODE_LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _up_real_node(args: argparse.Namespace, signals: _Signals) -> int:
    from tests.cluster import images
    from tests.cluster.driver import DriverRelease, driver_image, helm_binary
    from tests.cluster.node import NODE_CONTROLLERS, Node, ensure_node_binaries, node_unavailable_reason

    reason = node_unavailable_reason()
    if reason is not None:
        _log(f"error: {reason}")
        return 1
    began = time.monotonic()
    cp = ControlPlane(
        work_dir=args.work_dir, keep_work_dir=args.keep, service_accounts=True, controllers=NODE_CONTROLLERS
    )
    node: Node | None = None
    release: DriverRelease | None = None
    try:
        _log("building (or finding cached) the control-plane and node binaries, the images and helm ...")
        ensure_binaries()
        ensure_node_binaries()
        node_images = [images.pause_image(), images.workload_image()]
        image = driver_image()
        helm = helm_binary()
        _log(f"driver image {image}")
        cp.start()
        _log(f"control plane ready in {cp.startup_seconds:.1f}s at {cp.server}")
        node = Node(cp, sandbox_image=images.PAUSE_IMAGE, images=node_images)
        node.keep_work_dir = node.keep_work_dir or args.keep
        if _node_lock_busy():
            _log("another real node runs on this machine (a test?): waiting for it to stop ...")
        node.start()
        # the pause image under the name `dra-driver demo` gives its pods: no pull can succeed on this node
        from dra_driver.demo import DEMO_IMAGE

        node.ctr("images", "tag", "--force", images.PAUSE_IMAGE, DEMO_IMAGE)
        _log(f"node {node.name} Ready in {node.startup_seconds:.1f}s; work dir {node.work_dir}, state {node.state_dir}")
        release = DriverRelease(node, machine=args.machine, mode=args.mode)
        release.install()
        slices = release.slices()
        devices = sum(len(s["spec"].get("devices") or []) for s in slices)
        _log(
            f"driver {release.release} deployed by helm in namespace {release.namespace}: simulated {args.machine}, "
            f"mode {args.mode}, {len(slices)} ResourceSlices with {devices} devices"
        )
        signals.started()
        kubectl = cp.bin_dir / "kubectl"
        _log(f"ready in {time.monotonic() - began:.0f}s; cluster work dir {cp.work_dir}")
        _log(f"kubectl: {kubectl}")
        _log(f"helm: {helm}")
        _log(f"export KUBECONFIG={cp.kubeconfig}")
        _log(f'export PATH="{kubectl.parent}:{helm.parent}:$PATH"')
        _log("Ctrl-C (or SIGTERM) stops everything and cleans the host up")
        print(cp.kubeconfig, flush=True)
        return _run_until_stopped(
            signals,
            [
                ("a control-plane component", lambda: cp.running, cp.log_tails),
                ("the kubelet", node.kubelet_running, node.log_tails),
            ],
        )
    except _Interrupted as e:
        _log(f"{e} while starting: stopping")
        return 1
    finally:
        signals.tearing_down()
        if release is not None:
            release.log.stop()  # before the node's work dir, where it keeps the logs, goes
        if node is not None:
            with contextlib.suppress(Exception):
                node.stop()
        cp.stop()


def main(argv: list[str] | None = None) -> int:
    from dra_driver.simulator.catalog import machine_names
    from dra_driver.slices.devices import PublishMode

    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build (or find cached) binaries and print their directory").set_defaults(func=_build)
    up = sub.add_parser("up", help="start a control plane and print its kubeconfig path; Ctrl-C stops it")
    up.add_argument("--node", action="append", default=[], help="create a kubelet-less Ready Node (repeatable)")
    up.add_argument(
        "--real-node",
        action="store_true",
        help="also run a real node here (containerd, runc, kubelet; needs root) with the driver deployed by its "
        "Helm chart from its image, GPUs simulated",
    )
    up.add_argument(
        "--machine", default="dgx-h100", choices=machine_names(), help="simulated machine (--real-node; dgx-h100)"
    )
    up.add_argument(
        "--mode",
        default=PublishMode.PARTITIONABLE.value,
        choices=[m.value for m in PublishMode],
        help="what the driver publishes (--real-node; the chart's `mode`; default partitionable, so that the demo's "
        "MIG claims run: the chart's own default is static)",
    )
    up.add_argument("--work-dir", type=Path, default=None, help="use this directory instead of a temporary one")
    up.add_argument("--keep", action="store_true", help="keep the work directory (logs, etcd data) on exit")
    up.set_defaults(func=_up)
    args = parser.parse_args(argv)
    if args.command == "up" and args.real_node and args.node:
        parser.error("--node (kubelet-less nodes) and --real-node do not mix")
    try:
        return int(args.func(args))
    except ControlPlaneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
