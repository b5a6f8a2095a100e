/* common.cuh: the base of fuser's kernel templates: fixed-width types, 16-bit conversions and small
 * helpers, written so the templates compile under NVRTC with no CUDA toolkit headers on the include
 * path (a user may have only torch's wheels). Device code only; embedded into the extension and
 * handed to NVRTC in memory. */
#pragma once

#ifndef __CUDACC_RTC__
#include <stdint.h>
#else
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned long long uintptr_t;
#endif

#define FUSER_DEVICE __device__ __forceinline__

namespace fuser {

/* A if B, else F (std::conditional, which NVRTC's bare include path lacks). */
template <bool B, class T, class F>
struct pick { using type = T; };
template <class T, class F>
struct pick<false, T, F> { using type = F; };

/* ceil(a / b) for positive integers, usable in constant expressions. */
template <typename T>
FUSER_DEVICE constexpr T ceil_div(T a, T b) { return (a + b - 1) / b; }

template <typename T>
FUSER_DEVICE constexpr T cmin(T a, T b) { return a < b ? a : b; }
template <typename T>
FUSER_DEVICE constexpr T cmax(T a, T b) { return a > b ? a : b; }

/* 16-bit element types by the core's dtype code (0 bfloat16, 1 float16); DT_E4M3: 8-bit e4m3 MMA operands
 * (the GEMM probe's fp8 variants), whose results are stored in bfloat16. */
enum { DT_BF16 = 0, DT_F16 = 1, DT_E4M3 = 2 };

/* One 16-bit value to fp32. */
template <int DT>
FUSER_DEVICE float to_float(uint16_t h)
{
    if constexpr (DT == DT_BF16) {
        return __uint_as_float(((uint32_t)h) << 16);
    } else {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
}

/* Two fp32 values to e4m3 (round to nearest even, saturating at +-448; NaN stays NaN): lo in the low byte. */
FUSER_DEVICE uint32_t e4m3x2(float lo, float hi)
{
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}
/* One fp32 value to e4m3, in the low byte. */
FUSER_DEVICE uint16_t to_e4m3(float v) { return (uint16_t)e4m3x2(v, 0.f); }

/* Two fp32 values to a packed pair of 16-bit values, round to nearest even (lo in the low half). */
template <int DT>
FUSER_DEVICE uint32_t pack2(float lo, float hi)
{
    uint32_t r;
    if constexpr (DT == DT_BF16)
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    else
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* Activations in fp32 (the definitions of include/fuser/chain.h).
 * NOTE: no IEEE division here. `x / (1 + expf(-x))` compiles to a division whose rare-input slow
 * path is a subroutine call (__cuda_sm3x_div_rn_noftz_f32_slowpath); on an H200 with NVRTC 13.0 that
 * call clobbered registers live across the epilogue (the main loop's stage offsets), giving
 * input-dependent misaligned ldmatrix addresses and garbage outputs. SiLU therefore uses ex2.approx
 * and rcp.approx (a few ulp), and fuser.compile refuses any kernel that contains such a subroutine. */
enum { ACT_RELU = 0, ACT_GELU = 1, ACT_GELU_TANH = 2, ACT_SILU = 3 };

FUSER_DEVICE float fast_exp2(float x)
{
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

FUSER_DEVICE float fast_rcp(float x)
{
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

/* q(z) ~ -log2(erfc(z)) / z on [0, 4], lowest power first (a degree-8 Chebyshev fit; tests/test_device_math.py
 * checks it): erfc(z) / 2 = 2^(-z q(z) - 1). */
__device__ constexpr float GELU_Q[9] = {1.62794983f,     0.917991161f,    0.149960831f,   -0.0306933466f, 0.00291701616f,
                                        0.000474281696f, -0.00021112361f, 2.99531821e-05f, -1.61141782e-06f};

/* max(x, 0), NaN for a NaN x (fmaxf would return 0) */
FUSER_DEVICE float relu_nan(float x)
{
    float r;
    asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(r) : "f"(x));
    return r;
}

/* GELU, x Phi(x), the normal CDF from erfc in one piece: with z = |x| / sqrt(2), Phi = erfc(z) / 2 for
 * x < 0 and 1 - erfc(z) / 2 for x > 0, so GELU = max(x, 0) - |x| erfc(z) / 2 and the negative tail has no
 * 1 + erf cancellation: relative error under 5e-6 wherever |GELU(x)| > 1e-6, where
 * 0.5 x (1 + erff(x / sqrt(2))) loses up to 7% near x = -5. |x| erfc(z) / 2 = z 2^(-z q(z) - 1/2), with
 * q fitted on [0, 4] and held at q(4) beyond (z <= 20 in the product and the power: past z = 4 the
 * term is below 5e-8 and falls to exactly 0 at z = 20, where the power flushes; x = +-inf gives +inf and 0,
 * NaN stays NaN). About 15 instructions and one ex2, no select: the epilogues of large GELU tiles are
 * bound by these instructions. */
FUSER_DEVICE float gelu_erf(float x)
{
    const float z = fabsf(x) * 0.70710678118654752f;
    const float zq = fminf(z, 4.0f), zt = fminf(z, 20.0f);
    float q = GELU_Q[8];
#pragma unroll
    for (int i = 7; i >= 0; i--)
        q = fmaf(q, zq, GELU_Q[i]);
    return fmaf(-zt, fast_exp2(fmaf(-zt, q, -0.5f)), relu_nan(x));
}

/* GELU's tanh form, 0.5 x (1 + tanh(u)) with u = sqrt(2 / pi) (x + 0.044715 x^3), as x sigmoid(2 u) =
 * x / (1 + 2^(-2 log2(e) u)): one ex2 and one rcp, a few ulp, and no 1 + tanh cancellation in the negative
 * tail (tanhf costs ~20 instructions and its registers spilled in 128 x 256 tiles). */
constexpr float GELU_TANH_K1 = -2.0f * 1.4426950408889634f * 0.7978845608028654f;
constexpr float GELU_TANH_K3 = GELU_TANH_K1 * 0.044715f;
FUSER_DEVICE float gelu_tanh(float x)
{
    return x * fast_rcp(1.0f + fast_exp2(x * fmaf(GELU_TANH_K3, x * x, GELU_TANH_K1)));
}

template <int ACT>
FUSER_DEVICE float activate(float x)
{
    if constexpr (ACT == ACT_RELU)
        return x > 0.f ? x : 0.f;
    else if constexpr (ACT == ACT_GELU)
        return gelu_erf(x);
    else if constexpr (ACT == ACT_GELU_TANH)
        return gelu_tanh(x);
    else /* x * sigmoid(x); for x -> -inf, exp2 -> inf, rcp -> 0: the product is (-)0 as it should be */
        return x * fast_rcp(1.0f + fast_exp2(-1.4426950408889634f * x));
}

} // namespace fuser
