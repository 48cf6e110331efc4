// The per-sequence state of a decoder whose layers each hold one KV cache and share one set of
// scratch buffers (the llama and gemma families): what their forwards read and write.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include <memory>

#include "core/dtype.h"
#include "model/arch.h"
#include "model/archs/moe_ffn.h"
#include "model/config.h"

namespace arbiter {

/// The KV cache of every layer and the scratch of forwards of up to max_T tokens. A layer's
/// cache holds max_ctx rows; with ring_sliding, a sliding layer's (c.layer_sliding) holds
/// only the window + max_T - 1 latest positions as a ring (kv_store), all its attention can
/// see, so its size does not grow with max_ctx. A non-empty kv_layers (the hybrids) limits the
/// caches to the layers it marks; the others get none. gate, up and act hold rows of ff
/// values (0: c.d_ff), the widest MLP of the model.
class DecoderState : public ForwardState {
 public:
  DecoderState(Backend& be, const ModelConfig& c, int max_ctx_, int max_T_,
               bool ring_sliding = false, const std::vector<bool>& kv_layers = {}, int64_t ff = 0)
      : be_(be) {
    const int64_t T = max_T_, D = c.d_model, q_dim = int64_t(c.n_head) * c.head_dim;
    const int64_t kv_dim = int64_t(c.n_head_kv) * c.head_dim, F = ff > 0 ? ff : c.d_ff;
    max_T = max_T_;
    max_ctx = max_ctx_;
    for (int l = 0; l < c.n_layer; ++l) {
      const bool kv = kv_layers.empty() || kv_layers[size_t(l)];
      const bool ring = ring_sliding && c.layer_sliding[size_t(l)] && c.sliding_window > 0;
      const int64_t rows = ring ? std::min<int64_t>(max_ctx, c.sliding_window + T - 1) : max_ctx;
      k_cache.push_back(kv ? be.alloc(rows * kv_dim) : Buffer{});  // [rows, Hkv*Dh]
      v_cache.push_back(kv ? be.alloc(rows * kv_dim) : Buffer{});
    }
    x = be.alloc(T * D);
    xn = be.alloc(T * D);
    q = be.alloc(T * q_dim);
    k = be.alloc(T * kv_dim);
    v = be.alloc(T * kv_dim);
    att = be.alloc(T * q_dim);
    o = be.alloc(T * D);
    gate = be.alloc(T * F);
    up = be.alloc(T * F);
    act = be.alloc(T * F);
    down = be.alloc(T * D);
    logits = be.alloc(T * c.vocab, /*logits=*/true);
    if (c.router.n_experts > 0) moe = std::make_unique<MoeScratch>(be, c, max_T_);
    for (const std::vector<Buffer>* cache : {&k_cache, &v_cache})
      for (const Buffer& b : *cache) bytes += int64_t(dtype_bytes(b.dtype, b.n));
    for (const Buffer* b : {&x, &xn, &q, &k, &v, &att, &o, &gate, &up, &act, &down, &logits})
      bytes += int64_t(dtype_bytes(b->dtype, b->n));
  }
  ~DecoderState() override {
    for (Buffer* b : {&x, &xn, &q, &k, &v, &att, &o, &gate, &up, &act, &down, &logits})
      be_.free(*b);
    for (Buffer& b : k_cache) be_.free(b);  // an empty Buffer frees as a no-op on every tier
    for (Buffer& b : v_cache) be_.free(b);
  }
  std::vector<Buffer> k_cache, v_cache;
  Buffer x, xn, q, k, v, att, o, gate, up, act, down;  // [max_T, ...]
  std::unique_ptr<MoeScratch> moe;  // MoE configs only

 protected:
  Backend& be_;
};

}  // namespace arbiter
