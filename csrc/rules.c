/* rules.c: the pruning rules of the plan search, one named, commented predicate each, in one table.
 * A rule runs at the search level where the fields it reads are set, and the search counts how many
 * candidates it removed. Hardware limits are rules too; fuser_plan_check_target() re-checks them on
 * every returned plan. */
#include <stdint.h>

#include "fuser/plan.h"
#include "fuser/search.h"

static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* CHAIN: fused kernels compute in 16 bits (or, the stream kernel, in e4m3) with fp32 accumulation. */
static int r_dtype(const fuser_plan *p, const fuser_target *t)
{
    (void)t;
    return p->chain.dtype == FUSER_F32 || (p->chain.dtype == FUSER_E4M3 && p->kind != FUSER_KIND_STREAM);
}

/* FULL: a quantized (e4m3) chain runs the stream kernel's swap-AB units in two phases, unpaired. */
static int r_quantized_scope(const fuser_plan *p, const fuser_target *t)
{
    (void)t;
    return p->chain.dtype == FUSER_E4M3 && (p->phases == 1 || p->cls_m * p->cls_n > 1);
}

/* CHAIN: 16-byte loads and cp.async need every row of X, W_up, W_down and Y to start 16-byte
 * aligned: d_model, d_ff and d_out must be multiples of 8 elements (d_model and d_ff of 16 in e4m3). */
static int r_vector_alignment(const fuser_plan *p, const fuser_target *t)
{
    (void)t;
    const int64_t row16 = 16 / fuser_dtype_size(p->chain.dtype);
    return p->chain.k % row16 || p->chain.n % row16 || p->chain.l % 8;
}

/* SHAPE: at most 16 blocks per cluster, and more than 8 only where the non-portable size is allowed. */
static int r_cluster_limit(const fuser_plan *p, const fuser_target *t)
{
    int size = p->cls_m * p->cls_n * p->cls_k;
    return size > 16 || size > t->max_cluster;
}

/* SHAPE: the GEMM2 view regroups the cls_n*cls_k blocks into cls_l output parts of cls_k blocks per
 * shuffle group: cls_k must divide cls_l and cls_l must divide cls_n*cls_k. */
static int r_cluster_divisibility(const fuser_plan *p, const fuser_target *t)
{
    (void)t;
    return p->cls_l % p->cls_k || (p->cls_n * p->cls_k) % p->cls_l;
}

/* SHAPE: gated spatial mode splits the cls_k blocks into gate and up halves. */
static int r_gated_spatial_even(const fuser_plan *p, const fuser_target *t)
{
    (void)t;
    return p->gate_mode == FUSER_GATE_SPATIAL && p->cls_k % 2;
}

/* SHAPE: every K split must own at least one K step, or blocks idle through GEMM1. */
static int r_k_split_waste(const fuser_plan *p, const fuser_target *t)
{
    (void)t;
    int ksplit = p->gate_mode == FUSER_GATE_SPATIAL ? p->cls_k / 2 : p->cls_k;
    int64_t kt = (p->chain.k + FUSER_BK - 1) / FUSER_BK;
    return ksplit > kt;
}

/* BM: a block tile larger than the tokens (rounded up to 16) is mostly padding, and no block of the
 * last cluster along tokens may own only rows beyond the tokens. */
static int r_m_tile_waste(const fuser_plan *p, const fuser_target *t)
{
    (void)t;
    int64_t rows = (int64_t)p->cls_m * p->bm;
    int64_t grid_m = (p->chain.m + rows - 1) / rows;
    return p->bm > round_up(p->chain.m, 16) || (grid_m * p->cls_m - 1) * p->bm >= p->chain.m;
}

/* BN: the 8 warps tile bm x bn in m16n8 pieces: bn must be a multiple of 8 x (warps along n). */
static int r_warp_tiling_bn(const fuser_plan *p, const fuser_target *t)
{
    (void)t;
    int wm = p->bm / 16 < 4 ? p->bm / 16 : 4;
    return p->bn % (8 * (8 / wm));
}

/* NITERS: no block may own a d_ff slice entirely beyond d_ff (it would only add zeros), and the
 * cluster's d_ff range should not be much wider than d_ff itself. */
static int r_idle_blocks(const fuser_plan *p, const fuser_target *t)
{
    (void)t;
    int64_t nb = (int64_t)p->bn * p->n_iters;
    int64_t nc = nb * p->cls_n;
    int64_t grid_n = (p->chain.n + nc - 1) / nc;
    return (grid_n - 1) * nc + (p->cls_n - 1) * nb >= p->chain.n;
}

/* NITERS: inter_cluster_reduce keeps fp32 partials of the whole output per d_ff cluster in global
 * memory: grid_n x tokens x d_out x 4 bytes (a lower bound here; exact at FULL) must fit the budget. */
static int r_workspace_bound(const fuser_plan *p, const fuser_target *t)
{
    int64_t nc = (int64_t)p->bn * p->n_iters * p->cls_n;
    int64_t grid_n = (p->chain.n + nc - 1) / nc;
    int64_t rows = round_up(p->chain.m, (int64_t)p->cls_m * p->bm);
    return grid_n > 1 && grid_n * rows * p->chain.l * 4 > t->max_workspace;
}

/* BL: the reduction over d_ff may sit outside the output loop only while the output tile stays in
 * registers: n_outer needs each block's output part to be one chunk of bl columns. */
static int r_reduction_innermost(const fuser_plan *p, const fuser_target *t)
{
    (void)t;
    if (p->order != FUSER_ORDER_N_OUTER)
        return 0;
    int64_t part = (p->chain.l + p->cls_l - 1) / p->cls_l;
    return part > p->bl || p->bl > 256; /* 256: the widest output tile the 8 warps keep in registers */
}

/* BL: bl is tiled by the warps (8 columns each) and split into cls_reduce shares of 8-column
 * multiples for the reduce-scatter. */
static int r_warp_tiling_bl(const fuser_plan *p, const fuser_target *t)
{
    (void)t;
    int wm = p->bm / 16 < 4 ? p->bm / 16 : 4;
    int reduce = p->cls_n * p->cls_k / p->cls_l;
    return p->bl % (8 * (8 / wm)) || p->bl % reduce || (p->bl / reduce) % 8;
}

/* BL: no output part or chunk may be entirely padding: the last part must own real columns, and bl
 * may not be wider than a part needs. */
static int r_output_waste(const fuser_plan *p, const fuser_target *t)
{
    (void)t;
    int64_t part = (p->chain.l + p->cls_l - 1) / p->cls_l;
    int64_t lp = round_up(part, p->bl);
    return (p->cls_l - 1) * lp >= p->chain.l || p->bl >= 2 * round_up(part, 32);
}

/* FULL: a stream-kernel candidate must be a valid geometry: tokens within bm, wgmma tile widths, a
 * gated tile's two accumulators within the consumers' registers, no empty K split (plan.c says which). */
static int r_stream_geometry(const fuser_plan *p, const fuser_target *t)
{
    (void)t;
    if (p->kind != FUSER_KIND_STREAM)
        return 0;
    fuser_plan q = *p;
    return fuser_plan_derive(&q, NULL) != FUSER_OK;
}

/* CHOICE (splits left free): a stream phase with fewer units than 3/4 of the SMs leaves SMs idle while
 * it runs, and its units stream from fewer SMs than HBM needs (measured on the H200: LLaMA-3-8B's phase
 * 2 with 64 units took 108-119 us where 128 units took 94-96; the cost model misses much of that):
 * a phase must have units for 3/4 of the SMs, or as many as any split of the search gives it. Except
 * at decode (up to 64 tokens) for a phase whose weights fit L2: it is short and latency-bound, and its
 * best plans have fewer, longer units (GPT-2 at 16 tokens: 96 phase-1 units 10.8 us, 144 13.7). */
/* The most units a phase of `tiles` tiles reaches with a split of the search's set that leaves no split
 * empty (at most `cap` splits). */
static int64_t most_units(int64_t tiles, int64_t steps, int cap)
{
    int64_t best = tiles;
    for (int i = 0; i < fuser_num_stream_splits; i++) {
        const int s = fuser_stream_splits[i];
        if (s <= cap && s <= steps && (s - 1) * ((steps + s - 1) / s) < steps && tiles * s > best)
            best = tiles * s;
    }
    return best;
}

static int r_stream_fill(const fuser_plan *p, const fuser_target *t)
{
    if (p->kind != FUSER_KIND_STREAM)
        return 0;
    const int64_t want = 3 * (int64_t)t->sm_count / 4;
    const int64_t kc = fuser_kstep_cols(p->chain.dtype);
    const int64_t kt2 = (p->chain.n + kc - 1) / kc;
    const int64_t rt = p->grid_m; /* row tiles: each multiplies both phases' units */
    /* (one phase: a unit spans lspan l-tiles, and its d_ff slice is at least one n-tile) */
    const int64_t lg = fuser_stream_lgroups(p);
    const int64_t u1 = rt * p->nt1 * p->s1, u2 = rt * lg * p->s2;
    const int decode = p->chain.m <= 64;
    const int small1 = decode && fuser_stream_phase_weights(p, 1) <= FUSER_STREAM_L2_BYTES;
    const int small2 = decode && fuser_stream_phase_weights(p, 2) <= FUSER_STREAM_L2_BYTES;
    /* (one phase: no phase-1 units; GEMM1 runs inside the phase-2 units) */
    const int64_t most1 = most_units(rt * p->nt1, p->kt, fuser_stream_max_s1(p));
    /* a phase 1 of one 128-row tile: its units run at once and the SMs they leave idle start phase 2 (unit
     * traces: docs/planner.md "64-128 tokens"), so half the SMs' worth of units suffice there and the
     * cost model judges the rest; after one phase-1 split, phase 2 likewise (a round of units that start
     * as phase 1's end) */
    const int round = p->bm == 128 && rt == 1 && !fuser_stream_swap(p);
    const int64_t want1 = round ? t->sm_count / 2 : want;
    const int64_t want2 = round && p->phases == 2 && p->s1 == 1 ? t->sm_count / 2 : want;
    return (!small1 && p->phases != 1 && u1 < fuser_min64(want1, most1)) ||
           (!small2 && u2 < fuser_min64(want2, p->lspan > 1 ? rt * lg * ((kt2 * kc + p->bn - 1) / p->bn)
                                                          : most_units(rt * p->lt2, kt2, 16)));
}

/* CHOICE: at up to 32 tokens, where the swap-AB tiles (bm 16, 32) hold every token, 64- and 128-row tiles only
 * in one phase and for chains whose weights fit L2 (the tiny chains' one-phase units). Such a tile runs its MMAs
 * over rows that are nearly all padding, which the cost model hides under the weight stream; where that stream is
 * long it does not hide (LLaMA-2-7B at 1-16 tokens, bm 128 on an H100: 0.72-0.80x eager), and in two phases the
 * padded tiles' hand-off does not either (GPT-2 at 16 tokens, bm 64 on the H200: 1.20x the swap-AB plan it tied in
 * the model; docs/planner.md "Padded row tiles at decode"). */
static int r_stream_decode_rows(const fuser_plan *p, const fuser_target *t)
{
    (void)t;
    return p->kind == FUSER_KIND_STREAM && !fuser_stream_swap(p) && p->chain.m <= 32 &&
           (p->phases != 1 || !fuser_stream_weights_in_l2(p));
}

/* CHOICE: a plain 16-bit chain's swap-AB tiles (bm 16, 32) only at up to 96 tokens. Beyond, each of their many
 * row tiles streams the weights again through L2 and pays a unit's fixed cost, which the cost model under-prices:
 * on the H200's timings no such plan is the fastest in any of 13 plain cells of 100-2048 tokens, and those an
 * H100's model picked at 100-256 tokens ran 0.82-0.96x eager. A gated chain's (S8 at 160 tokens: 1.05-1.13x
 * eager) are left to the model (docs/planner.md "Narrow row tiles beyond 96 tokens"). */
static int r_stream_narrow_rows(const fuser_plan *p, const fuser_target *t)
{
    (void)t;
    return p->kind == FUSER_KIND_STREAM && !p->chain.gated && p->chain.dtype != FUSER_E4M3 && p->bm < 64 &&
           p->chain.m > 96;
}

/* CHOICE: narrow n-tiles (fuser_stream_narrow_bn) and l-tiles (fuser_stream_narrow_bl) only where the last row
 * tile is more than half full: such plans run slower as a tile's real rows fall below that, which the cost
 * model does not see (docs/planner.md, "96- and 112-wide n-tiles"); other tiles serve those counts. */
static int r_stream_narrow_n(const fuser_plan *p, const fuser_target *t)
{
    (void)t;
    const int64_t last = p->chain.m - (p->grid_m - 1) * p->bm;
    return p->kind == FUSER_KIND_STREAM && (fuser_stream_narrow_bn(p->bn) || fuser_stream_narrow_bl(p->bl)) &&
           2 * last <= p->bm;
}

/* FULL: shared memory (pipeline stages, exchange buffer, H slices) must fit one block's opt-in limit. */
static int r_smem_capacity(const fuser_plan *p, const fuser_target *t)
{
    return p->smem_bytes > t->smem_per_block;
}

/* FULL: the accumulators live in registers; 256 threads may use at most regs_per_sm / 256 each, less
 * the headroom ptxas needs beyond the estimate (FUSER_REG_HEADROOM) so that nothing spills. */
static int r_registers(const fuser_plan *p, const fuser_target *t)
{
    int cap = t->regs_per_sm / FUSER_THREADS;
    return p->regs_est > (cap < t->max_regs_per_thread ? cap : t->max_regs_per_thread) - FUSER_REG_HEADROOM;
}

/* FULL: the exact workspace (padded tokens and outputs) must fit the budget. */
static int r_workspace_limit(const fuser_plan *p, const fuser_target *t)
{
    return p->workspace_bytes > t->max_workspace;
}

/* FULL: at least two pipeline stages, so loads overlap the math; one more stage only if it fits. */
static int r_stages(const fuser_plan *p, const fuser_target *t)
{
    (void)t;
    return p->stages < 2;
}

const fuser_rule fuser_rules[] = {
    {"dtype", "fused kernels compute in bfloat16/float16 (float8_e4m3fn: stream plans) with fp32 accumulation",
     FUSER_LEVEL_CHAIN, r_dtype},
    {"vector_alignment", "d_model, d_ff and d_out must be multiples of 8 (d_model, d_ff 16 in e4m3) for 16-byte rows",
     FUSER_LEVEL_CHAIN, r_vector_alignment},
    {"cluster_limit", "at most 16 blocks per cluster (8 where 16 is not allowed)", FUSER_LEVEL_SHAPE,
     r_cluster_limit},
    {"cluster_divisibility", "cls_k | cls_l | cls_n * cls_k", FUSER_LEVEL_SHAPE, r_cluster_divisibility},
    {"gated_spatial_even", "gate and up halves need an even cls_k", FUSER_LEVEL_SHAPE, r_gated_spatial_even},
    {"k_split_waste", "every K split owns at least one K step", FUSER_LEVEL_SHAPE, r_k_split_waste},
    {"m_tile_waste", "tiles and clusters not mostly padding rows", FUSER_LEVEL_BM, r_m_tile_waste},
    {"warp_tiling_bn", "bn divisible by the warps' 8-column pieces", FUSER_LEVEL_BN, r_warp_tiling_bn},
    {"idle_blocks", "no block owns only columns beyond d_ff", FUSER_LEVEL_NITERS, r_idle_blocks},
    {"workspace_bound", "inter-cluster partials fit the workspace budget", FUSER_LEVEL_NITERS,
     r_workspace_bound},
    {"reduction_innermost", "n_outer keeps one output chunk per block in registers", FUSER_LEVEL_BL,
     r_reduction_innermost},
    {"warp_tiling_bl", "bl divisible by warps and reduce-scatter shares", FUSER_LEVEL_BL, r_warp_tiling_bl},
    {"output_waste", "no output part or chunk entirely padding", FUSER_LEVEL_BL, r_output_waste},
    {"stages", "at least two pipeline stages", FUSER_LEVEL_FULL, r_stages},
    {"quantized_scope",
     "a float8_e4m3fn chain runs swap-AB stream plans in two phases, unpaired",
     FUSER_LEVEL_FULL, r_quantized_scope},
    {"stream_geometry", "stream kernel: wgmma tile widths, accumulators fit, no empty split, int32 units",
     FUSER_LEVEL_FULL, r_stream_geometry},
    {"stream_fill", "stream kernel: each phase has units for 3/4 of the SMs (or the most any split gives), "
     "but a decode phase whose weights fit L2; a phase 1 of one 128-row tile (and its phase 2 after one "
     "split), half the SMs",
     FUSER_LEVEL_CHOICE, r_stream_fill},
    {"stream_decode_rows", "stream kernel: 64- and 128-row tiles at up to 32 tokens only in one phase, for chains "
                           "whose weights fit L2",
     FUSER_LEVEL_CHOICE, r_stream_decode_rows},
    {"stream_narrow_rows", "stream kernel: 16- and 32-row (swap-AB) tiles of plain 16-bit chains at up to 96 tokens",
     FUSER_LEVEL_CHOICE, r_stream_narrow_rows},
    {"stream_narrow_n", "stream kernel: 96- and 112-wide n-tiles and 96-wide l-tiles where the last row tile is "
                        "more than half full",
     FUSER_LEVEL_CHOICE, r_stream_narrow_n},
    {"smem_capacity", "shared memory within the per-block limit", FUSER_LEVEL_FULL, r_smem_capacity},
    {"registers", "estimated registers within the per-thread budget", FUSER_LEVEL_FULL, r_registers},
    {"workspace_limit", "exact workspace within the budget", FUSER_LEVEL_FULL, r_workspace_limit},
};
const int fuser_num_rules = (int)(sizeof fuser_rules / sizeof fuser_rules[0]);
_Static_assert(sizeof fuser_rules / sizeof fuser_rules[0] <= FUSER_MAX_RULES, "raise FUSER_MAX_RULES");
