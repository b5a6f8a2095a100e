/* plan.h: a plan, i.e. how one chain runs on one target: the cluster shape, the block tiles, the loop
 * order and the dataflows between blocks, plus everything derived from them (grid, buffers, traffic,
 * predicted time). This header is the contract that the cost model, the CPU plan interpreter, the code
 * generator and the kernel templates all implement; docs/dataflows.md explains it with pictures.
 *
 * A fused plan runs a grid of clusters. Cluster (cm, cn) owns rows [cm*cls_m*bm, +cls_m*bm) of the
 * tokens and the d_ff range [cn*nc, +nc). Its cls_m*cls_n*cls_k blocks are, by rank
 * r = ik*(cls_n*cls_m) + in*cls_m + im:
 *   GEMM1 view: block (im, in, ik) computes the partial H tile of rows im and d_ff slice `in`
 *     (bn*n_iters contiguous columns, processed bn at a time) over K-split ik.
 *     all_exchange (cls_k > 1): the cls_k blocks of one (im, in) read each other's fp32 partials over
 *     DSM and each forms the complete tile, adding (K split) or multiplying (gate x up); the
 *     activation is applied and H is rounded to 16 bits. Every replica then holds the same H tile.
 *   GEMM2 view: shuffle group g = in / cls_shuffle, position s = in % cls_shuffle, output part
 *     lpart = s*cls_k + ik (cls_l = cls_shuffle*cls_k parts of lp columns each).
 *     shuffle (cls_shuffle > 1): the blocks of a group copy each other's H slices over DSM (ring order),
 *     so each multiplies the group's whole d_ff range with its own W_down columns.
 *     reduce_scatter (cls_reduce > 1): the cls_reduce groups hold partial output tiles of the same
 *     columns; each block sums one share (bl/cls_reduce columns) of every group's tile over DSM.
 *     inter_cluster_reduce (grid_n > 1): clusters along d_ff write fp32 partial shares to a global
 *     workspace; per share tile, the last block to arrive (an atomic ticket) sums all of them in
 *     cluster order (deterministic), adds b_down, rounds and stores.
 * Loop orders: n_outer keeps the output tile in registers and streams d_ff chunks (each block has one
 * output chunk); l_outer computes the block's whole H slice first (it stays in shared memory) and
 * then loops over output chunks.
 * Gated chains: spatial mode puts gate and up on different blocks (cls_k = 2 x K-split, exchange
 * multiplies); sequential mode computes both in one block (two accumulators, exchange adds both).
 */
#ifndef FUSER_PLAN_H
#define FUSER_PLAN_H

#include <stdint.h>

#include "fuser/chain.h"
#include "fuser/status.h"
#include "fuser/target.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FUSER_ORDER_N_OUTER = 0, FUSER_ORDER_L_OUTER = 1 } fuser_order;
/* Kernel families. cluster: the cluster-fused kernel (include/fuser/device/ffn.cuh) running the DSM
 * dataflows above. stream: the whole-GPU streaming kernel (include/fuser/device/stream.cuh): one
 * persistent launch; phase 1 computes H tile by tile (n-tiles of bn d_ff columns, each split s1 ways
 * over K) into a global buffer that stays in L2 while it fits, phase 2 computes Y (l-tiles of bl output
 * columns, split s2 ways over d_ff) as soon as the H columns it needs are ready; split partials are
 * summed deterministically by the last split to finish. bm is the token rows of a row tile (the tokens
 * are cut into ceil(m / bm) of them, each with its own units): 64 or 128 with tokens on wgmma's M side,
 * 16 or 32 with the weights there instead (swap-AB, for decode; bn = bl = 128), as a quantized chain's
 * plans (bm 16, 32 or 64) always have them. A stream plan's cluster
 * is (1, 1, 1, 1), or a pair of blocks sharing one operand by TMA multicast: (2, 1, 1, 1) runs units of two
 * consecutive row tiles side by side (they share the weight tiles), (1, 2, 1, 2) units of two consecutive
 * n-tiles or l-tiles (they share the token tile: X or H). */
typedef enum { FUSER_KIND_CLUSTER = 0, FUSER_KIND_STREAM = 1 } fuser_kind;
/* A stream plan's pairs (from its cluster shape). */
typedef enum { FUSER_PAIR_NONE = 0, FUSER_PAIR_ROWS = 1, FUSER_PAIR_TILES = 2 } fuser_pair;
typedef enum { FUSER_GATE_NONE = 0, FUSER_GATE_SPATIAL = 1, FUSER_GATE_SEQUENTIAL = 2 } fuser_gate_mode;

/* Dataflow bits (a plan uses a set of them). */
enum {
    FUSER_DF_ALL_EXCHANGE = 1 << 0,
    FUSER_DF_SHUFFLE = 1 << 1,
    FUSER_DF_REDUCE_SCATTER = 1 << 2,
    FUSER_DF_INTER_CLUSTER = 1 << 3,
};
#define FUSER_NUM_DATAFLOWS 4
/** Name of dataflow bit i ("all_exchange", ...). */
const char *fuser_dataflow_name(int bit_index);

/* Fixed kernel constants (see include/fuser/device/): 8 warps; K step of GEMM1; K step of GEMM2. */
#define FUSER_THREADS 256
#define FUSER_STREAM_THREADS 384     /* a producer warpgroup and two consumer warpgroups */
/* NOTE: registers the estimate leaves to ptxas' own choices (fragments in flight, addresses). In a
 * sweep of 232 generated kernels every plan estimated at <= 208 compiled without spills, and the
 * only spilling one was estimated at 224; so plans must estimate at most (cap - 40). */
#define FUSER_REG_HEADROOM 40
#define FUSER_BK 64
#define FUSER_BK2 64

/* Bytes moved per memory level. hbm: compulsory global traffic (each input byte read once, each output
 * byte written once, the workspace written and read); l2: every global load and store issued by any
 * block (in-bounds bytes); dsm: bytes read from another block's shared memory; smem: bytes written
 * into shared memory (operand tiles, received DSM data, exchange buffers). */
typedef struct {
    int64_t hbm, l2, dsm, smem;
} fuser_traffic;

/* Predicted time in microseconds, by component. `total` = launch + max(compute, hbm, l2, dsm, smem)
 * + sync + tail (the minimax of the paper's cost model plus the serial terms it leaves out). */
typedef struct {
    double compute, hbm, l2, dsm, smem, sync, launch, tail, total;
    double flops;        /* executed, including padded tiles */
    double useful_flops; /* the chain's own FLOPs */
    int waves;           /* ceil(clusters / co-resident clusters) */
    int sms_used;
} fuser_cost;

typedef struct fuser_plan {
    fuser_chain chain;
    int fused;                       /* 0: the unfused path (library GEMMs + elementwise kernels) */
    fuser_kind kind;                 /* kernel family of a fused plan */
    /* --- searched --- */
    int cls_m, cls_n, cls_k, cls_l;  /* cluster shape (the paper's notation) */
    int bm, bn, bl;                  /* block tiles: token rows, d_ff columns per chunk, output columns per chunk */
    int n_iters;                     /* d_ff chunks per block: a block's d_ff slice is bn * n_iters wide */
    int stages;                      /* cp.async pipeline depth */
    fuser_order order;
    fuser_gate_mode gate_mode;
    int s1, s2;                      /* stream: K splits of phase 1 (over d_model) and phase 2 (over d_ff) */
    int phases;                      /* stream: 2 (phase 1 writes H to a buffer in L2, phase 2 reads it) or 1
                                        (each unit computes the H columns of its d_ff range itself); 0 reads
                                        as 2 */
    int lspan;                       /* stream, one phase: l-tiles each unit computes (GEMM1 runs once per
                                        unit); 0 reads as 1 */
    /* --- derived by fuser_plan_derive --- */
    int cluster_size;                /* cls_m * cls_n * cls_k */
    int cls_shuffle, cls_reduce;     /* cls_l / cls_k, cls_n * cls_k / cls_l */
    int ksplit, parts;               /* K splits; fp32 partial tiles a block publishes (2: gated sequential) */
    int warps_m, warps_n;            /* warp grid of the 8 warps over a bm x (bn | bl) tile */
    int64_t kt, kts;                 /* K steps in total, per split */
    int64_t nb, nc;                  /* d_ff slice per block, per cluster */
    int64_t lp;                      /* output columns per output part (a multiple of bl) */
    int lc;                          /* output chunks per part: lp / bl */
    int sw;                          /* share width: bl / cls_reduce */
    int64_t grid_m, grid_n;          /* clusters along tokens (stream: row tiles), along d_ff */
    int64_t clusters, blocks;
    int64_t m_pad, l_pad;            /* grid_m*cls_m*bm, cls_l*lp */
    int smem_bytes;                  /* dynamic shared memory per block */
    int smem_pipe, smem_xbuf, smem_hg; /* its parts */
    int regs_est;                    /* estimated registers per thread */
    int64_t workspace_bytes;         /* fp32 partials for inter_cluster_reduce (0 if grid_n == 1) */
    int64_t tickets;                 /* int32 counters for inter_cluster_reduce */
    int barriers;                    /* cluster barriers per block */
    int dataflows;                   /* FUSER_DF_* bits */
    int threads;                     /* threads per block */
    int nt1, lt2;                    /* stream: n-tiles of phase 1, l-tiles of phase 2 */
    int64_t units;                   /* stream: work units (phase 1 + phase 2, every row tile) at the chain's m */
    /* --- filled by the cost model --- */
    fuser_traffic traffic;
    fuser_cost cost;
} fuser_plan;

/** Fill the derived fields of a plan whose chain and searched fields are set. Checks structural
 * validity (divisibility of the cluster shape, tile shapes, ranges) and returns FUSER_E_VALUE naming
 * the first violated condition. It does not check hardware limits (see fuser_plan_check_target). */
int fuser_plan_derive(fuser_plan *p, fuser_err *err);

/** The deepest pipeline (stages in [2, 8]) of a derived stream plan whose shared memory fits `smem_limit`
 * bytes, or 0 where two stages do not fit: only the ring depends on the depth, so one derivation answers
 * for every depth. */
int fuser_stream_deepest_ring(const fuser_plan *p, int smem_limit);

/** Scratch a launch of plan p with m tokens needs: zeroed 32-bit words (tickets, flags: zero again when
 * the kernel ends) and fp32 workspace words (partials, and the stream kernel's H buffer). */
void fuser_plan_scratch(const fuser_plan *p, int64_t m, int64_t *zeroed_words, int64_t *ws_floats);

/** Where a stream launch of m tokens keeps its data in the workspace (fp32 words from its start, after the
 * zeroed words): H at 0, a quantized chain's e4m3 copy of x at `*xq` (its x map and xbuf), the split
 * partials at `*partials`. */
void fuser_stream_ws_layout(const fuser_plan *p, int64_t m, int64_t *xq, int64_t *partials);

/** The pairs of a stream plan: FUSER_PAIR_ROWS for cluster (2, 1, 1, 1), FUSER_PAIR_TILES for (1, 2, 1, 2),
 * else FUSER_PAIR_NONE. */
fuser_pair fuser_stream_pair(const fuser_plan *p);

/** Whether a stream plan puts the weights on wgmma's M side and the tokens on its N side (swap-AB: each
 * consumer warpgroup 64 weight rows of a 128-row tile, the bm tokens as wgmma's N): plans of bm 16 or 32,
 * and every quantized (e4m3) plan, whose bm 64 tiles thus need no register tile of 64 x 128 per operand. */
int fuser_stream_swap(const fuser_plan *p);

/** The most phase-1 K splits a stream plan may take: 16 over its parts, but 1 for a gated quantized tile of
 * 128 tokens (the last split's sum of both parts' 64 x 128 partials in registers spills, and such splits
 * measured 1.2-1.35x slower than none). */
int fuser_stream_max_s1(const fuser_plan *p);

/** Whether a stream plan's phase-2 split partials are the real token rows only, summed by every block after
 * the last unit (instead of by each tile's last split): one phase with swap-AB (bm 16 or 32; any number of
 * d_ff splits), and a quantized chain's tiles of 128 tokens. */
int fuser_stream_row_partials(const fuser_plan *p);

/** Whether bn is one of the stream kernel's narrow n-tile widths (48, 96, 112): 16-bit tiles of 64 or 128 token
 * rows (48: of 128) in two phases only (wgmma N 48 / 56 per warpgroup at bm 64), for d_ff widths whose 64- or
 * 128-wide tiles leave SMs without a phase-1 unit. */
static inline int fuser_stream_narrow_bn(int bn) { return bn == 48 || bn == 96 || bn == 112; }

/** Whether n-tiles of bn columns fit row tiles of bm tokens: 48-wide ones only at bm 128 (wgmma N 48 per consumer;
 * bm 64's per-warpgroup halves would be 24 wide). plan.c refuses the rest; the search does not offer them. */
static inline int fuser_stream_bn_fits_bm(int bn, int bm) { return bn != 48 || bm == 128; }

/** Whether bl is the stream kernel's narrow l-tile width (96): the same tiles as a narrow n-tile (wgmma N 96, or
 * 48 per warpgroup at bm 64), for d_out widths whose 128-wide l-tiles leave SMs without a phase-2 unit (768: 6
 * l-tiles of 128 per row tile, 8 of 96; 3072: 24 and 32). */
static inline int fuser_stream_narrow_bl(int bl) { return bl == 96; }

/** Groups of l-tiles along d_out of a derived stream plan, one per phase-2 unit and row tile and split:
 * d_out's l-tiles, or in one phase ceil(l-tiles / lspan). */
int64_t fuser_stream_lgroups(const fuser_plan *p);

/** Whether a stream plan's units share their l-tiles with helper blocks: one phase, swap-AB (bm 16 or
 * 32), each unit spanning every l-tile (of several), several d_ff splits. */
int fuser_stream_steals(const fuser_plan *p);

/** The work units of a stream launch of plan p with m tokens (every row tile's units of both phases;
 * with fuser_stream_steals, each unit and each of its l-tiles): the most blocks worth launching, and
 * the trace's length. */
int64_t fuser_stream_units(const fuser_plan *p, int64_t m);

/** Bytes of L2 the stream kernel counts on keeping data in (weights shared by row tiles, H between its
 * phases): about half of the H100's and H200's 50 MB, which also holds the tiles in flight. */
#define FUSER_STREAM_L2_BYTES (24.0 * 1024 * 1024)

/** Bytes of a stream plan's weights in phase 1 (W_up and W_gate) or phase 2 (W_down), 16-bit. */
double fuser_stream_phase_weights(const fuser_plan *p, int phase);

/** 1 where both phases' weights together fit the L2 the stream kernel counts on (FUSER_STREAM_L2_BYTES). */
int fuser_stream_weights_in_l2(const fuser_plan *p);

/** Row tiles per group of a stream launch's unit order: 1 (row tile by row tile) when the weights stay
 * in L2, so each row tile's H is complete early; else every row tile (each weight tile read from HBM
 * once, by consecutive units). */
int64_t fuser_stream_row_group(const fuser_plan *p, int64_t m);

/** Check a derived plan against a target's hardware limits (shared memory, registers, cluster size,
 * workspace); FUSER_E_VALUE naming the limit. The unfused plan always passes. */
int fuser_plan_check_target(const fuser_plan *p, const fuser_target *t, fuser_err *err);

/** A plan for the unfused path of a chain. */
void fuser_plan_unfused(const fuser_chain *c, fuser_plan *p);

/** Short text of the dataflow set: "all_exchange+shuffle", "local" (none), or "unfused". */
void fuser_plan_dataflow_str(const fuser_plan *p, char *buf, size_t n);

/** Block-level geometry helpers (shared by the interpreter and the cost model). */
static inline int64_t fuser_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t fuser_max64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t fuser_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
/** How many of the `len` indices starting at `begin` are below `limit`. */
int64_t fuser_in_bounds(int64_t begin, int64_t len, int64_t limit);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_PLAN_H */
