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
 * Entry points: fuser_gate_<dtype>_<act>(g, u, n), extern "C" so the binding finds them by name; g and u
 * 16-byte aligned, n elements each; any n (a tail shorter than a vector is done one element at a time). */
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

template <int DT, int ACT>
FUSER_DEVICE void run(uint16_t *g, const uint16_t *u, long long n)
{
    const long long vecs = n / 8, stride = (long long)gridDim.x * blockDim.x;
    uint4 *gv = reinterpret_cast<uint4 *>(g);
    const uint4 *uv = reinterpret_cast<const uint4 *>(u);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < vecs; i += stride) {
        uint4 a = gv[i];
        const uint4 b = __ldg(uv + i);
        uint32_t *pa = reinterpret_cast<uint32_t *>(&a);
        const uint32_t *pb = reinterpret_cast<const uint32_t *>(&b);
#pragma unroll
        for (int j = 0; j < 4; j++)
            pa[j] = pair<DT, ACT>(pa[j], pb[j]);
        gv[i] = a;
    }
    if (blockIdx.x == 0 && threadIdx.x < n - vecs * 8) {
        const long long i = vecs * 8 + threadIdx.x;
        g[i] = (uint16_t)pair<DT, ACT>(g[i], u[i]);
    }
}

} // namespace gate
} // namespace fuser

#define FUSER_GATE_ENTRY(dt, DT, an, ACT)                                                                   \
    extern "C" __global__ void __launch_bounds__(256) fuser_gate_##dt##_##an(uint16_t *g, const uint16_t *u, \
                                                                               long long n)                  \
    {                                                                                                        \
        fuser::gate::run<fuser::DT, fuser::ACT>(g, u, n);                                                    \
    }
#define FUSER_GATE_ENTRIES(dt, DT)                                                                          \
    FUSER_GATE_ENTRY(dt, DT, relu, ACT_RELU)                                                                 \
    FUSER_GATE_ENTRY(dt, DT, gelu, ACT_GELU)                                                                 \
    FUSER_GATE_ENTRY(dt, DT, gelu_tanh, ACT_GELU_TANH)                                                       \
    FUSER_GATE_ENTRY(dt, DT, silu, ACT_SILU)
