/* probe_bind.c: _C.probe_load, _C.probe_launch and _C.probe_clusters: load a microbenchmark kernel of
 * include/fuser/device/probes.cuh (a CUBIN from fuser.jit) and launch it with any grid, block, cluster
 * size and dynamic shared memory; _C.gemm_launch runs the wgmma GEMM probe (include/fuser/device/gemm.cuh)
 * on checked tensors. Every probe takes (float *out, int iters) and writes two floats per
 * block, so `out` comes in through DLPack and its size is checked against the grid: a probe launch can
 * fail, never write out of bounds. Used by `python -m fuser calibrate` (fuser/probes.py); FFN kernels
 * go through launch_bind.c. */
#include "binding.h"

#include <stdlib.h>
#include <string.h>

#include "fuser/cuda.h"
#include "fuser/launch.h"
#include "fuser/tmap.h"

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

/* Must match GemmParams in include/fuser/device/gemm.cuh. */
typedef struct {
    fuser_tmap a, b;
    void *c;
    const void *b_ptr;
    int m, n, k;
} gemm_params;

/* gemm_launch(probe, a, b, c, bn, cm, smem, stream): the wgmma GEMM probe c = a @ b.T on the probe's
 * device, a [M, K], b [N, K], c [M, N], 16-bit, one dtype, contiguous. bn and cm must be the probe's
 * (its B tile width and cluster size); the tensor maps are encoded here, the grid is persistent. */
PyObject *fuser_py_gemm_launch(PyObject *module, PyObject *args)
{
    PyObject *pobj, *obj[3];
    unsigned bn, cm, smem;
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "OOOOIIIK:gemm_launch", &pobj, &obj[0], &obj[1], &obj[2], &bn, &cm, &smem, &stream))
        return NULL;
    fuser_kernel *k = get_probe(pobj);
    if (!k)
        return NULL;
    if ((bn != 64 && bn != 128 && bn != 256) || (cm != 1 && cm != 2))
        return PyErr_Format(PyExc_ValueError, "gemm_launch: bn must be 64, 128 or 256 and cm 1 or 2, got %u, %u", bn,
                            cm);
    static const char *const names[3] = {"a", "b", "c"};
    fuser_state *st = fuser_get_state(module);
    PyObject *stream_obj = PyLong_FromUnsignedLongLong(stream), *res = NULL;
    if (!stream_obj)
        return NULL;
    fuser_held h[3];
    memset(h, 0, sizeof h);
    for (int i = 0; i < 3; i++)
        if (fuser_take(st, obj[i], names[i], stream_obj, i == 2 ? FUSER_TAKE_WRITABLE : 0, &h[i]))
            goto done;
    {
        const fuser_tensor *a = &h[0].t, *b = &h[1].t, *c = &h[2].t;
        for (int i = 0; i < 3; i++) {
            const fuser_tensor *t = &h[i].t;
            if (t->ndim != 2 || t->device != FUSER_CUDA || t->device_id != k->device || t->dtype != a->dtype ||
                (t->dtype != FUSER_BF16 && t->dtype != FUSER_F16) || t->numel < 1) {
                PyErr_Format(PyExc_ValueError, "gemm_launch: %s must be a non-empty 2-D bfloat16 or float16 tensor on "
                             "cuda:%d with the dtype of a", names[i], k->device);
                goto done;
            }
        }
        const int64_t M = a->shape[0], K = a->shape[1], N = b->shape[0];
        if (b->shape[1] != K || c->shape[0] != M || c->shape[1] != N || K % 8 || N % 2 || M > 0x7fffffff ||
            N > 0x7fffffff || K > 0x7fffffff) {
            PyErr_Format(PyExc_ValueError, "gemm_launch: need a [M, K], b [N, K], c [M, N] with K a multiple of 8 and "
                         "N even; got a [%lld, %lld], b [%lld, %lld], c [%lld, %lld]", (long long)M, (long long)K,
                         (long long)b->shape[0], (long long)b->shape[1], (long long)c->shape[0], (long long)c->shape[1]);
            goto done;
        }
        fuser_err err;
        fuser_err_clear(&err);
        const fuser_driver *drv = fuser_driver_get(&err);
        gemm_params prm;
        memset(&prm, 0, sizeof prm);
        int rc = drv ? FUSER_OK : err.code;
        if (!rc)
            rc = fuser_tmap_2d(drv, &prm.a, a->dtype, a->data, (uint64_t)M, (uint64_t)K, (uint64_t)K, 128, &err);
        if (!rc)
            rc = fuser_tmap_2d(drv, &prm.b, a->dtype, b->data, (uint64_t)N, (uint64_t)K, (uint64_t)K, bn / cm, &err);
        int clusters = 0;
        fuser_dim3 blk = {384, 1, 1}, cl = {cm, 1, 1};
        if (!rc)
            rc = fuser_kernel_max_active_clusters(drv, k, blk, cl, smem, &clusters, &err);
        if (!rc) {
            prm.c = c->data;
            prm.b_ptr = b->data;
            prm.m = (int)M, prm.n = (int)N, prm.k = (int)K;
            const int64_t tiles = (M + 128 * cm - 1) / (128 * cm) * ((N + bn - 1) / bn);
            const int64_t g = tiles < clusters ? tiles : clusters;
            void *argv[] = {&prm};
            fuser_dim3 grid = {(unsigned)(g * cm), 1, 1};
            rc = g < 1 ? fuser_fail(&err, FUSER_E_CUDA, "gemm_launch: no cluster of this probe fits") :
                 fuser_kernel_launch(drv, k, grid, blk, cl, smem, (fuser_cu_stream)(uintptr_t)stream, argv, &err);
        }
        if (rc)
            fuser_raise(st, &err);
        else
            res = Py_NewRef(Py_None);
    }
done:
    for (int i = 0; i < 3; i++)
        fuser_release(&h[i]);
    Py_DECREF(stream_obj);
    return res;
}
