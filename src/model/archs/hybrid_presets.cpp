// synth's presets of the hybrid family (model/archs/hybrid.h): the official configs' keys of
// Granite 4.0-H and Nemotron 3 Nano, and small test shapes.
#include <nlohmann/json.hpp>

#include "io/json_config.h"
#include "model/archs/hybrid.h"
#include "model/synth.h"

namespace arbiter::hybrid {

// Each preset is the official config.json's keys read by parse_hf, so a preset holds what
// loading that file gives. Sources, read 2026-12 (the Hub is not reachable from the machine
// these were written on: each is the file as quoted verbatim elsewhere, named per preset).
std::vector<SynthPreset> Hybrid::presets() const {
  std::vector<SynthPreset> p;
  auto add = [&](const char* name, const char* hf_id, const char* cls, const char* source,
                 const char* arch, nlohmann::json keys, std::vector<std::string> specials,
                 int bos, int eos) {
    SynthPreset s;
    s.name = name, s.hf_id = hf_id, s.hf_class = cls, s.source = source;
    s.config.arch = arch;
    const JsonConfig j(keys.dump(), std::string("synth preset ") + name);
    parse_hf(j, s.config);
    s.specials = std::move(specials), s.bos = bos, s.eos = eos, s.add_bos = false;
    p.push_back(std::move(s));
  };
  // Granite 4.0-H: attention at layers 5, 15, 25 and 35 of 40, the rest Mamba2.
  nlohmann::json granite40 = nlohmann::json::array();
  for (int l = 0; l < 40; ++l) granite40.push_back(l % 10 == 5 ? "attention" : "mamba");
  // <|end_of_text|> 100257 is BOS and EOS, <|pad|> 100256; Granite adds no BOS.
  const std::vector<std::string> granite_specials = {"<|end_of_text|>", "<|pad|>"};
  const nlohmann::json granite_common = {
      {"hidden_act", "silu"},       {"rms_norm_eps", 1e-5},        {"vocab_size", 100352},
      {"tie_word_embeddings", true}, {"position_embedding_type", "nope"},
      {"rope_theta", 10000},        {"mamba_expand", 2},           {"mamba_n_groups", 1},
      {"mamba_d_state", 128},       {"mamba_d_conv", 4},           {"mamba_conv_bias", true},
      {"mamba_proj_bias", false},   {"attention_bias", false},     {"embedding_multiplier", 12}};
  auto granite_keys = [&](nlohmann::json own) {
    nlohmann::json k = granite_common;
    k.update(own);
    return k;
  };
  add("granite-4.0-h-tiny", "ibm-granite/granite-4.0-h-tiny", "GraniteMoeHybridForCausalLM",
      "huggingface.co/ibm-granite/granite-4.0-h-tiny config.json as quoted in public code "
      "(dimensions, layer_types and mamba_* keys verbatim; hidden 1536, 40 layers, 64 experts "
      "top-6 of 512, shared 1024, embedding_multiplier 12, logits_scaling 6, rms_norm_eps "
      "1e-5); attention_multiplier 0.0078125 (= 1 / head_dim 128) and residual_multiplier "
      "0.22 are the Granite 4.0 values, not found quoted for this file",
      "granitemoehybrid",
      granite_keys({{"hidden_size", 1536}, {"num_hidden_layers", 40},
                    {"num_attention_heads", 12}, {"num_key_value_heads", 4},
                    {"max_position_embeddings", 131072}, {"shared_intermediate_size", 1024},
                    {"intermediate_size", 512}, {"num_local_experts", 64},
                    {"num_experts_per_tok", 6}, {"mamba_n_heads", 48}, {"mamba_d_head", 64},
                    {"mamba_chunk_size", 256}, {"layer_types", granite40},
                    {"attention_multiplier", 0.0078125}, {"residual_multiplier", 0.22},
                    {"logits_scaling", 6}}),
      granite_specials, 0, 0);
  add("granite-4.0-h-1b", "ibm-granite/granite-4.0-h-1b", "GraniteMoeHybridForCausalLM",
      "huggingface.co/ibm-granite/granite-4.0-h-1b config.json as quoted in public code "
      "(dimensions, layer_types and mamba_* keys verbatim: hidden 1536, 40 layers, dense, "
      "shared 4096); the four multipliers were not found quoted for this file and are "
      "granite-4.0-h-tiny's (they change no shape or byte count)",
      "granitemoehybrid",
      granite_keys({{"hidden_size", 1536}, {"num_hidden_layers", 40},
                    {"num_attention_heads", 12}, {"num_key_value_heads", 4},
                    {"max_position_embeddings", 131072}, {"shared_intermediate_size", 4096},
                    {"intermediate_size", 4096}, {"num_local_experts", 0},
                    {"num_experts_per_tok", 0}, {"mamba_n_heads", 48}, {"mamba_d_head", 64},
                    {"mamba_chunk_size", 256}, {"layer_types", granite40},
                    {"attention_multiplier", 0.0078125}, {"residual_multiplier", 0.22},
                    {"logits_scaling", 6}}),
      granite_specials, 0, 0);
  nlohmann::json granite32 = nlohmann::json::array();
  for (int l = 0; l < 32; ++l)
    granite32.push_back(l == 10 || l == 13 || l == 17 || l == 27 ? "attention" : "mamba");
  add("granite-4.0-h-350m", "ibm-granite/granite-4.0-h-350m", "GraniteMoeHybridForCausalLM",
      "ibm-granite/granite-4.0-h-350m's config.json as an MLX conversion's test quotes it "
      "(every key used here but mamba_chunk_size, which is at the class default 256)",
      "granitemoehybrid",
      granite_keys({{"hidden_size", 768}, {"num_hidden_layers", 32},
                    {"num_attention_heads", 12}, {"num_key_value_heads", 4},
                    {"max_position_embeddings", 32768}, {"shared_intermediate_size", 2048},
                    {"intermediate_size", 2048}, {"num_local_experts", 0},
                    {"num_experts_per_tok", 0}, {"mamba_n_heads", 48}, {"mamba_d_head", 32},
                    {"layer_types", granite32}, {"attention_multiplier", 0.015625},
                    {"residual_multiplier", 0.246}, {"logits_scaling", 3}}),
      granite_specials, 0, 0);
  // Nemotron 3 Nano: 23 Mamba2, 23 MoE and 6 attention blocks. <s> 1, </s> 2 (eos_token_id).
  add("nemotron-3-nano-30b-a3b", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
      "NemotronHForCausalLM",
      "huggingface.co/nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 config.json as quoted "
      "verbatim in public code (every key used here)",
      "nemotron_h",
      {{"hidden_size", 2688},
       {"hybrid_override_pattern", "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"},
       {"num_attention_heads", 32}, {"num_key_value_heads", 2}, {"head_dim", 128},
       {"intermediate_size", 1856}, {"layer_norm_epsilon", 1e-5}, {"vocab_size", 131072},
       {"max_position_embeddings", 262144}, {"tie_word_embeddings", false},
       {"mamba_num_heads", 64}, {"mamba_head_dim", 64}, {"n_groups", 8},
       {"ssm_state_size", 128}, {"conv_kernel", 4}, {"chunk_size", 128},
       {"use_conv_bias", true}, {"time_step_min", 0.001}, {"mamba_hidden_act", "silu"},
       {"mlp_hidden_act", "relu2"}, {"n_routed_experts", 128}, {"num_experts_per_tok", 6},
       {"moe_intermediate_size", 1856}, {"moe_shared_expert_intermediate_size", 3712},
       {"n_shared_experts", 1}, {"norm_topk_prob", true}, {"routed_scaling_factor", 2.5},
       {"n_group", 1}, {"topk_group", 1}, {"attention_bias", false}, {"mlp_bias", false},
       {"use_bias", false}},
      {"<unk>", "<s>", "</s>"}, 1, 2);
  // Ours: small shapes that cover each family's blocks (Granite's MoE with its shared MLP and
  // RoPE; every Nemotron-H block type), for tests.
  add("tiny-granite-h", "none (arbiter test shape)", "GraniteMoeHybridForCausalLM",
      "arbiter: a 4-layer Granite 4.0-H MoE hybrid small enough for unit tests",
      "granitemoehybrid",
      {{"hidden_size", 64}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
       {"num_key_value_heads", 2}, {"vocab_size", 512}, {"max_position_embeddings", 2048},
       {"rms_norm_eps", 1e-6}, {"tie_word_embeddings", false},
       {"layer_types", {"mamba", "attention", "mamba", "mamba"}},
       {"position_embedding_type", "rope"}, {"rope_theta", 10000},
       {"shared_intermediate_size", 64}, {"intermediate_size", 32},
       {"num_local_experts", 4}, {"num_experts_per_tok", 2}, {"embedding_multiplier", 8},
       {"residual_multiplier", 0.5}, {"attention_multiplier", 0.125}, {"logits_scaling", 2},
       {"mamba_expand", 2}, {"mamba_n_heads", 8}, {"mamba_d_head", 16}, {"mamba_n_groups", 2},
       {"mamba_d_state", 16}, {"mamba_d_conv", 4}, {"mamba_chunk_size", 16}},
      granite_specials, 0, 0);
  add("tiny-nemotron-h", "none (arbiter test shape)", "NemotronHForCausalLM",
      "arbiter: a 4-layer Nemotron-H (Mamba2, MoE, attention, MLP) for unit tests",
      "nemotron_h",
      {{"hidden_size", 64}, {"hybrid_override_pattern", "ME*-"}, {"num_attention_heads", 4},
       {"num_key_value_heads", 2}, {"head_dim", 16}, {"intermediate_size", 128},
       {"layer_norm_epsilon", 1e-5}, {"vocab_size", 512}, {"max_position_embeddings", 2048},
       {"mamba_num_heads", 8}, {"mamba_head_dim", 16}, {"n_groups", 2},
       {"ssm_state_size", 16}, {"conv_kernel", 4}, {"chunk_size", 16},
       {"n_routed_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 32},
       {"moe_shared_expert_intermediate_size", 48}, {"routed_scaling_factor", 2.0}},
      {"<unk>", "<s>", "</s>"}, 1, 2);
  return p;
}

}  // namespace arbiter::hybrid
