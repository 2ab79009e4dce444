"""Crash soak of the node daemon: SIGKILLs from outside at random moments of random prepares and unprepares,
each followed by a restart, another claim prepared, the kubelet's retry and the invariants of
tests/crash_harness.py. Starts its own control plane (tests/cluster); everything is on loopback.

Each trial: pick a random operation (prepare of 1-2 claims not prepared, or unprepare of 1-2 prepared ones, from
the crash test's scenarios: whole GPU, MIG, two MIG partitions, time-sliced GPU, MPS, and two more MIG partitions
of gpu-0), start it over the kubelet socket, SIGKILL the daemon after a random delay (uniform over the time such an
operation takes, learned as it goes), restart it, prepare another claim, retry the operation if it got no answer,
and check (a quarter of the interrupted prepares are unprepared instead, as when the pod went away meanwhile).
The daemon traces every step it reaches (DRA_DRIVER_CRASH_TRACE), so the table says where the kills
landed. Every --clean-every trials, and at the end, everything is unprepared and the node must be clean.

Run: python bench/bench_crash_soak.py [--trials 200] [--seed N] [--max-seconds 1500]. Prints a table.
"""

from __future__ import annotations

import argparse
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc

from dra_driver.claimstate import steps
from tests.cluster.controlplane import ControlPlane
from tests.crash_harness import (
    ALL_SPECS,
    REPO_ROOT,
    Checker,
    ClusterClaims,
    DaemonNode,
    Failure,
    format_table,
)
from tests.daemon_zygote import Zygote

NODE = "soak-node"
BEFORE_ANY_STEP = "(before any step)"
AFTER_ANSWER = "(after the answer)"
ABANDON = 0.25  # how often the kubelet unprepares an interrupted prepare instead of retrying it


class Soak:
    def __init__(self, node: DaemonNode, checker: Checker, rng: random.Random) -> None:
        self.node = node
        self.c = checker
        self.rng = rng
        self.prepared: set[str] = set()  # what the kubelet believes is prepared
        self.durations: dict[str, list[float]] = {"prepare": [], "unprepare": []}
        self.early: dict[str, list[float]] = {"prepare": [], "unprepare": []}  # delays that killed before any step
        self.kill_points: Counter[str] = Counter()
        self.ops: Counter[str] = Counter()
        self.trials = 0
        self.cleanups = 0
        self.abandoned = 0

    def delay(self, op: str) -> float:
        """When to kill: uniform up to a little more than such an operation takes (median of the last ones seen
        complete); most of the time from about when the first step comes (the claim is read from the API server
        before), learnt from the kills that landed before it."""
        seen = self.durations[op][-25:]
        end = 1.15 * (statistics.median(seen) if seen else 0.08)
        early = self.early[op][-15:]
        start = 0.8 * statistics.median(early) if early and self.rng.random() < 0.8 else 0.0
        return self.rng.uniform(min(start, end), end)

    def _reset(self) -> None:
        """After a failure: forget everything, start from a clean node."""
        self.c.answers.clear()
        self.prepared.clear()
        self.node.wipe()

    def trial(self, index: int) -> None:
        self.trials += 1
        c = self.c
        c.trial = f"trial {index}"
        before = len(c.failures)
        try:
            self._trial()
        except Exception as e:
            c.fail("error", f"{type(e).__name__}: {e}\n{self.node.log_tail(15)}")
        if len(c.failures) > before:
            self._reset()

    def _trial(self) -> None:
        c, node, rng = self.c, self.node, self.rng
        node.ensure(None)
        free = sorted(set(ALL_SPECS) - self.prepared)
        held = sorted(self.prepared)
        op = "unprepare" if held and (not free or rng.random() < 0.5) else "prepare"
        pool = held if op == "unprepare" else free
        keys = rng.sample(pool, min(len(pool), rng.choice((1, 1, 2))))
        refs = [c.refs[k] for k in keys]
        self.ops[op] += 1

        # the operation, killed from outside after a random delay
        mark = len(node.trace_lines())
        outcome: dict[str, Any] = {}
        kubelet = node.kubelet
        assert kubelet is not None and node.proc is not None

        def call() -> None:
            began = time.monotonic()
            try:
                outcome["answer"] = kubelet.prepare(refs) if op == "prepare" else kubelet.unprepare(refs)
                outcome["seconds"] = time.monotonic() - began
            except (grpc.RpcError, ValueError) as e:  # the daemon died (ValueError: the channel went away)
                outcome["error"] = e

        thread = threading.Thread(target=call)
        delay = self.delay(op)
        thread.start()
        time.sleep(delay)
        node.proc.send_signal(signal.SIGKILL)
        thread.join(timeout=60)
        node.wait_exit()
        steps = node.trace_lines()[mark:]
        if "answer" in outcome:
            self.durations[op].append(outcome["seconds"])
            self.kill_points[AFTER_ANSWER] += 1
        else:
            self.kill_points[f"{op}: {steps[-1] if steps else BEFORE_ANY_STEP}"] += 1
            if not steps:
                self.early[op].append(delay)

        # what the kubelet learnt from an answer, if one came
        retry = "answer" not in outcome
        if not retry and op == "prepare":  # the answer is what a repeated prepare must give again
            if c.record(keys, outcome["answer"], "prepare (answered before the kill)"):
                self.prepared.update(keys)
        elif not retry:
            for k, r in zip(keys, refs, strict=True):
                error = outcome["answer"].get(r.uid, "no answer")
                if error:
                    c.fail(op, f"unprepare of {k} answered an error: {error}")
                else:
                    self.prepared.discard(k)
                    c.answers.pop(k, None)

        # restart, another claim prepared, the kubelet's retry, the checks
        node.start(None)
        c.check_recovered()
        others = sorted(set(ALL_SPECS) - self.prepared - set(keys))
        if others:
            other = rng.choice(others)
            if c.prepare([other], "prepare another claim"):
                self.prepared.add(other)
        if retry:
            if op == "prepare" and rng.random() < ABANDON:  # the pod went away meanwhile: the kubelet unprepares
                self.abandoned += 1
                c.unprepare(keys, "unprepare of an interrupted prepare")
            elif op == "prepare":
                if c.prepare(keys, "retry"):
                    self.prepared.update(keys)
            elif c.unprepare(keys, "retry"):
                self.prepared.difference_update(keys)
        c.check_prepared(set(self.prepared), sorted(self.prepared - set(keys)))

    def clean(self, label: str) -> None:
        """Unprepare everything; nothing may be left."""
        self.cleanups += 1
        c = self.c
        c.trial = label
        before = len(c.failures)
        try:
            self.node.ensure(None)
            if self.prepared:
                c.unprepare(sorted(self.prepared), "unprepare everything")
            self.prepared.clear()
            c.check_clean()
        except Exception as e:
            c.fail("error", f"{type(e).__name__}: {e}\n{self.node.log_tail(15)}")
        if len(c.failures) > before:
            self._reset()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random, printed)")
    parser.add_argument("--max-seconds", type=float, default=1500, help="stop starting trials after this long")
    parser.add_argument("--clean-every", type=int, default=20, help="unprepare everything every N trials")
    parser.add_argument("--driver-root", type=Path, default=REPO_ROOT, help="run the daemon from this copy")
    parser.add_argument("--no-zygote", action="store_true", help="start daemons as `python -m dra_driver`")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)

    with ControlPlane() as cp, tempfile.TemporaryDirectory(prefix="dra-soak-") as tmp:
        cp.create_node(NODE)
        claims = ClusterClaims(cp, NODE, "soak")
        zygote = None if args.no_zygote else Zygote(args.driver_root)
        node = DaemonNode(Path(tmp), cp.kubeconfig, NODE, zygote, args.driver_root)
        began = time.monotonic()
        try:
            checker = Checker(node, claims.create(ALL_SPECS.values()))
            soak = Soak(node, checker, rng)
            for i in range(1, args.trials + 1):
                if time.monotonic() - began > args.max_seconds:
                    print(f"stopping after {i - 1} trials: --max-seconds {args.max_seconds:.0f} reached")
                    break
                soak.trial(i)
                if i % args.clean_every == 0:
                    soak.clean(f"clean after trial {i}")
                if i % 25 == 0:
                    print(f"  {i} trials, {len(checker.failures)} failures, {time.monotonic() - began:.0f} s",
                          flush=True)  # fmt: skip
            soak.clean("final clean")
        finally:
            node.close()
            if zygote is not None:
                zygote.close()
            claims.delete()
        seconds = time.monotonic() - began
    report(soak, checker.failures, node, seed, seconds)


def report(soak: Soak, failures: list[Failure], node: DaemonNode, seed: int, seconds: float) -> None:
    print(f"crash soak of the node daemon: {soak.trials} trials (seed {seed}), {seconds:.0f} s")
    rows = [("kill point (last step traced before the SIGKILL)", "kills")]
    points = [f"{s.split('.')[0]}: {s}" for s in steps.ALL_POINTS]
    points += [f"prepare: {BEFORE_ANY_STEP}", f"unprepare: {BEFORE_ANY_STEP}", AFTER_ANSWER]
    order = {p: i for i, p in enumerate(points)}
    for point, n in sorted(soak.kill_points.items(), key=lambda kv: order.get(kv[0], len(order))):
        rows.append((point, str(n)))
    rows.append(("total", str(sum(soak.kill_points.values()))))
    print("\n".join(format_table(rows, total=True)))
    reached = {p.split(": ", 1)[1] for p in soak.kill_points if ": " in p}
    missing = [s for s in steps.ALL_POINTS if s not in reached and not s.startswith("recover.")]
    print(f"steps of prepare/unprepare never the last before a kill: {', '.join(missing) if missing else 'none'}")
    by_invariant = Counter(f.invariant for f in failures)
    rows = [("trials", str(soak.trials)), ("operations killed", f"{soak.ops['prepare']} prepare, "
             f"{soak.ops['unprepare']} unprepare"), ("interrupted prepares unprepared", str(soak.abandoned)),
            ("clean-ups checked", str(soak.cleanups)),
            ("daemon starts", f"{node.starts} (median {statistics.median(node.start_seconds or [0]):.2f} s to serve)"),
            ("failures", str(len(failures)))]  # fmt: skip
    rows += [(f"  {k}", str(v)) for k, v in sorted(by_invariant.items())]
    print("\n".join(format_table([("", ""), *rows])[2:]))
    for f in failures[:30]:
        print(f"  {f}")
    if len(failures) > 30:
        print(f"  ... {len(failures) - 30} more")


if __name__ == "__main__":
    main()
