"""Host time fuser adds per FFN call, outside graphs (issue #5's target: at most 10 us for the fused op).

Each variant runs back to back in a loop timed with the CPU clock, variants interleaved, medians over
rounds. On a Hopper GPU the FFN is a tiny forced-fused one, and each loop starts behind a GPU sleep
(torch.cuda._sleep) longer than the loop, so the launches only queue up: the loop's time is host time
alone, whatever the kernel's length:

  bare launch      _C.ffn_launch of the loaded kernel with freshly exported capsules: the least any
                   Python caller of the kernel pays;
  fuser.ffn        the public function with the plan given (validation, export, launch);
  FusedFFN         the module as optimize() leaves it, no autograd;
  torch.ops        the registered op through the dispatcher;
  original module  (context, no overhead computed) the nn.Sequential FusedFFN replaced, in PyTorch eager:
                   the host time the fused module has to stay under for a small FFN not to lose.

Overhead = variant - bare launch. Without a Hopper GPU it measures the reference route instead
(fuser.ffn and FusedFFN minus ffn_reference on CPU): the same Python and C intake, no launch.

With --parts it also times the pieces the fused route is made of, each alone (stream lookup, device
guard, DLPack export, C validation, output allocation, the launch glue), to show where the time goes.

    python benchmarks/host_overhead.py [--rounds 15] [--calls 400] [--parts]
"""
import argparse
import statistics
import sys
import time

import torch
from torch import nn

import fuser
from fuser import _C, runtime
from fuser.tools.timing import hopper_reason
from fuser.module import FusedFFN

M, D, F = 16, 256, 512
#: ~100 ms at the H200's clocks: longer than any loop below (calls x at most ~100 us)
SLEEP_CYCLES = 200_000_000


def loop_us(fn, calls):
    """Per-call host time of `calls` back-to-back calls (microseconds)."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def measure(variants, rounds, calls):
    for fn in variants.values():       # warm-up: compile, load, allocate scratch, fill caches
        for _ in range(20):
            fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    cuda = torch.cuda.is_available()
    samples = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            if cuda:
                torch.cuda._sleep(SLEEP_CYCLES)   # the GPU waits; the loop below only enqueues
            samples[name].append(loop_us(fn, calls))
            if cuda:
                torch.cuda.synchronize()
    return {name: statistics.median(v) for name, v in samples.items()}


def pieces(x, w, args, dev, plan):
    """The fused route's pieces, each a variant of its own (named 'part: ...')."""
    from fuser import interop
    cap = torch._C._to_dlpack_versioned
    objs = lambda: [t if t is None else cap(t) for t in args]    # noqa: E731
    parts = {
        "part: export 7 tensors": objs,
        "part: _C.ffn_check": lambda: _C.ffn_check(*objs(), activation="silu", capsules=0x7f),
        "part: x.new_empty": lambda: x.new_empty((M, D)),
        "part: module.weights": FusedFFN.from_module(nn.Sequential(nn.Linear(D, F), nn.SiLU(), nn.Linear(F, D))).weights,
    }
    if dev == "cuda":
        d = x.get_device()
        parts["part: current_stream().cuda_stream"] = lambda: torch.cuda.current_stream(d).cuda_stream
        parts["part: raw current stream"] = lambda: torch._C._cuda_getCurrentRawStream(d)

        def guard():
            with torch.cuda.device(d):
                pass
        parts["part: torch.cuda.device guard"] = guard
        parts["part: interop.placement"] = lambda: interop.placement(x)
    return parts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=300, help="calls per loop (launches must fit the ~1000-entry queue: the original module makes 3 a call)")
    ap.add_argument("--parts", action="store_true", help="also time the pieces of the fused route alone")
    a = ap.parse_args(argv)
    why = hopper_reason()
    dev = "cuda" if why is None else "cpu"
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(D, F), nn.SiLU(), nn.Linear(F, D)).to(dev, torch.bfloat16).eval()
    x = torch.randn(M, D, device=dev, dtype=torch.bfloat16)
    w = FusedFFN.from_module(mlp).weights()
    args = (x, w["up"], w["down"], None, w["b_up"], None, w["b_down"])
    torch.set_grad_enabled(False)
    if why is None:
        plan = fuser.plan(M, D, F, bias=True, activation="silu", fused=True)
        module = FusedFFN.from_module(mlp)
        runtime.plan_for = lambda chain, device, _p=plan: _p     # make the module take the fused route
        y = torch.empty(M, D, device=dev, dtype=torch.bfloat16)
        device = torch.cuda.current_device()
        kernel = runtime.load(runtime.kernel_for(plan), device)
        stream = torch.cuda.current_stream().cuda_stream
        scratch = runtime.launch_for(plan, device).scratch(M, stream)
        cap = torch._C._to_dlpack_versioned

        def bare():
            _C.ffn_launch(kernel, *(t if t is None else cap(t) for t in args), "silu", cap(y), scratch.capsule,
                          stream)
        variants = {
            "bare launch": bare,
            "fuser.ffn": lambda: fuser.ffn(x, w["up"], w["down"], b_up=w["b_up"], b_down=w["b_down"],
                                           activation="silu", plan=plan),
            "FusedFFN": lambda: module(x),
            "torch.ops": lambda: torch.ops.fuser.ffn(*args, "silu"),
        }
        variants["original module"] = lambda: mlp(x)
        base = "bare launch"
    else:
        print(f"no Hopper GPU ({why}): measuring the reference route on CPU", file=sys.stderr, flush=True)
        torch.set_num_threads(1)
        module = FusedFFN.from_module(mlp)
        variants = {
            "ffn_reference": lambda: fuser.ffn_reference(x, w["up"], w["down"], b_up=w["b_up"],
                                                         b_down=w["b_down"], activation="silu"),
            "fuser.ffn": lambda: fuser.ffn(x, w["up"], w["down"], b_up=w["b_up"], b_down=w["b_down"],
                                           activation="silu"),
            "FusedFFN": lambda: module(x),
            "torch.ops": lambda: torch.ops.fuser.ffn(*args, "silu"),
        }
        variants["original module"] = lambda: mlp(x)
        base = "ffn_reference"
    if a.parts:
        variants.update(pieces(x, w, args, dev, plan if why is None else None))
    res = measure(variants, a.rounds, a.calls)
    print(f"FFN {M} x {D} -> {F} -> {D} bf16 SiLU on {dev}; per call, medians of {a.rounds} rounds of "
          f"{a.calls} calls")
    for name, us in res.items():
        extra = "" if name in (base, "original module") or name.startswith("part:") else f"   overhead {us - res[base]:+6.2f} us"
        print(f"  {name:16s} {us:7.2f} us{extra}" if not name.startswith("part:") else f"  {name:38s} {us:7.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
