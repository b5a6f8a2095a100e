/* intake.c: DLPack intake. Objects with __dlpack__ and raw capsules of both kinds come in here, are
 * consumed by the protocol's rules (rename to used_*, delete exactly once, also on every error path),
 * or only borrowed (capsules fuser exported itself, read again later), and validated by the core
 * (fuser_tensor_from_dl). Instances of the registered tensor type (torch.Tensor) may come in without
 * the protocol's Python call: described through their type's DLPack C exchange API (exchange.c), or
 * exported by the registered exporter. */
#include "binding.h"

#include <string.h>

#include "fuser/dlpack.h"

void fuser_release(fuser_held *h)
{
    void *m = h->managed;
    h->managed = NULL;
    if (!m)
        return;
    /* a deleter may run Python code (a producer written in Python): it must not see, or clobber, the
     * exception we may be about to raise */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (h->versioned) {
        DLManagedTensorVersioned *v = m;
        if (v->deleter)
            v->deleter(v);
    } else {
        DLManagedTensor *t = m;
        if (t->deleter)
            t->deleter(t);
    }
    if (PyErr_Occurred())
        PyErr_WriteUnraisable(NULL); /* a failing deleter: report it, keep our own error */
    PyErr_Restore(type, value, tb);
}

/* Prefix the pending exception's message with "name: ". A producer that cannot export the object
 * (BufferError, or a RuntimeError or AssertionError from its own checks: sparse, quantized, meta or
 * nested tensors, numpy object arrays) raises TypeError, the object is not a tensor fuser can take;
 * other types are kept. The original stays attached as the cause. */
static void prefix_error(const char *name)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value) {
        PyObject *msg = PyObject_Str(value);
        if (msg) {
            if (PyErr_GivenExceptionMatches(type, PyExc_BufferError) ||
                PyErr_GivenExceptionMatches(type, PyExc_RuntimeError) ||
                PyErr_GivenExceptionMatches(type, PyExc_AssertionError))
                PyErr_Format(PyExc_TypeError, "%s: cannot be taken through DLPack (%s: %U)", name,
                             ((PyTypeObject *)type)->tp_name, msg);
            else
                PyErr_Format(type, "%s: %U", name, msg);
            Py_DECREF(msg);
            PyObject *t2, *v2, *tb2;
            PyErr_Fetch(&t2, &v2, &tb2);
            PyErr_NormalizeException(&t2, &v2, &tb2);
            if (v2)
                PyException_SetCause(v2, Py_NewRef(value));
            PyErr_Restore(t2, v2, tb2);
            Py_DECREF(type);
            Py_DECREF(value);
            Py_XDECREF(tb);
            return;
        }
    }
    PyErr_Restore(type, value, tb);
}

/* Export a capsule from an object with __dlpack__, passing the stream and max_version=(1, 0). */
static PyObject *export_capsule(fuser_state *st, PyObject *obj, const char *name, PyObject *stream)
{
    PyObject *meth = PyObject_GetAttr(obj, st->s_dlpack);
    if (!meth) {
        PyErr_Clear();
        return PyErr_Format(PyExc_TypeError,
                            "%s: expected a tensor (an object with __dlpack__, such as a torch.Tensor) or a "
                            "DLPack capsule, got %s", name, Py_TYPE(obj)->tp_name);
    }
    /* the device decides the stream argument: CUDA gets the caller's stream, others None */
    PyObject *use_stream = Py_None;
    PyObject *dev = PyObject_CallMethodNoArgs(obj, st->s_dlpack_device);
    if (!dev) {
        Py_DECREF(meth);
        prefix_error(name);
        return NULL;
    }
    long dev_type = -1;
    if (PyTuple_Check(dev) && PyTuple_GET_SIZE(dev) == 2)
        dev_type = PyLong_AsLong(PyTuple_GET_ITEM(dev, 0));
    Py_DECREF(dev);
    if (dev_type == -1 && PyErr_Occurred())
        PyErr_Clear();
    PyObject *one = NULL;
    if (dev_type == kDLCUDA && stream != Py_None) {
        use_stream = stream;
        int zero = PyLong_Check(stream) && PyLong_AsLong(stream) == 0;
        if (zero) /* the protocol forbids 0: the legacy default stream is 1 */
            use_stream = one = PyLong_FromLong(1);
    }
    PyObject *kw = PyDict_New();
    PyObject *cap = NULL;
    if (kw && use_stream && !PyDict_SetItem(kw, st->s_stream, use_stream) &&
        !PyDict_SetItem(kw, st->s_max_version, st->max_version)) {
        PyObject *empty = PyTuple_New(0);
        if (empty) {
            cap = PyObject_Call(meth, empty, kw);
            if (!cap && PyErr_ExceptionMatches(PyExc_TypeError)) {
                /* a producer that predates max_version: ask again without it (legacy capsule) */
                PyErr_Clear();
                PyDict_DelItem(kw, st->s_max_version);
                cap = PyObject_Call(meth, empty, kw);
            }
            Py_DECREF(empty);
        }
        if (!cap)
            prefix_error(name);
    }
    Py_XDECREF(kw);
    Py_XDECREF(one);
    Py_DECREF(meth);
    return cap;
}

/* Read a DLPack capsule: its DLTensor in *dl, 0; or -1 with an exception set. Consumed (renamed used_*,
 * its managed tensor then owned by h) unless FUSER_TAKE_BORROW is set. */
static int open_capsule(PyObject *cap, const char *name, int opts, fuser_held *h, const DLTensor **dl)
{
    const char *cname = PyCapsule_GetName(cap);
    if (cname && !strcmp(cname, FUSER_DLPACK_CAPSULE_VERSIONED)) {
        DLManagedTensorVersioned *v = PyCapsule_GetPointer(cap, cname);
        if (!v)
            return -1;
        if (!(opts & FUSER_TAKE_BORROW)) {
            if (PyCapsule_SetName(cap, FUSER_DLPACK_CAPSULE_VERSIONED_USED))
                return -1;
            h->managed = v; /* ours from here on: deleted exactly once by fuser_release */
        }
        h->versioned = 1;
        h->flags = v->flags;
        if (v->version.major != FUSER_DLPACK_MAJOR) {
            PyErr_Format(PyExc_ValueError,
                         "%s: DLPack version %u.%u is not supported; fuser understands %d.x", name,
                         v->version.major, v->version.minor, FUSER_DLPACK_MAJOR);
            return -1;
        }
        *dl = &v->dl_tensor;
        return 0;
    }
    if (cname && !strcmp(cname, FUSER_DLPACK_CAPSULE)) {
        DLManagedTensor *t = PyCapsule_GetPointer(cap, cname);
        if (!t)
            return -1;
        if (!(opts & FUSER_TAKE_BORROW)) {
            if (PyCapsule_SetName(cap, FUSER_DLPACK_CAPSULE_USED))
                return -1;
            h->managed = t;
        }
        *dl = &t->dl_tensor;
        return 0;
    }
    if (cname &&
        (!strcmp(cname, FUSER_DLPACK_CAPSULE_USED) || !strcmp(cname, FUSER_DLPACK_CAPSULE_VERSIONED_USED)))
        PyErr_Format(PyExc_ValueError,
                     "%s: this DLPack capsule was already consumed (a capsule can be read only once); "
                     "export a new one with __dlpack__()", name);
    else
        PyErr_Format(PyExc_TypeError, "%s: a capsule named '%s' is not a DLPack capsule", name,
                     cname ? cname : "(null)");
    return -1;
}

/* A capsule of `obj`, an instance of the registered tensor type, from the registered exporter (what
 * fuser.interop.export makes of it); NULL with an exception set. Any other object is a TypeError. */
static PyObject *export_registered(fuser_state *st, PyObject *obj, const char *name)
{
    PyTypeObject *type = (PyTypeObject *)st->tensor_type;
    if (!type || !PyObject_TypeCheck(obj, type))
        return PyErr_Format(PyExc_TypeError, "%s: expected a %s, got %s", name,
                            type ? type->tp_name : "tensor of a registered type", Py_TYPE(obj)->tp_name);
    if (!st->tensor_exporter)
        return PyErr_Format(PyExc_TypeError, "%s: no exporter is registered for a %s that is not exactly one of the "
                            "exchange types", name, Py_TYPE(obj)->tp_name);
    PyObject *cap = PyObject_CallOneArg(st->tensor_exporter, obj);
    if (!cap) {
        prefix_error(name);
        return NULL;
    }
    if (!PyCapsule_CheckExact(cap)) {
        PyErr_Format(PyExc_TypeError, "%s: the registered exporter returned %s, not a DLPack capsule", name,
                     Py_TYPE(cap)->tp_name);
        Py_DECREF(cap);
        return NULL;
    }
    atomic_fetch_add_explicit(&st->n_exported, 1, memory_order_relaxed);
    return cap;
}

int fuser_take(fuser_state *st, PyObject *obj, const char *name, PyObject *stream, int opts, fuser_held *h)
{
    memset(h, 0, sizeof *h);
    PyObject *cap = NULL;
    DLTensor described;
    const DLTensor *dl = NULL;
    int rc = -1;
    if (PyCapsule_CheckExact(obj)) {
        if (opts & FUSER_TAKE_NO_CAPSULE) {
            PyErr_Format(PyExc_TypeError,
                         "%s: got a raw DLPack capsule; pass a tensor instead (a capsule can be consumed only "
                         "once), e.g. torch.from_dlpack(capsule)", name);
            return -1;
        }
        cap = Py_NewRef(obj);
    } else if (opts & FUSER_TAKE_REGISTERED) {
        if (fuser_exchange_describe(st, obj, &described, h))
            dl = h->managed ? &((DLManagedTensorVersioned *)h->managed)->dl_tensor : &described;
        else if (!(cap = export_registered(st, obj, name)))
            return -1;
        opts &= ~FUSER_TAKE_BORROW; /* a capsule made here is ours to consume */
    } else {
        cap = export_capsule(st, obj, name, stream);
        if (!cap)
            return -1;
        if (!PyCapsule_CheckExact(cap)) {
            PyErr_Format(PyExc_TypeError, "%s: __dlpack__ returned %s, not a DLPack capsule", name,
                         Py_TYPE(cap)->tp_name);
            Py_DECREF(cap);
            return -1;
        }
    }
    if (cap && open_capsule(cap, name, opts, h, &dl))
        goto done;

    if (opts & FUSER_TAKE_WRITABLE) {
        if (h->flags & FUSER_DLPACK_FLAG_READ_ONLY) {
            PyErr_Format(PyExc_ValueError, "%s: the tensor was exported read-only; pass a writable tensor", name);
            goto done;
        }
        if (h->flags & FUSER_DLPACK_FLAG_IS_COPIED) {
            PyErr_Format(PyExc_ValueError,
                         "%s: the producer exported a copy, so results written to it would be lost; pass a "
                         "tensor that can be shared without copying", name);
            goto done;
        }
    }
    fuser_err err;
    fuser_err_clear(&err);
    if (fuser_tensor_from_dl(dl, name, &h->t, &err)) {
        fuser_raise(st, &err);
        goto done;
    }
    rc = 0;
done:
    Py_XDECREF(cap);
    return rc;
}

/* _C.dlpack_info(obj, stream=None, writable=False) -> dict: take one tensor in, describe it, release
 * it. The same path every fuser op uses; handy for debugging a producer. */
PyObject *fuser_py_dlpack_info(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"obj", "stream", "writable", NULL};
    PyObject *obj, *stream = Py_None;
    int writable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|Op:dlpack_info", kwlist, &obj, &stream, &writable))
        return NULL;
    fuser_state *st = fuser_get_state(module);
    fuser_held h;
    PyObject *res = NULL;
    if (fuser_take(st, obj, "obj", stream, writable ? FUSER_TAKE_WRITABLE : 0, &h) == 0) {
        PyObject *shape = PyTuple_New(h.t.ndim);
        for (int i = 0; shape && i < h.t.ndim; i++)
            PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(h.t.shape[i]));
        if (shape)
            res = Py_BuildValue("{s:K,s:N,s:s,s:s,s:i,s:L,s:L,s:O,s:K}",
                                "data", (unsigned long long)(uintptr_t)h.t.data, "shape", shape,
                                "dtype", fuser_dtype_name(h.t.dtype),
                                "device", h.t.device == FUSER_CPU ? "cpu" : "cuda", "device_id", h.t.device_id,
                                "numel", (long long)h.t.numel, "nbytes", (long long)h.t.nbytes,
                                "versioned", h.versioned ? Py_True : Py_False, "flags",
                                (unsigned long long)h.flags);
    }
    fuser_release(&h);
    return res;
}

int fuser_take_scales(fuser_state *st, PyObject *scales, PyObject *stream, int opts, unsigned borrow,
                      fuser_held *held, const fuser_tensor **t)
{
    for (int i = 0; i < FUSER_NUM_SCALES; i++)
        t[i] = NULL;
    if (!scales || scales == Py_None)
        return 0;
    PyObject *seq = PySequence_Fast(scales, "scales: expected None or a sequence of 5 tensors (x, up, gate, down, "
                                            "h: fuser.fp8.Scales)");
    if (!seq)
        return -1;
    int rc = 0;
    if (PySequence_Fast_GET_SIZE(seq) != FUSER_NUM_SCALES) {
        PyErr_Format(PyExc_ValueError, "scales: expected 5 entries (x, up, gate, down, h: fuser.fp8.Scales), got %zd",
                     PySequence_Fast_GET_SIZE(seq));
        rc = -1;
    }
    for (int i = 0; !rc && i < FUSER_NUM_SCALES; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
        if (o == Py_None)
            continue;
        const int o_i = (borrow >> i) & 1 ? (opts & ~FUSER_TAKE_NO_CAPSULE) | FUSER_TAKE_BORROW : opts;
        rc = fuser_take(st, o, fuser_scale_name(i), stream, o_i, &held[i]);
        if (!rc)
            t[i] = &held[i].t;
    }
    Py_DECREF(seq);
    return rc;
}
