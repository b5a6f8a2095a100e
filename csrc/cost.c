/* cost.c: the analytical cost model: exact bytes per memory level and a time breakdown for a plan.
 *
 * Every byte count here is a closed form of the schedule in include/fuser/plan.h; csrc/interp.c
 * executes the same schedule and counts the same bytes one load at a time. Sums over blocks factor
 * into products because a block's in-bounds extent along tokens, d_ff, d_model and output depends
 * only on its coordinate along that dimension (e.g. summed over all blocks, the in-bounds d_ff
 * columns of every chunk add up to exactly d_ff). */
#include "fuser/cost.h"
#include "fuser/stream.h"

#include <math.h>

/* Compulsory global bytes of a chain: inputs once, output once. */
static double compulsory_bytes(const fuser_chain *c)
{
    const double e = fuser_dtype_size(c->dtype), eo = fuser_dtype_size(fuser_chain_out_dtype(c));
    double w = (double)c->n * c->k * (c->gated ? 2 : 1) + (double)c->l * c->n;
    double b = (double)c->n * (c->bias_up + c->bias_gate) + (double)c->l * c->bias_down;
    return e * w + eo * ((double)c->m * c->k + b + (double)c->m * c->l);
}

static double chain_flops(const fuser_chain *c)
{
    return 2.0 * c->m * c->n * ((double)c->k * (c->gated ? 2 : 1) + c->l);
}

double fuser_chain_floor_us(const fuser_chain *c, const fuser_target *t)
{
    double tc = chain_flops(c) / (t->mma_tflops * (c->dtype == FUSER_E4M3 ? 2 : 1) * 1e6);
    double tm = compulsory_bytes(c) / (t->hbm_gbs * 1e3);
    return tc > tm ? tc : tm;
}

/* Global (l2) bytes by phase: GEMM1 operands, GEMM2 operands, and the rest (outputs, workspace). */
typedef struct {
    int64_t g1, g2, rest;
} l2_split;

static void traffic(const fuser_plan *p, fuser_traffic *out, l2_split *split)
{
    const fuser_chain *c = &p->chain;
    const int64_t M = c->m, K = c->k, N = c->n, L = c->l;
    const int64_t rows_blocks = p->grid_m * p->cls_m;   /* distinct (cm, im) */
    const int64_t cols_blocks = p->grid_n * p->cls_n;   /* distinct (cn, in) */
    const int64_t kmul = p->cls_k / p->ksplit;          /* 2 in gated spatial mode: gate and up blocks */
    const int64_t nbias1 = c->bias_up + c->bias_gate;
    const int64_t B = p->blocks, J = p->n_iters, LC = p->lc;
    const int64_t bm = p->bm, bn = p->bn, bl = p->bl, sw = p->sw;

    /* l2: every global load/store, in-bounds bytes */
    l2_split s = {0, 0, 0};
    s.g1 += 2 * M * K * J * cols_blocks * kmul;               /* X tiles, once per d_ff chunk */
    s.g1 += 2 * p->parts * kmul * N * K * rows_blocks;        /* W_up / W_gate tiles */
    s.g1 += 2 * nbias1 * N * rows_blocks * p->cls_k;          /* b_up / b_gate, every replica */
    s.g2 += 2 * L * N * rows_blocks;                          /* W_down tiles */
    s.rest += 2 * c->bias_down * L * rows_blocks;             /* b_down, once per stored share */
    s.rest += 2 * M * L;                                      /* Y */
    int64_t ws = 0;
    if (p->grid_n > 1) {
        ws = 2 * B * LC * bm * sw * 4;                        /* partial shares written, then read */
        s.rest += ws + 4 * B * LC + 4 * p->tickets;           /* + ticket atomics and resets */
    }
    int64_t l2 = s.g1 + s.g2 + s.rest;
    /* hbm: compulsory bytes plus the workspace round trip */
    int64_t hbm = (int64_t)compulsory_bytes(c) + ws;
    /* dsm: reads of peers' shared memory */
    int64_t dsm = B * J * (p->cls_k - 1) * p->parts * bm * bn * 4      /* all_exchange */
                + B * J * (p->cls_shuffle - 1) * bm * bn * 2          /* shuffle */
                + B * LC * (p->cls_reduce - 1) * bm * sw * 4;         /* reduce_scatter */
    /* smem: bytes written into shared memory */
    int64_t smem = p->grid_m * p->grid_n * p->cls_m * p->cls_n * kmul * p->kt * J * (bm + p->parts * bn) *
                   FUSER_BK * 2;                                      /* GEMM1 operand tiles */
    smem += (p->cls_k > 1) * B * J * p->parts * bm * bn * 4;           /* published partials */
    smem += B * J * p->cls_shuffle * bm * bn * 2;                      /* own H + copied slices */
    smem += B * LC * p->cls_shuffle * J * bl * bn * 2;                 /* GEMM2 operand tiles */
    smem += (p->cls_reduce > 1) * B * LC * bm * bl * 4;                /* published output partials */
    out->hbm = hbm;
    out->l2 = l2;
    out->dsm = dsm;
    out->smem = smem;
    if (split)
        *split = s;
}

void fuser_plan_traffic(const fuser_plan *p, fuser_traffic *out)
{
    if (p->kind == FUSER_KIND_STREAM)
        fuser_stream_traffic(p, out);
    else
        traffic(p, out, NULL);
}

/* Bandwidth (bytes/s) the busy SMs pull from L2 when each keeps (stages - 1) tiles of
 * `stage_bytes` in flight: the lesser of L2's aggregate rate and Little's law per SM. */
static double l2_bw(const fuser_target *t, const fuser_plan *p, double sms, double stage_bytes)
{
    double per_sm = fmin(t->sm_load_gbs * 1e9, (p->stages - 1) * stage_bytes / (t->mem_latency_us * 1e-6));
    return fmin(t->l2_gbs * 1e9, sms * per_sm);
}

/* Time of one library GEMM [m x k] x [k x n] (+ bias) as a separate kernel, without its fixed cost:
 * compute (at `eff` of the matmul rate) or bandwidth (the weights read at `w_rate` of the streaming rate),
 * whichever is longer, plus a ramp that grows with its bytes (a small GEMM's fill and drain are most of it;
 * a large one's saturate). A 16-bit GEMM's compute and bandwidth do not overlap fully where the two are close
 * (7B-70B FFNs at ~128 tokens, whose one or two rows of output tiles do not fill the SMs without splitting K):
 * it pays the excess of their smooth maximum over their maximum (eager_mixed_p), in full once its weights
 * reach eager_mixed_mb and in proportion below (`mixed`; the e4m3 GEMMs' own constants were fitted without).
 * Where its bytes take longer than its FLOPs, its whole time is also added to *mem: the breakdown's hbm term. */
static double gemm_us(const fuser_target *t, double m, double k, double n, double e, double eff, double w_rate,
                      int mixed, double *mem)
{
    const double bytes = e * (m * k + k * n + m * n);
    const double tc = 2 * m * k * n / (t->mma_tflops * eff * 1e6);
    const double tm = e * (m * k + m * n + k * n / w_rate) / (t->hbm_gbs * t->small_gemm_eff * 1e3);
    const double hi = fmax(tc, tm), lo = fmin(tc, tm), p = t->eager_mixed_p;
    double busy = hi;
    if (mixed)
        busy += hi * (pow(1 + pow(lo / hi, p), 1 / p) - 1) * fmin(1.0, e * k * n / (t->eager_mixed_mb * 1e6));
    const double us = busy + t->eager_ramp_us * (1 - exp(-bytes / (t->eager_ramp_mb * 1e6)));
    *mem += tm > tc ? us : 0;
    return us;
}

/* One projection's GEMM of a packed chain in 128 x 128 output tiles (T below). */
static double projection_tiles(const fuser_chain *c)
{
    return ceil((double)c->m / 128) * ceil((double)c->n / 128);
}

/* The share of SMs that one projection's GEMM of a packed chain leaves idle, relative to its own tiles (0 to 1):
 * T = 128 x 128 output tiles on S SMs, (S - T) / T where T < S. Merged, the two GEMMs run on up to twice the
 * SMs: about two launches saved where T is a fraction of S, nothing beyond H's passes where T fills the SMs
 * (the timings behind it: docs/planner.md, "The packed route in the model"). */
static double packed_idle(const fuser_chain *c, const fuser_target *t)
{
    const double tiles = projection_tiles(c), s = t->sm_count;
    return tiles >= s ? 0 : fmin(1, (s - tiles) / tiles);
}

/* The unfused path as fuser runs it: PyTorch eager ops (cuBLAS GEMMs with fused bias, separate
 * activation and product kernels, the intermediate through HBM), a plain chain's ReLU or tanh GELU in the up
 * GEMM's epilogue where fuser_eager_epilogue says so. A packed gated chain's (c->packed): gate and up as one
 * GEMM of 2 N rows, then the gate kernel (activation and product in one pass: H read twice, written once); priced
 * as the ops less two passes of H and, where each projection's GEMM alone leaves SMs without a 128 x 128 output
 * tile, up to two launches (packed_idle). (An unpacked gated chain's route also runs the gate kernel: priced as
 * PyTorch's two ops, docs/planner.md.) A quantized chain's:
 * PyTorch's FP8 ops (fuser.fp8.eager: scaled GEMMs of e4m3 operands with bfloat16 results, the elementwise
 * kernels in bfloat16, and x and H quantized by three elementwise ops each). The GEMMs are tensorwise, at the
 * 16-bit rate (measured no faster than bf16 ones on the H200), each result then scaled per row by one
 * more op, except where fuser_fp8_rowwise says rowwise (multiples of 128 tokens, and 512 on): rowwise,
 * at eager_fp8_mma_eff of the matmul rate and reading their weights at eager_fp8_hbm_eff of the
 * streaming rate, the scales inside the GEMM and two ops making the per-token activation scales.
 * The kernels run one after another, so the terms add up: `compute` holds the GEMMs bound by their FLOPs,
 * `hbm` those bound by their bytes (gemm_us) and the elementwise kernels' passes, `launch` the kernels' fixed cost. */
static void cost_unfused(fuser_plan *p, const fuser_target *t)
{
    const fuser_chain *c = &p->chain;
    const int q = c->dtype == FUSER_E4M3, rowwise = q && fuser_fp8_rowwise(c->m);
    const int gemms = c->gated ? 3 : 2;
    const double e = c->dtype == FUSER_F32 ? 4 : 2, eg = fuser_dtype_size(c->dtype), M = (double)c->m,
                 K = (double)c->k, N = (double)c->n, L = (double)c->l;
    const double eff = rowwise ? t->eager_fp8_mma_eff : t->eager_mma_eff,
                 w_rate = rowwise ? t->eager_fp8_hbm_eff : 1;
    fuser_cost *k = &p->cost;
    /* the activation in the up GEMM's epilogue (fuser_eager_epilogue): no activation kernel */
    const int epi = fuser_eager_epilogue(c);
    /* gate and up as one GEMM, the gate kernel after it */
    const int pk = c->gated && c->packed && !q;
    /* the intermediate's HBM passes: plain: GEMM1 writes H, act reads and writes it, GEMM2 reads it (4; 2 with
     * the activation in the epilogue); gated: gate and up written (2), act r+w (2), product reads 2 and writes 1
     * (3), GEMM2 reads (1): 8, and x read twice; packed: the gate kernel reads 2 and writes 1: 6 */
    double ew_bytes = pk ? e * M * N * 3 : c->gated ? e * M * N * 5 : epi ? 0 : e * M * N * 2; /* elementwise */
    double hbm = compulsory_bytes(c) + e * M * N * (pk ? 6 : c->gated ? 8 : epi ? 2 : 4) +
                 (c->gated && !pk ? e * M * K : 0);
    if (q) /* x and H read in bfloat16 and written in e4m3 by the quantizing ops (each pass read and written) */
        ew_bytes += 3 * 3 * M * (K + N);
    if (q && !rowwise) /* each GEMM's bfloat16 result read and written by its per-row scaling */
        ew_bytes += 4 * M * ((c->gated ? 2 : 1) * N + L);
    /* rowwise scaled GEMMs run whole tiles of 128 token rows: a count between multiples costs the next one's
     * (measured: 576 tokens as long as 640 within 2%, 1000 as 1024, 2000 as 2048; -twentythird-fp8-large) */
    const double Mg = rowwise ? 128 * ceil(M / 128) : M;
    /* a packed chain's gate and up GEMMs as one where both projections' 128 x 128 output tiles fit on the SMs at
     * once: one kernel's fill and drain (gemm_us's ramp) instead of two, as far as the target says (a merged GEMM
     * of more tiles than SMs runs in waves: S2 at 192 tokens, 176 tiles, timed 1.07x over this price) */
    const double merged = pk && 2 * projection_tiles(c) <= t->sm_count ? t->eager_packed_merge : 0;
    double mem[3] = {0, 0, 0}; /* each GEMM's time where its bytes bound it */
    const double apart = (c->gated ? 2 : 1) * (1 - merged);
    const double gemms_us = gemm_us(t, Mg, K, N, eg, eff, w_rate, !q, &mem[0]) * apart +
                            gemm_us(t, Mg, K, 2 * N, eg, eff, w_rate, !q, &mem[1]) * merged +
                            gemm_us(t, Mg, N, L, eg, eff, w_rate, !q, &mem[2]);
    const double gemms_mem = mem[0] * apart + mem[1] * merged + mem[2];
    const double ew_us = ew_bytes / (t->hbm_gbs * 1e3);
    k->compute = gemms_us - gemms_mem;
    k->hbm = ew_us + gemms_mem;
    k->l2 = k->dsm = k->smem = k->sync = k->tail = 0;
    /* the GEMMs, the activation (unless in the epilogue) and (gated) the product; quantized: and 3 ops each for x
     * and H, and the per-row scaling ops (tensorwise) or the two scale fills (rowwise) */
    k->launch = t->eager_op_us * (gemms + (c->gated ? 2 : epi ? 0 : 1) + (q ? 6 + (rowwise ? 2 : gemms) : 0) -
                                  (pk ? 2 * packed_idle(c, t) : 0)) +
                (epi ? t->eager_epilogue_us : 0);
    k->total = gemms_us + ew_us + k->launch; /* compute + hbm + launch, added so that the split moves no rounding */
    k->useful_flops = k->flops = chain_flops(c);
    k->waves = 0;
    k->sms_used = t->sm_count;
    p->traffic.hbm = (int64_t)hbm;
    p->traffic.l2 = (int64_t)hbm;
    p->traffic.dsm = p->traffic.smem = 0;
}

void fuser_plan_cost(fuser_plan *p, const fuser_target *t)
{
    if (!p->fused) {
        cost_unfused(p, t);
        return;
    }
    if (p->kind == FUSER_KIND_STREAM) {
        fuser_stream_cost(p, t);
        return;
    }
    l2_split split;
    traffic(p, &p->traffic, &split);
    fuser_cost *k = &p->cost;
    const int ci = fuser_cluster_size_index(p->cluster_size);
    /* co-residency: blocks per SM by shared memory and registers, then clusters per wave */
    int regs = (p->regs_est + 7) / 8 * 8;
    int bps = t->smem_per_sm / (p->smem_bytes + 1024);
    int by_regs = t->regs_per_sm / (FUSER_THREADS * regs);
    if (by_regs < bps)
        bps = by_regs;
    if (bps > 8)
        bps = 8;
    if (bps < 1)
        bps = 1;
    int64_t per_wave = (int64_t)t->usable_sms[ci] * bps / p->cluster_size;
    if (per_wave < 1)
        per_wave = 1;
    k->waves = (int)fuser_ceil_div(p->clusters, per_wave);
    int64_t wave_blocks = fuser_min64(p->blocks, per_wave * p->cluster_size);
    int64_t sms = fuser_min64(wave_blocks, t->usable_sms[ci]);
    int share = (int)fuser_ceil_div(wave_blocks, sms); /* blocks sharing one SM */
    k->sms_used = (int)sms;

    const double clk = t->clock_ghz * 1e9;
    const double kmul = p->cls_k / p->ksplit;
    double f1 = (double)p->grid_m * p->grid_n * p->cls_m * p->cls_n * kmul * p->kt * FUSER_BK * p->n_iters *
                p->parts * p->bm * p->bn * 2;
    double f2 = (double)p->blocks * p->lc * p->bm * p->bl * p->cls_shuffle * p->n_iters * p->bn * 2;
    k->flops = f1 + f2;
    k->useful_flops = chain_flops(&p->chain);
    /* compute: each wave runs its blocks' FLOPs on `sms` SMs at the main loop's rate */
    double sm_rate = t->mma_tflops * 1e12 / t->sm_count * t->fused_mma_eff;
    double per_block = k->flops / p->blocks;
    k->compute = k->waves * per_block * share / sm_rate * 1e6;
    const double stage1 = (double)(p->bm + p->parts * p->bn) * FUSER_BK * 2;
    const double stage2 = (double)p->bl * (p->bn < FUSER_BK2 ? p->bn : FUSER_BK2) * 2;
    k->l2 = (split.g1 / l2_bw(t, p, sms, stage1) + split.g2 / l2_bw(t, p, sms, stage2) +
             split.rest / fmin(t->l2_gbs * 1e9, sms * t->sm_load_gbs * 1e9)) * 1e6;
    /* HBM cannot stream faster than the SMs have loads in flight either */
    double hbm_bw = fmin(t->hbm_gbs * 1e9, l2_bw(t, p, sms, stage1 < stage2 ? stage1 : stage2));
    k->hbm = p->traffic.hbm / hbm_bw * 1e6;
    k->dsm = ci > 0 ? p->traffic.dsm / (sms * t->dsm_bytes_per_clk[ci] * clk) * 1e6 : 0;
    k->smem = p->traffic.smem / (sms * t->smem_bytes_per_clk * clk) * 1e6;
    k->sync = k->waves * (double)p->barriers * t->barrier_cycles / clk * 1e6;
    /* NOTE: each barrier-separated GEMM phase starts with an empty pipeline: ~1 global round trip
     * (~1200 cycles) per d_ff chunk and per output chunk; the final workspace pass of
     * inter_cluster_reduce is serial after the last partial lands. */
    k->tail = k->waves * (double)(p->n_iters + p->lc) * 1200.0 / clk * 1e6;
    if (p->grid_n > 1)
        k->tail += (double)p->grid_n * p->bm * p->sw * 4 * p->lc / (t->sm_load_gbs * 1e9) * 1e6;
    k->launch = t->launch_us;
    /* calibration: every fused term scaled by the measured fused/model ratio and its own fitted factor
     * (target.c, fuser/calibrate.py) */
    const struct { double *term; double factor; } cal[] = {
        {&k->compute, t->fused_scale_compute}, {&k->hbm, t->fused_scale_hbm}, {&k->l2, t->fused_scale_l2},
        {&k->dsm, t->fused_scale_dsm}, {&k->smem, t->fused_scale_smem}, {&k->sync, t->fused_scale_sync},
        {&k->tail, t->fused_scale_tail},
    };
    for (size_t i = 0; i < sizeof cal / sizeof cal[0]; i++)
        *cal[i].term *= t->fused_time_scale * cal[i].factor;
    double body = fmax(fmax(k->compute, k->hbm), fmax(fmax(k->l2, k->dsm), k->smem));
    k->total = k->launch + body + k->sync + k->tail;
}
