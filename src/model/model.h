// A loaded checkpoint: config, architecture, weight views (into mapped files), tokenizer and
// provenance.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/mmap.h"
#include "model/arch.h"
#include "model/config.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace arbiter {

struct Model {
  std::string path;       // as given by the user
  std::string format;     // "gguf" or "hf"
  ModelConfig config;
  const Arch* arch = nullptr;  // the family that parsed the config and runs the forward
  Weights weights;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string weights_sha256;  // over the weight files' bytes, in sorted path order
  int64_t n_params = 0;        // unique parameters (a tied matrix counted once)
  DType weight_dtype = DType::F32;  // dtype of the large matrices
  std::vector<std::shared_ptr<MappedFile>> files;  // keep the mappings alive
  // Weights made at load rather than mapped (MLX's packed tensors repacked into blocks,
  // model/mlx.h); the views in `weights` point into it.
  std::shared_ptr<const void> repacked;
  // Values a GGUF stores transformed, inverted at load (TensorSpec::gguf_value: Mamba2's
  // A_log = log(-A)); the views in `weights` point into them.
  std::vector<std::vector<double>> derived;
  // EOS ids that stop generation (config/generation_config may list several).
  std::vector<int32_t> eos_ids;
};

/// Loads a GGUF file or an HF model directory (config.json + safetensors + tokenizer.json).
/// Refuses unknown architectures with the list of supported ones. Throws arbiter::Error.
std::unique_ptr<Model> load_model(const std::string& path);

/// An HF checkpoint held in memory rather than in a directory (model/synth.h's synth_model):
/// config.json's text, every tensor by its HF name (views into `storage`, which the model
/// keeps alive), the tokenizer files' text and the EOS ids. `path` names it in errors and
/// reports, `format` in reports; `weights_id` stands in for the weight files' sha256.
struct HfInMemory {
  std::string path, format, weights_id;
  std::string config_text, tokenizer_json, tokenizer_config_json;
  std::map<std::string, Tensor> tensors;
  std::shared_ptr<const void> storage;
  std::vector<int32_t> eos_ids;
};
/// Parses, binds (every tensor the family reads, shapes checked, none left over), counts and
/// validates it as load_model does an HF directory. Throws arbiter::Error.
std::unique_ptr<Model> load_hf_in_memory(HfInMemory src);

/// config.json text -> config, through the family registered for its class (model/arch.h);
/// `path` names the file in errors. For tests and tools; load_model uses it.
ModelConfig parse_hf_config(const std::string& json_text, const std::string& path);
/// DIR/config.json -> config.
ModelConfig load_hf_config(const std::string& dir);

}  // namespace arbiter
