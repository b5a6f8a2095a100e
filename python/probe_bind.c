/* probe_bind.c: _C.probe_load, _C.probe_launch and _C.probe_clusters: load a microbenchmark kernel of
 * include/fuser/device/probes.cuh (a CUBIN from fuser.jit) and launch it with any grid, block, cluster
 * size and dynamic shared memory. Every probe takes (float *out, int iters) and writes two floats per
 * block, so `out` comes in through DLPack and its size is checked against the grid: a probe launch can
 * fail, never write out of bounds. Used by `python -m fuser calibrate` (fuser/probes.py); FFN kernels
 * go through launch_bind.c. */
#include "binding.h"

#include <stdlib.h>

#include "fuser/cuda.h"
#include "fuser/launch.h"

#define PROBE_CAPSULE "fuser.probe"

/* Like FFN kernels, a probe's module stays loaded for the life of the process (a launch may still be
 * queued when Python drops the object); the capsule (fuser_capsule_free) frees the host-side struct. */
static fuser_kernel *get_probe(PyObject *obj)
{
    return fuser_capsule_get(obj, PROBE_CAPSULE, "probe", "a probe from fuser._C.probe_load");
}

/* probe_load(cubin, name, device) -> probe */
PyObject *fuser_py_probe_load(PyObject *module, PyObject *args)
{
    Py_buffer cubin;
    const char *name;
    int device;
    if (!PyArg_ParseTuple(args, "y*si:probe_load", &cubin, &name, &device))
        return NULL;
    PyObject *res = NULL;
    fuser_kernel *k = calloc(1, sizeof *k);
    fuser_err err;
    fuser_err_clear(&err);
    const fuser_driver *drv = k ? fuser_driver_get(&err) : NULL;
    int rc = drv ? FUSER_OK : err.code;
    if (!k)
        PyErr_NoMemory();
    else if (drv) {
        Py_BEGIN_ALLOW_THREADS
        rc = fuser_kernel_load(drv, device, cubin.buf, name, k, &err);
        Py_END_ALLOW_THREADS
    }
    if (k && rc)
        fuser_raise(fuser_get_state(module), &err);
    else if (k && (res = PyCapsule_New(k, PROBE_CAPSULE, fuser_capsule_free)) != NULL)
        k = NULL;
    free(k);
    PyBuffer_Release(&cubin);
    return res;
}

/* probe_launch(probe, grid, block, cluster, smem, out, iters, stream): out is a CUDA float32 tensor of
 * at least 2 x grid elements on the probe's device. */
PyObject *fuser_py_probe_launch(PyObject *module, PyObject *args)
{
    PyObject *pobj, *oobj;
    unsigned grid, block, cluster, smem;
    int iters;
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "OIIIIOiK:probe_launch", &pobj, &grid, &block, &cluster, &smem, &oobj, &iters,
                          &stream))
        return NULL;
    fuser_kernel *k = get_probe(pobj);
    if (!k)
        return NULL;
    if (iters < 0)
        return PyErr_Format(PyExc_ValueError, "probe_launch: iters must be >= 0, got %d", iters);
    fuser_state *st = fuser_get_state(module);
    PyObject *stream_obj = PyLong_FromUnsignedLongLong(stream), *res = NULL;
    if (!stream_obj)
        return NULL;
    fuser_held h = {0};
    if (fuser_take(st, oobj, "out", stream_obj, FUSER_TAKE_WRITABLE, &h))
        goto done;
    if (h.t.dtype != FUSER_F32 || h.t.device != FUSER_CUDA || h.t.device_id != k->device ||
        h.t.numel < 2 * (int64_t)grid) {
        PyErr_Format(PyExc_ValueError,
                     "probe_launch: out must be a float32 tensor of at least 2 x grid = %lld elements on cuda:%d "
                     "(the probe's device), got %s with %lld elements on %s", 2 * (long long)grid, k->device,
                     fuser_dtype_name(h.t.dtype), (long long)h.t.numel, h.t.device == FUSER_CUDA ? "cuda" : "cpu");
        goto done;
    }
    {
        fuser_err err;
        fuser_err_clear(&err);
        const fuser_driver *drv = fuser_driver_get(&err);
        void *out_ptr = h.t.data;
        void *argv[] = {&out_ptr, &iters};
        fuser_dim3 g = {grid, 1, 1}, b = {block, 1, 1}, c = {cluster, 1, 1};
        int rc = drv ? fuser_kernel_launch(drv, k, g, b, c, smem, (fuser_cu_stream)(uintptr_t)stream, argv, &err)
                     : err.code;
        if (rc)
            fuser_raise(st, &err);
        else
            res = Py_NewRef(Py_None);
    }
done:
    fuser_release(&h);
    Py_DECREF(stream_obj);
    return res;
}

/* probe_clusters(probe, block, cluster, smem) -> how many such clusters can be resident at once */
PyObject *fuser_py_probe_clusters(PyObject *module, PyObject *args)
{
    PyObject *pobj;
    unsigned block, cluster, smem;
    if (!PyArg_ParseTuple(args, "OIII:probe_clusters", &pobj, &block, &cluster, &smem))
        return NULL;
    fuser_kernel *k = get_probe(pobj);
    if (!k)
        return NULL;
    int n = 0;
    fuser_err err;
    fuser_err_clear(&err);
    const fuser_driver *drv = fuser_driver_get(&err);
    fuser_dim3 b = {block, 1, 1}, c = {cluster, 1, 1};
    if (!drv || fuser_kernel_max_active_clusters(drv, k, b, c, smem, &n, &err))
        return fuser_raise(fuser_get_state(module), &err);
    return PyLong_FromLong(n);
}
