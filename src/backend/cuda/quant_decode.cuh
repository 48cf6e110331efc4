// ggml's block formats (core/quant.h) decoded a unit of 32 values at a time, for the CUDA
// tier's kernels that read packed blocks (gemv_quant.cu) and, as host code, for the test that
// holds every decoder to core/quant.cpp's dequantization without a GPU
// (tests/cuda/cuda_quant_test.cpp, CudaQuant.DecodersEqualCoreDequantization).
//
// Fmt<Q>::unit turns unit u of a block into 32 byte-sized quants q and, per half of 16 values,
// a scale a and a min b: value j = a * (q_j - off) + b, or a * table[q_j] + b for the codebook
// formats (IQ4_NL, IQ4_XS, MXFP4); a and b are exact in f32 (core/quant.cpp), so the value is
// exact in f64 (unit_value).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace arbiter::cuda {

/// A unit of 32 values: q[j / 4] byte j % 4 is value j's quant; values 0..15 take (a0, b0),
/// 16..31 (a1, b1).
struct Unit {
  uint32_t q[8];
  float a0, a1, b0, b1;
};

// Host code too (their constant-trip loops unroll without a pragma, which the host compiler
// would warn about).
#define ARB_HD __host__ __device__ __forceinline__

/// 4 bytes at p, which is A-byte aligned (a block's offset in a row is only as aligned as its
/// size: 210-byte Q6_K blocks are 2-byte aligned, 17-byte MXFP4 blocks not at all).
template <int A>
ARB_HD uint32_t ld32(const uint8_t* p) {
  if constexpr (A == 4) {
    return *reinterpret_cast<const uint32_t*>(p);
  } else if constexpr (A == 2) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return uint32_t(h[0]) | uint32_t(h[1]) << 16;
  } else {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
  }
}
ARB_HD float ldh(const uint8_t* p) {
  return __half2float(*reinterpret_cast<const __half*>(p));
}
constexpr uint32_t kLo4 = 0x0F0F0F0Fu, kLo2 = 0x03030303u, kLo1 = 0x01010101u;

/// The 4-bit nibble pairs of 16 bytes at p (legacy and IQ4 layouts): values 0..15 are the low
/// nibbles of bytes 0..15, values 16..31 the high ones.
template <int A>
ARB_HD void nibbles16(const uint8_t* p, Unit& o) {
  for (int i = 0; i < 4; ++i) {
    const uint32_t w = ld32<A>(p + 4 * i);
    o.q[i] = w & kLo4;
    o.q[4 + i] = (w >> 4) & kLo4;
  }
}
/// Bits 0..3 of b to bit 4 of bytes 0..3 (Q5_0/Q5_1's fifth bits).
ARB_HD uint32_t spread4(uint32_t b) {
  return (b & 1u) << 4 | (b & 2u) << 11 | (b & 4u) << 18 | (b & 8u) << 25;
}

// Format traits: B values per block of BB bytes; a GEMV piece of PB blocks (a multiple of 16
// bytes, so pieces stay 16-byte aligned in a row, and a multiple of 32 units, so every lane
// has work); A the alignment of a block in a row; kOff the quant offset; kMin whether the
// format adds a min; kOneScale whether both halves of a unit share (a, b); kTable 1 for the
// IQ4 codebook, 2 for MXFP4's, else 0.
template <DType Q>
struct Fmt;

template <>
struct Fmt<DType::Q8_0> {  // d * q, q int8 (stored with its sign bit flipped below: q + 128)
  static constexpr int B = 32, BB = 34, PB = 32, A = 2, kOff = 128, kTable = 0;
  static constexpr bool kMin = false, kOneScale = true;
  ARB_HD static void unit(const uint8_t* b, int, Unit& o) {
    o.a0 = o.a1 = ldh(b);
    for (int i = 0; i < 8; ++i) o.q[i] = ld32<A>(b + 2 + 4 * i) ^ 0x80808080u;
  }
};
template <>
struct Fmt<DType::Q4_0> {  // d * (q - 8)
  static constexpr int B = 32, BB = 18, PB = 32, A = 2, kOff = 8, kTable = 0;
  static constexpr bool kMin = false, kOneScale = true;
  ARB_HD static void unit(const uint8_t* b, int, Unit& o) {
    o.a0 = o.a1 = ldh(b);
    nibbles16<A>(b + 2, o);
  }
};
template <>
struct Fmt<DType::Q4_1> {  // d * q + m
  static constexpr int B = 32, BB = 20, PB = 32, A = 4, kOff = 0, kTable = 0;
  static constexpr bool kMin = true, kOneScale = true;
  ARB_HD static void unit(const uint8_t* b, int, Unit& o) {
    o.a0 = o.a1 = ldh(b);
    o.b0 = o.b1 = ldh(b + 2);
    nibbles16<A>(b + 4, o);
  }
};
template <>
struct Fmt<DType::Q5_0> {  // d * (q - 16); the 5th bit of value j is bit j of qh
  static constexpr int B = 32, BB = 22, PB = 32, A = 2, kOff = 16, kTable = 0;
  static constexpr bool kMin = false, kOneScale = true;
  ARB_HD static void unit(const uint8_t* b, int, Unit& o) {
    o.a0 = o.a1 = ldh(b);
    const uint32_t qh = ld32<A>(b + 2);
    nibbles16<A>(b + 6, o);
    for (int i = 0; i < 4; ++i) {
      o.q[i] |= spread4(qh >> (4 * i));
      o.q[4 + i] |= spread4(qh >> (16 + 4 * i));
    }
  }
};
template <>
struct Fmt<DType::Q5_1> {  // d * q + m
  static constexpr int B = 32, BB = 24, PB = 32, A = 4, kOff = 0, kTable = 0;
  static constexpr bool kMin = true, kOneScale = true;
  ARB_HD static void unit(const uint8_t* b, int, Unit& o) {
    o.a0 = o.a1 = ldh(b);
    o.b0 = o.b1 = ldh(b + 2);
    const uint32_t qh = ld32<A>(b + 4);
    nibbles16<A>(b + 8, o);
    for (int i = 0; i < 4; ++i) {
      o.q[i] |= spread4(qh >> (4 * i));
      o.q[4 + i] |= spread4(qh >> (16 + 4 * i));
    }
  }
};
template <>
struct Fmt<DType::Q2_K> {
  // 16 sub-blocks of 16 (scales[s]: low nibble scale, high nibble min); unit u = sub-blocks
  // 2u, 2u+1: bytes qs[32 (u / 4) + l], l < 32, shifted right by 2 (u % 4).
  static constexpr int B = 256, BB = 84, PB = 4, A = 4, kOff = 0, kTable = 0;
  static constexpr bool kMin = true, kOneScale = false;
  ARB_HD static void unit(const uint8_t* b, int u, Unit& o) {
    const float d = ldh(b + 80), dmin = ldh(b + 82);
    const int s0 = b[2 * u], s1 = b[2 * u + 1];
    o.a0 = d * float(s0 & 15), o.b0 = -(dmin * float(s0 >> 4));
    o.a1 = d * float(s1 & 15), o.b1 = -(dmin * float(s1 >> 4));
    const int sh = 2 * (u % 4);
    for (int i = 0; i < 8; ++i) o.q[i] = (ld32<A>(b + 16 + 32 * (u / 4) + 4 * i) >> sh) & kLo2;
  }
};
template <>
struct Fmt<DType::Q3_K> {
  // As Q2_K's 2-bit layout plus the high bit of value l, bit 4 (u / 4) + u % 4 of hmask[l]:
  // q = q2 + 4 hbit - 4. Scales: 16 of 6 bits (low nibbles in bytes 0..7, high pairs in 8..11)
  // minus 32.
  static constexpr int B = 256, BB = 110, PB = 8, A = 2, kOff = 4, kTable = 0;
  static constexpr bool kMin = false, kOneScale = false;
  ARB_HD static int scale(const uint8_t* s, int j) {
    const int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | hi << 4) - 32;
  }
  ARB_HD static void unit(const uint8_t* b, int u, Unit& o) {
    const float d = ldh(b + 108);
    o.a0 = d * float(scale(b + 96, 2 * u));
    o.a1 = d * float(scale(b + 96, 2 * u + 1));
    const int sh = 2 * (u % 4), hb = 4 * (u / 4) + u % 4;
    for (int i = 0; i < 8; ++i) {
      const uint32_t q2 = (ld32<A>(b + 32 + 32 * (u / 4) + 4 * i) >> sh) & kLo2;
      o.q[i] = q2 | ((ld32<A>(b + 4 * i) >> hb) & kLo1) << 2;
    }
  }
};
/// A Q4_K/Q5_K sub-block's 6-bit scale and min (ggml's get_scale_min_k4; core/quant.cpp).
ARB_HD void scale_min_k4_dev(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}
template <>
struct Fmt<DType::Q4_K> {  // sub-block s of 32: d sc q - dmin m; nibble s % 2 of qs[32 (s / 2) + l]
  static constexpr int B = 256, BB = 144, PB = 4, A = 4, kOff = 0, kTable = 0;
  static constexpr bool kMin = true, kOneScale = true;
  ARB_HD static void unit(const uint8_t* b, int s, Unit& o) {
    int sc, m;
    scale_min_k4_dev(s, b + 4, sc, m);
    o.a0 = o.a1 = ldh(b) * float(sc);
    o.b0 = o.b1 = -(ldh(b + 2) * float(m));
    const int sh = 4 * (s % 2);
    for (int i = 0; i < 8; ++i) o.q[i] = (ld32<A>(b + 16 + 32 * (s / 2) + 4 * i) >> sh) & kLo4;
  }
};
template <>
struct Fmt<DType::Q5_K> {  // as Q4_K, with bit s of qh[l] as the 5th bit of value l
  static constexpr int B = 256, BB = 176, PB = 4, A = 4, kOff = 0, kTable = 0;
  static constexpr bool kMin = true, kOneScale = true;
  ARB_HD static void unit(const uint8_t* b, int s, Unit& o) {
    int sc, m;
    scale_min_k4_dev(s, b + 4, sc, m);
    o.a0 = o.a1 = ldh(b) * float(sc);
    o.b0 = o.b1 = -(ldh(b + 2) * float(m));
    const int sh = 4 * (s % 2);
    for (int i = 0; i < 8; ++i)
      o.q[i] = ((ld32<A>(b + 48 + 32 * (s / 2) + 4 * i) >> sh) & kLo4) |
               ((ld32<A>(b + 16 + 4 * i) >> s) & kLo1) << 4;
  }
};
template <>
struct Fmt<DType::Q6_K> {
  // Unit s = values 32 s..32 s + 31: half n = s / 4, k = s % 4; value l: nibble k / 2 of
  // ql[64 n + 32 (k % 2) + l], bits 2k of qh[32 n + l] above it; q - 32; int8 scales
  // 8 n + 2 k (l < 16) and the next.
  static constexpr int B = 256, BB = 210, PB = 8, A = 2, kOff = 32, kTable = 0;
  static constexpr bool kMin = false, kOneScale = false;
  ARB_HD static void unit(const uint8_t* b, int s, Unit& o) {
    const int n = s / 4, k = s % 4;
    const float d = ldh(b + 208);
    o.a0 = d * float(int8_t(b[192 + 8 * n + 2 * k]));
    o.a1 = d * float(int8_t(b[192 + 8 * n + 2 * k + 1]));
    const int sl = 4 * (k / 2), sh = 2 * k;
    for (int i = 0; i < 8; ++i)
      o.q[i] = ((ld32<A>(b + 64 * n + 32 * (k % 2) + 4 * i) >> sl) & kLo4) |
               ((ld32<A>(b + 128 + 32 * n + 4 * i) >> sh) & kLo2) << 4;
  }
};
template <>
struct Fmt<DType::IQ4_NL> {  // d * kvalues_iq4nl[q]
  static constexpr int B = 32, BB = 18, PB = 32, A = 2, kOff = 0, kTable = 1;
  static constexpr bool kMin = false, kOneScale = true;
  ARB_HD static void unit(const uint8_t* b, int, Unit& o) {
    o.a0 = o.a1 = ldh(b);
    nibbles16<A>(b + 2, o);
  }
};
template <>
struct Fmt<DType::IQ4_XS> {  // sub-block s of 32: d (ls - 32) kvalues_iq4nl[q], ls 6 bits
  static constexpr int B = 256, BB = 136, PB = 4, A = 4, kOff = 0, kTable = 1;
  static constexpr bool kMin = false, kOneScale = true;
  ARB_HD static void unit(const uint8_t* b, int s, Unit& o) {
    const int sh = b[2] | b[3] << 8;
    const int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 0xF) | ((sh >> (2 * s)) & 3) << 4;
    o.a0 = o.a1 = ldh(b) * float(ls - 32);
    nibbles16<A>(b + 8 + 16 * s, o);
  }
};
template <>
struct Fmt<DType::MXFP4> {  // 2^(e - 128) * kvalues_mxfp4[q] (E2M1 doubled)
  static constexpr int B = 32, BB = 17, PB = 32, A = 1, kOff = 0, kTable = 2;
  static constexpr bool kMin = false, kOneScale = true;
  ARB_HD static void unit(const uint8_t* b, int, Unit& o) {
    const int e = b[0];  // 2^(e - 128): normal from e = 2, subnormal (exact) below
    const uint32_t bits = e >= 2 ? uint32_t(e - 1) << 23 : 0x00400000u >> (1 - e);
    float d;
    std::memcpy(&d, &bits, 4);
    o.a0 = o.a1 = d;
    nibbles16<A>(b + 1, o);
  }
};

/// Value j of a decoded unit of format F, exactly (tab: F's codebook when F::kTable), w being
/// the unit's word u.q[j / 4].
template <class F>
ARB_HD double unit_value(const Unit& u, uint32_t w, int j, const float* tab) {
  const int q = (w >> (8 * (j % 4))) & 0xFF;
  const double v = F::kTable ? double(tab[q]) : double(q - F::kOff);
  const double y = double(j < 16 ? u.a0 : u.a1) * v;
  return F::kMin ? y + double(j < 16 ? u.b0 : u.b1) : y;
}
template <class F>
ARB_HD double unit_value(const Unit& u, int j, const float* tab) {
  return unit_value<F>(u, u.q[j / 4], j, tab);
}

}  // namespace arbiter::cuda
