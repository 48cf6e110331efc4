// GEMM (matmul with T > 1: prefill, verify-sized forwards): our register-blocked kernels and
// an OpenBLAS path, all taking weights in their storage dtype and widening them per panel.
//
// Own kernels: two outer-product schemes, chosen by T (the number of tokens).
// - Broadcast weights (T <= kBroadcastMaxT, short prefills): x [T, K] is packed once into
//   token tiles Xp[kb][tt][k][TN]. For each k-block, MR weight rows are widened to f32 row by
//   row (sequential reads, no transpose), and each token tile's MR x TN partial sums are
//   updated in registers: per k, NV vector loads of TN tokens' x, MR broadcasts of one weight
//   each, MR*NV FMAs. The sums are stored transposed into out [T, N] at the end. With few
//   tokens, a transposed copy of the weights would be used too few times to pay for itself.
// - Packed weights (long prefills, as in BLIS/GotoBLAS): x is packed into micro-panels
//   Xp[tb][k][MR] (MR tokens); for each k-block, each strip of NV vectors of output columns is
//   widened and transposed into Bp[k][NR] (L1-resident) and reused by every token block: per
//   k, MR broadcasts of x times NV vectors of weights.
// AVX-512 tiles are 12 x 32 either way: 24 zmm accumulators.
// - bf16 pairs (gemm_bf16_dot, AVX512-BF16): the broadcast-weights scheme on bf16 weight pairs
//   as stored and x rounded to bf16, one vdpbf16ps per two products; for every T.
// Every out element is one FMA chain over k = 0..K-1 starting from 0 (a k-block continues the
// chain from the stored partial sum), so the result depends neither on the scheme nor on the
// tiling nor on the thread count. Threads claim chunks of whole strips; the strip grid is
// fixed by N alone.
#include <cblas.h>

#include <algorithm>
#include <mutex>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace arbiter::cpu {

namespace {

// Register tile: MR broadcast values (weight rows, or tokens with packed weights) x NV vectors
// (of tokens, or of output columns).
template <class V>
struct Tile;
template <>
struct Tile<VScalar> {
  static constexpr int MR = 4, NV = 2;
};
#ifdef ARBITER_CPU_AVX2
template <>
struct Tile<VAvx2> {
  static constexpr int MR = 6, NV = 2;  // 12 ymm accumulators + 2 vectors + 1 broadcast
};
#endif
#ifdef ARBITER_CPU_AVX512
template <>
struct Tile<VAvx512> {
  static constexpr int MR = 12, NV = 2;  // 24 zmm accumulators + 2 vectors of 16
};
#endif

// Up to this many tokens the broadcast-weights scheme runs. bench/ (gemm/own, 2 threads,
// qwen3-0.6b's shapes; docs/performance.md, session 27): against the packed one, AVX-512 at
// T = 64 1.31-1.35x with bf16 and Q4_K weights (1.02-1.03 with f32, which need no widening),
// at T = 128 1.06-1.12x (f32 0.95); AVX2 1.07-1.12x at 64, 0.97 at 128. While it was tuned
// it was even at T = 256 and 8-18% slower at 512.
constexpr int64_t kBroadcastMaxT = 128;

// The packed-x buffer of the calling thread (reused across calls).
std::vector<float>& xp_buffer() {
  thread_local std::vector<float> buf;
  return buf;
}

#ifdef ARBITER_CPU_AVX512
// 16 x 16 transpose in registers: unpack ps, unpack pd, then two 128-bit lane shuffles.
inline void transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    u[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // u[4g + j], 128-bit lane L = rows 4g..4g+3 of column 4L + j.
  for (int j = 0; j < 4; ++j) {
    const __m512 v0 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x44);
    const __m512 v1 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xEE);
    const __m512 w0 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x44);
    const __m512 w1 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xEE);
    r[j] = _mm512_shuffle_f32x4(v0, w0, 0x88);
    r[4 + j] = _mm512_shuffle_f32x4(v0, w0, 0xDD);
    r[8 + j] = _mm512_shuffle_f32x4(v1, w1, 0x88);
    r[12 + j] = _mm512_shuffle_f32x4(v1, w1, 0xDD);
  }
}

#endif

// ---- Broadcast weights (short prefills) ----

// k-block: MR rows of kRowKC widened weights (L1-resident) against the token tiles' x of the
// same k range; a multiple of every block format's block, as widening takes whole blocks. The
// rows are kRowLd floats apart: the MR rows a step broadcasts from are constant offsets from
// one pointer, and the pad keeps them out of one L1 set. 128 measured the same for bf16.
constexpr int64_t kRowKC = 256;
constexpr int64_t kRowLd = kRowKC + 16;

// Xp[kb][tt][k][TN]: x in tiles of TN tokens (zero past T), per k-block of KB values the
// tiles one after another, so a k-block's tiles stream from one address range (KB >= K: one
// block, Xp[tt][k][TN]). Packs tiles [tt0, tt1).
template <int TN>
void pack_x(const float* x, int64_t T, int64_t K, int64_t KB, int64_t n_tt, float* xp,
            int64_t tt0, int64_t tt1) {
  for (int64_t tt = tt0; tt < tt1; ++tt)
    for (int64_t k0 = 0; k0 < K; k0 += KB) {
      const int64_t kc = std::min(KB, K - k0);
      float* dst = xp + ((k0 / KB) * n_tt + tt) * KB * TN;
      for (int j = 0; j < TN; ++j) {
        const int64_t t = tt * TN + j;
        if (t < T) {
          const float* src = x + t * K + k0;
          for (int64_t k = 0; k < kc; ++k) dst[k * TN + j] = src[k];
        } else {
          for (int64_t k = 0; k < kc; ++k) dst[k * TN + j] = 0.f;
        }
      }
    }
}

// c[m][j] (+)= sum over k < kc of w(row m, k) * xp[k][j] for MR rows and the first NV * W
// tokens of a tile whose x rows are TN floats apart; w: one k-block of a strip (rows kRowLd
// apart); accumulate: continue the chains from c.
template <class V, int MR, int NV, int TN>
inline void row_kernel(const float* w, const float* xp, int64_t kc, float* c, bool accumulate) {
  using R = typename V::R;
  constexpr int W = V::W;
  R acc[MR][NV];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[m][v] = accumulate ? V::load(c + m * TN + v * W) : V::zero();
  for (int64_t k = 0; k < kc; ++k) {
    R xv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) xv[v] = V::load(xp + k * TN + v * W);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const R a = V::set1(w[m * kRowLd + k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] = V::fma(a, xv[v], acc[m][v]);
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) V::store(c + m * TN + v * W, acc[m][v]);
}

// out[t * ldo + m] = c[t / TN][m][t % TN] (+ bias[m]) for t < T, m < nr: a strip's sums
// ([tile][MR][TN]) into out's rows of tokens.
template <class V, int MR, int TN>
void store_transposed(const float* c, int64_t T, int nr, const float* bias, float* out,
                      int64_t ldo) {
#ifdef ARBITER_CPU_AVX512
  if constexpr (std::is_same_v<V, VAvx512> && MR <= 16) {
    // 16 tokens at a time: their MR rows transposed in registers, one masked row store each.
    const __mmask16 mask = __mmask16((1u << nr) - 1);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
    for (int64_t t0 = 0; t0 < T; t0 += 16) {
      const float* ct = c + (t0 / TN) * MR * TN + t0 % TN;
      __m512 r[16];
      for (int m = 0; m < 16; ++m)
        r[m] = m < MR ? _mm512_loadu_ps(ct + m * TN) : _mm512_setzero_ps();
      transpose16(r);
      const int nt = int(std::min<int64_t>(16, T - t0));
      for (int j = 0; j < nt; ++j)
        _mm512_mask_storeu_ps(out + (t0 + j) * ldo, mask, bias ? _mm512_add_ps(r[j], b) : r[j]);
    }
    return;
  }
#endif
  for (int64_t t = 0; t < T; ++t) {
    const float* ct = c + (t / TN) * MR * TN + t % TN;
    float* o = out + t * ldo;
    if (bias)
      for (int m = 0; m < nr; ++m) o[m] = ct[m * TN] + bias[m];
    else
      for (int m = 0; m < nr; ++m) o[m] = ct[m * TN];
  }
}

template <class V>
void gemm_broadcast_w(Isa isa, const GemmProblem& p, ThreadPool& pool) {
  constexpr int MR = Tile<V>::MR, NV = Tile<V>::NV, W = V::W, TN = NV * W;
  static_assert(NV == 2, "a tile's last token vectors are dispatched as NV or 1");
  const int64_t T = p.T, N = p.N, K = p.K;
  const int64_t n_tt = (T + TN - 1) / TN, n_strips = (N + MR - 1) / MR;
  const WidenFn widen = widen_kernel(isa, p.wtype);
  ARB_ASSERT(widen != nullptr);
  std::vector<float>& xp = xp_buffer();
  xp.resize(size_t(((K + kRowKC - 1) / kRowKC) * n_tt * kRowKC * TN));
  float* xpp = xp.data();
  pool.parallel_for(n_tt, [&](int64_t b, int64_t e) {
    pack_x<TN>(p.x, T, K, kRowKC, n_tt, xpp, b, e);
  });

  // Strips in claimed chunks, 4 per thread, so a thread that loses its core delays only its
  // chunk; a strip's arithmetic does not depend on which chunk holds it.
  pool.parallel_for_dynamic(n_strips, int64_t(pool.size()) * 4, [&](int64_t s0, int64_t s1) {
    // w: one k-block of the strip's rows widened, [MR][kRowLd]; c: its partial sums,
    // [tt][MR][TN].
    thread_local std::vector<float> w, c;
    w.resize(size_t(MR * kRowLd));
    c.resize(size_t(n_tt * MR * TN));
    const auto* wbase = static_cast<const uint8_t*>(p.W);
    const size_t row_bytes = dtype_bytes(p.wtype, K);
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t n0 = s * MR;
      const int nr = int(std::min<int64_t>(MR, N - n0));
      for (int64_t k0 = 0; k0 < K; k0 += kRowKC) {
        const int64_t kc = std::min(kRowKC, K - k0);
        const size_t k_off = dtype_bytes(p.wtype, k0);
        // The rows' next k-block (after the last, the next strip's first) is fetched now: MR
        // short pieces of rows far apart are streams no hardware prefetcher follows in time.
        const int64_t k_next = k0 + kRowKC < K ? k0 + kRowKC : 0;
        const int64_t n_next = k_next > 0 ? n0 : n0 + MR;
        const size_t next_off = dtype_bytes(p.wtype, k_next);
        const size_t next_bytes = dtype_bytes(p.wtype, std::min(kRowKC, K - k_next));
        for (int m = 0; m < MR; ++m) {
          float* dst = w.data() + m * kRowLd;
          if (m < nr) widen(wbase + size_t(n0 + m) * row_bytes + k_off, dst, kc);
          else std::fill(dst, dst + kc, 0.f);
          if (n_next + m < N && (k_next > 0 || s + 1 < s1))
            prefetch_lines(wbase + size_t(n_next + m) * row_bytes + next_off, next_bytes);
        }
        for (int64_t tt = 0; tt < n_tt; ++tt) {
          const float* xt = xpp + ((k0 / kRowKC) * n_tt + tt) * kRowKC * TN;
          float* ct = c.data() + tt * MR * TN;
          if (T - tt * TN > W) row_kernel<V, MR, NV, TN>(w.data(), xt, kc, ct, k0 > 0);
          else row_kernel<V, MR, 1, TN>(w.data(), xt, kc, ct, k0 > 0);
        }
      }
      store_transposed<V, MR, TN>(c.data(), T, nr, p.bias ? p.bias + n0 : nullptr, p.out + n0, N);
    }
  });
}

#if defined(ARBITER_CPU_AVX512) && defined(__AVX512BF16__)
// ---- bf16 pairs (vdpbf16ps; gemm_bf16_dot) ----
// The broadcast-weights scheme on pairs: per k-block of kRowKC values, a strip's 12 rows are
// copied as pairs into wp[12][kDotLd] (rows at constant offsets from one pointer, padded out
// of one L1 set as kRowLd; rows past N zero), and x's pairs sit in tiles of 32 tokens,
// Xp[kb][tt][kc / 2][32]. Per pair: 2 loads of 16 tokens' pairs, 12 broadcast weight pairs,
// 24 vdpbf16ps. The weights are copied, not widened, so this one scheme serves every T; the
// partial sums take the f32 path's layout and store_transposed. Tried and slower
// (docs/performance.md, session 41): 16 rows x 16 tokens (whole 64-byte rows of out per
// store), k-blocks of 512.
constexpr int kDotMR = 12, kDotTN = 32;
constexpr int64_t kDotLd = kRowKC / 2 + 16;

template <int NV>
inline void dot_row_kernel(const uint32_t* wp, const uint32_t* xp, int64_t kp, float* c,
                           bool accumulate) {
  constexpr int MR = kDotMR, TN = kDotTN;
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v)
      acc[m][v] = accumulate ? _mm512_loadu_ps(c + m * TN + v * 16) : _mm512_setzero_ps();
  for (int64_t j = 0; j < kp; ++j) {
    __m512bh xv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) xv[v] = __m512bh(_mm512_loadu_si512(xp + j * TN + v * 16));
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const __m512bh a = __m512bh(_mm512_set1_epi32(int(wp[m * kDotLd + j])));
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], a, xv[v]);
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + m * TN + v * 16, acc[m][v]);
}
#endif

// ---- Packed weights (long prefills) ----

// k-block: Bp is kKC x NR f32 = 32 KiB at NR = 32 (L1d is 48 KiB on the dev machine). Tile
// shapes 12x32, 14x32, 8x48, 6x64 and KC 128..512 were tried with bench/ (gemm/own, T = 512):
// all within noise of each other on the dev machine, 12x32 / 256 at least as fast as any.
constexpr int64_t kKC = 256;

// bp[k][NR] = w[r][k] for r < NR, k < kc (w: NR widened rows of stride ld; rows past the
// matrix are zero-filled by the caller). Scalar transpose; AVX-512 overrides below.
template <class V, int NR>
inline void pack_b(const float* w, int64_t ld, int64_t kc, float* bp) {
  for (int r = 0; r < NR; ++r)
    for (int64_t k = 0; k < kc; ++k) bp[k * NR + r] = w[r * ld + k];
}

#ifdef ARBITER_CPU_AVX512
template <int NR>
inline void pack_b_avx512(const float* w, int64_t ld, int64_t kc, float* bp) {
  static_assert(NR % 16 == 0);
  int64_t k = 0;
  for (; k + 16 <= kc; k += 16)
    for (int h = 0; h < NR; h += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(w + (h + i) * ld + k);
      transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(bp + (k + i) * NR + h, r[i]);
    }
  for (; k < kc; ++k)
    for (int r = 0; r < NR; ++r) bp[k * NR + r] = w[r * ld + k];
}
#endif

// c[MR x NR] (+)= ap[kc][MR] * bp[kc][NR]; only the first mr rows and nr columns of c exist.
template <class V, int MR, int NV>
inline void micro_kernel(const float* ap, const float* bp, int64_t kc, float* c, int64_t ldc,
                         int mr, int nr, bool accumulate) {
  using R = typename V::R;
  constexpr int W = V::W, NR = NV * W;
  R acc[MR][NV];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[m][v] = V::zero();
  if (accumulate) {
    for (int m = 0; m < mr; ++m)
      for (int v = 0; v < NV; ++v) {
        const int n = nr - v * W;  // columns left in this vector
        if (n >= W) acc[m][v] = V::load(c + m * ldc + v * W);
        else if (n > 0) acc[m][v] = V::load_n(c + m * ldc + v * W, n);
      }
  }
  for (int64_t k = 0; k < kc; ++k) {
    R b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = V::load(bp + k * NR + v * W);
    const float* a = ap + k * MR;
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const R am = V::set1(a[m]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[m][v] = V::fma(am, b[v], acc[m][v]);
    }
  }
  for (int m = 0; m < mr; ++m)
    for (int v = 0; v < NV; ++v) {
      const int n = nr - v * W;
      if (n >= W) V::store(c + m * ldc + v * W, acc[m][v]);
      else if (n > 0) V::store_n(c + m * ldc + v * W, acc[m][v], n);
    }
}

template <class V>
void gemm_packed_w(Isa isa, const GemmProblem& p, ThreadPool& pool) {
  constexpr int MR = Tile<V>::MR, NV = Tile<V>::NV, NR = NV * V::W;
  const int64_t T = p.T, N = p.N, K = p.K;
  const int64_t n_tb = (T + MR - 1) / MR, n_strips = (N + NR - 1) / NR;
  const WidenFn widen = widen_kernel(isa, p.wtype);
  ARB_ASSERT(widen != nullptr);
  std::vector<float>& xp = xp_buffer();
  xp.resize(size_t(n_tb * MR * K));
  float* xpp = xp.data();
  pool.parallel_for(n_tb, [&](int64_t b, int64_t e) { pack_x<MR>(p.x, T, K, K, n_tb, xpp, b, e); });

  // Strips in claimed chunks, 4 per thread, so a thread that loses its core delays only
  // its chunk; a strip's arithmetic does not depend on which chunk holds it.
  pool.parallel_for_dynamic(n_strips, int64_t(pool.size()) * 4, [&](int64_t s0, int64_t s1) {
    // wrows: NR widened rows of one k-block (row stride kKC + 16 floats, so the 16 rows a
    // transpose reads do not all map to the same L1 set); bp: the packed strip.
    constexpr int64_t ld = kKC + 16;
    thread_local std::vector<float> bp, wrows;
    bp.resize(size_t(kKC * NR));
    wrows.resize(size_t(ld * NR));
    const auto* wbase = static_cast<const uint8_t*>(p.W);
    const size_t row_bytes = dtype_bytes(p.wtype, K);
    for (int64_t k0 = 0; k0 < K; k0 += kKC) {
      const int64_t kc = std::min(kKC, K - k0);
      const size_t k_off = dtype_bytes(p.wtype, k0);
      for (int64_t s = s0; s < s1; ++s) {
        const int64_t n0 = s * NR;
        const int nr = int(std::min<int64_t>(NR, N - n0));
        // f32 weights of a full strip are transposed straight from W; other dtypes (and the
        // zero-padded last strip) are widened into wrows first.
        const float* src = wrows.data();
        int64_t src_ld = ld;
        if (p.wtype == DType::F32 && nr == NR) {
          src = reinterpret_cast<const float*>(wbase + size_t(n0) * row_bytes + k_off);
          src_ld = K;
        } else {
          for (int r = 0; r < NR; ++r) {
            float* dst = wrows.data() + r * ld;
            if (r < nr) widen(wbase + size_t(n0 + r) * row_bytes + k_off, dst, kc);
            else std::fill(dst, dst + kc, 0.f);
          }
        }
#ifdef ARBITER_CPU_AVX512
        if constexpr (std::is_same_v<V, VAvx512>) pack_b_avx512<NR>(src, src_ld, kc, bp.data());
        else pack_b<V, NR>(src, src_ld, kc, bp.data());
#else
        pack_b<V, NR>(src, src_ld, kc, bp.data());
#endif
        for (int64_t tb = 0; tb < n_tb; ++tb) {
          const int mr = int(std::min<int64_t>(MR, T - tb * MR));
          // The next tile of out: its rows are N floats apart, so no hardware prefetcher
          // sees them coming; fetched now, they arrive while this tile computes.
          if (tb + 1 < n_tb) {
            const float* cn = p.out + (tb + 1) * MR * N + n0;
            const int mr_next = int(std::min<int64_t>(MR, T - (tb + 1) * MR));
            for (int m = 0; m < mr_next; ++m) prefetch_lines(cn + m * N, nr * sizeof(float));
          }
          micro_kernel<V, MR, NV>(xpp + (tb * K + k0) * MR, bp.data(), kc,
                                  p.out + tb * MR * N + n0, N, mr, nr, k0 > 0);
        }
      }
    }
    if (p.bias) {
      const int64_t c0 = s0 * NR, c1 = std::min(N, s1 * NR);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = c0; n < c1; ++n) p.out[t * N + n] += p.bias[n];
    }
  });
}

template <class V>
void gemm_own_impl(Isa isa, const GemmProblem& p, ThreadPool& pool) {
  if (p.T <= kBroadcastMaxT) gemm_broadcast_w<V>(isa, p, pool);
  else gemm_packed_w<V>(isa, p, pool);
}

}  // namespace

void gemm_own(Isa isa, const GemmProblem& p, ThreadPool& pool) {
  switch (isa) {
    case Isa::Scalar: return gemm_own_impl<VScalar>(isa, p, pool);
#ifdef ARBITER_CPU_AVX2
    case Isa::Avx2: return gemm_own_impl<VAvx2>(isa, p, pool);
#endif
#ifdef ARBITER_CPU_AVX512
    case Isa::Avx512: return gemm_own_impl<VAvx512>(isa, p, pool);
#endif
    default: throw Error(std::string("[cpu] gemm: ISA ") + isa_name(isa) + " not compiled in");
  }
}

#if defined(ARBITER_CPU_AVX512) && defined(__AVX512BF16__)
void gemm_bf16_dot(const uint16_t* xb, const GemmProblem& p, ThreadPool& pool) {
  constexpr int MR = kDotMR, TN = kDotTN;
  constexpr int64_t KP = kRowKC / 2;
  const int64_t T = p.T, N = p.N, K = p.K;
  ARB_ASSERT(p.wtype == DType::BF16 && K % 2 == 0);
  const int64_t n_tt = (T + TN - 1) / TN, n_strips = (N + MR - 1) / MR;
  const int64_t n_kb = (K + kRowKC - 1) / kRowKC;
  // Xp[kb][tt][j][TN]: pair j of k-block kb for the tile's tokens (zero past T).
  thread_local std::vector<uint32_t> xp;
  xp.resize(size_t(n_kb * n_tt * KP * TN));
  uint32_t* xpp = xp.data();
  const auto* xpairs = reinterpret_cast<const uint32_t*>(xb);
  pool.parallel_for(n_tt, [&](int64_t b, int64_t e) {
    for (int64_t tt = b; tt < e; ++tt)
      for (int64_t kb = 0; kb < n_kb; ++kb) {
        const int64_t kp = std::min(kRowKC, K - kb * kRowKC) / 2;
        uint32_t* dst = xpp + (kb * n_tt + tt) * KP * TN;
        for (int j = 0; j < TN; ++j) {
          const int64_t t = tt * TN + j;
          if (t < T) {
            const uint32_t* src = xpairs + t * (K / 2) + kb * KP;
            for (int64_t i = 0; i < kp; ++i) dst[i * TN + j] = src[i];
          } else {
            for (int64_t i = 0; i < kp; ++i) dst[i * TN + j] = 0u;
          }
        }
      }
  });

  pool.parallel_for_dynamic(n_strips, int64_t(pool.size()) * 4, [&](int64_t s0, int64_t s1) {
    thread_local std::vector<uint32_t> wp;
    thread_local std::vector<float> c;
    wp.resize(size_t(kDotLd * MR));
    c.resize(size_t(n_tt * MR * TN));
    const auto* W = static_cast<const uint32_t*>(p.W);  // pairs: K / 2 a row
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t n0 = s * MR;
      const int nr = int(std::min<int64_t>(MR, N - n0));
      for (int64_t k0 = 0; k0 < K; k0 += kRowKC) {
        const int64_t kp = std::min(kRowKC, K - k0) / 2;
        // The rows' next k-block (after the last, the next strip's first), as in
        // gemm_broadcast_w.
        const int64_t k_next = k0 + kRowKC < K ? k0 + kRowKC : 0;
        const int64_t n_next = k_next > 0 ? n0 : n0 + MR;
        const size_t next_bytes = size_t(std::min(kRowKC, K - k_next)) * 2;
        for (int m = 0; m < MR; ++m) {
          uint32_t* dst = wp.data() + m * kDotLd;
          if (m < nr) std::copy_n(W + (n0 + m) * (K / 2) + k0 / 2, kp, dst);
          else std::fill_n(dst, kp, 0u);
          if (n_next + m < N && (k_next > 0 || s + 1 < s1))
            prefetch_lines(W + (n_next + m) * (K / 2) + k_next / 2, next_bytes);
        }
        for (int64_t tt = 0; tt < n_tt; ++tt) {
          const uint32_t* xt = xpp + ((k0 / kRowKC) * n_tt + tt) * KP * TN;
          float* ct = c.data() + tt * MR * TN;
          if (T - tt * TN > 16) dot_row_kernel<2>(wp.data(), xt, kp, ct, k0 > 0);
          else dot_row_kernel<1>(wp.data(), xt, kp, ct, k0 > 0);
        }
      }
      store_transposed<VAvx512, MR, TN>(c.data(), T, nr, p.bias ? p.bias + n0 : nullptr,
                                        p.out + n0, N);
    }
  });
}
#else
void gemm_bf16_dot(const uint16_t*, const GemmProblem&, ThreadPool&) {
  ARB_CHECK(false, "[cpu] gemm_bf16_dot: this build has no AVX512-BF16");
}
#endif

void blas_pin_single_thread() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// OpenBLAS sgemm per panel of NB weight rows widened to f32 (f32 weights are used in place).
// The panel grid depends on N and K only, and each panel is one single-threaded sgemm call
// with the same arguments whatever thread runs it, so results do not depend on thread count.
void gemm_blas(Isa isa, const GemmProblem& p, ThreadPool& pool) {
  blas_pin_single_thread();
  const int64_t T = p.T, N = p.N, K = p.K;
  // About 1 MiB of widened weights per panel (L2-sized); 16..256 rows.
  const int64_t NB = std::clamp<int64_t>(((int64_t(1) << 18) / K) / 16 * 16, 16, 256);
  const int64_t n_panels = (N + NB - 1) / NB;
  const WidenFn widen = widen_kernel(isa, p.wtype);
  ARB_ASSERT(widen != nullptr);
  const auto* wbase = static_cast<const uint8_t*>(p.W);
  const size_t row_bytes = dtype_bytes(p.wtype, K);
  pool.parallel_for_dynamic(n_panels, int64_t(pool.size()) * 4, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> panel;
    for (int64_t pi = b; pi < e; ++pi) {
      const int64_t n0 = pi * NB, nb = std::min(NB, N - n0);
      const float* wp;
      if (p.wtype == DType::F32) {
        wp = reinterpret_cast<const float*>(wbase + size_t(n0) * row_bytes);
      } else {
        panel.resize(size_t(NB * K));
        for (int64_t r = 0; r < nb; ++r)
          widen(wbase + size_t(n0 + r) * row_bytes, panel.data() + r * K, K);
        wp = panel.data();
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(nb), int(K), 1.0f, p.x,
                  int(K), wp, int(K), 0.0f, p.out + n0, int(N));
      if (p.bias)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t n = n0; n < n0 + nb; ++n) p.out[t * N + n] += p.bias[n];
    }
  });
}

}  // namespace arbiter::cpu
