"""One small stream plan (swap-AB, both phases K-split, biases, ragged tokens) launched twice, checked
against float64: the workload for compute-sanitizer on the stream kernel.

    compute-sanitizer --tool racecheck --kernel-name regex=fuser_ffn python tests/gpu/sanitize_stream.py"""
import sys

import torch

import fuser
from plan_check import check_plan, ffn_tensors


def main():
    p = fuser.plan(9, 512, 2048, gated=True, activation="silu", bias=True, target="h200", fused=True,
                   kind="stream", bm=16, s1=2, s2=3)
    t = ffn_tensors(torch.Generator(device="cuda").manual_seed(0), 9, 512, 2048, 512, gated=True, bias=True,
                    dtype=torch.bfloat16)
    r = check_plan(p, "silu", t, runs=2)
    print("ok" if r["ok"] else "BAD", p.summary(), r)
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
