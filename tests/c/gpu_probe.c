/* gpu_probe.c: a real-GPU check of csrc/launch.c, run by tests/test_jit.py on Hopper only: load a CUBIN
 * (compiled by fuser.jit from tests/test_jit.py's PROBE kernel), launch it with clusters of 2 and of 16
 * blocks (non-portable) and with more than 48 KB of dynamic shared memory, and check every value the
 * kernel read from its peer block over DSM. Memory comes from the driver directly (cuMemAlloc and
 * friends, looked up here: fuser itself leaves memory to torch). By hand:
 *   python -c 'import sys; sys.path.insert(0, "tests"); from test_jit import PROBE; from fuser import jit;
 *              open("/tmp/probe.cubin", "wb").write(jit.compile_source(PROBE, "probe.cu").cubin)'
 *   cc -std=c11 -Iinclude $(ls csrc/[a-z]*.c) tests/c/embedded_fixture.c tests/c/gpu_probe.c -o /tmp/gpu_probe \
 *      -ldl -lpthread -lm
 *   /tmp/gpu_probe /tmp/probe.cubin */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "fuser/launch.h"

typedef fuser_cu_result (*mem_alloc_fn)(fuser_cu_deviceptr *, size_t);
typedef fuser_cu_result (*mem_free_fn)(fuser_cu_deviceptr);
typedef fuser_cu_result (*dtoh_fn)(void *, fuser_cu_deviceptr, size_t);

#define THREADS 128

static int fail(const char *what, const fuser_err *err)
{
    fprintf(stderr, "gpu_probe: %s: %s\n", what, err ? err->msg : "");
    return 1;
}

/* Launch `blocks` blocks in clusters of `cluster` and check out[b][t] = t * n + ceil(rank / 2). */
static int run(const fuser_driver *drv, fuser_kernel *k, dtoh_fn dtoh, fuser_cu_deviceptr out, unsigned blocks,
               unsigned cluster, unsigned dyn_smem)
{
    fuser_err err;
    fuser_err_clear(&err);
    int n = 3;
    void *args[] = {&out, &n};
    fuser_dim3 grid = {blocks, 1, 1}, block = {THREADS, 1, 1}, cl = {cluster, 1, 1};
    if (fuser_kernel_launch(drv, k, grid, block, cl, dyn_smem, NULL, args, &err))
        return fail("launch", &err);
    fuser_cu_result r = drv->cuCtxSynchronize();
    static unsigned host[64 * THREADS];
    if (r != FUSER_CUDA_SUCCESS || dtoh(host, out, sizeof(unsigned) * blocks * THREADS) != FUSER_CUDA_SUCCESS)
        return fail("synchronize / copy back", NULL);
    for (unsigned b = 0; b < blocks; b++) {
        for (unsigned t = 0; t < THREADS; t++) {
            unsigned rank = b % cluster, want = t * n + (rank + 1) / 2;
            if (host[b * THREADS + t] != want) {
                fprintf(stderr, "gpu_probe: cluster %u: block %u thread %u read %u, expected %u\n", cluster, b, t,
                        host[b * THREADS + t], want);
                return 1;
            }
        }
    }
    int active = 0;
    if (fuser_kernel_max_active_clusters(drv, k, block, cl, dyn_smem, &active, &err) || active < 1)
        return fail("max active clusters", &err);
    printf("gpu_probe: %u blocks in clusters of %u, %u B dynamic smem: ok (%d clusters can be resident)\n", blocks,
           cluster, dyn_smem, active);
    return 0;
}

int main(int argc, char **argv)
{
    fuser_err err;
    fuser_err_clear(&err);
    if (argc != 2)
        return fail("usage: gpu_probe <cubin file>", NULL);
    FILE *f = fopen(argv[1], "rb");
    static char cubin[1 << 22];
    size_t size = f ? fread(cubin, 1, sizeof cubin, f) : 0;
    if (f)
        fclose(f);
    if (!size)
        return fail("cannot read the cubin", NULL);
    const fuser_driver *drv = fuser_driver_get(&err);
    if (!drv)
        return fail("driver", &err);
    void *lib = dlopen(drv->path, RTLD_NOW | RTLD_LOCAL);
    mem_alloc_fn mem_alloc = lib ? (mem_alloc_fn)dlsym(lib, "cuMemAlloc_v2") : NULL;
    mem_free_fn mem_free = lib ? (mem_free_fn)dlsym(lib, "cuMemFree_v2") : NULL;
    dtoh_fn dtoh = lib ? (dtoh_fn)dlsym(lib, "cuMemcpyDtoH_v2") : NULL;
    if (!mem_alloc || !mem_free || !dtoh)
        return fail("memory entry points not found", NULL);
    fuser_kernel k;
    if (fuser_kernel_load(drv, 0, cubin, "fuser_probe", &k, &err))
        return fail("load", &err);
    printf("gpu_probe: loaded fuser_probe: %d registers, %d B static smem, %d B local\n", k.num_regs,
           k.static_smem_bytes, k.local_bytes);
    fuser_cu_deviceptr out = 0;
    if (mem_alloc(&out, sizeof(unsigned) * 64 * THREADS) != FUSER_CUDA_SUCCESS)
        return fail("cuMemAlloc", NULL);
    int bad = run(drv, &k, dtoh, out, 16, 2, 0) || run(drv, &k, dtoh, out, 64, 16, 0) ||
              run(drv, &k, dtoh, out, 32, 8, 100 * 1024);
    mem_free(out);
    fuser_kernel_unload(drv, &k, &err);
    return bad;
}
