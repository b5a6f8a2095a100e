"""Planner search time and search-space size, on this machine's CPU.

For the paper's workloads (G1-G10, S1-S8 at 128 tokens) and the H200-baseline model shapes at
1..16384 tokens, prints the median search time over repeated searches, the candidates before pruning,
the candidates scored after pruning, and the plan chosen. Usage:

    python benchmarks/search_time.py [--repeat 5] [--markdown]
"""
import argparse
import statistics
import time

import fuser
from fuser import _C
from fuser.tools.workloads import MODELS, PAPER, TOKENS


def shapes():
    for name, w in PAPER.items():
        yield name, w
    for name, w in MODELS.items():
        for m in TOKENS:
            yield f"{name} M={m}", dict(w, m=m)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    rows, medians = [], []
    for name, w in shapes():
        chain = dict(m=w["m"], d_model=w["d_model"], d_ff=w["d_ff"], d_out=w["d_out"], gated=w["gated"],
                     activation=w["activation"], dtype="bfloat16")
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            plans, st = _C.search(chain, "h200", k=1)
            times.append((time.perf_counter() - t0) * 1e3)
        med = statistics.median(times)
        medians.append(med)
        rows.append((name, med, st["search_ms"], st["candidates"], st["scored"],
                     fuser.Plan(plans[0], st).summary()))
    if args.markdown:
        print("| workload | median search ms (wall) | core ms | candidates | scored after pruning | chosen |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r[0]} | {r[1]:.2f} | {r[2]:.2f} | {r[3]:,} | {r[4]:,} | {r[5]} |")
    else:
        for r in rows:
            print(f"{r[0]:22s} {r[1]:7.2f} ms  candidates {r[3]:>10,}  scored {r[4]:>7,}  {r[5]}")
    print(f"\n{len(rows)} shapes: median {statistics.median(medians):.2f} ms, max {max(medians):.2f} ms per search")


if __name__ == "__main__":
    main()
