// GEMM (matmul with T > 1: prefill, verify-sized forwards): our register-blocked kernel and an
// OpenBLAS path, both taking weights in their storage dtype and widening them per panel.
//
// Own kernel (the classic packed outer-product scheme, as in BLIS/GotoBLAS):
//   x [T, K] is packed once into micro-panels Xp[tb][k][MR] (MR tokens, zero-padded);
//   for each k-block of KC, each strip of NR = 2 vectors of output columns is widened and
//   transposed into Bp[k][NR] (L1-resident), then an MR x NR tile of out is updated for every
//   token block: per k, MR broadcasts of x times two vectors of weights, 2*MR FMAs into
//   2*MR register accumulators (AVX-512: 12 x 32, 24 zmm accumulators).
// Every out element is one FMA chain over k = 0..K-1 (a k-block continues the chain from the
// stored partial sum), so the result depends neither on the tiling nor on the thread count.
// Threads take whole strips; the strip grid is fixed by N alone.
#include <cblas.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace arbiter::cpu {

namespace {

constexpr int64_t kKC = 256;  // k-block: Bp is KC x NR f32 = 32 KiB at NR = 32 (fits L1d)

template <class V>
struct Tile;
template <>
struct Tile<VScalar> {
  static constexpr int MR = 4;
};
#ifdef ARBITER_CPU_AVX2
template <>
struct Tile<VAvx2> {
  static constexpr int MR = 6;  // 12 ymm accumulators + 2 weight vectors + 1 broadcast of 16
};
#endif
#ifdef ARBITER_CPU_AVX512
template <>
struct Tile<VAvx512> {
  static constexpr int MR = 12;  // 24 zmm accumulators + 2 weight vectors of 32 registers
};
#endif

// Xp[tb][k][MR] for token blocks [tb0, tb1); rows past T are zero.
template <int MR>
void pack_x(const float* x, int64_t T, int64_t K, float* xp, int64_t tb0, int64_t tb1) {
  for (int64_t tb = tb0; tb < tb1; ++tb) {
    float* dst = xp + tb * K * MR;
    for (int m = 0; m < MR; ++m) {
      const int64_t t = tb * MR + m;
      if (t < T) {
        const float* src = x + t * K;
        for (int64_t k = 0; k < K; ++k) dst[k * MR + m] = src[k];
      } else {
        for (int64_t k = 0; k < K; ++k) dst[k * MR + m] = 0.f;
      }
    }
  }
}

// c[MR x NR] (+)= ap[kc][MR] * bp[kc][NR]; only the first mr rows and nr columns of c exist.
template <class V, int MR>
inline void micro_kernel(const float* ap, const float* bp, int64_t kc, float* c, int64_t ldc,
                         int mr, int nr, bool accumulate) {
  using R = typename V::R;
  constexpr int W = V::W;
  R c0[MR], c1[MR];
#pragma GCC unroll 16
  for (int m = 0; m < MR; ++m) c0[m] = c1[m] = V::zero();
  if (accumulate) {
    for (int m = 0; m < mr; ++m) {
      const float* cm = c + m * ldc;
      c0[m] = nr >= W ? V::load(cm) : V::load_n(cm, nr);
      if (nr >= 2 * W) c1[m] = V::load(cm + W);
      else if (nr > W) c1[m] = V::load_n(cm + W, nr - W);
    }
  }
  for (int64_t k = 0; k < kc; ++k) {
    const R b0 = V::load(bp + k * 2 * W), b1 = V::load(bp + k * 2 * W + W);
    const float* a = ap + k * MR;
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const R am = V::set1(a[m]);
      c0[m] = V::fma(am, b0, c0[m]);
      c1[m] = V::fma(am, b1, c1[m]);
    }
  }
  for (int m = 0; m < mr; ++m) {
    float* cm = c + m * ldc;
    if (nr >= 2 * W) {
      V::store(cm, c0[m]);
      V::store(cm + W, c1[m]);
    } else if (nr > W) {
      V::store(cm, c0[m]);
      V::store_n(cm + W, c1[m], nr - W);
    } else {
      V::store_n(cm, c0[m], nr);
    }
  }
}

// The packed-x buffer of the calling thread (reused across calls).
std::vector<float>& xp_buffer() {
  thread_local std::vector<float> buf;
  return buf;
}

template <class V>
void gemm_own_impl(Isa isa, const GemmProblem& p, ThreadPool& pool) {
  constexpr int MR = Tile<V>::MR, NR = 2 * V::W;
  const int64_t T = p.T, N = p.N, K = p.K;
  const int64_t n_tb = (T + MR - 1) / MR, n_strips = (N + NR - 1) / NR;
  const WidenFn widen = widen_kernel(isa, p.wtype);
  ARB_ASSERT(widen != nullptr);
  std::vector<float>& xp = xp_buffer();
  xp.resize(size_t(n_tb * MR * K));
  float* xpp = xp.data();
  pool.parallel_for(n_tb, [&](int64_t b, int64_t e) { pack_x<MR>(p.x, T, K, xpp, b, e); });

  pool.parallel_for(n_strips, [&](int64_t s0, int64_t s1) {
    thread_local std::vector<float> bp, wrow;
    bp.resize(size_t(kKC * NR));
    wrow.resize(size_t(kKC));
    const auto* wbase = static_cast<const uint8_t*>(p.W);
    const size_t row_bytes = dtype_bytes(p.wtype, K);
    for (int64_t k0 = 0; k0 < K; k0 += kKC) {
      const int64_t kc = std::min(kKC, K - k0);
      const size_t k_off = dtype_bytes(p.wtype, k0);
      for (int64_t s = s0; s < s1; ++s) {
        const int64_t n0 = s * NR;
        const int nr = int(std::min<int64_t>(NR, N - n0));
        // Widen each weight row's k-block, then transpose it into column r of Bp.
        for (int r = 0; r < NR; ++r) {
          if (r < nr) {
            widen(wbase + size_t(n0 + r) * row_bytes + k_off, wrow.data(), kc);
            for (int64_t k = 0; k < kc; ++k) bp[size_t(k * NR + r)] = wrow[size_t(k)];
          } else {
            for (int64_t k = 0; k < kc; ++k) bp[size_t(k * NR + r)] = 0.f;
          }
        }
        for (int64_t tb = 0; tb < n_tb; ++tb) {
          const int mr = int(std::min<int64_t>(MR, T - tb * MR));
          micro_kernel<V, MR>(xpp + (tb * K + k0) * MR, bp.data(), kc,
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
  pool.parallel_for(n_panels, [&](int64_t b, int64_t e) {
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
