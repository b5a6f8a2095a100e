"""The eager route of plain FFNs with a bias and ReLU or tanh GELU (GPT-2's, OPT's): the up projection, bias and
activation as one cuBLASLt GEMM with an epilogue (``torch._addmm_activation``), beside PyTorch's ops, in CUDA graphs,
side by side in one process.

Per cell (a model's FFN at a token count, bfloat16, with biases):

  ops       fuser.reference.eager: linear (bias in cuBLASLt's epilogue), the activation, linear
  fuser     _C.eager: what fuser's eager route runs there (the activation in the first GEMM's epilogue); its output
            checked bitwise against torch._addmm_activation then linear, and its largest difference from the ops
  compile   torch.compile(fuser.reference.eager) in its default mode, with --compile

and the floor of the step removed: two passes of the intermediate (the activation reads and writes it) at the copy
rate measured in the same run. Every variant is a CUDA graph of calls over rotated input sets (enough that the 60 MB
L2 holds nobody's next inputs), replays interleaved in seeded orders, CUDA events, medians (fuser.tools.timing).

With --zero-bias the cells are FFNs without biases (the paper's G chains, T5's), and fuser is its eager route with
the zero-bias epilogue switched on for the run (``_C.zero_bias_setup`` from 2 tokens; ``runtime.ZERO_BIAS_MIN_TOKENS``
says where it is on by default): the activation in the first GEMM's epilogue over a zero bias kept in C, its output
checked bitwise against ``torch._addmm_activation`` over zeros then linear (docs/kernels.md, "Next kernels" 12). Its
largest difference from the ops is reported (ReLU: the same values but for the GEMM's own accumulation order).

    python benchmarks/eager_epilogue.py [--cells gpt2:2048 ...] [--zero-bias] [--compile] [--rounds 15] [--json FILE]
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

from fuser import _C, runtime
from fuser.reference import ACTIVATIONS, eager
from fuser.tools.timing import copy_gbs, graphed, hopper_reason, time_interleaved

#: model -> (d_model, d_ff, activation): FFNs with biases whose activation cuBLASLt's epilogue computes
MODELS = {"gpt2": (768, 3072, "gelu_tanh"), "gpt2-medium": (1024, 4096, "gelu_tanh"),
          "gpt2-xl": (1600, 6400, "gelu_tanh"), "opt-1.3b": (2048, 8192, "relu"), "opt-2.7b": (2560, 10240, "relu"),
          "opt-6.7b": (4096, 16384, "relu"), "opt-13b": (5120, 20480, "relu")}
CELLS = ("gpt2:512", "gpt2:2048", "gpt2:8192", "gpt2-medium:2048", "gpt2-xl:2048", "opt-1.3b:2048", "opt-6.7b:2048")
#: model -> (d_model, d_ff, activation): FFNs without biases (the paper's plain chains, T5's)
BIASLESS = {"G4": (768, 3072, "relu"), "G6": (1024, 4096, "relu"), "G7": (768, 768, "relu"),
            "G8": (2048, 8192, "relu"), "G9": (512, 2048, "relu"), "G10": (384, 1536, "relu"),
            "t5-large": (1024, 4096, "relu"), "t5-3b": (1024, 16384, "relu")}
BIASLESS_CELLS = ("G4:128", "G6:128", "G7:128", "G8:128", "G9:128", "G10:128", "G4:1", "G4:16", "t5-large:1",
                  "t5-large:16", "t5-large:512", "t5-large:2048", "t5-3b:2048")
L2_BYTES = 60e6
#: a cell loses where fuser's time is this much over the ops' (ratios of medians move by ~1% between runs)
LOSS_TOLERANCE = 0.01


def zero_bias_verdict(cells):
    """From timed --zero-bias cells ({name: {"ops": us, "fuser": us, ...}}, names MODEL:TOKENS): the token rows
    from which to take the zero bias (2 where no cell loses, else the least timed count above every losing cell's;
    None where the largest still loses), and the worst cell as (name, ops / fuser), so that
    ``runtime.ZERO_BIAS_MIN_TOKENS`` is set from the measurement. Cells of one token are left out: the zero bias
    never applies there (torch would copy it into the result first), so fuser ran the ops.

    Example:
        >>> zero_bias_verdict({"G4:1": {"ops": 10.0, "fuser": 11.0}, "G4:2": {"ops": 10.0, "fuser": 10.5},
        ...                    "G4:16": {"ops": 10.0, "fuser": 9.0}, "G4:128": {"ops": 20.0, "fuser": 17.0}})
        (16, ('G4:2', 0.952))
    """
    tokens = {n: int(n.rsplit(":", 1)[1]) for n in cells}
    speed = {n: c["ops"] / c["fuser"] for n, c in cells.items() if tokens[n] >= 2}
    if not speed:
        return None, None
    worst = min(speed, key=speed.get)
    losing = [tokens[n] for n, v in speed.items() if v < 1 - LOSS_TOLERANCE]
    above = sorted(tokens[n] for n in speed if losing and tokens[n] > max(losing))
    return (2 if not losing else above[0] if above else None), (worst, round(speed[worst], 3))


def cell(name, rounds, compile_too, zero_bias=False):
    model, m = name.split(":")
    d, f, act_name = (BIASLESS if zero_bias else MODELS)[model]
    m, act = int(m), ACTIVATIONS[act_name]
    per_set = 2 * (m * d + 2 * f * d + f + d + 2 * m * f + m * d)
    sets = max(1, min(8, int(2 * L2_BYTES // per_set) + 1))
    gen = torch.Generator(device="cuda").manual_seed(0)

    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=gen, device="cuda") * scale).bfloat16()

    ts = [dict(x=r(m, d), wu=r(f, d, scale=d ** -0.5), bu=None if zero_bias else r(f, scale=0.1),
               wd=r(d, f, scale=f ** -0.5), bd=None if zero_bias else r(d, scale=0.1)) for _ in range(sets)]
    gelu = act_name == "gelu_tanh"

    def ops_ffn():
        for t in ts:
            eager(t["x"], t["wu"], t["wd"], None, t["bu"], None, t["bd"], act)

    def fuser_ffn():
        for t in ts:
            _C.eager(F.linear, act, t["x"], t["wu"], t["wd"], None, t["bu"], None, t["bd"])

    with torch.no_grad():
        t0 = ts[0]
        # (with zero_bias: the call outside any graph makes the zero bias the graphs then read)
        y = _C.eager(F.linear, act, t0["x"], t0["wu"], t0["wd"], None, t0["bu"], None, t0["bd"])
        bias = torch.zeros(f, device="cuda", dtype=torch.bfloat16) if zero_bias else t0["bu"]
        h = torch._addmm_activation(bias, t0["x"], t0["wu"].t(), use_gelu=gelu)
        # (one token takes no epilogue: torch would copy the bias into the result first; the ops run there)
        same = torch.equal(y, F.linear(h, t0["wd"], t0["bd"])) if m >= 2 or not zero_bias else None
        ref = eager(t0["x"], t0["wu"], t0["wd"], None, t0["bu"], None, t0["bd"], act)
        diff = (y.float() - ref.float()).abs().max().item()
        calls = max(1, 4 // sets)
        variants = {"ops": ops_ffn, "fuser": fuser_ffn}
        if compile_too:
            compiled = torch.compile(eager, dynamic=False)

            def compiled_ffn():
                for t in ts:
                    compiled(t["x"], t["wu"], t["wd"], None, t["bu"], None, t["bd"], act)
            compiled_ffn()
            variants["compile"] = compiled_ffn
        graphs = {k: graphed(fn, calls) for k, fn in variants.items()}
        us = time_interleaved([(g, c * sets) for g, c in graphs.values()], rounds=rounds)
    return dict(zip(variants, us), sets=sets, epilogue_bitwise=same, max_diff_from_ops=diff, h_mb=m * f * 2 / 1e6)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cells", nargs="*")
    p.add_argument("--zero-bias", action="store_true",
                   help="FFNs without biases, the candidate being the epilogue given a zero bias")
    p.add_argument("--compile", action="store_true", help="time torch.compile of the ops too")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--json")
    a = p.parse_args(argv)
    models = BIASLESS if a.zero_bias else MODELS
    a.cells = a.cells or (BIASLESS_CELLS if a.zero_bias else CELLS)
    for name in a.cells:
        if name.split(":")[0] not in models or not name.split(":")[-1].isdigit():
            p.error(f"--cells: {name!r} is not MODEL:TOKENS with MODEL one of {', '.join(models)}")
    why = hopper_reason()
    if why:
        sys.exit(f"eager_epilogue.py needs a Hopper GPU: {why}")
    torch._dynamo.config.cache_size_limit = 64
    rate = copy_gbs()
    print(f"copy rate {rate:.0f} GB/s (read + write)")
    res = {"copy_gbs": rate, "zero_bias": a.zero_bias, "cells": {}}
    was = _C.zero_bias_setup(runtime.zero_bias, 2) if a.zero_bias else None
    try:
        for name in a.cells:
            c = cell(name, a.rounds, a.compile, a.zero_bias)
            c["step_floor_us"] = 2 * c["h_mb"] * 1e6 / (rate * 1e9) * 1e6
            res["cells"][name] = c
            extra = (f", compile {c['compile']:.1f} (fuser {c['compile'] / c['fuser']:.3f}x it)" if "compile" in c
                     else "")
            print(f"{name:18s} ops {c['ops']:8.1f} us  fuser {c['fuser']:8.1f} ({c['ops'] / c['fuser']:.3f}x){extra}  "
                  f"activation pass floor {c['step_floor_us']:.1f}  bitwise _addmm_activation "
                  f"{c['epilogue_bitwise']}, max |diff| from the ops {c['max_diff_from_ops']:.2e}")
    finally:
        if was is not None:
            _C.zero_bias_setup(*was)
    verdict = zero_bias_verdict(res["cells"]) if a.zero_bias else (None, None)
    if verdict[1]:
        t, (name, speed) = verdict
        res["min_tokens"] = t
        print(f"zero bias: worst cell {name} at {speed:.3f}x the ops; "
              + (f"none over {LOSS_TOLERANCE:.0%} slower than the ops from {t} tokens: ZERO_BIAS_MIN_TOKENS = {t}"
                 if t else "a cell loses at every token count: leave ZERO_BIAS_MIN_TOKENS = 0"))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
