/* test_ffn_launch.c: a fused plan's launch against a recording stand-in driver (no GPU): a prepared
 * launch fills the stream kernel's parameters once (tensor maps at the tensors' addresses), a run
 * re-points only what moved and re-encodes only those maps, refuses a tensor the launch was prepared
 * without and misaligned data, and the one-shot launch passes the kernel the same bytes. A quantized
 * launch maps X on the kernel's e4m3 copy of x in the workspace and hands it x itself (xin). Exact token
 * boxes map a ragged last row tile's x rows on their own and read the scratch's H as whole row tiles. */
#include "ctest.h"
#include "fuser/ffn_launch.h"

static struct {
    int encodes, launches;
    const void *last_base;
    const void *base[64]; /* each encode's base, rows and box rows, in order */
    uint64_t rows[64];
    unsigned box_rows[64];
    unsigned char params[FUSER_FFN_PARAM_BYTES];
    fuser_cu_launch_config cfg;
} rec;

static fuser_cu_result r_get_current(fuser_cu_context *c) { *c = (fuser_cu_context)(uintptr_t)0x10; return 0; }
static fuser_cu_result r_set_attr(fuser_cu_function f, int a, int v) { (void)f, (void)a, (void)v; return 0; }
static fuser_cu_result r_launch(const fuser_cu_launch_config *c, fuser_cu_function f, void **p, void **e)
{
    (void)f, (void)e;
    memcpy(rec.params, p[0], sizeof rec.params);
    rec.cfg = *c;
    rec.launches++;
    return 0;
}
/* a map records its base address in its first word */
static fuser_cu_result r_encode(void *map, int t, unsigned r, void *base, const uint64_t *d, const uint64_t *s,
                                const unsigned *b, const unsigned *e, int i, int w, int l, int o)
{
    (void)t, (void)r, (void)s, (void)e, (void)i, (void)w, (void)l, (void)o;
    memcpy(map, &base, sizeof base);
    rec.base[rec.encodes % 64] = base, rec.rows[rec.encodes % 64] = d[1], rec.box_rows[rec.encodes % 64] = b[1];
    rec.encodes++;
    rec.last_base = base;
    return 0;
}

/* StreamParams as the device declares it: six 128-byte maps, then the pointers, m, group, x_tail_rows and lead_bytes */
enum { MAP_X, MAP_UP, MAP_GATE, MAP_H, MAP_DOWN, MAP_X_TAIL, MAPS };
static const void *map_base(const unsigned char *params, int map)
{
    const void *b;
    memcpy(&b, params + 128 * map, sizeof b);
    return b;
}
static const void *field(const unsigned char *params, int i) /* 0 b_up, 1 b_gate, 2 b_down, 3 hbuf, 4 y */
{
    const void *v;
    memcpy(&v, params + MAPS * 128 + i * sizeof v, sizeof v);
    return v;
}
static int x_tail_rows(const unsigned char *params) /* after 15 pointers, m and group */
{
    int v;
    memcpy(&v, params + MAPS * 128 + 15 * sizeof(void *) + 2 * sizeof v, sizeof v);
    return v;
}

static int lead_bytes(const unsigned char *params) /* after 15 pointers, m, group and x_tail_rows */
{
    int v;
    memcpy(&v, params + MAPS * 128 + 15 * sizeof(void *) + 3 * sizeof v, sizeof v);
    return v;
}

static fuser_tensor cuda_nd(uintptr_t addr, fuser_dtype dt, int ndim, int64_t rows, int64_t cols)
{
    fuser_tensor t;
    memset(&t, 0, sizeof t);
    t.data = (void *)addr, t.dtype = dt, t.device = FUSER_CUDA, t.device_id = 0, t.ndim = ndim;
    t.shape[0] = rows, t.shape[1] = cols, t.numel = rows * (ndim == 2 ? cols : 1);
    t.nbytes = fuser_dtype_size(dt) * t.numel;
    return t;
}
static fuser_tensor cuda2d(uintptr_t addr, int64_t rows, int64_t cols)
{
    return cuda_nd(addr, FUSER_BF16, 2, rows, cols);
}

/* The recording driver (its record cleared) */
static fuser_driver recording_driver(void)
{
    fuser_driver d;
    memset(&d, 0, sizeof d);
    d.cuCtxGetCurrent = r_get_current;
    d.cuFuncSetAttribute = r_set_attr;
    d.cuLaunchKernelEx = r_launch;
    d.cuTensorMapEncodeTiled = r_encode;
    memset(&rec, 0, sizeof rec);
    return d;
}

/* k: an unpaired two-phase stream plan of `chain` (bn = bl = 128, 4 stages), "loaded" on device 0 */
static int stream_kernel(fuser_ffn_kernel *k, fuser_chain chain, int bm, int s2, fuser_err *err)
{
    memset(k, 0, sizeof *k);
    fuser_plan *p = &k->plan;
    fuser_plan_unfused(&(fuser_chain){0}, p);
    p->chain = chain;
    p->fused = 1, p->kind = FUSER_KIND_STREAM, p->bm = bm, p->bn = 128, p->bl = 128, p->s1 = 1, p->s2 = s2;
    p->stages = 4, p->cls_m = p->cls_n = p->cls_k = p->cls_l = 1, p->n_iters = 1, p->order = FUSER_ORDER_N_OUTER;
    p->gate_mode = FUSER_GATE_NONE;
    k->k.ctx = (fuser_cu_context)(uintptr_t)0x10, k->k.func = (fuser_cu_function)(uintptr_t)0x20;
    atomic_store(&k->k.dyn_smem_limit, 1 << 20);
    atomic_flag_clear(&k->lock);
    k->max_active = 132;
    return fuser_plan_derive(p, err);
}

/* A stream plan of an ungated 256 -> 512 -> 128 chain with up to 16 tokens (bm 16, two d_ff splits), loaded on
 * device 0, and 5 tokens' tensors for it */
static struct {
    fuser_ffn_kernel k;
    fuser_tensor x, wu, wd, y;
} five;
static int five_tokens(fuser_ffn_args *a, fuser_err *err)
{
    five.x = cuda2d(0x100000, 5, 256), five.wu = cuda2d(0x200000, 512, 256), five.wd = cuda2d(0x300000, 128, 512);
    five.y = cuda2d(0x400000, 5, 128);
    *a = (fuser_ffn_args){&five.x, &five.wu, &five.wd, NULL, NULL, NULL, NULL, &five.y, "silu"};
    return stream_kernel(&five.k, (fuser_chain){.m = 16, .k = 256, .n = 512, .l = 128, .act = FUSER_ACT_SILU,
                                                .dtype = FUSER_BF16}, 16, 2, err);
}

void test_ffn_prepared_launch(void)
{
    fuser_driver d = recording_driver();
    fuser_err err;
    fuser_err_clear(&err);

    /* five tokens in a row tile of 16 */
    fuser_ffn_args a;
    CHECK(five_tokens(&a, &err) == FUSER_OK);
    fuser_ffn_kernel *k = &five.k;
    fuser_plan *p = &k->plan;
    fuser_tensor x = five.x, wu = five.wu, wd = five.wd, y = five.y;
    fuser_chain c;
    CHECK(fuser_ffn_validate(&a, &c, &err) == FUSER_OK && c.m == 5);
    int64_t zw, wf;
    fuser_plan_scratch(p, c.m, &zw, &wf);
    fuser_scratch_view s = {0x800000, 0, (zw + 3) / 4 * 4, wf};
    fuser_cu_stream stream = (fuser_cu_stream)(uintptr_t)0x77;

    fuser_ffn_prepared pr;
    CHECK(fuser_ffn_prepare(&d, k, &a, &c, &s, NULL, FUSER_OVERLAP_DEFAULT, stream, &pr, &err) == FUSER_OK);
    CHECK(rec.encodes == 5 && rec.launches == 0); /* x, w_up, w_down, H, and x's tail (exact boxes: the default) */
    CHECK(pr.m == 5 && pr.stream == stream && pr.grid.x == (unsigned)(p->units < 132 ? p->units : 132));
    CHECK(pr.flags == FUSER_LAUNCH_EARLY && pr.block.x == (unsigned)p->threads);

    /* as prepared */
    CHECK(fuser_ffn_run(&d, &pr, NULL, &err) == FUSER_OK && rec.launches == 1 && rec.encodes == 5);
    CHECK(map_base(rec.params, MAP_X) == x.data && map_base(rec.params, MAP_UP) == wu.data);
    CHECK(map_base(rec.params, MAP_DOWN) == wd.data && map_base(rec.params, MAP_GATE) == NULL);
    CHECK(field(rec.params, 4) == y.data && field(rec.params, 0) == NULL);
    CHECK(rec.cfg.stream == stream && rec.cfg.num_attrs == 2 && rec.cfg.grid_x == pr.grid.x);
    unsigned char first[FUSER_FFN_PARAM_BYTES];
    memcpy(first, rec.params, sizeof first);

    /* the one-shot launch passes the same bytes */
    CHECK(fuser_ffn_launch(&d, k, &a, &c, &s, NULL, FUSER_OVERLAP_DEFAULT, stream, &err) == FUSER_OK);
    CHECK(memcmp(first, rec.params, sizeof first) == 0 && rec.launches == 2);

    /* new x and y: x's two maps alone are encoded again; the weights' maps are the prepared ones */
    int enc = rec.encodes;
    const void *next[8] = {(void *)0x110000, NULL, NULL, NULL, NULL, NULL, NULL, (void *)0x410000};
    CHECK(fuser_ffn_run(&d, &pr, next, &err) == FUSER_OK && rec.encodes == enc + 2 && rec.launches == 3);
    CHECK(map_base(rec.params, MAP_X) == next[0] && field(rec.params, 4) == next[7]);
    CHECK(map_base(rec.params, MAP_UP) == wu.data && map_base(rec.params, MAP_H) == map_base(first, MAP_H));
    CHECK(memcmp(first + MAPS * 128, rec.params + MAPS * 128, 3 * sizeof(void *)) == 0); /* biases unchanged */
    CHECK(x_tail_rows(rec.params) == 5 && map_base(rec.params, MAP_X_TAIL) == next[0]); /* exact boxes by default */

    /* a moved weight: its map too */
    const void *moved[8] = {(void *)0x110000, (void *)0x210000, NULL, NULL, NULL, NULL, NULL, (void *)0x410000};
    CHECK(fuser_ffn_run(&d, &pr, moved, &err) == FUSER_OK && rec.encodes == enc + 5); /* x (two maps), w_up */
    CHECK(map_base(rec.params, MAP_UP) == moved[1] && map_base(rec.params, MAP_DOWN) == wd.data);

    /* refused: a tensor the launch was prepared without, misaligned data; nothing launched */
    int launches = rec.launches;
    const void *gate[8] = {(void *)0x110000, NULL, NULL, (void *)0x500000, NULL, NULL, NULL, (void *)0x410000};
    CHECK(fuser_ffn_run(&d, &pr, gate, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "w_gate: this launch was prepared without it");
    const void *odd[8] = {(void *)0x110000, NULL, NULL, NULL, NULL, NULL, NULL, (void *)0x410008};
    CHECK(fuser_ffn_run(&d, &pr, odd, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "y: the kernel needs 16-byte aligned data");
    CHECK(rec.launches == launches);

    /* prepare checks what the launch checks: a scratch too small */
    fuser_scratch_view small = {0x800000, 0, 0, 0};
    if (zw + wf > 0) {
        CHECK(fuser_ffn_prepare(&d, k, &a, &c, &small, NULL, FUSER_OVERLAP_DEFAULT, stream, &pr, &err) ==
              FUSER_E_VALUE);
        CHECK_ERR(&err, FUSER_E_VALUE, "scratch: this launch needs");
    }
    /* more tokens than one row tile: two row tiles, each with its own units and sync words; the scratch
     * sized for 5 tokens is refused */
    fuser_tensor x17 = cuda2d(0x100000, 17, 256), y17 = cuda2d(0x400000, 17, 128);
    fuser_ffn_args a17 = {&x17, &wu, &wd, NULL, NULL, NULL, NULL, &y17, "silu"};
    fuser_chain c17;
    CHECK(fuser_ffn_validate(&a17, &c17, &err) == FUSER_OK);
    CHECK(fuser_ffn_prepare(&d, k, &a17, &c17, &s, NULL, FUSER_OVERLAP_DEFAULT, stream, &pr, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "scratch: this launch needs");
    int64_t zw17, wf17;
    fuser_plan_scratch(p, c17.m, &zw17, &wf17);
    CHECK(zw17 == 7 + 2 * (p->nt1 + p->lt2 + p->s2) && wf17 > wf); /* seven counters, then per row tile */
    CHECK(fuser_stream_units(p, 17) == 2 * p->units && p->units == 4 * 1 + 1 * 2);
    fuser_scratch_view s17 = {0x800000, 0, (zw17 + 3) / 4 * 4, wf17};
    CHECK(fuser_ffn_prepare(&d, k, &a17, &c17, &s17, NULL, FUSER_OVERLAP_DEFAULT, stream, &pr, &err) == FUSER_OK);
    CHECK(pr.m == 17 && pr.grid.x == 12);

    /* the unit order: weights that stay in L2 row tile by row tile; larger ones every row tile in a row */
    CHECK(fuser_stream_row_group(p, 17) == 1 && fuser_stream_row_group(p, 1000) == 1);
    fuser_plan big = *p;
    big.chain.k = big.chain.n = 4096;
    CHECK(fuser_stream_row_group(&big, 17) == 2 && fuser_stream_row_group(&big, 1000) == 63);
}

void test_ffn_quantized_launch(void)
{
    fuser_driver d = recording_driver();
    fuser_err err;
    fuser_err_clear(&err);

    /* a quantized ungated 256 -> 512 -> 128 chain in one swap-AB tile of 64 tokens, unsplit */
    static fuser_ffn_kernel k;
    fuser_plan *p = &k.plan;
    CHECK(stream_kernel(&k, (fuser_chain){.m = 64, .k = 256, .n = 512, .l = 128, .act = FUSER_ACT_SILU,
                                          .dtype = FUSER_E4M3}, 64, 1, &err) == FUSER_OK && fuser_stream_swap(p));

    fuser_tensor x = cuda2d(0x100000, 40, 256), y = cuda2d(0x400000, 40, 128);
    fuser_tensor wu = cuda_nd(0x200000, FUSER_E4M3, 2, 512, 256), wd = cuda_nd(0x300000, FUSER_E4M3, 2, 128, 512);
    fuser_tensor sx = cuda_nd(0x500000, FUSER_F32, 1, 1, 0), su = cuda_nd(0x500100, FUSER_F32, 1, 512, 0);
    fuser_tensor sd = cuda_nd(0x501000, FUSER_F32, 1, 128, 0), sh = cuda_nd(0x502000, FUSER_F32, 1, 1, 0);
    fuser_ffn_args a = {&x, &wu, &wd, NULL, NULL, NULL, NULL, &y, "silu", {&sx, &su, NULL, &sd, &sh}};
    fuser_chain c;
    CHECK(fuser_ffn_validate(&a, &c, &err) == FUSER_OK && c.m == 40 && c.dtype == FUSER_E4M3);
    /* seven counters and one row tile's; H (16-bit room), x in e4m3 (d_model bytes a row), both for the whole
     * row tile of 64 rows; no split partials */
    int64_t zw, wf;
    fuser_plan_scratch(p, c.m, &zw, &wf);
    CHECK(zw == 7 + (p->nt1 + p->lt2 + 1) && wf == 64 * 512 / 2 + 64 * 256 / 4);
    fuser_scratch_view s = {0x800000, 0, (zw + 3) / 4 * 4, wf};
    const uintptr_t ws = 0x800000 + 4 * (uintptr_t)s.zeroed_words, xbuf = ws + 2 * 64 * 512;

    fuser_ffn_prepared pr;
    CHECK(fuser_ffn_prepare(&d, &k, &a, &c, &s, NULL, FUSER_OVERLAP_DEFAULT, (fuser_cu_stream)(uintptr_t)0x77, &pr, &err) ==
          FUSER_OK);
    CHECK(fuser_ffn_run(&d, &pr, NULL, &err) == FUSER_OK && rec.launches == 1);
    /* fields after the maps: b_up, b_gate, b_down, hbuf, y, ws, sync, trace, five scales, xin, xbuf */
    CHECK(map_base(rec.params, MAP_X) == (const void *)xbuf && map_base(rec.params, MAP_H) == (const void *)ws);
    CHECK(field(rec.params, 13) == x.data && field(rec.params, 14) == (const void *)xbuf);
    CHECK(field(rec.params, 5) == (const void *)(xbuf + 64 * 256) && field(rec.params, 3) == (const void *)ws);
    CHECK(field(rec.params, 8) == sx.data && field(rec.params, 12) == sh.data && field(rec.params, 10) == NULL);

    /* a new x: handed over as xin; X's map stays on the workspace copy, nothing encoded again */
    const int enc = rec.encodes;
    const void *next[8] = {(void *)0x110000, NULL, NULL, NULL, NULL, NULL, NULL, (void *)0x410000};
    CHECK(fuser_ffn_run(&d, &pr, next, &err) == FUSER_OK && rec.encodes == enc && rec.launches == 2);
    CHECK(field(rec.params, 13) == next[0] && map_base(rec.params, MAP_X) == (const void *)xbuf);
    CHECK(field(rec.params, 4) == next[7]);
}

/* The encode of `base` among the last `n` (its index in rec), or -1 */
static int encoded(const void *base, int n)
{
    for (int i = rec.encodes - 1; i >= 0 && i >= rec.encodes - n; i--)
        if (rec.base[i % 64] == base)
            return i % 64;
    return -1;
}

void test_ffn_exact_token_boxes(void)
{
    fuser_driver d = recording_driver();
    fuser_err err;
    fuser_err_clear(&err);
    CHECK(fuser_stream_exact_boxes(-1) == 1); /* on unless switched off */
    CHECK(fuser_stream_exact_boxes(0) == 1);

    /* 5 tokens in a row tile of 16: x's rows [0, 5) in a box of 5 through a second map; H read as 16 rows */
    fuser_ffn_args a;
    fuser_chain c;
    CHECK(five_tokens(&a, &err) == FUSER_OK);
    fuser_ffn_kernel *k = &five.k;
    const fuser_tensor x = five.x, wu = five.wu, wd = five.wd;
    CHECK(fuser_ffn_validate(&a, &c, &err) == FUSER_OK);
    int64_t zw, wf;
    fuser_plan_scratch(&k->plan, c.m, &zw, &wf);
    CHECK(wf >= 16 * 512 / 2); /* H: the whole row tile */
    fuser_scratch_view s = {0x800000, 0, (zw + 3) / 4 * 4, wf};
    const void *h = (const void *)(uintptr_t)(0x800000 + 4 * s.zeroed_words);
    fuser_cu_stream stream = (fuser_cu_stream)(uintptr_t)0x77;

    fuser_ffn_prepared whole, pr;
    CHECK(fuser_ffn_prepare(&d, k, &a, &c, &s, NULL, FUSER_OVERLAP_DEFAULT, stream, &whole, &err) == FUSER_OK);
    int i = encoded(h, 4);
    CHECK(i >= 0 && rec.rows[i] == 5 && rec.box_rows[i] == 16); /* whole boxes: H's map ends at the last row */
    CHECK(fuser_stream_exact_boxes(1) == 0 && fuser_stream_exact_boxes(-1) == 1);
    int enc = rec.encodes;
    CHECK(fuser_ffn_prepare(&d, k, &a, &c, &s, NULL, FUSER_OVERLAP_DEFAULT, stream, &pr, &err) == FUSER_OK);
    CHECK(rec.encodes == enc + 3); /* x, H (its rows changed), x's tail; the weights' maps are cached */
    i = encoded(h, 3);
    CHECK(i >= 0 && rec.rows[i] == 16 && rec.box_rows[i] == 16);
    CHECK(rec.base[(enc + 2) % 64] == x.data && rec.rows[(enc + 2) % 64] == 5 && rec.box_rows[(enc + 2) % 64] == 5);
    CHECK(fuser_ffn_run(&d, &pr, NULL, &err) == FUSER_OK);
    CHECK(x_tail_rows(rec.params) == 5 && map_base(rec.params, MAP_X_TAIL) == x.data);
    CHECK(map_base(rec.params, MAP_X) == x.data && map_base(rec.params, MAP_H) == h);

    /* a new x: both of its maps encoded again at its address */
    enc = rec.encodes;
    const void *next[8] = {(void *)0x110000, NULL, NULL, NULL, NULL, NULL, NULL, (void *)0x410000};
    CHECK(fuser_ffn_run(&d, &pr, next, &err) == FUSER_OK && rec.encodes == enc + 2);
    CHECK(map_base(rec.params, MAP_X) == next[0] && map_base(rec.params, MAP_X_TAIL) == next[0]);
    CHECK(x_tail_rows(rec.params) == 5 && rec.rows[(enc + 1) % 64] == 5 && rec.box_rows[(enc + 1) % 64] == 5);

    /* whole row tiles (16 tokens): nothing of its own for the last one */
    fuser_tensor x16 = cuda2d(0x100000, 16, 256), y16 = cuda2d(0x400000, 16, 128);
    fuser_ffn_args a16 = {&x16, &wu, &wd, NULL, NULL, NULL, NULL, &y16, "silu"};
    fuser_chain c16;
    CHECK(fuser_ffn_validate(&a16, &c16, &err) == FUSER_OK);
    CHECK(fuser_ffn_prepare(&d, k, &a16, &c16, &s, NULL, FUSER_OVERLAP_DEFAULT, stream, &pr, &err) == FUSER_OK);
    CHECK(fuser_ffn_run(&d, &pr, NULL, &err) == FUSER_OK);
    CHECK(x_tail_rows(rec.params) == 0 && map_base(rec.params, MAP_X_TAIL) == NULL);

    /* a launch prepared before keeps its whole boxes */
    CHECK(fuser_ffn_run(&d, &whole, NULL, &err) == FUSER_OK && x_tail_rows(rec.params) == 0);
    CHECK(fuser_stream_exact_boxes(0) == 1 && fuser_stream_exact_boxes(-1) == 0);
    fuser_stream_exact_boxes(1);
}

void test_ffn_first_pass_lead(void)
{
    fuser_driver d = recording_driver();
    fuser_err err;
    fuser_err_clear(&err);
    CHECK(fuser_stream_lead_bytes(-1) == FUSER_STREAM_LEAD_BYTES && FUSER_STREAM_LEAD_BYTES == 128 * 1024);
    fuser_ffn_args a;
    fuser_chain c;
    CHECK(five_tokens(&a, &err) == FUSER_OK);
    fuser_ffn_kernel *k = &five.k;
    CHECK(fuser_ffn_validate(&a, &c, &err) == FUSER_OK);
    int64_t zw, wf;
    fuser_plan_scratch(&k->plan, c.m, &zw, &wf);
    fuser_scratch_view s = {0x800000, 0, (zw + 3) / 4 * 4, wf};
    fuser_cu_stream stream = (fuser_cu_stream)(uintptr_t)0x77;

    /* a launch carries the setting it was prepared with, whatever the setting is when it runs */
    fuser_ffn_prepared led, whole;
    CHECK(fuser_ffn_prepare(&d, k, &a, &c, &s, NULL, FUSER_OVERLAP_DEFAULT, stream, &led, &err) == FUSER_OK);
    CHECK(fuser_stream_lead_bytes(0) == FUSER_STREAM_LEAD_BYTES && fuser_stream_lead_bytes(-1) == 0);
    CHECK(fuser_ffn_prepare(&d, k, &a, &c, &s, NULL, FUSER_OVERLAP_DEFAULT, stream, &whole, &err) == FUSER_OK);
    CHECK(fuser_ffn_run(&d, &whole, NULL, &err) == FUSER_OK && lead_bytes(rec.params) == 0);
    CHECK(fuser_ffn_run(&d, &led, NULL, &err) == FUSER_OK && lead_bytes(rec.params) == 128 * 1024);
    CHECK(fuser_stream_lead_bytes(FUSER_STREAM_LEAD_BYTES) == 0);
    CHECK(fuser_ffn_run(&d, &whole, NULL, &err) == FUSER_OK && lead_bytes(rec.params) == 0);
    CHECK(x_tail_rows(rec.params) == 5); /* the field before it is still where it was */
}
