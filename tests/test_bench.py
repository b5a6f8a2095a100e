"""The benchmark harness's CPU-checkable parts: workload parsing and sets, the floor, the row a result
becomes (speedups like with like), and the report (CSV round trip, Markdown tables, headline, PNG plot)
drawn from a results CSV. The timing itself runs on the GPU (tests/test_cli.py::test_bench_on_hopper)."""
import math

import pytest

from fuser.tools import bench, bench_report
from fuser.tools.bench import BASELINES, VARIANTS, Result, Workload, parse_workload, workload_set
from fuser.tools.timing import median_interval, round_orders


def test_parse_workload_forms():
    assert parse_workload("G3") == Workload("G3", 128, 416, 512, 256, False, "relu")
    assert parse_workload("S1:512") == Workload("S1", 512, 3072, 8192, 3072, True, "silu")
    assert parse_workload("gpt3-6.7b:1") == Workload("gpt3-6.7b", 1, 4096, 16384, 4096, False, "gelu")
    assert parse_workload("1024x2816:silu-gated:8") == Workload("custom", 8, 1024, 2816, 1024, True, "silu")
    for bad in ("G11", "llama3-8b", "llama3-8b:x", "1024x2816:swish:8", "1024x:relu:8", "gpt2:16:3"):
        with pytest.raises(ValueError, match="expected a paper workload"):
            parse_workload(bad)


def test_workload_sets_hold_the_paper_and_model_shapes():
    paper = workload_set("paper")
    assert [w.name for w in paper] == [f"G{i}" for i in range(1, 11)] + [f"S{i}" for i in range(1, 9)]
    assert all(w.m == 128 for w in paper)
    models = workload_set("models")
    assert {w.name for w in models} == {"gpt2", "gpt2-medium", "llama2-7b", "llama3-8b", "llama-70b", "gpt3-6.7b"}
    assert sorted({w.m for w in models}) == [1, 16, 128, 512, 2048, 8192]
    with pytest.raises(ValueError, match="paper, models, all, targets or quick"):
        workload_set("everything")


def test_floor_matches_the_baselines_doc():
    """h200-baselines.md: LLaMA-3-8B at 16 tokens, 82.5 us memory-bound at 4.275 TB/s; at 8192 tokens
    3758.7 us compute-bound at 767.9 TFLOP/s."""
    w = parse_workload("llama3-8b:16")
    assert w.flops == 2 * 16 * 14336 * 4096 * 3
    us, bound = w.floor_us(767.9, 4.275)
    assert bound == "M" and us == pytest.approx(82.5, abs=0.1)
    us, bound = parse_workload("llama3-8b:8192").floor_us(767.9, 4.275)
    assert bound == "C" and us == pytest.approx(3758.7, abs=0.5)


def fake_result(w, eager=100.0, fuser=80.0, **extra):
    times = {v: eager * (1 + 0.01 * i) for i, v in enumerate(BASELINES)}
    times.update(fuser=fuser, fuser_graph=fuser * 0.9, fused_graph=fuser * 0.8, autotune=None, autotune_graph=None, **extra)
    times = {k: v for k, v in times.items() if v is not None}
    floor, bound = w.floor_us(800.0, 4.0)
    return Result(w, floor, bound, times, {"compile": 4.2}, "fused x: 1 us", True, "fused x: 1 us", 12.5,
                  dict(sm_mhz_min=1500, sm_mhz_max=1980, reasons=4), 3, 20)


def test_result_row_compares_like_with_like():
    w = parse_workload("gpt2:128")
    r = fake_result(w).row()
    t = fake_result(w).times
    assert r["speedup_vs_eager"] == pytest.approx(t["eager"] / t["fuser"], abs=1e-3)
    assert r["speedup_vs_eager_graph"] == pytest.approx(t["eager_graph"] / t["fuser_graph"], abs=1e-3)
    assert r["autotune_us"] is None and r["speedup_vs_autotune"] is None
    assert r["fuser_tflops"] == pytest.approx(w.flops / (t["fuser_graph"] * 1e6), abs=0.1)
    assert r["fused_tflops"] == pytest.approx(w.flops / (t["fused_graph"] * 1e6), abs=0.1)
    assert r["eager_x_floor"] == pytest.approx(t["eager"] / w.floor_us(800.0, 4.0)[0], abs=1e-3)
    assert r["compile_compile_s"] == 4.2 and r["autotune_compile_s"] is None
    assert set(VARIANTS) <= {k[:-3] for k in r if k.endswith("_us")}


def test_report_from_a_csv(tmp_path):
    rows = [fake_result(parse_workload(s), eager=100 + i, fuser=90 - i).row()
            for i, s in enumerate(["G1", "S8", "gpt2:1", "gpt2:128", "llama3-8b:16"])]
    bench_report.write_csv(rows, tmp_path / "r.csv")
    back = bench_report.read_csv(tmp_path / "r.csv")
    assert len(back) == 5 and back[3]["m"] == 128 and back[3]["gated"] is False
    assert all(math.isclose(a["fuser_us"], b["fuser_us"]) for a, b in zip(rows, back))
    md = bench_report.markdown(back)
    assert md.count("\n### ") == 3          # the paper's, gpt2, llama3-8b
    assert "| G1 | 128 |" in md and "| gpt2 | 1 |" in md and "[4 s]" in md and "max-autotune" not in md
    head = bench_report.headline(back)
    assert head.count("\n") == 2 + 5 and "eager graph" in head
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (the test extra installs it)")
    bench_report.plot(back, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_redraws_from_a_csv(tmp_path):
    from fuser.tools.cli import main
    rows = [fake_result(parse_workload("llama3-8b:16")).row()]
    bench_report.write_csv(rows, tmp_path / "r.csv")
    assert main(["bench", "--plot", str(tmp_path / "r.csv"), "--out", str(tmp_path / "o")]) == 0


def test_clocks_reader_degrades_without_nvml():
    c = bench.Clocks()
    r = c.read()
    assert set(r) == {"sm_mhz", "reasons", "watts"}


def test_compare_two_runs_counts_only_shapes_above_the_threshold():
    big = fake_result(parse_workload("llama3-8b:16"), eager=400, fuser=300).row()
    small = fake_result(parse_workload("G1"), eager=20, fuser=10).row()
    other = dict(big, speedup_vs_eager_graph=big["speedup_vs_eager_graph"] * 1.08)
    rows, summary = bench_report.compare([big, small], [other, small])
    assert {r[0] for r in rows} == {"llama3-8b"}
    assert summary["n"] == len(rows) == sum(big[f"speedup_vs_{b}"] is not None for b in BASELINES)
    assert summary["over_5pct"] == 1 and summary["max"] == pytest.approx(1 - 1 / 1.08, abs=1e-3)


def test_compare_can_leave_out_host_bound_per_call_ratios(tmp_path, capsys):
    """With gpu_bound, a per-call ratio counts only where both variants run within that factor of their
    graph times in both runs (a host-bound per-call time measures the host); graph ratios always count.
    `python -m fuser bench --compare` prints both summaries."""
    from fuser.tools.cli import main
    w = parse_workload("llama3-8b:16")
    gpu = fake_result(w, eager=400, fuser=300, eager_graph=390).row()        # fuser 300 vs graph 270: 1.11x
    slow_host = dict(gpu, speedup_vs_eager=gpu["speedup_vs_eager"] * 1.3)
    _, everything = bench_report.compare([gpu], [slow_host])
    rows, bound = bench_report.compare([gpu], [slow_host], gpu_bound=1.2)
    assert everything["over_5pct"] == 1 and bound["over_5pct"] == 1
    rows, bound = bench_report.compare([gpu], [slow_host], gpu_bound=1.1)
    assert bound["over_5pct"] == 0 and {r[2] for r in rows} == {
        f"speedup_vs_{b}" for b in BASELINES if b.endswith("_graph") and gpu[f"speedup_vs_{b}"]}
    for name, row in (("a", gpu), ("b", slow_host)):
        bench_report.write_csv([row], tmp_path / f"{name}.csv")
    assert main(["bench", "--compare", str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]) == 0
    out = capsys.readouterr().out
    assert "all ratios" in out and "1 over 5%" in out and "GPU-bound ratios" in out and "0 over 5%" in out


def test_compare_and_score_say_when_the_runs_graphed_differently(tmp_path, capsys):
    """Saved runs whose graphed calls followed different predecessors (a copy writing the input, or the previous
    call) get a note naming each file's method on stderr, from --compare and --score alike; runs of one method,
    and files written before the column existed (read as "self"), get none."""
    from fuser.tools.cli import main
    w = parse_workload("llama3-8b:16")
    old = fake_result(w, eager=400, fuser=300).row()
    old.pop("graph_after")
    new = dict(fake_result(w, eager=400, fuser=300).row(), graph_after="op", graph_op_us=1.5)
    same = dict(new)
    for name, row in (("old", old), ("new", new), ("same", same)):
        bench_report.write_csv([row], tmp_path / f"{name}.csv")
    assert bench_report.graph_after(bench_report.read_csv(tmp_path / "old.csv")) == "self"
    for args in (["--compare"], ["--score"]):
        assert main(["bench", *args, str(tmp_path / "old.csv"), str(tmp_path / "new.csv")]) == 0
        err = capsys.readouterr().err
        assert "follow different predecessors" in err and "old.csv: self" in err and "new.csv: op" in err, err
        assert main(["bench", *args, str(tmp_path / "same.csv"), str(tmp_path / "new.csv")]) == 0
        assert "different predecessors" not in capsys.readouterr().err


@pytest.mark.parametrize("text", ["G3:4", "S8:4"])
def test_fusedffn_variant_computes_the_workloads_ffn(text):
    """The harness's FusedFFN variant wraps one weight set's tensors (no copy) as optimize() would."""
    import torch

    import fuser
    w = parse_workload(text)
    n = w.d_ff * (2 if w.gated else 1)
    s = {"w_gu": torch.randn(n, w.d_model) * w.d_model ** -0.5, "w_down": torch.randn(w.d_out, w.d_ff) * w.d_ff ** -0.5}
    m = bench._module_of(w, s)
    wts = m.weights()
    assert wts["up"].data_ptr() == s["w_gu"][n - w.d_ff:].data_ptr() and wts["down"].data_ptr() == s["w_down"].data_ptr()
    x = torch.randn(w.m, w.d_model)
    gate, up = (s["w_gu"][:w.d_ff], s["w_gu"][w.d_ff:]) if w.gated else (None, s["w_gu"])
    ref = fuser.ffn_reference(x, up, s["w_down"], w_gate=gate, activation=w.activation)
    with torch.no_grad():
        torch.testing.assert_close(m(x), ref)


def test_median_interval_holds_the_median_as_often_as_it_says():
    """The sign test's interval: the order statistics a table gives (9 samples: the 2nd and 8th; 31: the 10th
    and 22nd), the whole range below 6 samples, and over many draws of skewed samples the true median inside
    it at least 95% of the time, and not always (an interval that always held it would be too wide)."""
    import random
    assert median_interval(range(1, 10)) == (2, 8)
    assert median_interval(range(1, 32)) == (10, 22)
    assert median_interval([5.0, 1.0, 3.0, 2.0, 4.0]) == (1.0, 5.0)
    assert median_interval([7.0]) == (7.0, 7.0)
    rng = random.Random(0)
    for n in (9, 15, 31):
        hits = 0
        for _ in range(2000):
            lo, hi = median_interval([rng.expovariate(1.0) for _ in range(n)])
            hits += lo <= math.log(2) <= hi      # the exponential's median
        assert 0.95 * 2000 - 30 <= hits < 2000, (n, hits)
    with pytest.raises(ValueError, match="no values"):
        median_interval([])
    with pytest.raises(ValueError, match="level"):
        median_interval([1.0, 2.0], level=1.5)


def test_round_orders_vary_every_variants_predecessor():
    """Each round runs every variant once, in an order that changes: over 30 rounds each variant follows
    several different ones (a rotation kept one predecessor in all rounds but one), and the same seed
    gives the same orders (a rerun times in the same sequence)."""
    orders = round_orders(VARIANTS, 30, seed="llama3-8b M=128")
    assert all(sorted(o) == sorted(VARIANTS) for o in orders)
    for v in VARIANTS:
        before = {o[o.index(v) - 1] for o in orders if o.index(v) > 0}
        assert len(before) >= 4, v
    assert orders == round_orders(VARIANTS, 30, seed="llama3-8b M=128")
    assert orders != round_orders(VARIANTS, 30, seed="G1 M=128")


def test_graphs_hold_several_short_calls_whatever_the_host_probe_says():
    """A short call goes into a graph several times (each replay carries the graph's launch once), as many
    as fill the budget when the probe is short (at most GRAPH_MAX_CALLS), at least GRAPH_MIN_CALLS (16)
    when host time made the probe long, whatever the number of rotating sets; a long call goes in once."""
    from fuser.tools.bench import GRAPH_MAX_CALLS, GRAPH_MIN_CALLS, GRAPH_SHORT_US, graph_calls
    assert GRAPH_MIN_CALLS == 16 and GRAPH_MAX_CALLS == 64
    assert graph_calls(10.0) == 50 and graph_calls(0.0) == graph_calls(2.0) == GRAPH_MAX_CALLS
    assert graph_calls(20.0) == 25 and graph_calls(100.0) == graph_calls(GRAPH_SHORT_US - 1) == GRAPH_MIN_CALLS
    assert graph_calls(GRAPH_SHORT_US) == 1 and graph_calls(5000.0) == 1
    # the fewest calls is the caller's (`fuser bench --graph-calls`)
    assert graph_calls(100.0, 4) == 5 and graph_calls(GRAPH_SHORT_US - 1, 4) == 4 and graph_calls(300.0, 1) == 1
    assert graph_calls(GRAPH_SHORT_US, 4) == 1
    with pytest.raises(ValueError, match="min_calls must be at least 1"):
        graph_calls(100.0, 0)


def test_a_graph_of_more_calls_than_sets_cycles_through_them():
    """The graphed variants' calls take the rotating sets in turn while the graph is captured, so a graph of
    16 calls over 5 sets reads set after set, each again only after the four others (what keeps a set's
    weights out of the L2 when it comes round again), and never the same set twice in a row."""
    from fuser.tools.bench import Sets
    sets = Sets.__new__(Sets)
    sets.n, sets.sets, sets.i = 5, [object() for _ in range(5)], 0
    seen = [sets.sets.index(sets.turn()) for _ in range(16)]
    assert seen == [(k + 1) % 5 for k in range(16)]
    assert all(a != b for a, b in zip(seen, seen[1:]))


def test_a_back_to_back_sequence_is_timed_per_call():
    """The back-to-back variants run S calls between one pair of timestamps and report per call: S such
    calls of ~1 ms come out near 1 ms each (not S ms, and not one call's time plus the timer's), and S
    stays within its bounds whatever the probe."""
    import time
    from fuser.tools.bench import SEQ_MAX_CALLS, SEQ_MIN_CALLS, back_to_back, seq_calls
    from fuser.tools.timing import time_interleaved
    seen = []
    f, n = back_to_back(lambda: (seen.append(1), time.sleep(0.001)), 5)
    one, per = time_interleaved([lambda: time.sleep(0.001), (f, n)], rounds=3, warmup=0, cpu=True)
    assert n == 5 and len(seen) == 15 and 1000 <= per < 1.5 * one
    assert seq_calls(0.0) == SEQ_MAX_CALLS and seq_calls(1e6) == SEQ_MIN_CALLS and seq_calls(250.0) == 8


def test_a_graphed_call_follows_a_copy_writing_its_input():
    """With graphs after an op (the default), each graphed call's input is first written by a copy of that
    set's kept input: the call reads the set it turns to, whose x was poisoned and is whole again, and the
    copy comes before the call every time; the copies alone are a turn and a copy with no call."""
    import torch

    from fuser.tools.bench import Sets, after_op
    sets = Sets.__new__(Sets)
    sets.n, sets.i = 3, 0
    sets.sets = [{"x_src": torch.full((2, 4), float(k))} for k in range(3)]
    for s in sets.sets:
        s["x"] = torch.full((2, 4), -1.0)     # poisoned: only the copy makes it right
    seen = []

    def call():
        s = sets.turn()
        seen.append(float(s["x"].mean()))
        return s
    f = after_op(sets, call)
    for _ in range(5):
        f()
    assert seen == [1.0, 2.0, 0.0, 1.0, 2.0]
    alone = after_op(sets, sets.turn)
    sets.sets[0]["x"].fill_(-1.0)
    assert alone() is sets.sets[0] and float(sets.sets[0]["x"].mean()) == 0.0 and len(seen) == 5


def test_the_copies_are_taken_off_graphed_times_only():
    """The copies' time per call comes off every graphed variant (its "_graph" name) and no other, and is
    reported; without copies the times stand as measured."""
    from fuser.tools.bench import own_graph_times
    timed, op = own_graph_times({"eager": 40.0, "fusedffn_seq": 20.0, "eager_graph": 10.0, "fused_graph": 7.0,
                                 "graph_op": 2.0})
    assert op == 2.0 and timed == {"eager": 40.0, "fusedffn_seq": 20.0, "eager_graph": 8.0, "fused_graph": 5.0}
    assert own_graph_times({"fuser_graph": 3.0}) == ({"fuser_graph": 3.0}, None)


def test_run_refuses_an_unknown_graph_predecessor_before_the_gpu():
    from fuser.tools.bench import GRAPH_AFTER, run
    assert GRAPH_AFTER == ("op", "self")
    with pytest.raises(ValueError, match="graph_after must be one of"):
        run([], graph_after="copy")


def test_rows_record_what_graphed_calls_followed():
    w = parse_workload("G1")
    r = fake_result(w).row()
    assert r["graph_after"] == "self" and r["graph_op_us"] is None
    r = Result(w, 1.0, "M", {"fuser": 5.0, "fuser_graph": 4.0}, {}, "p", True, "p", 1.0, {}, 3, 20,
               graph_calls=16, graph_after="op", graph_op_us=1.234).row()
    assert r["graph_after"] == "op" and r["graph_op_us"] == 1.23 and r["graph_calls"] == 16
