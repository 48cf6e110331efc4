// The decoder-only transformer forward pass (llama family), one function top-down like
// llama2.c's forward(). Every op goes through the Backend; every stage output is offered to
// the hook (fault injection, capture for drift).
#include "model/forward.h"

#include "core/error.h"

namespace arbiter {

static const char* kStageNames[] = {
    "embed", "attn_norm", "q", "k", "v", "q_norm", "k_norm", "q_rope", "k_rope", "attn", "o",
    "attn_res", "ffn_norm", "gate", "up", "act", "down", "ffn_res", "final_norm", "logits"};

const char* stage_name(Stage s) { return kStageNames[int(s)]; }

std::vector<Stage> all_stages() {
  std::vector<Stage> out;
  for (int i = 0; i <= int(Stage::Logits); ++i) out.push_back(Stage(i));
  return out;
}

Stage stage_from_name(const std::string& name) {
  std::string valid;
  for (Stage s : all_stages()) {
    if (name == stage_name(s)) return s;
    valid += (valid.empty() ? "" : ", ") + std::string(stage_name(s));
  }
  throw Error("[model] unknown stage/op '" + name + "' (valid: " + valid + ")");
}

void kv_cache_init(Backend& be, const ModelConfig& cfg, int max_ctx, KVCache& kv) {
  int64_t kv_dim = int64_t(cfg.n_head_kv) * cfg.head_dim;
  kv.max_ctx = max_ctx;
  kv.k.resize(cfg.n_layer);
  kv.v.resize(cfg.n_layer);
  for (int l = 0; l < cfg.n_layer; ++l) {
    kv.k[l] = be.alloc(max_ctx * kv_dim);
    kv.v[l] = be.alloc(max_ctx * kv_dim);
  }
}

void kv_cache_free(Backend& be, KVCache& kv) {
  for (auto& b : kv.k) be.free(b);
  for (auto& b : kv.v) be.free(b);
  kv.k.clear();
  kv.v.clear();
}

void scratch_init(Backend& be, const ModelConfig& cfg, int max_T, Scratch& s) {
  int64_t T = max_T, D = cfg.d_model, q_dim = int64_t(cfg.n_head) * cfg.head_dim;
  int64_t kv_dim = int64_t(cfg.n_head_kv) * cfg.head_dim, F = cfg.d_ff;
  s.max_T = max_T;
  s.x = be.alloc(T * D);
  s.xn = be.alloc(T * D);
  s.q = be.alloc(T * q_dim);
  s.k = be.alloc(T * kv_dim);
  s.v = be.alloc(T * kv_dim);
  s.att = be.alloc(T * q_dim);
  s.o = be.alloc(T * D);
  s.gate = be.alloc(T * F);
  s.up = be.alloc(T * F);
  s.act = be.alloc(T * F);
  s.down = be.alloc(T * D);
  s.logits = be.alloc(T * cfg.vocab, /*logits=*/true);
}

void scratch_free(Backend& be, Scratch& s) {
  for (Buffer* b : {&s.x, &s.xn, &s.q, &s.k, &s.v, &s.att, &s.o, &s.gate, &s.up, &s.act,
                    &s.down, &s.logits})
    be.free(*b);
}

void forward(const Model& m, Backend& be, KVCache& kv, Scratch& s, const int32_t* ids, int T,
             int pos0, const StageHook& hook, bool logits) {
  const ModelConfig& c = m.config;
  const Weights& w = m.weights;
  ARB_CHECK(T >= 1 && T <= s.max_T, "[model] forward of %d tokens exceeds scratch width %d", T,
            s.max_T);
  ARB_CHECK(pos0 + T <= kv.max_ctx, "[model] position %d exceeds the KV cache (%d rows)",
            pos0 + T, kv.max_ctx);
  const int D = c.d_model, H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim, F = c.d_ff;
  const int q_dim = H * Dh, kv_dim = Hkv * Dh;
  auto emit = [&](Stage st, int layer, Buffer& b, int rows, int cols) {
    if (hook) hook(st, layer, b, rows, cols);
  };

  ARB_CHECK(ids || T == 1, "[model] a forward of %d picked tokens (only one is kept)", T);
  if (ids) be.embed(w.embed, ids, T, s.x);  // x [T, D]
  else be.embed_picked(w.embed, s.x);
  emit(Stage::Embed, -1, s.x, T, D);

  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& lw = w.layers[l];
    if (!hook) {
      // No hook reads intermediates: the fused ops (backend.h; on ref/cpu the same ops one
      // by one). attention block, then feed-forward block, as below.
      const Backend::MatmulTarget qkv[3] = {{&lw.wq, &lw.bq, &s.q}, {&lw.wk, &lw.bk, &s.k},
                                            {&lw.wv, &lw.bv, &s.v}};
      be.rmsnorm_matmul(s.x, lw.attn_norm, T, D, c.norm_eps, s.xn, qkv, 3);
      be.qk_rope_attention(s.q, s.k, s.v, c.qk_norm ? &lw.q_norm : nullptr,
                           c.qk_norm ? &lw.k_norm : nullptr, c.norm_eps, T, H, Hkv, Dh, pos0, c,
                           kv.k[l], kv.v[l], c.sliding_window, s.att);
      be.matmul_add(s.att, lw.wo, T, s.o, s.x);
      be.rmsnorm_swiglu(s.x, lw.ffn_norm, T, D, c.norm_eps, s.xn, lw.w_gate, lw.w_up, s.gate,
                        s.up, s.act);
      be.matmul_add(s.act, lw.w_down, T, s.down, s.x);
      continue;
    }
    // attention block: x += o_proj(attn(rope(q), rope(k), v)) of rmsnorm(x)
    be.rmsnorm(s.x, lw.attn_norm, T, D, c.norm_eps, s.xn);
    emit(Stage::AttnNorm, l, s.xn, T, D);
    be.matmul(s.xn, lw.wq, lw.bq.empty() ? nullptr : &lw.bq, T, s.q);  // q [T, H*Dh]
    emit(Stage::Q, l, s.q, T, q_dim);
    be.matmul(s.xn, lw.wk, lw.bk.empty() ? nullptr : &lw.bk, T, s.k);  // k [T, Hkv*Dh]
    emit(Stage::K, l, s.k, T, kv_dim);
    be.matmul(s.xn, lw.wv, lw.bv.empty() ? nullptr : &lw.bv, T, s.v);  // v [T, Hkv*Dh]
    emit(Stage::V, l, s.v, T, kv_dim);
    if (c.qk_norm) {  // qwen3: RMSNorm over each head before RoPE (HF Qwen3Attention)
      be.rmsnorm(s.q, lw.q_norm, T * H, Dh, c.norm_eps, s.q);
      emit(Stage::QNorm, l, s.q, T, q_dim);
      be.rmsnorm(s.k, lw.k_norm, T * Hkv, Dh, c.norm_eps, s.k);
      emit(Stage::KNorm, l, s.k, T, kv_dim);
    }
    be.rope(s.q, T, H, Dh, pos0, c);
    emit(Stage::QRope, l, s.q, T, q_dim);
    be.rope(s.k, T, Hkv, Dh, pos0, c);
    emit(Stage::KRope, l, s.k, T, kv_dim);
    be.kv_store(s.k, s.v, kv.k[l], kv.v[l], T, pos0, kv_dim);
    be.attention(s.q, kv.k[l], kv.v[l], T, pos0, H, Hkv, Dh, c.sliding_window, s.att);
    emit(Stage::Attn, l, s.att, T, q_dim);
    be.matmul(s.att, lw.wo, nullptr, T, s.o);  // o [T, D]
    emit(Stage::O, l, s.o, T, D);
    be.add(s.x, s.o, int64_t(T) * D);
    emit(Stage::AttnRes, l, s.x, T, D);

    // feed-forward block: x += down(silu(gate(xn)) * up(xn)), xn = rmsnorm(x)
    be.rmsnorm(s.x, lw.ffn_norm, T, D, c.norm_eps, s.xn);
    emit(Stage::FfnNorm, l, s.xn, T, D);
    be.matmul(s.xn, lw.w_gate, nullptr, T, s.gate);  // [T, F]
    emit(Stage::Gate, l, s.gate, T, F);
    be.matmul(s.xn, lw.w_up, nullptr, T, s.up);  // [T, F]
    emit(Stage::Up, l, s.up, T, F);
    be.swiglu(s.gate, s.up, int64_t(T) * F, s.act);
    emit(Stage::Act, l, s.act, T, F);
    be.matmul(s.act, lw.w_down, nullptr, T, s.down);  // [T, D]
    emit(Stage::Down, l, s.down, T, D);
    be.add(s.x, s.down, int64_t(T) * D);
    emit(Stage::FfnRes, l, s.x, T, D);
  }
  if (!logits) return;

  if (!hook) {
    const Backend::MatmulTarget head[1] = {{&w.lm_head, nullptr, &s.logits}};
    be.rmsnorm_matmul(s.x, w.out_norm, T, D, c.norm_eps, s.xn, head, 1);  // logits [T, V]
    return;
  }
  be.rmsnorm(s.x, w.out_norm, T, D, c.norm_eps, s.xn);
  emit(Stage::FinalNorm, -1, s.xn, T, D);
  be.matmul(s.xn, w.lm_head, nullptr, T, s.logits);  // logits [T, V]
  emit(Stage::Logits, -1, s.logits, T, c.vocab);
}

}  // namespace arbiter
