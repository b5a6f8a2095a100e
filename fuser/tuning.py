"""``fuser.tune`` (this module is ``fuser.tuning``): time the planner's best plans for one FFN shape on this GPU and keep the fastest.

The candidates are the `k` best fused plans by predicted time plus the unfused path (PyTorch eager);
each runs in a CUDA graph over rotated inputs (``fuser.calibrate.time_plans``). The winner is stored
per GPU model (``fuser.store``: ``tuned/<gpu>.json``, keyed by the exact chain, token count included)
and ``fuser.ffn`` / ``FusedFFN`` use it for that chain from then on, in this process and later ones,
instead of the model's pick. Biases are not part of the timing (their cost is the same for every plan);
a tuned plan applies to the chain with the biases it was tuned for.
"""
from __future__ import annotations

import dataclasses

__all__ = ["TuneResult", "tune", "lookup", "chain_key"]

_cache = {}   # device key -> {chain key: plan dict}


def chain_key(chain):
    """The storage key of a chain dict (as ``_C.ffn_check`` or ``Plan.chain`` give it).

    Example:
        >>> from fuser.tuning import chain_key
        >>> chain_key(dict(m=16, d_model=4096, d_ff=14336, d_out=4096, gated=True, activation="silu",
        ...                bias_up=False, bias_gate=False, bias_down=False, dtype="bfloat16"))
        'm=16 k=4096 n=14336 l=4096 gated silu bias=- bfloat16'
    """
    bias = "".join(c for c, f in (("u", "bias_up"), ("g", "bias_gate"), ("d", "bias_down")) if chain[f]) or "-"
    return (f"m={chain['m']} k={chain['d_model']} n={chain['d_ff']} l={chain['d_out']} "
            f"{'gated' if chain['gated'] else 'plain'} {chain['activation']} bias={bias} {chain['dtype']}")


def _device_identity():
    """(GPU name, SM count) of the current device, as ``fuser.runtime`` looks tuned plans up."""
    from fuser._env import env
    e = env()
    return e.gpu_name or "no GPU", e.sm_count


def forget():
    """Drop the in-memory copies of the tuned-plan files."""
    _cache.clear()


def _plans_of(key):
    if key not in _cache:
        from fuser import store
        _cache[key] = dict(store.load("tuned", key).get("plans", {}))
    return _cache[key]


def lookup(chain, gpu_name, sm_count):
    """The tuned :class:`fuser.Plan` for this exact chain on this GPU model, or None.

    Example:
        >>> import fuser
        >>> from fuser.tuning import lookup
        >>> lookup(fuser.plan(16, 768, 3072).chain, "a GPU never tuned", 1) is None
        True
    """
    from fuser.planner import Plan
    from fuser.store import device_key
    d = _plans_of(device_key(gpu_name, sm_count)).get(chain_key(chain))
    if d is None:
        return None
    try:
        return Plan.from_dict(d)
    except (TypeError, ValueError):
        return None    # a plan the core no longer accepts (e.g. limits changed): plan again


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
    import fuser
    from fuser import runtime, store
    from fuser.bench import Workload, hopper_reason
    from fuser.store import device_key
    if timer is None:
        why = hopper_reason()
        if why is not None:
            raise RuntimeError(f"fuser.tune times plans on a Hopper GPU: {why}")
        from fuser.calibrate import time_plans
        timer = time_plans
    args = dict(d_out=d_out, gated=gated, activation=activation, bias=bias, dtype=dtype)
    plans = fuser.plans(m, d_model, d_ff, fused=True, k=k, **args) + [fuser.plan(m, d_model, d_ff, fused=False, **args)]
    w = Workload("tune", m, d_model, d_ff, plans[0].chain["d_out"], gated, activation)
    measured = list(timer(w, plans))
    if len(measured) != len(plans) or all(t is None for t in measured):
        raise RuntimeError("fuser.tune: no candidate could be timed")
    timings = sorted(zip(plans, [p.predicted_us for p in plans], measured),
                     key=lambda r: float("inf") if r[2] is None else r[2])
    best = timings[0][0]
    name, sms = _device_identity()
    key = device_key(name, sms)
    data = store.load("tuned", key)
    data.setdefault("plans", {})[chain_key(best.chain)] = best.to_dict()
    data["gpu"] = name
    path = store.save("tuned", key, data)
    forget()
    runtime.forget_plans()
    return TuneResult(best, tuple(timings), path)
