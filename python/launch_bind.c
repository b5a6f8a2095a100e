/* launch_bind.c: run fused plans on the GPU: _C.load_kernel (a compiled plan's CUBIN into the current
 * context of a device) and _C.ffn_launch (take the tensors through DLPack, check them against the
 * kernel's own chain so a mismatch can never become an out-of-bounds access, launch on the caller's
 * stream). No synchronisation, no allocation, no compilation in the launch path. */
#include "binding.h"

#include <stdlib.h>
#include <string.h>

#include "fuser/chain.h"
#include "fuser/cuda.h"
#include "fuser/ffn_launch.h"
#include "fuser/plan.h"

#define KERNEL_CAPSULE "fuser.kernel"
#define SCRATCH_CAPSULE "fuser.scratch"

/* Scratch for inter_cluster_reduce: [tickets_cap int32 tickets, zeroed][workspace floats]. */
typedef struct {
    fuser_scratch s;
    long long tickets_cap, floats;
} scratch_obj;

static void scratch_free(PyObject *cap)
{
    scratch_obj *o = PyCapsule_GetPointer(cap, SCRATCH_CAPSULE);
    if (!o)
        return;
    fuser_err err;
    const fuser_driver *drv = fuser_driver_get(&err);
    if (drv)
        fuser_scratch_free(drv, &o->s, &err); /* stream-ordered; a failure here has no one to tell */
    free(o);
}

/* scratch_alloc(device, tickets_cap, ws_floats, stream) -> scratch */
PyObject *fuser_py_scratch_alloc(PyObject *module, PyObject *args)
{
    int device;
    long long tickets_cap, ws_floats;
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "iLLK:scratch_alloc", &device, &tickets_cap, &ws_floats, &stream))
        return NULL;
    if (tickets_cap < 0 || ws_floats < 0 || tickets_cap + ws_floats < 1)
        return PyErr_Format(PyExc_ValueError, "scratch_alloc: need a positive size, got %lld tickets + %lld floats",
                            tickets_cap, ws_floats);
    scratch_obj *o = calloc(1, sizeof *o);
    if (!o)
        return PyErr_NoMemory();
    fuser_err err;
    fuser_err_clear(&err);
    const fuser_driver *drv = fuser_driver_get(&err);
    int rc = drv ? FUSER_OK : err.code;
    if (drv) {
        Py_BEGIN_ALLOW_THREADS
        rc = fuser_scratch_alloc(drv, device, (size_t)(tickets_cap + ws_floats) * 4, (size_t)tickets_cap * 4,
                                 (fuser_cu_stream)(uintptr_t)stream, &o->s, &err);
        Py_END_ALLOW_THREADS
    }
    if (rc) {
        free(o);
        return fuser_raise(fuser_get_state(module), &err);
    }
    o->tickets_cap = tickets_cap;
    o->floats = tickets_cap + ws_floats;
    PyObject *cap = PyCapsule_New(o, SCRATCH_CAPSULE, scratch_free);
    if (!cap) {
        fuser_scratch_free(drv, &o->s, &err);
        free(o);
    }
    return cap;
}

/* A loaded plan (fuser_ffn_kernel). Modules stay loaded for the life of the process (a launch may still
 * be queued when Python drops the object); the host-side struct is freed with the capsule. */
static fuser_ffn_kernel *get_loaded(PyObject *obj)
{
    return fuser_capsule_get(obj, KERNEL_CAPSULE, "kernel", "a kernel from fuser._C.load_kernel");
}

PyObject *fuser_py_load_kernel(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"plan", "target", "cubin", "device", NULL};
    PyObject *pd, *td;
    Py_buffer cubin;
    int device = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOy*i:load_kernel", kwlist, &pd, &td, &cubin, &device))
        return NULL;
    fuser_target t;
    fuser_plan plan;
    fuser_ffn_kernel *l = calloc(1, sizeof *l);
    PyObject *res = NULL;
    if (!l) {
        PyErr_NoMemory();
        goto done;
    }
    if (fuser_target_from_obj(td, &t) || fuser_plan_from_obj(fuser_get_state(module), pd, &t, &plan))
        goto done;
    if (!plan.fused) {
        PyErr_SetString(PyExc_ValueError, "plan: an unfused plan has no kernel to load");
        goto done;
    }
    fuser_err err;
    fuser_err_clear(&err);
    const fuser_driver *drv = fuser_driver_get(&err);
    int rc = drv ? FUSER_OK : err.code;
    if (drv) {
        Py_BEGIN_ALLOW_THREADS
        rc = fuser_ffn_kernel_load(drv, device, cubin.buf, &plan, l, &err);
        Py_END_ALLOW_THREADS
    }
    if (rc) {
        fuser_raise(fuser_get_state(module), &err);
        goto done;
    }
    res = PyCapsule_New(l, KERNEL_CAPSULE, fuser_capsule_free);
    if (res)
        l = NULL;
done:
    free(l);
    PyBuffer_Release(&cubin);
    return res;
}

PyObject *fuser_py_kernel_info(PyObject *module, PyObject *args)
{
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "O:kernel_info", &obj))
        return NULL;
    fuser_ffn_kernel *l = get_loaded(obj);
    if (!l)
        return NULL;
    int clusters = 0;
    fuser_err err;
    fuser_err_clear(&err);
    const fuser_driver *drv = fuser_driver_get(&err);
    fuser_dim3 block = {(unsigned)l->plan.threads, 1, 1}, cluster = {(unsigned)l->plan.cluster_size, 1, 1};
    if (!drv || fuser_kernel_max_active_clusters(drv, &l->k, block, cluster, (unsigned)l->plan.smem_bytes,
                                                 &clusters, &err))
        return fuser_raise(fuser_get_state(module), &err);
    return Py_BuildValue("{s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "registers", l->k.num_regs, "local_bytes",
                         l->k.local_bytes, "static_shared_bytes", l->k.static_smem_bytes, "dynamic_shared_bytes",
                         l->plan.smem_bytes, "device", l->k.device, "max_active_clusters", clusters,
                         "persistent_clusters", l->max_active);
}

/* scratch_need(kernel, m) -> (zeroed words, workspace floats) a launch with m tokens needs */
PyObject *fuser_py_scratch_need(PyObject *module, PyObject *args)
{
    PyObject *obj;
    long long m;
    (void)module;
    if (!PyArg_ParseTuple(args, "OL:scratch_need", &obj, &m))
        return NULL;
    fuser_ffn_kernel *l = get_loaded(obj);
    if (!l)
        return NULL;
    if (m < 0)
        return PyErr_Format(PyExc_ValueError, "scratch_need: m must be >= 0, got %lld", m);
    int64_t zw, wf;
    fuser_plan_scratch(&l->plan, m, &zw, &wf);
    return Py_BuildValue("(LL)", (long long)zw, (long long)wf);
}

/* stream_exact_boxes([on]) -> the setting before the call (fuser_stream_exact_boxes; no argument: read it) */
PyObject *fuser_py_stream_exact_boxes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs > 1 || (nargs == 1 && !PyBool_Check(args[0])))
        return PyErr_Format(PyExc_TypeError, "stream_exact_boxes([on: bool]): got %zd arguments%s", nargs,
                            nargs == 1 ? " (not a bool)" : "");
    return PyBool_FromLong(fuser_stream_exact_boxes(nargs ? args[0] == Py_True : -1));
}

/* stream_lead_bytes([bytes]) -> the setting before the call (fuser_stream_lead_bytes; no argument: read it) */
PyObject *fuser_py_stream_lead_bytes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    long bytes = -1;
    if (nargs > 1 || (nargs == 1 && (PyBool_Check(args[0]) || !PyLong_Check(args[0]))))
        return PyErr_Format(PyExc_TypeError, "stream_lead_bytes([bytes: int]): got %zd arguments%s", nargs,
                            nargs == 1 ? " (not an int)" : "");
    if (nargs == 1 && ((bytes = PyLong_AsLong(args[0])) < 0 || bytes > (1L << 20)))
        return PyErr_Occurred() ? NULL
                                : PyErr_Format(PyExc_ValueError,
                                               "stream_lead_bytes: %ld bytes; give 0 (the whole ring at once) to "
                                               "1048576", bytes);
    return PyLong_FromLong(fuser_stream_lead_bytes((int)bytes));
}

/* The arguments launch and prepare share, taken and validated: ffn_launch's positional ones. */
enum { X, WU, WD, WG, BU, BG, BD, Y, NT };

typedef struct {
    fuser_ffn_kernel *k;
    scratch_obj *sc;
    fuser_held h[NT], th, sh[FUSER_NUM_SCALES];
    fuser_ffn_args a;
    fuser_chain c;
    PyObject *stream_obj;
} taken;

static void release_taken(taken *tk)
{
    for (int i = 0; i < NT; i++)
        fuser_release(&tk->h[i]);
    fuser_release(&tk->th);
    for (int i = 0; i < FUSER_NUM_SCALES; i++)
        fuser_release(&tk->sh[i]);
    Py_XDECREF(tk->stream_obj);
}

/* Take kernel, tensors (obj[NT]), scratch and trace (None: none) in and validate them against each
 * other; 0, or -1 with an exception set. Either way the caller calls release_taken once. */
static int take_all(PyObject *module, taken *tk, PyObject *kobj, PyObject *const obj[NT], const char *activation,
                    PyObject *sobj, unsigned long long stream, int borrow, PyObject *tobj, PyObject *scales)
{
    static const char *const names[NT] = {"x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down", "y"};
    memset(tk, 0, sizeof *tk);
    if (!(tk->k = get_loaded(kobj)))
        return -1;
    if (!(tk->sc = fuser_capsule_get(sobj, SCRATCH_CAPSULE, "scratch", "a scratch from fuser._C.scratch_alloc")))
        return -1;
    fuser_state *st = fuser_get_state(module);
    /* the stream: the caller's current one; __dlpack__ then needs no cross-stream synchronisation */
    if (!(tk->stream_obj = PyLong_FromUnsignedLongLong(stream)))
        return -1;
    const fuser_tensor *t[NT] = {NULL};
    for (int i = 0; i < NT; i++) {
        if (obj[i] == Py_None)
            continue;
        if (fuser_take(st, obj[i], names[i], tk->stream_obj,
                       (i == Y ? FUSER_TAKE_WRITABLE : 0) | (borrow >> i & 1 ? FUSER_TAKE_BORROW : 0), &tk->h[i]))
            return -1;
        t[i] = &tk->h[i].t;
    }
    if (!t[Y]) {
        PyErr_SetString(PyExc_ValueError, "ffn_launch: y is required");
        return -1;
    }
    if (tobj != Py_None && fuser_take(st, tobj, "trace", tk->stream_obj, FUSER_TAKE_WRITABLE, &tk->th))
        return -1;
    tk->a = (fuser_ffn_args){t[X], t[WU], t[WD], t[WG], t[BU], t[BG], t[BD], t[Y], activation, {NULL}};
    if (fuser_take_scales(st, scales, tk->stream_obj, 0, 0, tk->sh, tk->a.scale))
        return -1;
    fuser_err err;
    fuser_err_clear(&err);
    if (fuser_ffn_validate(&tk->a, &tk->c, &err)) {
        fuser_raise(st, &err);
        return -1;
    }
    return 0;
}

static fuser_scratch_view view_of(const scratch_obj *sc)
{
    return (fuser_scratch_view){sc->s.ptr, sc->s.device, sc->tickets_cap, sc->floats - sc->tickets_cap};
}

PyObject *fuser_py_ffn_launch(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"kernel", "x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down", "activation",
                             "y", "scratch", "stream", "borrow", "trace", "overlap", "scales", NULL};
    PyObject *kobj, *sobj, *obj[NT] = {NULL};
    const char *activation;
    unsigned long long stream = 0;
    int borrow = 0; /* bit i: read capsule i without consuming it (the caller keeps it for later launches) */
    PyObject *tobj = Py_None, *scales = Py_None;
    int overlap = 1; /* 0: never start before the stream's previous kernel ends (measurement) */
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOsOOK|iOpO:ffn_launch", kwlist, &kobj, &obj[X], &obj[WU],
                                     &obj[WD], &obj[WG], &obj[BU], &obj[BG], &obj[BD], &activation, &obj[Y], &sobj,
                                     &stream, &borrow, &tobj, &overlap, &scales))
        return NULL;
    taken tk;
    PyObject *res = NULL;
    if (!take_all(module, &tk, kobj, obj, activation, sobj, stream, borrow, tobj, scales)) {
        fuser_err err;
        fuser_err_clear(&err);
        const fuser_scratch_view view = view_of(tk.sc);
        const fuser_driver *drv = fuser_driver_get(&err);
        int rc = drv ? fuser_ffn_launch(drv, tk.k, &tk.a, &tk.c, &view, tobj != Py_None ? &tk.th.t : NULL,
                                        overlap ? FUSER_OVERLAP_DEFAULT : FUSER_OVERLAP_NEVER,
                                        (fuser_cu_stream)(uintptr_t)stream, &err)
                     : err.code;
        if (rc)
            fuser_raise(fuser_get_state(module), &err);
        else
            res = Py_NewRef(Py_None);
    }
    release_taken(&tk);
    return res;
}

/* A prepared launch: the core's struct and what keeps its memory alive (the kernel, the scratch and
 * the weights it points at). */
#define PREPARED_CAPSULE "fuser.prepared"

typedef struct {
    fuser_ffn_prepared p;
    PyObject *keep;
    int weights_each_run; /* prepared with keep=False: it holds no weights; every run names them */
} prepared_obj;

static void prepared_free(PyObject *cap)
{
    prepared_obj *o = PyCapsule_GetPointer(cap, PREPARED_CAPSULE);
    if (!o)
        return;
    Py_XDECREF(o->keep);
    free(o);
}

PyObject *fuser_py_ffn_prepare(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"kernel", "x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down", "activation",
                             "y", "scratch", "stream", "borrow", "overlap", "keep", "scales", NULL};
    PyObject *kobj, *sobj, *obj[NT] = {NULL}, *scales = Py_None;
    const char *activation;
    unsigned long long stream = 0;
    int borrow = 0, overlap = 1, keep = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOsOOK|ippO:ffn_prepare", kwlist, &kobj, &obj[X], &obj[WU],
                                     &obj[WD], &obj[WG], &obj[BU], &obj[BG], &obj[BD], &activation, &obj[Y], &sobj,
                                     &stream, &borrow, &overlap, &keep, &scales))
        return NULL;
    for (int i = WU; i <= BD && keep; i++)
        if (obj[i] != Py_None && PyCapsule_CheckExact(obj[i]) && !(borrow >> i & 1))
            return PyErr_Format(PyExc_ValueError, "ffn_prepare: weight capsules must be borrowed (bit %d of borrow): "
                                "the prepared launch keeps pointing at their memory", i);
    prepared_obj *o = calloc(1, sizeof *o);
    if (!o)
        return PyErr_NoMemory();
    taken tk;
    PyObject *res = NULL;
    if (!take_all(module, &tk, kobj, obj, activation, sobj, stream, borrow, Py_None, scales)) {
        fuser_err err;
        fuser_err_clear(&err);
        const fuser_scratch_view view = view_of(tk.sc);
        const fuser_driver *drv = fuser_driver_get(&err);
        int rc = drv ? fuser_ffn_prepare(drv, tk.k, &tk.a, &tk.c, &view, NULL,
                                         overlap ? FUSER_OVERLAP_DEFAULT : FUSER_OVERLAP_NEVER,
                                         (fuser_cu_stream)(uintptr_t)stream, &o->p, &err)
                     : err.code;
        if (rc)
            fuser_raise(fuser_get_state(module), &err);
        else if ((o->keep = keep ? PyTuple_Pack(9, kobj, sobj, obj[WU], obj[WD], obj[WG], obj[BU], obj[BG], obj[BD], scales)
                                 : PyTuple_Pack(3, kobj, sobj, scales)) &&
                 (res = PyCapsule_New(o, PREPARED_CAPSULE, prepared_free))) {
            o->weights_each_run = !keep;
            o = NULL;
        }
    }
    release_taken(&tk);
    if (o) {
        Py_XDECREF(o->keep);
        free(o);
    }
    return res;
}

/* A pointer argument of ffn_run: an int address, None (the prepared one), or a tensor: its data_ptr(),
 * read through the DLPack C exchange API for the registered exchange types (torch.Tensor, Parameter),
 * else by calling the method. */
static int pointer_arg(fuser_state *st, PyObject *v, const char *name, const void **out)
{
    if (v == Py_None) {
        *out = NULL;
        return 0;
    }
    PyObject *addr = NULL;
    if (!PyLong_Check(v)) {
        fuser_held h;
        DLTensor dl;
        memset(&h, 0, sizeof h);
        if (fuser_exchange_describe(st, v, &dl, &h)) {
            const DLTensor *d = h.managed ? &((DLManagedTensorVersioned *)h.managed)->dl_tensor : &dl;
            *out = d->data ? (const char *)d->data + d->byte_offset : NULL;
            fuser_release(&h);
            return 0;
        }
        addr = PyObject_HasAttrString(v, "data_ptr") ? PyObject_CallMethod(v, "data_ptr", NULL) : NULL;
        if (!addr || !PyLong_Check(addr)) {
            Py_XDECREF(addr);
            PyErr_Format(PyExc_TypeError, "ffn_run: %s: expected an address (int), a tensor or None, got %s", name,
                         Py_TYPE(v)->tp_name);
            return -1;
        }
        v = addr;
    }
    *out = PyLong_AsVoidPtr(v);
    Py_XDECREF(addr);
    return *out || !PyErr_Occurred() ? 0 : -1;
}

PyObject *fuser_py_ffn_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    static const char *const names[] = {"x", "y", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down"};
    static const int slot[] = {X, Y, WU, WD, WG, BU, BG, BD};
    if (nargs != 3 && nargs != 9)
        return PyErr_Format(PyExc_TypeError, "ffn_run(prepared, x_ptr, y_ptr[, w_up, w_down, w_gate, b_up, b_gate, "
                            "b_down]): got %zd arguments", nargs);
    prepared_obj *o = fuser_capsule_get(args[0], PREPARED_CAPSULE, "prepared", "a launch from fuser._C.ffn_prepare");
    if (!o)
        return NULL;
    if (nargs == 3 && o->weights_each_run)
        return PyErr_Format(PyExc_ValueError, "ffn_run: this launch was prepared with keep=False and holds no weights: "
                            "pass their addresses");
    const void *ptr[NT] = {NULL};
    fuser_state *st = fuser_get_state(module);
    for (Py_ssize_t i = 1; i < nargs; i++)
        if (pointer_arg(st, args[i], names[i - 1], &ptr[slot[i - 1]]))
            return NULL;
    for (int i = WU; i <= BD && o->weights_each_run; i++)
        if (o->p.ptr[i] && !ptr[i])
            return PyErr_Format(PyExc_ValueError, "ffn_run: %s: this launch holds no weights (keep=False): pass its "
                                "address", names[i + 1]);
    if (!ptr[X] || !ptr[Y])
        return PyErr_Format(PyExc_ValueError, "ffn_run: x and y need addresses, got %p and %p", ptr[X], ptr[Y]);
    fuser_err err;
    fuser_err_clear(&err);
    const fuser_driver *drv = fuser_driver_get(&err);
    if (!drv || fuser_ffn_run(drv, &o->p, ptr, &err))
        return fuser_raise(st, &err);
    Py_RETURN_NONE;
}
