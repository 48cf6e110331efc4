#include "backend/cpu/ssm.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace arbiter::cpu {

namespace {

float silu(float v) { return v / (1.f + std::exp(-v)); }

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
        const float v = a.dt_raw[int64_t(t) * a.nh + h] + a.dt_bias[h];
        float dt = v > 20.f ? v : std::log1p(std::exp(v));  // torch softplus, threshold 20
        dt = float(std::min(std::max(double(dt), a.dt_min), a.dt_max));
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
