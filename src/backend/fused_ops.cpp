// Default compositions of the fused ops of the Backend interface (backend.h): the plain ops
// one by one, exactly as the forward pass called them before the fused ops existed. ref and
// cpu use these; the CUDA tier overrides them for single-token forwards.
#include "backend/backend.h"

#include "core/error.h"

namespace arbiter {

void Backend::rmsnorm_matmul(const Buffer& x, const Tensor& w, int T, int D, double eps,
                             Buffer& xn, const MatmulTarget* outs, int n_outs) {
  rmsnorm(x, w, T, D, eps, xn);
  for (int i = 0; i < n_outs; ++i)
    matmul(xn, *outs[i].W, outs[i].bias && !outs[i].bias->empty() ? outs[i].bias : nullptr, T,
           *outs[i].out);
}

void Backend::rmsnorm_swiglu(const Buffer& x, const Tensor& w, int T, int D, double eps,
                             Buffer& xn, const Tensor& w_gate, const Tensor& w_up, Buffer& gate,
                             Buffer& up, Buffer& act) {
  rmsnorm(x, w, T, D, eps, xn);
  matmul(xn, w_gate, nullptr, T, gate);
  matmul(xn, w_up, nullptr, T, up);
  swiglu(gate, up, int64_t(T) * w_gate.rows(), act);
}

void Backend::matmul_add(const Buffer& x, const Tensor& W, int T, Buffer& tmp, Buffer& residual) {
  matmul(x, W, nullptr, T, tmp);
  add(residual, tmp, int64_t(T) * W.rows());
}

void Backend::qk_rope_store(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                            const Tensor* k_norm, double eps, int T, int H, int Hkv, int Dh,
                            int pos0, const ModelConfig& cfg, Buffer& k_cache, Buffer& v_cache) {
  if (q_norm) rmsnorm(q, *q_norm, T * H, Dh, eps, q);
  if (k_norm) rmsnorm(k, *k_norm, T * Hkv, Dh, eps, k);
  rope(q, T, H, Dh, pos0, cfg);
  rope(k, T, Hkv, Dh, pos0, cfg);
  kv_store(k, v, k_cache, v_cache, T, pos0, Hkv * Dh);
}

void Backend::qk_rope_attention(Buffer& q, Buffer& k, const Buffer& v, const Tensor* q_norm,
                                const Tensor* k_norm, double eps, int T, int H, int Hkv, int Dh,
                                int pos0, const ModelConfig& cfg, Buffer& k_cache,
                                Buffer& v_cache, int window, Buffer& out) {
  qk_rope_store(q, k, v, q_norm, k_norm, eps, T, H, Hkv, Dh, pos0, cfg, k_cache, v_cache);
  attention(q, k_cache, v_cache, T, pos0, H, Hkv, Dh, window, out);
}

void Backend::pick_greedy(const Buffer& logits, int row, int V) {
  std::vector<LogitsSummary> s;
  summarize(logits, row + 1, V, 1, std::vector<int32_t>(size_t(row) + 1, -1).data(), s);
  last_pick_ = s[size_t(row)].top_ids[0];
  picks_.push_back(last_pick_);
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
