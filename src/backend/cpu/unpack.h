// Reading block formats in registers, shared by the integer GEMV (qdot.cpp) and the GEMM's
// widening (gemv.cpp). Internal to src/backend/cpu/. Layouts: core/quant.h.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace arbiter::cpu {

// A block's f16 field: blocks are read through byte pointers and memcpy, never a cast
// (core/quant.h: a block can sit at any byte address). Copying a block into a local struct
// instead made GCC store and reload it piecewise, 5x slower. f16 -> f32 is exact either way;
// the instruction saves a call per block.
inline uint16_t f16_bits_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}
inline float f16_at(const uint8_t* p) {
#ifdef __F16C__
  return _cvtsh_ss(f16_bits_at(p));
#else
  return f16_to_f32(f16_bits_at(p));
#endif
}

#ifdef ARBITER_CPU_AVX2
// Q4_K's / Q5_K's codes of sub-block j (values 32 j + [0, 32)): nibble j % 2 of qs[32 (j / 2)
// + l], and for Q5_K (kQ5) bit j of qh[l] as bit 4 (qh the block's 32 qh bytes; a 16-bit
// shift by j < 8 moves no other bit of a byte to its bit 0).
template <bool kQ5>
inline __m256i k45_codes(const uint8_t* qs, __m256i qh, int j) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (j / 2)));
  const __m256i u = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(0xF));
  if constexpr (!kQ5) return u;
  return _mm256_or_si256(u, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1)), 4));
}

// Q6_K's 6-bit codes (0..63) of values 128 h + 32 k + [0, 32), k = 0..3: value l + 32 k of
// the half takes nibble k / 2 of ql[l + 32 (k % 2)] and bits 2k, 2k + 1 of qh[l] (ql, qh the
// half's 64 and 32 bytes).
inline void q6k_codes(const uint8_t* ql, const uint8_t* qh, __m256i u[4]) {
  const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(0x30);
  const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
  const __m256i qb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
  u[0] = _mm256_or_si256(_mm256_and_si256(qa, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m2));
  u[1] = _mm256_or_si256(_mm256_and_si256(qb, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m2));
  u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4), _mm256_and_si256(h, m2));
  u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4), _mm256_and_si256(_mm256_srli_epi16(h, 2), m2));
}
#endif

}  // namespace arbiter::cpu
