/* exchange.c: the tensor type registered for the per-call entry points (fuser.interop registers
 * torch.Tensor) and its DLPack C exchange API. A call of torch tensors then reaches C without the
 * protocol's Python call and capsule per tensor: exact instances of the exchange types (torch.Tensor,
 * nn.Parameter) are described in place through `dltensor_from_py_object_no_sync`, nothing allocated
 * or owned; other instances of the registered type (subclasses) go through the registered exporter,
 * as capsules. */
#include "binding.h"

#include <string.h>

#include "fuser/dlpack.h"

/* The exchange table `type` carries, of DLPack major version FUSER_DLPACK_MAJOR (following prev_api from
 * a newer one): 0 with *api set (NULL: the type carries none, or none of that major version); or -1 with
 * an exception set (an attribute that is not the protocol's capsule). */
static int exchange_of(PyObject *type, const DLPackExchangeAPI **api)
{
    *api = NULL;
    PyObject *cap = PyObject_GetAttrString(type, "__dlpack_c_exchange_api__");
    if (!cap) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    int rc = -1;
    if (!PyCapsule_IsValid(cap, FUSER_DLPACK_EXCHANGE_CAPSULE)) {
        PyErr_Format(PyExc_TypeError, "%s.__dlpack_c_exchange_api__ is not a capsule named '%s'",
                     ((PyTypeObject *)type)->tp_name, FUSER_DLPACK_EXCHANGE_CAPSULE);
        goto done;
    }
    const DLPackExchangeAPIHeader *hd = PyCapsule_GetPointer(cap, FUSER_DLPACK_EXCHANGE_CAPSULE);
    while (hd && hd->version.major > FUSER_DLPACK_MAJOR)
        hd = hd->prev_api;
    if (hd && hd->version.major == FUSER_DLPACK_MAJOR) {
        const DLPackExchangeAPI *a = (const DLPackExchangeAPI *)hd;
        /* the describing function may be NULL; the owning export then serves */
        if (a->dltensor_from_py_object_no_sync || a->managed_tensor_from_py_object_no_sync)
            *api = a;
    }
    rc = 0;
done:
    Py_DECREF(cap);
    return rc;
}

static void forget_registration(fuser_state *st)
{
    Py_CLEAR(st->tensor_type);
    Py_CLEAR(st->tensor_exporter);
    Py_CLEAR(st->exchange_types);
    st->exchange = NULL;
    st->n_exchange = 0;
    memset(st->exchange_exact, 0, sizeof st->exchange_exact);
}

/* register_tensor_type(type, exporter=None, exchange=()) -> (major, minor) or None */
PyObject *fuser_py_register_tensor_type(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"type", "exporter", "exchange", NULL};
    PyObject *type, *exporter = Py_None, *exchange = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OO!:register_tensor_type", kwlist, &type, &exporter,
                                     &PyTuple_Type, &exchange))
        return NULL;
    fuser_state *st = fuser_get_state(module);
    if (type == Py_None) {
        forget_registration(st);
        Py_RETURN_NONE;
    }
    if (!PyType_Check(type))
        return PyErr_Format(PyExc_TypeError, "type: expected a type or None, got %s", Py_TYPE(type)->tp_name);
    if (exporter != Py_None && !PyCallable_Check(exporter))
        return PyErr_Format(PyExc_TypeError, "exporter: expected a callable or None, got %s",
                            Py_TYPE(exporter)->tp_name);
    Py_ssize_t n = exchange ? PyTuple_GET_SIZE(exchange) : 0;
    if (n > FUSER_EXCHANGE_TYPES)
        return PyErr_Format(PyExc_ValueError, "exchange: at most %d types, got %zd", FUSER_EXCHANGE_TYPES, n);
    /* every exchange type must be `type` or a subclass carrying the very same table: its functions are
     * then valid for exact instances of each */
    const DLPackExchangeAPI *api = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(exchange, i);
        if (!PyType_Check(t) || !PyType_IsSubtype((PyTypeObject *)t, (PyTypeObject *)type))
            return PyErr_Format(PyExc_TypeError, "exchange: expected subclasses of %s, got %R",
                                ((PyTypeObject *)type)->tp_name, t);
        const DLPackExchangeAPI *a;
        if (exchange_of(t, &a))
            return NULL;
        if (i > 0 && a != api)
            return PyErr_Format(PyExc_ValueError, "exchange: %s carries another DLPack exchange API than %s",
                                ((PyTypeObject *)t)->tp_name,
                                ((PyTypeObject *)PyTuple_GET_ITEM(exchange, 0))->tp_name);
        api = a;
    }
    forget_registration(st);
    st->tensor_type = Py_NewRef(type);
    st->tensor_exporter = exporter == Py_None ? NULL : Py_NewRef(exporter);
    if (!api)
        Py_RETURN_NONE;
    st->exchange_types = Py_NewRef(exchange);
    for (Py_ssize_t i = 0; i < n; i++)
        st->exchange_exact[i] = (PyTypeObject *)PyTuple_GET_ITEM(exchange, i);
    st->n_exchange = (int)n;
    st->exchange = api;
    return Py_BuildValue("(II)", api->header.version.major, api->header.version.minor);
}

/* tensor_intake() -> dict */
PyObject *fuser_py_tensor_intake(PyObject *module, PyObject *noargs)
{
    (void)noargs;
    fuser_state *st = fuser_get_state(module);
    PyObject *version = st->exchange ? Py_BuildValue("(II)", st->exchange->header.version.major,
                                                     st->exchange->header.version.minor)
                                     : Py_NewRef(Py_None);
    PyObject *empty = PyTuple_New(0);
    if (!version || !empty) {
        Py_XDECREF(version);
        Py_XDECREF(empty);
        return NULL;
    }
    int describe = st->exchange && st->exchange->dltensor_from_py_object_no_sync;
    PyObject *res = Py_BuildValue("{s:O,s:O,s:O,s:N,s:O,s:K,s:K}",
                                  "type", st->tensor_type ? st->tensor_type : Py_None,
                                  "exporter", st->tensor_exporter ? st->tensor_exporter : Py_None,
                                  "exchange", st->exchange_types ? st->exchange_types : empty,
                                  "version", version, "describe", describe ? Py_True : Py_False,
                                  "exchanged", (unsigned long long)atomic_load(&st->n_exchanged),
                                  "exported", (unsigned long long)atomic_load(&st->n_exported));
    Py_DECREF(empty);
    return res;
}

int fuser_exchange_describe(fuser_state *st, PyObject *obj, DLTensor *out, fuser_held *h)
{
    const DLPackExchangeAPI *api = st->exchange;
    if (!api)
        return 0;
    PyTypeObject *tp = Py_TYPE(obj);
    int i = 0;
    while (i < st->n_exchange && st->exchange_exact[i] != tp)
        i++;
    if (i == st->n_exchange)
        return 0;
    /* a tensor the producer cannot describe (sparse, meta, quantized, nested): the exporter is asked,
     * which raises the error the capsule path has always raised */
    if (api->dltensor_from_py_object_no_sync) {
        if (api->dltensor_from_py_object_no_sync(obj, out)) {
            PyErr_Clear();
            return 0;
        }
    } else {
        DLManagedTensorVersioned *v = NULL;
        if (api->managed_tensor_from_py_object_no_sync(obj, &v) || !v) {
            PyErr_Clear();
            return 0;
        }
        h->managed = v;
        h->versioned = 1;
        if (v->version.major != FUSER_DLPACK_MAJOR) {
            fuser_release(h);
            memset(h, 0, sizeof *h);
            return 0;
        }
        h->flags = v->flags;
        *out = v->dl_tensor;   /* (its shape and strides live while h holds v) */
    }
    atomic_fetch_add_explicit(&st->n_exchanged, 1, memory_order_relaxed);
    return 1;
}

/* What tensor_layout() and tensor_signature() pack of one tensor, in int64 words: [data address,] its
 * exchange type's index, device, dtype, ndim, shape[ndim][, strides[ndim] in elements, computed where the
 * producer gives none]. */
enum { PACK_SIGNATURE = 0, PACK_LAYOUT = 1 };
#define PACK_WORDS (5 + 2 * FUSER_MAX_DIMS)

/* Pack `obj` into buf[*n ..) (at most cap words): 1 done; 0 obj is not a tensor of an exchange type, or
 * one the producer cannot describe, or past cap; no exception set either way. *data (when given) is its
 * first element's address where it is compact row-major (extent-1 dimensions' strides aside), else NULL. */
static int pack(fuser_state *st, PyObject *obj, int what, int64_t *buf, Py_ssize_t *n, Py_ssize_t cap,
                void **data)
{
    fuser_held h;
    DLTensor dl;
    memset(&h, 0, sizeof h);
    if (!fuser_exchange_describe(st, obj, &dl, &h))
        return 0;
    const DLTensor *d = h.managed ? &((DLManagedTensorVersioned *)h.managed)->dl_tensor : &dl;
    int nd = d->ndim;
    int ok = nd >= 0 && nd <= FUSER_MAX_DIMS && (nd == 0 || d->shape) &&
             *n + (what == PACK_LAYOUT) + 4 + (1 + (what == PACK_LAYOUT)) * nd <= cap;
    if (ok) {
        int64_t *o = buf + *n;
        if (what == PACK_LAYOUT)
            *o++ = (int64_t)(uintptr_t)((char *)d->data + d->byte_offset);
        int type = 0;
        while (st->exchange_exact[type] != Py_TYPE(obj))
            type++;
        o[0] = type;
        o[1] = (int64_t)d->device.device_type << 32 | (uint32_t)d->device.device_id;
        o[2] = (int64_t)d->dtype.code << 32 | (int64_t)d->dtype.bits << 16 | d->dtype.lanes;
        o[3] = nd;
        uint64_t expect = 1; /* unsigned: a product past int64 wraps instead of being undefined */
        int compact = 1;
        for (int i = nd - 1; i >= 0; i--) {
            int64_t stride = d->strides ? d->strides[i] : (int64_t)expect;
            o[4 + i] = d->shape[i];
            if (what == PACK_LAYOUT)
                o[4 + nd + i] = stride;
            compact = compact && (d->shape[i] == 1 || stride == (int64_t)expect);
            expect *= (uint64_t)d->shape[i];
        }
        *n += (what == PACK_LAYOUT) + 4 + (1 + (what == PACK_LAYOUT)) * nd;
        if (data)
            *data = compact ? (char *)d->data + d->byte_offset : NULL;
    }
    fuser_release(&h);
    return ok;
}

/* tensor_layout(*tensors) -> bytes or None */
PyObject *fuser_py_tensor_layout(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t buf[8 * PACK_WORDS];
    Py_ssize_t used = 0;
    if (nargs > 8)
        return PyErr_Format(PyExc_TypeError, "tensor_layout: at most 8 tensors, got %zd", nargs);
    for (Py_ssize_t i = 0; i < nargs; i++) {
        if (args[i] == Py_None)
            buf[used++] = -1;
        else if (!pack(fuser_get_state(module), args[i], PACK_LAYOUT, buf, &used, 8 * PACK_WORDS, NULL))
            Py_RETURN_NONE;
    }
    return PyBytes_FromStringAndSize((const char *)buf, used * (Py_ssize_t)sizeof buf[0]);
}

/* tensor_signature(x) -> bytes or None */
PyObject *fuser_py_tensor_signature(PyObject *module, PyObject *x)
{
    int64_t buf[PACK_WORDS];
    Py_ssize_t used = 0;
    if (!pack(fuser_get_state(module), x, PACK_SIGNATURE, buf, &used, PACK_WORDS, NULL))
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)buf, used * (Py_ssize_t)sizeof buf[0]);
}

/* Whether every row (registry, name, owner, parameters, pname, p, ...) of `held` still holds and the
 * p's of the rows in the bit mask `laid` (bit i: row i) have tensor_layout `layout`: 1, 0, or -1 with an
 * exception set. A row left out of `laid` is checked for identity alone (the same Parameter registered
 * under its name), which is all a caller needs that reads the Parameter itself at each call. */
static int weights_unchanged(fuser_state *st, PyObject *held, PyObject *layout, unsigned long laid)
{
    if (!PyTuple_Check(held) || !PyBytes_Check(layout)) {
        PyErr_SetString(PyExc_TypeError, "held: expected a tuple, layout: bytes");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(held);
    if (n > 8) {
        PyErr_Format(PyExc_ValueError, "held: at most 8 weights, got %zd", n);
        return -1;
    }
    int64_t buf[8 * PACK_WORDS];
    Py_ssize_t used = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyTuple_GET_ITEM(held, i);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) < 6 || !PyDict_Check(PyTuple_GET_ITEM(row, 0)) ||
            !PyDict_Check(PyTuple_GET_ITEM(row, 3))) {
            PyErr_Format(PyExc_TypeError, "held[%zd]: expected (registry, name, owner, parameters, pname, p, ...)",
                         i);
            return -1;
        }
        /* the same owner registered under its name, holding the same Parameter under its name */
        PyObject *owner = PyDict_GetItemWithError(PyTuple_GET_ITEM(row, 0), PyTuple_GET_ITEM(row, 1));
        if (owner != PyTuple_GET_ITEM(row, 2))
            return PyErr_Occurred() ? -1 : 0;
        PyObject *p = PyDict_GetItemWithError(PyTuple_GET_ITEM(row, 3), PyTuple_GET_ITEM(row, 4));
        if (p != PyTuple_GET_ITEM(row, 5))
            return PyErr_Occurred() ? -1 : 0;
        /* each laid one still at the same address with the same dtype, device, shape and strides */
        if ((laid >> i & 1) && !pack(st, p, PACK_LAYOUT, buf, &used, 8 * PACK_WORDS, NULL))
            return 0;
    }
    Py_ssize_t bytes = used * (Py_ssize_t)sizeof buf[0];
    return PyBytes_GET_SIZE(layout) == bytes && !memcmp(PyBytes_AS_STRING(layout), buf, (size_t)bytes);
}

/* kept_match(x, signature, held, layout, laid=-1) -> int or None */
PyObject *fuser_py_kept_match(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 4 && nargs != 5) || !PyBytes_Check(args[1]) || (nargs == 5 && !PyLong_Check(args[4])))
        return PyErr_Format(PyExc_TypeError, "kept_match(x, signature: bytes, held, layout, laid: int = -1)");
    unsigned long laid = nargs == 5 ? PyLong_AsUnsignedLongMask(args[4]) : ~0UL;
    if (laid == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    fuser_state *st = fuser_get_state(module);
    int64_t buf[PACK_WORDS];
    Py_ssize_t used = 0;
    void *data = NULL;
    if (!pack(st, args[0], PACK_SIGNATURE, buf, &used, PACK_WORDS, &data))
        Py_RETURN_NONE;
    Py_ssize_t bytes = used * (Py_ssize_t)sizeof buf[0];
    if (PyBytes_GET_SIZE(args[1]) != bytes || memcmp(PyBytes_AS_STRING(args[1]), buf, (size_t)bytes))
        Py_RETURN_NONE;
    int same = weights_unchanged(st, args[2], args[3], laid);
    if (same <= 0)
        return same < 0 ? NULL : Py_NewRef(Py_None);
    return PyLong_FromVoidPtr(data);
}
