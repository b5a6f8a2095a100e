/* cuda_loader.c: dlopen/dlsym of libcuda and libnvrtc (see include/fuser/cuda.h for the search order).
 *
 * The loaded tables are process-wide (a library is loaded once per process anyway). Each is written
 * once under a mutex and is read-only afterwards; nothing else here is mutable. */
#define _GNU_SOURCE
#include "fuser/cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static fuser_driver driver;     /* valid once driver_loaded */
static int driver_loaded;
static fuser_nvrtc nvrtc;       /* valid once nvrtc_loaded */
static int nvrtc_loaded;

/* ---- helpers ---- */

/* Append "; <text>" to a bounded message buffer. */
static void note(char *buf, size_t n, const char *text)
{
    if (buf[0])
        fuser_strlcat(buf, "; ", n);
    fuser_strlcat(buf, text, n);
}

/* out = dir + "/" + file; 0 on success, -1 if it does not fit. */
static int join_path(char *out, size_t n, const char *dir, const char *file)
{
    return snprintf(out, n, "%s/%s", dir, file) < (int)n ? 0 : -1;
}

/* Resolve `count` symbols named in `names` into the consecutive function-pointer slots at `slots`. */
static int resolve(void *lib, const char *const *names, void **slots, int count, char *missing, size_t n)
{
    for (int i = 0; i < count; i++) {
        void *sym = dlsym(lib, names[i]);
        if (!sym) {
            snprintf(missing, n, "%s", names[i]);
            return -1;
        }
        slots[i] = sym;
    }
    return 0;
}

/* The real path of the loaded object that defines `sym`. */
static void loaded_path(void *sym, const char *fallback, char *out, size_t n)
{
    Dl_info info;
    if (sym && dladdr(sym, &info) && info.dli_fname)
        snprintf(out, n, "%s", info.dli_fname);
    else
        snprintf(out, n, "%s", fallback);
}

/* ---- driver ---- */

static const char *const driver_syms[] = {
    "cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName",
    "cuDeviceGetAttribute", "cuGetErrorName", "cuGetErrorString", "cuCtxGetCurrent", "cuCtxSetCurrent",
    "cuCtxSynchronize", "cuDevicePrimaryCtxRetain", "cuModuleLoadData", "cuModuleUnload",
    "cuModuleGetFunction", "cuFuncSetAttribute", "cuFuncGetAttribute", "cuLaunchKernelEx",
    "cuOccupancyMaxActiveClusters", "cuStreamSynchronize", "cuCtxGetDevice", "cuMemAllocAsync",
    "cuMemFreeAsync", "cuMemsetD32Async", "cuTensorMapEncodeTiled",
};
#define N_DRIVER_SYMS ((int)(sizeof driver_syms / sizeof driver_syms[0]))
_Static_assert(sizeof(fuser_driver) == offsetof(fuser_driver, cuInit) + N_DRIVER_SYMS * sizeof(void *),
               "driver_syms must list every entry point of fuser_driver, in order");

void fuser_cu_describe(const fuser_driver *drv, fuser_cu_result r, char *buf, size_t n)
{
    const char *name = NULL, *text = NULL;
    if (drv) {
        drv->cuGetErrorName(r, &name);
        drv->cuGetErrorString(r, &text);
    }
    snprintf(buf, n, "%s (%s)", name ? name : "CUDA_ERROR_UNKNOWN", text ? text : "no description");
}

static int load_driver(fuser_err *err)
{
    const char *override = getenv("FUSER_LIBCUDA");
    const char *name = override && *override ? override : "libcuda.so.1";
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        if (override && *override)
            return fuser_fail(err, FUSER_E_CUDA, "no CUDA driver: $FUSER_LIBCUDA=%s could not be loaded (%s)",
                              override, why ? why : "?");
        return fuser_fail(err, FUSER_E_CUDA,
                          "no CUDA driver: libcuda.so.1 not found by the system loader (%s); install the "
                          "NVIDIA driver or set $FUSER_LIBCUDA", why ? why : "?");
    }
    fuser_driver d;
    memset(&d, 0, sizeof d);
    char missing[128];
    if (resolve(lib, driver_syms, (void **)&d.cuInit, N_DRIVER_SYMS, missing, sizeof missing)) {
        dlclose(lib);
        return fuser_fail(err, FUSER_E_CUDA,
                          "the CUDA driver in %s lacks %s: it is older than CUDA 12.0; update the NVIDIA "
                          "driver", name, missing);
    }
    loaded_path((void *)d.cuInit, name, d.path, sizeof d.path);
    fuser_cu_result r = d.cuInit(0);
    if (r != FUSER_CUDA_SUCCESS) {
        char desc[256];
        fuser_cu_describe(&d, r, desc, sizeof desc);
        dlclose(lib);
        return fuser_fail(err, FUSER_E_CUDA, "the CUDA driver (%s) failed to initialise: %s", d.path, desc);
    }
    d.cuDriverGetVersion(&d.version);
    driver = d;
    driver_loaded = 1; /* the handle stays open for the life of the process */
    return FUSER_OK;
}

const fuser_driver *fuser_driver_get(fuser_err *err)
{
    pthread_mutex_lock(&load_lock);
    int rc = driver_loaded ? FUSER_OK : load_driver(err);
    pthread_mutex_unlock(&load_lock);
    return rc == FUSER_OK ? &driver : NULL;
}

/* ---- NVRTC ---- */

static const char *const nvrtc_syms[] = {
    "nvrtcVersion", "nvrtcGetErrorString", "nvrtcCreateProgram", "nvrtcDestroyProgram",
    "nvrtcCompileProgram", "nvrtcGetProgramLogSize", "nvrtcGetProgramLog", "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
};
#define N_NVRTC_SYMS ((int)(sizeof nvrtc_syms / sizeof nvrtc_syms[0]))
_Static_assert(sizeof(fuser_nvrtc) ==
                   offsetof(fuser_nvrtc, nvrtcVersion) + N_NVRTC_SYMS * sizeof(void *),
               "nvrtc_syms must list every entry point of fuser_nvrtc, in order");

static const char *const nvrtc_sonames[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
#define N_SONAMES ((int)(sizeof nvrtc_sonames / sizeof nvrtc_sonames[0]))

/* NOTE: libnvrtc dlopens libnvrtc-builtins.so.<major>.<minor> by bare name at compile time, and has
 * no RPATH; from a wheel folder (not on the loader's path) that fails with "failed to open
 * libnvrtc-builtins". Loading it from libnvrtc's own folder first makes the later lookup by soname
 * find it. A failure here is not fatal: the system loader may still find it. */
static void preload_builtins(const fuser_nvrtc *v)
{
    char dir[sizeof v->path], file[sizeof v->path + 64];
    fuser_strlcpy(dir, v->path, sizeof dir);
    char *slash = strrchr(dir, '/');
    if (!slash)
        return;
    *slash = '\0';
    if (snprintf(file, sizeof file, "%s/libnvrtc-builtins.so.%d.%d", dir, v->major, v->minor) < (int)sizeof file)
        dlopen(file, RTLD_NOW | RTLD_LOCAL); /* kept open for the life of the process, as libnvrtc is */
}

/* Try one candidate file (or soname); on success fill nvrtc and return 0. */
static int try_nvrtc(const char *file, char *tried, size_t ntried)
{
    void *lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        note(tried, ntried, file);
        return -1;
    }
    fuser_nvrtc v;
    memset(&v, 0, sizeof v);
    char missing[128];
    if (resolve(lib, nvrtc_syms, (void **)&v.nvrtcVersion, N_NVRTC_SYMS, missing, sizeof missing)) {
        note(tried, ntried, file);
        note(tried, ntried, "(lacks a needed symbol)");
        dlclose(lib);
        return -1;
    }
    if (v.nvrtcVersion(&v.major, &v.minor) != 0) {
        note(tried, ntried, file);
        dlclose(lib);
        return -1;
    }
    loaded_path((void *)v.nvrtcVersion, file, v.path, sizeof v.path);
    preload_builtins(&v);
    nvrtc = v;
    nvrtc_loaded = 1;
    return 0;
}

/* Try every soname in directory `dir`. */
static int try_nvrtc_dir(const char *dir, char *tried, size_t ntried)
{
    char file[1100];
    for (int i = 0; i < N_SONAMES; i++)
        if (!join_path(file, sizeof file, dir, nvrtc_sonames[i]) && !try_nvrtc(file, tried, ntried))
            return 0;
    return -1;
}

static int load_nvrtc(const char *const *dirs, int ndirs, fuser_err *err)
{
    const char *override = getenv("FUSER_NVRTC");
    char tried[FUSER_ERRMSG_MAX - 200] = "";
    if (override && *override) {
        if (!try_nvrtc(override, tried, sizeof tried))
            return FUSER_OK;
        return fuser_fail(err, FUSER_E_CUDA, "no NVRTC: $FUSER_NVRTC=%s could not be loaded or is not a "
                          "usable libnvrtc (tried: %s)", override, tried);
    }
    for (int i = 0; i < ndirs; i++)
        if (dirs[i] && *dirs[i] && !try_nvrtc_dir(dirs[i], tried, sizeof tried))
            return FUSER_OK;
    static const char *const roots[] = {"CUDA_HOME", "CUDA_PATH"};
    for (int r = 0; r < 2; r++) {
        const char *root = getenv(roots[r]);
        if (!root || !*root)
            continue;
        char dir[1100];
        if (!join_path(dir, sizeof dir, root, "lib64") && !try_nvrtc_dir(dir, tried, sizeof tried))
            return FUSER_OK;
        if (!join_path(dir, sizeof dir, root, "lib") && !try_nvrtc_dir(dir, tried, sizeof tried))
            return FUSER_OK;
    }
    if (!try_nvrtc_dir("/usr/local/cuda/lib64", tried, sizeof tried))
        return FUSER_OK;
    for (int i = 0; i < N_SONAMES; i++)
        if (!try_nvrtc(nvrtc_sonames[i], tried, sizeof tried))
            return FUSER_OK;
    return fuser_fail(err, FUSER_E_CUDA,
                      "no NVRTC: install it with `pip install nvidia-cuda-nvrtc` or set $FUSER_NVRTC or "
                      "$CUDA_HOME (tried: %s)", tried);
}

const fuser_nvrtc *fuser_nvrtc_get(const char *const *dirs, int ndirs, fuser_err *err)
{
    pthread_mutex_lock(&load_lock);
    int rc = nvrtc_loaded ? FUSER_OK : load_nvrtc(dirs, ndirs, err);
    pthread_mutex_unlock(&load_lock);
    return rc == FUSER_OK ? &nvrtc : NULL;
}
