/* gate_bind.c: when the eager route's gate step, act(g) * u, runs as fuser's gate kernel (include/fuser/gate.h)
 * instead of PyTorch's two ops: for two plain 16-bit CUDA tensors of one shape and layout, aligned, compact or
 * rows of one stride (the two halves of one gate-and-up GEMM's result) whose elements do not overlap, on the
 * current device, that record no autograd, outside any torch dispatch or function mode, with an activation of
 * fuser.reference.ACTIVATIONS, while FUSER_DISABLE does not ask for PyTorch's ops everywhere. Then g is
 * overwritten with the result (bitwise what the ops return); anywhere else the caller runs the ops. The
 * kernels are compiled by a loader fuser.runtime registers (gate_setup: the CUBIN through fuser.jit, or why
 * there is none) and loaded once per device, in the context current then (the device's, which every launch
 * checks): like every fuser kernel they stay loaded for the process. */
#include "binding.h"

#include <stdio.h>
#include <string.h>

#include "fuser/chain.h"
#include "fuser/gate.h"

#define GATE_DEVICES 64

/* Per device: not tried yet, being loaded (a call meanwhile runs the ops), loaded, or not available. */
enum { GATE_UNTRIED = 0, GATE_LOADING, GATE_READY, GATE_UNAVAILABLE };
typedef struct {
    int state;
    char why[256];                        /* GATE_UNAVAILABLE: the reason */
    fuser_kernel k[FUSER_GATE_KERNELS];
} gate_device;

/* What gate_setup registered (NULL before): the loader (device -> CUBIN bytes, or a str saying why none),
 * the activation functions in FUSER_ACT_* order, and the per-call predicates (torch's capturing(),
 * len(dispatch stack), function mode enabled, current device, current raw stream of a device; fuser's
 * FUSER_DISABLE; torch's is_grad_enabled()), torch._addmm_activation (None where torch has none), the
 * activations' in-place forms in FUSER_ACT_* order (each a function of one tensor, or None), and the linear whose
 * out= form writes the down projection into a given output (torch.nn.functional.linear, or None). */
enum { H_LOADER, H_ACTS, H_CAPTURING, H_DISPATCH, H_FUNCTION, H_DEVICE, H_STREAM, H_DISABLED, H_GRAD, H_ADDMM_ACT,
       H_ACTS_INPLACE, H_DOWN_OUT, H_COUNT };
static PyObject *hooks, *s_requires_grad, *s_is_cuda;
static gate_device *devices[GATE_DEVICES];
static unsigned long long launches;
/* The CUDA devices (bit d: device d) on which this thread has made what the eager ops of a host-bound route's
 * graphs take and a capture cannot make: PyTorch's cuBLAS and cuBLASLt handles, which it keeps per thread and
 * device (fuser.route's `prepare_thread` makes them, then marks the device here). A thread's first launch on
 * such a route therefore goes to Python. Devices outside 0..GATE_DEVICES-1 are not tracked (taken as prepared). */
static _Thread_local unsigned long long thread_prepared;

/* The FUSER_ACT_* of act (one of the registered activation functions), or -1. */
static int act_index(PyObject *act)
{
    PyObject *acts = PyTuple_GET_ITEM(hooks, H_ACTS);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(acts); i++)
        if (PyTuple_GET_ITEM(acts, i) == act)
            return (int)i;
    return -1;
}

/* The value of hook i called with no argument, or with `arg` (a new reference), or NULL with an exception. */
static PyObject *call_hook(int i, PyObject *arg)
{
    PyObject *fn = PyTuple_GET_ITEM(hooks, i);
    return arg ? PyObject_CallOneArg(fn, arg) : PyObject_CallNoArgs(fn);
}

/* 1 where hook i returns something false (0, False), 0 where true, -1 with an exception. */
static int hook_false(int i)
{
    PyObject *v = call_hook(i, NULL);
    if (!v)
        return -1;
    const int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t < 0 ? -1 : !t;
}

/* 1 where no torch dispatch or function mode is active (one would expect to see the ops as the reference calls
 * them); 0 where one is, -1 with an exception. */
static int no_mode(void)
{
    const int yes = hook_false(H_DISPATCH);
    return yes > 0 ? hook_false(H_FUNCTION) : yes;
}

/* 1 where fuser may run its own steps in place of PyTorch's ops: no torch mode (no_mode), and FUSER_DISABLE not
 * asking for PyTorch's ops everywhere; 0 where not, -1 with an exception. */
static int unobserved(void)
{
    const int yes = no_mode();
    return yes > 0 ? hook_false(H_DISABLED) : yes;
}

/* Load the gate kernels of `device` (the current device) through the registered loader; the device's
 * state says how it went. 0, or -1 with an exception set (the loader raised). */
static int load(gate_device *d, int device)
{
    d->state = GATE_LOADING;
    PyObject *dev = PyLong_FromLong(device);
    PyObject *cubin = dev ? call_hook(H_LOADER, dev) : NULL;
    Py_XDECREF(dev);
    if (!cubin) {
        d->state = GATE_UNTRIED;
        return -1;
    }
    d->state = GATE_UNAVAILABLE;
    if (!PyBytes_Check(cubin)) {
        PyObject *s = PyObject_Str(cubin);
        const char *why = s ? PyUnicode_AsUTF8(s) : NULL;
        snprintf(d->why, sizeof d->why, "%s", why ? why : "the loader gave no CUBIN");
        if (!why)
            PyErr_Clear();
        Py_XDECREF(s);
        Py_DECREF(cubin);
        return 0;
    }
    fuser_err err;
    fuser_err_clear(&err);
    const fuser_driver *drv = fuser_driver_get(&err);
    int rc = drv ? FUSER_OK : err.code, i = 0;
    for (; !rc && i < FUSER_GATE_KERNELS; i++)
        rc = fuser_kernel_load(drv, device, PyBytes_AS_STRING(cubin), fuser_gate_name(i), &d->k[i], &err);
    if (rc) {
        fuser_err ignored;
        for (int j = 0; j < i - 1; j++)
            fuser_kernel_unload(drv, &d->k[j], &ignored);
        snprintf(d->why, sizeof d->why, "%s", err.msg);
    } else {
        d->state = GATE_READY;
    }
    Py_DECREF(cubin);
    return 0;
}

/* g or u as rows of `cols` elements `ld` apart: compact (ld == cols == numel), or, once dimensions of size one are
 * left out, the last dimension dense, the one before it `ld` apart (ld > cols) and every one above dense over
 * it (a row slice of a wider tensor, as a GEMM result's half). t is validated as the compact [rows, cols] tensor
 * at the view's first element (type, device, alignment). 1 where it is such a tensor, else 0. */
static int as_rows(const DLTensor *dl, const char *name, fuser_tensor *t, int64_t *cols, int64_t *ld, fuser_err *err)
{
    if (fuser_tensor_from_dl(dl, name, t, err) == FUSER_OK) {
        *cols = *ld = t->numel;
        return 1;
    }
    if (!dl->strides || dl->ndim < 2 || dl->ndim > FUSER_MAX_DIMS)
        return 0;
    int64_t size[FUSER_MAX_DIMS], stride[FUSER_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < dl->ndim; i++)
        if (dl->shape[i] != 1) {
            size[n] = dl->shape[i];
            stride[n++] = dl->strides[i];
        }
    if (n < 2 || size[n - 1] < 1 || stride[n - 1] != 1 || stride[n - 2] <= size[n - 1])
        return 0;
    int64_t rows = size[n - 2];
    for (int i = n - 3; i >= 0; i--) {
        if (stride[i] != stride[i + 1] * size[i + 1])
            return 0;
        rows *= size[i];
    }
    const int64_t shape[2] = {rows, size[n - 1]};
    DLTensor flat = *dl;
    flat.ndim = 2;
    flat.shape = (int64_t *)shape;
    flat.strides = NULL;
    if (fuser_tensor_from_dl(&flat, name, t, err) != FUSER_OK)
        return 0;
    *cols = size[n - 1];
    *ld = stride[n - 2];
    return 1;
}

/* 1 where no element of g's rows is one of u's (n elements each in rows of cols, ld apart, es bytes each). */
static int rows_disjoint(const fuser_tensor *g, const fuser_tensor *u, int64_t cols, int64_t ld)
{
    if (ld == cols)
        return !fuser_tensors_overlap(g, u);
    const int64_t es = fuser_dtype_size(g->dtype), span = (g->numel / cols - 1) * ld + cols;
    const int64_t diff = (int64_t)((const char *)u->data - (const char *)g->data);
    if (diff >= span * es || -diff >= span * es)
        return 1;
    if (diff % es)
        return 0;
    const int64_t r = ((diff / es) % ld + ld) % ld;
    return r >= cols && r <= ld - cols;
}

/* The gate kernel for act on g and u where it applies (see the top of this file): 1 when it ran (g then holds
 * the result), 0 where the caller runs the ops, -1 with an exception set (a launch that failed). */
int fuser_gate_try(fuser_state *st, PyObject *act, PyObject *g, PyObject *u)
{
    if (!hooks)
        return 0;
    /* a tensor's is_cuda first: CPU tensors are not described (the exchange API is the costlier read) */
    const int a = act_index(act);
    if (a < 0 || !fuser_attr_is(g, s_is_cuda, Py_True))
        return 0;
    DLTensor dl[2];
    fuser_held h[2];
    memset(h, 0, sizeof h);
    fuser_tensor t[2];
    int64_t cols[2], ld[2];
    fuser_err err;
    fuser_err_clear(&err);
    int ok = fuser_exchange_describe(st, g, &dl[0], &h[0]) && fuser_exchange_describe(st, u, &dl[1], &h[1]) &&
             as_rows(&dl[0], "g", &t[0], &cols[0], &ld[0], &err) && as_rows(&dl[1], "u", &t[1], &cols[1], &ld[1], &err);
    int rc = 0;
    if (!ok || t[0].device != FUSER_CUDA || t[1].device != FUSER_CUDA || t[0].device_id != t[1].device_id ||
        t[0].dtype != t[1].dtype || dl[0].ndim != dl[1].ndim || t[0].numel < 1 || t[0].numel != t[1].numel ||
        memcmp(dl[0].shape, dl[1].shape, sizeof(int64_t) * (size_t)dl[0].ndim) || cols[0] != cols[1] ||
        ld[0] != ld[1] || t[0].device_id < 0 || t[0].device_id >= GATE_DEVICES ||
        !rows_disjoint(&t[0], &t[1], cols[0], ld[0]) ||
        (ld[0] != cols[0] && (cols[0] % 8 || ld[0] % 8 || t[0].numel > FUSER_GATE_MAX_STRIDED)))
        goto done;
    const int k = fuser_gate_index(t[0].dtype, a), device = t[0].device_id;
    if (k < 0 || !fuser_attr_is(g, s_requires_grad, Py_False) ||
        !fuser_attr_is(u, s_requires_grad, Py_False))
        goto done;
    /* no mode that would expect to see the ops, fuser not switched off, and the tensors' device current (its
     * context is the one the kernels were loaded in) */
    int yes = unobserved();
    if (yes <= 0) {
        rc = yes;
        goto done;
    }
    PyObject *cur = call_hook(H_DEVICE, NULL);
    if (!cur) {
        rc = -1;
        goto done;
    }
    const long current = PyLong_AsLong(cur);
    Py_DECREF(cur);
    if (current != device) {
        rc = current == -1 && PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    gate_device *d = devices[device];
    if (!d && !(d = devices[device] = PyMem_RawCalloc(1, sizeof *d))) {
        PyErr_NoMemory();
        rc = -1;
        goto done;
    }
    if (d->state == GATE_UNTRIED) {
        /* loading is not for a stream being captured into a CUDA graph: the ops run then */
        yes = hook_false(H_CAPTURING);
        if (yes <= 0 || load(d, device) < 0) {
            rc = yes < 0 || PyErr_Occurred() ? -1 : 0;
            goto done;
        }
    }
    if (d->state != GATE_READY)
        goto done;
    PyObject *dev = PyLong_FromLong(device);
    PyObject *s = dev ? call_hook(H_STREAM, dev) : NULL;
    Py_XDECREF(dev);
    const unsigned long long stream = s ? PyLong_AsUnsignedLongLong(s) : 0;
    Py_XDECREF(s);
    if (!s || PyErr_Occurred()) {
        rc = -1;
        goto done;
    }
    const fuser_driver *drv = fuser_driver_get(&err);
    if (!drv || fuser_gate_launch(drv, &d->k[k], t[0].data, t[1].data, t[0].numel, cols[0], ld[0],
                                  (fuser_cu_stream)(uintptr_t)stream, &err)) {
        fuser_raise(st, &err);
        rc = -1;
        goto done;
    }
    launches++;
    rc = 1;
done:
    fuser_release(&h[0]);
    fuser_release(&h[1]);
    return rc;
}

/* (binding.h) */
int fuser_gate_records(PyObject *const *ts, int n)
{
    if (!hooks)
        return 1;
    const int off = hook_false(H_GRAD);
    if (off)
        return off < 0 ? -1 : 0;
    for (int i = 0; i < n; i++)
        if (ts[i] != Py_None && !fuser_attr_is(ts[i], s_requires_grad, Py_False))
            return 1;
    return 0;
}

/* (binding.h) */
int fuser_act_index(PyObject *act)
{
    return hooks ? act_index(act) : -1;
}

/* (binding.h) */
PyObject *fuser_act_function(int a)
{
    return hooks && a >= 0 && a <= FUSER_ACT_SILU ? PyTuple_GET_ITEM(PyTuple_GET_ITEM(hooks, H_ACTS), a) : NULL;
}

/* (binding.h) */
PyObject *fuser_addmm_activation(void)
{
    PyObject *f = hooks ? PyTuple_GET_ITEM(hooks, H_ADDMM_ACT) : NULL;
    return f == Py_None ? NULL : f;
}

/* (binding.h) */
int fuser_no_mode(void)
{
    return hooks ? no_mode() : 0;
}

/* (binding.h) */
PyObject *fuser_down_out_linear(void)
{
    PyObject *f = hooks ? PyTuple_GET_ITEM(hooks, H_DOWN_OUT) : NULL;
    return f == Py_None ? NULL : f;
}

/* (binding.h) */
PyObject *fuser_act_in_place(PyObject *act, PyObject *h)
{
    const int a = hooks ? act_index(act) : -1;
    PyObject *f = a < 0 ? Py_None : PyTuple_GET_ITEM(PyTuple_GET_ITEM(hooks, H_ACTS_INPLACE), a);
    if (f == Py_None || !fuser_attr_is(h, s_requires_grad, Py_False))
        return Py_NewRef(Py_None);
    const int yes = no_mode();
    return yes > 0 ? PyObject_CallOneArg(f, h) : yes < 0 ? NULL : Py_NewRef(Py_None);
}

/* (binding.h) */
int fuser_eager_may_fuse(PyObject *x, PyObject *const *ts, int n)
{
    if (!hooks || !fuser_attr_is(x, s_is_cuda, Py_True))
        return 0;
    const int yes = unobserved();
    if (yes <= 0)
        return yes;
    int rec = fuser_gate_records(&x, 1);
    if (!rec)
        rec = fuser_gate_records(ts, n);
    return rec < 0 ? -1 : !rec;
}

/* 1 where hook i called with `arg` (or no argument) returns a value equal to `want`, 0 where not, -1 with an
 * exception set. */
static int hook_equals(int i, PyObject *arg, PyObject *want)
{
    PyObject *v = call_hook(i, arg);
    if (!v)
        return -1;
    const int eq = v == want ? 1 : PyObject_RichCompareBool(v, want, Py_EQ);
    Py_DECREF(v);
    return eq;
}

/* 1 where this thread has made its capture-time state on CUDA device `device` (an int; thread_prepared), 0 where
 * not, -1 with an exception set. */
static int thread_is_prepared(PyObject *device)
{
    const long d = PyLong_AsLong(device);
    if (d == -1 && PyErr_Occurred())
        return -1;
    return d < 0 || d >= GATE_DEVICES || (thread_prepared >> d & 1);
}

/* thread_is_prepared, after marking `device` prepared on this thread where `mark` (a tracked device only). */
static int thread_mark(PyObject *device, int mark)
{
    const int yes = thread_is_prepared(device);
    if (yes == 0 && mark)
        thread_prepared |= 1ull << PyLong_AsLong(device);
    return yes < 0 ? -1 : yes || mark;
}

/* (binding.h) */
int fuser_launch_may_run(PyObject *device, PyObject *stream, int graphs_eager)
{
    if (!hooks)
        return 0;
    int ok = hook_equals(H_DEVICE, NULL, device);
    if (ok > 0)
        ok = hook_equals(H_STREAM, device, stream);
    if (ok > 0)
        ok = unobserved();
    if (ok > 0 && graphs_eager)
        ok = thread_is_prepared(device);
    if (ok > 0 && graphs_eager)
        ok = hook_false(H_CAPTURING);
    return ok;
}

/* (binding.h) */
PyObject *fuser_route_stream(PyObject *device, int graphs_eager)
{
    if (!hooks)
        return Py_NewRef(Py_None);
    int ok = hook_equals(H_DEVICE, NULL, device);
    if (ok > 0)
        ok = hook_false(H_DISABLED);
    if (ok > 0 && graphs_eager)
        ok = thread_is_prepared(device);
    if (ok > 0 && graphs_eager)
        ok = hook_false(H_CAPTURING);
    return ok < 0 ? NULL : ok ? call_hook(H_STREAM, device) : Py_NewRef(Py_None);
}

/* gate_setup(loader, acts, capturing, dispatch_len, function_mode, current_device, raw_stream, disabled,
 * grad_enabled, addmm_activation, acts_in_place, down_out) */
PyObject *fuser_py_gate_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != H_COUNT || !PyTuple_Check(args[H_ACTS]) || PyTuple_GET_SIZE(args[H_ACTS]) != FUSER_ACT_SILU + 1 ||
        !PyTuple_Check(args[H_ACTS_INPLACE]) || PyTuple_GET_SIZE(args[H_ACTS_INPLACE]) != FUSER_ACT_SILU + 1)
        return PyErr_Format(PyExc_TypeError, "gate_setup(loader, acts: a tuple of %d functions, capturing, "
                                             "dispatch_len, function_mode, current_device, raw_stream, disabled, grad_enabled, "
                                             "addmm_activation, acts_in_place: a tuple of %d functions or None, "
                                             "down_out: linear or None)",
                            FUSER_ACT_SILU + 1, FUSER_ACT_SILU + 1);
    for (int i = 0; i < H_COUNT; i++)
        if (i != H_ACTS && i != H_ACTS_INPLACE && !((i == H_ADDMM_ACT || i == H_DOWN_OUT) && args[i] == Py_None) &&
            !PyCallable_Check(args[i]))
            return PyErr_Format(PyExc_TypeError, "gate_setup: argument %d is not callable", i + 1);
    for (int i = 0; i <= FUSER_ACT_SILU; i++) {
        PyObject *f = PyTuple_GET_ITEM(args[H_ACTS_INPLACE], i);
        if (f != Py_None && !PyCallable_Check(f))
            return PyErr_Format(PyExc_TypeError, "gate_setup: acts_in_place[%d] is neither callable nor None", i);
    }
    if ((!s_requires_grad && !(s_requires_grad = PyUnicode_InternFromString("requires_grad"))) ||
        (!s_is_cuda && !(s_is_cuda = PyUnicode_InternFromString("is_cuda"))))
        return NULL;
    PyObject *t = PyTuple_New(H_COUNT);
    if (!t)
        return NULL;
    for (int i = 0; i < H_COUNT; i++)
        PyTuple_SET_ITEM(t, i, Py_NewRef(args[i]));
    Py_XSETREF(hooks, t);
    Py_RETURN_NONE;
}

/* thread_prepared(device[, mark]) -> bool */
PyObject *fuser_py_thread_prepared(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 1 || nargs > 2 || !PyLong_Check(args[0]))
        return PyErr_Format(PyExc_TypeError, "thread_prepared(device: int[, mark: bool])");
    const int mark = nargs == 2 ? PyObject_IsTrue(args[1]) : 0;
    const int yes = mark < 0 ? -1 : thread_mark(args[0], mark);
    return yes < 0 ? NULL : PyBool_FromLong(yes);
}

/* gate(g, u, act) -> True where the gate kernel ran (g holds act(g) * u), False where the ops must */
PyObject *fuser_py_gate(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3)
        return PyErr_Format(PyExc_TypeError, "gate(g, u, act): 3 arguments, got %zd", nargs);
    const int rc = fuser_gate_try(fuser_get_state(module), args[2], args[0], args[1]);
    return rc < 0 ? NULL : PyBool_FromLong(rc);
}

/* gate_info() -> {"launches": n, "devices": {device: "ready" | "loading" | "unavailable: why"}} */
PyObject *fuser_py_gate_info(PyObject *module, PyObject *noargs)
{
    (void)module, (void)noargs;
    PyObject *devs = PyDict_New(), *res = NULL;
    for (int i = 0; devs && i < GATE_DEVICES; i++) {
        const gate_device *d = devices[i];
        if (!d || d->state == GATE_UNTRIED)
            continue;
        PyObject *k = PyLong_FromLong(i);
        PyObject *v = d->state == GATE_READY     ? PyUnicode_FromString("ready")
                      : d->state == GATE_LOADING ? PyUnicode_FromString("loading")
                                                 : PyUnicode_FromFormat("unavailable: %s", d->why);
        if (!k || !v || PyDict_SetItem(devs, k, v))
            Py_CLEAR(devs);
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    if (devs)
        res = Py_BuildValue("{s:K,s:O}", "launches", launches, "devices", devs);
    Py_XDECREF(devs);
    return res;
}

/* gate_source() -> the CUDA translation unit of the gate kernels (for fuser.jit) */
PyObject *fuser_py_gate_source(PyObject *module, PyObject *noargs)
{
    (void)module, (void)noargs;
    return PyUnicode_FromString(fuser_gate_source());
}
