"""CUDA graphs of fused calls of several FFN shapes in one process, as a server that captures a graph per
batch size: each shape's tensors are kept for the process's life (a model's weights, a server's static
input and output buffers), each shape is called once, then two calls of it are captured in a graph whose
outputs are kept; then every graph is replayed in a seeded random order for several rounds, its outputs
poisoned (NaN) before each replay and compared bit for bit after it with the shape's first call (the
kernels' sums run in a fixed order, so a replay repeats the call exactly).

Run in a process of its own: an illegal address would leave the CUDA context unusable.
argv: WORKLOAD... [--rounds N] (fuser.tools.bench.parse_workload's forms). Exits 0 when every replay
matches, 1 when one fails or differs (which, on stderr)."""
import random
import sys

import torch

import fuser
from fuser.tools.bench import Sets, parse_workload


def capture(call):
    """A graph of two calls of `call` and the outputs it writes (warm-up on a side stream first)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ys = [call(), call()]
    return g, ys


def main(specs, rounds):
    shapes = []   # (spec, tensors, graph, outputs, expected): everything a graph reads stays referenced
    for spec in specs:
        w = parse_workload(spec)
        p = fuser.plan(w.m, w.d_model, w.d_ff, fused=True, d_out=w.d_out, gated=w.gated, activation=w.activation)
        t = Sets(w).sets[0]

        def call(t=t, p=p, w=w):
            return fuser.ffn(t["x"], t["w_up"], t["w_down"], w_gate=t["w_gate"], activation=w.activation, plan=p)
        expected = call()
        g, ys = capture(call)
        torch.cuda.synchronize()
        shapes.append((spec, t, g, ys, expected))
    order = random.Random(0)
    for r in range(rounds):
        turn = list(range(len(shapes)))
        order.shuffle(turn)
        for i in turn:
            spec, _, g, ys, expected = shapes[i]
            for y in ys:
                y.fill_(float("nan"))
            try:
                g.replay()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 (torch.AcceleratorError, or any error of the replay)
                print(f"{spec}: round {r}: replay failed: {str(e).splitlines()[0]}", file=sys.stderr)
                return 1
            for j, y in enumerate(ys):
                if not torch.equal(y, expected):
                    diff = (y.float() - expected.float()).abs().nan_to_num(float("inf")).max().item()
                    print(f"{spec}: round {r}: call {j} of the replay differs from the first call (max |diff| "
                          f"{diff:.3g})", file=sys.stderr)
                    return 1
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    rounds = 4
    if "--rounds" in args:
        i = args.index("--rounds")
        rounds = int(args[i + 1])
        del args[i:i + 2]
    sys.exit(main(args, rounds))
