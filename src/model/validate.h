// Checks that belong to model loading, on plain values, so that both loaders (GGUF, HF
// directory) run the same ones whatever the family (docs/reliability.md). The JSON files
// themselves are read through io/file.h and io/json.h (regular files, bounded size and
// nesting, objects). Each refusal is one arbiter::Error naming the file and the key as that
// file spells it:
//   [loader] m.gguf: llama.block_count is 50000000 but the weights hold 21 tensors
//
// Where they are called (src/model/loader.cpp):
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
/// and how many tensors its weight files hold.
struct ConfigSource {
  std::string path;           // the GGUF file, or the HF directory's config.json
  bool gguf = false;          // keys as "<arch>.block_count" (GGUF) or "num_hidden_layers" (HF)
  uint64_t n_tensors = 0;     // tensors in the weight file(s)
};

/// Hyper-parameters, each against its range and against the weight files:
///   - every dimension >= 1; head_dim even (RoPE rotates pairs); heads divisible by KV heads;
///   - the layer count at most n_tensors (every layer of every family holds a tensor), so the
///     architecture's tensor list for c stays within the file; the binder then checks every
///     tensor's shape, so no buffer is sized from a dimension the file does not back;
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
