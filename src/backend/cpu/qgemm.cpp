// The integer GEMM: T > 1 matmuls of k-quant weights (Q4_K, Q5_K, Q6_K) and Q8_0 on 8-bit
// activation codes, as the decode GEMV's (qdot.cpp) but for many tokens at once, on
// AVX512-VNNI.
//
// Why: an f32 GEMM of these weights does 16 multiply-adds an instruction (an FMA) after
// widening every weight to f32; vpdpbusd does 64 on the codes as stored. llama.cpp's CPU
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

#if defined(ARBITER_CPU_AVX512) && defined(__AVX512VNNI__)
namespace {

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

// Q8_0, 8 blocks at a time: value d_j q, q signed; codes u = q + 128 for vpdpbusd's unsigned
// side (block_tile_f32_scales takes the offset back), so each block's sum of q x is exact
// (|.| <= 32 * 255 * 127 + 128 * 32 * 127); ds_j = d_j.
struct KQ8_0 {
  struct Block {
    BlockQ8_0 b[kQK_K / kQK];
  };
  static constexpr DType kType = DType::Q8_0;
  static constexpr int G = 32;
  static constexpr bool kF32Scales = true;
  static void unpack(const uint8_t* p, RowBlock& r) {
    const __m256i flip = _mm256_set1_epi8(int8_t(0x80));
    for (int j = 0; j < kQK_K / kQK; ++j) {
      const uint8_t* b = p + j * sizeof(BlockQ8_0);
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + offsetof(BlockQ8_0, qs)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(r.u + 32 * j), _mm256_xor_si256(q, flip));
      r.ds[j] = f16_at(b + offsetof(BlockQ8_0, d));
    }
  }
};

// acc[r][p] = the integer dots of sub-block s (values [s G, s G + G)) of MR rows with NP
// panels: per 4 values of k, NP panel vectors against MR broadcasts of 4 codes.
template <int G, int MR, int NP>
inline void subblock_dots(const RowBlock* rb, const int8_t* const* xq, int s, __m512i (&acc)[MR][NP]) {
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int g = 0; g < G / 4; ++g) {
    const int k = s * G + 4 * g;
    __m512i xv[NP];
    for (int p = 0; p < NP; ++p) {
      xv[p] = _mm512_loadu_si512(xq[p] + k * kPanel);
      // One load per panel vector: without this GCC folds it into each row's vpdpbusd,
      // MR loads of it, and the loads, not the dot products, bound the loop.
      asm("" : "+v"(xv[p]));
    }
    for (int r = 0; r < MR; ++r) {
      int32_t w;
      std::memcpy(&w, rb[r].u + k, 4);
      const __m512i wv = _mm512_set1_epi32(w);
      for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_dpbusd_epi32(acc[r][p], wv, xv[p]);
    }
  }
}

// block_tile for f32 scales per block of 32 (Q8_0): xd[p] holds the panel's 8 block scales.
// The codes' offset of 128 comes back as -128 times the block's pair of sums of x.
template <int MR, int NP>
inline void block_tile_f32_scales(const RowBlock* rb, const int8_t* const* xq, const int32_t* const* xs,
                                  const float* const* xd, float* y, int64_t ys) {
  const __m512i offset = _mm512_set1_epi32(pair16(-128, -128));
  __m512 yv[MR][NP];
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NP; ++p) yv[r][p] = _mm512_loadu_ps(y + r * ys + p * kPanel);
  for (int s = 0; s < kQK_K / kQK; ++s) {
    __m512i acc[MR][NP];
    subblock_dots<kQK, MR, NP>(rb, xq, s, acc);
    for (int r = 0; r < MR; ++r)
      for (int p = 0; p < NP; ++p) {
        const __m512i isum = _mm512_dpwssd_epi32(acc[r][p], offset, _mm512_loadu_si512(xs[p] + s * kPanel));
        const __m512 f = _mm512_mul_ps(_mm512_set1_ps(rb[r].ds[s]), _mm512_loadu_ps(xd[p] + s * kPanel));
        yv[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), f, yv[r][p]);
      }
  }
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NP; ++p) _mm512_storeu_ps(y + r * ys + p * kPanel, yv[r][p]);
}

// One super-block of MR rows against NP panels: y[r][p * 16 + lane] (row stride ys) += the
// block's contribution. xq, xs, xd: panel p's codes, sum words and scales of this block.
template <int G, int MR, int NP>
inline void block_tile(const RowBlock* rb, const int8_t* const* xq, const int32_t* const* xs,
                       const float* const* xd, float* y, int64_t ys) {
  __m512i isum[MR][NP];
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NP; ++p) isum[r][p] = _mm512_setzero_si512();
  for (int s = 0; s < kQK_K / G; ++s) {
    __m512i acc[MR][NP];
    subblock_dots<G, MR, NP>(rb, xq, s, acc);
    for (int r = 0; r < MR; ++r) {
      const __m512i sc = _mm512_set1_epi32(rb[r].sc[s]);
      for (int p = 0; p < NP; ++p) isum[r][p] = _mm512_add_epi32(isum[r][p], _mm512_mullo_epi32(acc[r][p], sc));
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int p = 0; p < NP; ++p) {
      __m512i bsum = _mm512_setzero_si512();
      for (int i = 0; i < 8; ++i)
        bsum = _mm512_dpwssd_epi32(bsum, _mm512_set1_epi32(rb[r].bw[i]), _mm512_loadu_si512(xs[p] + i * kPanel));
      const __m512 dx = _mm512_loadu_ps(xd[p]);
      float* yp = y + r * ys + p * kPanel;
      __m512 acc = _mm512_loadu_ps(yp);
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][p]), _mm512_mul_ps(_mm512_set1_ps(rb[r].a), dx), acc);
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(bsum), _mm512_mul_ps(_mm512_set1_ps(rb[r].b), dx), acc);
      _mm512_storeu_ps(yp, acc);
    }
}

// MR rows share the panels' loads: 4 rows x 2 panels hold 8 + 8 int32 accumulators.
constexpr int kMR = 4;

// Every panel of one super-block for mr <= kMR unpacked rows: pairs of panels, then the odd
// one (FS: the format's scales are f32 per block of 32).
template <int G, bool FS, int MR>
void block_rows(const RowBlock* rb, const ActQ8Panels& x, int64_t b, float* y, int64_t ys) {
  const int64_t K = x.K, nd = K / x.block;
  auto at = [&](int64_t p, const int8_t*& q, const int32_t*& s, const float*& d) {
    q = x.q.data() + (p * K + b * kQK_K) * kPanel;
    s = x.sums.data() + (p * (K / 32) + b * (kQK_K / 32)) * kPanel;
    d = x.d.data() + (p * nd + b * (kQK_K / x.block)) * kPanel;
  };
  int64_t p = 0;
  for (; p + 2 <= x.panels; p += 2) {
    const int8_t* q[2];
    const int32_t* s[2];
    const float* d[2];
    at(p, q[0], s[0], d[0]);
    at(p + 1, q[1], s[1], d[1]);
    if constexpr (FS) block_tile_f32_scales<MR, 2>(rb, q, s, d, y + p * kPanel, ys);
    else block_tile<G, MR, 2>(rb, q, s, d, y + p * kPanel, ys);
  }
  if (p < x.panels) {
    const int8_t* q[1];
    const int32_t* s[1];
    const float* d[1];
    at(p, q[0], s[0], d[0]);
    if constexpr (FS) block_tile_f32_scales<MR, 1>(rb, q, s, d, y + p * kPanel, ys);
    else block_tile<G, MR, 1>(rb, q, s, d, y + p * kPanel, ys);
  }
}

// Rows come in output tiles of kQGemmRows (16: one 64-byte line of out per token, written
// whole; 4-row tiles wrote a quarter line per token and the strided stores took two thirds
// of the time outside block_tile), each computed as register tiles of kMR rows.
template <class F>
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
          block_rows<F::G, F::kF32Scales, kMR>(rb, x, b, y, ys);
        } else {
          for (int r = 0; r < mr; ++r) block_rows<F::G, F::kF32Scales, 1>(rb + r, x, b, y + r * ys, ys);
        }
      }
    for (int64_t t = 0; t < x.T; ++t)
      for (int r = 0; r < rows; ++r) out[t * N + n + r] = ybuf[size_t(r * ys + t)];
  }
}

}  // namespace

QGemmFn qgemm_kernel(Isa isa, DType dtype, int64_t K) {
  if (isa != Isa::Avx512 || K % kQK_K != 0) return nullptr;
  switch (dtype) {
    case DType::Q4_K: return qgemm_k<KQ45<DType::Q4_K>>;
    case DType::Q5_K: return qgemm_k<KQ45<DType::Q5_K>>;
    case DType::Q6_K: return qgemm_k<KQ6>;
    case DType::Q8_0: return qgemm_k<KQ8_0>;
    default: return nullptr;
  }
}
#else
QGemmFn qgemm_kernel(Isa, DType, int64_t) { return nullptr; }
#endif

}  // namespace arbiter::cpu
