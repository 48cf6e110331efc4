// Device-side helpers shared by the .cu files: f32 conversion of the compute types, 16-byte
// vector loads, warp reductions and the dispatch from CType to a C++ element type.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace arbiter::cuda {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

/// Elements of T in one 16-byte vector.
template <class T>
struct Vec16 {
  static constexpr int N = 16 / int(sizeof(T));
};

/// Loads 16 bytes (p must be 16-byte aligned) and widens them to f32.
template <class T>
__device__ __forceinline__ void load16(const T* p, float (&f)[Vec16<T>::N]) {
  uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < Vec16<T>::N; ++i) f[i] = to_f(e[i]);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ int pos_of(const PosRef& p) { return p.dev ? *p.dev : p.host; }

}  // namespace arbiter::cuda

/// Runs the statement with `T` bound to the element type of the CType value.
#define ARB_DISPATCH_CTYPE(ct, T, ...)                  \
  switch (ct) {                                         \
    case ::arbiter::cuda::CType::F32: {                 \
      using T = float;                                  \
      __VA_ARGS__;                                      \
      break;                                            \
    }                                                   \
    case ::arbiter::cuda::CType::F16: {                 \
      using T = __half;                                 \
      __VA_ARGS__;                                      \
      break;                                            \
    }                                                   \
    case ::arbiter::cuda::CType::BF16: {                \
      using T = __nv_bfloat16;                          \
      __VA_ARGS__;                                      \
      break;                                            \
    }                                                   \
  }
