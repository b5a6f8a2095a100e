/* ptx_async.cuh: inline-PTX wrappers for Hopper's asynchronous data movement: mbarrier transaction
 * barriers, TMA tile loads (cp.async.bulk.tensor, optionally multicast to the blocks of a cluster), the
 * proxy fences that order ordinary and asynchronous accesses, and flag handshakes between blocks through
 * global memory. Each wrapper is one documented instruction; no CUDA headers. */
#pragma once

#include "fuser/device/common.cuh"
#include "fuser/device/ptx.cuh"

namespace fuser {

/* A TMA descriptor (CUtensorMap): 128 opaque bytes encoded on the host by cuTensorMapEncodeTiled and
 * passed inside the kernel's __grid_constant__ parameter struct (its address is then a generic address
 * of the parameter space, which is what the TMA instructions take). */
struct alignas(64) TensorMap {
    uint64_t opaque[16];
};

/* ---- mbarrier ---- */

FUSER_DEVICE void mbar_init(uint64_t *bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

/* Make barrier initialisation visible to the async proxy (TMA) and to the other blocks of the cluster. */
FUSER_DEVICE void fence_mbar_init()
{
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/* Arrive once and announce `bytes` more to come from asynchronous copies (one arrival per phase). */
FUSER_DEVICE void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}

FUSER_DEVICE void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

/* Arrive on the barrier at the same offset in block `rank` of the cluster (the .shared::cluster form on
 * a mapa'd address: the local form on a remote address is wrong). The default semantics (release at CTA
 * scope) are what a ring's slot release needs, the slot's reads being complete (wgmma waited for): the
 * .release.cluster form costs a MEMBAR.GPU per arrive, which stalls the releasing warp's next MMAs. */
FUSER_DEVICE void mbar_arrive_cluster(uint64_t *bar, uint32_t rank)
{
    asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}" ::"r"(smem_addr(bar)),
                 "r"(rank)
                 : "memory");
}

/* The same arrive, releasing this thread's earlier accesses at cluster scope (a hand-off, not a hot loop). */
FUSER_DEVICE void mbar_arrive_cluster_release(uint64_t *bar, uint32_t rank)
{
    asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
                 "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}" ::"r"(smem_addr(bar)),
                 "r"(rank)
                 : "memory");
}

/* Store v at the address of `dst` in block `rank`'s shared memory, then arrive on the barrier at `bar`'s
 * offset there, releasing the store at cluster scope (a waiter that acquires the phase reads v). */
FUSER_DEVICE void st_cluster_arrive(int *dst, int v, uint64_t *bar, uint32_t rank)
{
    asm volatile("{\n.reg .b32 rd, rb;\nmapa.shared::cluster.u32 rd, %0, %3;\nmapa.shared::cluster.u32 rb, %1, %3;\n"
                 "st.shared::cluster.u32 [rd], %2;\n"
                 "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [rb];\n}" ::"r"(smem_addr(dst)),
                 "r"(smem_addr(bar)), "r"(v), "r"(rank)
                 : "memory");
}

/* Wait until the phase with this parity has completed, acquiring at cluster scope what the arrivals of
 * other blocks released (st_cluster_arrive). */
FUSER_DEVICE void mbar_wait_cluster(uint64_t *bar, uint32_t parity)
{
    uint32_t ok = 0;
    while (!ok)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(ok)
                     : "r"(smem_addr(bar)), "r"(parity)
                     : "memory");
}

FUSER_DEVICE bool mbar_try_wait(uint32_t bar, uint32_t parity)
{
    uint32_t ok;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                 : "=r"(ok)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return ok != 0;
}

/* Wait until the phase with this parity has completed. try_wait suspends the thread for a
 * hardware-chosen time before returning false, so the loop does not hammer shared memory. */
FUSER_DEVICE void mbar_wait(uint64_t *bar, uint32_t parity)
{
    const uint32_t a = smem_addr(bar);
    while (!mbar_try_wait(a, parity)) {
    }
}

/* ---- TMA ---- */

FUSER_DEVICE void tma_prefetch(const TensorMap *map)
{
    asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

/* Load the box at (col, row) of a 2-D tensor map into shared memory at dst; completes `bytes` of the
 * transaction count of `bar`. Out-of-bounds elements are written as zero. */
FUSER_DEVICE void tma_load_2d(void *dst, const TensorMap *map, uint64_t *bar, int col, int row)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4}], [%2];" ::"r"(smem_addr(dst)),
                 "l"(map), "r"(smem_addr(bar)), "r"(col), "r"(row)
                 : "memory");
}

/* An L2 eviction policy for loads of data read once (evict first), or the default one (evict normal). */
FUSER_DEVICE uint64_t l2_policy(bool evict_first)
{
    uint64_t pol;
    if (evict_first)
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    else
        asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}

/* tma_load_2d with an L2 eviction policy (l2_policy) for the lines it reads. */
FUSER_DEVICE void tma_load_2d_hint(void *dst, const TensorMap *map, uint64_t *bar, int col, int row, uint64_t pol)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(dst)),
                 "l"(map), "r"(smem_addr(bar)), "r"(col), "r"(row), "l"(pol)
                 : "memory");
}

/* Copy `bytes` contiguous bytes (a multiple of 16, both addresses 16-byte aligned) from global memory at
 * src into shared memory at dst; completes `bytes` of the transaction count of `bar`. */
FUSER_DEVICE void bulk_load_1d(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}

/* The same load delivered to every block of the cluster in `mask` (bit r: rank r), at the same
 * shared-memory offset, completing on the barrier at the same offset in each. */
FUSER_DEVICE void tma_load_2d_multicast(void *dst, const TensorMap *map, uint64_t *bar, int col, int row,
                                        uint16_t mask)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(dst)),
                 "l"(map), "r"(smem_addr(bar)), "r"(col), "r"(row), "h"(mask)
                 : "memory");
}

/* ---- proxies and inter-block flags ---- */

/* Order this thread's ordinary global accesses with asynchronous-proxy (TMA) accesses to global memory. */
FUSER_DEVICE void fence_proxy_async_global()
{
    asm volatile("fence.proxy.async.global;" ::: "memory");
}

/* Order ordinary shared-memory writes before asynchronous-proxy (wgmma, TMA) reads of them. */
FUSER_DEVICE void fence_proxy_async_smem()
{
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

FUSER_DEVICE int ld_acquire_gpu(const int *p)
{
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

FUSER_DEVICE void red_release_gpu_add(int *p, int v)
{
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* Fire-and-forget counting and its relaxed read: orders nothing (a count only, not a publication). */
FUSER_DEVICE void red_relaxed_gpu_add(int *p, int v)
{
    asm volatile("red.relaxed.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
FUSER_DEVICE int ld_relaxed_gpu(const int *p)
{
    int v;
    asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

FUSER_DEVICE void nanosleep(uint32_t ns) { asm volatile("nanosleep.u32 %0;" ::"r"(ns)); }

/* Spin until *flag >= target (acquire): what another block released before raising it is visible. */
FUSER_DEVICE void wait_flag(const int *flag, int target)
{
    if (ld_acquire_gpu(flag) >= target)
        return;
    uint32_t ns = 32;
    while (ld_acquire_gpu(flag) < target) {
        nanosleep(ns);
        ns = ns < 256 ? 2 * ns : ns;
    }
}

/* ---- programmatic dependent launch ---- */

/* Wait until the stream's previous kernel has completed and its memory operations are visible (returns
 * at once when this launch was not early). Until then a thread may only read what no kernel writes. */
FUSER_DEVICE void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

/* This block no longer holds back the stream's next kernel, if that one was launched early: it may be
 * scheduled once every block of this grid has said so or exited. */
FUSER_DEVICE void griddep_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

/* ---- named barriers (a subset of the block's warps) ---- */

FUSER_DEVICE void named_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

} // namespace fuser
