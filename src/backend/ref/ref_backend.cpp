// The f64 oracle: plain loops, f64 accumulation, one fixed sequential reduction order
// (index 0 upward), weights widened exactly from their storage dtype. Readable first; the
// concessions to speed (widening each weight row once per matmul call, four rows of x per
// pass over it) leave every result bit-identical to the plain loop.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/ref/ref_backend.h"
#include "core/error.h"
#include "backend/rope.h"

namespace arbiter {

namespace {

double* f64(const Buffer& b) { return static_cast<double*>(b.ptr); }

class RefBackend final : public Backend {
 public:
  std::string device_name() const override { return "ref"; }
  DType compute() const override { return DType::F64; }

  Buffer alloc(int64_t n, bool logits) override {
    Buffer b;
    b.ptr = new double[size_t(n)]();
    b.n = n;
    b.dtype = DType::F64;
    return b;
  }
  void free(Buffer& b) override {
    delete[] f64(b);
    b = Buffer{};
  }
  void read(const Buffer& b, int64_t off, int64_t n, double* dst) override {
    ARB_ASSERT(off >= 0 && off + n <= b.n);
    if (n > 0) std::memcpy(dst, f64(b) + off, size_t(n) * sizeof(double));  // an empty buffer has no data
  }
  void write(Buffer& b, int64_t off, int64_t n, const double* src) override {
    ARB_ASSERT(off >= 0 && off + n <= b.n);
    if (n > 0) std::memcpy(f64(b) + off, src, size_t(n) * sizeof(double));
  }

  void embed(const Tensor& table, const int32_t* ids, int T, Buffer& out) override {
    stats_.record("embed", "ref.embed");
    const int64_t D = table.cols();
    for (int t = 0; t < T; ++t) row_to_f64(table.dtype, table.row(ids[t]), f64(out) + t * D, D);
  }

  void rmsnorm(const Buffer& x, const Tensor& w, int R, int N, double eps,
               Buffer& out) override {
    stats_.record("rmsnorm", "ref.rmsnorm");
    std::vector<double> wd(N);
    row_to_f64(w.dtype, w.data, wd.data(), N);
    norm_rows(x, wd, R, N, eps, out);
  }

  void rmsnorm_1p(const Buffer& x, const Tensor& w, int R, int N, double eps,
                  Buffer& out) override {
    stats_.record("rmsnorm_1p", "ref.rmsnorm_1p");
    std::vector<double> wd(N);
    row_to_f64(w.dtype, w.data, wd.data(), N);
    for (double& v : wd) v += 1.0;  // exact: a stored weight has at most 24 significant bits
    norm_rows(x, wd, R, N, eps, out);
  }

  // out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w
  static void norm_rows(const Buffer& x, const std::vector<double>& wd, int R, int N, double eps,
                        Buffer& out) {
    for (int r = 0; r < R; ++r) {
      const double* xr = f64(x) + int64_t(r) * N;
      double* yr = f64(out) + int64_t(r) * N;
      double ss = 0;
      for (int i = 0; i < N; ++i) ss += xr[i] * xr[i];
      double inv = 1.0 / std::sqrt(ss / N + eps);
      for (int i = 0; i < N; ++i) yr[i] = xr[i] * inv * wd[i];
    }
  }

  void matmul(const Buffer& x, const Tensor& W, const Tensor* bias, int T,
              Buffer& out) override {
    stats_.record("matmul", "ref.matmul");
    const int64_t N = W.rows(), K = W.cols();
    std::vector<double> w4(size_t(4 * K)), b(N, 0.0);
    if (bias) row_to_f64(bias->dtype, bias->data, b.data(), N);
    // Four independent accumulators at a time, each summed in the same order as one at a
    // time, so the result is unchanged and the loop is not latency-bound: four rows of x
    // against a weight row, and for the rows of x left over (all of them in decode), four
    // weight rows against a row of x.
    for (int64_t n0 = 0; n0 < N; n0 += 4) {
      const int nn = int(std::min<int64_t>(4, N - n0));
      for (int r = 0; r < nn; ++r) row_to_f64(W.dtype, W.row(n0 + r), w4.data() + r * K, K);
      const int t4 = T - T % 4;
      for (int r = 0; r < nn; ++r) {
        const int64_t n = n0 + r;
        const double* wrow = w4.data() + r * K;
        for (int t = 0; t < t4; t += 4) {
          const double* x0 = f64(x) + t * K;
          const double *x1 = x0 + K, *x2 = x1 + K, *x3 = x2 + K;
          double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
          for (int64_t k = 0; k < K; ++k) {
            a0 += x0[k] * wrow[k];
            a1 += x1[k] * wrow[k];
            a2 += x2[k] * wrow[k];
            a3 += x3[k] * wrow[k];
          }
          double* o = f64(out) + t * N + n;
          o[0] = a0 + b[n];
          o[N] = a1 + b[n];
          o[2 * N] = a2 + b[n];
          o[3 * N] = a3 + b[n];
        }
      }
      for (int t = t4; t < T; ++t) {
        const double* xt = f64(x) + t * K;
        double* o = f64(out) + t * N + n0;
        if (nn == 4) {
          const double *w0 = w4.data(), *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
          double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
          for (int64_t k = 0; k < K; ++k) {
            a0 += xt[k] * w0[k];
            a1 += xt[k] * w1[k];
            a2 += xt[k] * w2[k];
            a3 += xt[k] * w3[k];
          }
          o[0] = a0 + b[n0];
          o[1] = a1 + b[n0 + 1];
          o[2] = a2 + b[n0 + 2];
          o[3] = a3 + b[n0 + 3];
        } else {
          for (int r = 0; r < nn; ++r) {
            double acc = 0;
            for (int64_t k = 0; k < K; ++k) acc += xt[k] * w4[size_t(r * K + k)];
            o[r] = acc + b[n0 + r];
          }
        }
      }
    }
  }

  void rope(Buffer& x, int T, int nh, int Dh, int pos0, const RopeSpec& rope) override {
    stats_.record("rope", "ref.rope");
    ARB_CHECK(rope.dims == Dh, "[ref] rope: heads of %d, RoPE of %d dimensions", Dh, rope.dims);
    if (!(rope_ == rope)) {
      inv_freq_ = rope_inv_freq(rope);
      rope_ = rope;
    }
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < Dh / 2; ++i) {
        double angle = double(pos0 + t) * inv_freq_[i];
        double c = std::cos(angle), s = std::sin(angle);
        for (int h = 0; h < nh; ++h) {
          double* head = f64(x) + (int64_t(t) * nh + h) * Dh;
          int a, b;
          rope_pair(rope.layout, Dh, i, a, b);
          double xa = head[a], xb = head[b];
          head[a] = xa * c - xb * s;
          head[b] = xb * c + xa * s;
        }
      }
  }

  void kv_store(const Buffer& k, const Buffer& v, Buffer& k_cache, Buffer& v_cache, int T,
                int pos0, int kv_dim) override {
    stats_.record("kv_store", "ref.kv_store");
    const int rows = kv_cache_rows(k_cache, v_cache, kv_dim);
    ARB_CHECK(T <= rows, "[ref] kv_store: %d rows into a cache of %d", T, rows);
    for (int t = 0; t < T; ++t) {
      const int64_t at = int64_t((pos0 + t) % rows) * kv_dim, from = int64_t(t) * kv_dim;
      std::memcpy(f64(k_cache) + at, f64(k) + from, sizeof(double) * size_t(kv_dim));
      std::memcpy(f64(v_cache) + at, f64(v) + from, sizeof(double) * size_t(kv_dim));
    }
  }

  void attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T, int pos0,
                 int H, int Hkv, int Dh, int window, Buffer& out) override {
    stats_.record("attention", "ref.attention");
    attend(q, k_cache, v_cache, T, pos0, H, Hkv, Dh, window, 1.0 / std::sqrt(double(Dh)), 0,
           out);
  }

  void scaled_attention(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T,
                        int pos0, int H, int Hkv, int Dh, int window, double scale,
                        double softcap, Buffer& out) override {
    stats_.record("scaled_attention", "ref.attention");
    attend(q, k_cache, v_cache, T, pos0, H, Hkv, Dh, window, scale, softcap, out);
  }

  void kv_store_paged(const Buffer& k, const Buffer& v, Buffer& k_pool, Buffer& v_pool,
                      const KvPages& pages, int T, int pos0, int kv_dim) override {
    stats_.record("kv_store", "ref.kv_store_paged");
    check_kv_pages(k_pool, v_pool, kv_dim, pages, pos0 + T, "ref");
    for (int t = 0; t < T; ++t) {
      const int64_t at = pages.row(pos0 + t) * kv_dim, from = int64_t(t) * kv_dim;
      std::memcpy(f64(k_pool) + at, f64(k) + from, sizeof(double) * size_t(kv_dim));
      std::memcpy(f64(v_pool) + at, f64(v) + from, sizeof(double) * size_t(kv_dim));
    }
  }

  void attention_paged(const Buffer& q, const Buffer& k_pool, const Buffer& v_pool,
                       const KvPages& pages, int T, int pos0, int H, int Hkv, int Dh, int window,
                       const AttentionScores& scores, Buffer& out) override {
    const bool plain = scores.scale == 0 && scores.softcap == 0;
    stats_.record(plain ? "attention" : "scaled_attention", "ref.attention_paged");
    check_kv_pages(k_pool, v_pool, Hkv * Dh, pages, pos0 + T, "ref");
    attend_rows(q, k_pool, v_pool, T, pos0, H, Hkv, Dh, window,
                plain ? 1.0 / std::sqrt(double(Dh)) : scores.scale, scores.softcap, out,
                [&](int j) { return pages.row(j); });
  }

  void set_row_invariant(bool) override {}  // every element is one f64 sum in k order

  // Scores s = scale * q.k (softcap > 0: s = tanh(s / softcap) * softcap), softmax over the
  // keys in (i - window, i], weighted sum of the values; position p at row p % rows.
  static void attend(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T,
                     int pos0, int H, int Hkv, int Dh, int window, double scale, double softcap,
                     Buffer& out) {
    const int rows = attention_cache_rows(k_cache, v_cache, Hkv * Dh, T, pos0, window, "ref");
    attend_rows(q, k_cache, v_cache, T, pos0, H, Hkv, Dh, window, scale, softcap, out,
                [rows](int j) { return int64_t(j % rows); });
  }

  // attend() with position j's K and V at row row_of(j).
  template <class RowOf>
  static void attend_rows(const Buffer& q, const Buffer& k_cache, const Buffer& v_cache, int T,
                          int pos0, int H, int Hkv, int Dh, int window, double scale,
                          double softcap, Buffer& out, RowOf row_of) {
    const int kv_dim = Hkv * Dh, group = H / Hkv;
    std::vector<double> score(size_t(pos0 + T));
    for (int t = 0; t < T; ++t) {
      const int i = pos0 + t;  // query position; keys in [lo, i]
      const int lo = window > 0 ? std::max(0, i - window + 1) : 0;
      for (int h = 0; h < H; ++h) {
        const double* qh = f64(q) + (int64_t(t) * H + h) * Dh;
        const int hk = h / group;
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = lo; j <= i; ++j) {
          const double* kj = f64(k_cache) + row_of(j) * kv_dim + hk * Dh;
          double dot = 0;
          for (int d = 0; d < Dh; ++d) dot += qh[d] * kj[d];
          score[j] = dot * scale;
          if (softcap > 0) score[j] = std::tanh(score[j] / softcap) * softcap;
          mx = std::max(mx, score[j]);
        }
        double sum = 0;
        for (int j = lo; j <= i; ++j) {
          score[j] = std::exp(score[j] - mx);
          sum += score[j];
        }
        double* oh = f64(out) + (int64_t(t) * H + h) * Dh;
        for (int d = 0; d < Dh; ++d) oh[d] = 0;
        for (int j = lo; j <= i; ++j) {
          const double* vj = f64(v_cache) + row_of(j) * kv_dim + hk * Dh;
          const double p = score[j] / sum;
          for (int d = 0; d < Dh; ++d) oh[d] += p * vj[d];
        }
      }
    }
  }

  void swiglu(const Buffer& gate, const Buffer& up, int64_t n, Buffer& out) override {
    stats_.record("swiglu", "ref.swiglu");
    for (int64_t i = 0; i < n; ++i) {
      double g = f64(gate)[i];
      f64(out)[i] = g / (1.0 + std::exp(-g)) * f64(up)[i];
    }
  }

  void geglu(const Buffer& gate, const Buffer& up, int64_t n, Buffer& out) override {
    stats_.record("geglu", "ref.geglu");
    const double c = std::sqrt(2.0 / 3.14159265358979323846);
    for (int64_t i = 0; i < n; ++i) {
      const double g = f64(gate)[i];
      f64(out)[i] = 0.5 * g * (1.0 + std::tanh(c * (g + 0.044715 * g * g * g))) * f64(up)[i];
    }
  }

  void scale(Buffer& x, int64_t n, double s) override {
    stats_.record("scale", "ref.scale");
    for (int64_t i = 0; i < n; ++i) f64(x)[i] *= s;
  }

  void softcap(Buffer& x, int64_t n, double cap) override {
    stats_.record("softcap", "ref.softcap");
    for (int64_t i = 0; i < n; ++i) f64(x)[i] = std::tanh(f64(x)[i] / cap) * cap;
  }

  void ssm_conv(const Buffer& x, const Tensor& w, const Tensor* bias, int T, int C, int K,
                Buffer& state, Buffer& out) override {
    stats_.record("ssm_conv", "ref.ssm_conv");
    ARB_ASSERT(w.numel() == int64_t(C) * K && (!bias || bias->numel() == C) && K >= 1);
    std::vector<double> wd(size_t(C) * K), bd(size_t(C), 0.0);
    row_to_f64(w.dtype, w.data, wd.data(), int64_t(C) * K);
    if (bias) row_to_f64(bias->dtype, bias->data, bd.data(), C);
    // seq = [state; x]: row r < K-1 of seq is state row r, row K-1+t is x row t.
    auto seq = [&](int r, int c) {
      return r < K - 1 ? f64(state)[int64_t(r) * C + c] : f64(x)[int64_t(r - (K - 1)) * C + c];
    };
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        double acc = 0;
        for (int k = 0; k < K; ++k) acc += wd[size_t(c) * K + k] * seq(t + k, c);
        acc += bd[size_t(c)];
        f64(out)[int64_t(t) * C + c] = acc / (1.0 + std::exp(-acc));
      }
    std::vector<double> next(size_t(K - 1) * C);  // the last K-1 rows of seq
    for (int r = 0; r < K - 1; ++r)
      for (int c = 0; c < C; ++c) next[size_t(r) * C + c] = seq(T + r, c);
    std::copy(next.begin(), next.end(), f64(state));
  }

  void ssm_scan(const Buffer& xbc, const Buffer& dt_raw, const Tensor& A_log, const Tensor& D,
                const Tensor& dt_bias, double dt_min, double dt_max, int T, int nh, int hd, int G,
                int N, int /*chunk: the oracle is the recurrence (backend.h)*/, Buffer& state,
                Buffer& y) override {
    stats_.record("ssm_scan", "ref.ssm_scan");
    ARB_ASSERT(nh % G == 0 && A_log.numel() == nh && D.numel() == nh && dt_bias.numel() == nh);
    std::vector<double> a_log(static_cast<size_t>(nh)), dd(a_log), db(a_log);
    row_to_f64(A_log.dtype, A_log.data, a_log.data(), nh);
    row_to_f64(D.dtype, D.data, dd.data(), nh);
    row_to_f64(dt_bias.dtype, dt_bias.data, db.data(), nh);
    const int64_t I = int64_t(nh) * hd, width = I + 2 * int64_t(G) * N;
    const int heads_per_group = nh / G;
    for (int t = 0; t < T; ++t) {
      const double* xt = f64(xbc) + t * width;
      const double* Bt = xt + I;
      const double* Ct = Bt + int64_t(G) * N;
      for (int h = 0; h < nh; ++h) {
        const int g = h / heads_per_group;
        const double v = f64(dt_raw)[int64_t(t) * nh + h] + db[size_t(h)];
        double dt = v > 20 ? v : std::log1p(std::exp(v));  // torch softplus, threshold 20
        dt = std::min(std::max(dt, dt_min), dt_max);
        const double decay = std::exp(dt * -std::exp(a_log[size_t(h)]));
        for (int p = 0; p < hd; ++p) {
          const double xp = xt[int64_t(h) * hd + p];
          double* s = f64(state) + (int64_t(h) * hd + p) * N;
          double acc = 0;
          for (int n = 0; n < N; ++n) {
            s[n] = decay * s[n] + dt * Bt[int64_t(g) * N + n] * xp;
            acc += s[n] * Ct[int64_t(g) * N + n];
          }
          f64(y)[int64_t(t) * I + int64_t(h) * hd + p] = acc + dd[size_t(h)] * xp;
        }
      }
    }
  }

  void rmsnorm_gated(const Buffer& y, const Buffer& z, const Tensor& w, int R, int W, int group,
                     double eps, Buffer& out) override {
    stats_.record("rmsnorm_gated", "ref.rmsnorm_gated");
    ARB_ASSERT(group >= 1 && W % group == 0 && w.numel() == W);
    std::vector<double> wd(static_cast<size_t>(W)), v(static_cast<size_t>(group));
    row_to_f64(w.dtype, w.data, wd.data(), W);
    for (int r = 0; r < R; ++r)
      for (int g0 = 0; g0 < W; g0 += group) {
        const int64_t o = int64_t(r) * W + g0;
        double ss = 0;
        for (int i = 0; i < group; ++i) {
          const double zi = f64(z)[o + i];
          v[size_t(i)] = f64(y)[o + i] * (zi / (1.0 + std::exp(-zi)));
          ss += v[size_t(i)] * v[size_t(i)];
        }
        const double inv = 1.0 / std::sqrt(ss / group + eps);
        for (int i = 0; i < group; ++i) f64(out)[o + i] = v[size_t(i)] * inv * wd[size_t(g0 + i)];
      }
  }

  void relu2(const Buffer& x, int64_t n, Buffer& out) override {
    stats_.record("relu2", "ref.relu2");
    for (int64_t i = 0; i < n; ++i) {
      const double v = std::max(f64(x)[i], 0.0);
      f64(out)[i] = v * v;
    }
  }

  void add(Buffer& x, const Buffer& y, int64_t n) override {
    stats_.record("add", "ref.add");
    for (int64_t i = 0; i < n; ++i) f64(x)[i] += f64(y)[i];
  }

  void summarize(const Buffer& logits, int T, int V, int K, const int32_t* targets,
                 std::vector<LogitsSummary>& out) override {
    stats_.record("summarize", "ref.summarize");
    out.resize(T);
    for (int t = 0; t < T; ++t) summarize_row(f64(logits) + int64_t(t) * V, V, K, targets[t], out[t]);
  }

 private:
  std::vector<double> inv_freq_;
  RopeSpec rope_{-1, 0.0, {}, RopeLayout::Half};  // the spec inv_freq_ was computed for
};

}  // namespace

void summarize_row(const double* row, int V, int K, int32_t target, LogitsSummary& s) {
  s = LogitsSummary{};
  double mx = -std::numeric_limits<double>::infinity();
  for (int v = 0; v < V; ++v) {
    if (!std::isfinite(row[v])) ++s.n_nonfinite;
    else mx = std::max(mx, row[v]);
  }
  if (s.n_nonfinite) {
    s.lse = std::numeric_limits<double>::quiet_NaN();
  } else {
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
    s.lse = mx + std::log(sum);
  }
  s.target_logit = target >= 0 && target < V ? row[target] : std::nan("");
  // Top-K by partial selection: descending logit, ties to the lower id. NaN sorts last.
  std::vector<int32_t> idx(V);
  for (int v = 0; v < V; ++v) idx[v] = v;
  auto better = [row](int32_t a, int32_t b) {
    double x = row[a], y = row[b];
    bool xn = std::isnan(x), yn = std::isnan(y);
    if (xn != yn) return yn;
    if (x != y && !xn) return x > y;
    return a < b;
  };
  std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), better);
  s.top_ids.assign(idx.begin(), idx.begin() + K);
  s.top_logits.resize(K);
  for (int k = 0; k < K; ++k) s.top_logits[k] = row[s.top_ids[k]];
}

std::unique_ptr<Backend> make_ref_backend() { return std::make_unique<RefBackend>(); }

}  // namespace arbiter
