// arbiter quantize: a GGUF file re-encoded in ggml's block formats, tensor by tensor, with
// llama.cpp's mixture recipes (src/llama-quant.cpp llama_tensor_get_type, without an
// imatrix); docs/quantization.md lists which tensors get which type.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace arbiter {

/// A recipe: Q8_0, Q4_0, Q6_K, Q4_K_M, Q5_K_M or MXFP4 (case-insensitive); throws otherwise.
enum class QuantRecipe { Q8_0, Q4_0, Q6_K, Q4_K_M, Q5_K_M, MXFP4 };
QuantRecipe quant_recipe_from_name(const std::string& name);
/// The same lookup without throwing: nothing when name is no recipe (`synth --dtype` takes a
/// recipe or a float dtype).
std::optional<QuantRecipe> find_quant_recipe(const std::string& name);
const char* quant_recipe_name(QuantRecipe r);

/// The type `name` (a GGUF tensor of ne0 = cols values per row and n_dims dimensions) gets
/// under recipe r. i_attn_v / n_attn_v count the attn_v tensors (file order), i_ffn_down the
/// ffn_down ones, n_layer the blocks; tied: the file has no output.weight. F32 for a tensor
/// the recipe keeps in float (1-D tensors, norms).
struct QuantCounters {
  int i_attn_v = 0, n_attn_v = 0, i_ffn_down = 0, n_layer = 0;
  bool tied = false;
};
/// The counters before the first tensor of a file whose tensors are `names` (file order) and
/// whose blocks number n_layer.
QuantCounters quant_counters(const std::vector<std::string>& names, int n_layer);
DType quant_tensor_type(QuantRecipe r, const std::string& name, int n_dims, int64_t cols, DType stored,
                        QuantCounters& c);

class GgufWriter;
/// general.quantization_version and general.file_type as llama-quantize writes them for r.
void add_quant_file_type(QuantRecipe r, GgufWriter& w);

/// n f32 values (whole blocks of `to`) encoded as `to`: a block format, F32, F16 or BF16.
void encode_f32(DType to, const float* x, int64_t n, void* dst);

struct QuantizeStats {
  int tensors = 0, quantized = 0;
  uint64_t bytes_in = 0, bytes_out = 0;
};
/// Reads the GGUF at in_path and writes out_path (atomically): every metadata key copied,
/// general.file_type and general.quantization_version set as llama-quantize sets them, each
/// tensor re-encoded from its exact f32 values. Refuses an output path equal to the input, and
/// an input whose matrices are already in a block format.
QuantizeStats quantize_gguf(const std::string& in_path, const std::string& out_path, QuantRecipe r, int threads);

/// Writes the MLX affine layout (model/mlx.h) of the HF directory in_dir to the directory
/// out_dir, as mlx-lm's convert does: every 2-D `*.weight` whose rows divide into group_size
/// (MLX quantizes Linear and Embedding modules; our families store no other 2-D weight) as
/// P.weight (U32 words), P.scales and P.biases (the input's dtype, f32 for f64); every other
/// tensor as stored; config.json with `quantization` and `quantization_config` =
/// {group_size, bits, mode: "affine"}; the directory's other files copied. Built in
/// out_dir.partial and renamed, so out_dir holds all of it or nothing. Refuses out_dir equal
/// to in_dir or already present, an input already quantized, bits outside {2,3,4,5,6,8} and
/// group sizes outside {32, 64, 128}.
QuantizeStats quantize_mlx(const std::string& in_dir, const std::string& out_dir, int bits, int group_size,
                           int threads);

}  // namespace arbiter
