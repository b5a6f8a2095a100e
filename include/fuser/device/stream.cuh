/* stream.cuh: the whole-GPU streaming FFN kernel (decode, the paper's M = 128 chains, and row tiles of
 * any token count). One persistent launch runs both GEMMs; every weight byte is read from HBM once,
 * and every SM streams weights from the first microsecond to the last.
 *
 * The tokens are cut into row tiles of BM (one tile up to BM tokens). Work is a list of units, claimed in
 * order from a global counter by whichever block's producer asks next (so load balances itself, and a
 * launch needs no co-residency guarantee: a unit is only claimed by a running block, and phase-2 units,
 * the only ones that wait, are claimed after every phase-1 unit). Row tiles are taken in groups of
 * `group` (the last group may be smaller); within a group consecutive units share their weight tiles and
 * differ in the row tile. With weights larger than L2 the group is every row tile, so each weight tile is
 * read from HBM once and from L2 by the other row tiles; with weights that stay in L2 a group is one row
 * tile, so a row tile's H is complete early and its phase-2 units need not wait for the whole phase 1:
 *   phase 1, unit (n-tile, split, row tile): H[rows, n-tile] partial = X[rows, K range] *
 *     W[n-tile, K range]^T, for W = W_up (and W_gate when gated: both accumulators in one block, so the
 *     gate product is local).
 *     With S1 K splits, fp32 partials go to a workspace and the last split to arrive (an atomic ticket)
 *     sums all of them in split order (deterministic; each thread its own fragment, which the workspace
 *     keeps in the accumulators' order: 16-byte stores and loads, every warp's contiguous); it adds the
 *     biases, activates (and gates), rounds
 *     H to 16 bits into a global buffer (it stays in L2) and counts the n-tile done (release) in the
 *     row tile's ready counter of every phase-2 split whose d_ff range the n-tile overlaps.
 *   phase 2, unit (split, l-tile, row tile): Y[rows, l-tile] partial = H[rows, N range] * W_down[l-tile,
 *     N range]^T. The producer acquires its row tile's split's ready counter once (every n-tile of the
 *     range done) before loading H, so phase 2 starts as soon as the H columns it needs exist (no
 *     grid-wide barrier). S2 splits reduce as in phase 1, then b_down, round, store Y; a quantized
 *     chain's tiles of 128 tokens instead store the real rows' partials, which every block sums after
 *     the last unit (ROWSUM, as one phase below), so no tile's last split reads all S2 whole tiles alone.
 * The last block to finish resets the ready counters and the claim counter: the sync words are zero
 * between launches.
 *
 * Launched early (programmatic dependent launch), the kernel starts while the stream's previous kernel
 * finishes: each block requests its first unit's weight tiles, then waits for that kernel
 * (griddepcontrol.wait) before it reads X, claims a unit or writes anything. Likewise a phase-2 unit
 * requests its W_down tiles before it waits for its split's H.
 *
 * Roles: warpgroup 0 is the producer (one thread issues TMA into a STAGES-deep ring; it runs ahead
 * across unit boundaries, so the ring never drains; its first pass keeps about lead_bytes in flight, three
 * quarters of it in ungated swap-AB tiles: fill); warpgroups 1-2 consume with wgmma. BM, the token
 * rows of every tile, picks the operand roles:
 *   BM = 128: tokens on wgmma's M side, each consumer its 64 token rows, all the tile's columns;
 *   BM = 64: tokens on the M side, both consumers the 64 rows, each half of the columns;
 *   BM = 16 or 32 (swap-AB, decode): weights on the M side (each consumer 64 of the tile's 128 weight
 *     rows), tokens on the N side (wgmma n16 / n32), so a few tokens do not pay for 64 rows of MMA;
 *     a quantized chain's tiles all run swap-AB (up to n128 at BM = 128).
 * Tokens beyond M are zero-filled by TMA and never stored.
 *
 * Cluster pairs (C::PAIR): the claim order is a list of pairs of units, run by the two blocks of a
 * cluster side by side, which share one operand through TMA multicast (each block loads half of its rows
 * for both), so L2 serves it once:
 *   ROWS:  units of consecutive row tiles of one tile and split share the weight tiles;
 *   TILES: units of consecutive tiles (n-tiles, l-tiles) of one row tile and split share the token tile.
 * The pair's K ranges are equal, so both blocks walk their rings in step; a slot is refilled once the
 * consumers of both blocks released it. Block 0 claims a pair and hands its id to block 1 through
 * block 1's shared memory. Where a pair's second unit does not exist (an odd count of row tiles or
 * tiles), block 1 runs a ghost: it loads its half of the shared tiles for block 0 and computes nothing.
 *
 * One phase (C::PHASES == 1, for chains whose GEMM1 is cheap to repeat): there are no phase-1 units and no H
 * buffer. Each unit (split, l-tile, row tile) first computes the H columns of its d_ff range itself,
 * n-tile by n-tile over the whole K (X and W_up tiles through the ring as a phase-1 unit's), activates
 * and rounds them into shared memory in the layout TMA would load from the H buffer, then runs GEMM2 on
 * them (the ring brings only W_down). A unit spans C::LSPAN l-tiles (GEMM1 runs once per unit, so once per
 * l-tile at LSPAN 1, once per split and row tile when a unit spans every l-tile); nothing waits for another
 * unit. With swap-AB (decode), the split partials are only the tile's real token rows ([token][feature],
 * fp32), stored without a ticket, so a unit's weight stream never waits for an epilogue; once every unit
 * is done (a counter every block waits for after its last unit) all blocks sum y together, each a share
 * of its elements: G threads per element each sum a run of consecutive splits in order, then the runs are
 * added in order (G is fixed by the token count, the split count and the grid, so repeated runs are
 * bitwise equal). So a unit per d_ff slice of 128 columns, spanning every l-tile, streams each weight byte
 * once with no phase boundary, and its partials are M x 512 bytes per l-tile.
 * Such units (C::LSPAN = every l-tile, swap-AB, several splits: STEAL) share their l-tiles with blocks that
 * have no unit: each slice's l-tiles are taken one at a time from the slice's counter, by its unit (after
 * GEMM1) or by a helper, a block whose units are done or that found none, which loads the slice's H
 * (the unit stores it to the H buffer too) and the l-tile's W_down tiles by TMA, so no SM idles while
 * slower units finish. A piece's partial is the same bits whoever computes it. */
#pragma once

#include "fuser/device/pipeline.cuh"
#include "fuser/device/wgmma.cuh"

namespace fuser {

struct StreamParams {
    TensorMap x;      /* X [M, K], box 64 x BM (a quantized chain: its e4m3 copy in xbuf) */
    TensorMap w_up;   /* [N, K], box 64 x BN */
    TensorMap w_gate; /* [N, K], box 64 x BN (gated only) */
    TensorMap h;      /* H [M, N] in the workspace, box 64 x BM */
    TensorMap w_down; /* [L, N], box 64 x BL */
    TensorMap x_tail; /* X again, box 64 x x_tail_rows: the last row tile's real rows (when x_tail_rows > 0) */
    const uint16_t *b_up, *b_gate, *b_down;
    void *hbuf;       /* H's memory: [M][N], 16-bit (or e4m3 in a quantized chain) */
    uint16_t *y;      /* [M, L] */
    float *ws;        /* fp32 split partials, whole tiles in the accumulators' order (store_frag): phase 1
                         [row tile][n-tile][S1][PARTS][BM x BN], then phase 2 [row tile][l-tile][S2][BM x BL] */
    int *sync;        /* [claim][done][summed], then per row tile [NT1 tickets][LT tickets][S2 ready counters]; all
                         zero between launches */
    uint64_t *trace;  /* optional (null: off): per unit TRACE_WORDS words, see Stream::trace_unit */
    const float *scale[5]; /* a quantized chain's fp32 scales: x, up, gate, down, h (include/fuser/chain.h) */
    const uint16_t *xin;   /* a quantized chain's x, bfloat16 [M, K], which the consumers quantize into xbuf */
    void *xbuf;            /* there: x in e4m3 [M][K], the memory the x map reads */
    int m;
    int group;        /* row tiles per group of the unit order (>= 1) */
    int x_tail_rows;  /* 0, or m % BM (unpaired 16-bit chains): the last row tile's X box stops at the last row,
                         since boxes reaching past it (TMA's zero fill) arrived slower than whole ones; the rows
                         of the tile beyond it keep stale data, which only reaches rows no store writes */
    int lead_bytes;   /* the ring's first pass keeps about this many bytes in flight (0: all its slots; Stream::fill) */
};

constexpr int STREAM_THREADS = 384;
constexpr int CONSUMER_WARPS = 8; /* warpgroups 1-2 */
/* per unit: block, claimed, H ready (phase 2), first data, done, SM, MMAs done, consumer ns spent waiting for
 * data after the first slot, producer's last slot issued (times: global ns) */
constexpr int TRACE_WORDS = 9;

template <class C>
struct Stream {
    static constexpr int DT = C::DTYPE;
    /* A quantized chain (DT_E4M3): e4m3 weights and H, fp32 scales, bfloat16 x, biases and y. The weights',
     * H's and X's TMA maps are 16-bit views of half the columns, so their tiles, boxes and swizzle are a 16-bit
     * chain's; a K step is then 128 columns (KCOLS), four k32 MMAs. X arrives in bfloat16: first thing, the
     * consumers of every block quantize it (x (1 / s_x) to e4m3) into xbuf slice by slice (quantize_x), and
     * phase 1 loads X from there once every slice is stored. The scales apply in the epilogues: phase 1 scales
     * the summed partials by s_x s_w[feature] before the biases and rounds H x (1 / s_h) to e4m3; phase 2
     * scales by s_h s_down[feature]. */
    static constexpr bool Q = DT == DT_E4M3;
    static constexpr int DTO = Q ? DT_BF16 : DT; /* y's and the biases' type */
    static constexpr int KCOLS = Q ? 2 * SW_COLS : SW_COLS;
    using HT = typename pick<Q, uint8_t, uint16_t>::type; /* an element of H */
    static constexpr int BM = C::BM, BN = C::BN, BL = C::BL, S1 = C::S1, S2 = C::S2, STAGES = C::STAGES;
    /* weights on wgmma's M side (fuser_stream_swap): few tokens, or a quantized chain, whose K step's fresh
     * sums would double a 64 x 128 accumulator tile per operand (and whose X tile the consumers share) */
    static constexpr bool SWAP = BM < 64 || Q;
    static constexpr int MT = SWAP ? 0 : BM / 64;
    static constexpr int PARTS = C::GATED ? 2 : 1;
    static constexpr int MP = BM;                                   /* token rows of every tile */
    static constexpr int KT1 = ceil_div(C::K, KCOLS), KS1 = ceil_div(KT1, S1);
    static constexpr int NT1 = ceil_div(C::N, BN);
    static constexpr int KT2 = ceil_div(C::N, KCOLS), KS2 = ceil_div(KT2, S2);
    static constexpr int LT = ceil_div(C::L, BL);
    /* wgmma N of each consumer's MMAs: phase 1, phase 2 */
    static constexpr int NW1 = SWAP ? BM : MT == 2 ? BN : BN / 2;
    static constexpr int NW2 = SWAP ? BM : MT == 2 ? BL : BL / 2;
    static constexpr int TOK = MP * SW_ROW_BYTES;           /* a token tile of one K step: X or H */
    static constexpr int X_BYTES = TOK;                      /* a slot's token region, before its weight tiles */
    static constexpr int BYTES1 = X_BYTES + PARTS * BN * SW_ROW_BYTES; /* a slot's bytes: phase 1, phase 2 */
    static constexpr int BYTES2 = TOK + BL * SW_ROW_BYTES;
    static constexpr int STAGE_BYTES =
        ceil_div(cmax(BYTES1, X_BYTES + BL * SW_ROW_BYTES), SW_GROUP_BYTES) * SW_GROUP_BYTES;
    static_assert(BM == 16 || BM == 32 || BM == 64 || BM == 128, "BM");
    static_assert(!SWAP || (BN == 128 && BL == 128), "swap-AB: each consumer takes 64 weight rows of a 128-row tile");
    static_assert((BN % 64 == 0 || ((BN == 96 || BN == 112) && !SWAP) || (BN == 48 && BM == 128 && !SWAP)) &&
                      BN <= 256 && BL % 32 == 0 && BL <= 256,
                  "tiles");
    static_assert((S1 - 1) * KS1 < KT1 && (S2 - 1) * KS2 < KT2, "every split has K steps");
    static_assert(C::N % 8 == 0 && C::L % 8 == 0 && C::K % 8 == 0, "16-byte rows");
    static constexpr bool ONE = C::PHASES == 1; /* one phase: each unit computes its own H (above) */
    /* one phase: the unit's H, GEMM2's token operand, one MP x 64 swizzled tile per K step of its split */
    static constexpr int H_BYTES = ONE ? KS2 * TOK : 0;
    static_assert(C::PHASES == 1 || C::PHASES == 2, "PHASES");
    static_assert(!Q || (!ONE && C::PAIR == 0 && (BM <= 64 || !C::GATED || S1 == 1)), "a quantized chain: two "
                  "phases, no pairs, gated tiles of 128 tokens without K splits in phase 1");
    static_assert(!ONE || (S1 == 1 && KS2 * SW_COLS % BN == 0 && C::PAIR == 0),
                  "one phase: GEMM1 unsplit, n-tiles tiling each d_ff split, no pairs");
    /* l-tiles per phase-2 unit (one phase only), and the units' groups of l-tiles along d_out */
    static constexpr int LSPAN = C::LSPAN, LG = ceil_div(LT, LSPAN);
    static_assert(LSPAN >= 1 && (LSPAN == 1 || ONE), "a unit spans several l-tiles only in one phase");
    /* phase-2 partials of the real token rows, summed by every block after the last unit (sum_partials):
     * swap-AB plans of one phase, and a quantized chain's tiles of 128 tokens (fuser_stream_row_partials) */
    static constexpr bool ROWSUM = C::ROWSUM;
    static_assert(!ROWSUM || SWAP, "row partials are swap-AB fragments");
    /* units spanning every l-tile share them with helper blocks (above) */
    static constexpr bool STEAL = ONE && ROWSUM && LSPAN == LT && LT > 1 && S2 > 1;
    static constexpr int PIECE = 1 << 29; /* a slot's tag: a helper's piece (slice x LT + l-tile) */
    static constexpr int END = -2;        /* a slot's tag: the unit's l-tiles are done */
    static_assert(ROWSUM || (S1 * PARTS <= 16 && S2 <= 16), "a thread's split sums hold at most 16 partials");
    enum { PAIR_NONE = 0, PAIR_ROWS = 1, PAIR_TILES = 2 };
    static constexpr int PAIR = C::PAIR, CS = PAIR == PAIR_NONE ? 1 : 2; /* blocks per cluster */
    static constexpr int GHOST = 1 << 30; /* a unit id with this bit: the partner's unit, run as a ghost */
    static_assert(PAIR != PAIR_TILES || (NT1 > 1 && LT > 1), "tile pairs need two tiles in each phase");
    /* registers per thread after the role split, within the 168 x 384 the launch allocates: a pair's
     * producer maps claims to units and hands them over, which needs more than 40 */
    static constexpr int PRODUCER_REGS = PAIR == PAIR_NONE ? 40 : 56, CONSUMER_REGS = PAIR == PAIR_NONE ? 232 : 224;
    static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= 168 * 384, "register budget");

    /* sync words: seven per launch, then each row tile's (offsets within its group of ROW_WORDS) */
    /* SUMMED: phase-2 units (STEAL: l-tiles) whose partials are stored; HELP: helpers' slice claims; TAKEN:
     * l-tiles taken (STEAL) */
    /* XCLAIM, XDONE: a quantized chain's slices of x claimed, and stored (quantize_x) */
    static constexpr int CLAIM = 0, DONE = 1, SUMMED = 2, HELP = 3, TAKEN = 4, XCLAIM = 5, XDONE = 6, ROWS0 = 7;
    static constexpr int XSLICE = 256; /* 16-element chunks of x per slice: one per consumer thread */
    /* (TAKE: STEAL, each slice's l-tiles taken; READY: STEAL, each slice's H stored) */
    static constexpr int TICKETS1 = 0, TICKETS2 = NT1, READY = NT1 + LT, TAKE = READY + S2,
                         ROW_WORDS = TAKE + (STEAL ? S2 : 0);

    struct Smem {
        alignas(1024) unsigned char stage[STAGES][STAGE_BYTES];
        /* one phase: the unit's H */
        alignas(1024) unsigned char hs[H_BYTES > 0 ? H_BYTES : 16];
        Ring<STAGES> ring;
        int unit[STAGES]; /* the unit whose first K step a slot holds (-1: no more units), set by the producer */
        int last;
        int box;                    /* pairs: the claimed pair block 0 hands to block 1 */
        int xslice;                 /* quantize_x: the slice of x the consumers claimed */
        uint64_t box_full, box_empty;
    };

    const StreamParams &p;
    Smem &s;
    int lt, warp, lane, w;   /* consumer thread: index in the consumers, warp in its warpgroup, lane, warpgroup */
    int m0;                  /* consumer: the first token row of the current unit's row tile */

    FUSER_DEVICE Stream(const StreamParams &prm, Smem &sm) : p(prm), s(sm) {}

    /* Row tiles and the units of each phase, computed from the parameters where used (a few instructions;
     * held in registers they live through every epilogue and the largest ones spill) */
    FUSER_DEVICE int rt() const { return ceil_div(p.m, BM); }
    FUSER_DEVICE int u1() const { return ONE ? 0 : rt() * NT1 * S1; }
    FUSER_DEVICE int u2() const { return rt() * LG * S2; }
    FUSER_DEVICE int pieces() const { return rt() * S2 * LT; } /* STEAL: every slice's l-tiles */
    FUSER_DEVICE int64_t xchunks() const { return (int64_t)p.m * C::K / 16; } /* quantized: x in 16-element chunks */
    FUSER_DEVICE int xslices() const { return Q ? (int)ceil_div(xchunks(), (int64_t)XSLICE) : 0; }

    /* Entries of each phase in the claim order (units, or pairs of units) and the block's rank in its
     * cluster, likewise computed where used */
    FUSER_DEVICE int q1() const { return ONE ? 0 : entries(rt(), NT1, S1); }
    FUSER_DEVICE int q2() const { return entries(rt(), LG, S2); }
    static FUSER_DEVICE int rank() { return PAIR == PAIR_NONE ? 0 : (int)cluster_rank(); }

    /* Claim-order entries of a phase of T tiles and S splits over `rows` row tiles. */
    static FUSER_DEVICE int entries(int rows, int T, int S)
    {
        return PAIR == PAIR_ROWS ? ceil_div(rows, 2) * T * S : PAIR == PAIR_TILES ? rows * ceil_div(T, 2) * S
                                                                                  : rows * T * S;
    }

    /* One unit's coordinates: which tile (n-tile or l-tile), which split, which row tile. A phase's
     * units run group by group (p.group row tiles each, the last group what is left); within a group,
     * `per` units per row tile, ordered (tile and split, then row tile). */
    struct Unit {
        int tile, split, row;
    };
    static FUSER_DEVICE void locate(int u, int per, int group, int rows_total, int &index, int &row)
    {
        const int g = u / (group * per), r0 = g * group, rows = cmin(group, rows_total - r0);
        const int local = u - r0 * per;
        index = local / rows;
        row = r0 + local % rows;
    }
    FUSER_DEVICE void locate(int u, int per, int &index, int &row) const { locate(u, per, p.group, rt(), index, row); }
    /* The inverse: the unit of index `i` (tile and split) in row tile `row`. */
    FUSER_DEVICE int unit_at(int per, int i, int row) const
    {
        const int r0 = row / p.group * p.group, rows = cmin(p.group, rt() - r0);
        return r0 * per + i * rows + (row - r0);
    }
    FUSER_DEVICE Unit unit1(int u) const
    {
        int i, r;
        locate(u, NT1 * S1, i, r);
        return {i / S1, i % S1, r};
    }
    /* (tile: the group of LSPAN l-tiles, one l-tile but in one phase) */
    FUSER_DEVICE Unit unit2(int v) const
    {
        int i, r;
        locate(v, LG * S2, i, r);
        return {i % LG, i / LG, r};
    }
    FUSER_DEVICE int *sync_of(int row, int word) const { return p.sync + ROWS0 + row * ROW_WORDS + word; }

    /* Entry q of the claim order -> this block's unit (phase 1: [0, u1), phase 2: u1 + its index), or, where
     * a pair's second unit does not exist, GHOST plus the partner's unit (same tile or row tile, same split). */
    FUSER_DEVICE int member(int q) const
    {
        if constexpr (PAIR == PAIR_NONE)
            return q;
        const bool one = q < q1();
        const int v = one ? q : q - q1(), T = one ? NT1 : LT, S = one ? S1 : S2;
        int row, tile, split, ghost;
        if constexpr (PAIR == PAIR_ROWS) {
            int i, rp;
            locate(v, T * S, cmax(1, p.group / 2), ceil_div(rt(), 2), i, rp);
            tile = one ? i / S1 : i % LT;
            split = one ? i % S1 : i / LT;
            row = 2 * rp + rank();
            ghost = row >= rt();
            row -= ghost;
        } else {
            const int TP = ceil_div(T, 2);
            int ip;
            locate(v, TP * S, ip, row);
            tile = 2 * (one ? ip / S1 : ip % TP) + rank();
            split = one ? ip % S1 : ip / TP;
            ghost = tile >= T;
            tile -= ghost;
        }
        const int u = one ? unit_at(T * S, tile * S1 + split, row) : u1() + unit_at(T * S, split * LT + tile, row);
        return ghost ? u | GHOST : u;
    }

    /* ---------------- producer ---------------- */

    /* The n-tiles whose columns overlap phase-2 split sp's d_ff range (that split's ready count): the range ends
     * at d_ff, not at its last K step's padded end, where an n-tile that does not exist may start (d_ff 2000 in
     * 96-wide tiles: 21 tiles end at 2016, the K steps at 2048) */
    static FUSER_DEVICE int first_tile(int sp) { return sp * KS2 * KCOLS / BN; }
    static FUSER_DEVICE int tiles_in(int sp)
    {
        return (cmin(C::N, (sp + 1) * KS2 * KCOLS) - 1) / BN - first_tile(sp) + 1;
    }

    /* Fill the ring with one unit's K steps [k0, k1): each slot gets the unit's weight tiles
     * (weights(stage, bar, kb)) and its token tile (tokens(...): X, or H from phase 1). Weights are read
     * only, so they are requested at once; the token tiles wait for `dep` (the stream's previous kernel,
     * or the split's ready counter) unless `ready`. So HBM keeps streaming while a dependency resolves:
     * up to a ring of weight tiles is in flight before the first token tile is requested. */
    template <class Weights, class Tokens, class Dep>
    FUSER_DEVICE void fill(Cursor<STAGES> &c, int u, int k0, int k1, uint32_t bytes, bool ready, Weights weights,
                           Tokens tokens, Dep dep) const
    {
        Cursor<STAGES> first = c; /* the first slot still without its token tile */
        int held = 0;
        /* The ring's first pass in the lead's slots at a time: every SM asking for its whole ring at once gets the
         * bytes in no order, so each slot lands only when most of the burst has, and tiles of 64-128 token rows, whose
         * MMAs on a slot take about as long as its load, then compute only after the burst; slot k is requested once
         * slot k - lead has landed instead, and the block's first unit holds `lead` weight tiles, not a ring, before
         * its dependency. Swap-AB tiles (decode) take the lead too: their MMAs are short, but the slots in order still
         * let the first ones start before the burst ends (docs/kernels.md step 58); an ungated one's slot holds one
         * weight tile (18-20 KB), which the full lead would give the whole ring or all but one slot, so it keeps
         * three quarters of it (6 or 5 of 8 slots: step 59). Pairs, and the quantized chains' x (written by the
         * consumers), keep the whole ring. */
        const int lead_bytes = SWAP && !C::GATED ? p.lead_bytes - p.lead_bytes / 4 : p.lead_bytes;
        const int lead = !Q && PAIR == PAIR_NONE && lead_bytes > 0 ? cmin(STAGES, ceil_div(lead_bytes, STAGE_BYTES))
                                                                   : STAGES;
        const int hold = c.passed == 0 ? lead : STAGES;
        for (int kb = k0; kb < k1; kb++, c.next()) {
            mbar_wait(&s.ring.empty[c.stage], c.phase ^ 1);
            if (ready && c.passed >= lead && c.passed < STAGES) /* (in the first pass, stage == passed) */
                mbar_wait(&s.ring.full[c.stage - lead], 0);
            s.unit[c.stage] = u; /* published by the arrive below (release) */
            uint64_t *bar = &s.ring.full[c.stage];
            mbar_arrive_expect_tx(bar, bytes);
            weights(s.stage[c.stage], bar, kb);
            if (ready) {
                tokens(s.stage[c.stage], bar, kb);
                continue;
            }
            /* a full ring of slots waiting for their token tiles, or the unit's last: resolve, then request them */
            if (++held < hold && kb + 1 < k1)
                continue;
            dep();
            ready = true;
            for (int i = held - 1; i >= 0; i--, first.next())
                tokens(s.stage[first.stage], &s.ring.full[first.stage], kb - i);
        }
    }

    /* Rows [r0, r0 + rows) of `map` at K step kb into dst: alone, or, `shared` in a pair, this block's half
     * of them for both blocks (multicast; the partner loads the other half; the map's box is rows / 2). */
    FUSER_DEVICE void load_rows(unsigned char *dst, const TensorMap *map, uint64_t *bar, int kb, int r0, int rows,
                                bool shared, bool once = false) const
    {
        if (PAIR != PAIR_NONE && shared) {
            const int half = rows / 2;
            const int r = rank();
            tma_load_2d_multicast(dst + r * half * SW_ROW_BYTES, map, bar, kb * SW_COLS, r0 + r * half, 3);
        } else if (once) {
            tma_load_2d_hint(dst, map, bar, kb * SW_COLS, r0, l2_policy(true));
        } else {
            tma_load_2d(dst, map, bar, kb * SW_COLS, r0);
        }
    }
    /* two phases at one row tile read every weight tile once, so those loads leave L2 first (the split
     * partials, H and x stay); one phase reads W_up once per group of l-tiles */
    FUSER_DEVICE bool weights_once() const { return !ONE && rt() == 1; }

    /* GEMM1's slot at K step kb: W_up's rows [n0, n0 + BN) (and W_gate's after them), X's rows [m0, m0 + BM)
     * (in pairs, the shared ones in halves: load_rows). */
    FUSER_DEVICE void load_w1(unsigned char *st, uint64_t *bar, int kb, int n0) const
    {
        if constexpr (C::GATED)
            load_rows(st + X_BYTES + BN * SW_ROW_BYTES, &p.w_gate, bar, kb, n0, BN, PAIR == PAIR_ROWS, weights_once());
        load_rows(st + X_BYTES, &p.w_up, bar, kb, n0, BN, PAIR == PAIR_ROWS, weights_once());
    }
    FUSER_DEVICE bool x_tail(int m0) const { return p.x_tail_rows && m0 + BM > p.m; }
    FUSER_DEVICE void load_x(unsigned char *st, uint64_t *bar, int kb, int m0) const
    {
        load_rows(st, x_tail(m0) ? &p.x_tail : &p.x, bar, kb, m0, BM, PAIR == PAIR_TILES);
    }
    /* the bytes of X's box at row tile m0 (load_x) */
    FUSER_DEVICE uint32_t x_bytes(int m0) const
    {
        return x_tail(m0) ? (uint32_t)p.x_tail_rows * SW_ROW_BYTES : (uint32_t)X_BYTES;
    }

    /* The next entry of the claim order. In a pair, block 0 takes it from the counter and hands it to
     * block 1 through block 1's one-entry box (waiting until block 1 took the previous one); `n` counts
     * the hand-offs. */
    FUSER_DEVICE int claim(int fixed, uint32_t &n) const
    {
        if constexpr (PAIR == PAIR_NONE) {
            return fixed + atomic_add_relaxed_gpu(p.sync + CLAIM, 1);
        } else {
            int q;
            if (rank() == 0) {
                q = fixed + atomic_add_relaxed_gpu(p.sync + CLAIM, 1);
                mbar_wait(&s.box_empty, (n & 1) ^ 1);
                st_cluster_arrive(&s.box, q, &s.box_full, 1);
            } else {
                mbar_wait_cluster(&s.box_full, n & 1);
                q = *(volatile int *)&s.box;
                mbar_arrive_cluster_release(&s.box_empty, 0);
            }
            n++;
            return q;
        }
    }

    /* A slot without data whose tag tells the consumers something (they release it). */
    FUSER_DEVICE void mark(Cursor<STAGES> &c, int tag) const
    {
        mbar_wait(&s.ring.empty[c.stage], c.phase ^ 1);
        s.unit[c.stage] = tag;
        mbar_arrive(&s.ring.full[c.stage]);
        c.next();
    }

    /* STEAL, a block with no unit left: take l-tiles of the slices' counters (one slice until it is
     * exhausted, then the next slice of a shared counter), each as a piece: the slice's H tiles (once its
     * unit stored them) and the l-tile's W_down tiles. Until every l-tile is taken. */
    FUSER_DEVICE void help(Cursor<STAGES> &c) const
    {
        const int slices = rt() * S2;
        int j = -1;
        for (;;) {
            const int k = j < 0 ? LT : atomic_add_relaxed_gpu(sync_of(j / S2, TAKE + j % S2), 1);
            if (k >= LT) {
                if (ld_relaxed_gpu(p.sync + TAKEN) >= pieces())
                    return;
                j = atomic_add_relaxed_gpu(p.sync + HELP, 1) % slices;
                continue;
            }
            red_relaxed_gpu_add(p.sync + TAKEN, 1);
            const int row = j / S2, sp = j % S2, piece = j * LT + k;
            int *ready = sync_of(row, READY + sp);
            if (p.trace) {
                p.trace[(u2() + piece) * TRACE_WORDS + 0] = blockIdx.x;
                p.trace[(u2() + piece) * TRACE_WORDS + 1] = global_ns();
                p.trace[(u2() + piece) * TRACE_WORDS + 5] = sm_id();
            }
            const bool now = ld_acquire_gpu(ready) >= 1;
            if (now)
                fence_proxy_async_global();
            fill(c, PIECE | piece, sp * KS2, cmin(KT2, (sp + 1) * KS2), TOK + BL * SW_ROW_BYTES, now,
                 [&](unsigned char *st, uint64_t *bar, int kb) {
                     load_rows(st + X_BYTES, &p.w_down, bar, kb, k * BL, BL, false);
                 },
                 [&](unsigned char *st, uint64_t *bar, int kb) { load_rows(st, &p.h, bar, kb, row * BM, BM, false); },
                 [&] {
                     wait_flag(ready, 1);
                     fence_proxy_async_global();
                 });
            if (p.trace)
                p.trace[(u2() + piece) * TRACE_WORDS + 8] = global_ns();
        }
    }

    FUSER_DEVICE void produce() const
    {
        Cursor<STAGES> c;
        /* Block b's first entry is entry b (cluster b's, in pairs), known without a claim, so its weights are
         * requested before the previous kernel is waited for; later entries are claimed in order from a
         * counter, which the previous launch resets as it ends. A phase-2 unit waits only for phase-1 units
         * that are claimed or fixed to a block; a fixed block that has not started yet (another stream's
         * kernel holds SMs) starts when one is free, since the grid is at most what fits at once. */
        /* (one phase: no unit waits for another, so every block's first unit can be fixed) */
        const int cid = (int)blockIdx.x / CS, fixed = cmin((int)gridDim.x / CS, ONE ? q2() : q1());
        bool after_prev = false; /* griddepcontrol.wait done: the previous kernel's writes are visible */
        bool x_ok = !Q;          /* a quantized chain: every slice of x is stored in xbuf (and after_prev) */
        uint32_t handoffs = 0;
        int q = cid < fixed ? cid : -1;
        for (;;) {
            if (q < 0) {
                if (!after_prev)
                    griddep_wait();
                after_prev = true;
                q = claim(fixed, handoffs);
            }
            if (q >= q1() + q2()) { /* tell the consumers: no more units */
                if constexpr (STEAL)
                    help(c);
                mbar_wait(&s.ring.empty[c.stage], c.phase ^ 1);
                s.unit[c.stage] = -1;
                mbar_arrive(&s.ring.full[c.stage]);
                return;
            }
            const int tagged = member(q), u = tagged & ~GHOST;
            const bool ghost = tagged != u;
            /* a ghost loads only its half of the shared tiles: the weights (ROWS) or the tokens (TILES) */
            const bool own_w = !ghost || PAIR == PAIR_ROWS, own_t = !ghost || PAIR == PAIR_TILES;
            if (p.trace && !ghost) {
                p.trace[u * TRACE_WORDS + 0] = blockIdx.x;
                p.trace[u * TRACE_WORDS + 1] = global_ns();
                p.trace[u * TRACE_WORDS + 5] = sm_id();
            }
            if (u < u1()) {
                const Unit t = unit1(u);
                const int nt = t.tile, sp = t.split, m0 = t.row * BM;
                const uint32_t bytes = (own_t ? x_bytes(m0) : 0) + (own_w ? PARTS * BN * SW_ROW_BYTES : 0);
                fill(c, tagged, sp * KS1, cmin(KT1, (sp + 1) * KS1), bytes, (after_prev && x_ok) || !own_t,
                     [&](unsigned char *st, uint64_t *bar, int kb) {
                         if (own_w)
                             load_w1(st, bar, kb, nt * BN);
                     },
                     [&](unsigned char *st, uint64_t *bar, int kb) {
                         if (own_t)
                             load_x(st, bar, kb, m0);
                     },
                     [&] {
                         griddep_wait();
                         if constexpr (Q) { /* the consumers' e4m3 x, visible to TMA */
                             wait_flag(p.sync + XDONE, xslices());
                             fence_proxy_async_global();
                         }
                     });
                after_prev = after_prev || own_t;
                x_ok = x_ok || own_t;
                if (p.trace && !ghost)
                    p.trace[u * TRACE_WORDS + 8] = global_ns();
            } else {
                const Unit t = unit2(u - u1());
                const int sp = t.split, m0 = t.row * BM;
                int *ready = sync_of(t.row, READY + sp);
                /* the H columns of the split exist and are visible to TMA */
                auto h_ready = [&] {
                    fence_proxy_async_global();
                    if (p.trace && !ghost)
                        p.trace[u * TRACE_WORDS + 2] = global_ns();
                };
                if constexpr (ONE) {
                    /* the unit's own H first: X and W_up (W_gate) tiles of each n-tile of its d_ff range */
                    for (int n0 = sp * KS2 * SW_COLS; n0 < cmin(C::N, (sp + 1) * KS2 * SW_COLS); n0 += BN)
                        fill(c, u, 0, KT1, BYTES1 - X_BYTES + x_bytes(m0), after_prev,
                             [&](unsigned char *st, uint64_t *bar, int kb) { load_w1(st, bar, kb, n0); },
                             [&](unsigned char *st, uint64_t *bar, int kb) { load_x(st, bar, kb, m0); },
                             [&] { griddep_wait(); });
                    after_prev = true;
                }
                bool now = ONE || !own_t || ld_acquire_gpu(ready) >= tiles_in(sp);
                if (now && own_t && !ONE)
                    h_ready();
                const uint32_t bytes = (own_t && !ONE ? TOK : 0) + (own_w ? BL * SW_ROW_BYTES : 0);
                if constexpr (STEAL) { /* the slice's l-tiles, as long as the helpers leave some */
                    int *take = sync_of(t.row, TAKE + sp);
                    int k = atomic_add_relaxed_gpu(take, 1);
                    while (k < LT) {
                        red_relaxed_gpu_add(p.sync + TAKEN, 1);
                        const int next = atomic_add_relaxed_gpu(take, 1); /* in flight while k is requested */
                        fill(c, k, sp * KS2, cmin(KT2, (sp + 1) * KS2), bytes, true,
                             [&](unsigned char *st, uint64_t *bar, int kb) {
                                 load_rows(st + X_BYTES, &p.w_down, bar, kb, k * BL, BL, false);
                             },
                             [](unsigned char *, uint64_t *, int) {}, [] {});
                        k = next;
                    }
                    mark(c, END);
                } else
                for (int l_t = t.tile * LSPAN; l_t < cmin(LT, (t.tile + 1) * LSPAN); l_t++) {
                    fill(c, tagged, sp * KS2, cmin(KT2, (sp + 1) * KS2), bytes, now,
                         [&](unsigned char *st, uint64_t *bar, int kb) {
                             if (own_w)
                                 load_rows(st + X_BYTES, &p.w_down, bar, kb, l_t * BL, BL, PAIR == PAIR_ROWS,
                                           weights_once());
                         },
                         [&](unsigned char *st, uint64_t *bar, int kb) {
                             if (own_t && !ONE)
                                 load_rows(st, &p.h, bar, kb, m0, BM, PAIR == PAIR_TILES);
                         },
                         [&] {
                             wait_flag(ready, tiles_in(sp));
                             h_ready();
                         });
                    now = true;
                }
                if (p.trace && !ghost)
                    p.trace[u * TRACE_WORDS + 8] = global_ns();
            }
            q = -1;
        }
    }

    /* ---------------- consumers ---------------- */

    FUSER_DEVICE int row_of(int h) const { return m0 + (MT == 2 ? 64 * w : 0) + 16 * warp + lane / 4 + 8 * h; }
    template <int NW>
    FUSER_DEVICE int col_of(int j) const { return (MT == 2 ? 0 : NW * w) + 8 * j + 2 * (lane % 4); }

    /* The A and B operands of K step kb of a unit whose first step is k0, in slot c.stage: A this consumer's
     * 64 token rows (or, swap-AB, 64 weight rows), B its columns (or the tokens). The token tiles are the
     * slots' (X or H by TMA) or, at own_tokens, the unit's H in shared memory, one tile per K step. */
    template <int NW>
    FUSER_DEVICE void operands(const Cursor<STAGES> &c, int kb, int k0, uint32_t own_tokens, uint32_t &a,
                               uint32_t &b) const
    {
        const uint32_t st = smem_addr(s.stage[c.stage]);
        const uint32_t w_rows = st + X_BYTES + (SWAP ? w * 64 : MT == 2 ? 0 : w * NW) * SW_ROW_BYTES;
        const uint32_t tokens =
            (own_tokens ? own_tokens + (kb - k0) * TOK : st) + (MT == 2 ? w * 64 * SW_ROW_BYTES : 0);
        a = SWAP ? w_rows : tokens;
        b = SWAP ? tokens : w_rows;
    }

    FUSER_DEVICE void wait_slot(const Cursor<STAGES> &c, bool timed, uint64_t &waited) const
    {
        if (timed) {
            const uint64_t t0 = global_ns();
            consume_wait(s.ring, c);
            waited += global_ns() - t0;
        } else {
            consume_wait(s.ring, c);
        }
    }

    /* Run the K steps [k0, k1) of one unit into acc (and acc2 when TWO: the gate tile after the up tile,
     * b_rows rows on). The token tiles are the slots' or, at own_tokens, tiles in shared memory the
     * consumers wrote. */
    template <int NW, bool TWO, int R>
    FUSER_DEVICE void mainloop(Cursor<STAGES> &c, int k0, int k1, int b_rows, float (&acc)[R], float (&acc2)[R],
                               uint64_t *trace, uint32_t own_tokens = 0) const
    {
        uint64_t waited = 0; /* traced: ns this thread waited for full slots after the unit's first */
        if (k0 >= k1) {
#pragma unroll
            for (int i = 0; i < R; i++)
                acc[i] = acc2[i] = 0.f;
            return;
        }
        if constexpr (Q) {
            promoted_steps<NW, TWO>(c, k0, k1, b_rows, acc, acc2, trace != nullptr, waited, own_tokens);
        } else {
            int prev = -1;
            /* not unrolled: an unrolled copy puts the (one-thread) slot release between wgmma groups, where
             * ptxas serialises the MMAs (C7520); the wait written out, not wait_slot, whose call ptxas
             * schedules differently here */
#pragma unroll 1
            for (int kb = k0; kb < k1; kb++, c.next()) {
                if (trace && kb > k0) {
                    const uint64_t t0 = global_ns();
                    consume_wait(s.ring, c);
                    waited += global_ns() - t0;
                } else {
                    consume_wait(s.ring, c);
                }
                uint32_t a, b;
                operands<NW>(c, kb, k0, own_tokens, a, b);
                const uint32_t second = b_rows * SW_ROW_BYTES; /* the gate tile, after the up tile */
                wgmma_fence();
                mma_k64<DT, NW>(acc, a, b, kb > k0);
                if constexpr (TWO)
                    mma_k64<DT, NW>(acc2, SWAP ? a + second : a, SWAP ? b : b + second, kb > k0);
                wgmma_commit();
                wgmma_wait<1>();
                if (prev >= 0)
                    release(prev);
                prev = c.stage;
            }
            wgmma_wait<0>();
            fence_operands(acc);
            if constexpr (TWO)
                fence_operands(acc2);
            release(prev);
        }
        if (trace) {
            trace[6] = global_ns();
            trace[7] = waited;
        }
    }

    /* Fresh sums of a quantized chain's K step (promoted_steps): two for gated tiles of up to 64 tokens, one
     * for wider gated tiles (whose four would not fit beside both parts' accumulators) and plain ones. */
    static constexpr int SUMS = C::GATED && BM <= 64 ? 2 : 1;

    /* A quantized chain's K steps (always swap-AB): e4m3 MMAs keep their sums in fewer bits than fp32
     * (DeepGEMM's "promotion"), so each K step (4 MMAs of k32) starts a sum of its own per part, added to
     * the part's fp32 accumulators once the step's MMAs are done. With two sums (SUMS) each part is a commit
     * group of its own and the up part's sum is added while the gate part's MMAs run; with one, the gate
     * part (if any) reuses the sum after the up part's is added. Nothing is in flight across the loop's back
     * edge: ptxas serialises MMAs whose sums are read while other groups are in flight there (C7514). */
    template <int NW, bool TWO, int R>
    FUSER_DEVICE void promoted_steps(Cursor<STAGES> &c, int k0, int k1, int b_rows, float (&acc)[R],
                                     float (&acc2)[R], bool timed, uint64_t &waited, uint32_t own_tokens) const
    {
        constexpr int NS = TWO ? SUMS : 1;
        float s0[R], s1[NS == 2 ? R : 1];
#pragma unroll
        for (int i = 0; i < R; i++)
            acc[i] = acc2[i] = 0.f;
        const uint32_t second = b_rows * SW_ROW_BYTES; /* the gate tile, after the up tile */
        uint32_t a, b;
        auto add = [&](float (&s)[R], float (&to)[R]) {
            fence_operands(s);
#pragma unroll
            for (int i = 0; i < R; i++)
                to[i] += s[i];
        };
        /* not unrolled: as the 16-bit loop (C7520) */
#pragma unroll 1
        for (int kb = k0; kb < k1; kb++, c.next()) {
            wait_slot(c, timed && kb > k0, waited);
            operands<NW>(c, kb, k0, own_tokens, a, b);
            wgmma_fence();
            mma_k64<DT, NW>(s0, a, b, 0);
            wgmma_commit();
            if constexpr (NS == 2) {
                wgmma_fence();
                mma_k64<DT, NW>(s1, a + second, b, 0);
                wgmma_commit();
                wgmma_wait<1>();
                add(s0, acc);
                wgmma_wait<0>();
                add(s1, acc2);
            } else {
                wgmma_wait<0>();
                add(s0, acc);
                if constexpr (TWO) {
                    wgmma_fence();
                    mma_k64<DT, NW>(s0, a + second, b, 0);
                    wgmma_commit();
                    wgmma_wait<0>();
                    add(s0, acc2);
                }
            }
            release(c.stage);
        }
    }

    FUSER_DEVICE void consumers_sync() const { named_sync(1, 256); }

    /* A quantized chain, before any unit: x (bfloat16) as e4m3 x (1 / s_x) into xbuf, by the consumers of
     * every block, a slice of XSLICE 16-element chunks at a time, claimed from a counter (so it needs no block
     * but the running ones); each stored slice counted with a release (XDONE), which phase 1's producers
     * acquire before their X tiles. Each thread converts 16 consecutive elements (32 bytes in, 16 out). */
    FUSER_DEVICE void quantize_x() const
    {
        griddep_wait(); /* x is the previous kernel's */
        const int64_t chunks = xchunks();
        const int slices = xslices();
        const float inv = fast_rcp(__ldg(p.scale[0]));
        for (;;) {
            if (lt == 0)
                s.xslice = atomic_add_relaxed_gpu(p.sync + XCLAIM, 1);
            consumers_sync();
            const int j = s.xslice;
            if (j >= slices)
                break;
            const int64_t end = cmin((int64_t)(j + 1) * XSLICE, chunks);
            for (int64_t i = (int64_t)j * XSLICE + lt; i < end; i += 256) {
                const uint4 *src = (const uint4 *)(p.xin + 16 * i);
                const uint4 lo = __ldg(src), hi = __ldg(src + 1);
                const uint32_t in[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
                uint32_t out[4];
#pragma unroll
                for (int k = 0; k < 4; k++) { /* four bf16 pairs -> four e4m3 bytes */
                    const uint32_t a = e4m3x2(to_float<DT_BF16>((uint16_t)(in[2 * k] & 0xffff)) * inv,
                                              to_float<DT_BF16>((uint16_t)(in[2 * k] >> 16)) * inv);
                    const uint32_t b = e4m3x2(to_float<DT_BF16>((uint16_t)(in[2 * k + 1] & 0xffff)) * inv,
                                              to_float<DT_BF16>((uint16_t)(in[2 * k + 1] >> 16)) * inv);
                    out[k] = a | b << 16;
                }
                *(uint4 *)((uint8_t *)p.xbuf + 16 * i) = make_uint4(out[0], out[1], out[2], out[3]);
            }
            consumers_sync(); /* every store of the slice, and every read of s.xslice, before the count */
            if (lt == 0)
                red_release_gpu_add(p.sync + XDONE, 1);
        }
    }

    /* This warp no longer reads the slot: its tiles (wgmma) or its unit id. Every consumer warp arrives
     * (the warp's reads ordered before its lanes' arrives), in pairs in both blocks, so a producer
     * refills or rewrites the slot only after all of them. */
    FUSER_DEVICE void release(int stage) const
    {
        __syncwarp();
        consume_release<CS>(s.ring, stage, lane);
    }

    /* A ghost unit (the partner's unit u): its slots hold only the shared tiles, for the partner; wait
     * for each (the partner's loads land here too) and release it. */
    FUSER_DEVICE void idle(Cursor<STAGES> &c, int u) const
    {
        const bool one = u < u1();
        const int sp = one ? unit1(u).split : unit2(u - u1()).split;
        const int k0 = sp * (one ? KS1 : KS2), k1 = cmin(one ? KT1 : KT2, k0 + (one ? KS1 : KS2));
        for (int kb = k0; kb < k1; kb++, c.next()) {
            consume_wait(s.ring, c);
            release(c.stage);
        }
    }

    /* After this unit's fp32 partial is in the workspace: take a ticket; true (in every consumer thread)
     * when this was the last of `splits` partials of the tile. */
    FUSER_DEVICE bool last_of(int *ticket, int splits) const
    {
        consumers_sync();
        if (lt == 0)
            s.last = atomic_add_gpu(ticket, 1) == splits - 1; /* acq_rel: publishes the block's partial */
        consumers_sync();
        return s.last != 0;
    }

    /* Swap-AB fragments: element i of a consumer's accumulator is (token, feature) = (token_of(i),
     * feature_of(i)) of its 64-row block of the tile (columns: tokens). */
    FUSER_DEVICE int token_of(int i) const { return m0 + 8 * (i / 4) + 2 * (lane % 4) + (i & 1); }
    FUSER_DEVICE int feature_of(int i) const { return 64 * w + 16 * warp + lane / 4 + 8 * ((i >> 1) & 1); }

    /* Whether this consumer thread's fragment holds a token row of the problem: with tokens on the M side
     * a thread's accumulators are two rows (row_of(0), row_of(1) = row_of(0) + 8), and a fragment of
     * padding rows (a row tile with fewer than BM tokens) is never stored as H or y. */
    FUSER_DEVICE bool frag_live() const { return SWAP || row_of(0) < p.m; }

    /* Split partials, in the accumulators' own order: a tile's partial is FRAG floats, R per consumer
     * thread, kept as [R / 4][256 threads][4] so each float4 store or load of a warp covers 512 contiguous
     * bytes (a [row][column] layout made each warp instruction write 8 rows of 32 bytes). The fragments of
     * padding rows are neither stored nor summed (frag_sum), so a few tokens move a few rows' partials;
     * with swap-AB every element is stored (the tokens are the columns). */
    template <int R>
    FUSER_DEVICE void store_frag(const float (&acc)[R], float *tile) const
    {
        static_assert(R % 4 == 0, "float4 pieces");
        const bool live = frag_live(); /* (predicated stores: no branch around them) */
#pragma unroll
        for (int i = 0; i < R; i += 4)
            st_global_if(live, (float4 *)(tile + ((int64_t)(i / 4) * 256 + lt) * 4),
                         make_float4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]));
    }

    /* The last split of a swap-AB tile (a few accumulators): acc = the SPLITS partials at tile + sp * stride
     * summed in split order (this thread's fragment, frag_sum chunk by chunk). */
    template <int SPLITS, int R>
    FUSER_DEVICE void sum_frags(float (&acc)[R], const float *tile, int64_t stride) const
    {
        const float *sums = launder(tile);
        if constexpr (SPLITS * R / 4 <= 32 && R < 64) { /* every load in flight at once (not beside 64 sums) */
#pragma unroll
            for (int j = 0; j < R / 4; j++) {
                const float4 t = frag_sum<SPLITS>(sums, stride, j);
                acc[4 * j] = t.x, acc[4 * j + 1] = t.y, acc[4 * j + 2] = t.z, acc[4 * j + 3] = t.w;
            }
        } else { /* that many would spill: a few splits' loads in flight at a time (one beside 64 sums), the same
                  * sums in the same order */
            constexpr int AHEAD = R < 64 ? 4 : 1;
#pragma unroll
            for (int j = 0; j < R / 4; j++) {
                const float4 t = ld_cg_f4_relaxed(sums + ((int64_t)j * 256 + lt) * 4);
                acc[4 * j] = t.x, acc[4 * j + 1] = t.y, acc[4 * j + 2] = t.z, acc[4 * j + 3] = t.w;
            }
#pragma unroll AHEAD
            for (int sp = 1; sp < SPLITS; sp++)
#pragma unroll
                for (int j = 0; j < R / 4; j++) {
                    const float4 v = ld_cg_f4_relaxed(sums + sp * stride + ((int64_t)j * 256 + lt) * 4);
                    acc[4 * j] += v.x, acc[4 * j + 1] += v.y, acc[4 * j + 2] += v.z, acc[4 * j + 3] += v.w;
                }
        }
    }

    /* E biases from column n on (zeros without the bias). Epilogues load every bias they need before
     * their first store: H and Y are 16-bit like the biases, so a bias load after a store of the same
     * type cannot be moved above it (they may alias), and each would pay its own L2 round trip. */
    template <bool HAS, int E>
    static FUSER_DEVICE void bias(const uint16_t *b, int n, float (&v)[E])
    {
#pragma unroll
        for (int e = 0; e < E; e++)
            v[e] = HAS ? to_float<DTO>(__ldg(b + n + e)) : 0.f;
    }

    /* The biases of columns n and n + 1 (n even), as they are stored (zero without the bias). */
    template <bool HAS>
    static FUSER_DEVICE uint32_t bias2(const uint16_t *b, int n)
    {
        return HAS ? __ldg((const unsigned int *)(b + n)) : 0u;
    }
    static FUSER_DEVICE void unpack2(uint32_t v, float (&f)[2])
    {
        f[0] = to_float<DTO>((uint16_t)(v & 0xffff));
        f[1] = to_float<DTO>((uint16_t)(v >> 16));
    }

    /* v + b where the bias exists (adding a zero bias is not free: x + 0 is an instruction, -0 + 0 = +0) */
    template <bool HAS>
    static FUSER_DEVICE float plus(float v, float b) { return HAS ? v + b : v; }

    /* act(up + bu) (gated: act(gate + bg) * (up + bu)) of E values. */
    template <int E>
    static FUSER_DEVICE void h_values(const float (&up)[E], const float (&gate)[E], const float (&bu)[E],
                                      const float (&bg)[E], float (&v)[E])
    {
#pragma unroll
        for (int e = 0; e < E; e++) {
            const float a = plus<C::BIAS_UP>(up[e], bu[e]);
            v[e] = C::GATED ? activate<C::ACT>(plus<C::BIAS_GATE>(gate[e], bg[e])) * a : activate<C::ACT>(a);
        }
    }

    /* H[row][n] = h_values, rounded (quantized: h_values x inv_h to e4m3); stored only where `ok` (the row
     * and column in the output), computed everywhere (st_global_if). */
    FUSER_DEVICE void store_h(bool ok, HT *dst, float up, float gate, float bu, float bg, float inv_h = 1.f) const
    {
        float v[1];
        h_values<1>({up}, {gate}, {bu}, {bg}, v);
        if constexpr (Q)
            st_global_if(ok, dst, to_e4m3(v[0] * inv_h));
        else
            store16(ok, dst, v[0]);
    }
    FUSER_DEVICE HT *h_at(int row, int n) const { return (HT *)p.hbuf + (int64_t)row * C::N + n; }

    /* Y[row][l] = v + bd, rounded; stored only where `ok`. */
    FUSER_DEVICE void store_y(bool ok, uint16_t *dst, float v, float bd) const
    {
        store16(ok, dst, plus<C::BIAS_DOWN>(v, bd));
    }
    FUSER_DEVICE uint16_t *y_at(int row, int l) const { return p.y + (int64_t)row * C::L + l; }

    /* A consumer's fragment tile, rounded to 16 bits, into the [rows][width] matrix `out`: chunk j (column
     * pair c0 + col_of<NW>(j) and the next, in row row_of(0) then row_of(1): the accumulators' order) is
     * value(j, f) in fp32; only rows in the tokens and columns below `limit` are stored, every value is
     * computed. The 4 lanes of a quad trade pairs (quad_transpose) so that each stores 8 consecutive
     * columns: 16-byte stores filling whole 32-byte sectors, where a lane's own pairs would take four
     * 4-byte stores that each write half a sector. */
    template <int NW, class V>
    FUSER_DEVICE void store_tile(uint16_t *out, int width, int c0, int limit, V value) const
    {
        static_assert(NW % 8 == 0, "whole chunks of 8 columns");
        const int q = lane % 4;
        /* the first of a lane's 8 columns (pair group q), in each of its two rows */
        const int c = c0 + col_of<NW>(0) + 6 * q;
        uint16_t *const at[2] = {out + (int64_t)row_of(0) * width + c, out + (int64_t)row_of(1) * width + c};
        const bool rows_in[2] = {row_of(0) < p.m, row_of(1) < p.m};
#pragma unroll
        for (int g = 0; g < NW / 32; g++) {
            uint32_t v[2][4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float f[4];
                value(4 * g + k, f);
                v[0][k] = pack2<DTO>(f[0], f[1]);
                v[1][k] = pack2<DTO>(f[2], f[3]);
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                quad_transpose(v[h], q);
                st_global_if(rows_in[h] && c + 32 * g < limit, (uint4 *)(at[h] + 32 * g),
                             make_uint4(v[h][0], v[h][1], v[h][2], v[h][3]));
            }
        }
        /* a width that is not a multiple of 32 (48, 56, 112): its last chunks as each lane's own pairs, 4 bytes a
         * store */
#pragma unroll
        for (int j = NW / 32 * 4; j < NW / 8; j++) {
            float f[4];
            value(j, f);
            const int cj = c0 + col_of<NW>(j);
#pragma unroll
            for (int h = 0; h < 2; h++)
                st_global_if(rows_in[h] && cj < limit, (uint32_t *)(out + (int64_t)row_of(h) * width + cj),
                             pack2<DTO>(f[2 * h], f[2 * h + 1]));
        }
    }

    /* Chunk j of a tile's SPLITS partials at tile + sp * stride (store_frag's order), summed in split order:
     * L2 loads (`.cg`: other blocks wrote them) through a pointer laundered after the ticket's barrier. */
    template <int SPLITS>
    FUSER_DEVICE float4 frag_sum(const float *tile, int64_t stride, int j) const
    {
        /* a fragment of padding rows (its sum is never stored) reads the chunk of its warp's first lane (the
         * warp's lowest rows) instead of its own: no branch, and a warp's loads cost only its live lanes' */
        const int at = frag_live() ? lt : lt & ~31;
        float4 t = ld_cg_f4_relaxed(tile + ((int64_t)j * 256 + at) * 4);
#pragma unroll
        for (int sp = 1; sp < SPLITS; sp++) {
            const float4 v = ld_cg_f4_relaxed(tile + sp * stride + ((int64_t)j * 256 + at) * 4);
            t.x += v.x, t.y += v.y, t.z += v.z, t.w += v.w;
        }
        return t;
    }

    /* One fp32 value rounded to 16 bits, stored where `ok` (swap-AB's epilogues: a value per element). */
    static FUSER_DEVICE void store16(bool ok, uint16_t *dst, float v)
    {
        st_global_if(ok, dst, (uint16_t)(pack2<DTO>(v, 0.f) & 0xffff));
    }

    /* where consumer thread 0 records its unit's mainloop (null: no trace, or another thread) */
    FUSER_DEVICE uint64_t *unit_trace(int u) const { return p.trace && lt == 0 ? p.trace + u * TRACE_WORDS : nullptr; }

    FUSER_DEVICE void phase1(Cursor<STAGES> &c, int u) const
    {
        const Unit t = unit1(u);
        const int nt = t.tile, sp = t.split;
        float up[NW1 / 2], gate[NW1 / 2];
        mainloop<NW1, C::GATED>(c, sp * KS1, cmin(KT1, (sp + 1) * KS1), BN, up, gate, unit_trace(u));
        const int n0 = nt * BN;
        if constexpr (S1 > 1) {
            /* this split's partials; the last split sums them all into up (and gate), then stores H */
            constexpr int64_t TILE = (int64_t)BM * BN;
            float *tile = p.ws + ((int64_t)t.row * NT1 + nt) * S1 * PARTS * TILE;
            store_frag(up, tile + sp * PARTS * TILE);
            if constexpr (C::GATED)
                store_frag(gate, tile + (sp * PARTS + 1) * TILE);
            if (!last_of(sync_of(t.row, TICKETS1 + nt), S1))
                return;
            if (lt == 0) /* every split has arrived: the ticket is zero again for the next launch */
                store_relaxed_gpu(sync_of(t.row, TICKETS1 + nt), 0);
            if constexpr (!SWAP) { /* H straight from the summed partials, chunk by chunk */
                const float *sums = launder(tile);
                store_tile<NW1>((uint16_t *)p.hbuf, C::N, n0, C::N, [&](int j, float (&f)[4]) {
                    const float4 u = frag_sum<S1>(sums, PARTS * TILE, j);
                    const float4 g = C::GATED ? frag_sum<S1>(sums + TILE, PARTS * TILE, j) : u;
                    const int n = cmin(n0 + col_of<NW1>(j), C::N - 2);
                    float bu[2], bg[2];
                    unpack2(bias2<C::BIAS_UP>(p.b_up, n), bu);
                    unpack2(bias2<C::BIAS_GATE>(p.b_gate, n), bg);
                    h_values<2>({u.x, u.y}, {g.x, g.y}, bu, bg, *(float (*)[2])&f[0]);
                    h_values<2>({u.z, u.w}, {g.z, g.w}, bu, bg, *(float (*)[2])&f[2]);
                });
                publish1(t.row, n0);
                return;
            }
            sum_frags<S1>(up, tile, PARTS * TILE);
            if constexpr (C::GATED)
                sum_frags<S1>(gate, tile + TILE, PARTS * TILE);
        }
        if constexpr (SWAP) {
            /* a thread's features: feature_of(i) for i % 4 < 2 and for i % 4 >= 2 */
            float bu[2], bg[2], su[2] = {1.f, 1.f}, sg[2] = {1.f, 1.f}, inv_h = 1.f;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int n = cmin(n0 + feature_of(2 * h), C::N - 1);
                float u[1], g[1];
                bias<C::BIAS_UP>(p.b_up, n, u);
                bias<C::BIAS_GATE>(p.b_gate, n, g);
                bu[h] = u[0], bg[h] = g[0];
                if constexpr (Q) {
                    const float sx = __ldg(p.scale[0]);
                    su[h] = sx * __ldg(p.scale[1] + n);
                    if constexpr (C::GATED)
                        sg[h] = sx * __ldg(p.scale[2] + n);
                }
            }
            if constexpr (Q)
                inv_h = fast_rcp(__ldg(p.scale[4]));
#pragma unroll
            for (int i = 0; i < NW1 / 2; i++) {
                const int t = token_of(i), n = n0 + feature_of(i), h = (i >> 1) & 1;
                if constexpr (Q)
                    store_h(t < p.m && n < C::N, h_at(t, n), up[i] * su[h], gate[i] * sg[h], bu[h], bg[h], inv_h);
                else
                    store_h(t < p.m && n < C::N, h_at(t, n), up[i], gate[i], bu[h], bg[h]);
            }
        } else {
            /* the biases of the thread's column pairs first (16-bit pairs, every load before the first store) */
            uint32_t bu[NW1 / 8], bg[NW1 / 8];
#pragma unroll
            for (int j = 0; j < NW1 / 8; j++) {
                const int n = cmin(n0 + col_of<NW1>(j), C::N - 2);
                bu[j] = bias2<C::BIAS_UP>(p.b_up, n);
                bg[j] = bias2<C::BIAS_GATE>(p.b_gate, n);
            }
            store_tile<NW1>((uint16_t *)p.hbuf, C::N, n0, C::N, [&](int j, float (&f)[4]) {
                float bu2[2], bg2[2];
                unpack2(bu[j], bu2);
                unpack2(bg[j], bg2);
#pragma unroll
                for (int h = 0; h < 2; h++)
                    h_values<2>({up[4 * j + 2 * h], up[4 * j + 2 * h + 1]}, {gate[4 * j + 2 * h], gate[4 * j + 2 * h + 1]},
                                bu2, bg2, *(float (*)[2])&f[2 * h]);
            });
        }
        publish1(t.row, n0);
    }

    /* Publish the n-tile at column n0 of row tile `row`: every consumer's stores of it, then one release per
     * phase-2 split it feeds (the barrier orders the other threads' stores before it). */
    FUSER_DEVICE void publish1(int row, int n0) const
    {
        consumers_sync();
        if (lt == 0) {
            const int last_step = (cmin(C::N, n0 + BN) - 1) / KCOLS;
            for (int sp2 = n0 / KCOLS / KS2; sp2 <= last_step / KS2; sp2++)
                red_release_gpu_add(sync_of(row, READY + sp2), 1);
        }
    }

    /* One phase: H[rows, d_ff range of split sp] into s.hs, n-tile by n-tile (a phase-1 unit's main loop
     * over the whole K), activated and rounded as phase 1 stores it, at the place TMA would put the H
     * buffer's tiles: K step j of the range is an MP x 64 tile, row r's 16-byte chunk q at chunk q ^ (r % 8)
     * (the 128-byte swizzle). Columns beyond d_ff are zeros (their W_down columns are too). */
    FUSER_DEVICE void local_h(Cursor<STAGES> &c, int sp) const
    {
        const int n_lo = sp * KS2 * SW_COLS, n_hi = cmin(C::N, n_lo + KS2 * SW_COLS);
        consumers_sync(); /* every warp has finished reading the previous unit's H */
        for (int n0 = n_lo; n0 < n_hi; n0 += BN) {
            float up[NW1 / 2], gate[NW1 / 2];
            mainloop<NW1, C::GATED>(c, 0, KT1, BN, up, gate, nullptr);
            /* 2 consecutive d_ff columns (n even) of token row r (of the tile) */
            auto put = [&](int r, int n, const float (&f)[2]) {
                const int rel = n - n_lo, col = rel % SW_COLS;
                const uint32_t off = rel / SW_COLS * TOK + r * SW_ROW_BYTES +
                                     (((col / 8) ^ (r % 8)) * 16 + col % 8 * 2);
                const uint32_t v = n < C::N ? pack2<DT>(f[0], f[1]) : 0u;
                *(uint32_t *)(s.hs + off) = v;
                if (STEAL && n < C::N && m0 + r < p.m) /* and to the H buffer, for the helpers */
                    *(uint32_t *)h_at(m0 + r, n) = v;
            };
            if constexpr (SWAP) {
                /* element i: (token_of(i), feature_of(i)); the pair partner (next feature) is in lane + 4:
                 * a thread stores its value and its partner's, even features only */
#pragma unroll
                for (int i = 0; i < NW1 / 2; i++) {
                    const int n = cmin(n0 + feature_of(i), C::N - 1);
                    float bu[1], bg[1], v[1];
                    bias<C::BIAS_UP>(p.b_up, n, bu);
                    bias<C::BIAS_GATE>(p.b_gate, n, bg);
                    h_values<1>({up[i]}, {gate[i]}, bu, bg, v);
                    const float other = __shfl_down_sync(0xffffffffu, v[0], 4);
                    if ((lane / 4) % 2 == 0)
                        put(token_of(i) - m0, n0 + feature_of(i), {v[0], other});
                }
            } else {
#pragma unroll
                for (int j = 0; j < NW1 / 8; j++) {
                    const int n = cmin(n0 + col_of<NW1>(j), C::N - 2);
                    float bu[2], bg[2];
                    unpack2(bias2<C::BIAS_UP>(p.b_up, n), bu);
                    unpack2(bias2<C::BIAS_GATE>(p.b_gate, n), bg);
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        float f[2];
                        h_values<2>({up[4 * j + 2 * h], up[4 * j + 2 * h + 1]},
                                    {gate[4 * j + 2 * h], gate[4 * j + 2 * h + 1]}, bu, bg, f);
                        put(row_of(h) - m0, n0 + col_of<NW1>(j), f);
                    }
                }
            }
        }
        fence_proxy_async_smem(); /* the stores, before wgmma (the async proxy) reads them */
        consumers_sync();
    }

    FUSER_DEVICE void phase2(Cursor<STAGES> &c, int u) const
    {
        const Unit t = unit2(u);
        const int sp = t.split;
        if constexpr (ONE)
            local_h(c, sp);
        if constexpr (STEAL) {
            if (lt == 0) /* the slice's H is in the H buffer (local_h's barrier ordered every store) */
                red_release_gpu_add(sync_of(t.row, READY + sp), 1);
            int done = 0;
            for (;; done++) { /* the l-tiles the producer took, then its END */
                consume_wait(s.ring, c);
                const int l_t = s.unit[c.stage];
                if (l_t == END) {
                    release(c.stage);
                    c.next();
                    break;
                }
                float acc[NW2 / 2];
                mainloop<NW2, false>(c, sp * KS2, cmin(KT2, (sp + 1) * KS2), 0, acc, acc, unit_trace(u1() + u),
                                     smem_addr(s.hs));
                finish2(acc, t.row, l_t, sp);
            }
            count_summed(done);
            return;
        }
        for (int i = 0; i < LSPAN; i++) { /* (a constant trip count: one l-tile compiles as straight code) */
            const int l_t = t.tile * LSPAN + i;
            if (l_t >= LT)
                break;
            float acc[NW2 / 2];
            mainloop<NW2, false>(c, sp * KS2, cmin(KT2, (sp + 1) * KS2), 0, acc, acc, unit_trace(u1() + u),
                                 ONE ? smem_addr(s.hs) : 0u);
            finish2(acc, t.row, l_t, sp);
        }
        if constexpr (ROWSUM && S2 > 1)
            count_summed(1);
    }

    /* A quantized chain's phase-2 scale of output feature l: s_h s_down[l] */
    FUSER_DEVICE float down_scale(int l) const { return __ldg(p.scale[4]) * __ldg(p.scale[3] + l); }

    /* Phase 2's split partials in the workspace, after phase 1's (if any) */
    FUSER_DEVICE float *partials2() const
    {
        return p.ws + (S1 > 1 ? (int64_t)S1 * PARTS * rt() * BM * NT1 * BN : 0);
    }

    /* `n` more partials stored (every consumer's), counted with a release. */
    FUSER_DEVICE void count_summed(int n) const
    {
        consumers_sync();
        if (lt == 0 && n > 0)
            red_release_gpu_add(p.sync + SUMMED, n);
    }

    /* STEAL: one piece taken by this block as a helper: l-tile k of slice j, H from the slots. */
    FUSER_DEVICE void piece(Cursor<STAGES> &c, int id) const
    {
        const int j = id / LT, k = id % LT, row = j / S2, sp = j % S2;
        float acc[NW2 / 2];
        mainloop<NW2, false>(c, sp * KS2, cmin(KT2, (sp + 1) * KS2), 0, acc, acc, unit_trace(u2() + id), 0u);
        finish2(acc, row, k, sp);
    }

    /* GEMM2's epilogue for l-tile l_t of row tile `row`, split sp: y (+ b_down) from acc, or this split's
     * partial, and, in the last split to finish the tile, the sum of every split's. */
    FUSER_DEVICE void finish2(float (&acc)[NW2 / 2], int row, int l_t, int sp) const
    {
        const int l0 = l_t * BL;
        if constexpr (ROWSUM && S2 > 1) { /* the real token rows' partial, summed after every unit (consume) */
            float *mine = partials2() + (((int64_t)row * LT + l_t) * S2 + sp) * BM * BL; /* [token][feature] */
            float sd[2] = {1.f, 1.f}; /* a quantized chain's partials are scaled (the sum is linear) */
            if constexpr (Q)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    sd[h] = down_scale(cmin(l0 + feature_of(2 * h), C::L - 1));
#pragma unroll
            for (int i = 0; i < NW2 / 2; i++)
                if (token_of(i) < p.m)
                    mine[(token_of(i) - m0) * BL + feature_of(i)] = Q ? acc[i] * sd[(i >> 1) & 1] : acc[i];
            return;
        }
        if constexpr (S2 > 1 && !ROWSUM) {
            constexpr int64_t TILE = (int64_t)BM * BL;
            float *tile = partials2() + ((int64_t)row * LT + l_t) * S2 * TILE;
            store_frag(acc, tile + sp * TILE);
            if (!last_of(sync_of(row, TICKETS2 + l_t), S2))
                return;
            if (lt == 0) /* every split has arrived: the ticket is zero again for the next launch */
                store_relaxed_gpu(sync_of(row, TICKETS2 + l_t), 0);
            if constexpr (!SWAP) { /* y straight from the summed partials, chunk by chunk */
                const float *sums = launder(tile);
                store_tile<NW2>(p.y, C::L, l0, C::L, [&](int j, float (&f)[4]) {
                    const float4 v = frag_sum<S2>(sums, TILE, j);
                    float bd[2];
                    unpack2(bias2<C::BIAS_DOWN>(p.b_down, cmin(l0 + col_of<NW2>(j), C::L - 2)), bd);
                    f[0] = plus<C::BIAS_DOWN>(v.x, bd[0]), f[1] = plus<C::BIAS_DOWN>(v.y, bd[1]);
                    f[2] = plus<C::BIAS_DOWN>(v.z, bd[0]), f[3] = plus<C::BIAS_DOWN>(v.w, bd[1]);
                });
                return;
            }
            sum_frags<S2>(acc, tile, TILE);
        }
        if constexpr (SWAP) {
            float bd[2], sd[2] = {1.f, 1.f};
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float b[1];
                const int l = cmin(l0 + feature_of(2 * h), C::L - 1);
                bias<C::BIAS_DOWN>(p.b_down, l, b);
                bd[h] = b[0];
                if constexpr (Q)
                    sd[h] = down_scale(l);
            }
#pragma unroll
            for (int i = 0; i < NW2 / 2; i++) {
                const int t = token_of(i), l = l0 + feature_of(i);
                store_y(t < p.m && l < C::L, y_at(t, l), Q ? acc[i] * sd[(i >> 1) & 1] : acc[i], bd[(i >> 1) & 1]);
            }
        } else {
            uint32_t bd[NW2 / 8];
#pragma unroll
            for (int j = 0; j < NW2 / 8; j++)
                bd[j] = bias2<C::BIAS_DOWN>(p.b_down, cmin(l0 + col_of<NW2>(j), C::L - 2));
            store_tile<NW2>(p.y, C::L, l0, C::L, [&](int j, float (&f)[4]) {
                float bd2[2];
                unpack2(bd[j], bd2);
#pragma unroll
                for (int e = 0; e < 4; e++)
                    f[e] = plus<C::BIAS_DOWN>(acc[4 * j + e], bd2[e % 2]);
            });
        }
    }

    /* y = the sum of the S2 partials of every element + b_down, by every block after every unit is done:
     * y's E = M x L / 4 float4 elements, G threads each (a power of two up to 16 and S2: the one that makes
     * the fewest loads per thread, ties to the smaller), thread group g of a block summing splits
     * [g S2 / G, (g + 1) S2 / G) of its element in order, then the first group adding the G runs in order.
     * Within a group consecutive threads take consecutive elements (whole-sector loads). */
    FUSER_DEVICE void sum_partials() const
    {
        constexpr int64_t TILE = (int64_t)BM * BL;
        constexpr int Q = C::L / 4; /* float4 elements of a y row */
        const int E = p.m * Q, threads = (int)gridDim.x * 256;
        int G = 1;
        for (int g = 2; g <= 16 && g <= S2; g *= 2)
            if (ceil_div(E * g, threads) * ((S2 + g - 1) / g) < ceil_div(E * G, threads) * ((S2 + G - 1) / G))
                G = g;
        const int per = 256 / G, g = lt / per;
        const int lo = g * S2 / G, hi = (g + 1) * S2 / G;
        const float *ws = launder(partials2());
        /* element e's value in split 0's partial: row tile, l-tile, then [token][feature] */
        auto split0 = [&](int e) {
            const int token = e / Q, l = e % Q * 4;
            return ws + ((int64_t)(token / BM) * LT + l / BL) * S2 * TILE + (token % BM) * BL + l % BL;
        };
        auto store = [&](int e, float4 t) { /* y = t + b_down */
            const int token = e / Q, l = e % Q * 4;
            float b[4];
            bias<C::BIAS_DOWN, 4>(p.b_down, l, b);
            *(uint2 *)y_at(token, l) =
                make_uint2(pack2<DTO>(plus<C::BIAS_DOWN>(t.x, b[0]), plus<C::BIAS_DOWN>(t.y, b[1])),
                           pack2<DTO>(plus<C::BIAS_DOWN>(t.z, b[2]), plus<C::BIAS_DOWN>(t.w, b[3])));
        };
        if constexpr (S2 <= 16) {
            /* one group, several elements per thread (many tokens): R elements at a time, every split's load
             * of all of them in flight together, each element summed in split order as below */
            constexpr int R = cmax(1, 16 / S2);
            if (G == 1 && R > 1 && E > threads) {
                for (int base = (int)blockIdx.x * 256 * R; base < E; base += (int)gridDim.x * 256 * R) {
                    float4 v[R][S2];
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        const int e = base + r * 256 + lt;
#pragma unroll
                        for (int sp = 0; sp < S2; sp++)
                            v[r][sp] = e < E ? ld_cg_f4_relaxed(split0(e) + sp * TILE) : make_float4(0.f, 0.f, 0.f, 0.f);
                    }
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        float4 t = v[r][0];
#pragma unroll
                        for (int sp = 1; sp < S2; sp++)
                            t.x += v[r][sp].x, t.y += v[r][sp].y, t.z += v[r][sp].z, t.w += v[r][sp].w;
                        if (base + r * 256 + lt < E)
                            store(base + r * 256 + lt, t);
                    }
                }
                return;
            }
        }
        /* each thread's run of splits: in the ring's first slot, which no load fills after the last unit */
        float4 *red = (float4 *)s.stage[0];
        static_assert(STAGE_BYTES >= 256 * sizeof(float4), "a slot holds the block's runs");
        for (int base = (int)blockIdx.x * per; base < E; base += (int)gridDim.x * per) {
            const int e = base + lt % per;
            const float *at = split0(e);
            float4 t = make_float4(0.f, 0.f, 0.f, 0.f);
            if (e < E) {
                t = ld_cg_f4_relaxed(at + lo * TILE);
#pragma unroll 8
                for (int sp = lo + 1; sp < hi; sp++) {
                    const float4 v = ld_cg_f4_relaxed(at + sp * TILE);
                    t.x += v.x, t.y += v.y, t.z += v.z, t.w += v.w;
                }
            }
            if (G > 1) {
                red[lt] = t;
                consumers_sync();
                if (g == 0)
                    for (int j = 1; j < G; j++) {
                        const float4 v = red[j * per + lt];
                        t.x += v.x, t.y += v.y, t.z += v.z, t.w += v.w;
                    }
                consumers_sync(); /* every run read before the next element's are written */
            }
            if (g == 0 && e < E)
                store(e, t);
        }
    }

    FUSER_DEVICE void consume(int tid)
    {
        lt = tid - 128;
        w = lt / 128;
        warp = lt % 128 / 32;
        lane = lt % 32;
        Cursor<STAGES> c;
        int helped = 0; /* STEAL: pieces this block computed as a helper */
        if constexpr (Q)
            quantize_x();
        for (;;) {
            consume_wait(s.ring, c); /* the unit's first slot says which unit it is */
            const int u = s.unit[c.stage];
            if (u < 0)
                break;
            if (STEAL && (u & PIECE)) {
                const int id = u & ~PIECE;
                m0 = id / LT / S2 * BM;
                if (p.trace && lt == 0)
                    p.trace[(u2() + id) * TRACE_WORDS + 3] = global_ns();
                piece(c, id);
                helped++;
                if (p.trace && lt == 0)
                    p.trace[(u2() + id) * TRACE_WORDS + 4] = global_ns();
                continue;
            }
            if (PAIR != PAIR_NONE && (u & GHOST)) {
                idle(c, u & ~GHOST);
                continue;
            }
            if (p.trace && lt == 0)
                p.trace[u * TRACE_WORDS + 3] = global_ns();
            if (u < u1()) {
                m0 = unit1(u).row * BM;
                phase1(c, u);
            } else {
                m0 = unit2(u - u1()).row * BM;
                phase2(c, u - u1());
            }
            if (p.trace && lt == 0)
                p.trace[u * TRACE_WORDS + 4] = global_ns();
        }
        if constexpr (ROWSUM && S2 > 1) { /* every unit's partials, then this block's share of y */
            if constexpr (STEAL)
                count_summed(helped);
            if (lt == 0)
                wait_flag(p.sync + SUMMED, STEAL ? pieces() : u2());
            consumers_sync();
            sum_partials();
        }
        /* the last block out resets the ready counters and the claim counter for the next launch (every
         * poll and claim of this launch is over) */
        consumers_sync();
        if (lt == 0) {
            if (atomic_add_gpu(p.sync + DONE, 1) == (int)gridDim.x - 1) {
                for (int r = 0; r < rt(); r++)
                    for (int i = 0; i < S2; i++) {
                        store_relaxed_gpu(sync_of(r, READY + i), 0);
                        if constexpr (STEAL)
                            store_relaxed_gpu(sync_of(r, TAKE + i), 0);
                    }
                store_relaxed_gpu(p.sync + HELP, 0);
                store_relaxed_gpu(p.sync + TAKEN, 0);
                store_relaxed_gpu(p.sync + CLAIM, 0);
                store_relaxed_gpu(p.sync + SUMMED, 0);
                store_relaxed_gpu(p.sync + XCLAIM, 0);
                store_relaxed_gpu(p.sync + XDONE, 0);
                store_relaxed_gpu(p.sync + DONE, 0);
            }
        }
    }

    static FUSER_DEVICE void run(const StreamParams &p)
    {
        static_assert(sizeof(Smem) + 1023 <= C::SMEM_BYTES, "the plan's shared memory holds Smem, aligned to 1024");
        extern __shared__ __align__(1024) unsigned char smem_raw[];
        Smem &sm = *(Smem *)align_smem<1024>(smem_raw);
        const int tid = (int)threadIdx.x;
        if (tid == 0) {
            sm.ring.init(CS * CONSUMER_WARPS);
            mbar_init(&sm.box_full, 1);
            mbar_init(&sm.box_empty, 1);
            fence_mbar_init();
            tma_prefetch(&p.x);
            tma_prefetch(&p.w_up);
            if constexpr (C::GATED)
                tma_prefetch(&p.w_gate);
            tma_prefetch(&p.h);
            tma_prefetch(&p.w_down);
            if (p.x_tail_rows)
                tma_prefetch(&p.x_tail);
        }
        if constexpr (CS > 1)
            cluster_sync(); /* the partner's barriers exist before the first multicast or remote arrive */
        else
            __syncthreads();
        griddep_launch_dependents(); /* the next kernel's blocks may take SMs as this grid's blocks leave */
        /* each role builds its own view: values computed before the split would live across it and spill
         * in the producer's 40 registers */
        if (tid < 128) {
            setmaxnreg_dec<PRODUCER_REGS>();
            if (tid == 0)
                Stream(p, sm).produce();
        } else {
            setmaxnreg_inc<CONSUMER_REGS>();
            Stream(p, sm).consume(tid);
        }
        if constexpr (CS > 1)
            cluster_sync(); /* no block leaves while its partner may still load into it or arrive on its barriers */
    }
};

} // namespace fuser
