/* ffn_launch.c: launch a fused plan (see include/fuser/ffn_launch.h). One parameter struct per kernel
 * family, laid out exactly as the device side declares it. */
#define _POSIX_C_SOURCE 200809L /* sched_yield */
#include "fuser/ffn_launch.h"

#include <sched.h>
#include <stddef.h>
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
    fuser_tmap x, w_up, w_gate, h, w_down, x_tail;
    const void *b_up, *b_gate, *b_down;
    void *hbuf, *y;
    float *ws;
    int *sync;
    void *trace;
    const float *scale[FUSER_NUM_SCALES]; /* a quantized chain's (fuser_ffn_args' order), else null */
    const void *xin; /* a quantized chain's x (bfloat16), which the kernel quantizes into xbuf */
    void *xbuf;
    int m;
    int group;
    int x_tail_rows;
    int lead_bytes;
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

_Static_assert(sizeof(cluster_params) <= FUSER_FFN_PARAM_BYTES && sizeof(stream_params) <= FUSER_FFN_PARAM_BYTES,
               "FUSER_FFN_PARAM_BYTES");

enum { P_X, P_WU, P_WD, P_WG, P_BU, P_BG, P_BD, P_Y, P_N };

static const void *data_of(const fuser_tensor *t) { return t ? t->data : NULL; }

/* The tensor pointers of a cluster launch go straight into its parameters. */
static void place_cluster(cluster_params *prm, const void *const ptr[P_N])
{
    prm->x = ptr[P_X];
    prm->w_up = ptr[P_WU];
    prm->w_down = ptr[P_WD];
    prm->w_gate = ptr[P_WG];
    prm->b_up = ptr[P_BU];
    prm->b_gate = ptr[P_BG];
    prm->b_down = ptr[P_BD];
    prm->y = (void *)ptr[P_Y];
}

static void prepare_cluster(fuser_ffn_kernel *k, const fuser_chain *c, const fuser_scratch_view *s,
                            fuser_ffn_prepared *out)
{
    const fuser_plan *p = &k->plan;
    const int64_t grid_m = fuser_ceil_div(c->m, (int64_t)p->cls_m * p->bm);
    cluster_params *prm = (cluster_params *)out->params;
    place_cluster(prm, out->ptr);
    prm->ws = (float *)(uintptr_t)s->ptr + s->zeroed_words;
    prm->tickets = (int *)(uintptr_t)s->ptr;
    prm->m = (int)c->m;
    prm->grid_m = (int)grid_m;
    /* persistent: at most the co-resident clusters; the kernel loops over the rest */
    const int64_t clusters = fuser_min64(grid_m * p->grid_n, k->max_active);
    out->grid = (fuser_dim3){(unsigned)(clusters * p->cluster_size), 1, 1};
    out->cluster = (fuser_dim3){(unsigned)p->cluster_size, 1, 1};
    out->flags = 0;
}

/* The maps of a quantized chain's e4m3 matrices (weights, H, and x as the kernel quantizes it into the
 * workspace) are 16-bit views of half the columns: a K step is a 128-byte row of a box either way, so the
 * boxes, the swizzle and the kernel's loads stay those of 16-bit chains. */
static fuser_dtype map_dtype(const fuser_chain *c) { return c->dtype == FUSER_E4M3 ? FUSER_BF16 : c->dtype; }
static uint64_t map_cols(const fuser_chain *c, int64_t cols)
{
    return (uint64_t)(cols * fuser_dtype_size(c->dtype) / fuser_dtype_size(map_dtype(c)));
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
        rc = fuser_tmap_2d(drv, &k->map[slot], map_dtype(&k->plan.chain), addr, rows, cols, cols, box_rows, err);
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

/* The tensor maps of a stream launch: x's and each weight's (rows x cols, box rows), by slot of ptr[]. */
static const struct {
    int slot;
    size_t offset;
} stream_maps[] = {
    {P_X, offsetof(stream_params, x)},
    {P_WU, offsetof(stream_params, w_up)},
    {P_WG, offsetof(stream_params, w_gate)},
    {P_WD, offsetof(stream_params, w_down)},
};

/* Box rows of a token tile (X, H) and of a weight tile: in pairs, the shared one is loaded in halves. */
static unsigned token_box(const fuser_plan *p) { return (unsigned)(p->bm / (fuser_stream_pair(p) == FUSER_PAIR_TILES ? 2 : 1)); }
static unsigned weight_box(const fuser_plan *p, int rows) { return (unsigned)(rows / (fuser_stream_pair(p) == FUSER_PAIR_ROWS ? 2 : 1)); }

static atomic_int exact_boxes = 1;

int fuser_stream_exact_boxes(int on) { return on < 0 ? atomic_load(&exact_boxes) : atomic_exchange(&exact_boxes, !!on); }

static atomic_int lead_bytes = FUSER_STREAM_LEAD_BYTES;

int fuser_stream_lead_bytes(int bytes)
{
    return bytes < 0 ? atomic_load(&lead_bytes) : atomic_exchange(&lead_bytes, bytes);
}

/* The rows of a ragged last row tile's own X box (prm->x_tail_rows): 0 where X boxes stay whole (exact boxes off, a
 * quantized chain, whose X tiles come from the scratch, cluster pairs, whole row tiles). */
static int x_tail_rows(const fuser_plan *p, int64_t m, int exact)
{
    return exact && p->chain.dtype != FUSER_E4M3 && fuser_stream_pair(p) == FUSER_PAIR_NONE ? (int)(m % p->bm) : 0;
}

/* x's map of the last row tile's `tail` real rows, at `x` (m rows) */
static int x_tail_map(const fuser_driver *drv, const fuser_plan *p, const void *x, int64_t m, int tail, fuser_tmap *out,
                      fuser_err *err)
{
    const uint64_t k = (uint64_t)p->chain.k;
    return fuser_tmap_2d(drv, out, fuser_chain_out_dtype(&p->chain), x, (uint64_t)m, k, k, (unsigned)tail, err);
}

static void stream_map_shape(const fuser_plan *p, int64_t m, int slot, uint64_t *rows, uint64_t *cols, unsigned *box)
{
    const fuser_chain *pc = &p->chain;
    switch (slot) {
    case P_X: *rows = (uint64_t)m, *cols = (uint64_t)pc->k, *box = token_box(p); break;
    case P_WD: *rows = (uint64_t)pc->l, *cols = map_cols(pc, pc->n), *box = weight_box(p, p->bl); break;
    default: *rows = (uint64_t)pc->n, *cols = map_cols(pc, pc->k), *box = weight_box(p, p->bn); break;
    }
}

static int prepare_stream(const fuser_driver *drv, fuser_ffn_kernel *k, const fuser_ffn_args *a, const fuser_chain *c,
                          const fuser_scratch_view *s, void *trace, fuser_overlap overlap, fuser_ffn_prepared *out,
                          fuser_err *err)
{
    const fuser_plan *p = &k->plan;
    const fuser_chain *pc = &p->chain;
    stream_params *prm = (stream_params *)out->params;
    float *ws = (float *)(uintptr_t)s->ptr + s->zeroed_words;
    const void *h = ws;
    const int quantized = pc->dtype == FUSER_E4M3;
    int64_t xq_at, partials_at;
    fuser_stream_ws_layout(p, c->m, &xq_at, &partials_at);
    void *xq = quantized ? ws + xq_at : NULL;
    /* exact boxes: the scratch's token matrices read as whole row tiles (fuser_stream_ws_layout pads them) */
    const int exact = atomic_load(&exact_boxes);
    const uint64_t ws_rows = (uint64_t)(exact ? fuser_ceil_div(c->m, p->bm) * p->bm : c->m);
    static const int cache_slot[P_N] = {[P_WU] = FUSER_MAP_W_UP, [P_WG] = FUSER_MAP_W_GATE, [P_WD] = FUSER_MAP_W_DOWN};
    int rc = FUSER_OK;
    for (size_t i = 0; i < sizeof stream_maps / sizeof *stream_maps && !rc; i++) {
        const int slot = stream_maps[i].slot;
        fuser_tmap *map = (fuser_tmap *)(out->params + stream_maps[i].offset);
        uint64_t rows, cols;
        unsigned box;
        stream_map_shape(p, c->m, slot, &rows, &cols, &box);
        if (!out->ptr[slot])
            continue;
        if (slot == P_X && quantized) /* X tiles come from the kernel's e4m3 copy of x */
            rc = cached_map(drv, k, FUSER_MAP_XQ, xq, ws_rows, map_cols(pc, pc->k), box, map, err);
        else if (slot == P_X)
            rc = fuser_tmap_2d(drv, map, fuser_chain_out_dtype(pc), out->ptr[slot], rows, cols, cols, box, err);
        else
            rc = cached_map(drv, k, cache_slot[slot], out->ptr[slot], rows, cols, box, map, err);
    }
    if (!rc)
        rc = cached_map(drv, k, FUSER_MAP_H, h, ws_rows, map_cols(pc, pc->n), token_box(p), &prm->h, err);
    prm->x_tail_rows = x_tail_rows(p, c->m, exact);
    prm->lead_bytes = atomic_load(&lead_bytes);
    if (!rc && prm->x_tail_rows)
        rc = x_tail_map(drv, p, out->ptr[P_X], c->m, prm->x_tail_rows, &prm->x_tail, err);
    if (rc)
        return rc;
    prm->b_up = out->ptr[P_BU];
    prm->b_gate = out->ptr[P_BG];
    prm->b_down = out->ptr[P_BD];
    prm->hbuf = (void *)h;
    prm->y = (void *)out->ptr[P_Y];
    prm->xin = quantized ? out->ptr[P_X] : NULL;
    prm->xbuf = xq;
    prm->ws = ws + partials_at;
    prm->sync = (int *)(uintptr_t)s->ptr;
    prm->trace = trace;
    for (int i = 0; i < FUSER_NUM_SCALES; i++)
        prm->scale[i] = a->scale[i] ? (const float *)a->scale[i]->data : NULL;
    prm->m = (int)c->m;
    prm->group = (int)fuser_stream_row_group(p, c->m);
    /* units (or pairs) are claimed dynamically: clusters beyond those resident at once would find no work */
    const int64_t cs = p->cluster_size, units = fuser_stream_units(p, c->m);
    out->grid = (fuser_dim3){(unsigned)(cs * fuser_min64((units + cs - 1) / cs, k->max_active)), 1, 1};
    out->cluster = (fuser_dim3){(unsigned)cs, 1, 1};
    /* the kernel waits for the previous one (griddepcontrol.wait) before it touches anything but weights */
    out->flags = overlap == FUSER_OVERLAP_NEVER ? 0u : (unsigned)FUSER_LAUNCH_EARLY;
    return FUSER_OK;
}

/* Re-point a stream launch's parameters at ptr[] (entries that differ from the prepared ones). */
static int place_stream(const fuser_driver *drv, const fuser_ffn_prepared *p, stream_params *prm,
                        const void *const ptr[P_N], fuser_err *err)
{
    const fuser_plan *plan = &p->k->plan;
    const int quantized = plan->chain.dtype == FUSER_E4M3;
    for (size_t i = 0; i < sizeof stream_maps / sizeof *stream_maps; i++) {
        const int slot = stream_maps[i].slot;
        if (ptr[slot] == p->ptr[slot] || (slot == P_X && quantized)) /* (a quantized x: xin, below) */
            continue;
        uint64_t rows, cols;
        unsigned box;
        stream_map_shape(plan, p->m, slot, &rows, &cols, &box);
        int rc = fuser_tmap_2d(drv, (fuser_tmap *)((unsigned char *)prm + stream_maps[i].offset),
                               slot == P_X ? fuser_chain_out_dtype(&plan->chain) : map_dtype(&plan->chain),
                               ptr[slot], rows, cols, cols, box, err);
        if (rc)
            return rc;
    }
    if (prm->x_tail_rows && ptr[P_X] != p->ptr[P_X]) {
        int rc = x_tail_map(drv, plan, ptr[P_X], p->m, prm->x_tail_rows, &prm->x_tail, err);
        if (rc)
            return rc;
    }
    prm->b_up = ptr[P_BU];
    prm->b_gate = ptr[P_BG];
    prm->b_down = ptr[P_BD];
    prm->y = (void *)ptr[P_Y];
    if (quantized)
        prm->xin = ptr[P_X];
    return FUSER_OK;
}

int fuser_ffn_prepare(const fuser_driver *drv, fuser_ffn_kernel *k, const fuser_ffn_args *a, const fuser_chain *c,
                      const fuser_scratch_view *s, const fuser_tensor *trace, fuser_overlap overlap,
                      fuser_cu_stream stream, fuser_ffn_prepared *out, fuser_err *err)
{
    const fuser_plan *p = &k->plan;
    memset(out, 0, sizeof *out);
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
    const int64_t trace_bytes =
        p->kind == FUSER_KIND_STREAM ? fuser_stream_units(p, c->m) * FUSER_STREAM_TRACE_WORDS * 8 : 0;
    if (trace && (p->kind != FUSER_KIND_STREAM || trace->device != FUSER_CUDA || trace->device_id != k->k.device ||
                  trace->nbytes < trace_bytes))
        return fuser_fail(err, FUSER_E_VALUE, "trace: a stream kernel's trace needs %lld bytes on cuda:%d (%d 64-bit "
                          "words per unit); got %lld bytes", (long long)trace_bytes,
                          k->k.device, FUSER_STREAM_TRACE_WORDS, (long long)(trace ? trace->nbytes : 0));
    out->k = k;
    out->m = c->m;
    out->stream = stream;
    out->block = (fuser_dim3){(unsigned)p->threads, 1, 1};
    const fuser_tensor *t[P_N] = {a->x, a->w_up, a->w_down, a->w_gate, a->b_up, a->b_gate, a->b_down, a->out};
    for (int i = 0; i < P_N; i++)
        out->ptr[i] = data_of(t[i]);
    if (c->m == 0)
        return FUSER_OK;
    if (p->kind == FUSER_KIND_STREAM)
        return prepare_stream(drv, k, a, c, s, trace ? trace->data : NULL, overlap, out, err);
    prepare_cluster(k, c, s, out);
    return FUSER_OK;
}

int fuser_ffn_run(const fuser_driver *drv, const fuser_ffn_prepared *p, const void *const ptr[P_N], fuser_err *err)
{
    static const char *const names[P_N] = {"x", "w_up", "w_down", "w_gate", "b_up", "b_gate", "b_down", "y"};
    const void *use[P_N];
    for (int i = 0; i < P_N; i++) {
        use[i] = ptr && ptr[i] ? ptr[i] : p->ptr[i];
        if (ptr && ptr[i] && !p->ptr[i])
            return fuser_fail(err, FUSER_E_VALUE, "%s: this launch was prepared without it", names[i]);
        if ((uintptr_t)use[i] % 16)
            return fuser_fail(err, FUSER_E_VALUE, "%s: the kernel needs 16-byte aligned data", names[i]);
    }
    if (p->m == 0)
        return FUSER_OK;
    _Alignas(64) unsigned char params[FUSER_FFN_PARAM_BYTES];
    memcpy(params, p->params, sizeof params);
    if (p->k->plan.kind == FUSER_KIND_STREAM) {
        int rc = place_stream(drv, p, (stream_params *)params, use, err);
        if (rc)
            return rc;
    } else {
        place_cluster((cluster_params *)params, use);
    }
    void *argv[] = {params};
    return fuser_kernel_launch_ex(drv, &p->k->k, p->grid, p->block, p->cluster, (unsigned)p->k->plan.smem_bytes,
                                  p->stream, p->flags, argv, err);
}

int fuser_ffn_launch(const fuser_driver *drv, fuser_ffn_kernel *k, const fuser_ffn_args *a, const fuser_chain *c,
                     const fuser_scratch_view *s, const fuser_tensor *trace, fuser_overlap overlap,
                     fuser_cu_stream stream, fuser_err *err)
{
    fuser_ffn_prepared p;
    int rc = fuser_ffn_prepare(drv, k, a, c, s, trace, overlap, stream, &p, err);
    return rc ? rc : fuser_ffn_run(drv, &p, NULL, err);
}
