#include "core/dtype.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/quant.h"

namespace arbiter {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F64: return "f64";
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::Q8_0: return "q8_0";
    case DType::Q4_0: return "q4_0";
    case DType::Q4_1: return "q4_1";
    case DType::Q5_0: return "q5_0";
    case DType::Q5_1: return "q5_1";
    case DType::Q2_K: return "q2_k";
    case DType::Q3_K: return "q3_k";
    case DType::Q4_K: return "q4_k";
    case DType::Q5_K: return "q5_k";
    case DType::Q6_K: return "q6_k";
    case DType::IQ4_NL: return "iq4_nl";
    case DType::IQ4_XS: return "iq4_xs";
    case DType::MXFP4: return "mxfp4";
    case DType::MLX_Q2: return "mlx_q2";
    case DType::MLX_Q3: return "mlx_q3";
    case DType::MLX_Q4: return "mlx_q4";
    case DType::MLX_Q5: return "mlx_q5";
    case DType::MLX_Q6: return "mlx_q6";
    case DType::MLX_Q8: return "mlx_q8";
    case DType::MLX_MXFP8: return "mlx_mxfp8";
    case DType::MLX_NVFP4: return "mlx_nvfp4";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  for (int i = 0; i <= int(DType::MLX_NVFP4); ++i)
    if (name == dtype_name(DType(i))) return DType(i);
  throw Error("[dtype] unknown dtype '" + name +
              "' (expected f64, f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, "
              "iq4_nl, iq4_xs, mxfp4, mlx_q2, mlx_q3, mlx_q4, mlx_q5, mlx_q6, mlx_q8, mlx_mxfp8 or mlx_nvfp4)");
}

bool is_compute_dtype(DType t) { return !is_quantized(t); }

DType compute_dtype_from_name(const std::string& name, const std::string& what) {
  for (DType t : {DType::F64, DType::F32, DType::F16, DType::BF16})
    if (name == dtype_name(t)) return t;
  throw Error("[dtype] " + what + " '" + name + "' is not a compute type (expected f64, f32, bf16 or f16)");
}

double unit_roundoff(DType t) {
  switch (t) {
    case DType::F64: return std::ldexp(1.0, -53);
    case DType::F32: return std::ldexp(1.0, -24);
    case DType::F16: return std::ldexp(1.0, -11);
    case DType::BF16: return std::ldexp(1.0, -8);
    default: break;
  }
  throw Error(std::string("[dtype] ") + dtype_name(t) + " is a storage type, not a compute type");
}

Roundoff roundoff_of(DType compute) {
  const double u = unit_roundoff(compute);
  return {u, compute == DType::F64 ? u : unit_roundoff(DType::F32)};
}

Roundoff coarser(const Roundoff& a, const Roundoff& b) {
  return {std::max(a.storage, b.storage), std::max(a.accum, b.accum)};
}

size_t dtype_bytes(DType t, int64_t n) { return size_t(n / block_elems(t)) * block_bytes(t); }

// IEEE binary16 <-> binary32, exact widening, round-to-nearest-even narrowing.
float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400));
      u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00);  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // overflow to Inf (incl. rounding)
  if (a < 0x38800000u) {  // subnormal or zero in f16
    if (a < 0x33000000u) return sign;  // below half the smallest subnormal
    uint32_t man = (a & 0x7fffff) | 0x800000;
    int shift = 126 - int(a >> 23);  // 14..24
    uint32_t r = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = a - 0x38000000u;  // rebias exponent
  uint32_t lo = r & 0x1fff;
  r >>= 13;
  if (lo > 0x1000 || (lo == 0x1000 && (r & 1))) ++r;
  return uint16_t(sign | r);
}

template <typename Out>
static void row_widen(DType t, const void* src, Out* dst, int64_t n) {
  switch (t) {
    case DType::F64: {
      auto s = static_cast<const double*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Out(s[i]);
      return;
    }
    case DType::F32: {
      auto s = static_cast<const float*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Out(s[i]);
      return;
    }
    case DType::F16: {
      auto s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Out(f16_to_f32(s[i]));
      return;
    }
    case DType::BF16: {
      auto s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Out(bf16_to_f32(s[i]));
      return;
    }
    default: {
      ARB_ASSERT(n % block_elems(t) == 0);
      dequant_blocks(t, static_cast<const uint8_t*>(src), n / block_elems(t), dst);
      return;
    }
  }
}

void row_to_f32(DType t, const void* src, float* dst, int64_t n) { row_widen(t, src, dst, n); }
void row_to_f64(DType t, const void* src, double* dst, int64_t n) { row_widen(t, src, dst, n); }

}  // namespace arbiter
