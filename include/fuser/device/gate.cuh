/* gate.cuh: the gate step of a gated FFN's eager route, g = act(g) * u, in one pass over 16-bit tensors and
 * in place of g (the gate GEMM's result, which nothing else holds): three passes of the intermediate
 * through HBM where PyTorch's two kernels (the activation, then the product) take five, and one launch
 * where they take two.
 *
 * The result is bitwise PyTorch's: each activation is PyTorch's CUDA formula in fp32 with the same
 * library functions (expf, erff, tanhf: IEEE division, no fast math), rounded to the 16-bit type as
 * PyTorch's activation kernel stores it, then the product in fp32 rounded as its multiplication kernel
 * rounds (tests/test_gate.py checks every bfloat16 and float16 value of g). The fused kernels' activations
 * (common.cuh) are a few ulp off these and never run here.
 *
 * Entry points: fuser_gate_<dtype>_<act>(g, u, n, cols, ld), extern "C" so the binding finds them by name; g and
 * u 16-byte aligned, each n elements in rows of `cols` that start `ld` elements apart (the same for both). Compact
 * tensors pass ld == cols (any n: a tail shorter than a vector is done one element at a time); the halves of one
 * gate-and-up GEMM's result ([rows, 2 d_ff], g and u each [rows, d_ff]) pass ld = 2 cols, with cols and ld
 * multiples of 8 and n / 8 below 2^32. */
#pragma once

#include "fuser/device/common.cuh"

namespace fuser {
namespace gate {

/* PyTorch's activations in fp32 (ATen/native/cuda/Activation*.cu): clamp_min for ReLU (NaN stays NaN), GELU
 * as x 0.5 (1 + erf(x / sqrt 2)) or its tanh form, SiLU as x / (1 + exp(-x)). */
template <int ACT>
FUSER_DEVICE float act(float x)
{
    if constexpr (ACT == ACT_RELU) {
        return x > 0.0f || x != x ? x : 0.0f;
    } else if constexpr (ACT == ACT_GELU) {
        const float alpha = 0.70710678118654752440f;
        return x * 0.5f * (1.0f + erff(x * alpha));
    } else if constexpr (ACT == ACT_GELU_TANH) {
        const float beta = (float)(1.41421356237309504880 * 1.12837916709551257390 * 0.5);
        const float kappa = 0.044715f;
        const float cube = x * x * x;
        const float inner = beta * (x + kappa * cube);
        return 0.5f * x * (1.0f + tanhf(inner));
    } else {
        return x / (1.0f + expf(-x));
    }
}

/* Two packed elements of g and u: the activations rounded to the 16-bit type, then the products rounded. */
template <int DT, int ACT>
FUSER_DEVICE uint32_t pair(uint32_t g, uint32_t u)
{
    const uint32_t a = pack2<DT>(act<ACT>(to_float<DT>((uint16_t)(g & 0xffff))),
                                 act<ACT>(to_float<DT>((uint16_t)(g >> 16))));
    return pack2<DT>(to_float<DT>((uint16_t)(a & 0xffff)) * to_float<DT>((uint16_t)(u & 0xffff)),
                     to_float<DT>((uint16_t)(a >> 16)) * to_float<DT>((uint16_t)(u >> 16)));
}

/* One 8-element vector of g and u, g overwritten. */
template <int DT, int ACT>
FUSER_DEVICE void vec(uint4 *gv, const uint4 *uv)
{
    uint4 a = *gv;
    const uint4 b = __ldg(uv);
    uint32_t *pa = reinterpret_cast<uint32_t *>(&a);
    const uint32_t *pb = reinterpret_cast<const uint32_t *>(&b);
#pragma unroll
    for (int j = 0; j < 4; j++)
        pa[j] = pair<DT, ACT>(pa[j], pb[j]);
    *gv = a;
}

template <int DT, int ACT>
FUSER_DEVICE void run(uint16_t *g, const uint16_t *u, long long n, long long cols, long long ld)
{
    const long long vecs = n / 8, stride = (long long)gridDim.x * blockDim.x;
    uint4 *gv = reinterpret_cast<uint4 *>(g);
    const uint4 *uv = reinterpret_cast<const uint4 *>(u);
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (ld == cols) {
        for (long long i = first; i < vecs; i += stride)
            vec<DT, ACT>(gv + i, uv + i);
        if (blockIdx.x == 0 && threadIdx.x < n - vecs * 8) {
            const long long i = vecs * 8 + threadIdx.x;
            g[i] = (uint16_t)pair<DT, ACT>(g[i], u[i]);
        }
        return;
    }
    /* rows of cols / 8 vectors, ld / 8 vectors apart: a 32-bit division per vector (vecs < 2^32) */
    const unsigned per_row = (unsigned)(cols / 8);
    const long long row_vecs = ld / 8;
    for (long long i = first; i < vecs; i += stride) {
        const unsigned r = (unsigned)i / per_row, c = (unsigned)i - r * per_row;
        const long long at = (long long)r * row_vecs + c;
        vec<DT, ACT>(gv + at, uv + at);
    }
}

} // namespace gate
} // namespace fuser

#define FUSER_GATE_ENTRY(dt, DT, an, ACT)                                                                   \
    extern "C" __global__ void __launch_bounds__(256) fuser_gate_##dt##_##an(uint16_t *g, const uint16_t *u, \
                                                                               long long n, long long cols,  \
                                                                               long long ld)                 \
    {                                                                                                        \
        fuser::gate::run<fuser::DT, fuser::ACT>(g, u, n, cols, ld);                                          \
    }
#define FUSER_GATE_ENTRIES(dt, DT)                                                                          \
    FUSER_GATE_ENTRY(dt, DT, relu, ACT_RELU)                                                                 \
    FUSER_GATE_ENTRY(dt, DT, gelu, ACT_GELU)                                                                 \
    FUSER_GATE_ENTRY(dt, DT, gelu_tanh, ACT_GELU_TANH)                                                       \
    FUSER_GATE_ENTRY(dt, DT, silu, ACT_SILU)
