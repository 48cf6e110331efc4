// A small vector abstraction so each CPU kernel is written once and instantiated per ISA:
// VScalar (the scalar twin, W = 1), VAvx2 (W = 8) and VAvx512 (W = 16). Internal to
// src/backend/cpu/ (and its tests and benchmarks).
//
// Every V provides the same static functions on its register type V::R. The ISA variants are
// chosen at compile time (-march decides what is compiled); tests run every compiled one.
// Semantics shared by all three, so that the instantiations compute the same thing:
//   max(a, b) = a > b ? a : b  and  min(a, b) = a < b ? a : b (x86 maxps/minps: a NaN in
//   either operand returns b, which lets clamps written max(lo, x) propagate NaN in x);
//   reduce_add uses a fixed tree order (deterministic for a given ISA);
//   *_n(p, n) loads n < W elements and zero-fills the rest (never reads past p + n).
#pragma once
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own "undefined" vectors
// (GCC bug 105593); the warnings are about the headers, not about this code.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace arbiter::cpu {

struct VScalar {
  using R = float;
  static constexpr int W = 1;
  static R zero() { return 0.f; }
  static R set1(float a) { return a; }
  static R load(const float* p) { return *p; }
  static R load_n(const float* p, int n) { return n > 0 ? *p : 0.f; }
  static void store(float* p, R v) { *p = v; }
  static void store_n(float* p, R v, int n) {
    if (n > 0) *p = v;
  }
  static R add(R a, R b) { return a + b; }
  static R sub(R a, R b) { return a - b; }
  static R mul(R a, R b) { return a * b; }
  static R div(R a, R b) { return a / b; }
  static R fma(R a, R b, R c) { return std::fma(a, b, c); }
  static R max(R a, R b) { return a > b ? a : b; }
  static R min(R a, R b) { return a < b ? a : b; }
  static float reduce_add(R v) { return v; }
  static float reduce_max(R v) { return v; }
  static R round(R v) { return std::nearbyint(v); }
  /// 2^n for integral n in [-126, 127] (NaN stays NaN).
  static R pow2i(R n) {
    if (n != n) return n;
    uint32_t bits = uint32_t(int32_t(n) + 127) << 23;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  static R load_bf16(const uint16_t* p) { return bf16_to_f32(*p); }
  static R load_bf16_n(const uint16_t* p, int n) { return n > 0 ? bf16_to_f32(*p) : 0.f; }
  static R load_f16(const uint16_t* p) { return f16_to_f32(*p); }
  static R load_f16_n(const uint16_t* p, int n) { return n > 0 ? f16_to_f32(*p) : 0.f; }
  static R load_i8(const int8_t* p) { return float(*p); }
  static float f16_scalar(uint16_t h) { return f16_to_f32(h); }
};

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define ARBITER_CPU_AVX2 1
struct VAvx2 {
  using R = __m256;
  static constexpr int W = 8;
  static __m256i mask_n(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static R zero() { return _mm256_setzero_ps(); }
  static R set1(float a) { return _mm256_set1_ps(a); }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static R load_n(const float* p, int n) { return _mm256_maskload_ps(p, mask_n(n)); }
  static void store(float* p, R v) { _mm256_storeu_ps(p, v); }
  static void store_n(float* p, R v, int n) { _mm256_maskstore_ps(p, mask_n(n), v); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R div(R a, R b) { return _mm256_div_ps(a, b); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R max(R a, R b) { return _mm256_max_ps(a, b); }
  static R min(R a, R b) { return _mm256_min_ps(a, b); }
  static float reduce_add(R v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float reduce_max(R v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static R round(R v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static R pow2i(R n) {
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
  }
  // bf16 -> f32 is a 16-bit left shift of the bit pattern (exact).
  static R load_bf16(const uint16_t* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static R load_bf16_n(const uint16_t* p, int n) {
    alignas(16) uint16_t tmp[8] = {};
    std::memcpy(tmp, p, size_t(n) * 2);
    return load_bf16(tmp);
  }
  static R load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static R load_f16_n(const uint16_t* p, int n) {
    alignas(16) uint16_t tmp[8] = {};
    std::memcpy(tmp, p, size_t(n) * 2);
    return load_f16(tmp);
  }
  static R load_i8(const int8_t* p) {
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  }
  static float f16_scalar(uint16_t h) { return _cvtsh_ss(h); }
};
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define ARBITER_CPU_AVX512 1
struct VAvx512 {
  using R = __m512;
  static constexpr int W = 16;
  static __mmask16 mask_n(int n) { return __mmask16((1u << n) - 1u); }
  static R zero() { return _mm512_setzero_ps(); }
  static R set1(float a) { return _mm512_set1_ps(a); }
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static R load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(mask_n(n), p); }
  static void store(float* p, R v) { _mm512_storeu_ps(p, v); }
  static void store_n(float* p, R v, int n) { _mm512_mask_storeu_ps(p, mask_n(n), v); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R div(R a, R b) { return _mm512_div_ps(a, b); }
  static R fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R max(R a, R b) { return _mm512_max_ps(a, b); }
  static R min(R a, R b) { return _mm512_min_ps(a, b); }
  static float reduce_add(R v) {
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float reduce_max(R v) {
    __m256 s8 = _mm256_max_ps(_mm512_castps512_ps256(v),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static R round(R v) {
    return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static R pow2i(R n) {
    __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
    return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  }
  static R load_bf16(const uint16_t* p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static R load_bf16_n(const uint16_t* p, int n) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask_n(n), p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static R load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static R load_f16_n(const uint16_t* p, int n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask_n(n), p));
  }
  static R load_i8(const int8_t* p) {
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  }
  static float f16_scalar(uint16_t h) { return _cvtsh_ss(h); }
};
#endif

/// Asks for the 64-byte lines of [p, p + n) in L1, for streams no hardware prefetcher follows
/// in time (short pieces of rows far apart, or a stream that must run ahead of its reads).
inline void prefetch_lines(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  for (size_t o = 0; o < n; o += 64) _mm_prefetch(c + o, _MM_HINT_T0);
}

/// exp(x) in f32 for every lane: x clamped to [-87, 88] (so 2^n stays a normal number; the
/// clamp's error, below 2e-38 absolute or at +88, is far outside what softmax and SiLU can
/// see), n = round(x / ln 2), r = x - n ln 2 in two steps (Cody-Waite), exp(r) by its Taylor
/// series to r^7 (truncation below 6e-9 relative for |r| <= ln2/2, under one f32 ulp).
/// NaN in gives NaN out.
template <class V>
inline typename V::R vexp(typename V::R x) {
  using R = typename V::R;
  x = V::min(V::set1(88.0f), V::max(V::set1(-87.0f), x));
  const R n = V::round(V::mul(x, V::set1(1.44269504088896341f)));
  R r = V::fma(n, V::set1(-0.693145751953125f), x);  // ln2 high part (exact product)
  r = V::fma(n, V::set1(-1.428606820309417e-06f), r);  // ln2 - high part
  R p = V::set1(1.f / 5040);
  p = V::fma(p, r, V::set1(1.f / 720));
  p = V::fma(p, r, V::set1(1.f / 120));
  p = V::fma(p, r, V::set1(1.f / 24));
  p = V::fma(p, r, V::set1(1.f / 6));
  p = V::fma(p, r, V::set1(0.5f));
  p = V::fma(p, r, V::set1(1.f));
  p = V::fma(p, r, V::set1(1.f));
  return V::mul(p, V::pow2i(n));
}

}  // namespace arbiter::cpu
