/* env.c: what fuser.env() reports: driver, GPU, NVRTC, cache directory, and whether (or exactly why
 * not) the fused path is available. It records problems; it never fails. */
#include "fuser/cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* NOTE: fused kernels use thread-block clusters, DSM and sm_90a instructions: Hopper only. */
#define FUSER_FUSED_CC_MAJOR 9
#define FUSER_FUSED_CC_MINOR 0
/* NOTE: NVRTC must know sm_90a and cluster PTX: CUDA 12.0+; 12.4+ is the oldest we test against. */
#define FUSER_MIN_NVRTC_MAJOR 12
#define FUSER_MIN_NVRTC_MINOR 4
/* The fused kernels are part of this build (include/fuser/device/ffn.cuh). */
#define FUSER_HAVE_FUSED_KERNELS 1

void fuser_cache_dir(char *buf, size_t n)
{
    const char *dir = getenv("FUSER_CACHE_DIR");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (dir && *dir)
        fuser_strlcpy(buf, dir, n);
    else if (xdg && *xdg)
        snprintf(buf, n, "%s/fuser", xdg);
    else
        snprintf(buf, n, "%s/.cache/fuser", home && *home ? home : "/tmp");
}

static void query_device(const fuser_driver *drv, fuser_env *e)
{
    fuser_cu_device dev;
    if (drv->cuDeviceGet(&dev, e->device) != FUSER_CUDA_SUCCESS)
        return;
    drv->cuDeviceGetName(e->gpu_name, (int)sizeof e->gpu_name, dev);
    const struct { int attr; int *slot; } attrs[] = {
        {FUSER_CU_ATTR_COMPUTE_CAPABILITY_MAJOR, &e->cc_major},
        {FUSER_CU_ATTR_COMPUTE_CAPABILITY_MINOR, &e->cc_minor},
        {FUSER_CU_ATTR_MULTIPROCESSOR_COUNT, &e->sm_count},
        {FUSER_CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, &e->smem_per_block_optin},
        {FUSER_CU_ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, &e->smem_per_sm},
        {FUSER_CU_ATTR_L2_CACHE_SIZE, &e->l2_bytes},
        {FUSER_CU_ATTR_CLOCK_RATE, &e->clock_khz},
        {FUSER_CU_ATTR_MEMORY_CLOCK_RATE, &e->mem_clock_khz},
        {FUSER_CU_ATTR_GLOBAL_MEMORY_BUS_WIDTH, &e->mem_bus_bits},
        {FUSER_CU_ATTR_CLUSTER_LAUNCH, &e->cluster_launch},
    };
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++)
        drv->cuDeviceGetAttribute(attrs[i].slot, attrs[i].attr, dev);
}

void fuser_env_query(int device, const char *const *nvrtc_dirs, int ndirs, fuser_env *e)
{
    memset(e, 0, sizeof *e);
    e->device = device;
    fuser_cache_dir(e->cache_dir, sizeof e->cache_dir);

    fuser_err derr, nerr;
    fuser_err_clear(&derr);
    fuser_err_clear(&nerr);
    const fuser_driver *drv = fuser_driver_get(&derr);
    if (drv) {
        e->driver_found = 1;
        fuser_strlcpy(e->driver_path, drv->path, sizeof e->driver_path);
        e->driver_version = drv->version;
        drv->cuDeviceGetCount(&e->device_count);
        if (device >= 0 && device < e->device_count)
            query_device(drv, e);
    }
    const fuser_nvrtc *rtc = fuser_nvrtc_get(nvrtc_dirs, ndirs, &nerr);
    if (rtc) {
        e->nvrtc_found = 1;
        fuser_strlcpy(e->nvrtc_path, rtc->path, sizeof e->nvrtc_path);
        e->nvrtc_major = rtc->major;
        e->nvrtc_minor = rtc->minor;
    }

    /* the first reason, in the order a user would fix them */
    if (!drv)
        fuser_strlcpy(e->why, derr.msg, sizeof e->why);
    else if (e->device_count == 0)
        snprintf(e->why, sizeof e->why, "no GPU: the CUDA driver (%s) sees no device", e->driver_path);
    else if (device < 0 || device >= e->device_count)
        snprintf(e->why, sizeof e->why, "no GPU with ordinal %d (the driver sees %d)", device, e->device_count);
    else if (e->cc_major != FUSER_FUSED_CC_MAJOR || e->cc_minor != FUSER_FUSED_CC_MINOR)
        snprintf(e->why, sizeof e->why,
                 "not Hopper: %s is sm_%d%d; fused kernels need sm_90 (H100/H200/H20/GH200)", e->gpu_name,
                 e->cc_major, e->cc_minor);
    else if (!e->cluster_launch)
        snprintf(e->why, sizeof e->why, "%s does not support thread-block cluster launch", e->gpu_name);
    else if (!rtc)
        fuser_strlcpy(e->why, nerr.msg, sizeof e->why);
    else if (rtc->major < FUSER_MIN_NVRTC_MAJOR ||
             (rtc->major == FUSER_MIN_NVRTC_MAJOR && rtc->minor < FUSER_MIN_NVRTC_MINOR))
        snprintf(e->why, sizeof e->why, "NVRTC %d.%d at %s is too old; fused kernels need %d.%d or newer",
                 rtc->major, rtc->minor, rtc->path, FUSER_MIN_NVRTC_MAJOR, FUSER_MIN_NVRTC_MINOR);
    else if (!FUSER_HAVE_FUSED_KERNELS)
        snprintf(e->why, sizeof e->why,
                 "this version of fuser has no fused GPU kernels yet; fuser.ffn computes the PyTorch "
                 "reference");
    else
        e->fused_available = 1;
}
