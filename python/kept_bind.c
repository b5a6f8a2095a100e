/* kept_bind.c: FusedFFN's kept routes run from C. A kept route (fuser.module's _KeptEager, _KeptLaunch) hands C a
 * tuple of what its checks read; a call of the module then runs the checks nn.Module.__call__ and the route would
 * make (no hook, no compiled call, forward not replaced, not traced; the route not stale; x and the weights as kept)
 * and the route itself in one C call, from the module's call slot (install_call) without a Python frame. A call the
 * kept route declines goes where FusedFFN.__call__ would send it. */
#include "binding.h"

/* The fields every kept route's tuple (its `fast`) begins with, what plain_call and after_ffn read: the route
 * (stale?), the dropouts between the GEMMs and after the FFN (their names, or None) and the classes whose inactive
 * instance after the FFN is the identity, whether the module trains with its own forward, the global hook dicts,
 * torch.jit's tracing-state function. */
enum { C_ROUTE, C_MID, C_POST, C_DROPOUTS, C_TRAIN_SOURCE, C_HOOKS, C_TRACING, C_COMMON };

/* A kept eager route's fields after them, in the order of fuser.module's _KeptEagerFast. */
enum {
    K_LINEAR = C_COMMON, K_ACT, K_TENSORS,           /* K_TENSORS..+5: w_up, w_down, w_gate, b_up, b_gate, b_down */
    K_SIGNATURE = K_TENSORS + 6, K_HELD, K_LAYOUT, K_LAID,   /* kept_match's arguments */
    K_PACKED, K_PACKED_BIAS, K_PACK,                 /* fuser_eager_run's pk */
    K_FIELDS
};

/* A kept launch's fields after them, in the order of fuser.module's _KeptLaunchFast: the prepared launch (a
 * capsule, which tells the two kinds apart) and the function that runs it (_C.ffn_run, as fuser.module holds it),
 * kept_match's arguments, the kernel's device and the raw stream it was
 * prepared for (ints), the scratch table (a dict), the key of the stream's scratch there and the scratch kept, the
 * tensors autograd would record through besides x, whether the route runs the eager ops while a graph is captured
 * (bool), y's shape where it is not x's (else None: empty_like), torch's is_any_autocast_enabled and empty_like. */
enum {
    L_PREPARED = C_COMMON, L_RUN, L_SIGNATURE, L_HELD, L_LAYOUT, L_DEVICE, L_STREAM, L_SCRATCHES, L_SKEY, L_SCRATCH,
    L_GRAD_OF, L_GRAPHS_EAGER, L_OUT_SHAPE, L_AUTOCAST, L_EMPTY_LIKE, L_FIELDS
};

/* 1 where d[name] is an empty dict, 0 where it holds something or is not a dict (or is missing). */
static int empty_dict_at(PyObject *d, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(d, name);
    return v && PyDict_Check(v) && PyDict_GET_SIZE(v) == 0;
}

/* 1 where calling the module whose __dict__ is `d` would do nothing but call its forward: no hook of its
 * own, no compiled call, forward not replaced on the instance; 0 otherwise, -1 with an exception set. */
static int no_module_call(PyObject *const *s, PyObject *d)
{
    if (PyDict_GetItemWithError(d, s[KN_FORWARD]))
        return 0;
    PyObject *compiled = PyDict_GetItemWithError(d, s[KN_COMPILED]);
    if ((compiled && compiled != Py_None) || PyErr_Occurred())
        return PyErr_Occurred() ? -1 : 0;
    for (int i = KN_HOOKS; i < KN_HOOKS + 4; i++)
        if (!empty_dict_at(d, s[i]))
            return PyErr_Occurred() ? -1 : 0;
    return 1;
}

/* The child module `name` of the module whose __dict__ is `d` (borrowed), or NULL (an exception set only
 * where reading failed). */
static PyObject *child(PyObject *const *s, PyObject *d, PyObject *name)
{
    PyObject *mods = PyDict_GetItemWithError(d, s[KN_MODULES]);
    return mods && PyDict_Check(mods) ? PyDict_GetItemWithError(mods, name) : NULL;
}

/* The dropout after the FFN, when its call would change nothing and may be left out: exactly one of the
 * dropout classes, not training, and calling it would only call its forward (the identity then). 1, 0,
 * or -1 with an exception set. */
static int inactive_dropout(PyObject *const *s, PyObject *post, PyObject *dropouts)
{
    int listed = PyTuple_Check(dropouts) ? PySequence_Contains(dropouts, (PyObject *)Py_TYPE(post)) : 0;
    if (listed <= 0 || !fuser_attr_is(post, s[KN_TRAINING], Py_False))
        return listed < 0 ? -1 : 0;
    PyObject *pd = PyObject_GenericGetDict(post, NULL);
    if (!pd)
        return -1;
    int plain = PyDict_Check(pd) ? no_module_call(s, pd) : 0;
    Py_DECREF(pd);
    return plain;
}

/* Whether the call FusedFFN.__call__ hands over may run here (k: a kept route's fields, C_* first): nothing of
 * nn.Module.__call__ would apply
 * (no hook of the module's or global, no compiled call, forward not replaced on the instance, not traced
 * by torch.jit), the route is not stale, no training forward of its own or active dropout between the
 * GEMMs, and the dropout after the FFN (if any) is there. 1, 0, or -1 with an exception set. */
static int plain_call(fuser_state *st, PyObject *d, PyObject *const *k)
{
    PyObject *const *s = &PyTuple_GET_ITEM(st->kept_names, 0);
    int plain = no_module_call(s, d);
    if (plain <= 0)
        return plain;
    PyObject *hooks = k[C_HOOKS];
    if (!PyTuple_Check(hooks))
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(hooks); i++) {
        PyObject *h = PyTuple_GET_ITEM(hooks, i);
        if (!PyDict_Check(h) || PyDict_GET_SIZE(h))
            return 0;
    }
    if (k[C_TRAIN_SOURCE] == Py_True) {
        PyObject *training = PyDict_GetItemWithError(d, s[KN_TRAINING]);
        if (training != Py_False)
            return PyErr_Occurred() ? -1 : 0;
    }
    if (k[C_MID] != Py_None) {
        PyObject *mid = child(s, d, k[C_MID]);
        if (!mid || !fuser_attr_is(mid, s[KN_TRAINING], Py_False))
            return PyErr_Occurred() ? -1 : 0;
    }
    if (k[C_POST] != Py_None && !child(s, d, k[C_POST]))
        return PyErr_Occurred() ? -1 : 0;
    PyObject *stale = PyObject_GetAttr(k[C_ROUTE], s[KN_STALE]);
    if (!stale)
        return -1;
    Py_DECREF(stale);
    if (stale != Py_False)
        return 0;
    PyObject *tracing = PyObject_CallNoArgs(k[C_TRACING]);
    if (!tracing)
        return -1;
    Py_DECREF(tracing);
    return tracing == Py_None;
}

/* The dropout `name` after the FFN of the module whose __dict__ is `d`, applied to y (a reference this
 * function takes): its call left out where it would be the identity (inactive_dropout; the caller has
 * found no global hook), else made as the module would make it. New reference, or NULL with an
 * exception set. */
static PyObject *after_ffn(fuser_state *st, PyObject *d, PyObject *name, PyObject *dropouts, PyObject *y)
{
    PyObject *const *s = &PyTuple_GET_ITEM(st->kept_names, 0);
    PyObject *post = child(s, d, name);
    if (!post) {
        Py_DECREF(y);
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, name);
        return NULL;
    }
    int skip = inactive_dropout(s, post, dropouts);
    if (skip) {
        if (skip < 0)
            Py_CLEAR(y);
        return y;
    }
    Py_INCREF(post); /* (its call may change the registry that holds it) */
    PyObject *out = PyObject_CallOneArg(post, y);
    Py_DECREF(post);
    Py_DECREF(y);
    return out;
}

/* The kept eager route `kt` (a tuple of K_FIELDS) of the module whose __dict__ is d, on x: y, or None where
 * it does not serve the call, or NULL with an exception set. */
static PyObject *kept_eager(PyObject *module, PyObject *d, PyObject *x, PyObject *kt)
{
    fuser_state *st = fuser_get_state(module);
    PyObject *const *k = &PyTuple_GET_ITEM(kt, 0);
    int ok = plain_call(st, d, k);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *match[5] = {x, k[K_SIGNATURE], k[K_HELD], k[K_LAYOUT], k[K_LAID]};
    PyObject *same = fuser_py_kept_match(module, match, 5);
    if (!same || same == Py_None)
        return same;
    Py_DECREF(same);
    PyObject *t[7] = {x, k[K_TENSORS], k[K_TENSORS + 1], k[K_TENSORS + 2], k[K_TENSORS + 3], k[K_TENSORS + 4],
                      k[K_TENSORS + 5]};
    PyObject *y = fuser_eager_run(st, k[K_LINEAR], k[K_ACT], t, k[K_PACKED] == Py_None ? NULL : k + K_PACKED);
    return !y || k[C_POST] == Py_None ? y : after_ffn(st, d, k[C_POST], k[C_DROPOUTS], y);
}

/* kept_eager(d, x, k) -> y or None */
PyObject *fuser_py_kept_eager(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyDict_Check(args[0]) || !PyTuple_Check(args[2]) || PyTuple_GET_SIZE(args[2]) != K_FIELDS)
        return PyErr_Format(PyExc_TypeError, "kept_eager(d: dict, x, k: tuple of %d)", (int)K_FIELDS);
    return kept_eager(module, args[0], args[1], args[2]);
}

/* 1 where the kept launch `k` (L_* fields) may launch for x, at the address `ptr` (kept_match's): x 16-byte
 * aligned; on the kernel's device, current, with the current stream the one prepared for and its scratch still
 * the one kept (fuser_launch_may_run: also no torch mode, FUSER_DISABLE unset, and for a route that runs the eager
 * ops in graphs no capture); no autocast; no autograd to record through x or the weights. 0 where not, -1 with an
 * exception set. */
static int launch_allowed(PyObject *const *k, PyObject *x, PyObject *ptr)
{
    const unsigned long long p = PyLong_AsUnsignedLongLongMask(ptr);
    if (p == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (!p || (p & 15) || !PyTuple_Check(k[L_GRAD_OF]) || PyTuple_GET_SIZE(k[L_GRAD_OF]) > 8)
        return 0;
    int ok = fuser_launch_may_run(k[L_DEVICE], k[L_STREAM], k[L_GRAPHS_EAGER] == Py_True);
    if (ok <= 0)
        return ok;
    PyObject *scratch = PyDict_GetItemWithError(k[L_SCRATCHES], k[L_SKEY]);
    if (scratch != k[L_SCRATCH])
        return PyErr_Occurred() ? -1 : 0;
    PyObject *autocast = PyObject_CallNoArgs(k[L_AUTOCAST]);
    if (!autocast)
        return -1;
    Py_DECREF(autocast);
    if (autocast != Py_False)
        return 0;
    PyObject *ts[9] = {x};
    const Py_ssize_t n = PyTuple_GET_SIZE(k[L_GRAD_OF]);
    for (Py_ssize_t i = 0; i < n; i++)
        ts[i + 1] = PyTuple_GET_ITEM(k[L_GRAD_OF], i);
    const int rec = fuser_gate_records(ts, (int)n + 1);
    return rec < 0 ? -1 : !rec;
}

/* The kept launch `kt` (a tuple of L_FIELDS) of the module whose __dict__ is d, on x: y (a new tensor the kernel
 * writes, through the dropout after the FFN), or None where it does not serve the call, or NULL with an exception
 * set. The same checks as fuser.module's _KeptLaunch.run, and FusedFFN.__call__'s before it. */
static PyObject *kept_launch(PyObject *module, PyObject *d, PyObject *x, PyObject *kt)
{
    fuser_state *st = fuser_get_state(module);
    PyObject *const *k = &PyTuple_GET_ITEM(kt, 0);
    int ok = plain_call(st, d, k);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *match[4] = {x, k[L_SIGNATURE], k[L_HELD], k[L_LAYOUT]};
    PyObject *ptr = fuser_py_kept_match(module, match, 4);
    if (!ptr || ptr == Py_None)
        return ptr;
    ok = launch_allowed(k, x, ptr);
    if (ok <= 0) {
        Py_DECREF(ptr);
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *y;
    if (k[L_OUT_SHAPE] == Py_None) {
        y = PyObject_CallOneArg(k[L_EMPTY_LIKE], x);
    } else {
        PyObject *a[2] = {x, k[L_OUT_SHAPE]};
        y = PyObject_VectorcallMethod(PyTuple_GET_ITEM(st->kept_names, KN_NEW_EMPTY), a, 2, NULL);
    }
    PyObject *run[3] = {k[L_PREPARED], ptr, y};
    PyObject *r = y ? PyObject_Vectorcall(k[L_RUN], run, 3, NULL) : NULL;
    Py_DECREF(ptr);
    if (!r) {
        Py_XDECREF(y);
        return NULL;
    }
    Py_DECREF(r);
    return k[C_POST] == Py_None ? y : after_ffn(st, d, k[C_POST], k[C_DROPOUTS], y);
}

/* kept_launch(d, x, k) -> y or None */
PyObject *fuser_py_kept_launch(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyDict_Check(args[0]) || !PyTuple_Check(args[2]) || PyTuple_GET_SIZE(args[2]) != L_FIELDS ||
        !PyCapsule_CheckExact(PyTuple_GET_ITEM(args[2], L_PREPARED)) ||
        !PyDict_Check(PyTuple_GET_ITEM(args[2], L_SCRATCHES)))
        return PyErr_Format(PyExc_TypeError, "kept_launch(d: dict, x, k: tuple of %d, a prepared launch at %d and the "
                            "scratch table, a dict, at %d)", (int)L_FIELDS, (int)L_PREPARED, (int)L_SCRATCHES);
    return kept_launch(module, args[0], args[1], args[2]);
}

/* The kept route `kt` of the module whose __dict__ is d, on x, by its kind (a kept launch's tuple holds its
 * prepared launch, a capsule, where an eager route's holds F.linear): as kept_launch or kept_eager; None where
 * kt is neither. */
static PyObject *kept_route(PyObject *module, PyObject *d, PyObject *x, PyObject *kt)
{
    const Py_ssize_t n = PyTuple_Check(kt) ? PyTuple_GET_SIZE(kt) : 0;
    if (n == L_FIELDS && PyCapsule_CheckExact(PyTuple_GET_ITEM(kt, L_PREPARED)) &&
        PyDict_Check(PyTuple_GET_ITEM(kt, L_SCRATCHES)))
        return kept_launch(module, d, x, kt);
    if (n == K_FIELDS && !PyCapsule_CheckExact(PyTuple_GET_ITEM(kt, K_LINEAR)))
        return kept_eager(module, d, x, kt);
    return Py_NewRef(Py_None);
}

/* FusedFFN's call slot (install_call): `m(x)` served by the module's kept route (the eager ops, or the kept
 * launch) without a Python frame, exactly where FusedFFN.__call__ would serve it from there (one input, no
 * keyword, not compiling, a kept route whose checks C reads); a call that route declines goes where __call__
 * would send it, nn.Module.__call__; every other call goes to the class's __call__ as written in Python, which
 * is also what `FusedFFN.__call__` names and what torch.compile traces. The slot's objects, one set per
 * process: the extension module (its state), torch.compiler.is_compiling, and where torch keeps the flag that
 * function returns outside TorchScript (torch.compiler's `_is_compiling_flag`, read directly: C code is never
 * scripted), its module and name, or NULL to call the function. */
static PyObject *slot_module, *slot_compiling, *slot_flag_owner, *slot_flag, *slot_nn_module;

/* 1 where torch is compiling or exporting (torch.compiler.is_compiling()), 0 where not, -1 with an exception. */
static int compiling(void)
{
    PyObject *v = slot_flag ? PyObject_GetAttr(slot_flag_owner, slot_flag) : PyObject_CallNoArgs(slot_compiling);
    if (!v)
        return -1;
    const int on = v != Py_False;
    Py_DECREF(v);
    return on;
}

/* owner.__call__(self, *args, **kwargs), the method looked up at this call (so patches of it apply) */
static PyObject *python_call(PyObject *owner, PyObject *self, PyObject *args, PyObject *kwargs)
{
    fuser_state *st = fuser_get_state(slot_module);
    PyObject *fn = PyObject_GetAttr(owner, PyTuple_GET_ITEM(st->kept_names, KN_CALL));
    if (!fn)
        return NULL;
    const Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *all = PyTuple_New(n + 1);
    if (!all) {
        Py_DECREF(fn);
        return NULL;
    }
    PyTuple_SET_ITEM(all, 0, Py_NewRef(self));
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(all, i + 1, Py_NewRef(PyTuple_GET_ITEM(args, i)));
    PyObject *out = PyObject_Call(fn, all, kwargs);
    Py_DECREF(all);
    Py_DECREF(fn);
    return out;
}

/* A call the kept eager route declined goes where FusedFFN.__call__ sends it then, nn.Module.__call__, without
 * running the route's checks a second time; every other call the slot does not serve goes to cls.__call__. */
static PyObject *fused_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
    PyObject *cls = (PyObject *)Py_TYPE(self);
    if (PyTuple_GET_SIZE(args) != 1 || (kwargs && PyDict_GET_SIZE(kwargs)))
        return python_call(cls, self, args, kwargs);
    fuser_state *st = fuser_get_state(slot_module);
    PyObject *d = PyObject_GenericGetDict(self, NULL);
    if (!d)
        return NULL;
    PyObject *kept = PyDict_GetItemWithError(d, PyTuple_GET_ITEM(st->kept_names, KN_KEPT));
    PyObject *fast = kept && kept != Py_None ? PyObject_GetAttr(kept, PyTuple_GET_ITEM(st->kept_names, KN_FAST))
                                             : NULL;
    PyObject *y = NULL;
    if (fast && fast != Py_None && compiling() == 0)
        y = kept_route(slot_module, d, PyTuple_GET_ITEM(args, 0), fast);
    Py_XDECREF(fast);
    Py_DECREF(d);
    if (y && y != Py_None)
        return y;
    const int declined = y == Py_None;
    Py_XDECREF(y);
    if (PyErr_Occurred())
        return NULL;
    return python_call(declined ? slot_nn_module : cls, self, args, kwargs);
}

/* install_call(cls, is_compiling, flag_owner, flag, nn_module): cls's instances called through fused_call (cls:
 * FusedFFN); flag_owner.flag (flag a str) is what is_compiling returns outside TorchScript, or flag is None;
 * nn_module: torch.nn.Module, whose __call__ takes the calls the kept route declines */
PyObject *fuser_py_install_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyType_Check(args[0]) || !(((PyTypeObject *)args[0])->tp_flags & Py_TPFLAGS_HEAPTYPE) ||
        !PyCallable_Check(args[1]) || !(args[3] == Py_None || PyUnicode_Check(args[3])) || !PyType_Check(args[4]))
        return PyErr_Format(PyExc_TypeError, "install_call(cls: a class, is_compiling: callable, flag_owner, "
                                             "flag: str or None, nn_module: a class)");
    Py_XSETREF(slot_module, Py_NewRef(module));
    Py_XSETREF(slot_nn_module, Py_NewRef(args[4]));
    Py_XSETREF(slot_compiling, Py_NewRef(args[1]));
    Py_XSETREF(slot_flag_owner, args[3] == Py_None ? NULL : Py_NewRef(args[2]));
    Py_XSETREF(slot_flag, args[3] == Py_None ? NULL : Py_NewRef(args[3]));
    ((PyTypeObject *)args[0])->tp_call = fused_call;
    PyType_Modified((PyTypeObject *)args[0]);
    Py_RETURN_NONE;
}

/* after_ffn(d, name, dropouts, y) -> the output */
PyObject *fuser_py_after_ffn(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyDict_Check(args[0]))
        return PyErr_Format(PyExc_TypeError, "after_ffn(d: dict, name, dropouts, y)");
    return after_ffn(fuser_get_state(module), args[0], args[1], args[2], Py_NewRef(args[3]));
}
