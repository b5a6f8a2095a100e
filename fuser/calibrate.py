"""``python -m fuser calibrate``: measure on this GPU the target constants the cost model uses and store
them where the planner picks them up (``fuser.store``: ``calibration/<gpu>.json`` in the kernel cache
directory). ``fuser.plan`` on that GPU then plans with the measured values instead of the built-in
H200 table; ``fuser.env()``-style details (what was measured, when, on which stack) are kept beside them.

Measured (``MEASURED``):

  hbm_gbs           read bandwidth: a 1 GiB device copy (bytes read + written / time) x STREAM_OVER_COPY
  mma_tflops        bf16 torch.matmul 8192^3 (the burst rate the floors use)
  small_gemm_eff    cuBLAS weight streaming at 16 tokens (a 4096 x 28672 GEMM) over hbm_gbs
  launch_us         per-kernel time of tiny kernels back to back in a CUDA graph
  fused_time_scale  fuser's fused kernels against the cost model: the best `k` predicted candidates of
                    a few shapes timed in CUDA graphs; median of measured / modelled (launch excluded)

Not measured here (kept from the table, measured once in the H200 baselines): DSM bandwidth per cluster
size, barrier cost, L2 bandwidth, shared-memory bandwidth.
"""
from __future__ import annotations

import datetime
import statistics

__all__ = ["MEASURED", "apply", "calibrate", "time_plans"]

MEASURED = ("hbm_gbs", "mma_tflops", "small_gemm_eff", "launch_us", "fused_time_scale")
#: Read-only streaming over copy bandwidth, measured on the H200 (h200-baselines.md section 2:
#: 4.48-4.51 TB/s streaming with 16-byte loads against a 4.275 TB/s copy).
STREAM_OVER_COPY = 1.05
#: The shapes whose fused candidates set fused_time_scale (a spread of sizes, plain and gated).
SHAPES = ("gpt2:16", "G9", "S8", "llama3-8b:16", "llama3-8b:512")

_cache = {}


def _stored(key):
    if key not in _cache:
        from fuser import store
        _cache[key] = store.load("calibration", key).get("fields", {})
    return _cache[key]


def forget():
    """Drop the in-memory copies of calibration files (after writing one, or in tests)."""
    _cache.clear()


def apply(target, gpu_name, sm_count):
    """`target` (a target dict) with the fields this GPU model's calibration file measured.

    Example:
        >>> import fuser
        >>> from fuser.calibrate import apply
        >>> t = fuser._C.targets()["h200"]
        >>> apply(t, "a GPU never calibrated", 1) == t
        True
    """
    from fuser.store import device_key
    fields = _stored(device_key(gpu_name, sm_count))
    out = dict(target)
    out.update({k: float(v) for k, v in fields.items() if k in MEASURED and isinstance(v, (int, float))})
    return out


def time_plans(workload, plans, reps=10, calls=None):
    """Median microseconds per call of each plan on `workload` (a ``fuser.bench.Workload``), each in a
    CUDA graph over rotated inputs, interleaved; an unfused plan runs PyTorch eager. None for a plan
    that failed to run (printed).

    Example:
        >>> import fuser
        >>> from fuser.bench import parse_workload
        >>> from fuser.calibrate import time_plans
        >>> ps = fuser.plans(16, 768, 3072, activation="gelu", fused=True, k=2)
        >>> [t > 0 for t in time_plans(parse_workload("gpt2:16"), ps, reps=3)]  # doctest: +SKIP
        [True, True]
    """
    import torch

    import fuser
    from fuser.bench import _graphed, _median_event_us, _Sets
    w = workload
    sets = _Sets(w)
    per = calls or (1 if w.m >= 512 else 4)

    def call(p):
        def f():
            s = sets.turn()
            if not p.fused:
                return fuser.ffn_reference(s["x"], s["w_up"], s["w_down"], w_gate=s["w_gate"], activation=w.activation)
            return fuser.ffn(s["x"], s["w_up"], s["w_down"], w_gate=s["w_gate"], activation=w.activation, plan=p)
        return f
    fns = []
    for p in plans:
        try:
            fns.append(_graphed(call(p), per))
        except Exception as e:  # noqa: BLE001 (reported: a candidate the planner offers must run)
            print(f"  {w.label}: a plan failed to run: {p.summary()}: {type(e).__name__}: {e}", flush=True)
            fns.append(None)
    samples = [[] for _ in fns]
    for i in range(reps):
        for j in list(range(i % len(fns), len(fns))) + list(range(i % len(fns))):
            if fns[j] is not None:
                samples[j].append(_median_event_us(fns[j][0], 1, fns[j][1]))
    fns.clear()
    torch.cuda.empty_cache()
    return [statistics.median(s) if s else None for s in samples]


def _scale_samples(log, k, reps):
    """measured / modelled (launch excluded) for the best k fused candidates of each calibration shape,
    modelled with the scale currently in effect taken out."""
    import fuser
    from fuser.bench import parse_workload
    out = []
    for text in SHAPES:
        w = parse_workload(text)
        ps = fuser.plans(w.m, w.d_model, w.d_ff, d_out=w.d_out, gated=w.gated, activation=w.activation, fused=True, k=k)
        measured = time_plans(w, ps, reps)
        for p, t in zip(ps, measured):
            tgt = p.target if isinstance(p.target, dict) else fuser._C.targets()[p.target or "h200"]
            body = (p.predicted_us - p.breakdown["launch"]) / tgt["fused_time_scale"]
            if t is not None and body > 0:
                out.append((t - p.breakdown["launch"]) / body)
        log(f"  {w.label}: {len(ps)} fused candidates timed")
    return out


def measure(log=print, k=8, reps=10):
    """Run the measurements on the current CUDA device (a Hopper GPU); returns the calibration record
    (``fields``: the MEASURED values; ``details``: the raw numbers behind them)."""
    import torch

    from fuser.bench import _graphed, _median_event_us, hopper_reason, measure_ceilings
    why = hopper_reason()
    if why is not None:
        raise RuntimeError(f"fuser calibrate measures a Hopper GPU: {why}")
    ceil = measure_ceilings()
    hbm = ceil["copy_tbps"] * 1000 * STREAM_OVER_COPY
    log(f"copy {ceil['copy_tbps']:.3f} TB/s -> hbm_gbs {hbm:.0f}; bf16 matmul {ceil['matmul_tflops']:.1f} TFLOP/s")
    x = torch.randn(16, 4096, device="cuda").bfloat16()
    wt = torch.randn(28672, 4096, device="cuda").bfloat16()
    for _ in range(3):
        x @ wt.t()
    gemv_us = statistics.median(_median_event_us(lambda: x @ wt.t(), 1) for _ in range(20))
    stream_gbs = wt.numel() * 2 / (gemv_us * 1e3)
    log(f"weight streaming at 16 tokens: {stream_gbs:.0f} GB/s -> small_gemm_eff {stream_gbs / hbm:.3f}")
    tiny = torch.zeros(256, device="cuda")
    n = 200
    g, _ = _graphed(lambda: [tiny.add_(1) for _ in range(n)], 1)
    launch = statistics.median(_median_event_us(g, 1) for _ in range(20)) / n
    log(f"tiny kernels in a graph: {launch:.2f} us each -> launch_us")
    samples = _scale_samples(log, k, reps)
    scale = statistics.median(samples)
    q = statistics.quantiles(samples, n=4)
    log(f"fused kernels / model: median {scale:.2f} (quartiles {q[0]:.2f}-{q[2]:.2f}, {len(samples)} kernels)")
    from fuser._env import env
    e = env()
    return dict(
        fields=dict(hbm_gbs=hbm, mma_tflops=ceil["matmul_tflops"], small_gemm_eff=min(1.0, stream_gbs / hbm),
                    launch_us=launch, fused_time_scale=scale),
        details=dict(copy_tbps=ceil["copy_tbps"], stream_gbs=stream_gbs, gemv_us=gemv_us,
                     scale_quartiles=q, scale_kernels=len(samples), shapes=list(SHAPES), k=k, reps=reps),
        gpu=e.gpu_name, sm_count=e.sm_count, torch=torch.__version__,
        measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def calibrate(log=print, k=8, reps=10):
    """Measure this GPU (see the module docstring) and store the result where ``fuser.plan`` picks it up;
    returns (record, path). Plans cached in this process are dropped so the next call re-plans.

    Example:
        >>> import fuser.calibrate
        >>> record, path = fuser.calibrate.calibrate()  # doctest: +SKIP
        >>> sorted(record["fields"]) == sorted(fuser.calibrate.MEASURED)  # doctest: +SKIP
        True
    """
    from fuser import runtime, store
    from fuser.store import device_key
    record = measure(log, k, reps)
    p = store.save("calibration", device_key(record["gpu"], record["sm_count"]), record)
    forget()
    runtime.forget_plans()
    return record, p
