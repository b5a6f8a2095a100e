"""The host (thread CPU) time of the single PyTorch ops the eager route launches, each alone on small
bfloat16 tensors (128 x 768, as G7), beside runtime.host_op_us: whether an epilogue GEMM
(torch._addmm_activation) costs the host what an F.linear does (runtime.eager_ops counts it as one op).

    python benchmarks/host_ops.py     # on a CUDA GPU; prints each op's median over 15 loops of 32 calls
"""
import statistics
import time

import torch
import torch.nn.functional as F

from fuser import runtime


def main():
    x = torch.randn(128, 768, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(768, 768, device="cuda", dtype=torch.bfloat16)
    b = torch.zeros(768, device="cuda", dtype=torch.bfloat16)
    ops = {"linear": lambda: F.linear(x, w), "relu": lambda: torch.relu(x),
           "addmm_act": lambda: torch._addmm_activation(b, x, w.t()), "addmm": lambda: torch.addmm(b, x, w.t()),
           "linear+bias": lambda: F.linear(x, w, b)}
    times = {k: [] for k in ops}
    for _ in range(15):
        for name, op in ops.items():   # interleaved: a drifting host affects every op alike
            for _ in range(8):
                op()
            torch.cuda.synchronize()
            t0 = time.thread_time()
            for _ in range(32):
                op()
            times[name].append((time.thread_time() - t0) / 32 * 1e6)
            torch.cuda.synchronize()
    print("host_op_us", runtime.host_op_us(0))
    for name, v in times.items():
        print(f"{name}: median {statistics.median(v):.2f} us  (min {min(v):.2f})")


if __name__ == "__main__":
    main()
