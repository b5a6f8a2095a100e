/* plan_bind.c: the planner in Python: _C.search, _C.derive, _C.simulate, _C.targets, _C.rules.
 * Plans leave as _C.Plan objects (plan_type.c; fuser/planner.py wraps them in fuser.Plan) and come in as those or
 * as dicts, targets cross as dicts; every dict coming in
 * is read exactly (ints range-checked, never wrapped or truncated; strings whole; bools only True or
 * False) and re-derived by the core, so a hand-edited or stale plan cannot reach a kernel. Which
 * target a plan is checked against is the caller's choice (fuser/planner.py: never the dict's own). */
#include "binding.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "fuser/codegen.h"
#include "fuser/cost.h"
#include "fuser/interp.h"
#include "fuser/plan.h"
#include "fuser/search.h"

/* ---- dict <-> struct tables ---- */

typedef enum { F_INT, F_I64, F_DBL, F_STR } ftype;
typedef struct {
    const char *key;
    ftype type;
    size_t off;
} field;

#define TF(k, t) {#k, t, offsetof(fuser_target, k)}
static const field target_fields[] = {
    TF(sm_count, F_INT), TF(smem_per_block, F_INT), TF(smem_per_sm, F_INT), TF(regs_per_sm, F_INT),
    TF(max_regs_per_thread, F_INT), TF(max_cluster, F_INT), TF(clock_ghz, F_DBL), TF(hbm_gbs, F_DBL),
    TF(l2_gbs, F_DBL), TF(sm_load_gbs, F_DBL), TF(mem_latency_us, F_DBL), TF(smem_bytes_per_clk, F_DBL),
    TF(barrier_cycles, F_DBL), TF(launch_us, F_DBL), TF(mma_tflops, F_DBL), TF(fused_mma_eff, F_DBL),
    TF(fused_time_scale, F_DBL), TF(fused_scale_compute, F_DBL), TF(fused_scale_hbm, F_DBL),
    TF(fused_scale_l2, F_DBL), TF(fused_scale_dsm, F_DBL), TF(fused_scale_smem, F_DBL), TF(fused_scale_sync, F_DBL),
    TF(fused_scale_tail, F_DBL), TF(small_gemm_eff, F_DBL), TF(stream_mma_eff, F_DBL), TF(stream_fixed_us, F_DBL),
    TF(stream_time_scale, F_DBL), TF(stream_operand_bytes_per_clk, F_DBL), TF(stream_unit_us, F_DBL),
    TF(stream_unit_one_us, F_DBL), TF(stream_unit_one_kb, F_DBL), TF(stream_fp8_tail_rows, F_DBL),
    TF(stream_round_mma_eff, F_DBL), TF(stream_hbm_gbs, F_DBL), TF(stream_long_gbs, F_DBL),
    TF(stream_ramp_us, F_DBL), TF(stream_reread_gbs, F_DBL),
    TF(stream_sm_gbs, F_DBL), TF(eager_op_us, F_DBL), TF(eager_mma_eff, F_DBL),
    TF(eager_fp8_mma_eff, F_DBL), TF(eager_fp8_hbm_eff, F_DBL), TF(eager_ramp_us, F_DBL), TF(eager_ramp_mb, F_DBL),
    TF(eager_epilogue_us, F_DBL), TF(eager_mixed_p, F_DBL), TF(eager_mixed_mb, F_DBL),
    TF(eager_packed_merge, F_DBL),
    TF(fusion_margin, F_DBL), TF(stream_margin, F_DBL), TF(max_workspace, F_I64),
};
#define PF(k) {#k, F_INT, offsetof(fuser_plan, k)}
#define PL(k) {#k, F_I64, offsetof(fuser_plan, k)}
static const field plan_derived[] = {
    PF(cluster_size), PF(cls_shuffle), PF(cls_reduce), PF(ksplit), PF(parts), PF(warps_m), PF(warps_n),
    PL(kt), PL(kts), PL(nb), PL(nc), PL(lp), PF(lc), PF(sw), PL(grid_m), PL(grid_n), PL(clusters), PL(blocks),
    PL(m_pad), PL(l_pad), PF(smem_bytes), PF(smem_pipe), PF(smem_xbuf), PF(smem_hg), PF(regs_est),
    PL(workspace_bytes), PL(tickets), PF(barriers), PF(threads), PF(nt1), PF(lt2), PL(units),
};
#define CF(k) {#k, F_DBL, offsetof(fuser_cost, k)}
static const field cost_fields[] = {
    CF(compute), CF(hbm), CF(l2), CF(dsm), CF(smem), CF(sync), CF(launch), CF(tail), CF(total), CF(flops),
    CF(useful_flops),
};

/* The searched integer fields and the range each may take (fuser_plan_derive then checks the values
 * allowed within it). A fused plan's dict gives the first N_TILES; a search may constrain any. */
typedef struct {
    const char *key;
    size_t plan_off, cons_off;
    int lo, hi;
} searched_field;
#define SF(k, lo, hi) {#k, offsetof(fuser_plan, k), offsetof(fuser_constraints, k), lo, hi}
static const searched_field searched[] = {
    SF(bm, 16, 128), SF(bn, 32, 256), SF(bl, 32, 256), SF(n_iters, 1, 4096), SF(stages, 1, 8), SF(s1, 1, 4096),
    SF(s2, 1, 4096), SF(cls_m, 1, 16), SF(cls_n, 1, 16), SF(cls_k, 1, 16), SF(cls_l, 1, 16), SF(phases, 1, 2),
    SF(lspan, 1, 4096),
};
enum { N_TILES = 5 };

static const char *const order_names[] = {"n_outer", "l_outer"};
static const char *const kind_names[] = {"cluster", "stream"};
static const char *const gate_names[] = {"none", "spatial", "sequential"};

/* ---- reading Python values exactly: no coercion, no wrap-around, no truncation ----
 * Each reader names the field (`what`: the dict it is in, `key`: the field), what it expects and what
 * it got, as TypeError (wrong type) or ValueError (right type, wrong value). */

static int int_in(PyObject *v, const char *what, const char *key, long long lo, long long hi, long long *out)
{
    if (!PyLong_Check(v) || PyBool_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s: '%s' must be an int in [%lld, %lld], got %s", what, key, lo, hi,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (overflow) {
        PyErr_Format(PyExc_ValueError, "%s: '%s' must be an int in [%lld, %lld], got one of more than 64 bits",
                     what, key, lo, hi);
        return -1;
    }
    if (x < lo || x > hi) {
        PyErr_Format(PyExc_ValueError, "%s: '%s' must be an int in [%lld, %lld], got %lld", what, key, lo, hi, x);
        return -1;
    }
    *out = x;
    return 0;
}

static int int_in_i(PyObject *v, const char *what, const char *key, int lo, int hi, int *out)
{
    long long x;
    if (int_in(v, what, key, lo, hi, &x))
        return -1;
    *out = (int)x;
    return 0;
}

/* A finite number (int or float, not bool). */
static int finite_number(PyObject *v, const char *what, const char *key, double *out)
{
    if (!(PyFloat_Check(v) || PyLong_Check(v)) || PyBool_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s: '%s' must be a number, got %s", what, key, Py_TYPE(v)->tp_name);
        return -1;
    }
    double x = PyFloat_AsDouble(v);
    if (x == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        x = HUGE_VAL;
    }
    if (!isfinite(x)) {
        /* (PyErr_Format has no float conversions: Python 3.12 raises SystemError on %g) */
        char num[32];
        snprintf(num, sizeof num, "%g", x);
        PyErr_Format(PyExc_ValueError, "%s: '%s' must be a finite number, got %s", what, key, num);
        return -1;
    }
    *out = x;
    return 0;
}

const char *fuser_exact_str(PyObject *v, const char *what, const char *key)
{
    char label[96]; /* formatted only for an error: this runs in every fuser.ffn call */
#define LABEL() snprintf(label, sizeof label, key ? "%s: '%s'" : "%s", what, key)
    if (!PyUnicode_Check(v)) {
        LABEL();
        PyErr_Format(PyExc_TypeError, "%s must be a str, got %s", label, Py_TYPE(v)->tp_name);
        return NULL;
    }
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(v, &n);
    if (!s) {
        PyErr_Clear();
        LABEL();
        PyErr_Format(PyExc_ValueError, "%s is not valid Unicode text (it has a lone surrogate)", label);
        return NULL;
    }
    if (strlen(s) != (size_t)n) {
        LABEL();
        PyErr_Format(PyExc_ValueError, "%s must not contain NUL characters, got %R", label, v);
        return NULL;
    }
#undef LABEL
    return s;
}

/* Whether d has `key` with a value other than None. */
static int given(PyObject *d, const char *key)
{
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    return v && v != Py_None;
}

/* d[key] into *out, an int in [lo, hi]; absent: kept, or a ValueError if `required`. */
static int get_int(PyObject *d, const char *key, const char *what, int lo, int hi, int required, int *out)
{
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    if (!v) {
        if (required)
            PyErr_Format(PyExc_ValueError, "%s: missing key '%s'", what, key);
        return required ? -1 : 0;
    }
    return int_in_i(v, what, key, lo, hi, out);
}

/* d[key] as True or False (absent: false). Strings such as "no" are refused, not read as true. */
static int get_bool(PyObject *d, const char *key, const char *what, int *out)
{
    PyObject *v = PyDict_GetItemString(d, key); /* borrowed */
    if (v && !PyBool_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s: '%s' must be True or False, got %s", what, key, Py_TYPE(v)->tp_name);
        return -1;
    }
    *out = v == Py_True;
    return 0;
}

/* v, one of names[0..n): its index, or -1 with a ValueError listing the names. */
static int choice(PyObject *v, const char *what, const char *key, const char *const *names, int n)
{
    const char *s = fuser_exact_str(v, what, key);
    if (!s)
        return -1;
    char list[160] = "";
    for (int i = 0; i < n; i++) {
        if (!strcmp(names[i], s))
            return i;
        fuser_strlcat(list, i ? ", '" : "'", sizeof list);
        fuser_strlcat(list, names[i], sizeof list);
        fuser_strlcat(list, "'", sizeof list);
    }
    PyErr_Format(PyExc_ValueError, "%s: '%s' must be one of %s, got %R", what, key, list, v);
    return -1;
}

/* A list or tuple of exactly n items (the borrowed items in *items), or -1 with TypeError/ValueError. */
static int fixed_list(PyObject *v, const char *what, const char *key, Py_ssize_t n, PyObject ***items)
{
    if (!PyList_Check(v) && !PyTuple_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s: '%s' must be a list or tuple of %zd values, got %s", what, key, n,
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    if (PySequence_Fast_GET_SIZE(v) != n) {
        PyErr_Format(PyExc_ValueError, "%s: '%s' must have %zd values, got %zd", what, key, n,
                     PySequence_Fast_GET_SIZE(v));
        return -1;
    }
    *items = PySequence_Fast_ITEMS(v);
    return 0;
}

static PyObject *field_value(const void *base, const field *f)
{
    const char *p = (const char *)base + f->off;
    switch (f->type) {
    case F_INT: return PyLong_FromLong(*(const int *)p);
    case F_I64: return PyLong_FromLongLong(*(const int64_t *)p);
    case F_DBL: return PyFloat_FromDouble(*(const double *)p);
    default: return PyUnicode_FromString(p);
    }
}

static int put_fields(PyObject *d, const void *base, const field *fs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        PyObject *v = field_value(base, &fs[i]);
        if (!v || PyDict_SetItemString(d, fs[i].key, v)) {
            Py_XDECREF(v);
            return -1;
        }
        Py_DECREF(v);
    }
    return 0;
}

/* Read d[key] into the field; missing keys keep the current value unless `required`. Ints must fit the
 * field's C type (later checks give the field's own range); doubles must be finite. */
static int get_field(PyObject *d, void *base, const field *f, const char *what, int required)
{
    PyObject *v = PyDict_GetItemString(d, f->key); /* borrowed */
    if (!v) {
        if (required)
            PyErr_Format(PyExc_ValueError, "%s: missing key '%s'", what, f->key);
        return required ? -1 : 0;
    }
    char *p = (char *)base + f->off;
    if (f->type == F_DBL)
        return finite_number(v, what, f->key, (double *)p);
    long long x;
    if (f->type == F_INT ? int_in(v, what, f->key, -INT_MAX, INT_MAX, &x)
                         : int_in(v, what, f->key, INT64_MIN, INT64_MAX, &x))
        return -1;
    if (f->type == F_INT)
        *(int *)p = (int)x;
    else
        *(int64_t *)p = x;
    return 0;
}

/* (binding.h) */
PyObject *fuser_target_to_dict(const fuser_target *t)
{
    PyObject *d = Py_BuildValue("{s:s}", "name", t->name);
    if (!d || put_fields(d, t, target_fields, sizeof target_fields / sizeof target_fields[0]))
        goto fail;
    PyObject *u = Py_BuildValue("[iiiii]", t->usable_sms[0], t->usable_sms[1], t->usable_sms[2], t->usable_sms[3],
                                t->usable_sms[4]);
    PyObject *b = Py_BuildValue("[ddddd]", t->dsm_bytes_per_clk[0], t->dsm_bytes_per_clk[1],
                                t->dsm_bytes_per_clk[2], t->dsm_bytes_per_clk[3], t->dsm_bytes_per_clk[4]);
    int bad = !u || !b || PyDict_SetItemString(d, "usable_sms", u) || PyDict_SetItemString(d, "dsm_bytes_per_clk", b);
    Py_XDECREF(u);
    Py_XDECREF(b);
    if (!bad)
        return d;
fail:
    Py_XDECREF(d);
    return NULL;
}

/* A target from a name ("h200"), or a dict (a built-in's fields overridden by the dict's). */
int fuser_target_from_obj(PyObject *obj, fuser_target *t)
{
    if (PyUnicode_Check(obj)) {
        const char *name = fuser_exact_str(obj, "target", "name");
        const fuser_target *b = name ? fuser_target_builtin(name) : NULL;
        if (!b) {
            if (name)
                PyErr_Format(PyExc_ValueError, "target: unknown target %R; expected one of %s or a dict", obj,
                             fuser_target_names());
            return -1;
        }
        *t = *b;
        return 0;
    }
    if (!PyDict_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "target: expected a name or a dict, got %s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    /* every key is a field: a misspelt or retired one would otherwise leave its default silently in place */
    PyObject *key, *val;
    Py_ssize_t pos = 0;
    while (PyDict_Next(obj, &pos, &key, &val)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        int known = k && (!strcmp(k, "name") || !strcmp(k, "usable_sms") || !strcmp(k, "dsm_bytes_per_clk"));
        for (size_t i = 0; k && !known && i < sizeof target_fields / sizeof target_fields[0]; i++)
            known = !strcmp(k, target_fields[i].key);
        if (!known) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "target: unknown field %R; a target dict holds only the fields of "
                             "fuser._C.targets()['h200'] (those it leaves out keep the H200's values)", key);
            return -1;
        }
    }
    *t = *fuser_target_builtin("h200");
    PyObject *name = PyDict_GetItemString(obj, "name");
    if (name) {
        const char *s = fuser_exact_str(name, "target", "name");
        if (!s)
            return -1;
        if (strlen(s) >= sizeof t->name) {
            PyErr_Format(PyExc_ValueError, "target: 'name' must be at most %d bytes, got %zu",
                         (int)sizeof t->name - 1, strlen(s));
            return -1;
        }
        snprintf(t->name, sizeof t->name, "%s", s);
    }
    for (size_t i = 0; i < sizeof target_fields / sizeof target_fields[0]; i++)
        if (get_field(obj, t, &target_fields[i], "target", 0))
            return -1;
    PyObject *v = PyDict_GetItemString(obj, "usable_sms"), **items;
    if (v && fixed_list(v, "target", "usable_sms", FUSER_NUM_CLUSTER_SIZES, &items))
        return -1;
    for (int i = 0; v && i < FUSER_NUM_CLUSTER_SIZES; i++)
        if (int_in_i(items[i], "target", "usable_sms", 1, INT_MAX, &t->usable_sms[i]))
            return -1;
    v = PyDict_GetItemString(obj, "dsm_bytes_per_clk");
    if (v && fixed_list(v, "target", "dsm_bytes_per_clk", FUSER_NUM_CLUSTER_SIZES, &items))
        return -1;
    for (int i = 0; v && i < FUSER_NUM_CLUSTER_SIZES; i++)
        if (finite_number(items[i], "target", "dsm_bytes_per_clk", &t->dsm_bytes_per_clk[i]))
            return -1;
    fuser_err err;
    fuser_err_clear(&err);
    if (fuser_target_check(t, &err)) {
        PyErr_SetString(PyExc_ValueError, err.msg);
        return -1;
    }
    return 0;
}

/* ---- chains ---- */

static int chain_from_dict(PyObject *d, fuser_chain *c)
{
    memset(c, 0, sizeof *c);
    if (!PyDict_Check(d)) {
        PyErr_Format(PyExc_TypeError, "chain: expected a dict, got %s", Py_TYPE(d)->tp_name);
        return -1;
    }
    static const field cf[] = {{"m", F_I64, offsetof(fuser_chain, m)}, {"d_model", F_I64, offsetof(fuser_chain, k)},
                               {"d_ff", F_I64, offsetof(fuser_chain, n)}, {"d_out", F_I64, offsetof(fuser_chain, l)}};
    for (size_t i = 0; i < 4; i++)
        if (get_field(d, c, &cf[i], "chain", 1))
            return -1;
    if (get_bool(d, "gated", "chain", &c->gated) || get_bool(d, "bias_up", "chain", &c->bias_up) ||
        get_bool(d, "bias_gate", "chain", &c->bias_gate) || get_bool(d, "bias_down", "chain", &c->bias_down) ||
        get_bool(d, "packed", "chain", &c->packed))
        return -1;
    PyObject *a = PyDict_GetItemString(d, "activation"), *t = PyDict_GetItemString(d, "dtype");
    const char *as = a ? fuser_exact_str(a, "chain", "activation") : NULL;
    const char *ts = as && t ? fuser_exact_str(t, "chain", "dtype") : NULL;
    if (PyErr_Occurred())
        return -1;
    int act = fuser_act_from_name(as), dt = fuser_dtype_from_name(ts);
    if (act < 0) {
        PyErr_Format(PyExc_ValueError, "activation: unknown activation %R; expected one of %s", a ? a : Py_None,
                     fuser_act_choices());
        return -1;
    }
    if (dt < 0) {
        PyErr_Format(PyExc_ValueError, "dtype: unknown dtype %R; expected bfloat16, float16 or float32",
                     t ? t : Py_None);
        return -1;
    }
    c->act = (fuser_act)act;
    c->dtype = (fuser_dtype)dt;
    fuser_err err;
    fuser_err_clear(&err);
    if (fuser_chain_check(c, &err)) {
        PyErr_SetString(PyExc_ValueError, err.msg);
        return -1;
    }
    return 0;
}

static PyObject *chain_to_dict(const fuser_chain *c)
{
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:O,s:s,s:O,s:O,s:O,s:s,s:O}", "m", (long long)c->m, "d_model",
                         (long long)c->k, "d_ff", (long long)c->n, "d_out", (long long)c->l, "gated",
                         c->gated ? Py_True : Py_False, "activation", fuser_act_name(c->act), "bias_up",
                         c->bias_up ? Py_True : Py_False, "bias_gate", c->bias_gate ? Py_True : Py_False,
                         "bias_down", c->bias_down ? Py_True : Py_False, "dtype", fuser_dtype_name(c->dtype),
                         "packed", c->packed ? Py_True : Py_False);
}

/* ---- plans ---- */

/* (binding.h) */
PyObject *fuser_plan_to_dict(const fuser_plan *p)
{
    char df[160];
    fuser_plan_dataflow_str(p, df, sizeof df);
    PyObject *d = Py_BuildValue("{s:N,s:O,s:s}", "chain", chain_to_dict(&p->chain), "fused",
                                p->fused ? Py_True : Py_False, "dataflow", df);
    if (!d)
        return NULL;
    PyObject *tr = Py_BuildValue("{s:L,s:L,s:L,s:L}", "hbm", (long long)p->traffic.hbm, "l2",
                                 (long long)p->traffic.l2, "dsm", (long long)p->traffic.dsm, "smem",
                                 (long long)p->traffic.smem);
    PyObject *cost = PyDict_New();
    int bad = !tr || !cost || put_fields(cost, &p->cost, cost_fields, sizeof cost_fields / sizeof cost_fields[0]);
    if (!bad) {
        PyObject *w = PyLong_FromLong(p->cost.waves), *s = PyLong_FromLong(p->cost.sms_used);
        bad = !w || !s || PyDict_SetItemString(cost, "waves", w) || PyDict_SetItemString(cost, "sms_used", s);
        Py_XDECREF(w);
        Py_XDECREF(s);
    }
    bad = bad || PyDict_SetItemString(d, "traffic", tr) || PyDict_SetItemString(d, "cost", cost);
    Py_XDECREF(tr);
    Py_XDECREF(cost);
    /* an unfused plan: whether the eager route it prices runs the activation in the up GEMM's epilogue */
    bad = bad || (!p->fused && PyDict_SetItemString(d, "eager_epilogue",
                                                     fuser_eager_epilogue(&p->chain) ? Py_True : Py_False));
    if (!bad && p->fused) {
        PyObject *params = Py_BuildValue("{s:s,s:(iiii),s:i,s:i,s:i,s:i,s:i,s:s,s:s,s:i,s:i,s:i,s:i}", "kind",
                                         kind_names[p->kind], "cluster", p->cls_m, p->cls_n, p->cls_k, p->cls_l, "bm",
                                         p->bm, "bn", p->bn, "bl", p->bl, "n_iters", p->n_iters, "stages", p->stages,
                                         "order", order_names[p->order], "gate_mode", gate_names[p->gate_mode], "s1",
                                         p->s1, "s2", p->s2, "phases", p->phases, "lspan", p->lspan);
        PyObject *derived = PyDict_New();
        bad = !params || !derived || put_fields(derived, p, plan_derived, sizeof plan_derived / sizeof plan_derived[0]) ||
              PyDict_SetItemString(d, "params", params) || PyDict_SetItemString(d, "derived", derived);
        if (!bad) {
            PyObject *dfl = PyList_New(0);
            for (int i = 0; dfl && i < FUSER_NUM_DATAFLOWS; i++)
                if (p->dataflows & (1 << i)) {
                    PyObject *s = PyUnicode_FromString(fuser_dataflow_name(i));
                    if (!s || PyList_Append(dfl, s))
                        Py_CLEAR(dfl);
                    Py_XDECREF(s);
                }
            bad = !dfl || PyDict_SetItemString(d, "dataflows", dfl);
            Py_XDECREF(dfl);
        }
        Py_XDECREF(params);
        Py_XDECREF(derived);
    }
    if (bad) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* The searched fields of a fused plan from its 'params' dict (ranges from `searched`). */
static int params_from_dict(PyObject *pd, fuser_plan *p)
{
    static const char what[] = "plan params";
    if (!pd) {
        PyErr_SetString(PyExc_ValueError, "plan: a fused plan needs a 'params' dict");
        return -1;
    }
    if (!PyDict_Check(pd)) {
        PyErr_Format(PyExc_TypeError, "plan: 'params' must be a dict, got %s", Py_TYPE(pd)->tp_name);
        return -1;
    }
    /* the kernel family (absent: the cluster kernel, as older plan files have it) */
    PyObject *v = PyDict_GetItemString(pd, "kind"), **items;
    int ki = v ? choice(v, what, "kind", kind_names, 2) : FUSER_KIND_CLUSTER;
    if (ki < 0)
        return -1;
    p->kind = (fuser_kind)ki;
    v = PyDict_GetItemString(pd, "cluster");
    if (!v) {
        PyErr_Format(PyExc_ValueError, "%s: missing key 'cluster'", what);
        return -1;
    }
    if (fixed_list(v, what, "cluster", 4, &items))
        return -1;
    static const char *const dims[4] = {"cluster[0] (cls_m)", "cluster[1] (cls_n)", "cluster[2] (cls_k)",
                                        "cluster[3] (cls_l)"};
    int *slot[4] = {&p->cls_m, &p->cls_n, &p->cls_k, &p->cls_l};
    for (int i = 0; i < 4; i++)
        if (int_in_i(items[i], what, dims[i], 1, 16, slot[i]))
            return -1;
    for (int i = 0; i < N_TILES; i++)
        if (get_int(pd, searched[i].key, what, searched[i].lo, searched[i].hi, 1,
                    (int *)((char *)p + searched[i].plan_off)))
            return -1;
    static const char *const keys[2] = {"order", "gate_mode"};
    const char *const *names[2] = {order_names, gate_names};
    int idx[2];
    for (int i = 0; i < 2; i++) {
        v = PyDict_GetItemString(pd, keys[i]);
        if (!v) {
            PyErr_Format(PyExc_ValueError, "%s: missing key '%s'", what, keys[i]);
            return -1;
        }
        if ((idx[i] = choice(v, what, keys[i], names[i], i ? 3 : 2)) < 0)
            return -1;
    }
    p->order = (fuser_order)idx[0];
    p->gate_mode = (fuser_gate_mode)idx[1];
    /* the stream kernel's splits (a cluster plan has none: 0, as plans write it, or 1) */
    const int stream = p->kind == FUSER_KIND_STREAM;
    p->s1 = p->s2 = stream;
    p->phases = 2 * stream;
    p->lspan = stream;
    /* and its phases (2 where the dict has none; a cluster plan has none: 0) and l-tiles per unit (1 where
     * the dict has none) */
    return get_int(pd, "s1", what, stream, 4096, 0, &p->s1) || get_int(pd, "s2", what, stream, 4096, 0, &p->s2) ||
           get_int(pd, "phases", what, stream, 2 * stream, 0, &p->phases) ||
           get_int(pd, "lspan", what, stream, 4096 * stream, 0, &p->lspan);
}

/* A plan from a dict: chain + fused + params; everything else is re-derived and re-costed on t. */
int fuser_plan_from_dict(PyObject *d, const fuser_target *t, fuser_plan *p)
{
    if (!PyDict_Check(d)) {
        PyErr_Format(PyExc_TypeError, "plan: expected a dict, got %s", Py_TYPE(d)->tp_name);
        return -1;
    }
    PyObject *cd = PyDict_GetItemString(d, "chain");
    fuser_chain c;
    if (!cd) {
        PyErr_SetString(PyExc_ValueError, "plan: missing key 'chain'");
        return -1;
    }
    if (chain_from_dict(cd, &c))
        return -1;
    fuser_plan_unfused(&c, p);
    if (get_bool(d, "fused", "plan", &p->fused))
        return -1;
    if (p->fused && params_from_dict(PyDict_GetItemString(d, "params"), p))
        return -1;
    return fuser_plan_finish(p, t);
}

/* (binding.h) */
int fuser_plan_finish(fuser_plan *p, const fuser_target *t)
{
    fuser_err err;
    fuser_err_clear(&err);
    if (fuser_plan_derive(p, &err) || fuser_plan_check_target(p, t, &err)) {
        PyErr_Format(PyExc_ValueError, "plan: %s", err.msg);
        return -1;
    }
    fuser_plan_cost(p, t);
    return 0;
}

/* ---- module functions ---- */

/* A search's constraints from a dict: each key present and not None restricts that field. Values are
 * checked like a plan's (0 and negative numbers are refused, never read as "free"). */
static int constraints_from_dict(PyObject *d, fuser_constraints *cons)
{
    static const char what[] = "constraints";
    if (!PyDict_Check(d)) {
        PyErr_Format(PyExc_TypeError, "constraints: expected a dict, got %s", Py_TYPE(d)->tp_name);
        return -1;
    }
    static const struct { const char *key; size_t off; int hi; } flags[] = {
        {"fused", offsetof(fuser_constraints, fused), 1},
        {"dataflows_all", offsetof(fuser_constraints, dataflows_all), (1 << FUSER_NUM_DATAFLOWS) - 1},
        {"dataflows_none", offsetof(fuser_constraints, dataflows_none), (1 << FUSER_NUM_DATAFLOWS) - 1},
    };
    for (size_t i = 0; i < sizeof searched / sizeof searched[0]; i++)
        if (given(d, searched[i].key) && get_int(d, searched[i].key, what, searched[i].lo, searched[i].hi, 0,
                                                 (int *)((char *)cons + searched[i].cons_off)))
            return -1;
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (given(d, flags[i].key) && get_int(d, flags[i].key, what, 0, flags[i].hi, 0,
                                              (int *)((char *)cons + flags[i].off)))
            return -1;
    static const char *const keys[3] = {"kind", "order", "gate_mode"};
    const char *const *names[3] = {kind_names, order_names, gate_names};
    const int n[3] = {2, 2, 3};
    int *slot[3] = {&cons->kind, &cons->order, &cons->gate_mode};
    for (int i = 0; i < 3; i++)
        if (given(d, keys[i]) && (*slot[i] = choice(PyDict_GetItemString(d, keys[i]), what, keys[i], names[i],
                                                    n[i])) < 0)
            return -1;
    return 0;
}

/* search(chain, target, k=1, constraints=None) -> (list of plan dicts, stats dict) */
PyObject *fuser_py_search(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"chain", "target", "k", "constraints", NULL};
    PyObject *cd, *td, *k_obj = NULL, *cons_d = Py_None;
    int k = 1;
    (void)module;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OO:search", kwlist, &cd, &td, &k_obj, &cons_d))
        return NULL;
    if (k_obj && int_in_i(k_obj, "search", "k", 1, 64, &k))
        return NULL;
    fuser_chain c;
    fuser_target t;
    if (chain_from_dict(cd, &c) || fuser_target_from_obj(td, &t))
        return NULL;
    fuser_constraints cons;
    fuser_constraints_init(&cons);
    if (cons_d != Py_None && constraints_from_dict(cons_d, &cons))
        return NULL;
    fuser_plan out[64];
    int n = 0;
    fuser_search_stats st;
    fuser_err err;
    fuser_err_clear(&err);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fuser_search(&c, &t, &cons, k, out, &n, &st, &err);
    Py_END_ALLOW_THREADS
    if (rc)
        return fuser_raise(fuser_get_state(module), &err);
    PyObject *list = PyList_New(n), *pruned = PyDict_New();
    for (int i = 0; list && i < n; i++) {
        PyObject *po = fuser_plan_object_new(fuser_get_state(module), &out[i], &t);
        if (!po)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, po);
    }
    for (int r = 0; pruned && r < fuser_num_rules; r++) {
        PyObject *v = PyLong_FromLongLong(st.pruned[r]);
        if (!v || PyDict_SetItemString(pruned, fuser_rules[r].name, v))
            Py_CLEAR(pruned);
        Py_XDECREF(v);
    }
    PyObject *td_out = fuser_target_to_dict(&t);
    if (!list || !pruned || !td_out) {
        Py_XDECREF(list);
        Py_XDECREF(pruned);
        Py_XDECREF(td_out);
        return NULL;
    }
    return Py_BuildValue("(N{s:L,s:L,s:L,s:N,s:d,s:N,s:d})", list, "candidates", (long long)st.candidates, "scored",
                         (long long)st.scored, "constrained", (long long)st.constrained, "pruned", pruned, "search_ms",
                         st.search_ms, "target", td_out, "floor_us", fuser_chain_floor_us(&c, &t));
}

/* derive(plan, target) -> Plan: validate a plan (a Plan, or a dict from JSON, say), re-derive and re-cost it on
 * target. */
PyObject *fuser_py_derive(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"plan", "target", NULL};
    PyObject *pd, *td;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:derive", kwlist, &pd, &td))
        return NULL;
    fuser_state *st = fuser_get_state(module);
    fuser_target t;
    fuser_plan p;
    if (fuser_target_from_obj(td, &t) || fuser_plan_from_obj(st, pd, &t, &p))
        return NULL;
    return fuser_plan_object_new(st, &p, &t);
}

/* targets() -> dict name -> target dict (the built-ins). target_for_device(props) -> target dict. */
PyObject *fuser_py_targets(PyObject *module, PyObject *noargs)
{
    (void)module;
    (void)noargs;
    PyObject *d = PyDict_New();
    const char *names[] = {"h200", "h100"};
    for (int i = 0; d && i < 2; i++) {
        PyObject *t = fuser_target_to_dict(fuser_target_builtin(names[i]));
        if (!t || PyDict_SetItemString(d, names[i], t))
            Py_CLEAR(d);
        Py_XDECREF(t);
    }
    return d;
}

PyObject *fuser_py_target_for_device(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"name", "cc", "sm_count", "smem_per_block_optin", "smem_per_sm", "l2_bytes", "clock_khz",
                             "mem_clock_khz", "mem_bus_bits", NULL};
    fuser_device_props pr;
    memset(&pr, 0, sizeof pr);
    const char *name = "";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s(ii)|iiiiiii:target_for_device", kwlist, &name, &pr.cc_major,
                                     &pr.cc_minor, &pr.sm_count, &pr.smem_per_block_optin, &pr.smem_per_sm,
                                     &pr.l2_bytes, &pr.clock_khz, &pr.mem_clock_khz, &pr.mem_bus_bits))
        return NULL;
    snprintf(pr.name, sizeof pr.name, "%s", name);
    fuser_target t;
    fuser_err err;
    fuser_err_clear(&err);
    if (fuser_target_from_device(&pr, &t, &err))
        return fuser_raise(fuser_get_state(module), &err);
    return fuser_target_to_dict(&t);
}

PyObject *fuser_py_rules(PyObject *module, PyObject *noargs)
{
    static const char *const levels[] = {"chain", "shape", "bm", "bn", "n_iters", "bl", "full", "choice"};
    _Static_assert(sizeof levels / sizeof levels[0] == FUSER_LEVEL_CHOICE + 1, "a name for every rule level");
    (void)module;
    (void)noargs;
    PyObject *l = PyList_New(fuser_num_rules);
    for (int r = 0; l && r < fuser_num_rules; r++) {
        PyObject *t = Py_BuildValue("(sss)", fuser_rules[r].name, levels[fuser_rules[r].level], fuser_rules[r].why);
        if (!t)
            Py_CLEAR(l);
        else
            PyList_SET_ITEM(l, r, t);
    }
    return l;
}

/* simulate(plan, target, x, w_up, w_down, w_gate, b_up, b_gate, b_down, y) -> (traffic, barriers, flops) */
PyObject *fuser_py_simulate(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"plan", "target", "x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down", "y", NULL};
    enum { X, WU, WD, WG, BU, BG, BD, Y, NT };
    static const char *const names[NT] = {"x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down", "y"};
    PyObject *pd, *td, *obj[NT] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOO:simulate", kwlist, &pd, &td, &obj[X], &obj[WU],
                                     &obj[WD], &obj[WG], &obj[BU], &obj[BG], &obj[BD], &obj[Y]))
        return NULL;
    fuser_target t;
    fuser_plan p;
    if (fuser_target_from_obj(td, &t) || fuser_plan_from_obj(fuser_get_state(module), pd, &t, &p))
        return NULL;
    fuser_state *st = fuser_get_state(module);
    fuser_held h[NT];
    memset(h, 0, sizeof h);
    PyObject *res = NULL;
    const fuser_chain *c = &p.chain;
    /* expected shapes, checked here so a plan cannot read past a tensor */
    const int64_t shapes[NT][2] = {{c->m, c->k}, {c->n, c->k}, {c->l, c->n}, {c->n, c->k}, {c->n, -1}, {c->n, -1},
                                   {c->l, -1}, {c->m, c->l}};
    const int needed[NT] = {1, 1, 1, c->gated, c->bias_up, c->bias_gate, c->bias_down, 1};
    for (int i = 0; i < NT; i++) {
        if (obj[i] == Py_None) {
            if (needed[i]) {
                PyErr_Format(PyExc_ValueError, "%s: the plan's chain needs it", names[i]);
                goto done;
            }
            continue;
        }
        if (!needed[i]) {
            PyErr_Format(PyExc_ValueError, "%s: given, but the plan's chain does not use it", names[i]);
            goto done;
        }
        if (fuser_take(st, obj[i], names[i], Py_None, FUSER_TAKE_NO_CAPSULE | (i == Y ? FUSER_TAKE_WRITABLE : 0), &h[i]))
            goto done;
        const fuser_tensor *tt = &h[i].t;
        int nd = shapes[i][1] < 0 ? 1 : 2;
        if (tt->device != FUSER_CPU || tt->dtype != c->dtype || tt->ndim != nd || tt->shape[0] != shapes[i][0] ||
            (nd == 2 && tt->shape[1] != shapes[i][1])) {
            PyErr_Format(PyExc_ValueError, "%s: expected a CPU %s tensor of shape [%lld%s%lld] for this plan", names[i],
                         fuser_dtype_name(c->dtype), (long long)shapes[i][0], nd == 2 ? ", " : "",
                         nd == 2 ? (long long)shapes[i][1] : 0LL);
            goto done;
        }
    }
    {
        fuser_ffn_data d = {h[X].t.data, h[WU].t.data, h[WG].t.data, h[WD].t.data, h[BU].t.data, h[BG].t.data,
                            h[BD].t.data, h[Y].t.data};
        fuser_interp_result r;
        fuser_err err;
        fuser_err_clear(&err);
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = fuser_interpret(&p, &d, &r, &err);
        Py_END_ALLOW_THREADS
        if (rc) {
            fuser_raise(st, &err);
            goto done;
        }
        res = Py_BuildValue("({s:L,s:L,s:L,s:L}id)", "hbm", (long long)r.traffic.hbm, "l2", (long long)r.traffic.l2,
                            "dsm", (long long)r.traffic.dsm, "smem", (long long)r.traffic.smem, r.barriers, r.flops);
    }
done:
    for (int i = 0; i < NT; i++)
        fuser_release(&h[i]);
    return res;
}

/* codegen(plan, target) -> str: the kernel specialisation for a fused plan. */
PyObject *fuser_py_codegen(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"plan", "target", NULL};
    PyObject *pd, *td;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:codegen", kwlist, &pd, &td))
        return NULL;
    fuser_target t;
    fuser_plan p;
    if (fuser_target_from_obj(td, &t) || fuser_plan_from_obj(fuser_get_state(module), pd, &t, &p))
        return NULL;
    char buf[8192];
    fuser_err err;
    fuser_err_clear(&err);
    if (fuser_codegen(&p, buf, sizeof buf, &err))
        return fuser_raise(fuser_get_state(module), &err);
    return PyUnicode_FromString(buf);
}
