/* stream.c: the stream kernel family in the core: exact traffic (closed forms of the unit schedule),
 * the cost model, and the CPU interpreter that executes the same units, split order and rounding points
 * as include/fuser/device/stream.cuh (where a one-phase swap-AB tile sums runs of splits, then the runs,
 * the interpreter sums the splits in order: the same to fp32 rounding). See include/fuser/stream.h. */
#include "fuser/stream.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- geometry ---- */

typedef struct {
    int64_t m, K, N, L, parts, bm, bn, bl, s1, s2;
    int64_t kt1, ks1, kt2, ks2, nt1, lt2, u1, u2; /* u1, u2: units of each phase per row tile */
    int64_t rt;                                   /* row tiles of bm tokens */
    int64_t kc;                                   /* columns of a K step (128 bytes of a row) */
    int64_t e, eo;                                /* bytes of a weight's and H's element, of x's, y's and biases' */
    int64_t reps;                                 /* GEMM1 runs per row tile and n-tile: 1, or lg in one phase */
    int64_t lg;                                   /* groups of l-tiles along d_out (one per phase-2 unit) */
    int one;                                      /* one phase: each unit computes its own H in shared memory */
    int rowsum;                                   /* partials of the real token rows, summed by every block */
} geom;

static geom geom_of(const fuser_plan *p)
{
    const fuser_chain *c = &p->chain;
    geom g = {c->m, c->k, c->n, c->l, p->parts, p->bm, p->bn, p->bl, p->s1, p->s2};
    g.reps = 1;
    g.kc = fuser_kstep_cols(c->dtype);
    g.e = fuser_dtype_size(c->dtype);
    g.eo = fuser_dtype_size(fuser_chain_out_dtype(c));
    g.kt1 = fuser_ceil_div(g.K, g.kc);
    g.ks1 = fuser_ceil_div(g.kt1, g.s1);
    g.kt2 = fuser_ceil_div(g.N, g.kc);
    g.ks2 = fuser_ceil_div(g.kt2, g.s2);
    g.nt1 = p->nt1;
    g.lt2 = p->lt2;
    g.one = p->phases == 1;
    g.rowsum = fuser_stream_row_partials(p);
    g.lg = fuser_stream_lgroups(p);
    g.u1 = g.nt1 * g.s1;
    g.u2 = g.lg * g.s2;
    g.rt = fuser_ceil_div(g.m, g.bm);
    g.reps = g.one ? g.lg : 1;
    return g;
}

/* ---- traffic ---- */

/* Bytes of phase 1's K-split partials: whole fp32 partial tiles, written and read back. */
static double partials1(const geom *g)
{
    return g->s1 > 1 ? 2.0 * 4 * g->s1 * g->parts * g->rt * g->bm * g->nt1 * g->bn : 0;
}

void fuser_stream_traffic(const fuser_plan *p, fuser_traffic *out)
{
    const fuser_chain *c = &p->chain;
    const geom g = geom_of(p);
    const int64_t e = g.e, eo = g.eo;
    int64_t l2 = 0;
    /* pairs read their shared operand once for both units: the weights once per pair of row tiles, or the
     * token tile once per pair of tiles */
    const fuser_pair pair = fuser_stream_pair(p);
    const int64_t wr = pair == FUSER_PAIR_ROWS ? (g.rt + 1) / 2 : g.rt;
    const int64_t nx = pair == FUSER_PAIR_TILES ? (g.nt1 + 1) / 2 : g.nt1;
    const int64_t nh = pair == FUSER_PAIR_TILES ? (g.lt2 + 1) / 2 : g.lt2;
    /* phase 1 (one phase: in every unit, once per group of l-tiles): x by every n-tile, the weights by every row tile,
     * biases once, H stored once (one phase: kept in shared memory). A quantized chain's x is read in e4m3,
     * quantized from bfloat16 first (read and written once). */
    const int q = c->dtype == FUSER_E4M3;
    const int64_t ex = q ? e : eo;
    l2 += g.reps * (ex * g.m * g.K * nx + e * g.parts * g.N * g.K * wr + eo * (c->bias_up + c->bias_gate) * g.N) +
          (g.one ? 0 : e * g.m * g.N) + (q ? (eo + e) * g.m * g.K : 0);
    l2 += (int64_t)partials1(&g);
    /* phase 2: H by every l-tile (not in one phase), W_down by every row tile, b_down once, y */
    l2 += (g.one ? 0 : e * g.m * g.N * nh) + e * g.L * g.N * wr + eo * c->bias_down * g.L + eo * g.m * g.L;
    if (g.s2 > 1) /* partials written and read back: whole tiles, or the real token rows (rowsum) */
        l2 += 2 * 4 * g.s2 * (g.rowsum ? g.m : g.rt * g.bm) * g.lt2 * g.bl;
    out->l2 = l2;
    out->hbm = e * (g.parts * g.N * g.K + g.L * g.N) +
               eo * (g.m * g.K + (c->bias_up + c->bias_gate) * g.N + c->bias_down * g.L + g.m * g.L);
    out->dsm = 0;
    out->smem = g.rt * (g.reps * g.nt1 * g.kt1 * (g.bm + g.parts * g.bn) + g.lt2 * g.kt2 * ((g.one ? 0 : g.bm) + g.bl)) *
                g.kc * e;
}

/* ---- cost ---- */

/* Fraction of the tensor cores' rate a stream of SS wgmma m64nNk16 reaches when shared memory feeds
 * it: each instruction reads A (64 x 16) and B (N x 16), 16-bit, while the SM's tensor cores need N / 2
 * cycles for it; below N = 64 the operands cannot arrive fast enough. */
static double wgmma_eff(const fuser_target *t, int n)
{
    return fmin(1.0, t->stream_operand_bytes_per_clk / ((2048.0 + 32.0 * n) / (n / 2.0)));
}

/* A unit's time when `n` SMs load weights at once, each at most its share of HBM (or its own rate),
 * and at least its MMAs, epilogue and fixed cost (`busy`). */
static double shared_unit(double w, double busy, double per_sm, double hbm, double n)
{
    return fmax(w / fmin(per_sm, hbm / n), busy);
}

void fuser_stream_cost(fuser_plan *p, const fuser_target *t)
{
    fuser_stream_traffic(p, &p->traffic);
    const fuser_chain *c = &p->chain;
    const geom g = geom_of(p);
    fuser_cost *k = &p->cost;
    memset(k, 0, sizeof *k);
    const int64_t G = fuser_min64(g.rt * ((g.one ? 0 : g.u1) + g.u2), t->sm_count);
    const double rows = (double)g.m / g.rt; /* token rows of a row tile, on average */
    const double e = (double)g.e, clk = t->clock_ghz * 1e9;
    /* (e4m3 MMAs run at twice the 16-bit rate) */
    const double mma_sm = t->mma_tflops * 1e12 * t->stream_mma_eff / t->sm_count * (2.0 / e);
    const double stage = (double)p->smem_pipe / p->stages;
    const double per_sm = fmin(t->stream_sm_gbs * 1e9, (p->stages - 1) * stage / (t->mem_latency_us * 1e-6));
    /* a unit's fixed cost: smaller in one phase (each unit reads its own weights and waits for no other
     * unit) where the tokens fit one row tile, or where up to 256 token rows make units that all run at
     * once and stream few weights each (such units of several row tiles measure like one's; larger units,
     * and more rows, do not: docs/planner.md) */
    const double unit_w = g.one ? e * g.L * g.N / g.u2 + e * g.parts * g.ks2 * g.kc * g.K : 0;
    const int cheap = g.one && (g.rt == 1 || (g.rt * g.bm <= 256 && (double)g.rt * g.u2 <= G &&
                                              unit_w <= t->stream_unit_one_kb * 1024));
    const double unit = (cheap ? t->stream_unit_one_us : t->stream_unit_us) * 1e-6;
    /* wgmma N of the consumers' MMAs (swap-AB: the tokens) */
    const int swap = fuser_stream_swap(p);
    const int nw1 = swap ? p->bm : p->bm == 128 ? p->bn : p->bn / 2;
    const int nw2 = swap ? p->bm : p->bm == 128 ? p->bl : p->bl / 2;
    /* H through HBM once it outgrows L2: phase 1 writes it, phase 2 reads it */
    const double h_hbm = e * g.m * g.N > FUSER_STREAM_L2_BYTES ? e * g.m * g.N : 0;
    /* One phase: `units` equal units (every row tile's), each `w` weight bytes, `x` operand bytes (X or H,
     * from L2), `f` FLOPs and an epilogue of `epi` bytes; `hbm` bytes the phase moves through HBM (its
     * weights once: the row tiles of a weight tile are consecutive units, so all but one read it from L2).
     * The blocks claim units in order, so the phase takes ceil(units / G) rounds of one unit on one SM
     * (its loads, or its MMAs plus epilogue, whichever is longer), or the phase's bytes over HBM or L2
     * bandwidth, whichever is longest. `f1` FLOPs more run at GEMM1's wgmma width: one phase's units
     * compute their own H (GEMM1 over their d_ff range, n-tile by n-tile) before GEMM2, and phase 1 is empty. */
    struct { double units, w, x, f, f1, epi, hbm; int nw; } ph[2] = {
        {(double)(g.rt * g.u1), e * g.parts * g.N * g.K / g.u1, (double)g.eo * rows * g.K * g.nt1 / g.u1,
         2.0 * g.bm * g.parts * g.bn * g.ks1 * g.kc, 0, (g.s1 > 1 ? 4.0 * g.parts * rows * g.bn : 0) + e * rows * g.bn,
         e * g.parts * g.N * g.K + h_hbm, nw1},
        {(double)(g.rt * g.u2), e * g.L * g.N / g.u2, e * rows * g.N * g.lt2 / g.u2,
         2.0 * g.bm * g.bl * g.ks2 * g.kc * g.lt2 / g.lg, 0,
         ((g.s2 > 1 ? 4.0 * rows * g.bl : 0) + e * rows * g.bl) * g.lt2 / g.lg, e * g.L * g.N + h_hbm, nw2},
    };
    if (g.one) {
        const double range = (double)g.ks2 * g.kc; /* d_ff columns of a unit's split */
        ph[1].w += e * g.parts * range * g.K;
        ph[1].x = e * rows * g.K * range / g.bn;
        ph[1].f1 = 2.0 * g.bm * g.parts * range * g.kt1 * g.kc;
        ph[1].hbm = e * (g.parts * g.N * g.K + g.L * g.N);
        memset(&ph[0], 0, sizeof ph[0]);
    }
    /* tiles of 128 token rows on wgmma's M side: each phase-1 K split's fp32 partial tile (64 KB per part)
     * is written and read back, tens of MB at 7B weights, more than L2 keeps while the weights stream
     * through it: phase 1 pays its partials' round trip through HBM (timed at 77-128 tokens, such plans of
     * 2-4 splits ran 7-25% slower than modelled without it; docs/planner.md) */
    if (p->bm == 128 && !fuser_stream_swap(p) && !g.one)
        ph[0].hbm += partials1(&g);
    /* pairs: each SM still takes in both operands whole, but L2 serves the shared one once per pair */
    const fuser_pair pair = fuser_stream_pair(p);
    const double sw = pair == FUSER_PAIR_ROWS ? 0.5 : 1, sx = pair == FUSER_PAIR_TILES ? 0.5 : 1;
    double T = 0, busy[2] = {0, 0}; /* busy: a unit's MMAs, epilogue and fixed cost */
    /* one row tile's plans read each weight once, straight from HBM into one SM, at the part's stream rate;
     * several row tiles' read each weight tile again from L2 for the next row tile, and measure at hbm_gbs's
     * rate (timed on the H100, where the two differ: docs/planner.md "The stream's HBM rate on other parts") */
    const double hbm = (g.rt == 1 ? t->stream_hbm_gbs : t->hbm_gbs) * 1e9;
    /* one round of 128-row phase-1 units on one row tile (64-128 tokens), each SM one unit of GEMM1 over
     * the whole of d_model: their main loops run at the matmul rate, above the GEMM probe's (unit traces:
     * docs/planner.md "64-128 tokens") */
    const int round1 = g.rt == 1 && !g.one && p->bm == 128 && !swap && g.s1 == 1 && ph[0].units <= G;
    const double mma_ph[2] = {round1 ? mma_sm * t->stream_round_mma_eff / t->stream_mma_eff : mma_sm, mma_sm};
    for (int i = 0; i < 2; i++) {
        if (ph[i].units == 0)
            continue;
        const double active = fmin(ph[i].units, (double)G);
        busy[i] = ph[i].f / (mma_ph[i] * wgmma_eff(t, ph[i].nw)) + ph[i].f1 / (mma_sm * wgmma_eff(t, nw1)) +
                  ph[i].epi / (t->sm_load_gbs * 1e9) + unit;
        const double one = fmax((ph[i].w + ph[i].x) / per_sm, busy[i]);
        const double rounds = ceil(ph[i].units / G);
        /* swap-AB over several row tiles: every row tile's units read the weights from L2 again */
        const double reread = swap && g.rt > 1 ? ph[i].units * ph[i].w / (t->stream_reread_gbs * 1e9) : 0;
        T += fmax(fmax(rounds * one, reread), fmax(ph[i].hbm / hbm, ph[i].units * (sw * ph[i].w + sx * ph[i].x) /
                                                                       fmin(t->l2_gbs * 1e9, active * per_sm)));
    }
    /* Decode over several rounds of phase 1 (one row tile, two phases, single blocks): every SM loads its
     * unit's weights at its share of HBM, and the SMs a short last round leaves free run the phase-2 units
     * whose H is ready. The splits whose n-tiles that round holds start only after it: when they are few
     * (LLaMA-2-7B at one token in 2 x 86 units: the last split's 32 units), they end the kernel below
     * HBM's rate (docs/planner.md, decode rounds). */
    if (g.rt == 1 && !g.one && pair == FUSER_PAIR_NONE && ph[0].units > G) {
        const double rounds1 = ceil(ph[0].units / G);
        const int64_t n_last = (int64_t)((rounds1 - 1) * G) / g.s1; /* the last round's first n-tile */
        const int64_t s_first = fuser_min64(g.s2 - 1, n_last * g.bn / (g.ks2 * g.kc));
        const double tail_units = (double)(g.s2 - s_first) * g.lg;
        const double tail = fmax(tail_units * ph[1].w / hbm,
                                 ceil(tail_units / G) * shared_unit(ph[1].w, busy[1], per_sm, hbm, fmin(tail_units, G)));
        T = fmax(T, rounds1 * shared_unit(ph[0].w, busy[0], per_sm, hbm, G) + tail);
    }
    /* the last split of a tile sums every split's partial before H (or y) exists: the real rows' share of
     * the partial tiles. One phase's ticketed sums are sized by the padded bm-row tile although the kernel
     * moves only the real rows' fragments: at few tokens that term stands for the per-split cost of the
     * ticket and the last split's loads (bm 64 plans with 12-16 splits are under-predicted without it) */
    const double red1 = g.s1 > 1 ? 4.0 * g.s1 * g.parts * rows * g.bn / (t->sm_load_gbs * 1e9) : 0;
    /* (rowsum: after every unit, all blocks sum y's partials together, the real rows only) */
    const double red2 = g.s2 <= 1 ? 0
                        : g.rowsum ? 4.0 * g.s2 * g.m * g.L / (G * t->sm_load_gbs * 1e9) + t->mem_latency_us * 1e-6
                                   : 4.0 * g.s2 * (g.one ? g.bm : rows) * g.bl / (t->sm_load_gbs * 1e9);
    /* the sums are the kernel's tail: counted in `sync`, and in the schedule too where they hold up other
     * units (one phase's ticketed sums end a unit nothing waits for; timed cells in docs/planner.md) */
    T += g.one && !g.rowsum ? 0 : red1 + red2;

    k->flops = 2.0 * g.kc * g.bm * g.rt * (g.reps * g.parts * g.bn * g.nt1 * g.kt1 + g.bl * g.lt2 * g.kt2);
    k->useful_flops = 2.0 * c->m * c->n * ((double)c->k * (c->gated ? 2 : 1) + c->l);
    k->compute = k->flops / (G * mma_sm) * 1e6;
    const double hbm_bytes = p->traffic.hbm + 2 * h_hbm;
    k->hbm = hbm_bytes / hbm * 1e6;
    k->l2 = p->traffic.l2 / (t->l2_gbs * 1e9) * 1e6;
    k->smem = p->traffic.smem / (G * t->smem_bytes_per_clk * clk) * 1e6;
    k->dsm = 0;
    k->sync = (red1 + red2) * 1e6 + t->stream_fixed_us;
    const double bound = fmax(fmax(k->compute, k->hbm), fmax(k->l2, k->smem));
    k->tail = fmax(0, T * 1e6 - bound); /* imbalance between blocks and the phase-1 -> phase-2 hand-off */
    const double tile_rows = (double)g.rt * g.bm;
    if (g.e == 1 && tile_rows > t->stream_fp8_tail_rows && fuser_stream_row_group(p, g.m) > 1)
        k->tail *= t->stream_fp8_tail_rows / tile_rows;
    k->launch = t->launch_us;
    k->waves = 1;
    k->sms_used = (int)G;
    const double s = t->stream_time_scale;
    k->compute *= s, k->hbm *= s, k->l2 *= s, k->smem *= s, k->sync *= s, k->tail *= s;
    if (g.rt == 1) /* a long stream pays its start once (stream_long_gbs in target.h) */
        k->hbm = fmin(k->hbm, t->stream_ramp_us + hbm_bytes / (t->stream_long_gbs * 1e9) * 1e6);
    k->total = k->launch + fmax(fmax(k->compute, k->hbm), fmax(k->l2, k->smem)) + k->tail + k->sync;
}

/* ---- the interpreter ---- */

typedef struct {
    const fuser_plan *p;
    const fuser_ffn_data *d;
    fuser_dtype dt;
    geom g;
    float *part;          /* split partials: [s][parts][m][tile] */
    float *h;             /* H [m][N], already rounded to 16 bits */
    unsigned char *seen[7];
    int64_t sizes[7];
    unsigned char *written;
    fuser_traffic tr;
    double flops;
} ssim;

static float val(ssim *S, int which, const uint16_t *src, int64_t i)
{
    S->seen[which][i] = 1;
    return fuser_half_to_float(src[i], S->dt);
}

/* out[m][w] (rows ld_out apart) = sum over k in [k0, k1) of a[m][k] * b[row0 + w][k], k ascending. */
static void split_product(ssim *S, int wa, const float *a_f32, const uint16_t *a16, int64_t lda, int wb,
                          const uint16_t *b16, int64_t ldb, int64_t row0, int64_t rows, int64_t k0, int64_t k1,
                          float *out, int64_t ld_out)
{
    for (int64_t r = 0; r < S->g.m; r++)
        for (int64_t w = 0; w < rows; w++) {
            float acc = 0;
            for (int64_t kk = k0; kk < k1; kk++) {
                const float a = a_f32 ? a_f32[r * lda + kk] : val(S, wa, a16, r * lda + kk);
                acc += a * val(S, wb, b16, (row0 + w) * ldb + kk);
            }
            out[r * ld_out + w] = acc;
        }
}

enum { S_X, S_WU, S_WG, S_WD, S_BU, S_BG, S_BD };

static void phase1(ssim *S, int64_t nt)
{
    const geom *g = &S->g;
    const fuser_ffn_data *d = S->d;
    const fuser_chain *c = &S->p->chain;
    const int64_t n0 = nt * g->bn, nr = fuser_min64(g->bn, g->N - n0);
    const uint16_t *w[2] = {d->w_up, d->w_gate};
    const int wi[2] = {S_WU, S_WG};
    for (int64_t sp = 0; sp < g->s1; sp++) {
        const int64_t k0 = sp * g->ks1 * g->kc, k1 = fuser_min64(g->K, (sp + 1) * g->ks1 * g->kc);
        const int64_t steps = fuser_ceil_div(k1 - k0, g->kc);
        for (int q = 0; q < g->parts; q++)
            split_product(S, S_X, NULL, d->x, g->K, wi[q], w[q], g->K, n0, nr, k0, k1,
                          S->part + (sp * g->parts + q) * g->m * g->bn, g->bn);
        /* every row tile's unit reads the weight tile (one phase: every l-tile's unit of every row tile) */
        S->tr.l2 += g->reps * (2 * g->m * (k1 - k0) + 2 * g->parts * nr * (k1 - k0) * g->rt);
        S->tr.smem += g->reps * g->rt * steps * (g->bm + g->parts * g->bn) * g->kc * 2;
        S->flops += 2.0 * g->reps * g->rt * steps * g->kc * g->bm * g->parts * g->bn;
        if (g->s1 > 1)
            S->tr.l2 += 2 * 4 * g->parts * g->rt * g->bm * g->bn; /* whole tiles, written and read back */
    }
    for (int64_t j = 0; j < nr; j++) {
        const float bu = c->bias_up ? val(S, S_BU, d->b_up, n0 + j) : 0;
        const float bg = c->bias_gate ? val(S, S_BG, d->b_gate, n0 + j) : 0;
        for (int64_t r = 0; r < g->m; r++) {
            float v[2] = {0, 0};
            for (int q = 0; q < g->parts; q++)
                for (int64_t sp = 0; sp < g->s1; sp++) /* split order */
                    v[q] += S->part[((sp * g->parts + q) * g->m + r) * g->bn + j];
            const float hv = c->gated ? fuser_act_f32(c->act, v[1] + bg) * (v[0] + bu) : fuser_act_f32(c->act, v[0] + bu);
            S->h[r * g->N + n0 + j] = fuser_half_to_float(fuser_float_to_half(hv, S->dt), S->dt);
        }
    }
    S->tr.l2 += g->reps * 2 * (c->bias_up + c->bias_gate) * nr + (g->one ? 0 : 2 * g->m * nr);
}

static void phase2(ssim *S, int64_t lt)
{
    const geom *g = &S->g;
    const fuser_ffn_data *d = S->d;
    const fuser_chain *c = &S->p->chain;
    const int64_t l0 = lt * g->bl, lr = fuser_min64(g->bl, g->L - l0);
    for (int64_t sp = 0; sp < g->s2; sp++) {
        const int64_t k0 = sp * g->ks2 * g->kc, k1 = fuser_min64(g->N, (sp + 1) * g->ks2 * g->kc);
        const int64_t steps = fuser_ceil_div(k1 - k0, g->kc);
        split_product(S, -1, S->h, NULL, g->N, S_WD, d->w_down, g->N, l0, lr, k0, k1, S->part + sp * g->m * g->bl,
                      g->bl);
        S->tr.l2 += (g->one ? 0 : 2 * g->m * (k1 - k0)) + 2 * lr * (k1 - k0) * g->rt;
        S->tr.smem += g->rt * steps * ((g->one ? 0 : g->bm) + g->bl) * g->kc * 2;
        S->flops += 2.0 * g->rt * steps * g->kc * g->bm * g->bl;
        if (g->s2 > 1)
            S->tr.l2 += 2 * 4 * (g->rowsum ? g->m : g->rt * g->bm) * g->bl;
    }
    for (int64_t j = 0; j < lr; j++) {
        const float b = c->bias_down ? val(S, S_BD, d->b_down, l0 + j) : 0;
        for (int64_t r = 0; r < g->m; r++) {
            float v = 0;
            for (int64_t sp = 0; sp < g->s2; sp++)
                v += S->part[(sp * g->m + r) * g->bl + j];
            d->y[r * g->L + l0 + j] = fuser_float_to_half(v + b, S->dt);
            S->written[r * g->L + l0 + j]++;
        }
    }
    S->tr.l2 += 2 * c->bias_down * lr + 2 * g->m * lr;
}

int fuser_stream_interpret(const fuser_plan *p, const fuser_ffn_data *d, fuser_interp_result *res, fuser_err *err)
{
    if (p->chain.dtype == FUSER_E4M3)
        return fuser_fail(err, FUSER_E_VALUE, "the interpreter runs 16-bit chains; a quantized chain's reference is "
                          "fuser.fp8.reference");
    ssim S;
    memset(&S, 0, sizeof S);
    S.p = p;
    S.d = d;
    S.dt = p->chain.dtype;
    S.g = geom_of(p);
    const geom *g = &S.g;
    const fuser_chain *c = &p->chain;
    const int64_t sizes[7] = {g->m * g->K, g->N * g->K, c->gated ? g->N * g->K : 0, g->L * g->N,
                              c->bias_up ? g->N : 0, c->bias_gate ? g->N : 0, c->bias_down ? g->L : 0};
    int ok = 1;
    for (int i = 0; i < 7; i++) {
        S.sizes[i] = sizes[i];
        ok &= (S.seen[i] = calloc((size_t)sizes[i] + 1, 1)) != NULL;
    }
    const int64_t tile = fuser_max64(g->parts * g->bn, g->bl);
    S.part = malloc(sizeof(float) * (size_t)(fuser_max64(g->s1, g->s2) * g->m * tile));
    S.h = malloc(sizeof(float) * (size_t)(g->m * g->N));
    S.written = calloc((size_t)(g->m * g->L), 1);
    ok &= S.part && S.h && S.written;
    int rc = ok ? FUSER_OK : fuser_fail(err, FUSER_E_NOMEM, "interpreter: out of memory for this plan's buffers");
    if (rc == FUSER_OK) {
        for (int64_t nt = 0; nt < g->nt1; nt++)
            phase1(&S, nt);
        for (int64_t lt = 0; lt < g->lt2; lt++)
            phase2(&S, lt);
        int64_t hbm = 0;
        for (int i = 0; i < 7; i++)
            for (int64_t e = 0; e < S.sizes[i]; e++)
                hbm += 2 * S.seen[i][e];
        for (int64_t e = 0; rc == FUSER_OK && e < g->m * g->L; e++) {
            if (S.written[e] != 1)
                rc = fuser_fail(err, FUSER_E_INTERNAL, "plan leaves output element (%lld, %lld) written %d times",
                                (long long)(e / g->L), (long long)(e % g->L), S.written[e]);
            hbm += 2;
        }
        S.tr.hbm = hbm;
        res->traffic = S.tr;
        res->barriers = 0;
        res->flops = S.flops;
    }
    for (int i = 0; i < 7; i++)
        free(S.seen[i]);
    free(S.part);
    free(S.h);
    free(S.written);
    return rc;
}
