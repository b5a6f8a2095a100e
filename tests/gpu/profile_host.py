"""Where fuser.ffn's host time goes on CUDA tensors: cProfile over many calls of the reference route
(the planner's choice for this shape: PyTorch eager) and of a forced fused plan, launches queued behind a
GPU sleep. Prints the top functions by own time. Run on the GPU machine:

    python tests/gpu/profile_host.py [--calls 3000]
"""
import argparse
import cProfile
import pstats
import time

import torch

import fuser

ap = argparse.ArgumentParser()
ap.add_argument("--calls", type=int, default=3000)
a = ap.parse_args()
torch.set_grad_enabled(False)
x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
wg, wu = (torch.randn(14336, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2))
wd = torch.randn(4096, 14336, device="cuda", dtype=torch.bfloat16)
forced = fuser.plan(16, 4096, 14336, gated=True, activation="silu", fused=True)
routes = {
    "ffn_reference": lambda: fuser.ffn_reference(x, wu, wd, w_gate=wg, activation="silu"),
    "fuser.ffn (planner: eager)": lambda: fuser.ffn(x, wu, wd, w_gate=wg, activation="silu"),
    "fuser.ffn (forced fused)": lambda: fuser.ffn(x, wu, wd, w_gate=wg, activation="silu", plan=forced),
}
for name, fn in routes.items():
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    n = a.calls
    torch.cuda._sleep(int(4e8))            # ~0.2 s on the GPU: the calls below only enqueue
    t = time.perf_counter()
    for _ in range(100):
        fn()
    print(f"== {name}: {(time.perf_counter() - t) / 100 * 1e6:.1f} us per call (host, queued)")
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for i in range(n):
        if i % 100 == 0:
            torch.cuda.synchronize()
            torch.cuda._sleep(int(4e8))
        fn()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)
