/* env.c: what fuser.env() reports (driver, GPU, NVRTC, cache directory, and whether, or exactly why
 * not, the fused path is available), and the environment variables the core reads itself (env.h):
 * the boolean parser and the choice of the cache directory. It records problems; it never fails. */
#define _POSIX_C_SOURCE 200809L /* geteuid */
#include "fuser/env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuser/cuda.h"

/* NOTE: fused kernels use thread-block clusters, DSM and sm_90a instructions: Hopper only. */
#define FUSER_FUSED_CC_MAJOR 9
#define FUSER_FUSED_CC_MINOR 0
/* NOTE: NVRTC must know sm_90a and cluster PTX: CUDA 12.0+; 12.4+ is the oldest we test against. */
#define FUSER_MIN_NVRTC_MAJOR 12
#define FUSER_MIN_NVRTC_MINOR 4
/* The fused kernels are part of this build (include/fuser/device/ffn.cuh). */
#define FUSER_HAVE_FUSED_KERNELS 1

_Static_assert(sizeof ((fuser_env *)0)->cache_dir == FUSER_CACHE_DIR_MAX, "env.h and cuda.h agree");

/* ---- boolean variables ---- */

/* Every spelling a boolean variable takes (compared without case); FUSER_FLAG_SPELLINGS lists them. */
static const struct { const char *word; int on; } flag_words[] = {
    {"", 0}, {"0", 0}, {"false", 0}, {"no", 0}, {"off", 0}, {"1", 1}, {"true", 1}, {"yes", 1}, {"on", 1},
};

static int same_word(const char *value, const char *word)
{
    for (; *value && *word; value++, word++) {
        char c = *value >= 'A' && *value <= 'Z' ? (char)(*value - 'A' + 'a') : *value;
        if (c != *word)
            return 0;
    }
    return *value == *word;
}

int fuser_parse_flag(const char *name, const char *value, int *on, fuser_err *err)
{
    *on = 0;
    if (!value)
        return FUSER_OK;
    for (size_t i = 0; i < sizeof flag_words / sizeof flag_words[0]; i++)
        if (same_word(value, flag_words[i].word)) {
            *on = flag_words[i].on;
            return FUSER_OK;
        }
    char shown[68]; /* the value as printable text, cut at 64 bytes: it goes into a one-line message */
    size_t n = 0;
    for (; value[n] && n < 64; n++)
        shown[n] = value[n] >= ' ' && value[n] <= '~' ? value[n] : '?';
    fuser_strlcpy(shown + n, value[n] ? "..." : "", sizeof shown - n);
    return fuser_fail(err, FUSER_E_VALUE, "$%s='%s' is not a boolean: use %s", name, shown, FUSER_FLAG_SPELLINGS);
}

int fuser_env_flag(const char *name, int *on, fuser_err *err)
{
    return fuser_parse_flag(name, getenv(name), on, err);
}

/* ---- the cache directory ---- */

int fuser_cache_dir(char buf[FUSER_CACHE_DIR_MAX], const char **from, fuser_err *err)
{
    const char *dir = getenv("FUSER_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    const char *tmp = getenv("TMPDIR"), *who;
    int len;
    if (dir && *dir) {
        who = "$FUSER_CACHE_DIR";
        len = snprintf(buf, FUSER_CACHE_DIR_MAX, "%s", dir);
    } else if (xdg && xdg[0] == '/') {
        who = "$XDG_CACHE_HOME/fuser";
        len = snprintf(buf, FUSER_CACHE_DIR_MAX, "%s/fuser", xdg);
    } else if (home && *home) {
        who = "$HOME/.cache/fuser";
        len = snprintf(buf, FUSER_CACHE_DIR_MAX, "%s/.cache/fuser", home);
    } else {
        int own_tmp = tmp && tmp[0] == '/';
        who = own_tmp ? "$TMPDIR/fuser-<uid>" : "/tmp/fuser-<uid>";
        len = snprintf(buf, FUSER_CACHE_DIR_MAX, "%s/fuser-%lu", own_tmp ? tmp : "/tmp", (unsigned long)geteuid());
    }
    if (from)
        *from = who;
    if (len >= 0 && len < FUSER_CACHE_DIR_MAX)
        return FUSER_OK;
    buf[0] = '\0';
    return fuser_fail(err, FUSER_E_CACHE, "the kernel cache path from %s is %d bytes long; fuser takes paths of up "
                      "to %d bytes and never cuts one, so it runs without a disk cache (kernels are compiled and "
                      "kept in memory): set $FUSER_CACHE_DIR to a shorter path", who, len,
                      FUSER_CACHE_DIR_MAX - 1);
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
    fuser_cache_dir(e->cache_dir, NULL, NULL); /* "" when too long: the cache reports why */

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
