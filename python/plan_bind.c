/* plan_bind.c: the planner in Python: _C.search, _C.derive, _C.simulate, _C.targets, _C.rules.
 * Plans and targets cross as dicts (fuser/planner.py wraps them in fuser.Plan); every dict coming in
 * is validated and re-derived by the core, so a hand-edited or stale plan cannot reach a kernel. */
#include "binding.h"

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
    TF(stream_sm_gbs, F_DBL),
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

static const char *const order_names[] = {"n_outer", "l_outer"};
static const char *const kind_names[] = {"cluster", "stream"};
static const char *const gate_names[] = {"none", "spatial", "sequential"};

static int name_index(const char *const *names, int n, const char *s)
{
    for (int i = 0; s && i < n; i++)
        if (!strcmp(names[i], s))
            return i;
    return -1;
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

/* Read d[key] into the field; missing keys keep the current value unless `required`. */
static int get_field(PyObject *d, void *base, const field *f, const char *what, int required)
{
    PyObject *v = PyDict_GetItemString(d, f->key); /* borrowed */
    if (!v) {
        if (required)
            PyErr_Format(PyExc_ValueError, "%s: missing key '%s'", what, f->key);
        return required ? -1 : 0;
    }
    char *p = (char *)base + f->off;
    if (f->type == F_DBL) {
        double x = PyFloat_AsDouble(v);
        if (x == -1 && PyErr_Occurred())
            return -1;
        *(double *)p = x;
        return 0;
    }
    if (!PyLong_Check(v) || PyBool_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s: '%s' must be an int, got %s", what, f->key, Py_TYPE(v)->tp_name);
        return -1;
    }
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (f->type == F_INT) {
        if (x < -2147483647LL || x > 2147483647LL) {
            PyErr_Format(PyExc_ValueError, "%s: '%s' = %lld is out of range", what, f->key, x);
            return -1;
        }
        *(int *)p = (int)x;
    } else {
        *(int64_t *)p = x;
    }
    return 0;
}

static PyObject *target_to_dict(const fuser_target *t)
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
        const char *name = PyUnicode_AsUTF8(obj);
        const fuser_target *b = name ? fuser_target_builtin(name) : NULL;
        if (!b) {
            if (name)
                PyErr_Format(PyExc_ValueError, "target: unknown target '%s'; expected one of %s or a dict", name,
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
    *t = *fuser_target_builtin("h200");
    PyObject *name = PyDict_GetItemString(obj, "name");
    if (name) {
        const char *s = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
        if (!s) {
            PyErr_SetString(PyExc_TypeError, "target: 'name' must be a str");
            return -1;
        }
        snprintf(t->name, sizeof t->name, "%.63s", s);
    }
    for (size_t i = 0; i < sizeof target_fields / sizeof target_fields[0]; i++)
        if (get_field(obj, t, &target_fields[i], "target", 0))
            return -1;
    const char *lists[2] = {"usable_sms", "dsm_bytes_per_clk"};
    for (int li = 0; li < 2; li++) {
        PyObject *v = PyDict_GetItemString(obj, lists[li]);
        if (!v)
            continue;
        PyObject *seq = PySequence_Fast(v, "target: expected a list of 5 numbers");
        if (!seq)
            return -1;
        int ok = PySequence_Fast_GET_SIZE(seq) == FUSER_NUM_CLUSTER_SIZES;
        for (int i = 0; ok && i < FUSER_NUM_CLUSTER_SIZES; i++) {
            PyObject *x = PySequence_Fast_GET_ITEM(seq, i);
            if (li == 0)
                t->usable_sms[i] = (int)PyLong_AsLong(x);
            else
                t->dsm_bytes_per_clk[i] = PyFloat_AsDouble(x);
            ok = !PyErr_Occurred();
        }
        Py_DECREF(seq);
        if (!ok) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "target: '%s' must list 5 values (cluster sizes 1..16)", lists[li]);
            return -1;
        }
    }
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
        PyErr_SetString(PyExc_TypeError, "chain: expected a dict");
        return -1;
    }
    static const field cf[] = {{"m", F_I64, offsetof(fuser_chain, m)}, {"d_model", F_I64, offsetof(fuser_chain, k)},
                               {"d_ff", F_I64, offsetof(fuser_chain, n)}, {"d_out", F_I64, offsetof(fuser_chain, l)}};
    for (size_t i = 0; i < 4; i++)
        if (get_field(d, c, &cf[i], "chain", 1))
            return -1;
    const char *flags[4] = {"gated", "bias_up", "bias_gate", "bias_down"};
    int *slots[4] = {&c->gated, &c->bias_up, &c->bias_gate, &c->bias_down};
    for (int i = 0; i < 4; i++) {
        PyObject *v = PyDict_GetItemString(d, flags[i]);
        int b = v ? PyObject_IsTrue(v) : 0;
        if (b < 0)
            return -1;
        *slots[i] = b;
    }
    PyObject *a = PyDict_GetItemString(d, "activation"), *t = PyDict_GetItemString(d, "dtype");
    const char *as = a && PyUnicode_Check(a) ? PyUnicode_AsUTF8(a) : NULL;
    const char *ts = t && PyUnicode_Check(t) ? PyUnicode_AsUTF8(t) : NULL;
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
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:O,s:s,s:O,s:O,s:O,s:s}", "m", (long long)c->m, "d_model",
                         (long long)c->k, "d_ff", (long long)c->n, "d_out", (long long)c->l, "gated",
                         c->gated ? Py_True : Py_False, "activation", fuser_act_name(c->act), "bias_up",
                         c->bias_up ? Py_True : Py_False, "bias_gate", c->bias_gate ? Py_True : Py_False,
                         "bias_down", c->bias_down ? Py_True : Py_False, "dtype", fuser_dtype_name(c->dtype));
}

/* ---- plans ---- */

static PyObject *plan_to_dict(const fuser_plan *p)
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
    if (!bad && p->fused) {
        PyObject *params = Py_BuildValue("{s:s,s:(iiii),s:i,s:i,s:i,s:i,s:i,s:s,s:s,s:i,s:i}", "kind",
                                         kind_names[p->kind], "cluster", p->cls_m, p->cls_n, p->cls_k, p->cls_l, "bm",
                                         p->bm, "bn", p->bn, "bl", p->bl, "n_iters", p->n_iters, "stages", p->stages,
                                         "order", order_names[p->order], "gate_mode", gate_names[p->gate_mode], "s1",
                                         p->s1, "s2", p->s2);
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
    PyObject *fused = PyDict_GetItemString(d, "fused");
    int f = fused ? PyObject_IsTrue(fused) : 0;
    if (f < 0)
        return -1;
    p->fused = f;
    if (f) {
        PyObject *pd = PyDict_GetItemString(d, "params");
        if (!pd || !PyDict_Check(pd)) {
            PyErr_SetString(PyExc_ValueError, "plan: a fused plan needs a 'params' dict");
            return -1;
        }
        PyObject *cl = PyDict_GetItemString(pd, "cluster");
        PyObject *seq = cl ? PySequence_Fast(cl, "plan: 'cluster' must be a sequence of 4 ints") : NULL;
        if (!seq) {
            if (!cl)
                PyErr_SetString(PyExc_ValueError, "plan: missing 'cluster'");
            return -1;
        }
        int *dims[4] = {&p->cls_m, &p->cls_n, &p->cls_k, &p->cls_l};
        int ok = PySequence_Fast_GET_SIZE(seq) == 4;
        for (int i = 0; ok && i < 4; i++) {
            PyObject *v = PySequence_Fast_GET_ITEM(seq, i);
            ok = PyLong_Check(v) && !PyBool_Check(v);
            *dims[i] = ok ? (int)PyLong_AsLong(v) : 0;
            ok = ok && !PyErr_Occurred();
        }
        Py_DECREF(seq);
        if (!ok) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "plan: 'cluster' must be 4 ints (cls_m, cls_n, cls_k, cls_l)");
            return -1;
        }
        static const field pf[] = {PF(bm), PF(bn), PF(bl), PF(n_iters), PF(stages)};
        for (size_t i = 0; i < sizeof pf / sizeof pf[0]; i++)
            if (get_field(pd, p, &pf[i], "plan params", 1))
                return -1;
        PyObject *o = PyDict_GetItemString(pd, "order"), *g = PyDict_GetItemString(pd, "gate_mode");
        int oi = name_index(order_names, 2, o && PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL);
        int gi = name_index(gate_names, 3, g && PyUnicode_Check(g) ? PyUnicode_AsUTF8(g) : NULL);
        if (oi < 0 || gi < 0) {
            PyErr_SetString(PyExc_ValueError, "plan: 'order' must be n_outer or l_outer and 'gate_mode' none, "
                                              "spatial or sequential");
            return -1;
        }
        p->order = (fuser_order)oi;
        p->gate_mode = (fuser_gate_mode)gi;
        /* the kernel family and the stream kernel's splits (absent: the cluster kernel, no splits) */
        PyObject *kd = PyDict_GetItemString(pd, "kind");
        int ki = kd ? name_index(kind_names, 2, PyUnicode_Check(kd) ? PyUnicode_AsUTF8(kd) : NULL) : 0;
        if (ki < 0) {
            PyErr_Format(PyExc_ValueError, "plan: 'kind' must be 'cluster' or 'stream', got %R", kd);
            return -1;
        }
        p->kind = (fuser_kind)ki;
        p->s1 = p->s2 = 1;
        static const field sf[] = {PF(s1), PF(s2)};
        for (size_t i = 0; i < sizeof sf / sizeof sf[0]; i++)
            if (get_field(pd, p, &sf[i], "plan params", 0))
                return -1;
    }
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

/* search(chain, target, k=1, constraints=None) -> (list of plan dicts, stats dict) */
PyObject *fuser_py_search(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"chain", "target", "k", "constraints", NULL};
    PyObject *cd, *td, *cons_d = Py_None;
    int k = 1;
    (void)module;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|iO:search", kwlist, &cd, &td, &k, &cons_d))
        return NULL;
    fuser_chain c;
    fuser_target t;
    if (chain_from_dict(cd, &c) || fuser_target_from_obj(td, &t))
        return NULL;
    fuser_constraints cons;
    fuser_constraints_init(&cons);
    if (cons_d != Py_None) {
        if (!PyDict_Check(cons_d))
            return PyErr_Format(PyExc_TypeError, "constraints: expected a dict");
        static const field cf[] = {
            {"cls_m", F_INT, offsetof(fuser_constraints, cls_m)}, {"cls_n", F_INT, offsetof(fuser_constraints, cls_n)},
            {"cls_k", F_INT, offsetof(fuser_constraints, cls_k)}, {"cls_l", F_INT, offsetof(fuser_constraints, cls_l)},
            {"bm", F_INT, offsetof(fuser_constraints, bm)}, {"bn", F_INT, offsetof(fuser_constraints, bn)},
            {"bl", F_INT, offsetof(fuser_constraints, bl)}, {"n_iters", F_INT, offsetof(fuser_constraints, n_iters)},
            {"stages", F_INT, offsetof(fuser_constraints, stages)}, {"fused", F_INT, offsetof(fuser_constraints, fused)},
            {"s1", F_INT, offsetof(fuser_constraints, s1)}, {"s2", F_INT, offsetof(fuser_constraints, s2)},
            {"dataflows_all", F_INT, offsetof(fuser_constraints, dataflows_all)},
            {"dataflows_none", F_INT, offsetof(fuser_constraints, dataflows_none)},
        };
        for (size_t i = 0; i < sizeof cf / sizeof cf[0]; i++)
            if (get_field(cons_d, &cons, &cf[i], "constraints", 0))
                return NULL;
        PyObject *o = PyDict_GetItemString(cons_d, "order"), *g = PyDict_GetItemString(cons_d, "gate_mode");
        PyObject *kd = PyDict_GetItemString(cons_d, "kind");
        if (kd && kd != Py_None) {
            cons.kind = name_index(kind_names, 2, PyUnicode_Check(kd) ? PyUnicode_AsUTF8(kd) : NULL);
            if (cons.kind < 0)
                return PyErr_Format(PyExc_ValueError, "kind: expected 'cluster' or 'stream', got %R", kd);
        }
        if (o && o != Py_None) {
            cons.order = name_index(order_names, 2, PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL);
            if (cons.order < 0)
                return PyErr_Format(PyExc_ValueError, "order: expected 'n_outer' or 'l_outer', got %R", o);
        }
        if (g && g != Py_None) {
            cons.gate_mode = name_index(gate_names, 3, PyUnicode_Check(g) ? PyUnicode_AsUTF8(g) : NULL);
            if (cons.gate_mode < 0)
                return PyErr_Format(PyExc_ValueError, "gate_mode: expected 'spatial' or 'sequential', got %R", g);
        }
    }
    if (k < 1 || k > 64)
        return PyErr_Format(PyExc_ValueError, "k must be in [1, 64], got %d", k);
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
        PyObject *pd = plan_to_dict(&out[i]);
        if (!pd)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, pd);
    }
    for (int r = 0; pruned && r < fuser_num_rules; r++) {
        PyObject *v = PyLong_FromLongLong(st.pruned[r]);
        if (!v || PyDict_SetItemString(pruned, fuser_rules[r].name, v))
            Py_CLEAR(pruned);
        Py_XDECREF(v);
    }
    PyObject *td_out = target_to_dict(&t);
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

/* derive(plan, target) -> plan dict: validate a plan (from JSON, say), re-derive and re-cost it. */
PyObject *fuser_py_derive(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"plan", "target", NULL};
    PyObject *pd, *td;
    (void)module;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:derive", kwlist, &pd, &td))
        return NULL;
    fuser_target t;
    fuser_plan p;
    if (fuser_target_from_obj(td, &t) || fuser_plan_from_dict(pd, &t, &p))
        return NULL;
    return plan_to_dict(&p);
}

/* targets() -> dict name -> target dict (the built-ins). target_for_device(props) -> target dict. */
PyObject *fuser_py_targets(PyObject *module, PyObject *noargs)
{
    (void)module;
    (void)noargs;
    PyObject *d = PyDict_New();
    const char *names[] = {"h200", "h100"};
    for (int i = 0; d && i < 2; i++) {
        PyObject *t = target_to_dict(fuser_target_builtin(names[i]));
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
    return target_to_dict(&t);
}

PyObject *fuser_py_rules(PyObject *module, PyObject *noargs)
{
    static const char *const levels[] = {"chain", "shape", "bm", "bn", "n_iters", "bl", "full"};
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
    if (fuser_target_from_obj(td, &t) || fuser_plan_from_dict(pd, &t, &p))
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
    if (fuser_target_from_obj(td, &t) || fuser_plan_from_dict(pd, &t, &p))
        return NULL;
    char buf[8192];
    fuser_err err;
    fuser_err_clear(&err);
    if (fuser_codegen(&p, buf, sizeof buf, &err))
        return fuser_raise(fuser_get_state(module), &err);
    return PyUnicode_FromString(buf);
}
