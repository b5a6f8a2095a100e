"""Refit the planner's stream-kernel and eager-path constants to timed plans, and say what the fit changes.

Reads the timed stream plans of `benchmarks/kernel_check.py` logs (its sweep, decode, prefill and overlap sections:
each row a plan summary, its token count, its measured time and eager's), predicts every plan under the
built-in H200 target with candidate values of the five fitted constants (``stream_fixed_us``,
``stream_unit_us``, ``stream_time_scale``, ``stream_sm_gbs``, ``stream_operand_bytes_per_clk``) and keeps
the values with the least mean squared log error (coordinate descent over multiplicative steps; the
same rows and start always give the same answer). Then, before and after, per shape: the rank
correlation of predicted and measured times, the regret of the predicted-best plan (its measured time
over the best measured), and whether that plan beat eager.

The eager path's constants (``eager_op_us``, ``eager_mma_eff``, ``eager_ramp_us``, ``eager_ramp_mb``,
``small_gemm_eff``) are fitted the same way to eager's times (the median of each shape's rows, every row
timing eager beside a plan). With both fitted, the planner itself (``fuser.plan`` on the fitted target)
chooses for every shape, and its choice's measured time is set against the best measured (eager or any
stream plan): the backtest of the joint fit. Every fit starts from the same constants (``START``), so it
does not depend on what the table holds. ``--loso`` repeats both fits without each shape in turn and
asks the planner about the shape left out: how the fit does on a shape it has not seen.

A plan timed in several logs keeps its newest time (logs are read in the order given: put the newest
last). Overlap rows count their early launch, the kernel's default.

    python benchmarks/fit_stream.py \\
        benchmarks/results/2026-12-02-h200-{fit-sweep,fit-decode,prefill-a,prefill-b}.json [--loso] [--json FILE]
"""
import argparse
import json
import math
import os
import re
import statistics
import sys

import fuser
from fuser.tools.bench import parse_workload

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from planner_accuracy import spearman  # noqa: E402

FITTED = ("stream_fixed_us", "stream_unit_us", "stream_time_scale", "stream_sm_gbs", "stream_operand_bytes_per_clk")
EAGER_FITTED = ("eager_op_us", "eager_mma_eff", "eager_ramp_us", "eager_ramp_mb", "small_gemm_eff")
#: Where every fit starts (the table's values before the first fit, a ramp of 2 us where there was none:
#: a multiplicative search cannot leave 0), so a fit does not depend on what the table holds now.
START = dict(stream_fixed_us=2.0, stream_unit_us=3.0, stream_time_scale=1.2, stream_sm_gbs=60.0,
             stream_operand_bytes_per_clk=100.0, eager_op_us=1.24, eager_mma_eff=0.87, eager_ramp_us=2.0,
             eager_ramp_mb=1.0, small_gemm_eff=0.8)
STEPS = (0.5, 0.7, 0.85, 0.95, 1.05, 1.2, 1.4, 2.0)
#: A stream plan as its summary names it: tiles, splits, stages, cluster pairs, one phase (and its units'
#: l-tiles where more than one).
_SUMMARY = re.compile(r"bm=(\d+) bn=(\d+) bl=(\d+), splits (\d+)/(\d+), (\d+) stages"
                      r"( \((?:row-tile|tile) pairs [^)]*\))?(, one phase)?(?:, (\d+) l-tiles per unit)?")
_PAIRS = {" (row-tile pairs share weight tiles)": (2, 1, 1, 1), " (tile pairs share token tiles)": (1, 2, 1, 2)}


def plan_args(summary):
    """The constraints that give back the stream plan a summary names (fuser.plan keywords)."""
    g = _SUMMARY.search(summary).groups()
    bm, bn, bl, s1, s2, stages = (int(v) for v in g[:6])
    out = dict(bm=bm, bn=bn, bl=bl, s1=s1, s2=s2, stages=stages, phases=1 if g[7] else 2)
    if g[8]:
        out["lspan"] = int(g[8])
    if g[6]:
        out["cluster"] = _PAIRS[g[6]]
    return out


def rows_of(paths, after=False):
    """{(name, m, plan): (measured us, eager us)} from kernel_check logs, newest last. `after`: the times after a
    copy writing the input (``measured_after``, ``eager_after``: ``kernel_check.py --after``), rows without them
    left out."""
    out = {}
    for path in paths:
        with open(path) as f:
            result = json.load(f)["result"]
        for section in ("sweep", "decode", "prefill", "overlap"):
            for r in result.get(section) or []:
                if "stream" not in r.get("plan", "") or not r.get("ok", True):
                    continue
                t, eager = (r.get("measured_after"), r.get("eager_after")) if after else \
                    (r.get("early", r.get("measured")), r.get("eager"))
                if t is None or eager is None:
                    continue
                key = (r["name"], r["m"], _SUMMARY.search(r["plan"]).group(0))
                out[key] = (t, eager)
    return out


def predict(key, target):
    name, m, summary = key
    w = parse_workload(f"{name}:{m}")
    p = fuser.plan(m, w.d_model, w.d_ff, d_out=w.d_out, gated=w.gated, activation=w.activation, target=target,
                   fused=True, kind="stream", **plan_args(summary))
    return p.predicted_us


def msle(rows, target):
    return statistics.mean((math.log(predict(k, target)) - math.log(t)) ** 2 for k, (t, _) in rows.items())


def eager_rows(rows):
    """{(name, m): median eager us} over every row of the shape."""
    by = {}
    for k, (_, eager) in rows.items():
        by.setdefault(k[:2], []).append(eager)
    return {k: statistics.median(v) for k, v in by.items()}


def predict_eager(shape, target):
    name, m = shape
    w = parse_workload(f"{name}:{m}")
    return fuser.plan(m, w.d_model, w.d_ff, d_out=w.d_out, gated=w.gated, activation=w.activation, target=target,
                      fused=False).predicted_us


def msle_eager(eager, target):
    return statistics.mean((math.log(predict_eager(k, target)) - math.log(t)) ** 2 for k, t in eager.items())


def fit(rows, target, sweeps=20, names=FITTED, err_of=msle):
    t = dict(target)
    best = err_of(rows, t)
    for _ in range(sweeps):
        improved = False
        for name in names:
            for step in STEPS:
                cand = dict(t, **{name: t[name] * step})
                if name.endswith("_eff") and cand[name] > 1:
                    continue
                e = err_of(rows, cand)
                if e < best - 1e-6:
                    best, t, improved = e, cand, True
        if not improved:
            break
    return t, best


def per_shape(rows, target):
    """Per (name, m): plans, Spearman, regret of the predicted-best plan, its speed-up over eager."""
    shapes = {}
    for k, (t, eager) in rows.items():
        shapes.setdefault(k[:2], []).append((predict(k, target), t, eager, k[2]))
    out = {}
    for shape, plans in sorted(shapes.items()):
        pred, meas = [p[0] for p in plans], [p[1] for p in plans]
        pick = min(plans, key=lambda p: p[0])
        out[shape] = dict(plans=len(plans), spearman=spearman(pred, meas), regret=pick[1] / min(meas),
                          pick=pick[3], pick_us=pick[1], predicted_us=pick[0], eager_us=pick[2],
                          vs_eager=pick[2] / pick[1])
    return out


def backtest(rows, eager, target, packed=False):
    """Per shape: what the planner picks on `target` (eager, or a stream plan: its measured time when the
    sweep timed it), against the best measured time (eager or any stream plan). `packed`: gated shapes are
    planned with their gate and up weights in one tensor (``fuser.plan(..., packed=True)``), so `eager` should
    hold that route's times."""
    out = {}
    for (name, m), t_eager in sorted(eager.items()):
        w = parse_workload(f"{name}:{m}")
        p = fuser.plan(m, w.d_model, w.d_ff, d_out=w.d_out, gated=w.gated, activation=w.activation, target=target,
                       packed=packed and w.gated)
        timed = {k[2]: t for k, (t, _) in rows.items() if k[:2] == (name, m)}
        best = min([t_eager] + list(timed.values()))
        if not p.fused:
            pick, meas = "eager", t_eager
        else:
            s = _SUMMARY.search(p.summary())
            pick = s.group(0) if s else p.summary()
            meas = timed.get(pick)
        out[(name, m)] = dict(pick=pick, predicted_us=p.predicted_us, measured_us=meas, eager_us=t_eager,
                              best_us=best, regret=None if meas is None else meas / best,
                              vs_eager=None if meas is None else t_eager / meas)
    return out


def joint_fit(rows, base):
    """The stream constants fitted to `rows`, then the eager ones to eager's times: (stream-fitted
    target, both-fitted target, stream msle, eager msle)."""
    fitted, err = fit(rows, dict(base, **START))
    both, e_err = fit(eager_rows(rows), fitted, names=EAGER_FITTED, err_of=msle_eager)
    return fitted, both, err, e_err


def loso(rows, base):
    """Leave one shape out: for each shape, both models fitted to the other shapes' rows, then the planner's
    pick for the left-out shape, measured: how the joint fit does on a shape it has not seen."""
    eager = eager_rows(rows)
    out = {}
    for shape in sorted(eager):
        rest = {k: v for k, v in rows.items() if k[:2] != shape}
        _, both, _, _ = joint_fit(rest, base)
        out[shape] = backtest({k: v for k, v in rows.items() if k[:2] == shape}, {shape: eager[shape]}, both)[shape]
    return out


def show_checks(title, checks):
    print(f"== {title} ==")
    for (name, m), r in checks.items():
        meas = "not timed" if r["measured_us"] is None else f"{r['measured_us']:7.1f} us"
        rel = "" if r["regret"] is None else f"regret {r['regret']:.3f}, {r['vs_eager']:.2f}x eager"
        print(f"  {name:11s} m={m:<5d} {r['pick']:44s} {meas} (predicted {r['predicted_us']:7.1f}; eager "
              f"{r['eager_us']:7.1f}, best {r['best_us']:7.1f}) {rel}")
    timed = [r["regret"] for r in checks.values() if r["regret"] is not None]
    if timed:
        print(f"  geomean regret {math.exp(statistics.mean(map(math.log, timed))):.3f} over {len(timed)} timed "
              f"picks; worst {max(timed):.3f}; {len(checks) - len(timed)} picks not timed")


def show_fit(what, before, after, names, base, fitted):
    print(f"{what}; msle {before:.4f} with the built-in constants, {after:.4f} fitted")
    for name in names:
        print(f"  {name:30s} {base[name]:8.3f} -> {fitted[name]:8.3f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", help="kernel_check JSON logs, oldest first")
    ap.add_argument("--json", help="write the fitted constants and the tables here")
    ap.add_argument("--loso", action="store_true", help="also fit without each shape and check its pick")
    ap.add_argument("--after", action="store_true",
                    help="fit to the times after a copy writing the input (logs of kernel_check.py --after)")
    a = ap.parse_args(argv)
    rows = rows_of(a.logs, after=a.after)
    if not rows:
        ap.error("no timed stream plans in the logs" + (" with after-op times (kernel_check.py --after)"
                                                        if a.after else ""))
    base = dict(fuser._C.targets()["h200"])
    fitted, both, err, e_err = joint_fit(rows, base)
    show_fit(f"{len(rows)} timed stream plans", msle(rows, base), err, FITTED, base, fitted)
    tables = {}
    for label, t in (("built-in", base), ("fitted", fitted)):
        tables[label] = per_shape(rows, t)
        print(f"== {label}: per shape (plans, Spearman, regret of the pick, the pick against eager) ==")
        for (name, m), r in tables[label].items():
            print(f"  {name:10s} m={m:<4d} {r['plans']:3d} plans  rho {r['spearman']:5.2f}  regret "
                  f"{r['regret']:.3f}  pick {r['pick_us']:7.1f} us (predicted {r['predicted_us']:7.1f}) vs eager "
                  f"{r['eager_us']:7.1f}: {r['vs_eager']:.2f}x  {r['pick']}")
    eager = eager_rows(rows)
    show_fit(f"{len(eager)} eager shapes", msle_eager(eager, base), e_err, EAGER_FITTED, base, both)
    checks = {}
    for label, t in (("built-in", base), ("fitted", both)):
        checks[label] = backtest(rows, eager, t)
        show_checks(f"{label}: the planner's pick per shape, measured, against the best measured", checks[label])
    if a.loso:
        checks["left out"] = loso(rows, base)
        show_checks("each shape left out of the fit: the planner's pick for it", checks["left out"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(fitted={k: both[k] for k in FITTED + EAGER_FITTED},
                           built_in={k: base[k] for k in FITTED + EAGER_FITTED},
                           backtest={label: {f"{n}:{m}": r for (n, m), r in tab.items()}
                                     for label, tab in checks.items()},
                           shapes={label: {f"{n}:{m}": r for (n, m), r in tab.items()}
                                   for label, tab in tables.items()}), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
