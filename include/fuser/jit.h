/* jit.h: CUDA source -> sm_90a CUBIN with NVRTC, and what ptxas said about it.
 *
 * The kernel templates (the .cuh files under include/fuser/device, embedded at build time:
 * embedded.h) go to NVRTC as in-memory headers under their include names ("fuser/device/common.cuh"),
 * so generated source compiles with no CUDA toolkit on disk. Options, in order:
 * FUSER_JIT_BASE_OPTIONS, then the caller's. `--gpu-architecture=sm_90a` makes NVRTC produce a CUBIN
 * (SASS for Hopper with the wgmma/setmaxnreg "a" features; `compute_90a` would give PTX);
 * `--ptxas-options=-v` makes the log report registers, spills and static shared memory per kernel,
 * which fuser_jit_parse_log reads back.
 *
 * This file does not cache (cache.h) and does not load or launch (launch.h).
 */
#ifndef FUSER_JIT_H
#define FUSER_JIT_H

#include <stddef.h>

#include "fuser/cuda.h"
#include "fuser/hash.h"
#include "fuser/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FUSER_JIT_ARCH "sm_90a"
/* The options every compile gets, before the caller's (they are part of every cache key). */
#define FUSER_JIT_BASE_OPTIONS                                                                      \
    "--gpu-architecture=" FUSER_JIT_ARCH, "-std=c++17", "-default-device", "--ptxas-options=-v"
#define FUSER_JIT_MAX_OPTIONS 64 /* base + extra */

/** What ptxas reported for one entry function (a __global__ kernel). -1: not reported. */
typedef struct fuser_kernel_res {
    char *name;              /* as ptxas names it: the symbol for cuModuleGetFunction (malloc) */
    int registers;           /* per thread */
    int spill_store_bytes;   /* bytes of spill stores (0: no spills) */
    int spill_load_bytes;
    int stack_bytes;         /* stack frame */
    int smem_bytes;          /* static shared memory per block */
} fuser_kernel_res;

/** How the disk cache took part in producing a fuser_cubin (fuser_compile_cached, cache.h). */
enum {
    FUSER_CACHE_NONE = 0,       /* compiled by fuser_jit_compile directly: no cache involved */
    FUSER_CACHE_STORED,         /* compiled now and written to the disk cache */
    FUSER_CACHE_HIT,            /* read from the disk cache: NVRTC was not called */
    FUSER_CACHE_DISABLED,       /* compiled now; $FUSER_CACHE_DISABLE turned the disk cache off */
    FUSER_CACHE_NOT_STORED,     /* compiled now and valid, but writing the entry failed (see note) */
    FUSER_CACHE_REFUSED,        /* compiled now; the cache directory is unsafe or its path too long, so
                                 * nothing was read or written there (the note says why) */
};

/** A compiled module. Owns every pointer in it (malloc); release with fuser_cubin_free, after
 * success and after failure alike. Zeroed by the functions that fill it. */
typedef struct fuser_cubin {
    unsigned char *data;     /* the CUBIN (an ELF image); NULL after a failed compile */
    size_t size;
    char *log;               /* the full NVRTC log (ptxas' report, warnings, errors), NUL-terminated,
                              * also after a failed compile; NULL only when there is none at all */
    size_t log_size;         /* strlen(log) */
    /* totals over the module: most registers and most static smem of any kernel; spill bytes summed
     * over every function (kernels and non-inlined device functions) */
    int registers, spill_store_bytes, spill_load_bytes, smem_bytes;
    fuser_kernel_res *kernels; /* entry functions in the order ptxas compiled them (malloc) */
    int n_kernels;
    struct {                 /* filled by fuser_compile_cached; zero otherwise */
        int state;           /* FUSER_CACHE_* above */
        char key[FUSER_SHA256_HEX];  /* the cache key (hex), "" when none was computed */
        char note[512];      /* why the disk cache did not serve this (absent or invalid entry, a
                              * failed store), or how a hit was served; "" when there is nothing to say */
    } cache;
} fuser_cubin;

/** The full option list for `extra` (FUSER_JIT_BASE_OPTIONS then extra), into out[0..max).
 * Returns the count, or -1 when it exceeds max. */
int fuser_jit_options(const char *const *extra, int n_extra, const char **out, int max);

/** Compile `source` (a translation unit; `name` is its file name in diagnostics, e.g. "ffn.cu") for
 * sm_90a with the embedded headers available to #include. On success fills out (cubin, log, resource
 * numbers) and returns FUSER_OK. A compile error returns FUSER_E_COMPILE whose message holds the start
 * of the log; out->log then holds all of it. Too many options: FUSER_E_VALUE. Thread-safe (NVRTC
 * programs are independent); it blocks for as long as NVRTC runs (tens of ms to seconds). */
int fuser_jit_compile(const fuser_nvrtc *rtc, const char *source, const char *name, const char *const *extra_opts,
                      int n_extra, fuser_cubin *out, fuser_err *err);

/** Read ptxas' verbose report in `log` into out's resource numbers and kernel list (replacing any).
 * A log without such lines gives no kernels and zero totals. FUSER_E_NOMEM is the only failure. */
int fuser_jit_parse_log(const char *log, fuser_cubin *out, fuser_err *err);

/** Release what `c` owns and zero it. Safe on a zeroed or already freed fuser_cubin. */
void fuser_cubin_free(fuser_cubin *c);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_JIT_H */
