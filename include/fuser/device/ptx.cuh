/* ptx.cuh: thin inline-PTX wrappers for what the kernels need on sm_90a: thread-block clusters and
 * distributed shared memory (rank, barrier, mapa, remote loads), cp.async, ldmatrix, mma.sync, and
 * global atomics and fences. No CUDA headers: each wrapper is one documented instruction. */
#pragma once

#include "fuser/device/common.cuh"

namespace fuser {

/* ---- shared-memory addresses ---- */

/* The 32-bit shared-window address of a generic pointer to shared memory. */
FUSER_DEVICE uint32_t smem_addr(const void *p)
{
    uint32_t r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

/* The thread's index, read so that the compiler cannot hoist what is computed from it out of the
 * persistent tile loop (holding every tile's address arithmetic live across tiles made kernels spill). */
FUSER_DEVICE uint32_t thread_index()
{
    uint32_t r;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(r));
    return r;
}

/* Nanoseconds of the GPU's global timer (coarse: for traces, not for timing short spans). */
FUSER_DEVICE uint64_t global_ns()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

FUSER_DEVICE uint32_t sm_id()
{
    uint32_t r;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
    return r;
}

/* ---- clusters and DSM ---- */

FUSER_DEVICE uint32_t cluster_rank()
{
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

/* Full cluster barrier: every thread of every block arrives (release) and waits (acquire), so shared
 * memory written before it is visible to peers' DSM reads after it. The non-.aligned form: it stays
 * defined even if a warp were to arrive diverged (the .aligned form would not), at no measurable cost. */
FUSER_DEVICE void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}

/* The address of the same shared variable in block `rank` of this cluster. */
FUSER_DEVICE uint32_t map_peer(uint32_t local, uint32_t rank)
{
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(local), "r"(rank));
    return r;
}

FUSER_DEVICE float4 ld_dsm_f4(uint32_t addr)
{
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
    return v;
}

FUSER_DEVICE uint4 ld_dsm_u4(uint32_t addr)
{
    uint4 v;
    asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
    return v;
}

/* 16 bytes of read-only global memory, through the non-coherent path (data no kernel writes meanwhile). */
FUSER_DEVICE uint4 ldg_nc_v4(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

/* ---- cp.async (16 bytes, zero-filled when `valid` is false) ---- */

FUSER_DEVICE void cp_async16(uint32_t dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
FUSER_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* The mbarrier at `bar` hears this thread's arrival once its earlier cp.async copies have landed (the
 * barrier's expected count includes it: .noinc). */
FUSER_DEVICE void cp_async_mbar_arrive(uint64_t *bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}
template <int N>
FUSER_DEVICE void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* ---- tensor cores ---- */

FUSER_DEVICE void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
FUSER_DEVICE void ldmatrix_x2(uint32_t (&r)[2], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

/* d += a * b for one m16n8k16 tile: a row-major 16x16, b "col" (stored [n][k]), fp32 accumulators. */
template <int DT>
FUSER_DEVICE void mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    if constexpr (DT == DT_BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* ---- global memory: fences, atomics, L1-bypassing loads ---- */

FUSER_DEVICE void fence_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

FUSER_DEVICE int atomic_add_gpu(int *p, int v)
{
    int old;
    asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

FUSER_DEVICE void store_relaxed_gpu(int *p, int v)
{
    asm volatile("st.relaxed.gpu.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* Stores of 2, 4, 8 or 16 bytes made only where `ok`: one predicated instruction, so that the values are
 * computed unconditionally and an epilogue stays straight-line code (a branch per store would fence
 * off each store's arithmetic from its neighbours' and leave the scheduler one element at a time). */
FUSER_DEVICE void st_global_if(bool ok, uint16_t *p, uint16_t v)
{
    asm volatile("{ .reg .pred q; setp.ne.b32 q, %0, 0; @q st.global.b16 [%1], %2; }" ::"r"((int)ok), "l"(p), "h"(v)
                 : "memory");
}
FUSER_DEVICE void st_global_if(bool ok, uint8_t *p, uint16_t v) /* the low byte of v */
{
    asm volatile("{ .reg .pred q; setp.ne.b32 q, %0, 0; @q st.global.b8 [%1], %2; }" ::"r"((int)ok), "l"(p), "h"(v)
                 : "memory");
}
FUSER_DEVICE void st_global_if(bool ok, uint32_t *p, uint32_t v)
{
    asm volatile("{ .reg .pred q; setp.ne.b32 q, %0, 0; @q st.global.b32 [%1], %2; }" ::"r"((int)ok), "l"(p), "r"(v)
                 : "memory");
}
FUSER_DEVICE void st_global_if(bool ok, uint2 *p, uint2 v)
{
    asm volatile("{ .reg .pred q; setp.ne.b32 q, %0, 0; @q st.global.v2.b32 [%1], {%2, %3}; }" ::"r"((int)ok),
                 "l"(p), "r"(v.x), "r"(v.y)
                 : "memory");
}

FUSER_DEVICE void st_global_if(bool ok, uint4 *p, uint4 v)
{
    asm volatile("{ .reg .pred q; setp.ne.b32 q, %0, 0; @q st.global.v4.b32 [%1], {%2, %3, %4, %5}; }" ::"r"((int)ok),
                 "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

FUSER_DEVICE void st_global_if(bool ok, float4 *p, float4 v)
{
    asm volatile("{ .reg .pred q; setp.ne.b32 q, %0, 0; @q st.global.v4.f32 [%1], {%2, %3, %4, %5}; }" ::"r"((int)ok),
                 "l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
}

/* The lane `lane ^ mask` of this warp's value v (every lane takes part). */
FUSER_DEVICE uint32_t shfl_xor(uint32_t v, int mask)
{
    uint32_t r;
    asm("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(v), "r"(mask));
    return r;
}

/* Transpose 4 x 4 words across the 4 lanes of a quad (lanes 4i .. 4i+3; q = lane % 4): afterwards
 * v[k] of lane q is what v[q] of lane k was. Two butterfly rounds, 4 shuffles. */
FUSER_DEVICE void quad_transpose(uint32_t (&v)[4], int q)
{
    const bool o1 = q & 1, o2 = q & 2;
    uint32_t r0 = shfl_xor(o1 ? v[0] : v[1], 1), r1 = shfl_xor(o1 ? v[2] : v[3], 1);
    if (o1)
        v[0] = r0, v[2] = r1;
    else
        v[1] = r0, v[3] = r1;
    r0 = shfl_xor(o2 ? v[0] : v[2], 2), r1 = shfl_xor(o2 ? v[1] : v[3], 2);
    if (o2)
        v[0] = r0, v[1] = r1;
    else
        v[2] = r0, v[3] = r1;
}

/* The first byte at or after p (dynamic shared memory) whose shared-window address is a multiple of
 * ALIGN: what 128-byte-swizzled TMA tiles and their wgmma descriptors need (ALIGN 1024). */
template <int ALIGN>
FUSER_DEVICE unsigned char *align_smem(unsigned char *p)
{
    return p + ((ALIGN - smem_addr(p) % ALIGN) % ALIGN);
}

/* The same pointer, as far as the compiler knows produced here: loads through it cannot be hoisted above
 * this point (e.g. above the barrier after which the data is valid). */
template <typename T>
FUSER_DEVICE T *launder(T *p)
{
    asm volatile("mov.b64 %0, %0;" : "+l"(p)::"memory");
    return p;
}

/* An L1-bypassing load the compiler may schedule freely (batch, reorder among loads): for data made
 * visible before a barrier, read through a pointer laundered after it. */
FUSER_DEVICE float4 ld_cg_f4_relaxed(const float *p)
{
    float4 v;
    asm("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}

FUSER_DEVICE int atomic_add_relaxed_gpu(int *p, int v)
{
    int old;
    asm volatile("atom.add.relaxed.gpu.global.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

/* Read workspace written by other blocks: bypass L1 (not coherent across SMs). */
FUSER_DEVICE float4 ld_cg_f4(const float *p)
{
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p)
                 : "memory");
    return v;
}

} // namespace fuser
