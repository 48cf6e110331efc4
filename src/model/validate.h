// Checks that belong to model loading, on plain values, so that any loader (GGUF, HF
// directory, the architecture registry) runs the same ones (docs/reliability.md). Each
// refusal is one arbiter::Error naming the file and the key as that file spells it:
//   [loader] m.gguf: llama.block_count is 50000000 but the file holds 21 tensors (each layer needs at least 9)
//
// Where they are called (src/model/loader.cpp):
//   validate_hf_dir_files   load_model, on an HF directory, before config.json is read;
//   validate_config         load_gguf / load_hf, once the config is parsed and the weight
//                           files are open, before any tensor is bound or buffer sized;
//   validate_loaded         load_model, on the Model either loader returns.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"

namespace arbiter {

struct Model;
class Tokenizer;

/// Where a config came from: the file named in refusals, which spelling of the keys to use,
/// and the weight files it is checked against.
struct ConfigSource {
  std::string path;           // the GGUF file, or the HF directory's config.json
  bool gguf = false;          // keys as "<arch>.block_count" (GGUF) or "num_hidden_layers" (HF)
  uint64_t n_tensors = 0;     // tensors in the weight file(s)
  uint64_t weight_bytes = 0;  // total size of the weight file(s)
};

/// Regular files and sane sizes for the HF directory's JSON inputs read outside io/file.h
/// (config.json, generation_config.json): not a FIFO or a directory, at most kMaxInputBytes,
/// nested at most kMaxJsonDepth levels, a JSON object. An absent generation_config.json is
/// fine.
void validate_hf_dir_files(const std::string& dir);

/// Hyper-parameters, each against its range and against the weight files:
///   - every dimension >= 1; head_dim even (RoPE rotates pairs); heads divisible by KV heads;
///   - the layer count at most n_tensors / 9 (the tensors every layer needs);
///   - the weights the dimensions describe at most weight_bytes (no storage type is smaller
///     than a byte per weight), so no buffer is sized from a count the file cannot back;
///   - rms epsilon finite in (0, 1); rope theta finite and > 1; RoPE scaling factors finite
///     and > 0 (llama3: low < high, original context >= 1); max positions >= 1;
///     sliding window >= 0.
void validate_config(const ModelConfig& c, const ConfigSource& src);

/// A loaded model as a whole:
///   - the tokenizer's vocabulary fits the embedding rows (an id past them would be encoded
///     and then refused, or read out of bounds, at the first forward);
///   - the tokenizer's BOS/EOS and every stop id (eos_ids) lie inside the vocabulary;
///   - no weight holds NaN or Inf (refused naming the tensor and the first element: such a
///     weight may never reach a logit a trace looks at, so it must not pass unseen).
void validate_loaded(const Model& m);

/// validate_loaded(*m), then m: lets a loader write `return validated(load_hf(path));`.
std::unique_ptr<Model> validated(std::unique_ptr<Model> m);

}  // namespace arbiter
