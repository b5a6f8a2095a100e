"""The side-by-side FFN benchmark: ``python -m fuser bench`` and ``benchmarks/ffn.py``.

For each workload, in one process, fuser and the baselines run interleaved (one call of each variant
per round, each round in its own seeded random order, so that no variant always follows the same one:
``fuser.tools.timing.time_interleaved``), each call bracketed by CUDA events, after warm-up; the result
is the median over rounds. Every call takes the next of several input and weight sets, so the 60 MB L2 holds
nobody's weights from the previous call. The roofline floor uses a matmul rate and a copy bandwidth
measured in the same run, and the SM clock is read (NVML) around every workload.

Variants (``VARIANTS``; "graph": L calls captured in one CUDA graph, timed per replay / L):

  eager            PyTorch eager (F.linear, activation, [gate product], F.linear)
  eager_graph      the same, in a CUDA graph
  compile          torch.compile default mode (the paper's PyTorch baseline); compile time reported
  compile_graph    that, in a CUDA graph
  autotune         torch.compile mode="max-autotune-no-cudagraphs" (GEMM autotuning: slow to compile,
                   so by default only on a subset, see ``AUTOTUNE_SUBSET``)
  autotune_graph   that, in a CUDA graph
  cublas_graph     the GEMMs alone (x @ W1 with gate and up merged, p @ W2): the unfused lower bound
  fuser            fuser.ffn as a user calls it (the planner's choice: fused kernel or PyTorch eager; every
                   set holds gate and up in one allocation, as ``fuser.optimize`` leaves a gated FFN's
                   weights on a GPU, so the eager route runs them as one GEMM)
  fuser_graph      that, in a CUDA graph
  fusedffn         the same FFN as the module ``fuser.optimize`` swaps in (``FusedFFN``), called per
                   call: it keeps its input shape's route, so a call costs no validation
  fused_graph      the best fused plan, forced, in a CUDA graph: fuser's kernel itself
  eager_seq        eager called S times back to back between the events, timed per call: what a call costs
                   in a running model outside graphs, where nothing waits for each call (the per-call
                   variants above time one call from an idle GPU: its host time, the events' and the wait)
  compile_seq      torch.compile (default mode) the same way
  fusedffn_seq     FusedFFN the same way

Each call of a graphed variant follows a PyTorch copy that writes its input, as a model's FFN follows the norm
that writes its input; the copies alone are timed in the same interleaving (``graph_op_us``) and taken off, so a
graphed time is the call's own. Back to back (``graph_after="self"``, ``fuser bench --graph-after self``) a fused
call would follow its own kernel and start during that kernel's last blocks (programmatic dependent launch), which
no FFN in a model does: 0.7-3.4 us of a call on an H100 (``benchmarks/graph_calls.py --after-op``).

Speedups compare like with like: ``fuser`` against the per-call baselines, ``fuser_graph`` against the
graphed ones.
"""
from __future__ import annotations

import ctypes
import dataclasses
import math
import statistics
import os
import tempfile
import time
import types

import torch
from torch import nn

import fuser
from fuser import interop, runtime
from fuser.module import FusedFFN
from fuser.ffn_spec import FFNSpec, WeightRef
from fuser.reference import ACTIVATIONS, eager
from fuser.tools import targets
from fuser.tools.timing import graphed, hopper_reason, median_event_us, time_interleaved
from fuser.tools.workloads import MODELS, PAPER

__all__ = ["VARIANTS", "BASELINES", "SEQUENCES", "Workload", "Result", "Sets", "parse_workload", "workload_set",
           "measure_ceilings", "run", "host_costs", "Clocks", "graph_calls", "seq_calls", "back_to_back",
           "GRAPH_AFTER", "after_op", "own_graph_times"]

VARIANTS = ("eager", "eager_graph", "compile", "compile_graph", "autotune", "autotune_graph", "cublas_graph",
            "fuser", "fuser_graph", "fused_graph", "fusedffn", "eager_seq", "compile_seq", "fusedffn_seq")
BASELINES = VARIANTS[:7]
#: The back-to-back variants: each times S calls of the per-call variant it names.
SEQUENCES = {"eager_seq": "eager", "compile_seq": "compile", "fusedffn_seq": "fusedffn"}
#: Token counts of the model sweep.
BENCH_TOKENS = (1, 16, 128, 512, 2048, 8192)
#: Where max-autotune runs unless asked for everywhere: the model shapes at these token counts.
AUTOTUNE_SUBSET = (16, 128, 2048)
L2_BYTES = 60 << 20
#: A call shorter than this is captured L times per graph, cycling through the rotating sets.
GRAPH_SHORT_US = 500.0
#: ...and this many times: each replay is timed from a start event the GPU reaches before the host has
#: submitted the graph, so every replay carries the graph's launch once and each call 1/L of it (3-10 us per
#: replay on an H100: ``benchmarks/graph_calls.py`` times graphs of 1, 4 and 16 calls side by side).
#: In a model's graph the launch is spread over every layer's kernels, so a call's time here is its share.
GRAPH_MIN_CALLS = 16
GRAPH_MAX_CALLS = 64
#: What a graphed call follows: "op", a copy writing its input (timed alone and taken off), or "self", the
#: graph's previous call.
GRAPH_AFTER = ("op", "self")
#: A back-to-back sequence lasts about this long (the events and the final wait, tens of us on a slow host,
#: then cost a few percent of it) and holds SEQ_MIN_CALLS to SEQ_MAX_CALLS calls.
SEQ_US = 2000.0
SEQ_MIN_CALLS, SEQ_MAX_CALLS = 2, 64


def seq_calls(probe_us):
    """Calls per back-to-back sequence for a call whose eager probe took `probe_us`.

    Example:
        >>> from fuser.tools.bench import seq_calls
        >>> seq_calls(100.0), seq_calls(10.0), seq_calls(5000.0)
        (20, 64, 2)
    """
    return max(SEQ_MIN_CALLS, min(SEQ_MAX_CALLS, int(SEQ_US // max(probe_us, 1.0))))


def back_to_back(fn, calls):
    """(a function making `calls` calls of fn one after the other, calls): one sample of a sequence timed
    per call by ``time_interleaved``.

    Example:
        >>> from fuser.tools.bench import back_to_back
        >>> seen = []
        >>> f, n = back_to_back(lambda: seen.append(1), 3)
        >>> f(); (len(seen), n)
        (3, 3)
    """
    def run():
        for _ in range(calls):
            fn()
    return run, calls


def graph_calls(probe_us, min_calls=GRAPH_MIN_CALLS):
    """Calls per CUDA graph for a call whose eager probe took `probe_us` (CUDA events around one call made
    from Python): enough to fill GRAPH_SHORT_US (at most GRAPH_MAX_CALLS) and at least `min_calls`; one for
    a call of GRAPH_SHORT_US or more, whose graph's launch is then under ~1% of it. The calls take the
    rotating sets in turn, so a graph of more calls than sets still reads each set after the others have
    passed through the L2 (``Sets``: together they are 4x the L2, or one set is).

    Example:
        >>> from fuser.tools.bench import graph_calls
        >>> graph_calls(60.0), graph_calls(20.0), graph_calls(2.0), graph_calls(300.0), graph_calls(900.0)
        (16, 25, 64, 16, 1)
        >>> graph_calls(60.0, min_calls=4), graph_calls(300.0, min_calls=1)
        (8, 1)
    """
    if min_calls < 1:
        raise ValueError(f"graph_calls: min_calls must be at least 1, got {min_calls}")
    if probe_us >= GRAPH_SHORT_US:
        return 1
    return max(min_calls, min(GRAPH_MAX_CALLS, int(GRAPH_SHORT_US // max(probe_us, 1.0))))


@dataclasses.dataclass(frozen=True)
class Workload:
    """One FFN shape: ``name`` (a paper workload, a model, or "custom"), tokens ``m``, widths, gating and
    activation. bfloat16 throughout."""
    name: str
    m: int
    d_model: int
    d_ff: int
    d_out: int
    gated: bool
    activation: str

    @property
    def label(self):
        return f"{self.name} M={self.m}"

    @property
    def flops(self):
        return 2 * self.m * self.d_ff * (self.d_model * (2 if self.gated else 1) + self.d_out)

    @property
    def min_bytes(self):
        """Every weight, x and y once, in bfloat16."""
        weights = self.d_ff * (self.d_model * (2 if self.gated else 1) + self.d_out)
        return 2 * (weights + self.m * (self.d_model + self.d_out))

    def floor_us(self, tflops, tbps):
        """(the roofline floor in microseconds, "C" or "M" for the bound) at these rates."""
        c, m = self.flops / (tflops * 1e6), self.min_bytes / (tbps * 1e6)
        return (c, "C") if c >= m else (m, "M")


def parse_workload(text):
    """A workload from the command line: ``G3`` or ``S1`` (the paper's, 128 tokens, or ``S1:512``), ``NAME:M``
    with a model of ``fuser.tools.workloads.MODELS``, or ``D_MODELxD_FF:ACT[-gated]:M`` for any shape.

    Example:
        >>> from fuser.tools.bench import parse_workload
        >>> parse_workload("llama3-8b:16")
        Workload(name='llama3-8b', m=16, d_model=4096, d_ff=14336, d_out=4096, gated=True, activation='silu')
        >>> parse_workload("1024x4096:gelu:64").d_ff
        4096
    """
    parts = text.split(":")
    try:
        if parts[0] in PAPER and len(parts) <= 2:
            w = dict(PAPER[parts[0]])
            m = int(parts[1]) if len(parts) == 2 else w.pop("m")
            w.pop("m", None)
            return Workload(parts[0], m, **w)
        if parts[0] in MODELS and len(parts) == 2:
            return Workload(parts[0], int(parts[1]), **MODELS[parts[0]])
        if len(parts) == 3 and "x" in parts[0]:
            d, f = (int(v) for v in parts[0].split("x"))
            act, _, gated = parts[1].partition("-")
            if act in ("relu", "gelu", "gelu_tanh", "silu") and gated in ("", "gated"):
                return Workload("custom", int(parts[2]), d, f, d, gated == "gated", act)
    except ValueError:
        pass
    raise ValueError(f"workload {text!r}: expected a paper workload (G1-G10, S1-S8, optionally :TOKENS), "
                     f"NAME:TOKENS with NAME one of {', '.join(MODELS)}, or DxF:ACT[-gated]:TOKENS "
                     "(ACT relu, gelu, gelu_tanh or silu), e.g. 4096x14336:silu-gated:128")


def workload_set(name):
    """``paper`` (G1-G10, S1-S8 at 128 tokens), ``models`` (the H200 baselines' models at
    ``BENCH_TOKENS``), ``all`` (both), ``targets`` (every workload the issues' speed targets name:
    ``fuser.tools.targets.WORKLOADS``) or ``quick`` (a few, for a smoke run).

    Example:
        >>> from fuser.tools.bench import workload_set
        >>> len(workload_set("paper")), len(workload_set("models")), len(workload_set("all"))
        (18, 36, 54)
        >>> len(workload_set("targets"))
        39
    """
    if name == "paper":
        return [parse_workload(n) for n in PAPER]
    if name == "models":
        return [parse_workload(f"{n}:{m}") for n in MODELS for m in BENCH_TOKENS]
    if name == "all":
        return workload_set("paper") + workload_set("models")
    if name == "targets":
        return [parse_workload(t) for t in targets.WORKLOADS]
    if name == "quick":
        return [parse_workload(t) for t in ("G4", "S8", "gpt2:128", "llama3-8b:16", "llama3-8b:2048")]
    raise ValueError(f"workload set {name!r}: expected paper, models, all, targets or quick")


class Clocks:
    """The GPU's SM clock (MHz), clock-event reasons and power draw (W), read through NVML (libnvidia-ml)
    with ctypes; ``read()`` gives Nones where NVML is missing. Reading never changes a setting."""

    def __init__(self, index=0):
        self._nvml, self._dev = None, ctypes.c_void_p()
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() == 0 and lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self._dev)) == 0:
                self._nvml = lib
        except OSError:
            pass

    def read(self):
        """dict(sm_mhz, reasons, watts), each None where unavailable. ``reasons`` is NVML's bit mask
        (0x4: software power cap, 0x1: idle)."""
        if self._nvml is None:
            return dict(sm_mhz=None, reasons=None, watts=None)
        clk, reasons, mw = ctypes.c_uint(), ctypes.c_ulonglong(), ctypes.c_uint()
        ok_clk = self._nvml.nvmlDeviceGetClockInfo(self._dev, 1, ctypes.byref(clk)) == 0   # 1: NVML_CLOCK_SM
        ok_r = self._nvml.nvmlDeviceGetCurrentClocksEventReasons(self._dev, ctypes.byref(reasons)) == 0
        ok_p = self._nvml.nvmlDeviceGetPowerUsage(self._dev, ctypes.byref(mw)) == 0
        return dict(sm_mhz=clk.value if ok_clk else None, reasons=reasons.value if ok_r else None,
                    watts=mw.value / 1000 if ok_p else None)


def measure_ceilings(reps=15):
    """The rates the floor uses, measured now: dict(matmul_tflops: bf16 8192^3 torch.matmul,
    copy_tbps: device-to-device copy of 1 GiB, bytes read + written).

    Example:
        >>> from fuser.tools import bench
        >>> c = bench.measure_ceilings()  # doctest: +SKIP
        >>> 300 < c["matmul_tflops"] < 1200 and 2 < c["copy_tbps"] < 6  # doctest: +SKIP
        True
    """
    a = torch.randn(8192, 8192, device="cuda").bfloat16()
    b = torch.randn(8192, 8192, device="cuda").bfloat16()
    src = torch.empty(1 << 29, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    for _ in range(3):
        a @ b
        dst.copy_(src)
    # four calls between the events: a lone call's time would include the host's submission latency
    # (the GPU idles between the first event and the kernel), 1-2% on these ~0.5-1.5 ms kernels
    mm_us = median_event_us(lambda: [a @ b for _ in range(4)], reps, per=4)
    cp_us = median_event_us(lambda: [dst.copy_(src) for _ in range(4)], reps, per=4)
    return dict(matmul_tflops=2 * 8192 ** 3 / (mm_us * 1e6), copy_tbps=2 * (1 << 30) / (cp_us * 1e6))


@dataclasses.dataclass
class Result:
    """One workload's measurements: ``times`` (variant -> median us, None where not run), ``compile_s``
    (variant -> first-call seconds), the floor, the plans, and the clocks seen."""
    workload: Workload
    floor_us: float
    bound: str
    times: dict
    compile_s: dict
    plan: str               # the planner's choice, one line
    planner_fuses: bool
    fused_plan: str         # the forced fused plan timed as fused_graph
    fused_predicted_us: float
    clocks: dict
    sets: int
    reps: int
    notes: list = dataclasses.field(default_factory=list)
    graph_calls: int = 1    # calls per CUDA graph of the graphed variants
    graph_after: str = "self"   # what each graphed call follows (GRAPH_AFTER)
    graph_op_us: float = None   # "op": the copy alone per call, taken off every graphed time

    def speedup(self, baseline):
        """baseline's time over fuser's in the same mode (graphed against fuser_graph), or None."""
        mine = self.times.get("fuser_graph" if baseline.endswith("_graph") else "fuser")
        other = self.times.get(baseline)
        return other / mine if mine and other else None

    def row(self):
        """A flat dict (the CSV row)."""
        w = self.workload
        r = dict(workload=w.name, m=w.m, d_model=w.d_model, d_ff=w.d_ff, d_out=w.d_out, gated=w.gated,
                 activation=w.activation, floor_us=round(self.floor_us, 2), bound=self.bound)
        for v in VARIANTS:
            t = self.times.get(v)
            r[f"{v}_us"] = None if t is None else round(t, 2)
        for v in VARIANTS:
            t = self.times.get(v)
            r[f"{v}_x_floor"] = None if t is None else round(t / self.floor_us, 3)
        for b in BASELINES:
            s = self.speedup(b)
            r[f"speedup_vs_{b}"] = None if s is None else round(s, 3)
        t = self.times.get("fuser_graph")
        r["fuser_tflops"] = round(w.flops / (t * 1e6), 1) if t else None
        r["fuser_gbps"] = round(w.min_bytes / (t * 1e3), 1) if t else None
        t = self.times.get("fused_graph")
        r["fused_tflops"] = round(w.flops / (t * 1e6), 1) if t else None
        for v in ("compile", "autotune"):
            r[f"{v}_compile_s"] = None if self.compile_s.get(v) is None else round(self.compile_s[v], 1)
        r.update(plan=self.plan, planner_fuses=self.planner_fuses, fused_plan=self.fused_plan,
                 fused_predicted_us=round(self.fused_predicted_us, 2), sets=self.sets, reps=self.reps,
                 graph_calls=self.graph_calls, graph_after=self.graph_after,
                 graph_op_us=None if self.graph_op_us is None else round(self.graph_op_us, 2),
                 sm_mhz_min=self.clocks.get("sm_mhz_min"), sm_mhz_max=self.clocks.get("sm_mhz_max"),
                 clock_reasons=self.clocks.get("reasons"), notes="; ".join(self.notes))
        return r


# ---- the variants of one workload ---------------------------------------------------------------------

class Sets:
    """Rotating input and weight sets for one workload (enough that the L2 cannot hold the next call's
    weights; one where a set alone is 4x L2 or more), and a ``turn()`` that hands out the next one. Each set
    keeps its input twice: "x", what the variants read, and "x_src", what ``write_next_x`` copies into the next
    set's "x" (a PyTorch kernel writing a call's input just before it)."""

    def __init__(self, w, max_sets=24):
        per_set = w.min_bytes
        self.n = max(2, min(max_sets, math.ceil(4 * L2_BYTES / per_set))) if per_set < 4 * L2_BYTES else 1
        g = torch.Generator(device="cuda").manual_seed(0)
        mk = lambda *s, fan: torch.randn(*s, device="cuda", generator=g).mul_(fan ** -0.5).bfloat16()  # noqa: E731
        self.sets = []
        for _ in range(self.n):
            s = {"x": torch.randn(w.m, w.d_model, device="cuda", generator=g).bfloat16()}
            s["x_src"] = s["x"].clone()
            up = mk(w.d_ff * (2 if w.gated else 1), w.d_model, fan=w.d_model)   # [gate; up] merged, cuBLAS's
            s["w_gu"] = up
            s["w_gate"], s["w_up"] = (up[:w.d_ff], up[w.d_ff:]) if w.gated else (None, up)
            s["w_down"] = mk(w.d_out, w.d_ff, fan=w.d_ff)
            s["p"] = torch.randn(w.m, w.d_ff, device="cuda", generator=g).bfloat16()
            self.sets.append(s)
        self.i = 0

    def turn(self):
        self.i = (self.i + 1) % self.n
        return self.sets[self.i]

    def write_next_x(self):
        """Copy the input of the set ``turn()`` hands out next into place (same values); returns that set."""
        s = self.sets[(self.i + 1) % self.n]
        s["x"].copy_(s["x_src"])
        return s


def after_op(sets, f):
    """f, each call's input first written by a copy (``Sets.write_next_x``): a graphed call then follows a
    PyTorch kernel it depends on, not its own previous call.

    Example:
        >>> from fuser.tools.bench import after_op
        >>> class FakeSets:
        ...     def write_next_x(self): seen.append("copy")
        >>> seen = []
        >>> after_op(FakeSets(), lambda: seen.append("call"))(); seen
        ['copy', 'call']
    """
    def call():
        sets.write_next_x()
        return f()
    return call


def own_graph_times(timed):
    """(the times with the copies' time taken off each graphed variant's, the copies' time or None): `timed`
    maps variants to their measured times per call, "graph_op" to the copies alone (``after_op``).

    Example:
        >>> from fuser.tools.bench import own_graph_times
        >>> own_graph_times({"eager": 50.0, "eager_graph": 12.0, "fuser_graph": 9.5, "graph_op": 1.5})
        ({'eager': 50.0, 'eager_graph': 10.5, 'fuser_graph': 8.0}, 1.5)
        >>> own_graph_times({"eager_graph": 12.0})
        ({'eager_graph': 12.0}, None)
    """
    timed = dict(timed)
    op = timed.pop("graph_op", None)
    if op is not None:
        timed = {k: t - op if k.endswith("_graph") else t for k, t in timed.items()}
    return timed, op


def _eager_fn(activation):
    act = ACTIVATIONS[activation]

    def ffn(x, w_gate, w_up, w_down):
        return eager(x, w_up, w_down, w_gate, None, None, None, act)
    return ffn


def _module_of(w, s):
    """A ``FusedFFN`` over one set's tensors (no copy): a gate/up linear holding [gate; up] and a down
    linear, as fuser.optimize would leave a gated or plain FFN."""
    gu, down = nn.Linear(1, 1, bias=False), nn.Linear(1, 1, bias=False)
    gu.weight = nn.Parameter(s["w_gu"], requires_grad=False)
    down.weight = nn.Parameter(s["w_down"], requires_grad=False)
    f = w.d_ff
    up = WeightRef("gate_up", "weight", (f, 2 * f) if w.gated else None)
    gate = WeightRef("gate_up", "weight", (0, f)) if w.gated else None
    spec = FFNSpec("bench", w.activation, w.d_model, f, w.d_out, up, WeightRef("down", "weight"), gate)
    with torch.no_grad():
        return FusedFFN(spec, {"gate_up": gu, "down": down}).eval()


def _variants(w, sets, want, autotune, log, min_graph_calls=GRAPH_MIN_CALLS, graph_after="op"):
    """name -> (function, calls per invocation), compile seconds, the plans, notes. With `graph_after` "op"
    every graphed call follows a copy writing its input, and "graph_op" is the copies alone."""
    eager_ops = _eager_fn(w.activation)
    compile_s, notes = {}, []

    def per_call(f):
        def call():
            s = sets.turn()
            return f(s["x"], s["w_gate"], s["w_up"], s["w_down"])
        return call

    fns = {"eager": per_call(eager_ops)}
    torch._dynamo.reset()       # each workload compiles from scratch (compile times are cold)
    for v, mode in (("compile", "default"), ("autotune", "max-autotune-no-cudagraphs")):
        if (v not in want and f"{v}_seq" not in want) or (v == "autotune" and not autotune):
            continue
        # a code object of its own: dynamo caches compiled code per code object, and the two modes must
        # not evict or reuse each other's
        own = types.FunctionType(eager_ops.__code__.replace(co_name=f"ffn_{v}"), eager_ops.__globals__,
                                 f"ffn_{v}", eager_ops.__defaults__, eager_ops.__closure__)
        cf = torch.compile(own, mode=mode, dynamic=False, fullgraph=True)
        t0 = time.perf_counter()
        s = sets.sets[0]
        cf(s["x"], s["w_gate"], s["w_up"], s["w_down"])
        torch.cuda.synchronize()
        compile_s[v] = time.perf_counter() - t0
        fns[v] = per_call(cf)

    def cublas():
        s = sets.turn()
        torch.mm(s["x"], s["w_gu"].t())
        torch.mm(s["p"], s["w_down"].t())

    plan = fuser.plan(w.m, w.d_model, w.d_ff, d_out=w.d_out, gated=w.gated, activation=w.activation)
    fplan = plan if plan.fused else fuser.plan(w.m, w.d_model, w.d_ff, d_out=w.d_out, gated=w.gated,
                                                activation=w.activation, fused=True)

    def user(p=None):
        def call():
            s = sets.turn()
            return fuser.ffn(s["x"], s["w_up"], s["w_down"], w_gate=s["w_gate"], activation=w.activation, plan=p)
        return call

    fns["fuser"] = user()
    if "fusedffn" in want or "fusedffn_seq" in want:
        mods = [_module_of(w, s) for s in sets.sets]
        for m, s in zip(mods, sets.sets):     # each module's first call routes its shape (validation and
            for _ in range(3):                # planning, not what is timed); later calls take the kept
                m(s["x"])                     # route

        def module():
            sets.turn()
            return mods[sets.i](sets.sets[sets.i]["x"])
        fns["fusedffn"] = module
    graph_of = {"eager_graph": fns["eager"], "compile_graph": fns.get("compile"),
                "autotune_graph": fns.get("autotune"), "cublas_graph": cublas, "fuser_graph": fns["fuser"],
                "fused_graph": user(fplan)}
    out = {k: (f, 1) for k, f in fns.items() if k in want}   # (a sequence's own variant may be left out)
    probe = median_event_us(fns["eager"], 3)
    for k, v in SEQUENCES.items():
        if k in want and v in fns:
            out[k] = back_to_back(fns[v], seq_calls(probe))
    calls = graph_calls(probe, min_graph_calls)
    # NOTE: the first graph captured in a process runs slower than later captures of the same ops
    # (state set up by the first capture, such as cuBLAS's workspace for the capture stream): a
    # throwaway capture first puts every timed graph in the same conditions (benchmarks/RESULTS.md)
    wrap = (lambda f: after_op(sets, f)) if graph_after == "op" else (lambda f: f)
    graphed(wrap(fns["eager"]), calls)
    if graph_after == "op" and any(k in want and f is not None for k, f in graph_of.items()):
        out["graph_op"] = graphed(after_op(sets, sets.turn), calls)   # the copies alone
    for k, f in graph_of.items():
        if k not in want or f is None:
            continue
        try:
            out[k] = graphed(wrap(f), calls)
        except Exception as e:  # noqa: BLE001 (a baseline that cannot be captured is reported, not fatal)
            notes.append(f"{k}: capture failed ({type(e).__name__}: {str(e).splitlines()[0][:80]})")
            log(f"  {k}: capture failed: {e}")
    return out, compile_s, plan, fplan, notes


def run(workloads, *, variants=VARIANTS, autotune="subset", reps=None, log=print, ceilings=None,
        on_result=None, budget_s=None, min_graph_calls=GRAPH_MIN_CALLS, graph_after="op"):
    """Time every workload; returns (results, meta). ``autotune``: "subset" (models at
    ``AUTOTUNE_SUBSET`` tokens), "all" or "none". ``reps``: rounds per workload (default: enough for
    ~0.4 s of timing, 15 to 60). ``on_result(result)`` is called as each workload finishes (write it out:
    a run cut short keeps what it measured). With ``budget_s``, workloads that start that many seconds
    or more into the run skip the torch.compile variants (noted in the result; 0: every workload).
    ``min_graph_calls``: the fewest calls a graphed variant's graph holds (``graph_calls``). ``graph_after``:
    what each graphed call follows, "op" (a copy writing its input, timed alone and taken off) or "self"
    (``GRAPH_AFTER``; the module docstring).

    Example:
        >>> from fuser.tools.bench import parse_workload, run
        >>> results, meta = run([parse_workload("G4")], autotune="none", reps=5)  # doctest: +SKIP
        >>> r = results[0]; r.times["fuser_graph"] > 0 and r.speedup("eager_graph") > 0  # doctest: +SKIP
        True
    """
    if graph_after not in GRAPH_AFTER:
        raise ValueError(f"run: graph_after must be one of {GRAPH_AFTER}, got {graph_after!r}")
    why = hopper_reason()
    if why is not None:
        raise RuntimeError(f"fuser bench times kernels on a Hopper GPU: {why}")
    t_start = time.perf_counter()
    clocks = Clocks(torch.cuda.current_device())
    ceil = ceilings or measure_ceilings()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, **ceil, clocks_before=clocks.read())
    log(f"ceilings: bf16 matmul {ceil['matmul_tflops']:.1f} TFLOP/s, copy {ceil['copy_tbps']:.3f} TB/s")
    results = []
    for w in workloads:
        t0 = time.perf_counter()
        want = set(variants)
        over = budget_s is not None and t0 - t_start >= budget_s
        if over:
            want -= {"compile", "compile_graph", "compile_seq", "autotune", "autotune_graph"}
        tune = autotune == "all" or (autotune == "subset" and w.name in MODELS and w.m in AUTOTUNE_SUBSET)
        sets = Sets(w)
        c0 = clocks.read()
        fns, compile_s, plan, fplan, notes = _variants(w, sets, want, tune, log, min_graph_calls, graph_after)
        if over:
            notes.append("torch.compile variants skipped: past the time budget")
        names = list(fns)
        for f, _ in fns.values():      # warm-up, interleaved
            f()
        probe = sum(median_event_us(f, 1, per) for f, per in fns.values())
        # at least 15 rounds: per-call times move with the host, and medians of fewer moved by >5% run to run
        n = reps or max(15, min(60, int(4e5 / max(probe, 1.0))))
        mhz = [c0["sm_mhz"]]
        times = time_interleaved(list(fns.values()), n, warmup=0, seed=w.label,
                                 on_round=lambda: mhz.append(clocks.read()["sm_mhz"]))
        c1 = clocks.read()
        floor, bound = w.floor_us(ceil["matmul_tflops"], ceil["copy_tbps"])
        seen = [v for v in mhz if v is not None]
        timed, op = own_graph_times(dict(zip(names, times)))
        r = Result(w, floor, bound, timed, compile_s,
                   plan.summary(), plan.fused, fplan.summary(), fplan.predicted_us,
                   dict(sm_mhz_min=min(seen) if seen else None, sm_mhz_max=max(seen) if seen else None,
                        reasons=c1["reasons"]), sets.n, n, notes,
                   graph_calls=next((c for k, (_f, c) in fns.items() if k.endswith("_graph")), 1),
                   graph_after=graph_after, graph_op_us=op)
        results.append(r)
        log(f"{w.label:18s} floor {floor:9.1f} us  " + "  ".join(
            f"{k} {r.times[k]:.1f}" for k in r.times) + (f"  (graphed: the copy before each, {op:.2f} us, "
                                                        f"taken off)" if op is not None else "")
            + f"  [{time.perf_counter() - t0:.1f} s]")
        if on_result:
            on_result(r)
        del fns, sets
        torch.cuda.empty_cache()
    meta["clocks_after"] = clocks.read()
    meta["seconds"] = time.perf_counter() - t_start
    return results, meta


def host_costs(workload=None, calls=300):
    """Host-side costs of fuser on this machine, for the results table: dict(
    jit_s: first compile of a fused kernel with an empty kernel cache (NVRTC),
    cache_load_s: the same compile answered from the disk cache (a new process's first call),
    module_load_ms: loading that CUBIN onto the GPU (cuModuleLoadData and attributes),
    call_us: fuser.ffn's host time per call outside graphs with the plan given, so validated at every
    call (launches queued behind a GPU sleep, so the loop is host time alone), bare_launch_us: the same
    for the bare launch of the kernel). ``benchmarks/host_overhead.py`` times every entry point.

    Example:
        >>> from fuser.tools import bench
        >>> h = bench.host_costs()  # doctest: +SKIP
        >>> h["jit_s"] > h["cache_load_s"]  # doctest: +SKIP
        True
    """
    w = workload or parse_workload("llama3-8b:16")
    plan = fuser.plan(w.m, w.d_model, w.d_ff, d_out=w.d_out, gated=w.gated, activation=w.activation, fused=True)
    old = os.environ.get("FUSER_CACHE_DIR")
    with tempfile.TemporaryDirectory() as d:
        os.environ["FUSER_CACHE_DIR"] = d
        try:
            t0 = time.perf_counter()
            k = fuser.compile(plan)
            t1 = time.perf_counter()
            fuser.compile(plan)
            t2 = time.perf_counter()
        finally:
            if old is None:
                del os.environ["FUSER_CACHE_DIR"]
            else:
                os.environ["FUSER_CACHE_DIR"] = old
    dev = torch.cuda.current_device()
    t3 = time.perf_counter()
    runtime.load_module(k, dev)
    t4 = time.perf_counter()
    s = Sets(w, max_sets=1).sets[0]
    y = torch.empty(w.m, w.d_out, device="cuda", dtype=torch.bfloat16)
    call = lambda: fuser.ffn(s["x"], s["w_up"], s["w_down"], w_gate=s["w_gate"], activation=w.activation,  # noqa: E731
                             plan=plan)
    call()
    launch = runtime.launch_for(plan, dev)
    stream = interop.raw_stream(dev)
    scratch = launch.scratch(w.m, stream)
    cap = interop.export

    def bare():
        launch(cap(s["x"]), (cap(s["w_up"]), cap(s["w_down"]), cap(s["w_gate"]), None, None, None), w.activation,
               cap(y), scratch, stream)
    res = {}
    for name, fn in (("bare_launch_us", bare), ("call_us", call)):
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(7):
            torch.cuda._sleep(200_000_000)     # ~0.1 s: the loop below only enqueues
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            ts.append((time.perf_counter() - t) / calls * 1e6)
            torch.cuda.synchronize()
        res[name] = statistics.median(ts)
    return dict(jit_s=t1 - t0, cache_load_s=t2 - t1, module_load_ms=(t4 - t3) * 1e3, **res,
                workload=w.label)
