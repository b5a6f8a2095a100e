/* target.c: built-in GPU targets (measured H200 numbers; H100 SXM scaled from them) and targets built
 * from a live device's properties. */
#include "fuser/target.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int fuser_cluster_size_index(int size)
{
    for (int i = 0; i < FUSER_NUM_CLUSTER_SIZES; i++)
        if (size == 1 << i)
            return i;
    return -1;
}

/* NOTE: every number below is a measurement on one H200 (shared docs, h200-baselines.md, or
 * `python -m fuser calibrate` where its comment says so) unless the comment says otherwise; calibrate
 * re-measures the fields of fuser.calibrate.MEASURED on any Hopper GPU and the planner uses those. */
static const fuser_target builtin[] = {
    {
        .name = "h200",
        .sm_count = 132,
        .usable_sms = {132, 132, 120, 120, 112}, /* occupancy query at >= 128 KB smem per block */
        .smem_per_block = 232448,
        .smem_per_sm = 233472,
        .regs_per_sm = 65536,
        .max_regs_per_thread = 255,
        .max_cluster = 16,
        .clock_ghz = 1.70,          /* 1.41-1.98 GHz seen under the 700 W cap; a mid value */
        /* NOTE: hbm_gbs, mma_tflops and launch_us: `python -m fuser calibrate` on the H200, 2026-11-29
         * (commit 1e8bbf5, docs/gpu-results.md): 1 GiB copy 4.189 TB/s x 1.05 streaming/copy; 8192^3
         * bf16 matmul; tiny kernels back to back in a CUDA graph. Were 4480 (baselines doc), 767.9 and
         * 2.5 (derived). small_gemm_eff below: that run's 0.668 timed a lone eager GEMM (host latency
         * included; calibrate now uses a graph); the cuBLAS-GEMMs-in-a-graph column of
         * benchmarks/RESULTS.md run3 streams the weights at M=16 at 0.79 (LLaMA-2-7B), 0.81 (GPT-3),
         * 0.84 (LLaMA-3-8B) and 0.93 (LLaMA-70B) of 4398 GB/s. */
        .hbm_gbs = 4398.0,
        .l2_gbs = 8500.0,           /* L2-resident reads, 7.4-8.9 TB/s */
        .sm_load_gbs = 110.0,       /* derived: ~64 B/clk per SM of load throughput at 1.7 GHz */
        .mem_latency_us = 0.7,      /* not yet measured: ~1200 cycles under load, assumed */
        /* NOTE: dsm_bytes_per_clk, barrier_cycles, fused_mma_eff: `python -m fuser calibrate`'s probes
         * (include/fuser/device/probes.cuh) on the H200, 2026-11-29 (docs/gpu-results.md, fourth session),
         * at the fused kernel's 256 threads per block, one block per SM, the whole GPU at once:
         * remote ld.shared::cluster.v4 streaming at cluster 2/4/8/16; one barrier.cluster
         * arrive.release + wait.acquire (371-379 cycles over cluster 2-16, median 377); gemm1's
         * ldmatrix + mma.sync step from shared memory, best warp tile (4x8: 588 and 589 TFLOP/s in two
         * runs) over this table's mma_tflops: 0.773 (calibrate divides by its own run's matmul reading,
         * 0.742 and 0.794 under the power cap; the product is what the model uses). At the baselines
         * doc's 1024 threads the same probes read 16.3 / 12.6 / 15.6 / 14.9 B/clk and 616-633 barrier
         * cycles, the doc's numbers within 3%. Were 16.4, 12.4, 15.5, 15.0 (1024 threads), 390
         * (interpolated) and 0.45 (assumed). */
        .dsm_bytes_per_clk = {0.0, 16.0, 14.3, 14.4, 15.1},
        .smem_bytes_per_clk = 127.3,
        .barrier_cycles = 377.0,
        .launch_us = 1.24,
        .mma_tflops = 762.2,
        .fused_mma_eff = 0.773,
        /* NOTE: fused_time_scale and the per-term factors: fuser.calibrate.fit_term_scales on the 768
         * fused kernels measured on the H200 (benchmarks/results/2026-11-29-h200-planner.csv and
         * -planner-2.csv: the 64 best predicted candidates of 6 shapes, twice, each in a CUDA graph),
         * their terms converted to the constants above (benchmarks/planner_accuracy.py COSTED_WITH;
         * tests/test_calibrate_tune.py refits them): median measured / modelled 2.62, leave-one-shape-
         * out mean squared log error 0.106 -> 0.037 with the factors. The compute factor puts the fused
         * kernels' FLOP rate at 1 / (2.62 x 1.59) of what their main loop does from shared memory
         * (0.19 of the matmul rate): operand staging and the pipeline, not mma.sync, hold them back
         * (benchmarks/RESULTS.md). Calibrate's own fit on that day (40 kernels,
         * scale 2.98) predicts the 768 with log error 0.011, as well as this fit does; this table predicts
         * 384 kernels timed after it was set (-planner-3.csv) with 0.011. */
        .fused_time_scale = 2.618,
        .fused_scale_compute = 1.585, .fused_scale_hbm = 0.459, .fused_scale_l2 = 0.782,
        .fused_scale_dsm = 1.221, .fused_scale_smem = 1.000, .fused_scale_sync = 1.418,
        .fused_scale_tail = 1.102,
        /* NOTE: the eager path's constants and the stream ones below (all but stream_mma_eff) were fitted
         * together by benchmarks/fit_stream.py (coordinate descent on mean squared log error) to the
         * H200 runs of 2026-12-02 (benchmarks/results/2026-12-02-h200-{fit-sweep,fit-decode,prefill-a,
         * prefill-b}.json): 173 stream plans of 20 shapes (1-1024 tokens, GPT-2 to LLaMA-70B, the paper's
         * 128-token chains) and eager in a CUDA graph beside each, four or more calls per graph. Eager:
         * msle 0.139 -> 0.002 (small chains were predicted 2x too fast: each eager kernel costs ~2.2 us
         * in a graph and each GEMM ~2.8 us of ramp); stream: 0.038 -> 0.015. The planner's pick then
         * beats or ties eager on every one of the 20 shapes (1.16-1.32x at GPT-2 decode, 1.07-1.11x on
         * 7B decode measured again out of sample, eager from 128 tokens on). */
        .small_gemm_eff = 0.972,
        .eager_op_us = 2.182, .eager_mma_eff = 0.959, .eager_ramp_us = 2.807, .eager_ramp_mb = 2.508,
        /* the bias-free ReLU chains' eager route with the activation in the up GEMM's epilogue over a zero bias
         * against PyTorch's ops (G4-G10 at 16-128 tokens, twice each, 2026-12-06, -thirtyseventh-zero-bias-{a,b}):
         * 1.15-2.32 us saved, of which H's two passes account for 0.09-0.95, the launch ~1.1 of eager_op_us */
        .eager_epilogue_us = 1.1,
        /* the overlap loss: eager FFNs of 7B-70B weights at 64-128 tokens measured 4-13% over the plain maximum
         * (2026-12-04, docs/planner.md "64-128 tokens"), those of a few MB at any token count under
         * it; p = 3 from 64 MB of weights on: msle of the 46 timed cells of 50 MB or more 0.0015 -> 0.0013 (all
         * 210: 0.0067 -> 0.0066), every pick it changes timed (docs/planner.md) */
        .eager_mixed_p = 3.0, .eager_mixed_mb = 64.0,
        /* half the merged GEMM's saving: the packed route's 18 timed cells here (S1, S2, S4 at 77-128 tokens, S8 at
         * 48-128, 2026-12-07) fit best at 0.5 (log error rms 0.025, bias -0.003; 0.050 and +0.040 as two GEMMs,
         * 0.057 and -0.048 as one; docs/planner.md) */
        .eager_packed_merge = 0.5,
        /* PyTorch's rowwise e4m3 FFNs at 128-512 tokens of four 7B-70B shapes (2026-12-03, benchmarks/RESULTS.md,
         * twentieth session; msle 0.009): the GEMMs 1.3x the bf16 rate when compute-bound, their e4m3 weights
         * read at two thirds of the bf16 byte rate when not */
        .eager_fp8_mma_eff = 1.3, .eager_fp8_hbm_eff = 0.667,
        /* stream_mma_eff is the wgmma GEMM probe's rate over the matmul rate (0.82 at 8192^3 on the H200,
         * 2026-12-01, benchmarks/RESULTS.md): the kernel's SS wgmma are fed at ~94 of shared memory's 127
         * B/clk (so N <= 32 is operand-bound); ~2 us per unit of epilogue and ring restart; ~1.2 us per
         * launch of fill and hand-off; 1.14x the modelled rest. */
        .stream_mma_eff = 0.80, .stream_fixed_us = 1.194, .stream_time_scale = 1.14,
        .stream_operand_bytes_per_clk = 93.713, .stream_unit_us = 1.985, .stream_sm_gbs = 75.6,
        /* 0.4 of stream_unit_us, where picks over 117 small-chain cells timed on the H200 stop improving
         * (docs/planner.md); the per-unit cost the joint fit found is an average over plans of many rounds */
        .stream_unit_one_us = 0.794,
        /* where that cost holds for several row tiles: the small chains' one-round units of up to ~72 KB of
         * weights (G1-G3) measure like one row tile's, those of 113 KB and more (G7, G9, G10) do not
         * (docs/planner.md); halfway in log scale, rounded */
        .stream_unit_one_kb = 96.0,
        /* measured e4m3 7B-70B plans show ~1x their modelled tail at 2-3 row tiles of 128 tokens and
         * 0-0.5x at 8-16, so the tail is scaled by 384 / rows beyond 384 rows (the fit: docs/planner.md) */
        .stream_fp8_tail_rows = 384.0,
        /* one round of 128-row phase-1 units at 64-128 tokens: LLaMA-2-7B's 86 units of 268 MFLOP ran their
         * main loops in 45.7 us, the matmul rate (unit traces, docs/planner.md "64-128 tokens") */
        .stream_round_mma_eff = 1.0,
        .stream_hbm_gbs = 4398.0,   /* hbm_gbs */
        /* fitted to the bm 16 decode plans of 268-1409 MB timed here (LLaMA-70B's 1.41 GB at one token in
         * 334.7 us, LLaMA-2-7B's 271 MB in 71.8): torch.sum's rate (docs/planner.md "Long streams") */
        .stream_long_gbs = 4330.0, .stream_ramp_us = 6.5,
        .stream_reread_gbs = 8500.0,
        .fusion_margin = 0.10,      /* policy: the calibrated model's typical error is ~20% (log error
                                       0.037 leave-one-shape-out), so gains under 10% are not trusted */
        .stream_margin = 0.03,      /* policy: fitted without S8, the models pick for it a stream plan
                                       predicted 2.5% faster than eager that measures 0.90x; at 2.5% G9 at
                                       128 tokens takes a plan measured 0.88x eager. At 3% the picks that
                                       change from eager (GPT-3 6.7B and G5 at 1-32 and 96 tokens, G10 at
                                       192) measured 1.00-1.09x eager on an H100, GPT-3 6.7B's 1.02-1.07x
                                       on the H200 (docs/planner.md) */
        .max_workspace = (int64_t)256 << 20,
    },
    {
        .name = "h100",
        .sm_count = 132,
        .usable_sms = {132, 132, 120, 120, 112},
        .smem_per_block = 232448,
        .smem_per_sm = 233472,
        .regs_per_sm = 65536,
        .max_regs_per_thread = 255,
        .max_cluster = 16,
        .clock_ghz = 1.70,
        .hbm_gbs = 3130.0,          /* scaled: 3.35 TB/s spec x the H200's measured 0.93 efficiency */
        .l2_gbs = 8500.0,
        .sm_load_gbs = 110.0,
        .mem_latency_us = 0.7,
        .dsm_bytes_per_clk = {0.0, 16.0, 14.3, 14.4, 15.1}, /* the H200's (same SMs and network) */
        .smem_bytes_per_clk = 127.3,
        .barrier_cycles = 377.0,
        .launch_us = 1.24,        /* the H200's (same chip and driver path) */
        .mma_tflops = 762.2,      /* the H200's (same SMs) */
        .fused_mma_eff = 0.773,
        .fused_time_scale = 2.618,  /* the H200's median, until measured here */
        .fused_scale_compute = 1, .fused_scale_hbm = 1, .fused_scale_l2 = 1, .fused_scale_dsm = 1,
        .fused_scale_smem = 1, .fused_scale_sync = 1, .fused_scale_tail = 1,
        .small_gemm_eff = 0.972,  /* the H200's, until measured here */
        .eager_op_us = 2.182, .eager_mma_eff = 0.959, .eager_ramp_us = 2.807, .eager_ramp_mb = 2.508,
        .eager_epilogue_us = 1.1, .eager_mixed_p = 3.0, .eager_mixed_mb = 64.0, /* the H200's */
        /* S8's packed route at 16-256 tokens timed 18.6-22.5 us, priced 20.7-24.6 with two GEMMs' fill and drain
         * and 18.3-21.9 with one (docs/planner.md, "The merged GEMM's fill and drain") */
        .eager_packed_merge = 1.0,
        .eager_fp8_mma_eff = 1.3, .eager_fp8_hbm_eff = 0.667, /* the H200's */
        .stream_mma_eff = 0.80, .stream_fixed_us = 1.194, .stream_time_scale = 1.14, /* the H200's */
        .stream_operand_bytes_per_clk = 93.713, .stream_unit_us = 1.985, .stream_sm_gbs = 75.6,
        .stream_unit_one_us = 0.794, .stream_unit_one_kb = 96.0, .stream_fp8_tail_rows = 384.0,
        .stream_round_mma_eff = 1.0,
        .stream_hbm_gbs = 3352.0,   /* its theoretical 3.35 TB/s: 2619 MHz x 2 x 5120 bits */
        /* fitted to its bm 16 decode plans of 101-1409 MB (S4 at one token in 40.3 us, LLaMA-70B in 468.2):
         * 0.91 of its theoretical rate (a device target takes that fraction, with the H200's ramp) */
        .stream_long_gbs = 3050.0, .stream_ramp_us = 5.0,
        .stream_reread_gbs = 6000.0,
        .fusion_margin = 0.10,
        .stream_margin = 0.03,
        .max_workspace = (int64_t)256 << 20,
    },
};

const fuser_target *fuser_target_builtin(const char *name)
{
    for (size_t i = 0; name && i < sizeof builtin / sizeof builtin[0]; i++)
        if (!strcmp(name, builtin[i].name))
            return &builtin[i];
    return NULL;
}

const char *fuser_target_names(void)
{
    return "h200, h100";
}

/* The H200's theoretical bandwidth, GB/s (3201 MHz x 2 transfers x 6144 bits), which its table's rates were
 * measured on (hbm_gbs 4398 is 0.894 of it). */
#define H200_THEORETICAL_GBS (2.0 * 3201e3 * 1e3 * 6144 / 8.0 / 1e9)

int fuser_target_from_device(const fuser_device_props *p, fuser_target *t, fuser_err *err)
{
    if (p->cc_major != 9 || p->cc_minor != 0)
        return fuser_fail(err, FUSER_E_UNSUPPORTED, "%s is sm_%d%d: fuser's planner models Hopper (sm_90) only",
                          p->name, p->cc_major, p->cc_minor);
    *t = builtin[0];
    snprintf(t->name, sizeof t->name, "%.63s", p->name);
    const double ref_sms = t->sm_count;
    if (p->sm_count > 0) {
        /* the GPC layout of a smaller part is unknown: keep the measured stranding fractions */
        for (int i = 0; i < FUSER_NUM_CLUSTER_SIZES; i++)
            t->usable_sms[i] = (int)floor(t->usable_sms[i] * p->sm_count / ref_sms);
        t->l2_gbs *= p->sm_count / ref_sms;
        t->sm_count = p->sm_count;
    }
    if (p->smem_per_block_optin > 0)
        t->smem_per_block = p->smem_per_block_optin;
    if (p->smem_per_sm > 0)
        t->smem_per_sm = p->smem_per_sm;
    if (p->regs_per_sm > 0)
        t->regs_per_sm = p->regs_per_sm;
    if (p->mem_clock_khz > 0 && p->mem_bus_bits > 0) {
        /* DDR: 2 transfers per clock */
        const double theoretical = 2.0 * p->mem_clock_khz * 1e3 * p->mem_bus_bits / 8.0 / 1e9;
        const fuser_target *h200 = &builtin[0];
        /* an H200 keeps its table's measured rate; another part 0.915 of its theoretical one (the H200's 4.8
         * TB/s datasheet rate over its measured one; calibrate measures the part's own) */
        const int same = fabs(theoretical / H200_THEORETICAL_GBS - 1) < 0.01;
        t->hbm_gbs = same ? h200->hbm_gbs : 0.915 * theoretical;
        /* the stream's reads: the part's theoretical rate up to the H200's, whose ring bounds them at its
         * hbm_gbs (docs/planner.md, "The stream's HBM rate on other parts") */
        t->stream_hbm_gbs = fmax(t->hbm_gbs, fmin(theoretical, h200->stream_hbm_gbs));
        /* long streams: 0.91 of the theoretical rate (an H100's fit) up to the H200's measured rate, and the
         * H200's ramp: both tables' values on their parts */
        t->stream_long_gbs = fmin(0.91 * theoretical, h200->stream_long_gbs);
        /* the L2's re-reads: the H200's table on an H200, the H100's (the one other part timed) elsewhere */
        if (!same) {
            t->stream_reread_gbs = fuser_target_builtin("h100")->stream_reread_gbs;
            t->eager_packed_merge = fuser_target_builtin("h100")->eager_packed_merge;
        }
    }
    if (p->sm_count > 0)
        t->stream_reread_gbs *= p->sm_count / ref_sms;
    return fuser_target_check(t, err);
}

int fuser_target_check(const fuser_target *t, fuser_err *err)
{
    const struct { const char *name; double v; } pos[] = {
        {"sm_count", t->sm_count}, {"smem_per_block", t->smem_per_block}, {"smem_per_sm", t->smem_per_sm},
        {"regs_per_sm", t->regs_per_sm}, {"max_regs_per_thread", t->max_regs_per_thread},
        {"clock_ghz", t->clock_ghz}, {"hbm_gbs", t->hbm_gbs}, {"l2_gbs", t->l2_gbs},
        {"sm_load_gbs", t->sm_load_gbs}, {"mem_latency_us", t->mem_latency_us},
        {"smem_bytes_per_clk", t->smem_bytes_per_clk},
        {"barrier_cycles", t->barrier_cycles}, {"mma_tflops", t->mma_tflops},
        {"fused_mma_eff", t->fused_mma_eff}, {"fused_time_scale", t->fused_time_scale},
        {"fused_scale_compute", t->fused_scale_compute}, {"fused_scale_hbm", t->fused_scale_hbm},
        {"fused_scale_l2", t->fused_scale_l2}, {"fused_scale_dsm", t->fused_scale_dsm},
        {"fused_scale_smem", t->fused_scale_smem}, {"fused_scale_sync", t->fused_scale_sync},
        {"fused_scale_tail", t->fused_scale_tail}, {"small_gemm_eff", t->small_gemm_eff},
        {"stream_mma_eff", t->stream_mma_eff}, {"stream_fixed_us", t->stream_fixed_us},
        {"stream_time_scale", t->stream_time_scale}, {"stream_operand_bytes_per_clk", t->stream_operand_bytes_per_clk},
        {"stream_sm_gbs", t->stream_sm_gbs}, {"stream_hbm_gbs", t->stream_hbm_gbs},
        {"stream_long_gbs", t->stream_long_gbs}, {"stream_reread_gbs", t->stream_reread_gbs},
        {"eager_op_us", t->eager_op_us}, {"eager_mma_eff", t->eager_mma_eff},
        {"eager_fp8_mma_eff", t->eager_fp8_mma_eff}, {"eager_fp8_hbm_eff", t->eager_fp8_hbm_eff},
        {"eager_ramp_mb", t->eager_ramp_mb}, {"stream_round_mma_eff", t->stream_round_mma_eff},
    };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (!(pos[i].v > 0) || !isfinite(pos[i].v))
            return fuser_fail(err, FUSER_E_VALUE, "target %s: %s must be positive, got %g", t->name, pos[i].name,
                              pos[i].v);
    if (t->fused_mma_eff > 1 || t->small_gemm_eff > 1 || t->stream_mma_eff > 1 || t->eager_mma_eff > 1 ||
        t->eager_fp8_hbm_eff > 1 || t->stream_round_mma_eff > 1)
        return fuser_fail(err, FUSER_E_VALUE, "target %s: efficiencies must be in (0, 1]", t->name);
    if (t->max_cluster != 8 && t->max_cluster != 16)
        return fuser_fail(err, FUSER_E_VALUE, "target %s: max_cluster must be 8 or 16, got %d", t->name,
                          t->max_cluster);
    for (int i = 0; i < FUSER_NUM_CLUSTER_SIZES; i++) {
        if (t->usable_sms[i] < (1 << i) || t->usable_sms[i] > t->sm_count)
            return fuser_fail(err, FUSER_E_VALUE, "target %s: usable_sms[%d] = %d is impossible with %d SMs",
                              t->name, 1 << i, t->usable_sms[i], t->sm_count);
        if (i > 0 && !(t->dsm_bytes_per_clk[i] > 0))
            return fuser_fail(err, FUSER_E_VALUE, "target %s: dsm_bytes_per_clk[%d] must be positive", t->name,
                              1 << i);
    }
    if (t->smem_per_block > t->smem_per_sm)
        return fuser_fail(err, FUSER_E_VALUE, "target %s: smem_per_block %d exceeds smem_per_sm %d", t->name,
                          t->smem_per_block, t->smem_per_sm);
    if (!(t->fusion_margin >= 0 && t->fusion_margin < 10) || !(t->stream_margin >= 0 && t->stream_margin < 10))
        return fuser_fail(err, FUSER_E_VALUE, "target %s: fusion_margin and stream_margin must be in [0, 10), got "
                          "%g and %g", t->name, t->fusion_margin, t->stream_margin);
    if (!(t->stream_unit_us >= 0) || !isfinite(t->stream_unit_us))
        return fuser_fail(err, FUSER_E_VALUE, "target %s: stream_unit_us must be >= 0, got %g", t->name,
                          t->stream_unit_us);
    if (!(t->stream_ramp_us >= 0) || !isfinite(t->stream_ramp_us))
        return fuser_fail(err, FUSER_E_VALUE, "target %s: stream_ramp_us must be >= 0, got %g", t->name,
                          t->stream_ramp_us);
    if (!(t->stream_unit_one_us >= 0) || !isfinite(t->stream_unit_one_us))
        return fuser_fail(err, FUSER_E_VALUE, "target %s: stream_unit_one_us must be >= 0, got %g", t->name,
                          t->stream_unit_one_us);
    if (!(t->stream_unit_one_kb >= 0) || !isfinite(t->stream_unit_one_kb))
        return fuser_fail(err, FUSER_E_VALUE, "target %s: stream_unit_one_kb must be >= 0, got %g", t->name,
                          t->stream_unit_one_kb);
    if (!(t->stream_fp8_tail_rows >= 1) || !isfinite(t->stream_fp8_tail_rows))
        return fuser_fail(err, FUSER_E_VALUE, "target %s: stream_fp8_tail_rows must be >= 1, got %g", t->name,
                          t->stream_fp8_tail_rows);
    if (!(t->eager_mixed_mb > 0) || !isfinite(t->eager_mixed_mb))
        return fuser_fail(err, FUSER_E_VALUE, "target %s: eager_mixed_mb must be positive, got %g", t->name,
                          t->eager_mixed_mb);
    if (!(t->eager_mixed_p >= 1) || !isfinite(t->eager_mixed_p))
        return fuser_fail(err, FUSER_E_VALUE, "target %s: eager_mixed_p must be >= 1, got %g", t->name,
                          t->eager_mixed_p);
    if (!(t->eager_packed_merge >= 0 && t->eager_packed_merge <= 1))
        return fuser_fail(err, FUSER_E_VALUE, "target %s: eager_packed_merge must be in [0, 1], got %g", t->name,
                          t->eager_packed_merge);
    if (!(t->eager_epilogue_us >= 0) || !isfinite(t->eager_epilogue_us))
        return fuser_fail(err, FUSER_E_VALUE, "target %s: eager_epilogue_us must be >= 0, got %g", t->name,
                          t->eager_epilogue_us);
    if (!(t->eager_ramp_us >= 0) || !isfinite(t->eager_ramp_us))
        return fuser_fail(err, FUSER_E_VALUE, "target %s: eager_ramp_us must be >= 0, got %g", t->name,
                          t->eager_ramp_us);
    if (t->max_workspace < 0)
        return fuser_fail(err, FUSER_E_VALUE, "target %s: max_workspace must be >= 0", t->name);
    return FUSER_OK;
}
