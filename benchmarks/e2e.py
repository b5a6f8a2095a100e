"""End to end: a LLaMA-architecture model from a transformers config with random weights
(LLaMA-3-8B dimensions, a few decoder layers), optimized by fuser against the same model unoptimized,
in prefill (batch x sequence tokens) and decode (one new token per sequence over a static KV cache of
`--context` tokens, batch 1-32), in eager mode and replayed from a CUDA graph. Also the FFNs' share of
the unoptimized model's time (the model timed with its MLPs skipped), which bounds what any FFN
speed-up can give end to end.

Timing: the two models alternate (A B A B ...), CUDA events around each forward, medians. Outputs are
checked before timing: both models' logits against the same model in higher precision (float32 on a
GPU, float64 on the CPU), and the optimized model's error there may be at most 1.5x the unoptimized
one's (plus 1e-3): a deep random-weight model amplifies every rounding difference, so the optimized
model is held to what the unoptimized one achieves, not to a fixed tolerance.

    python benchmarks/e2e.py                              # H200: 4 layers, default phases
    python benchmarks/e2e.py --layers 2 --prefill 1x512 --decode 1,32
    python benchmarks/e2e.py --tiny                       # any machine: a small config on this device
    python benchmarks/e2e.py --fp8 --decode 1,32 --prefill ""   # FFNs in FP8 (fuser.quantize)

With --fp8 the optimized model's FFNs run in FP8 (``fuser.quantize``: e4m3 weights, static activation
scales calibrated on one forward of 256 sample tokens): its logits then differ from the bfloat16 model's
by the quantization itself, which is reported (against the reference and the unoptimized model), not held
to the 1.5x rule.

Without a CUDA GPU it runs the tiny configuration on the CPU in eager mode (CPU timer), as a smoke test.
"""
import argparse
import copy
import sys

import torch

import fuser
from fuser.tools.timing import graphed, time_interleaved


def build(args, device, dtype):
    import transformers as T
    if args.tiny:
        cfg = T.LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=256, max_position_embeddings=4096)
    else:
        cfg = T.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=args.layers,
                            num_attention_heads=32, num_key_value_heads=8, vocab_size=args.vocab,
                            max_position_embeddings=8192, rope_theta=500000.0)
    torch.manual_seed(0)
    with torch.device(device):
        model = T.LlamaForCausalLM(cfg).to(dtype).eval()
    return model


def interleaved(fns, iters, device):
    """Median microseconds of each function, run alternately (CUDA events on a GPU, else the CPU clock)."""
    return time_interleaved(fns, iters, warmup=2, cpu=device != "cuda")


class _SkipMLP(torch.nn.Module):
    """Stands in for a decoder layer's MLP to time the model without it (returns zeros: the residual add
    stays)."""

    def forward(self, x):
        return x.new_zeros(())  # broadcasts in the residual add


def steps(model, phase, batch, tokens, context, device):
    """A no-argument forward for the phase: prefill (batch x tokens, no cache) or decode (batch x 1 over a
    static cache already holding `context` tokens). Returns (step, inputs for the correctness check)."""
    from transformers import StaticCache
    g = torch.Generator(device="cpu").manual_seed(1)
    vocab = model.config.vocab_size
    if phase == "prefill":
        ids = torch.randint(vocab, (batch, tokens), generator=g).to(device)
        return lambda: model(input_ids=ids, use_cache=False).logits
    cache = StaticCache(config=model.config, max_cache_len=context + 8)
    ctx = torch.randint(vocab, (batch, context), generator=g).to(device)
    with torch.no_grad():
        model(input_ids=ctx, past_key_values=cache, cache_position=torch.arange(context, device=device),
              use_cache=True)
    tok = torch.randint(vocab, (batch, 1), generator=g).to(device)
    pos = torch.tensor([context], device=device)
    # transformers' static layers write where their own counter says (cumulative_length, advanced on each
    # call, also inside a replayed graph), not at cache_position: rewind it so every timed step decodes
    # token `context + 1` instead of running off the end of the cache.
    counters = [c for c in (getattr(layer, "cumulative_length", None) for layer in getattr(cache, "layers", ()))
                if isinstance(c, torch.Tensor)]

    def step():
        for c in counters:
            c.fill_(context)
        return model(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
    return step


def _rel(y, ref):
    return float((y - ref).norm() / ref.norm().clamp_min(1e-30))


def run_case(base, opt, ref, phase, batch, tokens, args, device, graphs):
    """One row: times of both models (eager and graphed), speedups, FFN share, logits errors (the optimized
    model against the unoptimized one, and each against `ref`, the model in higher precision)."""
    row = dict(phase=phase, batch=batch, tokens=tokens if phase == "prefill" else 1)
    with torch.no_grad():
        fa = steps(base, phase, batch, tokens, args.context, device)
        fb = steps(opt, phase, batch, tokens, args.context, device)
        ya, yb = fa().double(), fb().double()
        yr = steps(ref, phase, batch, tokens, args.context, device)().double()
        row.update(rel_error=_rel(yb, ya), base_ref_error=_rel(ya, yr), fuser_ref_error=_rel(yb, yr))
        ta, tb = interleaved([fa, fb], args.iters, device)
        row.update(base_us=ta, fuser_us=tb, speedup=ta / tb)
        layers = base.model.layers
        mlps = [layer.mlp for layer in layers]
        for layer in layers:
            layer.mlp = _SkipMLP()
        try:
            fs = steps(base, phase, batch, tokens, args.context, device)
            (t_skip,) = interleaved([fs], args.iters, device)
            gs = _graph_or_note(fs, row) if graphs else None
        finally:
            for layer, m in zip(layers, mlps):
                layer.mlp = m
        row["ffn_share"] = max(0.0, 1 - t_skip / ta)
        if graphs:
            ga, gb = _graph_or_note(fa, row), _graph_or_note(fb, row)
            if ga and gb:
                ga_us, gb_us = interleaved([ga, gb], args.iters, device)
                row.update(base_graph_us=ga_us, fuser_graph_us=gb_us, graph_speedup=ga_us / gb_us)
                if gs:
                    # in a graph the GPU's time alone: eager decode is host-bound, and skipping the MLPs
                    # there mostly removes host work
                    (t_skip_graph,) = interleaved([gs], args.iters, device)
                    row["ffn_share_graph"] = max(0.0, 1 - t_skip_graph / ga_us)
    return row


def _graph_or_note(fn, row):
    """fn captured in a CUDA graph (its replay), or None with the reason noted in the row."""
    try:
        return graphed(fn, 1)[0]
    except Exception as e:  # noqa: BLE001 (reported in the row, not fatal)
        row["graph_note"] = f"capture failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
        return None


def table(rows):
    out = ["| phase | batch x tokens | unoptimized us | fuser us | speedup | graph: unoptimized us | graph: fuser us | "
           "graph speedup | FFN share (eager) | FFN share (graph) | logits rel. error | vs reference: unoptimized / "
           "fuser |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g = (f"{r['base_graph_us']:,.1f} | {r['fuser_graph_us']:,.1f} | {r['graph_speedup']:.2f}x"
             if "base_graph_us" in r else f"{r.get('graph_note', 'not run')} | | ")
        out.append(f"| {r['phase']} | {r['batch']} x {r['tokens']} | {r['base_us']:,.1f} | {r['fuser_us']:,.1f} | "
                   f"{r['speedup']:.2f}x | {g} | {r['ffn_share']:.0%} | "
                   + (f"{r['ffn_share_graph']:.0%}" if "ffn_share_graph" in r else "") + f" | {r['rel_error']:.1e} | "
                   f"{r['base_ref_error']:.1e} / {r['fuser_ref_error']:.1e} |")
    return "\n".join(out)


def parse_pairs(text):
    try:
        return [tuple(int(v) for v in p.split("x")) for p in text.split(",") if p]
    except ValueError:
        raise SystemExit(f"--prefill: expected BATCHxTOKENS[,...], e.g. 1x512,4x512; got {text!r}") from None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--prefill", default="1x512,4x512,1x2048", help="BATCHxTOKENS list")
    ap.add_argument("--decode", default="1,8,32", help="batch sizes of the decode step")
    ap.add_argument("--context", type=int, default=512, help="tokens already in the KV cache when decoding")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--tiny", action="store_true", help="a small config (the default without a CUDA GPU)")
    ap.add_argument("--fp8", action="store_true", help="the optimized model's FFNs in FP8 (fuser.quantize)")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        args.tiny = True
        print("no CUDA GPU: the tiny configuration on the CPU, eager only, CPU timer", file=sys.stderr)
    if args.tiny and args.prefill == ap.get_default("prefill"):
        args.prefill, args.context = "1x16,2x16", 16
    dtype = torch.bfloat16 if device == "cuda" or args.fp8 else torch.float32
    base = build(args, device, dtype)
    if args.fp8:   # calibrated on one forward of 256 sample tokens
        calib = torch.randint(base.config.vocab_size, (1, 256), generator=torch.Generator().manual_seed(2)).to(device)
        opt = fuser.quantize(copy.deepcopy(base), input_ids=calib, use_cache=False)
    else:
        opt = fuser.optimize(copy.deepcopy(base))
    ref = copy.deepcopy(base).to(torch.float32 if device == "cuda" else torch.float64)
    rep = fuser.report(opt)
    print(f"model: {type(base).__name__}, {base.config.num_hidden_layers} layers, hidden {base.config.hidden_size}, "
          f"intermediate {base.config.intermediate_size}, vocab {base.config.vocab_size}, {dtype}, {device}; "
          f"fuser: {len(rep.fused)} FFN(s) swapped" + (", in FP8" if args.fp8 else ""))
    cases = [("prefill", b, t) for b, t in parse_pairs(args.prefill)]
    cases += [("decode", int(b), 1) for b in args.decode.split(",") if b]
    rows = []
    for phase, b, t in cases:
        rows.append(run_case(base, opt, ref, phase, b, t, args, device, graphs=device == "cuda"))
        r = rows[-1]
        print(f"  {phase:7s} {b} x {r['tokens']}: {r['base_us']:,.1f} vs {r['fuser_us']:,.1f} us ({r['speedup']:.2f}x), "
              f"FFN share {r['ffn_share']:.0%}, error {r['rel_error']:.1e} (against the reference: unoptimized "
              f"{r['base_ref_error']:.1e}, fuser {r['fuser_ref_error']:.1e})", flush=True)
    print(table(rows))
    bad = [r for r in rows if not r["fuser_ref_error"] <= 1.5 * r["base_ref_error"] + 1e-3]
    if bad and not args.fp8:
        print(f"the optimized model's logits are further from the reference than 1.5x the unoptimized model's "
              f"(+1e-3) in {len(bad)} case(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
