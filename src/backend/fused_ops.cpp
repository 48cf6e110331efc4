// Stage taps on the host path, and the default compositions of the fused ops of the Backend
// interface (backend.h): the plain ops one by one with each stage's tap right after the op
// that computes it. ref and cpu use these; the CUDA tier overrides the fused ops for
// single-token forwards and applies the taps inside its kernels.
#include "backend/backend.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace arbiter {

void Backend::apply_tap(const StageTap* tap, Buffer& out, int rows, int cols) {
  const std::vector<double> rounding = take_input_rounding();
  const bool lost = input_rounding_lost_;
  input_rounding_lost_ = false;
  if (!tap) return;
  const int64_t n = int64_t(rows) * cols;
  if (tap->record && tap->input_rounding) {
    // A rounding lost, or of another shape, came from matmuls inside a composite that did
    // not account for them (Qwen2-MoE's shared expert): NaN, which drift and opcheck refuse
    // by name rather than judge the stage without it.
    double sum = !lost && (rounding.empty() || int64_t(rounding.size()) == n) ? 0.0 : NAN;
    for (double r : rounding) sum += r;
    *tap->input_rounding = sum;
  }
  ARB_CHECK(!tap->fault || tap->noise.empty() || int64_t(tap->noise.size()) == n,
            "[%s] stage tap: %zu noise values for %lld outputs", device_name().c_str(),
            tap->noise.size(), (long long)n);
  if (tap->fault || tap->record) {
    std::vector<double> host(static_cast<size_t>(n));
    read(out, 0, n, host.data());
    if (tap->fault) {
      for (int64_t i = 0; i < n; ++i) {
        double& v = host[size_t(i)];
        v = v * tap->scale + tap->bias;
        if (!tap->noise.empty()) v += tap->noise[size_t(i)];
      }
      write(out, 0, n, host.data());
      // What the next op reads is the stored value: record it rounded as stored.
      if (tap->record) read(out, 0, n, host.data());
    }
    if (tap->record) *tap->record = std::move(host);
  }
  if (tap->overwrite) {
    ARB_CHECK(int64_t(tap->overwrite->size()) == n,
              "[%s] stage tap: %zu values to overwrite %lld outputs", device_name().c_str(),
              tap->overwrite->size(), (long long)n);
    write(out, 0, n, tap->overwrite->data());
  }
}

void Backend::norm(const Buffer& x, const Tensor& w, NormWeight nw, int R, int N, double eps,
                   Buffer& out) {
  if (nw == NormWeight::OnePlus) rmsnorm_1p(x, w, R, N, eps, out);
  else rmsnorm(x, w, R, N, eps, out);
}

void Backend::norm_add(const NormAdd* pre, NormWeight nw, int T, int D, double eps) {
  if (pre) rmsnorm_add(*pre->y, *pre->w, nw, T, D, eps, *pre->residual, pre->norm, pre->sum);
}

void Backend::rmsnorm_matmul(const Buffer& x, const Tensor& w, NormWeight nw, int T, int D,
                             double eps, Buffer& xn, bool /*keep_xn: xn is always kept here*/,
                             const StageTap* norm_tap, const MatmulTarget* outs, int n_outs,
                             const NormAdd* pre) {
  norm_add(pre, nw, T, D, eps);
  norm(x, w, nw, T, D, eps, xn);
  apply_tap(norm_tap, xn, T, D);
  matmuls(xn, T, outs, n_outs);
}

void Backend::matmuls(const Buffer& x, int T, const MatmulTarget* outs, int n_outs) {
  for (int i = 0; i < n_outs; ++i) {
    const MatmulTarget& o = outs[i];
    matmul(x, *o.W, o.bias && !o.bias->empty() ? o.bias : nullptr, T, *o.out);
    apply_tap(o.tap, *o.out, T, int(o.W->rows()));
  }
}

void Backend::apply_conv(const Buffer& x, int T, int C, const ConvTarget& conv) {
  ssm_conv(x, *conv.w, conv.bias, T, C, conv.K, *conv.state, *conv.act);
  apply_tap(conv.tap, *conv.act, T, C);
  apply_tap(conv.state_tap, *conv.state, conv.K - 1, C);
}

void Backend::rmsnorm_matmul_conv(const Buffer& x, const Tensor& w, NormWeight nw, int T, int D,
                                  double eps, Buffer& xn, const StageTap* norm_tap,
                                  const MatmulTarget* outs, int n_outs, const ConvTarget& conv) {
  rmsnorm_matmul(x, w, nw, T, D, eps, xn, false, norm_tap, outs, n_outs);
  apply_conv(*outs[conv.of].out, T, int(outs[conv.of].W->rows()), conv);
}

void Backend::rmsnorm_glu(const Buffer& x, const Tensor& w, NormWeight nw, int T, int D,
                          double eps, Buffer& xn, const Tensor& w_gate, const Tensor& w_up,
                          GluAct act_fn, Buffer& gate, Buffer& up, Buffer& act,
                          const GluTaps& taps, const NormAdd* pre) {
  const int F = int(w_gate.rows());
  norm_add(pre, nw, T, D, eps);
  norm(x, w, nw, T, D, eps, xn);
  apply_tap(taps.norm, xn, T, D);
  const MatmulTarget outs[2] = {{&w_gate, nullptr, &gate, taps.gate},
                                {&w_up, nullptr, &up, taps.up}};
  matmuls(xn, T, outs, 2);
  if (act_fn == GluAct::GeluTanh) geglu(gate, up, int64_t(T) * F, act);
  else swiglu(gate, up, int64_t(T) * F, act);
  apply_tap(taps.act, act, T, F);
}

void Backend::matmul_add(const Buffer& x, const Tensor& W, int T, Buffer& tmp, Buffer& residual,
                         double scale, const StageTap* product, const StageTap* sum) {
  const int N = int(W.rows());
  matmul(x, W, nullptr, T, tmp);
  apply_tap(product, tmp, T, N);
  if (scale != 1) this->scale(tmp, int64_t(T) * N, scale);
  add(residual, tmp, int64_t(T) * N);
  apply_tap(sum, residual, T, N);
}

void Backend::moe_add(const Buffer& logits, const Buffer& x, const MoeExperts& ex, int T,
                      Buffer& out, std::vector<Route>* routes, Buffer& residual,
                      const MoeResidual& r) {
  moe(logits, x, ex, T, out, routes);  // checks the experts: down[0] is [D, F]
  const int D = int(ex.down[0]->rows());
  const int64_t n = int64_t(T) * D;
  apply_tap(r.routed, out, T, D);
  if (r.shared) {
    add(out, *r.shared, n);
    apply_tap(r.sum, out, T, D);
  }
  if (r.scale != 1) scale(out, n, r.scale);
  add(residual, out, n);
  apply_tap(r.res, residual, T, D);
}

void Backend::rmsnorm_add(Buffer& y, const Tensor& w, NormWeight nw, int T, int D, double eps,
                          Buffer& residual, const StageTap* norm_tap, const StageTap* sum) {
  norm(y, w, nw, T, D, eps, y);
  apply_tap(norm_tap, y, T, D);
  add(residual, y, int64_t(T) * D);
  apply_tap(sum, residual, T, D);
}

void Backend::qk_rope_store(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                            const Tensor* k_norm, NormWeight qk_nw, double eps, int T, int H,
                            int Hkv, int Dh, int pos0, const RopeSpec& rope, Buffer& k_cache,
                            Buffer& v_cache, const AttentionTaps& taps) {
  qk_norm_rope(q, k, q_norm, k_norm, qk_nw, eps, T, H, Hkv, Dh, pos0, rope, taps);
  kv_store(k, v, k_cache, v_cache, T, pos0, Hkv * Dh);
}

void Backend::qk_norm_rope(Buffer& q, Buffer& k, const Tensor* q_norm, const Tensor* k_norm,
                           NormWeight qk_nw, double eps, int T, int H, int Hkv, int Dh, int pos0,
                           const RopeSpec& rope, const AttentionTaps& taps) {
  if (q_norm) {
    norm(q, *q_norm, qk_nw, T * H, Dh, eps, q);
    apply_tap(taps.q_norm, q, T, H * Dh);
  }
  if (k_norm) {
    norm(k, *k_norm, qk_nw, T * Hkv, Dh, eps, k);
    apply_tap(taps.k_norm, k, T, Hkv * Dh);
  }
  this->rope(q, T, H, Dh, pos0, rope);
  apply_tap(taps.q_rope, q, T, H * Dh);
  this->rope(k, T, Hkv, Dh, pos0, rope);
  apply_tap(taps.k_rope, k, T, Hkv * Dh);
}

void Backend::qk_rope_attention(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                                const Tensor* k_norm, NormWeight qk_nw, double eps, int T,
                                int H, int Hkv, int Dh, int pos0, const RopeSpec& rope,
                                Buffer& k_cache, Buffer& v_cache, int window,
                                const AttentionScores& scores, Buffer& out,
                                const AttentionTaps& taps) {
  qk_rope_store(q, k, v, q_norm, k_norm, qk_nw, eps, T, H, Hkv, Dh, pos0, rope, k_cache, v_cache,
                taps);
  if (scores.scale == 0 && scores.softcap == 0)
    attention(q, k_cache, v_cache, T, pos0, H, Hkv, Dh, window, out);
  else
    scaled_attention(q, k_cache, v_cache, T, pos0, H, Hkv, Dh, window, scores.scale,
                     scores.softcap, out);
  apply_tap(taps.out, out, T, H * Dh);
}

void Backend::qk_rope_attention_paged(Buffer& q, Buffer& k, const Buffer& v,
                                      const Tensor* q_norm, const Tensor* k_norm,
                                      NormWeight qk_nw, double eps, int T, int H, int Hkv, int Dh,
                                      int pos0, const RopeSpec& rope, Buffer& k_pool,
                                      Buffer& v_pool, const KvPages& pages, int window,
                                      const AttentionScores& scores, Buffer& out) {
  qk_norm_rope(q, k, q_norm, k_norm, qk_nw, eps, T, H, Hkv, Dh, pos0, rope, {});
  kv_store_paged(k, v, k_pool, v_pool, pages, T, pos0, Hkv * Dh);
  attention_paged(q, k_pool, v_pool, pages, T, pos0, H, Hkv, Dh, window, scores, out);
}

void Backend::attention_batch(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                              const Tensor* k_norm, NormWeight nw, double eps, int H, int Hkv,
                              int Dh, const RopeSpec* rope, Buffer& k_pool, Buffer& v_pool,
                              const std::vector<PagedSeq>& seqs, int window,
                              const AttentionScores& scores, Buffer& out) {
  const int q_dim = H * Dh, kv_dim = Hkv * Dh;
  for (const PagedSeq& s : seqs) {
    Buffer qv = buffer_view(q, int64_t(s.row0) * q_dim, int64_t(s.T) * q_dim);
    Buffer kv = buffer_view(k, int64_t(s.row0) * kv_dim, int64_t(s.T) * kv_dim);
    Buffer vv = buffer_view(v, int64_t(s.row0) * kv_dim, int64_t(s.T) * kv_dim);
    Buffer ov = buffer_view(out, int64_t(s.row0) * q_dim, int64_t(s.T) * q_dim);
    if (rope) {
      qk_rope_attention_paged(qv, kv, vv, q_norm, k_norm, nw, eps, s.T, H, Hkv, Dh, s.pos0, *rope,
                              k_pool, v_pool, s.pages, window, scores, ov);
    } else {
      ARB_ASSERT(!q_norm && !k_norm);
      kv_store_paged(kv, vv, k_pool, v_pool, s.pages, s.T, s.pos0, kv_dim);
      attention_paged(qv, k_pool, v_pool, s.pages, s.T, s.pos0, H, Hkv, Dh, window, scores, ov);
    }
  }
}

Buffer buffer_view(const Buffer& b, int64_t off, int64_t n) {
  ARB_ASSERT(off >= 0 && n >= 0 && off + n <= b.n);
  return {static_cast<char*>(b.ptr) + dtype_bytes(b.dtype, off), n, b.dtype};
}

void check_kv_pages(const Buffer& k_pool, const Buffer& v_pool, int kv_dim,
                    const Backend::KvPages& pages, int positions, const char* tier) {
  const int64_t rows = kv_cache_rows(k_pool, v_pool, kv_dim);
  ARB_CHECK(pages.block_rows > 0 && int64_t(pages.n_blocks) * pages.block_rows >= positions,
            "[%s] paged KV: %d blocks of %d rows for %d positions", tier, pages.n_blocks,
            pages.block_rows, positions);
  for (int b = 0; b < pages.n_blocks; ++b)
    ARB_CHECK(pages.blocks[b] >= 0 && (int64_t(pages.blocks[b]) + 1) * pages.block_rows <= rows,
              "[%s] paged KV: block %d outside the pool of %lld rows", tier, pages.blocks[b],
              (long long)rows);
}

int kv_cache_rows(const Buffer& k_cache, const Buffer& v_cache, int kv_dim) {
  ARB_ASSERT(kv_dim > 0 && k_cache.n == v_cache.n && k_cache.n % kv_dim == 0);
  return int(k_cache.n / kv_dim);
}

int attention_cache_rows(const Buffer& k_cache, const Buffer& v_cache, int kv_dim, int T,
                         int pos0, int window, const char* tier) {
  const int rows = kv_cache_rows(k_cache, v_cache, kv_dim);
  const int need = window > 0 ? std::min(pos0 + T, window + T - 1) : pos0 + T;
  ARB_CHECK(rows >= need,
            "[%s] attention of %d queries at position %d (window %d) needs %d cache rows, the "
            "cache has %d", tier, T, pos0, window, need, rows);
  return rows;
}

namespace {

[[noreturn]] void not_implemented(const Backend& be, const char* op,
                                  const char* family = "gemma") {
  throw Error("[" + be.device_name() + "] " + op + " (a " + family +
              " op) is not implemented on this tier; " + family + " models run on ref and cpu");
}

}  // namespace

// Continuous batching (paged KV pool, row-invariant matmuls) runs on ref and cpu; another
// tier refuses it rather than serve it through a path it was not checked on.
[[noreturn]] static void no_batching(const Backend& be, const char* op) {
  const std::string d = be.device_name();
  throw Error("[" + d + "] continuous batching: not on the " + d.substr(0, d.find(':')) +
              " tier yet (" + op + ")");
}
void Backend::kv_store_paged(const Buffer&, const Buffer&, Buffer&, Buffer&, const KvPages&, int,
                             int, int) {
  no_batching(*this, "kv_store_paged");
}
void Backend::attention_paged(const Buffer&, const Buffer&, const Buffer&, const KvPages&, int,
                              int, int, int, int, int, const AttentionScores&, Buffer&) {
  no_batching(*this, "attention_paged");
}
void Backend::set_row_invariant(bool on) {
  if (on) no_batching(*this, "row-invariant matmul");
}

void Backend::rmsnorm_1p(const Buffer&, const Tensor&, int, int, double, Buffer&) {
  not_implemented(*this, "rmsnorm_1p");
}
void Backend::geglu(const Buffer&, const Buffer&, int64_t, Buffer&) {
  not_implemented(*this, "geglu");
}
void Backend::scale(Buffer&, int64_t, double) { not_implemented(*this, "scale"); }
void Backend::softcap(Buffer&, int64_t, double) { not_implemented(*this, "softcap"); }
void Backend::scaled_attention(const Buffer&, const Buffer&, const Buffer&, int, int, int, int,
                               int, int, double, double, Buffer&) {
  not_implemented(*this, "scaled_attention");
}

void Backend::ssm_conv(const Buffer&, const Tensor&, const Tensor*, int, int, int, Buffer&,
                       Buffer&) {
  not_implemented(*this, "ssm_conv", "hybrid");
}
void Backend::ssm_scan(const Buffer&, const Buffer&, const Tensor&, const Tensor&, const Tensor&,
                       double, double, int, int, int, int, int, int, Buffer&, Buffer&) {
  not_implemented(*this, "ssm_scan", "hybrid");
}
void Backend::rmsnorm_gated(const Buffer&, const Buffer&, const Tensor&, int, int, int, double,
                            Buffer&) {
  not_implemented(*this, "rmsnorm_gated", "hybrid");
}
void Backend::relu2(const Buffer&, int64_t, Buffer&) { not_implemented(*this, "relu2", "hybrid"); }

void Backend::pick_greedy(const Buffer& logits, int row, int V) {
  std::vector<LogitsSummary> s;
  summarize(logits, row + 1, V, 1, std::vector<int32_t>(size_t(row) + 1, -1).data(), s);
  push_pick(s[size_t(row)].top_ids[0]);
}

void Backend::push_pick(int32_t id) {
  last_pick_ = id;
  picks_.push_back(id);
}

void Backend::embed_picked(const Tensor& table, Buffer& out) {
  ARB_CHECK(last_pick_ >= 0, "[%s] embed of a picked token before any pick", device_name().c_str());
  embed(table, &last_pick_, 1, out);
}

int32_t Backend::take_pick() {
  ARB_CHECK(!picks_.empty(), "[%s] no pick left to take", device_name().c_str());
  const int32_t id = picks_.front();
  picks_.pop_front();
  return id;
}

}  // namespace arbiter
