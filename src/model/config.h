// Model hyper-parameters, independent of the file format they came from. The architecture
// file (model/archs/) that parses a config is the one that reads it in the forward.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/rope.h"

namespace arbiter {

struct ModelConfig {
  std::string arch;  // the config's own name: llama, mistral, qwen2, qwen3 (model/archs/)
  int n_layer = 0;   // L
  int d_model = 0;   // D
  int n_head = 0;    // H
  int n_head_kv = 0; // Hkv
  int head_dim = 0;  // Dh (qwen3 may differ from D / H)
  int d_ff = 0;      // F
  int vocab = 0;     // V
  int max_pos = 0;   // positions the model was built for (max_position_embeddings)
  double norm_eps = 1e-5;
  RopeSpec rope;     // rope.dims == head_dim
  bool qkv_bias = false;  // qwen2
  bool qk_norm = false;   // qwen3: RMSNorm over each head of q and k before RoPE
  bool tied_embeddings = false;
  int sliding_window = 0;  // 0: full attention (mistral: a query at i sees keys in (i-W, i])

  // gemma (model/archs/gemma.cpp): which layers slide (the others attend to every position and
  // use `rope`), the RoPE of sliding layers, the scores' scale and the soft caps (0: none).
  std::vector<bool> layer_sliding;  // [L]; empty for the other families
  RopeSpec rope_local;
  double attn_scale = 0;        // query_pre_attn_scalar^-0.5
  double attn_softcap = 0;      // attn_logit_softcapping (gemma 2)
  double final_softcap = 0;     // final_logit_softcapping
  bool multimodal_text = false;  // gemma3: the text model of a Gemma3ForConditionalGeneration
  bool norms_hold_one = false;   // gemma GGUF: norm weights store 1 + w (plain RMSNorm reads them)
};

}  // namespace arbiter
