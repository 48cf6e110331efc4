// Storage and compute element types, and the scalar conversions every tier shares.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace arbiter {

/// Compute and dense storage types, then ggml's block formats, then MLX's quantized weights
/// as the loader repacks them into self-contained blocks (core/quant.h has their layouts).
enum class DType : uint8_t {
  F64, F32, F16, BF16, Q8_0,
  Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4,
  MLX_Q2, MLX_Q3, MLX_Q4, MLX_Q5, MLX_Q6, MLX_Q8, MLX_MXFP8, MLX_NVFP4
};

const char* dtype_name(DType t);
/// Parses a name dtype_name gives ("f32", "q4_k", "mxfp4", ...); throws arbiter::Error otherwise.
DType dtype_from_name(const std::string& name);

/// Whether activations can be computed and stored in t (f64, f32, f16, bf16; no block format).
bool is_compute_dtype(DType t);
/// Parses a compute type ("f64", "f32", "f16", "bf16"); `what` names the field in the error
/// ("[dtype] --dtype 'q4': ...").
DType compute_dtype_from_name(const std::string& name, const std::string& what = "dtype");

/// Unit roundoff (half an ulp at 1) of a compute type: f64 2^-53, f32 2^-24, f16 2^-11,
/// bf16 2^-8. The one table every bound and tolerance is derived from.
double unit_roundoff(DType t);

/// A tier's roundings: storage u_s (activations rounded to the compute type between ops)
/// and accumulation u_a (dot products and sums; every reduced-precision tier accumulates in
/// f32): f64 2^-53/2^-53, f32 2^-24/2^-24, bf16 2^-8/2^-24, f16 2^-11/2^-24.
struct Roundoff {
  double storage = 0, accum = 0;
};
Roundoff roundoff_of(DType compute);
/// Componentwise max: a comparison of two inexact sides is bounded by the coarser one.
Roundoff coarser(const Roundoff& a, const Roundoff& b);

/// Q8_0: blocks of 32 values, one f16 scale then 32 int8 (ggml's layout, 34 bytes).
constexpr int kQ8BlockSize = 32;
struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[kQ8BlockSize];
};
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block must be 34 bytes");

/// Bytes taken by n elements of type t (for a block format n must be a multiple of its block).
size_t dtype_bytes(DType t, int64_t n);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
/// Round to nearest even, NaN kept quiet (matches torch's float->bfloat16).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

/// Widens n elements of a row stored as t into f32 (t may be any storage type; each value is
/// the exact one rounded once).
void row_to_f32(DType t, const void* src, float* dst, int64_t n);
/// Widens n elements of a row stored as t into f64 (exact for every storage type).
void row_to_f64(DType t, const void* src, double* dst, int64_t n);

}  // namespace arbiter
