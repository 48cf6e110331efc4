// The hybrid family's class (model/arch.h): Mamba2/attention hybrids, Granite 4.0-H and
// Nemotron-H. hybrid.cpp has the semantics, the tensors and the forward; hybrid_config.cpp the
// config readers and writers (HF and GGUF); hybrid_presets.cpp synth's presets.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "backend/moe_routing.h"
#include "model/arch.h"

namespace arbiter::hybrid {

enum Global { kEmbed, kOutNorm, kLmHead, kGlobalSlots };
enum Layer {
  kNorm,                                                    // the block's (input) norm
  kInProj, kConvW, kConvB, kALog, kD, kDtBias, kSsmNorm, kOutProj,  // Mamba2 mixer
  kWq, kWk, kWv, kWo,                                       // attention
  kFfnNorm,                                                 // Granite post_attention_layernorm
  kMlpGate, kMlpUp, kMlpOut,  // Granite shared_mlp: input_linear's gate and up rows, output_linear
  kUp, kDown,                                               // Nemotron-H relu2 MLP
  kRouter, kRouterBias,                                     // MoE router (+ Nemotron-H bias)
  kShUp, kShDown,                                           // Nemotron-H shared expert
  // Expert e: gate (Granite) at kExpert0 + 3e, up at + 1, down at + 2; Granite's are views
  // into its 3-D input_linear / output_linear (TensorSpec::hf_stack), GGUF's into _exps.
  kExpert0,
  kMaxExperts = 512,
  kLayerSlots = kExpert0 + 3 * kMaxExperts
};

inline bool granite(const ModelConfig& c) { return c.arch == "granitemoehybrid"; }

// NemotronHConfig's time_step_min: Zamba2MambaMixer.torch_forward clamps dt from below at it.
constexpr double kNemotronDtMin = 0.001;

// The MoE router of each hybrid, from its config.
RouterSpec router_spec(const ModelConfig& c);

class Hybrid final : public Arch {
 public:
  std::string family() const override { return "hybrid"; }
  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    return {{"GraniteMoeHybridForCausalLM", "granitemoehybrid"},
            {"NemotronHForCausalLM", "nemotron_h"}};
  }
  // llama.cpp's names; Nemotron-H with experts is nemotron_h_moe.
  std::vector<std::string> gguf_names() const override {
    return {"granitehybrid", "nemotron_h", "nemotron_h_moe"};
  }
  std::string gguf_arch(const ModelConfig& c) const override {
    return granite(c) ? "granitehybrid" : c.moe_experts > 0 ? "nemotron_h_moe" : "nemotron_h";
  }
  // Nemotron-H's multi-token-prediction head (mtp.*, a block that guesses token t + 2): the
  // Nemotron 3 checkpoints ship it and transformers drops it at load
  // (NemotronHPreTrainedModel._keys_to_ignore_on_load_unexpected); so does arbiter.
  bool hf_ignored(const ModelConfig& c, const std::string& stored) const override {
    return !granite(c) && stored.compare(0, 4, "mtp.") == 0;
  }
  int global_slots() const override { return kGlobalSlots; }
  int layer_slots() const override { return kLayerSlots; }
  std::vector<std::string> stages() const override {
    return {"embed",   "attn_norm", "ssm_z",  "ssm_xbc",   "ssm_dt",  "ssm_conv", "ssm_scan",
            "ssm_norm", "ssm_out",  "q",      "k",         "v",       "q_rope",   "k_rope",
            "attn",    "o",         "attn_res", "ffn_norm", "gate",   "up",       "act",
            "down",    "router",    "moe",    "ffn_out",   "ffn_res", "final_norm", "logits",
            // Last: all_stage_names' order seeds --inject noise; the earlier names keep theirs.
            "ssm_conv_state", "ssm_state"};
  }

  // hybrid_config.cpp
  void parse_hf(const JsonConfig& j, ModelConfig& c) const override;
  void parse_gguf(const GgufFile& g, ModelConfig& c) const override;
  void hf_config_json(const ModelConfig& c, nlohmann::json& j) const override;
  void gguf_metadata(const ModelConfig& c, GgufWriter& g) const override;
  nlohmann::ordered_json describe(const ModelConfig& c) const override;
  RopeLayout gguf_rope_layout(const std::string&) const override { return RopeLayout::Half; }

  // hybrid_presets.cpp
  std::vector<SynthPreset> presets() const override;

  // hybrid.cpp
  std::vector<TensorSpec> tensors(const ModelConfig& c) const override;
  std::unique_ptr<ForwardState> make_state(const Model& m, Backend& be, int max_ctx,
                                           int max_T) const override;
  std::unique_ptr<ForwardState> make_batch_state(const Model& m, Backend& be, int pool_rows,
                                                 int max_T, int seqs) const override;
  void forward(const Model& m, Backend& be, ForwardState& state,
               const ForwardArgs& a) const override;
  double weight_bytes_per_step(const Model& m, int rows) const override;
  double state_bytes_per_token(const ModelConfig& c, double ctx, int elem_bytes) const override;
  double flops_per_token(const ModelConfig& c, int T, int pos0) const override;
};

}  // namespace arbiter::hybrid
