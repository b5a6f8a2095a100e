"""Graphs of fused calls of two FFN shapes in one process: each shape called once, then captured in a CUDA
graph of two calls (fuser.tools.timing.graphed: warm-up on a side stream, the outputs freed after capture),
then every graph replayed in capture order, twice. Exits 0 when every replay completes, 1 when one fails
(the shape on stderr). Run in a process of its own: an illegal address leaves the CUDA context unusable.
argv: WORKLOAD WORKLOAD [--hold SECONDS] (fuser.tools.bench.parse_workload's forms); --hold waits that long
after a failed replay before exiting, so that a CUDA core dump (CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1), which
the driver writes while the process runs on, is complete."""
import sys
import time

import torch

import fuser
from fuser.tools.bench import Sets, parse_workload
from fuser.tools.timing import graphed


def main(specs, hold=0.0):
    graphs = []
    for spec in specs:
        w = parse_workload(spec)
        p = fuser.plan(w.m, w.d_model, w.d_ff, fused=True, d_out=w.d_out, gated=w.gated, activation=w.activation)
        s = Sets(w).sets[0]

        def call(s=s, p=p, w=w):
            return fuser.ffn(s["x"], s["w_up"], s["w_down"], w_gate=s["w_gate"], activation=w.activation, plan=p)
        call()
        torch.cuda.synchronize()
        graphs.append((spec, graphed(call, 2)[0]))
        torch.cuda.synchronize()
    for _ in range(2):
        for spec, replay in graphs:
            try:
                replay()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 (torch.AcceleratorError, or any error of the replay)
                print(f"{spec}: replay failed: {str(e).splitlines()[0]}", file=sys.stderr)
                time.sleep(hold)
                return 1
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    hold = 0.0
    if "--hold" in args:
        i = args.index("--hold")
        hold = float(args[i + 1])
        del args[i:i + 2]
    sys.exit(main(args, hold))
