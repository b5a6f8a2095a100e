"""A quick side-by-side timing of fuser.ffn against PyTorch eager on a few FFN shapes (CUDA events,
interleaved, medians, several weight sets rotated so the L2 does not flatter anyone). The full
harness is benchmarks/ffn.py; this is the smoke version for one GPU call."""
import sys

import torch

import fuser
from fuser.timing import time_interleaved as bench
from fuser.workloads import MODELS


def main():
    shapes = [("llama3-8b", 1), ("llama3-8b", 16), ("llama3-8b", 128), ("gpt2", 128), ("gpt2", 2048),
              ("gpt3-6.7b", 16), ("llama2-7b", 512)]
    for name, m in shapes:
        w = MODELS[name]
        d, f = w["d_model"], w["d_ff"]
        sets = 2 if d * f > 8_000_000 else 8
        ws = []
        for _ in range(sets):
            t = dict(w_up=torch.randn(f, d, device="cuda").bfloat16() * d ** -0.5,
                     w_down=torch.randn(d, f, device="cuda").bfloat16() * f ** -0.5)
            if w["gated"]:
                t["w_gate"] = torch.randn(f, d, device="cuda").bfloat16() * d ** -0.5
            ws.append(t)
        x = torch.randn(m, d, device="cuda").bfloat16()
        plan = fuser.plan(m, d, f, gated=w["gated"], activation=w["activation"])
        fplan = plan if plan.fused else fuser.plan(m, d, f, gated=w["gated"], activation=w["activation"], fused=True)
        i = [0]

        def nxt():
            i[0] = (i[0] + 1) % sets
            return ws[i[0]]
        eager = lambda: fuser.ffn_reference(x, activation=w["activation"], **nxt())  # noqa: E731
        fused = lambda: fuser.ffn(x, activation=w["activation"], plan=fplan, **nxt())  # noqa: E731
        te, tf = bench([eager, fused])
        print(f"{name:10s} M={m:<5d} eager {te:8.1f} us  fused {tf:8.1f} us  ({te / tf:.2f}x)  predicted "
              f"{fplan.predicted_us:7.1f} us  planner picks {'fused' if plan.fused else 'unfused'}  {fplan.summary()}",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
