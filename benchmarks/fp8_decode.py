"""FP8 (W8A8) decode FFNs on a Hopper GPU: the fused FP8 kernel against PyTorch eager in bfloat16 and
against PyTorch's own FP8 path, at the token counts of decoding.

Shapes (d_model -> d_ff, activation): LLaMA-2-7B 4096 -> 11008 gated silu, LLaMA-3-8B 4096 -> 14336 gated
silu, LLaMA-70B 8192 -> 28672 gated silu, GPT-3 6.7B 4096 -> 16384 plain gelu; M tokens (default 1, 16,
64, 128). Random weights (std 0.02), x normal (std 1); the FP8 scales from ``fuser.fp8.quantize_ffn`` on 256
other sample tokens (per-row weight scales, static per-tensor scales for x and the hidden activation H).

Variants, each one call of the FFN on [M, d_model] activations:
  eager      the bfloat16 FFN in PyTorch ops (``fuser.reference.eager``: F.linear, act, mul, F.linear)
  torch fp8  ``fuser.fp8.torch_path``: x quantized in PyTorch elementwise ops, ``torch._scaled_mm`` GEMMs with
             bfloat16 results, act(G) * U in bfloat16, H quantized, ``torch._scaled_mm`` down; its default
             recipe (tensorwise GEMMs, the per-row weight scales multiplied into their results: the faster
             one at decode sizes)
  torch rowwise  the same with rowwise ``_scaled_mm`` scales (the per-row weight scales inside the GEMM)
  fused      ``fuser.ffn(x, w_up_q, w_down_q, w_gate=..., scales=fuser.fp8.Scales(...))``: x in bfloat16, which
             the kernel quantizes as it loads it (left out, with the reason printed, where the call fails); the
             planner's route, so PyTorch's FP8 ops (``fuser.fp8.eager``) where it prefers them
  fused plan the same call with the planner's best fused plan forced (``plan=``), timed only where the route
             is not a fused plan: what the kernel would have given there
  quantize   ``fuser.fp8.quantize(x, scales.x)`` alone: what x's quantization costs torch fp8 (three ops)

Timing: every variant is captured in a CUDA graph of L calls (``fuser.tools.timing.graphed``) that walk L
copies of the weights, so the 60 MB L2 holds none of a call's weights from the call before; the replays are
timed side by side, interleaved, each round in its own random order, CUDA events around each replay, medians
over rounds (``fuser.tools.timing.time_interleaved``), reported per call.

Reported per row: the planner's route (its plan's summary; the fused plan forced beside it where that is PyTorch's
ops); the median us of each variant; eager / fused and torch / fused, where torch is the faster of PyTorch's two
FP8 recipes in that row; the floor (the weights' bytes at 4.8 TB/s, the H200's HBM peak) for bfloat16 and FP8 weights; the achieved
weight stream of eager (bfloat16 bytes) and of torch and fused (FP8 bytes) in GB/s; the relative errors
(||y - ref|| / ||ref||) of torch fp8 and fused against the eager bfloat16 output, of fused against
``fuser.fp8.reference`` (the kernel's exact definition), and of reference itself against eager (the FP8
recipe's own error).

    python benchmarks/fp8_decode.py
    python benchmarks/fp8_decode.py --models llama3-8b,llama-70b --tokens 1,16 --rounds 30 --json fp8.json

Needs a Hopper GPU (sm_90); elsewhere it says why and exits with status 2.
"""
import argparse
import itertools
import json
import sys

import torch

import fuser
from fuser import fp8
from fuser.reference import ACTIVATIONS, eager
from fuser.tools.timing import graphed, hopper_reason, time_interleaved

#: name -> (d_model, d_ff, gated, activation)
MODELS = {
    "llama2-7b": (4096, 11008, True, "silu"),
    "llama3-8b": (4096, 14336, True, "silu"),
    "llama-70b": (8192, 28672, True, "silu"),
    "gpt3-6.7b": (4096, 16384, False, "gelu"),
}
HBM_BYTES_PER_S = 4.8e12     # the H200's HBM3e peak
VARIANTS = ("eager", "torch fp8", "torch rowwise", "fused", "fused plan", "quantize")


def rel(y, ref):
    y, ref = y.double(), ref.double()
    return float((y - ref).norm() / ref.norm().clamp_min(1e-300))


def weight_sets(name, copies, device):
    """The model's FFN: bfloat16 weights, their FP8 quantization, each in `copies` copies (copy 0 the one the
    errors are measured on), and the number of weight bytes per call in bfloat16 and in FP8."""
    d_model, d_ff, gated, activation = MODELS[name]
    g = torch.Generator(device=device).manual_seed(0)

    def randn(*shape, std=0.02):
        return (torch.randn(*shape, generator=g, device=device) * std).to(torch.bfloat16)
    w = dict(w_up=randn(d_ff, d_model), w_down=randn(d_model, d_ff), w_gate=randn(d_ff, d_model) if gated else None)
    samples = torch.randn(256, d_model, generator=g, device=device).to(torch.bfloat16)
    q = fp8.quantize_ffn(w["w_up"], w["w_down"], w_gate=w["w_gate"], x_samples=samples, activation=activation)
    qw = dict(w_up=q.w_up, w_down=q.w_down, w_gate=q.w_gate)
    bf16 = [w] + [{k: None if t is None else t.clone() for k, t in w.items()} for _ in range(copies - 1)]
    f8 = [qw] + [{k: None if t is None else t.clone() for k, t in qw.items()} for _ in range(copies - 1)]
    n = sum(t.numel() for t in w.values() if t is not None)
    return bf16, f8, q.scales, n * 2, n


def copies_that_fit(name, wanted):
    """At most `wanted` weight copies (bfloat16 and FP8 sets), as many as fit in half the free GPU memory,
    at least 1."""
    d_model, d_ff, gated, _ = MODELS[name]
    per_copy = (3 if gated else 2) * d_model * d_ff * 3           # 2 bytes bfloat16 + 1 byte FP8
    free, _ = torch.cuda.mem_get_info()
    return max(1, min(wanted, int(free * 0.5 // per_copy)))


def cycling(step, copies):
    """A no-argument function that calls step(i) for i = 0, 1, ..., copies - 1, 0, ...: a graph of `copies`
    calls of it reads every weight copy once."""
    it = itertools.cycle(range(copies))
    return lambda: step(next(it))


def fused_or_reason(x, f8, scales, activation):
    """(the fused call's output, None), or (None, why it is left out) where fuser.ffn fails on these tensors."""
    try:
        y = fuser.ffn(x, f8["w_up"], f8["w_down"], w_gate=f8["w_gate"], activation=activation, scales=scales)
    except TypeError as e:
        return None, f"fuser.ffn does not take FP8 inputs with scales= here: {str(e).splitlines()[0]}"
    except Exception as e:  # noqa: BLE001 (any failure leaves the variant out, with its reason)
        return None, f"fuser.ffn raised {type(e).__name__}: {str(e).splitlines()[0]}"
    expect = (x.shape[0], scales.down.numel())
    if not (isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and y.shape == expect):
        what = f"{y.dtype} {list(y.shape)}" if isinstance(y, torch.Tensor) else type(y).__name__
        return None, f"fuser.ffn returned {what}, not bfloat16 [M, d_out]"
    return y, None


def run_row(name, m, bf16, f8, scales, bytes_bf16, bytes_fp8, rounds):
    d_model, d_ff, gated, activation = MODELS[name]
    act, copies = ACTIVATIONS[activation], len(bf16)
    g = torch.Generator(device="cuda").manual_seed(1000 + m)
    x = torch.randn(m, d_model, generator=g, device="cuda").to(torch.bfloat16)
    x_q = fp8.quantize(x, scales.x)
    pick = fuser.plan(m, d_model, d_ff, gated=gated, activation=activation, dtype="float8_e4m3fn")
    forced = None if pick.fused else fuser.plan(m, d_model, d_ff, gated=gated, activation=activation,
                                                dtype="float8_e4m3fn", fused=True)
    row = dict(model=name, tokens=m, copies=copies, route=pick.summary(),
               fused_plan=None if forced is None else forced.summary())

    # outputs on copy 0, before any timing: torch_path's first call also settles its _scaled_mm recipe
    # outside graph capture
    y_bf16 = eager(x, bf16[0]["w_up"], bf16[0]["w_down"], bf16[0]["w_gate"], None, None, None, act)
    y_torch = fp8.torch_path(x, f8[0]["w_up"], f8[0]["w_down"], scales, w_gate=f8[0]["w_gate"], activation=activation)
    y_rowwise = fp8.torch_path(x, f8[0]["w_up"], f8[0]["w_down"], scales, w_gate=f8[0]["w_gate"],
                               activation=activation, recipe="rowwise")
    y_ref = fp8.reference(x_q, f8[0]["w_up"], f8[0]["w_down"], scales, w_gate=f8[0]["w_gate"], activation=activation)
    y_fused, why = fused_or_reason(x, f8[0], scales, activation)
    row.update(err_ref=rel(y_ref, y_bf16), err_torch=rel(y_torch, y_bf16), err_torch_ref=rel(y_torch, y_ref),
               err_rowwise_ref=rel(y_rowwise, y_ref),
               torch_recipe=fp8.SCALED_MM_RECIPES.get((x.device, m % 16 == 0, None)))
    if y_fused is not None:
        row.update(err_fused=rel(y_fused, y_bf16), err_fused_ref=rel(y_fused, y_ref))
    else:
        row["fused_note"] = why

    def fused(i, plan=None):
        w = f8[i]
        return fuser.ffn(x, w["w_up"], w["w_down"], w_gate=w["w_gate"], activation=activation, scales=scales,
                         plan=plan)
    steps = {
        "eager": lambda i: eager(x, bf16[i]["w_up"], bf16[i]["w_down"], bf16[i]["w_gate"], None, None, None, act),
        "torch fp8": lambda i: fp8.torch_path(x, f8[i]["w_up"], f8[i]["w_down"], scales, w_gate=f8[i]["w_gate"],
                                              activation=activation),
        "torch rowwise": lambda i: fp8.torch_path(x, f8[i]["w_up"], f8[i]["w_down"], scales, w_gate=f8[i]["w_gate"],
                                                  activation=activation, recipe="rowwise"),
        "quantize": lambda i: fp8.quantize(x, scales.x),
    }
    if y_fused is not None:
        steps["fused"] = fused
        if forced is not None:
            steps["fused plan"] = lambda i: fused(i, forced)
    names = [v for v in VARIANTS if v in steps]
    graphs = [graphed(cycling(steps[v], copies), copies) for v in names]
    times = dict(zip(names, time_interleaved(graphs, rounds, warmup=2)))
    for v in names:
        row[f"{v}_us"] = times[v]
    torch_us = min(times["torch fp8"], times["torch rowwise"])
    row.update(torch_best="torch fp8" if torch_us == times["torch fp8"] else "torch rowwise",
               floor_bf16_us=bytes_bf16 / HBM_BYTES_PER_S * 1e6, floor_fp8_us=bytes_fp8 / HBM_BYTES_PER_S * 1e6,
               eager_gbs=bytes_bf16 / times["eager"] / 1e3, torch_gbs=bytes_fp8 / torch_us / 1e3)
    if "fused" in times:
        row.update(eager_over_fused=times["eager"] / times["fused"], torch_over_fused=torch_us / times["fused"],
                   fused_gbs=bytes_fp8 / times["fused"] / 1e3)
    return row


def line(r):
    t = " ".join(f"{v} {r[v + '_us']:.1f}" for v in VARIANTS if v + "_us" in r)
    s = (f"{r['model']} M={r['tokens']}: {t} us; floor bf16 {r['floor_bf16_us']:.1f} / fp8 {r['floor_fp8_us']:.1f} us; "
         f"GB/s eager {r['eager_gbs']:.0f} torch {r['torch_gbs']:.0f}")
    if "fused_gbs" in r:
        s += (f" fused {r['fused_gbs']:.0f}; eager/fused {r['eager_over_fused']:.2f}x torch/fused "
              f"{r['torch_over_fused']:.2f}x; err vs bf16: torch {r['err_torch']:.1e} fused {r['err_fused']:.1e}, "
              f"fused vs reference {r['err_fused_ref']:.1e}")
    else:
        s += f"; err vs bf16: torch {r['err_torch']:.1e}; fused left out: {r['fused_note']}"
    return s


def table(rows):
    def f(r, k, spec):
        return format(r[k], spec) if k in r else "-"
    out = ["| model | M | eager us | torch fp8 us | torch rowwise us | fused us | fused plan us | quantize us | "
           "eager / fused | torch / fused | floor bf16 / fp8 us | GB/s eager / torch / fused | "
           "error vs bf16: reference / torch / fused | fused vs reference |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r['model']} | {r['tokens']} | {f(r, 'eager_us', '.1f')} | {f(r, 'torch fp8_us', '.1f')} | "
            f"{f(r, 'torch rowwise_us', '.1f')} | "
            f"{f(r, 'fused_us', '.1f')} | {f(r, 'fused plan_us', '.1f')} | {f(r, 'quantize_us', '.1f')} | "
            f"{f(r, 'eager_over_fused', '.2f')}x | {f(r, 'torch_over_fused', '.2f')}x | "
            f"{r['floor_bf16_us']:.1f} / {r['floor_fp8_us']:.1f} | "
            f"{r['eager_gbs']:.0f} / {r['torch_gbs']:.0f} / {f(r, 'fused_gbs', '.0f')} | "
            f"{r['err_ref']:.1e} / {r['err_torch']:.1e} / {f(r, 'err_fused', '.1e')} | "
            f"{f(r, 'err_fused_ref', '.1e')} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of: {', '.join(MODELS)}")
    ap.add_argument("--tokens", default="1,16,64,128", help="comma-separated token counts M")
    ap.add_argument("--rounds", type=int, default=20, help="timed rounds (medians over them)")
    ap.add_argument("--copies", type=int, default=4,
                    help="weight copies walked by each graph (fewer where GPU memory runs short)")
    ap.add_argument("--json", metavar="PATH", help="write the rows and the setup here")
    a = ap.parse_args(argv)
    models = [s for s in a.models.split(",") if s]
    unknown = [s for s in models if s not in MODELS]
    if unknown:
        ap.error(f"--models: unknown {', '.join(unknown)}; expected some of {', '.join(MODELS)}")
    try:
        tokens = [int(t) for t in a.tokens.split(",") if t]
    except ValueError:
        ap.error(f"--tokens: expected comma-separated integers, got {a.tokens!r}")
    why = hopper_reason()
    if why is not None:
        print(f"fp8_decode.py times FP8 kernels on a Hopper GPU (torch._scaled_mm and the fused kernel): {why}",
              file=sys.stderr)
        return 2
    torch.set_grad_enabled(False)
    setup = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                 fuser=fuser.__version__, rounds=a.rounds, hbm_bytes_per_s=HBM_BYTES_PER_S)
    print(f"{setup['gpu']}, torch {setup['torch']} (CUDA {setup['cuda']}), fuser {setup['fuser']}; medians of "
          f"{a.rounds} interleaved rounds of CUDA-graph replays, us per call", flush=True)
    rows = []
    for name in models:
        copies = copies_that_fit(name, a.copies)
        bf16, f8, scales, bytes_bf16, bytes_fp8 = weight_sets(name, copies, "cuda")
        print(f"== {name} {MODELS[name]}: {copies} weight copies, {bytes_bf16 / 1e9:.2f} GB bf16 / "
              f"{bytes_fp8 / 1e9:.2f} GB fp8 per call", flush=True)
        for m in tokens:
            rows.append(run_row(name, m, bf16, f8, scales, bytes_bf16, bytes_fp8, a.rounds))
            print("  " + line(rows[-1]), flush=True)
        del bf16, f8
        torch.cuda.empty_cache()
    setup["torch_fp8_recipes"] = {f"{dev}, M multiple of 16: {mult}, asked: {asked}": list(v)
                                  for (dev, mult, asked), v in fp8.SCALED_MM_RECIPES.items()}
    print(f"torch._scaled_mm recipes used (scales, rows padded to): {setup['torch_fp8_recipes']}")
    print(table(rows))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(setup=setup, rows=rows), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
