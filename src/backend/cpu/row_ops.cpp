// Row and element-wise kernels of the CPU tier (rmsnorm, swiglu, add, attention), written
// once over the vector abstraction of simd.h and instantiated per ISA (VScalar is the twin).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd.h"
#include "core/error.h"

namespace arbiter::cpu {

namespace {

// sum(a[i] * b[i]) with two accumulators (even / odd vector steps, tail into the odd one).
template <class V>
inline float dot(const float* a, const float* b, int n) {
  using R = typename V::R;
  constexpr int W = V::W;
  R s0 = V::zero(), s1 = V::zero();
  int i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    s0 = V::fma(V::load(a + i), V::load(b + i), s0);
    s1 = V::fma(V::load(a + i + W), V::load(b + i + W), s1);
  }
  if (i + W <= n) {
    s0 = V::fma(V::load(a + i), V::load(b + i), s0);
    i += W;
  }
  if (i < n) s1 = V::fma(V::load_n(a + i, n - i), V::load_n(b + i, n - i), s1);
  return V::reduce_add(V::add(s0, s1));
}

// HF LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * w. The mean square is summed in f32 with
// SIMD accumulators; the reciprocal square root is taken in f64 and rounded once.
template <class V>
void rmsnorm_rows(const float* x, const float* w, int64_t r0, int64_t r1, int N, double eps,
                  float* out) {
  constexpr int W = V::W;
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * N;
    float* yr = out + r * N;
    const float ss = dot<V>(xr, xr, N);
    const typename V::R inv = V::set1(float(1.0 / std::sqrt(double(ss) / N + eps)));
    int i = 0;
    for (; i + W <= N; i += W)
      V::store(yr + i, V::mul(V::mul(V::load(xr + i), inv), V::load(w + i)));
    if (i < N)
      V::store_n(yr + i, V::mul(V::mul(V::load_n(xr + i, N - i), inv), V::load_n(w + i, N - i)),
                 N - i);
  }
}

// silu(g) * u = g / (1 + exp(-g)) * u (HF SiLU; exp from simd.h's vexp).
template <class V>
inline typename V::R swiglu_vec(typename V::R g, typename V::R u) {
  const typename V::R e = vexp<V>(V::sub(V::zero(), g));
  return V::mul(V::div(g, V::add(V::set1(1.f), e)), u);
}

template <class V>
void swiglu(const float* gate, const float* up, int64_t i0, int64_t i1, float* out) {
  constexpr int W = V::W;
  int64_t i = i0;
  for (; i + W <= i1; i += W) V::store(out + i, swiglu_vec<V>(V::load(gate + i), V::load(up + i)));
  if (i < i1) {
    const int n = int(i1 - i);
    V::store_n(out + i, swiglu_vec<V>(V::load_n(gate + i, n), V::load_n(up + i, n)), n);
  }
}

template <class V>
void add(float* x, const float* y, int64_t i0, int64_t i1) {
  constexpr int W = V::W;
  int64_t i = i0;
  for (; i + W <= i1; i += W) V::store(x + i, V::add(V::load(x + i), V::load(y + i)));
  if (i < i1) {
    const int n = int(i1 - i);
    V::store_n(x + i, V::add(V::load_n(x + i, n), V::load_n(y + i, n)), n);
  }
}

// p[j] = exp(s[j] - mx) in place; returns sum(p) (two accumulators, fixed order).
template <class V>
inline float exp_shift_sum(float* s, int n, float mx) {
  using R = typename V::R;
  constexpr int W = V::W;
  const R m = V::set1(mx);
  R a0 = V::zero(), a1 = V::zero();
  int j = 0;
  for (; j + 2 * W <= n; j += 2 * W) {
    const R e0 = vexp<V>(V::sub(V::load(s + j), m));
    const R e1 = vexp<V>(V::sub(V::load(s + j + W), m));
    V::store(s + j, e0);
    V::store(s + j + W, e1);
    a0 = V::add(a0, e0);
    a1 = V::add(a1, e1);
  }
  for (; j + W <= n; j += W) {
    const R e = vexp<V>(V::sub(V::load(s + j), m));
    V::store(s + j, e);
    a0 = V::add(a0, e);
  }
  if (j < n) {
    // Padding lanes hold exp(0 - mx), masked out of the sum by the partial load below.
    const R e = vexp<V>(V::sub(V::load_n(s + j, n - j), m));
    V::store_n(s + j, e, n - j);
    a1 = V::add(a1, V::load_n(s + j, n - j));
  }
  return V::reduce_add(V::add(a0, a1));
}

// acc[d] += p * v[d]
template <class V>
inline void axpy(float p, const float* v, float* acc, int n) {
  constexpr int W = V::W;
  const typename V::R pv = V::set1(p);
  int d = 0;
  for (; d + W <= n; d += W) V::store(acc + d, V::fma(pv, V::load(v + d), V::load(acc + d)));
  if (d < n) V::store_n(acc + d, V::fma(pv, V::load_n(v + d, n - d), V::load_n(acc + d, n - d)), n - d);
}

// Two-pass softmax per (head, token): scores of one query row against keys [lo, i], max,
// exp and sum, then the weighted sum of value rows divided by the sum once at the end.
template <class V>
void attention_units(const AttentionArgs& a, int64_t u0, int64_t u1) {
  const int kv_dim = a.Hkv * a.Dh, group = a.H / a.Hkv, Dh = a.Dh;
  const float scale = float(a.scale), softcap = float(a.softcap);
  thread_local std::vector<float> score, acc;
  score.resize(size_t(a.pos0 + a.T));
  acc.resize(size_t(Dh));
  for (int64_t u = u0; u < u1; ++u) {
    const int h = int(u / a.T), t = int(u % a.T);
    const int i = a.pos0 + t;
    const int lo = a.window > 0 ? std::max(0, i - a.window + 1) : 0;
    const int L = i - lo + 1;
    const float* qh = a.q + (int64_t(t) * a.H + h) * Dh;
    const int64_t koff = int64_t(h / group) * Dh;
    // Key lo + j sits at row (lo + j) % rows: rows from r0 up to the ring's end, then from 0;
    // in a paged pool, at its block's row.
    const int r0 = lo % a.rows;
    auto row = [&](int j) {
      if (a.blocks) {
        const int p = lo + j;
        return int64_t(a.blocks[p / a.block_rows]) * a.block_rows + p % a.block_rows;
      }
      return int64_t(r0 + j < a.rows ? r0 + j : r0 + j - a.rows);
    };
    float mx = -std::numeric_limits<float>::infinity();
    for (int j = 0; j < L; ++j) {
      float s = dot<V>(qh, a.k_cache + row(j) * kv_dim + koff, Dh) * scale;
      if (softcap > 0) s = std::tanh(s / softcap) * softcap;
      score[size_t(j)] = s;
      mx = s > mx ? s : mx;
    }
    const float sum = exp_shift_sum<V>(score.data(), L, mx);
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int j = 0; j < L; ++j)
      axpy<V>(score[size_t(j)], a.v_cache + row(j) * kv_dim + koff, acc.data(), Dh);
    const float inv = 1.f / sum;
    float* oh = a.out + (int64_t(t) * a.H + h) * Dh;
    for (int d = 0; d < Dh; ++d) oh[d] = acc[size_t(d)] * inv;
  }
}

template <class V>
const RowKernels& kernels_for() {
  static const RowKernels k{rmsnorm_rows<V>, swiglu<V>, add<V>, attention_units<V>};
  return k;
}

}  // namespace

const RowKernels& row_kernels(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return kernels_for<VScalar>();
#ifdef ARBITER_CPU_AVX2
    case Isa::Avx2: return kernels_for<VAvx2>();
#endif
#ifdef ARBITER_CPU_AVX512
    case Isa::Avx512: return kernels_for<VAvx512>();
#endif
    default: throw Error(std::string("[cpu] ISA ") + isa_name(isa) + " not compiled in");
  }
}

}  // namespace arbiter::cpu
