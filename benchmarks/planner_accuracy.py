"""How well the planner's cost model ranks fused plans: for each shape, the K best fused
candidates by predicted time (K = 64, the search's most; every one compiled and run) are timed on the
GPU, interleaved, each in a CUDA graph over rotated inputs (CUDA events, medians). Reported per shape:
the Spearman rank correlation between predicted and measured time, the regret of the planner's pick
(its measured time over the best measured), the median measured / predicted ratio (what
``fused_time_scale`` in the target table stands for), and PyTorch eager in a graph for scale.

    python benchmarks/planner_accuracy.py [--shape llama3-8b:16 ...] [--k 64] [--reps 10] [--csv out.csv]

Compile the candidates ahead of time (no GPU needed) with ``--compile-only``; the kernel cache then
serves the GPU run.
"""
import argparse
import csv
import os
import re
import statistics
import sys
import time

import fuser
from fuser.tools.bench import parse_workload
from fuser.tools.calibrate import TERMS, fit_term_scales, time_plans, unscaled_terms
from fuser.tools.timing import hopper_reason

SHAPES = ("gpt2:16", "gpt2:2048", "G9", "S8", "llama3-8b:16", "llama3-8b:512")


def ranks(values):
    """Ranks 1..n, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    r = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a, b):
    """Spearman's rank correlation of two equal-length sequences (Pearson's on their ranks)."""
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else float("nan")


def candidates(w, k):
    return fuser.plans(w.m, w.d_model, w.d_ff, d_out=w.d_out, gated=w.gated, activation=w.activation,
                       fused=True, k=k)


def measure(w, plans, reps):
    """Median microseconds per call of each plan (graphed; None where one failed), and of eager in a graph."""
    unfused = fuser.plan(w.m, w.d_model, w.d_ff, d_out=w.d_out, gated=w.gated, activation=w.activation, fused=False)
    t = time_plans(w, list(plans) + [unfused], reps)
    return t[:-1], t[-1]


#: The target constants each committed CSV was costed with, where they differ from today's table:
#: ``samples_from_csv(..., costed_with=COSTED_WITH[name])`` converts its terms to today's constants.
COSTED_WITH = {
    "2026-11-29-h200-planner.csv": dict(mma_tflops=767.9, fused_mma_eff=0.45, barrier_cycles=390.0, launch_us=2.5,
                                        dsm_bytes_per_clk=[0.0, 16.4, 12.4, 15.5, 15.0]),
    "2026-11-29-h200-planner-2.csv": dict(mma_tflops=762.2, fused_mma_eff=0.45, barrier_cycles=390.0, launch_us=1.24,
                                          dsm_bytes_per_clk=[0.0, 16.4, 12.4, 15.5, 15.0]),
    "2026-11-29-h200-planner-3.csv": dict(mma_tflops=762.2, fused_mma_eff=0.742, barrier_cycles=377.0, launch_us=1.24,
                                          dsm_bytes_per_clk=[0.0, 16.0, 14.3, 14.4, 15.1]),
}


def cluster_index(plan_text):
    """log2 of the cluster size of a plan summary ("... cluster (1, 4, 4, 4) ...": 1 x 4 x 4 = 16 -> 4)."""
    m, n, k = (int(v) for v in re.search(r"cluster \(([^)]*)\)", plan_text).group(1).split(",")[:3])
    return (m * n * k).bit_length() - 1


def samples_from_csv(path, scale_used=None, costed_with=None, target="h200"):
    """The (shape, measured us, launch us, unscaled terms) samples of a CSV this script wrote: from its
    model_* columns, or from cost_* / scale_used for a CSV written before those existed.

    `costed_with` (the target constants the CSV was costed with, see COSTED_WITH) converts the terms
    that scale with one constant to `target`'s value of it: compute (mma_tflops x fused_mma_eff), dsm
    (dsm_bytes_per_clk of the plan's cluster size), sync (barrier_cycles), and launch. The hbm and l2
    terms (rates capped by loads in flight) are kept as written."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and "model_compute" not in rows[0] and scale_used is None:
        raise SystemExit(f"{path}: no model_* columns; give --scale-used (the fused_time_scale of that run)")
    now = fuser._C.targets()[target] if isinstance(target, str) else target
    out = []
    for r in rows:
        terms = {k: float(r[f"model_{k}"]) if "model_compute" in r else float(r[f"cost_{k}"]) / scale_used
                 for k in TERMS}
        launch = float(r["cost_launch"])
        if costed_with:
            was = costed_with
            ci = cluster_index(r["plan"])
            terms["compute"] *= was["mma_tflops"] * was["fused_mma_eff"] / (now["mma_tflops"] * now["fused_mma_eff"])
            terms["dsm"] *= was["dsm_bytes_per_clk"][ci] / now["dsm_bytes_per_clk"][ci] if ci else 1.0
            terms["sync"] *= was["barrier_cycles"] / now["barrier_cycles"]
            launch = now["launch_us"]
        out.append((r["shape"], float(r["measured_us"]), launch, terms))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", help="workloads as for `python -m fuser bench --shape`")
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--csv", default=None, help="write every candidate's prediction and measurement here")
    ap.add_argument("--compile-only", action="store_true", help="only compile the candidates (no GPU needed)")
    ap.add_argument("--fit", metavar="CSV", help="only fit the cost model's calibration to a CSV this script wrote")
    ap.add_argument("--scale-used", type=float, default=None,
                    help="with --fit on a CSV without model_* columns: the uniform fused_time_scale its cost_* "
                         "columns were computed with (4.1 for results/2026-11-29-h200-planner.csv)")
    a = ap.parse_args(argv)
    if a.fit:
        fit = fit_term_scales(samples_from_csv(a.fit, a.scale_used, COSTED_WITH.get(os.path.basename(a.fit))))
        print(f"fused_time_scale {fit['fused_time_scale']:.3f}; leave-one-shape-out log error: uniform "
              f"{fit['loso_uniform']:.3f}, per-term {fit['loso_terms']:.3f}; factors "
              f"{'adopted' if fit['adopted'] else 'not adopted'}: "
              + ", ".join(f"fused_scale_{k} {v:.3f}" for k, v in fit["factors"].items()))
        return 0
    workloads = [parse_workload(s) for s in (a.shape or SHAPES)]
    if a.compile_only:
        for w in workloads:
            t = time.perf_counter()
            ks = [fuser.compile(p) for p in candidates(w, a.k)]
            print(f"{w.label}: {len(ks)} kernels, {sum(not k.cache_hit for k in ks)} compiled, "
                  f"{time.perf_counter() - t:.1f} s", flush=True)
        return 0
    why = hopper_reason()
    if why is not None:
        print(f"planner_accuracy times kernels on a Hopper GPU: {why}", file=sys.stderr)
        return 2
    rows = []
    print("| shape | candidates | Spearman | regret of the pick | measured / predicted (median) | best measured "
          "us | pick us | eager graph us | best plan |\n|---|---|---|---|---|---|---|---|---|")
    for w in workloads:
        ps = candidates(w, a.k)
        measured, eager = measure(w, ps, a.reps)
        ran = [i for i, m in enumerate(measured) if m is not None]
        ps, measured = [ps[i] for i in ran], [measured[i] for i in ran]
        pred = [p.predicted_us for p in ps]
        best = min(range(len(ps)), key=measured.__getitem__)
        ratio = statistics.median(m / p for m, p in zip(measured, pred))
        print(f"| {w.label} | {len(ps)} | {spearman(pred, measured):.2f} | {measured[0] / measured[best]:.2f}x | "
              f"{ratio:.2f} | {measured[best]:.1f} | {measured[0]:.1f} | {eager:.1f} | {ps[best].summary()} |",
              flush=True)
        for i, (p, m) in enumerate(zip(ps, measured)):
            rows.append(dict(shape=w.label, rank_predicted=i, predicted_us=round(p.predicted_us, 2),
                             measured_us=round(m, 2), eager_graph_us=round(eager, 2), plan=p.summary(),
                             **{f"cost_{k}": round(v, 3) for k, v in p.breakdown.items()},
                             **{f"model_{k}": round(v, 4) for k, v in unscaled_terms(p).items()}))
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows[0]))
            wr.writeheader()
            wr.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
