"""The host (thread CPU) time of the single PyTorch ops the eager route launches, each alone on small
bfloat16 tensors (128 x 768, as G7), beside runtime.host_op_us: whether an epilogue GEMM
(torch._addmm_activation) costs the host what an F.linear does (runtime.eager_ops counts it as one op)."""
import time, statistics, torch, torch.nn.functional as F
from fuser import runtime
d = "cuda"; x = torch.randn(128, 768, device=d, dtype=torch.bfloat16); w = torch.randn(768, 768, device=d, dtype=torch.bfloat16)
b = torch.zeros(768, device=d, dtype=torch.bfloat16)
fs = {"linear": lambda: F.linear(x, w), "relu": lambda: torch.relu(x),
      "addmm_act": lambda: torch._addmm_activation(b, x, w.t()), "addmm": lambda: torch.addmm(b, x, w.t()),
      "linear+bias": lambda: F.linear(x, w, b)}
res = {k: [] for k in fs}
for r in range(15):
    for k, f in fs.items():
        for _ in range(8): f()
        torch.cuda.synchronize(); t0 = time.thread_time()
        for _ in range(32): f()
        res[k].append((time.thread_time() - t0) / 32 * 1e6)
        torch.cuda.synchronize()
print("host_op_us", runtime.host_op_us(0))
for k, v in res.items(): print(f"{k}: median {statistics.median(v):.2f} us  (min {min(v):.2f})")
