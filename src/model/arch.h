// The architecture registry: one class per family in model/archs/<family>.cpp, holding
// everything that differs between families: which HF classes and GGUF architectures it
// reads, their config keys and defaults, the tensors it reads (names in both formats), its
// synth presets, its per-sequence state and its forward, written once against the Backend
// op interface. docs/architecture.md has the checklist for adding one.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/stage.h"
#include "model/weights.h"

namespace arbiter {

class GgufFile;
class GgufWriter;
class JsonConfig;
struct Model;
struct SynthPreset;

/// Per-sequence state of a forward on one tier (KV caches, scratch buffers), made by the
/// architecture; freed with its backend's free() when destroyed.
class ForwardState {
 public:
  virtual ~ForwardState() = default;
  Buffer logits;    // [max_T, V]: the latest forward's logits rows (f64 on ref, f32 elsewhere)
  int max_T = 0;    // widest forward
  int max_ctx = 0;  // positions the caches hold
  int64_t bytes = 0;  // what the state allocated on its tier: KV caches and scratch
};

/// One forward: ids[T] at positions pos0.. (the state holds rows [0, pos0) already); ids ==
/// nullptr (T == 1): the token of the backend's latest pick_greedy. Without logits (a context
/// pass that only fills the caches) the forward stops after the last layer. hook may be null;
/// routes, when given, receives every routing decision of the forward's MoE layers.
struct BatchSeq;
struct ForwardArgs {
  const int32_t* ids = nullptr;
  int T = 0;
  int pos0 = 0;
  StageHook* hook = nullptr;
  bool logits = true;
  /// With logits: the last row's alone, as logits row 0 (what generation picks from; a
  /// prefill then skips the output matrix for T - 1 rows). Not with a hook.
  bool last_row = false;
  RouteLog* routes = nullptr;
  /// Continuous batching: the T rows belong to these sequences, in order (their T sum to T;
  /// pos0 and logits are unused; no hook; routes logs sequence routes_seq's rows alone, at
  /// its positions). The state is make_batch_state's.
  const std::vector<BatchSeq>* batch = nullptr;
  int routes_seq = -1;
};

/// One sequence of a batched forward: the next T rows of ids, at positions pos0.., its K/V in
/// the state's paged pool (one per layer) at pages, its recurrent state (the hybrids' Mamba2
/// conv and SSM states) in the state's slot `slot` (zeroed by a forward at pos0 0; the
/// scheduler hands slots out and takes them back with the blocks). Logits rows, in sequence
/// order: All gives its T rows, Last its last row, None nothing.
struct BatchSeq {
  enum class Logits { None, Last, All };
  int T = 0;
  int pos0 = 0;
  Backend::KvPages pages;
  int slot = 0;
  Logits logits = Logits::Last;
  int logit_rows() const { return logits == Logits::All ? T : logits == Logits::Last ? 1 : 0; }
};

class Arch {
 public:
  virtual ~Arch() = default;
  /// The family ("llama") and the config names it covers ("llama", "mistral", ...).
  virtual std::string family() const = 0;
  /// HF `architectures[0]` classes it reads, each with the config name it gives (an HF
  /// `model_type` equal to a config name selects it too).
  virtual std::vector<std::pair<std::string, std::string>> hf_classes() const = 0;
  /// GGUF `general.architecture` values it reads. parse_gguf gets the value as c.arch and may
  /// turn it into the HF config name (llama.cpp's "qwen3moe" is "qwen3_moe").
  virtual std::vector<std::string> gguf_names() const = 0;
  /// The GGUF `general.architecture` (and metadata key prefix) of config c.
  virtual std::string gguf_arch(const ModelConfig& c) const { return c.arch; }

  /// config.json -> config (c.arch is set): dimensions, defaults as transformers applies
  /// them, refusals of what the forward does not compute. Errors name the file and key.
  virtual void parse_hf(const JsonConfig& j, ModelConfig& c) const = 0;
  /// GGUF metadata (`ARCH.*` keys) -> config (c.arch and c.vocab are set).
  virtual void parse_gguf(const GgufFile& g, ModelConfig& c) const = 0;
  /// Every tensor the forward reads for c (the loader refuses any other in the file).
  virtual std::vector<TensorSpec> tensors(const ModelConfig& c) const = 0;
  /// The names an HF checkpoint may store tensor `hf` (TensorSpec::hf) under, tried in order:
  /// a wrapper class nests the model under other prefixes (transformers' checkpoint
  /// conversion mapping).
  virtual std::vector<std::string> hf_stored_names(const ModelConfig&, const std::string& hf) const {
    return {hf};
  }
  /// Stored HF tensors of parts the forward does not compute (a multimodal checkpoint's vision
  /// tower), which the loader leaves unread instead of refusing the file.
  virtual bool hf_ignored(const ModelConfig&, const std::string&) const { return false; }
  /// Counts of global and per-layer tensor slots (TensorSpec::slot ranges).
  virtual int global_slots() const = 0;
  virtual int layer_slots() const = 0;
  /// Per-layer slots for config c (a family whose slot count depends on the config, such as
  /// one slot per expert, overrides it; the loader calls this one).
  virtual int layer_slots_for(const ModelConfig& c) const {
    (void)c;
    return layer_slots();
  }
  /// Every stage name the forward may emit, for any config (what --inject op= accepts).
  virtual std::vector<std::string> stages() const = 0;

  virtual std::unique_ptr<ForwardState> make_state(const Model& m, Backend& be, int max_ctx,
                                                   int max_T) const = 0;
  virtual void forward(const Model& m, Backend& be, ForwardState& st,
                       const ForwardArgs& a) const = 0;
  /// Continuous batching (engine/scheduler.h): the state of batched forwards (ForwardArgs::
  /// batch) of up to max_T rows, whose sequences keep their K/V in one pool of pool_rows rows
  /// per layer and their recurrent state, if the family has one, in slots [0, seqs).
  /// nullptr: this family's forward does not batch (it never gets a batch).
  virtual std::unique_ptr<ForwardState> make_batch_state(const Model& m, Backend& be,
                                                         int pool_rows, int max_T,
                                                         int seqs) const {
    (void)m, (void)be, (void)pool_rows, (void)max_T, (void)seqs;
    return nullptr;
  }

  /// synth: presets (shapes of real checkpoints), and for a config the arch's own
  /// config.json keys and GGUF metadata (the generic ones are written by model/synth.cpp).
  virtual std::vector<SynthPreset> presets() const = 0;
  virtual void hf_config_json(const ModelConfig& c, nlohmann::json& j) const = 0;
  virtual void gguf_metadata(const ModelConfig& c, GgufWriter& g) const = 0;
  /// How RoPE pairs the rows of RoPE'd projections in this family's GGUF files (llama.cpp's
  /// converter permutes llama/mistral q/k rows into adjacent pairs; synth writes them so).
  virtual RopeLayout gguf_rope_layout(const std::string& config_name) const = 0;

  /// The family's own config fields, by name, as `info` prints them ({"qk_norm": true, ...}).
  virtual nlohmann::ordered_json describe(const ModelConfig& c) const = 0;

  /// bench's work model (engine/bench.h). Weight bytes one decode step of `rows` sequences
  /// reads (default: every distinct tensor once, one row of the embedding table per row).
  virtual double weight_bytes_per_step(const Model& m, int rows = 1) const;
  /// Bytes of per-sequence state one decode step at context ctx reads (the K/V rows it
  /// attends over), at elem_bytes per cached element.
  virtual double state_bytes_per_token(const ModelConfig& c, double ctx, int elem_bytes) const = 0;
  /// Mean FLOPs per token of a causal forward of T tokens after pos0 cached ones, with the
  /// logits of the last token alone (a prefill; decode: T = 1).
  virtual double flops_per_token(const ModelConfig& c, int T, int pos0) const = 0;

 protected:
  /// weight_bytes_per_step of a model whose "expert*" tensors are routed top_k of n_experts
  /// per row: a step reads the experts some row picked, 1 - (1 - k/E)^rows of them in
  /// expectation when rows pick independently and evenly (k/E for one row).
  double routed_weight_bytes(const Model& m, int rows, int top_k, int n_experts) const;
};

/// Every registered family (model/archs/registry.cpp), in order.
const std::vector<const Arch*>& arch_registry();
/// The family covering a config name; throws listing the supported names.
const Arch& arch_of(const std::string& config_name);
/// "llama, mistral, qwen2, qwen3": the config names of every family, for error messages.
std::string supported_archs();
/// Every stage name of every family (what --inject op= may name before a model is known).
std::vector<std::string> all_stage_names();

}  // namespace arbiter
