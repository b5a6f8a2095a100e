/* chain.c: the chain IR's activation table, chain checks, and validation of fuser.ffn's arguments
 * (see include/fuser/chain.h). */
#include "fuser/chain.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- activations: one table ---- */
static const char *const act_names[FUSER_NUM_ACTS] = {
    [FUSER_ACT_RELU] = "relu",
    [FUSER_ACT_GELU] = "gelu",
    [FUSER_ACT_GELU_TANH] = "gelu_tanh",
    [FUSER_ACT_SILU] = "silu",
};

const char *fuser_act_name(fuser_act a)
{
    return (unsigned)a < FUSER_NUM_ACTS ? act_names[a] : NULL;
}

int fuser_act_from_name(const char *name)
{
    for (int i = 0; name && i < FUSER_NUM_ACTS; i++)
        if (!strcmp(name, act_names[i]))
            return i;
    return -1;
}

const char *fuser_act_choices(void)
{
    return "relu, gelu, gelu_tanh, silu";
}

double fuser_act_eval(fuser_act a, double x)
{
    switch (a) {
    case FUSER_ACT_RELU: return x > 0 ? x : 0;
    case FUSER_ACT_GELU: return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440));
    case FUSER_ACT_GELU_TANH:
        return 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
    case FUSER_ACT_SILU: return x / (1.0 + exp(-x));
    default: return NAN;
    }
}

fuser_dtype fuser_chain_out_dtype(const fuser_chain *c)
{
    return c->dtype == FUSER_E4M3 ? FUSER_BF16 : c->dtype;
}

int fuser_kstep_cols(fuser_dtype dt)
{
    return 128 / fuser_dtype_size(dt);
}

const char *fuser_scale_name(int i)
{
    static const char *const names[FUSER_NUM_SCALES] = {"x_scale", "up_scale", "gate_scale", "down_scale",
                                                        "h_scale"};
    return (unsigned)i < FUSER_NUM_SCALES ? names[i] : "?";
}

int fuser_chain_check(const fuser_chain *c, fuser_err *err)
{
    static const char *const dims[] = {"m (tokens)", "k (d_model)", "n (d_ff)", "l (d_out)"};
    const int64_t v[] = {c->m, c->k, c->n, c->l};
    for (int i = 0; i < 4; i++) {
        if (v[i] < (i == 0 ? 0 : 1))
            return fuser_fail(err, FUSER_E_VALUE, "%s must be %s, got %lld", dims[i],
                              i == 0 ? ">= 0" : ">= 1", (long long)v[i]);
        if (v[i] > ((int64_t)1 << 31) - 1)
            return fuser_fail(err, FUSER_E_VALUE, "%s = %lld is too large (at most 2^31 - 1)", dims[i],
                              (long long)v[i]);
    }
    if ((unsigned)c->act >= FUSER_NUM_ACTS)
        return fuser_fail(err, FUSER_E_VALUE, "unknown activation %d; expected one of %s", (int)c->act,
                          fuser_act_choices());
    if ((unsigned)c->dtype >= FUSER_NUM_DTYPES)
        return fuser_fail(err, FUSER_E_VALUE, "unknown dtype %d; expected bfloat16, float16, float32 or "
                          "float8_e4m3fn", (int)c->dtype);
    if (c->bias_gate && !c->gated)
        return fuser_fail(err, FUSER_E_VALUE, "a gate bias needs a gated chain");
    if (c->packed && (!c->gated || c->dtype == FUSER_E4M3 || c->dtype == FUSER_F32))
        return fuser_fail(err, FUSER_E_VALUE, "packed: only a gated 16-bit chain's gate and up weights run as one "
                          "packed GEMM (gated=True, dtype bfloat16 or float16); pass packed=False");
    return FUSER_OK;
}

/* ---- fuser.ffn argument validation ---- */

/* Check that t has exactly the expected 1-D or 2-D shape. `what` explains the expectation. */
static int expect_shape(const fuser_tensor *t, const char *name, int ndim, int64_t d0, int64_t d1,
                        const char *what, fuser_err *err)
{
    int64_t want[2] = {d0, d1};
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = t->shape[i] == want[i];
    if (ok)
        return FUSER_OK;
    char got[160], exp[64];
    fuser_shape_str(t->shape, t->ndim, got, sizeof got);
    fuser_shape_str(want, ndim, exp, sizeof exp);
    return fuser_fail(err, FUSER_E_VALUE, "%s: expected shape %s (%s), got %s", name, exp, what, got);
}

/* t has dtype `want` (x's; in a quantized chain e4m3 for the weights, bfloat16 for the rest) and x's device. */
static int same_dtype_device(const fuser_tensor *t, const char *name, const fuser_tensor *x, fuser_dtype want,
                             int quantized, fuser_err *err)
{
    if (t->dtype != want && quantized)
        return fuser_fail(err, FUSER_E_TYPE, "%s: dtype %s; a quantized FFN (float8_e4m3fn w_up) takes %s", name,
                          fuser_dtype_name(t->dtype),
                          want == FUSER_E4M3 ? "every weight in float8_e4m3fn (fuser.fp8.quantize_weight makes them)"
                                             : "x, the biases and the output in bfloat16");
    if (t->dtype != want)
        return fuser_fail(err, FUSER_E_TYPE,
                          "%s: dtype %s does not match x's dtype %s; all tensors must share one dtype%s", name,
                          fuser_dtype_name(t->dtype), fuser_dtype_name(x->dtype),
                          t->dtype == FUSER_E4M3 ? " (a quantized FFN takes w_up in float8_e4m3fn too, and scales=)"
                                                 : "");
    if (t->device != x->device || t->device_id != x->device_id) {
        char a[32], b[32];
        fuser_device_str(t, a, sizeof a);
        fuser_device_str(x, b, sizeof b);
        return fuser_fail(err, FUSER_E_VALUE,
                          "%s is on %s but x is on %s; move all tensors to one device", name, a, b);
    }
    return FUSER_OK;
}

/* A quantized chain's scales: each present (the gate's only when gated), fp32 on x's device, with
 * one element (x's, H's) or one per weight row; a 16-bit chain takes none. */
static int check_scales(const fuser_ffn_args *a, const fuser_chain *c, fuser_err *err)
{
    const int quantized = c->dtype == FUSER_E4M3;
    const int64_t rows[FUSER_NUM_SCALES] = {1, c->n, c->n, c->l, 1};
    for (int i = 0; i < FUSER_NUM_SCALES; i++) {
        const fuser_tensor *t = a->scale[i];
        const char *name = fuser_scale_name(i);
        const int wanted = quantized && (i != FUSER_S_GATE || c->gated);
        if (!t && wanted)
            return fuser_fail(err, FUSER_E_VALUE, "%s: missing; a quantized FFN (float8_e4m3fn) needs its scales: pass "
                              "scales=fuser.fp8.Scales(x=, up=, down=, h=%s) (fuser.fp8.quantize_ffn makes them)",
                              name, c->gated ? ", gate=" : "");
        if (!t)
            continue;
        if (!wanted)
            return fuser_fail(err, FUSER_E_VALUE, "%s: given for %s; scales belong to a quantized FFN "
                              "(float8_e4m3fn tensors)%s", name, quantized ? "an FFN without w_gate" :
                              fuser_dtype_name(c->dtype), quantized ? "" : ": drop them");
        if (t->dtype != FUSER_F32)
            return fuser_fail(err, FUSER_E_TYPE, "%s: dtype %s; scales are float32", name, fuser_dtype_name(t->dtype));
        if (t->device != a->x->device || t->device_id != a->x->device_id) {
            char s1[32], s2[32];
            fuser_device_str(t, s1, sizeof s1);
            fuser_device_str(a->x, s2, sizeof s2);
            return fuser_fail(err, FUSER_E_VALUE, "%s is on %s but x is on %s; move all tensors to one device", name,
                              s1, s2);
        }
        if (t->ndim > 1 || t->numel != rows[i] || (rows[i] > 1 && t->ndim != 1)) {
            char got[160];
            fuser_shape_str(t->shape, t->ndim, got, sizeof got);
            return fuser_fail(err, FUSER_E_VALUE, "%s: expected %s%lld%s, got shape %s", name,
                              rows[i] == 1 ? "one element (shape [] or [" : "shape [", (long long)rows[i],
                              rows[i] == 1 ? "])" : i == FUSER_S_DOWN ? "] (one per row of w_down: d_out)"
                                                                       : "] (one per row of the weight: d_ff)", got);
        }
        if (a->out && fuser_tensors_overlap(a->out, t))
            return fuser_fail(err, FUSER_E_VALUE, "out: its memory overlaps %s; pass a separate output tensor", name);
    }
    return FUSER_OK;
}

/* Where the compact tensors g and u (of one shape) are the two halves of one memory: 1 with g first, 2 with u
 * first; else 0. How FusedFFN.pack and a Linear of both leave gate and up weights (and their biases), which the
 * eager route then runs as one GEMM. */
static int halves(const fuser_tensor *g, const fuser_tensor *u)
{
    const char *pg = g->data, *pu = u->data;
    return g->nbytes <= 0 ? 0 : pg + g->nbytes == pu ? 1 : pu + u->nbytes == pg ? 2 : 0;
}

/* Whether a gated chain's eager route runs gate and up as one GEMM: the weights halves of one memory, and
 * their biases absent or halves of one other in the same order. */
static int packed_gate_up(const fuser_ffn_args *a)
{
    const int w = halves(a->w_gate, a->w_up);
    if (!w || (a->b_gate == NULL) != (a->b_up == NULL))
        return 0;
    return !a->b_gate || halves(a->b_gate, a->b_up) == w;
}

int fuser_ffn_validate(const fuser_ffn_args *a, fuser_chain *c, fuser_err *err)
{
    char s1[160];
    memset(c, 0, sizeof *c);
    if (!a->x || !a->w_up || !a->w_down)
        return fuser_fail(err, FUSER_E_VALUE, "x, w_up and w_down are required");

    /* activation first: it needs no tensor */
    int act = fuser_act_from_name(a->activation);
    if (act < 0)
        return fuser_fail(err, FUSER_E_VALUE, "activation: unknown activation '%s'; expected one of %s",
                          a->activation ? a->activation : "(null)", fuser_act_choices());
    c->act = (fuser_act)act;

    /* x: [..., d_model]; leading dimensions flatten into M */
    const fuser_tensor *x = a->x;
    if (x->ndim < 1)
        return fuser_fail(err, FUSER_E_VALUE,
                          "x: expected a tensor of shape [..., d_model] with at least 1 dimension, got a "
                          "0-dimensional tensor");
    c->k = x->shape[x->ndim - 1];
    c->m = 1;
    for (int i = 0; i < x->ndim - 1; i++)
        c->m *= x->shape[i];
    if (c->k < 1)
        return fuser_fail(err, FUSER_E_VALUE, "x: the last dimension (d_model) is 0; it must be >= 1");
    c->dtype = x->dtype;

    /* weights: nn.Linear layout [out_features, in_features] */
    const fuser_tensor *wu = a->w_up;
    if (wu->ndim != 2 || wu->shape[1] != c->k || wu->shape[0] < 1) {
        fuser_shape_str(wu->shape, wu->ndim, s1, sizeof s1);
        return fuser_fail(err, FUSER_E_VALUE,
                          "w_up: expected shape [d_ff, %lld] (nn.Linear layout [out_features, in_features], "
                          "in_features = x's last dimension %lld, d_ff >= 1), got %s",
                          (long long)c->k, (long long)c->k, s1);
    }
    c->n = wu->shape[0];
    const fuser_tensor *wd = a->w_down;
    if (wd->ndim != 2 || wd->shape[1] != c->n || wd->shape[0] < 1) {
        fuser_shape_str(wd->shape, wd->ndim, s1, sizeof s1);
        return fuser_fail(err, FUSER_E_VALUE,
                          "w_down: expected shape [d_out, %lld] (nn.Linear layout, in_features = d_ff = "
                          "w_up.shape[0] = %lld, d_out >= 1), got %s",
                          (long long)c->n, (long long)c->n, s1);
    }
    c->l = wd->shape[0];
    /* float8_e4m3fn weights make a quantized chain, whose x, biases and output are bfloat16 */
    const int quantized = wu->dtype == FUSER_E4M3;
    if (quantized)
        c->dtype = FUSER_E4M3;
    if (quantized && x->dtype != FUSER_BF16)
        return fuser_fail(err, FUSER_E_TYPE, "x: dtype %s; a quantized FFN (float8_e4m3fn weights) takes x in bfloat16 "
                          "and quantizes it with scales.x itself", fuser_dtype_name(x->dtype));

    struct { const fuser_tensor *t; const char *name; } all[] = {
        {wu, "w_up"}, {wd, "w_down"}, {a->w_gate, "w_gate"}, {a->b_up, "b_up"},
        {a->b_gate, "b_gate"}, {a->b_down, "b_down"}, {a->out, "out"},
    };
    const fuser_dtype out_dt = fuser_chain_out_dtype(c);
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i].t &&
            same_dtype_device(all[i].t, all[i].name, x, all[i].name[0] == 'w' ? c->dtype : out_dt, quantized, err))
            return err->code;

    if (a->w_gate) {
        c->gated = 1;
        if (expect_shape(a->w_gate, "w_gate", 2, c->n, c->k, "the same shape as w_up", err))
            return err->code;
    }
    if (a->b_gate && !a->w_gate)
        return fuser_fail(err, FUSER_E_VALUE, "b_gate: given without w_gate; pass w_gate too, or drop b_gate");
    if (a->b_up && expect_shape(a->b_up, "b_up", 1, c->n, 0, "[d_ff]", err))
        return err->code;
    if (a->b_gate && expect_shape(a->b_gate, "b_gate", 1, c->n, 0, "[d_ff]", err))
        return err->code;
    if (a->b_down && expect_shape(a->b_down, "b_down", 1, c->l, 0, "[d_out]", err))
        return err->code;
    c->bias_up = a->b_up != NULL;
    c->bias_gate = a->b_gate != NULL;
    c->bias_down = a->b_down != NULL;
    c->packed = c->gated && (c->dtype == FUSER_BF16 || c->dtype == FUSER_F16) && packed_gate_up(a);
    if (check_scales(a, c, err))
        return err->code;

    if (a->out) {
        const fuser_tensor *o = a->out;
        int ok = o->ndim == (x->ndim > 1 ? x->ndim : 1);
        for (int i = 0; ok && i < x->ndim - 1; i++)
            ok = o->shape[i] == x->shape[i];
        ok = ok && o->shape[o->ndim - 1] == c->l;
        if (!ok) {
            int64_t want[FUSER_MAX_DIMS];
            char s2[160];
            for (int i = 0; i < x->ndim - 1; i++)
                want[i] = x->shape[i];
            want[x->ndim - 1] = c->l;
            fuser_shape_str(want, x->ndim, s1, sizeof s1);
            fuser_shape_str(o->shape, o->ndim, s2, sizeof s2);
            return fuser_fail(err, FUSER_E_VALUE, "out: expected shape %s (x's leading dimensions + d_out), got %s",
                              s1, s2);
        }
        for (size_t i = 0; i + 1 < sizeof all / sizeof all[0]; i++)
            if (all[i].t && fuser_tensors_overlap(o, all[i].t))
                return fuser_fail(err, FUSER_E_VALUE,
                                  "out: its memory overlaps %s; pass a separate output tensor", all[i].name);
        if (fuser_tensors_overlap(o, x))
            return fuser_fail(err, FUSER_E_VALUE, "out: its memory overlaps x; pass a separate output tensor");
    }
    return fuser_chain_check(c, err);
}
