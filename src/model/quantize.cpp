#include "model/quantize.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include "core/error.h"
#include "core/quant.h"
#include "core/thread_pool.h"
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "io/json_config.h"
#include "io/safetensors.h"
#include "io/safetensors_write.h"
#include "model/mlx.h"

namespace arbiter {

namespace {

struct RecipeInfo {
  QuantRecipe r;
  const char* name;
  DType base;        // the type of every matrix the recipe does not single out
  uint32_t ftype;    // llama.h enum llama_ftype, written as general.file_type
};
constexpr RecipeInfo kRecipes[] = {
    {QuantRecipe::Q8_0, "Q8_0", DType::Q8_0, 7},       {QuantRecipe::Q4_0, "Q4_0", DType::Q4_0, 2},
    {QuantRecipe::Q6_K, "Q6_K", DType::Q6_K, 18},      {QuantRecipe::Q4_K_M, "Q4_K_M", DType::Q4_K, 15},
    {QuantRecipe::Q5_K_M, "Q5_K_M", DType::Q5_K, 17}, {QuantRecipe::MXFP4, "MXFP4", DType::MXFP4, 38},
};
constexpr uint32_t kQuantizationVersion = 2;  // ggml.h GGML_QNT_VERSION

const RecipeInfo& info(QuantRecipe r) {
  for (const RecipeInfo& i : kRecipes)
    if (i.r == r) return i;
  ARB_ASSERT(false);
  return kRecipes[0];
}

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third between.
bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// llama-quant.cpp tensor_type_fallback: a row length the block does not divide.
DType fallback(DType t, int64_t cols) {
  if (cols % block_elems(t) == 0) return t;
  switch (t) {
    case DType::Q4_K: t = DType::Q5_0; break;
    case DType::Q5_K: t = DType::Q5_1; break;
    case DType::Q6_K: t = DType::Q8_0; break;
    default: break;
  }
  return cols % block_elems(t) == 0 ? t : DType::F16;
}

}  // namespace

std::optional<QuantRecipe> find_quant_recipe(const std::string& name) {
  std::string up = name;
  for (char& c : up) c = char(std::toupper(static_cast<unsigned char>(c)));
  for (const RecipeInfo& i : kRecipes)
    if (up == i.name) return i.r;
  return std::nullopt;
}

QuantRecipe quant_recipe_from_name(const std::string& name) {
  if (const std::optional<QuantRecipe> r = find_quant_recipe(name)) return *r;
  throw Error("[quantize] unknown --type '" + name + "' (expected Q8_0, Q4_0, Q6_K, Q4_K_M, Q5_K_M or MXFP4)");
}

const char* quant_recipe_name(QuantRecipe r) { return info(r).name; }

QuantCounters quant_counters(const std::vector<std::string>& names, int n_layer) {
  QuantCounters c;
  c.n_layer = n_layer;
  c.tied = std::find(names.begin(), names.end(), "output.weight") == names.end();
  for (const std::string& n : names)
    if (n.find("attn_v.weight") != std::string::npos || n.find("attn_qkv.weight") != std::string::npos) ++c.n_attn_v;
  return c;
}

void add_quant_file_type(QuantRecipe r, GgufWriter& w) {
  w.add_u32("general.quantization_version", kQuantizationVersion);
  w.add_u32("general.file_type", info(r).ftype);
}

void encode_f32(DType to, const float* x, int64_t n, void* dst) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  if (is_quantized(to)) {
    quantize_blocks(to, x, n / block_elems(to), out);
  } else if (to == DType::F32) {
    std::memcpy(out, x, size_t(n) * 4);
  } else {
    ARB_ASSERT(to == DType::F16 || to == DType::BF16);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t u = to == DType::F16 ? f32_to_f16(x[i]) : f32_to_bf16(x[i]);
      std::memcpy(out + 2 * i, &u, 2);
    }
  }
}

DType quant_tensor_type(QuantRecipe r, const std::string& name, int n_dims, int64_t cols, DType stored,
                        QuantCounters& c) {
  // llama-quant.cpp tensor_allows_quantization: matrices named *weight, not norms. 1-D
  // tensors are written F32 (llama-quantize keeps their input type; llama.cpp's own converter
  // writes them F32, and its graph refuses bf16 norms).
  if (n_dims < 2) return DType::F32;
  if (!ends_with(name, "weight") || name.find("_norm.weight") != std::string::npos) return stored;
  // llama-quant.cpp keeps the MoE router and Mamba's conv kernel as they are.
  if (name.find("ffn_gate_inp.weight") != std::string::npos || name.find("ssm_conv1d") != std::string::npos)
    return stored;
  DType t = info(r).base;
  const bool output = name == "output.weight" || (c.tied && name == "token_embd.weight");
  if (output) {
    // The output matrix (or the embedding it is tied to): Q6_K unless the recipe is Q8_0, Q8_0
    // when its rows do not divide into 256 (and under MXFP4_MOE).
    if (r == QuantRecipe::MXFP4 || cols % kQK_K != 0) t = DType::Q8_0;
    else if (t != DType::Q8_0) t = DType::Q6_K;
  } else if (name.find("attn_v.weight") != std::string::npos || name.find("attn_qkv.weight") != std::string::npos) {
    const bool qkv = name.find("attn_qkv") != std::string::npos;
    if ((r == QuantRecipe::Q4_K_M || r == QuantRecipe::Q5_K_M) && !qkv && use_more_bits(c.i_attn_v, c.n_attn_v))
      t = DType::Q6_K;
    if (qkv && r == QuantRecipe::Q4_K_M) t = DType::Q5_K;
    if (qkv && r == QuantRecipe::Q5_K_M) t = DType::Q6_K;
    ++c.i_attn_v;
  } else if (name.find("ffn_down") != std::string::npos) {
    if ((r == QuantRecipe::Q4_K_M || r == QuantRecipe::Q5_K_M) && use_more_bits(c.i_ffn_down, c.n_layer))
      t = DType::Q6_K;
    ++c.i_ffn_down;
  }
  return fallback(t, cols);
}

QuantizeStats quantize_gguf(const std::string& in_path, const std::string& out_path, QuantRecipe r, int threads) {
  std::error_code ec;
  if (in_path == out_path || std::filesystem::equivalent(in_path, out_path, ec))
    throw Error("[quantize] " + out_path + ": the output is the input file (write elsewhere)");
  GgufFile in(in_path);

  std::vector<std::string> names;
  for (const Tensor& t : in.tensors()) {
    if (is_quantized(t.dtype) && t.shape.size() >= 2)
      throw Error("[quantize] " + in_path + ": tensor '" + t.name + "' is already " + dtype_name(t.dtype) +
                  " (quantize from an f32, f16 or bf16 file)");
    names.push_back(t.name);
  }
  const std::string arch = in.find("general.architecture") ? in.find("general.architecture")->s : "";
  int n_layer = 0;
  if (const GgufValue* n = in.find(arch + ".block_count")) n_layer = int(n->u ? n->u : uint64_t(n->i));
  QuantCounters c = quant_counters(names, n_layer);

  GgufWriter w;
  for (const auto& [key, v] : in.metadata())
    if (key != "general.file_type" && key != "general.quantization_version" && key != "general.alignment")
      w.add_value(key, v);
  add_quant_file_type(r, w);

  ThreadPool pool(threads);
  QuantizeStats st;
  for (const Tensor& t : in.tensors()) {
    const int64_t cols = t.shape.back();
    const DType to = quant_tensor_type(r, t.name, int(t.shape.size()), cols, t.dtype, c);
    ++st.tensors;
    st.quantized += is_quantized(to);
    st.bytes_in += t.nbytes();
    st.bytes_out += dtype_bytes(to, t.numel());
    GgufTensorEntry e;
    e.name = t.name;
    e.dtype = to;
    e.shape = t.shape;
    // Elements [begin, begin + n) are whole rows' worth of blocks: widened exactly to f32
    // (the input is f32, f16 or bf16), then encoded or narrowed, rows spread over the pool.
    e.fill = [t, to, &pool](int64_t begin, int64_t n, void* dst) {
      const int be = block_elems(to);
      const int64_t nb = n / be;
      pool.parallel_for(nb, [&](int64_t b0, int64_t b1) {
        std::vector<float> f(size_t((b1 - b0) * be));
        const int64_t first = begin + b0 * be;
        row_to_f32(t.dtype, static_cast<const uint8_t*>(t.data) + dtype_bytes(t.dtype, first), f.data(),
                   int64_t(f.size()));
        encode_f32(to, f.data(), int64_t(f.size()), static_cast<uint8_t*>(dst) + dtype_bytes(to, b0 * be));
      });
    };
    w.add_tensor(std::move(e));
  }
  w.write(out_path);
  return st;
}

QuantizeStats quantize_mlx(const std::string& in_dir, const std::string& out_dir, int bits, int group_size,
                           int threads) {
  namespace fs = std::filesystem;
  const std::string err = mlx_params_error({"affine", group_size, bits});
  if (!err.empty()) throw Error("[quantize] --mlx " + std::to_string(bits) + " --group-size " + std::to_string(group_size) + ": " + err);
  std::error_code ec;
  if (!fs::is_directory(in_dir)) throw Error("[quantize] " + in_dir + ": --mlx reads an HF model directory");
  if (in_dir == out_dir || fs::equivalent(in_dir, out_dir, ec))
    throw Error("[quantize] " + out_dir + ": the output is the input directory (write elsewhere)");
  if (fs::exists(out_dir)) throw Error("[quantize] " + out_dir + ": already exists (refusing to replace it)");
  const std::string cfg_path = in_dir + "/config.json";
  const std::string cfg_text = read_config_text(cfg_path);
  if (MlxQuant(JsonConfig(cfg_text, cfg_path)).enabled())  // also checks the text is a JSON object
    throw Error("[quantize] " + cfg_path + ": the model is already MLX-quantized (quantize from f32, f16 or bf16)");
  const SafetensorsSet st = SafetensorsSet::open_dir(in_dir);
  if (!st.int_tensors().empty())
    throw Error("[quantize] " + in_dir + ": tensor '" + st.int_tensors().begin()->first + "' is an integer tensor");

  ThreadPool pool(threads);
  QuantizeStats stats;
  std::vector<SafetensorsEntry> entries;
  std::vector<std::vector<uint8_t>> owned;  // words, scales and biases of every quantized matrix
  owned.reserve(3 * st.tensors().size());
  for (const auto& entry : st.tensors()) {
    const std::string& name = entry.first;
    const Tensor& t = entry.second;  // not a structured binding: the lambda below captures it (clang 14)
    ++stats.tensors;
    stats.bytes_in += t.nbytes();
    const bool quantize = t.shape.size() == 2 && ends_with(name, ".weight") && t.cols() % group_size == 0;
    if (!quantize) {
      SafetensorsEntry e;
      e.name = name;
      e.dtype = t.dtype;
      e.shape = t.shape;
      e.data = t.data;
      entries.push_back(std::move(e));
      stats.bytes_out += t.nbytes();
      continue;
    }
    ++stats.quantized;
    const int64_t rows = t.rows(), cols = t.cols(), groups = cols / group_size, wcols = cols * bits / 32;
    // MLX rounds scales and biases to the model dtype after computing the quants (mlx/ops.cpp).
    const DType sd = t.dtype == DType::F64 ? DType::F32 : t.dtype;
    std::vector<uint8_t>& words = owned.emplace_back(size_t(rows * wcols) * 4);
    std::vector<uint8_t>& sc = owned.emplace_back(dtype_bytes(sd, rows * groups));
    std::vector<uint8_t>& bi = owned.emplace_back(dtype_bytes(sd, rows * groups));
    pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
      std::vector<float> x(size_t((r1 - r0) * cols)), s(size_t((r1 - r0) * groups)), b(s.size());
      row_to_f32(t.dtype, t.row(r0), x.data(), int64_t(x.size()));
      mlx_affine_quantize(x.data(), r1 - r0, cols, group_size, bits,
                          reinterpret_cast<uint32_t*>(words.data()) + r0 * wcols, s.data(), b.data());
      for (size_t i = 0; i < s.size(); ++i) {
        const size_t at = dtype_bytes(sd, r0 * groups + int64_t(i));
        if (sd == DType::F32) {
          std::memcpy(sc.data() + at, &s[i], 4);
          std::memcpy(bi.data() + at, &b[i], 4);
        } else {
          const uint16_t us = sd == DType::F16 ? f32_to_f16(s[i]) : f32_to_bf16(s[i]);
          const uint16_t ub = sd == DType::F16 ? f32_to_f16(b[i]) : f32_to_bf16(b[i]);
          std::memcpy(sc.data() + at, &us, 2);
          std::memcpy(bi.data() + at, &ub, 2);
        }
      }
    });
    const std::string module = name.substr(0, name.size() - 7);
    SafetensorsEntry w;
    w.name = name;
    w.int_type = StInt::U32;
    w.shape = {rows, wcols};
    w.data = words.data();
    entries.push_back(std::move(w));
    for (const auto& [suffix, bytes] : {std::pair{".scales", &sc}, std::pair{".biases", &bi}}) {
      SafetensorsEntry e;
      e.name = module + suffix;
      e.dtype = sd;
      e.shape = {rows, groups};
      e.data = bytes->data();
      entries.push_back(std::move(e));
    }
    stats.bytes_out += words.size() + sc.size() + bi.size();
  }

  const std::string tmp = out_dir + ".partial";
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec)) throw Error("[quantize] " + tmp + ": cannot create (" + ec.message() + ")");
  try {
    write_safetensors(tmp + "/model.safetensors", entries, {{"format", "mlx"}});
    const nlohmann::json q = {{"group_size", group_size}, {"bits", bits}, {"mode", "affine"}};
    nlohmann::json cfg = nlohmann::json::parse(cfg_text);
    cfg["quantization"] = q;
    cfg["quantization_config"] = q;  // mlx-lm's save_config writes both
    std::ofstream cf(tmp + "/config.json");
    cf << cfg.dump(2) << "\n";
    if (!cf.flush()) throw Error("[quantize] " + tmp + "/config.json: write failed");
    for (const fs::directory_entry& f : fs::directory_iterator(in_dir)) {
      const std::string n = f.path().filename().string();
      // The tokenizer and generation files, as mlx-lm's save copies them.
      const bool copy = n.rfind("tokenizer", 0) == 0 || n == "generation_config.json" ||
                        n == "special_tokens_map.json" || n == "added_tokens.json" || n == "vocab.json" ||
                        n == "merges.txt" || n.rfind("chat_template", 0) == 0;
      if (!f.is_regular_file() || !copy) continue;
      fs::copy_file(f.path(), tmp + "/" + n);
    }
    fs::rename(tmp, out_dir);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return stats;
}

}  // namespace arbiter
