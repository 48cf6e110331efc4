// Integer dot kernels for the block formats: the decode GEMV with activations quantized to
// 8 bits (kernels.h ActQ8), as llama.cpp's CPU backend does with q8_0 / q8_K.
//
// Every format below writes each weight as a * u + b per sub-block of G values (G = 16 or
// 32): u an integer code (unsigned 0..63, or a signed int8 for the formats whose values are
// a signed table: Q8_0, IQ4_NL, IQ4_XS, MXFP4, where b = 0), a and b f32 (exact: an f16
// scale times a sub-scale of at most 8 bits, or an f16 min). With x ~ dx * q per activation
// block, a sub-block's contribution is
//     dx * (a * sum(u * q) + b * sum(q)),
// where sum(u * q) is an exact int32 (VNNI vpdpbusd, AVX2 maddubs + madd, or scalar) and
// sum(q) comes with the activations (ActQ8::sums, per 16). The first term is accumulated in
// f32 lanes, A = a * dx broadcast to the lanes of its sub-block; the second in one f32 scalar
// per row. The scalar twin unpacks each chunk of 256 values to bytes in an L1 buffer by plain
// loops (Fmt<T>::unpack), one dot routine serving every format; on AVX2 / AVX-512 every format
// has a register kernel (Reg*, below, run by the one GEMV qgemv_reg): the buffer's stores and
// reloads stall, and these run several times faster.
//
// Bounds (docs/quantization.md, tests/backend/qdot_test.cpp): against the f64
// dot of the exact weights with the dequantized activations, the f32 steps alone; against
// the f32 activations, plus the activation rounding (<= dx / 2 per value).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/unpack.h"
#include "core/error.h"
#include "core/quant.h"

namespace arbiter::cpu {

namespace {
// Values per block of the formats with an integer kernel (their activation block too).
constexpr int qblock(DType t) {
  switch (t) {
    case DType::Q8_0: case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1:
    case DType::IQ4_NL: case DType::MXFP4: return kQK;
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::IQ4_XS: return kQK_K;
    default: return 0;
  }
}
}  // namespace

int act_q8_block(DType t) { return qblock(t); }

const char* act_q8_name(int block) { return block == kQK ? "q8_0" : "q8_K"; }

void quantize_act_q8(const float* x, int64_t K, int block, ActQ8& a) {
  ARB_ASSERT((block == kQK || block == kQK_K) && K % block == 0);
  a.block = block;
  a.K = K;
  a.q.resize(size_t(K));
  a.d.resize(size_t(K / block));
  a.sums.resize(size_t(K / 16));
  for (int64_t b = 0; b < K / block; ++b) {
    const float* xb = x + b * block;
    float amax = 0, poison = 0;
    for (int i = 0; i < block; ++i) {
      amax = std::max(amax, std::fabs(xb[i]));
      poison += xb[i] * 0.f;  // NaN when any value is NaN or infinite
    }
    // A non-finite value makes the block's scale NaN (and its codes 0), so the dot is NaN as
    // the f32 path's would be.
    const float d = amax / 127.f + poison;
    int8_t* q = a.q.data() + b * block;
    if (d > 0) {
      const float id = 1.f / d;
      for (int i = 0; i < block; ++i) q[i] = int8_t(std::clamp(std::nearbyint(xb[i] * id), -127.f, 127.f));
    } else {
      std::memset(q, 0, size_t(block));  // all zeros, or the poisoned block
    }
    a.d[size_t(b)] = d;
  }
  for (int64_t s = 0; s < K / 16; ++s) {
    int t = 0;
    for (int i = 0; i < 16; ++i) t += a.q[size_t(s * 16 + i)];
    a.sums[size_t(s)] = int16_t(t);
  }
}

void act_q8_rounding(DType t, const void* W, int64_t K, const ActQ8& a, double* out, int64_t n0,
                     int64_t n1) {
  ARB_ASSERT(a.block == act_q8_block(t) && a.K == K);
  const size_t row = size_t(K / a.block) * block_bytes(t);
  std::vector<double> w(static_cast<size_t>(K));
  for (int64_t n = n0; n < n1; ++n) {
    row_to_f64(t, static_cast<const uint8_t*>(W) + size_t(n) * row, w.data(), K);
    double s = 0;
    for (int64_t k = 0; k < K; ++k) {
      // quantize_act_q8's largest rounding of x_k: d (1/2 + 2^-15) (kernels.h ActQ8).
      const double r = double(a.d[size_t(k / a.block)]) * (0.5 + std::ldexp(1.0, -15));
      s += (w[size_t(k)] * r) * (w[size_t(k)] * r);
    }
    out[n - n0] = s;
  }
}

namespace {

// Per format: G (sub-block size), whether its codes are signed, whether it has the b term,
// and unpack(block) -> codes u[block_elems], a[sub-blocks], b[sub-blocks]. The bit layouts
// are core/quant.cpp's (written out there and in docs/quantization.md).
template <DType T>
struct Fmt;

template <>
struct Fmt<DType::Q8_0> {
  static constexpr int G = 32;
  static constexpr bool kSigned = true, kHasB = false;
  static void unpack(const uint8_t* p, uint8_t* u, float* a, float*) {
    using B = BlockQ8_0;
    const uint8_t* qs = p + offsetof(B, qs);
    std::memcpy(u, qs, 32);
    a[0] = f16_at(p + offsetof(B, d));
  }
};

// Q4_0 / Q4_1: value j the low nibble of qs[j], value j + 16 the high one.
template <>
struct Fmt<DType::Q4_0> {
  static constexpr int G = 32;
  static constexpr bool kSigned = false, kHasB = true;
  static void scales(const uint8_t* p, float& a, float& b) {
    using B = BlockQ4_0;
    a = f16_at(p + offsetof(B, d));
    b = -8.f * a;
  }
  static void unpack(const uint8_t* p, uint8_t* u, float* a, float* bb) {
    using B = BlockQ4_0;
    scales(p, a[0], bb[0]);
    const uint8_t* qs = p + offsetof(B, qs);
    for (int j = 0; j < 16; ++j) {
      u[j] = qs[j] & 0xF;
      u[j + 16] = qs[j] >> 4;
    }
  }
};
template <>
struct Fmt<DType::Q4_1> {
  static constexpr int G = 32;
  static constexpr bool kSigned = false, kHasB = true;
  static void scales(const uint8_t* p, float& a, float& b) {
    using B = BlockQ4_1;
    a = f16_at(p + offsetof(B, d));
    b = f16_at(p + offsetof(B, m));
  }
  static void unpack(const uint8_t* p, uint8_t* u, float* a, float* bb) {
    using B = BlockQ4_1;
    scales(p, a[0], bb[0]);
    const uint8_t* qs = p + offsetof(B, qs);
    for (int j = 0; j < 16; ++j) {
      u[j] = qs[j] & 0xF;
      u[j + 16] = qs[j] >> 4;
    }
  }
};

// Q5_0 / Q5_1: the 5th bit of value j is bit j of qh (little-endian u32).
inline void unpack_q5(const uint8_t* qs, const uint8_t* qh4, uint8_t* u) {
  uint32_t qh;
  std::memcpy(&qh, qh4, 4);
  for (int j = 0; j < 16; ++j) {
    u[j] = uint8_t((qs[j] & 0xF) | ((qh >> j) & 1) << 4);
    u[j + 16] = uint8_t((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
  }
}
template <>
struct Fmt<DType::Q5_0> {
  static constexpr int G = 32;
  static constexpr bool kSigned = false, kHasB = true;
  static void scales(const uint8_t* p, float& a, float& b) {
    using B = BlockQ5_0;
    a = f16_at(p + offsetof(B, d));
    b = -16.f * a;
  }
  static void unpack(const uint8_t* p, uint8_t* u, float* a, float* bb) {
    using B = BlockQ5_0;
    scales(p, a[0], bb[0]);
    const uint8_t* qs = p + offsetof(B, qs);
    const uint8_t* qh = p + offsetof(B, qh);
    unpack_q5(qs, qh, u);
  }
};
template <>
struct Fmt<DType::Q5_1> {
  static constexpr int G = 32;
  static constexpr bool kSigned = false, kHasB = true;
  static void scales(const uint8_t* p, float& a, float& b) {
    using B = BlockQ5_1;
    a = f16_at(p + offsetof(B, d));
    b = f16_at(p + offsetof(B, m));
  }
  static void unpack(const uint8_t* p, uint8_t* u, float* a, float* bb) {
    using B = BlockQ5_1;
    scales(p, a[0], bb[0]);
    const uint8_t* qs = p + offsetof(B, qs);
    const uint8_t* qh = p + offsetof(B, qh);
    unpack_q5(qs, qh, u);
  }
};

// The signed-table formats: the code is the table's int8 value.
inline void unpack_table(const uint8_t* qs, const int8_t* table, uint8_t* u) {
  for (int j = 0; j < 16; ++j) {
    u[j] = uint8_t(table[qs[j] & 0xF]);
    u[j + 16] = uint8_t(table[qs[j] >> 4]);
  }
}
template <>
struct Fmt<DType::IQ4_NL> {
  static constexpr int G = 32;
  static constexpr bool kSigned = true, kHasB = false;
  static void scales(const uint8_t* p, float& a, float& b) {
    using B = BlockIQ4_NL;
    a = f16_at(p + offsetof(B, d));
    b = 0;
  }
  static void unpack(const uint8_t* p, uint8_t* u, float* a, float* bb) {
    using B = BlockIQ4_NL;
    scales(p, a[0], bb[0]);
    const uint8_t* qs = p + offsetof(B, qs);
    unpack_table(qs, kIQ4NLValues, u);
  }
};
template <>
struct Fmt<DType::MXFP4> {
  static constexpr int G = 32;
  static constexpr bool kSigned = true, kHasB = false;
  static void scales(const uint8_t* p, float& a, float& b) {
    using B = BlockMXFP4;
    // E8M0 with the table's doubling: 2^(e - 128), built from its bits (ldexp is a call per
    // block); e = 0 and 1 give the f32 subnormals 2^-128 and 2^-127.
    const uint32_t e = p[offsetof(B, e)];
    const uint32_t bits = e >= 2 ? (e - 1) << 23 : 0x200000u << e;
    std::memcpy(&a, &bits, 4);
    b = 0;
  }
  static void unpack(const uint8_t* p, uint8_t* u, float* a, float* bb) {
    using B = BlockMXFP4;
    scales(p, a[0], bb[0]);
    const uint8_t* qs = p + offsetof(B, qs);
    unpack_table(qs, kMXFP4Values, u);
  }
};
template <>
struct Fmt<DType::IQ4_XS> {
  static constexpr int G = 32;
  static constexpr bool kSigned = true, kHasB = false;
  static void unpack(const uint8_t* p, uint8_t* u, float* a, float*) {
    using B = BlockIQ4_XS;
    const uint8_t* qs = p + offsetof(B, qs);
    const uint8_t* scales_l = p + offsetof(B, scales_l);
    const float d = f16_at(p + offsetof(B, d));
    for (int s = 0; s < 8; ++s) {
      unpack_table(qs + 16 * s, kIQ4NLValues, u + 32 * s);
      const int ls = ((scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | ((f16_bits_at(p + offsetof(B, scales_h)) >> (2 * s)) & 3) << 4;
      a[s] = d * float(ls - 32);
    }
  }
};

// Q2_K / Q3_K: 16 sub-blocks of 16; byte l of each 32-byte half of qs holds values l, l+32,
// l+64, l+96 of that 128, two bits each.
inline void unpack_2bit(const uint8_t* qs, uint8_t* u) {
  for (int half = 0; half < 2; ++half)
    for (int sh = 0; sh < 4; ++sh)
      for (int l = 0; l < 32; ++l) u[128 * half + 32 * sh + l] = (qs[32 * half + l] >> (2 * sh)) & 3;
}
template <>
struct Fmt<DType::Q2_K> {
  static constexpr int G = 16;
  static constexpr bool kSigned = false, kHasB = true;
  static void unpack(const uint8_t* p, uint8_t* u, float* a, float* bb) {
    using B = BlockQ2_K;
    const uint8_t* qs = p + offsetof(B, qs);
    const uint8_t* scales = p + offsetof(B, scales);
    unpack_2bit(qs, u);
    const float d = f16_at(p + offsetof(B, d)), dmin = f16_at(p + offsetof(B, dmin));
    for (int s = 0; s < 16; ++s) {
      a[s] = d * float(scales[s] & 0xF);
      bb[s] = -dmin * float(scales[s] >> 4);
    }
  }
};
// Q3_K: u = q + 4 * hbit in 0..7, value d * sc * (u - 4); hbit of value 32 k + l (k = 0..7
// over the super-block) is bit k of hmask[l].
template <>
struct Fmt<DType::Q3_K> {
  static constexpr int G = 16;
  static constexpr bool kSigned = false, kHasB = true;
  static void unpack(const uint8_t* p, uint8_t* u, float* a, float* bb) {
    using B = BlockQ3_K;
    const uint8_t* qs = p + offsetof(B, qs);
    const uint8_t* hmask = p + offsetof(B, hmask);
    const uint8_t* scales = p + offsetof(B, scales);
    unpack_2bit(qs, u);
    for (int k = 0; k < 8; ++k)
      for (int l = 0; l < 32; ++l) u[32 * k + l] = uint8_t(u[32 * k + l] | ((hmask[l] >> k) & 1) << 2);
    const float d = f16_at(p + offsetof(B, d));
    for (int s = 0; s < 16; ++s) {
      const int lo = s < 8 ? scales[s] & 0xF : scales[s - 8] >> 4;
      const int hi = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
      a[s] = d * float((lo | hi << 4) - 32);
      bb[s] = -4.f * a[s];
    }
  }
};
// Q4_K / Q5_K: 8 sub-blocks of 32, 64 values per 32 bytes of qs (low nibbles first); Q5_K's
// 5th bit of value l of sub-block s is bit s of qh[l].
template <DType T>
struct FmtQ45K {
  static constexpr int G = 32;
  static constexpr bool kSigned = false, kHasB = true;
  static void unpack(const uint8_t* p, uint8_t* u, float* a, float* bb) {
    using B = std::conditional_t<T == DType::Q5_K, BlockQ5_K, BlockQ4_K>;
    const uint8_t* qs = p + offsetof(B, qs);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        u[64 * c + l] = qs[32 * c + l] & 0xF;
        u[64 * c + 32 + l] = qs[32 * c + l] >> 4;
      }
    if constexpr (T == DType::Q5_K)
      for (int s = 0; s < 8; ++s)
        for (int l = 0; l < 32; ++l) u[32 * s + l] = uint8_t(u[32 * s + l] | ((p[offsetof(B, qh) + l] >> s) & 1) << 4);
    const float d = f16_at(p + offsetof(B, d)), dmin = f16_at(p + offsetof(B, dmin));
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, m;
      scale_min_k4(s, p + offsetof(B, scales), sc, m);
      a[s] = d * float(sc);
      bb[s] = -dmin * float(m);
    }
  }
};
template <>
struct Fmt<DType::Q4_K> : FmtQ45K<DType::Q4_K> {};
template <>
struct Fmt<DType::Q5_K> : FmtQ45K<DType::Q5_K> {};
// Q6_K: per 128 values, value l + 32 k (k = 0..3) takes nibble k / 2 of ql[l + 32 (k % 2)]
// and bits 2k..2k+1 of qh[l]; value d * sc * (u - 32), 16 sub-blocks of 16.
template <>
struct Fmt<DType::Q6_K> {
  static constexpr int G = 16;
  static constexpr bool kSigned = false, kHasB = true;
  static void unpack(const uint8_t* p, uint8_t* u, float* a, float* bb) {
    using B = BlockQ6_K;
    const uint8_t* ql = p + offsetof(B, ql);
    const uint8_t* qh = p + offsetof(B, qh);
    const uint8_t* scales = p + offsetof(B, scales);
    for (int n = 0; n < 2; ++n)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const uint8_t lo = ql[64 * n + l + 32 * (k % 2)];
          u[128 * n + 32 * k + l] =
              uint8_t((k / 2 ? lo >> 4 : lo & 0xF) | ((qh[32 * n + l] >> (2 * k)) & 3) << 4);
        }
    const float d = f16_at(p + offsetof(B, d));
    for (int s = 0; s < 16; ++s) {
      a[s] = d * float(int8_t(scales[s]));
      bb[s] = -32.f * a[s];
    }
  }
};

// One chunk of up to 256 values, unpacked: codes, and per sub-block A = a * dx.
struct Chunk {
  alignas(64) uint8_t u[kQK_K];
  alignas(64) float A[kQK_K / 16];
};

// The scalar twin's dot: acc += the integer dot of codes u[0, n) with activations q[0, n) per
// sub-block of G, times A of the sub-block (n a multiple of 32).
struct DotScalar {
  using Acc = float;
  static Acc zero() { return 0.f; }
  template <int G, bool S>
  static void dot(const uint8_t* u, const int8_t* q, int n, const float* A, Acc& acc) {
    for (int j = 0; j < n / G; ++j) {
      int32_t t = 0;
      // Signed codes read through an int8 pointer: with each byte converted by int8_t(u[i])
      // instead, GCC 12.2 at -O2/-O3 summed the bytes as unsigned (QdotTest caught it).
      const auto* us = reinterpret_cast<const int8_t*>(u + j * G);
      for (int i = 0; i < G; ++i)
        t += (S ? int32_t(us[i]) : int32_t(u[j * G + i])) * int32_t(q[j * G + i]);
      acc += A[j] * float(t);
    }
  }
  static float finish(Acc a) { return a; }
};

#ifdef ARBITER_CPU_AVX2
// Register kernels, on 256-bit registers: codes unpacked in registers; for the super-block
// formats, each sub-block's integer sums scaled by its integer sub-scale inside the 16-bit
// multiply-add, so only a few f32 operations remain per super-block. I is the u8 x s8 dot:
// dot(u, x) gives 8 int32 lanes of 4 products each (maddubs + madd, or VNNI vpdpbusd on
// 256-bit registers, AVX512-VL). sdot (below, one form for both ISAs) scales instead.
struct I8Madd {
  static __m256i dot(__m256i w, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
  }
};
#if defined(ARBITER_CPU_AVX512) && defined(__AVX512VNNI__)
struct I8Vnni {
  static __m256i dot(__m256i w, __m256i x) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x); }
};
#else
using I8Vnni = I8Madd;
#endif

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// acc plus, in each int32 lane, its 4 products u x times the 16-bit scale s of their words:
// the same integers as s * dot(u, x), the lanes' scales coming from a register instead of a
// multiply per sub-block. maddubs's pair sums never saturate: |u| <= 128 and |x| <= 127
// (2 * 128 * 127 < 2^15).
inline __m256i sdot(__m256i acc, __m256i u, __m256i x, __m256i s) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), s));
}

// Word j of each 128-bit half of v, in all 8 words of that half.
inline __m256i spread_word(__m256i v, int j) {
  return _mm256_shuffle_epi8(v, _mm256_set1_epi16(int16_t((2 * j + 1) << 8 | 2 * j)));
}
// Formats of 16 sub-blocks of 16 (Q2_K, Q3_K, Q6_K) dot 32 values at a time, values
// 128 h + 32 k + [0, 32): sub-blocks s = 8 h + 2 k (the dot's lanes 0-3) and s + 1 (lanes 4-7).
// From the 16 sub-scales as 16-bit words, the words that scale them: s in the low half, s + 1
// in the high half.
inline __m256i scales_of_pair(__m256i sc16, int h, int k) {
  // Literal immediates: an unoptimised build (ASan) does not fold h ? 0x11 : 0x00 into one.
  const __m256i half = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11) : _mm256_permute2x128_si256(sc16, sc16, 0x00);
  return _mm256_shuffle_epi8(half, _mm256_set_m128i(_mm_set1_epi16(int16_t((4 * k + 3) << 8 | (4 * k + 2))),
                                                    _mm_set1_epi16(int16_t((4 * k + 1) << 8 | 4 * k))));
}

// A format's register kernel is one block's integer work, R::block(p, xq, xs, a, b, count):
// from the block at p and its activation codes xq (xs: their sums per 16), the integer sums
// in 8 int32 lanes (returned), the f32 factor a that scales them, and for the formats with a b
// term (R::kHasB) the f32 b and the integer counts it multiplies, in 8 int32 lanes too. The
// constants (masks, tables) are built once per call. qgemv_reg is the GEMV around them, the
// same for every format: per block acc += sums * (a dx) and bacc += counts * (b dx), in f32
// lanes, reduced once per row.
// Each block's bytes 2 KiB ahead are prefetched. The hardware prefetcher alone kept too few
// lines in flight for kernels with this many instructions per byte: Q4_K streamed 8.4 GB/s on
// 2 threads, 26 GB/s with the prefetch (bench/cpu_kernels_bench.cpp qgemv/q4_k; 1 KiB and
// 4 KiB were slower, docs/performance.md).
constexpr int64_t kPrefetchAhead = 2048;
// The integer sums' lanes: 8 (R::Sums __m256i) or 16 (__m512i, the 512-bit kernels below),
// each FMAed into its f32 lane; 16 lanes folded to 8 before the b term joins them.
inline __m256 zero_lanes(__m256i) { return _mm256_setzero_ps(); }
inline __m256 fma_lanes(__m256i s, float f, __m256 acc) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(f), acc);
}
inline __m256 fold_lanes(__m256 v) { return v; }
#if defined(ARBITER_CPU_AVX512) && defined(__AVX512VNNI__)
inline __m512 zero_lanes(__m512i) { return _mm512_setzero_ps(); }
inline __m512 fma_lanes(__m512i s, float f, __m512 acc) {
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(f), acc);
}
inline __m256 fold_lanes(__m512 v) {
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return _mm256_add_ps(_mm512_castps512_ps256(v), hi);
}
#endif
template <class I, class R>
void qgemv_reg(const void* Wv, int64_t K, const ActQ8& xa, float* y, int64_t n0, int64_t n1) {
  using B = typename R::Block;
  ARB_ASSERT(xa.block == R::kBlock && xa.K == K);
  const int64_t nb = K / R::kBlock;
  const R r;
  for (int64_t n = n0; n < n1; ++n) {
    const auto* row = static_cast<const uint8_t*>(Wv) + size_t(n * nb) * sizeof(B);
    auto acc = zero_lanes(typename R::Sums{});
    __m256 bacc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_lines(row + size_t(b) * sizeof(B) + kPrefetchAhead, sizeof(B));
      float a, bb = 0;
      __m256i count = _mm256_setzero_si256();
      const typename R::Sums s = r.template block<I>(row + size_t(b) * sizeof(B), xa.q.data() + b * R::kBlock,
                                                     xa.sums.data() + b * (R::kBlock / 16), a, bb, count);
      const float dx = xa.d[size_t(b)];
      acc = fma_lanes(s, a * dx, acc);
      if constexpr (R::kHasB) bacc = fma_lanes(count, bb * dx, bacc);
    }
    y[n] = VAvx2::reduce_add(R::kHasB ? _mm256_add_ps(fold_lanes(acc), bacc) : fold_lanes(acc));
  }
}

// Q8_0: the signed dot (w's sign moved onto x); a = d.
struct RegQ8_0 {
  using Block = BlockQ8_0;
  using Sums = __m256i;
  static constexpr int kBlock = kQK;
  static constexpr bool kHasB = false;
  template <class I>
  __m256i block(const uint8_t* p, const int8_t* xq, const int16_t*, float& a, float&, __m256i&) const {
    const __m256i w = load32(p + offsetof(Block, qs)), x = load32(xq);
    a = f16_at(p + offsetof(Block, d));
    return I::dot(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
  }
};

// The other formats of 32-value blocks (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4): the nibbles
// (plus Q5's 5th bit from qh, or the IQ4_NL / MXFP4 table through a byte shuffle) unpacked
// in a register, one dot. Q4_0 and Q5_0 take their offset (8, 16) in the codes, a signed dot
// of u - offset (the same integer as sum(u q) - offset sum(q)), a = d and no b term; Q4_1 and
// Q5_1 keep a = d, b = m, count = sum(q) in lane 0.
template <DType T>
struct Reg32 {
  using F = Fmt<T>;
  using Sums = __m256i;
  using Block = std::conditional_t<T == DType::Q4_0, BlockQ4_0,
                std::conditional_t<T == DType::Q4_1, BlockQ4_1,
                std::conditional_t<T == DType::Q5_0, BlockQ5_0,
                std::conditional_t<T == DType::Q5_1, BlockQ5_1,
                std::conditional_t<T == DType::IQ4_NL, BlockIQ4_NL, BlockMXFP4>>>>>;
  static constexpr int kBlock = kQK;
  static constexpr int kOffset = T == DType::Q4_0 ? 8 : T == DType::Q5_0 ? 16 : 0;
  static constexpr bool kHasB = F::kHasB && kOffset == 0;
  static constexpr bool kQ5 = T == DType::Q5_0 || T == DType::Q5_1;
  const __m256i m4 = _mm256_set1_epi8(0xF);
  const __m256i table = F::kSigned ? _mm256_broadcastsi128_si256(load16(T == DType::IQ4_NL ? kIQ4NLValues : kMXFP4Values))
                                   : _mm256_setzero_si256();
  // Q5: byte j of the expanded qh takes byte j / 8 of qh and tests bit j % 8.
  const __m256i qh_shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                           2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i qh_bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
  template <class I>
  __m256i block(const uint8_t* p, const int8_t* xq, const int16_t* xs, float& a, float& b,
                __m256i& count) const {
    const __m128i raw = load16(p + offsetof(Block, qs));
    __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), m4);
    if constexpr (kQ5) {
      uint32_t qh;
      std::memcpy(&qh, p + offsetof(Block, qh), 4);
      const __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32(int32_t(qh)), qh_shuf);
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bits, qh_bit), qh_bit);
      u = _mm256_or_si256(u, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
    const __m256i x = load32(xq);
    __m256i s;
    if constexpr (F::kSigned || kOffset) {
      u = F::kSigned ? _mm256_shuffle_epi8(table, u) : _mm256_sub_epi8(u, _mm256_set1_epi8(kOffset));
      s = I::dot(_mm256_abs_epi8(u), _mm256_sign_epi8(x, u));
    } else {
      s = I::dot(u, x);
    }
    if constexpr (kOffset) {
      a = f16_at(p + offsetof(Block, d));
    } else {
      F::scales(p, a, b);
      if constexpr (kHasB) count = _mm256_setr_epi32(xs[0] + xs[1], 0, 0, 0, 0, 0, 0, 0);
    }
    return s;
  }
};

// IQ4_XS: 8 sub-blocks of 32, each IQ4_NL's nibble layout and table, sub-scale ls - 32;
// |sum| <= 8 * 32 * 32 * 127 * 127 < 2^31: exact; a = d.
struct RegIq4Xs {
  using Block = BlockIQ4_XS;
  using Sums = __m256i;
  static constexpr int kBlock = kQK_K;
  static constexpr bool kHasB = false;
  const __m256i m4 = _mm256_set1_epi8(0xF);
  const __m256i table = _mm256_broadcastsi128_si256(load16(kIQ4NLValues));
  template <class I>
  __m256i block(const uint8_t* p, const int8_t* xq, const int16_t*, float& a, float&, __m256i&) const {
    using B = Block;
    const uint16_t sh = f16_bits_at(p + offsetof(B, scales_h));
    __m256i isum = _mm256_setzero_si256();
    for (int s = 0; s < 8; ++s) {
      const __m128i raw = load16(p + offsetof(B, qs) + 16 * s);
      const __m256i u = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), m4));
      const __m256i x = load32(xq + 32 * s);
      const int ls = ((p[offsetof(B, scales_l) + s / 2] >> (4 * (s % 2))) & 0xF) | ((sh >> (2 * s)) & 3) << 4;
      isum = sdot(isum, _mm256_abs_epi8(u), _mm256_sign_epi8(x, u), _mm256_set1_epi16(int16_t(ls - 32)));
    }
    a = f16_at(p + offsetof(B, d));
    return isum;
  }
};

// Q4_K / Q5_K: sum_j d sc_j dx sum(u q) - dmin dx sum_j m_j sum(q): both sums exact in int32
// (|sum_j sc_j sum(u q)| <= 8 * 63 * 32 * 31 * 127 < 2^31); a = d, b = -dmin, count lane j
// = m_j sum(q) over sub-block j. The 12 scale bytes decoded word-parallel (scales_mins_k4),
// widened to 16-bit words, word j spread over a register per sub-block; the codes from
// k45_codes (unpack.h).
template <DType T>
struct RegQ45K {
  using Block = std::conditional_t<T == DType::Q5_K, BlockQ5_K, BlockQ4_K>;
  using Sums = __m256i;
  static constexpr int kBlock = kQK_K;
  static constexpr bool kHasB = true;
  template <class I>
  __m256i block(const uint8_t* p, const int8_t* xq, const int16_t* xs, float& a, float& b,
                __m256i& count) const {
    using B = Block;
    uint64_t sc8, m8;
    scales_mins_k4(p + offsetof(B, scales), sc8, m8);
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sc8))));
    // Words 2 j and 2 j + 1 take m_j, against the two sums of 16 of sub-block j.
    const __m128i mv = _mm_cvtsi64_si128(int64_t(m8));
    count = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv)), load32(xs));
    __m256i qh = _mm256_setzero_si256();
    if constexpr (T == DType::Q5_K) qh = load32(p + offsetof(B, qh));
    __m256i isum = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j)
      isum = sdot(isum, k45_codes<T == DType::Q5_K>(p + offsetof(B, qs), qh, j), load32(xq + 32 * j),
                  spread_word(sc, j));
    a = f16_at(p + offsetof(B, d));
    b = -f16_at(p + offsetof(B, dmin));
    return isum;
  }
};

// Q2_K / Q3_K: 16 sub-blocks of 16; per 32 bytes of qs (half n of the super-block), shift 2j
// gives values 128 n + 32 j + l, l = 0..31 (scales_of_pair's order). Q2_K: u the 2 bits,
// sum_s sc_s sum(u q) exact in int32 (<= 16 * 15 * 16 * 3 * 127); a = d, b = -dmin, count lane
// i = m_2i sum(q)_2i + m_2i+1 sum(q)_2i+1. Q3_K: u = the 2 bits + 4 hbit in 0..7 (hbit of
// value 32 k + l, k = 4 n + j, is bit k of hmask[l]: a 16-bit shift by k < 8 brings it to bit
// 0 of its own byte), value d (s - 32) (u - 4): sum_s (s - 32) (sum(u q) - 4 sum(q)) exact in
// int32 (<= 16 * 32 * 16 * 11 * 127), the -4 offset taken per lane as Q6_K's -32; a = d. Q3_K's
// 6-bit scales come word-parallel: sub-blocks 4 g .. 4 g + 3 take nibble g / 2 of bytes
// 4 (g % 2) .. + 3 and bits 2 g, 2 g + 1 of bytes 8 .. 11.
template <DType T>
struct RegQ23K {
  using Block = std::conditional_t<T == DType::Q3_K, BlockQ3_K, BlockQ2_K>;
  using Sums = __m256i;
  static constexpr int kBlock = kQK_K;
  static constexpr bool kHasB = T == DType::Q2_K;
  const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  template <class I>
  __m256i block(const uint8_t* p, const int8_t* xq, const int16_t* xs, float& a, float& b,
                __m256i& count) const {
    using B = Block;
    __m256i sc, isum;
    if constexpr (T == DType::Q2_K) {
      const __m128i v = load16(p + offsetof(B, scales));
      sc = _mm256_cvtepu8_epi16(_mm_and_si128(v, _mm_set1_epi8(0xF)));
      count = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0xF))),
                                load32(xs));
      isum = _mm256_setzero_si256();
    } else {
      uint32_t w[3];
      std::memcpy(w, p + offsetof(B, scales), 12);
      const uint32_t lo4 = 0x0F0F0F0Fu, lo2 = 0x03030303u;
      const __m128i v = _mm_setr_epi32(int32_t((w[0] & lo4) | (w[2] & lo2) << 4),
                                       int32_t((w[1] & lo4) | ((w[2] >> 2) & lo2) << 4),
                                       int32_t(((w[0] >> 4) & lo4) | ((w[2] >> 4) & lo2) << 4),
                                       int32_t(((w[1] >> 4) & lo4) | ((w[2] >> 6) & lo2) << 4));
      sc = _mm256_sub_epi16(_mm256_cvtepu8_epi16(v), _mm256_set1_epi16(32));
      isum = _mm256_slli_epi32(_mm256_madd_epi16(sc, load32(xs)), 2);
      isum = _mm256_sub_epi32(_mm256_setzero_si256(), isum);
    }
    __m256i hm = _mm256_setzero_si256();
    if constexpr (T == DType::Q3_K) hm = load32(p + offsetof(B, hmask));
    for (int n = 0; n < 2; ++n) {
      const __m256i q = load32(p + offsetof(B, qs) + 32 * n);
      for (int j = 0; j < 4; ++j) {
        __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m2);
        if constexpr (T == DType::Q3_K)
          u = _mm256_or_si256(u, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * n + j), one), 2));
        isum = sdot(isum, u, load32(xq + 128 * n + 32 * j), scales_of_pair(sc, n, j));
      }
    }
    if constexpr (T == DType::Q2_K) b = -f16_at(p + offsetof(B, dmin));
    a = f16_at(p + offsetof(B, d));
    return isum;
  }
};

// Q6_K: sum_s sc_s (sum(u q) - 32 sum(q)) exact in int32 (< 16 * 128 * 16 * 95 * 127); a = d.
// The -32 offset per lane: lane i starts at -32 (sc_2i sum(q)_2i + sc_2i+1 sum(q)_2i+1).
struct RegQ6K {
  using Block = BlockQ6_K;
  using Sums = __m256i;
  static constexpr int kBlock = kQK_K;
  static constexpr bool kHasB = false;
  template <class I>
  __m256i block(const uint8_t* p, const int8_t* xq, const int16_t* xs, float& a, float&, __m256i&) const {
    using B = Block;
    const __m256i sc = _mm256_cvtepi8_epi16(load16(p + offsetof(B, scales)));
    __m256i isum = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc, load32(xs)), 5));
    for (int h = 0; h < 2; ++h) {
      __m256i u[4];
      q6k_codes(p + offsetof(B, ql) + 64 * h, p + offsetof(B, qh) + 32 * h, u);
      for (int k = 0; k < 4; ++k)
        isum = sdot(isum, u[k], load32(xq + 128 * h + 32 * k), scales_of_pair(sc, h, k));
    }
    a = f16_at(p + offsetof(B, d));
    return isum;
  }
};

#if defined(ARBITER_CPU_AVX512) && defined(__AVX512VNNI__)
// 512-bit kernels for the k-quants of the common mixtures (Q4_K_M, Q5_K_M: Q4_K or Q5_K with
// Q6_K). A register holds 64 values: two sub-blocks of 32 (Q4_K, Q5_K) or four of 16 (Q6_K),
// one per 256 or 128 bits. The codes come from one 64-byte load or one 32-byte broadcast, each
// half shifted its own way by a masked shift (no cross-lane shuffle); maddubs forms the 16-bit
// pair sums and vpdpwssd multiplies them by the sub-scales' words (one vpermw a register) into
// int32 lanes: two instructions per 64 values, where the 256-bit kernels take three per 32.
// One thread from L2 on the Zen 5 VM (512-bit datapaths; bench/cpu_kernels_bench.cpp
// qgemv_hot, the 256-bit kernels in the avx2 rows): Q4_K 27.4 -> 32.2 GB/s, Q5_K 25.2 -> 33.6,
// Q6_K 36.8 -> 54.9; Q8_0 (qgemv_q8_0_zmm, below) 35.1 -> 53.3. A thread streams 40 GB/s.
inline __m512i zdot(__m512i acc, __m512i u, __m512i x, __m512i s) {
  return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u, x), s);
}
inline __m512i load64(const void* p) { return _mm512_loadu_si512(p); }
inline __m512i bcast32(const void* p) { return _mm512_broadcast_i64x4(load32(p)); }
// vpermw's index for a register of sub-blocks first, first + 1, ... of `words` words each
// (maddubs' words: 2 values each): word w takes sub-scale first + w / words.
inline __m512i subscale_index(int first, int words) {
  alignas(64) int16_t idx[32];
  for (int w = 0; w < 32; ++w) idx[w] = int16_t(first + w / words);
  return _mm512_load_si512(idx);
}
constexpr __mmask32 kLowWords = 0x0000FFFF, kHighWords = 0xFFFF0000;

// Q4_K / Q5_K (RegQ45K's sums): register p holds sub-blocks 2p (the low nibbles of qs[32 p,
// + 32), in the low half) and 2p + 1 (their high nibbles); Q5_K's 5th bit of sub-block j is
// bit j of qh[l], tested per byte (vptestmb) and added as 16.
template <DType T>
struct ZRegQ45K {
  using Block = std::conditional_t<T == DType::Q5_K, BlockQ5_K, BlockQ4_K>;
  using Sums = __m512i;
  static constexpr int kBlock = kQK_K;
  static constexpr bool kHasB = true;
  const __m512i m4 = _mm512_set1_epi8(0xF), c16 = _mm512_set1_epi8(0x10);
  __m512i idx[4], hbit[4];
  ZRegQ45K() {
    for (int p = 0; p < 4; ++p) {
      idx[p] = subscale_index(2 * p, 16);
      hbit[p] = _mm512_inserti64x4(_mm512_set1_epi8(char(1 << 2 * p)),
                                   _mm256_set1_epi8(char(1 << (2 * p + 1))), 1);
    }
  }
  template <class I>
  __m512i block(const uint8_t* p, const int8_t* xq, const int16_t* xs, float& a, float& b,
                __m256i& count) const {
    using B = Block;
    uint64_t sc8, m8;
    scales_mins_k4(p + offsetof(B, scales), sc8, m8);
    const __m512i sc = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(int64_t(sc8))));
    const __m128i mv = _mm_cvtsi64_si128(int64_t(m8));
    count = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv)), load32(xs));
    __m512i qh = _mm512_setzero_si512();
    if constexpr (T == DType::Q5_K) qh = bcast32(p + offsetof(B, qh));
    __m512i isum = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j) {
      const __m512i q = bcast32(p + offsetof(B, qs) + 32 * j);
      __m512i u = _mm512_and_si512(_mm512_mask_srli_epi16(q, kHighWords, q, 4), m4);
      if constexpr (T == DType::Q5_K) u = _mm512_mask_add_epi8(u, _mm512_test_epi8_mask(qh, hbit[j]), u, c16);
      isum = zdot(isum, u, load64(xq + 64 * j), _mm512_permutexvar_epi16(idx[j], sc));
    }
    a = f16_at(p + offsetof(B, d));
    b = -f16_at(p + offsetof(B, dmin));
    return isum;
  }
};

// Q6_K (RegQ6K's sums): register 2 h + g holds values 128 h + 64 g + [0, 64), sub-blocks
// 8 h + 4 g + [0, 4): for g = 0 the low nibbles of ql[64 h, + 64) (q6k_codes' k = 0 in the low
// half, k = 1 in the high), for g = 1 their high nibbles (k = 2, 3); bits 2k, 2k + 1 of qh[l]
// moved to bits 4-5 by a shift of 4, 2, 0 or -2.
struct ZRegQ6K {
  using Block = BlockQ6_K;
  using Sums = __m512i;
  static constexpr int kBlock = kQK_K;
  static constexpr bool kHasB = false;
  const __m512i m4 = _mm512_set1_epi8(0xF), m30 = _mm512_set1_epi8(0x30);
  __m512i idx[4];
  ZRegQ6K() {
    for (int m = 0; m < 4; ++m) idx[m] = subscale_index(4 * m, 8);
  }
  template <class I>
  __m512i block(const uint8_t* p, const int8_t* xq, const int16_t* xs, float& a, float&, __m256i&) const {
    using B = Block;
    const __m256i sc16 = _mm256_cvtepi8_epi16(load16(p + offsetof(B, scales)));
    const __m512i sc = _mm512_castsi256_si512(sc16);
    __m512i isum = _mm512_zextsi256_si512(
        _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, load32(xs)), 5)));
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = load64(p + offsetof(B, ql) + 64 * h), qh = bcast32(p + offsetof(B, qh) + 32 * h);
      const __m512i h01 = _mm512_mask_slli_epi16(_mm512_slli_epi16(qh, 2), kLowWords, qh, 4);
      const __m512i h23 = _mm512_mask_srli_epi16(qh, kHighWords, qh, 2);
      const __m512i u01 = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(h01, m30));
      const __m512i u23 =
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4), _mm512_and_si512(h23, m30));
      isum = zdot(isum, u01, load64(xq + 128 * h), _mm512_permutexvar_epi16(idx[2 * h], sc));
      isum = zdot(isum, u23, load64(xq + 128 * h + 64), _mm512_permutexvar_epi16(idx[2 * h + 1], sc));
    }
    a = f16_at(p + offsetof(B, d));
    return isum;
  }
};

// Q8_0, two blocks a register: the codes of block b in the low half, b + 1 in the high; w's
// sign moved onto x (x negated where w < 0; |w| <= 128 read unsigned: the exact product), one
// vpdpbusd, then each half's f32 factor d dx in one FMA. Four blocks a step share the
// conversion of their scales (one vcvtph2ps, one multiply by the 4 dx, one vpermps a
// register); a last 1-3 blocks run one at a time in the low half. Its own GEMV: qgemv_reg
// takes one factor a block.
void qgemv_q8_0_zmm(const void* Wv, int64_t K, const ActQ8& xa, float* y, int64_t n0, int64_t n1) {
  using B = BlockQ8_0;
  ARB_ASSERT(xa.block == kQK && xa.K == K);
  const int64_t nb = K / kQK;
  const __m512i spread[2] = {_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                             _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3)};
  // The exact integer dot of w and x per 4 values, in 16 lanes.
  auto dot = [](__m512i w, __m512i x) {
    const __m512i xs = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
    return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), xs));
  };
  for (int64_t n = n0; n < n1; ++n) {
    const auto* row = static_cast<const uint8_t*>(Wv) + size_t(n * nb) * sizeof(B);
    __m512 acc = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
      const uint8_t* p = row + size_t(b) * sizeof(B);
      prefetch_lines(p + kPrefetchAhead, 4 * sizeof(B));
      uint64_t d4 = 0;
      for (int i = 0; i < 4; ++i) d4 |= uint64_t(f16_bits_at(p + i * sizeof(B) + offsetof(B, d))) << (16 * i);
      const __m512 f = _mm512_castps128_ps512(
          _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi64_si128(int64_t(d4))), _mm_loadu_ps(xa.d.data() + b)));
      for (int h = 0; h < 2; ++h) {
        const uint8_t* q = p + 2 * h * sizeof(B) + offsetof(B, qs);
        const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(load32(q)), load32(q + sizeof(B)), 1);
        acc = _mm512_fmadd_ps(dot(w, load64(xa.q.data() + (b + 2 * h) * kQK)),
                              _mm512_permutexvar_ps(spread[h], f), acc);
      }
    }
    for (; b < nb; ++b) {
      const uint8_t* p = row + size_t(b) * sizeof(B);
      const __m512 s = dot(_mm512_zextsi256_si512(load32(p + offsetof(B, qs))),
                           _mm512_zextsi256_si512(load32(xa.q.data() + b * kQK)));
      acc = _mm512_fmadd_ps(s, _mm512_set1_ps(f16_at(p + offsetof(B, d)) * xa.d[size_t(b)]), acc);
    }
    y[n] = VAvx2::reduce_add(fold_lanes(acc));
  }
}
#endif
#endif

// The scalar twin's GEMV: per row, chunks of 256 values (one super-block, or up to 8 blocks of
// 32) unpacked to bytes by Fmt<T>, then DotScalar.
template <DType T>
void qgemv_bytes(const void* Wv, int64_t K, const ActQ8& xa, float* y, int64_t n0, int64_t n1) {
  using F = Fmt<T>;
  constexpr int kBlock = qblock(T), kSub = kBlock / F::G;
  ARB_ASSERT(xa.block == kBlock && xa.K == K && K % kBlock == 0);
  const size_t bb = block_bytes(T);
  const int64_t nb = K / kBlock;
  Chunk c;
  float a[kQK_K / 16], b[kQK_K / 16];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = static_cast<const uint8_t*>(Wv) + size_t(n * nb) * bb;
    DotScalar::Acc acc = DotScalar::zero();
    float bias = 0;
    for (int64_t k0 = 0; k0 < K; k0 += kQK_K) {
      const int kc = int(std::min<int64_t>(kQK_K, K - k0));
      for (int i = 0; i < kc / kBlock; ++i) {
        const int64_t blk = k0 / kBlock + i;
        F::unpack(row + size_t(blk) * bb, c.u + i * kBlock, a + i * kSub, b + i * kSub);
        const float dx = xa.d[size_t(blk)];
        for (int s = 0; s < kSub; ++s) {
          const int j = i * kSub + s;
          c.A[j] = a[j] * dx;
          if constexpr (F::kHasB) {
            const int64_t s16 = (k0 + int64_t(j) * F::G) / 16;
            const int32_t xs = F::G == 16 ? xa.sums[size_t(s16)] : xa.sums[size_t(s16)] + xa.sums[size_t(s16) + 1];
            bias += b[j] * dx * float(xs);
          }
        }
      }
      DotScalar::dot<F::G, F::kSigned>(c.u, xa.q.data() + k0, kc, c.A, acc);
    }
    y[n] = DotScalar::finish(acc) + bias;
  }
}

QGemvFn qgemv_scalar(DType t) {
  switch (t) {
    case DType::Q8_0: return qgemv_bytes<DType::Q8_0>;
    case DType::Q4_0: return qgemv_bytes<DType::Q4_0>;
    case DType::Q4_1: return qgemv_bytes<DType::Q4_1>;
    case DType::Q5_0: return qgemv_bytes<DType::Q5_0>;
    case DType::Q5_1: return qgemv_bytes<DType::Q5_1>;
    case DType::Q2_K: return qgemv_bytes<DType::Q2_K>;
    case DType::Q3_K: return qgemv_bytes<DType::Q3_K>;
    case DType::Q4_K: return qgemv_bytes<DType::Q4_K>;
    case DType::Q5_K: return qgemv_bytes<DType::Q5_K>;
    case DType::Q6_K: return qgemv_bytes<DType::Q6_K>;
    case DType::IQ4_NL: return qgemv_bytes<DType::IQ4_NL>;
    case DType::IQ4_XS: return qgemv_bytes<DType::IQ4_XS>;
    case DType::MXFP4: return qgemv_bytes<DType::MXFP4>;
    default: return nullptr;
  }
}

#ifdef ARBITER_CPU_AVX2
// The vector ISAs: every format's register kernel, I the ISA's u8 x s8 dot.
template <class I>
QGemvFn qgemv_registers(DType t) {
  switch (t) {
    case DType::Q8_0: return qgemv_reg<I, RegQ8_0>;
    case DType::Q4_0: return qgemv_reg<I, Reg32<DType::Q4_0>>;
    case DType::Q4_1: return qgemv_reg<I, Reg32<DType::Q4_1>>;
    case DType::Q5_0: return qgemv_reg<I, Reg32<DType::Q5_0>>;
    case DType::Q5_1: return qgemv_reg<I, Reg32<DType::Q5_1>>;
    case DType::IQ4_NL: return qgemv_reg<I, Reg32<DType::IQ4_NL>>;
    case DType::MXFP4: return qgemv_reg<I, Reg32<DType::MXFP4>>;
    case DType::Q2_K: return qgemv_reg<I, RegQ23K<DType::Q2_K>>;
    case DType::Q3_K: return qgemv_reg<I, RegQ23K<DType::Q3_K>>;
    case DType::Q4_K: return qgemv_reg<I, RegQ45K<DType::Q4_K>>;
    case DType::Q5_K: return qgemv_reg<I, RegQ45K<DType::Q5_K>>;
    case DType::Q6_K: return qgemv_reg<I, RegQ6K>;
    case DType::IQ4_XS: return qgemv_reg<I, RegIq4Xs>;
    default: return nullptr;
  }
}
#endif

}  // namespace

QGemvFn qgemv_kernel(Isa isa, DType dtype) {
  switch (isa) {
    case Isa::Scalar: return qgemv_scalar(dtype);
#ifdef ARBITER_CPU_AVX2
    case Isa::Avx2: return qgemv_registers<I8Madd>(dtype);
#endif
#ifdef ARBITER_CPU_AVX512
    case Isa::Avx512:
#ifdef __AVX512VNNI__
      if (dtype == DType::Q8_0) return qgemv_q8_0_zmm;
      if (dtype == DType::Q4_K) return qgemv_reg<I8Vnni, ZRegQ45K<DType::Q4_K>>;
      if (dtype == DType::Q5_K) return qgemv_reg<I8Vnni, ZRegQ45K<DType::Q5_K>>;
      if (dtype == DType::Q6_K) return qgemv_reg<I8Vnni, ZRegQ6K>;
#endif
      return qgemv_registers<I8Vnni>(dtype);
#endif
    default: return nullptr;
  }
}

}  // namespace arbiter::cpu
