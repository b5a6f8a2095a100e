"""How the tools time GPU work: one interleaved timer, CUDA-graph capture, and the Hopper check.

``time_interleaved`` runs the functions it compares in rounds, each round in its own seeded random
order (``round_orders``), each call bracketed by CUDA events (or the CPU clock), and reports medians:
clock and cache states then treat every function alike, and no function always follows the same one.
Used by the benchmark harness, calibration, tuning, the demo and ``benchmarks/e2e.py``.
"""
from __future__ import annotations

import math
import random
import statistics
import time

import torch

__all__ = ["hopper_reason", "median_event_us", "graphed", "round_orders", "time_interleaved", "median_interval",
           "copy_gbs"]


def hopper_reason():
    """None when a Hopper GPU (sm_90) is present for timing, else why not.

    Example:
        >>> import torch
        >>> from fuser.tools.timing import hopper_reason
        >>> hopper = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
        >>> (hopper_reason() is None) == hopper
        True
    """
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    cc = torch.cuda.get_device_capability()
    return None if cc == (9, 0) else f"the GPU is sm_{cc[0]}{cc[1]}, not Hopper (sm_90)"


def median_event_us(fn, reps, per=1):
    """Median microseconds of `reps` calls of fn, each bracketed by CUDA events, divided by `per` (the
    calls of the timed work one call of fn makes).

    Example:
        >>> import torch
        >>> from fuser.tools.timing import median_event_us
        >>> a = torch.randn(1024, 1024, device="cuda")            # doctest: +SKIP
        >>> median_event_us(lambda: a @ a, 5) > 0                 # doctest: +SKIP
        True
    """
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / per)
    return statistics.median(ts)


def _cpu_us(fn, reps, per=1):
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e6 / per)
    return statistics.median(ts)


def graphed(fn, calls):
    """(a replay function, calls per replay): `calls` calls of fn captured in one CUDA graph after a
    warm-up on a side stream. The replay function keeps fn alive, and with it every tensor fn reads:
    a graph replays the addresses it captured, so a tensor freed while its graph lives is memory torch's
    allocator may hand out again or release (``torch.cuda.empty_cache``, which every later capture
    calls), and the replay then reads another tensor's data or faults with an illegal address.

    Example:
        >>> import torch
        >>> from fuser.tools.timing import graphed
        >>> a = torch.zeros(8, device="cuda")                     # doctest: +SKIP
        >>> replay, calls = graphed(lambda: a.add_(1), 4)         # doctest: +SKIP
        >>> replay(); calls                                       # doctest: +SKIP
        4
    """
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.captured_fn = fn   # g.replay holds g, g holds fn and what fn's closure holds
    g.replay()
    return g.replay, calls


def round_orders(names, rounds, seed=0):
    """The order of the functions in each round: a fresh seeded permutation per round.

    NOTE: a rotation (A B C, B C A, ...) keeps every function's predecessor the same in all rounds but
    one, and what runs before a timed call changes its time (a host-bound call leaves the GPU idle).

    Example:
        >>> from fuser.tools.timing import round_orders
        >>> [sorted(o) for o in round_orders("abc", 2)]
        [['a', 'b', 'c'], ['a', 'b', 'c']]
    """
    rng = random.Random(str(seed))
    out = []
    for _ in range(rounds):
        order = list(names)
        rng.shuffle(order)
        out.append(order)
    return out


def time_interleaved(fns, rounds=30, *, warmup=1, seed=0, cpu=False, on_round=None):
    """Median microseconds per call of each function, timed interleaved (see the module docstring).

    Args:
        fns: callables, or (callable, calls) pairs where one call of the callable makes `calls` calls
            of the timed work (a CUDA-graph replay of several calls).
        rounds: how many times each function is timed.
        warmup: untimed rounds first.
        seed: seeds the orders (``round_orders``).
        cpu: time with the CPU clock instead of CUDA events.
        on_round: called after every round (e.g. to read the GPU clock).

    Example:
        >>> from fuser.tools.timing import time_interleaved
        >>> fast, slow = time_interleaved([lambda: None, lambda: sum(range(20000))], rounds=5, cpu=True)
        >>> fast < slow
        True
    """
    pairs = [f if isinstance(f, tuple) else (f, 1) for f in fns]
    once = _cpu_us if cpu else median_event_us
    for _ in range(warmup):
        for f, _calls in pairs:
            f()
    samples = [[] for _ in pairs]
    for order in round_orders(range(len(pairs)), rounds, seed):
        for i in order:
            f, calls = pairs[i]
            samples[i].append(once(f, 1, calls))
        if on_round is not None:
            on_round()
    return [statistics.median(s) for s in samples]


def median_interval(values, level=0.95):
    """A distribution-free interval around the median of `values`: the order statistics (lo, hi) that hold
    the true median with probability at least `level` for independent samples of any continuous
    distribution (the sign test's interval: the count of samples below the median is binomial(n, 1/2)).
    With too few samples for `level` (fewer than 6 at 0.95) it is the whole range, which then holds it
    with less. What a verdict on a noisy median needs: a target inside the interval is not decided by
    these samples.

    Example:
        >>> from fuser.tools.timing import median_interval
        >>> median_interval(range(1, 32))    # 31 samples: the 10th and 22nd of them
        (10, 22)
        >>> median_interval([3, 1, 2])
        (1, 3)
    """
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("median_interval: no values")
    if not 0 < level < 1:
        raise ValueError(f"median_interval: level must be in (0, 1), got {level}")
    tail, below, k = (1 - level) / 2, 0.0, 0
    while k < n // 2:   # grow k while P(fewer than k + 1 samples below the median) stays within the tail
        below += math.comb(n, k) / 2 ** n
        if below > tail:
            break
        k += 1
    return (xs[k - 1], xs[n - k]) if k else (xs[0], xs[-1])


def copy_gbs(rounds=15):
    """The current device's copy rate on 1 GiB of bfloat16 (bytes read + written per second, / 1e9), the median
    of `rounds` timed copies: the rate a pass over an intermediate is held to.

    Example:
        >>> from fuser.tools.timing import copy_gbs
        >>> 2000 < copy_gbs() < 8000  # doctest: +SKIP
        True
    """
    a = torch.empty(2 ** 29, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    us, = time_interleaved([lambda: b.copy_(a)], rounds=rounds)
    return 2 * a.numel() * 2 / (us * 1e-6) / 1e9
