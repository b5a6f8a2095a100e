/* test_launch.c: the launch path against a recording stand-in driver table (no GPU): launch
 * configuration (attribute id, cluster dims, validation), the non-portable decision, context binding,
 * attributes read back at load, and that each function attribute is set once, only when needed. */
#include "ctest.h"
#include "fuser/launch.h"

/* ---- a driver that records what it is asked ---- */
static struct {
    fuser_cu_context current;
    int ctx_device;                  /* what cuCtxGetDevice says */
    int retained, set_current;
    int set_attr_calls, last_attr, last_value;
    fuser_cu_launch_config launched; /* a copy of the last launch configuration */
    fuser_cu_launch_attr launched_attr;
    fuser_cu_launch_attr launched_attr2; /* the second attribute, when there is one */
    int launches;
    fuser_cu_result launch_result;
} fake;

#define PRIMARY(dev) ((fuser_cu_context)(0x1000 + (char *)0 + (dev)))

static fuser_cu_result f_get_current(fuser_cu_context *c) { *c = fake.current; return 0; }
static fuser_cu_result f_set_current(fuser_cu_context c) { fake.current = c; fake.set_current++; return 0; }
static fuser_cu_result f_ctx_device(fuser_cu_device *d) { *d = fake.ctx_device; return 0; }
static fuser_cu_result f_device_get(fuser_cu_device *d, int ordinal) { *d = ordinal; return ordinal < 2 ? 0 : 101; }
static fuser_cu_result f_retain(fuser_cu_context *c, fuser_cu_device d)
{
    *c = PRIMARY(d);
    fake.retained++;
    return 0;
}
static fuser_cu_result f_load(fuser_cu_module *m, const void *image)
{
    *m = (fuser_cu_module)(uintptr_t)0x2000;
    return memcmp(image, "\177ELF", 4) ? 200 : 0; /* CUDA_ERROR_INVALID_IMAGE */
}
static fuser_cu_result f_unload(fuser_cu_module m) { (void)m; return 0; }
static fuser_cu_result f_get_function(fuser_cu_function *f, fuser_cu_module m, const char *name)
{
    (void)m;
    *f = (fuser_cu_function)(uintptr_t)0x3000;
    return strcmp(name, "probe") ? 500 : 0; /* CUDA_ERROR_NOT_FOUND */
}
static fuser_cu_result f_get_attr(int *v, int attr, fuser_cu_function f)
{
    (void)f;
    static const int values[16] = {[FUSER_CU_FUNC_ATTR_MAX_THREADS_PER_BLOCK] = 384,
                                   [FUSER_CU_FUNC_ATTR_SHARED_SIZE_BYTES] = 1024,
                                   [FUSER_CU_FUNC_ATTR_LOCAL_SIZE_BYTES] = 0,
                                   [FUSER_CU_FUNC_ATTR_NUM_REGS] = 168,
                                   [FUSER_CU_FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES] = 48 * 1024 - 1024};
    *v = values[attr];
    return 0;
}
static fuser_cu_result f_set_attr(fuser_cu_function f, int attr, int v)
{
    (void)f;
    fake.set_attr_calls++;
    fake.last_attr = attr;
    fake.last_value = v;
    return attr == FUSER_CU_FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES && v > 232448 ? 1 : 0;
}
static fuser_cu_result f_launch(const fuser_cu_launch_config *c, fuser_cu_function f, void **p, void **e)
{
    (void)f;
    (void)p;
    (void)e;
    fake.launched = *c;
    fake.launched_attr = c->attrs[0];
    if (c->num_attrs > 1)
        fake.launched_attr2 = c->attrs[1];
    fake.launches++;
    return fake.launch_result;
}
static fuser_cu_result f_occupancy(int *n, fuser_cu_function f, const fuser_cu_launch_config *c)
{
    (void)f;
    *n = 132 / (int)(c->attrs[0].value.cluster_dim.x * c->attrs[0].value.cluster_dim.y);
    return 0;
}
static fuser_cu_result f_error_name(fuser_cu_result r, const char **s)
{
    *s = r == 1 ? "CUDA_ERROR_INVALID_VALUE" : r == 912 ? "CUDA_ERROR_INVALID_CLUSTER_SIZE" : "CUDA_ERROR_OTHER";
    return 0;
}
static fuser_cu_result f_error_string(fuser_cu_result r, const char **s)
{
    *s = r == 1 ? "invalid argument" : "some error";
    return 0;
}

static fuser_driver fake_driver(void)
{
    fuser_driver d;
    memset(&d, 0, sizeof d);
    d.cuCtxGetCurrent = f_get_current;
    d.cuCtxSetCurrent = f_set_current;
    d.cuCtxGetDevice = f_ctx_device;
    d.cuDeviceGet = f_device_get;
    d.cuDevicePrimaryCtxRetain = f_retain;
    d.cuModuleLoadData = f_load;
    d.cuModuleUnload = f_unload;
    d.cuModuleGetFunction = f_get_function;
    d.cuFuncGetAttribute = f_get_attr;
    d.cuFuncSetAttribute = f_set_attr;
    d.cuLaunchKernelEx = f_launch;
    d.cuOccupancyMaxActiveClusters = f_occupancy;
    d.cuGetErrorName = f_error_name;
    d.cuGetErrorString = f_error_string;
    return d;
}

static fuser_dim3 dim(unsigned x, unsigned y, unsigned z) { return (fuser_dim3){x, y, z}; }

void test_launch_config(void)
{
    fuser_cu_launch_attr attr[FUSER_LAUNCH_MAX_ATTRS];
    fuser_cu_launch_config cfg;
    fuser_err err;
    fuser_err_clear(&err);
    fuser_cu_stream stream = (fuser_cu_stream)(uintptr_t)0x77;
    CHECK(fuser_launch_config(dim(128, 2, 1), dim(384, 1, 1), dim(4, 2, 1), 200000, stream, 0, attr, &cfg, &err) ==
          FUSER_OK);
    CHECK(cfg.grid_x == 128 && cfg.grid_y == 2 && cfg.grid_z == 1 && cfg.block_x == 384 && cfg.block_y == 1);
    CHECK(cfg.shared_bytes == 200000 && cfg.stream == stream && cfg.attrs == attr && cfg.num_attrs == 1);
    CHECK(attr[0].id == FUSER_CU_LAUNCH_ATTR_CLUSTER_DIMENSION && attr[0].id == 4);
    CHECK(attr[0].value.cluster_dim.x == 4 && attr[0].value.cluster_dim.y == 2 && attr[0].value.cluster_dim.z == 1);

    /* early (programmatic dependent) launch: a second attribute, CUDA's id 6 with the int 1 */
    CHECK(fuser_launch_config(dim(132, 1, 1), dim(384, 1, 1), dim(1, 1, 1), 0, stream, FUSER_LAUNCH_EARLY, attr, &cfg,
                              &err) == FUSER_OK);
    CHECK(cfg.num_attrs == 2 && attr[1].id == FUSER_CU_LAUNCH_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION && attr[1].id == 6);
    CHECK(attr[1].value.programmatic_serialization == 1 && attr[0].value.cluster_dim.x == 1);
    CHECK(fuser_launch_config(dim(132, 1, 1), dim(384, 1, 1), dim(1, 1, 1), 0, stream, 4, attr, &cfg, &err) ==
          FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "launch flags 0x4: unknown bits");

    CHECK(fuser_launch_config(dim(6, 1, 1), dim(128, 1, 1), dim(4, 1, 1), 0, NULL, 0, attr, &cfg, &err) ==
          FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "grid (6, 1, 1) is not a whole number of clusters (4, 1, 1)");
    CHECK(fuser_launch_config(dim(8, 1, 1), dim(128, 0, 1), dim(1, 1, 1), 0, NULL, 0, attr, &cfg, &err) ==
          FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "block (128, 0, 1) has a zero dimension");
    CHECK(fuser_launch_config(dim(8, 1, 1), dim(1024, 2, 1), dim(1, 1, 1), 0, NULL, 0, attr, &cfg, &err) ==
          FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "more than 1024 threads");

    /* portable up to 8 blocks, whatever the shape */
    CHECK(!fuser_cluster_non_portable(dim(8, 1, 1)) && !fuser_cluster_non_portable(dim(2, 2, 2)));
    CHECK(!fuser_cluster_non_portable(dim(1, 1, 1)));
    CHECK(fuser_cluster_non_portable(dim(16, 1, 1)) && fuser_cluster_non_portable(dim(4, 2, 2)));
    CHECK(fuser_cluster_non_portable(dim(3, 3, 1)));
}

void test_launch_driver(void)
{
    fuser_driver d = fake_driver();
    fuser_kernel k;
    fuser_err err;
    fuser_err_clear(&err);
    static const unsigned char elf[] = "\177ELF....";
    memset(&fake, 0, sizeof fake);

    /* a thread with no context: device 1's primary context is retained and made current */
    CHECK(fuser_kernel_load(&d, 1, elf, "probe", &k, &err) == FUSER_OK);
    CHECK(fake.retained == 1 && fake.current == PRIMARY(1) && k.ctx == PRIMARY(1) && k.device == 1);
    CHECK(k.num_regs == 168 && k.static_smem_bytes == 1024 && k.local_bytes == 0 && k.max_threads == 384);
    CHECK(atomic_load(&k.dyn_smem_limit) == 48 * 1024 - 1024);

    /* torch's context already current: used as it is */
    fuser_kernel k2;
    fake.ctx_device = 1;
    CHECK(fuser_kernel_load(&d, 1, elf, "probe", &k2, &err) == FUSER_OK && fake.retained == 1);
    CHECK(fuser_kernel_unload(&d, &k2, &err) == FUSER_OK && k2.module == NULL);
    CHECK(fuser_kernel_load(&d, 0, elf, "probe", &k2, &err) == FUSER_E_CUDA);
    CHECK_ERR(&err, FUSER_E_CUDA, "the current CUDA context is on device 1, not 0");
    fake.ctx_device = 0;
    CHECK(fuser_kernel_load(&d, 0, "nope", "probe", &k2, &err) == FUSER_E_CUDA);
    CHECK_ERR(&err, FUSER_E_CUDA, "cuModuleLoadData of kernel probe failed: CUDA_ERROR_OTHER");
    CHECK(fuser_kernel_load(&d, 0, elf, "missing", &k2, &err) == FUSER_E_CUDA);
    CHECK_ERR(&err, FUSER_E_CUDA, "cuModuleGetFunction of kernel missing failed");
    CHECK(k2.module == NULL);

    /* a launch within the default limit sets nothing */
    fake.ctx_device = 1;
    CHECK(fuser_kernel_launch(&d, &k, dim(132, 1, 1), dim(384, 1, 1), dim(2, 1, 1), 40 * 1024, NULL, NULL, &err) ==
          FUSER_OK);
    CHECK(fake.launches == 1 && fake.set_attr_calls == 0);
    CHECK(fake.launched.grid_x == 132 && fake.launched.shared_bytes == 40 * 1024 && fake.launched.num_attrs == 1);
    CHECK(fake.launched_attr.id == FUSER_CU_LAUNCH_ATTR_CLUSTER_DIMENSION);
    CHECK(fake.launched_attr.value.cluster_dim.x == 2 && fake.launched_attr.value.cluster_dim.y == 1);

    CHECK(fuser_kernel_launch(&d, &k, dim(132, 1, 1), dim(384, 1, 1), dim(2, 1, 1), 47 * 1024, NULL, NULL, &err) ==
          FUSER_OK); /* exactly the default 48 KB - 1 KB static */
    CHECK(fake.set_attr_calls == 0);

    /* 47.5 KB dynamic + 1 KB static is over the 48 KB default: raised */
    CHECK(fuser_kernel_launch(&d, &k, dim(132, 1, 1), dim(384, 1, 1), dim(2, 1, 1), 47 * 1024 + 512, NULL, NULL,
                              &err) == FUSER_OK);
    CHECK(fake.set_attr_calls == 1 && fake.last_attr == FUSER_CU_FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES);
    CHECK(fake.last_value == 47 * 1024 + 512);

    /* more: raised once more, then remembered */
    CHECK(fuser_kernel_launch(&d, &k, dim(128, 1, 1), dim(384, 1, 1), dim(2, 1, 1), 200000, NULL, NULL, &err) ==
          FUSER_OK);
    CHECK(fake.set_attr_calls == 2 && fake.last_value == 200000);
    CHECK(fuser_kernel_launch(&d, &k, dim(128, 1, 1), dim(384, 1, 1), dim(2, 1, 1), 200000, NULL, NULL, &err) ==
          FUSER_OK);
    CHECK(fuser_kernel_launch(&d, &k, dim(128, 1, 1), dim(384, 1, 1), dim(2, 1, 1), 100000, NULL, NULL, &err) ==
          FUSER_OK);
    CHECK(fake.set_attr_calls == 2 && fake.launches == 6);

    /* a 16-block cluster: the non-portable flag, once */
    CHECK(fuser_kernel_launch(&d, &k, dim(128, 1, 1), dim(384, 1, 1), dim(16, 1, 1), 0, NULL, NULL, &err) ==
          FUSER_OK);
    CHECK(fake.set_attr_calls == 3 && fake.last_attr == FUSER_CU_FUNC_ATTR_NON_PORTABLE_CLUSTER_SIZE_ALLOWED);
    CHECK(fake.last_value == 1);
    CHECK(fuser_kernel_launch(&d, &k, dim(128, 1, 1), dim(384, 1, 1), dim(4, 4, 1), 0, NULL, NULL, &err) ==
          FUSER_E_VALUE); /* grid.y = 1 is not a multiple of 4 */
    CHECK(fuser_kernel_launch(&d, &k, dim(128, 4, 1), dim(384, 1, 1), dim(4, 4, 1), 0, NULL, NULL, &err) ==
          FUSER_OK);
    CHECK(fake.set_attr_calls == 3);

    /* the driver's refusals, described */
    CHECK(fuser_kernel_launch(&d, &k, dim(8, 1, 1), dim(384, 1, 1), dim(1, 1, 1), 300000, NULL, NULL, &err) ==
          FUSER_E_CUDA);
    CHECK_ERR(&err, FUSER_E_CUDA, "SHARED_SIZE_BYTES) of kernel probe failed: CUDA_ERROR_INVALID_VALUE");
    CHECK(atomic_load(&k.dyn_smem_limit) == 200000);
    fake.launch_result = 912;
    CHECK(fuser_kernel_launch(&d, &k, dim(8, 1, 1), dim(384, 1, 1), dim(8, 1, 1), 0, NULL, NULL, &err) ==
          FUSER_E_CUDA);
    CHECK_ERR(&err, FUSER_E_CUDA, "cluster (8, 1, 1), 0 bytes dynamic smem) failed: CUDA_ERROR_INVALID_CLUSTER");
    fake.launch_result = 0;

    /* a new thread (no current context) gets the kernel's; another context is refused */
    fake.current = NULL;
    int sets = fake.set_current;
    CHECK(fuser_kernel_launch(&d, &k, dim(8, 1, 1), dim(384, 1, 1), dim(1, 1, 1), 0, NULL, NULL, &err) == FUSER_OK);
    CHECK(fake.current == PRIMARY(1) && fake.set_current == sets + 1);
    CHECK(fake.launched.num_attrs == 1);
    CHECK(fuser_kernel_launch_ex(&d, &k, dim(8, 1, 1), dim(384, 1, 1), dim(1, 1, 1), 0, NULL, FUSER_LAUNCH_EARLY, NULL,
                                 &err) == FUSER_OK);
    CHECK(fake.launched.num_attrs == 2 && fake.launched_attr2.id == 6 &&
          fake.launched_attr2.value.programmatic_serialization == 1);
    fake.current = PRIMARY(0);
    CHECK(fuser_kernel_launch(&d, &k, dim(8, 1, 1), dim(384, 1, 1), dim(1, 1, 1), 0, NULL, NULL, &err) ==
          FUSER_E_CUDA);
    CHECK_ERR(&err, FUSER_E_CUDA, "loaded on device 1, whose context is not current");
    fake.current = PRIMARY(1);

    int n = 0;
    CHECK(fuser_kernel_max_active_clusters(&d, &k, dim(384, 1, 1), dim(2, 1, 1), 200000, &n, &err) == FUSER_OK);
    CHECK(n == 66);
    CHECK(fuser_kernel_unload(&d, &k, &err) == FUSER_OK);
}
