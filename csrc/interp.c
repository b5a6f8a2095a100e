/* interp.c: the CPU plan interpreter (see include/fuser/interp.h). It runs the schedule of
 * include/fuser/plan.h one cluster at a time; within a cluster, every block runs each phase before
 * any block passes the next cluster barrier, so a block only ever reads what its peers published
 * before a barrier. Bytes are counted as they move; global reads also mark which elements were
 * touched, so the HBM count is the set of distinct bytes read (plus writes and the workspace). */
#include "fuser/interp.h"
#include "fuser/stream.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- 16-bit conversions (round to nearest even) ---- */

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float fuser_half_to_float(uint16_t h, fuser_dtype dt)
{
    if (dt == FUSER_BF16)
        return u2f((uint32_t)h << 16);
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {
        float v = ldexpf((float)m, -24);
        return sign ? -v : v;
    }
    if (e == 31)
        return u2f(sign | 0x7f800000u | (m << 13));
    return u2f(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t fuser_float_to_half(float f, fuser_dtype dt)
{
    uint32_t x = f2u(f);
    if (dt == FUSER_BF16) {
        if ((x & 0x7fffffffu) > 0x7f800000u)
            return 0x7fc0;
        return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
    }
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u)
        return sign | (x > 0x7f800000u ? 0x7e00 : 0x7c00);
    if (x >= 0x477ff000u) /* 65520 and up round to infinity */
        return sign | 0x7c00;
    if (x >= 0x38800000u) /* normal: rebias the exponent by -112 and round the 13 dropped bits */
        return sign | (uint16_t)((x + 0xc8000fffu + ((x >> 13) & 1)) >> 13);
    return sign | (uint16_t)nearbyintf(u2f(x) * 16777216.0f); /* subnormal: units of 2^-24 */
}

float fuser_act_f32(fuser_act a, float x)
{
    switch (a) {
    case FUSER_ACT_RELU: return x > 0 ? x : 0;
    case FUSER_ACT_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case FUSER_ACT_GELU_TANH: return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    case FUSER_ACT_SILU: return x / (1.0f + expf(-x));
    default: return NAN;
    }
}

/* ---- simulation state ---- */

typedef struct {
    int im, in, ik, g, s, lpart;
    float *acc1;   /* [parts][bm*bn] registers */
    float *acc2;   /* [bm*bl] registers */
    float *xbuf;   /* shared: published fp32 partials */
    uint16_t *hg;  /* shared: H slots [cls_shuffle * (l_outer ? n_iters : 1)][bm*bn] */
    float *sx, *sw, *sd; /* shared: operand staging tiles */
    float *sum;    /* registers: [2][bm*bn] exchange sums, or [bm*bl] output share */
} sblock;

typedef struct {
    const fuser_plan *p;
    const fuser_ffn_data *d;
    fuser_dtype dt;
    int csize;
    sblock *b;
    unsigned char *touched[7]; /* x, w_up, w_gate, w_down, b_up, b_gate, b_down */
    int64_t sizes[7];
    unsigned char *written;    /* y */
    float *ws;
    int32_t *tickets;
    int64_t cm, cn;
    fuser_traffic tr;
    int64_t ws_bytes;
    int barriers;
    double flops;
} sim;

enum { T_X, T_WU, T_WG, T_WD, T_BU, T_BG, T_BD };

static const uint16_t *tensor(const sim *S, int which)
{
    const fuser_ffn_data *d = S->d;
    const uint16_t *const t[7] = {d->x, d->w_up, d->w_gate, d->w_down, d->b_up, d->b_gate, d->b_down};
    return t[which];
}

/* Load the tile [r0, r0+tr) x [c0, c0+tc) of a row-major [rows, cols] tensor into dst (zero outside). */
static void load_tile(sim *S, int which, int64_t rows, int64_t cols, int64_t r0, int64_t c0, int tr, int tc,
                      float *dst)
{
    const uint16_t *src = tensor(S, which);
    for (int i = 0; i < tr; i++)
        for (int j = 0; j < tc; j++) {
            int64_t r = r0 + i, c = c0 + j;
            float v = 0;
            if (r < rows && c < cols) {
                v = fuser_half_to_float(src[r * cols + c], S->dt);
                S->touched[which][r * cols + c] = 1;
                S->tr.l2 += 2;
            }
            dst[i * tc + j] = v;
        }
    S->tr.smem += (int64_t)tr * tc * 2;
}

/* Read bias[c0 .. c0+n) (in-bounds only) for an epilogue. */
static void load_bias(sim *S, int which, int64_t len, int64_t c0, int n, float *dst)
{
    const uint16_t *src = tensor(S, which);
    for (int j = 0; j < n; j++) {
        dst[j] = 0;
        if (src && c0 + j < len) {
            dst[j] = fuser_half_to_float(src[c0 + j], S->dt);
            S->touched[which][c0 + j] = 1;
            S->tr.l2 += 2;
        }
    }
}

static void barrier(sim *S) { S->barriers++; }

static sblock *block_at(sim *S, int im, int in, int ik)
{
    const fuser_plan *p = S->p;
    return &S->b[ik * (p->cls_n * p->cls_m) + in * p->cls_m + im];
}

static int64_t row0(const sim *S, const sblock *b) { return (S->cm * S->p->cls_m + b->im) * S->p->bm; }

static int64_t n_col0(const sim *S, int in, int j)
{
    return S->cn * S->p->nc + in * S->p->nb + (int64_t)j * S->p->bn;
}

static int hg_slot(const fuser_plan *p, int s, int j) { return p->order == FUSER_ORDER_L_OUTER ? s * p->n_iters + j : s; }

/* ---- GEMM1: the block's partial H tile(s) for d_ff chunk j over its K split ---- */
static void gemm1(sim *S, sblock *b, int j)
{
    const fuser_plan *p = S->p;
    const fuser_chain *c = &p->chain;
    const int bm = p->bm, bn = p->bn;
    int which[2] = {T_WU, T_WU};
    if (p->gate_mode == FUSER_GATE_SEQUENTIAL)
        which[0] = T_WG, which[1] = T_WU;
    else if (p->gate_mode == FUSER_GATE_SPATIAL)
        which[0] = b->ik / p->ksplit == 0 ? T_WG : T_WU;
    const int64_t q = b->ik % p->ksplit, ks0 = q * p->kts, ks1 = fuser_min64(ks0 + p->kts, p->kt);
    memset(b->acc1, 0, sizeof(float) * p->parts * bm * bn);
    for (int64_t t = ks0; t < ks1; t++) {
        load_tile(S, T_X, c->m, c->k, row0(S, b), t * FUSER_BK, bm, FUSER_BK, b->sx);
        for (int pi = 0; pi < p->parts; pi++)
            load_tile(S, which[pi], c->n, c->k, n_col0(S, b->in, j), t * FUSER_BK, bn, FUSER_BK,
                      b->sw + (size_t)pi * bn * FUSER_BK);
        for (int pi = 0; pi < p->parts; pi++) {
            float *acc = b->acc1 + (size_t)pi * bm * bn;
            const float *w = b->sw + (size_t)pi * bn * FUSER_BK;
            for (int r = 0; r < bm; r++)
                for (int cc = 0; cc < bn; cc++) {
                    float a = acc[r * bn + cc];
                    for (int kk = 0; kk < FUSER_BK; kk++)
                        a += b->sx[r * FUSER_BK + kk] * w[cc * FUSER_BK + kk];
                    acc[r * bn + cc] = a;
                }
            S->flops += 2.0 * bm * bn * FUSER_BK;
        }
    }
}

/* Publish the GEMM1 partials into the block's exchange buffer. */
static void publish_partials(sim *S, sblock *b)
{
    const fuser_plan *p = S->p;
    size_t n = (size_t)p->parts * p->bm * p->bn;
    memcpy(b->xbuf, b->acc1, n * sizeof(float));
    S->tr.smem += (int64_t)n * 4;
}

/* all_exchange: form the complete gate (G) and up (U) sums from every replica's partials, in rank
 * order, then apply bias, activation and gating; round H into the block's own slot. */
static void exchange_epilogue(sim *S, sblock *b, int j)
{
    const fuser_plan *p = S->p;
    const fuser_chain *c = &p->chain;
    const int bm = p->bm, bn = p->bn, tile = bm * bn;
    float *G = b->sum, *U = b->sum + tile;
    memset(b->sum, 0, sizeof(float) * 2 * tile);
    for (int ik = 0; ik < p->cls_k; ik++) {
        const float *src;
        if (p->cls_k == 1) {
            src = b->acc1;
        } else {
            const sblock *peer = block_at(S, b->im, b->in, ik);
            src = peer->xbuf;
            if (peer != b)
                S->tr.dsm += (int64_t)p->parts * tile * 4;
        }
        float *dst0 = U;
        if (p->gate_mode == FUSER_GATE_SEQUENTIAL || (p->gate_mode == FUSER_GATE_SPATIAL && ik / p->ksplit == 0))
            dst0 = G;
        for (int e = 0; e < tile; e++)
            dst0[e] += src[e];
        if (p->gate_mode == FUSER_GATE_SEQUENTIAL)
            for (int e = 0; e < tile; e++)
                U[e] += src[tile + e];
    }
    const int64_t n0 = n_col0(S, b->in, j), r0 = row0(S, b);
    float bu[256], bg[256];
    load_bias(S, T_BU, c->n, n0, bn, bu);
    if (c->gated)
        load_bias(S, T_BG, c->n, n0, bn, bg);
    uint16_t *h = b->hg + (size_t)hg_slot(p, b->s, j) * tile;
    for (int r = 0; r < bm; r++)
        for (int cc = 0; cc < bn; cc++) {
            float v = 0;
            if (n0 + cc < c->n && r0 + r < c->m) {
                if (c->gated)
                    v = fuser_act_f32(c->act, G[r * bn + cc] + bg[cc]) * (U[r * bn + cc] + bu[cc]);
                else
                    v = fuser_act_f32(c->act, U[r * bn + cc] + bu[cc]);
            }
            h[r * bn + cc] = fuser_float_to_half(v, S->dt);
        }
    S->tr.smem += (int64_t)tile * 2;
}

/* shuffle: copy the group peers' H slices for chunk j (or every chunk when j < 0) into own slots. */
static void shuffle(sim *S, sblock *b, int j)
{
    const fuser_plan *p = S->p;
    const int tile = p->bm * p->bn;
    for (int t = 1; t < p->cls_shuffle; t++) {
        int s2 = (b->s + t) % p->cls_shuffle;
        const sblock *peer = block_at(S, b->im, b->g * p->cls_shuffle + s2, b->ik);
        for (int jj = j < 0 ? 0 : j; jj < (j < 0 ? p->n_iters : j + 1); jj++) {
            size_t off = (size_t)hg_slot(p, s2, jj) * tile;
            memcpy(b->hg + off, peer->hg + off, (size_t)tile * 2);
            S->tr.dsm += (int64_t)tile * 2;
            S->tr.smem += (int64_t)tile * 2;
        }
    }
}

/* GEMM2 of one H slot (position s2 of the group, chunk j) into acc2 for output chunk c. */
static void gemm2_slot(sim *S, sblock *b, int c, int s2, int j)
{
    const fuser_plan *p = S->p;
    const fuser_chain *ch = &p->chain;
    const int bm = p->bm, bn = p->bn, bl = p->bl, k2 = bn < FUSER_BK2 ? bn : FUSER_BK2;
    const int64_t l0 = b->lpart * p->lp + (int64_t)c * bl;
    const int64_t nbase = n_col0(S, b->g * p->cls_shuffle + s2, j);
    const uint16_t *h = b->hg + (size_t)hg_slot(p, s2, j) * bm * bn;
    for (int kk0 = 0; kk0 < bn; kk0 += k2) {
        load_tile(S, T_WD, ch->l, ch->n, l0, nbase + kk0, bl, k2, b->sd);
        for (int r = 0; r < bm; r++)
            for (int cl = 0; cl < bl; cl++) {
                float a = b->acc2[r * bl + cl];
                for (int kk = 0; kk < k2; kk++)
                    a += fuser_half_to_float(h[r * bn + kk0 + kk], S->dt) * b->sd[cl * k2 + kk];
                b->acc2[r * bl + cl] = a;
            }
        S->flops += 2.0 * bm * bl * k2;
    }
}

/* Store one output share [bm x width] at columns col0: directly (one d_ff cluster) or through the
 * workspace and the per-share ticket (inter_cluster_reduce; the last arrival sums in cluster order). */
static int store_share(sim *S, sblock *b, int c, const float *E, int ld, int width, int64_t col0, fuser_err *err)
{
    const fuser_plan *p = S->p;
    const fuser_chain *ch = &p->chain;
    const int bm = p->bm;
    const int64_t r0 = row0(S, b);
    const float *src = E;
    float *tmp = NULL;
    if (p->grid_n > 1) {
        for (int r = 0; r < bm; r++)
            for (int cc = 0; cc < width; cc++)
                S->ws[(S->cn * p->m_pad + r0 + r) * p->l_pad + col0 + cc] = E[r * ld + cc];
        S->tr.l2 += (int64_t)bm * width * 4;
        S->ws_bytes += (int64_t)bm * width * 4;
        int64_t T = (((S->cm * p->cls_m + b->im) * p->cls_l + b->lpart) * p->lc + c) * p->cls_reduce + b->g;
        S->tr.l2 += 4;
        if (++S->tickets[T] < p->grid_n)
            return FUSER_OK;
        S->tickets[T] = 0;
        S->tr.l2 += 4;
        tmp = b->sum; /* registers */
        for (int r = 0; r < bm; r++)
            for (int cc = 0; cc < width; cc++) {
                float a = 0;
                for (int64_t cn = 0; cn < p->grid_n; cn++)
                    a += S->ws[(cn * p->m_pad + r0 + r) * p->l_pad + col0 + cc];
                tmp[r * width + cc] = a;
            }
        S->tr.l2 += p->grid_n * bm * width * 4;
        S->ws_bytes += p->grid_n * bm * width * 4;
        src = tmp;
        ld = width;
    }
    float bias[256];
    load_bias(S, T_BD, ch->l, col0, width, bias);
    for (int r = 0; r < bm; r++)
        for (int cc = 0; cc < width; cc++) {
            int64_t row = r0 + r, col = col0 + cc;
            if (row >= ch->m || col >= ch->l)
                continue;
            if (S->written[row * ch->l + col]++)
                return fuser_fail(err, FUSER_E_INTERNAL, "plan writes output (%lld, %lld) twice", (long long)row,
                                  (long long)col);
            S->d->y[row * ch->l + col] = fuser_float_to_half(src[r * ld + cc] + bias[cc], S->dt);
            S->tr.l2 += 2;
        }
    return FUSER_OK;
}

/* Output chunk c of every block: reduce_scatter over the groups (if any), then store. */
static int reduce_store(sim *S, int c, fuser_err *err)
{
    const fuser_plan *p = S->p;
    const int bm = p->bm, bl = p->bl, sw = p->sw;
    if (p->cls_reduce > 1) {
        for (int i = 0; i < S->csize; i++) {
            memcpy(S->b[i].xbuf, S->b[i].acc2, sizeof(float) * bm * bl);
            S->tr.smem += (int64_t)bm * bl * 4;
        }
        barrier(S);
    }
    for (int i = 0; i < S->csize; i++) {
        sblock *b = &S->b[i];
        const int64_t l0 = b->lpart * p->lp + (int64_t)c * bl;
        if (p->cls_reduce == 1) {
            if (store_share(S, b, c, b->acc2, bl, bl, l0, err))
                return err->code;
            continue;
        }
        float *E = b->sum;
        memset(E, 0, sizeof(float) * bm * sw);
        for (int g2 = 0; g2 < p->cls_reduce; g2++) {
            const sblock *peer = block_at(S, b->im, g2 * p->cls_shuffle + b->s, b->ik);
            if (peer != b)
                S->tr.dsm += (int64_t)bm * sw * 4;
            for (int r = 0; r < bm; r++)
                for (int cc = 0; cc < sw; cc++)
                    E[r * sw + cc] += peer->xbuf[r * bl + b->g * sw + cc];
        }
        if (store_share(S, b, c, E, sw, sw, l0 + (int64_t)b->g * sw, err))
            return err->code;
    }
    if (p->cls_reduce > 1 && p->order == FUSER_ORDER_L_OUTER && c < p->lc - 1)
        barrier(S); /* peers done reading my exchange buffer before the next chunk rewrites it */
    return FUSER_OK;
}

/* GEMM1 of chunk j for every block, through the exchange into H. */
static void h_chunk(sim *S, int j)
{
    const fuser_plan *p = S->p;
    for (int i = 0; i < S->csize; i++)
        gemm1(S, &S->b[i], j);
    if (p->cls_k > 1) {
        for (int i = 0; i < S->csize; i++)
            publish_partials(S, &S->b[i]);
        barrier(S);
    }
    for (int i = 0; i < S->csize; i++)
        exchange_epilogue(S, &S->b[i], j);
}

static int run_cluster(sim *S, fuser_err *err)
{
    const fuser_plan *p = S->p;
    if (p->cluster_size > 1)
        barrier(S); /* entry: every peer has started and set up its shared memory */
    if (p->order == FUSER_ORDER_N_OUTER) {
        for (int i = 0; i < S->csize; i++)
            memset(S->b[i].acc2, 0, sizeof(float) * p->bm * p->bl);
        for (int j = 0; j < p->n_iters; j++) {
            h_chunk(S, j);
            if (p->cls_k > 1 || p->cls_shuffle > 1)
                barrier(S); /* H published; exchange buffers free */
            for (int i = 0; i < S->csize; i++) {
                sblock *b = &S->b[i];
                shuffle(S, b, j);
                for (int t = 0; t < p->cls_shuffle; t++)
                    gemm2_slot(S, b, 0, (b->s + t) % p->cls_shuffle, j);
            }
            if (p->cls_shuffle > 1 && j < p->n_iters - 1)
                barrier(S); /* peers done copying my H slot before I overwrite it */
        }
        if (reduce_store(S, 0, err))
            return err->code;
    } else {
        for (int j = 0; j < p->n_iters; j++) {
            h_chunk(S, j);
            if (p->cls_k > 1)
                barrier(S); /* H published; exchange buffers free */
        }
        if (p->cls_shuffle > 1) {
            if (p->cls_k == 1)
                barrier(S); /* every H slot published */
            for (int i = 0; i < S->csize; i++)
                shuffle(S, &S->b[i], -1);
        }
        for (int c = 0; c < p->lc; c++) {
            for (int i = 0; i < S->csize; i++) {
                sblock *b = &S->b[i];
                memset(b->acc2, 0, sizeof(float) * p->bm * p->bl);
                for (int t = 0; t < p->cls_shuffle; t++)
                    for (int j = 0; j < p->n_iters; j++)
                        gemm2_slot(S, b, c, (b->s + t) % p->cls_shuffle, j);
            }
            if (reduce_store(S, c, err))
                return err->code;
        }
    }
    if (p->cluster_size > 1)
        barrier(S); /* exit: no block leaves while peers may read its shared memory */
    return FUSER_OK;
}

/* ---- the unfused path: fuser's eager route (PyTorch's ops, a plain chain's activation in the up GEMM's epilogue
 * where fuser_eager_epilogue says so), each kernel reading and writing HBM ---- */

/* out[m, n] = round(act(sum_k a[m, k] * w[n, k] + bias[n])): one library GEMM with its bias epilogue, and the
 * activation in it when `epi` (fuser_eager_epilogue: one rounding). */
static void ref_gemm(fuser_dtype dt, const uint16_t *a, const uint16_t *w, const uint16_t *bias, int64_t m,
                     int64_t k, int64_t n, int epi, fuser_act act, uint16_t *out)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float acc = 0;
            for (int64_t kk = 0; kk < k; kk++)
                acc += fuser_half_to_float(a[i * k + kk], dt) * fuser_half_to_float(w[j * k + kk], dt);
            if (bias)
                acc += fuser_half_to_float(bias[j], dt);
            out[i * n + j] = fuser_float_to_half(epi ? fuser_act_f32(act, acc) : acc, dt);
        }
}

static int interpret_unfused(const fuser_plan *p, const fuser_ffn_data *d, fuser_interp_result *res,
                             fuser_err *err)
{
    const fuser_chain *c = &p->chain;
    const fuser_dtype dt = c->dtype;
    const int64_t M = c->m, K = c->k, N = c->n, L = c->l, MN = M * N;
    uint16_t *g = malloc(sizeof(uint16_t) * (size_t)(MN ? MN : 1) * 2);
    if (!g)
        return fuser_fail(err, FUSER_E_NOMEM, "interpreter: out of memory for %lld intermediate elements",
                          (long long)MN * 2);
    uint16_t *u = g + MN;
    int64_t bytes = 0;
    const int epi = fuser_eager_epilogue(c);
    ref_gemm(dt, d->x, d->w_up, d->b_up, M, K, N, epi, c->act, u);
    bytes += 2 * (M * K + N * K + (c->bias_up ? N : 0) + MN);
    if (c->gated) {
        ref_gemm(dt, d->x, d->w_gate, d->b_gate, M, K, N, 0, c->act, g);
        bytes += 2 * (M * K + N * K + (c->bias_gate ? N : 0) + MN);
        for (int64_t i = 0; i < MN; i++) /* act(g): read g, write a */
            g[i] = fuser_float_to_half(fuser_act_f32(c->act, fuser_half_to_float(g[i], dt)), dt);
        for (int64_t i = 0; i < MN; i++) /* a * u: read both, write h */
            u[i] = fuser_float_to_half(fuser_half_to_float(g[i], dt) * fuser_half_to_float(u[i], dt), dt);
        bytes += 2 * (2 * MN) + 2 * (3 * MN);
    } else if (!epi) {
        for (int64_t i = 0; i < MN; i++)
            u[i] = fuser_float_to_half(fuser_act_f32(c->act, fuser_half_to_float(u[i], dt)), dt);
        bytes += 2 * (2 * MN);
    }
    ref_gemm(dt, u, d->w_down, d->b_down, M, N, L, 0, c->act, d->y);
    bytes += 2 * (MN + L * N + (c->bias_down ? L : 0) + M * L);
    free(g);
    res->traffic.hbm = res->traffic.l2 = bytes;
    res->traffic.dsm = res->traffic.smem = 0;
    res->barriers = 0;
    res->flops = 2.0 * M * N * (K * (c->gated ? 2 : 1) + L);
    return FUSER_OK;
}

/* ---- entry point ---- */

static void sim_free(sim *S)
{
    if (S->b)
        for (int i = 0; i < S->csize; i++) {
            sblock *b = &S->b[i];
            free(b->acc1), free(b->acc2), free(b->xbuf), free(b->hg), free(b->sx), free(b->sw), free(b->sd),
                free(b->sum);
        }
    free(S->b);
    for (int i = 0; i < 7; i++)
        free(S->touched[i]);
    free(S->written);
    free(S->ws);
    free(S->tickets);
}

int fuser_interpret(const fuser_plan *p, const fuser_ffn_data *d, fuser_interp_result *res, fuser_err *err)
{
    memset(res, 0, sizeof *res);
    const fuser_chain *c = &p->chain;
    if (c->dtype == FUSER_F32)
        return fuser_fail(err, FUSER_E_VALUE, "the interpreter runs 16-bit chains (bfloat16 or float16)");
    if (!d->x || !d->w_up || !d->w_down || !d->y || (c->gated && !d->w_gate) || (c->bias_up && !d->b_up) ||
        (c->bias_gate && !d->b_gate) || (c->bias_down && !d->b_down))
        return fuser_fail(err, FUSER_E_VALUE, "interpreter: a tensor the chain needs is missing");
    if (c->m == 0)
        return FUSER_OK;
    if (!p->fused)
        return interpret_unfused(p, d, res, err);
    if (p->cluster_size < 1 || p->blocks < 1)
        return fuser_fail(err, FUSER_E_VALUE, "interpreter: the plan is not derived (call fuser_plan_derive)");
    if (p->kind == FUSER_KIND_STREAM)
        return fuser_stream_interpret(p, d, res, err);

    sim S;
    memset(&S, 0, sizeof S);
    S.p = p;
    S.d = d;
    S.dt = c->dtype;
    S.csize = p->cluster_size;
    const int64_t sizes[7] = {c->m * c->k, c->n * c->k, c->gated ? c->n * c->k : 0, c->l * c->n,
                              c->bias_up ? c->n : 0, c->bias_gate ? c->n : 0, c->bias_down ? c->l : 0};
    int ok = 1;
    for (int i = 0; i < 7; i++) {
        S.sizes[i] = sizes[i];
        S.touched[i] = calloc((size_t)sizes[i] + 1, 1);
        ok &= S.touched[i] != NULL;
    }
    S.written = calloc((size_t)(c->m * c->l), 1);
    S.b = calloc((size_t)S.csize, sizeof(sblock));
    const size_t tile = (size_t)p->bm * p->bn, otile = (size_t)p->bm * p->bl;
    const size_t xb = p->smem_xbuf / 4 + 1, slots = (size_t)p->cls_shuffle * (p->order == FUSER_ORDER_L_OUTER ? p->n_iters : 1);
    const size_t sum = 2 * tile > otile ? 2 * tile : otile;
    ok &= S.written && S.b;
    for (int i = 0; ok && i < S.csize; i++) {
        sblock *b = &S.b[i];
        b->ik = i / (p->cls_n * p->cls_m);
        b->in = i / p->cls_m % p->cls_n;
        b->im = i % p->cls_m;
        b->g = b->in / p->cls_shuffle;
        b->s = b->in % p->cls_shuffle;
        b->lpart = b->s * p->cls_k + b->ik;
        b->acc1 = malloc(sizeof(float) * tile * p->parts);
        b->acc2 = malloc(sizeof(float) * otile);
        b->xbuf = malloc(sizeof(float) * xb);
        b->hg = malloc(2 * tile * slots);
        b->sx = malloc(sizeof(float) * p->bm * FUSER_BK);
        b->sw = malloc(sizeof(float) * p->bn * FUSER_BK * p->parts);
        b->sd = malloc(sizeof(float) * p->bl * FUSER_BK2);
        b->sum = malloc(sizeof(float) * sum);
        ok &= b->acc1 && b->acc2 && b->xbuf && b->hg && b->sx && b->sw && b->sd && b->sum;
    }
    if (ok && p->grid_n > 1) {
        S.ws = calloc((size_t)(p->grid_n * p->m_pad * p->l_pad), sizeof(float));
        S.tickets = calloc((size_t)p->tickets, sizeof(int32_t));
        ok &= S.ws && S.tickets;
    }
    int rc = FUSER_OK;
    if (!ok)
        rc = fuser_fail(err, FUSER_E_NOMEM, "interpreter: out of memory for this plan's buffers");
    int first_barriers = -1;
    for (int64_t cn = 0; rc == FUSER_OK && cn < p->grid_n; cn++)
        for (int64_t cm = 0; rc == FUSER_OK && cm < p->grid_m; cm++) {
            S.cm = cm, S.cn = cn;
            S.barriers = 0;
            rc = run_cluster(&S, err);
            if (first_barriers < 0)
                first_barriers = S.barriers;
            else if (rc == FUSER_OK && S.barriers != first_barriers)
                rc = fuser_fail(err, FUSER_E_INTERNAL, "clusters passed different numbers of barriers");
        }
    if (rc == FUSER_OK) {
        int64_t hbm = S.ws_bytes;
        for (int i = 0; i < 7; i++)
            for (int64_t e = 0; e < S.sizes[i]; e++)
                hbm += 2 * S.touched[i][e];
        for (int64_t e = 0; e < c->m * c->l; e++) {
            if (S.written[e] != 1) {
                rc = fuser_fail(err, FUSER_E_INTERNAL, "plan leaves output element (%lld, %lld) unwritten",
                                (long long)(e / c->l), (long long)(e % c->l));
                break;
            }
            hbm += 2;
        }
        S.tr.hbm = hbm;
        res->traffic = S.tr;
        res->barriers = first_barriers < 0 ? 0 : first_barriers;
        res->flops = S.flops;
    }
    sim_free(&S);
    return rc;
}
