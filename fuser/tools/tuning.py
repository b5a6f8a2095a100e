"""``fuser.tune``: time the planner's best plans for one FFN shape on this GPU and keep the fastest.

The candidates are the `k` best fused plans by predicted time, the best plan with each tile width the search offers
only on request (``ON_REQUEST``), and the unfused path (PyTorch eager);
each runs in a CUDA graph over rotated inputs (``fuser.tools.calibrate.time_plans``), a fused one only once its
output on the first input set is the FFN's (``calibrate.agrees``), so a plan that computes something else is
never kept. The winner is
stored per GPU model (``fuser.store``: ``tuned/<gpu>.json``, keyed by the exact chain, token count
included) and ``fuser.ffn`` / ``FusedFFN`` run it for that chain from then on, in this process and later
ones, instead of the model's pick (``fuser.runtime.plan_for`` reads it). Biases are not part of the
timing (their cost is the same for every plan); a tuned plan applies to the chain with the biases it
was tuned for. A gated chain's weight layout is not part of the key either: the plan applies whether gate and
up are one packed tensor (as ``fuser.optimize`` leaves them, and as the timing holds them) or two, since the
fused kernels read both the same way (timed side by side on an H100: 0.989-1.008x) and an unfused plan runs the
call's own eager route.
"""
from __future__ import annotations

import dataclasses

from fuser import planner, route, store, target
from fuser._env import env
from fuser.tools.bench import Workload
from fuser.tools.calibrate import time_plans
from fuser.tools.timing import hopper_reason

__all__ = ["TuneResult", "tune", "gpu_identity"]

#: Tile widths the search offers only where asked at some token counts (csrc/search.c: 96-wide l-tiles above 256
#: tokens, where their picks are not timed into the model); ``tune`` adds the best plan of each to its candidates
#: where the `k` best do not hold it already.
ON_REQUEST = ({"bl": 96},)


def gpu_identity():
    """(GPU name, SM count) of the current device: the GPU model a tuned plan is stored for.

    Example:
        >>> from fuser.tools.tuning import gpu_identity
        >>> name, sms = gpu_identity()
        >>> isinstance(name, str) and sms >= 0
        True
    """
    e = env()
    return e.gpu_name or "no GPU", e.sm_count


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """``best``: the fastest plan measured; ``timings``: (plan, predicted us, measured us or None) for
    every candidate, fastest measured first; ``path``: the file it was stored in."""
    best: object
    timings: tuple
    path: str

    def table(self):
        rows = [f"{'measured us':>12s} {'predicted us':>13s}  plan"]
        rows += [f"{'failed' if t is None else f'{t:12.1f}'} {p.predicted_us:13.1f}  {p.summary()}"
                 for p, _, t in self.timings]
        return "\n".join(rows)


def tune(m, d_model, d_ff, *, d_out=None, gated=False, activation="gelu", bias=False, dtype="bfloat16", k=8,
         reps=10, timer=None):
    """Time the best `k` fused plans and the unfused path for one FFN on this GPU; store and return the
    fastest (a :class:`TuneResult`). Arguments as for :func:`fuser.plan`. ``timer(workload, plans)``
    replaces the GPU timing (it returns microseconds per plan, None for one that failed).

    Example:
        >>> import fuser
        >>> r = fuser.tune(16, 4096, 14336, gated=True, activation="silu")  # doctest: +SKIP
        >>> fuser.plan(16, 4096, 14336, gated=True, activation="silu") == r.best  # doctest: +SKIP
        True
    """
    if timer is None:
        why = hopper_reason()
        if why is not None:
            raise RuntimeError(f"fuser.tune times plans on a Hopper GPU: {why}")

        def timer(workload, candidates):
            return time_plans(workload, candidates, reps)
    args = dict(d_out=d_out, gated=gated, activation=activation, bias=bias, dtype=dtype)
    plans = planner.plans(m, d_model, d_ff, fused=True, k=k, **args)
    for tiles in ON_REQUEST:    # timing decides here, so tiles the search offers only when asked compete too
        try:
            extra = planner.plans(m, d_model, d_ff, fused=True, k=1, **args, **tiles)
        except ValueError:      # none fits this chain
            continue
        plans += [p for p in extra if p.raw["params"] not in [q.raw["params"] for q in plans]]
    plans += [planner.plan(m, d_model, d_ff, fused=False, **args)]
    w = Workload("tune", m, d_model, d_ff, plans[0].chain["d_out"], gated, activation)
    measured = list(timer(w, plans))
    if len(measured) != len(plans) or all(t is None for t in measured):
        raise RuntimeError("fuser.tune: no candidate could be timed")
    timings = sorted(zip(plans, [p.predicted_us for p in plans], measured),
                     key=lambda r: float("inf") if r[2] is None else r[2])
    best = timings[0][0]
    name, sms = gpu_identity()
    key = store.device_key(name, sms)
    data = store.load("tuned", key)
    data.setdefault("plans", {})[target.chain_key(best.chain)] = best.to_dict()
    data["gpu"] = name
    path = store.save("tuned", key, data)
    target.forget()
    route.forget()
    return TuneResult(best, tuple(timings), path)
