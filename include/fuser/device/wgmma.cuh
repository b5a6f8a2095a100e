/* wgmma.cuh: what a consumer warpgroup needs around wgmma.mma_async: shared-memory matrix descriptors
 * for TMA's 128-byte-swizzled K-major tiles, the fence / commit / wait sequence, operand fences that
 * keep the compiler from touching accumulators while an MMA is in flight, and register reallocation
 * between producer and consumer warpgroups (setmaxnreg). */
#pragma once

#include "fuser/device/common.cuh"
#include "fuser/device/ptx.cuh"
#include "fuser/device/wgmma_ops.cuh"

namespace fuser {

/* Tiles are [rows][64] 16-bit elements (128 bytes a row) as TMA writes them with 128-byte swizzle: 8-row
 * groups of 1024 bytes, each row's 16-byte chunks XORed with (row % 8). A tile must start at a multiple
 * of 1024 bytes. */
constexpr int SW_COLS = 64;                 /* elements per swizzled row */
constexpr int SW_ROW_BYTES = 128;
constexpr int SW_GROUP_BYTES = 8 * SW_ROW_BYTES;

/* Descriptor of the K-major swizzled tile at shared address `addr` (rows = M or N side, 64 K columns):
 * start >> 4 (bits 0-13), leading byte offset 16 >> 4 (ignored for swizzled K-major), stride byte
 * offset 1024 >> 4 between 8-row groups (bits 32-45), 128-byte swizzle (bits 62-63 = 1). Advancing K by
 * 16 elements inside the row adds 32 bytes to the start address (the swizzle is applied to the final
 * address bits, which is why tiles are 1024-byte aligned). */
FUSER_DEVICE uint64_t sw128_desc(uint32_t addr)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(SW_GROUP_BYTES >> 4) << 32) |
           ((uint64_t)1 << 62);
}

FUSER_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
FUSER_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
FUSER_DEVICE void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }

/* An empty asm that claims to read and write every accumulator: placed after wgmma_wait, it orders the
 * epilogue's reads after the wait (and before the next MMA, any writes). */
template <int R>
FUSER_DEVICE void fence_operands(float (&d)[R])
{
#pragma unroll
    for (int i = 0; i < R; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

template <int REGS>
FUSER_DEVICE void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS)); }
template <int REGS>
FUSER_DEVICE void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS)); }

/* d (64 x N, fp32) (+)= A (64 rows at a_addr) * B (N rows at b_addr)^T over one K step of 128-byte rows:
 * four MMAs of 32 bytes of K each (k16 of 16-bit elements: 64 columns; k32 of e4m3: 128). Both tiles are
 * swizzled K-major; the caller fences, commits and waits. `accumulate` 0 starts the sum (the first K
 * step). */
template <int DT, int N>
FUSER_DEVICE void mma_k64(float (&d)[N / 2], uint32_t a_addr, uint32_t b_addr, int accumulate)
{
    const uint64_t da = sw128_desc(a_addr), db = sw128_desc(b_addr);
#pragma unroll
    for (int k = 0; k < 4; k++)
        wgmma<DT, N>(d, da + (uint64_t)(2 * k), db + (uint64_t)(2 * k), k > 0 ? 1 : accumulate);
}

} // namespace fuser
