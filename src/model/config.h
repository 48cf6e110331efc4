// Model hyper-parameters and weights, independent of the file format they came from.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace arbiter {

/// How RoPE pairs dimensions inside a head. HF checkpoints rotate (i, i + Dh/2)
/// ("rotate_half"); GGUF llama-family checkpoints have Q/K rows permuted so that RoPE
/// rotates adjacent pairs (2i, 2i+1) (llama.cpp "normal" rope, llama2.c). We keep the file's
/// layout and tell the op, instead of permuting rows at load.
enum class RopeLayout { Half, Adjacent };

struct RopeScaling {
  enum class Kind { None, Linear, Llama3 };
  Kind kind = Kind::None;
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int64_t original_max_pos = 8192;  // llama3
};

struct ModelConfig {
  std::string arch;  // llama, qwen2, qwen3, mistral
  int n_layer = 0;
  int d_model = 0;    // D
  int n_head = 0;     // H
  int n_head_kv = 0;  // Hkv
  int head_dim = 0;   // Dh (qwen3 may differ from D / H)
  int d_ff = 0;
  int vocab = 0;      // V
  int max_pos = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  RopeLayout rope_layout = RopeLayout::Half;
  bool qkv_bias = false;  // qwen2
  bool qk_norm = false;   // qwen3: RMSNorm over each head of q and k before RoPE
  bool tied_embeddings = false;
  int sliding_window = 0;  // 0: full attention (mistral: a query at i sees keys in (i-W, i])
};

struct LayerWeights {
  Tensor attn_norm;          // [D]
  Tensor wq, wk, wv;         // [H*Dh, D], [Hkv*Dh, D], [Hkv*Dh, D]
  Tensor bq, bk, bv;         // optional biases (qwen2)
  Tensor q_norm, k_norm;     // optional [Dh] (qwen3)
  Tensor wo;                 // [D, H*Dh]
  Tensor ffn_norm;           // [D]
  Tensor w_gate, w_up;       // [F, D]
  Tensor w_down;             // [D, F]
};

struct Weights {
  Tensor embed;     // [V, D]
  std::vector<LayerWeights> layers;
  Tensor out_norm;  // [D]
  Tensor lm_head;   // [V, D] (the embedding itself when tied)
};

/// Calls fn once per distinct non-empty tensor (storage shared by tied tensors counts once):
/// embed, out_norm, lm_head, then each layer's tensors in declaration order.
template <class F>
void for_each_distinct_tensor(const Weights& w, F&& fn) {
  std::vector<const void*> seen;
  auto visit = [&](const Tensor& t) {
    if (t.empty()) return;
    for (const void* p : seen)
      if (p == t.data) return;
    seen.push_back(t.data);
    fn(t);
  };
  visit(w.embed);
  visit(w.out_norm);
  visit(w.lm_head);
  for (const LayerWeights& l : w.layers)
    for (const Tensor* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.bq, &l.bk, &l.bv, &l.q_norm,
                            &l.k_norm, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down})
      visit(*t);
}

/// Architectures accepted by the loaders, for error messages.
inline const char* kSupportedArchs = "llama, mistral, qwen2, qwen3";

}  // namespace arbiter
