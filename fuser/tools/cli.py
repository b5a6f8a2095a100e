"""The command line: ``python -m fuser <command>``.

Commands:
    env     what fuser found (driver, GPU, NVRTC, cache) and whether the fused path is available
    plan    plan one FFN shape and explain the choice (or print the top plans, or the JSON)
    demo    build a small random LLaMA (transformers config, no download), fuser.optimize it, print the
            report, check its logits against the unoptimized model, and on Hopper time both
    explain optimize the same LLaMA, print the report and, for each distinct FFN shape at a token count,
            what runs it on this machine and the planner's explanation
    warmup  compile ahead of time every fused kernel the LLaMA's FFNs could need at some token counts
            (needs NVRTC)
    bench   time fuser against PyTorch eager, CUDA graphs, torch.compile, cuBLAS and the floor (Hopper GPU)
    calibrate  measure this GPU's cost-model constants and store them where the planner picks them up

A value no command can take (``--tokens 0``, ``--dataflow bogus``, ``--target a100``, a plan no search
can satisfy) is a usage error: one line on stderr after the usage, exit status 2, as argparse answers.
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import sys

import torch

import fuser
from fuser import _C
from fuser.planner import DATAFLOWS
from fuser.tools import bench, bench_report, calibrate, compat, targets, warm
from fuser.tools.timing import hopper_reason, time_interleaved


class UsageError(Exception):
    """A combination of option values the command cannot take; ``main`` reports it as argparse does."""


#: the largest count an option takes (tokens, widths): the planner's products of two stay within int64
_MAX_COUNT = 2**31 - 1


def _integer(lo):
    """An option type: an integer from `lo` to ``_MAX_COUNT``."""
    def parse(text):
        try:
            n = int(text)
        except ValueError:
            n = lo - 1
        if not lo <= n <= _MAX_COUNT:
            raise argparse.ArgumentTypeError(f"expected an integer from {lo} to {_MAX_COUNT}, got {text!r}")
        return n
    return parse


_count = _integer(1)   # tokens, widths, layers, repetitions
_index = _integer(0)   # a device ordinal, a seed


def _seconds(text):
    """A finite number of seconds, 0 or more."""
    try:
        t = float(text)
    except ValueError:
        t = -1.0
    if not t >= 0 or t == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds from 0, got {text!r}")
    return t


def _token_counts(text):
    """Comma-separated positive token counts, such as 1,16,128."""
    parts = text.split(",")
    try:   # every part a count: an empty one ("1,,2", "16,") is a typo, not something to skip
        counts = tuple(_count(t) for t in parts) if all(t.strip() for t in parts) else ()
    except argparse.ArgumentTypeError:
        counts = ()
    if counts:
        return counts
    raise argparse.ArgumentTypeError(f"expected comma-separated positive token counts such as 1,16,128, got {text!r}")


def _planned(fn, *args, **kw):
    """``fuser.plan``/``fuser.plans`` with the command's values: what they refuse is a usage error."""
    try:
        return fn(*args, **kw)
    except (ValueError, OverflowError) as e:
        raise UsageError(str(e)) from None


def _cmd_env(args):
    print(fuser.env(args.device))
    return 0


def _cmd_plan(args):
    kw = dict(d_out=args.d_out, gated=args.gated, activation=args.activation, bias=args.bias, dtype=args.dtype,
              target=args.target)
    if args.fused is not None:
        kw["fused"] = args.fused == "yes"
    if args.dataflow:
        kw["dataflows"] = args.dataflow
    if args.top > 1:
        for i, p in enumerate(_planned(fuser.plans, args.tokens, args.d_model, args.d_ff, k=args.top, **kw)):
            print(f"{i + 1:3d}. {p.summary()}")
        return 0
    p = _planned(fuser.plan, args.tokens, args.d_model, args.d_ff, **kw)
    print(json.dumps(p.to_dict(), indent=2) if args.json else p.explain())
    return 0


def rel_error(y, ref):
    """||y - ref|| / ||ref|| in float64 (a scale-independent error; NaN never passes)."""
    y, ref = y.double(), ref.double()
    return float((y - ref).norm() / ref.norm().clamp_min(1e-300))


def _transformers_missing(e):
    """Why transformers cannot be imported, and what to do: not installed, or installed but broken by a
    dependency (most often a torchvision built for another torch, which transformers imports)."""
    head = "the demo builds a LLaMA model from a transformers config"
    if importlib.util.find_spec("transformers") is None:
        return f"{head}, and transformers is not installed: python -m pip install 'fuser[demo]'"
    root = e
    while root.__cause__ is not None or root.__context__ is not None:
        root = root.__cause__ or root.__context__
    why = f"{type(root).__name__}: {root}"
    fix = ("install the torchvision built for your torch (or uninstall torchvision)" if "torchvision" in why
           else "reinstall it: python -m pip install --force-reinstall 'fuser[demo]'")
    return f"{head}; transformers is installed but fails to import ({why}); {fix}"


def _llama(args, device, dtype):
    """A small random LLaMA (no download) from a transformers config; None if transformers is missing."""
    if args.hidden % args.heads:
        raise UsageError(f"--hidden {args.hidden} must be a multiple of --heads {args.heads}")
    try:
        compat.importable_torchvision()   # a torchvision built for another torch would break transformers
        from transformers import LlamaConfig, LlamaForCausalLM
    except (ImportError, RuntimeError) as e:
        print(_transformers_missing(e), file=sys.stderr)
        return None
    cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, num_key_value_heads=args.heads, vocab_size=args.vocab,
                      max_position_embeddings=max(args.seq, 64), pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(args.seed)
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()


def _cmd_demo(args):
    e = fuser.env()
    print("== environment ==")
    print(e)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    hopper = cuda and torch.cuda.get_device_capability(device) == (9, 0)
    dtype = {"auto": torch.bfloat16 if cuda else torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16, "float32": torch.float32}[args.dtype]
    model = _llama(args, device, dtype)
    if model is None:
        return 2
    name = str(dtype).replace("torch.", "")
    print(f"\n== a random LLaMA: hidden {args.hidden}, intermediate {args.intermediate}, {args.layers} layers, "
          f"vocab {args.vocab}, {name} on {device} ==")
    reference = copy.deepcopy(model)
    fuser.optimize(model)
    print(fuser.report(model))
    ids = torch.randint(3, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(args.seed))
    ids = ids.to(device)
    with torch.no_grad():
        y, y_ref = model(ids).logits, reference(ids).logits
    err = rel_error(y, y_ref)
    bound = 1e-4 if dtype == torch.float32 else 3e-2
    tokens = args.batch * args.seq
    ffns = [m for m in model.modules() if isinstance(m, fuser.FusedFFN)]
    kernels = sum(1 for m in ffns if m.plan(tokens).fused) if e.fused_available and cuda else 0
    print("\n== check ==")
    if not (e.fused_available and cuda):
        print("path        : PyTorch reference (" + e.why + ")")
    elif kernels:
        print(f"path        : fused kernel in {kernels} of {len(ffns)} FFN(s) at {tokens} tokens")
    else:
        print(f"path        : PyTorch eager in every FFN: the planner predicts it faster at {tokens} tokens "
              "(fuser.plan(...).explain() says why)")
    print(f"logits      : relative error {err:.2e} against the unoptimized model (bound {bound:.0e})")
    ok = err <= bound and len(fuser.report(model).fused) == args.layers
    print("result      :", "OK" if ok else "MISMATCH")
    if hopper:
        with torch.no_grad():
            t_ref, t_fused = (t / 1e3 for t in time_interleaved([lambda: reference(ids), lambda: model(ids)], args.iters))
        print(f"\n== time per forward ({args.batch}x{args.seq} tokens, median of {args.iters}, interleaved) ==")
        print(f"PyTorch     : {t_ref:.3f} ms")
        print(f"fuser       : {t_fused:.3f} ms  ({t_ref / t_fused:.2f}x)")
    else:
        print("\n(timing runs on a Hopper GPU only: " + ("GPU is not sm_90" if cuda else "no CUDA GPU") + ")")
    return 0 if ok else 1


def _optimized_llama(args):
    """The demo's LLaMA on the CPU in args.dtype, optimized; None (after saying why) without transformers."""
    model = _llama(args, torch.device("cpu"), getattr(torch, args.dtype))
    return None if model is None else fuser.optimize(model)


def _cmd_explain(args):
    model = _optimized_llama(args)
    if model is None:
        return 2
    print(f"== a random LLaMA: hidden {args.hidden}, intermediate {args.intermediate}, {args.layers} layers, "
          f"{args.dtype} ==")
    print(fuser.report(model))
    for plan_args, paths in warm.ffn_shapes(model):
        print(f"\n== {warm.describe(plan_args)} ({len(paths)} FFN(s): {', '.join(paths)}) at {args.tokens} tokens ==")
        print("on this machine: " + model.get_submodule(paths[0]).running(args.tokens))
        print(_planned(fuser.plan, args.tokens, target=args.target, **plan_args).explain())
    return 0


def _cmd_warmup(args):
    e = fuser.env()
    if not e.nvrtc_found:
        print("fuser warmup compiles kernels with NVRTC, which was not found; install it (python -m pip install "
              "nvidia-cuda-nvrtc) or set $FUSER_NVRTC", file=sys.stderr)
        return 2
    tokens = args.tokens
    model = _optimized_llama(args)
    if model is None:
        return 2
    print(f"== warming fused kernels for a random LLaMA (hidden {args.hidden}, intermediate {args.intermediate}, "
          f"{args.dtype}) at {', '.join(map(str, tokens))} tokens; kernel cache {e.cache_dir} ==")
    kernels = warm.warmup(model, tokens, target=args.target, log=lambda line: print(line, flush=True))
    print(f"{len(kernels)} kernel(s) ready, {sum(k.spill_bytes for k in kernels)} spill bytes in all")
    return 0


def _cmd_bench(args):
    if args.compare:    # run-to-run agreement of two saved CSVs: any machine
        return _bench_compare(bench_report, *args.compare)
    if args.score:      # the issues' targets on saved runs: any machine
        return _bench_score(bench_report, args.score)
    if args.plot:       # redraw tables and plot from a saved CSV: any machine
        rows = bench_report.read_csv(args.plot)
        os.makedirs(args.out, exist_ok=True)
        print(bench_report.markdown(rows))
        return _bench_plot(bench_report, rows, args.out)
    why = hopper_reason()
    if why is not None:
        print(f"fuser bench times kernels on a Hopper GPU (sm_90): {why}", file=sys.stderr)
        return 2
    try:
        workloads = [bench.parse_workload(t) for t in args.shape] if args.shape else bench.workload_set(args.set)
    except ValueError as e:
        raise UsageError(f"argument --shape: {e}") from None
    os.makedirs(args.out, exist_ok=True)
    meta = {}
    if not args.no_host:
        meta["host"] = bench.host_costs()
        h = meta["host"]
        print(f"host: first-call JIT {h['jit_s']:.2f} s, warm-cache load {h['cache_load_s'] * 1e3:.1f} ms + module "
              f"load {h['module_load_ms']:.1f} ms; fuser.ffn {h['call_us']:.1f} us per call vs bare launch "
              f"{h['bare_launch_us']:.1f} us ({h['workload']})", flush=True)
    rows = []

    def keep(result):     # written as each workload finishes: a run cut short keeps what it measured
        rows.append(result.row())
        bench_report.write_csv(rows, os.path.join(args.out, "results.csv"))
    results, m = bench.run(workloads, autotune=args.autotune, reps=args.reps, budget_s=args.budget_s,
                           min_graph_calls=args.graph_calls or bench.GRAPH_MIN_CALLS, on_result=keep,
                           graph_after=args.graph_after,
                           log=lambda line: print(line, flush=True))
    meta.update(m)
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, default=str)
    md = bench_report.markdown(rows)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    print(md)
    _bench_targets(rows, args.out, show=args.set == "targets" and not args.shape)
    return _bench_plot(bench_report, rows, args.out)


def _graph_methods_differ(bench_report, runs):
    """A note on stderr where saved runs graphed their calls after different predecessors (their graphed ratios
    then differ by method, not only run to run); whether they do."""
    seen = {path: bench_report.graph_after(rows) for path, rows in runs}
    if len(set(seen.values())) > 1:
        print("note: the runs' graphed calls follow different predecessors (op: a copy writing the input, as in a "
              "model; self: the previous call, which a fused kernel's early launch overlaps), so their graphed "
              "ratios differ by method: " + ", ".join(f"{p}: {m}" for p, m in seen.items()), file=sys.stderr)
        return True
    return False


def _bench_compare(bench_report, path_a, path_b):
    a, b = bench_report.read_csv(path_a), bench_report.read_csv(path_b)
    _graph_methods_differ(bench_report, [(path_a, a), (path_b, b)])
    for title, factor in (("all ratios", None), ("GPU-bound ratios (per-call within 1.1x of its graph)", 1.1)):
        rows, s = bench_report.compare(a, b, gpu_bound=factor)
        if not s["n"]:
            print(f"{title}: no workload above 50 us in both runs")
            continue
        print(f"{title}, workloads above 50 us: {s['n']} ratios, median difference {s['median']:.1%}, "
              f"max {s['max']:.1%}, {s['over_5pct']} over 5%")
        for w, m, k, x, y, d in rows:
            if d > 0.05:
                print(f"  {w} M={m} {k}: {x:.3f} vs {y:.3f} ({d:.1%})")
    return 0


def _bench_targets(rows, out, show):
    """The issues' speed targets scored on this run's rows, into `out`/targets.md (and printed with `show`)."""
    card = targets.markdown(targets.score([rows]))
    with open(os.path.join(out, "targets.md"), "w") as f:
        f.write(card)
    if show:
        print(card, end="")


def _bench_score(bench_report, paths):
    try:
        saved = [(p, bench_report.read_csv(p)) for p in paths]
        runs = targets.runs_of([r for _p, rows in saved for r in rows])
    except (OSError, KeyError, ValueError) as e:
        raise UsageError(f"argument --score: {e}") from None
    _graph_methods_differ(bench_report, saved)
    print(targets.markdown(targets.score(runs)), end="")
    return 0


def _bench_plot(bench_report, rows, out):
    try:
        bench_report.plot(rows, os.path.join(out, "speedup.png"))
    except ImportError as e:
        print(str(e), file=sys.stderr)
    return 0


def _cmd_calibrate(args):
    why = hopper_reason()
    if why is not None:
        print(f"fuser calibrate measures a Hopper GPU (sm_90): {why}", file=sys.stderr)
        return 2
    record, path = calibrate.calibrate(log=lambda line: print(line, flush=True), k=args.k, reps=args.reps)
    def show(v):
        return "[" + ", ".join(f"{x:.4g}" for x in v) + "]" if isinstance(v, list) else f"{v:.4g}"
    print("stored " + path + ": " + ", ".join(f"{k} {show(v)}" for k, v in record["fields"].items()))
    return 0


def _model_options(p, planned=False):
    """The LLaMA options of demo, explain and warmup; `planned` adds the planner's dtype and target (the
    model is built on the CPU in that dtype, bfloat16 by default: float32 FFNs never fuse)."""
    p.add_argument("--hidden", type=_count, default=512)
    p.add_argument("--intermediate", type=_count, default=1376)
    p.add_argument("--layers", type=_count, default=2)
    p.add_argument("--heads", type=_count, default=8)
    p.add_argument("--vocab", type=_count, default=1000)
    p.add_argument("--seed", type=_index, default=0)
    if planned:
        p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
        _target_option(p)
        p.set_defaults(seq=64)


def _target_option(p):
    p.add_argument("--target", default=None, choices=sorted(_C.targets()),
                   help="the GPU to plan for (default: this machine's GPU, else h200)")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fuser", description="fuser: fused FFN kernels for Hopper GPUs")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("env", help="show what fuser found and whether the fused path is available")
    p.add_argument("--device", type=_index, default=None, help="CUDA device ordinal (default: current)")
    p.set_defaults(func=_cmd_env)
    p = sub.add_parser("plan", help="plan one FFN shape and explain the choice")
    p.add_argument("--tokens", "-m", type=_count, required=True, help="tokens (M)")
    p.add_argument("--d-model", type=_count, required=True)
    p.add_argument("--d-ff", type=_count, required=True)
    p.add_argument("--d-out", type=_count, default=None, help="output width (default: d_model)")
    p.add_argument("--gated", action="store_true", help="gated FFN (SwiGLU with silu, GeGLU with gelu)")
    p.add_argument("--activation", default="gelu", choices=["relu", "gelu", "gelu_tanh", "silu"])
    p.add_argument("--bias", action="store_true")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    _target_option(p)
    p.add_argument("--fused", choices=["yes", "no"], default=None, help="force or forbid fusion")
    p.add_argument("--dataflow", action="append", choices=DATAFLOWS, help="require a dataflow (repeatable)")
    p.add_argument("--top", type=_count, default=1, help="list the best N plans instead of explaining one")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_cmd_plan)
    p = sub.add_parser("demo", help="optimize a small random LLaMA, check it, and time it on Hopper")
    _model_options(p)
    p.add_argument("--batch", type=_count, default=4)
    p.add_argument("--seq", type=_count, default=64)
    p.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto",
                   help="auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--iters", type=_count, default=50, help="timed forwards per model (Hopper only)")
    p.set_defaults(func=_cmd_demo)
    p = sub.add_parser("explain", help="optimize the demo's LLaMA and explain the plan of each FFN shape")
    _model_options(p, planned=True)
    p.add_argument("--tokens", "-m", type=_count, default=128, help="tokens to plan for (default 128)")
    p.set_defaults(func=_cmd_explain)
    p = sub.add_parser("warmup", help="compile ahead of time every fused kernel the demo's LLaMA could need")
    _model_options(p, planned=True)
    p.add_argument("--tokens", type=_token_counts, default=(1, 16, 128),
                   help="comma-separated token counts (default 1,16,128)")
    p.set_defaults(func=_cmd_warmup)
    p = sub.add_parser("bench", help="time fuser against eager, CUDA graphs, torch.compile and the floor (Hopper only)")
    p.add_argument("--set", default="quick", choices=["quick", "paper", "models", "all", "targets"],
                   help="workloads: quick (default), paper (G1-G10, S1-S8), models (x 1..8192 tokens), all, "
                        "targets (every workload the issues' speed targets name)")
    p.add_argument("--shape", action="append", metavar="WORKLOAD",
                   help="G3, S1[:TOKENS], NAME:TOKENS (a model) or DxF:ACT[-gated]:TOKENS; repeatable (replaces --set)")
    p.add_argument("--autotune", default="subset", choices=["subset", "all", "none"],
                   help="where torch.compile max-autotune runs (subset: models at 16, 128, 2048 tokens)")
    p.add_argument("--reps", type=_count, default=None, help="interleaved rounds per workload (default: ~0.3 s of timing)")
    p.add_argument("--budget-s", type=_seconds, default=None,
                   help="skip torch.compile for workloads starting this many seconds or more into the run "
                        "(0: skip it for every workload; default: never)")
    p.add_argument("--graph-calls", type=_count, default=None,
                   help="the fewest calls one CUDA graph of a graphed variant holds (default 16: each call then carries a "
                        "sixteenth of the graph's own launch; a call of 500 us or more is one per graph)")
    p.add_argument("--graph-after", choices=bench.GRAPH_AFTER, default="op",
                   help="what each call in a graphed variant follows: op (default), a PyTorch copy writing its input, "
                        "as a model's FFN follows its norm (the copies timed alone and taken off); self, the graph's "
                        "previous call (a fused kernel then starts early during its predecessor's last blocks)")
    p.add_argument("--out", default="bench-out", help="folder for results.csv, results.md, meta.json, speedup.png")
    p.add_argument("--no-host", action="store_true", help="skip the host-cost measurements (JIT, load, per call)")
    p.add_argument("--plot", metavar="CSV", help="only redraw results.md-style tables and the plot from a saved CSV")
    p.add_argument("--score", nargs="+", metavar="CSV",
                   help="only score saved runs against the issues' speed targets: the CSVs of run A, then of run "
                        "B (a workload's first row is run A's, its second run B's)")
    p.add_argument("--compare", nargs=2, metavar=("A.csv", "B.csv"),
                   help="only report how far the speedup ratios of two saved runs differ (run-to-run noise)")
    p.set_defaults(func=_cmd_bench)
    p = sub.add_parser("calibrate", help="measure this GPU's cost-model constants and store them for the planner")
    p.add_argument("--k", type=_count, default=8, help="fused candidates timed per shape (default 8)")
    p.add_argument("--reps", type=_count, default=10)
    p.set_defaults(func=_cmd_calibrate)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UsageError as e:
        sub.choices[args.command].error(str(e))


if __name__ == "__main__":
    sys.exit(main())
