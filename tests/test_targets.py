"""The issues' speed targets scored from saved harness runs (fuser.tools.targets, ``python -m fuser bench
--score``): which rows each target reads, its verdicts on runs built to meet or miss it, two runs and
partial ones, and the command line. Rows are made by the harness's own Result.row() and go through its
CSV, so the columns are the ones a real run writes."""
import math
import pathlib

import pytest

from fuser.tools import bench_report, cli, targets
from fuser.tools.bench import Result, parse_workload, workload_set

ROOT = pathlib.Path(__file__).resolve().parents[1]


def row(label, over_floor=1.0, vs_eager=3.0, per_call=10.0, fused_tflops=700.0):
    """A harness row for workload `label` whose fuser graph time is `over_floor` x the floor, eager's
    graph (and torch.compile's) `vs_eager` x that, the per-call baselines `per_call` x FusedFFN's (one call, and
    back to back), and the
    forced fused kernel at `fused_tflops`. The floor is 100 us everywhere, so the CSV's 0.01 us rounding
    moves no ratio."""
    w = parse_workload(label)
    floor, bound = 100.0, "M"
    f = floor * over_floor
    times = dict(fuser_graph=f, fuser=f, fusedffn=f, eager_graph=f * vs_eager, compile_graph=f * vs_eager,
                 eager=f * per_call, compile=f * per_call, fused_graph=w.flops / (fused_tflops * 1e6),
                 fusedffn_seq=f, eager_seq=f * per_call, compile_seq=f * per_call)
    return Result(w, floor, bound, times, {}, "p", True, "p", 1.0, {}, 3, 20).row()


def through_csv(rows, tmp_path, name="r.csv"):
    bench_report.write_csv(rows, tmp_path / name)
    return bench_report.read_csv(tmp_path / name)


def verdicts(results):
    return {r["target"].name: r["verdict"] for r in results}


def test_the_targets_set_measures_every_row_a_target_names():
    labels = {f"{w.name}:{w.m}" for w in workload_set("targets")}
    assert labels == set(targets.WORKLOADS) and len(labels) == len(targets.WORKLOADS)
    used = set()
    for t in targets.TARGETS:
        assert t.expected, t.name
        assert all(f"{n}:{m}" in labels for n, m in t.expected), t.name
        assert t.metric in targets.METRICS and t.agg in ("each", "geomean", "report")
        used |= {f"{n}:{m}" for n, m in t.expected}
    assert used == labels                     # no workload that no target reads
    assert {t.group for t in targets.TARGETS} == {"fast kernels", "decode"}


def test_a_run_that_meets_every_bound_is_met_and_one_row_over_misses_its_target(tmp_path):
    rows = through_csv([row(label) for label in targets.WORKLOADS], tmp_path)
    v = verdicts(targets.score([rows]))
    assert set(v.values()) == {"met", "shown"} and list(v.values()).count("shown") == 1

    worse = [row(label, over_floor=1.3 if label == "S3:128" else 1.0) for label in targets.WORKLOADS]
    res = {r["target"].name: r for r in targets.score([through_csv(worse, tmp_path)])}
    s_floor = res["S1-S8: fuser in a graph over the floor"]
    assert s_floor["verdict"] == "missed" and s_floor["values"][0] == pytest.approx(1.3, rel=1e-3)
    assert [m for m, r in res.items() if r["verdict"] == "missed"] == ["S1-S8: fuser in a graph over the floor"]


def test_geomean_targets_average_in_logs_and_each_targets_take_the_worst_row(tmp_path):
    speed = {f"{n}:128": 1.2 + 0.1 * i for i, n in enumerate(targets.PAPER)}
    rows = through_csv([row(label, vs_eager=speed.get(label, 3.0)) for label in targets.WORKLOADS], tmp_path)
    res = {r["target"].name: r for r in targets.score([rows])}
    paper = res["paper's table: fuser vs eager, both in CUDA graphs"]
    want = math.exp(sum(math.log(s) for s in speed.values()) / len(speed))
    assert paper["values"][0] == pytest.approx(want, rel=1e-3) and want < 2.2 and paper["verdict"] == "missed"
    decode = res["7B-70B at 1 and 16 tokens: vs eager graph"]
    assert decode["values"][0] == pytest.approx(3.0, rel=1e-3) and decode["verdict"] == "met"
    low = [row(label, fused_tflops=590.0 if label == "llama-70b:2048" else 700.0) for label in targets.WORKLOADS]
    res = {r["target"].name: r for r in targets.score([through_csv(low, tmp_path)])}
    tf = res["7B-70B at >= 2048 tokens: the fused kernel's TFLOP/s"]
    assert tf["values"][0] == pytest.approx(590.0, rel=1e-2) and tf["verdict"] == "missed"


def test_two_runs_split_disagree_and_absent_rows_leave_a_target_incomplete(tmp_path):
    a = through_csv([row(label) for label in targets.WORKLOADS], tmp_path, "a.csv")
    b = through_csv([row(label, over_floor=1.2 if label == "llama3-8b:16" else 1.0) for label in targets.WORKLOADS],
                    tmp_path, "b.csv")
    runs = targets.runs_of(a + b)
    assert [len(r) for r in runs] == [len(targets.WORKLOADS)] * 2
    res = {r["target"].name: r for r in targets.score(runs)}
    dec = res["7B-70B at 1 and 16 tokens: fuser graph over the floor"]
    assert dec["verdict"] == "split" and dec["values"][1] == pytest.approx(1.2, rel=1e-3)
    md = targets.markdown(targets.score(runs))
    assert "| run A | run B | A vs B | verdict |" in md and "16.7%" in md   # |1.0 - 1.2| / 1.2

    part = [r for r in a if (r["workload"], r["m"]) != ("gpt2", 8192)]
    res = {r["target"].name: r for r in targets.score([part, b])}
    assert res["GPT-2 (768 -> 3072, GELU) at >= 2048 tokens: vs eager graph"]["verdict"] == \
        "incomplete (1 of 2 rows absent)"
    only_a = {r["target"].name: r["verdict"] for r in targets.score([a, [x for x in b if x["m"] < 2048]])}
    assert only_a["7B-70B at >= 2048 tokens: the fused kernel's TFLOP/s"] == "met (one run)"
    with pytest.raises(ValueError, match="more than twice"):
        targets.runs_of(a + b + a[:1])
    no_compile = [dict(r, compile_graph_us=None) for r in a]     # a run without torch.compile
    res = {r["target"].name: r for r in targets.score([no_compile])}
    assert res["7B-70B at >= 2048 tokens: fuser graph over the faster of eager and compile graphs"]["verdict"] == \
        "not measured"


def test_score_on_the_command_line(tmp_path, capsys):
    bench_report.write_csv([row(label) for label in targets.WORKLOADS[:20]], tmp_path / "a1.csv")
    bench_report.write_csv([row(label) for label in targets.WORKLOADS[20:]], tmp_path / "a2.csv")
    assert cli.main(["bench", "--score", str(tmp_path / "a1.csv"), str(tmp_path / "a2.csv")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| goal | target | required | run A | verdict |")
    assert "incomplete" not in out and out.count("| met |") == len(targets.TARGETS) - 1
    assert out.count("| G1 | 128 |") == 1        # the per-workload table, one line a workload
    (tmp_path / "notes.csv").write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--score", str(tmp_path / "notes.csv")])
    assert e.value.code == 2 and "not a results.csv" in capsys.readouterr().err


def test_a_bench_run_writes_its_scorecard(tmp_path, capsys):
    """What ``python -m fuser bench`` does with its rows at the end of a run (on a GPU): the scorecard into
    targets.md beside results.csv, printed too for ``--set targets``."""
    rows = [row(label) for label in targets.WORKLOADS]
    cli._bench_targets(rows, str(tmp_path), show=False)
    assert capsys.readouterr().out == ""
    card = (tmp_path / "targets.md").read_text()
    assert card == targets.markdown(targets.score([rows])) and card.count("| met |") == len(targets.TARGETS) - 1
    cli._bench_targets(rows[:5], str(tmp_path), show=True)
    assert "| not measured |" in capsys.readouterr().out


def test_the_committed_decode_runs_score_as_their_rows_say():
    """Two committed decode runs of the harness on the H200 (benchmarks/results/*-twentythird-bench-a/b.csv):
    each row's value is its own columns' ratio, and the verdicts follow from them."""
    paths = [ROOT / f"benchmarks/results/2026-12-03-h200-twentythird-bench-{k}.csv" for k in "ab"]
    runs = targets.runs_of([r for p in paths for r in bench_report.read_csv(p)])
    res = {r["target"].name: r for r in targets.score(runs)}
    floor = res["7B-70B at 1 and 16 tokens: fuser graph over the floor"]
    for i, run in enumerate(runs):
        mine = [r["fuser_graph_us"] / r["floor_us"] for r in run if r["m"] in (1, 16)]
        assert len(mine) == 8 and floor["values"][i] == pytest.approx(max(mine))
    assert floor["verdict"] == ("met" if max(floor["values"]) <= 1.08 else
                                "missed" if min(floor["values"]) > 1.08 else "split")
