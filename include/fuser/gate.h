/* gate.h: the gate step of a gated FFN's eager route on a Hopper GPU (include/fuser/device/gate.cuh):
 * g = act(g) * u in place, in one kernel, bitwise PyTorch's activation then product. This file holds its
 * translation unit, its kernels' names and one launch; the binding (python/gate_bind.c) decides when it
 * runs and loads the kernels once per device. */
#ifndef FUSER_GATE_H
#define FUSER_GATE_H

#include <stdint.h>

#include "fuser/launch.h"
#include "fuser/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One kernel per 16-bit dtype (bfloat16, float16) and activation (FUSER_ACT_*): index dtype * 4 + act. */
#define FUSER_GATE_KERNELS 8
/* Threads per block (the kernels' __launch_bounds__) and the most blocks a launch takes (each thread then
 * loops over its share of 8-element vectors). */
#define FUSER_GATE_BLOCK 256
#define FUSER_GATE_MAX_BLOCKS 8192

/** The CUDA translation unit that defines every gate kernel (for fuser.jit). */
const char *fuser_gate_source(void);

/** The kernel index for dtype `dt` and activation `act`, or -1 where there is none (float32, e4m3). */
int fuser_gate_index(fuser_dtype dt, int act);

/** The __global__ function name of kernel `index` (0 .. FUSER_GATE_KERNELS - 1). */
const char *fuser_gate_name(int index);

/** Launch a loaded gate kernel on `stream`: g = act(g) * u over n >= 1 elements each, in rows of `cols` that
 * start `ld` elements apart in both (compact: ld == cols, any n); g and u device addresses aligned to
 * FUSER_ALIGN_BYTES whose elements do not overlap. Rows apart (ld > cols) need cols and ld multiples of 8, n a
 * multiple of cols and n / 8 < 2^32 (FUSER_GATE_MAX_STRIDED). */
int fuser_gate_launch(const fuser_driver *drv, fuser_kernel *k, void *g, const void *u, int64_t n, int64_t cols,
                      int64_t ld, fuser_cu_stream stream, fuser_err *err);

/** The most elements a launch of rows apart takes (its kernels index vectors in 32 bits). */
#define FUSER_GATE_MAX_STRIDED (((int64_t)1 << 32) * 8 - 8)

#ifdef __cplusplus
}
#endif
#endif /* FUSER_GATE_H */
