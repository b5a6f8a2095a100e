"""Host time fuser adds per FFN call outside CUDA graphs, against what the call would cost without it.

Every variant runs `--calls` times back to back, timed with the CPU clock; variants are interleaved
(one loop of each per round, each round in its own seeded order). On a CUDA GPU each loop starts behind
a GPU sleep longer than the loop, so the launches only queue up and the loop's time is host time alone,
whatever the kernels' length.

Two statistics per variant. The median over rounds of its loop's time (the raw per-call host time,
printed and kept in the JSON). And the overhead the targets judge: the median over rounds of the
paired difference, the variant's loop minus the baseline's loop of the same round (the ops on the
eager route, the bare launch on the fused one). The machines these targets are met on drift: the GPU
machine's host time moves 20-30% between rounds (clock changes, other tenants), which at ~10-20 us a
call is 2-6 us, more than the 2 us target itself; a difference of two medians taken over different
rounds carries that drift, a difference within one round (loops a few ms apart) mostly cancels it.

Eager route (bfloat16 shapes where the planner picks the PyTorch ops; on a machine without a GPU, small
float32 FFNs on CPU tensors):

  ops              the PyTorch ops of the FFN (``fuser.reference.eager``), called directly; on a gated FFN
                   on the GPU fuser's eager route launches one kernel fewer (the gate kernel takes the
                   activation and the product), so a plain FFN (gpt3-6.7b:2048) shows the routes' own cost
  fuser.ffn        the functional call                         target: at most 2 us over ops
  FusedFFN         an optimized module (after its first call)  target: at most 2 us over ops
  module           the original module, in PyTorch eager (context: its own container overhead)
  ops, again       the same ops in a second loop of each round: its paired difference from the ops is what
                   the measurement reads where there is nothing to read (its noise at that shape), printed
                   beside the verdicts

Fused route (a Hopper GPU; one tiny FFN whose fused plan ``fuser.tune`` is made to store, so that
``fuser.ffn`` and ``FusedFFN`` pick it as they would any tuned plan):

  bare launch      ``_C.ffn_launch`` of the loaded kernel with freshly exported capsules: the least
                   any Python caller of the kernel pays
  FusedFFN         target: at most 6 us over bare launch
  fuser.ffn        target: at most 8 us over bare launch
  torch.ops        ``torch.ops.fuser.ffn`` through the dispatcher; target: at most 15 us over bare launch
  module           the original module, in PyTorch eager (context)

Time is the wall clock, or with ``--clock thread`` the calling thread's CPU time: on a machine shared
with other tenants the wall clock also counts the time the core was taken away, which at this
resolution is noise; the thread's CPU time counts what the calls themselves execute (the GPU only
queues launches, so the thread never waits for it).

Inference is timed under ``torch.no_grad()``; ``--grad`` times it with autograd on (a model called
outside ``no_grad``): the eager route's variants then record their backward, the fused route computes
with the eager ops (the kernel has no backward).

    python benchmarks/host_overhead.py [--set quick|models] [--rounds 15] [--calls 150] [--clock wall|thread]
                                       [--grad] [--pieces] [--json FILE]

The JSON holds each variant's median (us), under "paired" each variant's paired overhead over the
baseline (us), and under "intervals" that overhead's 95% interval (``fuser.tools.timing.median_interval``). A
verdict whose interval holds its target says so: the rounds did not decide it (run more of them).
"""
import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time

import torch
from torch import nn

import fuser
from fuser import _C, interop, runtime
from fuser.reference import ACTIVATIONS, eager
from fuser.tools.bench import parse_workload, workload_set
from fuser.tools.timing import hopper_reason, median_interval, round_orders

#: ~100 ms at the H200's clocks (more at lower clocks): the GPU sleep each loop queues behind
SLEEP_CYCLES = 200_000_000
#: GPU time a loop's calls may queue: well under the sleep, so that the loop never waits for the GPU (a
#: loop of large FFNs that outran the sleep would time the GPU, not the host)
QUEUED_GPU_US = 40_000
#: The eager-route shapes of --set quick on a GPU (a spread of sizes, plain and gated)
QUICK = ("gpt2:1", "gpt2:128", "llama3-8b:16", "llama3-8b:2048", "gpt3-6.7b:2048", "G4", "S8")
#: Without a GPU: small float32 FFNs on CPU tensors, where host time is most of a call
CPU_SHAPES = ("8x32:relu:2", "8x32:silu-gated:2", "64x256:gelu:4")
TARGETS = {"fuser.ffn": 2.0, "FusedFFN": 2.0}
#: The eager route's null variant: the ops again, whose paired difference from the ops is the noise
NULL = "ops, again"
#: --pieces: the C calls inside the eager routes, timed alone: fuser.ffn's route key (it describes x and every
#: weight), FusedFFN's check of x and the held weights (the layouts of row slices only), its whole C call
#: (checks and ops, without FusedFFN.__call__'s Python frame), and that call checking every weight's layout
#: as a kept fused launch does (what reading each weight through the exchange API costs); the eager ops as
#: fuser.ffn's route calls them (`_C.eager`: a plain chain's activation in place of the up projection's
#: result) and, on a plain chain, with a look-alike of the activation that C does not know (so it runs out of
#: place, allocating its result as the ops do): what the in-place activation saves; and fuser.ffn with out= (its
#: kept route, the down projection written into out)
PIECES = ("ffn_key", "kept_match", "kept_eager", "kept_eager_all", "_C.eager", "_C.eager, act out of place",
          "fuser.ffn, out=")
#: What a loop's time is read from (--clock)
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
FUSED_TARGETS = {"FusedFFN": 6.0, "fuser.ffn": 8.0, "torch.ops": 15.0}


class Mlp(nn.Module):
    """A plain or gated FFN of linear layers, as a model writes it (fuser.optimize recognises it)."""

    def __init__(self, d, f, activation, gated):
        super().__init__()
        self.up, self.down = nn.Linear(d, f, bias=False), nn.Linear(f, d, bias=False)
        self.gate = nn.Linear(d, f, bias=False) if gated else None
        self.act = {"relu": nn.ReLU(), "gelu": nn.GELU(), "gelu_tanh": nn.GELU(approximate="tanh"),
                    "silu": nn.SiLU()}[activation]

    def forward(self, x):
        h = self.up(x)
        return self.down(self.act(self.gate(x)) * h if self.gate is not None else self.act(h))


def loop_us(fn, calls, clock=time.perf_counter):
    """Per-call host time of `calls` back-to-back calls (microseconds) on `clock` (seconds)."""
    t0 = clock()
    for _ in range(calls):
        fn()
    return (clock() - t0) / calls * 1e6


def gpu_us(fn, n=5):
    """GPU time of one call of `fn` (CUDA events around `n` calls), microseconds."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / n


def loop_calls(calls, call_gpu_us):
    """Calls per loop: `calls`, or fewer (at least 10) where they would queue more than QUEUED_GPU_US of
    GPU time, at `call_gpu_us` each."""
    return max(10, min(calls, int(QUEUED_GPU_US / call_gpu_us)))


def measure(variants, rounds, calls, seed, base, clock=time.perf_counter):
    """Per-call host time of each variant, loops interleaved in seeded orders: (the median over rounds of
    each variant's time, name -> us; the median over rounds of each other variant's time minus `base`'s
    in the same round, name -> us; the calls per loop; the 95% interval of each such median, name -> (lo, hi),
    ``median_interval``). On a GPU the loops hold fewer than `calls` calls
    where that many would queue more than QUEUED_GPU_US of GPU time."""
    cuda = torch.cuda.is_available()
    for fn in variants.values():       # warm-up: route, compile, load, allocate scratch, fill caches
        for _ in range(5):
            fn()
    if cuda:
        torch.cuda.synchronize()
        calls = loop_calls(calls, max(gpu_us(fn) for fn in variants.values()))
    samples = {name: [] for name in variants}
    for order in round_orders(list(variants), rounds, seed):
        for name in order:
            if cuda:
                torch.cuda._sleep(SLEEP_CYCLES)   # the GPU waits; the loop below only enqueues
            samples[name].append(loop_us(variants[name], calls, clock))
            if cuda:
                torch.cuda.synchronize()
    medians = {name: statistics.median(v) for name, v in samples.items()}
    diffs = {name: [a - b for a, b in zip(v, samples[base])] for name, v in samples.items() if name != base}
    paired = {name: statistics.median(d) for name, d in diffs.items()}
    return medians, paired, calls, {name: median_interval(d) for name, d in diffs.items()}


def eager_variants(w, device, pieces=False):
    """The eager route's variants for workload `w`, or None where its calls outside CUDA graphs launch a
    fused plan (the planner's, or a host-bound route's); with `pieces`, also the C calls inside the routes,
    each alone (PIECES)."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    mlp = Mlp(w.d_model, w.d_ff, w.activation, w.gated).to(device, dtype).eval()
    x = torch.randn(w.m, w.d_model, device=device, dtype=dtype)
    wu, wd, wg = mlp.up.weight, mlp.down.weight, None if mlp.gate is None else mlp.gate.weight
    if fuser.ops.route(x, wu, wd, wg, activation=w.activation).fused:
        return None
    module = fuser.FusedFFN.from_module(mlp)
    act = ACTIVATIONS[w.activation]
    out = {
        "ops": lambda: eager(x, wu, wd, wg, None, None, None, act),
        "fuser.ffn": lambda: fuser.ffn(x, wu, wd, w_gate=wg, activation=w.activation),
        "FusedFFN": lambda: module(x),
        "module": lambda: mlp(x),
        NULL: lambda: eager(x, wu, wd, wg, None, None, None, act),
    }
    if pieces:
        module(x)   # (its first call keeps the route whose checks C reads)
        kept = module.__dict__.get("_kept")
        fast = None if kept is None else kept.fast
        out["ffn_key"] = lambda: _C.ffn_key(x, wu, wd, wg, None, None, None, w.activation)
        if fast is not None:
            d = module.__dict__
            every = fast._replace(layout=kept.weights.layout, laid=-1)
            out["kept_match"] = lambda: _C.kept_match(x, fast.signature, fast.held, fast.layout, fast.laid)
            out["kept_eager"] = lambda: _C.kept_eager(d, x, fast)
            out["kept_eager_all"] = lambda: _C.kept_eager(d, x, every)
        lin = torch.nn.functional.linear
        out["_C.eager"] = lambda: _C.eager(lin, act, x, wu, wd, wg, None, None, None)
        y = torch.empty(*x.shape[:-1], wd.shape[0], device=device, dtype=dtype)
        out["fuser.ffn, out="] = lambda: fuser.ffn(x, wu, wd, w_gate=wg, activation=w.activation, out=y)
        if wg is None:
            look_alike = functools.partial(act.func, *act.args, **act.keywords) if isinstance(
                act, functools.partial) else functools.partial(act)
            out["_C.eager, act out of place"] = lambda: _C.eager(lin, look_alike, x, wu, wd, None, None, None, None)
    return out


def fused_variants(m=16, d=256, f=512):
    """The fused route's variants: a tiny plain FFN whose fused plan is stored as this GPU's tuned plan."""
    mlp = Mlp(d, f, "silu", False).to("cuda", torch.bfloat16).eval()
    module = fuser.FusedFFN.from_module(mlp)
    wu, wd = mlp.up.weight, mlp.down.weight
    r = fuser.tune(m, d, f, activation="silu", k=1, timer=lambda w, plans: [1.0 if p.fused else 2.0 for p in plans])
    plan = r.best
    x = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(m, d, device="cuda", dtype=torch.bfloat16)
    dev = torch.cuda.current_device()
    stream = interop.raw_stream(dev)
    launch = runtime.launch_for(plan, dev)
    scratch = launch.scratch(m, stream)
    cap = torch._C._to_dlpack_versioned

    def bare():
        _C.ffn_launch(launch.kernel, cap(x), cap(wu), cap(wd), None, None, None, None, "silu", cap(y),
                      scratch.capsule, stream)
    def bare_alloc():
        _C.ffn_launch(launch.kernel, cap(x), cap(wu), cap(wd), None, None, None, None, "silu",
                      cap(x.new_empty((m, d))), scratch.capsule, stream)
    identity = nn.Identity()
    variants = {
        "bare launch": bare,
        "FusedFFN": lambda: module(x),
        "fuser.ffn": lambda: fuser.ffn(x, wu, wd, activation="silu"),
        "torch.ops": lambda: torch.ops.fuser.ffn(x, wu, wd, None, None, None, None, "silu"),
        "module": lambda: mlp(x),
    }
    with torch.no_grad():
        module(x)
        assert fuser.ops.route(x, wu, wd, activation="silu").fused, "the tuned fused plan was not picked up"
        torch.testing.assert_close(module(x), mlp(x), rtol=2e-2, atol=2e-2)
        kept, route = module.__dict__["_kept"], fuser.ops.route(x, wu, wd, activation="silu")
    # where the time goes (context): the pieces FusedFFN and fuser.ffn are made of
    variants.update({
        "| y = x.new_empty": lambda: x.new_empty((m, d)),
        "| y = empty_like(x)": lambda: torch.empty_like(x),
        "| bare + new_empty": bare_alloc,
        "| Identity()(x)": lambda: identity(x),
        "| FusedFFN.forward": lambda: module.forward(x),
        "| kept route run": lambda: kept.run(module, x),
        "| ffn_run (kept)": lambda: _C.ffn_run(kept.prepared, x.data_ptr(), y.data_ptr()),
        "| route key": lambda: fuser.ops._key(x, wu, wd, None, None, None, None, "silu"),
        "| route.run": lambda: route.run(x, wu, wd, None, None, None, None, "silu"),
    })
    if kept.signature is not None:   # x and the weights checked in one C call (torch's DLPack exchange API)
        variants["| kept check"] = lambda: _C.kept_match(x, kept.signature, kept.weights.held, kept.weights.layout)
    if kept.fast is not None:        # the module's checks, the launch's and the launch in one C call
        slots = module.__dict__
        variants["| kept launch (C)"] = lambda: _C.kept_launch(slots, x, kept.fast)
    return plan, variants


def verdict(over, interval, target):
    """The verdict on a paired overhead `over` (us) against `target`: "met" or "MISSED", judged on the median;
    where its 95% interval (lo, hi) holds the target, the rounds did not decide it, which the verdict says.

    Example:
        >>> verdict(1.2, (0.8, 1.7), 2.0), verdict(2.6, (2.2, 3.1), 2.0)
        ('met', 'MISSED')
        >>> verdict(2.6, (1.1, 4.0), 2.0)
        'MISSED (undecided: the 95% interval holds the target; more rounds)'
    """
    word = "met" if over <= target else "MISSED"
    lo, hi = interval
    if lo <= target < hi:
        word += " (undecided: the 95% interval holds the target; more rounds)"
    return word


def report_eager(rows):
    """rows: (label, medians, paired, calls per loop, intervals) per shape. Each cell: the median, and for the
    targeted variants the paired overhead over the ops in parentheses; the verdicts judge the paired overhead, with
    its 95% interval beside it."""
    names = ("ops", "fuser.ffn", "FusedFFN", "module")
    print(f"{'shape':34s}" + "".join(f"{n:>18s}" for n in names))
    worst = {n: None for n in TARGETS}
    for label, res, paired, _, ci in rows:
        cells = []
        for n in names:
            over = paired.get(n)
            cells.append(f"{res[n]:8.2f}" + (f" ({over:+6.2f})" if n in TARGETS else " " * 9) + " ")
            if n in TARGETS and (worst[n] is None or over > worst[n][0]):
                worst[n] = (over, res[n] - res["ops"], res["ops"] / res[n], label, paired[NULL], ci[n])
        print(f"{label:34s}" + "".join(f"{c:>18s}" for c in cells) + f"  null {paired[NULL]:+.2f}")
        if any(n in res for n in PIECES):
            print(f"{'':34s}pieces: " + ", ".join(f"{n} {res[n]:.2f}" + (f" ({paired[n]:+.2f} over the ops)"
                                                                       if n.startswith(("kept_eager", "_C.eager",
                                                                                        "fuser.ffn"))
                                                                       else "")
                                                  for n in PIECES if n in res))
    for n, (over, raw, ratio, label, null, ci) in worst.items():
        print(f"eager route, {n}: worst {over:+.2f} us over the ops (paired per round, 95% interval {ci[0]:+.2f} to "
              f"{ci[1]:+.2f}; the medians differ by "
              f"{raw:+.2f}, {ratio:.2f}x their speed; the ops against themselves {null:+.2f}) at {label}; "
              f"target {TARGETS[n]:.0f} us: {verdict(over, ci, TARGETS[n])}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="quick", choices=["quick", "models", "paper", "all"],
                    help="eager-route shapes on a GPU (those the planner fuses are left out)")
    ap.add_argument("--shape", action="append", help="a workload (fuser.tools.bench.parse_workload); repeatable")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=150,
                    help="calls per loop (on a GPU also at most QUEUED_GPU_US of GPU time: a loop that filled the "
                         "launch queue or outran the sleep would time the GPU, not the host)")
    ap.add_argument("--json", metavar="FILE", help="also write the medians there")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall: elapsed time; thread: the CPU time of the calling thread (what the calls "
                         "themselves spend, without the time other processes take the core away)")
    ap.add_argument("--pieces", action="store_true",
                    help="also time the C calls inside the eager routes alone (" + ", ".join(PIECES) + ")")
    ap.add_argument("--grad", action="store_true",
                    help="leave autograd on, as a script that calls its model outside torch.no_grad() does (the "
                         "weights require grad, so every variant records its backward)")
    a = ap.parse_args(argv)
    why = hopper_reason()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    torch.set_grad_enabled(a.grad)
    if device == "cpu":
        torch.set_num_threads(1)
        shapes = [parse_workload(s) for s in (a.shape or CPU_SHAPES)]
    else:
        shapes = ([parse_workload(s) for s in a.shape] if a.shape
                  else [parse_workload(s) for s in QUICK] if a.set == "quick" else workload_set(a.set))
    print(f"== eager route on {device}: host us per call ({a.clock} clock), medians of {a.rounds} rounds of {a.calls} calls "
          "(in parentheses: over the ops, the median of the per-round differences) ==")
    rows = []
    for w in shapes:
        variants = eager_variants(w, device, a.pieces)
        if variants is None:
            print(f"{w.label}: launched fused outside CUDA graphs; left out", file=sys.stderr)
            continue
        label = f"{w.name}:{w.m} {w.d_model}x{w.d_ff} {'gated ' if w.gated else ''}{w.activation}"
        rows.append((label, *measure(variants, a.rounds, a.calls, label, "ops", CLOCKS[a.clock])))
        if rows[-1][3] < a.calls:
            print(f"{label}: {rows[-1][3]} calls per loop (their GPU time must stay under the GPU's sleep)",
                  file=sys.stderr)
    report_eager(rows)
    out = dict(device=device, rounds=a.rounds, calls=a.calls, grad=a.grad, clock=a.clock, fused=None,
               eager=[dict(shape=label, **res, paired=paired, calls=calls, intervals=ci)
                      for label, res, paired, calls, ci in rows])
    if why is not None or a.grad:
        print(f"== fused route: not measured ({why or 'autograd on: the kernel has no backward'}) ==")
    else:
        with tempfile.TemporaryDirectory() as d:
            os.environ["FUSER_CACHE_DIR"] = d      # the tuned plan and its kernel stay out of the user's cache
            plan, variants = fused_variants()
            res, paired, _, ci = measure(variants, a.rounds, a.calls, "fused", "bare launch", CLOCKS[a.clock])
            out["fused"] = dict(plan=plan.summary(), **res, paired=paired, intervals=ci)
        report_fused(out["fused"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def report_fused(res):
    """res: the medians, the plan, "paired" (the per-round differences' medians), which the targets judge, and
    "intervals" (their 95% intervals)."""
    print(f"== fused route: FFN 16 x 256 -> 512 -> 256 bf16 SiLU, {res['plan']}; host us per call (medians) ==")
    for name, us in res.items():
        if name in ("plan", "paired", "intervals"):
            continue
        if name in FUSED_TARGETS:
            over, (lo, hi) = res["paired"][name], res["intervals"][name]
            print(f"{name:12s} {us:8.2f}  ({over:+.2f} over bare launch, 95% interval {lo:+.2f} to {hi:+.2f}; target "
                  f"{FUSED_TARGETS[name]:.0f}: {verdict(over, (lo, hi), FUSED_TARGETS[name])}; the medians differ by "
                  f"{us - res['bare launch']:+.2f})")
        else:
            print(f"{name:12s} {us:8.2f}")


if __name__ == "__main__":
    sys.exit(main())
