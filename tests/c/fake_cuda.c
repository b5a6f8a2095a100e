/* fake_cuda.c: a stand-in libcuda / libnvrtc for CPU-only tests of fuser's lazy loader and env report.
 * Built by tests/test_env.py into a temporary folder; loaded through $FUSER_LIBCUDA / $FUSER_NVRTC.
 * Properties come from environment variables: FAKE_CUDA_COUNT, FAKE_CUDA_CC (e.g. 90),
 * FAKE_CUDA_INIT_ERROR, FAKE_NVRTC_VERSION (e.g. 1304). It launches nothing. */
#include <stdlib.h>
#include <string.h>

static int envint(const char *name, int def)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : def;
}

int cuInit(unsigned flags) { (void)flags; return envint("FAKE_CUDA_INIT_ERROR", 0); }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuDeviceGetCount(int *n) { *n = envint("FAKE_CUDA_COUNT", 1); return 0; }
int cuDeviceGet(int *d, int ordinal) { *d = ordinal; return ordinal < envint("FAKE_CUDA_COUNT", 1) ? 0 : 101; }
int cuDeviceGetName(char *buf, int n, int dev)
{
    (void)dev;
    strncpy(buf, envint("FAKE_CUDA_CC", 90) == 90 ? "NVIDIA H200" : "NVIDIA A100-SXM4-80GB", (size_t)n);
    return 0;
}
int cuDeviceGetAttribute(int *v, int attr, int dev)
{
    (void)dev;
    switch (attr) {
    case 75: *v = envint("FAKE_CUDA_CC", 90) / 10; break;
    case 76: *v = envint("FAKE_CUDA_CC", 90) % 10; break;
    case 16: *v = 132; break;
    case 97: *v = 232448; break;
    case 81: *v = 233472; break;
    case 38: *v = 62914560; break;
    case 120: *v = envint("FAKE_CUDA_CC", 90) >= 90; break;
    default: *v = 1; break;
    }
    return 0;
}
int cuGetErrorName(int r, const char **s) { *s = r == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_FAKE"; return 0; }
int cuGetErrorString(int r, const char **s) { *s = r == 100 ? "no CUDA-capable device is detected" : "fake"; return 0; }
/* present so the loader resolves every symbol; never called by the env tests */
int cuCtxGetCurrent(void **c) { *c = 0; return 0; }
int cuCtxSetCurrent(void *c) { (void)c; return 0; }
int cuCtxSynchronize(void) { return 0; }
int cuDevicePrimaryCtxRetain(void **c, int d) { (void)d; *c = 0; return 0; }
int cuModuleLoadData(void **m, const void *p) { (void)m; (void)p; return 1; }
int cuModuleUnload(void *m) { (void)m; return 0; }
int cuModuleGetFunction(void **f, void *m, const char *n) { (void)f; (void)m; (void)n; return 1; }
int cuFuncSetAttribute(void *f, int a, int v) { (void)f; (void)a; (void)v; return 0; }
int cuFuncGetAttribute(int *v, int a, void *f) { (void)a; (void)f; *v = 0; return 0; }
int cuLaunchKernelEx(const void *c, void *f, void **p, void **e) { (void)c; (void)f; (void)p; (void)e; return 1; }
int cuOccupancyMaxActiveClusters(int *n, void *f, const void *c) { (void)f; (void)c; *n = 0; return 0; }
int cuStreamSynchronize(void *s) { (void)s; return 0; }
int cuCtxGetDevice(int *d) { *d = 0; return 0; }
int cuMemAllocAsync(unsigned long long *p, size_t n, void *s) { (void)n; (void)s; *p = 0; return 2; }
int cuMemFreeAsync(unsigned long long p, void *s) { (void)p; (void)s; return 0; }
int cuMemsetD32Async(unsigned long long p, unsigned v, size_t n, void *s) { (void)p; (void)v; (void)n; (void)s; return 0; }
int cuTensorMapEncodeTiled(void *m, int t, unsigned r, void *a, const void *d, const void *s, const void *b,
                           const void *e, int i, int w, int l, int o)
{
    (void)m; (void)t; (void)r; (void)a; (void)d; (void)s; (void)b; (void)e; (void)i; (void)w; (void)l; (void)o;
    return 1;
}

/* NVRTC */
int nvrtcVersion(int *major, int *minor)
{
    int v = envint("FAKE_NVRTC_VERSION", 1300);
    *major = v / 100;
    *minor = v % 100;
    return 0;
}
const char *nvrtcGetErrorString(int r) { (void)r; return "fake"; }
int nvrtcCreateProgram(void **p, const char *s, const char *n, int k, const char *const *h, const char *const *i)
{ (void)p; (void)s; (void)n; (void)k; (void)h; (void)i; return 1; }
int nvrtcDestroyProgram(void **p) { (void)p; return 0; }
int nvrtcCompileProgram(void *p, int n, const char *const *o) { (void)p; (void)n; (void)o; return 1; }
int nvrtcGetProgramLogSize(void *p, size_t *n) { (void)p; *n = 1; return 0; }
int nvrtcGetProgramLog(void *p, char *s) { (void)p; s[0] = 0; return 0; }
int nvrtcGetCUBINSize(void *p, size_t *n) { (void)p; *n = 0; return 0; }
int nvrtcGetCUBIN(void *p, char *s) { (void)p; (void)s; return 0; }
