/* ffn_bind.c: _C.ffn_check: fuser.ffn's arguments, taken in through DLPack and validated by the core.
 * Every tensor taken is released exactly once, on success and on every error path. A raw capsule is
 * refused (it could be read only once) unless its bit in `capsules` says fuser.ffn exported it itself
 * (torch tensors, exported without __dlpack__'s Python overhead): those are only borrowed, so the
 * fused route launches with the same capsules instead of exporting again. */
#include "binding.h"

#include "fuser/chain.h"

enum { A_X, A_W_UP, A_W_DOWN, A_W_GATE, A_B_UP, A_B_GATE, A_B_DOWN, A_OUT, N_TENSOR_ARGS };
static const char *const tensor_names[N_TENSOR_ARGS] = {"x", "w_up", "w_down", "w_gate",
                                                        "b_up", "b_gate", "b_down", "out"};

/* The chain as a dict (what the Python layer needs to dispatch). */
static PyObject *chain_dict(const fuser_chain *c, const fuser_tensor *x)
{
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:O,s:s,s:O,s:O,s:O,s:s,s:O,s:s,s:i}", "m", (long long)c->m, "d_model",
                         (long long)c->k, "d_ff", (long long)c->n, "d_out", (long long)c->l, "gated",
                         c->gated ? Py_True : Py_False, "activation", fuser_act_name(c->act), "bias_up",
                         c->bias_up ? Py_True : Py_False, "bias_gate", c->bias_gate ? Py_True : Py_False,
                         "bias_down", c->bias_down ? Py_True : Py_False, "dtype", fuser_dtype_name(c->dtype),
                         "packed", c->packed ? Py_True : Py_False, "device", x->device == FUSER_CPU ? "cpu" : "cuda",
                         "device_id", x->device_id);
}

/* The activation argument's name (a str, exactly), or NULL with a TypeError/ValueError set. */
static const char *activation_name(PyObject *act_obj)
{
    if (!PyUnicode_Check(act_obj)) {
        PyErr_Format(PyExc_TypeError, "activation: expected a str (one of %s), got %s", fuser_act_choices(),
                     Py_TYPE(act_obj)->tp_name);
        return NULL;
    }
    return fuser_exact_str(act_obj, "activation", NULL);
}

/* Take obj[0 .. n) in (None: absent; opts[i] says how) and validate them as fuser.ffn's tensors: the chain
 * in *c, 0; or an exception set, -1. The caller releases held[0 .. n) either way. */
static int take_and_validate(fuser_state *st, PyObject *const *obj, int n, PyObject *stream, const int *opts,
                             const char *activation, fuser_held *held, const fuser_tensor **t, fuser_chain *c,
                             PyObject *scales, int scale_opts, unsigned scale_capsules, fuser_held *sheld)
{
    for (int i = 0; i < n; i++) {
        if (!obj[i] || obj[i] == Py_None)
            continue;
        if (fuser_take(st, obj[i], tensor_names[i], stream, opts[i], &held[i]))
            return -1;
        t[i] = &held[i].t;
    }
    fuser_ffn_args a = {t[A_X], t[A_W_UP], t[A_W_DOWN], t[A_W_GATE], t[A_B_UP], t[A_B_GATE], t[A_B_DOWN],
                        n > A_OUT ? t[A_OUT] : NULL, activation, {NULL}};
    if (sheld && fuser_take_scales(st, scales, stream, scale_opts, scale_capsules, sheld, a.scale))
        return -1;
    fuser_err err;
    fuser_err_clear(&err);
    if (fuser_ffn_validate(&a, c, &err)) {
        fuser_raise(st, &err);
        return -1;
    }
    return 0;
}

PyObject *fuser_py_ffn_check(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down",
                             "activation", "out", "stream", "capsules", "scales", NULL};
    PyObject *obj[N_TENSOR_ARGS] = {NULL};
    PyObject *act_obj = NULL, *stream = Py_None, *scales = Py_None;
    unsigned int capsules = 0; /* bit i: argument i may be a raw capsule (one fuser.ffn exported itself); bit
                                  8 + j: scale j likewise */
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|OOOOOOOIO:ffn_check", kwlist, &obj[A_X], &obj[A_W_UP],
                                     &obj[A_W_DOWN], &obj[A_W_GATE], &obj[A_B_UP], &obj[A_B_GATE],
                                     &obj[A_B_DOWN], &act_obj, &obj[A_OUT], &stream, &capsules, &scales))
        return NULL;
    /* None too is refused: the Python layer dispatches on the activation's name */
    const char *activation = act_obj ? activation_name(act_obj) : "gelu";
    if (!activation)
        return NULL;
    if (stream != Py_None && !PyLong_Check(stream))
        return PyErr_Format(PyExc_TypeError, "stream: expected None or an int (a cudaStream_t), got %s",
                            Py_TYPE(stream)->tp_name);

    fuser_state *st = fuser_get_state(module);
    fuser_held held[N_TENSOR_ARGS];
    const fuser_tensor *t[N_TENSOR_ARGS] = {NULL};
    memset(held, 0, sizeof held);
    int opts[N_TENSOR_ARGS];
    for (int i = 0; i < N_TENSOR_ARGS; i++)
        opts[i] = ((capsules >> i) & 1 ? FUSER_TAKE_BORROW : FUSER_TAKE_NO_CAPSULE) |
                  (i == A_OUT ? FUSER_TAKE_WRITABLE : 0);
    fuser_chain chain;
    fuser_held sheld[FUSER_NUM_SCALES];
    memset(sheld, 0, sizeof sheld);
    PyObject *res = take_and_validate(st, obj, N_TENSOR_ARGS, stream, opts, activation, held, t, &chain, scales,
                                      FUSER_TAKE_NO_CAPSULE, capsules >> 8, sheld)
                        ? NULL
                        : chain_dict(&chain, t[A_X]);
    for (int i = 0; i < N_TENSOR_ARGS; i++)
        fuser_release(&held[i]);
    for (int i = 0; i < FUSER_NUM_SCALES; i++)
        fuser_release(&sheld[i]);
    return res;
}

/* What route_key read of a call besides its key: the chain's FUSER_ACT_*, its token rows, and the addresses of
 * w_up, w_down and w_gate (NULL where absent). */
typedef struct {
    int act;
    int64_t m;
    void *w[3];
} call_seen;

static PyObject *route_key(fuser_state *st, PyObject *const *args, PyObject *out, PyObject *scales, call_seen *seen);

/* ffn_key(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation[, scales]) -> bytes: the per-call form of
 * ffn_check for fuser.ffn's kept routes. Each tensor is an instance of the registered tensor type
 * (torch.Tensor: described through its DLPack C exchange API, or exported by the registered exporter;
 * see exchange.c) or None; anything else, a raw capsule included, is a TypeError (fuser.ffn's general
 * path then judges the call). They are validated exactly as ffn_check validates them (the same
 * errors), and the result is what a call's route depends on, packed into 56 bytes to key a dict with:
 * the chain (m, d_model, d_ff, d_out; gated, the three biases, activation and dtype in one word) and the
 * device (kind, index), each an int64 in native byte order. A quantized chain's `scales` (x, up, gate,
 * down, h: registered-type tensors, or None for none) are validated with it; they are not in the key,
 * since a route depends on the chain only. No keywords and no dict: the cheapest call that validates. */
PyObject *fuser_py_ffn_key(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != A_OUT + 1 && nargs != A_OUT + 2)
        return PyErr_Format(PyExc_TypeError, "ffn_key(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation"
                            "[, scales]): got %zd arguments", nargs);
    return route_key(fuser_get_state(module), args, NULL, nargs == A_OUT + 2 ? args[A_OUT + 1] : Py_None, NULL);
}

/* The fields of a fused route's `fast` (fuser.route's FusedRoute): its CUDA device, its prepared launches (a dict
 * keyed by (raw stream, token rows, w_up, w_down, w_gate addresses), each (scratch, prepared launch)), the scratch
 * table (keyed by (device, raw stream)), whether y has x's shape, whether the route runs the eager ops while a
 * graph is captured, the function that runs a prepared launch (_C.ffn_run, as fuser.route holds it) and
 * torch.empty_like. */
enum { F_DEVICE, F_PREPARED, F_SCRATCHES, F_SAME_SHAPE, F_GRAPHS_EAGER, F_RUN, F_EMPTY_LIKE, F_FIELDS };

/* A kept fused route r's output for the validated call t (seen: what route_key read), launched here as
 * FusedRoute.run would launch it, where r's `fast` allows: y has x's shape, nothing for autograd to record,
 * FUSER_DISABLE unset, r's device current (and no capture on a route that runs the eager ops then), and a launch
 * prepared for the current stream, these token rows and weight addresses whose scratch is still the stream's.
 * y (new reference); Py_None where r.run must (prepare, or run the eager ops); NULL with an exception set. */
static PyObject *fused_run(fuser_state *st, PyObject *r, PyObject *const *t, const call_seen *seen)
{
    PyObject *fast = PyObject_GetAttr(r, PyTuple_GET_ITEM(st->kept_names, KN_FAST));
    if (!fast) {
        PyErr_Clear();
        return Py_NewRef(Py_None);
    }
    PyObject *const *k = PyTuple_Check(fast) && PyTuple_GET_SIZE(fast) == F_FIELDS ? &PyTuple_GET_ITEM(fast, 0)
                                                                                    : NULL;
    PyObject *y = NULL, *stream = NULL, *w[3] = {NULL, NULL, NULL}, *m = NULL, *key = NULL, *skey = NULL;
    int rec = 0;
    if (!k || k[F_SAME_SHAPE] != Py_True || !PyDict_Check(k[F_PREPARED]) || !PyDict_Check(k[F_SCRATCHES]) ||
        (rec = fuser_gate_records(t, A_OUT)) != 0) {
        y = rec < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    stream = fuser_route_stream(k[F_DEVICE], k[F_GRAPHS_EAGER] == Py_True);
    if (!stream || stream == Py_None) {
        y = stream ? Py_NewRef(Py_None) : NULL;
        goto done;
    }
    m = PyLong_FromLongLong(seen->m);
    for (int i = 0; i < 3; i++)
        w[i] = seen->w[i] ? PyLong_FromVoidPtr(seen->w[i]) : Py_NewRef(Py_None);
    key = m && w[0] && w[1] && w[2] ? PyTuple_Pack(5, stream, m, w[0], w[1], w[2]) : NULL;
    PyObject *e = key ? PyDict_GetItemWithError(k[F_PREPARED], key) : NULL;
    skey = e ? PyTuple_Pack(2, k[F_DEVICE], stream) : NULL;
    PyObject *scratch = skey ? PyDict_GetItemWithError(k[F_SCRATCHES], skey) : NULL;
    if (!scratch || !PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2 || PyTuple_GET_ITEM(e, 0) != scratch) {
        y = PyErr_Occurred() ? NULL : Py_NewRef(Py_None); /* (nothing prepared here: r.run prepares) */
        goto done;
    }
    Py_INCREF(e); /* (the calls below run Python, which may change the dict) */
    y = PyObject_CallOneArg(k[F_EMPTY_LIKE], t[A_X]);
    PyObject *run[9] = {PyTuple_GET_ITEM(e, 1), t[A_X], y, w[0], w[1], w[2], t[A_B_UP], t[A_B_GATE], t[A_B_DOWN]};
    PyObject *res = y ? PyObject_Vectorcall(k[F_RUN], run, 9, NULL) : NULL;
    Py_DECREF(e);
    if (!res)
        Py_CLEAR(y);
    Py_XDECREF(res);
done:
    for (int i = 0; i < 3; i++)
        Py_XDECREF(w[i]);
    Py_XDECREF(m);
    Py_XDECREF(stream);
    Py_XDECREF(key);
    Py_XDECREF(skey);
    Py_DECREF(fast);
    return y;
}

/* ffn_kept(routes, linear, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation[, out]) -> y or None:
 * fuser.ffn's call (without plan= or scales) by the route `routes` keeps under its route key (ffn_key's), in
 * one crossing: a route whose `fused` is False runs the eager ops here (the 9-argument form of `eager`, with
 * `linear` and the activation function gate_setup registered); a fused route's launch prepared for the call runs
 * here too where its `fast` allows (fused_run); any other call goes to the route's `run`. With
 * `out` (not None), validated with the rest as ffn_check validates it (writable, its shape, no overlap) and
 * not requiring grad, every route's run(..., out) gets the call. None where no fresh route is kept for the
 * key (no entry, a stale one, or arguments the checks refuse: the general path then decides, or says what
 * is wrong). */
PyObject *fuser_py_ffn_kept(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != A_OUT + 3 && nargs != A_OUT + 4) || !PyDict_Check(args[0]))
        return PyErr_Format(PyExc_TypeError, "ffn_kept(routes: dict, linear, x, w_up, w_down, w_gate, b_up, b_gate, "
                            "b_down, activation[, out]): got %zd arguments", nargs);
    fuser_state *st = fuser_get_state(module);
    PyObject *const *t = args + 2;
    PyObject *out = nargs == A_OUT + 4 && args[A_OUT + 3] != Py_None ? args[A_OUT + 3] : NULL;
    PyObject *const *kn = &PyTuple_GET_ITEM(st->kept_names, 0);
    if (out && !fuser_attr_is(out, kn[KN_REQUIRES_GRAD], Py_False))
        Py_RETURN_NONE; /* (the general path says why autograd cannot record a result written into it) */
    call_seen seen = {-1, 0, {NULL}};
    PyObject *key = route_key(st, t, out, Py_None, &seen);
    if (!key) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *r = PyDict_GetItemWithError(args[0], key);
    Py_DECREF(key);
    if (!r)
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    Py_INCREF(r); /* (the call below may change the dict) */
    PyObject *stale = PyObject_GetAttr(r, kn[KN_STALE]);
    PyObject *fused = stale == Py_False ? PyObject_GetAttr(r, kn[KN_FUSED]) : NULL;
    PyObject *fn = fuser_act_function(seen.act), *y;
    if (!stale || (stale == Py_False && !fused)) {
        y = NULL; /* reading the route's fields raised */
    } else if (stale != Py_False) {
        y = Py_NewRef(Py_None); /* the general path decides again */
    } else if (fused == Py_False && fn && !out) {
        y = fuser_eager_call(st, args[1], fn, t, NULL);
    } else {
        y = fused == Py_True && !out ? fused_run(st, r, t, &seen) : Py_NewRef(Py_None);
        if (y == Py_None) {
            Py_DECREF(y);
            PyObject *call[10] = {r, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[A_OUT], out};
            y = PyObject_VectorcallMethod(kn[KN_RUN], call, out ? 10 : 9, NULL);
        }
    }
    Py_XDECREF(stale);
    Py_XDECREF(fused);
    Py_DECREF(r);
    return y;
}

/* The route key of t (x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation) and a quantized chain's
 * `scales` (or None), validated as ffn_check validates them (ffn_key's docstring), and `out` with them where
 * given (NULL: none); with `act`, the chain's FUSER_ACT_* there. A bytes object (out is not part of the key),
 * or NULL with an exception set. */
static PyObject *route_key(fuser_state *st, PyObject *const *args, PyObject *out, PyObject *scales, call_seen *seen)
{
    const char *activation = activation_name(args[A_OUT]);
    if (!activation)
        return NULL;
    PyObject *obj[N_TENSOR_ARGS];
    for (int i = 0; i < A_OUT; i++)
        obj[i] = args[i];
    obj[A_OUT] = out;
    const int n = out ? N_TENSOR_ARGS : A_OUT;
    fuser_held held[N_TENSOR_ARGS];
    const fuser_tensor *t[N_TENSOR_ARGS] = {NULL};
    memset(held, 0, sizeof held);
    int opts[N_TENSOR_ARGS];
    for (int i = 0; i < N_TENSOR_ARGS; i++) /* a user's capsule: the general path says no */
        opts[i] = FUSER_TAKE_NO_CAPSULE | FUSER_TAKE_REGISTERED | (i == A_OUT ? FUSER_TAKE_WRITABLE : 0);
    if (args[A_X] == Py_None || args[A_W_UP] == Py_None || args[A_W_DOWN] == Py_None)
        return PyErr_Format(PyExc_TypeError, "ffn_key: x, w_up and w_down are required");
    fuser_chain c;
    PyObject *res = NULL;
    fuser_held sheld[FUSER_NUM_SCALES];
    memset(sheld, 0, sizeof sheld);
    if (!take_and_validate(st, obj, n, Py_None, opts, activation, held, t, &c, scales,
                           FUSER_TAKE_NO_CAPSULE | FUSER_TAKE_REGISTERED, 0, sheld)) {
        /* bytes, not a tuple of ints: no object for the garbage collector to count, one cheap hash */
        const int64_t key[7] = {c.m, c.k, c.n, c.l,
                                c.gated | c.bias_up << 1 | c.bias_gate << 2 | c.bias_down << 3 | c.packed << 4 |
                                    (int64_t)c.act << 8 | (int64_t)c.dtype << 16,
                                (int64_t)t[A_X]->device, t[A_X]->device_id};
        res = PyBytes_FromStringAndSize((const char *)key, sizeof key);
        if (seen) {
            seen->act = (int)c.act;
            seen->m = c.m;
            for (int i = 0; i < 3; i++)
                seen->w[i] = t[A_W_UP + i] ? t[A_W_UP + i]->data : NULL;
        }
    }
    for (int i = 0; i < n; i++)
        fuser_release(&held[i]);
    for (int i = 0; i < FUSER_NUM_SCALES; i++)
        fuser_release(&sheld[i]);
    return res;
}
