// A loaded checkpoint: config, weight views (into mapped files), tokenizer and provenance.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "io/mmap.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"

namespace arbiter {

struct Model {
  std::string path;       // as given by the user
  std::string format;     // "gguf" or "hf"
  ModelConfig config;
  Weights weights;
  std::unique_ptr<Tokenizer> tokenizer;
  std::string weights_sha256;  // over the weight files' bytes, in sorted path order
  int64_t n_params = 0;        // unique parameters (a tied matrix counted once)
  DType weight_dtype = DType::F32;  // dtype of the large matrices
  std::vector<std::shared_ptr<MappedFile>> files;  // keep the mappings alive
  // EOS ids that stop generation (config/generation_config may list several).
  std::vector<int32_t> eos_ids;
};

/// Loads a GGUF file or an HF model directory (config.json + safetensors + tokenizer.json).
/// Refuses unknown architectures with the list of supported ones. Throws arbiter::Error.
std::unique_ptr<Model> load_model(const std::string& path);

}  // namespace arbiter
