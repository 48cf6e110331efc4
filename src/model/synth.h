// Synthetic checkpoints for speed measurements: a complete Hugging Face model directory
// (config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
// generation_config.json, README.md) or one GGUF file, with the exact shapes of a real model
// and seeded random weights (the same weights in both formats). The weights are noise: such a checkpoint is for timing only, never for
// any correctness claim.
//
// Presets copy the dimensions from each model's official config.json (the source is named
// in SynthPreset::source and in docs/performance.md). Each architecture family lists its own
// (Arch::presets, model/archs/); to add one, append it there and a shape test in
// tests/bench/synth_test.cpp. The tensors written are the family's TensorSpecs.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"
#include "model/quantize.h"

namespace arbiter {

class GgufWriter;
struct Model;

struct SynthPreset {
  std::string name;        // "qwen3-0.6b"
  std::string hf_id;       // "Qwen/Qwen3-0.6B": the model whose shapes these are
  std::string hf_class;    // "Qwen3ForCausalLM"
  std::string source;      // where the numbers come from
  ModelConfig config;      // arch, dims, RoPE, norm eps, tied, bias, qk norm, window
  // Special tokens, appended after the byte and merge tokens (ids vocab - n .. vocab - 1).
  std::vector<std::string> specials;
  int bos = -1;            // index into specials, -1: the tokenizer adds no BOS
  int eos = 0;             // index into specials
  bool add_bos = false;    // whether encoding prepends BOS (Llama/Mistral yes, Qwen no)
};

/// All presets of every registered family, in registry order.
const std::vector<SynthPreset>& synth_presets();
/// Throws arbiter::Error listing the preset names when name is unknown.
const SynthPreset& synth_preset(const std::string& name);

enum class SynthFormat { Hf, Gguf };

struct SynthOptions {
  std::string preset;
  SynthFormat format = SynthFormat::Hf;  // Gguf: out_dir names the .gguf file to write
  DType dtype = DType::BF16;  // F32, F16 or BF16
  /// GGUF only: the weights generated as f32 (dtype must be F32) and each tensor encoded as
  /// `arbiter quantize --type` encodes it in an f32 GGUF (quant_tensor_type), tensor by tensor
  /// with no f32 copy of the model on disk.
  std::optional<QuantRecipe> quant;
  uint64_t seed = 0;
  int layers = 0;             // > 0 overrides the preset's layer count (quick tests)
  std::string out_dir;
  bool force = false;         // replace an existing out_dir
  int threads = 0;            // weight generation threads; <= 0: all cores
  /// Progress on stderr (core/progress.h): what is written, then bytes written / total.
  bool progress = true;
};

struct SynthResult {
  ModelConfig config;         // as written to config.json
  int64_t n_params = 0;       // distinct stored parameters (tied embedding counted once)
  uint64_t weight_bytes = 0;  // size of the tensor data in model.safetensors
};

/// The config a synth run would write (preset + layer override), and its size.
SynthResult synth_plan(const SynthOptions& opt);

/// The config.json text a synth run writes (for tests and dry runs).
std::string synth_config_json(const SynthOptions& opt);

/// Writes the checkpoint atomically: an HF directory goes to a temporary directory beside
/// out_dir, renamed into place at the end; a GGUF file to a temporary file renamed onto
/// out_dir. Refuses an existing non-empty out_dir (or existing file) unless force, an
/// unsupported dtype, and a disk without room. Throws arbiter::Error.
///
/// With opt.quant the GGUF also carries general.file_type and general.quantization_version
/// as llama-quantize writes them; an HF output with opt.quant is refused (synth_plan).
///
/// GGUF layout (what src/model/loader.cpp reads): the family's GGUF tensor names, its
/// `ARCH.*` hyperparameter keys (Arch::gguf_metadata), a gpt2-model tokenizer with the same
/// tokens and merges as tokenizer.json; rows of RoPE'd projections permuted to adjacent pairs
/// when the config's RoPE layout is Adjacent, as llama.cpp's converter does.
SynthResult synth_checkpoint(const SynthOptions& opt);

/// The checkpoint synth_checkpoint would write as an HF directory (same preset, dtype, seed
/// and layer override), built in host memory instead and loaded as load_model loads that
/// directory: the same config, the same tensor bytes, the same tokenizer, and no file
/// (`arbiter bench --synth`). The weights take one host buffer of SynthResult::weight_bytes
/// (plus alignment), which the model owns; Model::format is "synth (in memory)" and
/// Model::path "synth:PRESET". Throws arbiter::Error (an unknown preset, a bad dtype, a
/// GGUF format, host memory too small).
std::unique_ptr<Model> synth_model(const SynthOptions& opt);

/// n standard-normal-ish values of stream `key` starting at element `begin`, times std.
/// Deterministic on every machine: a counter-based SplitMix64 hash feeds Box-Muller whose
/// log/sin/cos are evaluated here with IEEE +, *, /, sqrt and explicit fma only, so libm
/// differences cannot change a byte. Element i depends only on (key, i), so any split of a
/// range over calls or threads gives the same values (model/synth_normals.cpp).
void synth_normals(uint64_t key, int64_t begin, int64_t n, double std, float* out);

/// The stream key of the tensor named `name` under `seed`.
uint64_t synth_stream_key(const std::string& name, uint64_t seed);

/// The byte-level (GPT-2) alphabet: byte b as the UTF-8 of its printable stand-in.
std::string byte_level_char(uint8_t b);

/// A loaded model's config and weights as GGUF metadata and f32 tensors, laid out as
/// llama.cpp's converter writes them (names, 3-D expert stacks, its reshapes, A = -exp(A_log),
/// permuted Q/K rows, gemma's 1 + w): loading the file gives the same model. The caller adds
/// the tokenizer metadata and writes.
void add_model_gguf(const Model& m, GgufWriter& g);

}  // namespace arbiter
