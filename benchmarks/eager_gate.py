"""The eager route's gate kernel beside PyTorch's ops, in CUDA graphs, side by side in one process.

Per cell (a gated model's FFN at a token count, bfloat16):

  ops       fuser.reference.eager: PyTorch's five ops (up, gate, activation, product, down)
  fuser     _C.eager: the same GEMMs, the activation and product as fuser's gate kernel (what the eager
            route runs; bitwise the same output, checked here)
  compile   torch.compile(fuser.reference.eager) in its default mode (Inductor fuses the activation and
            product into one kernel), with --compile

  packed    _C.eager with the gate and up weights in one allocation (as fuser.optimize packs them), one GEMM
            for both and the gate kernel on its result's two halves (what FusedFFN's eager route runs); its
            output checked bitwise against the ops as one GEMM (the product written over the gate half, as
            the kernel leaves it), and its largest difference from the ops

two variants of the ops beside it, gate and up weights in one allocation (views of it, as the harness keeps them)
and as one GEMM over that allocation (what the harness's cuBLAS baseline does); and the gate step alone: PyTorch's activation and product against the gate kernel on the GEMMs' outputs (the
kernel works in place, so each of its calls first refills g from the GEMM's output: that copy is timed on its
own and taken off), with its floor: three passes of the intermediate (read g and u, write g) at the copy rate
measured in the same run.
With --kernels, each variant's CUDA kernels too: one call outside graphs under torch.profiler (the cuBLAS
algorithms a graph captures are the ones its calls choose), each kernel's name and time in launch order: which
GEMM kernels two variants of the same ops differ in, where their graphs' times do.
Every variant is a CUDA graph of calls over rotated input sets (enough that the 60 MB L2 holds nobody's next
inputs), replays interleaved in seeded orders, CUDA events, medians (fuser.tools.timing).

    python benchmarks/eager_gate.py [--cells llama3-8b:2048 ...] [--compile [--compile-from 512]] [--rounds 15]
                                    [--kernels] [--json FILE]
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

from fuser import _C
from fuser.module import packed_gate_up
from fuser.reference import ACTIVATIONS, eager
from fuser.tools.bench import parse_workload
from fuser.tools.timing import copy_gbs, graphed, hopper_reason, time_interleaved

CELLS = ("llama3-8b:1", "llama3-8b:128", "llama3-8b:512", "llama3-8b:2048", "llama3-8b:8192", "llama2-7b:2048",
         "llama-70b:2048", "S1:128", "S8:128")
L2_BYTES = 60e6


def kernels(fn):
    """[name, us] of each CUDA kernel one call of `fn` launches (after one call to warm it), in launch order."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ks = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    ks.sort(key=lambda e: e.time_range.start)
    return [[e.name, e.time_range.elapsed_us()] for e in ks]


def cell(name, rounds, compile_too, with_kernels=False):
    w = parse_workload(name)
    assert w.gated, f"{name}: not a gated FFN"
    m, d, f, act = w.m, w.d_model, w.d_ff, ACTIVATIONS[w.activation]
    per_set = 2 * (m * d + 5 * f * d + d * f + 3 * m * f + m * d)
    sets = max(1, min(8, int(2 * L2_BYTES // per_set) + 1))
    gen = torch.Generator(device="cuda").manual_seed(0)

    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=gen, device="cuda") * scale).bfloat16()

    ts = [dict(x=r(m, d), wu=r(f, d, scale=d ** -0.5), wg=r(f, d, scale=d ** -0.5), wd=r(w.d_out, f, scale=f ** -0.5))
          for _ in range(sets)]
    for t in ts:   # gate and up rows in one allocation, as the harness keeps them (and its cuBLAS baseline uses)
        t["wgu"] = torch.cat([t["wg"], t["wu"]])
        t["wg1"], t["wu1"] = t["wgu"][:f], t["wgu"][f:]
        t["pk"] = packed_gate_up(t["wg1"], t["wu1"])
    hs = [(F.linear(t["x"], t["wg"]), F.linear(t["x"], t["wu"])) for t in ts]
    gs = [g.clone() for g, _ in hs]   # the gate kernel's working copies, refilled from hs before each call

    def ops_ffn():
        for t in ts:
            eager(t["x"], t["wu"], t["wd"], t["wg"], None, None, None, act)

    def fuser_ffn():
        for t in ts:
            _C.eager(F.linear, act, t["x"], t["wu"], t["wd"], t["wg"], None, None, None)

    def fuser_packed():
        for t in ts:
            _C.eager(F.linear, act, t["x"], t["wu1"], t["wd"], t["wg1"], None, None, None, *t["pk"])

    def ops_views():
        for t in ts:
            eager(t["x"], t["wu1"], t["wd"], t["wg1"], None, None, None, act)

    def ops_one_gemm():
        for t in ts:
            p = F.linear(t["x"], t["wgu"])
            F.linear(act(p[:, :f]) * p[:, f:], t["wd"])

    def ops_gate():
        for g, u in hs:
            act(g) * u

    def refill():
        for g, (g0, _) in zip(gs, hs):
            g.copy_(g0)

    def fuser_gate():   # in place: refilled first, so every call sees the GEMM's values (refill timed apart)
        for g, (g0, u) in zip(gs, hs):
            g.copy_(g0)
            _C.gate(g, u, act)

    with torch.no_grad():
        t0 = ts[0]
        same = torch.equal(eager(t0["x"], t0["wu"], t0["wd"], t0["wg"], None, None, None, act),
                           _C.eager(F.linear, act, t0["x"], t0["wu"], t0["wd"], t0["wg"], None, None, None))
        n = _C.gate_info()["launches"]
        _C.eager(F.linear, act, t0["x"], t0["wu"], t0["wd"], t0["wg"], None, None, None)
        ran = _C.gate_info()["launches"] == n + 1
        p = F.linear(t0["x"], t0["wgu"])       # the ops as one GEMM, the product in place of its gate half
        p[:, :f].copy_(act(p[:, :f]) * p[:, f:])
        one = F.linear(p[:, :f], t0["wd"])
        packed = _C.eager(F.linear, act, t0["x"], t0["wu1"], t0["wd"], t0["wg1"], None, None, None, *t0["pk"])
        packed_same = torch.equal(packed, one)
        packed_diff = (packed.float() - eager(t0["x"], t0["wu"], t0["wd"], t0["wg"], None, None, None, act).float()
                       ).abs().max().item()
        calls = max(1, 4 // sets)
        variants = {"ops": ops_ffn, "fuser": fuser_ffn, "packed": fuser_packed, "ops gate step": ops_gate,
                    "refill + fuser gate step": fuser_gate, "refill": refill,
                    "ops, weights in one allocation": ops_views, "ops, one gate-and-up GEMM": ops_one_gemm}
        if compile_too:
            compiled = torch.compile(eager, dynamic=False)

            def compiled_ffn():
                for t in ts:
                    compiled(t["x"], t["wu"], t["wd"], t["wg"], None, None, None, act)
            compiled_ffn()
            variants["compile"] = compiled_ffn
        listed = {k: kernels(fn) for k, fn in variants.items()} if with_kernels else None
        graphs = {k: graphed(fn, calls) for k, fn in variants.items()}
        us = time_interleaved([(g, c * sets) for g, c in graphs.values()], rounds=rounds)
    out = dict(zip(variants, us), sets=sets, bitwise=same, gate_ran=ran, h_mb=m * f * 2 / 1e6,
               packed_bitwise_one_gemm=packed_same, packed_max_diff=packed_diff)
    out["fuser gate step"] = out["refill + fuser gate step"] - out["refill"]
    if listed is not None:
        out["kernels"] = listed
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cells", nargs="*", default=CELLS)
    p.add_argument("--compile", action="store_true", help="time torch.compile of the ops too")
    p.add_argument("--compile-from", type=int, default=512, help="... at this many tokens and more")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--kernels", action="store_true", help="list each variant's CUDA kernels and their times too")
    p.add_argument("--json")
    a = p.parse_args(argv)
    why = hopper_reason()
    if why:
        sys.exit(f"eager_gate.py needs a Hopper GPU: {why}")
    torch._dynamo.config.cache_size_limit = 64
    rate = copy_gbs()
    print(f"copy rate {rate:.0f} GB/s (read + write)")
    res = {"copy_gbs": rate, "cells": {}}
    for name in a.cells:
        c = cell(name, a.rounds, a.compile and parse_workload(name).m >= a.compile_from, a.kernels)
        floor = 3 * c["h_mb"] * 1e6 / (rate * 1e9) * 1e6
        c["gate_floor_us"] = floor
        res["cells"][name] = c
        extra = f", compile {c['compile']:.1f} ({c['ops'] / c['compile']:.3f}x)" if "compile" in c else ""
        print(f"{name:16s} ops {c['ops']:9.1f} us  fuser {c['fuser']:9.1f} ({c['ops'] / c['fuser']:.3f}x){extra}  | "
              f"gate step: ops {c['ops gate step']:7.1f}  fuser {c['fuser gate step']:7.1f} "
              f"(floor {floor:.1f}: {c['fuser gate step'] / floor:.2f}x)  bitwise {c['bitwise']}  ran {c['gate_ran']}")
        vs = f", {c['compile'] / c['packed']:.3f}x compile" if "compile" in c else ""
        print(f"{'':16s} packed {c['packed']:9.1f} ({c['ops'] / c['packed']:.3f}x ops{vs}; bitwise the ops as one "
              f"GEMM {c['packed_bitwise_one_gemm']}, max |diff| from the ops {c['packed_max_diff']:.2e})  ops with "
              f"gate and up in one allocation {c['ops, weights in one allocation']:9.1f}, as one GEMM "
              f"{c['ops, one gate-and-up GEMM']:9.1f}")
        for variant, ks in c.get("kernels", {}).items():
            total = sum(k[1] for k in ks)
            print(f"{'':16s} kernels of {variant} (one call per input set, outside graphs, {total:.1f} us):")
            for k, us in ks:
                print(f"{'':18s}{us:9.1f}  {k[:110]}")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
