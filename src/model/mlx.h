// MLX quantized checkpoints (mlx-community; mlx-lm's convert): config.json's `quantization`
// block and the packed tensors it describes, repacked at load into the MLX block types of
// core/quant.h, so that every architecture and every tier reads them as it reads ggml's blocks.
//
// Facts from ml-explore/mlx (mlx/ops.cpp quantize/dequantize, python/mlx/nn/layers/quantized.py)
// and ml-explore/mlx-lm (mlx_lm/utils.py load_model / quantize_model / save_config):
// - `quantization`: {group_size, bits, mode (default "affine")} plus per-module overrides keyed
//   by module path ("model.layers.0.mlp.down_proj"): false (left in float), true (the
//   defaults) or {group_size, bits, mode} (missing keys take the mode's defaults: affine 64/4,
//   mxfp4 32/4, mxfp8 32/8, nvfp4 16/4). mlx-lm writes the same block as
//   `quantization_config` too; a `quantization_config` alone is another tool's (quant_method).
// - A module P is quantized when P.scales is stored (mlx-lm's class predicate): P.weight is
//   uint32 [out, in * bits / 32], P.scales [out, in / group_size] (model dtype for affine, uint8
//   E8M0/E4M3 for the fp modes), P.biases the same shape and dtype as scales (affine only).
//   Linear and Embedding modules are quantized, the embedding used as the tied lm_head too.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/json_config.h"
#include "io/safetensors.h"

namespace arbiter {

/// One module's quantization. mode: "affine", "mxfp4", "mxfp8" or "nvfp4".
struct MlxQuantParams {
  std::string mode = "affine";
  int group_size = 64, bits = 4;
};

class MlxQuant {
 public:
  /// From config.json (`config`): disabled when it has neither `quantization` nor
  /// `quantization_config`; refuses ("[mlx] PATH: ...") a `quantization_config` without
  /// `quantization` (another tool's quant_method), and modes, bits and group sizes MLX does
  /// not define.
  explicit MlxQuant(const JsonConfig& config);
  bool enabled() const { return enabled_; }
  const MlxQuantParams& defaults() const { return defaults_; }

  /// The repacked weight for a stored tensor name (P.weight with P.scales stored), made once
  /// and kept; nullptr when `name` is not an MLX-packed tensor. Refuses (naming the tensor)
  /// packed shapes that disagree with the scales, missing scales or biases, and a packed tensor
  /// the config says is not quantized.
  const Tensor* tensor(const SafetensorsSet& st, const std::string& name);
  /// Whether a stored name was read into a repacked weight (P.weight's words, P.scales,
  /// P.biases).
  bool consumed(const std::string& name) const { return consumed_.count(name) > 0; }

  /// The parameters of module path p (its override, else the defaults); false when the
  /// config leaves it unquantized.
  bool params_for(const std::string& module, MlxQuantParams& out) const;

 private:
  bool enabled_ = false;
  std::string path_;
  MlxQuantParams defaults_;
  std::map<std::string, MlxQuantParams> overrides_;
  std::map<std::string, bool> off_;  // modules the config leaves unquantized
  struct Repacked {
    Tensor t;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Repacked> repacked_;
  std::map<std::string, bool> consumed_;
};

/// `quantization` block params for `mode`, checked as MLX checks them (mlx/ops.cpp): affine
/// bits 2, 3, 4, 5, 6, 8 and group size 32, 64, 128; mxfp4 4/32, mxfp8 8/32, nvfp4 4/16.
/// Returns an empty string when valid, else what is wrong.
std::string mlx_params_error(const MlxQuantParams& p);

/// Packs rows x cols f32 values (row-major) with MLX's affine quantizer (group size g, bits):
/// words [rows, cols * bits / 32] uint32, scales and biases [rows, cols / g] as f32 (the
/// writer rounds them to the model dtype, as MLX does after computing the quants).
void mlx_affine_quantize(const float* x, int64_t rows, int64_t cols, int g, int bits, uint32_t* words,
                         float* scales, float* biases);

}  // namespace arbiter
