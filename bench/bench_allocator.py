"""Allocation of claims on fleets of simulated dgx-h100 nodes (our default partitionable layout), ours
(dra_driver.allocation) vs the kube-scheduler's structured allocator (tools/allocbench, Go, v0.37.2) on identical
input; the results must be identical (asserted). A claim per node in a mix of whole GPUs and MIG partitions, each
claim a pod of its own, tried on the nodes from (i mod nodes) like a scheduler spreading pods: one claim per node, at
most 200 (--per-node, --max-claims).

`--packing`: instead, the search's worst case on one GPU of each MIG-capable product: a claim for the seven 1g
partitions that fill it plus one more, which fits nowhere, so both allocators try every placement before failing
(tests/test_mig_packing.py). Ours is the best of 3 runs, as Go's is.

Run: python bench/bench_allocator.py [--quick] [--nodes 20,100,500] [--packing]. Prints a table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.test_allocbench import build_allocbench, claims, classes, differences, fleet, run_go, run_ours


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="20 and 100 nodes, one claim per node")
    parser.add_argument("--nodes", default="20,100,500")
    parser.add_argument("--per-node", type=float, default=1.0, help="claims per node")
    parser.add_argument(
        "--max-claims", type=int, default=200, help="claims at most (Go takes ~0.3 s a claim at 500 nodes)"
    )
    parser.add_argument("--packing", action="store_true", help="eight 1g requests on one GPU, per product")
    args = parser.parse_args()
    if args.packing:
        packing()
        return
    sizes = [20, 100] if args.quick else [int(n) for n in args.nodes.split(",")]
    per_node = 1.0 if args.quick else args.per_node
    binary = build_allocbench()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            names, slices = fleet(n, Path(tmp))
            inp = {
                "slices": slices,
                "classes": classes(),
                "claims": claims(min(int(n * per_node), args.max_claims)),
                "nodes": names,
            }
            go, go_s = run_go(binary, inp, repeat=1 if n >= 500 else 3)
            ours, ours_s = run_ours(inp)
            diff = differences(ours, go)
            assert not diff, "results differ:\n" + "\n".join(diff[:10])
            errors = [r["error"] for r in go if r.get("error")]
            assert not errors, errors[:3]
            placed = sum(1 for r in go if r.get("node"))
            rows.append((n, len(slices), len(inp["claims"]), placed, ours_s, go_s))
    print(f"{'nodes':>5} {'slices':>6} {'claims':>6} {'placed':>6} {'ours s':>8} {'Go s':>8} {'ours/Go':>8} "
          f"{'ours ms/claim':>13} {'Go ms/claim':>11}")  # fmt: skip
    for n, s, c, p, ours_s, go_s in rows:
        print(f"{n:>5} {s:>6} {c:>6} {p:>6} {ours_s:>8.2f} {go_s:>8.3f} {ours_s / go_s:>7.1f}x "
              f"{1000 * ours_s / c:>13.2f} {1000 * go_s / c:>11.2f}")  # fmt: skip
    print("identical results on every claim (node and devices); Go time is the best of 3 runs below 500 nodes")


def packing() -> None:
    """Ours vs Go on the claim for one 1g more than a GPU holds, per product (both must fail it)."""
    import time

    from dra_driver.allocation.allocator import Allocator
    from tests.test_mig_packing import MACHINE_OF, MIG_CLASS, PACKINGS, gpu_slices, packing_claim

    binary = build_allocbench()
    print(f"{'product':<18} {'MIG devices':>11} {'ours s':>8} {'Go s':>8} {'ours/Go':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for key in sorted(MACHINE_OF):
            uuid, slices = gpu_slices(key, Path(tmp) / key)
            claim = packing_claim(key, uuid, [*PACKINGS["seven 1g"], (1, 1)])
            ours_s = []
            for _ in range(3):
                start = time.perf_counter()
                assert Allocator(slices, [MIG_CLASS]).allocate([claim], "n") is None
                ours_s.append(time.perf_counter() - start)
            go, go_s = run_go(binary, {"slices": slices, "classes": [MIG_CLASS], "claims": [claim], "nodes": ["n"]},
                              repeat=3)  # fmt: skip
            assert not go[0].get("node"), go
            devices = sum(1 for s in slices for d in s["spec"].get("devices") or [] if "mig" in d["name"])
            print(f"{key:<18} {devices:>11} {min(ours_s):>8.2f} {go_s:>8.2f} {min(ours_s) / go_s:>7.1f}x")
    print("the claim: seven 1g partitions and one more on one GPU, which fits nowhere; best of 3 runs each")


if __name__ == "__main__":
    main()
