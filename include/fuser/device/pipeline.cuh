/* pipeline.cuh: the producer/consumer ring of the warp-specialised main loops. A STAGES-deep ring of
 * shared-memory slots, each with a `full` mbarrier (the producer's TMA loads complete their bytes on it)
 * and an `empty` mbarrier (each consumer, a warpgroup or a warp as the kernel counts them, arrives when it
 * no longer reads the slot; with multicast, the consumers of every block the slot's loads land in). Producer and consumers walk the
 * ring with their own (stage, phase) cursor; the producer starts one phase ahead, so its first pass
 * finds every slot free. */
#pragma once

#include "fuser/device/ptx_async.cuh"

namespace fuser {

template <int STAGES>
struct Ring {
    uint64_t full[STAGES];
    uint64_t empty[STAGES];

    /* Called by one thread before any use; the block (or cluster) synchronises afterwards. A slot fills
     * on `producer_arrivals` arrivals (one: the TMA producer's, whose loads complete the bytes it
     * announced; or every producer thread's when each copies its share with cp.async). */
    FUSER_DEVICE void init(uint32_t consumer_arrivals, uint32_t producer_arrivals = 1)
    {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], producer_arrivals);
            mbar_init(&empty[s], consumer_arrivals);
        }
        fence_mbar_init();
    }
};

/* A cursor over the ring: slot index, the parity of the pass the holder is in, and the slots it has passed up to
 * STAGES (below STAGES: still in the ring's first pass, where `stage` is that count). */
template <int STAGES>
struct Cursor {
    int stage = 0;
    uint32_t phase = 0;
    int passed = 0;
    FUSER_DEVICE void next()
    {
        passed += passed < STAGES;
        if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
        }
    }
};

/* Producer side: wait for slot `c.stage` to be free, then announce `bytes` of TMA loads on its full
 * barrier (the caller issues them next). */
template <int STAGES>
FUSER_DEVICE void produce_begin(Ring<STAGES> &r, const Cursor<STAGES> &c, uint32_t bytes)
{
    mbar_wait(&r.empty[c.stage], c.phase ^ 1);
    mbar_arrive_expect_tx(&r.full[c.stage], bytes);
}

/* Consumer side: wait until the slot's loads have landed. */
template <int STAGES>
FUSER_DEVICE void consume_wait(Ring<STAGES> &r, const Cursor<STAGES> &c)
{
    mbar_wait(&r.full[c.stage], c.phase);
}

/* Consumer side: the slot may be refilled. Called by the threads of lanes 0 .. CLUSTER - 1 of each
 * consumer (a warpgroup's first threads, or a warp's); with a cluster of CLUSTER blocks sharing multicast
 * loads, every block's producer must hear it: lane r arrives in block r. */
template <int CLUSTER, int STAGES>
FUSER_DEVICE void consume_release(Ring<STAGES> &r, int stage, int lane)
{
    if constexpr (CLUSTER == 1) {
        if (lane == 0)
            mbar_arrive(&r.empty[stage]);
    } else {
        if (lane < CLUSTER)
            mbar_arrive_cluster(&r.empty[stage], (uint32_t)lane);
    }
}

} // namespace fuser
