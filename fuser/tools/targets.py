"""The open issues' FFN speed targets as data, and their scorecard.

A target picks rows of a ``python -m fuser bench`` CSV (workload names and token counts), computes one
value per row from the row's columns (``METRICS``), and holds either every row to its bound (``each``:
the worst row is the target's value) or the rows' geometric mean (``geomean``). ``score`` evaluates every
target on one run or two (the issues ask for a second run that agrees), ``markdown`` writes the
scorecard: per target the required bound, each run's value, how far the two runs differ and a verdict,
then every row's value. ``WORKLOADS`` is every row some target names: ``python -m fuser bench --set
targets`` measures them, ``python -m fuser bench --score A.csv [B.csv]`` scores saved runs on any machine.

The bounds are the issues' own (fast kernels: the paper's table at 128 tokens, GPT-2-size FFNs at 1024
tokens and more, 7B-70B prefill; decode: 7B-70B at 1, 16 and 128 tokens). The issues' other targets
come from other tools (the GEMM probe, ``benchmarks/planner_accuracy.py``, ``benchmarks/e2e.py``,
``benchmarks/host_overhead.py``) and are not scored here.
"""
from __future__ import annotations

import dataclasses
import math

from fuser.tools.workloads import PAPER

__all__ = ["Target", "TARGETS", "METRICS", "WORKLOADS", "runs_of", "score", "markdown"]

#: 7B-70B FFN shapes of the harness (``fuser.tools.workloads.MODELS``).
LARGE = ("llama2-7b", "llama3-8b", "llama-70b", "gpt3-6.7b")
PAPER_S = tuple(n for n in PAPER if n.startswith("S"))


def _ratio(num, den):
    """A metric: column `num` over column `den` (None where either is missing or zero)."""
    def f(r):
        a, b = r.get(num), r.get(den)
        return a / b if a and b else None
    return f


def _vs_faster_baseline(r):
    """fuser in a graph over the faster of eager and torch.compile in graphs (1.02 = 2% slower); None
    unless both were measured (a run without torch.compile does not say)."""
    base = [r.get(k) for k in ("eager_graph_us", "compile_graph_us")]
    return r["fuser_graph_us"] / min(base) if all(base) and r.get("fuser_graph_us") else None


def _fused_tflops(r):
    """The forced fused kernel's rate in a graph (TFLOP/s) from the row's shape."""
    t = r.get("fused_graph_us")
    if not t or any(r.get(k) is None for k in ("d_model", "d_ff", "d_out", "gated")):
        return None
    flops = 2 * r["m"] * r["d_ff"] * (r["d_model"] * (2 if r["gated"] else 1) + r["d_out"])
    return flops / (t * 1e6)


#: name -> (function of a row, unit shown)
METRICS = {
    "vs_eager_graph": (_ratio("eager_graph_us", "fuser_graph_us"), "x"),
    "vs_eager_call": (_ratio("eager_us", "fusedffn_us"), "x"),
    "vs_compile_call": (_ratio("compile_us", "fusedffn_us"), "x"),
    "vs_eager_seq": (_ratio("eager_seq_us", "fusedffn_seq_us"), "x"),
    "vs_compile_seq": (_ratio("compile_seq_us", "fusedffn_seq_us"), "x"),
    "x_floor": (_ratio("fuser_graph_us", "floor_us"), "x floor"),
    "vs_faster_baseline": (_vs_faster_baseline, "x"),
    "fused_tflops": (_fused_tflops, " TFLOP/s"),
    "weight_stream": (lambda r: r.get("fuser_gbps"), " GB/s"),
}


@dataclasses.dataclass(frozen=True)
class Target:
    """One target of a `group` ("fast kernels": the paper's chains and prefill; "decode": 7B-70B at 1-128
    tokens): rows whose workload is in `names` and whose token count is in `tokens` (or at least
    `min_tokens`), the metric's value of each, `agg` ("each": every row; "geomean"; "report": shown,
    not held to a bound, its value the lowest row's), held by `op` (">=" or "<=") to `bound`. `expected`
    are the rows a complete run has (the workloads ``--set targets`` measures); rows of other token counts
    that match count too."""
    group: str
    name: str
    names: tuple
    metric: str
    agg: str
    op: str
    bound: float
    tokens: tuple = ()
    min_tokens: int = 0

    def selects(self, row):
        m = int(row["m"])
        return row["workload"] in self.names and (m in self.tokens if self.tokens else m >= self.min_tokens)

    @property
    def expected(self):
        ms = self.tokens or tuple(m for n, m in _LABELS if n in self.names and m >= self.min_tokens)
        return [(n, m) for n, m in _LABELS if n in self.names and m in ms]

    def holds(self, value):
        return value >= self.bound if self.op == ">=" else value <= self.bound


# The rows the targets name; every target must find its rows here (tests/test_targets.py holds it).
_LABELS = ([(n, 128) for n in PAPER]
           + [("gpt2", 2048), ("gpt2", 8192), ("gpt2-medium", 1024), ("gpt2-medium", 4096)]
           + [(n, m) for n in LARGE for m in (1, 16, 128, 2048)] + [("llama3-8b", 8192)])
#: The workloads of ``python -m fuser bench --set targets`` (``fuser.tools.bench.parse_workload`` labels).
WORKLOADS = tuple(f"{n}:{m}" for n, m in _LABELS)

FAST, DECODE = "fast kernels", "decode"
TARGETS = (
    Target(FAST, "paper's table: fuser vs eager, both in CUDA graphs", tuple(PAPER), "vs_eager_graph", "geomean",
           ">=", 2.2, tokens=(128,)),
    Target(FAST, "paper's table per call: FusedFFN vs eager, outside graphs", tuple(PAPER), "vs_eager_call",
           "geomean", ">=", 5.0, tokens=(128,)),
    Target(FAST, "paper's table per call: FusedFFN vs torch.compile, outside graphs", tuple(PAPER),
           "vs_compile_call", "geomean", ">=", 8.0, tokens=(128,)),
    Target(FAST, "paper's table per call, back to back: FusedFFN vs eager, outside graphs", tuple(PAPER),
           "vs_eager_seq", "geomean", ">=", 5.0, tokens=(128,)),
    Target(FAST, "paper's table per call, back to back: FusedFFN vs torch.compile, outside graphs", tuple(PAPER),
           "vs_compile_seq", "geomean", ">=", 8.0, tokens=(128,)),
    Target(FAST, "S1-S8: fuser in a graph over the floor", PAPER_S, "x_floor", "each", "<=", 1.25, tokens=(128,)),
    Target(FAST, "GPT-2 (768 -> 3072, GELU) at >= 2048 tokens: vs eager graph", ("gpt2",), "vs_eager_graph",
           "each", ">=", 1.4, min_tokens=2048),
    Target(FAST, "1024 -> 4096 GELU at >= 1024 tokens: vs eager graph", ("gpt2-medium",), "vs_eager_graph",
           "each", ">=", 1.3, min_tokens=1024),
    Target(FAST, "7B-70B at >= 2048 tokens: fuser graph over the faster of eager and compile graphs", LARGE,
           "vs_faster_baseline", "each", "<=", 1.02, min_tokens=2048),
    Target(FAST, "7B-70B at >= 2048 tokens: the fused kernel's TFLOP/s", LARGE, "fused_tflops", "each", ">=",
           600.0, min_tokens=2048),
    Target(DECODE, "7B-70B at 1 and 16 tokens: fuser graph over the floor", LARGE, "x_floor", "each", "<=", 1.08,
           tokens=(1, 16)),
    Target(DECODE, "7B-70B at 1 and 16 tokens: vs eager graph", LARGE, "vs_eager_graph", "each", ">=", 1.2,
           tokens=(1, 16)),
    Target(DECODE, "7B-70B at 128 tokens: fuser graph over the floor", LARGE, "x_floor", "each", "<=", 1.15,
           tokens=(128,)),
    Target(DECODE, "7B-70B at 128 tokens: vs eager graph", LARGE, "vs_eager_graph", "each", ">=", 1.2,
           tokens=(128,)),
    Target(DECODE, "7B-70B at 1, 16 and 128 tokens: the bytes fuser must read per us in a graph", LARGE,
           "weight_stream", "report", "", 0.0, tokens=(1, 16, 128)),
)


def runs_of(rows):
    """Split rows read from saved CSVs into runs: the first row of each (workload, tokens) belongs to the
    first run, a second one to the second run (so ``A1.csv A2.csv B1.csv`` gives runs A and B when run A
    was measured in two parts). A third row of the same workload raises ValueError.

    Example:
        >>> from fuser.tools.targets import runs_of
        >>> rows = [dict(workload="G1", m=128, run="a"), dict(workload="G2", m=128, run="a"),
        ...         dict(workload="G1", m=128, run="b")]
        >>> [[r["run"] for r in run] for run in runs_of(rows)]
        [['a', 'a'], ['b']]
    """
    runs = [[], []]
    seen = {}
    for r in rows:
        key = (r["workload"], int(r["m"]))
        k = seen.get(key, 0)
        if k >= 2:
            raise ValueError(f"{r['workload']} at {key[1]} tokens appears more than twice: give the CSVs of "
                             "one run, or of two runs, in order")
        seen[key] = k + 1
        runs[k].append(r)
    return [run for run in runs if run]


def _aggregate(target, values):
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    if target.agg == "geomean":
        return math.exp(sum(math.log(v) for v in vals) / len(vals))
    return max(vals) if target.op == "<=" else min(vals)


def score(runs):
    """Every target on `runs` (one or two lists of row dicts): a list of dicts(target, rows: [(workload,
    tokens, [value per run])], values: [aggregate per run, None where the run has no row of it],
    missing: [expected rows absent, per run], verdict: "met" (every run that has its rows complete and
    holding it), "missed" (complete, none holding it), "split" (complete, the runs disagree), "shown" (a
    value shown, not held to a bound), "incomplete (K of N rows absent)" or "not measured"; " (one run)"
    added where only one of two runs has its rows).

    Example:
        >>> from fuser.tools.targets import score
        >>> rows = [dict(workload="gpt2", m=m, eager_graph_us=45.0, fuser_graph_us=30.0) for m in (2048, 8192)]
        >>> r = next(r for r in score([rows]) if r["target"].name.startswith("GPT-2"))
        >>> round(r["values"][0], 2), r["verdict"]
        (1.5, 'met')
    """
    fn = {k: f for k, (f, _) in METRICS.items()}
    out = []
    for t in TARGETS:
        keyed = []
        for run in runs:
            keyed.append({(r["workload"], int(r["m"])): fn[t.metric](r) for r in run if t.selects(r)})
        keys = sorted({k for run in keyed for k in run} | set(t.expected),
                      key=lambda k: (t.names.index(k[0]), k[1]))
        rows = [(n, m, [run.get((n, m)) for run in keyed]) for n, m in keys]
        values = [_aggregate(t, [vs[i] for _, _, vs in rows]) for i in range(len(runs))]
        missing = [[k for k in t.expected if run.get(k) is None] for run in keyed]
        measured = [i for i, v in enumerate(values) if v is not None]
        if not measured:
            verdict = "not measured"
        elif any(missing[i] for i in measured):
            worst = max(len(missing[i]) for i in measured)
            verdict = f"incomplete ({worst} of {len(t.expected)} rows absent)"
        elif t.agg == "report":
            verdict = "shown"
        else:
            held = [t.holds(values[i]) for i in measured]
            verdict = "met" if all(held) else "missed" if not any(held) else "split"
        if verdict != "not measured" and len(measured) < len(runs):
            verdict += " (one run)"
        out.append(dict(target=t, rows=rows, values=values, missing=missing, verdict=verdict))
    return out


def _fmt(v, unit, bare=False):
    """`v` with its unit (or, `bare`, without: the per-workload table's titles carry it)."""
    if v is None:
        return "-"
    whole = unit.strip().startswith(("TFLOP", "GB"))
    return (f"{v:.0f}" if whole else f"{v:.3f}") + ("" if bare else unit)


#: Column titles of the per-row table, one per metric.
TITLES = {"vs_eager_graph": "vs eager graph", "vs_eager_call": "per call vs eager",
          "vs_compile_call": "per call vs compile", "vs_eager_seq": "back to back vs eager",
          "vs_compile_seq": "back to back vs compile", "x_floor": "graph over floor",
          "vs_faster_baseline": "graph over faster baseline", "fused_tflops": "fused kernel TFLOP/s",
          "weight_stream": "GB/s in a graph"}


def markdown(results):
    """The scorecard: a summary table (goal, target, required, each run's value, the runs' difference,
    verdict; a target's value is its geometric mean, or its worst row), then one line per workload with
    the value of every metric a target reads from it (run A / run B).

    Example:
        >>> from fuser.tools.targets import markdown, score
        >>> rows = [dict(workload="gpt2", m=2048, eager_graph_us=41.5, fuser_graph_us=45.7)]
        >>> [line for line in markdown(score([rows])).splitlines() if "| gpt2 |" in line]
        ['| gpt2 | 2048 | 0.908 |  |  |  |  |  |  |  |  |']
    """
    n = max(len(r["values"]) for r in results)
    names = ["run A", "run B"][:n]
    out = ["| goal | target | required | " + " | ".join(names) + (" | A vs B" if n == 2 else "") + " | verdict |",
           "|---" * (4 + n + (n == 2)) + "|"]
    cells_of = {}                            # (workload, tokens) -> metric -> values per run
    for r in results:
        t, unit = r["target"], METRICS[r["target"].metric][1]
        agg = {"geomean": "geomean", "each": "every row", "report": "shown (lowest row)"}[t.agg]
        cells = [t.group, t.name, agg + (f" {t.op} {_fmt(t.bound, unit)}" if t.op else "")]
        cells += [_fmt(v, unit) for v in r["values"]]
        if n == 2:
            a, b = r["values"]
            cells.append(f"{abs(a - b) / b:.1%}" if a is not None and b else "-")
        cells.append(r["verdict"])
        out.append("| " + " | ".join(cells) + " |")
        for w, m, vs in r["rows"]:
            cells_of.setdefault((w, m), {})[t.metric] = vs
    metrics = [k for k in METRICS if any(k in c for c in cells_of.values())]
    out += ["", f"Per workload ({' / '.join(names)}):", "",
            "| workload | tokens | " + " | ".join(TITLES[k] for k in metrics) + " |", "|---" * (2 + len(metrics)) + "|"]
    for (w, m), c in cells_of.items():
        if all(v is None for vs in c.values() for v in vs):
            continue                         # a workload no run measured: the summary counts it absent
        vals = [" / ".join(_fmt(v, METRICS[k][1], bare=True) for v in c[k]) if k in c else ""
                for k in metrics]
        out.append(f"| {w} | {m} | " + " | ".join(vals) + " |")
    return "\n".join(out) + "\n"
