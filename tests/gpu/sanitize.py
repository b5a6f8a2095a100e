"""One small fused kernel per dataflow (and gated mode), each checked against float64: the workload for
compute-sanitizer (memcheck, racecheck, synccheck) and a quick smoke test of the GPU path.

    compute-sanitizer --tool racecheck python tests/gpu/sanitize.py [--only shuffle]"""
import argparse
import sys

import torch

import fuser

CASES = [  # (required dataflow or None for none at all, gate mode)
    ("all_exchange", None), ("shuffle", None), ("reduce_scatter", None), ("inter_cluster_reduce", None),
    (None, None), ("all_exchange", "spatial"), ("shuffle", "sequential"), ("inter_cluster_reduce", "sequential"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=None)
    ap.add_argument("--m", type=int, default=37)
    a = ap.parse_args()
    bad = 0
    g = torch.Generator(device="cuda").manual_seed(0)
    for df, gate in CASES:
        if a.only and a.only != str(df):
            continue
        kw = dict(gated=gate is not None, activation="silu", bias=True, target="h200", fused=True)
        if gate:
            kw["gate_mode"] = gate
        if df:
            kw["dataflows"] = [df]
        else:
            kw["avoid"] = list(fuser.DATAFLOWS)
        d, f = 256, 1024
        p = fuser.plan(a.m, d, f, **kw)
        t = dict(x=torch.randn(a.m, d, device="cuda", generator=g).bfloat16(),
                 w_up=(torch.randn(f, d, device="cuda", generator=g) * d ** -0.5).bfloat16(),
                 w_down=(torch.randn(d, f, device="cuda", generator=g) * f ** -0.5).bfloat16(),
                 b_up=torch.randn(f, device="cuda", generator=g).bfloat16(),
                 b_down=torch.randn(d, device="cuda", generator=g).bfloat16())
        if gate:
            t["w_gate"] = (torch.randn(f, d, device="cuda", generator=g) * d ** -0.5).bfloat16()
            t["b_gate"] = torch.randn(f, device="cuda", generator=g).bfloat16()
        out = torch.full((a.m, d), float("nan"), device="cuda", dtype=torch.bfloat16)
        fuser.ffn(activation="silu", out=out, plan=p, **t)
        ref = fuser.ffn_reference(activation="silu", compute_dtype=torch.float64, **t)
        eager = fuser.ffn_reference(activation="silu", **t)
        torch.cuda.synchronize()
        err = float((out.double() - ref).norm() / ref.norm())
        e_eager = float((eager.double() - ref).norm() / ref.norm())
        ok = err <= 2 * e_eager
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {str(df):22s} {str(gate):10s} err {err:.2e} eager {e_eager:.2e} {p.summary()}",
              flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
