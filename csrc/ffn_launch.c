/* ffn_launch.c: launch a fused plan (see include/fuser/ffn_launch.h). One parameter struct per kernel
 * family, laid out exactly as the device side declares it. */
#define _POSIX_C_SOURCE 200809L /* sched_yield */
#include "fuser/ffn_launch.h"

#include <sched.h>
#include <string.h>

/* Must match FfnParams in include/fuser/device/ffn.cuh. */
typedef struct {
    const void *x, *w_up, *w_gate, *w_down, *b_up, *b_gate, *b_down;
    void *y;
    float *ws;
    int *tickets;
    int m;
    int grid_m;
} cluster_params;

/* Must match StreamParams in include/fuser/device/stream.cuh. */
typedef struct {
    fuser_tmap x, w_up, w_gate, h, w_down;
    const void *b_up, *b_gate, *b_down;
    void *hbuf, *y;
    float *ws;
    int *sync;
    void *trace;
    int m;
} stream_params;
_Static_assert(sizeof(fuser_tmap) == 128 && sizeof(stream_params) % 64 == 0, "StreamParams layout");

int fuser_ffn_kernel_load(const fuser_driver *drv, int device, const void *cubin, const fuser_plan *plan,
                          fuser_ffn_kernel *out, fuser_err *err)
{
    memset(out, 0, sizeof *out);
    atomic_flag_clear(&out->lock);
    if (!plan->fused)
        return fuser_fail(err, FUSER_E_VALUE, "plan: an unfused plan has no kernel to load");
    out->plan = *plan;
    int rc = fuser_kernel_load(drv, device, cubin, "fuser_ffn", &out->k, err);
    if (rc)
        return rc;
    fuser_dim3 block = {(unsigned)plan->threads, 1, 1}, cluster = {(unsigned)plan->cluster_size, 1, 1};
    rc = fuser_kernel_max_active_clusters(drv, &out->k, block, cluster, (unsigned)plan->smem_bytes, &out->max_active,
                                          err);
    if (!rc && out->max_active < 1)
        rc = fuser_fail(err, FUSER_E_CUDA, "no cluster of %d blocks with %d bytes of shared memory each fits on cuda:%d",
                        plan->cluster_size, plan->smem_bytes, device);
    return rc;
}

static int same_chain(const fuser_chain *a, const fuser_chain *b)
{
    return a->k == b->k && a->n == b->n && a->l == b->l && a->gated == b->gated && a->act == b->act &&
           a->bias_up == b->bias_up && a->bias_gate == b->bias_gate && a->bias_down == b->bias_down &&
           a->dtype == b->dtype;
}

static const void *data_of(const fuser_tensor *t) { return t ? t->data : NULL; }

static int launch_cluster(const fuser_driver *drv, fuser_ffn_kernel *k, const fuser_ffn_args *a, const fuser_chain *c,
                          const fuser_scratch_view *s, fuser_cu_stream stream, fuser_err *err)
{
    const fuser_plan *p = &k->plan;
    const int64_t grid_m = fuser_ceil_div(c->m, (int64_t)p->cls_m * p->bm);
    float *ws = (float *)(uintptr_t)s->ptr + s->zeroed_words;
    cluster_params prm = {data_of(a->x), data_of(a->w_up), data_of(a->w_gate), data_of(a->w_down),
                          data_of(a->b_up), data_of(a->b_gate), data_of(a->b_down), (void *)data_of(a->out),
                          ws, (int *)(uintptr_t)s->ptr, (int)c->m, (int)grid_m};
    void *argv[] = {&prm};
    /* persistent: at most the co-resident clusters; the kernel loops over the rest */
    const int64_t clusters = fuser_min64(grid_m * p->grid_n, k->max_active);
    fuser_dim3 grid = {(unsigned)(clusters * p->cluster_size), 1, 1};
    fuser_dim3 block = {(unsigned)p->threads, 1, 1}, cluster = {(unsigned)p->cluster_size, 1, 1};
    return fuser_kernel_launch(drv, &k->k, grid, block, cluster, (unsigned)p->smem_bytes, stream, argv, err);
}

/* The cached map of a weight (or the H buffer) at `addr` with `rows` rows, re-encoded when either changed. */
static int cached_map(const fuser_driver *drv, fuser_ffn_kernel *k, int slot, const void *addr, uint64_t rows,
                      uint64_t cols, unsigned box_rows, fuser_tmap *out, fuser_err *err)
{
    while (atomic_flag_test_and_set(&k->lock))
        sched_yield(); /* held for one encode at most */
    int rc = FUSER_OK;
    if (k->map_addr[slot] != addr || k->map_rows[slot] != rows) {
        k->map_addr[slot] = NULL;
        rc = fuser_tmap_2d(drv, &k->map[slot], k->plan.chain.dtype, addr, rows, cols, cols, box_rows, err);
        if (!rc) {
            k->map_addr[slot] = addr;
            k->map_rows[slot] = rows;
        }
    }
    if (!rc)
        *out = k->map[slot];
    atomic_flag_clear(&k->lock);
    return rc;
}

static int launch_stream(const fuser_driver *drv, fuser_ffn_kernel *k, const fuser_ffn_args *a, const fuser_chain *c,
                         const fuser_scratch_view *s, void *trace, fuser_overlap overlap, fuser_cu_stream stream,
                         fuser_err *err)
{
    const fuser_plan *p = &k->plan;
    const fuser_chain *pc = &p->chain;
    if (c->m > p->bm)
        return fuser_fail(err, FUSER_E_VALUE, "x: %lld tokens; this stream kernel computes at most %d",
                          (long long)c->m, p->bm);
    stream_params prm;
    memset(&prm, 0, sizeof prm);
    float *ws = (float *)(uintptr_t)s->ptr + s->zeroed_words;
    const void *h = ws;
    int rc = fuser_tmap_2d(drv, &prm.x, pc->dtype, a->x->data, (uint64_t)c->m, (uint64_t)pc->k, (uint64_t)pc->k,
                           (unsigned)p->bm, err);
    if (!rc)
        rc = cached_map(drv, k, FUSER_MAP_W_UP, a->w_up->data, pc->n, pc->k, (unsigned)p->bn, &prm.w_up, err);
    if (!rc && pc->gated)
        rc = cached_map(drv, k, FUSER_MAP_W_GATE, a->w_gate->data, pc->n, pc->k, (unsigned)p->bn, &prm.w_gate, err);
    if (!rc)
        rc = cached_map(drv, k, FUSER_MAP_W_DOWN, a->w_down->data, pc->l, pc->n, (unsigned)p->bl, &prm.w_down, err);
    if (!rc)
        rc = cached_map(drv, k, FUSER_MAP_H, h, (uint64_t)c->m, pc->n, (unsigned)p->bm, &prm.h, err);
    if (rc)
        return rc;
    prm.b_up = data_of(a->b_up);
    prm.b_gate = data_of(a->b_gate);
    prm.b_down = data_of(a->b_down);
    prm.hbuf = (void *)h;
    prm.y = (void *)a->out->data;
    prm.ws = ws + c->m * pc->n / 2;
    prm.sync = (int *)(uintptr_t)s->ptr;
    prm.trace = trace;
    prm.m = (int)c->m;
    void *argv[] = {&prm};
    /* units are claimed dynamically: blocks beyond those resident at once would only find no work */
    fuser_dim3 grid = {(unsigned)fuser_min64(p->units, k->max_active), 1, 1};
    fuser_dim3 block = {(unsigned)p->threads, 1, 1}, one = {1, 1, 1};
    /* the kernel waits for the previous one (griddepcontrol.wait) before it touches anything but weights */
    const unsigned flags = overlap == FUSER_OVERLAP_NEVER ? 0u : (unsigned)FUSER_LAUNCH_EARLY;
    return fuser_kernel_launch_ex(drv, &k->k, grid, block, one, (unsigned)p->smem_bytes, stream, flags, argv, err);
}

int fuser_ffn_launch(const fuser_driver *drv, fuser_ffn_kernel *k, const fuser_ffn_args *a, const fuser_chain *c,
                     const fuser_scratch_view *s, const fuser_tensor *trace, fuser_overlap overlap,
                     fuser_cu_stream stream, fuser_err *err)
{
    const fuser_plan *p = &k->plan;
    if (!same_chain(c, &p->chain))
        return fuser_fail(err, FUSER_E_VALUE,
                          "ffn_launch: the tensors describe d_model %lld, d_ff %lld, d_out %lld, %s %s; the kernel was "
                          "compiled for d_model %lld, d_ff %lld, d_out %lld, %s %s (with other biases or gating?)",
                          (long long)c->k, (long long)c->n, (long long)c->l, fuser_dtype_name(c->dtype),
                          fuser_act_name(c->act), (long long)p->chain.k, (long long)p->chain.n, (long long)p->chain.l,
                          fuser_dtype_name(p->chain.dtype), fuser_act_name(p->chain.act));
    if (a->x->device != FUSER_CUDA || a->x->device_id != k->k.device)
        return fuser_fail(err, FUSER_E_VALUE, "x: the kernel was loaded on cuda:%d; the tensors are elsewhere",
                          k->k.device);
    if (c->m > 0x7fffffffLL / 2)
        return fuser_fail(err, FUSER_E_VALUE, "x: %lld tokens exceed the kernel's int32 indexing", (long long)c->m);
    int64_t zw, wf;
    fuser_plan_scratch(p, c->m, &zw, &wf);
    if (s->device != k->k.device || s->zeroed_words < zw || s->ws_floats < wf || s->zeroed_words % 4 ||
        (zw + wf > 0 && !s->ptr))
        return fuser_fail(err, FUSER_E_VALUE,
                          "scratch: this launch needs %lld zeroed words and %lld workspace floats on cuda:%d; the "
                          "scratch holds %lld and %lld on cuda:%d", (long long)zw, (long long)wf, k->k.device,
                          (long long)s->zeroed_words, (long long)s->ws_floats, s->device);
    if (trace && (p->kind != FUSER_KIND_STREAM || trace->device != FUSER_CUDA || trace->device_id != k->k.device ||
                  trace->nbytes < p->units * FUSER_STREAM_TRACE_WORDS * 8))
        return fuser_fail(err, FUSER_E_VALUE, "trace: a stream kernel's trace needs %lld bytes on cuda:%d (%d 64-bit "
                          "words per unit); got %lld bytes", (long long)(p->units * FUSER_STREAM_TRACE_WORDS * 8),
                          k->k.device, FUSER_STREAM_TRACE_WORDS, (long long)(trace ? trace->nbytes : 0));
    if (c->m == 0)
        return FUSER_OK;
    return p->kind == FUSER_KIND_STREAM ? launch_stream(drv, k, a, c, s, trace ? trace->data : NULL, overlap, stream, err)
                                        : launch_cluster(drv, k, a, c, s, stream, err);
}
