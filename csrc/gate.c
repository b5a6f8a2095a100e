/* gate.c: the eager route's gate kernels: their source, names and launch (include/fuser/gate.h). */
#include "fuser/gate.h"

#include "fuser/chain.h"

static const char *const names[FUSER_GATE_KERNELS] = {
    "fuser_gate_bf16_relu", "fuser_gate_bf16_gelu", "fuser_gate_bf16_gelu_tanh", "fuser_gate_bf16_silu",
    "fuser_gate_f16_relu",  "fuser_gate_f16_gelu",  "fuser_gate_f16_gelu_tanh",  "fuser_gate_f16_silu",
};

const char *fuser_gate_source(void)
{
    return "#include \"fuser/device/gate.cuh\"\n"
           "FUSER_GATE_ENTRIES(bf16, DT_BF16)\n"
           "FUSER_GATE_ENTRIES(f16, DT_F16)\n";
}

int fuser_gate_index(fuser_dtype dt, int act)
{
    if ((dt != FUSER_BF16 && dt != FUSER_F16) || act < FUSER_ACT_RELU || act > FUSER_ACT_SILU)
        return -1;
    return (dt == FUSER_F16 ? 4 : 0) + act;
}

const char *fuser_gate_name(int index)
{
    return index >= 0 && index < FUSER_GATE_KERNELS ? names[index] : NULL;
}

int fuser_gate_launch(const fuser_driver *drv, fuser_kernel *k, void *g, const void *u, int64_t n, int64_t cols,
                      int64_t ld, fuser_cu_stream stream, fuser_err *err)
{
    if (n < 1 || ((uintptr_t)g | (uintptr_t)u) % FUSER_ALIGN_BYTES)
        return fuser_fail(err, FUSER_E_VALUE, "gate launch: need n >= 1 and %d-byte aligned g and u, got n = %lld",
                          FUSER_ALIGN_BYTES, (long long)n);
    if (ld != cols && (cols < 8 || cols % 8 || ld % 8 || ld < cols || n % cols || n > FUSER_GATE_MAX_STRIDED))
        return fuser_fail(err, FUSER_E_VALUE,
                          "gate launch: rows apart need cols and ld multiples of 8, ld >= cols, n a multiple of "
                          "cols and at most %lld; got n = %lld, cols = %lld, ld = %lld",
                          (long long)FUSER_GATE_MAX_STRIDED, (long long)n, (long long)cols, (long long)ld);
    const int64_t vecs = (n + 7) / 8, blocks = (vecs + FUSER_GATE_BLOCK - 1) / FUSER_GATE_BLOCK;
    long long count = n, c = cols, l = ld;
    void *argv[] = {&g, (void *)&u, &count, &c, &l};
    fuser_dim3 grid = {(unsigned)(blocks < FUSER_GATE_MAX_BLOCKS ? blocks : FUSER_GATE_MAX_BLOCKS), 1, 1},
               block = {FUSER_GATE_BLOCK, 1, 1}, cluster = {1, 1, 1};
    return fuser_kernel_launch(drv, k, grid, block, cluster, 0, stream, argv, err);
}
