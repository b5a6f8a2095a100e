"""Writing out benchmark results (``fuser.tools.bench``): the CSV (one row per workload, every number), the
Markdown tables (one per workload group, each time with its ratio to the floor), and the PNG plot of
speedup against tokens per model shape (matplotlib, optional). The plot and tables are made from the
CSV's rows, so they can be redrawn from a saved CSV on any machine."""
from __future__ import annotations

import csv
import io

from fuser.tools.bench import BASELINES, VARIANTS

#: Column titles of the Markdown tables.
TITLES = {"eager": "eager", "eager_graph": "eager graph", "compile": "compile", "compile_graph": "compile graph",
          "autotune": "max-autotune", "autotune_graph": "max-autotune graph", "cublas_graph": "cuBLAS GEMMs graph",
          "fuser": "fuser", "fuser_graph": "fuser graph", "fused_graph": "fused kernel graph",
          "fusedffn": "FusedFFN", "eager_seq": "eager back to back", "compile_seq": "compile back to back",
          "fusedffn_seq": "FusedFFN back to back"}


def write_csv(rows, path):
    """Write row dicts (``Result.row()``) to `path`."""
    if not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def read_csv(path):
    """Row dicts back from a CSV written by :func:`write_csv`, numbers as floats (empty: None). Raises
    ValueError for a file that is not one (no workload and token columns, or a row longer than the header)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if not {"workload", "m"} <= set(reader.fieldnames or ()):
            raise ValueError(f"{path}: not a results.csv of python -m fuser bench (no 'workload' and 'm' columns)")
        rows = []
        for r in reader:
            if None in r:
                raise ValueError(f"{path}, line {reader.line_num}: more fields than the header has")
            rows.append({k: _num(v) for k, v in r.items()})
        return rows


def graph_after(rows):
    """What the graphed calls of a run's rows followed (``fuser.tools.bench.GRAPH_AFTER``): "op", "self", or
    "op and self" for a mix; rows from before the column existed followed the previous call ("self").

    Example:
        >>> from fuser.tools.bench_report import graph_after
        >>> graph_after([{"graph_after": "op"}]), graph_after([{}]), graph_after([{"graph_after": "op"}, {}])
        ('op', 'self', 'op and self')
    """
    return " and ".join(sorted({r.get("graph_after") or "self" for r in rows}))


def _num(v):
    if v in ("", None):
        return None
    if v in ("True", "False"):
        return v == "True"
    try:
        return float(v) if any(c in v for c in ".e") or not v.lstrip("-").isdigit() else int(v)
    except ValueError:
        return v


def _cell(r, v):
    t = r.get(f"{v}_us")
    if t is None:
        return ""
    s = f"{t:,.1f} ({r[f'{v}_x_floor']:.2f}x)"
    c = r.get(f"{v.removesuffix('_graph')}_compile_s") if v.startswith(("compile", "autotune")) else None
    return s + (f" [{c:.0f} s]" if c is not None and not v.endswith("_graph") else "")


def markdown(rows):
    """Markdown tables, one per workload group (the paper's workloads, then each model): every variant's
    median time with its ratio to the floor, [compile seconds], fuser's speedups, its rates in a graph (TFLOP/s,
    and GB/s: the bytes it must read, weights, x and y, per us), the forced fused kernel's TFLOP/s and the plans."""
    out = io.StringIO()
    groups = {}
    for r in rows:
        groups.setdefault("paper (G1-G10, S1-S8)" if r["workload"][0] in "GS" and r["workload"][1:].isdigit()
                          else r["workload"], []).append(r)
    cols = [v for v in VARIANTS if any(r.get(f"{v}_us") is not None for r in rows)]
    for name, rs in groups.items():
        first = rs[0]
        shape = "" if name.startswith("paper") else (f", d_model {first['d_model']}, d_ff {first['d_ff']}, "
                                                     f"{'gated ' if first['gated'] else ''}{first['activation']}")
        out.write(f"\n### {name}{shape}\n\n")
        head = ["workload", "M", "floor us"] + [TITLES[v] for v in cols] + [
            "fuser graph vs eager graph", "vs compile graph", "vs cuBLAS graph", "fuser TFLOP/s", "fuser GB/s",
            "fused kernel TFLOP/s", "planner's plan"]
        out.write("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n")
        for r in rs:
            sp = [r.get(f"speedup_vs_{b}") for b in ("eager_graph", "compile_graph", "cublas_graph")]
            cells = ([r["workload"], str(r["m"]), f"{r['floor_us']:,.1f} ({r['bound']})"]
                     + [_cell(r, v) for v in cols] + ["" if s is None else f"{s:.2f}x" for s in sp]
                     + ["" if r.get(k) is None else f"{r[k]:.0f}"
                        for k in ("fuser_tflops", "fuser_gbps", "fused_tflops")]
                     + [str(r["plan"]).split(":")[0]])
            out.write("| " + " | ".join(cells) + " |\n")
    return out.getvalue()


def headline(rows):
    """The README's short table: per workload the floor, eager in a graph, the best complete baseline in
    a graph (eager, torch.compile or max-autotune), fuser in a graph and the forced fused kernel, the
    cuBLAS GEMMs alone (a lower bound, not an FFN), and fuser's speedups."""
    out = io.StringIO()
    out.write("| workload | M | floor us | eager graph | best baseline graph | fuser graph | fused kernel graph | "
              "cuBLAS GEMMs alone | fuser vs eager graph | fuser vs best |\n|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        graphed = {b: r.get(f"{b}_us") for b in ("eager_graph", "compile_graph", "autotune_graph")
                   if r.get(f"{b}_us") is not None}
        if not graphed or r.get("fuser_graph_us") is None:
            continue
        best = min(graphed, key=graphed.get)
        fg = r["fuser_graph_us"]
        out.write(f"| {r['workload']} | {r['m']} | {r['floor_us']:,.1f} | {r.get('eager_graph_us') or 0:,.1f} | "
                  f"{graphed[best]:,.1f} ({TITLES[best].removesuffix(' graph')}) | {fg:,.1f} | "
                  f"{r.get('fused_graph_us') or 0:,.1f} | {r.get('cublas_graph_us') or 0:,.1f} | "
                  f"{(r.get('eager_graph_us') or 0) / fg:.2f}x | {graphed[best] / fg:.2f}x |\n")
    return out.getvalue()


def plot(rows, path):
    """A PNG of fuser's speedup (graphed) over the graphed baselines, and the forced fused kernel's over
    eager graph, against tokens, one panel per model shape. Needs matplotlib (``pip install
    matplotlib``); raises ImportError saying so otherwise."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.lines
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("fuser bench: the plot needs matplotlib (pip install matplotlib); the CSV and "
                          "tables are written without it") from e
    models = [n for n in dict.fromkeys(r["workload"] for r in rows) if not (n[0] in "GS" and n[1:].isdigit())]
    paper = [r for r in rows if r["workload"] not in models]
    panels = len(models) + (1 if paper else 0)
    cols = min(3, max(panels, 1))
    grid_rows = -(-panels // cols)
    fig, axes = plt.subplots(grid_rows, cols, figsize=(5 * cols, 3.6 * grid_rows), squeeze=False)
    lines = [("fuser_graph", "eager_graph", "fuser vs eager graph"),
             ("fuser_graph", "compile_graph", "fuser vs compile graph"),
             ("fuser_graph", "cublas_graph", "fuser vs cuBLAS GEMMs"),
             ("fused_graph", "eager_graph", "fused kernel vs eager graph")]
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red")     # one per line, in every panel

    def ratio(r, other, mine):
        return r[f"{other}_us"] / r[f"{mine}_us"] if r.get(f"{other}_us") and r.get(f"{mine}_us") else None

    for ax, name in zip(axes.flat, models):
        rs = sorted((r for r in rows if r["workload"] == name), key=lambda r: r["m"])
        for (mine, other, label), color in zip(lines, colors):
            pts = [(r["m"], ratio(r, other, mine)) for r in rs if ratio(r, other, mine) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label, color=color)
        ax.set_xscale("log", base=2)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_title(name)
        ax.set_xlabel("tokens (M)")
        ax.set_ylabel("speedup (x)")
    if paper:
        ax = axes.flat[len(models)]
        names = [r["workload"] for r in paper]
        for k, (mine, other, label) in enumerate(lines):
            vals = [ratio(r, other, mine) or 0 for r in paper]
            ax.bar([i + 0.2 * k for i in range(len(names))], vals, width=0.2, label=label, color=colors[k])
        ax.set_xticks([i + 0.3 for i in range(len(names))], names, rotation=90)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_title("paper workloads, M=128")
    for ax in list(axes.flat)[panels:]:
        ax.axis("off")
    handles = [matplotlib.lines.Line2D([], [], color=c, marker="o", label=lb) for (_, _, lb), c in zip(lines, colors)]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _gpu_bound(row, variant, factor):
    """Is `variant`'s time in this row the GPU's? Graph variants always; a per-call one when it is within
    `factor` of the same code in a graph (beyond that the host's submission time is being measured, and
    the shared host's speed drifts ~1.7x between runs)."""
    if factor is None or variant.endswith("_graph"):
        return True
    per, graph = row.get(f"{variant}_us"), row.get(f"{variant}_graph_us")
    return bool(per and graph and per <= factor * graph)


def compare(a, b, min_us=50.0, gpu_bound=None):
    """Run-to-run agreement of two result sets (rows of the same workloads): for every workload whose
    fuser graph time is above `min_us` in both, the relative difference of each speedup ratio. With
    ``gpu_bound`` (e.g. 1.1), per-call ratios count only where both variants are GPU-bound in both runs
    (see ``_gpu_bound``). Returns (rows of (workload, m, ratio name, a, b, |a - b| / b), summary
    dict(n, median, max, over_5pct))."""
    keyed = {(r["workload"], r["m"]): r for r in b}
    out = []
    for ra in a:
        rb = keyed.get((ra["workload"], ra["m"]))
        if rb is None or not ra.get("fuser_graph_us") or not rb.get("fuser_graph_us"):
            continue
        if min(ra["fuser_graph_us"], rb["fuser_graph_us"]) <= min_us:
            continue
        for base in BASELINES:
            k = f"speedup_vs_{base}"
            mine = "fuser_graph" if base.endswith("_graph") else "fuser"
            if not all(_gpu_bound(r, v, gpu_bound) for r in (ra, rb) for v in (base, mine)):
                continue
            if ra.get(k) and rb.get(k):
                out.append((ra["workload"], ra["m"], k, ra[k], rb[k], abs(ra[k] - rb[k]) / rb[k]))
    d = sorted(x[-1] for x in out)
    summary = dict(n=len(d), median=d[len(d) // 2] if d else None, max=d[-1] if d else None,
                   over_5pct=sum(x > 0.05 for x in d))
    return out, summary
