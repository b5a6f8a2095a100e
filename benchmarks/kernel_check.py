"""Check and time the wgmma kernels in one GPU call: the GEMM probe (correctness on ragged shapes, then
its rate against torch.mm side by side), the stream FFN kernel (a correctness matrix against a float64
reference: poisoned outputs, bitwise repeats, ragged token counts; then chosen plans timed against
PyTorch eager in CUDA graphs with the floor beside them). Writes a JSON log.

    python benchmarks/kernel_check.py [--gemm] [--stream] [--variants] [--bench SET] [--out DIR]
    python benchmarks/kernel_check.py --trace-fp8 llama3-8b:128 llama3-8b:128:bm=64   # FP8 unit timelines
    python benchmarks/kernel_check.py --inputs-ab llama2-7b:1 llama2-7b:1:bm=16,s1=2,s2=4  # input construction
"""
import argparse
import contextlib
import itertools
import json
import os
import signal
import sys
import time
import traceback

import torch

import fuser
from fuser.tools import probes
from fuser.tools.timing import time_interleaved

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
from plan_check import check_plan, ffn_tensors, graph_of  # noqa: E402


def gemm_section(log):
    out = []
    for v in probes.GEMM_VARIANTS:
        for (m, n, k) in [(128, 256, 64), (300, 520, 136), (1000, 1000, 1000), (2048, 4096, 8192)]:
            r = probes.gemm(m, n, k, v, sets=1, iters=3)
            ok = r["rel_error"] < 1e-2
            log(f"gemm {v} {m}x{n}x{k}: rel err {r['rel_error']:.2e} {'ok' if ok else 'BAD'}")
            out.append(dict(r, shape=(m, n, k), ok=ok))
    for size in (4096, 8192):
        for v in probes.GEMM_VARIANTS:
            r = probes.gemm(size, size, size, v, sets=3, iters=20)
            log(f"gemm {v} {size}^3: {r['tflops']:.0f} TFLOP/s vs torch.mm {r['torch_tflops']:.0f}: "
                f"{r['ratio']:.3f}x, err {r['rel_error']:.1e}")
            out.append(dict(r, shape=(size, size, size)))
    return out


CHAINS = [  # (name, d_model, d_ff, d_out, gated, activation, bias)
    ("G1", 32, 512, 256, False, "relu", False),
    ("S8", 1024, 3072, 1024, True, "silu", False),
    ("gpt2", 768, 3072, 768, False, "gelu", True),
    ("llama-small", 1024, 4096, 1024, True, "silu", True),
    ("tanh", 512, 1536, 384, False, "gelu_tanh", True),
]


def stream_case(name, d, f, l, gated, act, bias, m, dtype, cons, gen):
    plan = fuser.plan(m, d, f, d_out=l, gated=gated, activation=act, bias=bias, dtype=dtype, target="h200",
                      fused=True, kind="stream", **cons)
    t = ffn_tensors(gen, m, d, f, l, gated=gated, bias=bias, dtype=dtype)
    return dict(name=name, m=m, dtype=dtype, plan=plan.summary(), **check_plan(plan, act, t, slack=1e-6))


def stream_section(log, quick=False):
    gen = torch.Generator(device="cuda").manual_seed(7)
    out = []
    ms = (1, 7, 16, 64, 77, 128)
    variants = [{}, dict(bn=128, bl=128), dict(bm=128, bn=64, bl=64), dict(bn=64, bl=128, stages=3)]
    for (name, d, f, l, g, act, bias), m, dtype in itertools.product(CHAINS, ms, ("bfloat16", "float16")):
        if dtype == "float16" and m not in (7, 128):
            continue
        swap = [dict(bm=16)] * (m <= 16) + [dict(bm=32)] * (m <= 32)
        for cons in (variants if m in (16, 128) else variants[:1]) + swap:
            try:
                res = stream_case(name, d, f, l, g, act, bias, m, dtype, cons, gen)
            except Exception as e:  # noqa: BLE001 - report and go on
                res = dict(name=name, m=m, dtype=dtype, cons=cons, ok=False, error=f"{type(e).__name__}: {e}")
            out.append(res)
            log(("ok " if res["ok"] else "BAD ") + json.dumps({k: res[k] for k in res if k not in ("ok",)})[:300])
    return out


def _inputs(d, f, l, gated, m, sets, gen, packed=False):
    """`sets` random input sets of one shape; `packed`: a gated chain's gate and up weights as the two row halves
    of one tensor (gate first), as ``FusedFFN.pack`` leaves them, so fuser's eager route runs one GEMM of both."""
    out = []
    for _ in range(sets):
        r = lambda *s, scale=1.0: (torch.randn(*s, generator=gen, device="cuda") * scale).bfloat16()  # noqa: E731
        t = dict(x=r(m, d), w_down=r(l, f, scale=f ** -0.5))
        if gated and packed:
            both = r(2 * f, d, scale=d ** -0.5)
            t["w_gate"], t["w_up"] = both[:f], both[f:]
        else:
            t["w_up"] = r(f, d, scale=d ** -0.5)
            if gated:
                t["w_gate"] = r(f, d, scale=d ** -0.5)
        out.append(t)
    return out


def _packed_pair(w_gate, w_up, packed):
    """`w_gate` and `w_up` as {"w_gate", "w_up"}: copies into the two row halves of one tensor (gate first)
    where `packed`, else copies of their own."""
    if not packed:
        return dict(w_gate=w_gate.clone(), w_up=w_up.clone())
    both = torch.cat([w_gate, w_up])
    return dict(w_gate=both[:w_gate.shape[0]], w_up=both[w_gate.shape[0]:])


def _time_graphs(graphs, per, rounds=15):
    """Median us per call of each graph of `per` calls (replays interleaved in seeded orders, CUDA events)."""
    return time_interleaved([(g.replay, per) for g in graphs], rounds, warmup=1)


DECODE = [  # name, d_model, d_ff, d_out, gated, act, tokens
    ("llama3-8b", 4096, 14336, 4096, True, "silu", 1), ("llama3-8b", 4096, 14336, 4096, True, "silu", 16),
    ("llama3-8b", 4096, 14336, 4096, True, "silu", 32), ("llama-70b", 8192, 28672, 8192, True, "silu", 16),
    ("gpt3-6.7b", 4096, 16384, 4096, False, "gelu", 16), ("gpt2", 768, 3072, 768, False, "gelu", 1),
    ("llama2-7b", 4096, 11008, 4096, True, "silu", 1),
]

SWEEP = [  # name, d_model, d_ff, d_out, gated, act, tokens
    ("G1", 32, 512, 256, False, "relu", 128), ("G4", 768, 3072, 768, False, "relu", 128),
    ("G8", 2048, 8192, 2048, False, "relu", 128), ("S1", 3072, 8192, 3072, True, "silu", 128),
    ("S8", 1024, 3072, 1024, True, "silu", 128), ("llama3-8b", 4096, 14336, 4096, True, "silu", 16),
    ("llama3-8b", 4096, 14336, 4096, True, "silu", 128), ("gpt2", 768, 3072, 768, False, "gelu", 16),
    ("llama3-8b", 4096, 14336, 4096, True, "silu", 1),
    # the rest of the paper's table at 128 tokens, where one-phase plans and split epilogues decide
    ("G2", 512, 256, 64, False, "relu", 128), ("G3", 416, 512, 256, False, "relu", 128),
    ("G5", 4096, 16384, 4096, False, "relu", 128), ("G6", 1024, 4096, 1024, False, "relu", 128),
    ("G7", 768, 768, 768, False, "relu", 128), ("G9", 512, 2048, 512, False, "relu", 128),
    ("G10", 384, 1536, 384, False, "relu", 128), ("S2", 2048, 5632, 2048, True, "silu", 128),
    ("S3", 4096, 11008, 4096, True, "silu", 128), ("S4", 2048, 8192, 2048, True, "silu", 128),
    ("S5", 2048, 11008, 2048, True, "silu", 128), ("S6", 1536, 8960, 1536, True, "silu", 128),
    ("S7", 2560, 9728, 2560, True, "silu", 128),
]


PREFILL = [  # name, d_model, d_ff, d_out, gated, act, tokens: several row tiles
    ("gpt2", 768, 3072, 768, False, "gelu", 512), ("gpt2", 768, 3072, 768, False, "gelu", 2048),
    ("gpt2-medium", 1024, 4096, 1024, False, "gelu", 1024), ("gpt2-medium", 1024, 4096, 1024, False, "gelu", 2048),
    ("llama3-8b", 4096, 14336, 4096, True, "silu", 256), ("llama3-8b", 4096, 14336, 4096, True, "silu", 1024),
]


def _extras(m, gated, f=0, l=0):
    """Plan constraints timed beside the model's best: wide tiles, and for decode the swap-AB splits and the
    one-phase units that span every l-tile (d_ff slices of 128 and 256 columns), for several row tiles the
    128-row tiles without or with few splits."""
    if m <= 32:
        bm = 16 if m <= 16 else 32
        whole = [dict(bm=bm, phases=1, lspan=-(-l // 128), s2=-(-f // w)) for w in (128, 256)] if l else []
        return [dict(bm=bm, s1=s1, s2=s2) for s1, s2 in ((1, 4), (2, 8), (4, 8), (8, 16))] + whole + \
               [dict(bm=64, bn=128, bl=256)]
    if m > 128:
        wide = 128 if gated else 256
        return [dict(bm=128, bn=wide, bl=128, s1=1, s2=s2) for s2 in (1, 2)] + \
               [dict(bm=128, bn=128, bl=128, s1=1, s2=1), dict(bm=128, bn=128, bl=64, s1=1, s2=1),
                dict(bm=64, bn=wide, bl=128, s1=1, s2=1)] + \
               ([] if gated else [dict(bm=128, bn=192, bl=192, s1=1, s2=1), dict(bm=128, bn=192, bl=128, s1=1, s2=1)])
    return [dict(bn=128, bl=256), dict(bn=128, bl=128), dict(bn=256 if not gated else 128, bl=128),
            dict(bm=64) if m <= 64 else dict(bn=128, bl=64)]


#: Each sweep section's rows so far, by section: what a run stopped by SIGTERM (`timeout`) still writes.
_IN_PROGRESS = {}


def sweep_section(log, top=6, shapes=None, section="sweep", after=False):
    """For each SWEEP shape: the `top` best predicted stream plans plus wide-tile ones, each timed in a CUDA
    graph interleaved with eager in a graph (rotating input sets): rows for fitting the cost model. Each
    plan's output for the first input set is checked against a float64 reference. `after`: each plan and eager
    also after a copy writing their input (``time_plans``), the times a model's FFN sees."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    rows = _IN_PROGRESS.setdefault(section, [])
    for name, d, f, l, gated, act, m in shapes or SWEEP:
        kw = dict(d_out=l, gated=gated, activation=act, target="h200", fused=True, kind="stream")
        ps = fuser.plans(m, d, f, k=top, **kw)
        for extra in _extras(m, gated, f, l):
            try:
                ps += fuser.plans(m, d, f, k=2, **kw, **extra)
            except ValueError:
                pass
        uniq = {}
        for p in ps:
            uniq.setdefault(p.summary(), p)
        rows += time_plans(log, gen, (name, d, f, l, gated, act, m), uniq.values(), after=after)
    return rows


@contextlib.contextmanager
def _launch_setting(name, value):
    """Stream launches prepared inside take `value` of the process-wide launch setting ``_C.<name>``
    (``stream_exact_boxes``, ``stream_lead_bytes``); the setting before is restored."""
    before = getattr(fuser._C, name)(value)
    try:
        yield
    finally:
        getattr(fuser._C, name)(before)


def time_plans(log, gen, shape, plans, packed=False, layouts=False, warm=False, exact=False, leads=(), again=False,
               after=False):
    """Each plan of one shape in a CUDA graph of several calls, interleaved with eager in a graph (rotating
    input sets), its output for the first set checked against float64: one row per plan. `packed`: the inputs'
    gate and up weights are halves of one tensor (``_inputs``). In the same interleaving, each fused plan also:
    with `layouts` (a gated shape), over the same values with gate and up in the other layout
    (``measured_packed``, or ``measured_unpacked`` where `packed`): what a layout alone costs the kernel; with
    `warm`, every call over the first set (``measured_warm``: weights that fit the L2 stay there): what reading
    them from HBM costs; with `exact`, each stream plan captured with exact token boxes (``measured_exact``:
    ``_C.stream_exact_boxes``, a ragged last row tile's X and H boxes without TMA's zero fill, the default) where
    the main graph is captured with whole ones; for each n of `leads`, each stream plan with about n bytes of the
    ring's first pass in flight per block (``measured_lead{n}``: ``_C.stream_lead_bytes``; 0: the whole ring at
    once); with `again`, the main graph's calls captured once more as they are (``measured_again``): the spread of
    two graphs of the same work, which can reach a couple of percent and repeat cell by cell (docs/kernels.md step
    57), so the others' ratios are read against it; with `after`, every call of each plan and of eager also after
    a copy writing its input (a PyTorch kernel it depends on, as a model's FFN follows its norm; in the main graph
    a fused call follows its own kernel, whose early launch lets it start during that kernel's last blocks), the
    copies alone timed beside them and taken off: ``measured_after``, ``eager_after`` and ``copy`` (us per call; every
    graph of the cell then holds 16 or more calls).
    Each such graph's first output must be the main graph's bits (``same_bits_*``)."""
    name, d, f, l, gated, act, m = shape
    rows = []
    bytes_ = 2 * (f * d * (2 if gated else 1) + l * f)
    sets = max(1, min(6, -(-(150 << 20) // bytes_)))
    ins = _inputs(d, f, l, gated, m, sets, gen, packed)
    # each set's values in the other layout: gate and up copied into one tensor, or apart where `packed`
    other = [dict(t, **_packed_pair(t["w_gate"], t["w_up"], not packed)) for t in ins] if layouts and gated else None
    # several calls per graph: one replay of a single small call is mostly the graph's own launch; `after` compares
    # times a microsecond or two apart, so its graphs (the main one too) hold 16 or more, each call carrying a
    # sixteenth of the launch (fuser.tools.bench.GRAPH_MIN_CALLS); the others keep the committed files' 4-20
    per = max(16 if after else 4, min(20, int(2e7 // bytes_)))
    ref_fn = [lambda t=t: fuser.ffn_reference(activation=act, **t) for t in ins]
    eager = graph_of([ref_fn[i % sets] for i in range(per)])
    ref = fuser.ffn_reference(activation=act, **{k: x.double() for k, x in ins[0].items()})
    # `after`: each set's input written by a copy just before each call (xs), and the copies alone
    xs = [torch.empty_like(t["x"]) for t in ins] if after else []
    ins_after = [dict(t, x=x) for t, x in zip(ins, xs)]
    write = [lambda i=i: xs[i].copy_(ins[i]["x"]) for i in range(len(xs))]
    cells_after = [("copy", graph_of([write[i % sets] for i in range(per)])),
                   ("eager_after", graph_of([lambda i=i % sets: (write[i](), fuser.ffn_reference(
                       activation=act, **ins_after[i])) for i in range(per)]))] if after else []
    for p in plans:
        try:
            outs = [torch.empty(m, l, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
            if p.fused:
                calls = [lambda t=t, o=o: fuser.ffn(activation=act, out=o, plan=p, **t) for t, o in zip(ins, outs)]
            else:   # the eager route as called: into out= it would add a copy of y; outs keep what the graph writes
                def keep(i, t):
                    outs[i] = fuser.ffn(activation=act, plan=p, **t)
                calls = [lambda i=i, t=t: keep(i, t) for i, t in enumerate(ins)]
            # with `exact`, the main graph takes whole token boxes (the default is exact ones)
            with _launch_setting("stream_exact_boxes", False) if exact else contextlib.nullcontext():
                g = graph_of([calls[i % sets] for i in range(per)])
            extra = []   # (what it times, its graph, its outputs): the same values, so the same bits as outs[0]
            if other is not None and p.fused:
                o2 = [torch.empty_like(o) for o in outs]
                extra.append(("unpacked" if packed else "packed", graph_of(
                    [lambda t=other[i % sets], o=o2[i % sets]: fuser.ffn(activation=act, out=o, plan=p, **t)
                     for i in range(per)]), o2))
            if warm and p.fused:
                o2 = [torch.empty_like(outs[0])]
                extra.append(("warm", graph_of([lambda o=o2[0]: fuser.ffn(activation=act, out=o, plan=p, **ins[0])]
                                               * per), o2))
            # the main graph's calls again, captured under another launch setting (or, `again`, the same one)
            settings = ([("exact", "stream_exact_boxes", True)] if exact else []) + \
                [(f"lead{n}", "stream_lead_bytes", n) for n in leads]
            if again:
                settings.append(("again", "stream_exact_boxes", False) if exact else ("again", None, None))
            if after:
                settings.append(("after", "stream_exact_boxes", False) if exact else ("after", None, None))
            for what, setting, value in settings if p.fused else ():
                o2 = [torch.empty_like(o) for o in outs]
                before = write if what == "after" else [lambda: None] * sets
                src = ins_after if what == "after" else ins
                with _launch_setting(setting, value) if setting else contextlib.nullcontext():
                    extra.append((what, graph_of(
                        [lambda i=i % sets, o=o2[i % sets], b=before, s=src: (b[i](), fuser.ffn(
                            activation=act, out=o, plan=p, **s[i])) for i in range(per)]), o2))
            te, tf, *ta = _time_graphs([eager, g] + [x[1] for x in extra] + [x[1] for x in cells_after], per)
            ta, cell_t = ta[:len(extra)], dict(zip([x[0] for x in cells_after], ta[len(extra):]))
            if after:   # the copies taken off
                ta = [t - cell_t["copy"] if what == "after" else t for (what, _, _), t in zip(extra, ta)]
            err = float((outs[0].double() - ref).norm() / ref.norm())
            row = dict(name=name, m=m, plan=p.summary(), params=p.raw.get("params"), predicted=p.predicted_us,
                       measured=tf, eager=te, speedup=te / tf, floor=p.floor_us, rel_err=err, ok=err < 2e-2,
                       tflops=p.raw["cost"]["useful_flops"] / tf / 1e6)
            for (what, _, o2), t in zip(extra, ta):
                row[f"measured_{what}"], row[f"same_bits_{what}"] = t, bool(torch.equal(o2[0], outs[0]))
            if after:
                row.update(copy=cell_t["copy"], eager_after=cell_t["eager_after"] - cell_t["copy"])
            rows.append(row)
            log(f"{name:10s} m={m:<4d} {tf:8.1f} us (eager {te:7.1f}, {te / tf:.2f}x; predicted "
                f"{p.predicted_us:7.1f}; floor {p.floor_us:.1f}; {row['tflops']:.0f} TFLOP/s; err {err:.1e}"
                f"{'' if row['ok'] else ' BAD'}) {p.summary()}"
                + "".join(f" | {what} {t:.1f} us, {t / tf:.3f}x{'' if row[f'same_bits_{what}'] else ' DIFFERENT BITS'}"
                          for (what, _, _), t in zip(extra, ta))
                + (f" | eager after {row['eager_after']:.1f} us (the copy {row['copy']:.2f})" if after else ""))
            del g, extra
        except Exception as e:  # noqa: BLE001
            log(f"{name} m={m} {p.summary()}: {type(e).__name__}: {e}")
    del eager, ref, cells_after
    torch.cuda.empty_cache()
    return rows


PAIRS = [  # name, d_model, d_ff, d_out, gated, act, tokens, constraints of the base plan
    ("gpt2", 768, 3072, 768, False, "gelu", 2048, dict(bm=128, bn=192, bl=128, s1=1, s2=1)),
    ("gpt2", 768, 3072, 768, False, "gelu", 2048, dict(bm=128, bn=128, bl=128, s1=1, s2=1)),
    ("gpt2-medium", 1024, 4096, 1024, False, "gelu", 2048, dict(bm=128, bn=192, bl=128, s1=1, s2=1)),
    ("gpt2-medium", 1024, 4096, 1024, False, "gelu", 1024, dict(bm=128, bn=192)),
    ("llama3-8b", 4096, 14336, 4096, True, "silu", 1024, dict(bm=128, bn=128, bl=128, s1=1, s2=1)),
    ("S1", 3072, 8192, 3072, True, "silu", 128, dict(bm=64)),
    ("S1", 3072, 8192, 3072, True, "silu", 128, dict(bm=128)),
    ("S8", 1024, 3072, 1024, True, "silu", 128, {}),
    ("G8", 2048, 8192, 2048, False, "relu", 128, {}),
    ("G4", 768, 3072, 768, False, "relu", 128, {}),
]
PAIR_CLUSTERS = {"rows": (2, 1, 1, 1), "tiles": (1, 2, 1, 2)}


def pairs_section(log):
    """Cluster pairs against single blocks: for each PAIRS shape, the model's best stream plan under the
    constraints, then the same tiles and splits as row-tile pairs and as tile pairs, timed side by side
    against eager (time_plans), and each traced (unit timelines)."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    out = dict(rows=[], traces=[])
    for name, d, f, l, gated, act, m, cons in PAIRS:
        kw = dict(d_out=l, gated=gated, activation=act, target="h200", fused=True, kind="stream")
        base = fuser.plan(m, d, f, **kw, **cons)
        fixed = {k: base.raw["params"][k] for k in ("bm", "bn", "bl", "s1", "s2")}
        plans = [base]
        for pair, cl in PAIR_CLUSTERS.items():
            try:
                plans.append(fuser.plan(m, d, f, **kw, **fixed, cluster=cl))
            except ValueError as e:
                log(f"{name} m={m} {pair} pairs: {e}")
        out["rows"] += time_plans(log, gen, (name, d, f, l, gated, act, m), plans)
        for p in plans:
            try:
                out["traces"].append(trace_run(name, m, log, cluster=tuple(p.cluster), **fixed))
            except Exception:  # noqa: BLE001
                log(f"trace {name} failed:\n{traceback.format_exc()}")
    return out


ONE_PHASE = [  # name, d_model, d_ff, d_out, gated, act, tokens: chains whose GEMM1 is cheap to repeat
    ("G1", 32, 512, 256, False, "relu", 128), ("G2", 512, 256, 64, False, "relu", 128),
    ("G3", 416, 512, 256, False, "relu", 128), ("G7", 768, 768, 768, False, "relu", 128),
    ("G9", 512, 2048, 512, False, "relu", 128), ("G10", 384, 1536, 384, False, "relu", 128),
    ("G4", 768, 3072, 768, False, "relu", 128), ("S8", 1024, 3072, 1024, True, "silu", 128),
    ("gpt2", 768, 3072, 768, False, "gelu", 1), ("gpt2", 768, 3072, 768, False, "gelu", 16),
]


def one_phase_section(log):
    """One phase against two: for each ONE_PHASE chain, the model's best two-phase stream plan and its best
    one-phase plans (the top 3, the best at bm 16 and at bm 32), timed side by side against eager
    (time_plans); then traces of G1's."""
    gen = torch.Generator(device="cuda").manual_seed(6)
    out = dict(rows=[], traces=[])
    for name, d, f, l, gated, act, m in ONE_PHASE:
        kw = dict(d_out=l, gated=gated, activation=act, target="h200", fused=True, kind="stream")
        plans = fuser.plans(m, d, f, k=1, **kw)
        for extra in (dict(k=3), dict(k=1, bm=16), dict(k=1, bm=32)):
            try:
                plans += fuser.plans(m, d, f, phases=1, **kw, **extra)
            except ValueError as e:
                log(f"{name} m={m} one phase {extra}: {e}")
        uniq = {}
        for p in plans:
            uniq.setdefault(p.summary(), p)
        out["rows"] += time_plans(log, gen, (name, d, f, l, gated, act, m), uniq.values())
    for phases in (2, 1):
        try:
            out["traces"].append(trace_run("G1", 128, log, phases=phases))
        except Exception:  # noqa: BLE001
            log(f"trace G1 failed:\n{traceback.format_exc()}")
    return out


def trace_run(name, m, log, act=None, shape=None, plan=None, **cons):
    """One stream plan of a SWEEP shape (or of `shape`: d_model, d_ff, d_out, gated, activation), launched with its
    trace: when each unit was claimed, could load, got its first data and was done (global timer), summarised per
    phase (trace_summary). `act` replaces the shape's activation; `plan` is the plan to trace (else the best under
    the constraints `cons`)."""
    from fuser import _C, runtime
    if shape is None:
        (_, d, f, l, gated, act0, _), = [w[:7] for w in SWEEP + PREFILL + PAIRS + ONE_PHASE if w[0] == name][:1]
    else:
        d, f, l, gated, act0 = shape
    act = act or act0
    p = plan or fuser.plan(m, d, f, d_out=l, gated=gated, activation=act, target="h200", fused=True, kind="stream",
                           **cons)
    t = _inputs(d, f, l, gated, m, 1, torch.Generator(device="cuda").manual_seed(1))[0]
    y = torch.empty(m, l, device="cuda", dtype=torch.bfloat16)
    trace = torch.zeros(p.derived["units"] * _C.STREAM_TRACE_WORDS * 2, device="cuda", dtype=torch.float32)
    dev = torch.cuda.current_device()
    stream = torch.cuda.current_stream().cuda_stream
    launch = runtime.launch_for(p, dev)
    buf = launch.scratch(m, stream)
    args = [t["x"], t["w_up"], t["w_down"], t.get("w_gate"), None, None, None]
    for _ in range(3):
        fuser.ffn(activation=act, plan=p, **t)
    _C.ffn_launch(launch.kernel, *args, act, y, buf.capsule, stream, trace=trace)
    torch.cuda.synchronize()
    r = trace_summary(trace, p, f"trace {name} m={m}", log, f" | {act}" if act != act0 else "")
    return dict(name=name, m=m, **r)


def parse_one(spec):
    """NAME:M[:bm=128,s1=1,...] as (NAME, M, the constraints as ints)."""
    name, m, *cons = spec.split(":")
    return name, int(m), {k: int(v) for k, v in (c.split("=") for c in cons[0].split(","))} if cons else {}


def trace_fp8(spec, log):
    """One quantized stream plan, launched with its trace and summarised as trace_run's. `spec`:
    MODEL:M[:bm=128,s1=1,...], MODEL one of fp8_decode's (the planner's best fused plan under the
    constraints); the traced launch must give the bits of an untraced call."""
    import fp8_decode
    from fuser import _C, ops, runtime
    name, m, cons = parse_one(spec)
    d, f, gated, act = fp8_decode.MODELS[name]
    _, f8, scales, _, _ = fp8_decode.weight_sets(name, 1, "cuda")
    w = f8[0]
    p = fuser.plans(m, d, f, gated=gated, activation=act, dtype="float8_e4m3fn", fused=True, k=1, kind="stream",
                    **cons)[0]
    x = torch.randn(m, d, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1)).bfloat16()
    for _ in range(3):
        want = fuser.ffn(x, w["w_up"], w["w_down"], w_gate=w["w_gate"], activation=act, scales=scales, plan=p)
    y = torch.empty_like(want)
    trace = torch.zeros(p.derived["units"] * _C.STREAM_TRACE_WORDS * 2, device="cuda", dtype=torch.float32)
    stream = torch.cuda.current_stream().cuda_stream
    launch = runtime.launch_for(p, torch.cuda.current_device())
    _C.ffn_launch(launch.kernel, x, w["w_up"], w["w_down"], w["w_gate"], None, None, None, act, y,
                  launch.scratch(m, stream).capsule, stream, trace=trace, scales=ops.scale_tensors(scales))
    torch.cuda.synchronize()
    assert torch.equal(y, want), f"{spec}: the traced launch's output differs from the untraced call's"
    return dict(name=name, m=m, fp8=True, **trace_summary(trace, p, f"trace fp8 {spec}", log))


def inputs_ab(spec, log, rounds=15):
    """One stream plan of a DECODE or SWEEP shape timed on two constructions of the same-sized inputs, each
    beside eager in CUDA graphs of four calls, all four graphs interleaved in one run: "separate" (W_up, W_gate
    and W_down their own tensors, as ``time_plans`` builds them) and "merged" (W_gate and W_up the two halves
    of one [2 d_ff, d_model] tensor, as ``python -m fuser bench`` builds them for its cuBLAS baseline). Both
    scale the weights by 1/sqrt(fan-in). `spec`: NAME:M[:bm=16,s1=3,...] (no constraints: the planner's pick,
    fused or not). Where the two tools disagree on a plan (benchmarks/RESULTS.md), the fused/eager ratios here
    say whether the input construction is why."""
    name, m, cons = parse_one(spec)
    (_, d, f, l, gated, act, _), = [w for w in DECODE + SWEEP if w[0] == name][:1]
    p = fuser.plan(m, d, f, d_out=l, gated=gated, activation=act, target="h200",
                   **(dict(fused=True, kind="stream", **cons) if cons else {}))
    g = torch.Generator(device="cuda").manual_seed(5)
    r = lambda *sh, fan: (torch.randn(*sh, generator=g, device="cuda") * fan ** -0.5).bfloat16()  # noqa: E731
    x = torch.randn(m, d, generator=g, device="cuda").bfloat16()
    sep = dict(x=x, w_up=r(f, d, fan=d), w_down=r(l, f, fan=f), w_gate=r(f, d, fan=d) if gated else None)
    both = r(2 * f if gated else f, d, fan=d)
    mer = dict(x=x, w_gate=both[:f] if gated else None, w_up=both[f:] if gated else both, w_down=r(l, f, fan=f))
    graphs, names = [], []
    for label, t in (("separate", sep), ("merged", mer)):
        out = torch.empty(m, l, device="cuda", dtype=torch.bfloat16)
        eager = lambda t=t: fuser.ffn_reference(activation=act, **t)  # noqa: E731
        fused = lambda t=t, out=out: fuser.ffn(activation=act, out=out, plan=p, **t)  # noqa: E731
        graphs += [graph_of([eager] * 4), graph_of([fused] * 4)]
        names += [f"{label} eager", f"{label} fuser"]
    times = dict(zip(names, _time_graphs(graphs, 4, rounds)))
    res = dict(spec=spec, plan=p.summary(), us=times,
               ratio={k: times[f"{k} eager"] / times[f"{k} fuser"] for k in ("separate", "merged")})
    log(f"inputs {spec}: " + ", ".join(f"{k} {v:.1f} us" for k, v in times.items()) +
        f" | eager/fuser separate {res['ratio']['separate']:.3f}, merged {res['ratio']['merged']:.3f} | {p.summary()}")
    return res


def trace_summary(trace, p, label, log, suffix=""):
    """A stream launch's unit trace (``trace``: the float32 buffer it filled) per phase: units, blocks, the
    first and last claim and done, a unit's median and longest time from its first data, its wait for first
    data, main loop (of which waiting for data) and epilogue, and phase 2's wait for H; the span from the
    first claim to the last unit done (a one-phase or row-summed plan's blocks sum after it), and the raw
    timeline (ns from the first claim; columns: block, claimed, H ready, first data, done, SM, MMAs done,
    ns waited for data in the main loop, last slot requested)."""
    from fuser import _C
    tr = trace.view(torch.int64).reshape(-1, _C.STREAM_TRACE_WORDS)[:p.derived["units"]].cpu()
    tr = tr[tr[:, 1] > 0]   # (units sharing their l-tiles: the pieces no helper took record nothing)
    units = len(tr)
    t0 = int(tr[:, 1].min())
    u1 = p.derived["grid_m"] * p.derived["nt1"] * p.splits[0] * (p.raw["params"]["phases"] == 2)
    rows = []
    for lo, hi, ph in ((0, u1, 1), (u1, units, 2)):
        if hi <= lo:  # one phase: no phase-1 units
            continue
        seg = tr[lo:hi]
        claim, ready, first, done, mma, issued = ((seg[:, i] - t0).double() / 1e3 for i in (1, 2, 3, 4, 6, 8))
        busy = (done - first)
        r = dict(phase=ph, units=hi - lo, blocks=len(set(seg[:, 0].tolist())), first_claim=float(claim.min()),
                 last_claim=float(claim.max()), first_done=float(done.min()), last_done=float(done.max()),
                 unit_us_median=float(busy.median()), unit_us_max=float(busy.max()),
                 wait_us_median=float((first - claim).median()),
                 # a unit's time split: its main loop (of which waiting for data), then its epilogue
                 mainloop_us_median=float((mma - first).median()),
                 data_wait_us_median=float(seg[:, 7].double().median() / 1e3),
                 epilogue_us_median=float((done - mma).median()), epilogue_us_max=float((done - mma).max()),
                 issue_us_median=float((issued - claim).median()))
        if ph == 2 and p.raw["params"]["phases"] == 2:  # (one phase: nothing to wait for)
            r["ready_wait_us_median"] = float((ready - claim).median())
        rows.append(r)
        log(f"{label} phase {ph}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                 for k, v in r.items()))
    span = float((tr[:, 4].max() - t0) / 1e3)
    log(f"{label}: span {span:.1f} us | {p.summary()}{suffix}")
    raw = tr.clone()
    for i in (1, 2, 3, 4, 6, 8):
        raw[:, i] -= t0
    return dict(plan=p.summary(), phases=rows, units1=u1, span_us=span, raw=raw.tolist())


OVERLAP = [  # name, d_model, d_ff, d_out, gated, act, tokens, plan constraints
    ("llama2-7b", 4096, 11008, 4096, True, "silu", 1, {}), ("llama3-8b", 4096, 14336, 4096, True, "silu", 1, {}),
    ("llama3-8b", 4096, 14336, 4096, True, "silu", 16, {}), ("llama3-8b", 4096, 14336, 4096, True, "silu", 16,
                                                             dict(bm=16, s1=2, s2=4)),
    ("llama3-8b", 4096, 14336, 4096, True, "silu", 128, dict(bm=128)), ("gpt2", 768, 3072, 768, False, "gelu", 1, {}),
    ("llama-70b", 8192, 28672, 8192, True, "silu", 16, dict(bm=16)), ("S1", 3072, 8192, 3072, True, "silu", 128, {}),
] + [(name, 4096, f, 4096, True, "silu", 1, dict(bm=16, s1=s1, s2=s2))
     for name, f in (("llama2-7b", 11008), ("llama3-8b", 14336)) for s1, s2 in ((1, 4), (2, 4), (2, 8), (1, 8))]


def overlap_section(log):
    """Stream plans launched early (programmatic dependent launch: the weights of a block's first unit, and
    a phase-2 unit's W_down, requested before the wait) against the same kernel launched after the
    previous one ends, and eager: CUDA graphs of back-to-back calls on rotating inputs, interleaved. Each
    graph's outputs (one per input set) are checked against a float64 reference afterwards."""
    from fuser import _C, runtime
    gen = torch.Generator(device="cuda").manual_seed(5)
    rows = []
    for name, d, f, l, gated, act, m, cons in OVERLAP:
        p = fuser.plan(m, d, f, d_out=l, gated=gated, activation=act, target="h200", fused=True, kind="stream",
                       **cons)
        bytes_ = 2 * (f * d * (2 if gated else 1) + l * f)
        sets = max(2, min(6, -(-(150 << 20) // bytes_)))
        per = max(sets, min(24, int(2e6 // bytes_) // sets * sets))
        ins = _inputs(d, f, l, gated, m, sets, gen)
        dev = torch.cuda.current_device()
        launch = runtime.launch_for(p, dev)

        def launcher(t, y, overlap):
            buf = launch.scratch(m, torch.cuda.current_stream().cuda_stream)
            return lambda: _C.ffn_launch(launch.kernel, t["x"], t["w_up"], t["w_down"], t.get("w_gate"), None, None,
                                         None, act, y, buf.capsule, torch.cuda.current_stream().cuda_stream,
                                         overlap=overlap)
        outs = {v: [torch.full((m, l), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
                for v in ("early", "serial")}
        graphs = [graph_of([lambda t=ins[i % sets]: fuser.ffn_reference(activation=act, **t) for i in range(per)])]
        for v in ("early", "serial"):
            calls = [launcher(t, o, v == "early") for t, o in zip(ins, outs[v])]
            graphs.append(graph_of([calls[i % sets] for i in range(per)]))
        te, t_early, t_serial = _time_graphs(graphs, per, rounds=21)
        errs = {}
        for v in ("early", "serial"):
            worst = 0.0
            for t, o in zip(ins, outs[v]):
                ref = fuser.ffn_reference(activation=act, **{k: x.double() for k, x in t.items()})
                worst = max(worst, float((o.double() - ref).norm() / ref.norm()))
            errs[v] = worst
        ok = all(e < 2e-2 for e in errs.values())
        row = dict(name=name, m=m, plan=p.summary(), eager=te, early=t_early, serial=t_serial, floor=p.floor_us,
                   gbps=bytes_ / t_early / 1e3, rel_err=errs, ok=ok)
        rows.append(row)
        log(f"{'ok ' if ok else 'BAD'} overlap {name:10s} m={m:<4d} early {t_early:7.1f} serial {t_serial:7.1f} "
            f"eager {te:7.1f} floor {p.floor_us:6.1f} | early {te / t_early:.2f}x eager, {t_early / p.floor_us:.2f}x "
            f"floor, {bytes_ / t_early / 1e3:.0f} GB/s; serial {t_serial / p.floor_us:.2f}x floor | err "
            f"{max(errs.values()):.1e} | {p.summary()}")
        del graphs, ins, outs
        torch.cuda.empty_cache()
    return rows


def splits_section(log):
    """Forced splits (s1, s2) on one shape: every reduction path, ragged and full token counts."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    out = []
    for (s1, s2), m, bm in itertools.product([(1, 1), (2, 1), (1, 3), (4, 6), (8, 16), (3, 16)], (5, 30, 64, 128),
                                             (16, 32, 64, 128)):
        if m > bm:
            continue
        try:
            res = stream_case("splits", 1024, 4096, 1024, True, "silu", True, m, "bfloat16",
                              dict(s1=s1, s2=s2, bm=bm), gen)
        except Exception as e:  # noqa: BLE001
            res = dict(name="splits", m=m, ok=False, error=f"{type(e).__name__}: {e}")
        out.append(dict(res, s=(s1, s2)))
        log(("ok " if res["ok"] else "BAD ") + f"splits {s1}/{s2} m={m} bm={bm}: " + json.dumps(res)[:250])
    return out


def bench_section(log, which):
    from fuser.tools.bench import parse_workload, run, workload_set
    ws = workload_set(which) if which in ("paper", "quick", "models", "all") else [parse_workload(s) for s in
                                                                                    which.split(",")]
    results, meta = run(ws, variants=("eager_graph", "cublas_graph", "fuser_graph", "fused_graph"), autotune="none",
                        log=log)
    rows = []
    for r in results:
        t = r.times
        row = dict(workload=r.workload.label, floor=r.floor_us, eager_graph=t.get("eager_graph"),
                   cublas_graph=t.get("cublas_graph"), fuser_graph=t.get("fuser_graph"),
                   fused_graph=t.get("fused_graph"), fused_plan=r.fused_plan, plan=r.plan,
                   fused_predicted=r.fused_predicted_us)
        row["fused_vs_eager"] = row["eager_graph"] / row["fused_graph"]
        row["fused_x_floor"] = row["fused_graph"] / r.floor_us
        rows.append(row)
        log(f"{row['workload']:18s} floor {r.floor_us:8.1f}  eager {row['eager_graph']:8.1f}  fused "
            f"{row['fused_graph']:8.1f} ({row['fused_vs_eager']:.2f}x eager, {row['fused_x_floor']:.2f}x floor, "
            f"predicted {r.fused_predicted_us:.1f})  fuser {row['fuser_graph']:.1f}  | {r.fused_plan}")
    return dict(rows=rows, meta=meta)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gemm", action="store_true")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--splits", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--decode", action="store_true", help="sweep the decode shapes (swap-AB and the rest)")
    ap.add_argument("--prefill", action="store_true", help="sweep shapes of several row tiles (256-2048 tokens)")
    ap.add_argument("--after", action="store_true",
                    help="the sweeps also time each plan and eager after a copy writing their input (16 or more calls "
                         "per graph): what fit_stream.py --after fits to")
    ap.add_argument("--bench", default=None, help="paper, quick, models, all, or workloads (G4,S1,llama3-8b:16)")
    ap.add_argument("--trace", nargs="?", const="decode", choices=("decode", "prefill"),
                    help="trace a few stream plans (unit timelines): decode-size (default) or prefill-size")
    ap.add_argument("--trace-fp8", nargs="+", metavar="SPEC", default=[],
                    help="trace quantized (FP8) stream plans: MODEL:M[:bm=128,s1=1,...], MODEL one of fp8_decode.py's")
    ap.add_argument("--inputs-ab", nargs="+", metavar="SPEC", default=[],
                    help="NAME:M[:bm=16,s1=3,...]: a plan timed on separate and on merged W_gate/W_up tensors")
    ap.add_argument("--overlap", action="store_true", help="early (PDL) against serial launches of stream plans")
    ap.add_argument("--pairs", action="store_true", help="cluster pairs (multicast) against single blocks, timed "
                    "and traced")
    ap.add_argument("--one-phase", action="store_true", help="one-phase stream plans against two-phase ones on "
                    "small chains, timed and traced")
    ap.add_argument("--epilogue", action="store_true",
                    help="trace GPT-2 prefill plans (2048 tokens, bn 256 and 128) with GELU and with ReLU: what the "
                    "activation costs a phase-1 epilogue")
    ap.add_argument("--one", default=None, help="NAME:M[:bm=128,s1=1,...]: run one SWEEP or PREFILL shape's best "
                    "stream plan (under the constraints) 3 times, for ncu, and exit")
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.one:
        name, m, cons = parse_one(a.one)
        (_, d, f, l, gated, act, _), = [w for w in SWEEP + PREFILL if w[0] == name][:1]
        p = fuser.plan(m, d, f, d_out=l, gated=gated, activation=act, target="h200", fused=True, kind="stream",
                       **cons)
        t = _inputs(d, f, l, gated, m, 1, torch.Generator(device="cuda").manual_seed(1))[0]
        for _ in range(3):
            fuser.ffn(activation=act, plan=p, **t)
        torch.cuda.synchronize()
        print(p.summary())
        return
    log_lines = []

    def log(s):
        print(s, flush=True)
        log_lines.append(s)
    log(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {torch.cuda.get_device_name()} torch {torch.__version__}")
    result = {}

    def write(res):
        with open(os.path.join(a.out, "kernel_check.json"), "w") as f:
            json.dump(dict(result=res, log=log_lines), f, indent=1, default=str)

    def stopped(signum, frame):  # `timeout` ran out: keep what the sweeps timed
        log(f"stopped by signal {signum}: writing the rows timed so far")
        write({**{k: v for k, v in _IN_PROGRESS.items()}, **result})
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stopped)
    for flag, name, fn in ((a.gemm, "gemm", gemm_section), (a.stream, "stream", stream_section),
                           (a.splits, "splits", splits_section),
                           (a.sweep, "sweep", lambda log: sweep_section(log, after=a.after)),
                           (a.decode, "decode", lambda log: sweep_section(log, top=4, shapes=DECODE, section="decode",
                                                                          after=a.after)),
                           (a.prefill, "prefill", lambda log: sweep_section(log, top=3, shapes=PREFILL,
                                                                            section="prefill", after=a.after)),
                           (a.overlap, "overlap", overlap_section), (a.pairs, "pairs", pairs_section),
                           (a.one_phase, "one_phase", one_phase_section)):
        if flag:
            t0 = time.time()
            try:
                result[name] = fn(log)
            except Exception:  # noqa: BLE001
                log(f"{name} section failed:\n{traceback.format_exc()}")
            log(f"[{name}: {time.time() - t0:.1f} s]")
    if a.epilogue:
        result["epilogue"] = []
        for bn in (256, 128):
            cons = dict(bm=128, bn=bn, bl=128, s1=1, s2=1)
            for act in ("gelu", "relu", "gelu"):
                try:
                    result["epilogue"].append(trace_run("gpt2", 2048, log, act=act, **cons))
                except Exception:  # noqa: BLE001
                    log(f"epilogue trace failed:\n{traceback.format_exc()}")
    if a.trace:
        result["trace"] = []
        decode = (("G1", 128, {}), ("G4", 128, {}), ("G8", 128, {}), ("S1", 128, {}), ("S1", 128, dict(bn=128, bl=128)),
                  ("S8", 128, {}),
                  ("llama3-8b", 1, dict(bn=128, bl=256)), ("llama3-8b", 1, dict(bm=16, s1=1, s2=4)),
                  ("llama3-8b", 1, dict(bm=16, s1=2, s2=8)), ("llama3-8b", 1, dict(bm=16, s1=4, s2=8)),
                  ("llama3-8b", 1, dict(bm=16, s1=8, s2=16)), ("llama3-8b", 16, dict(bm=16, s1=2, s2=8)),
                  ("llama3-8b", 1, dict(bm=16, lspan=32, s2=112)), ("gpt2", 16, {}))
        prefill = (("gpt2", 2048, dict(bm=128, bn=256, bl=128, s1=1, s2=1)),
                   ("gpt2", 2048, dict(bm=128, bn=256, bl=128, s1=1, s2=2)),
                   ("gpt2", 2048, dict(bm=128, bn=128, bl=128, s1=1, s2=1)),
                   ("gpt2", 2048, dict(bm=128, bn=192, bl=192, s1=1, s2=1)),
                   ("llama3-8b", 1024, dict(bm=128, bn=128, bl=128, s1=1, s2=1)))
        for name, m, cons in prefill if a.trace == "prefill" else decode:
            try:
                result["trace"].append(trace_run(name, m, log, **cons))
            except Exception:  # noqa: BLE001
                log(f"trace {name} failed:\n{traceback.format_exc()}")
    for section, specs, fn in (("trace_fp8", a.trace_fp8, trace_fp8), ("inputs_ab", a.inputs_ab, inputs_ab)):
        for spec in specs:
            try:
                result.setdefault(section, []).append(fn(spec, log))
            except Exception:  # noqa: BLE001
                log(f"{section} {spec} failed:\n{traceback.format_exc()}")
                result.setdefault(section, []).append(dict(spec=spec, ok=False))
    if a.bench:
        t0 = time.time()
        try:
            result["bench"] = bench_section(log, a.bench)
        except Exception:  # noqa: BLE001
            log(f"bench section failed:\n{traceback.format_exc()}")
        log(f"[bench: {time.time() - t0:.1f} s]")
    write(result)
    bad = sum(1 for sec in ("stream", "splits", "overlap") for r in result.get(sec, []) if not r.get("ok"))
    bad += sum(1 for sec in ("sweep", "decode", "prefill") for r in result.get(sec, []) if r.get("ok") is False)
    bad += sum(1 for sec in ("gemm", "trace_fp8", "inputs_ab") for r in result.get(sec, []) if r.get("ok") is False)
    log(f"failures: {bad}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
