/* cuda.h: the CUDA driver and NVRTC, opened with dlopen on first need and never linked.
 *
 * fuser builds and imports with no CUDA toolkit, driver or GPU. The few driver and NVRTC types and
 * entry points the core uses are declared here (ABI-compatible with cuda.h / nvrtc.h, written from
 * the documented API), and resolved with dlsym the first time something needs them.
 *
 * Library search order (first hit wins; an explicit override that fails is an error, not a fallback):
 *   libcuda:  1. $FUSER_LIBCUDA (a file path)
 *             2. the system loader: libcuda.so.1
 *   libnvrtc: 1. $FUSER_NVRTC (a file path)
 *             2. directories the caller passes (the Python layer passes the lib folder of the
 *                nvidia-cuda-nvrtc wheel that CUDA builds of torch install)
 *             3. $CUDA_HOME/lib64, $CUDA_HOME/lib, $CUDA_PATH/lib64, $CUDA_PATH/lib, /usr/local/cuda/lib64
 *             4. the system loader: libnvrtc.so.13, libnvrtc.so.12, libnvrtc.so
 * Loading is thread-safe (a mutex guards the one-time load; the loaded tables are then read-only).
 */
#ifndef FUSER_CUDA_H
#define FUSER_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "fuser/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- driver API types (ABI-compatible subset of cuda.h) ---- */
typedef int fuser_cu_result;
typedef int fuser_cu_device;
typedef struct CUctx_st *fuser_cu_context;
typedef struct CUmod_st *fuser_cu_module;
typedef struct CUfunc_st *fuser_cu_function;
typedef struct CUstream_st *fuser_cu_stream;
typedef unsigned long long fuser_cu_deviceptr;

#define FUSER_CUDA_SUCCESS 0
/* CUdevice_attribute values used by fuser */
#define FUSER_CU_ATTR_CLOCK_RATE 13
#define FUSER_CU_ATTR_MULTIPROCESSOR_COUNT 16
#define FUSER_CU_ATTR_MEMORY_CLOCK_RATE 36
#define FUSER_CU_ATTR_GLOBAL_MEMORY_BUS_WIDTH 37
#define FUSER_CU_ATTR_L2_CACHE_SIZE 38
#define FUSER_CU_ATTR_COMPUTE_CAPABILITY_MAJOR 75
#define FUSER_CU_ATTR_COMPUTE_CAPABILITY_MINOR 76
#define FUSER_CU_ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR 81
#define FUSER_CU_ATTR_MAX_REGISTERS_PER_MULTIPROCESSOR 82
#define FUSER_CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN 97
#define FUSER_CU_ATTR_CLUSTER_LAUNCH 120
/* CUfunction_attribute values */
#define FUSER_CU_FUNC_ATTR_MAX_THREADS_PER_BLOCK 0
#define FUSER_CU_FUNC_ATTR_NUM_REGS 4
#define FUSER_CU_FUNC_ATTR_LOCAL_SIZE_BYTES 3
#define FUSER_CU_FUNC_ATTR_SHARED_SIZE_BYTES 1
#define FUSER_CU_FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
#define FUSER_CU_FUNC_ATTR_NON_PORTABLE_CLUSTER_SIZE_ALLOWED 14
/* CUlaunchAttributeID values */
#define FUSER_CU_LAUNCH_ATTR_CLUSTER_DIMENSION 4
#define FUSER_CU_LAUNCH_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION 6

/* CUlaunchAttribute: id + a 64-byte value union (we use the cluster dimension member and, for
 * programmatic stream serialization, the int at its start). */
typedef struct {
    int id;
    char pad[4];
    union {
        char raw[64];
        struct { unsigned int x, y, z; } cluster_dim;
        int programmatic_serialization;
    } value;
} fuser_cu_launch_attr;

typedef struct {
    unsigned int grid_x, grid_y, grid_z;
    unsigned int block_x, block_y, block_z;
    unsigned int shared_bytes;
    fuser_cu_stream stream;
    fuser_cu_launch_attr *attrs;
    unsigned int num_attrs;
} fuser_cu_launch_config;

/* The driver entry points fuser uses, resolved once. */
typedef struct fuser_driver {
    char path[1024];    /* the file that was loaded */
    int version;        /* cuDriverGetVersion, e.g. 13000 */
    fuser_cu_result (*cuInit)(unsigned int);
    fuser_cu_result (*cuDriverGetVersion)(int *);
    fuser_cu_result (*cuDeviceGetCount)(int *);
    fuser_cu_result (*cuDeviceGet)(fuser_cu_device *, int);
    fuser_cu_result (*cuDeviceGetName)(char *, int, fuser_cu_device);
    fuser_cu_result (*cuDeviceGetAttribute)(int *, int, fuser_cu_device);
    fuser_cu_result (*cuGetErrorName)(fuser_cu_result, const char **);
    fuser_cu_result (*cuGetErrorString)(fuser_cu_result, const char **);
    fuser_cu_result (*cuCtxGetCurrent)(fuser_cu_context *);
    fuser_cu_result (*cuCtxSetCurrent)(fuser_cu_context);
    fuser_cu_result (*cuCtxSynchronize)(void);
    fuser_cu_result (*cuDevicePrimaryCtxRetain)(fuser_cu_context *, fuser_cu_device);
    fuser_cu_result (*cuModuleLoadData)(fuser_cu_module *, const void *);
    fuser_cu_result (*cuModuleUnload)(fuser_cu_module);
    fuser_cu_result (*cuModuleGetFunction)(fuser_cu_function *, fuser_cu_module, const char *);
    fuser_cu_result (*cuFuncSetAttribute)(fuser_cu_function, int, int);
    fuser_cu_result (*cuFuncGetAttribute)(int *, int, fuser_cu_function);
    fuser_cu_result (*cuLaunchKernelEx)(const fuser_cu_launch_config *, fuser_cu_function, void **, void **);
    fuser_cu_result (*cuOccupancyMaxActiveClusters)(int *, fuser_cu_function, const fuser_cu_launch_config *);
    fuser_cu_result (*cuStreamSynchronize)(fuser_cu_stream);
    fuser_cu_result (*cuCtxGetDevice)(fuser_cu_device *);
    fuser_cu_result (*cuMemAllocAsync)(fuser_cu_deviceptr *, size_t, fuser_cu_stream);
    fuser_cu_result (*cuMemFreeAsync)(fuser_cu_deviceptr, fuser_cu_stream);
    fuser_cu_result (*cuMemsetD32Async)(fuser_cu_deviceptr, unsigned int, size_t, fuser_cu_stream);
    fuser_cu_result (*cuTensorMapEncodeTiled)(void *, int, unsigned int, void *, const uint64_t *, const uint64_t *,
                                              const unsigned int *, const unsigned int *, int, int, int, int);
} fuser_driver;

/* ---- NVRTC ---- */
typedef int fuser_nvrtc_result;
typedef struct _nvrtcProgram *fuser_nvrtc_program;

typedef struct fuser_nvrtc {
    char path[1024];
    int major, minor;
    fuser_nvrtc_result (*nvrtcVersion)(int *, int *);
    const char *(*nvrtcGetErrorString)(fuser_nvrtc_result);
    fuser_nvrtc_result (*nvrtcCreateProgram)(fuser_nvrtc_program *, const char *, const char *, int, const char *const *,
                                      const char *const *);
    fuser_nvrtc_result (*nvrtcDestroyProgram)(fuser_nvrtc_program *);
    fuser_nvrtc_result (*nvrtcCompileProgram)(fuser_nvrtc_program, int, const char *const *);
    fuser_nvrtc_result (*nvrtcGetProgramLogSize)(fuser_nvrtc_program, size_t *);
    fuser_nvrtc_result (*nvrtcGetProgramLog)(fuser_nvrtc_program, char *);
    fuser_nvrtc_result (*nvrtcGetCUBINSize)(fuser_nvrtc_program, size_t *);
    fuser_nvrtc_result (*nvrtcGetCUBIN)(fuser_nvrtc_program, char *);
} fuser_nvrtc;

/** The loaded driver (cuInit already called), or NULL with err set (FUSER_E_CUDA) saying what was
 * tried. The first successful call loads; later calls return the same table. */
const fuser_driver *fuser_driver_get(fuser_err *err);

/** The loaded NVRTC, or NULL with err set (FUSER_E_CUDA) listing every path tried. `dirs` are extra
 * directories searched after $FUSER_NVRTC (may be NULL). A failed search is retried on the next call
 * (the user may have installed the wheel meanwhile); a success is final. */
const fuser_nvrtc *fuser_nvrtc_get(const char *const *dirs, int ndirs, fuser_err *err);

/** Format a driver error as "CUDA_ERROR_X (description)" into buf. */
void fuser_cu_describe(const fuser_driver *drv, fuser_cu_result r, char *buf, size_t n);

/* ---- what fuser.env() reports ---- */
typedef struct fuser_env {
    int driver_found;
    char driver_path[1024];
    int driver_version;          /* e.g. 13000 */
    int device_count;
    int device;                  /* the ordinal queried */
    char gpu_name[256];
    int cc_major, cc_minor;
    int sm_count;
    int smem_per_block_optin;    /* bytes */
    int smem_per_sm;             /* bytes */
    int l2_bytes;
    int clock_khz;
    int mem_clock_khz, mem_bus_bits;
    int cluster_launch;          /* device supports cluster launch */
    int nvrtc_found;
    char nvrtc_path[1024];
    int nvrtc_major, nvrtc_minor;
    char cache_dir[1024];        /* fuser_cache_dir (env.h); "" when that path is too long */
    int fused_available;         /* 1: fuser.ffn runs fused kernels on this device */
    char why[2048];              /* when not available: exactly why */
} fuser_env;

/** Fill `env` for device ordinal `device`. Never fails: what could not be found is recorded in it. */
void fuser_env_query(int device, const char *const *nvrtc_dirs, int ndirs, fuser_env *env);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_CUDA_H */
