// Hugging Face config.json -> ModelConfig, for the architectures arbiter runs
// (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM).
// Both RoPE spellings are read: the older `rope_theta` + `rope_scaling`, and the
// transformers-v5 `rope_parameters`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace arbiter {

/// Parses config.json text; `path` only names the file in errors ("[hf] PATH: ...").
/// Refuses unknown architectures (the message lists kSupportedArchs), unknown RoPE types,
/// and features our weights cannot express (o_proj / MLP biases, non-SiLU activations,
/// per-layer sliding windows). rope_layout is always Half (HF "rotate_half").
ModelConfig parse_hf_config(const std::string& json_text, const std::string& path);

/// Reads DIR/config.json.
ModelConfig load_hf_config(const std::string& dir);

/// eos_token_id (an int, a list of ints, or null) from one config text; [] when absent.
std::vector<int32_t> parse_eos_ids(const std::string& json_text, const std::string& path);

/// EOS ids that end generation: generation_config.json's (what transformers' generate()
/// uses) followed by any extra ones from config.json, without duplicates.
std::vector<int32_t> load_hf_eos_ids(const std::string& dir);

}  // namespace arbiter
