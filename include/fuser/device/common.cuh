/* common.cuh: the base of fuser's kernel templates: fixed-width types and small helpers, written so
 * the templates compile under NVRTC with no CUDA toolkit headers on the include path (a user may have
 * only torch's wheels). Device code only; embedded into the extension and handed to NVRTC in memory. */
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
#endif

#define FUSER_DEVICE __device__ __forceinline__

namespace fuser {

/* ceil(a / b) for positive integers, usable in constant expressions. */
template <typename T>
FUSER_DEVICE constexpr T ceil_div(T a, T b) { return (a + b - 1) / b; }

} // namespace fuser
