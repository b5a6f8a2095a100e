/* launch.c: load a CUBIN and launch its kernels with a cluster shape, through the dlopen'ed driver
 * table (see include/fuser/launch.h). Per-kernel state lives in fuser_kernel; nothing is global. */
#define _POSIX_C_SOURCE 200809L /* sched_yield */
#include "fuser/launch.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>

/* Record a failed driver call as "what: CUDA_ERROR_X (text)". */
static int cu_fail(const fuser_driver *drv, fuser_cu_result r, fuser_err *err, const char *what,
                   const fuser_kernel *k)
{
    char desc[256];
    fuser_cu_describe(drv, r, desc, sizeof desc);
    return fuser_fail(err, FUSER_E_CUDA, "%s%s%s failed: %s", what, k ? " of kernel " : "", k ? k->name : "",
                      desc);
}

/* The calling thread's context, made the primary context of `device` when it has none; it must
 * belong to `device`. */
int fuser_bind_context(const fuser_driver *drv, int device, fuser_cu_context *ctx, fuser_err *err)
{
    fuser_cu_result r = drv->cuCtxGetCurrent(ctx);
    if (r != FUSER_CUDA_SUCCESS)
        return cu_fail(drv, r, err, "cuCtxGetCurrent", NULL);
    if (*ctx) {
        fuser_cu_device have;
        if ((r = drv->cuCtxGetDevice(&have)) != FUSER_CUDA_SUCCESS)
            return cu_fail(drv, r, err, "cuCtxGetDevice", NULL);
        if (have != device)
            return fuser_fail(err, FUSER_E_CUDA, "the current CUDA context is on device %d, not %d: make device "
                              "%d current first (torch.cuda.device(%d))", have, device, device, device);
        return FUSER_OK;
    }
    fuser_cu_device dev;
    if ((r = drv->cuDeviceGet(&dev, device)) != FUSER_CUDA_SUCCESS)
        return cu_fail(drv, r, err, "cuDeviceGet", NULL);
    if ((r = drv->cuDevicePrimaryCtxRetain(ctx, dev)) != FUSER_CUDA_SUCCESS)
        return cu_fail(drv, r, err, "cuDevicePrimaryCtxRetain", NULL);
    if ((r = drv->cuCtxSetCurrent(*ctx)) != FUSER_CUDA_SUCCESS)
        return cu_fail(drv, r, err, "cuCtxSetCurrent", NULL);
    return FUSER_OK;
}

int fuser_kernel_load(const fuser_driver *drv, int device, const void *cubin, const char *func_name,
                      fuser_kernel *out, fuser_err *err)
{
    memset(out, 0, sizeof *out);
    atomic_flag_clear(&out->updating);
    out->device = device;
    fuser_strlcpy(out->name, func_name, sizeof out->name);
    int rc = fuser_bind_context(drv, device, &out->ctx, err);
    if (rc)
        return rc;
    fuser_cu_result r = drv->cuModuleLoadData(&out->module, cubin);
    if (r != FUSER_CUDA_SUCCESS)
        return cu_fail(drv, r, err, "cuModuleLoadData", out);
    if ((r = drv->cuModuleGetFunction(&out->func, out->module, func_name)) != FUSER_CUDA_SUCCESS) {
        drv->cuModuleUnload(out->module);
        out->module = NULL;
        return cu_fail(drv, r, err, "cuModuleGetFunction", out);
    }
    int dyn_limit = 0;
    const struct { int attr; int *slot; } attrs[] = {
        {FUSER_CU_FUNC_ATTR_NUM_REGS, &out->num_regs},
        {FUSER_CU_FUNC_ATTR_LOCAL_SIZE_BYTES, &out->local_bytes},
        {FUSER_CU_FUNC_ATTR_SHARED_SIZE_BYTES, &out->static_smem_bytes},
        {FUSER_CU_FUNC_ATTR_MAX_THREADS_PER_BLOCK, &out->max_threads},
        {FUSER_CU_FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES, &dyn_limit},
    };
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        if ((r = drv->cuFuncGetAttribute(attrs[i].slot, attrs[i].attr, out->func)) != FUSER_CUDA_SUCCESS) {
            drv->cuModuleUnload(out->module);
            out->module = NULL;
            return cu_fail(drv, r, err, "cuFuncGetAttribute", out);
        }
    }
    atomic_init(&out->dyn_smem_limit, dyn_limit);
    atomic_init(&out->non_portable, 0);
    return FUSER_OK;
}

int fuser_kernel_unload(const fuser_driver *drv, fuser_kernel *k, fuser_err *err)
{
    fuser_cu_result r = k->module ? drv->cuModuleUnload(k->module) : FUSER_CUDA_SUCCESS;
    int rc = r == FUSER_CUDA_SUCCESS ? FUSER_OK : cu_fail(drv, r, err, "cuModuleUnload", k);
    memset(k, 0, sizeof *k);
    return rc;
}

/* ---- launch configuration (pure) ---- */

int fuser_cluster_non_portable(fuser_dim3 c)
{
    return (unsigned long long)c.x * c.y * c.z > FUSER_PORTABLE_CLUSTER_MAX;
}

int fuser_launch_config(fuser_dim3 grid, fuser_dim3 block, fuser_dim3 cluster, unsigned int dyn_smem,
                        fuser_cu_stream stream, unsigned int flags, fuser_cu_launch_attr attr[FUSER_LAUNCH_MAX_ATTRS],
                        fuser_cu_launch_config *cfg, fuser_err *err)
{
    if (flags & ~(unsigned)FUSER_LAUNCH_EARLY)
        return fuser_fail(err, FUSER_E_VALUE, "launch flags 0x%x: unknown bits", flags);
    const struct { const char *what; fuser_dim3 d; } dims[] = {
        {"grid", grid}, {"block", block}, {"cluster", cluster},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (!dims[i].d.x || !dims[i].d.y || !dims[i].d.z)
            return fuser_fail(err, FUSER_E_VALUE, "%s (%u, %u, %u) has a zero dimension", dims[i].what, dims[i].d.x,
                              dims[i].d.y, dims[i].d.z);
    if (grid.x % cluster.x || grid.y % cluster.y || grid.z % cluster.z)
        return fuser_fail(err, FUSER_E_VALUE, "grid (%u, %u, %u) is not a whole number of clusters (%u, %u, %u)",
                          grid.x, grid.y, grid.z, cluster.x, cluster.y, cluster.z);
    if ((unsigned long long)block.x * block.y * block.z > FUSER_MAX_BLOCK_THREADS)
        return fuser_fail(err, FUSER_E_VALUE, "block (%u, %u, %u) has more than %d threads", block.x, block.y,
                          block.z, FUSER_MAX_BLOCK_THREADS);
    memset(attr, 0, FUSER_LAUNCH_MAX_ATTRS * sizeof *attr);
    attr[0].id = FUSER_CU_LAUNCH_ATTR_CLUSTER_DIMENSION;
    attr[0].value.cluster_dim.x = cluster.x;
    attr[0].value.cluster_dim.y = cluster.y;
    attr[0].value.cluster_dim.z = cluster.z;
    unsigned int n = 1;
    if (flags & FUSER_LAUNCH_EARLY) {
        attr[n].id = FUSER_CU_LAUNCH_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr[n++].value.programmatic_serialization = 1;
    }
    *cfg = (fuser_cu_launch_config){grid.x, grid.y, grid.z, block.x, block.y, block.z, dyn_smem, stream, attr, n};
    return FUSER_OK;
}

/* ---- per-kernel attributes ---- */

/* Set what this launch needs on the function (more dynamic shared memory; a non-portable cluster
 * size), each only the first time it is needed. The limit only grows, and the driver call and the
 * recorded value change together under k->updating, so a thread that reads a limit >= its need may
 * launch without a driver call. */
static int prepare(const fuser_driver *drv, fuser_kernel *k, fuser_dim3 cluster, unsigned int dyn_smem,
                   fuser_err *err)
{
    int want_smem = dyn_smem > (unsigned)atomic_load(&k->dyn_smem_limit);
    int want_np = fuser_cluster_non_portable(cluster) && !atomic_load(&k->non_portable);
    if (!want_smem && !want_np)
        return FUSER_OK;
    while (atomic_flag_test_and_set(&k->updating))
        sched_yield(); /* held for one driver call at most */
    fuser_cu_result r = FUSER_CUDA_SUCCESS;
    const char *what = "";
    if (dyn_smem > (unsigned)atomic_load(&k->dyn_smem_limit)) {
        what = "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)";
        r = drv->cuFuncSetAttribute(k->func, FUSER_CU_FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)dyn_smem);
        if (r == FUSER_CUDA_SUCCESS)
            atomic_store(&k->dyn_smem_limit, (int)dyn_smem);
    }
    if (r == FUSER_CUDA_SUCCESS && want_np && !atomic_load(&k->non_portable)) {
        what = "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)";
        r = drv->cuFuncSetAttribute(k->func, FUSER_CU_FUNC_ATTR_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
        if (r == FUSER_CUDA_SUCCESS)
            atomic_store(&k->non_portable, 1);
    }
    atomic_flag_clear(&k->updating);
    return r == FUSER_CUDA_SUCCESS ? FUSER_OK : cu_fail(drv, r, err, what, k);
}

/* The kernel's context must be current: set it where the thread has none (a new thread); refuse
 * another (it would fail with a less clear error). */
static int use_context(const fuser_driver *drv, const fuser_kernel *k, fuser_err *err)
{
    fuser_cu_context cur = NULL;
    fuser_cu_result r = drv->cuCtxGetCurrent(&cur);
    if (r == FUSER_CUDA_SUCCESS && !cur)
        r = drv->cuCtxSetCurrent(k->ctx);
    else if (r == FUSER_CUDA_SUCCESS && cur != k->ctx)
        return fuser_fail(err, FUSER_E_CUDA, "kernel %s was loaded on device %d, whose context is not current: "
                          "launch it under torch.cuda.device(%d)", k->name, k->device, k->device);
    return r == FUSER_CUDA_SUCCESS ? FUSER_OK : cu_fail(drv, r, err, "setting the current context", k);
}

/* Everything before the driver call of a launch or an occupancy query: the configuration, the context,
 * the function attributes (occupancy honours the same ones). */
static int ready(const fuser_driver *drv, fuser_kernel *k, fuser_dim3 grid, fuser_dim3 block, fuser_dim3 cluster,
                 unsigned int dyn_smem, fuser_cu_stream stream, unsigned int flags, fuser_cu_launch_attr *attr,
                 fuser_cu_launch_config *cfg, fuser_err *err)
{
    int rc = fuser_launch_config(grid, block, cluster, dyn_smem, stream, flags, attr, cfg, err);
    if (rc == FUSER_OK)
        rc = use_context(drv, k, err);
    if (rc == FUSER_OK)
        rc = prepare(drv, k, cluster, dyn_smem, err);
    return rc;
}

int fuser_kernel_launch(const fuser_driver *drv, fuser_kernel *k, fuser_dim3 grid, fuser_dim3 block,
                        fuser_dim3 cluster, unsigned int dyn_smem, fuser_cu_stream stream, void **args,
                        fuser_err *err)
{
    return fuser_kernel_launch_ex(drv, k, grid, block, cluster, dyn_smem, stream, 0, args, err);
}

int fuser_kernel_launch_ex(const fuser_driver *drv, fuser_kernel *k, fuser_dim3 grid, fuser_dim3 block,
                           fuser_dim3 cluster, unsigned int dyn_smem, fuser_cu_stream stream, unsigned int flags,
                           void **args, fuser_err *err)
{
    /* on this stack frame: alive through the launch, private to this thread */
    fuser_cu_launch_attr attr[FUSER_LAUNCH_MAX_ATTRS];
    fuser_cu_launch_config cfg;
    int rc = ready(drv, k, grid, block, cluster, dyn_smem, stream, flags, attr, &cfg, err);
    if (rc)
        return rc;
    fuser_cu_result r = drv->cuLaunchKernelEx(&cfg, k->func, args, NULL);
    if (r == FUSER_CUDA_SUCCESS)
        return FUSER_OK;
    char desc[256];
    fuser_cu_describe(drv, r, desc, sizeof desc);
    return fuser_fail(err, FUSER_E_CUDA, "cuLaunchKernelEx of kernel %s (grid (%u, %u, %u), block (%u, %u, %u), "
                      "cluster (%u, %u, %u), %u bytes dynamic smem) failed: %s", k->name, grid.x, grid.y, grid.z,
                      block.x, block.y, block.z, cluster.x, cluster.y, cluster.z, dyn_smem, desc);
}

int fuser_kernel_max_active_clusters(const fuser_driver *drv, fuser_kernel *k, fuser_dim3 block,
                                     fuser_dim3 cluster, unsigned int dyn_smem, int *n, fuser_err *err)
{
    fuser_cu_launch_attr attr[FUSER_LAUNCH_MAX_ATTRS];
    fuser_cu_launch_config cfg;
    *n = 0;
    int rc = ready(drv, k, cluster, block, cluster, dyn_smem, NULL, 0, attr, &cfg, err); /* grid: one cluster */
    if (rc)
        return rc;
    fuser_cu_result r = drv->cuOccupancyMaxActiveClusters(n, k->func, &cfg);
    return r == FUSER_CUDA_SUCCESS ? FUSER_OK : cu_fail(drv, r, err, "cuOccupancyMaxActiveClusters", k);
}

int fuser_scratch_alloc(const fuser_driver *drv, int device, size_t bytes, size_t zero_bytes,
                        fuser_cu_stream stream, fuser_scratch *out, fuser_err *err)
{
    memset(out, 0, sizeof *out);
    if (zero_bytes % 4 || zero_bytes > bytes || !bytes)
        return fuser_fail(err, FUSER_E_VALUE, "scratch: %zu zeroed bytes of %zu (need a multiple of 4 within it)",
                          zero_bytes, bytes);
    fuser_cu_context ctx;
    int rc = fuser_bind_context(drv, device, &ctx, err);
    if (rc)
        return rc;
    fuser_cu_result r = drv->cuMemAllocAsync(&out->ptr, bytes, stream);
    if (r != FUSER_CUDA_SUCCESS)
        return cu_fail(drv, r, err, "cuMemAllocAsync (fuser's inter-cluster workspace)", NULL);
    if (zero_bytes && (r = drv->cuMemsetD32Async(out->ptr, 0, zero_bytes / 4, stream)) != FUSER_CUDA_SUCCESS) {
        drv->cuMemFreeAsync(out->ptr, stream);
        out->ptr = 0;
        return cu_fail(drv, r, err, "cuMemsetD32Async", NULL);
    }
    out->bytes = bytes;
    out->zero_bytes = zero_bytes;
    out->device = device;
    out->stream = stream;
    return FUSER_OK;
}

int fuser_scratch_free(const fuser_driver *drv, fuser_scratch *s, fuser_err *err)
{
    if (!s->ptr)
        return FUSER_OK;
    fuser_cu_result r = drv->cuMemFreeAsync(s->ptr, s->stream);
    s->ptr = 0;
    return r == FUSER_CUDA_SUCCESS ? FUSER_OK : cu_fail(drv, r, err, "cuMemFreeAsync", NULL);
}
