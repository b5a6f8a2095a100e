/* plan.c: a plan's derived geometry (grid, buffers, barriers, dataflows) and its hardware checks.
 * The semantics are in include/fuser/plan.h; the cost model is in cost.c, the search in search.c. */
#include "fuser/plan.h"

#include <stdio.h>
#include <string.h>

int64_t fuser_in_bounds(int64_t begin, int64_t len, int64_t limit)
{
    int64_t v = fuser_min64(begin + len, limit) - begin;
    return v < 0 ? 0 : v > len ? len : v;
}

static const char *const df_names[FUSER_NUM_DATAFLOWS] = {"all_exchange", "shuffle", "reduce_scatter",
                                                          "inter_cluster_reduce"};

const char *fuser_dataflow_name(int i)
{
    return i >= 0 && i < FUSER_NUM_DATAFLOWS ? df_names[i] : NULL;
}

void fuser_plan_dataflow_str(const fuser_plan *p, char *buf, size_t n)
{
    if (!p->fused || p->kind == FUSER_KIND_STREAM) {
        snprintf(buf, n, p->fused ? "stream" : "unfused");
        return;
    }
    buf[0] = '\0';
    for (int i = 0; i < FUSER_NUM_DATAFLOWS; i++)
        if (p->dataflows & (1 << i)) {
            if (buf[0])
                fuser_strlcat(buf, "+", n);
            fuser_strlcat(buf, df_names[i], n);
        }
    if (!buf[0])
        snprintf(buf, n, "local");
}

void fuser_plan_unfused(const fuser_chain *c, fuser_plan *p)
{
    memset(p, 0, sizeof *p);
    p->chain = *c;
}

static int pow2_upto16(int v) { return fuser_cluster_size_index(v) >= 0; }

/* Cluster barriers each block passes, following the schedule in the header (and interp.c). */
static int count_barriers(const fuser_plan *p)
{
    int b = 0;
    if (p->order == FUSER_ORDER_N_OUTER) {
        /* per n-iteration: partials published; H published, exchange buffer free; peers done copying my H
         * slot (not after the last) */
        b += p->n_iters * ((p->cls_k > 1) + (p->cls_k > 1 || p->cls_shuffle > 1));
        b += (p->cls_shuffle > 1) * (p->n_iters - 1);
        b += p->cls_reduce > 1;                                  /* output partials published */
    } else {
        b += 2 * (p->cls_k > 1) * p->n_iters;                    /* publish partials; buffer free */
        b += p->cls_shuffle > 1 && p->cls_k == 1;                /* all H published */
        if (p->cls_reduce > 1)
            b += 2 * p->lc - 1;                                  /* per chunk: publish; free (not after the last) */
    }
    if (p->cluster_size > 1)
        b += 2;                                                  /* entry and exit */
    return b;
}

static int align128(int64_t v) { return (int)((v + 127) / 128 * 128); }

/* The stream kernel's shared memory per pipeline stage (include/fuser/device/stream.cuh, STAGE_BYTES): an X
 * or H tile of bm rows and the weight tiles, 128 bytes a row, rounded to the 1024-byte swizzle alignment. */
static int64_t stream_stage_bytes(const fuser_plan *p)
{
    const int64_t x = (int64_t)p->bm * 128;
    const int64_t b1 = x + (int64_t)p->parts * p->bn * 128, b2 = x + (int64_t)p->bl * 128;
    return (fuser_max64(b1, b2) + 1023) / 1024 * 1024;
}

int fuser_stream_deepest_ring(const fuser_plan *p, int smem_limit)
{
    const int64_t stage = stream_stage_bytes(p), rest = (int64_t)p->smem_bytes - p->smem_pipe;
    const int64_t s = stage > 0 && smem_limit > rest ? (smem_limit - rest) / stage : 0;
    return s < 2 ? 0 : s > 8 ? 8 : (int)s;
}

static int derive_stream(fuser_plan *p, fuser_err *err)
{
    const fuser_chain *c = &p->chain;
    if (p->bm != 16 && p->bm != 32 && p->bm != 64 && p->bm != 128)
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: bm = %d token rows: must be 16, 32, 64 or 128", p->bm);
    const int swap = fuser_stream_swap(p);
    if (swap && (p->bn != 128 || p->bl != 128))
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: bm = %d%s puts the weights on wgmma's M side (64 rows per "
                          "consumer warpgroup): bn and bl must be 128, got %d and %d", p->bm,
                          c->dtype == FUSER_E4M3 ? " in a quantized chain" : "", p->bn, p->bl);
    const int row16 = 16 / fuser_dtype_size(c->dtype); /* elements of 16 bytes */
    if (c->k % row16 || c->n % row16 || c->l % 8)
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: d_model and d_ff must be multiples of %d and d_out of 8 "
                          "(TMA rows are 16-byte aligned), got %lld, %lld, %lld", row16, (long long)c->k,
                          (long long)c->n, (long long)c->l);
    if (p->bn != 48 && p->bn != 64 && p->bn != 96 && p->bn != 112 && p->bn != 128 && p->bn != 192 && p->bn != 256)
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: bn = %d: must be 48, 64, 96, 112, 128, 192 or 256", p->bn);
    if (p->bl != 64 && p->bl != 96 && p->bl != 128 && p->bl != 192 && p->bl != 256)
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: bl = %d: must be 64, 96, 128, 192 or 256", p->bl);
    /* 96- and 112-wide n-tiles (wgmma N 96 or 112 per part at bm 128, the halves 48 or 56 per warpgroup at bm 64):
     * for d_ff widths whose 128-wide tiles leave SMs without a phase-1 unit (11008: 86 tiles of 128, 115 of 96;
     * 14336: 112 of 128, 128 of 112); tokens on wgmma's M side (bm 64 or 128, 16-bit), two phases, unpaired;
     * 48-wide ones likewise, at bm 128 only (wgmma N 48: halves of 24 have no instruction here), for d_ff widths
     * whose 64-wide tiles leave SMs idle (5632: 88 tiles of 64, 118 of 48);
     * 96-wide l-tiles likewise (wgmma N 96 in phase 2), for d_out widths whose 128-wide tiles leave SMs idle */
    if (!fuser_stream_bn_fits_bm(p->bn, p->bm))
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: bn = 48 needs bm = 128 (wgmma N 48 per consumer; at bm "
                          "%d each consumer would take 24 columns)", p->bm);
    const int narrow_bn = fuser_stream_narrow_bn(p->bn);
    if ((narrow_bn || fuser_stream_narrow_bl(p->bl)) &&
        (p->bm < 64 || swap || p->phases != 2 || p->cls_m != 1 || p->cls_n != 1))
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: %s = %d needs bm = 64 or 128 (16-bit), two phases and no "
                          "cluster pair; got bm = %d%s, phases = %d, cluster (%d, %d, %d, %d)", narrow_bn ? "bn" : "bl",
                          narrow_bn ? p->bn : p->bl, p->bm, swap ? " swap-AB" : "", p->phases, p->cls_m, p->cls_n,
                          p->cls_k, p->cls_l);
    if (c->gated && p->bn > 128)
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: a gated chain keeps gate and up accumulators: bn <= "
                          "128, got %d", p->bn);
    if (p->stages < 2 || p->stages > 8)
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: stages = %d: must be in [2, 8]", p->stages);
    const int pair_rows = p->cls_m == 2 && p->cls_n == 1 && p->cls_l == 1,
              pair_tiles = p->cls_m == 1 && p->cls_n == 2 && p->cls_l == 2;
    if (!(pair_rows || pair_tiles || (p->cls_m == 1 && p->cls_n == 1 && p->cls_l == 1)) || p->cls_k != 1 ||
        p->n_iters != 1 || p->order != FUSER_ORDER_N_OUTER)
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: cluster must be (1, 1, 1, 1), or a pair: (2, 1, 1, 1) "
                          "(row tiles share weight tiles) or (1, 2, 1, 2) (tiles share token tiles); n_iters 1, order "
                          "n_outer; got (%d, %d, %d, %d)", p->cls_m, p->cls_n, p->cls_k, p->cls_l);
    if (p->gate_mode != (c->gated ? FUSER_GATE_SEQUENTIAL : FUSER_GATE_NONE))
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: gate mode must be %s", c->gated ? "sequential" : "none");
    /* a quantized chain: swap-AB units through the H buffer, unpaired */
    if (c->dtype == FUSER_E4M3 && (p->phases == 1 || pair_rows || pair_tiles))
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: a quantized (float8_e4m3fn) chain runs swap-AB plans in two "
                          "phases without cluster pairs; got phases = %d, cluster (%d, %d, %d, %d)", p->phases,
                          p->cls_m, p->cls_n, p->cls_k, p->cls_l);
    const int kc = fuser_kstep_cols(c->dtype); /* columns of a K step: 128 bytes of a row */
    p->kt = fuser_ceil_div(c->k, kc);
    const int64_t kt2 = fuser_ceil_div(c->n, kc);
    if (p->s1 < 1 || p->s1 > p->kt || (p->s1 - 1) * fuser_ceil_div(p->kt, p->s1) >= p->kt)
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: s1 = %d splits of %lld K steps leave a split empty",
                          p->s1, (long long)p->kt);
    if (p->s2 < 1 || p->s2 > kt2 || (p->s2 - 1) * fuser_ceil_div(kt2, p->s2) >= kt2)
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: s2 = %d splits of %lld d_ff steps leave a split empty",
                          p->s2, (long long)kt2);
    p->parts = c->gated ? 2 : 1;
    /* consumer registers: ptxas keeps both phases' accumulators within the 232 a consumer thread gets only
     * up to 192 of them (above, it spills or serialises wgmma) */
    const int per_wg = p->bm == 128 ? 1 : 2; /* bm 64: the two consumer warpgroups split the columns */
    /* (a quantized chain: GEMM1's parts and a K step's fresh sums beside them, two for gated tiles of up to
     * 64 tokens, else one: include/fuser/device/stream.cuh, promoted_steps; phase 2 needs fewer) */
    const int sums = c->gated && p->bm <= 64 ? 2 : 1;
    const int acc_regs = c->dtype == FUSER_E4M3 ? (p->parts + sums) * p->bm / 2
                         : swap ? (p->parts + 1) * p->bm / 2 /* swap-AB: 64 x bm per part */
                                : p->parts * p->bn / per_wg / 2 + p->bl / per_wg / 2;
    if (p->s1 > 1 && fuser_stream_max_s1(p) == 1)
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: a gated quantized chain's tiles of 128 tokens take no K "
                          "splits in phase 1 (s1 = %d; their sum would spill registers): use s1 = 1, or bm = 64", p->s1);
    if (acc_regs > 192)
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: bm = %d, bn = %d and bl = %d need %d accumulator registers "
                          "per consumer thread%s; at most 192 compile without spills", p->bm, p->bn, p->bl, acc_regs,
                          c->dtype == FUSER_E4M3 ? " (a quantized chain's K steps add fresh sums beside its "
                                                   "accumulators)" : "");
    /* a pair's producer needs 56 registers (it maps claims to units and hands them over), which leaves the
     * consumers 224: tiles of 128 rows at most 192 wide compile without spills */
    if ((pair_rows || pair_tiles) && p->bm == 128 && (p->bn > 192 || p->bl > 192))
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: in cluster pairs, 128-row tiles are at most 192 wide (the "
                          "consumers have 224 registers), got bn = %d, bl = %d", p->bn, p->bl);
    if (p->phases == 0)
        p->phases = 2; /* a plan built without the field: H through the buffer */
    if (p->phases != 1 && p->phases != 2)
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: phases = %d: must be 2 (H through a buffer) or 1 (each unit "
                          "computes its own H)", p->phases);
    const int64_t range = fuser_ceil_div(kt2, p->s2) * kc; /* d_ff columns of a phase-2 split */
    if (p->phases == 1 && (p->s1 != 1 || range % p->bn || pair_rows || pair_tiles))
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: one phase computes each split's H in n-tiles of the whole "
                          "K: s1 must be 1, bn must divide the split's %lld d_ff columns, no cluster pairs (got s1 = %d, "
                          "bn = %d, cluster (%d, %d, %d, %d))", (long long)range, p->s1, p->bn, p->cls_m, p->cls_n,
                          p->cls_k, p->cls_l);
    /* partials of the real rows (fuser_stream_row_partials): every block sums them after the last unit (any count) */
    const int rowsum = fuser_stream_row_partials(p);
    if (p->s1 * p->parts > 16 || (p->s2 > 16 && !rowsum))
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: the last split sums at most 16 partials per element "
                          "(s1 x parts = %d, s2 = %d); more d_ff splits only where every block sums the partials (one "
                          "phase with bm 16 or 32, or a quantized chain with bm 128)",
                          p->s1 * p->parts, p->s2);
    p->cluster_size = pair_rows || pair_tiles ? 2 : 1;
    p->cls_shuffle = p->cls_reduce = 1;
    p->ksplit = p->s1;
    p->warps_m = p->warps_n = 0;
    p->kts = fuser_ceil_div(p->kt, p->s1);
    p->nb = p->nc = p->bn;
    p->nt1 = (int)fuser_ceil_div(c->n, p->bn);
    p->lt2 = (int)fuser_ceil_div(c->l, p->bl);
    p->lp = p->l_pad = (int64_t)p->lt2 * p->bl;
    p->lc = p->lt2;
    p->sw = p->bl;
    if (pair_tiles && (p->nt1 < 2 || p->lt2 < 2))
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: tile pairs (cluster (1, 2, 1, 2)) need two n-tiles and "
                          "two l-tiles; d_ff %lld in tiles of %d and d_out %lld in tiles of %d make %d and %d",
                          (long long)c->n, p->bn, (long long)c->l, p->bl, p->nt1, p->lt2);
    if (p->lspan == 0)
        p->lspan = 1; /* a plan built without the field: one l-tile per unit */
    if (p->lspan < 1 || p->lspan > p->lt2 || (p->lspan > 1 && p->phases != 1))
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: lspan = %d l-tiles per unit: must be in [1, %d] (d_out "
                          "%lld in tiles of %d), and above 1 only in one phase", p->lspan, p->lt2, (long long)c->l,
                          p->bl);
    p->grid_m = fuser_ceil_div(c->m, p->bm); /* row tiles */
    if (p->grid_m * ((int64_t)p->nt1 * p->s1 + (int64_t)p->lt2 * p->s2) > 0x3fffffff)
        return fuser_fail(err, FUSER_E_VALUE, "stream plan: %lld tokens in row tiles of %d make more work units than "
                          "the kernel's int32 counters hold; use bm = 128 or fewer tokens per call",
                          (long long)c->m, p->bm);
    p->grid_n = p->nt1;
    p->units = fuser_stream_units(p, c->m);
    p->clusters = p->blocks = p->units;
    p->m_pad = p->grid_m * p->bm;
    p->threads = FUSER_STREAM_THREADS;
    const int64_t stage = stream_stage_bytes(p);
    p->smem_pipe = (int)(stage * p->stages);
    p->smem_xbuf = 0;
    p->smem_hg = p->phases == 1 ? (int)(range / kc * p->bm * 128) : 0; /* one phase: the unit's H */
    /* barriers and flag; slack to align the ring to 1024 bytes */
    p->smem_bytes = p->smem_pipe + p->smem_hg + 2048;
    p->regs_est = 0;                     /* fixed by setmaxnreg: 40 producer, 232 consumer */
    int64_t zw, wf;
    fuser_plan_scratch(p, c->m, &zw, &wf);
    p->workspace_bytes = wf * 4;
    p->tickets = zw;
    p->dataflows = 0;
    p->barriers = 0;
    return FUSER_OK;
}

void fuser_plan_scratch(const fuser_plan *p, int64_t m, int64_t *zeroed_words, int64_t *ws_floats)
{
    *zeroed_words = *ws_floats = 0;
    if (!p->fused)
        return;
    if (p->kind == FUSER_KIND_STREAM) {
        /* seven counters (claim, done, summed, help, taken, x slices claimed and stored), then per row tile its
         * tickets and ready counters (and, units sharing their l-tiles, a counter of each slice's l-tiles taken) */
        const int64_t slices = (int64_t)p->s2 * (fuser_stream_steals(p) ? 2 : 1);
        *zeroed_words = 7 + fuser_ceil_div(m, p->bm) * ((int64_t)p->nt1 + p->lt2 + slices);
        /* H, x's copy (fuser_stream_ws_layout), then the split partials: whole tiles (bm rows, bn or bl columns)
         * of every row tile and n- or l-tile, in the accumulators' order */
        const int64_t rows = fuser_ceil_div(m, p->bm) * p->bm;
        int64_t xq, partials;
        fuser_stream_ws_layout(p, m, &xq, &partials);
        *ws_floats = partials + (p->s1 > 1 ? (int64_t)p->s1 * p->parts * rows * p->nt1 * p->bn : 0) +
                     (p->s2 > 1 ? (int64_t)p->s2 * rows * p->lt2 * p->bl : 0);
        return;
    }
    if (p->grid_n < 2)
        return;
    const int64_t grid_m = fuser_ceil_div(m, (int64_t)p->cls_m * p->bm);
    *zeroed_words = grid_m * p->cls_m * p->cls_l * p->lc * p->cls_reduce;
    *ws_floats = p->grid_n * grid_m * p->cls_m * p->bm * p->l_pad;
}

void fuser_stream_ws_layout(const fuser_plan *p, int64_t m, int64_t *xq, int64_t *partials)
{
    /* H [rows][N] in 16 bits (a multiple of 4 floats: N % 8 == 0), then a quantized chain's x in e4m3 [rows][K]
     * (K % 16 == 0: a multiple of 4 floats), rows being m rounded up to whole row tiles: the token boxes of the
     * last row tile may then stay inside the buffers (fuser_stream_exact_boxes) */
    const int64_t rows = fuser_ceil_div(m, p->bm) * p->bm;
    *xq = rows * p->chain.n / 2;
    *partials = *xq + (p->chain.dtype == FUSER_E4M3 ? rows * p->chain.k / 4 : 0);
}

fuser_pair fuser_stream_pair(const fuser_plan *p)
{
    if (!p->fused || p->kind != FUSER_KIND_STREAM || p->cluster_size != 2)
        return FUSER_PAIR_NONE;
    return p->cls_m == 2 ? FUSER_PAIR_ROWS : FUSER_PAIR_TILES;
}

int fuser_stream_swap(const fuser_plan *p) { return p->bm < 64 || p->chain.dtype == FUSER_E4M3; }

int fuser_stream_max_s1(const fuser_plan *p)
{
    const int parts = p->chain.gated ? 2 : 1;
    return p->chain.dtype == FUSER_E4M3 && p->chain.gated && p->bm == 128 ? 1 : 16 / parts;
}

int fuser_stream_row_partials(const fuser_plan *p)
{
    /* one phase's partials (many splits, few rows), and a quantized chain's tiles of 128 tokens, whose last
     * split would otherwise read every split's whole 64 KB tile alone at the end of the launch */
    return fuser_stream_swap(p) && (p->phases == 1 || (p->chain.dtype == FUSER_E4M3 && p->bm == 128));
}

int64_t fuser_stream_lgroups(const fuser_plan *p)
{
    return p->phases == 1 ? fuser_ceil_div(p->lt2, p->lspan > 1 ? p->lspan : 1) : p->lt2;
}

int fuser_stream_steals(const fuser_plan *p)
{
    return fuser_stream_row_partials(p) && p->lspan == p->lt2 && p->lt2 > 1 && p->s2 > 1;
}

int64_t fuser_stream_units(const fuser_plan *p, int64_t m)
{
    if (fuser_stream_steals(p)) /* a unit per slice, and each of its l-tiles a piece a helper may take */
        return fuser_ceil_div(m, p->bm) * p->s2 * (1 + (int64_t)p->lt2);
    const int64_t u1 = p->phases == 1 ? 0 : (int64_t)p->nt1 * p->s1;
    return fuser_ceil_div(m, p->bm) * (u1 + fuser_stream_lgroups(p) * p->s2);
}

double fuser_stream_phase_weights(const fuser_plan *p, int phase)
{
    const fuser_chain *c = &p->chain;
    const double e = fuser_dtype_size(c->dtype);
    return phase == 1 ? e * p->parts * (double)c->n * c->k : e * (double)c->l * c->n;
}

int fuser_stream_weights_in_l2(const fuser_plan *p)
{
    return fuser_stream_phase_weights(p, 1) + fuser_stream_phase_weights(p, 2) <= FUSER_STREAM_L2_BYTES;
}

int64_t fuser_stream_row_group(const fuser_plan *p, int64_t m)
{
    return fuser_stream_weights_in_l2(p) ? 1 : fuser_ceil_div(m, p->bm);
}

int fuser_plan_derive(fuser_plan *p, fuser_err *err)
{
    const fuser_chain *c = &p->chain;
    if (fuser_chain_check(c, err))
        return err->code;
    if (!p->fused)
        return FUSER_OK;
    if (c->m < 1)
        return fuser_fail(err, FUSER_E_VALUE, "a fused plan needs m >= 1 (an empty batch launches nothing)");
    if (c->dtype == FUSER_F32)
        return fuser_fail(err, FUSER_E_VALUE, "fused plans compute in 16-bit (bfloat16 or float16), not float32");
    if (p->kind == FUSER_KIND_STREAM)
        return derive_stream(p, err);
    if (c->dtype == FUSER_E4M3)
        return fuser_fail(err, FUSER_E_VALUE, "a quantized (float8_e4m3fn) chain runs stream plans only");
    if (p->kind != FUSER_KIND_CLUSTER)
        return fuser_fail(err, FUSER_E_VALUE, "unknown kernel kind %d", (int)p->kind);
    p->threads = FUSER_THREADS;
    if (p->s1 < 0 || p->s1 > 1 || p->s2 < 0 || p->s2 > 1)
        return fuser_fail(err, FUSER_E_VALUE, "s1 = %d, s2 = %d: a cluster plan has no stream splits (0 or 1)",
                          p->s1, p->s2);
    if (!pow2_upto16(p->cls_m) || !pow2_upto16(p->cls_n) || !pow2_upto16(p->cls_k) || !pow2_upto16(p->cls_l))
        return fuser_fail(err, FUSER_E_VALUE, "cluster (%d, %d, %d, %d): every extent must be 1, 2, 4, 8 or 16",
                          p->cls_m, p->cls_n, p->cls_k, p->cls_l);
    p->cluster_size = p->cls_m * p->cls_n * p->cls_k;
    if (p->cluster_size > 16)
        return fuser_fail(err, FUSER_E_VALUE, "cluster (%d, %d, %d, %d) has %d blocks; at most 16", p->cls_m,
                          p->cls_n, p->cls_k, p->cls_l, p->cluster_size);
    if (p->cls_l % p->cls_k || (p->cls_n * p->cls_k) % p->cls_l)
        return fuser_fail(err, FUSER_E_VALUE,
                          "cluster (%d, %d, %d, %d): cls_l must be a multiple of cls_k and divide cls_n * cls_k",
                          p->cls_m, p->cls_n, p->cls_k, p->cls_l);
    if (p->bm != 16 && p->bm != 32 && p->bm != 64 && p->bm != 128)
        return fuser_fail(err, FUSER_E_VALUE, "bm = %d: must be 16, 32, 64 or 128", p->bm);
    if (!(p->bn == 32 || (p->bn % 64 == 0 && p->bn >= 64 && p->bn <= 256)))
        return fuser_fail(err, FUSER_E_VALUE, "bn = %d: must be 32 or a multiple of 64 up to 256", p->bn);
    if (p->bl < 32 || p->bl > 256 || p->bl % 32)
        return fuser_fail(err, FUSER_E_VALUE, "bl = %d: must be a multiple of 32 in [32, 256]", p->bl);
    if (p->n_iters < 1 || p->n_iters > 4096)
        return fuser_fail(err, FUSER_E_VALUE, "n_iters = %d: must be in [1, 4096]", p->n_iters);
    if (p->stages < 1 || p->stages > 8)
        return fuser_fail(err, FUSER_E_VALUE, "stages = %d: must be in [1, 8]", p->stages);
    if (p->order != FUSER_ORDER_N_OUTER && p->order != FUSER_ORDER_L_OUTER)
        return fuser_fail(err, FUSER_E_VALUE, "unknown loop order %d", (int)p->order);
    if (c->gated ? (p->gate_mode != FUSER_GATE_SPATIAL && p->gate_mode != FUSER_GATE_SEQUENTIAL)
                 : p->gate_mode != FUSER_GATE_NONE)
        return fuser_fail(err, FUSER_E_VALUE, "gate mode %d does not fit a %s chain", (int)p->gate_mode,
                          c->gated ? "gated" : "plain");
    if (p->gate_mode == FUSER_GATE_SPATIAL && p->cls_k % 2)
        return fuser_fail(err, FUSER_E_VALUE, "gated spatial mode puts gate and up on different blocks: cls_k "
                          "must be even, got %d", p->cls_k);

    p->cls_shuffle = p->cls_l / p->cls_k;
    p->cls_reduce = p->cls_n * p->cls_k / p->cls_l;
    p->ksplit = p->gate_mode == FUSER_GATE_SPATIAL ? p->cls_k / 2 : p->cls_k;
    p->parts = p->gate_mode == FUSER_GATE_SEQUENTIAL ? 2 : 1;
    p->warps_m = p->bm / 16 < 4 ? p->bm / 16 : 4;
    p->warps_n = (FUSER_THREADS / 32) / p->warps_m;
    if (p->bn % (8 * p->warps_n) || p->bl % (8 * p->warps_n))
        return fuser_fail(err, FUSER_E_VALUE, "bn = %d and bl = %d must be multiples of %d (8 columns x %d warps)",
                          p->bn, p->bl, 8 * p->warps_n, p->warps_n);
    if (p->bl % p->cls_reduce || (p->bl / p->cls_reduce) % 8)
        return fuser_fail(err, FUSER_E_VALUE, "bl = %d must split into %d shares of a multiple of 8 columns",
                          p->bl, p->cls_reduce);
    p->sw = p->bl / p->cls_reduce;
    p->kt = fuser_ceil_div(c->k, FUSER_BK);
    p->kts = fuser_ceil_div(p->kt, p->ksplit);
    p->nb = (int64_t)p->bn * p->n_iters;
    p->nc = p->nb * p->cls_n;
    p->grid_n = fuser_ceil_div(c->n, p->nc);
    p->grid_m = fuser_ceil_div(c->m, (int64_t)p->cls_m * p->bm);
    p->lp = fuser_ceil_div(fuser_ceil_div(c->l, p->cls_l), p->bl) * p->bl;
    p->lc = (int)(p->lp / p->bl);
    if (p->order == FUSER_ORDER_N_OUTER && p->lc != 1)
        return fuser_fail(err, FUSER_E_VALUE,
                          "n_outer keeps a block's output part in registers: it must be one chunk, but %lld "
                          "columns per part need %d chunks of bl = %d", (long long)p->lp, p->lc, p->bl);
    p->clusters = p->grid_m * p->grid_n;
    p->blocks = p->clusters * p->cluster_size;
    p->m_pad = p->grid_m * p->cls_m * p->bm;
    p->l_pad = p->cls_l * p->lp;

    const int k2 = p->bn < FUSER_BK2 ? p->bn : FUSER_BK2;
    const int64_t pipe1 = (int64_t)p->stages * (p->bm + (int64_t)p->bn * p->parts) * FUSER_BK * 2;
    const int64_t pipe2 = (int64_t)p->stages * p->bl * k2 * 2;
    const int64_t xb1 = p->cls_k > 1 ? (int64_t)p->parts * p->bm * p->bn * 4 : 0;
    const int64_t xb2 = p->cls_reduce > 1 ? (int64_t)p->bm * p->bl * 4 : 0;
    const int64_t hg = (int64_t)p->cls_shuffle * (p->order == FUSER_ORDER_L_OUTER ? p->n_iters : 1) * p->bm *
                       p->bn * 2;
    if (hg > ((int64_t)1 << 30))
        return fuser_fail(err, FUSER_E_VALUE, "the H buffer of this plan is %lld bytes", (long long)hg);
    p->smem_pipe = align128(fuser_max64(pipe1, pipe2));
    p->smem_xbuf = align128(fuser_max64(xb1, xb2));
    p->smem_hg = align128(hg);
    p->smem_bytes = p->smem_pipe + p->smem_xbuf + p->smem_hg + 128; /* + flags */

    const int acc1 = p->parts * p->bm * p->bn / FUSER_THREADS;
    const int acc2 = p->bm * p->bl / FUSER_THREADS;
    /* NOTE: 64 = fragments (A 4-8, B 2-4 per n8 tile, double-buffered) + addresses, loop state */
    p->regs_est = (p->order == FUSER_ORDER_N_OUTER ? acc1 + acc2 : (acc1 > acc2 ? acc1 : acc2)) + 64;

    p->workspace_bytes = p->grid_n > 1 ? p->grid_n * p->m_pad * p->l_pad * 4 : 0;
    p->tickets = p->grid_n > 1 ? p->grid_m * p->cls_m * p->cls_l * p->lc * p->cls_reduce : 0;
    p->dataflows = (p->cls_k > 1 ? FUSER_DF_ALL_EXCHANGE : 0) | (p->cls_shuffle > 1 ? FUSER_DF_SHUFFLE : 0) |
                   (p->cls_reduce > 1 ? FUSER_DF_REDUCE_SCATTER : 0) | (p->grid_n > 1 ? FUSER_DF_INTER_CLUSTER : 0);
    p->barriers = count_barriers(p);
    return FUSER_OK;
}

int fuser_plan_check_target(const fuser_plan *p, const fuser_target *t, fuser_err *err)
{
    if (!p->fused)
        return FUSER_OK;
    if (p->cluster_size > t->max_cluster)
        return fuser_fail(err, FUSER_E_VALUE, "cluster of %d blocks exceeds %s's limit of %d", p->cluster_size,
                          t->name, t->max_cluster);
    if (p->smem_bytes > t->smem_per_block)
        return fuser_fail(err, FUSER_E_VALUE, "%d bytes of shared memory per block exceed %s's %d",
                          p->smem_bytes, t->name, t->smem_per_block);
    if (p->kind == FUSER_KIND_STREAM) /* registers are fixed by the template (static_asserts) */
        return p->workspace_bytes > t->max_workspace
                   ? fuser_fail(err, FUSER_E_VALUE, "%lld bytes of workspace exceed the limit of %lld",
                                (long long)p->workspace_bytes, (long long)t->max_workspace)
                   : FUSER_OK;
    int reg_cap = t->regs_per_sm / FUSER_THREADS;
    if (reg_cap > t->max_regs_per_thread)
        reg_cap = t->max_regs_per_thread;
    reg_cap -= FUSER_REG_HEADROOM;
    if (p->regs_est > reg_cap)
        return fuser_fail(err, FUSER_E_VALUE, "an estimated %d registers per thread exceed %s's %d", p->regs_est,
                          t->name, reg_cap);
    if (p->workspace_bytes > t->max_workspace)
        return fuser_fail(err, FUSER_E_VALUE, "%lld bytes of workspace exceed the limit of %lld",
                          (long long)p->workspace_bytes, (long long)t->max_workspace);
    if (p->blocks > 0x7fffffffLL)
        return fuser_fail(err, FUSER_E_VALUE, "%lld blocks exceed the grid limit", (long long)p->blocks);
    return FUSER_OK;
}
