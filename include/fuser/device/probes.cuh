/* probes.cuh: microbenchmark kernels that `python -m fuser calibrate` runs (fuser/probes.py) to measure
 * the hardware constants of the cost model on the current GPU:
 *
 *   fuser_probe_dsm      remote shared-memory (DSM) read bandwidth at the launch's cluster size: every
 *                        thread streams its peer block's (rank + 1) shared memory with 8 independent
 *                        ld.shared::cluster.v4 per iteration, as the fused kernel's exchange reads it
 *   fuser_probe_barrier  one full cluster barrier (arrive.release + wait.acquire, the kernel's own)
 *   fuser_probe_mma_<MT>x<NT>  the main loop's tensor-core rate with operands already in shared memory:
 *                        gemm1's inner loop (swizzled tiles, ldmatrix, mma.sync m16n8k16) for a warp
 *                        tile of MT m16 x NT n8, 2 x 4 warps, over and over
 *
 * Each takes (float *out, int iters); thread 0 of block b writes out[2b] = the cycles (clock64) the
 * block spent in the timed loop, out[2b + 1] = a check value (dsm: the block index the first remote
 * read returned, which the caller compares with the peer it should be; mma: the accumulators' sum,
 * finite; barrier: 0). Launch with one block per SM (dynamic shared memory > half an SM's) so each
 * block times an SM of its own. */
#pragma once

#include "fuser/device/common.cuh"
#include "fuser/device/ffn.cuh"
#include "fuser/device/ptx.cuh"

namespace fuser {

FUSER_DEVICE uint64_t clock_cycles()
{
    uint64_t c;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
    return c;
}

FUSER_DEVICE uint32_t cluster_blocks()
{
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
    return r;
}

/* Bytes each block fills and its peer streams: a power of two, within the smallest launch's smem. */
constexpr uint32_t PROBE_DSM_BYTES = 64 * 1024;
constexpr int PROBE_DSM_LOADS = 8;

FUSER_DEVICE void probe_dsm(float *out, int iters)
{
    extern __shared__ __align__(16) uint4 probe_smem[];
    const uint32_t n = PROBE_DSM_BYTES / 16;
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
        probe_smem[i] = make_uint4(blockIdx.x, i, 0, 0);
    cluster_sync();
    const uint32_t peer = map_peer(smem_addr(probe_smem), (cluster_rank() + 1) % cluster_blocks());
    const uint32_t first = ld_dsm_u4(peer).x;
    const uint32_t step = blockDim.x * 16;
    uint32_t off = threadIdx.x * 16, sink = 0;
    __syncthreads();
    const uint64_t t0 = clock_cycles();
    for (int it = 0; it < iters; it++) {
        uint4 v[PROBE_DSM_LOADS];
#pragma unroll
        for (int j = 0; j < PROBE_DSM_LOADS; j++)
            v[j] = ld_dsm_u4(peer + ((off + j * step) & (PROBE_DSM_BYTES - 1)));
#pragma unroll
        for (int j = 0; j < PROBE_DSM_LOADS; j++) /* used, or ptxas drops the loads */
            sink ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
        off += PROBE_DSM_LOADS * step;
    }
    __syncthreads();
    const uint64_t t1 = clock_cycles();
    cluster_sync(); /* no block leaves while a peer still reads its shared memory */
    if (threadIdx.x == 0) {
        out[2 * blockIdx.x] = (float)(t1 - t0);
        out[2 * blockIdx.x + 1] = (float)first;
    }
    if (sink == 0xffffffffu) /* never: the words read are block indices, indices below 4096 and 0 */
        out[2 * blockIdx.x + 1] = -1.f;
}

FUSER_DEVICE void probe_barrier(float *out, int iters)
{
    cluster_sync();
    __syncthreads();
    const uint64_t t0 = clock_cycles();
    for (int it = 0; it < iters; it++)
        cluster_sync();
    const uint64_t t1 = clock_cycles();
    cluster_sync();
    if (threadIdx.x == 0) {
        out[2 * blockIdx.x] = (float)(t1 - t0);
        out[2 * blockIdx.x + 1] = 0.f;
    }
}

/* gemm1's compute step on one resident stage: A [2*MT*16][BK] and B [4*NT*8][BK], both swizzled. */
template <int MT, int NT>
FUSER_DEVICE void probe_mma(float *out, int iters)
{
    constexpr int WM = 2, WN = 4, BM = WM * MT * 16, BN = WN * NT * 8;
    extern __shared__ __align__(16) uint16_t probe_tiles[];
    uint16_t *sa = probe_tiles, *sb = probe_tiles + BM * BK;
    for (int i = threadIdx.x; i < (BM + BN) * BK; i += blockDim.x)
        probe_tiles[i] = (uint16_t)(0x3c00 | ((i * 2654435761u) >> 24)); /* bf16 in [1/128, 1/64) */
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp % WM, wn = warp / WM;
    float acc[MT][NT][4] = {};
    const uint64_t t0 = clock_cycles();
    for (int it = 0; it < iters; it++) {
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const int r = wm * MT * 16 + mt * 16;
                ldmatrix_x4(a[mt], smem_addr(sa) + 2 * swz<BK>(r + (lane & 15), kk + ((lane >> 4) << 3)));
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint32_t b[2];
                const int n = wn * NT * 8 + nt * 8;
                ldmatrix_x2(b, smem_addr(sb) + 2 * swz<BK>(n + (lane & 7), kk + (((lane >> 3) & 1) << 3)));
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    mma16816<DT_BF16>(acc[mt][nt], a[mt], b);
            }
        }
    }
    __syncthreads();
    const uint64_t t1 = clock_cycles();
    float s = 0.f;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            s += acc[mt][nt][0] + acc[mt][nt][1] + acc[mt][nt][2] + acc[mt][nt][3];
    if (threadIdx.x == 0) {
        out[2 * blockIdx.x] = (float)(t1 - t0);
        out[2 * blockIdx.x + 1] = s; /* finite: the caller checks it */
    }
}

} // namespace fuser

extern "C" __global__ void fuser_probe_dsm(float *out, int iters) { fuser::probe_dsm(out, iters); }
extern "C" __global__ void fuser_probe_barrier(float *out, int iters) { fuser::probe_barrier(out, iters); }
#define FUSER_PROBE_MMA(MT, NT)                                                                            \
    extern "C" __global__ void __launch_bounds__(256, 1) fuser_probe_mma_##MT##x##NT(float *out, int iters) \
    {                                                                                                      \
        fuser::probe_mma<MT, NT>(out, iters);                                                              \
    }
FUSER_PROBE_MMA(1, 4)
FUSER_PROBE_MMA(2, 4)
FUSER_PROBE_MMA(4, 4)
FUSER_PROBE_MMA(2, 8)
FUSER_PROBE_MMA(4, 8)
