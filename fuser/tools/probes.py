"""fuser.tools.probes: the hardware microbenchmarks behind ``python -m fuser calibrate``.

The kernels live in ``include/fuser/device/probes.cuh`` (compiled by NVRTC through the kernel cache like
every fused kernel) and count their own cycles with ``clock64``, one block per SM, on the whole GPU:

  dsm(cluster)             remote shared-memory read bandwidth, bytes per clock per SM, at one cluster
                           size: each block streams its peer's shared memory with 16-byte
                           ``ld.shared::cluster`` loads (the cost model's ``dsm_bytes_per_clk``)
  barrier(cluster, threads) cycles of one full cluster barrier, release/acquire (``barrier_cycles``)
  mma(mt, nt)              the fused main loop's tensor-core rate with its operands in shared memory
                           (ldmatrix + mma.sync m16n8k16 on swizzled tiles, warp tile mt x m16 by nt x n8),
                           TFLOP/s from CUDA events (``fused_mma_eff`` = the best tile over the bf16 matmul rate)

Each result also carries the SM clock the probe ran at (its cycles over its event time).

  gemm(m, n, k, variant)   the wgmma main loop alone, as a GEMM (``include/fuser/device/gemm.cuh``: TMA into an
                           mbarrier ring, a producer warp, two consumer warpgroups, persistent blocks, optionally
                           clusters of 2 sharing B by multicast), checked against torch and timed side by side
                           with torch.mm on rotated inputs (the stream kernels' ``stream_mma_eff``)

Example:
    >>> from fuser.tools import probes
    >>> probes.dsm(2)["bytes_per_clk"] > 0           # doctest: +SKIP
    True
"""
from __future__ import annotations

import math
import statistics

import torch

from fuser import _C, jit
from fuser.tools.timing import time_interleaved

__all__ = ["SOURCE", "CLUSTERS", "BARRIER_THREADS", "MMA_TILES", "GEMM_VARIANTS", "GEMM_DTYPES", "STREAM_VARIANTS",
           "compiled", "dsm", "barrier", "mma", "gemm", "gemm_kernel", "gemm_smem", "stream", "measure_all"]

SOURCE = '#include "fuser/device/probes.cuh"\n'
#: Dynamic shared memory per block: above half an SM's, so each block has an SM to itself.
SMEM = 128 * 1024
GEMM_BM = 128                      # the GEMM probe's A tile rows (gemm.cuh)
THREADS = 256                      # the fused kernel's block (FUSER_THREADS)
CLUSTERS = (2, 4, 8, 16)           # the cost model's dsm_bytes_per_clk[1:]
BARRIER_THREADS = (128, 256, 384)
MMA_TILES = ((1, 4), (2, 4), (4, 4), (2, 8), (4, 8))
DSM_LOADS = 8                      # PROBE_DSM_LOADS: 16-byte loads per thread per iteration
MMA_WARPS = 8
REPEATS = 3                        # launches per measurement after a warm-up; the median is kept

#: wgmma GEMM probe variants: (B tile width, pipeline stages, cluster size along M).
GEMM_VARIANTS = ((256, 4, 1), (256, 4, 2), (128, 6, 2))
#: Weight-stream probe variants (the GEMM probe's producer alone): (B tile rows, pipeline stages, load). A
#: stage is rows x 128 bytes (a TMA box, or the producer warpgroup's 16-byte cp.async copies), so rows x
#: stages x 128 bytes are in flight per block; as many blocks run per SM as fit (one above ~113 KB of
#: ring). Loads: "tma" (every block walks its rows from column 0), "spread" (TMA, each block from its
#: own column, so that the blocks read different columns at any moment), "cp.async", "ldg" (the
#: consumers' 16-byte loads into registers, `stages` K steps in flight per thread, no shared memory), "cvt"
#: (TMA, and the consumers convert every slot's bytes as e4m3 to f16 before releasing it: whether 8-bit
#: weights converted in the SM keep up with the stream), and two that read each row tile (whole rows, one
#: contiguous region) in memory order instead of K step by K step: "bulk" (one 1-D bulk copy of the slot's
#: contiguous bytes) and "lin" ("ldg" with consecutive threads on consecutive 16 bytes).
STREAM_LOADS = {"tma": 1, "spread": 2, "cp.async": 3, "ldg": 4, "cvt": 5, "bulk": 6, "lin": 7}  # gemm.cuh's GemmRun
#: The loads into registers (no shared memory)
REGISTER_LOADS = ("ldg", "lin")
STREAM_VARIANTS = ((256, 6, "tma"), (128, 8, "tma"), (128, 8, "spread"), (128, 6, "tma"), (64, 4, "tma"),
                   (128, 8, "cp.async"), (256, 6, "cp.async"), (128, 6, "cp.async"), (64, 8, "cp.async"),
                   (128, 8, "cvt"), (256, 6, "cvt"), (128, 4, "ldg"), (64, 8, "ldg"), (128, 2, "ldg"),
                   (256, 6, "bulk"), (128, 8, "bulk"), (64, 8, "bulk"), (128, 4, "lin"), (128, 2, "lin"))


def _stream_smem(bn, stages, load):
    return 0 if load in REGISTER_LOADS else stages * bn * 128 + 2048


def _stream_name(bn, stages, load):
    return f"fuser_stream_{bn}_{stages}_{load.replace('.', '_')}"


def _stream_blocks(bn, stages, load):
    """Blocks of a stream variant per SM: as many as one SM's 228 KB of shared memory holds (1 KB reserved
    per block), or for loads into registers as the registers allow (4 per 16-byte load in flight, and ~32
    more per thread)."""
    if load in REGISTER_LOADS:
        return max(1, min(3, 65536 // (384 * (stages * bn * 8 // 256 * 4 + 32))))
    return min(3, 233472 // (_stream_smem(bn, stages, load) + 1024))


#: The GEMM probe's operand types: gemm.cuh's DT code and kernel name prefix ("e4m3": 8-bit operands, a
#: bfloat16 result).
GEMM_DTYPES = {"bfloat16": (0, "fuser_gemm"), "e4m3": (2, "fuser_gemm8")}

GEMM_SOURCE = '#include "fuser/device/gemm.cuh"\n' + "".join(
    f'extern "C" __global__ void __launch_bounds__(384, 1) {prefix}_{bn}_{st}_{cm}'
    f'(const __grid_constant__ fuser::GemmParams p) {{ fuser::Gemm<{dt}, {bn}, {st}, {cm}>::run(p); }}\n'
    for dt, prefix in GEMM_DTYPES.values() for bn, st, cm in GEMM_VARIANTS) + "".join(
    f'extern "C" __global__ void __launch_bounds__(384, {_stream_blocks(bn, st, load)}) {_stream_name(bn, st, load)}'
    f'(const __grid_constant__ fuser::GemmParams p) {{ fuser::Gemm<0, {bn}, {st}, 1, {STREAM_LOADS[load]}>::run(p); }}\n'
    for bn, st, load in STREAM_VARIANTS)

_loaded = {}


def compiled():
    """The probes' CUBIN (from the kernel cache after the first time); a ``fuser.jit.Compiled``.

    Example:
        >>> from fuser.tools import probes
        >>> sorted(k["name"] for k in probes.compiled().kernels)[:2]   # doctest: +SKIP
        ['fuser_probe_barrier', 'fuser_probe_dsm']
    """
    return jit.compile_source(SOURCE, "probes.cu")


def _kernel(name, source=SOURCE):
    dev = torch.cuda.current_device()
    if (dev, name) not in _loaded:
        cubin = compiled().cubin if source == SOURCE else jit.compile_source(source, "gemm_probe.cu").cubin
        _loaded[dev, name] = _C.probe_load(cubin, name, dev)
    return _loaded[dev, name]


def gemm_kernel(variant, dtype="bfloat16"):
    """The loaded GEMM probe of `variant` (bn, stages, cm) for operands of `dtype` (a ``GEMM_DTYPES`` key) on
    the current CUDA device.

    Example:
        >>> from fuser.tools import probes
        >>> k = probes.gemm_kernel(probes.GEMM_VARIANTS[0])        # doctest: +SKIP
    """
    if dtype not in GEMM_DTYPES:
        raise ValueError(f"gemm probe dtype {dtype!r}: expected one of {', '.join(GEMM_DTYPES)}")
    bn, stages, cm = variant
    return _kernel(f"{GEMM_DTYPES[dtype][1]}_{bn}_{stages}_{cm}", GEMM_SOURCE)


def gemm_smem(bn, stages):
    """Dynamic shared memory of a GEMM probe variant: its stages, barriers, and 1024 bytes to align them.

    Example:
        >>> from fuser.tools import probes
        >>> probes.gemm_smem(256, 4)
        198656
    """
    return stages * (128 + bn) * 128 + 2048


def stream(n, k, variant=STREAM_VARIANTS[0], iters=10):
    """The weight stream alone: persistent blocks read a bfloat16 ``[n, k]`` matrix once (slots of `variant`'s
    rows x 64 columns, row tiles dealt round-robin over the blocks, every slot released as it lands, or for
    "cvt" once the consumers have converted its bytes as e4m3; see ``STREAM_VARIANTS``), timed interleaved
    with torch reading the same matrix (``torch.sum`` in float32).
    Returns dict(variant, blocks, tbps, torch_tbps, ratio): the blocks that run at once, read rates in TB/s and
    ours over torch's. The matrix
    should dwarf L2 (50 MB on an H200) and its row tiles divide evenly over the SMs.

    Example:
        >>> from fuser.tools import probes
        >>> probes.stream(132 * 256 * 10, 512)["tbps"] > 3       # doctest: +SKIP
        True
    """
    bn, stages, load = variant
    k_ = _kernel(_stream_name(bn, stages, load), GEMM_SOURCE)
    smem = _stream_smem(bn, stages, load)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    a = torch.empty(GEMM_BM, k, device="cuda", dtype=torch.bfloat16)    # (a tensor map the stream never reads)
    c = torch.empty(GEMM_BM, n, device="cuda", dtype=torch.bfloat16)
    stream_ = torch.cuda.current_stream().cuda_stream
    t_ours, t_torch = time_interleaved([lambda: _C.gemm_launch(k_, a, b, c, bn, 1, smem, stream_),
                                        lambda: torch.sum(b, dtype=torch.float32)], rounds=iters)
    bytes_ = 2.0 * n * k
    blocks = _C.probe_clusters(k_, 384, 1, smem)
    return dict(variant=variant, blocks=blocks, tbps=bytes_ / t_ours / 1e6, torch_tbps=bytes_ / t_torch / 1e6,
                ratio=t_torch / t_ours)


def gemm(m, n, k, variant=GEMM_VARIANTS[0], sets=3, iters=20, dtype="bfloat16"):
    """The wgmma GEMM probe on [m, k] x [n, k]^T, checked against torch (relative error on fresh random
    inputs, output poisoned first) and timed interleaved with torch on `sets` rotated input sets: in
    bfloat16 against ``torch.mm``; with ``dtype="e4m3"`` on float8_e4m3fn operands (k and n multiples of
    16) into bfloat16, against ``torch._scaled_mm`` with unit scales, what PyTorch runs for fp8 GEMMs, the
    reference being the product of the same 8-bit values in float32. Returns dict(variant, dtype, tflops,
    torch_tflops, ratio, rel_error).

    Example:
        >>> from fuser.tools import probes
        >>> r = probes.gemm(8192, 8192, 8192)                      # doctest: +SKIP
        >>> r["ratio"] > 0.9                                       # doctest: +SKIP
        True
    """
    bn, stages, cm = variant
    k_ = gemm_kernel(variant, dtype)
    fp8 = dtype == "e4m3"
    if fp8 and (k % 16 or n % 16):
        raise ValueError(f"gemm probe: e4m3 operands need k and n multiples of 16 (16-byte rows, and what "
                         f"torch._scaled_mm takes), got k = {k}, n = {n}")
    smem = gemm_smem(bn, stages)
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731

    def operand(rows):
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        return x.to(torch.float8_e4m3fn) if fp8 else x
    ins = [(operand(m), operand(n)) for _ in range(sets)]
    # (8-bit operands reach the probe as 16-bit views of half the columns: the bytes TMA moves are the same)
    view = (lambda x: x.view(torch.uint8).view(torch.bfloat16)) if fp8 else (lambda x: x)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    a0, b0 = ins[0]
    _C.gemm_launch(k_, view(a0), view(b0), c, bn, cm, smem, stream())
    ref = a0.float() @ b0.float().T
    err = float((c.float() - ref).norm() / ref.norm())
    it = {"ours": 0, "torch": 0}
    one = torch.ones((), device="cuda", dtype=torch.float32)

    def ours():
        a, b = ins[it["ours"] % sets]
        it["ours"] += 1
        _C.gemm_launch(k_, view(a), view(b), c, bn, cm, smem, stream())

    def theirs():
        a, b = ins[it["torch"] % sets]
        it["torch"] += 1
        if fp8:
            torch._scaled_mm(a, b.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        else:
            torch.mm(a, b.T, out=c)
    t_ours, t_torch = time_interleaved([ours, theirs], rounds=iters)
    flops = 2.0 * m * n * k
    return dict(variant=variant, dtype=dtype, tflops=flops / t_ours / 1e6, torch_tflops=flops / t_torch / 1e6,
                ratio=t_torch / t_ours, rel_error=err)


def _launch(name, grid, block, cluster, iters):
    """Run one probe; (per-block cycles [grid], check values [grid], event milliseconds)."""
    k = _kernel(name)
    out = torch.full((grid, 2), float("nan"), device="cuda")
    stream = torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    _C.probe_launch(k, grid, block, cluster, SMEM, out, iters, stream.cuda_stream)
    end.record(stream)
    end.synchronize()
    host = out.cpu()
    return host[:, 0].tolist(), host[:, 1].tolist(), start.elapsed_time(end)


def _grid(name, block, cluster):
    n = _C.probe_clusters(_kernel(name), block, cluster, SMEM)
    if n < 1:
        raise RuntimeError(f"no cluster of {cluster} blocks with {SMEM} bytes of shared memory fits on this GPU")
    return n * cluster


def _median_run(name, grid, block, cluster, iters, check=None):
    """Warm up, then REPEATS launches; per launch the median block's cycles and the event time.
    Returns (cycles, ms, clock GHz) medians."""
    _launch(name, grid, block, cluster, max(1, iters // 10))
    runs = []
    for _ in range(REPEATS):
        cycles, checks, ms = _launch(name, grid, block, cluster, iters)
        if check is not None:
            check(checks)
        c = statistics.median(cycles)
        runs.append((c, ms, max(cycles) / (ms * 1e6)))
    return tuple(statistics.median(r[i] for r in runs) for i in range(3))


def dsm(cluster, threads=THREADS, iters=1000):
    """Remote shared-memory read bandwidth at one cluster size (every SM reading its peer at once), with
    `threads` per block (the fused kernel's 256 by default).

    Example:
        >>> from fuser.tools import probes
        >>> r = probes.dsm(4)                                      # doctest: +SKIP
        >>> sorted(r)                                              # doctest: +SKIP
        ['blocks', 'bytes_per_clk', 'clock_ghz', 'cluster', 'tbps', 'threads']
    """
    grid = _grid("fuser_probe_dsm", threads, cluster)

    def peers_read(checks):
        want = [b - b % cluster + (b % cluster + 1) % cluster for b in range(grid)]
        bad = [b for b, (got, w) in enumerate(zip(checks, want)) if int(got) != w]
        if bad:
            raise RuntimeError(f"DSM probe at cluster {cluster}: block {bad[0]} read block {checks[bad[0]]} "
                               f"instead of its peer {want[bad[0]]}")
    cycles, ms, ghz = _median_run("fuser_probe_dsm", grid, threads, cluster, iters, peers_read)
    per_block = iters * DSM_LOADS * 16 * threads
    return dict(cluster=cluster, threads=threads, blocks=grid, bytes_per_clk=per_block / cycles,
                tbps=per_block * grid / (ms * 1e9), clock_ghz=ghz)


def barrier(cluster, threads=THREADS, iters=2000):
    """Cycles of one cluster barrier with `threads` per block, every SM running the loop.

    Example:
        >>> from fuser.tools import probes
        >>> 100 < probes.barrier(2, 256)["cycles"] < 1000          # doctest: +SKIP
        True
    """
    grid = _grid("fuser_probe_barrier", threads, cluster)
    cycles, ms, ghz = _median_run("fuser_probe_barrier", grid, threads, cluster, iters)
    return dict(cluster=cluster, threads=threads, blocks=grid, cycles=cycles / iters, clock_ghz=ghz)


def mma(mt, nt, iters=2000):
    """The main loop's rate from shared memory for a warp tile of mt x 16 rows by nt x 8 columns.

    Example:
        >>> from fuser.tools import probes
        >>> r = probes.mma(2, 4)                                   # doctest: +SKIP
        >>> r["tile"], r["tflops"] > 0                             # doctest: +SKIP
        ('2x4', True)
    """
    name = f"fuser_probe_mma_{mt}x{nt}"
    grid = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count

    def finite(checks):
        if not all(math.isfinite(v) for v in checks):
            raise RuntimeError(f"MMA probe {mt}x{nt}: accumulators not finite")
    cycles, ms, ghz = _median_run(name, grid, THREADS, 1, iters, finite)
    flops = grid * MMA_WARPS * iters * 4 * mt * nt * (16 * 8 * 16 * 2)   # 4 k16 steps per BK = 64
    return dict(tile=f"{mt}x{nt}", tflops=flops / (ms * 1e9), flop_per_clk_sm=flops / grid / cycles, clock_ghz=ghz)


def measure_all(log=print):
    """Every probe at every size; returns dict(dsm=[...], barrier=[...], mma=[...]) of the dicts above.

    Example:
        >>> from fuser.tools import probes
        >>> [len(v) for v in probes.measure_all(log=lambda s: None).values()]   # doctest: +SKIP
        [4, 15, 5]
    """
    out = dict(dsm=[], barrier=[], mma=[])
    for c in CLUSTERS:
        out["dsm"].append(dsm(c))
    log("DSM reads, B/clk/SM: " + ", ".join(f"cluster {r['cluster']} {r['bytes_per_clk']:.1f} ({r['tbps']:.2f} TB/s)"
                                            for r in out["dsm"]))
    for t in BARRIER_THREADS:
        for c in (1,) + CLUSTERS:
            out["barrier"].append(barrier(c, t))
    log("cluster barrier, cycles: " + "; ".join(
        f"{t} threads " + "/".join(f"{r['cycles']:.0f}" for r in out["barrier"] if r["threads"] == t)
        for t in BARRIER_THREADS) + " (cluster 1/2/4/8/16)")
    for mt, nt in MMA_TILES:
        out["mma"].append(mma(mt, nt))
    log("main loop from shared memory, TFLOP/s: " + ", ".join(f"{r['tile']} {r['tflops']:.0f}" for r in out["mma"]))
    return out
