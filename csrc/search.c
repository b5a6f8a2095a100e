/* search.c: enumerate the plan space level by level, prune with the rule table (counting what each
 * rule removed), score survivors with the cost model, keep the k best. Deterministic: ties keep
 * enumeration order. The unfused path is one more candidate. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "fuser/search.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fuser/cost.h"

static const int cls_set[] = {1, 2, 4, 8, 16};
static const int bm_set[] = {16, 32, 64, 128};
static const int bn_set[] = {32, 64, 128, 256};
static const int bl_set[] = {64, 128, 256}; /* l_outer; n_outer uses the one bl that fits its part */
static const int stage_set[] = {2, 3, 4};
/* d_ff clusters to aim for; n_iters follows from each (duplicates dropped) */
static const int grid_n_targets[] = {1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64,
                                     80, 96, 112, 128, 160, 192, 224, 256};
/* the stream family: token rows of a row tile, tiles, K splits of either phase; stages: the most that fit */
static const int stream_bm_set[] = {16, 32, 64, 128};
/* bl 96 (fuser_stream_narrow_bl) is searched up to narrow_bl_max_tokens, and above only where the caller asks for
 * it (bl=96): timed, its picks at 48-256 tokens ran 1.035x the old ones (geomean of 28 cells), while the two prefill
 * cells it changed (G10 at 1024-2048 tokens) lost to eager (docs/planner.md, "96-wide l-tiles") */
static const int64_t narrow_bl_max_tokens = 256;
static const int stream_tile_set[] = {64, 96, 128, 192, 256};
static const int stream_bn_set[] = {48, 64, 96, 112, 128, 192, 256}; /* 48: bm 128 only (plan.c) */
const int fuser_stream_splits[] = {1, 2, 3, 4, 6, 8, 12, 16};
const int fuser_num_stream_splits = (int)(sizeof fuser_stream_splits / sizeof fuser_stream_splits[0]);
#define stream_split_set fuser_stream_splits
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define N_ORDER_BL (1 + COUNT(bl_set))     /* n_outer: 1 bl, l_outer: bl_set */
#define MAX_NITERS COUNT(grid_n_targets)

void fuser_constraints_init(fuser_constraints *c)
{
    memset(c, 0, sizeof *c);
    c->order = c->gate_mode = c->fused = c->kind = -1;
}

/* ---- the k best, sorted ascending by predicted time (stable) ----
 * Fused plans rank by their predicted time x (1 + their family's margin: fusion_margin for the cluster
 * kernel, stream_margin for the stream kernel): fusion must be predicted clearly faster than the unfused
 * path, by more than its family's model error, to be chosen. */
typedef struct {
    fuser_plan *v;
    int n, k;
    double margin[2]; /* by fuser_kind */
} topk;

static double rank_key(const topk *h, const fuser_plan *p)
{
    return p->fused ? p->cost.total * (1 + h->margin[p->kind]) : p->cost.total;
}

/* Row tiles of a stream plan (0 for other plans): the tie-break below. */
static int64_t row_tiles(const fuser_plan *p)
{
    return p->fused && p->kind == FUSER_KIND_STREAM ? fuser_ceil_div(p->chain.m, p->bm) : 0;
}

/* Whether `p` (of rank key `key`) ranks before `q`. Keys equal to rounding (a schedule-bound stream time that
 * two tilings share) go to the stream plan of fewer row tiles, which reads each weight once: timed on the
 * H100, G6 and GPT-2 medium at 48 tokens ran 13% faster at bm 64 than at bm 32 with the same prediction
 * (docs/planner.md "The stream's HBM rate on other parts"); otherwise enumeration order stands. */
static int ranks_before(const topk *h, double key, const fuser_plan *p, const fuser_plan *q)
{
    const double kq = rank_key(h, q);
    if (fabs(key - kq) <= 1e-9 * fabs(kq))
        return row_tiles(p) < row_tiles(q);
    return key < kq;
}

static void topk_push(topk *h, const fuser_plan *p)
{
    const double key = rank_key(h, p);
    if (h->n == h->k && !ranks_before(h, key, p, &h->v[h->n - 1]))
        return;
    int i = h->n < h->k ? h->n++ : h->n - 1;
    while (i > 0 && ranks_before(h, key, p, &h->v[i - 1])) {
        h->v[i] = h->v[i - 1];
        i--;
    }
    h->v[i] = *p;
}

/* n_iters values for a (cls_n, bn): one per targeted number of d_ff clusters, ascending, unique. */
static int niters_set(int64_t n, int cls_n, int bn, int *out)
{
    int cnt = 0;
    for (int i = 0; i < MAX_NITERS; i++) {
        int64_t v = (n + (int64_t)grid_n_targets[i] * cls_n * bn - 1) / ((int64_t)grid_n_targets[i] * cls_n * bn);
        if (v < 1)
            v = 1;
        if (cnt && out[cnt - 1] == v)
            continue;
        if (cnt && out[cnt - 1] < v) /* grid targets beyond what d_ff allows give the same n_iters */
            continue;
        out[cnt++] = (int)v;
    }
    return cnt;
}

static int64_t leaves_bn(const fuser_chain *c, int cls_n, int bn)
{
    int tmp[MAX_NITERS];
    return (int64_t)niters_set(c->n, cls_n, bn, tmp) * N_ORDER_BL * COUNT(stage_set);
}

static int64_t leaves_bm(const fuser_chain *c, int cls_n)
{
    int64_t s = 0;
    for (int i = 0; i < COUNT(bn_set); i++)
        s += leaves_bn(c, cls_n, bn_set[i]);
    return s;
}

static int64_t leaves_shape(const fuser_chain *c, int cls_n) { return COUNT(bm_set) * leaves_bm(c, cls_n); }

static int n_gate_modes(const fuser_chain *c) { return c->gated ? 2 : 1; }

static int64_t leaves_all(const fuser_chain *c)
{
    int64_t s = 0;
    for (int n = 0; n < COUNT(cls_set); n++)
        s += leaves_shape(c, cls_set[n]) * COUNT(cls_set) * COUNT(cls_set) * COUNT(cls_set);
    return s * n_gate_modes(c);
}

/* The rules of each level, in table order (built once per search): a check runs only its level's rules. */
typedef struct {
    int n[FUSER_NUM_LEVELS];
    int at[FUSER_NUM_LEVELS][FUSER_MAX_RULES];
} level_rules;

static void level_rules_init(level_rules *lr)
{
    memset(lr->n, 0, sizeof lr->n);
    for (int r = 0; r < fuser_num_rules; r++)
        lr->at[fuser_rules[r].level][lr->n[fuser_rules[r].level]++] = r;
}

/* Run the rules of one level; on rejection charge `leaves` to the rule and return 1. */
static int pruned(const level_rules *lr, const fuser_plan *p, const fuser_target *t, fuser_level lvl, int64_t leaves,
                  fuser_search_stats *st)
{
    for (int i = 0; i < lr->n[lvl]; i++) {
        const int r = lr->at[lvl][i];
        if (fuser_rules[r].reject(p, t)) {
            st->pruned[r] += leaves;
            return 1;
        }
    }
    return 0;
}

static int free_or(int want, int have) { return want <= 0 || want == have; }

/* A stream plan's phases: H through a buffer in L2 (2), or each unit computing its own (1), one l-tile per
 * unit, or (-1) every l-tile per unit: a unit per d_ff slice and row tile, whose split index b of
 * stream_split_set gives the slice's K steps (s2 = the d_ff steps over it) instead of the split count.
 * Units of several l-tiles are offered only when the caller asks (lspan): measured on the H200 they lose
 * to the two-phase plans at every decode shape timed (docs/kernels.md, step 24), which the cost model
 * does not yet see at 16 tokens and more. */
static const int stream_phase_set[] = {2, 1, -1};

static int64_t stream_leaves(const fuser_chain *c)
{
    (void)c;
    return (int64_t)COUNT(stream_phase_set) * COUNT(stream_bm_set) * COUNT(stream_bn_set) * COUNT(stream_tile_set) *
           COUNT(stream_split_set) * COUNT(stream_split_set);
}

/* Why stream candidates could not be derived, by kind of reason (a message up to its first number, so
 * the same rule's messages for different tiles count together): how many candidates each refused and
 * its first message (collected only to explain a search that found nothing). */
enum { REFUSAL_KINDS = 8 };
typedef struct {
    int n;
    int64_t count[REFUSAL_KINDS];
    char msg[REFUSAL_KINDS][FUSER_ERRMSG_MAX];
} refusals;

static size_t reason_len(const char *msg) { return strcspn(msg, "0123456789"); }

static void refusal_add(refusals *r, const char *msg)
{
    const size_t k = reason_len(msg);
    for (int i = 0; i < r->n; i++)
        if (reason_len(r->msg[i]) == k && !strncmp(r->msg[i], msg, k)) {
            r->count[i]++;
            return;
        }
    if (r->n < REFUSAL_KINDS) {
        snprintf(r->msg[r->n], sizeof r->msg[0], "%s", msg);
        r->count[r->n++] = 1;
    }
}

/* The stream family's candidates: every (phases, bm, bn, bl, s1, s2), each with the deepest pipeline that
 * fits. With `why`, each candidate that cannot be derived also adds its reason there. */
static void search_stream(const fuser_chain *c, const fuser_target *t, const level_rules *lr,
                          const fuser_constraints *cons, topk *best, fuser_search_stats *st, refusals *why)
{
    const int64_t leaves = stream_leaves(c);
    if (!leaves)
        return;
    fuser_plan p;
    fuser_plan_unfused(c, &p);
    p.fused = 1;
    p.kind = FUSER_KIND_STREAM;
    /* the cluster: single blocks, or the pair the caller asks for ((2, 1, 1, 1) or (1, 2, 1, 2)); the cost
     * model does not yet rank pairs against single blocks, so the search offers them only on request */
    p.cls_m = cons->cls_m == 2 ? 2 : 1;
    p.cls_n = p.cls_l = cons->cls_n == 2 ? 2 : 1;
    p.cls_k = 1;
    p.phases = 2;
    p.n_iters = 1;
    p.order = FUSER_ORDER_N_OUTER;
    p.gate_mode = c->gated ? FUSER_GATE_SEQUENTIAL : FUSER_GATE_NONE;
    if ((cons->kind >= 0 && cons->kind != FUSER_KIND_STREAM) || cons->dataflows_all || !free_or(cons->cls_m, p.cls_m) ||
        !free_or(cons->cls_n, p.cls_n) || !free_or(cons->cls_k, 1) || !free_or(cons->cls_l, p.cls_l) ||
        p.cls_m * p.cls_n > 2 ||
        !free_or(cons->n_iters, 1) || !(cons->order < 0 || cons->order == FUSER_ORDER_N_OUTER) ||
        !(cons->gate_mode < 0 || cons->gate_mode == (int)p.gate_mode)) {
        st->constrained += leaves;
        return;
    }
    if (pruned(lr, &p, t, FUSER_LEVEL_CHAIN, leaves, st))
        return;
    for (int ip = 0; ip < COUNT(stream_phase_set); ip++)
    for (int ib = 0; ib < COUNT(stream_bm_set); ib++)
    for (int jn = 0; jn < COUNT(stream_bn_set); jn++)
    for (int jl = 0; jl < COUNT(stream_tile_set); jl++)
    for (int a = 0; a < COUNT(stream_split_set); a++)
    for (int b = 0; b < COUNT(stream_split_set); b++) {
        const int whole = stream_phase_set[ip] < 0;
        p.phases = whole ? 1 : stream_phase_set[ip];
        p.bm = stream_bm_set[ib], p.bn = stream_bn_set[jn], p.bl = stream_tile_set[jl];
        p.s1 = stream_split_set[a];
        p.s2 = whole ? (int)fuser_ceil_div(fuser_ceil_div(c->n, fuser_kstep_cols(c->dtype)), stream_split_set[b]) : stream_split_set[b];
        p.lspan = whole ? (int)fuser_ceil_div(c->l, p.bl) : 1;
        /* units of several l-tiles: the caller's split count and span, where given, as they are */
        if (whole && cons->s2 > 0)
            p.s2 = b == 0 ? cons->s2 : 0;
        if (whole && cons->lspan > 1)
            p.lspan = cons->lspan;
        if (!p.s2 || !free_or(cons->phases, p.phases) || !free_or(cons->bm, p.bm) || !free_or(cons->bn, p.bn) ||
            !free_or(cons->bl, p.bl) || !free_or(cons->s1, p.s1) || !free_or(cons->s2, p.s2) ||
            !free_or(cons->lspan, p.lspan) || (whole && (p.lspan == 1 || cons->lspan <= 1)) ||
            (fuser_stream_narrow_bl(p.bl) && c->m > narrow_bl_max_tokens && cons->bl != p.bl) ||
            (!fuser_stream_bn_fits_bm(p.bn, p.bm) && cons->bn != p.bn)) { /* asked for, plan.c says why */
            st->constrained++;
            continue;
        }
        /* the deepest ring that fits (or the constrained depth); otherwise the shallowest (derived where it
         * can be), for the rules to refuse */
        fuser_plan q = p;
        q.stages = cons->stages > 0 ? cons->stages : 2;
        fuser_err e;
        fuser_err_clear(&e);
        if (fuser_plan_derive(&q, why ? &e : NULL) != FUSER_OK) {
            if (why)
                refusal_add(why, e.msg);
        } else if (cons->stages <= 0) {
            const int deepest = fuser_stream_deepest_ring(&q, t->smem_per_block);
            if (deepest > q.stages) {
                q = p;
                q.stages = deepest;
                (void)fuser_plan_derive(&q, NULL); /* derived above at another depth: cannot fail */
            }
        }
        if (pruned(lr, &q, t, FUSER_LEVEL_FULL, 1, st))
            continue;
        if (cons->s1 <= 0 && cons->s2 <= 0 && pruned(lr, &q, t, FUSER_LEVEL_CHOICE, 1, st))
            continue;
        if ((q.dataflows & cons->dataflows_none) != 0) {
            st->constrained++;
            continue;
        }
        fuser_plan_cost(&q, t);
        st->scored++;
        topk_push(best, &q);
    }
}

int fuser_search(const fuser_chain *c, const fuser_target *t, const fuser_constraints *cons_in, int k,
                 fuser_plan *out, int *n_out, fuser_search_stats *st, fuser_err *err)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    memset(st, 0, sizeof *st);
    *n_out = 0;
    fuser_constraints cons;
    if (cons_in)
        cons = *cons_in;
    else
        fuser_constraints_init(&cons);
    if (fuser_chain_check(c, err))
        return err->code;
    if (c->m < 1)
        return fuser_fail(err, FUSER_E_VALUE, "m (tokens) must be >= 1 to plan, got %lld", (long long)c->m);
    if (fuser_target_check(t, err))
        return err->code;
    if (k < 1 || k > 64)
        return fuser_fail(err, FUSER_E_VALUE, "k must be in [1, 64], got %d", k);
    topk best = {out, 0, k, {t->fusion_margin, t->stream_margin}};
    level_rules rules;
    level_rules_init(&rules);

    /* the unfused path */
    st->candidates = 1;
    fuser_plan p;
    fuser_plan_unfused(c, &p);
    if (cons.fused != 1 && !cons.dataflows_all) {
        fuser_plan_cost(&p, t);
        topk_push(&best, &p);
        st->scored++;
    } else {
        st->constrained++;
    }

    /* the fused space: the stream family, then the cluster family */
    st->candidates += leaves_all(c) + stream_leaves(c);
    if (cons.fused == 0) {
        st->constrained += leaves_all(c) + stream_leaves(c);
        goto done;
    }
    search_stream(c, t, &rules, &cons, &best, st, NULL);
    fuser_plan_unfused(c, &p);
    p.fused = 1;
    if ((cons.kind >= 0 && cons.kind != FUSER_KIND_CLUSTER) || cons.s1 > 1 || cons.s2 > 1 || cons.phases > 0 ||
        cons.lspan > 0) {
        st->constrained += leaves_all(c);
        goto done;
    }
    if (pruned(&rules, &p, t, FUSER_LEVEL_CHAIN, leaves_all(c), st))
        goto done;
    const int modes[2] = {c->gated ? FUSER_GATE_SPATIAL : FUSER_GATE_NONE, FUSER_GATE_SEQUENTIAL};
    int64_t bm_leaves[COUNT(cls_set)]; /* the leaves under one bm, by cls_n */
    for (int in = 0; in < COUNT(cls_set); in++)
        bm_leaves[in] = leaves_bm(c, cls_set[in]);
    for (int gi = 0; gi < n_gate_modes(c); gi++)
    for (int im = 0; im < COUNT(cls_set); im++)
    for (int in = 0; in < COUNT(cls_set); in++)
    for (int ik = 0; ik < COUNT(cls_set); ik++)
    for (int il = 0; il < COUNT(cls_set); il++) {
        p.gate_mode = (fuser_gate_mode)modes[gi];
        p.cls_m = cls_set[im], p.cls_n = cls_set[in], p.cls_k = cls_set[ik], p.cls_l = cls_set[il];
        int64_t lv = COUNT(bm_set) * bm_leaves[in];
        if (pruned(&rules, &p, t, FUSER_LEVEL_SHAPE, lv, st))
            continue;
        if (!(cons.gate_mode < 0 || cons.gate_mode == (int)p.gate_mode) || !free_or(cons.cls_m, p.cls_m) ||
            !free_or(cons.cls_n, p.cls_n) || !free_or(cons.cls_k, p.cls_k) || !free_or(cons.cls_l, p.cls_l)) {
            st->constrained += lv;
            continue;
        }
        for (int ib = 0; ib < COUNT(bm_set); ib++) {
            p.bm = bm_set[ib];
            lv = bm_leaves[in];
            if (pruned(&rules, &p, t, FUSER_LEVEL_BM, lv, st))
                continue;
            if (!free_or(cons.bm, p.bm)) {
                st->constrained += lv;
                continue;
            }
            for (int jn = 0; jn < COUNT(bn_set); jn++) {
                p.bn = bn_set[jn];
                int nis[MAX_NITERS];
                int nni = niters_set(c->n, p.cls_n, p.bn, nis);
                lv = (int64_t)nni * N_ORDER_BL * COUNT(stage_set);
                if (pruned(&rules, &p, t, FUSER_LEVEL_BN, lv, st))
                    continue;
                if (!free_or(cons.bn, p.bn)) {
                    st->constrained += lv;
                    continue;
                }
                for (int ni = 0; ni < nni; ni++) {
                    p.n_iters = nis[ni];
                    lv = N_ORDER_BL * COUNT(stage_set);
                    if (pruned(&rules, &p, t, FUSER_LEVEL_NITERS, lv, st))
                        continue;
                    if (!free_or(cons.n_iters, p.n_iters)) {
                        st->constrained += lv;
                        continue;
                    }
                    for (int ob = 0; ob < N_ORDER_BL; ob++) {
                        p.order = ob == 0 ? FUSER_ORDER_N_OUTER : FUSER_ORDER_L_OUTER;
                        if (ob == 0) {
                            /* the narrowest legal bl holding the whole part */
                            int wm = p.bm / 16 < 4 ? p.bm / 16 : 4;
                            int reduce = p.cls_n * p.cls_k / p.cls_l;
                            int64_t part = (c->l + p.cls_l - 1) / p.cls_l;
                            int unit = 32;
                            while (unit % (8 * (8 / wm)) || unit % (8 * reduce))
                                unit += 32;
                            int64_t bl = (part + unit - 1) / unit * unit;
                            p.bl = (int)(bl < 4096 ? bl : 4096); /* wider than 256: rejected below */
                        } else {
                            p.bl = bl_set[ob - 1];
                        }
                        lv = COUNT(stage_set);
                        if (pruned(&rules, &p, t, FUSER_LEVEL_BL, lv, st))
                            continue;
                        if (!(cons.order < 0 || cons.order == (int)p.order) || !free_or(cons.bl, p.bl)) {
                            st->constrained += lv;
                            continue;
                        }
                        for (int is = 0; is < COUNT(stage_set); is++) {
                            p.stages = stage_set[is];
                            fuser_plan q = p;
                            fuser_err derr;
                            if (fuser_plan_derive(&q, &derr)) {
                                return fuser_fail(err, FUSER_E_INTERNAL,
                                                  "internal: a candidate passed the rules but is invalid: %s",
                                                  derr.msg);
                            }
                            if (pruned(&rules, &q, t, FUSER_LEVEL_FULL, 1, st))
                                continue;
                            if (!free_or(cons.stages, q.stages) ||
                                (q.dataflows & cons.dataflows_all) != cons.dataflows_all ||
                                (q.dataflows & cons.dataflows_none)) {
                                st->constrained++;
                                continue;
                            }
                            fuser_plan_cost(&q, t);
                            st->scored++;
                            topk_push(&best, &q);
                        }
                    }
                }
            }
        }
    }
done:
    clock_gettime(CLOCK_MONOTONIC, &t1);
    st->search_ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    *n_out = best.n;
    if (!best.n) {
        /* say which rules refused the candidates the constraints left (name: count, what it protects) */
        char why[512] = "";
        size_t len = 0;
        for (int i = 0; i < fuser_num_rules && len < sizeof why - 1; i++) {
            if (!st->pruned[i])
                continue;
            const int w = snprintf(why + len, sizeof why - len, "%s %s (%lld: %s)", len ? "," : "; refused by",
                                   fuser_rules[i].name, (long long)st->pruned[i], fuser_rules[i].why);
            len = w < 0 || len + (size_t)w >= sizeof why ? sizeof why - 1 : len + (size_t)w;
        }
        /* and the stream candidates' two most common kinds of reason, from a second pass that collects them */
        refusals *r = calloc(1, sizeof *r);
        char reasons[2 * FUSER_ERRMSG_MAX + 64] = "";
        if (r) {
            fuser_plan scratch[1];
            topk none = {scratch, 0, 1, {t->fusion_margin, t->stream_margin}};
            fuser_search_stats ignored;
            memset(&ignored, 0, sizeof ignored);
            search_stream(c, t, &rules, &cons, &none, &ignored, r);
            int top[2] = {-1, -1};
            for (int i = 0; i < r->n; i++)
                if (top[0] < 0 || r->count[i] > r->count[top[0]])
                    top[1] = top[0], top[0] = i;
                else if (top[1] < 0 || r->count[i] > r->count[top[1]])
                    top[1] = i;
            size_t at = 0;
            for (int j = 0; j < 2 && top[j] >= 0 && at < sizeof reasons; j++) {
                const int w = snprintf(reasons + at, sizeof reasons - at, "; %lld stream candidates: %s",
                                       (long long)r->count[top[j]], r->msg[top[j]]);
                at = w < 0 ? sizeof reasons : at + (size_t)w;
            }
        }
        const int rc = fuser_fail(err, FUSER_E_VALUE,
                                  "no plan satisfies the constraints for this chain (m=%lld, d_model=%lld, d_ff=%lld, "
                                  "d_out=%lld)%s%s", (long long)c->m, (long long)c->k, (long long)c->n,
                                  (long long)c->l, why, reasons);
        free(r);
        return rc;
    }
    return FUSER_OK;
}
