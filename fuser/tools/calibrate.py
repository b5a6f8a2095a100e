"""``python -m fuser calibrate``: measure on this GPU the target constants the cost model uses and store
them where the planner picks them up (``fuser.store``: ``calibration/<gpu>.json`` in the kernel cache
directory). ``fuser.plan`` on that GPU then plans with the measured values instead of the built-in
H200 table (``fuser.target.apply`` lays them over it); ``fuser.env()``-style details (what was
measured, when, on which stack) are kept beside them. This module measures; it is not loaded to plan.

Measured (``fuser.target.MEASURED``):

  hbm_gbs           read bandwidth: a 1 GiB device copy (bytes read + written / time) x STREAM_OVER_COPY
  mma_tflops        bf16 torch.matmul 8192^3 (the burst rate the floors use)
  small_gemm_eff    cuBLAS weight streaming at 16 tokens (a 4096 x 28672 GEMM, less the eager model's
                    fixed cost and ramp of one GEMM) over hbm_gbs
  launch_us         per-kernel time of tiny kernels back to back in a CUDA graph
  dsm_bytes_per_clk remote shared-memory reads per SM per clock at cluster 2, 4, 8, 16 (``fuser.tools.probes``:
                    every SM streaming its peer's shared memory with 16-byte ld.shared::cluster)
  barrier_cycles    one cluster barrier (release/acquire) at the fused kernel's 256 threads per block,
                    the median over cluster sizes 2-16 (``fuser.tools.probes``)
  fused_mma_eff     the fused main loop's tensor-core rate from shared memory (ldmatrix + mma.sync, the
                    best of a few warp tiles, ``fuser.tools.probes``) over mma_tflops
  stream_mma_eff    the stream kernel's wgmma main loop alone, as a GEMM (``fuser.tools.probes.gemm`` at
                    8192^3: TMA ring, producer warp, two consumer warpgroups) over mma_tflops
  fused_time_scale  fuser's fused kernels against the cost model: the best `k` predicted candidates of
                    a few shapes timed in CUDA graphs; median of measured / modelled (launch excluded),
                    the model using every constant above as just measured
  fused_scale_*     per-term corrections on top of it (compute, hbm, l2, dsm, smem, sync, tail), fitted
                    to the same kernels (``fit_term_scales``); kept at 1 unless they predict shapes
                    left out of the fit better (leave-one-shape-out)

Not measured here (kept from the table, measured once in the H200 baselines): L2 bandwidth, local
shared-memory bandwidth, memory latency, the SM clock (the probes report the clock they ran at).
"""
from __future__ import annotations

import datetime
import math
import statistics

import torch

import fuser
from fuser import _C, route, store, target
from fuser._env import env
from fuser.tools import probes
from fuser.tools.bench import Sets, measure_ceilings, parse_workload
from fuser.tools.timing import graphed, hopper_reason, median_event_us, time_interleaved

__all__ = ["TERMS", "calibrate", "time_plans", "agrees", "fit_term_scales", "unscaled_terms", "hardware_fields"]

#: Read-only streaming over copy bandwidth, measured on the H200 (h200-baselines.md section 2:
#: 4.48-4.51 TB/s streaming with 16-byte loads against a 4.275 TB/s copy).
STREAM_OVER_COPY = 1.05
#: The shapes whose fused candidates set fused_time_scale (a spread of sizes, plain and gated).
SHAPES = ("gpt2:16", "G9", "S8", "llama3-8b:16", "llama3-8b:512")

#: A fused candidate whose output on the first input set is further than this from PyTorch's float32 computation
#: (relative Frobenius error; a bf16 FFN is ~4e-3 off) is not timed: what ``fuser.tune`` keeps must compute the FFN.
AGREE_REL = 2e-2


def agrees(y, ref):
    """Whether `y` is the FFN `ref` (float32) computes: every element finite and the relative error at most
    ``AGREE_REL``.

    Example:
        >>> import torch
        >>> from fuser.tools.calibrate import agrees
        >>> ref = torch.ones(4, 8)
        >>> agrees(ref.bfloat16(), ref), agrees(ref * 1.1, ref), agrees(torch.full((4, 8), float("nan")), ref)
        (True, False, False)
    """
    y = y.float()
    return bool(torch.isfinite(y).all()) and float((y - ref).norm()) <= AGREE_REL * float(ref.norm())


def time_plans(workload, plans, reps=10, calls=None):
    """Median microseconds per call of each plan on `workload` (a ``fuser.tools.bench.Workload``), each in a
    CUDA graph over rotated inputs, interleaved; an unfused plan runs PyTorch eager. None for a plan
    that failed to run, or whose output on the first set is not the FFN's (``agrees``; printed).

    Example:
        >>> import fuser
        >>> from fuser.tools.bench import parse_workload
        >>> from fuser.tools.calibrate import time_plans
        >>> ps = fuser.plans(16, 768, 3072, activation="gelu", fused=True, k=2)
        >>> [t > 0 for t in time_plans(parse_workload("gpt2:16"), ps, reps=3)]  # doctest: +SKIP
        [True, True]
    """
    w = workload
    sets = Sets(w)
    per = calls or (1 if w.m >= 512 else 4)

    def call(p):
        def f():
            s = sets.turn()
            if not p.fused:
                return fuser.ffn_reference(s["x"], s["w_up"], s["w_down"], w_gate=s["w_gate"], activation=w.activation)
            return fuser.ffn(s["x"], s["w_up"], s["w_down"], w_gate=s["w_gate"], activation=w.activation, plan=p)
        return f
    s0 = sets.sets[0]
    ref = fuser.ffn_reference(s0["x"], s0["w_up"], s0["w_down"], w_gate=s0["w_gate"], activation=w.activation,
                              compute_dtype=torch.float32)
    fns = []
    for p in plans:
        try:
            if p.fused and not agrees(fuser.ffn(s0["x"], s0["w_up"], s0["w_down"], w_gate=s0["w_gate"],
                                                activation=w.activation, plan=p), ref):
                print(f"  {w.label}: a plan's output is not the FFN's (relative error over {AGREE_REL}): "
                      f"{p.summary()}", flush=True)
                fns.append(None)
                continue
            fns.append(graphed(call(p), per))
        except Exception as e:  # noqa: BLE001 (reported: a candidate the planner offers must run)
            print(f"  {w.label}: a plan failed to run: {p.summary()}: {type(e).__name__}: {e}", flush=True)
            fns.append(None)
    ran = [f for f in fns if f is not None]
    times = iter(time_interleaved(ran, reps, warmup=0) if ran else [])
    fns = [None if f is None else next(times) for f in fns]
    torch.cuda.empty_cache()
    return fns


#: The fused cost terms, in the model's order: the first five overlap (their maximum counts), sync and
#: tail add.
TERMS = ("compute", "hbm", "l2", "dsm", "smem", "sync", "tail")


def unscaled_terms(plan):
    """A fused plan's cost terms (us) with the target's calibration taken out: what the model itself says.

    Example:
        >>> import fuser
        >>> from fuser.tools.calibrate import unscaled_terms
        >>> p = fuser.plan(128, 768, 3072, activation="gelu", fused=True)
        >>> t = p.target
        >>> abs(unscaled_terms(p)["hbm"] * t["fused_time_scale"] * t["fused_scale_hbm"] - p.breakdown["hbm"]) < 1e-9
        True
    """
    t = plan.target if isinstance(plan.target, dict) else _C.targets()[plan.target or "h200"]
    b = plan.breakdown
    return {k: b[k] / (t["fused_time_scale"] * t.get(f"fused_scale_{k}", 1.0)) for k in TERMS}


def _loss(params, samples):
    """Mean squared log error of the scaled model over samples, for each row of params [P, 7]."""
    c = torch.tensor([[s[3][k] for k in TERMS] for s in samples], dtype=torch.float64)
    launch = torch.tensor([s[2] for s in samples], dtype=torch.float64)
    meas = torch.tensor([s[1] for s in samples], dtype=torch.float64)
    p = params.unsqueeze(1)                                    # [P, 1, 7]
    scaled = c.unsqueeze(0) * p                                # [P, n, 7]
    pred = launch + scaled[..., :5].amax(-1) + scaled[..., 5] + scaled[..., 6]
    return ((pred.log() - meas.log()) ** 2).mean(-1)


#: Per-term scales stay within [1, FACTOR_RANGE x the uniform scale]: a term the model computes from
#: measured rates is a lower bound (a kernel cannot beat it), and a term the data cannot pin down (one
#: that is never the largest) is pulled towards the uniform scale by PRIOR instead of drifting.
FACTOR_RANGE = 3.0
PRIOR = 0.002


def _fit(samples, start):
    """Per-term scales minimising the log error plus PRIOR x the squared log distance from `start`:
    coordinate descent over a shrinking geometric grid, clamped to [1, FACTOR_RANGE x start]
    (deterministic)."""
    p = torch.full((7,), float(start), dtype=torch.float64)
    lo, hi = 1.0, FACTOR_RANGE * float(start)
    span = 4.0
    steps = torch.linspace(-1, 1, 41, dtype=torch.float64)
    for _ in range(14):
        for i in range(7):
            cand = p.repeat(41, 1)
            cand[:, i] = (p[i] * span ** steps).clamp(lo, hi)
            cost = _loss(cand, samples) + PRIOR * ((cand / start).log() ** 2).sum(-1)
            p = cand[int(cost.argmin())].clone()
        span = span ** 0.6
    return p


def fit_term_scales(samples):
    """Calibrate the fused model from measured kernels. `samples`: (shape, measured us, launch us,
    {term: unscaled us}) per kernel (``unscaled_terms``). Returns dict(fused_time_scale: the median
    measured / modelled with launch excluded; factors: per-term corrections on top of it (all 1 unless
    they cut the leave-one-shape-out log error by at least 10%); loso_uniform, loso_terms: those errors;
    fit_loss: the in-sample error with the factors used).

    Example:
        >>> from fuser.tools.calibrate import fit_term_scales
        >>> t = dict(compute=1.0, hbm=2.0, l2=0.5, dsm=0.0, smem=0.1, sync=0.5, tail=0.5)
        >>> s = [(f"s{i % 3}", 2.5 + 3.0 * (2.0 + 1.0) * (1 + i / 10), 2.5, {k: v * (1 + i / 10) for k, v in t.items()})
        ...      for i in range(9)]
        >>> round(fit_term_scales(s)["fused_time_scale"], 3)
        3.0
    """
    body = [(m - launch) / (max(c[k] for k in TERMS[:5]) + c["sync"] + c["tail"]) for _, m, launch, c in samples]
    scale = statistics.median(body)
    shapes = sorted({s[0] for s in samples})

    def uniform_loss(test, train):
        u = statistics.median((m - launch) / (max(c[k] for k in TERMS[:5]) + c["sync"] + c["tail"])
                              for _, m, launch, c in train)
        return float(_loss(torch.full((1, 7), u, dtype=torch.float64), test)[0])

    lu = lt = 0.0
    for sh in shapes if len(shapes) > 2 else ():
        test = [s for s in samples if s[0] == sh]
        train = [s for s in samples if s[0] != sh]
        lu += uniform_loss(test, train) * len(test)
        lt += float(_loss(_fit(train, scale).unsqueeze(0), test)[0]) * len(test)
    n = len(samples)
    adopt = bool(shapes) and len(shapes) > 2 and lt < 0.9 * lu
    factors = {k: 1.0 for k in TERMS}
    if adopt:
        p = _fit(samples, scale)
        factors = {k: float(p[i]) / scale for i, k in enumerate(TERMS)}
    used = torch.tensor([[scale * factors[k] for k in TERMS]], dtype=torch.float64)
    return dict(fused_time_scale=scale, factors=factors, loso_uniform=lu / n if lu else None,
                loso_terms=lt / n if lt else None, fit_loss=float(_loss(used, samples)[0]), adopted=adopt)


def _kernel_samples(log, k, reps, target=None):
    """(shape, measured us, launch us, unscaled terms) for the best k fused candidates of each
    calibration shape, planned for `target` (None: this GPU's)."""
    out = []
    for text in SHAPES:
        w = parse_workload(text)
        ps = fuser.plans(w.m, w.d_model, w.d_ff, d_out=w.d_out, gated=w.gated, activation=w.activation, fused=True,
                         k=k, target=target)
        measured = time_plans(w, ps, reps)
        out += [(w.label, t, p.breakdown["launch"], unscaled_terms(p)) for p, t in zip(ps, measured) if t is not None]
        log(f"  {w.label}: {len(ps)} fused candidates timed")
    return out


def measure(log=print, k=8, reps=10):
    """Run the measurements on the current CUDA device (a Hopper GPU); returns the calibration record
    (``fields``: the MEASURED values; ``details``: the raw numbers behind them)."""
    why = hopper_reason()
    if why is not None:
        raise RuntimeError(f"fuser calibrate measures a Hopper GPU: {why}")
    ceil = measure_ceilings()
    hbm = ceil["copy_tbps"] * 1000 * STREAM_OVER_COPY
    log(f"copy {ceil['copy_tbps']:.3f} TB/s -> hbm_gbs {hbm:.0f}; bf16 matmul {ceil['matmul_tflops']:.1f} TFLOP/s")
    # in a CUDA graph, alternating two weight copies (2 x 235 MB: L2 holds neither): a lone eager call
    # timed with events would also count the host's submission latency
    x = torch.randn(16, 4096, device="cuda").bfloat16()
    ws = [torch.randn(28672, 4096, device="cuda").bfloat16() for _ in range(2)]
    turn = [0]

    def gemm():
        turn[0] ^= 1
        x @ ws[turn[0]].t()
    g, calls = graphed(gemm, 4)
    gemv_us = statistics.median(median_event_us(g, 1, calls) for _ in range(20))
    stream_gbs = ws[0].numel() * 2 / (gemv_us * 1e3)
    # the eager model charges each GEMM its kernel's fixed cost and a ramp on top of the streaming time
    # (fitted with it, not measured here): what is left streams at small_gemm_eff of hbm_gbs
    table = target.default_target()
    table = _C.targets()["h200"] if isinstance(table, str) else table
    nbytes = (ws[0].numel() + x.numel() + 16 * 28672) * 2
    fixed = table["eager_op_us"] + table["eager_ramp_us"] * (1 - math.exp(-nbytes / (table["eager_ramp_mb"] * 1e6)))
    gemm_eff = min(1.0, nbytes / (max(gemv_us - fixed, 1e-3) * 1e3) / hbm)
    log(f"weight streaming at 16 tokens: {stream_gbs:.0f} GB/s in {gemv_us:.1f} us, {fixed:.1f} us of it the "
        f"kernel's fixed cost and ramp -> small_gemm_eff {gemm_eff:.3f}")
    tiny = torch.zeros(256, device="cuda")
    n = 200
    g, _ = graphed(lambda: [tiny.add_(1) for _ in range(n)], 1)
    launch = statistics.median(median_event_us(g, 1) for _ in range(20)) / n
    log(f"tiny kernels in a graph: {launch:.2f} us each -> launch_us")
    wg = probes.gemm(8192, 8192, 8192, probes.GEMM_VARIANTS[0], sets=2, iters=10)
    if wg["rel_error"] > 1e-2:
        raise RuntimeError(f"fuser calibrate: the wgmma GEMM probe computed a wrong product (relative error "
                           f"{wg['rel_error']:.2e}); not storing its rate")
    stream_eff = min(1.0, wg["tflops"] / ceil["matmul_tflops"])
    log(f"wgmma main loop (GEMM probe, 8192^3): {wg['tflops']:.0f} TFLOP/s, {wg['ratio']:.3f}x torch.mm -> "
        f"stream_mma_eff {stream_eff:.3f}")
    hw = hardware_fields(probes.measure_all(log), ceil["matmul_tflops"])
    log(f"-> dsm_bytes_per_clk {', '.join(f'{v:.1f}' for v in hw['dsm_bytes_per_clk'][1:])} (cluster 2/4/8/16); "
        f"barrier_cycles {hw['barrier_cycles']:.0f}; fused_mma_eff {hw['fused_mma_eff']:.3f}")
    fields = dict(hbm_gbs=hbm, mma_tflops=ceil["matmul_tflops"], small_gemm_eff=gemm_eff,
                  launch_us=launch, dsm_bytes_per_clk=hw["dsm_bytes_per_clk"], barrier_cycles=hw["barrier_cycles"],
                  fused_mma_eff=hw["fused_mma_eff"], stream_mma_eff=stream_eff)
    # the fused kernels are fitted against the model with the constants just measured
    base = target.default_target()
    base = dict(_C.targets()["h200"] if isinstance(base, str) else base, **fields)
    fit = fit_term_scales(_kernel_samples(log, k, reps, target=base))
    log(f"fused kernels / model: median {fit['fused_time_scale']:.2f}; per-term factors "
        + ("adopted (leave-one-shape-out log error {:.3f} -> {:.3f}): ".format(fit["loso_uniform"], fit["loso_terms"])
           + ", ".join(f"{t} {v:.2f}" for t, v in fit["factors"].items()) if fit["adopted"] else "not adopted"))
    e = env()
    return dict(
        fields=dict(fields, fused_time_scale=fit["fused_time_scale"],
                    **{f"fused_scale_{t}": v for t, v in fit["factors"].items()}),
        details=dict(copy_tbps=ceil["copy_tbps"], stream_gbs=stream_gbs, gemv_us=gemv_us, fit=fit, wgmma_gemm=wg,
                     shapes=list(SHAPES), k=k, reps=reps, probes=hw["probes"]),
        gpu=e.gpu_name, sm_count=e.sm_count, torch=torch.__version__,
        measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def hardware_fields(probed, matmul_tflops):
    """The cost model's hardware constants from ``fuser.probes.measure_all`` output: dsm_bytes_per_clk
    per cluster size (slot 0, cluster 1, unused: 0), barrier_cycles at the fused kernel's thread count
    (median over cluster sizes 2-16), fused_mma_eff (the best warp tile over the matmul rate, at most 1).

    Example:
        >>> from fuser.tools.calibrate import hardware_fields
        >>> p = dict(dsm=[dict(cluster=c, bytes_per_clk=16.0) for c in (2, 4, 8, 16)],
        ...          barrier=[dict(cluster=c, threads=256, cycles=400.0 + c) for c in (1, 2, 4, 8, 16)],
        ...          mma=[dict(tile="2x4", tflops=300.0), dict(tile="4x4", tflops=400.0)])
        >>> f = hardware_fields(p, 800.0)
        >>> f["dsm_bytes_per_clk"], f["barrier_cycles"], f["fused_mma_eff"]
        ([0.0, 16.0, 16.0, 16.0, 16.0], 406.0, 0.5)
    """
    by_size = {r["cluster"]: r["bytes_per_clk"] for r in probed["dsm"]}
    sync = [r["cycles"] for r in probed["barrier"] if r["threads"] == probes.THREADS and r["cluster"] > 1]
    best = max(r["tflops"] for r in probed["mma"])
    return dict(dsm_bytes_per_clk=[0.0] + [float(by_size[c]) for c in probes.CLUSTERS],
                barrier_cycles=float(statistics.median(sync)), fused_mma_eff=min(1.0, best / matmul_tflops),
                probes=probed)


def calibrate(log=print, k=8, reps=10):
    """Measure this GPU (see the module docstring) and store the result where ``fuser.plan`` picks it up;
    returns (record, path). Plans cached in this process are dropped so the next call re-plans.

    Example:
        >>> from fuser.target import MEASURED
        >>> from fuser.tools.calibrate import calibrate
        >>> record, path = calibrate()  # doctest: +SKIP
        >>> sorted(record["fields"]) == sorted(MEASURED)  # doctest: +SKIP
        True
    """
    record = measure(log, k, reps)
    p = store.save("calibration", store.device_key(record["gpu"], record["sm_count"]), record)
    target.forget()
    route.forget()
    return record, p
