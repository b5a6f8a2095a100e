"""A quick side-by-side timing of ``fuser.ffn`` (the best fused plan, forced) against PyTorch eager on a
few FFN shapes, on a Hopper GPU: what ``python -m fuser bench`` and ``benchmarks/quick_ffn.py`` print.

Timing is ``fuser.timing.time_interleaved`` (CUDA events, the two functions interleaved, medians), with
several weight sets rotated so the L2 cache does not flatter either side. Each row also carries the
roofline floor of the shape (``plan.floor_us``) and what the planner would pick unforced. The full
benchmark harness is a separate piece of work; this is the smoke version.
"""
from __future__ import annotations

import dataclasses

__all__ = ["QUICK_SHAPES", "Row", "bench", "hopper_reason"]

#: (workload name from ``fuser.workloads.MODELS``, tokens): the shapes the quick timing runs by default.
QUICK_SHAPES = (("llama3-8b", 1), ("llama3-8b", 16), ("llama3-8b", 128), ("gpt2", 128), ("gpt2", 2048),
                ("gpt3-6.7b", 16), ("llama2-7b", 512))


@dataclasses.dataclass(frozen=True)
class Row:
    """One timed shape: ``eager_us`` and ``fused_us`` are medians in microseconds, ``ratio`` is
    eager / fused (above 1: fused is faster), ``floor_us`` the roofline floor, ``plan`` the fused plan's
    summary and ``planner_fuses`` whether the planner, unforced, would fuse this shape."""
    shape: str
    tokens: int
    floor_us: float
    eager_us: float
    fused_us: float
    ratio: float
    plan: str
    planner_fuses: bool

    def __str__(self):
        return (f"{self.shape:10s} M={self.tokens:<5d} floor {self.floor_us:8.1f} us  eager {self.eager_us:8.1f} us  "
                f"fused {self.fused_us:8.1f} us  ({self.ratio:.2f}x)  planner picks "
                f"{'fused' if self.planner_fuses else 'unfused'}  {self.plan}")


def hopper_reason():
    """None when a Hopper GPU (sm_90) is present for timing, else why not.

    Example:
        >>> import torch, fuser.bench
        >>> (fuser.bench.hopper_reason() is None) == (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0))
        True
    """
    import torch
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    cc = torch.cuda.get_device_capability()
    return None if cc == (9, 0) else f"the GPU is sm_{cc[0]}{cc[1]}, not Hopper (sm_90)"


def bench(shapes=QUICK_SHAPES, iters=30, log=None):
    """Time ``fuser.ffn`` (forced onto its best fused plan) and PyTorch eager, bfloat16, side by side.

    ``shapes`` are ``(name, tokens)`` pairs with names from ``fuser.workloads.MODELS``; ``iters`` timed
    calls of each. Returns one :class:`Row` per shape (and calls ``log(row)`` as each is done, if given).
    Raises ``RuntimeError`` without a Hopper GPU.

    Example:
        >>> import fuser.bench
        >>> rows = fuser.bench.bench([("gpt2", 128)], iters=10)  # doctest: +SKIP
        >>> rows[0].fused_us > 0 and rows[0].ratio == rows[0].eager_us / rows[0].fused_us  # doctest: +SKIP
        True
    """
    import torch

    import fuser
    from fuser.timing import time_interleaved
    from fuser.workloads import MODELS

    why = hopper_reason()
    if why is not None:
        raise RuntimeError(f"fuser.bench times kernels on a Hopper GPU: {why}")
    rows = []
    for name, m in shapes:
        w = MODELS[name]
        d, f = w["d_model"], w["d_ff"]
        sets = 2 if d * f > 8_000_000 else 8
        ws = []
        for _ in range(sets):
            t = dict(w_up=torch.randn(f, d, device="cuda").bfloat16() * d ** -0.5,
                     w_down=torch.randn(d, f, device="cuda").bfloat16() * f ** -0.5)
            if w["gated"]:
                t["w_gate"] = torch.randn(f, d, device="cuda").bfloat16() * d ** -0.5
            ws.append(t)
        x = torch.randn(m, d, device="cuda").bfloat16()
        plan = fuser.plan(m, d, f, gated=w["gated"], activation=w["activation"])
        fplan = plan if plan.fused else fuser.plan(m, d, f, gated=w["gated"], activation=w["activation"], fused=True)
        turn = [0]

        def weights():
            turn[0] = (turn[0] + 1) % sets
            return ws[turn[0]]

        def eager():
            return fuser.ffn_reference(x, activation=w["activation"], **weights())

        def fused():
            return fuser.ffn(x, activation=w["activation"], plan=fplan, **weights())

        eager_us, fused_us = time_interleaved([eager, fused], iters)
        row = Row(name, m, fplan.floor_us, eager_us, fused_us, eager_us / fused_us, fplan.summary(), plan.fused)
        rows.append(row)
        if log:
            log(row)
    return rows
