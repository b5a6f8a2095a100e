"""What a graph's own launch adds to a short call's time: the same calls in CUDA graphs of 1, 4 and 16, side by side.

The harness (fuser.tools.bench) times a short call as L calls captured in one CUDA graph, each replay bracketed by
CUDA events and divided by L. The GPU reaches the start event before the host has submitted the replay, so every
replay carries the graph's launch once, and each call 1/L of it. This times PyTorch's ops (eager) and fuser's pick
(fuser.ffn with the planner's plan) as graphs of each L of --calls over the harness's rotating input sets, every
graph replayed interleaved with the others in seeded orders (fuser.tools.timing), and prints per cell each graph's
time per call, the floor beside them (fuser.tools.bench's, from the matmul and copy rates measured at the start),
eager over fuser at each L, and the launch's share: (time at the smallest L - time at the largest) per call.

In a graph of repeated fuser calls each call follows another fuser kernel, which lets it start as its blocks leave
(programmatic dependent launch); in a model it follows another op's kernel. With --after-op, at the largest L each
call of each variant also runs after a copy writing its input (one PyTorch kernel it depends on, as an FFN depends on
the norm before it; ``fuser.tools.bench.after_op``, what the harness's graphs do), and the copies alone are timed in
the same graphs' interleaving: "after an op" is (copy and call) - (copy alone) per call, the call's time where its
predecessor is not one of its own.

    python benchmarks/graph_calls.py [--cells G1:128 S8:128 llama2-7b:16 ...] [--calls 1 4 16] [--rounds 30]
                                     [--after-op] [--json FILE]
"""
import argparse
import json
import sys

import torch

import fuser
from fuser.reference import ACTIVATIONS, eager
from fuser.tools.bench import Sets, after_op, measure_ceilings, parse_workload
from fuser.tools.timing import graphed, time_interleaved

CELLS = ("G1:128", "G3:128", "S8:128", "S1:128", "llama2-7b:16", "llama3-8b:128")


def cell_row(w, calls, rounds, ceil, after_op=False):
    """One workload's row: {"cell", "floor_us", "eager": {L: us}, "fuser": {L: us}, "plan"}; with `after_op`,
    "after_op": {"copy", "eager", "fuser"} at the largest L (the copy alone, each variant's time after it)."""
    sets = Sets(w)
    act = ACTIVATIONS[w.activation]
    plan = fuser.plan(w.m, w.d_model, w.d_ff, d_out=w.d_out, gated=w.gated, activation=w.activation)

    def ops(s, x):
        return eager(x, s["w_up"], s["w_down"], s["w_gate"], None, None, None, act)

    def mine(s, x):
        return fuser.ffn(x, s["w_up"], s["w_down"], w_gate=s["w_gate"], activation=w.activation, plan=plan)

    def plain(f):       # f on the next set's input
        def call():
            s = sets.turn()
            return f(s, s["x"])
        return call

    graphed(plain(ops), calls[0])   # the first capture in a process runs slower (fuser.tools.bench): a throwaway
    fns = [(name, n, graphed(plain(f), n)) for name, f in (("eager", ops), ("fuser", mine)) for n in calls]
    if after_op:
        # each call's input written by a copy just before it, as the harness's graphs do (the copies alone: a turn)
        fns += [(name, "after", graphed(after_op(sets, f), calls[-1]))
                for name, f in (("copy", sets.turn), ("eager", plain(ops)), ("fuser", plain(mine)))]
    times = time_interleaved([g for _, _, g in fns], rounds=rounds)
    floor, _bound = w.floor_us(ceil["matmul_tflops"], ceil["copy_tbps"])
    row = {"cell": f"{w.name}:{w.m}", "floor_us": round(floor, 2), "plan": str(plan), "sets": sets.n,
           "eager": {}, "fuser": {}}
    after = {name: t for (name, n, _g), t in zip(fns, times) if n == "after"}
    for (name, n, _g), t in zip(fns, times):
        if n != "after":
            row[name][n] = round(t, 2)
    if after:
        row["after_op"] = {"copy": round(after["copy"], 2), **{v: round(after[v] - after["copy"], 2)
                                                               for v in ("eager", "fuser")}}
    return row


def report(row, calls):
    lo, hi = min(calls), max(calls)
    e, f = row["eager"], row["fuser"]
    per = "  ".join(f"L={n}: eager {e[n]:.2f} fuser {f[n]:.2f} ({e[n] / f[n]:.3f}x)" for n in calls)
    line = (f"{row['cell']:>16} floor {row['floor_us']:.2f} us  {per}  launch share per call at L={lo}: "
            f"eager {e[lo] - e[hi]:+.2f} fuser {f[lo] - f[hi]:+.2f} us")
    a = row.get("after_op")
    if a:
        line += (f"\n{'':>16} after an op (L={hi}, the copy {a['copy']:.2f}): eager {a['eager']:.2f} fuser "
                 f"{a['fuser']:.2f} ({a['eager'] / a['fuser']:.3f}x)")
    return line


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", nargs="+", default=list(CELLS), help="workloads (fuser bench's names)")
    ap.add_argument("--calls", nargs="+", type=int, default=[1, 4, 16], help="calls per graph to compare")
    ap.add_argument("--rounds", type=int, default=30, help="replays of each graph (interleaved)")
    ap.add_argument("--after-op", action="store_true",
                    help="also time each variant after a copy of its input at the largest L (module docstring)")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args(argv)
    if any(n < 1 for n in a.calls) or len(set(a.calls)) < 2:
        ap.error("--calls takes two or more different counts, each at least 1")
    if a.rounds < 3:
        ap.error("--rounds must be at least 3")
    try:
        cells = [parse_workload(c) for c in a.cells]
    except ValueError as e:
        ap.error(str(e))
    if not torch.cuda.is_available():
        print("graph_calls: needs a CUDA GPU", file=sys.stderr)
        return 2
    calls = sorted(set(a.calls))
    ceil = measure_ceilings()
    print(f"{torch.cuda.get_device_name()}: matmul {ceil['matmul_tflops']:.0f} TFLOP/s, copy "
          f"{ceil['copy_tbps']:.2f} TB/s; per call in graphs of {', '.join(map(str, calls))} calls, us")
    rows = []
    for w in cells:
        rows.append(cell_row(w, calls, a.rounds, ceil, a.after_op))
        print(report(rows[-1], calls), flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "ceilings": ceil, "calls": calls, "rows": rows},
                      fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
