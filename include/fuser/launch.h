/* launch.h: loading a CUBIN through the CUDA driver and launching its kernels with a run-time
 * thread-block cluster shape (cuLaunchKernelEx + CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION).
 *
 * Contexts: fuser works in the caller's (torch's) context, the device's primary context. Loading uses
 * the thread's current context; where a thread has none yet, it retains the device's primary context
 * and makes it current (it is never released: torch holds it for the life of the process anyway).
 * A kernel must be launched with the context it was loaded in current (torch's current device).
 *
 * Launching never synchronises: errors reported here are launch errors; faults inside the kernel
 * surface later on the stream, as with any CUDA launch.
 */
#ifndef FUSER_LAUNCH_H
#define FUSER_LAUNCH_H

#include <stdatomic.h>

#include "fuser/cuda.h"
#include "fuser/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* NOTE: dynamic shared memory above this needs the MAX_DYNAMIC_SHARED_SIZE_BYTES opt-in (CUDA docs);
 * the per-kernel default the driver reports is this minus the kernel's static shared memory. */
#define FUSER_DEFAULT_SMEM_BYTES (48 * 1024)
/* NOTE: clusters of more than 8 blocks are "non-portable": the launch fails with
 * CUDA_ERROR_INVALID_CLUSTER_SIZE unless NON_PORTABLE_CLUSTER_SIZE_ALLOWED is set (Hopper allows 16). */
#define FUSER_PORTABLE_CLUSTER_MAX 8
#define FUSER_MAX_BLOCK_THREADS 1024

typedef struct fuser_dim3 {
    unsigned int x, y, z;
} fuser_dim3;

/** A loaded kernel. Filled by fuser_kernel_load; may then be shared by threads (attribute updates are
 * atomic), but must not be copied or moved once in use. */
typedef struct fuser_kernel {
    fuser_cu_module module;
    fuser_cu_function func;
    fuser_cu_context ctx;        /* the context it was loaded in */
    int device;                  /* its device ordinal */
    char name[128];              /* the function name (for messages) */
    /* read back with cuFuncGetAttribute at load */
    int num_regs;                /* registers per thread */
    int local_bytes;             /* local memory per thread (stack and spills; 0 for fuser's kernels) */
    int static_smem_bytes;       /* static shared memory per block */
    int max_threads;             /* the most threads per block it can be launched with */
    /* what has been set on the function, so each launch calls the driver only when it must */
    atomic_int dyn_smem_limit;   /* MAX_DYNAMIC_SHARED_SIZE_BYTES now in force */
    atomic_int non_portable;     /* NON_PORTABLE_CLUSTER_SIZE_ALLOWED set */
    atomic_flag updating;        /* held while one thread changes the two above */
} fuser_kernel;

/** Load `cubin` into the current context of the calling thread (or device `device`'s primary context
 * when the thread has none) and find `func_name` in it. The current context must belong to `device`.
 * On failure (FUSER_E_CUDA, saying which step and the driver's CUDA_ERROR_X) nothing stays loaded. */
int fuser_kernel_load(const fuser_driver *drv, int device, const void *cubin, const char *func_name,
                      fuser_kernel *out, fuser_err *err);

/** Unload the kernel's module; k is zeroed. */
int fuser_kernel_unload(const fuser_driver *drv, fuser_kernel *k, fuser_err *err);

/** Whether a cluster of this shape needs NON_PORTABLE_CLUSTER_SIZE_ALLOWED (more than 8 blocks). */
int fuser_cluster_non_portable(fuser_dim3 cluster);

/** Launch flags. FUSER_LAUNCH_EARLY: programmatic dependent launch (the kernel may start while the
 * stream's previous kernel finishes; it must execute `griddepcontrol.wait` before it touches memory that
 * kernel writes or reads, and may execute `griddepcontrol.launch_dependents` to let the next one start). */
enum { FUSER_LAUNCH_EARLY = 1 };
#define FUSER_LAUNCH_MAX_ATTRS 2

/** Fill the cuLaunchKernelEx configuration: grid, block, dynamic shared memory, stream, a
 * CLUSTER_DIMENSION attribute and, with FUSER_LAUNCH_EARLY in `flags`, a PROGRAMMATIC_STREAM_SERIALIZATION
 * one, written into attr[] (caller-owned: keep it alive until the launch; use the stack, never static
 * storage, so threads do not share it). Pure: no driver call. FUSER_E_VALUE when a dimension is 0, the
 * grid is not a whole number of clusters, the block exceeds 1024 threads, or a flag is unknown. */
int fuser_launch_config(fuser_dim3 grid, fuser_dim3 block, fuser_dim3 cluster, unsigned int dyn_smem,
                        fuser_cu_stream stream, unsigned int flags, fuser_cu_launch_attr attr[FUSER_LAUNCH_MAX_ATTRS],
                        fuser_cu_launch_config *cfg, fuser_err *err);

/** Make the primary context of `device` current on this thread unless a context of that device is
 * already current (torch's); FUSER_E_CUDA if the current context belongs to another device. */
int fuser_bind_context(const fuser_driver *drv, int device, fuser_cu_context *ctx, fuser_err *err);

/* ---- scratch memory for inter_cluster_reduce: [zeroed tickets][workspace], outside any framework's
 * allocator (so CUDA-graph memory pools never see it), allocated and freed stream-ordered. ---- */
typedef struct fuser_scratch {
    fuser_cu_deviceptr ptr;
    size_t bytes;
    size_t zero_bytes;         /* the leading bytes set to zero at allocation (the tickets) */
    int device;
    fuser_cu_stream stream;    /* allocated, zeroed and freed on this stream */
} fuser_scratch;

/** Allocate `bytes` on `device` with cuMemAllocAsync on `stream` and zero the first `zero_bytes`
 * (a multiple of 4) with cuMemsetD32Async on it. No host synchronisation. */
int fuser_scratch_alloc(const fuser_driver *drv, int device, size_t bytes, size_t zero_bytes,
                        fuser_cu_stream stream, fuser_scratch *out, fuser_err *err);
/** Free it on its stream (stream-ordered: after work already queued there). */
int fuser_scratch_free(const fuser_driver *drv, fuser_scratch *s, fuser_err *err);

/** Launch k on `stream` (NULL: the legacy default stream) with `args` (one pointer per kernel parameter,
 * as for cuLaunchKernel). Raises the kernel's dynamic shared memory limit when dyn_smem exceeds it,
 * allows a non-portable cluster size when the cluster has more than 8 blocks, then calls
 * cuLaunchKernelEx. No synchronisation. FUSER_E_VALUE for a bad shape, FUSER_E_CUDA for the driver's
 * refusal ("CUDA_ERROR_X (text)"). */
int fuser_kernel_launch(const fuser_driver *drv, fuser_kernel *k, fuser_dim3 grid, fuser_dim3 block,
                        fuser_dim3 cluster, unsigned int dyn_smem, fuser_cu_stream stream, void **args,
                        fuser_err *err);
/** fuser_kernel_launch with launch `flags` (FUSER_LAUNCH_EARLY). */
int fuser_kernel_launch_ex(const fuser_driver *drv, fuser_kernel *k, fuser_dim3 grid, fuser_dim3 block,
                           fuser_dim3 cluster, unsigned int dyn_smem, fuser_cu_stream stream, unsigned int flags,
                           void **args, fuser_err *err);

/** How many clusters of this shape (blocks of `block`, `dyn_smem` bytes each) can be resident at once
 * (cuOccupancyMaxActiveClusters), into *n. Size a persistent grid from it, not from the SM count. */
int fuser_kernel_max_active_clusters(const fuser_driver *drv, fuser_kernel *k, fuser_dim3 block,
                                     fuser_dim3 cluster, unsigned int dyn_smem, int *n, fuser_err *err);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_LAUNCH_H */
