/* test_planner.c: the planner core without Python: 16-bit rounding, plan derivation errors, search
 * accounting and determinism, and the interpreter's own checks (bytes equal the cost model's; a
 * corrupted plan that leaves outputs unwritten is caught). */
#include <math.h>
#include <stdlib.h>

#include "ctest.h"
#include "fuser/cost.h"
#include "fuser/interp.h"
#include "fuser/search.h"

void test_half_rounding(void)
{
    /* bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1.0) */
    CHECK(fuser_float_to_half(1.00390625f, FUSER_BF16) == 0x3f80);
    CHECK(fuser_float_to_half(1.01171875f, FUSER_BF16) == 0x3f82); /* 1 + 3*2^-8: tie, to even 1 + 2^-6 */
    CHECK(fuser_half_to_float(0x3f80, FUSER_BF16) == 1.0f);
    CHECK(fuser_float_to_half(NAN, FUSER_BF16) == 0x7fc0);
    /* fp16: largest normal, overflow, subnormals and their ties */
    CHECK(fuser_float_to_half(65504.0f, FUSER_F16) == 0x7bff);
    CHECK(fuser_float_to_half(65519.0f, FUSER_F16) == 0x7bff);
    CHECK(fuser_float_to_half(65520.0f, FUSER_F16) == 0x7c00);
    CHECK(fuser_float_to_half(ldexpf(1, -24), FUSER_F16) == 0x0001);
    CHECK(fuser_float_to_half(ldexpf(1, -25), FUSER_F16) == 0x0000);        /* tie to even: 0 */
    CHECK(fuser_float_to_half(3 * ldexpf(1, -25), FUSER_F16) == 0x0002);    /* tie to even: 2 */
    CHECK(fuser_float_to_half(-1.0009765625f, FUSER_F16) == 0xbc01);
    CHECK(fuser_float_to_half(1.00048828125f, FUSER_F16) == 0x3c00);         /* 1 + 2^-11: tie to even */
    CHECK(fuser_half_to_float(0x0001, FUSER_F16) == ldexpf(1, -24));
    CHECK(fuser_half_to_float(0x7c00, FUSER_F16) == INFINITY);
    for (uint32_t h = 0; h < 0x7c00; h += 7) /* every finite fp16 survives a round trip */
        CHECK(fuser_float_to_half(fuser_half_to_float((uint16_t)h, FUSER_F16), FUSER_F16) == h);
}

static fuser_chain chain(int64_t m, int64_t k, int64_t n, int64_t l, int gated)
{
    fuser_chain c;
    memset(&c, 0, sizeof c);
    c.m = m, c.k = k, c.n = n, c.l = l, c.gated = gated, c.act = FUSER_ACT_SILU, c.dtype = FUSER_BF16;
    return c;
}

void test_plan_derive_errors(void)
{
    fuser_err err;
    fuser_plan p;
    fuser_plan_unfused(&(fuser_chain){0}, &p);
    p.chain = chain(64, 256, 512, 256, 0);
    p.fused = 1, p.cls_m = 1, p.cls_n = 4, p.cls_k = 2, p.cls_l = 2, p.bm = 32, p.bn = 64, p.bl = 64;
    p.n_iters = 2, p.stages = 2, p.order = FUSER_ORDER_L_OUTER, p.gate_mode = FUSER_GATE_NONE;
    CHECK(fuser_plan_derive(&p, &err) == FUSER_OK);
    CHECK(p.cls_shuffle == 1 && p.cls_reduce == 4 && p.dataflows == (FUSER_DF_ALL_EXCHANGE | FUSER_DF_REDUCE_SCATTER));
    fuser_plan q = p;
    q.cls_l = 16;
    CHECK(fuser_plan_derive(&q, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "cls_l must be a multiple of cls_k and divide cls_n * cls_k");
    q = p;
    q.cls_n = 16;
    CHECK(fuser_plan_derive(&q, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "at most 16");
    q = p;
    q.order = FUSER_ORDER_N_OUTER; /* 256 / 2 = 128 output columns per part need 2 chunks of 64 */
    CHECK(fuser_plan_derive(&q, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "must be one chunk");
    q = p;
    q.gate_mode = FUSER_GATE_SPATIAL;
    CHECK(fuser_plan_derive(&q, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "does not fit a plain chain");
    q = p;
    q.chain.dtype = FUSER_F32;
    CHECK(fuser_plan_derive(&q, &err) == FUSER_E_VALUE);
    const fuser_target *t = fuser_target_builtin("h200");
    q = p;
    q.stages = 8, q.bn = 256, q.bm = 128;
    CHECK(fuser_plan_derive(&q, &err) == FUSER_OK && fuser_plan_check_target(&q, t, &err) == FUSER_E_VALUE);
    /* the values a plan dict could smuggle in: each named, none read as "free" or wrapped */
    const struct { int *field; int value; const char *msg; } bad[] = {
        {&q.bn, -16, "bn = -16"}, {&q.bn, 0, "bn = 0"}, {&q.stages, 0, "stages = 0"},
        {&q.cls_m, 0, "cluster (0, 4, 2, 2)"}, {&q.s1, 4, "a cluster plan has no stream splits"},
        {&q.s2, -1, "a cluster plan has no stream splits"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        q = p;
        *bad[i].field = bad[i].value; /* a field of q, reset above */
        CHECK(fuser_plan_derive(&q, &err) == FUSER_E_VALUE);
        CHECK_ERR(&err, FUSER_E_VALUE, bad[i].msg);
    }
}

void test_search_accounting(void)
{
    const fuser_target *t = fuser_target_builtin("h200");
    fuser_chain c = chain(128, 1024, 2816, 1024, 1);
    fuser_plan a[8], b[8];
    int na, nb;
    fuser_search_stats sa, sb;
    fuser_err err;
    CHECK(fuser_search(&c, t, NULL, 8, a, &na, &sa, &err) == FUSER_OK && na == 8);
    CHECK(fuser_search(&c, t, NULL, 8, b, &nb, &sb, &err) == FUSER_OK && nb == 8);
    int64_t sum = sa.scored + sa.constrained;
    for (int r = 0; r < fuser_num_rules; r++)
        sum += sa.pruned[r];
    CHECK(sum == sa.candidates);
    /* ranked by predicted time x (1 + the margin of the plan's family); the unfused plan by its time */
    double key[8];
    for (int i = 0; i < 8; i++)
        key[i] = a[i].cost.total *
                 (a[i].fused ? 1 + (a[i].kind == FUSER_KIND_STREAM ? t->stream_margin : t->fusion_margin) : 1);
    for (int i = 0; i < 8; i++) {
        CHECK(a[i].cost.total == b[i].cost.total && a[i].cls_n == b[i].cls_n && a[i].bm == b[i].bm);
        CHECK(i == 0 || key[i - 1] <= key[i]);
        CHECK(fuser_plan_check_target(&a[i], t, &err) == FUSER_OK);
    }
    c.m = 0;
    CHECK(fuser_search(&c, t, NULL, 8, a, &na, &sa, &err) == FUSER_E_VALUE);
    c.m = 16;
    fuser_target small = *t;
    small.max_cluster = 8;
    CHECK(fuser_search(&c, &small, NULL, 8, a, &na, &sa, &err) == FUSER_OK);
    for (int i = 0; i < na; i++)
        CHECK(!a[i].fused || a[i].cluster_size <= 8);
    small.sm_count = 0;
    CHECK(fuser_search(&c, &small, NULL, 8, a, &na, &sa, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "sm_count must be positive");
}

static uint16_t *rnd_tensor(int64_t n, unsigned *seed, float scale)
{
    uint16_t *v = malloc(sizeof(uint16_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        v[i] = fuser_float_to_half(((float)(*seed >> 9) / 8388608.0f - 0.5f) * scale, FUSER_BF16);
    }
    return v;
}

void test_interpreter_checks(void)
{
    const fuser_target *t = fuser_target_builtin("h200");
    fuser_chain c = chain(21, 136, 200, 72, 1);
    unsigned s = 5;
    uint16_t *x = rnd_tensor(c.m * c.k, &s, 2), *wu = rnd_tensor(c.n * c.k, &s, 0.2f),
             *wg = rnd_tensor(c.n * c.k, &s, 0.2f), *wd = rnd_tensor(c.l * c.n, &s, 0.2f),
             *y = malloc(sizeof(uint16_t) * (size_t)(c.m * c.l));
    fuser_ffn_data d = {x, wu, wg, wd, NULL, NULL, NULL, y};
    fuser_plan ps[16];
    int n;
    fuser_search_stats st;
    fuser_err err;
    fuser_constraints cons;
    fuser_constraints_init(&cons);
    cons.fused = 1;
    cons.dataflows_all = FUSER_DF_SHUFFLE | FUSER_DF_INTER_CLUSTER;
    CHECK(fuser_search(&c, t, &cons, 16, ps, &n, &st, &err) == FUSER_OK && n > 0);
    for (int i = 0; i < n; i++) {
        fuser_interp_result r;
        CHECK(fuser_interpret(&ps[i], &d, &r, &err) == FUSER_OK);
        CHECK(r.traffic.hbm == ps[i].traffic.hbm && r.traffic.l2 == ps[i].traffic.l2);
        CHECK(r.traffic.dsm == ps[i].traffic.dsm && r.traffic.smem == ps[i].traffic.smem);
        CHECK(r.barriers == ps[i].barriers);
    }
    /* corrupt a derived field: output parts no longer tile d_out, so outputs overlap or go unwritten */
    fuser_plan bad = ps[0];
    bad.lp = bad.bl / 2 > 8 ? bad.bl / 2 : 8;
    bad.lc = 1;
    fuser_interp_result r;
    CHECK(fuser_interpret(&bad, &d, &r, &err) == FUSER_E_INTERNAL);
    CHECK_ERR(&err, FUSER_E_INTERNAL, "output"); /* written twice or left unwritten */
    d.w_gate = NULL; /* a gated chain without its gate weights */
    CHECK(fuser_interpret(&ps[0], &d, &r, &err) == FUSER_E_VALUE);
    free(x), free(wu), free(wg), free(wd), free(y);
}
