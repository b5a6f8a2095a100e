"""The eager route's gate kernel on ragged lengths (a partial vector at the end, one element, a whole grid of
8192 blocks and more) and on the two halves of one GEMM result (rows 2 cols apart, either half the gate), both
16-bit dtypes and every activation, each into a buffer with NaN-poisoned guard elements on both sides, checked
bitwise against PyTorch's ops (and the halves' other half unchanged): the workload for compute-sanitizer on the gate
kernel. The gate kernels run before any other GPU math but the inputs' fill, so a tool that trips over another
library's kernels cannot hide its verdict on this one.

    compute-sanitizer --tool memcheck --kernel-name regex=fuser_gate python tests/gpu/sanitize_gate.py"""
import sys

import torch

from fuser import _C, runtime
from fuser.reference import ACTIVATIONS

GUARD = 8   # elements of NaN on each side of every g and u (16 bytes: alignment kept)


def main():
    bad = 0
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        for n in (1, 7, 8, 9, 4099, 2 * 256 * 8 * 8192 + 3):   # the last: two grid-strides and a tail
            for name in runtime.GATE_ACTS:
                buf_g = torch.full((n + 2 * GUARD,), float("nan"), device="cuda", dtype=dtype)
                buf_u = torch.full_like(buf_g, float("nan"))
                g, u = buf_g[GUARD:GUARD + n], buf_u[GUARD:GUARD + n]
                g.copy_(torch.randn(n, device="cuda", generator=gen) * 3)
                u.copy_(torch.randn(n, device="cuda", generator=gen))
                ref = ACTIVATIONS[name](g) * u
                ran = _C.gate(g, u, ACTIVATIONS[name])
                torch.cuda.synchronize()
                guards = bool(buf_g[:GUARD].isnan().all() and buf_g[-GUARD:].isnan().all())
                same = ran and torch.equal(g, ref) and guards
                bad += not same
                print(f"{str(dtype):15s} n={n:<9d} {name:10s} {'ok' if same else 'BAD'}")
        for rows, cols in ((1, 8), (3, 64), (77, 1032), (4100, 4096)):   # the last: more than one grid-stride
            for name in runtime.GATE_ACTS:
                for gate_first in (True, False):
                    n = rows * 2 * cols
                    buf = torch.full((n + 2 * GUARD,), float("nan"), device="cuda", dtype=dtype)
                    both = buf[GUARD:GUARD + n].view(rows, 2 * cols)
                    both.copy_(torch.randn(rows, 2 * cols, device="cuda", generator=gen) * 3)
                    g, u = both.chunk(2, -1) if gate_first else both.chunk(2, -1)[::-1]
                    u0 = u.clone()
                    ref = ACTIVATIONS[name](g) * u
                    ran = _C.gate(g, u, ACTIVATIONS[name])
                    torch.cuda.synchronize()
                    guards = bool(buf[:GUARD].isnan().all() and buf[-GUARD:].isnan().all())
                    same = ran and torch.equal(g, ref) and torch.equal(u, u0) and guards
                    bad += not same
                    print(f"{str(dtype):15s} rows={rows:<5d} cols={cols:<5d} {name:10s} gate first {gate_first!s:5s} "
                          f"{'ok' if same else 'BAD'}")
    print("all ok" if not bad else f"{bad} BAD")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
