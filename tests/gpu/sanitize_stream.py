"""Small stream plans (swap-AB, both phases K-split, biases, ragged tokens in three row tiles; single blocks and
both kinds of cluster pairs, and one phase with units of one l-tile or of all; then bm 64 with split sums in
both phases and in one phase, 41 of the row tile's 64 rows real; then an ungated swap-AB chain, whose first pass
keeps a shorter lead), each launched
twice into NaN-poisoned outputs, then checked against a float64 reference computed on the CPU: the workload for
compute-sanitizer on the stream kernel. The fused kernel runs before any other GPU math, so a tool
that trips over another library's kernels cannot hide its verdict on this one.

    compute-sanitizer --tool racecheck --kernel-name regex=fuser_ffn python tests/gpu/sanitize_stream.py"""
import sys

import torch

import fuser
from plan_check import ffn_tensors, rel


def main():
    m, d, f = 41, 512, 2048
    # the single-block kernel, then cluster pairs of both kinds (three row tiles: the row-tile pairs end in a
    # ghost; multicast loads, remote slot releases and the claim hand-off)
    kw = dict(gated=True, activation="silu", bias=True, target="h200", fused=True, kind="stream", bm=16)
    plans = [fuser.plan(m, d, f, s1=2, s2=3, cluster=cl, **kw) for cl in ((1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 1, 2))]
    plans.append(fuser.plan(m, d, f, s1=1, s2=4, phases=1, **kw))  # one phase: each unit's H in shared memory
    # one phase, each unit spanning every l-tile: 16 d_ff slices whose l-tiles helper blocks share, the partials
    # of the real rows summed by every block after the last unit
    plans.append(fuser.plan(m, d, f, s1=1, s2=16, phases=1, lspan=4, **kw))
    # tokens on the M side (bm 64, 41 of 64 rows real): split partials of the real rows' fragments only, in
    # both phases' ticketed sums and in one phase's
    kw["bm"] = 64
    plans += [fuser.plan(m, d, f, s1=2, s2=2, **kw), fuser.plan(m, d, f, s1=1, s2=4, phases=1, **kw)]
    bad = max(check(m, d, f, p) for p in plans)
    ungated = fuser.plan(m, d, f, s1=2, s2=3, **dict(kw, bm=16, gated=False, activation="gelu"))
    return max(bad, check(m, d, f, ungated, gated=False, activation="gelu"))


def check(m, d, f, p, gated=True, activation="silu"):
    t = ffn_tensors(torch.Generator(device="cpu").manual_seed(0), m, d, f, d, gated=gated, bias=True,
                    dtype=torch.bfloat16)
    dev = {k: v.cuda() for k, v in t.items()}
    outs = []
    for _ in range(2):
        y = torch.full((m, d), float("nan"), device="cuda", dtype=torch.bfloat16)
        fuser.ffn(activation=activation, out=y, plan=p, **dev)
        outs.append(y)
    torch.cuda.synchronize()
    ys = [y.cpu() for y in outs]
    ref = fuser.ffn_reference(activation=activation, compute_dtype=torch.float64, **t)
    eager = fuser.ffn_reference(activation=activation, **t)
    err, err_eager = rel(ys[0], ref), rel(eager, ref)
    ok = err <= 2 * err_eager and not bool(torch.isnan(ys[0]).any()) and torch.equal(ys[0], ys[1])
    print("ok" if ok else "BAD", p.summary(), f"error {err:.2e} (eager on the CPU {err_eager:.2e})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
