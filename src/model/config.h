// Model hyper-parameters, independent of the file format they came from. The architecture
// file (model/archs/) that parses a config is the one that reads it in the forward.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/moe_routing.h"
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

  // mixture of experts (model/archs/moe_ffn.h): which layers route their FFN through experts,
  // the router, the experts' FFN width and the shared expert's (0: none; Qwen2-MoE's comes
  // with a sigmoid gate).
  std::vector<bool> layer_moe;  // [L]; empty: every layer dense
  RouterSpec router;            // n_experts == 0: no MoE layer
  int d_ff_expert = 0;
  int d_ff_shared = 0;
  // hybrid (model/archs/hybrid.cpp): Mamba2/attention hybrids. Each layer's block, as
  // Nemotron-H's pattern letters: 'M' Mamba2 mixer, '*' attention, '-' MLP, 'E' MoE. Granite
  // layers are 'M' or '*', each followed by its MLP in the same layer.
  std::string layer_blocks;     // [L]; empty for the other families
  int ssm_heads = 0;            // nh
  int ssm_head_dim = 0;         // hd (nh * hd = the mixer's inner width I)
  int ssm_state = 0;            // N (d_state)
  int ssm_groups = 0;           // G (n_groups): heads share B and C within a group
  int ssm_conv = 0;             // K (d_conv)
  int ssm_chunk = 0;            // chunk_size: tokens per chunk of the cpu and cuda prefill scan
  double ssm_dt_min = 0, ssm_dt_max = 0;  // dt's clamp
  bool ssm_conv_bias = true;
  bool ssm_norm_per_group = false;  // Nemotron-H: the gated norm's RMS per group of I / G
  bool use_rope = true;         // Granite position_embedding_type "rope" (Nemotron-H: none)
  double embed_mult = 1;        // Granite embedding_multiplier
  double residual_mult = 1;     // Granite residual_multiplier
  double logits_scaling = 1;    // Granite: logits divided by it
  // The hybrids' MoE layers (Granite: every layer when num_local_experts > 0; Nemotron-H: 'E'
  // blocks), routed by backend/moe_routing.h: E experts of FFN moe_ff, k per token, and a
  // shared expert (Granite: shared_mlp of d_ff; Nemotron-H: moe_shared_ff).
  int moe_experts = 0;          // E (0: dense)
  int moe_top_k = 0;            // k
  int moe_ff = 0;
  int moe_shared_ff = 0;
  bool moe_norm_topk = false;   // Nemotron-H norm_topk_prob
  double moe_scaling = 1;       // Nemotron-H routed_scaling_factor
  int moe_n_group = 1, moe_topk_group = 1;  // Nemotron-H group-limited selection
  bool multimodal_text = false;  // gemma3: the text model of a Gemma3ForConditionalGeneration
  bool norms_hold_one = false;   // gemma GGUF: norm weights store 1 + w (plain RMSNorm reads them)
};

}  // namespace arbiter
