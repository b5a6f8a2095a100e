"""The benchmark scripts stay runnable: each runs in a small configuration on this machine (the CPU
route where there is no Hopper GPU) and prints the rows it promises."""
import csv
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest
import torch

import fuser

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_zero_bias_benchmark_names_the_threshold_from_which_no_cell_loses():
    """eager_epilogue.py --zero-bias ends with the token count to set ZERO_BIAS_MIN_TOKENS to: 2 where no cell is
    more than 1% slower than the ops, else the least timed count above every losing cell's; one-token cells (the
    ops there by design) left out."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import eager_epilogue
    finally:
        sys.path.pop(0)
    v = eager_epilogue.zero_bias_verdict

    def cells(**ratios):   # MODEL_TOKENS=ops/fuser -> timed cells
        return {k.replace("_", ":"): {"ops": 10.0 * r, "fuser": 10.0} for k, r in ratios.items()}
    assert v(cells(G4_1=0.5, G4_16=1.1, G4_128=1.05, t5_2048=1.02)) == (2, ("t5:2048", 1.02))
    assert v(cells(G4_2=0.95, G4_16=1.1, G4_128=0.995)) == (16, ("G4:2", 0.95))     # within 1%: no loss
    assert v(cells(G4_16=0.9, G4_128=1.1, t5_16=1.2, t5_512=0.97, t5_2048=1.0)) == (2048, ("G4:16", 0.9))
    assert v(cells(G4_16=1.1, t5_2048=0.98)) == (None, ("t5:2048", 0.98))           # the largest still loses
    assert v(cells(G4_1=0.9)) == (None, None)


def test_host_overhead_loops_never_outrun_the_gpu_sleep():
    """A loop of large FFNs (LLaMA-3-8B at 2048 tokens: ~790 us of GPU time each) queued 118 ms behind a
    ~100 ms sleep and timed the GPU; loops now hold at most 40 ms of GPU time."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import host_overhead
    finally:
        sys.path.pop(0)
    assert host_overhead.loop_calls(150, 790.0) == 50
    assert host_overhead.loop_calls(150, 12.0) == 150
    assert host_overhead.loop_calls(150, 1e6) == 10
    assert host_overhead.loop_calls(150, 790.0) * 790.0 <= host_overhead.QUEUED_GPU_US < 100_000


@pytest.mark.no_gpu
def test_host_overhead_times_every_route_against_its_baseline(tmp_path):
    """benchmarks/host_overhead.py in a small configuration: every eager-route variant timed per shape,
    each overhead against the ops reported with its target, and the fused route measured on a Hopper GPU
    (said to be left out elsewhere)."""
    out = tmp_path / "host.json"
    # three rounds: the paired medians then stand against one round a busy machine stalls (with two, their mean)
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/host_overhead.py"), "--rounds", "3", "--calls", "20",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert len(res["eager"]) == 3
    for row in res["eager"]:
        assert {k for k in row if k not in ("shape", "paired", "calls", "intervals")} == {"ops", "fuser.ffn", "FusedFFN", "module",
                                                                              "ops, again"}
        assert all(row[k] > 0 for k in row if k not in ("shape", "paired", "calls", "intervals"))
        assert row["calls"] == 20      # on the CPU every loop holds the calls asked for
        # each over the ops of its round; the ops again: the measurement's noise, a difference near zero
        assert set(row["paired"]) == {"fuser.ffn", "FusedFFN", "module", "ops, again"}
        assert abs(row["paired"]["ops, again"]) < row["ops"], row
        # each paired median inside its interval, which with three rounds is their range
        assert set(row["intervals"]) == set(row["paired"])
        assert all(lo <= row["paired"][k] <= hi for k, (lo, hi) in row["intervals"].items()), row
    assert r.stdout.count("  null ") == 3
    for name in ("fuser.ffn", "FusedFFN"):
        assert re.search(rf"^eager route, {name}: worst [+-][\d.]+ us over the ops .*the ops against themselves "
                         rf"[+-][\d.]+\) .* target 2 us: (met|MISSED)( \(undecided: .*\))?$", r.stdout, re.M), r.stdout
    if res["fused"] is None:
        assert "== fused route: not measured" in r.stdout
    else:
        assert {"bare launch", "FusedFFN", "fuser.ffn", "torch.ops", "module"} <= set(res["fused"])
        assert {"FusedFFN", "fuser.ffn", "torch.ops"} <= set(res["fused"]["paired"])
        assert len(re.findall(r"over bare launch, 95% interval [+-][\d.]+ to [+-][\d.]+; target", r.stdout)) == 3


def test_host_overhead_verdicts_say_when_the_rounds_do_not_decide_them():
    """A verdict is judged on the paired median; where that median's 95% interval holds the target, the rounds
    did not decide it and the verdict says so (on a shared host one row's median moves between runs by more
    than the 2 us target: without the interval, two verdicts on the same code read as a change)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import host_overhead
    finally:
        sys.path.pop(0)
    v = host_overhead.verdict
    assert v(1.9, (1.5, 1.99), 2.0) == "met" and v(2.1, (2.01, 2.5), 2.0) == "MISSED"
    assert v(1.9, (1.5, 2.3), 2.0) == "met (undecided: the 95% interval holds the target; more rounds)"
    assert v(2.4, (1.0, 3.0), 2.0).startswith("MISSED (undecided")
    # measure's intervals come from the rounds' differences: a variant that costs ~1 ms more than the base
    # in every round has an interval far from zero; the base against itself one that holds zero
    variants = {"base": lambda: None, "same": lambda: None, "slow": lambda: time.sleep(1e-3)}
    _, paired, _, ci = host_overhead.measure(variants, 7, 2, 0, "base", host_overhead.CLOCKS["wall"])
    assert set(ci) == {"same", "slow"}
    assert 900 < ci["slow"][0] <= paired["slow"] <= ci["slow"][1], ci
    assert ci["same"][0] <= paired["same"] <= ci["same"][1] and ci["same"][1] < 900, ci


@pytest.mark.no_gpu
def test_host_overhead_pieces_time_the_c_calls_inside_the_routes(tmp_path):
    """``--pieces`` adds, per eager-route shape, the C calls inside the routes timed alone (fuser.ffn's route
    key, FusedFFN's checks, FusedFFN's whole C call) to the JSON and a line under each shape; the route
    key and the checks are a small part of a call (here, CPU tensors: under the ops' own time)."""
    out = tmp_path / "host.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/host_overhead.py"), "--rounds", "2", "--calls", "20",
                        "--clock", "thread", "--pieces", "--json", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["eager"]
    assert len(rows) == 3 and r.stdout.count("pieces: ffn_key") == 3
    for row in rows:
        assert {"ffn_key", "kept_match", "kept_eager", "kept_eager_all"} <= set(row), row
        assert 0 < row["ffn_key"] < row["ops"] and 0 < row["kept_match"] < row["ops"] < row["kept_eager"] * 2, row


def test_host_overhead_thread_clock_counts_what_the_thread_executes(tmp_path):
    """``--clock thread`` reads the calling thread's CPU time: a loop that waits (the core given away)
    costs next to nothing on it and its full length on the wall clock, a busy loop the same on both; the
    JSON says which clock."""
    import time
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import host_overhead
    finally:
        sys.path.pop(0)

    def busy():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 1e-3:
            pass
    variants = {"busy": busy, "waits": lambda: time.sleep(1e-3)}
    for clock, waits_us in ((host_overhead.CLOCKS["wall"], (900, 5000)), (host_overhead.CLOCKS["thread"], (0, 200))):
        med, paired, _, _ = host_overhead.measure(variants, 3, 5, 0, "busy", clock)
        assert 900 < med["busy"] < 5000, med
        assert waits_us[0] <= med["waits"] < waits_us[1], (clock, med)
    out = tmp_path / "host.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/host_overhead.py"), "--rounds", "2", "--calls", "20",
                        "--clock", "thread", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["clock"] == "thread" and all(row["ops"] > 0 for row in res["eager"])
    assert "(thread clock)" in r.stdout


@pytest.mark.no_gpu
def test_host_overhead_with_autograd_on(tmp_path):
    """``--grad`` times the eager route with autograd recording (a model called outside no_grad): every
    variant still timed, the JSON says so, and the fused route is left out (the kernel has no backward)."""
    out = tmp_path / "host.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/host_overhead.py"), "--rounds", "2", "--calls", "20",
                        "--grad", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["grad"] is True and res["fused"] is None and len(res["eager"]) == 3
    assert all(set(row["paired"]) == {"fuser.ffn", "FusedFFN", "module", "ops, again"} for row in res["eager"])
    assert "== fused route: not measured" in r.stdout


def _planner_accuracy():
    import importlib.util
    spec = importlib.util.spec_from_file_location("planner_accuracy", ROOT / "benchmarks/planner_accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_planner_accuracy_statistics():
    pa = _planner_accuracy()
    assert pa.ranks([3.0, 1.0, 2.0, 2.0]) == [4.0, 1.0, 2.5, 2.5]
    assert pa.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert pa.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert abs(pa.spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) - 0.8) < 1e-12


def test_planner_accuracy_compiles_its_candidates_without_a_gpu():
    if not fuser.env().nvrtc_found:
        pytest.skip("compiles kernels: needs NVRTC (pip install nvidia-cuda-nvrtc)")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/planner_accuracy.py"), "--compile-only", "--shape", "G1",
                        "--k", "3"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("G1 M=128: 3 kernels")


def test_e2e_runs_the_tiny_model_and_checks_its_logits(capsys):
    """benchmarks/e2e.py end to end on this machine (the tiny configuration, eager, CPU timer without a
    GPU): prefill and decode rows, both models' logits compared with each other and with the model in
    float64, the FFN share between 0 and 1."""
    import importlib.util

    import models  # noqa: F401  (makes transformers importable beside CI's CPU torch)
    spec = importlib.util.spec_from_file_location("e2e", ROOT / "benchmarks/e2e.py")
    e2e = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(e2e)
    assert e2e.main(["--tiny", "--iters", "12", "--decode", "1,2"]) == 0
    out = capsys.readouterr().out
    assert "fuser: 2 FFN(s) swapped" in out
    rows = [line for line in out.splitlines() if line.startswith("| prefill") or line.startswith("| decode")]
    assert [r.split(" | ")[1] for r in rows] == ["1 x 16", "2 x 16", "1 x 1", "2 x 1"]
    for r in rows:
        cells = r.split(" | ")
        share = float(cells[-4].rstrip("%")) / 100
        assert 0 <= share <= 1
        base_err, fuser_err = (float(v) for v in cells[-1].rstrip(" |").split(" / "))
        assert 0 <= fuser_err <= 1.5 * base_err + 1e-3   # against the float64 model


def test_e2e_decode_step_repeats_without_running_off_the_cache():
    """Every timed decode step writes the same cache slot and gives the same logits: transformers' static
    cache advances its own counter per call (left alone, index_copy_ runs out of bounds after 8 calls)."""
    import importlib.util

    import models  # noqa: F401
    spec = importlib.util.spec_from_file_location("e2e", ROOT / "benchmarks/e2e.py")
    e2e = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(e2e)
    import argparse
    model = e2e.build(argparse.Namespace(tiny=True), "cpu", torch.float32)
    with torch.no_grad():
        step = e2e.steps(model, "decode", 2, 1, 6, "cpu")
        first = step()
        for _ in range(12):
            last = step()
    torch.testing.assert_close(last, first)


def test_fit_stream_refits_the_constants_to_timed_plans(tmp_path):
    """benchmarks/fit_stream.py on the committed sweep logs: it reads every timed stream plan, neither fit
    (stream, eager) ends worse than the built-in constants, each shape gets a pick, a regret >= 1 and a
    rank correlation, and the planner's backtest covers every shape, in sample and left out of the fit."""
    out = tmp_path / "fit.json"
    logs = [ROOT / "benchmarks/results" / f for f in ("2026-12-01-h200-stream-decode.json",
                                                       "2026-12-02-h200-overlap-trace.json")]
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/fit_stream.py"), *map(str, logs), "--json", str(out),
                        "--loso"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    m = re.search(r"^(\d+) timed stream plans; msle ([\d.]+) with the built-in constants, ([\d.]+) fitted$",
                  r.stdout, re.M)
    assert m and int(m.group(1)) >= 60 and float(m.group(3)) <= float(m.group(2)), r.stdout
    e = re.search(r"^(\d+) eager shapes; msle ([\d.]+) with the built-in constants, ([\d.]+) fitted$", r.stdout, re.M)
    assert e and int(e.group(1)) >= 5 and float(e.group(3)) <= float(e.group(2)), r.stdout
    res = json.loads(out.read_text())
    assert set(res["fitted"]) == set(res["built_in"]) and len(res["fitted"]) == 10
    shapes = res["shapes"]["fitted"]
    assert "llama3-8b:1" in shapes and "llama2-7b:1" in shapes
    for s in shapes.values():
        assert s["regret"] >= 1.0 and s["pick_us"] > 0 and s["plans"] >= 1
    # the backtest: the planner on the fitted target picks eager or a plan, never beating the best measured
    for label in ("fitted", "left out"):   # in sample, and each shape fitted without its own rows
        checks = res["backtest"][label]
        assert set(checks) == set(shapes)
        for c in checks.values():
            assert c["pick"] and c["best_us"] <= c["eager_us"]
            assert c["measured_us"] is None or c["measured_us"] >= c["best_us"]


def test_fit_stream_fits_to_the_after_op_times_when_asked(tmp_path):
    """With `after`, fit_stream reads each row's times after a copy writing the input (``kernel_check.py --after``)
    in place of its main graph's, and leaves out rows timed without them; the CLI says when no row has them."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fit_stream
    plan = "fused stream, bm=16 bn=128 bl=128, splits 1/4, 6 stages, predicted 122.5 us"
    rows = [dict(name="llama3-8b", m=1, plan=plan, measured=120.0, eager=128.0, measured_after=121.5,
                 eager_after=127.5, copy=1.6, ok=True),
            dict(name="llama3-8b", m=16, plan=plan, measured=121.0, eager=133.0, ok=True)]
    log = tmp_path / "k.json"
    log.write_text(json.dumps(dict(result=dict(decode=rows))))
    key = lambda m: ("llama3-8b", m, fit_stream._SUMMARY.search(plan).group(0))  # noqa: E731
    assert fit_stream.rows_of([str(log)]) == {key(1): (120.0, 128.0), key(16): (121.0, 133.0)}
    assert fit_stream.rows_of([str(log)], after=True) == {key(1): (121.5, 127.5)}
    old = tmp_path / "old.json"
    old.write_text(json.dumps(dict(result=dict(decode=rows[1:]))))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/fit_stream.py"), str(old), "--after"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "with after-op times (kernel_check.py --after)" in r.stderr, r.stderr


def test_fit_stream_reads_back_the_plan_each_summary_names():
    """The refit rebuilds each timed plan from its summary: two phases with splits, one phase, cluster pairs,
    and one phase with units of several l-tiles must each give back the same plan (a missed field would fit
    the constants to another plan's prediction)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fit_stream
    kw = dict(gated=True, activation="silu", target="h200", fused=True, kind="stream")
    plans = [fuser.plan(1, 4096, 14336, bm=16, s1=2, s2=8, **kw),
             fuser.plan(1, 4096, 14336, bm=16, lspan=32, s2=112, **kw),
             fuser.plan(40, 1024, 4096, bm=16, phases=1, s2=4, **kw),
             fuser.plan(300, 1024, 4096, bm=64, cluster=(2, 1, 1, 1), **kw)]
    for p in plans:
        q = fuser.plan(p.chain["m"], p.chain["d_model"], p.chain["d_ff"], d_out=p.chain["d_out"], **kw,
                       **fit_stream.plan_args(p.summary()))
        assert q.to_dict()["params"] == p.to_dict()["params"], p.summary()
    assert fit_stream.plan_args(plans[1].summary())["lspan"] == 32


def _pick_diff():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import pick_diff
    finally:
        sys.path.pop(0)
    return pick_diff


def test_gpu_session_stops_before_the_build_when_no_committed_list_matches(tmp_path):
    """The cells and plans stages of benchmarks/gpu_session.sh take CELLS or PLANS as one committed file's name (with
    or without its suffix) or a part of several names; a name that matches none ends the stage with rc 2 and says
    which pattern found nothing, before the build spends the GPU call's time."""
    for stage, var in (("cells", "CELLS"), ("plans", "PLANS")):
        r = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_session.sh"), stage], capture_output=True, text=True,
                           timeout=60, env=dict(os.environ, OUT=str(tmp_path / stage), **{var: "no-such-list"}))
        assert r.returncode == 2 and f"{stage}: no file matches benchmarks/results/*no-such-list*" in r.stderr, r
        assert "pip" not in r.stdout + r.stderr


def test_gpu_session_queue_passes_every_setting_of_an_item(tmp_path):
    """A queue item takes several settings joined by + (``plans:PLANS=lead+LEADS=0+AGAIN=1``), each reaching its
    stage alone: here PLANS reaches the plans stage as its own value (the stage stops on it, rc 2, before the
    build) and the queue's log names every setting it passed."""
    r = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_session.sh"), "queue"], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, OUT=str(tmp_path),
                                            QUEUE="plans:PLANS=no-such-list+AGAIN=1 cells:CELLS=none-either"))
    assert r.returncode == 0, r
    log = (tmp_path / "gpu.txt").read_text()
    assert "== queue: plans with PLANS=no-such-list AGAIN=1" in log and "rc 2" in log, log
    assert "plans: no file matches benchmarks/results/*no-such-list*-plans.txt" in log, log
    assert "cells: no file matches benchmarks/results/*none-either*-cells.json" in log, log
    assert "pip" not in r.stdout + r.stderr + log


def test_gpu_session_queue_knows_how_long_every_stage_takes():
    """Every stage of benchmarks/gpu_session.sh but `all` and `queue` has a usual time in STAGE_SECONDS, which the
    queue needs to start it (a stage without one is skipped as "not a stage the queue runs"), and the usage message,
    the header's list and the stage table name the same stages."""
    text = (ROOT / "benchmarks/gpu_session.sh").read_text()
    r = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_session.sh"), "-h"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("usage: "), r
    stages = r.stderr.split()[-1].split("|")
    table = re.search(r"declare -A STAGE_SECONDS=\((.*?)\)\n", text, re.S).group(1)
    timed = set(re.findall(r"\[(\w+)\]=\d+", table))
    assert timed == set(stages) - {"all", "queue"}, sorted(set(stages) ^ timed)
    header = [ln[4:].split()[0] for ln in text.splitlines() if re.match(r"^#   [a-z]+ ", ln)]
    assert set(header) == set(stages), sorted(set(header) ^ set(stages))


def test_every_committed_plan_list_plans_as_it_is_written():
    """Each benchmarks/results/*-plans.txt (the `plans` stage of gpu_session.sh times them on a GPU) plans on
    this machine, one plan per line, each with the tiles, splits and stages its line names: a list that does
    not would fail only on the GPU, after the build. A misspelt key, an unknown shape or a constraint no plan
    meets raises ValueError naming its spec."""
    pd = _pick_diff()
    from kernel_check import parse_one   # pick_diff puts benchmarks/ on the path
    lists = sorted((ROOT / "benchmarks/results").glob("*-plans.txt"))
    assert lists
    for path in lists:
        specs = [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        cells = {cell: iter(plans) for cell, plans in pd.plan_specs(specs).items()}
        for spec in specs:   # each cell's plans come in its specs' order
            name, m, cons = parse_one(spec)
            got = pd.fit_stream.plan_args(next(cells[(name, m)]).summary())
            assert {k: got.get(k) for k in cons} == cons, (path.name, spec, got)
        assert not any(next(rest, None) for rest in cells.values()), path.name
    for bad, why in (("llama2-7b:16:bq=3", "bq not among the plan keys"), ("nope:16:bm=16", "not a grid shape"),
                     ("llama2-7b:16:bn=7", "'bn' must be an int")):
        with pytest.raises(ValueError, match=why):
            pd.plan_specs([bad])


def test_pick_diff_lists_the_cells_a_model_change_picks_differently(tmp_path):
    """dump stores each pick as constraints that rebuild the same plan; diff lists exactly the cells whose
    plan changed; the verdict names the cells where the new pick is slower than the old or than eager."""
    pd = _pick_diff()
    before = pd.dump(tmp_path / "a.json", tokens=(1, 128))
    assert set(before) == {f"{n}:{m}" for n in pd.shapes() for m in (1, 128)}
    for cell, (summary, cons) in before.items():
        if cons is not None and cons["kind"] == "stream":
            name, m = cell.split(":")
            assert pd._plan(name, int(m), cons).summary() == summary, cell
    after = json.loads((tmp_path / "a.json").read_text())
    assert pd.diff(before, after) == {}
    eager_cell = next(c for c, (_, cons) in after.items() if cons is None)
    fused_cell = next(c for c, (_, cons) in after.items() if cons is not None)
    after[eager_cell], after[fused_cell] = after[fused_cell], after[eager_cell]
    assert set(pd.diff(before, after)) == {eager_cell, fused_cell}
    timed = {"A:1": dict(eager=10.0, before=8.0, after=9.0), "B:1": dict(eager=10.0, before=10.0, after=10.1),
             "C:1": dict(eager=10.0, before=12.0, after=11.0)}
    assert pd.verdict(timed) == (["A:1"], ["C:1"])
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/pick_diff.py"), "diff", str(tmp_path / "a.json"),
                        str(tmp_path / "a.json"), str(tmp_path / "cells.json")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "0 cells differ" in r.stdout, r.stderr


def test_pick_diff_dumps_the_quantized_picks_and_leaves_their_timing_to_fp8_decode(tmp_path):
    """dump --fp8 lists the e4m3 chains' picks (cells NAME:M:fp8, the planner's quantized plans, which differ
    from the bf16 ones), diff compares them alike, and time refuses them with the tool that times them."""
    import fuser
    pd = _pick_diff()
    picks = pd.dump(tmp_path / "q.json", tokens=(1, 160), fp8=True)
    assert set(picks) == {f"{n}:{m}:fp8" for n in pd.shapes() for m in (1, 160)}
    d, f, l, gated, act = pd.shapes()["llama3-8b"]
    assert picks["llama3-8b:160:fp8"][0] == fuser.plan(160, d, f, d_out=l, gated=gated, activation=act, target="h200",
                                                        dtype="float8_e4m3fn").summary()
    assert picks["llama3-8b:1:fp8"][0] != pd.pick("llama3-8b", 1)[0]
    assert pd.diff(picks, json.loads((tmp_path / "q.json").read_text())) == {}
    with pytest.raises(ValueError, match=r"fp8_decode.py --models NAME --tokens M .*llama3-8b:160:fp8"):
        pd.time_cells({"llama3-8b:160:fp8": dict(before=picks["llama3-8b:160:fp8"], after=(("unfused", None)))})


#: Every timed cell the planner's stream model is held to: kernel_check logs, pick_diff's timings (the picks
#: before and after the last model change, beside eager) and the harness runs' fused plans beside eager,
#: newest last.
BACKTEST_LOGS = [f"benchmarks/results/2026-12-02-h200-{n}.json" for n in (
    "twelfth-fit-sweep", "twelfth-fit-decode", "twelfth-onephase-splits", "eleventh-onephase",
    "fourteenth-onephase-a", "fourteenth-onephase-b", "fourteenth-onephase-c", "fifteenth-pick-diff",
    "fifteenth-pick-diff-b", "fifteenth-live-rows-new", "fifteenth-live-rows-new2", "fifteenth-grid",
    "fifteenth-unit-one-a", "fifteenth-unit-one-b")] + [
    f"benchmarks/results/2026-12-03-h200-sixteenth-{n}.json" for n in ("dsm-small", "dsm-large", "unit-kb-a", "unit-kb-b")] + [
    f"benchmarks/results/2026-12-04-h200-{n}.json" for n in (
        "twentyfifth-sweep-64-128", "twentyfifth-pick-diff-a", "twentyfifth-pick-diff-b", "twentysixth-pick-diff-a",
        "twentysixth-pick-diff-b", "twentyseventh-pick-diff-s1-a", "twentyseventh-pick-diff-s1-b",
        "twentyseventh-pick-diff-bn96-a", "twentyseventh-pick-diff-bn96-b", "twentyseventh-pick-diff-bn112-a",
        "twentyseventh-pick-diff-bn112-b", "twentyseventh-pick-diff-bm64-a", "twentyseventh-pick-diff-bm64-b")] + [
    f"benchmarks/results/2026-12-05-h200-thirtysecond-{n}.json" for n in (
        "bl96-a", "bl96-b", "bl96-prefill-a", "bl96-prefill-b", "gate-model-a", "gate-model-b")] + [
    f"benchmarks/results/2026-12-05-h200-thirtysecond-targets-{r}.csv" for r in "ab"] + [
    f"benchmarks/results/2026-12-06-h200-fortieth-{n}-{r}.json" for n in ("epilogue-route", "narrow-rows") for r in "ab"] + [
    f"benchmarks/results/2026-12-06-h200-fortyseventh-{n}" for n in (
        "long-streams-a.json", "long-streams-b.json", "tie-rows-a.json", "tie-rows-b.json", "targets-a.csv",
        "targets-b.csv")] + [
    f"benchmarks/results/2026-12-07-h200-fiftyeighth-{n}" for n in (
        "targets-a.csv", "targets-b.csv", "decode-a.json", "decode-b.json", "ragged-again-a.json",
        "ragged-again-b.json", "lead-again-a.json", "lead-again-b.json", "bn48-a.json", "bn48-b.json",
        "packed-merge-a.json", "packed-merge-b.json")]


#: The committed H100 timings the model is held to on that card's built-in target, newest last.
BACKTEST_LOGS_H100 = [f"benchmarks/results/2026-12-06-h100-{n}" for n in (
    "thirtyninth-decode-rows-a.json", "thirtyninth-decode-rows-b.json", "thirtyninth-gate-model-a.json",
    "thirtyninth-gate-model-b.json", "thirtyninth-l2-fill-a.json", "thirtyninth-l2-fill-b.json",
    "thirtyninth-margin-a.json", "thirtyninth-margin-b.json", "thirtyninth-targets-a.csv", "thirtyninth-targets-b.csv",
    "thirtyninth-targets-c-decode-rows.csv", "fortieth-narrow-rows-a.json", "fortieth-narrow-rows-b.json",
    "fortieth-targets-a.csv", "fortieth-targets-b.csv", "fortyfirst-targets-a.csv", "fortyfirst-targets-b.csv",
    "fortyfirst-targets-c-host-cap.csv", "fortyfirst-stream-hbm-a.json", "fortyfirst-stream-hbm-b.json",
    "fortyfirst-stream-hbm-rows-a.json", "fortyfirst-stream-hbm-rows-b.json", "fortyfirst-tie-rows-a.json",
    "fortyfirst-tie-rows-b.json", "fortyfirst-tie-rows-c.json", "fortyfirst-tie-rows-d.json",
    "fortyfirst-targets-d-stream-hbm.csv", "fortysecond-long-streams-a.json", "fortysecond-long-streams-b.json",
    "fortysecond-targets-a.csv", "fortysecond-targets-b.csv", "fortythird-packed-route-a.json",
    "fortythird-packed-route-b.json", "fortythird-packed-route-h200-cells.json",
    "fortyfourth-packed-route-device-a.json", "fortyfourth-packed-route-device-b.json", "fortyfourth-targets-a.csv",
    "fortyfourth-near-targets-a.json", "fortyfourth-near-targets-b.json", "fortyfifth-targets-a.csv",
    "fortyfifth-targets-b.csv", "fortyfifth-near-targets-a.json", "fortyfifth-near-targets-b.json",
    "fortyfifth-s8-traces-a.json", "fortyfifth-s8-traces-b.json", "fortyfifth-layouts-a.json",
    "fortyfifth-layouts-b.json", "fortyfifth-targets-c-second-card.csv", "fortyfifth-targets-d-second-card.csv",
    "fortyfifth-three-rows-a.csv", "fortyfifth-three-rows-b.csv")] + [
    f"benchmarks/results/2026-12-07-h100-{n}-{r}.json"
    for n in ("fiftythird-bn48", "fiftyseventh-reread", "fiftyseventh-packed-merge", "fiftyninth-decode-rows-small",
              "fiftyninth-g1-splits", "fiftyninth-s1-decode") for r in "ab"] + [
    f"benchmarks/results/2026-12-07-h100-sixtieth-targets-{r}.csv" for r in "ab"]


def test_the_planners_picks_on_the_h100s_timed_cells():
    """On the 213 cells the committed H100 timings cover, the built model's picks on the h100 target are within
    0.7% of the best timed (geomean) and 9.8% faster than eager (without the L2's re-reads of swap-AB plans of
    several row tiles, ``stream_reread_gbs``, 1.0094 and 1.0946: the re-read files time both sets of picks, and the
    priced picks win in eight of the nine cells, S8 at 77 tokens losing 2%); priced at hbm_gbs as before (no
    stream_hbm_gbs of its own, no long streams' price), the same cells score 1.022 and 1.082 (docs/planner.md, "The
    stream's HBM rate on other parts"), and without the long streams' price alone 1.0072 and 1.0970 (LLaMA-70B at
    12-64 tokens stays eager, its fused plans timed 1.01-1.04x faster). Two cells' picks were never timed there (S6
    at 48 tokens, S7 at 77); the 48-wide n-tiles' picks are timed in the bn48 files. In the
    three decode cells nearest the issues' floor targets (LLaMA-2-7B at 16 and 128 tokens, GPT-3-6.7B at 128), where
    5-8 stream plans each were timed side by side on two cards, and at S8:128 (five plans, twice), the pick is the
    fastest of them."""
    pd = _pick_diff()
    logs = [str(ROOT / p) for p in BACKTEST_LOGS_H100]
    checks, regret, vs_eager, untimed = pd.backtest(logs, target="h100")
    assert len(checks) == 213 and untimed == ["S6:48", "S7:77"], untimed
    assert regret <= 1.007 and vs_eager >= 1.097, (regret, vs_eager)
    near = {c: checks[c] for c in (("llama2-7b", 16), ("llama2-7b", 128), ("gpt3-6.7b", 128), ("S8", 128))}
    assert all(r["regret"] == 1.0 for r in near.values()), near
    import fuser
    h100 = dict(fuser._C.targets()["h100"])
    _, flat_regret, flat_vs_eager, _ = pd.backtest(logs, target=dict(h100, stream_reread_gbs=h100["l2_gbs"]))
    assert flat_regret > 1.009 and flat_vs_eager < 1.095, (flat_regret, flat_vs_eager)
    _, off_regret, off_vs_eager, _ = pd.backtest(logs, target=dict(h100, stream_ramp_us=1e9))
    assert off_regret > regret and off_vs_eager < vs_eager, (off_regret, off_vs_eager)
    _, old_regret, old_vs_eager, _ = pd.backtest(logs, target=dict(h100, stream_hbm_gbs=h100["hbm_gbs"],
                                                                   stream_ramp_us=1e9))
    assert old_regret > 1.02 and old_vs_eager < 1.083, (old_regret, old_vs_eager)


def test_packed_chains_pick_their_route_where_it_was_timed_faster_on_the_h100():
    """Gate and up packed in one tensor (as fuser.optimize leaves them on CUDA), the eager route runs one GEMM of
    both and the gate kernel, which the model prices (docs/planner.md, "The packed route in the model"). On the
    committed H100 timings of that route beside the fused picks (the packed-route files: two runs, the H200
    table's cells and the H100 device target's; the 48-wide n-tiles', the re-read and the merged GEMM's cells,
    whose files time the route too), the seven cells whose pick the pricing moves on the h100 target take the route, timed faster
    than the fused plan they replace in each, and no other pick changes. Three of them (S8 at 77, 128 and 160
    tokens, the route 1.10-1.17x faster) move only with the merged GEMM priced once (``eager_packed_merge``;
    docs/planner.md, "The merged GEMM's fill and drain"): without it the packed picks score 1.012 against the best
    timed, with it 1.002."""
    import fuser
    pd = _pick_diff()
    logs = [str(ROOT / p) for p in BACKTEST_LOGS_H100 if any(k in p for k in ("packed-route", "bn48", "reread", "packed-merge"))]
    packed, regret, _, untimed = pd.backtest(logs, target="h100", packed=True)
    apart, _, _, _ = pd.backtest(logs, target="h100")
    assert untimed == ["S7:77"] and len(packed) == 33, untimed
    moved = sorted(f"{n}:{m}" for (n, m), r in packed.items() if r["pick"] != apart[(n, m)]["pick"])
    assert moved == ["S2:160", "S4:256", "S8:128", "S8:160", "S8:256", "S8:77", "S8:96"], moved
    routes = pd.packed_routes(logs)
    for cell in moved:
        n, m = cell.split(":")
        r, fused = packed[(n, int(m))], apart[(n, int(m))]
        assert r["pick"] == "eager" and r["regret"] == 1.0, (cell, r)
        assert fused["measured_us"] > 1.015 * routes[(n, int(m))], (cell, fused["measured_us"], routes[(n, int(m))])
    slow = sorted(f"{n}:{m}" for (n, m), r in packed.items() if r["regret"] is not None and r["regret"] > 1.02)
    assert slow == ["llama-70b:1"], slow   # the h100 table's eager pick, packed or not
    two = dict(fuser._C.targets()["h100"], eager_packed_merge=0.0)
    by_two, two_regret, _, _ = pd.backtest(logs, target=two, packed=True)
    assert sorted(f"{n}:{m}" for (n, m), r in packed.items() if r["pick"] != by_two[(n, m)]["pick"]) == \
        ["S8:128", "S8:160", "S8:77"]
    assert regret <= 1.003 and two_regret > 1.011, (regret, two_regret)
    assert fuser.plan(128, 1024, 3072, gated=True, activation="silu", target=two, packed=True).fused


def test_packed_chains_pick_their_route_where_it_was_timed_faster_on_the_h200():
    """On the H200's timings of the packed route beside the fused picks (the fifty-eighth session's merged-GEMM and
    48-wide n-tile cells, twice each: S1, S2 and S4 at 77-128 tokens, S8 at 48-128), the h200 table's half-merged
    GEMM (``eager_packed_merge`` 0.5, the value the route's 18 timings fit best) sends S8 at 77-128 tokens to the
    route, timed 1.09-1.15x faster than the fused picks there, at the price of S1 at 77-100 tokens and S4 at 77
    (the route 1.01-1.04x slower, inside the stream margin): 1.007 against the best timed, where two GEMMs score
    1.017 and one 1.022 (docs/planner.md, "The merged GEMM's fill and drain")."""
    import fuser
    pd = _pick_diff()
    logs = [str(ROOT / p) for p in BACKTEST_LOGS if "fiftyeighth-packed-merge" in p or "fiftyeighth-bn48" in p]
    h200 = dict(fuser._C.targets()["h200"])
    packed, regret, _, untimed = pd.backtest(logs, target="h200", packed=True)
    assert len(packed) == 18 and untimed == [], untimed
    routes = pd.packed_routes(logs)
    for m in (77, 100, 128):
        r = packed[("S8", m)]
        assert r["pick"] == "eager" and r["regret"] == 1.0 and r["best_us"] == pytest.approx(routes[("S8", m)]), (m, r)
    assert all(packed[("S8", m)]["pick"] != "eager" for m in (48, 64))
    _, two, _, _ = pd.backtest(logs, target=dict(h200, eager_packed_merge=0.0), packed=True)
    _, one, _, _ = pd.backtest(logs, target=dict(h200, eager_packed_merge=1.0), packed=True)
    assert regret <= 1.007 and two > 1.016 and one > 1.02, (regret, two, one)


def test_the_planners_picks_on_every_timed_cell_stay_timed_and_fast():
    """The built model's pick in each of the 298 cells the committed H200 timings cover is a plan they
    timed (or eager; but for five cells: four that only the H100's picks were timed in on the H200, G8 at 64
    tokens, S1, S2 and S5 at 32, and G4 at 16, whose swap-AB pick is timed at 12 tokens, 10.9 us against the old
    pick's 12.8 at 16: docs/planner.md, "Padded row tiles at decode"), within 1.1% of the best timed there
    (geomean) and 9.1% faster than eager (geomean), an eager pick timed as fuser's eager route where the files
    time it (``pick_diff.routes``: the plain ReLU cells whose fused picks the route-priced model sends to eager),
    else as PyTorch's ops. The forty-seventh session's runs
    (the long streams' 27 cells, S8's tie rows and two harness runs) time every pick, S8 at 48 and 64 tokens
    included, and hold the two picks slower than eager there: GPT-3 6.7B at 77 tokens (0.95x: a 128-row tile
    with 77 real rows runs slower than a full one, docs/kernels.md step 41) and S4 at 32 (1.05x eager, 0.93x the
    tiling it replaced); the fifty-eighth's (two harness runs, the decode, ragged-box and lead plans timed twice,
    the 48-wide n-tiles' cells) time the 48-wide picks of S2 at 77-128 tokens and S8 at 96. Without the long
    streams' price (``stream_ramp_us``) the same cells score 1.0119 and 1.0917x (1.0098 and 1.0940x with it): G5
    at 2-48 tokens, LLaMA-70B at 1-100 and GPT-3 6.7B at 77 stay eager, where their fused picks timed 0.95-1.07x
    eager (docs/planner.md, "Long streams")."""
    pd = _pick_diff()
    checks, regret, vs_eager, untimed = pd.backtest([str(ROOT / p) for p in BACKTEST_LOGS])
    # cells the lead plans' files time with the h100 table's picks only, and G4:16
    assert len(checks) == 298 and untimed == ["G4:16", "G8:64", "S1:32", "S2:32", "S5:32"], untimed
    assert regret <= 1.011 and vs_eager >= 1.091, (regret, vs_eager)
    import fuser
    _, off_regret, off_vs_eager, _ = pd.backtest([str(ROOT / p) for p in BACKTEST_LOGS],
                                                 target=dict(fuser._C.targets()["h200"], stream_ramp_us=1e9))
    assert off_regret > regret + 0.001 and off_vs_eager < vs_eager - 0.002, (off_regret, off_vs_eager)
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/pick_diff.py"), "backtest",
                        *[str(ROOT / p) for p in BACKTEST_LOGS]], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and f"geomean regret {regret:.3f}" in r.stdout, r.stderr


def test_the_model_ranks_the_timed_stream_plans_of_each_cell():
    """On the committed H200 timings, over the 67 cells with at least four timed stream plans, the built
    model's predicted times rank them with a median Spearman correlation of at least 0.8, and the plan it
    predicts fastest is within 3% of the fastest timed (geomean). Shuffling the predictions would fail both
    (docs/planner.md has the measured values)."""
    pd = _pick_diff()
    acc = pd.accuracy([str(ROOT / p) for p in BACKTEST_LOGS])
    rho = sorted(r["spearman"] for r in acc.values())
    regret = math.exp(sum(math.log(r["regret"]) for r in acc.values()) / len(acc))
    assert len(acc) == 67 and all(r["plans"] >= 4 for r in acc.values())
    assert rho[len(rho) // 2] >= 0.8 and regret <= 1.03, (rho, regret)


def test_pick_diff_reads_its_own_timings_and_kernel_check_rows(tmp_path):
    pd = _pick_diff()
    plan = "fused stream, bm=64 bn=64 bl=64, splits 1/8, 8 stages, one phase, predicted 5.4 us"
    (tmp_path / "t.json").write_text(json.dumps({"G1:4": dict(
        eager=6.0, before=5.0, after=6.0, before_plan=plan, after_plan="unfused (PyTorch eager ops)")}))
    (tmp_path / "k.json").write_text(json.dumps({"result": {"sweep": [
        dict(name="G1", m=4, plan=plan.replace("1/8", "1/4"), measured=5.5, eager=6.2),
        dict(name="G1", m=4, plan=plan.replace("1/8", "1/2"), measured=1.0, eager=6.2, ok=False),
        dict(name="G1", m=4, plan=plan.replace("one phase", "one phase, splits summed over DSM").replace("1/8", "1/4"),
             measured=4.0, eager=6.2)]}}))
    rows = pd.timed_plans([str(tmp_path / "k.json"), str(tmp_path / "t.json")])
    assert rows == {("G1", 4, "bm=64 bn=64 bl=64, splits 1/8, 8 stages, one phase"): (5.0, 6.0),
                    ("G1", 4, "bm=64 bn=64 bl=64, splits 1/4, 8 stages, one phase"): (5.5, 6.2)}
    # a harness run's CSV: each row's fused plan beside eager in graphs (an untimed column or a custom shape: none)
    fields = ["workload", "m", "fused_plan", "fused_graph_us", "eager_graph_us"]
    with open(tmp_path / "h.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerows([fields, ["G1", "4", plan.replace("1/8", "1/2"), "4.5", "6.1"], ["G2", "8", plan, "", "7.0"],
                     ["custom", "8", plan, "3.0", "7.0"]])
    rows = pd.timed_plans([str(tmp_path / "k.json"), str(tmp_path / "t.json"), str(tmp_path / "h.csv")])
    assert rows[("G1", 4, "bm=64 bn=64 bl=64, splits 1/2, 8 stages, one phase")] == (4.5, 6.1) and len(rows) == 3


def test_pick_diff_ab_reads_each_setting_against_the_null_of_every_run(tmp_path):
    """``ab``: a setting counts as faster or slower in a cell only where its ratio lies outside the run's null band
    (the lowest and highest ``measured_again`` ratio over the cells every run holds) in every run; cells a run lacks
    are left out, a setting's other bits are named, and files without the null are refused."""
    pd = _pick_diff()
    plan = "fused stream, bm={bm} bn=128 bl=128, splits 1/4, 8 stages, predicted 9.0 us"

    def row(name, bm, again, lead0, bits=True):
        return dict(name=name, m=16, plan=plan.format(bm=bm), measured=10.0, measured_again=10.0 * again,
                    same_bits_again=True, measured_lead0=10.0 * lead0, same_bits_lead0=bits)

    a = [row("S8", 16, 1.00, 1.03), row("G9", 32, 0.99, 0.98), row("G6", 16, 1.02, 1.01), row("S4", 16, 1.0, 0.95)]
    b = [row("S8", 16, 1.01, 1.02), row("G9", 32, 0.99, 0.985), row("G6", 16, 0.98, 1.00, bits=False),
         row("G4", 16, 1.0, 1.0)]   # G9 beyond run a's band (0.99-1.02) but not run b's (0.98-1.01); S4 only in a
    for name, rows in (("a", a), ("b", b)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"result": {"plans": rows}}))
    cells, settings = pd.ab([str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    assert sorted(c[0] for c in cells) == ["G6", "G9", "S8"]
    s8 = next(v for c, v in cells.items() if c[0] == "S8")
    assert s8["lead0"] == pytest.approx([1.03, 1.02]) and s8["again"] == pytest.approx([1.00, 1.01])
    lead = settings["lead0"]
    assert lead["slower"] == ["S8:16"] and lead["faster"] == [] and lead["bits"] == ["G6:16"]
    assert lead["geomean"] == pytest.approx(math.exp(sum(math.log(x) for x in (1.03, 1.02, .98, .985, 1.01, 1.0)) / 6))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/pick_diff.py"), "ab", str(tmp_path / "a.json"),
                        str(tmp_path / "b.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "slower: S8:16" in r.stdout and "other bits: G6:16" in r.stdout
    del a[1]["measured_again"]
    (tmp_path / "a.json").write_text(json.dumps({"result": {"plans": a}}))
    with pytest.raises(ValueError, match="without --again"):
        pd.ab([str(tmp_path / "a.json")])


@pytest.mark.gpu
def test_pick_diff_times_both_picks_of_a_cell_beside_eager():
    pd = _pick_diff()
    before, after = pd.pick("G1", 128), pd.pick("G1", 128)
    cons = dict(kind="stream", bm=64, bn=64, bl=64, s1=1, s2=8, stages=8, phases=1, lspan=1, cluster=[1, 1, 1, 1])
    timed = pd.time_cells({"G1:128": dict(before=(before[0], None), after=("one phase", cons))})
    t = timed["G1:128"]
    assert t["before"] == t["eager"] and 1.0 < t["eager"] < 100.0 and 1.0 < t["after"] < 100.0, t
    assert t["after_plan"] == "one phase" and t["before_plan"] == before[0]
    assert after == before


@pytest.mark.gpu
def test_pick_diff_times_fusers_eager_route_beside_the_ops():
    """``time --route``: fuser's own eager route (the gate kernel for a gated chain) timed in the cell's
    graphs beside the ops, for fitting the planner's model of that route."""
    pd = _pick_diff()
    timed = pd.time_cells({"S8:128": dict(before=("eager", None), after=("eager", None))}, route=True)
    t = timed["S8:128"]
    assert t["before"] == t["after"] == t["eager"] and 1.0 < t["route"] < 200.0, t
    assert t["route"] < 1.1 * t["eager"], t


def test_pick_diff_plans_checks_every_spec_before_timing_any():
    """``plans`` names the shape or key it cannot use, and plans every spec before the GPU runs one: a bad
    constraint in the last spec fails at once (here without a GPU), not after the cells before it."""
    pd = _pick_diff()
    ok = "S8:128:bm=64,bn=96,bl=64,s1=2,s2=4,stages=7"
    with pytest.raises(ValueError, match=r"S9 is not a grid shape \(G1, .*S8"):
        pd.time_specs([ok, "S9:128:bm=64"])
    with pytest.raises(ValueError, match=r"bx not among the plan keys bm, bn"):
        pd.time_specs([ok, "S8:128:bx=64"])
    with pytest.raises(ValueError, match=r"no plan satisfies the constraints .*bn and bl must be 128"):
        pd.time_specs([ok, "llama2-7b:16:bm=16,bn=192"])


@pytest.mark.gpu
def test_pick_diff_times_named_plans_beside_eager(tmp_path):
    """``plans``: the given stream plans of a cell, timed beside eager, as rows ``backtest`` reads back, and with
    ``trace`` each one's unit trace (phase 1's units: 128 for the bn 96 plan, one per SM, 192 for bn 64)."""
    pd = _pick_diff()
    specs = ["S8:128:bm=64,bn=96,bl=64,s1=2,s2=4,stages=7", "S8:128:bm=64,bn=64,bl=64,s1=2,s2=4,stages=8"]
    out = pd.time_specs(specs, trace=True)
    traces = out["result"]["traces"]
    assert [t["phases"][0]["units"] for t in traces] == [128, 192] and all(t["span_us"] > 1.0 for t in traces)
    rows = out["result"]["plans"]
    names = [r["plan"].split(", predicted")[0] for r in rows]
    assert names == ["fused stream, bm=64 bn=96 bl=64, splits 2/4, 7 stages",
                     "fused stream, bm=64 bn=64 bl=64, splits 2/4, 8 stages"], names
    assert all(r["ok"] and 1.0 < r["measured"] < 200.0 and 1.0 < r["eager"] < 200.0 for r in rows), rows
    (tmp_path / "p.json").write_text(json.dumps(out))
    assert len(pd.timed_plans([str(tmp_path / "p.json")])) == 2


@pytest.mark.gpu
def test_pick_diff_times_each_plan_over_both_weight_layouts_and_warm():
    """``plans --layouts --warm``: a gated cell's plan also over its gate and up weights packed in one tensor, and
    every plan over one input set (its weights kept in the L2), timed in the same interleaving; each holds the same
    values, so the kernel's outputs are the same bits. A plain chain has no second layout. S8's 19 MB of weights
    fit the L2: read from there, its pick runs faster than over the rotating sets."""
    pd = _pick_diff()
    out = pd.time_specs(["S8:128:bm=64,bn=96,bl=64,s1=2,s2=4,stages=7", "G4:128:bm=64"], layouts=True, warm=True)
    gated, plain = out["result"]["plans"]
    assert gated["ok"] and gated["same_bits_packed"] and 1.0 < gated["measured_packed"] < 200.0, gated
    assert 0.5 < gated["measured_packed"] / gated["measured"] < 2.0, gated
    assert gated["same_bits_warm"] and plain["same_bits_warm"], (gated, plain)
    assert gated["measured_warm"] < gated["measured"], gated
    assert plain["ok"] and "measured_packed" not in plain and plain["measured_warm"] > 1.0, plain


@pytest.mark.gpu
def test_pick_diff_times_each_plan_beside_other_first_pass_leads():
    """``plans --leads 0,1 --again``: each stream plan also captured with the whole ring at once, with one slot at a
    time in its first pass, and once more as it is (the graphs' own spread), in the same interleaving; the order loads
    are requested in never reaches the arithmetic, so each output is the main graph's bits, in a row tile plan and a
    swap-AB one."""
    pd = _pick_diff()
    out = pd.time_specs(["S8:128:bm=64,bn=96,bl=64,s1=2,s2=4,stages=7", "S8:16:bm=16,bn=128,bl=128,s1=2,s2=8"],
                        leads=(0, 1), again=True)
    rows = out["result"]["plans"]
    assert len(rows) == 2 and all(r["ok"] for r in rows), rows
    for r in rows:
        assert r["same_bits_lead0"] and r["same_bits_lead1"] and r["same_bits_again"], r
        assert all(0.5 < r[f"measured_{w}"] / r["measured"] < 2.0 for w in ("lead0", "lead1", "again")), r


@pytest.mark.gpu
def test_pick_diff_times_each_plan_and_eager_after_a_foreign_op(tmp_path):
    """``plans --after --again``: each plan, and eager, also with every call after a copy writing its input, the copies
    timed alone and taken off, in the same interleaving; a one-phase plan and a two-phase swap-AB one. The copy only
    rewrites the same values, so the outputs are the main graph's bits, and each time after the copy is a call's own
    time, near the main graph's (the copies alone are a few us of a 10-100 us call)."""
    pd = _pick_diff()
    out = pd.time_specs(["G1:128:bm=64,bn=64,bl=64,s1=1,s2=8,stages=8,phases=1",
                         "S8:16:bm=16,bn=128,bl=128,s1=2,s2=8"], after=True, again=True)
    rows = out["result"]["plans"]
    assert len(rows) == 2 and all(r["ok"] for r in rows), rows
    for r in rows:
        assert r["same_bits_after"] and r["same_bits_again"], r
        assert 0.0 < r["copy"] < 10.0, r
        assert 0.5 < r["measured_after"] / r["measured"] < 2.0 and 0.5 < r["eager_after"] / r["eager"] < 2.0, r
    (tmp_path / "a.json").write_text(json.dumps(out))
    cells, settings = pd.ab([str(tmp_path / "a.json")] * 2)     # the after-op ratio read against the null
    assert "after" in settings and all("after" in c for c in cells.values()), settings


def test_kernel_check_summarises_a_stream_trace_per_phase():
    """kernel_check's trace summary (bf16 and FP8 traces alike) on a made-up timeline of a 128-token FP8 plan:
    112 phase-1 units of 33 us from their first data, 128 phase-2 units of 25 us that waited 8 us for H; each
    phase's counts, medians and the span come out of the right columns."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import kernel_check
    finally:
        sys.path.pop(0)
    p = fuser.plan(128, 4096, 14336, gated=True, activation="silu", dtype="float8_e4m3fn", target="h200", fused=True,
                   kind="stream", bm=128, s1=1, s2=4)
    words = fuser._C.STREAM_TRACE_WORDS
    assert p.derived["units"] == 240 and words == 9
    tr = torch.zeros(240, words, dtype=torch.int64)
    for u in range(240):   # block, claimed, H ready, first data, done, SM, MMAs done, ns waited, last slot issued
        two = u >= 112
        c = 10**9 + (30_000 if two else 0) + u
        tr[u] = torch.tensor([u % 132, c, c + 8_000 * two, c + 6_000, c + (31_000 if two else 39_000), u % 132,
                              c + (29_000 if two else 37_000), 2_000 + 1_000 * two, c + 1_000])
    lines = []
    r = kernel_check.trace_summary(tr.view(torch.float32).reshape(-1), p, "trace", lines.append)
    one, two = r["phases"]
    assert (one["units"], two["units"], one["blocks"]) == (112, 128, 112)
    assert (one["unit_us_median"], two["unit_us_median"], two["ready_wait_us_median"]) == (33.0, 25.0, 8.0)
    assert (one["data_wait_us_median"], two["data_wait_us_median"], two["epilogue_us_max"]) == (2.0, 3.0, 2.0)
    assert abs(r["span_us"] - (30_000 + 239 + 31_000) / 1e3) < 1e-4 and r["units1"] == 112
    assert lines[-1].startswith("trace: span 61.2 us | fused stream, bm=128") and len(r["raw"]) == 240


def test_graph_calls_benchmark_checks_its_arguments_before_the_gpu():
    """graph_calls.py needs two or more different graph sizes, each at least one call, known workloads and 3 or
    more rounds: each mistake a usage error naming what to fix, on any machine."""
    script = str(ROOT / "benchmarks/graph_calls.py")
    for args, says in ((["--calls", "4"], "--calls takes two or more different counts"),
                       (["--calls", "0", "4"], "each at least 1"),
                       (["--rounds", "2"], "--rounds must be at least 3"),
                       (["--cells", "S9:128"], "workload 'S9:128'")):
        r = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and says in r.stderr, (args, r.stderr)


@pytest.mark.gpu
def test_graph_calls_benchmark_times_each_graph_size_per_call(tmp_path):
    """graph_calls.py times eager and fuser's pick in graphs of 1 and 8 calls: every time per call is a GPU
    time of a few us (not the replay's), and a graph of one G1 call, which carries a whole graph launch,
    costs each variant more per call than a graph of eight. With --after-op each variant is also timed after a
    copy of its input, the copy's own time taken off: a time per call of the same order as without it."""
    out = tmp_path / "g.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/graph_calls.py"), "--cells", "G1:128", "--calls", "1",
                        "8", "--rounds", "9", "--after-op", "--json", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(out.read_text())
    assert got["calls"] == [1, 8] and len(got["rows"]) == 1
    row = got["rows"][0]
    assert row["cell"] == "G1:128" and row["floor_us"] > 0 and "G1:128" in r.stdout
    for v in ("eager", "fuser"):
        one, eight = row[v]["1"], row[v]["8"]
        assert 1.0 < eight < one < 100.0, (v, row)
        assert 0.3 * eight < row["after_op"][v] < 3.0 * eight, (v, row)
    assert 0.5 < row["after_op"]["copy"] < 20.0 and "after an op (L=8" in r.stdout, row
