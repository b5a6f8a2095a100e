"""Side-by-side timing on a CUDA device: functions run interleaved (A B A B ...) so clock and cache
states treat them alike, each call bracketed by CUDA events, medians reported. Shared by the CLI's demo
and the benchmarks."""
from __future__ import annotations

import statistics


def time_interleaved(fns, iters=30, warmup=3):
    """Median microseconds per call of each function in ``fns``, measured interleaved with CUDA events.

    Example:
        >>> import torch, fuser.timing  # doctest: +SKIP
        >>> a = torch.randn(4096, 4096, device="cuda")  # doctest: +SKIP
        >>> fuser.timing.time_interleaved([lambda: a @ a, lambda: a + a])  # doctest: +SKIP
        [..., ...]
    """
    import torch
    for _ in range(warmup):
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(iters):
        for i, fn in enumerate(fns):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times[i].append(start.elapsed_time(end) * 1e3)
    return [statistics.median(t) for t in times]
