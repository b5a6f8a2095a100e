/* eager_bind.c: the eager route's PyTorch ops called from C, so that a call that runs them (fuser.ffn, and
 * FusedFFN's kept eager route with its checks: kept_bind.c) crosses into C once instead of running two Python
 * frames of plumbing around the ops. The ops are the ones fuser.reference.eager calls, in the same order with
 * the same arguments, so the results are bitwise the same and autograd records the same graph, except where no
 * autograd records them and the same values come from fewer steps: a gated chain's activation and product as one
 * gate kernel (gate_bind.c), gate and up weights of one memory as one GEMM, a plain chain's activation in place or
 * in the up GEMM's epilogue (one rounding fewer). */
#include "binding.h"

#include <limits.h>
#include <string.h>

/* pk[2]'s bits: the gate's weight comes first in the packed tensor; the packed tensor is a detached view, so it
 * serves only calls that autograd does not record through the separate weights. */
enum { PK_GATE_FIRST = 1, PK_NO_AUTOGRAD = 2 };

/* The gate step of a packed chain: linear(x, packed, packed_bias), one GEMM for the gate and up projections
 * (pk: packed, packed_bias, its PK_* bits), whose result's two halves are g and u; act(g) * u in place of
 * g by the gate kernel where it applies, else by the two ops. The product (a view of the GEMM's result: its
 * rows are 2 d_ff apart), NULL with an exception set. */
static PyObject *packed_gate(fuser_state *st, PyObject *linear, PyObject *act, PyObject *x, PyObject *const *pk)
{
    PyObject *a[3] = {x, pk[0], pk[1]};
    PyObject *both = PyObject_Vectorcall(linear, a, 3, NULL);
    if (!both)
        return NULL;
    PyObject *chunk[3] = {both, PyLong_FromLong(2), PyLong_FromLong(-1)};
    PyObject *halves = chunk[1] && chunk[2] ? PyObject_VectorcallMethod(PyTuple_GET_ITEM(st->kept_names, KN_CHUNK), chunk, 3, NULL) : NULL;
    Py_XDECREF(chunk[1]);
    Py_XDECREF(chunk[2]);
    Py_DECREF(both);
    if (!halves)
        return NULL;
    if (!PyTuple_Check(halves) || PyTuple_GET_SIZE(halves) != 2) {
        Py_DECREF(halves);
        return PyErr_Format(PyExc_RuntimeError, "eager: chunk(2, -1) of the gate-and-up GEMM gave no two halves");
    }
    const int first = (PyLong_AsLong(pk[2]) & PK_GATE_FIRST) != 0;
    PyObject *g = PyTuple_GET_ITEM(halves, first ? 0 : 1), *u = PyTuple_GET_ITEM(halves, first ? 1 : 0), *out;
    const int gated = fuser_gate_try(st, act, g, u);
    if (gated > 0) {
        out = Py_NewRef(g);
    } else if (gated < 0) {
        out = NULL;
    } else {
        PyObject *ga = PyObject_CallOneArg(act, g);
        out = ga ? PyNumber_Multiply(ga, u) : NULL;
        Py_XDECREF(ga);
    }
    Py_DECREF(halves);
    return out;
}

/* 1 where a gated chain's gate step runs packed (pk[0], see packed_gate): a packed tensor given, and where it
 * is a detached view, no autograd to record through the separate weights t (w_gate, b_up, b_gate, w_up: t[3],
 * t[4], t[5], t[1]); 0 where not, -1 with an exception set. */
static int runs_packed(PyObject *const *t, PyObject *const *pk)
{
    if (!pk || pk[0] == Py_None || t[3] == Py_None)
        return 0;
    const long bits = PyLong_AsLong(pk[2]);
    if (bits == -1 && PyErr_Occurred())
        return -1;
    if (!(bits & PK_NO_AUTOGRAD))
        return 1;
    PyObject *w[4] = {t[1], t[3], t[4], t[5]};
    const int rec = fuser_gate_records(w, 4);
    return rec < 0 ? -1 : !rec;
}

/* obj described through the exchange API as a compact tensor into t (h: released by the caller); 0 where not. */
static int compact(fuser_state *st, PyObject *obj, fuser_tensor *t, fuser_held *h)
{
    DLTensor dl;
    fuser_err err;
    return fuser_exchange_describe(st, obj, &dl, h) && fuser_tensor_from_dl(&dl, "w", t, &err) == FUSER_OK;
}

/* The PK_GATE_FIRST bit where the compact tensors a and b (gate, up; or their biases) are the two halves of
 * base's memory, in either order (0: gate second), or -1 where they are not. */
static int halves_of(const fuser_tensor *base, const fuser_tensor *a, const fuser_tensor *b)
{
    if (a->dtype != base->dtype || b->dtype != base->dtype || a->ndim != base->ndim || b->ndim != base->ndim ||
        a->numel != b->numel || base->numel != 2 * a->numel || base->shape[0] != 2 * a->shape[0] ||
        memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) ||
        memcmp(a->shape + 1, base->shape + 1, sizeof(int64_t) * (size_t)(a->ndim - 1)))
        return -1;
    const char *lo = base->data, *hi = lo + a->nbytes;
    if (a->data == lo && b->data == hi)
        return PK_GATE_FIRST;
    return b->data == lo && a->data == hi ? 0 : -1;
}

/* Where the gate and up weights (t[3], t[1]) are the two row halves of one tensor, their `_base` (and their
 * biases t[5], t[4] of one other, or both absent), each of the same requires_grad as its halves so that
 * autograd records through it what it would through them: pk filled with new references to that base, the
 * biases' base (or None) and the PK_GATE_FIRST bit as an int; 1. 0 where not (nothing set), -1 with an
 * exception set. */
static int base_pack(fuser_state *st, PyObject *const *t, PyObject **pk)
{
    if (t[3] == Py_None || (t[5] == Py_None) != (t[4] == Py_None))
        return 0;
    PyObject *name = PyTuple_GET_ITEM(st->kept_names, KN_BASE), *base[2] = {NULL, NULL};
    int rc = 0, bits = -1;
    for (int i = 0; i < 2; i++) {
        PyObject *g = t[i ? 5 : 3], *u = t[i ? 4 : 1];
        if (g == Py_None)
            break;
        PyObject *bg = PyObject_GetAttr(g, name), *bu = bg && bg != Py_None ? PyObject_GetAttr(u, name) : NULL;
        const int same = bg && bu && bg == bu;
        Py_XDECREF(bu);
        if (!same) {
            Py_XDECREF(bg);
            rc = PyErr_Occurred() ? -1 : 0;
            goto out;
        }
        base[i] = bg;
        PyObject *rg = PyObject_GetAttr(bg, PyTuple_GET_ITEM(st->kept_names, KN_REQUIRES_GRAD));
        Py_XDECREF(rg);
        if (!rg || !fuser_attr_is(g, PyTuple_GET_ITEM(st->kept_names, KN_REQUIRES_GRAD), rg) ||
            !fuser_attr_is(u, PyTuple_GET_ITEM(st->kept_names, KN_REQUIRES_GRAD), rg)) {
            rc = rg ? 0 : -1;
            goto out;
        }
        fuser_held h[3];
        memset(h, 0, sizeof h);
        fuser_tensor tb, tg, tu;
        const int ok = compact(st, bg, &tb, &h[0]) && compact(st, g, &tg, &h[1]) && compact(st, u, &tu, &h[2]);
        const int first = ok ? halves_of(&tb, &tg, &tu) : -1;
        for (int j = 0; j < 3; j++)
            fuser_release(&h[j]);
        if (first < 0 || (i && first != bits))
            goto out;
        bits = first;
    }
    pk[0] = base[0];
    pk[1] = base[1] ? base[1] : Py_NewRef(Py_None);
    pk[2] = PyLong_FromLong(bits);
    if (!pk[2]) {
        Py_DECREF(pk[0]);
        Py_DECREF(pk[1]);
        return -1;
    }
    return 1;
out:
    Py_XDECREF(base[0]);
    Py_XDECREF(base[1]);
    return rc;
}

static PyObject *down(fuser_state *st, PyObject *linear, PyObject *const *c, PyObject *out, PyObject *lead);

/* Zero biases, for a plain chain without b_up whose activation goes into the up GEMM's epilogue all the same:
 * torch._addmm_activation takes the epilogue only with a bias, and adding zeros changes no value. One per
 * (device kind and index, dtype, d_ff), made by the registered maker (zero_bias_setup: None while the caller's
 * stream captures a graph, whose private pool the tensor would live in) and kept for the process, so that a
 * graph which captured a call reads it at every replay. `zb_min_tokens`: the fewest token rows that take it (0:
 * none; torch runs _addmm_activation through cuBLASLt from 2 rows, and below copies the bias into the result
 * first, a kernel the ops do not have). The GIL guards the table. */
#define ZERO_BIASES 64
static struct {
    fuser_device_kind kind;
    int device;
    fuser_dtype dtype;
    int64_t n;
    PyObject *t;
} zb[ZERO_BIASES];
static int zb_count, zb_min_tokens;
static PyObject *zb_make;

/* The zero bias for w_up (borrowed: kept in zb), Py_None where there is none to take (the maker gave None,
 * the table is full, w_up is not a compact tensor), NULL with an exception set. */
static PyObject *zero_bias(fuser_state *st, PyObject *w_up)
{
    fuser_held h;
    memset(&h, 0, sizeof h);
    fuser_tensor w;
    const int ok = compact(st, w_up, &w, &h) && w.ndim == 2;
    fuser_release(&h);
    if (!ok || !zb_make)
        return Py_None;
    for (int i = 0; i < zb_count; i++)
        if (zb[i].kind == w.device && zb[i].device == w.device_id && zb[i].dtype == w.dtype && zb[i].n == w.shape[0])
            return zb[i].t;
    if (zb_count == ZERO_BIASES)
        return Py_None;
    PyObject *z = PyObject_CallOneArg(zb_make, w_up);
    if (!z || z == Py_None) {
        Py_XDECREF(z);
        return z ? Py_None : NULL;
    }
    zb[zb_count].kind = w.device;
    zb[zb_count].device = w.device_id;
    zb[zb_count].dtype = w.dtype;
    zb[zb_count].n = w.shape[0];
    zb[zb_count++].t = z;
    return z;
}

/* The token rows of a tensor of shape `shape` (a tuple of ints): the product of all but the last; -1 with an
 * exception set. */
static int64_t rows_of(PyObject *shape)
{
    int64_t rows = 1;
    for (Py_ssize_t i = 0; i + 1 < PyTuple_GET_SIZE(shape); i++) {
        const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        if (v == -1 && PyErr_Occurred())
            return -1;
        rows *= v;
    }
    return rows;
}

/* A plain chain's whole FFN with its up projection, bias and activation as one cuBLASLt GEMM with an epilogue
 * (torch._addmm_activation: ReLU, or GELU in its tanh form, on the fp32 sums plus the bias, rounded once), then
 * the down projection: one launch and two passes of H fewer than linear and the activation. Where it applies
 * (act ReLU or tanh GELU, a bias or a zero bias in its place (zero_bias, from zb_min_tokens rows), the
 * addmm_activation torch has, fuser_eager_may_fuse: no autograd, for which that op has no derivative), y (`dst`
 * where down_into wrote it there; dst NULL or None: a new tensor); else Py_None (new references), NULL with an
 * exception set. */
static PyObject *lt_ffn(fuser_state *st, PyObject *linear, PyObject *act, PyObject *const *t, PyObject *dst)
{
    const int a = fuser_act_index(act);
    PyObject *op = fuser_addmm_activation();
    if ((a != FUSER_ACT_RELU && a != FUSER_ACT_GELU_TANH) || (t[4] == Py_None && !zb_min_tokens) || !op)
        return Py_NewRef(Py_None);
    PyObject *w[2] = {t[1], t[4]};
    const int ok = fuser_eager_may_fuse(t[0], w, 2);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *const *kn = &PyTuple_GET_ITEM(st->kept_names, 0);
    PyObject *shape = PyObject_GetAttr(t[0], kn[KN_SHAPE]);
    if (!shape)
        return NULL;
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) < 1) {
        Py_DECREF(shape);
        return Py_NewRef(Py_None);
    }
    PyObject *bias = t[4];
    if (bias == Py_None) {
        const int64_t rows = rows_of(shape);
        bias = rows < 0 ? NULL : rows < zb_min_tokens ? Py_None : zero_bias(st, t[1]);
        if (bias == Py_None || !bias) {
            Py_DECREF(shape);
            return bias ? Py_NewRef(Py_None) : NULL;
        }
    }
    Py_INCREF(bias);
    const Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    PyObject *x2 = NULL, *wt = NULL, *h = NULL, *y = NULL, *out = NULL;
    PyObject *flat[3] = {t[0], PyLong_FromLong(-1), PyTuple_GET_ITEM(shape, nd - 1)};
    if (!flat[1])
        goto done;
    x2 = nd == 2 ? Py_NewRef(t[0]) : PyObject_VectorcallMethod(kn[KN_RESHAPE], flat, 3, NULL);
    PyObject *tw[1] = {t[1]};
    wt = x2 ? PyObject_VectorcallMethod(kn[KN_T], tw, 1, NULL) : NULL;
    if (!wt)
        goto done;
    static PyObject *kwnames; /* ("use_gelu",), made once */
    if (!kwnames)
        kwnames = PyTuple_Pack(1, kn[KN_USE_GELU]);
    PyObject *args[4] = {bias, x2, wt, a == FUSER_ACT_GELU_TANH ? Py_True : Py_False};
    h = kwnames ? PyObject_Vectorcall(op, args, 3, kwnames) : NULL;
    PyObject *c[3] = {h, t[2], t[6]};
    y = h ? down(st, linear, c, dst, shape) : NULL;
    if (!y || nd == 2 || (dst && y == dst)) {
        out = y;
        y = NULL;
        goto done;
    }
    PyObject *v[FUSER_MAX_DIMS + 1];
    if (nd > FUSER_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "eager: x has %zd dimensions, at most %d", nd, FUSER_MAX_DIMS);
        goto done;
    }
    PyObject *yshape = PyObject_GetAttr(y, kn[KN_SHAPE]);   /* (the output's width: -1 cannot size no tokens) */
    if (!yshape)
        goto done;
    if (!PyTuple_Check(yshape) || PyTuple_GET_SIZE(yshape) != 2) {
        Py_DECREF(yshape);
        PyErr_SetString(PyExc_RuntimeError, "eager: the down projection's output is not two-dimensional");
        goto done;
    }
    v[0] = y;
    for (Py_ssize_t i = 0; i < nd - 1; i++)
        v[i + 1] = PyTuple_GET_ITEM(shape, i);
    v[nd] = PyTuple_GET_ITEM(yshape, 1);
    out = PyObject_VectorcallMethod(kn[KN_VIEW], v, (size_t)nd + 1, NULL);
    Py_DECREF(yshape);
done:
    Py_XDECREF(flat[1]);
    Py_XDECREF(x2);
    Py_XDECREF(wt);
    Py_XDECREF(h);
    Py_XDECREF(y);
    Py_DECREF(bias);
    Py_DECREF(shape);
    return out;
}

/* zero_bias_setup(make, min_tokens) -> (make, min_tokens) as they were: make(w_up) -> a zero bias of w_up's rows
 * (dtype and device) or None; min_tokens 0 (none) or at least 2. The biases made so far stay (graphs may read
 * them), and are taken before make is asked for another. */
PyObject *fuser_py_zero_bias_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    const long n = nargs == 2 && PyLong_Check(args[1]) ? PyLong_AsLong(args[1]) : -1;
    if (nargs != 2 || (args[0] != Py_None && !PyCallable_Check(args[0])) || !PyLong_Check(args[1]))
        return PyErr_Format(PyExc_TypeError, "zero_bias_setup(make: callable or None, min_tokens: int)");
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0 || n == 1 || n > INT_MAX)
        return PyErr_Format(PyExc_ValueError, "zero_bias_setup: min_tokens must be 0 (never) or at least 2 (torch "
                                              "runs one token row without cuBLASLt's epilogue), got %ld", n);
    PyObject *was = Py_BuildValue("(Oi)", zb_make ? zb_make : Py_None, zb_min_tokens);
    if (!was)
        return NULL;
    Py_XSETREF(zb_make, args[0] == Py_None ? NULL : Py_NewRef(args[0]));
    zb_min_tokens = (int)n;
    return was;
}

/* zero_bias(w_up) -> the zero bias kept for w_up's rows, dtype and device, made now where there is none yet (by the
 * registered maker: None while the caller's stream captures a graph), or None where there is none to take. For a
 * route whose graphs run the eager ops but whose calls outside graphs do not (a host-bound route): a capture
 * cannot make the bias, so the route makes it when it is decided. */
PyObject *fuser_py_zero_bias(PyObject *module, PyObject *w_up)
{
    PyObject *z = zero_bias(fuser_get_state(module), w_up);
    return z ? Py_NewRef(z) : NULL;
}

/* zero_bias_info() -> {"min_tokens": n, "kept": the zero biases made} */
PyObject *fuser_py_zero_bias_info(PyObject *module, PyObject *noargs)
{
    (void)module, (void)noargs;
    return Py_BuildValue("{s:i,s:i}", "min_tokens", zb_min_tokens, "kept", zb_count);
}

/* linear(g, w, b) written into `out` by linear's own out= form, where that gives linear's result bit for bit:
 * `linear` is the registered torch.nn.functional.linear, no autograd records the call and no torch mode watches,
 * g and out compact with out [..., d_out] over g's rows, g of at least 2 dimensions (the out= form resizes a 1-D
 * out), and with a bias at most 3 (linear runs a 3-D input with a bias as one addmm over its rows, its out= form
 * as a matmul and an add, so that input is passed as its 2-D view; inputs of more dimensions with a bias run as
 * one addmm on some torch versions and as a matmul and an add on others). `lead`: NULL, or the shape (a tuple)
 * of the input whose rows a 2-D g holds (lt_ffn flattens x): then out [..., d_out] over that shape's leading
 * dimensions is filled through its 2-D view. Then out (new reference); Py_None (new reference) where not; NULL
 * with an exception set. */
static PyObject *down_into(fuser_state *st, PyObject *linear, PyObject *g, PyObject *w, PyObject *b, PyObject *out,
                           PyObject *lead)
{
    PyObject *reg = fuser_down_out_linear();
    if (!reg || linear != reg)
        return Py_NewRef(Py_None);
    PyObject *ts[3] = {g, w, b};
    int ok = fuser_gate_records(ts, 3);
    ok = ok == 0 ? fuser_no_mode() : ok < 0 ? -1 : 0;
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    fuser_held h[2];
    memset(h, 0, sizeof h);
    fuser_tensor tg, to;
    const int both = compact(st, g, &tg, &h[0]) && compact(st, out, &to, &h[1]) && tg.ndim >= 2 &&
                     tg.dtype == to.dtype && (b == Py_None || tg.ndim <= 3);
    const int same = both && to.ndim == tg.ndim &&
                     memcmp(tg.shape, to.shape, sizeof(int64_t) * (size_t)(tg.ndim - 1)) == 0;
    int over_lead = both && !same && lead && tg.ndim == 2 && PyTuple_Check(lead) &&
                    PyTuple_GET_SIZE(lead) == to.ndim;
    int64_t rows = 1;
    for (int i = 0; over_lead && i + 1 < to.ndim; i++) {
        const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(lead, i));
        if (v == -1 && PyErr_Occurred()) {
            fuser_release(&h[0]);
            fuser_release(&h[1]);
            return NULL;
        }
        over_lead = v == to.shape[i];
        rows *= v;
    }
    const int fits = same || (over_lead && rows == tg.shape[0]);
    const int flat = fits && (!same || (b != Py_None && tg.ndim == 3));
    const int64_t n = fits ? tg.shape[tg.ndim - 1] : 0, l = fits ? to.shape[to.ndim - 1] : 0;
    fuser_release(&h[0]);
    fuser_release(&h[1]);
    if (!fits)
        return Py_NewRef(Py_None);
    static PyObject *out_name; /* ("out",), made once */
    if (!out_name && !(out_name = Py_BuildValue("(s)", "out")))
        return NULL;
    PyObject *g2 = Py_NewRef(g), *o2 = Py_NewRef(out);
    if (flat) {
        PyObject *const *kn = &PyTuple_GET_ITEM(st->kept_names, 0);
        PyObject *minus = PyLong_FromLong(-1), *nn = PyLong_FromLongLong(n), *ll = PyLong_FromLongLong(l);
        PyObject *vg[3] = {g, minus, nn}, *vo[3] = {out, minus, ll};
        Py_SETREF(g2, minus && nn && ll ? PyObject_VectorcallMethod(kn[KN_VIEW], vg, 3, NULL) : NULL);
        Py_SETREF(o2, g2 ? PyObject_VectorcallMethod(kn[KN_VIEW], vo, 3, NULL) : NULL);
        Py_XDECREF(minus);
        Py_XDECREF(nn);
        Py_XDECREF(ll);
    }
    PyObject *a[4] = {g2, w, b, o2};
    PyObject *r = g2 && o2 ? PyObject_Vectorcall(linear, a, 3, out_name) : NULL;
    Py_XDECREF(g2);
    Py_XDECREF(o2);
    if (!r)
        return NULL;
    Py_DECREF(r);
    return Py_NewRef(out);
}

/* linear(g, w_down, b_down) (c: g, w_down, b_down), into `out` where down_into can (out: NULL or None for a new
 * tensor; lead as down_into's): y (out where written there), or NULL with an exception set. */
static PyObject *down(fuser_state *st, PyObject *linear, PyObject *const *c, PyObject *out, PyObject *lead)
{
    if (out && out != Py_None) {
        PyObject *y = down_into(st, linear, c[0], c[1], c[2], out, lead);
        if (y != Py_None)
            return y;
        Py_DECREF(y);
    }
    return PyObject_Vectorcall(linear, c, 3, NULL);
}

/* linear(x, w_up, b_up); with w_gate act(linear(x, w_gate, b_gate)) * that, else act(that); then
 * linear(h, w_down, b_down). t: x, w_up, w_down, w_gate, b_up, b_gate, b_down (None where absent). A plain
 * chain's up projection and activation run as one GEMM with an epilogue where lt_ffn applies, else its
 * activation in place of the GEMM's result where fuser_act_in_place applies (one allocation fewer); the gate
 * step runs as fuser's gate kernel where it applies (fuser_gate_try: the same values, one kernel instead of
 * two, in place of the gate GEMM's result), else as the two ops. pk (or NULL): the gate and up weights as one
 * tensor, its bias and PK_* bits, for one GEMM in place of the gate's and up's where runs_packed says so. out
 * (NULL or None: none): a tensor the down projection writes into where down_into can, which is then returned. */
static PyObject *run_eager(fuser_state *st, PyObject *linear, PyObject *act, PyObject *const *t, PyObject *const *pk,
                           PyObject *out)
{
    PyObject *g;
    if (t[3] == Py_None) {
        PyObject *y = lt_ffn(st, linear, act, t, out);
        if (y != Py_None)
            return y;
        Py_DECREF(y);
    }
    const int packed = runs_packed(t, pk);
    if (packed < 0)
        return NULL;
    if (packed) {
        g = packed_gate(st, linear, act, t[0], pk);
    } else {
        PyObject *a[3] = {t[0], t[1], t[4]};
        PyObject *h = PyObject_Vectorcall(linear, a, 3, NULL);
        if (!h)
            return NULL;
        if (t[3] != Py_None) {
            PyObject *b[3] = {t[0], t[3], t[5]};
            PyObject *pre = PyObject_Vectorcall(linear, b, 3, NULL);
            const int gated = pre ? fuser_gate_try(st, act, pre, h) : -1;
            if (gated) {
                g = gated > 0 ? pre : NULL;
                if (gated < 0)
                    Py_XDECREF(pre);
            } else {
                PyObject *ga = PyObject_CallOneArg(act, pre);
                Py_DECREF(pre);
                g = ga ? PyNumber_Multiply(ga, h) : NULL;
                Py_XDECREF(ga);
            }
        } else {
            g = fuser_act_in_place(act, h);
            if (g == Py_None) {
                Py_DECREF(g);
                g = PyObject_CallOneArg(act, h);
            }
        }
        Py_DECREF(h);
    }
    if (!g)
        return NULL;
    PyObject *c[3] = {g, t[2], t[6]};
    PyObject *y = down(st, linear, c, out, NULL);
    Py_DECREF(g);
    return y;
}

/* eager(linear, act, x, w_up, w_down, w_gate, b_up, b_gate, b_down[, packed, packed_bias, pack][, out]) -> y;
 * without `packed`, gate and up weights that are the two row halves of one tensor are packed as that tensor;
 * with `out` (a tensor or None), y is `out` where the down projection could write there (down_into), else a new
 * tensor for the caller to copy */
PyObject *fuser_py_eager(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9 && nargs != 10 && nargs != 12 && nargs != 13)
        return PyErr_Format(PyExc_TypeError,
                            "eager(linear, act, x, w_up, w_down, w_gate, b_up, b_gate, b_down[, packed, packed_bias, "
                            "pack][, out]): 9, 10, 12 or 13 arguments, got %zd", nargs);
    if (nargs >= 12 && args[9] != Py_None && !PyLong_Check(args[11]))
        return PyErr_Format(PyExc_TypeError, "eager: pack must be an int (1: gate first, 2: no autograd), got %s",
                            Py_TYPE(args[11])->tp_name);
    fuser_state *st = fuser_get_state(module);
    PyObject *out = nargs == 10 || nargs == 13 ? args[nargs - 1] : NULL;
    if (nargs >= 12)
        return run_eager(st, args[0], args[1], args + 2, args + 9, out);
    return fuser_eager_call(st, args[0], args[1], args + 2, out);
}

/* (binding.h) */
PyObject *fuser_eager_call(fuser_state *st, PyObject *linear, PyObject *act, PyObject *const *t, PyObject *out)
{
    PyObject *pk[3];
    const int packed = base_pack(st, t, pk);
    if (packed <= 0)
        return packed < 0 ? NULL : run_eager(st, linear, act, t, NULL, out);
    PyObject *y = run_eager(st, linear, act, t, pk, out);
    for (int i = 0; i < 3; i++)
        Py_DECREF(pk[i]);
    return y;
}

/* (binding.h) */
int fuser_attr_is(PyObject *obj, PyObject *name, PyObject *want)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (!v) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(v);
    return v == want;
}

/* (binding.h) */
PyObject *fuser_eager_run(fuser_state *st, PyObject *linear, PyObject *act, PyObject *const *t, PyObject *const *pk)
{
    return run_eager(st, linear, act, t, pk, NULL);
}
