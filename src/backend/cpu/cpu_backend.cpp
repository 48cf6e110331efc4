// Placeholder until the SIMD tier lands: f32 loops. Replaced by the cpu tier's kernels.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/ref/ref_backend.h"
#include "core/error.h"
#include "model/rope.h"

namespace arbiter {
namespace {

float* f32(const Buffer& b) { return static_cast<float*>(b.ptr); }

class CpuBackend final : public Backend {
 public:
  std::string device_name() const override { return "cpu"; }
  std::string compute_name() const override { return "f32"; }
  Buffer alloc(int64_t n, bool logits) override {
    Buffer b;
    b.ptr = new float[size_t(n)]();
    b.n = n;
    b.dtype = DType::F32;
    return b;
  }
  void free(Buffer& b) override { delete[] f32(b); b = Buffer{}; }
  void read(const Buffer& b, int64_t off, int64_t n, double* dst) override {
    for (int64_t i = 0; i < n; ++i) dst[i] = f32(b)[off + i];
  }
  void write(Buffer& b, int64_t off, int64_t n, const double* src) override {
    for (int64_t i = 0; i < n; ++i) f32(b)[off + i] = float(src[i]);
  }
  void embed(const Tensor& table, const int32_t* ids, int T, Buffer& out) override {
    stats_.record("embed", "cpu.embed");
    const int64_t D = table.cols();
    for (int t = 0; t < T; ++t) row_to_f32(table.dtype, table.row(ids[t]), f32(out) + t * D, D);
  }
  void rmsnorm(const Buffer& x, const Tensor& w, int R, int N, double eps, Buffer& out) override {
    stats_.record("rmsnorm", "cpu.rmsnorm");
    std::vector<float> wd(N);
    row_to_f32(w.dtype, w.data, wd.data(), N);
    for (int r = 0; r < R; ++r) {
      const float* xr = f32(x) + int64_t(r) * N;
      float* yr = f32(out) + int64_t(r) * N;
      float ss = 0;
      for (int i = 0; i < N; ++i) ss += xr[i] * xr[i];
      float inv = 1.0f / std::sqrt(ss / N + float(eps));
      for (int i = 0; i < N; ++i) yr[i] = xr[i] * inv * wd[i];
    }
  }
  void matmul(const Buffer& x, const Tensor& W, const Tensor* bias, int T, Buffer& out) override {
    stats_.record("matmul", "cpu.matmul");
    const int64_t N = W.rows(), K = W.cols();
    std::vector<float> wrow(K), b(N, 0.f);
    if (bias) row_to_f32(bias->dtype, bias->data, b.data(), N);
    for (int64_t n = 0; n < N; ++n) {
      row_to_f32(W.dtype, W.row(n), wrow.data(), K);
      for (int t = 0; t < T; ++t) {
        const float* xt = f32(x) + t * K;
        float acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += xt[k] * wrow[k];
        f32(out)[t * N + n] = acc + b[n];
      }
    }
  }
  void rope(Buffer& x, int T, int nh, int Dh, int pos0, const ModelConfig& cfg) override {
    stats_.record("rope", "cpu.rope");
    std::vector<double> inv = rope_inv_freq(cfg);
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < Dh / 2; ++i) {
        double angle = double(pos0 + t) * inv[i];
        float c = float(std::cos(angle)), s = float(std::sin(angle));
        for (int h = 0; h < nh; ++h) {
          float* head = f32(x) + (int64_t(t) * nh + h) * Dh;
          int a, b;
          rope_pair(cfg.rope_layout, Dh, i, a, b);
          float xa = head[a], xb = head[b];
          head[a] = xa * c - xb * s;
          head[b] = xb * c + xa * s;
        }
      }
  }
  void kv_store(const Buffer& k, const Buffer& v, Buffer& kc, Buffer& vc, int T, int pos0,
                int kv_dim) override {
    stats_.record("kv_store", "cpu.kv_store");
    std::memcpy(f32(kc) + int64_t(pos0) * kv_dim, f32(k), sizeof(float) * T * kv_dim);
    std::memcpy(f32(vc) + int64_t(pos0) * kv_dim, f32(v), sizeof(float) * T * kv_dim);
  }
  void attention(const Buffer& q, const Buffer& kc, const Buffer& vc, int T, int pos0, int H,
                 int Hkv, int Dh, int window, Buffer& out) override {
    stats_.record("attention", "cpu.attention");
    const int kv_dim = Hkv * Dh, group = H / Hkv;
    const float scale = 1.0f / std::sqrt(float(Dh));
    std::vector<float> score(size_t(pos0 + T));
    for (int t = 0; t < T; ++t) {
      const int i = pos0 + t, lo = window > 0 ? std::max(0, i - window + 1) : 0;
      for (int h = 0; h < H; ++h) {
        const float* qh = f32(q) + (int64_t(t) * H + h) * Dh;
        const int hk = h / group;
        float mx = -std::numeric_limits<float>::infinity();
        for (int j = lo; j <= i; ++j) {
          const float* kj = f32(kc) + int64_t(j) * kv_dim + hk * Dh;
          float dot = 0;
          for (int d = 0; d < Dh; ++d) dot += qh[d] * kj[d];
          score[j] = dot * scale;
          mx = std::max(mx, score[j]);
        }
        float sum = 0;
        for (int j = lo; j <= i; ++j) { score[j] = std::exp(score[j] - mx); sum += score[j]; }
        float* oh = f32(out) + (int64_t(t) * H + h) * Dh;
        for (int d = 0; d < Dh; ++d) oh[d] = 0;
        for (int j = lo; j <= i; ++j) {
          const float* vj = f32(vc) + int64_t(j) * kv_dim + hk * Dh;
          for (int d = 0; d < Dh; ++d) oh[d] += score[j] / sum * vj[d];
        }
      }
    }
  }
  void swiglu(const Buffer& gate, const Buffer& up, int64_t n, Buffer& out) override {
    stats_.record("swiglu", "cpu.swiglu");
    for (int64_t i = 0; i < n; ++i) {
      float g = f32(gate)[i];
      f32(out)[i] = g / (1.0f + std::exp(-g)) * f32(up)[i];
    }
  }
  void add(Buffer& x, const Buffer& y, int64_t n) override {
    stats_.record("add", "cpu.add");
    for (int64_t i = 0; i < n; ++i) f32(x)[i] += f32(y)[i];
  }
  void summarize(const Buffer& logits, int T, int V, int K, const int32_t* targets,
                 std::vector<LogitsSummary>& out) override {
    stats_.record("summarize", "cpu.summarize");
    out.resize(T);
    std::vector<double> row(V);
    for (int t = 0; t < T; ++t) {
      read(logits, int64_t(t) * V, V, row.data());
      summarize_row(row.data(), V, K, targets[t], out[t]);
    }
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(); }

}  // namespace arbiter
