// The integer GEMM: T > 1 matmuls of k-quant weights (Q4_K, Q5_K, Q6_K) and Q8_0 on 8-bit
// activation codes, as the decode GEMV's (qdot.cpp) but for many tokens at once, on
// AVX512-VNNI and on AVX2.
//
// Why: an f32 GEMM of these weights does 16 multiply-adds an instruction (an FMA) after
// widening every weight to f32; vpdpbusd does 64 on the codes as stored (AVX2's vpmaddubsw +
// vpmaddwd 32 per two multiplier slots, IAvx2). llama.cpp's CPU
// prefill runs this way, and an f32 GEMM could not keep up with it on Q4_K_M
// (docs/performance.md).
//
// Tokens are the lanes. Each token's row of x is quantized exactly as for a decode step
// (quantize_act_q8 in the weights' activation block: q8_K for the k-quants, q8_0 for Q8_0;
// the same codes, scales and sums), then 16 tokens form a panel: codes [K / 4][16][4] (one
// zmm per 4 values of k), scales [K / block][16] and the pairs of sums of 16 [K / 32][16]
// (ActQ8Panels). A tile is MR weight rows by NP panels: per super-block
// each row's codes are unpacked once into an L1 buffer, and per 4 values of k, NP panel
// vectors meet MR broadcasts of 4 codes in MR * NP vpdpbusd. Per sub-block the int32 sums
// are scaled by the row's integer sub-scale (vpmulld), per super-block the b term (the mins
// of Q4_K / Q5_K, Q6_K's -32 offset) comes from vpdpwssd of the 16-bit b words with the
// activation sums, and two f32 FMAs per lane finish it:
//     y += f32(isum) * (a * dx) + f32(bsum) * (b * dx).
// Q8_0's scales are f16 per block of 32, not integers, and its activations have a scale per
// block too: each block's exact integer sum (its -128 offset taken by vpdpwssd) becomes f32
// once, y += f32(isum_j) * (d_j * dx_j), blocks in order.
// Every integer is exact (bounds beside each format); the f32 steps per (row, token) are the
// same wherever the row and the token fall in the tiling, so any thread split, any T and
// any panel position give the same bits for one (row, token) (row invariance). They are not
// the decode GEMV's bits: that one keeps 8 f32 lanes of partial sums per row; both obey the
// same bound against the exact dot (tests/backend/qdot_test.cpp).
#include <immintrin.h>

#include <algorithm>
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
// Two 16-bit operands of vpdpwssd in one int32 lane: v0 low, v1 high.
int32_t pair16(int v0, int v1) { return int32_t(uint16_t(int16_t(v0)) | uint32_t(uint16_t(int16_t(v1))) << 16); }
}  // namespace

void pack_act_q8(const ActQ8* rows, int64_t T, ActQ8Panels& p) {
  ARB_ASSERT(T > 0 && rows[0].K % kQK_K == 0);
  const int64_t K = rows[0].K, P = (T + kPanel - 1) / kPanel, nd = K / rows[0].block;
  p.T = T;
  p.K = K;
  p.block = rows[0].block;
  p.panels = P;
  p.q.assign(size_t(P * K * kPanel), 0);
  p.d.assign(size_t(P * nd * kPanel), 0.f);
  p.sums.assign(size_t(P * (K / 32) * kPanel), 0);
  for (int64_t t = 0; t < T; ++t) {
    const ActQ8& a = rows[t];
    ARB_ASSERT(a.block == p.block && a.K == K);
    const int64_t pi = t / kPanel, l = t % kPanel;
    int8_t* q = p.q.data() + pi * K * kPanel;
    for (int64_t k = 0; k < K; k += 4) std::memcpy(q + (k / 4 * kPanel + l) * 4, a.q.data() + k, 4);
    float* d = p.d.data() + pi * nd * kPanel;
    for (int64_t b = 0; b < nd; ++b) d[b * kPanel + l] = a.d[size_t(b)];
    int32_t* s = p.sums.data() + pi * (K / 32) * kPanel;
    for (int64_t i = 0; i < K / 32; ++i)
      s[i * kPanel + l] = pair16(a.sums[size_t(2 * i)], a.sums[size_t(2 * i + 1)]);
  }
}

#ifdef ARBITER_CPU_AVX2
namespace {

// The integer instructions of one ISA. A panel of kPanel tokens is kVecs vectors of int32
// lanes (a token a lane); dot adds to each lane the 4 products of u8 codes (w) with the
// token's s8 codes (x); dot2 adds the 2 products of 16-bit words.
#if defined(ARBITER_CPU_AVX512) && defined(__AVX512VNNI__)
// AVX512-VNNI: vpdpbusd, 64 multiply-adds an instruction. Q8_0's signed codes are offset by
// 128 (vpdpbusd's unsigned side), the offset taken back by vpdpwssd of the sums of x.
struct IVnni {
  using I = __m512i;
  using F = __m512;
  static constexpr int kVecs = 1;
  static constexpr int kPanelsPerTile = 2;  // 4 rows x 2 panels: 8 + 8 accumulators
  static constexpr bool kSignedQ8 = false;
  static constexpr bool kOuterInMemory = false;
  static I zero() { return _mm512_setzero_si512(); }
  static I load(const void* p) { return _mm512_loadu_si512(p); }
  static I set1(int32_t v) { return _mm512_set1_epi32(v); }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I mullo(I a, I b) { return _mm512_mullo_epi32(a, b); }
  static I dot(I acc, I w, I x) { return _mm512_dpbusd_epi32(acc, w, x); }
  static I dot2(I acc, I w, I x) { return _mm512_dpwssd_epi32(acc, w, x); }
  static F loadf(const float* p) { return _mm512_loadu_ps(p); }
  static F set1f(float v) { return _mm512_set1_ps(v); }
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static void storef(float* p, F v) { _mm512_storeu_ps(p, v); }
};
#endif

// AVX2: vpmaddubsw (pairs of u8 x s8 products into 16 bits) then vpmaddwd by ones (pairs into
// 32), 32 multiply-adds per two multiplier slots, twice the FMA's 8 (Zen 3: both run on the
// two multiply pipes). The pairs do not saturate: codes u <= 63 (Q6_K) times |x| <= 127
// twice is 16,002, and Q8_0 runs on |q| <= 128 against x with q's sign (vpsignb; x's codes
// are within +-127, quantize_act_q8), 32,512 < 32,767. The same integers as vpdpbusd, and
// the same f32 steps after them: the same bits as the AVX-512 kernel.
struct IAvx2 {
  using I = __m256i;
  using F = __m256;
  static constexpr int kVecs = kPanel / 8;
  static constexpr int kPanelsPerTile = 1;  // 4 rows x 2 vectors: 8 accumulators
  static constexpr bool kSignedQ8 = true;
  // A sub-block's 8 accumulators and its temporaries take the 16 ymm registers: the sums
  // across sub-blocks stay in memory (y, a stack array), or GCC spilled inside the dots'
  // loop (Q8_0's prefill no faster than the f32 GEMM's, perf annotate).
  static constexpr bool kOuterInMemory = true;
  static I zero() { return _mm256_setzero_si256(); }
  static I load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static I set1(int32_t v) { return _mm256_set1_epi32(v); }
  static I dot(I acc, I w, I x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
  }
  static I dot2(I acc, I w, I x) { return _mm256_add_epi32(acc, _mm256_madd_epi16(w, x)); }
  static F loadf(const float* p) { return _mm256_loadu_ps(p); }
  static F set1f(float v) { return _mm256_set1_ps(v); }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static void storef(float* p, F v) { _mm256_storeu_ps(p, v); }
};
constexpr int kLanes = 8;  // int32 lanes of a 256-bit vector: vector v of a panel at 8 v

// One super-block of one weight row (256 values), unpacked for the tile: the codes (0..255),
// per sub-block its integer scale, the b term's 8 words (two 16-bit factors each, against the
// sums of x over values [32 i, 32 i + 16) and [32 i + 16, 32 i + 32)), and the f32 factors a
// and b; or for the formats with f32 scales per block of 32 (kF32Scales), those in ds (their
// b words are block_tile_f32_scales' constant).
struct RowBlock {
  alignas(64) uint8_t u[kQK_K];
  int32_t sc[16];
  int32_t bw[8];
  float a, b;
  float ds[8];
};
// Q4_K / Q5_K: value d sc_j u - dmin m_j over sub-blocks j of 32; a = d, b = -dmin, b words
// (m_j, m_j). |isum| <= 8 * 63 * 32 * 31 * 127 < 2^31, |bsum| <= 8 * 63 * 32 * 127.
template <DType T>
struct KQ45 {
  using Block = std::conditional_t<T == DType::Q5_K, BlockQ5_K, BlockQ4_K>;
  static constexpr DType kType = T;
  static constexpr int G = 32;
  static constexpr bool kF32Scales = false;
  // Groups of 4 codes whose vpmaddubsw pairs (|.| <= 2 * 127 u_max) add up in 16 bits:
  // Q4_K 8 * 2 * 127 * 15 = 30,480, Q5_K 4 * 2 * 127 * 31 = 31,496 (IAvx2).
  static constexpr int kSum16 = T == DType::Q5_K ? 4 : 8;
  static void unpack(const uint8_t* p, RowBlock& r) {
    using B = Block;
    uint64_t sc8, m8;
    scales_mins_k4(p + offsetof(B, scales), sc8, m8);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (T == DType::Q5_K) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + offsetof(B, qh)));
    for (int j = 0; j < 8; ++j) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(r.u + 32 * j),
                         k45_codes<T == DType::Q5_K>(p + offsetof(B, qs), qh, j));
      const int m = int((m8 >> (8 * j)) & 0xFF);
      r.sc[j] = int32_t((sc8 >> (8 * j)) & 0xFF);
      r.bw[j] = pair16(m, m);
    }
    r.a = f16_at(p + offsetof(B, d));
    r.b = -f16_at(p + offsetof(B, dmin));
  }
};

// Q6_K: value d sc_s (u - 32) over sub-blocks s of 16; a = b = d, b words (-32 sc_2i,
// -32 sc_2i+1). |isum| <= 16 * 128 * 16 * 63 * 127, |bsum| <= 16 * 32 * 128 * 16 * 127.
struct KQ6 {
  using Block = BlockQ6_K;
  static constexpr DType kType = DType::Q6_K;
  static constexpr int G = 16;
  static constexpr bool kF32Scales = false;
  static constexpr int kSum16 = 2;  // 2 * 2 * 127 * 63 = 32,004 (KQ45)
  static void unpack(const uint8_t* p, RowBlock& r) {
    using B = Block;
    for (int h = 0; h < 2; ++h) {
      __m256i u[4];
      q6k_codes(p + offsetof(B, ql) + 64 * h, p + offsetof(B, qh) + 32 * h, u);
      for (int k = 0; k < 4; ++k) _mm256_store_si256(reinterpret_cast<__m256i*>(r.u + 128 * h + 32 * k), u[k]);
    }
    const auto* s = reinterpret_cast<const int8_t*>(p + offsetof(B, scales));
    for (int i = 0; i < 16; ++i) r.sc[i] = s[i];
    for (int i = 0; i < 8; ++i) r.bw[i] = pair16(-32 * s[2 * i], -32 * s[2 * i + 1]);
    r.a = r.b = f16_at(p + offsetof(B, d));
  }
};

// Q8_0, 8 blocks at a time: value d_j q, q signed; ds_j = d_j. kSigned: the codes as stored
// (IAvx2's sign trick); else u = q + 128 for vpdpbusd's unsigned side (block_tile_f32_scales
// takes the offset back). Either way each block's sum of q x is exact (|.| <= 32 * 255 * 127
// + 128 * 32 * 127).
template <bool kSigned>
struct KQ8_0 {
  struct Block {
    BlockQ8_0 b[kQK_K / kQK];
  };
  static constexpr DType kType = DType::Q8_0;
  static constexpr int G = 32;
  static constexpr bool kF32Scales = true;
  static constexpr int kSum16 = 1;  // the sign trick's pairs reach 2 * 128 * 127 = 32,512
  static void unpack(const uint8_t* p, RowBlock& r) {
    const __m256i flip = _mm256_set1_epi8(kSigned ? 0 : int8_t(0x80));
    for (int j = 0; j < kQK_K / kQK; ++j) {
      const uint8_t* b = p + j * sizeof(BlockQ8_0);
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + offsetof(BlockQ8_0, qs)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(r.u + 32 * j), _mm256_xor_si256(q, flip));
      r.ds[j] = f16_at(b + offsetof(BlockQ8_0, d));
    }
  }
};

// The NV panel vectors of x at value k (vector v of panel p at p * kVecs + v), loaded once:
// without the barrier GCC folds each load into every row's dot, MR loads of it, and the
// loads, not the dot products, bound the loop.
template <class V, int NV>
inline void panel_vectors(const int8_t* const* xq, int k, typename V::I (&xv)[NV]) {
  for (int p = 0; p < NV; ++p) {
    xv[p] = V::load(xq[p / V::kVecs] + k * kPanel + p % V::kVecs * 4 * kLanes);
    asm("" : "+v"(xv[p]));
  }
}

// acc[r][p * kVecs + v] = the integer dots of sub-block s (values [s G, s G + G)) of MR
// rows with vector v of NP panels: per 4 values of k, the panels' vectors against MR
// broadcasts of 4 codes (kSigned: signed codes, IAvx2's sign trick).
template <class V, int G, int MR, int NP, bool kSigned>
inline void subblock_dots(const RowBlock* rb, const int8_t* const* xq, int s,
                          typename V::I (&acc)[MR][NP * V::kVecs]) {
  using I = typename V::I;
  constexpr int NV = NP * V::kVecs;
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NV; ++p) acc[r][p] = V::zero();
#pragma GCC unroll 8
  for (int g = 0; g < G / 4; ++g) {
    const int k = s * G + 4 * g;
    I xv[NV];
    panel_vectors<V>(xq, k, xv);
    for (int r = 0; r < MR; ++r) {
      int32_t w;
      std::memcpy(&w, rb[r].u + k, 4);
      const I wv = V::set1(w);
      if constexpr (kSigned) {
        const __m256i wa = _mm256_abs_epi8(wv);
        for (int p = 0; p < NV; ++p) acc[r][p] = V::dot(acc[r][p], wa, _mm256_sign_epi8(xv[p], wv));
      } else {
        for (int p = 0; p < NV; ++p) acc[r][p] = V::dot(acc[r][p], wv, xv[p]);
      }
    }
  }
}

// IAvx2, the k-quants: im[r][p] (8 int32 lanes each; first: set, else added to) += sub-block
// s's integer dots of MR rows with the panels' vectors times the row's sub-scale. C groups
// of 4 codes add up in the 16-bit lanes of vpmaddubsw (the format's kSum16: no overflow),
// then vpmaddwd by the sub-scale widens them: sc (p0 + p1) per int32 lane, the integer
// mullo(madd(p, 1), sc) gives, so the same bits with fewer multiplies (one vpmaddwd per C
// groups, and no vpmulld).
template <int G, int C, int MR, int NV>
inline void subblock_scaled_avx2(const RowBlock* rb, const int8_t* const* xq, int s, int32_t* im, bool first) {
  static_assert((G / 4) % C == 0, "whole chunks of groups");
  for (int c0 = 0; c0 < G / 4; c0 += C) {
    __m256i p16[MR][NV];
#pragma GCC unroll 8
    for (int g = c0; g < c0 + C; ++g) {
      const int k = s * G + 4 * g;
      __m256i xv[NV];
      panel_vectors<IAvx2>(xq, k, xv);
      for (int r = 0; r < MR; ++r) {
        int32_t w;
        std::memcpy(&w, rb[r].u + k, 4);
        const __m256i wv = _mm256_set1_epi32(w);
        for (int p = 0; p < NV; ++p) {
          const __m256i m = _mm256_maddubs_epi16(wv, xv[p]);
          p16[r][p] = g == c0 ? m : _mm256_add_epi16(p16[r][p], m);
        }
      }
    }
    for (int r = 0; r < MR; ++r) {
      const __m256i sc = _mm256_set1_epi16(int16_t(rb[r].sc[s]));
      for (int p = 0; p < NV; ++p) {
        int32_t* m = im + (r * NV + p) * kLanes;
        const __m256i v = _mm256_madd_epi16(p16[r][p], sc);
        _mm256_store_si256(reinterpret_cast<__m256i*>(m),
                           first && c0 == 0 ? v : _mm256_add_epi32(IAvx2::load(m), v));
      }
    }
  }
}

// Vector v of panel p's lanes at offset o of a [..][kPanel] array.
template <class V>
inline int lane0(int pv) { return pv / V::kVecs * kPanel + pv % V::kVecs * kLanes; }

// block_tile for f32 scales per block of 32 (Q8_0): xd[p] holds the panel's 8 block scales.
// Unsigned codes: their offset of 128 comes back as -128 times the block's pair of sums of x.
template <class V, int MR, int NP>
inline void block_tile_f32_scales(const RowBlock* rb, const int8_t* const* xq, const int32_t* const* xs,
                                  const float* const* xd, float* y, int64_t ys) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr int NV = NP * V::kVecs;
  const I offset = V::set1(pair16(-128, -128));
  F yv[MR][NV];
  if constexpr (!V::kOuterInMemory)
    for (int r = 0; r < MR; ++r)
      for (int p = 0; p < NV; ++p) yv[r][p] = V::loadf(y + r * ys + lane0<V>(p));
  for (int s = 0; s < kQK_K / kQK; ++s) {
    I acc[MR][NV];
    subblock_dots<V, kQK, MR, NP, V::kSignedQ8>(rb, xq, s, acc);
    for (int r = 0; r < MR; ++r)
      for (int p = 0; p < NV; ++p) {
        const int pp = p / V::kVecs, o = p % V::kVecs * kLanes;
        I isum = acc[r][p];
        if constexpr (!V::kSignedQ8) isum = V::dot2(isum, offset, V::load(xs[pp] + s * kPanel + o));
        const F f = V::mul(V::set1f(rb[r].ds[s]), V::loadf(xd[pp] + s * kPanel + o));
        if constexpr (V::kOuterInMemory) {
          float* yp = y + r * ys + lane0<V>(p);
          V::storef(yp, V::fmadd(V::cvt(isum), f, V::loadf(yp)));
        } else {
          yv[r][p] = V::fmadd(V::cvt(isum), f, yv[r][p]);
        }
      }
  }
  if constexpr (!V::kOuterInMemory)
    for (int r = 0; r < MR; ++r)
      for (int p = 0; p < NV; ++p) V::storef(y + r * ys + lane0<V>(p), yv[r][p]);
}

// One super-block of MR rows against NP panels: y[r][p * 16 + lane] (row stride ys) += the
// block's contribution. xq, xs, xd: panel p's codes, sum words and scales of this block.
template <class V, int G, int C, int MR, int NP>
inline void block_tile(const RowBlock* rb, const int8_t* const* xq, const int32_t* const* xs,
                       const float* const* xd, float* y, int64_t ys) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr int NV = NP * V::kVecs;
  I isum[MR][NV];
  alignas(64) int32_t im[V::kOuterInMemory ? MR * NV * kLanes : 1];  // isum in memory
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NV; ++p) isum[r][p] = V::zero();
  for (int s = 0; s < kQK_K / G; ++s) {
    if constexpr (V::kOuterInMemory) {
      subblock_scaled_avx2<G, C, MR, NV>(rb, xq, s, im, s == 0);
    } else {
      I acc[MR][NV];
      subblock_dots<V, G, MR, NP, false>(rb, xq, s, acc);
      for (int r = 0; r < MR; ++r) {
        const I sc = V::set1(rb[r].sc[s]);
        for (int p = 0; p < NV; ++p) isum[r][p] = V::add(isum[r][p], V::mullo(acc[r][p], sc));
      }
    }
  }
  if constexpr (V::kOuterInMemory)
    for (int r = 0; r < MR; ++r)
      for (int p = 0; p < NV; ++p) isum[r][p] = V::load(im + (r * NV + p) * kLanes);
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NV; ++p) {
      const int pp = p / V::kVecs, o = p % V::kVecs * kLanes;
      I bsum = V::zero();
      for (int i = 0; i < 8; ++i) bsum = V::dot2(bsum, V::set1(rb[r].bw[i]), V::load(xs[pp] + i * kPanel + o));
      const F dx = V::loadf(xd[pp] + o);
      float* yp = y + r * ys + lane0<V>(p);
      F acc = V::loadf(yp);
      acc = V::fmadd(V::cvt(isum[r][p]), V::mul(V::set1f(rb[r].a), dx), acc);
      acc = V::fmadd(V::cvt(bsum), V::mul(V::set1f(rb[r].b), dx), acc);
      V::storef(yp, acc);
    }
}

// MR rows share the panels' loads: 4 rows x 2 panels hold 8 + 8 int32 accumulators.
constexpr int kMR = 4;

// Every panel of one super-block for mr <= kMR unpacked rows: in tiles of V's panels, then
// the odd one (F: the format).
template <class V, class F, int MR>
void block_rows(const RowBlock* rb, const ActQ8Panels& x, int64_t b, float* y, int64_t ys) {
  const int64_t K = x.K, nd = K / x.block;
  auto at = [&](int64_t p, const int8_t*& q, const int32_t*& s, const float*& d) {
    q = x.q.data() + (p * K + b * kQK_K) * kPanel;
    s = x.sums.data() + (p * (K / 32) + b * (kQK_K / 32)) * kPanel;
    d = x.d.data() + (p * nd + b * (kQK_K / x.block)) * kPanel;
  };
  auto tile = [&](int64_t p, auto np) {
    constexpr int NP = decltype(np)::value;
    const int8_t* q[NP];
    const int32_t* s[NP];
    const float* d[NP];
    for (int i = 0; i < NP; ++i) at(p + i, q[i], s[i], d[i]);
    if constexpr (F::kF32Scales) block_tile_f32_scales<V, MR, NP>(rb, q, s, d, y + p * kPanel, ys);
    else block_tile<V, F::G, F::kSum16, MR, NP>(rb, q, s, d, y + p * kPanel, ys);
  };
  constexpr int NP = V::kPanelsPerTile;
  int64_t p = 0;
  for (; p + NP <= x.panels; p += NP) tile(p, std::integral_constant<int, NP>());
  if (p < x.panels) tile(p, std::integral_constant<int, 1>());
}

// Rows come in output tiles of kQGemmRows (16: one 64-byte line of out per token, written
// whole; 4-row tiles wrote a quarter line per token and the strided stores took two thirds
// of the time outside block_tile), each computed as register tiles of kMR rows.
template <class V, class F>
void qgemm_k(const void* Wv, int64_t N, int64_t K, const ActQ8Panels& x, float* out, int64_t n0, int64_t n1) {
  using B = typename F::Block;
  ARB_ASSERT(x.K == K && K % kQK_K == 0 && x.block == act_q8_block(F::kType));
  const int64_t nb = K / kQK_K, ys = x.panels * kPanel;
  thread_local std::vector<float> ybuf;
  ybuf.resize(size_t(kQGemmRows * ys));
  RowBlock rb[kMR];
  for (int64_t n = n0; n < n1; n += kQGemmRows) {
    const int rows = int(std::min<int64_t>(kQGemmRows, n1 - n));
    std::fill(ybuf.begin(), ybuf.end(), 0.f);
    for (int64_t b = 0; b < nb; ++b)
      for (int r0 = 0; r0 < rows; r0 += kMR) {
        const int mr = std::min(kMR, rows - r0);
        for (int r = 0; r < mr; ++r)
          F::unpack(static_cast<const uint8_t*>(Wv) + size_t((n + r0 + r) * nb + b) * sizeof(B), rb[r]);
        float* y = ybuf.data() + r0 * ys;
        if (mr == kMR) {
          block_rows<V, F, kMR>(rb, x, b, y, ys);
        } else {
          for (int r = 0; r < mr; ++r) block_rows<V, F, 1>(rb + r, x, b, y + r * ys, ys);
        }
      }
    for (int64_t t = 0; t < x.T; ++t)
      for (int r = 0; r < rows; ++r) out[t * N + n + r] = ybuf[size_t(r * ys + t)];
  }
}

template <class V>
QGemmFn qgemm_for(DType dtype) {
  switch (dtype) {
    case DType::Q4_K: return qgemm_k<V, KQ45<DType::Q4_K>>;
    case DType::Q5_K: return qgemm_k<V, KQ45<DType::Q5_K>>;
    case DType::Q6_K: return qgemm_k<V, KQ6>;
    case DType::Q8_0: return qgemm_k<V, KQ8_0<V::kSignedQ8>>;
    default: return nullptr;
  }
}

}  // namespace

QGemmFn qgemm_kernel(Isa isa, DType dtype, int64_t K) {
  if (K % kQK_K != 0) return nullptr;
#if defined(ARBITER_CPU_AVX512) && defined(__AVX512VNNI__)
  if (isa == Isa::Avx512) return qgemm_for<IVnni>(dtype);
#endif
  if (isa == Isa::Avx2) return qgemm_for<IAvx2>(dtype);
  return nullptr;
}
#else
QGemmFn qgemm_kernel(Isa, DType, int64_t) { return nullptr; }
#endif

}  // namespace arbiter::cpu
