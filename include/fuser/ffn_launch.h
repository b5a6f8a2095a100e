/* ffn_launch.h: launching a fused plan. One function takes the loaded kernel (with its plan), the
 * validated tensors, the scratch and a stream; it checks that the tensors are the chain the kernel was
 * generated for, sizes the grid and the scratch from the plan (fuser_plan_scratch: the one place that
 * arithmetic lives), encodes the TMA tensor maps the kernel family needs (weights' and the H buffer's
 * cached per address, x's per call), fills the family's parameter struct and launches. The Python
 * binding only converts arguments. */
#ifndef FUSER_FFN_LAUNCH_H
#define FUSER_FFN_LAUNCH_H

#include <stdatomic.h>

#include "fuser/chain.h"
#include "fuser/launch.h"
#include "fuser/plan.h"
#include "fuser/tmap.h"

#ifdef __cplusplus
extern "C" {
#endif

/* the tensor maps a loaded kernel keeps, re-encoded only when the address (or, for H, the token count) changes */
enum { FUSER_MAP_W_UP, FUSER_MAP_W_GATE, FUSER_MAP_W_DOWN, FUSER_MAP_H, FUSER_MAP_XQ, FUSER_NUM_CACHED_MAPS };

/** A fused plan's kernel, loaded on one device. Shared by threads once loaded; not copied or moved. */
typedef struct fuser_ffn_kernel {
    fuser_kernel k;
    fuser_plan plan;
    int max_active;            /* co-resident clusters (cluster plans) or blocks (stream plans) */
    atomic_flag lock;          /* guards the map cache below */
    const void *map_addr[FUSER_NUM_CACHED_MAPS];
    uint64_t map_rows[FUSER_NUM_CACHED_MAPS];
    fuser_tmap map[FUSER_NUM_CACHED_MAPS];
} fuser_ffn_kernel;

/** Load the CUBIN of derived fused plan `plan` on `device` and size its persistent grid. */
int fuser_ffn_kernel_load(const fuser_driver *drv, int device, const void *cubin, const fuser_plan *plan,
                          fuser_ffn_kernel *out, fuser_err *err);

/** Scratch memory handed to a launch: `zeroed_words` 32-bit words that are zero between launches,
 * followed by `ws_floats` fp32 words (16-byte aligned: zeroed_words is a multiple of 4). */
typedef struct {
    fuser_cu_deviceptr ptr;
    int device;
    int64_t zeroed_words, ws_floats;
} fuser_scratch_view;

/* A stream kernel's optional trace: per work unit, the block, the SM and global-timer nanoseconds when it
 * was claimed, its loads could start, its first data arrived, it was done and its MMAs were done, the
 * nanoseconds its consumers waited for data after the first slot, and when its last slot was requested
 * (word order: include/fuser/device/stream.cuh, TRACE_WORDS). */
#define FUSER_STREAM_TRACE_WORDS 9

/* How a launch may overlap the stream's previous kernel: the family's default (stream kernels start
 * early: they request their first weight tiles, which no kernel writes, while the previous kernel
 * finishes), or never (for side-by-side measurement). */
typedef enum { FUSER_OVERLAP_DEFAULT, FUSER_OVERLAP_NEVER } fuser_overlap;

/* The largest kernel parameter struct of any family (checked in ffn_launch.c). */
#define FUSER_FFN_PARAM_BYTES 1024

/** A launch made ready once and run many times: the kernel, its parameter struct filled for one chain,
 * token count, set of weights, scratch and stream, and the grid. A run patches the pointers of x and y
 * (and of weights that moved) and launches, so a kept route pays neither DLPack nor validation per call.
 * Plain data: copy it freely while the kernel stays loaded. */
typedef struct fuser_ffn_prepared {
    fuser_ffn_kernel *k;
    int64_t m;
    fuser_cu_stream stream;
    fuser_dim3 grid, block, cluster;
    unsigned flags;                      /* fuser_kernel_launch_ex flags */
    const void *ptr[8];                  /* x, w_up, w_down, w_gate, b_up, b_gate, b_down, y as prepared */
    _Alignas(64) unsigned char params[FUSER_FFN_PARAM_BYTES];
} fuser_ffn_prepared;

/** Fill `out` for launches of `k` like `a` (validated by fuser_ffn_validate into `c`) with scratch `s`
 * on `stream`; `trace` as fuser_ffn_launch's. The same checks and errors as fuser_ffn_launch. */
int fuser_ffn_prepare(const fuser_driver *drv, fuser_ffn_kernel *k, const fuser_ffn_args *a, const fuser_chain *c,
                      const fuser_scratch_view *s, const fuser_tensor *trace, fuser_overlap overlap,
                      fuser_cu_stream stream, fuser_ffn_prepared *out, fuser_err *err);

/** Launch prepared `p` with the tensors at `ptr` (x, w_up, w_down, w_gate, b_up, b_gate, b_down, y; the
 * layout fuser_ffn_prepare saw: same chain, token count, dtype, device, contiguous). A NULL entry keeps
 * the prepared pointer of a present tensor; an absent tensor's entry must be NULL. The pointers are
 * not validated beyond that and their 16-byte alignment (FUSER_E_VALUE): the caller guarantees the
 * rest. An empty batch launches nothing. */
int fuser_ffn_run(const fuser_driver *drv, const fuser_ffn_prepared *p, const void *const ptr[8], fuser_err *err);

/** Launch `k` on `a` (validated by fuser_ffn_validate into `c`) with scratch `s` on `stream`; `trace`
 * (NULL: none) receives a stream kernel's timeline. FUSER_E_VALUE when the tensors describe another
 * chain, live on another device, or the scratch or trace is too small or misplaced; FUSER_E_CUDA for the
 * driver's refusals. An empty batch launches nothing. */
int fuser_ffn_launch(const fuser_driver *drv, fuser_ffn_kernel *k, const fuser_ffn_args *a, const fuser_chain *c,
                     const fuser_scratch_view *s, const fuser_tensor *trace, fuser_overlap overlap,
                     fuser_cu_stream stream, fuser_err *err);

/** Token boxes of stream launches prepared from now on: 1 exact, the default (a ragged last row tile's X box holds
 * only its real rows, through a second map of x; the H buffer, and a quantized chain's copy of x, are read as whole
 * row tiles of the scratch), 0 whole row tiles of the tensors (rows past the last are TMA's zero fill, which
 * streams slower beside the weights: docs/kernels.md, step 54). Cluster pairs keep whole X boxes either way. `on`
 * < 0 only reads the setting. Returns the setting before the call. Process-wide, for measuring both side by side
 * (a launch keeps what it was prepared with; a graph what it captured). */
int fuser_stream_exact_boxes(int on);

/** Bytes in flight per block in the ring's first pass of stream launches prepared from now on (their lead), for 16-bit
 * single-block plans (cluster pairs and quantized chains always request the whole ring at once; ungated swap-AB tiles,
 * whose slots hold one weight tile, three quarters of it): a slot is requested
 * once the slot that many bytes before it has landed, and a block's first unit holds that many bytes of weight tiles,
 * not a ring, before the previous kernel is waited for; 0 requests the whole ring at once. Every SM asking for its
 * whole ring at once gets the bytes in no order, so its first slot lands only when most of them have (docs/kernels.md
 * steps 57-58). `bytes` < 0 only reads the setting. Returns the setting before the call. Process-wide, for measuring
 * both side by side (a launch keeps what it was prepared with; a graph what it captured). */
#define FUSER_STREAM_LEAD_BYTES (128 * 1024)
int fuser_stream_lead_bytes(int bytes);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_FFN_LAUNCH_H */
