// GEMV (the T == 1 matmul of decode) and exact row widening, per weight dtype and ISA.
//
// Decode reads every weight once per token, so these kernels are bound by memory bandwidth:
// each weight is loaded in its storage dtype and widened in registers (bf16: a 16-bit shift;
// f16: vcvtph2ps; q8_0: int8 -> f32 times the block scale; the other block formats: a chunk
// dequantized into an L1 buffer). One row at a time, each with two accumulators
// (independent FMA chains hide the FMA latency).
// These are the exact f32 paths: by default the backend runs a T == 1 matmul of a ggml block
// format on qdot.cpp's integer kernels instead, x quantized to 8 bits (CpuOptions::act_quant).
#include <algorithm>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/unpack.h"
#include "core/error.h"
#include "core/quant.h"

namespace arbiter::cpu {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

const std::vector<Isa>& available_isas() {
  static const std::vector<Isa> isas = [] {
    std::vector<Isa> v{Isa::Scalar};
    __builtin_cpu_init();
#ifdef ARBITER_CPU_AVX2
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) v.push_back(Isa::Avx2);
#endif
#ifdef ARBITER_CPU_AVX512
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
      v.push_back(Isa::Avx512);
#endif
    return v;
  }();
  return isas;
}

Isa best_isa() { return available_isas().back(); }

namespace {

// Loaders of dense weight rows: element type E, full vector and partial (n < W) loads.
template <class V>
struct LoadF32 {
  using E = float;
  static typename V::R load(const E* p) { return V::load(p); }
  static typename V::R load_n(const E* p, int n) { return V::load_n(p, n); }
};
template <class V>
struct LoadBf16 {
  using E = uint16_t;
  static typename V::R load(const E* p) { return V::load_bf16(p); }
  static typename V::R load_n(const E* p, int n) { return V::load_bf16_n(p, n); }
};
template <class V>
struct LoadF16 {
  using E = uint16_t;
  static typename V::R load(const E* p) { return V::load_f16(p); }
  static typename V::R load_n(const E* p, int n) { return V::load_f16_n(p, n); }
};

// One row at a time. Zen 4 (2-vCPU EPYC VM) streamed bf16 qwen3-0.6b decode at 18.9 tok/s
// with four rows sharing each load of x and 26-36 tok/s with one row: four concurrent
// streams per core kept its hardware prefetcher from running ahead (docs/performance.md,
// session 30). Each row's bytes 1 KiB ahead are prefetched, and near its end the start of the
// next row: with the hardware prefetcher alone, the Intel VM of sessions 25-28 read 0.64 of
// the limit, with the prefetch inside rows 0.81, with the next rows' starts too 0.90; on Zen 4
// the prefetch neither helps nor hurts.
constexpr int64_t kAheadBytes = 1024;
// Per row: accumulator 0 takes even vector steps, accumulator 1 odd steps and the partial
// tail, then acc0 + acc1 and a fixed-order horizontal sum.
template <class V, class L>
inline float gemv_dense_row(const typename L::E* row, int64_t K, const float* x) {
  using R = typename V::R;
  constexpr int W = V::W;
  R acc0 = V::zero(), acc1 = V::zero();
  int64_t k = 0;
  constexpr int64_t ahead = kAheadBytes / int64_t(sizeof(typename L::E));
  for (; k + 2 * W <= K; k += 2 * W) {
    prefetch_lines(row + k + ahead, 2 * W * sizeof(typename L::E));
    acc0 = V::fma(L::load(row + k), V::load(x + k), acc0);
    acc1 = V::fma(L::load(row + k + W), V::load(x + k + W), acc1);
  }
  if (k + W <= K) {
    acc0 = V::fma(L::load(row + k), V::load(x + k), acc0);
    k += W;
  }
  if (k < K) {
    const int n = int(K - k);
    acc1 = V::fma(L::load_n(row + k, n), V::load_n(x + k, n), acc1);
  }
  return V::reduce_add(V::add(acc0, acc1));
}

template <class V, template <class> class LT>
void gemv_dense(const void* Wv, int64_t K, const float* x, float* y, int64_t n0, int64_t n1) {
  using L = LT<V>;
  const auto* W = static_cast<const typename L::E*>(Wv);
  for (int64_t n = n0; n < n1; ++n) y[n] = gemv_dense_row<V, L>(W + n * K, K, x);
}

// q8_0: per block, t = sum of q * x over its 32 values in f32, then acc += d * t (the scale
// applied once per block, as ggml does). Accumulators alternate by block parity.
template <class V>
void gemv_q8(const void* Wv, int64_t K, const float* x, float* y, int64_t n0, int64_t n1) {
  using R = typename V::R;
  constexpr int S = kQ8BlockSize / V::W;
  const auto* W = static_cast<const BlockQ8_0*>(Wv);
  const int64_t nb = K / kQ8BlockSize;
  for (int64_t n = n0; n < n1; ++n) {
    const BlockQ8_0* row = W + n * nb;
    R acc[2] = {V::zero(), V::zero()};
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + b * kQ8BlockSize;
      R t = V::mul(V::load_i8(row[b].qs), V::load(xb));
      for (int s = 1; s < S; ++s) t = V::fma(V::load_i8(row[b].qs + s * V::W), V::load(xb + s * V::W), t);
      acc[b & 1] = V::fma(V::set1(V::f16_scalar(row[b].d)), t, acc[b & 1]);
    }
    y[n] = V::reduce_add(V::add(acc[0], acc[1]));
  }
}

// The other block formats (MLX's repacked blocks too): each row is dequantized a chunk of
// 256 values at a time (one super-block, or 8 small blocks) into an f32 buffer (each value
// the exact one rounded once, core/quant.h) and dotted with x by the ISA's FMA, accumulators
// alternating by vector step. The scale is applied while widening, not once per block as for
// q8_0: k-quants have a scale and a min per sub-block, so this keeps one kernel for all of
// them.
template <class V, DType T>
void gemv_blocks(const void* Wv, int64_t K, const float* x, float* y, int64_t n0, int64_t n1) {
  using R = typename V::R;
  constexpr int64_t kChunk = 256;
  const int64_t be = block_elems(T);
  const size_t row_bytes = dtype_bytes(T, K);
  alignas(64) float w[kChunk];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = static_cast<const uint8_t*>(Wv) + size_t(n) * row_bytes;
    R acc[2] = {V::zero(), V::zero()};
    int64_t step = 0;
    for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
      const int64_t kc = std::min(kChunk, K - k0);  // a multiple of the block (and of W)
      dequant_blocks(T, row + dtype_bytes(T, k0), kc / be, w);
      for (int64_t k = 0; k < kc; k += V::W, ++step)
        acc[step & 1] = V::fma(V::load(w + k), V::load(x + k0 + k), acc[step & 1]);
    }
    y[n] = V::reduce_add(V::add(acc[0], acc[1]));
  }
}

template <DType T>
void widen_blocks(const void* src, float* dst, int64_t n) {
  dequant_blocks(T, static_cast<const uint8_t*>(src), n / block_elems(T), dst);
}

#ifdef ARBITER_CPU_AVX2
// The k-quants of Q4_K_M / Q5_K_M files widened in registers (the prefill GEMM widens every
// weight of a forward; dequant_blocks' scalar loop took as long as the GEMM itself). The
// values are dequant_blocks' bit for bit: d sc q - dmin m with d sc q exact in f32 (11 + 6 + 5
// bits), so one rounding either way; Q6_K's d sc (q - 32) is one product of an exact d sc.
// 32 codes u (bytes; int8 when kSigned) become a u + b: a0 for the first 16, a1 for the rest.
template <bool kSigned, bool kHasB>
inline void widen32(__m256i u, __m256 a0, __m256 a1, __m256 b, float* dst) {
  const __m128i h[2] = {_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1)};
  for (int i = 0; i < 4; ++i) {
    const __m128i g = i % 2 ? _mm_srli_si128(h[i / 2], 8) : h[i / 2];
    const __m256 v = _mm256_cvtepi32_ps(kSigned ? _mm256_cvtepi8_epi32(g) : _mm256_cvtepu8_epi32(g));
    const __m256 a = i < 2 ? a0 : a1;
    _mm256_storeu_ps(dst + 8 * i, kHasB ? _mm256_fmadd_ps(a, v, b) : _mm256_mul_ps(a, v));
  }
}

template <DType T>
void widen_q45k(const void* src, float* dst, int64_t n) {
  using B = std::conditional_t<T == DType::Q5_K, BlockQ5_K, BlockQ4_K>;
  const auto* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i, p += sizeof(B), dst += kQK_K) {
    uint64_t sc, m;
    scales_mins_k4(p + offsetof(B, scales), sc, m);
    const float d = f16_at(p + offsetof(B, d)), dmin = f16_at(p + offsetof(B, dmin));
    __m256i qh = _mm256_setzero_si256();
    if constexpr (T == DType::Q5_K) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + offsetof(B, qh)));
    for (int s = 0; s < 8; ++s) {
      const __m256i u = k45_codes<T == DType::Q5_K>(p + offsetof(B, qs), qh, s);
      const __m256 a = _mm256_set1_ps(d * float(uint8_t(sc >> (8 * s))));
      widen32<false, true>(u, a, a, _mm256_set1_ps(-(dmin * float(uint8_t(m >> (8 * s))))), dst + 32 * s);
    }
  }
}

void widen_q6k(const void* src, float* dst, int64_t n) {
  using B = BlockQ6_K;
  const auto* p = static_cast<const uint8_t*>(src);
  const __m256i off = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < n / kQK_K; ++i, p += sizeof(B), dst += kQK_K) {
    const float d = f16_at(p + offsetof(B, d));
    const auto* scales = reinterpret_cast<const int8_t*>(p + offsetof(B, scales));
    for (int h = 0; h < 2; ++h) {
      __m256i u[4];
      q6k_codes(p + offsetof(B, ql) + 64 * h, p + offsetof(B, qh) + 32 * h, u);
      for (int k = 0; k < 4; ++k) {
        const int s = 8 * h + 2 * k;
        widen32<true, false>(_mm256_sub_epi8(u[k], off), _mm256_set1_ps(d * float(scales[s])),
                             _mm256_set1_ps(d * float(scales[s + 1])), _mm256_setzero_ps(),
                             dst + 128 * h + 32 * k);
      }
    }
  }
}
#endif

template <class V, template <class> class LT>
void widen_dense(const void* src, float* dst, int64_t n) {
  using L = LT<V>;
  const auto* s = static_cast<const typename L::E*>(src);
  int64_t k = 0;
  for (; k + V::W <= n; k += V::W) V::store(dst + k, L::load(s + k));
  if (k < n) V::store_n(dst + k, L::load_n(s + k, int(n - k)), int(n - k));
}

// d * q is exact in f32 (an 11-bit f16 significand times an 8-bit integer), as in row_to_f32.
template <class V>
void widen_q8(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQ8BlockSize; ++i) {
    const typename V::R d = V::set1(V::f16_scalar(b[i].d));
    for (int s = 0; s < kQ8BlockSize; s += V::W)
      V::store(dst + i * kQ8BlockSize + s, V::mul(d, V::load_i8(b[i].qs + s)));
  }
}

template <class V>
GemvFn gemv_for(DType t) {
  switch (t) {
    case DType::F32: return gemv_dense<V, LoadF32>;
    case DType::F16: return gemv_dense<V, LoadF16>;
    case DType::BF16: return gemv_dense<V, LoadBf16>;
    case DType::Q8_0: return gemv_q8<V>;
    case DType::Q4_0: return gemv_blocks<V, DType::Q4_0>;
    case DType::Q4_1: return gemv_blocks<V, DType::Q4_1>;
    case DType::Q5_0: return gemv_blocks<V, DType::Q5_0>;
    case DType::Q5_1: return gemv_blocks<V, DType::Q5_1>;
    case DType::Q2_K: return gemv_blocks<V, DType::Q2_K>;
    case DType::Q3_K: return gemv_blocks<V, DType::Q3_K>;
    case DType::Q4_K: return gemv_blocks<V, DType::Q4_K>;
    case DType::Q5_K: return gemv_blocks<V, DType::Q5_K>;
    case DType::Q6_K: return gemv_blocks<V, DType::Q6_K>;
    case DType::IQ4_NL: return gemv_blocks<V, DType::IQ4_NL>;
    case DType::IQ4_XS: return gemv_blocks<V, DType::IQ4_XS>;
    case DType::MXFP4: return gemv_blocks<V, DType::MXFP4>;
    case DType::MLX_Q2: return gemv_blocks<V, DType::MLX_Q2>;
    case DType::MLX_Q3: return gemv_blocks<V, DType::MLX_Q3>;
    case DType::MLX_Q4: return gemv_blocks<V, DType::MLX_Q4>;
    case DType::MLX_Q5: return gemv_blocks<V, DType::MLX_Q5>;
    case DType::MLX_Q6: return gemv_blocks<V, DType::MLX_Q6>;
    case DType::MLX_Q8: return gemv_blocks<V, DType::MLX_Q8>;
    case DType::MLX_MXFP8: return gemv_blocks<V, DType::MLX_MXFP8>;
    case DType::MLX_NVFP4: return gemv_blocks<V, DType::MLX_NVFP4>;
    default: return nullptr;
  }
}

template <class V>
WidenFn widen_for(DType t) {
  switch (t) {
    case DType::F32: return widen_dense<V, LoadF32>;
    case DType::F16: return widen_dense<V, LoadF16>;
    case DType::BF16: return widen_dense<V, LoadBf16>;
    case DType::Q8_0: return widen_q8<V>;
    case DType::Q4_0: return widen_blocks<DType::Q4_0>;
    case DType::Q4_1: return widen_blocks<DType::Q4_1>;
    case DType::Q5_0: return widen_blocks<DType::Q5_0>;
    case DType::Q5_1: return widen_blocks<DType::Q5_1>;
    case DType::Q2_K: return widen_blocks<DType::Q2_K>;
    case DType::Q3_K: return widen_blocks<DType::Q3_K>;
#ifdef ARBITER_CPU_AVX2
    case DType::Q4_K: return std::is_same_v<V, VScalar> ? widen_blocks<DType::Q4_K> : widen_q45k<DType::Q4_K>;
    case DType::Q5_K: return std::is_same_v<V, VScalar> ? widen_blocks<DType::Q5_K> : widen_q45k<DType::Q5_K>;
    case DType::Q6_K: return std::is_same_v<V, VScalar> ? widen_blocks<DType::Q6_K> : widen_q6k;
#else
    case DType::Q4_K: return widen_blocks<DType::Q4_K>;
    case DType::Q5_K: return widen_blocks<DType::Q5_K>;
    case DType::Q6_K: return widen_blocks<DType::Q6_K>;
#endif
    case DType::IQ4_NL: return widen_blocks<DType::IQ4_NL>;
    case DType::IQ4_XS: return widen_blocks<DType::IQ4_XS>;
    case DType::MXFP4: return widen_blocks<DType::MXFP4>;
    case DType::MLX_Q2: return widen_blocks<DType::MLX_Q2>;
    case DType::MLX_Q3: return widen_blocks<DType::MLX_Q3>;
    case DType::MLX_Q4: return widen_blocks<DType::MLX_Q4>;
    case DType::MLX_Q5: return widen_blocks<DType::MLX_Q5>;
    case DType::MLX_Q6: return widen_blocks<DType::MLX_Q6>;
    case DType::MLX_Q8: return widen_blocks<DType::MLX_Q8>;
    case DType::MLX_MXFP8: return widen_blocks<DType::MLX_MXFP8>;
    case DType::MLX_NVFP4: return widen_blocks<DType::MLX_NVFP4>;
    default: return nullptr;
  }
}

}  // namespace

GemvFn gemv_kernel(Isa isa, DType dtype) {
  switch (isa) {
    case Isa::Scalar: return gemv_for<VScalar>(dtype);
#ifdef ARBITER_CPU_AVX2
    case Isa::Avx2: return gemv_for<VAvx2>(dtype);
#endif
#ifdef ARBITER_CPU_AVX512
    case Isa::Avx512: return gemv_for<VAvx512>(dtype);
#endif
    default: return nullptr;
  }
}

WidenFn widen_kernel(Isa isa, DType dtype) {
  switch (isa) {
    case Isa::Scalar: return widen_for<VScalar>(dtype);
#ifdef ARBITER_CPU_AVX2
    case Isa::Avx2: return widen_for<VAvx2>(dtype);
#endif
#ifdef ARBITER_CPU_AVX512
    case Isa::Avx512: return widen_for<VAvx512>(dtype);
#endif
    default: return nullptr;
  }
}

bool bf16_dot(Isa isa) {
#if defined(ARBITER_CPU_AVX512) && defined(__AVX512BF16__)
  static const bool cpu = __builtin_cpu_supports("avx512bf16");
  return isa == Isa::Avx512 && cpu;
#else
  (void)isa;
  return false;
#endif
}

void round_act_bf16(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_bf16(x[i]);
    out[i] = (h & 0x7f80u) == 0 ? uint16_t(h & 0x8000u) : h;
  }
}

void act_bf16_rounding(const void* Wv, int64_t K, const float* x, const uint16_t* xb, double* out,
                       int64_t n0, int64_t n1) {
  const auto* W = static_cast<const uint16_t*>(Wv);
  for (int64_t n = n0; n < n1; ++n) {
    double s = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double e = double(bf16_to_f32(W[n * K + k])) * (double(x[k]) - double(bf16_to_f32(xb[k])));
      s += e * e;
    }
    out[n - n0] = s;
  }
}

#if defined(ARBITER_CPU_AVX512) && defined(__AVX512BF16__)
// Per row: 32 pairs a step, accumulator 0 taking even steps and 1 odd steps and the masked
// tail, then acc0 + acc1 and VAvx512's fixed-order horizontal sum. Prefetch as gemv_dense_row.
void gemv_bf16_dot(const void* Wv, int64_t K, const uint16_t* xb, float* y, int64_t n0,
                   int64_t n1) {
  ARB_ASSERT(K % 2 == 0);
  const auto* W = static_cast<const uint16_t*>(Wv);
  constexpr int64_t ahead = kAheadBytes / 2;
  for (int64_t n = n0; n < n1; ++n) {
    const uint16_t* row = W + n * K;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
      prefetch_lines(row + k + ahead, 128);
      acc0 = _mm512_dpbf16_ps(acc0, __m512bh(_mm512_loadu_si512(row + k)),
                              __m512bh(_mm512_loadu_si512(xb + k)));
      acc1 = _mm512_dpbf16_ps(acc1, __m512bh(_mm512_loadu_si512(row + k + 32)),
                              __m512bh(_mm512_loadu_si512(xb + k + 32)));
    }
    if (k + 32 <= K) {
      acc0 = _mm512_dpbf16_ps(acc0, __m512bh(_mm512_loadu_si512(row + k)),
                              __m512bh(_mm512_loadu_si512(xb + k)));
      k += 32;
    }
    if (k < K) {
      const __mmask32 m = __mmask32((uint64_t(1) << (K - k)) - 1);
      acc1 = _mm512_dpbf16_ps(acc1, __m512bh(_mm512_maskz_loadu_epi16(m, row + k)),
                              __m512bh(_mm512_maskz_loadu_epi16(m, xb + k)));
    }
    y[n] = VAvx512::reduce_add(_mm512_add_ps(acc0, acc1));
  }
}
#else
void gemv_bf16_dot(const void*, int64_t, const uint16_t*, float*, int64_t, int64_t) {
  ARB_CHECK(false, "[cpu] gemv_bf16_dot: this build has no AVX512-BF16");
}
#endif

}  // namespace arbiter::cpu
