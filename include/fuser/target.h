/* target.h: the GPU target model, a plain data table per GPU that the cost model and the pruning
 * rules read. Defaults for the H200 and H100 SXM come from measurements (h200-baselines.md in the
 * shared docs); fuser_target_from_device() builds one from a live device's properties. No function
 * here touches CUDA: the caller passes the properties in. */
#ifndef FUSER_TARGET_H
#define FUSER_TARGET_H

#include <stdint.h>

#include "fuser/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Cluster sizes fuser may use, and the index of each in the per-size tables below. */
#define FUSER_NUM_CLUSTER_SIZES 5 /* 1, 2, 4, 8, 16 */
int fuser_cluster_size_index(int size); /* -1 if not a power of two in [1, 16] */

typedef struct fuser_target {
    char name[64];
    int sm_count;
    int usable_sms[FUSER_NUM_CLUSTER_SIZES]; /* SMs a grid of 1-block-per-SM clusters of each size can
                                                fill (uneven GPCs strand SMs: 132/132/120/120/112) */
    int smem_per_block;          /* opt-in maximum dynamic shared memory per block, bytes */
    int smem_per_sm;             /* bytes */
    int regs_per_sm;             /* 32-bit registers */
    int max_regs_per_thread;
    int max_cluster;             /* 16 where the non-portable size is allowed, else 8 */
    double clock_ghz;            /* sustained SM clock under load */
    double hbm_gbs;              /* HBM bandwidth a streaming kernel reaches, GB/s */
    double l2_gbs;               /* aggregate L2 read bandwidth, GB/s */
    double sm_load_gbs;          /* global-load bandwidth one SM can pull, GB/s */
    double mem_latency_us;       /* global load latency under load: bytes in flight / latency bounds an
                                    SM's bandwidth (Little's law), so pipeline depth matters */
    double dsm_bytes_per_clk[FUSER_NUM_CLUSTER_SIZES]; /* remote smem reads per SM per clock */
    double smem_bytes_per_clk;   /* local shared memory per SM per clock */
    double barrier_cycles;       /* one cluster barrier (arrive.release + wait.acquire) */
    double launch_us;            /* one kernel launch on a busy stream */
    double mma_tflops;           /* dense 16-bit matmul rate of a cuBLAS-class kernel, TFLOP/s */
    double fused_mma_eff;        /* fraction of mma_tflops fuser's current GEMM main loop reaches */
    double fused_time_scale;     /* measured fused kernel time / the model's prediction (calibration of
                                    the whole fused estimate) */
    /* per-term corrections on top of fused_time_scale (1 = none): each fused cost term is multiplied by
     * fused_time_scale x its own factor, fitted to measured kernels (fuser/calibrate.py) */
    double fused_scale_compute, fused_scale_hbm, fused_scale_l2, fused_scale_dsm, fused_scale_smem,
        fused_scale_sync, fused_scale_tail;
    double small_gemm_eff;       /* fraction of hbm_gbs library GEMMs reach when weight-streaming */
    /* the unfused path (PyTorch eager ops in a CUDA graph): each kernel's fixed cost, the fraction of
     * mma_tflops its GEMMs reach when compute-bound, and each GEMM's ramp: eager_ramp_us x (1 -
     * exp(-bytes / eager_ramp_mb)) of fill and drain on top of its bandwidth or compute time */
    double eager_op_us, eager_mma_eff, eager_ramp_us, eager_ramp_mb;
    /* what the activation costs in the up GEMM's cuBLASLt epilogue (fuser_eager_epilogue) in place of its own
     * kernel's eager_op_us: the epilogue GEMM's time over a plain GEMM's */
    double eager_epilogue_us;
    /* a 16-bit library GEMM's compute time tc and bandwidth time tm do not overlap fully: max(tc, tm)
     * plus the excess of their smooth maximum (tc^p + tm^p)^(1/p), p = eager_mixed_p (large: none), in
     * full from eager_mixed_mb MB of weights on and in proportion below (small GEMMs' ramp covers it) */
    double eager_mixed_p, eager_mixed_mb;
    /* a packed chain's gate and up GEMM (one GEMM of 2 N rows) where its output tiles fit on the SMs at once:
     * this share (0 to 1) of it priced as one GEMM, fill and drain once (0: as two GEMMs, as the ops run them);
     * docs/planner.md, "The merged GEMM's fill and drain" */
    double eager_packed_merge;
    /* a quantized chain's eager GEMMs from FUSER_FP8_ROWWISE_TOKENS tokens on (torch._scaled_mm, rowwise
     * scales): their rate over mma_tflops when compute-bound (above 1: e4m3 tensor cores), and the rate
     * they read their weights at over the 16-bit GEMMs' (small_gemm_eff x hbm_gbs) */
    double eager_fp8_mma_eff, eager_fp8_hbm_eff;
    /* the stream kernel family (csrc/stream.c): its wgmma main loop's fraction of mma_tflops, its fixed
     * cost per launch beyond launch_us (pipeline fill, the H hand-off, the last reduction), and the
     * measured / modelled ratio of its time */
    double stream_mma_eff, stream_fixed_us, stream_time_scale;
    /* shared-memory bytes per clock the stream kernel's SS wgmma sustain (operand-bound below N = 128),
     * and the fixed cost of one work unit (its epilogue and the ring's restart); the same for a one-phase
     * plan whose units each read their own weights and wait for nothing: of a single row tile, or of
     * units that all run at once (one round) reading at most stream_unit_one_kb KB of weights each */
    double stream_operand_bytes_per_clk, stream_unit_us, stream_unit_one_us, stream_unit_one_kb;
    /* the MMA rate (over the matmul rate) of a single round of 128-row phase-1 units on one row tile */
    double stream_round_mma_eff;
    /* the HBM rate a stream plan of one row tile is priced at (before stream_time_scale), GB/s: the H200's
     * hbm_gbs, whose ring reads are bound by the bytes they keep in flight; a part of lower theoretical
     * bandwidth (the H100) streams at that theoretical rate (docs/planner.md "The stream's HBM rate on
     * other parts"). Plans of several row tiles stay at hbm_gbs. A target that changes hbm_gbs changes this
     * with it where it should apply (fuser.target.apply scales it with a calibrated hbm_gbs). */
    double stream_hbm_gbs;
    /* the read profile of a long stream on the part: stream_ramp_us + bytes / stream_long_gbs, as measured
     * (torch.sum over 64 MB-1.6 GB on the H200: 8.1 us + bytes / 4.33 TB/s). The scaled rate above was
     * fitted to streams of 70-350 MB, whose start it carries in proportion; a one-row-tile plan's weight
     * stream is priced at the lesser of the two, so the start of a 1.4 GB stream (LLaMA-70B) is paid once,
     * not 4x (docs/planner.md "Long streams"). */
    double stream_long_gbs, stream_ramp_us;
    /* the rate at which a swap-AB plan of several row tiles moves its weight tiles from L2 into the SMs, GB/s:
     * every row tile reads each weight tile again, the row tiles of a tile at about the same time (consecutive
     * units), so L2 serves the weights once per row tile while HBM serves them once (docs/planner.md, "Swap-AB
     * plans of several row tiles") */
    double stream_reread_gbs;
    /* bytes per second one SM of the stream kernel pulls (TMA into its ring; measured 26-50 GB/s in
     * unit traces): what a phase with fewer units than SMs is limited by */
    double stream_sm_gbs;
    /* the token rows (row tiles x bm) up to which the modelled tail (its phases in sequence over the
     * largest single bound) of an e4m3 plan whose weights outgrow L2 holds in full: beyond, it is scaled
     * by this / those rows (fitted to 46 timed 7B-70B plans of 2-16 row tiles, docs/planner.md) */
    double stream_fp8_tail_rows;
    double stream_margin;        /* the same for stream plans (their model's own error) */
    double fusion_margin;        /* a fused plan is chosen over the unfused path only when predicted at
                                    least this much faster (0.1: 10%): the model's error is larger than
                                    small predicted gains, and a fused kernel that loses is a slowdown */
    int64_t max_workspace;       /* bytes of global scratch a plan may use (inter-cluster partials) */
} fuser_target;

/** Named defaults: "h200", "h100" (H100 SXM). NULL if unknown. */
const fuser_target *fuser_target_builtin(const char *name);
/** Comma-separated names of the built-in targets, for error messages. */
const char *fuser_target_names(void);

/** Properties of a live device, as read from the driver. */
typedef struct {
    char name[256];
    int cc_major, cc_minor, sm_count, smem_per_block_optin, smem_per_sm, regs_per_sm, l2_bytes;
    int clock_khz, mem_clock_khz, mem_bus_bits;
} fuser_device_props;

/** A target for a live device: measured Hopper constants, scaled by the device's own SM count,
 * clocks, memory bus and shared memory. Fails (FUSER_E_UNSUPPORTED) for devices that are not sm_90. */
int fuser_target_from_device(const fuser_device_props *p, fuser_target *out, fuser_err *err);

/** Check a target's numbers are usable (positive, in range); FUSER_E_VALUE saying which is not. */
int fuser_target_check(const fuser_target *t, fuser_err *err);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_TARGET_H */
