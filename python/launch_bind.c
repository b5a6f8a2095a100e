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
    if (fuser_target_from_obj(td, &t) || fuser_plan_from_dict(pd, &t, &plan))
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

PyObject *fuser_py_ffn_launch(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"kernel", "x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down", "activation",
                             "y", "scratch", "stream", "borrow", "trace", "overlap", NULL};
    enum { X, WU, WD, WG, BU, BG, BD, Y, NT };
    static const char *const names[NT] = {"x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down", "y"};
    PyObject *kobj, *sobj, *obj[NT] = {NULL};
    const char *activation;
    unsigned long long stream = 0;
    int borrow = 0; /* bit i: read capsule i without consuming it (the caller keeps it for later launches) */
    PyObject *tobj = Py_None;
    int overlap = 1; /* 0: never start before the stream's previous kernel ends (measurement) */
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOsOOK|iOp:ffn_launch", kwlist, &kobj, &obj[X], &obj[WU],
                                     &obj[WD], &obj[WG], &obj[BU], &obj[BG], &obj[BD], &activation, &obj[Y], &sobj,
                                     &stream, &borrow, &tobj, &overlap))
        return NULL;
    fuser_ffn_kernel *l = get_loaded(kobj);
    if (!l)
        return NULL;
    scratch_obj *sc = fuser_capsule_get(sobj, SCRATCH_CAPSULE, "scratch", "a scratch from fuser._C.scratch_alloc");
    if (!sc)
        return NULL;
    fuser_state *st = fuser_get_state(module);
    fuser_held h[NT], th;
    memset(h, 0, sizeof h);
    memset(&th, 0, sizeof th);
    PyObject *res = NULL;
    const fuser_tensor *t[NT] = {NULL};
    /* the stream: the caller's current one; __dlpack__ then needs no cross-stream synchronisation */
    PyObject *stream_obj = PyLong_FromUnsignedLongLong(stream);
    if (!stream_obj)
        return NULL;
    for (int i = 0; i < NT; i++) {
        if (obj[i] == Py_None)
            continue;
        if (fuser_take(st, obj[i], names[i], stream_obj,
                       (i == Y ? FUSER_TAKE_WRITABLE : 0) | (borrow >> i & 1 ? FUSER_TAKE_BORROW : 0), &h[i]))
            goto done;
        t[i] = &h[i].t;
    }
    if (!t[Y]) {
        PyErr_SetString(PyExc_ValueError, "ffn_launch: y is required");
        goto done;
    }
    if (tobj != Py_None && fuser_take(st, tobj, "trace", stream_obj, FUSER_TAKE_WRITABLE, &th))
        goto done;
    fuser_ffn_args a = {t[X], t[WU], t[WD], t[WG], t[BU], t[BG], t[BD], t[Y], activation};
    fuser_chain c;
    fuser_err err;
    fuser_err_clear(&err);
    if (fuser_ffn_validate(&a, &c, &err)) {
        fuser_raise(st, &err);
        goto done;
    }
    {
        const fuser_scratch_view view = {sc->s.ptr, sc->s.device, sc->tickets_cap, sc->floats - sc->tickets_cap};
        const fuser_driver *drv = fuser_driver_get(&err);
        int rc = drv ? fuser_ffn_launch(drv, l, &a, &c, &view, tobj != Py_None ? &th.t : NULL,
                                        overlap ? FUSER_OVERLAP_DEFAULT : FUSER_OVERLAP_NEVER,
                                        (fuser_cu_stream)(uintptr_t)stream, &err)
                     : err.code;
        if (rc)
            fuser_raise(st, &err);
        else
            res = Py_NewRef(Py_None);
    }
done:
    for (int i = 0; i < NT; i++)
        fuser_release(&h[i]);
    fuser_release(&th);
    Py_DECREF(stream_obj);
    return res;
}
