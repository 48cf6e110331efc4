#include "backend/cpu/ssm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/simd.h"
#include "core/error.h"

namespace arbiter::cpu {

namespace {

float silu(float v) { return v / (1.f + std::exp(-v)); }

// dt of token t, head h: clamp(softplus(dt_raw + dt_bias)), torch's softplus linear above 20.
float scan_dt(const ScanArgs& a, int64_t t, int64_t h) {
  const float v = a.dt_raw[t * a.nh + h] + a.dt_bias[h];
  const float dt = v > 20.f ? v : std::log1p(std::exp(v));
  return float(std::min(std::max(double(dt), a.dt_min), a.dt_max));
}

}  // namespace

void ssm_conv_f32(const float* x, const float* w, const float* b, int T, int C, int K,
                  float* state, float* out) {
  // seq = [state; x]: the row r < K-1 is state's, K-1+t is x's t.
  auto row = [&](int r) {
    return r < K - 1 ? state + int64_t(r) * C : x + int64_t(r - (K - 1)) * C;
  };
  std::vector<float> acc(static_cast<size_t>(C));
  for (int t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int k = 0; k < K; ++k) {
      const float* s = row(t + k);
      for (int c = 0; c < C; ++c) acc[size_t(c)] += w[int64_t(c) * K + k] * s[c];
    }
    float* o = out + int64_t(t) * C;
    for (int c = 0; c < C; ++c) o[c] = silu(acc[size_t(c)] + (b ? b[c] : 0.f));
  }
  std::vector<float> next(size_t(K - 1) * C);
  for (int r = 0; r < K - 1; ++r) std::copy_n(row(T + r), C, next.data() + int64_t(r) * C);
  std::copy(next.begin(), next.end(), state);
}

void ssm_scan_f32(const ScanArgs& a, ThreadPool& pool) {
  const int64_t I = int64_t(a.nh) * a.hd, width = I + 2 * int64_t(a.G) * a.N;
  const int heads_per_group = a.nh / a.G;
  auto heads = [&](int64_t h0, int64_t h1) {
    for (int t = 0; t < a.T; ++t) {
      const float* xt = a.xbc + t * width;
      const float* Bt = xt + I;
      const float* Ct = Bt + int64_t(a.G) * a.N;
      for (int64_t h = h0; h < h1; ++h) {
        const int64_t g = h / heads_per_group;
        const float dt = scan_dt(a, t, h);
        const float decay = std::exp(dt * -std::exp(a.a_log[h]));
        const float* B = Bt + g * a.N;
        const float* C = Ct + g * a.N;
        for (int p = 0; p < a.hd; ++p) {
          const float xp = xt[h * a.hd + p], dtx = dt * xp;
          float* s = a.state + (h * a.hd + p) * a.N;
          float acc = 0;
          for (int n = 0; n < a.N; ++n) {
            s[n] = decay * s[n] + dtx * B[n];
            acc += s[n] * C[n];
          }
          a.y[int64_t(t) * I + h * a.hd + p] = acc + a.d[h] * xp;
        }
      }
    }
  };
  // Heads are independent: each worker runs its heads through every token.
  if (I * a.N * a.T >= (1 << 16)) pool.parallel_for(a.nh, heads);
  else heads(0, a.nh);
}

namespace {

template <class V>
float dot(const float* a, const float* b, int n) {
  typename V::R acc = V::zero();
  int i = 0;
  for (; i + V::W <= n; i += V::W) acc = V::fma(V::load(a + i), V::load(b + i), acc);
  if (i < n) acc = V::fma(V::load_n(a + i, n - i), V::load_n(b + i, n - i), acc);
  return V::reduce_add(acc);
}

// y[0, n) = s y + c x (s = 1: y += c x).
template <class V>
void scale_axpy(float s, float c, const float* x, float* y, int n) {
  const typename V::R sv = V::set1(s), cv = V::set1(c);
  int i = 0;
  for (; i + V::W <= n; i += V::W)
    V::store(y + i, V::fma(cv, V::load(x + i), V::mul(sv, V::load(y + i))));
  if (i < n)
    V::store_n(y + i, V::fma(cv, V::load_n(x + i, n - i), V::mul(sv, V::load_n(y + i, n - i))),
               n - i);
}

// Mamba2's SSD (Dao & Gu 2024, "Transformers are SSMs", sec. 6; HF
// GraniteMoeHybridMambaLayer.torch_forward's "ssd naive" branch), per head h and chunk of L
// tokens [c0, c0 + L), with la_t = dt_t A the log-decay of token t, seg(t, s) = la_{s+1} + ...
// + la_t (HF segment_sum: summed, never cum_t - cum_s, which cancels) and S the state entering
// the chunk:
//   y_t = exp(seg(t, c0 - 1)) C_t . S                           (HF's Y_off: state -> output)
//       + sum_{c0 <= s <= t} (C_t . B_s) exp(seg(t, s)) dt_s x_s   (Y_diag: the diagonal block)
//       + D x_t
//   S  <- exp(seg(c0 + L - 1, c0 - 1)) S + sum_s exp(seg(c0 + L - 1, s)) dt_s x_s B_s^T
// The last line is HF's chunk states and inter-chunk recurrence, run chunk after chunk (HF
// forms every chunk's state at once; the sums are the same). C_t . B_s depends on the group
// only: a worker computes it once per (chunk, group) for the heads it runs.
template <class V>
void scan_chunked(const ScanArgs& a, ThreadPool& pool) {
  const int64_t I = int64_t(a.nh) * a.hd, width = I + 2 * int64_t(a.G) * a.N;
  const int heads_per_group = a.nh / a.G, Q = std::min(a.chunk, a.T), hd = a.hd, N = a.N;
  auto heads = [&](int64_t h0, int64_t h1) {
    const size_t q = size_t(Q);
    std::vector<float> cb(q * q), dt(q), la(q), w(q), acc(static_cast<size_t>(hd));
    for (int c0 = 0; c0 < a.T; c0 += Q) {
      const int L = std::min(Q, a.T - c0);
      const float* x0 = a.xbc + c0 * width;  // row s of x, B, C at + s * width
      int64_t g_done = -1;
      for (int64_t h = h0; h < h1; ++h) {
        const int64_t g = h / heads_per_group;
        const float* B0 = x0 + I + g * N;
        const float* C0 = B0 + int64_t(a.G) * N;
        if (g != g_done) {  // cb[t, s] = C_t . B_s, s <= t
          for (int t = 0; t < L; ++t)
            for (int s = 0; s <= t; ++s)
              cb[size_t(t) * Q + s] = dot<V>(C0 + t * width, B0 + s * width, N);
          g_done = g;
        }
        const float A = -std::exp(a.a_log[h]);
        for (int t = 0; t < L; ++t) {
          dt[size_t(t)] = scan_dt(a, c0 + t, h);
          la[size_t(t)] = dt[size_t(t)] * A;
        }
        float* S = a.state + h * hd * N;
        auto x = [&](int s) { return x0 + s * width + h * hd; };
        float cum = 0;  // seg(t, c0 - 1)
        for (int t = 0; t < L; ++t) {
          cum += la[size_t(t)];
          std::fill(acc.begin(), acc.end(), 0.f);
          float seg = 0;  // seg(t, s), s from t down
          for (int s = t; s >= 0; --s) {
            scale_axpy<V>(1.f, cb[size_t(t) * Q + s] * std::exp(seg) * dt[size_t(s)], x(s),
                          acc.data(), hd);
            seg += la[size_t(s)];
          }
          const float in_decay = std::exp(cum), *Ct = C0 + t * width, *xt = x(t);
          float* yt = a.y + (c0 + t) * I + h * hd;
          for (int p = 0; p < hd; ++p)
            yt[p] = in_decay * dot<V>(S + p * N, Ct, N) + acc[size_t(p)] + a.d[h] * xt[p];
        }
        // The state leaving the chunk: w_s = exp(seg(last, s)) dt_s, then the entering state's
        // decay exp(seg(last, c0 - 1)).
        float seg = 0;
        for (int s = L - 1; s >= 0; --s) {
          w[size_t(s)] = std::exp(seg) * dt[size_t(s)];
          seg += la[size_t(s)];
        }
        const float out_decay = std::exp(seg);
        for (int p = 0; p < hd; ++p) {
          float* Sp = S + p * N;
          for (int s = 0; s < L; ++s)
            scale_axpy<V>(s == 0 ? out_decay : 1.f, w[size_t(s)] * x(s)[p], B0 + s * width, Sp,
                          N);
        }
      }
    }
  };
  // Heads are independent; a head's chunks run in order on one worker (the state carries).
  if (I * N * a.T >= (1 << 16)) pool.parallel_for(a.nh, heads);
  else heads(0, a.nh);
}

}  // namespace

void ssm_scan_chunked_f32(Isa isa, const ScanArgs& a, ThreadPool& pool) {
  switch (isa) {
    case Isa::Scalar: return scan_chunked<VScalar>(a, pool);
#ifdef ARBITER_CPU_AVX2
    case Isa::Avx2: return scan_chunked<VAvx2>(a, pool);
#endif
#ifdef ARBITER_CPU_AVX512
    case Isa::Avx512: return scan_chunked<VAvx512>(a, pool);
#endif
    default: throw Error(std::string("[cpu] ISA ") + isa_name(isa) + " not compiled in");
  }
}

void rmsnorm_gated_f32(const float* y, const float* z, const float* w, int R, int W, int group,
                       float eps, float* out) {
  std::vector<float> v(static_cast<size_t>(group));
  for (int r = 0; r < R; ++r)
    for (int g0 = 0; g0 < W; g0 += group) {
      const int64_t o = int64_t(r) * W + g0;
      float ss = 0;
      for (int i = 0; i < group; ++i) {
        v[size_t(i)] = y[o + i] * silu(z[o + i]);
        ss += v[size_t(i)] * v[size_t(i)];
      }
      const float inv = 1.f / std::sqrt(ss / float(group) + eps);
      for (int i = 0; i < group; ++i) out[o + i] = v[size_t(i)] * inv * w[g0 + i];
    }
}

}  // namespace arbiter::cpu
