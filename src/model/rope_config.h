// RoPE as checkpoints describe it, for every family that rotates: transformers' config keys
// (rope_theta + rope_scaling, or v5's rope_parameters) and llama.cpp's GGUF keys (rope.*,
// and Llama 3 scaling stored as the rope_freqs tensor).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "backend/rope.h"

namespace arbiter {

class GgufFile;
class GgufWriter;
class JsonConfig;

/// rope.theta (rope_theta, default 10000) and rope.scaling from config.json; rope.dims and
/// rope.layout (Half) are the caller's. Refuses unknown rope types and partial rotation.
void read_hf_rope(const JsonConfig& j, RopeSpec& rope);
/// One RoPE description held in the object at `key` of j (the older rope_scaling dict, or
/// v5's rope_parameters, which also carries rope_theta): its theta, if given, and scaling.
void read_hf_rope_dict(const JsonConfig& j, const char* key, RopeSpec& rope);
/// The same in config.json's keys (synth): rope_theta and rope_scaling.
void write_hf_rope(const RopeSpec& rope, nlohmann::json& j);

/// ARCH.rope.freq_base (default 10000) and the scaling (rope.scaling.type/factor, the older
/// rope.scale_linear, or llama3 factors as rope_freqs.weight, checked against transformers'
/// formula); rope.dims and layout are the caller's. Refuses rope.dimension_count != dims.
void read_gguf_rope(const GgufFile& g, const std::string& arch, RopeSpec& rope);
/// The same in GGUF keys and, for llama3 scaling, the rope_freqs.weight tensor (synth).
void write_gguf_rope(const RopeSpec& rope, const std::string& arch, GgufWriter& g);

}  // namespace arbiter
