"""Which plans a change to the planner's model picks differently, and whether each new pick wins.

A model change is adopted only when every pick it changes has been timed and none loses. This tool
makes that a routine: dump the planner's picks over a grid of shapes and token counts (the paper's
chains and the model FFNs) in the tree before the change and in the tree after it, list the cells whose
pick differs, and time both picks of each such cell beside PyTorch eager in CUDA graphs
(``kernel_check.time_plans``; an eager pick is eager's own time).

    python benchmarks/pick_diff.py dump BEFORE.json             # in the tree before the change (any machine)
    python benchmarks/pick_diff.py dump --fp8 BEFORE8.json      # the quantized (e4m3) chains' picks instead
    python benchmarks/pick_diff.py dump --target h100 B.json     # another built-in target's picks
    python benchmarks/pick_diff.py dump AFTER.json              # in the tree after it
    python benchmarks/pick_diff.py diff BEFORE.json AFTER.json CELLS.json
    python benchmarks/pick_diff.py time CELLS.json TIMED.json   # on a Hopper GPU, in either tree
    python benchmarks/pick_diff.py time --route CELLS.json T.json  # and fuser's own eager route beside them
    python benchmarks/pick_diff.py backtest LOG.json ...         # any machine: the built model's picks
    python benchmarks/pick_diff.py backtest --target h100 LOG.json ...  # another built-in target's picks
    python benchmarks/pick_diff.py accuracy LOG.json ...         # any machine: its ranking of timed plans
    python benchmarks/pick_diff.py plans OUT.json S8:128:bm=64,bn=96 ...  # on a GPU: named plans beside eager
    python benchmarks/pick_diff.py plans --trace OUT.json SPEC ...  # and each one's unit trace
    python benchmarks/pick_diff.py plans --layouts OUT.json SPEC ...  # and each over gate and up packed
    python benchmarks/pick_diff.py plans --warm OUT.json SPEC ...  # and each with its weights kept in the L2
    python benchmarks/pick_diff.py plans --exact OUT.json SPEC ...  # and each with exact token boxes
    python benchmarks/pick_diff.py plans --leads 0 OUT.json SPEC ...  # and each with other first-pass leads (bytes)
    python benchmarks/pick_diff.py plans --again OUT.json SPEC ...  # and each captured twice: the graphs' own spread
    python benchmarks/pick_diff.py plans --after OUT.json SPEC ...  # and each, and eager, after a copy of the input
    python benchmarks/pick_diff.py ab RUN_A.json RUN_B.json ...  # any machine: plans' settings against their null

Quantized picks (``dump --fp8``: cells NAME:M:fp8) are listed and diffed the same way; ``time`` leaves them to
``benchmarks/fp8_decode.py --models NAME --tokens M`` in each tree (their inputs are e4m3 weights with
scales), and says so. A pick is stored as its plan's constraints (``fuser.plan`` keywords of a stream plan) or None (eager),
so timing does not depend on which model is built. ``time`` prints per cell both picks against eager
and which is faster, and a verdict: the cells where the change's pick is slower than the one it
replaces, and those where it loses to eager; its file keeps each pick's plan beside its time.

``backtest`` asks the built model for its pick in every cell that timed files (``time``'s, and
``kernel_check.py``'s logs, newest last) hold, and sets the pick's measured time against the best
measured there (eager or any timed plan) and against eager: the geometric means of both over the cells
whose pick was timed, and the cells whose pick was not. A model change should not make either worse
on the committed timings (tests/test_benchmarks.py holds it to them). ``accuracy`` asks it to rank the
plans timed in each cell instead: Spearman's rank correlation between predicted and measured times, and
the regret of the plan it predicts fastest among them. ``plans`` times the stream plans it is given (NAME:M and
``fuser.plan`` constraints; a cell's plans in one rotation beside eager) where a model change needs timings the
grid's picks do not hold, as rows that ``backtest`` and ``accuracy`` read. ``ab`` reads runs of ``plans --again``
with other settings (``--leads``, ``--exact``, ...): each setting's time over the main graph's, cell by cell, beside
the null (the main graph captured again), and which cells lie beyond the null's band in every run.
"""
import argparse
import csv
import json
import math
import os
import statistics
import sys

from fuser.tools.workloads import MODELS, PAPER

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fit_stream  # noqa: E402

#: Token counts of the grid: decode, the paper's 128, and the sizes around them up to prefill.
TOKENS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 77, 96, 100, 128, 160, 192, 256, 384, 512, 768, 1024, 2048, 4096)
#: The constraints that give back a stream plan exactly (with its cluster shape).
PLAN_KEYS = ("bm", "bn", "bl", "s1", "s2", "stages", "phases", "lspan")


def shapes():
    """name -> (d_model, d_ff, d_out, gated, activation) of every shape in the grid."""
    out = {n: (w["d_model"], w["d_ff"], w["d_out"], w["gated"], w["activation"]) for n, w in PAPER.items()}
    out.update({n: (w["d_model"], w["d_ff"], w["d_out"], w["gated"], w["activation"]) for n, w in MODELS.items()})
    return out


def pick(name, m, dtype="bfloat16", target="h200"):
    """The planner's pick for shape `name` at `m` tokens on a built-in target: (summary, constraints or None)."""
    import fuser
    d, f, l, gated, act = shapes()[name]
    p = fuser.plan(m, d, f, d_out=l, gated=gated, activation=act, target=target, dtype=dtype)
    if not p.fused:
        return p.summary(), None
    params = p.raw["params"]
    if params.get("kind") != "stream":
        return p.summary(), dict(kind=params.get("kind"))
    return p.summary(), dict({k: params[k] for k in PLAN_KEYS}, kind="stream", cluster=list(params["cluster"]))


def dump(path, tokens=TOKENS, fp8=False, target="h200"):
    """The picks of every grid cell (NAME:M; NAME:M:fp8 for the quantized chains) on the built-in `target`,
    written to `path`."""
    dtype, tag = ("float8_e4m3fn", ":fp8") if fp8 else ("bfloat16", "")
    picks = {f"{name}:{m}{tag}": pick(name, m, dtype, target) for name in shapes() for m in tokens}
    with open(path, "w") as f:
        json.dump(picks, f, indent=0)
    return picks


def _plan_name(summary):
    return summary.split(", predicted")[0]


def diff(before, after):
    """The cells whose pick differs: {cell: dict(before=(summary, constraints), after=...)}."""
    return {cell: dict(before=before[cell], after=after[cell]) for cell in before
            if cell in after and _plan_name(before[cell][0]) != _plan_name(after[cell][0])}


def _plan(name, m, cons):
    """The stream plan of `cons` for the cell, planned on this machine's GPU (its device target: the prediction
    and floor printed beside the timing are that card's; the H200's without a GPU)."""
    import fuser
    d, f, l, gated, act = shapes()[name]
    kw = {k: v for k, v in cons.items() if k not in ("kind", "cluster")}
    return fuser.plan(m, d, f, d_out=l, gated=gated, activation=act, target=None, fused=True, kind="stream",
                      cluster=tuple(cons["cluster"]), **kw)


def time_cells(cells, log=print, route=False, save=None):
    """Each cell's two picks beside eager in CUDA graphs: {cell: dict(eager, before, after) in us}. With
    `route`, also fuser's own eager route (``fuser.ffn`` with the unfused plan: the gate kernel for a gated
    chain, its weights apart) in the same graphs' rotation, as ``route``: the time a model of that route
    would be fitted to (an eager pick's ``before``/``after`` stay eager's, the ops'); and for a gated chain the
    route over gate and up weights packed in one tensor (one GEMM of both, as ``FusedFFN`` runs it), timed beside
    eager in graphs of its own, as ``route_packed`` and that comparison's eager as ``eager_packed``. `save`: called
    with the results so far after each cell (a run stopped by a timeout keeps the cells it finished)."""
    fp8 = sorted(c for c in cells if c.endswith(":fp8"))
    if fp8:
        raise ValueError(f"quantized cells are timed by benchmarks/fp8_decode.py --models NAME --tokens M in each "
                         f"tree (its route and fused-plan columns), not here: {', '.join(fp8[:6])}")
    import torch
    import fuser
    from kernel_check import time_plans
    gen = torch.Generator(device="cuda").manual_seed(13)
    out = {}
    for cell, c in cells.items():
        name, m = cell.split(":")
        m = int(m)
        d, f, l, gated, act = shapes()[name]
        sides = [s for s in ("before", "after") if c[s][1] is not None]
        for s in sides:
            if c[s][1].get("kind") != "stream":
                raise ValueError(f"{cell}: only stream plans are timed here, got {c[s][0]}")
        if len(sides) == 2 and c["before"][1] == c["after"][1]:   # one plan both sides: timed once
            sides = ["before"]
        timed = {s: i for i, s in enumerate(sides)}
        if "after" not in timed and c["after"][1] is not None:
            timed["after"] = 0
        plans = [_plan(name, m, c[s][1]) for s in sides]
        if route:
            plans.append(fuser.plan(m, d, f, d_out=l, gated=gated, activation=act, target=None, fused=False))
        rows = time_plans(log, gen, (name, d, f, l, gated, act, m), plans)
        if len(rows) != len(plans):
            raise RuntimeError(f"{cell}: a plan failed to run (see the log above)")
        wrong = [r["plan"] for r in rows if not r["ok"]]
        if wrong:   # a pick that computes something else has no time worth comparing
            raise RuntimeError(f"{cell}: output not the FFN's (relative error over 2e-2): {'; '.join(wrong)}")
        eager = min(r["eager"] for r in rows) if rows else None
        res = dict(eager=eager)
        if route:
            res["route"] = rows[-1]["measured"]
        if route and gated:
            pk = time_plans(log, gen, (name, d, f, l, gated, act, m), plans[-1:], packed=True)
            if len(pk) != 1 or not pk[0]["ok"]:
                raise RuntimeError(f"{cell}: the packed eager route failed or computed something else (log above)")
            res["route_packed"], res["eager_packed"] = pk[0]["measured"], pk[0]["eager"]
        for s in ("before", "after"):
            res[s] = rows[timed[s]]["measured"] if s in timed else eager
            res[s + "_plan"] = c[s][0]
        out[cell] = res
        if save is not None:
            save(out)
    return out


def verdict(timed):
    """(cells where the change's pick is slower than before, cells where it is slower than eager)."""
    slower = sorted(c for c, t in timed.items() if t["after"] > t["before"] * 1.02)
    loses = sorted(c for c, t in timed.items() if t["eager"] is not None and t["after"] > t["eager"] * 1.02)
    return slower, loses


def timed_plans(paths):
    """{(name, m, plan): (measured us, eager us)} of every timed stream plan in `paths` (newest last):
    ``time``'s files, every row that names a plan, its time and eager's in any other JSON, and a harness
    run's CSV (``fuser bench``: each row's fused plan and eager, both in CUDA graphs). Rows of plans
    whose summary names more than this build parses (a kernel variant since removed) are left out."""
    out = {}

    def add(name, m, plan, t, eager):
        s = fit_stream._SUMMARY.search(plan or "")
        # (a summary with parts after the ones parsed names a plan of a variant this build does not have)
        if s and plan.split(", predicted")[0].endswith(s.group(0)) and "stream" in plan and t is not None \
                and eager is not None:
            out[(name, int(m), s.group(0))] = (t, eager)

    def walk(o):
        if isinstance(o, dict):
            if {"name", "m", "plan", "measured", "eager"} <= set(o):
                if o.get("ok", True):
                    add(o["name"], o["m"], o["plan"], o.get("early", o["measured"]), o["eager"])
                return
            for cell, v in o.items():
                if isinstance(v, dict) and "after_plan" in v:
                    name, m = cell.split(":")
                    for s in ("before", "after"):
                        add(name, m, v[s + "_plan"], v[s], v["eager"])
                else:
                    walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    for path in paths:
        with open(path) as f:
            if path.endswith(".csv"):   # a harness run: the fused plan of each row beside eager, in graphs
                for r in csv.DictReader(f):
                    if r.get("fused_graph_us") and r.get("eager_graph_us") and r["workload"] != "custom":
                        add(r["workload"], r["m"], r["fused_plan"], float(r["fused_graph_us"]),
                            float(r["eager_graph_us"]))
            else:
                walk(json.load(f))
    return out


def _timed_cells(paths):
    """(name, m, entry) of every cell ``time`` timed in the JSON files of `paths`, in order (newest last)."""
    for path in paths:
        if path.endswith(".csv"):
            continue
        with open(path) as f:
            o = json.load(f)
        for cell, v in (o.items() if isinstance(o, dict) else ()):
            if isinstance(v, dict) and "after_plan" in v:
                name, m = cell.split(":")
                yield name, int(m), v


def routes(paths):
    """{(name, m): us} of fuser's own eager route in every cell ``time --route`` timed in `paths` (newest last):
    what an eager pick runs, where the planner prices the route rather than PyTorch's ops."""
    return {(name, m): v["route"] for name, m, v in _timed_cells(paths) if v.get("route") is not None}


def packed_routes(paths):
    """{(name, m): us} of fuser's eager route over packed gate and up weights in every gated cell ``time --route``
    timed in `paths` (newest last), scaled by the ratio of the cell's two eager times (``eager`` / ``eager_packed``:
    the packed route is timed in graphs of its own) so that it stands beside the cell's other times."""
    return {(name, m): v["route_packed"] * v["eager"] / v["eager_packed"] for name, m, v in _timed_cells(paths)
            if v.get("route_packed") is not None}


def plan_specs(specs):
    """Stream plans given as NAME:M:key=value,... grouped by cell: {(NAME, M): [plan, ...]}, in the specs' order;
    raises ValueError naming the spec whose shape or keys are unknown, or whose constraints no plan meets."""
    from kernel_check import parse_one
    cells = {}
    for spec in specs:
        name, m, cons = parse_one(spec)
        if name not in shapes():
            raise ValueError(f"{spec}: {name} is not a grid shape ({', '.join(sorted(shapes()))})")
        unknown = sorted(set(cons) - set(PLAN_KEYS))
        if unknown:
            raise ValueError(f"{spec}: {', '.join(unknown)} not among the plan keys {', '.join(PLAN_KEYS)}")
        cells.setdefault((name, m), []).append(_plan(name, m, dict(cons, kind="stream", cluster=[1, 1, 1, 1])))
    return cells


def time_specs(specs, log=print, save=None, trace=False, layouts=False, warm=False, exact=False, leads=(),
               again=False, after=False):
    """Time stream plans given as NAME:M:key=value,... (``fuser.plan`` constraints of a grid shape), each cell's
    plans interleaved with eager in CUDA graphs (``kernel_check.time_plans``): {"result": {"plans": rows}}, rows
    as kernel_check's. `trace`: each plan also launched once with its unit trace (``kernel_check.trace_run``:
    when each unit was claimed, got its first data and was done), under "traces". `layouts`: each gated cell's
    plans also over gate and up packed in one tensor, in the same interleaving (``measured_packed``); `warm`: each
    plan also over one input set (``measured_warm``: weights that fit the L2 stay there); `exact`: each plan also
    with exact token boxes (``measured_exact``: a ragged last row tile without TMA's zero fill); `leads`: each plan also
    with about n bytes of the ring's first pass in flight per block, for each n (``measured_lead{n}``; 0: the whole
    ring at once); `again`: each plan also captured a second time as it is (``measured_again``: the spread two graphs
    of the same work show, beside which the other ratios are read); `after`: each plan and eager also after a copy
    writing their input, the copies taken off (``measured_after``, ``eager_after``, ``copy``: what a call costs
    where it follows another op's kernel, not its own). `save`: called with the results so far after each cell."""
    import torch
    from kernel_check import time_plans, trace_run
    cells = plan_specs(specs)   # before anything runs: a constraint no plan meets fails here
    gen = torch.Generator(device="cuda").manual_seed(17)
    out = dict(plans=[], traces=[]) if trace else dict(plans=[])
    for (name, m), plans in cells.items():
        d, f, l, gated, act = shapes()[name]
        out["plans"] += time_plans(log, gen, (name, d, f, l, gated, act, m), plans, layouts=layouts, warm=warm,
                                   exact=exact, leads=leads, again=again, after=after)
        for p in plans if trace else ():   # the very plans timed, each launched once more with its trace
            out["traces"].append(trace_run(name, m, log, shape=(d, f, l, gated, act), plan=p))
        if save is not None:
            save(dict(result=out))
    return dict(result=out)


def geomean(xs):
    """The geometric mean of positive numbers (ratios of times)."""
    return math.exp(statistics.mean(math.log(x) for x in xs))


def backtest(paths, target="h200", packed=False):
    """The built model's pick on `target` (a built-in name or a target dict) in every cell the timed files
    hold: (per-cell rows of ``fit_stream.backtest``, geomean regret, geomean speed-up over eager, cells whose
    pick was not timed).
    An eager pick's time is fuser's eager route's where the files timed it (``routes``), else PyTorch's ops'.
    `packed`: only the gated cells whose packed route the files timed (``packed_routes``), each planned and judged
    as a packed chain (gate and up weights in one tensor, as ``FusedFFN`` runs them): an eager pick's time, and
    the "eager" of the speed-up, are that route's."""
    import fuser
    rows = timed_plans(paths)
    eager = fit_stream.eager_rows(rows)
    eager.update({k: t for k, t in routes(paths).items() if k in eager})
    if packed:
        eager = {k: t for k, t in packed_routes(paths).items() if k in eager}
        rows = {k: v for k, v in rows.items() if k[:2] in eager}
    tgt = fuser._C.targets()[target] if isinstance(target, str) else target
    checks = fit_stream.backtest(rows, eager, dict(tgt), packed=packed)
    timed = [r for r in checks.values() if r["regret"] is not None]
    if not timed:
        raise ValueError(f"no cell of {len(checks)} has its pick timed in {paths}")
    return (checks, geomean(r["regret"] for r in timed), geomean(r["vs_eager"] for r in timed),
            sorted(f"{n}:{m}" for (n, m), r in checks.items() if r["regret"] is None))


def accuracy(paths, least=4):
    """How the built model ranks the stream plans timed in each cell of `paths` (cells of at least `least`
    plans): {cell: dict(plans, spearman, regret, msle)}, `regret` being the measured time of the plan
    predicted fastest over the fastest measured, both among the timed plans."""
    from planner_accuracy import spearman
    cells = {}
    for (name, m, plan), (t, _) in timed_plans(paths).items():
        cells.setdefault((name, m), []).append((plan, t))
    out = {}
    for (name, m), plans in sorted(cells.items()):
        if len(plans) < least:
            continue
        pred = [_plan(name, m, dict({"cluster": (1, 1, 1, 1)}, **fit_stream.plan_args(plan))).predicted_us
                for plan, _ in plans]
        meas = [t for _, t in plans]
        pick = min(range(len(plans)), key=pred.__getitem__)
        out[(name, m)] = dict(plans=len(plans), spearman=spearman(pred, meas), regret=meas[pick] / min(meas),
                              msle=statistics.mean(math.log(a / b) ** 2 for a, b in zip(pred, meas)))
    return out


def ab(paths):
    """Runs of ``plans --again`` (one file each, the same specs) read setting by setting against the null. A setting
    is each ``measured_<key>`` a row holds besides ``measured_again`` (``lead0``, ``exact``, ``warm``, ...); its
    ratio is its time over the main graph's, so below 1 the setting is faster. Each run's null band is the lowest
    and highest ``measured_again`` ratio over the cells every run holds: two graphs of the same work differ by that
    much, so only a ratio outside its run's band in every run says something. Returns (cells, settings): cells maps
    (name, m, plan) to {key: [ratio per run]} with "again" among the keys, for the cells every run holds; settings
    maps each key to dict(geomean, faster, slower, bits), faster and slower naming the cells beyond the band in every
    run, bits the cells whose output was not the same bits in some run."""
    runs = []
    for path in paths:
        with open(path) as f:
            rows = json.load(f).get("result", {}).get("plans")
        if not rows:
            raise ValueError(f"{path}: no plans rows (a file of `pick_diff.py plans`)")
        if any(r.get("measured_again") is None for r in rows):
            raise ValueError(f"{path}: timed without --again, so there is no null to read the settings against; "
                             "run `pick_diff.py plans --again` (AGAIN=1 in gpu_session.sh)")
        runs.append({(r["name"], r["m"], _plan_name(r["plan"])): r for r in rows})
    keys = sorted({k[len("measured_"):] for rs in runs for r in rs.values() for k in r
                   if k.startswith("measured_") and k != "measured_again"})
    common = [c for c in runs[0] if all(c in rs for rs in runs[1:])]
    cells = {c: {k: [rs[c][f"measured_{k}"] / rs[c]["measured"] for rs in runs]
                 for k in keys + ["again"] if all(rs[c].get(f"measured_{k}") is not None for rs in runs)}
             for c in common}
    bands = [(min(cells[c]["again"][i] for c in common), max(cells[c]["again"][i] for c in common))
             for i in range(len(runs))]
    name = lambda c: f"{c[0]}:{c[1]}"  # noqa: E731
    settings = {}
    for k in keys:
        have = [c for c in common if k in cells[c]]
        if not have:
            continue
        beyond = lambda c, side: all(side(x, band) for x, band in zip(cells[c][k], bands))  # noqa: E731
        settings[k] = dict(geomean=geomean(x for c in have for x in cells[c][k]),
                           faster=[name(c) for c in have if beyond(c, lambda x, b: x < b[0])],
                           slower=[name(c) for c in have if beyond(c, lambda x, b: x > b[1])],
                           bits=[name(c) for c in have if not all(rs[c].get(f"same_bits_{k}", True) for rs in runs)])
    return cells, settings


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("dump")
    a.add_argument("--fp8", action="store_true", help="the quantized (e4m3) chains' picks")
    a.add_argument("--target", default="h200", help="the built-in target whose picks to dump (default h200)")
    a.add_argument("out")
    a = sub.add_parser("diff")
    a.add_argument("before")
    a.add_argument("after")
    a.add_argument("out")
    a = sub.add_parser("time")
    a.add_argument("--route", action="store_true",
                   help="also time fuser's own eager route (the gate kernel for gated chains) in every cell")
    a.add_argument("cells")
    a.add_argument("out")
    a = sub.add_parser("backtest")
    a.add_argument("--target", default="h200", help="the built-in target whose picks to judge (default h200)")
    a.add_argument("--packed", action="store_true",
                   help="the gated cells whose packed route was timed, planned and judged as packed chains")
    a.add_argument("logs", nargs="+")
    a = sub.add_parser("accuracy")
    a.add_argument("logs", nargs="+")
    a = sub.add_parser("ab")
    a.add_argument("logs", nargs="+", help="files of `pick_diff.py plans --again`, one per run of the same specs")
    a = sub.add_parser("plans")
    a.add_argument("out")
    a.add_argument("--trace", action="store_true", help="also launch each plan once with its unit trace")
    a.add_argument("--layouts", action="store_true",
                   help="also time each gated cell's plans over gate and up packed in one tensor, side by side")
    a.add_argument("--warm", action="store_true",
                   help="also time each plan over one input set, its weights left in the L2 where they fit")
    a.add_argument("--exact", action="store_true",
                   help="also time each plan with exact token boxes (a ragged last row tile without zero fill)")
    a.add_argument("--leads", type=lambda v: tuple(int(n) for n in v.split(",")), default=(),
                   help="also time each plan with N bytes of the ring's first pass in flight per block, for each N "
                        "(0: the whole ring at once)")
    a.add_argument("--again", action="store_true",
                   help="also time each plan's graph captured a second time, as it is: the spread of two graphs of the "
                        "same work, beside which the other ratios are read")
    a.add_argument("--after", action="store_true",
                   help="also time each plan and eager with each call after a copy writing its input (the copies "
                        "timed alone and taken off): a call that follows another op's kernel, as in a model")
    a.add_argument("specs", nargs="+", help="NAME:M:bm=64,bn=96,... (fuser.plan constraints of a stream plan)")
    args = ap.parse_args(argv)

    def save(timed):   # time's and plans' results so far (a run stopped by a timeout keeps what it timed)
        with open(args.out, "w") as f:
            json.dump(timed, f, indent=1)

    if args.cmd == "dump":
        print(f"{len(dump(args.out, fp8=args.fp8, target=args.target))} picks written to {args.out}")
    elif args.cmd == "diff":
        with open(args.before) as f, open(args.after) as g:
            cells = diff(json.load(f), json.load(g))
        with open(args.out, "w") as f:
            json.dump(cells, f, indent=1)
        for cell, c in cells.items():
            print(f"{cell:16s} {_plan_name(c['before'][0])}  ->  {_plan_name(c['after'][0])}")
        print(f"{len(cells)} cells differ")
    elif args.cmd == "backtest":
        checks, regret, vs_eager, untimed = backtest(args.logs, args.target, args.packed)
        fit_stream.show_checks("the built model's pick per cell, measured, against the best measured", checks)
        print(f"geomean regret {regret:.3f}, geomean speed-up over eager {vs_eager:.3f}; "
              f"picks not timed: {', '.join(untimed) or 'none'}")
    elif args.cmd == "accuracy":
        acc = accuracy(args.logs)
        for (name, m), r in acc.items():
            print(f"{name:11s} m={m:<5d} {r['plans']:3d} plans  Spearman {r['spearman']:5.2f}  regret {r['regret']:.3f}  "
                  f"msle {r['msle']:.3f}")
        rho = [r["spearman"] for r in acc.values()]
        regret = geomean(r["regret"] for r in acc.values())
        print(f"{len(acc)} cells: median Spearman {statistics.median(rho):.2f} ({sum(x >= 0.8 for x in rho)} at >= 0.8), "
              f"geomean regret {regret:.3f}, worst {max(r['regret'] for r in acc.values()):.3f}")
    elif args.cmd == "ab":
        try:
            cells, settings = ab(args.logs)
        except ValueError as e:
            ap.error(str(e))
        for (name, m, plan), r in cells.items():
            print(f"{name + ':' + str(m):16s} {plan.replace('fused stream, ', '')[:40]:40s}"
                  + "".join(f"  {k} {' '.join(f'{x:.3f}' for x in xs)}" for k, xs in r.items()))
        for k, v in settings.items():
            print(f"{k} over the main graph: geomean {v['geomean']:.3f}; faster beyond the null in every run: "
                  f"{', '.join(v['faster']) or 'none'}; slower: {', '.join(v['slower']) or 'none'}"
                  + (f"; other bits: {', '.join(v['bits'])}" if v["bits"] else ""))
    elif args.cmd == "plans":
        try:
            save(time_specs(args.specs, save=save, trace=args.trace, layouts=args.layouts, warm=args.warm,
                            exact=args.exact, leads=args.leads, again=args.again, after=args.after))
        except ValueError as e:
            ap.error(str(e))
    else:
        with open(args.cells) as f:
            cells = json.load(f)
        try:
            timed = time_cells(cells, route=args.route, save=save)
        except ValueError as e:
            ap.error(str(e))
        save(timed)
        for cell, t in timed.items():
            print(f"{cell:16s} eager {t['eager']:7.1f}  before {t['before']:7.1f} ({t['eager'] / t['before']:.2f}x)  "
                  f"after {t['after']:7.1f} ({t['eager'] / t['after']:.2f}x)"
                  + (f"  route {t['route']:7.1f} ({t['eager'] / t['route']:.2f}x)" if "route" in t else "")
                  + (f"  packed {t['route_packed']:7.1f} ({t['eager_packed'] / t['route_packed']:.2f}x)"
                     if "route_packed" in t else ""))
        slower, loses = verdict(timed)
        print(f"the change's pick slower than before (by > 2%): {', '.join(slower) or 'none'}")
        print(f"the change's pick slower than eager (by > 2%): {', '.join(loses) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
