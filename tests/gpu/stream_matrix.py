"""The GPU correctness matrix of the stream kernel (include/fuser/device/stream.cuh): every token-row
layout (bm 16 and 32 swap-AB, 64, 128) x plain / gated x the four activations x bias or not x bfloat16 /
float16 x K splits of either phase (none, some, many), over ragged token counts (one row tile, or several
with a partial last one) and widths (448 -> 1472 -> 200: odd K step counts, a partial output tile),
192-wide tiles, 48-, 96- and 112-wide n-tiles, 96-wide l-tiles, cluster pairs sharing an operand (both kinds,
with ghost units), one-phase plans (units of one l-tile or of several, with many d_ff splits), and swap-AB
tiles of many splits.

Each case forces a stream plan with its bm and splits, draws fresh random inputs, poisons the output with
NaN, and checks: the relative error against a float64 reference is at most twice PyTorch eager's own
(same dtype); every element was written; three runs are bitwise identical. With --exact, the cases whose
last row tile is ragged run with its token boxes exact and whole, and must give the same bits. Run by
tests/test_gpu_stream.py, or directly (``python tests/gpu/stream_matrix.py [--json FILE]``); its plans are
compiled on the CPU by tests/test_stream.py."""
import argparse
import itertools
import json
import sys
import time

import fuser
from plan_check import check_plan, ffn_tensors

BMS = (16, 32, 64, 128)
SPLITS = ((1, 1), (2, 3), (4, 8))
ACTS = ("relu", "gelu", "gelu_tanh", "silu")
SHAPES = ((256, 1024, 256), (512, 1536, 384), (1024, 4096, 1024), (448, 1472, 200))   # d_model, d_ff, d_out


def cases():
    """bm x gating x activation x bias, each with the next dtype, splits, shape and token count (1, ragged,
    full, two and a half row tiles) in rotation: every value of every axis is covered."""
    combos = list(itertools.product(BMS, (False, True), ACTS, (False, True)))
    for j, (bm, gated, act, bias) in enumerate(combos):
        dtype = ("bfloat16", "float16")[j % 2]
        s1, s2 = SPLITS[j % 3]
        d, f, l = SHAPES[(j // 3) % len(SHAPES)]
        m = (1, bm // 2 + 1, bm, 2 * bm + bm // 2 + 3)[(j // 2) % 4]
        yield dict(bm=bm, gated=gated, activation=act, bias=bias, dtype=dtype, s1=s1, s2=s2, m=m,
                   d_model=d, d_ff=f, d_out=l)
    # 192-wide tiles (wgmma N 192, or 96 per warpgroup at bm 64; partial last tiles): unsplit, or beside a
    # split phase of 128-wide tiles (a split phase's tiles are 64, 128 or 256 wide)
    for j, (bm, gated) in enumerate(itertools.product((64, 128), (False, True))):
        split = j == 2
        yield dict(bm=bm, gated=gated, activation=ACTS[j], bias=j % 2 == 0, dtype=("bfloat16", "float16")[j % 2],
                   s1=1, s2=3 if split else 1, m=(bm + 5, 3 * bm - 7)[j % 2], d_model=448, d_ff=1472, d_out=200,
                   bn=(128 if bm == 64 else 64) if gated else 192, bl=128 if split else 192)
    # 192-wide tiles in split phases (their partials are whole fragments, like any width's)
    yield dict(bm=128, gated=False, activation="gelu", bias=True, dtype="bfloat16", s1=2, s2=3, m=200, d_model=448,
               d_ff=1472, d_out=392, bn=192, bl=192)
    # cluster pairs sharing an operand by multicast: row-tile pairs (2, 1, 1, 1) with an odd count of row
    # tiles (the last pair's second block a ghost) or one row tile (every pair a ghost pair), tile pairs
    # (1, 2, 1, 2) with an odd count of n-tiles or l-tiles; every bm, split or not
    for j, (cl, bm, gated, m, shape, tiles, splits) in enumerate((
            (ROWS, 128, False, 3 * 128 - 7, SHAPES[3], dict(bn=192, bl=128), (1, 1)),
            (ROWS, 64, True, 5 * 64 - 30, SHAPES[1], {}, (2, 3)),
            (ROWS, 16, True, 40, SHAPES[2], {}, (4, 8)),
            (ROWS, 32, False, 4 * 32, SHAPES[0], {}, (1, 3)),
            (ROWS, 128, True, 100, SHAPES[3], dict(bn=128, bl=64), (2, 1)),
            (TILES, 128, False, 128 + 5, SHAPES[3], dict(bn=64, bl=64), (1, 1)),
            (TILES, 64, True, 2 * 64 + 9, SHAPES[1], dict(bn=128, bl=128), (2, 3)),
            (TILES, 16, True, 9, SHAPES[2], {}, (2, 8)),
            (TILES, 32, False, 70, SHAPES[1], {}, (4, 1)))):
        yield dict(bm=bm, gated=gated, activation=ACTS[j % 4], bias=j % 3 == 0, dtype=("bfloat16", "float16")[j % 2],
                   s1=splits[0], s2=splits[1], m=m, d_model=shape[0], d_ff=shape[1], d_out=shape[2], cluster=cl,
                   **tiles)

    # 96-wide n-tiles (wgmma N 96; 128-row tiles): a partial last n-tile (1472 = 15 x 96 + 32, 4096 = 42 x 96 + 64)
    # whose columns straddle phase 2's 64-column K steps, one and several row tiles, K splits of either phase
    for j, (gated, m, shape, bl, splits) in enumerate((
            (True, 77, SHAPES[3], 128, (1, 2)),
            (False, 2 * 128 + 40, SHAPES[3], 64, (2, 3)),
            (True, 128, SHAPES[2], 128, (3, 4)),
            (True, 1, SHAPES[1], 64, (1, 8)))):
        yield dict(bm=128, gated=gated, activation=ACTS[(j + 2) % 4], bias=j % 2 == 0,
                   dtype=("bfloat16", "float16")[j % 2], s1=splits[0], s2=splits[1], m=m, d_model=shape[0],
                   d_ff=shape[1], d_out=shape[2], bn=96, bl=bl)
    # ... and at bm 64, where each consumer warpgroup takes half the columns (wgmma N 48 and 56)
    for j, (bn, gated, m, shape, bl, splits) in enumerate((
            (96, True, 50, SHAPES[3], 128, (2, 3)),
            (112, False, 2 * 64 + 40, SHAPES[2], 64, (1, 2)),
            (112, True, 64, SHAPES[1], 128, (3, 4)))):
        yield dict(bm=64, gated=gated, activation=ACTS[j], bias=j % 2 == 0, dtype=("bfloat16", "float16")[j % 2],
                   s1=splits[0], s2=splits[1], m=m, d_model=shape[0], d_ff=shape[1], d_out=shape[2], bn=bn, bl=bl)
    # 112-wide n-tiles (wgmma N 112: three chunks of 32 columns and a tail of 16 in the H stores), likewise
    for j, (gated, m, shape, bl, splits) in enumerate((
            (True, 100, SHAPES[3], 128, (1, 3)),
            (False, 3 * 128, SHAPES[2], 64, (2, 2)),
            (True, 128 + 70, SHAPES[2], 128, (1, 4)))):
        yield dict(bm=128, gated=gated, activation=ACTS[(j + 1) % 4], bias=j % 2 == 1,
                   dtype=("bfloat16", "float16")[j % 2], s1=splits[0], s2=splits[1], m=m, d_model=shape[0],
                   d_ff=shape[1], d_out=shape[2], bn=112, bl=bl)
    # 48-wide n-tiles (wgmma N 48; 128-row tiles only): S2's d_ff (5632 = 117 x 48 + 16), 1000 (20 x 48 + 40, its
    # last K step ending at 1024, past 1008 where a 22nd n-tile would start: phase 2's count of its split's
    # n-tiles stops at d_ff), 1472 and 1536, one and several row tiles, K splits of either phase, beside 96-wide
    # l-tiles
    for j, (gated, m, shape, bl, splits) in enumerate((
            (True, 77, (2048, 5632, 2048), 64, (1, 4)),
            (True, 2 * 128 - 56, (512, 1000, 264), 64, (2, 3)),
            (False, 128, SHAPES[3], 128, (1, 1)),
            (False, 3 * 128 - 5, SHAPES[1], 96, (3, 4)))):
        yield dict(bm=128, gated=gated, activation=ACTS[(j + 3) % 4], bias=j % 2 == 1,
                   dtype=("bfloat16", "float16")[j % 2], s1=splits[0], s2=splits[1], m=m, d_model=shape[0],
                   d_ff=shape[1], d_out=shape[2], bn=48, bl=bl)
    # 96-wide l-tiles (wgmma N 96 in phase 2, 48 per warpgroup at bm 64): a partial last l-tile (200 = 2 x 96 + 8,
    # 1024 = 10 x 96 + 64), split or not, beside 96- to 192-wide n-tiles
    for j, (bm, gated, m, shape, bn, splits) in enumerate((
            (128, False, 2 * 128 + 40, SHAPES[3], 192, (1, 1)),
            (128, True, 100, SHAPES[2], 64, (1, 4)),
            (64, True, 2 * 64 + 9, SHAPES[3], 128, (2, 3)),
            (128, False, 128, SHAPES[2], 96, (2, 2)))):
        yield dict(bm=bm, gated=gated, activation=ACTS[(j + 3) % 4], bias=j % 2 == 0,
                   dtype=("bfloat16", "float16")[j % 2], s1=splits[0], s2=splits[1], m=m, d_model=shape[0],
                   d_ff=shape[1], d_out=shape[2], bn=bn, bl=96)
    # one phase (each unit computes the H of its d_ff range into shared memory): every bm, gated or not,
    # several row tiles, d_ff 200 (the second n-tile of the range mostly beyond d_ff), split or not
    for j, (bm, gated, m, shape, tiles, s2) in enumerate((
            (16, False, 40, SHAPES[0], {}, 4),
            (32, True, 70, SHAPES[1], {}, 3),
            (64, False, 150, (448, 200, 392), dict(bn=128, bl=128), 1),
            (128, True, 133, SHAPES[0], dict(bn=64, bl=64), 4),
            (16, True, 1, SHAPES[2], {}, 8))):
        yield dict(bm=bm, gated=gated, activation=ACTS[(j + 1) % 4], bias=j % 2 == 0,
                   dtype=("bfloat16", "float16")[j // 2 % 2], s1=1, s2=s2, m=m, d_model=shape[0], d_ff=shape[1],
                   d_out=shape[2], phases=1, **tiles)
    # one phase, units spanning several l-tiles (GEMM1 once per unit) with many d_ff splits at bm 16 / 32: the
    # partials are the real token rows, summed after every unit by all blocks (each element by one thread or a
    # group of threads, by token count), every l-tile or a span that leaves a short last group
    for j, (bm, gated, m, shape, s2, lspan) in enumerate((
            (16, True, 1, SHAPES[2], 32, 8),
            (16, False, 3, SHAPES[1], 12, 3),
            (32, True, 37, SHAPES[0], 8, 2),
            (16, True, 16, SHAPES[2], 16, 3),
            (32, False, 9, SHAPES[3], 12, 2))):
        yield dict(bm=bm, gated=gated, activation=ACTS[j % 4], bias=j % 2 == 1, dtype=("bfloat16", "float16")[j % 2],
                   s1=1, s2=s2, m=m, d_model=shape[0], d_ff=shape[1], d_out=shape[2], phases=1, lspan=lspan)
    # many splits at bm 32 (swap-AB): more partials than the last split can hold in flight at once, summed
    # four splits at a time in the same order
    for j, (gated, s1, s2, m) in enumerate(((True, 8, 16, 37), (False, 4, 16, 1))):
        yield dict(bm=32, gated=gated, activation=ACTS[j + 1], bias=j == 0, dtype=("bfloat16", "float16")[j],
                   s1=s1, s2=s2, m=m, d_model=1024, d_ff=4096, d_out=1024)


ROWS, TILES = (2, 1, 1, 1), (1, 2, 1, 2)   # the stream kernel's cluster pairs


def plan_of(c):
    return fuser.plan(c["m"], c["d_model"], c["d_ff"], d_out=c["d_out"], gated=c["gated"], activation=c["activation"],
                      bias=c["bias"], dtype=c["dtype"], target="h200", fused=True, kind="stream", bm=c["bm"],
                      s1=c["s1"], s2=c["s2"], **{k: c[k] for k in ("bn", "bl", "cluster", "phases", "lspan") if k in c})


def inputs_of(c, gen):
    return ffn_tensors(gen, c["m"], c["d_model"], c["d_ff"], c["d_out"], gated=c["gated"], bias=c["bias"],
                       dtype=c["dtype"])


def run_case(c, gen):
    plan = plan_of(c)
    return dict(c, plan=plan.summary(), **check_plan(plan, c["activation"], inputs_of(c, gen)))


def run_settings_case(c, gen, setting, values):
    """The case under each of `values` of a process-wide launch setting (``_C.<setting>``), on the same inputs: each
    passes check_plan, and their outputs are bitwise equal. The result is the last value's check, with ``ok`` only
    where every value passed and gave the same bits."""
    import torch
    from fuser import _C
    plan, t = plan_of(c), inputs_of(c, gen)
    res, outs = [], []
    for v in values:
        before = getattr(_C, setting)(v)
        try:
            res.append(check_plan(plan, c["activation"], t))
            out = torch.full((c["m"], c["d_out"]), float("nan"), device="cuda", dtype=t["x"].dtype)
            outs.append(fuser.ffn(activation=c["activation"], out=out, plan=plan, **t))
        finally:
            getattr(_C, setting)(before)
    same = all(torch.equal(outs[0], o) for o in outs[1:])
    return dict(c, plan=plan.summary(), **{**res[-1], "ok": all(r["ok"] for r in res) and same},
                each_ok=[r["ok"] for r in res], same_bits=same)


def run_exact_case(c, gen):
    """The case with the token boxes of its ragged last row tile whole and exact (``_C.stream_exact_boxes``): a
    token row's products never meet another row's, so the rows past the last, zero fill or stale data, cannot reach
    a stored one."""
    return run_settings_case(c, gen, "stream_exact_boxes", (False, True))


#: The ring's first pass with the whole ring at once, one slot at a time (1 byte) and the default lead
LEADS = (0, 1, 128 * 1024)


def run_lead_case(c, gen):
    """The case with every lead of LEADS (``_C.stream_lead_bytes``): the order loads are requested in never reaches
    the arithmetic, so the bits are the same."""
    return run_settings_case(c, gen, "stream_lead_bytes", LEADS)


def run(log=print, exact=False, leads=False):
    """Every case (check_plan); with `exact`, only those whose last row tile is ragged, each with exact and
    whole token boxes (run_exact_case); with `leads`, each with every first-pass lead (run_lead_case)."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(4321)
    results, t0 = [], time.time()
    for c in cases():
        if exact and c["m"] % c["bm"] == 0:
            continue
        res = run_exact_case(c, gen) if exact else run_lead_case(c, gen) if leads else run_case(c, gen)
        results.append(res)
        log(f"{'ok ' if res['ok'] else 'BAD'} bm={c['bm']:<3d} m={c['m']:<3d} {'gated' if c['gated'] else 'plain'} "
            f"{c['activation']:9s} bias={c['bias']!s:5s} {c['dtype']:8s} splits {c['s1']}/{c['s2']} "
            f"err {res['err']:.2e} (eager {res['eager_err']:.2e}) nan={res['nan']} same={res['identical']}")
    summary = dict(cases=len(results), failed=sum(not r["ok"] for r in results), seconds=round(time.time() - t0, 1),
                   worst_ratio=max(r["err"] / r["eager_err"] for r in results), gpu=torch.cuda.get_device_name(),
                   date=time.strftime("%Y-%m-%d"))
    return summary, results


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--exact", action="store_true", help="the ragged cases with exact and whole token boxes")
    ap.add_argument("--leads", action="store_true", help="every case with each first-pass lead, the same bits")
    a = ap.parse_args()
    summary, results = run(exact=a.exact, leads=a.leads)
    print(json.dumps(summary, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(summary=summary, results=results), f, indent=1)
    sys.exit(1 if summary["failed"] else 0)
