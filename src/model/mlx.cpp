#include "model/mlx.h"

#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "core/quant.h"

namespace arbiter {

namespace {

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// python/mlx/nn/layers/quantized.py _defaults_for_mode.
bool mode_defaults(const std::string& mode, MlxQuantParams& p) {
  p.mode = mode;
  if (mode == "affine") p.group_size = 64, p.bits = 4;
  else if (mode == "mxfp4") p.group_size = 32, p.bits = 4;
  else if (mode == "mxfp8") p.group_size = 32, p.bits = 8;
  else if (mode == "nvfp4") p.group_size = 16, p.bits = 4;
  else return false;
  return true;
}

// One {group_size, bits, mode} object; `what` names it in errors ("quantization" or
// "quantization.model.layers.0.mlp.down_proj"). Keys it omits: `base`'s values for the
// top-level block (mlx-lm passes them to nn.quantize), the mode's defaults for an override
// (to_quantized(**params)).
MlxQuantParams parse_params(const JsonConfig& j, const nlohmann::json& o, const std::string& what, bool top) {
  auto fail = [&](const std::string& m) { j.fail(what + m); };
  MlxQuantParams p;
  std::string mode = "affine";
  if (o.contains("mode") && !o["mode"].is_null()) {
    if (!o["mode"].is_string()) fail(".mode is not a string");
    mode = o["mode"].get<std::string>();
  }
  if (!mode_defaults(mode, p))
    fail(".mode '" + mode + "' is not an MLX mode (expected affine, mxfp4, mxfp8 or nvfp4)");
  for (const char* k : {"group_size", "bits"}) {
    const bool present = o.contains(k) && !o[k].is_null();
    if (!present) {
      if (top) fail(std::string(" has no '") + k + "' (mlx-lm requires it)");
      continue;
    }
    if (!o[k].is_number_integer()) fail(std::string(".") + k + " is not an integer");
    const int64_t v = o[k].is_number_unsigned() && o[k].get<uint64_t>() > uint64_t(INT64_MAX) ? -1 : o[k].get<int64_t>();
    if (v < 1 || v > 1024) fail(std::string(".") + k + " is " + o[k].dump() + " (expected a small positive integer)");
    (std::string(k) == "bits" ? p.bits : p.group_size) = int(v);
  }
  const std::string err = mlx_params_error(p);
  if (!err.empty()) fail(": " + err);
  return p;
}

// Widens element i of an MLX scale or bias tensor (model dtype) to f32: exact.
float widen(const Tensor& t, int64_t i) {
  float v;
  row_to_f32(t.dtype, static_cast<const uint8_t*>(t.data) + dtype_bytes(t.dtype, i), &v, 1);
  return v;
}

}  // namespace

std::string mlx_params_error(const MlxQuantParams& p) {
  const std::string got = " (got bits " + std::to_string(p.bits) + ", group_size " + std::to_string(p.group_size) + ")";
  if (p.mode == "affine") {
    if (p.bits < 2 || p.bits > 8 || p.bits == 7) return "affine bits must be 2, 3, 4, 5, 6 or 8" + got;
    if (p.group_size != 32 && p.group_size != 64 && p.group_size != 128)
      return "affine group_size must be 32, 64 or 128" + got;
    return "";
  }
  MlxQuantParams d;
  mode_defaults(p.mode, d);
  if (p.bits != d.bits || p.group_size != d.group_size)
    return p.mode + " needs bits " + std::to_string(d.bits) + " and group_size " + std::to_string(d.group_size) + got;
  return "";
}

MlxQuant::MlxQuant(const JsonConfig& j) : path_(j.path()) {
  if (!j.has("quantization")) {
    // mlx-lm reads a text_config's quantization_config too; either way, without
    // `quantization` it is another tool's format (GPTQ, AWQ, compressed-tensors, fp8, ...).
    const JsonConfig* qc = nullptr;
    std::string where = "quantization_config";
    std::unique_ptr<JsonConfig> text;
    if (j.has("quantization_config")) {
      qc = &j;
    } else if (j.has("text_config") && j.raw("text_config").is_object() &&
               j.raw("text_config").contains("quantization_config") &&
               !j.raw("text_config")["quantization_config"].is_null()) {
      text = std::make_unique<JsonConfig>(j.object("text_config"));
      qc = text.get();
      where = "text_config.quantization_config";
    }
    if (qc == nullptr) return;
    const nlohmann::json& o = qc->raw("quantization_config");
    const std::string method =
        o.is_object() && o.contains("quant_method") && o["quant_method"].is_string() ? o["quant_method"].get<std::string>() : "";
    j.fail(where + (method.empty() ? " has no quant_method" : ".quant_method '" + method + "'") +
           " and there is no MLX 'quantization' block (arbiter reads MLX-quantized safetensors and GGUF block "
           "formats only)");
  }
  const nlohmann::json& q = j.raw("quantization");
  if (!q.is_object()) j.fail("'quantization' is not an object");
  enabled_ = true;
  defaults_ = parse_params(j, q, "quantization", true);
  for (auto it = q.begin(); it != q.end(); ++it) {
    const std::string& k = it.key();
    if (k == "group_size" || k == "bits" || k == "mode") continue;
    // Any other key is a module path (mlx-lm's class predicate looks every module up).
    const std::string what = "quantization." + k;
    if (it.value().is_boolean()) {
      if (it.value().get<bool>()) overrides_[k] = defaults_;
      else off_[k] = true;
    } else if (it.value().is_object()) {
      overrides_[k] = parse_params(j, it.value(), what, false);
    } else {
      j.fail(what + " is neither a module override (false, true or {group_size, bits, mode}) nor a known key");
    }
  }
}

bool MlxQuant::params_for(const std::string& module, MlxQuantParams& out) const {
  if (off_.count(module)) return false;
  auto it = overrides_.find(module);
  out = it == overrides_.end() ? defaults_ : it->second;
  return true;
}

const Tensor* MlxQuant::tensor(const SafetensorsSet& st, const std::string& name) {
  if (!enabled_ || !ends_with(name, ".weight")) return nullptr;
  if (auto it = repacked_.find(name); it != repacked_.end()) return &it->second.t;
  const std::string module = name.substr(0, name.size() - 7);
  const std::string sname = module + ".scales", bname = module + ".biases";
  const IntTensor* words = st.int_tensor(name);
  const bool has_scales = st.tensor(sname) || st.int_tensor(sname);
  auto fail = [&](const std::string& what) { throw Error("[mlx] " + path_ + ": tensor '" + name + "' " + what); };
  MlxQuantParams p;
  const bool quantized = params_for(module, p);
  if (words == nullptr) {
    if (has_scales) fail("has '" + sname + "' but is not stored as uint32 (MLX packs quantized weights in U32)");
    if (quantized && overrides_.count(module) && st.tensor(name))
      fail("is stored in float but config.json's quantization." + module + " quantizes it");
    return nullptr;
  }
  if (words->type != StInt::U32) fail("has dtype U8 (MLX packs quantized weights in U32)");
  if (!quantized) fail("is packed but config.json's quantization." + module + " is false");
  const bool affine = p.mode == "affine";
  const Tensor* fscales = st.tensor(sname);
  const IntTensor* iscales = st.int_tensor(sname);
  const Tensor* biases = st.tensor(bname);
  if (!fscales && !iscales) fail("is packed but '" + sname + "' is missing");
  if (affine && !fscales) fail("is affine-quantized but '" + sname + "' is not a float tensor");
  if (!affine && !iscales) fail("is " + p.mode + "-quantized but '" + sname + "' is not uint8 (E8M0/E4M3)");
  if (!affine && iscales->type != StInt::U8) fail("'s scales '" + sname + "' are U32 (expected U8)");
  if (affine && !biases) fail("is affine-quantized but '" + bname + "' is missing");
  if (!affine && (biases || st.int_tensor(bname))) fail("is " + p.mode + "-quantized but has '" + bname + "' (only affine has biases)");
  const std::vector<int64_t>& sshape = affine ? fscales->shape : iscales->shape;
  if (words->shape.size() != 2)
    fail("has shape " + shape_str(words->shape) + " (arbiter reads 2-D quantized matrices only)");
  const int64_t rows = words->shape[0], wcols = words->shape[1];
  if ((wcols * 32) % p.bits != 0) fail("packs rows of " + std::to_string(wcols) + " words, not a whole number of " + std::to_string(p.bits) + "-bit values");
  const int64_t cols = wcols * 32 / p.bits;
  const std::vector<int64_t> want = {rows, cols / p.group_size};
  if (cols % p.group_size != 0 || sshape != want)
    fail("packs " + shape_str(words->shape) + " uint32 words (" + std::to_string(cols) + " " + std::to_string(p.bits) +
         "-bit values per row), which '" + sname + "' " + shape_str(sshape) + " does not cover in groups of " +
         std::to_string(p.group_size));
  if (affine) {
    if (fscales->dtype != DType::F32 && fscales->dtype != DType::F16 && fscales->dtype != DType::BF16)
      fail("has '" + sname + "' in " + dtype_name(fscales->dtype) + " (MLX scales are f32, f16 or bf16)");
    if (biases->shape != fscales->shape || biases->dtype != fscales->dtype)
      fail("has '" + bname + "' " + shape_str(biases->shape) + " " + dtype_name(biases->dtype) + " unlike '" + sname +
           "' " + shape_str(fscales->shape) + " " + dtype_name(fscales->dtype));
  }

  Repacked r;
  r.t.name = name;
  r.t.shape = {rows, cols};
  r.t.dtype = affine ? mlx_affine_dtype(p.bits)
              : p.mode == "mxfp4" ? DType::MXFP4
              : p.mode == "mxfp8" ? DType::MLX_MXFP8
                                  : DType::MLX_NVFP4;
  const int be = block_elems(r.t.dtype);
  const size_t bb = block_bytes(r.t.dtype);
  const int64_t nb = cols / be, groups = cols / p.group_size;
  r.bytes.resize(size_t(rows * nb) * bb);
  const auto* w = static_cast<const uint32_t*>(words->data);
  const auto* s8 = iscales ? static_cast<const uint8_t*>(iscales->data) : nullptr;
  for (int64_t row = 0; row < rows; ++row) {
    const uint32_t* wr = w + row * wcols;
    for (int64_t k = 0; k < nb; ++k) {
      uint8_t* dst = r.bytes.data() + size_t(row * nb + k) * bb;
      const int64_t g = row * groups + k * be / p.group_size;  // the block's group
      if (affine) {
        // A 32-value block starts at bit 32 * bits * k: whole words, copied as they are.
        const float sb[2] = {widen(*fscales, g), widen(*biases, g)};
        std::memcpy(dst, sb, 8);
        std::memcpy(dst + 8, wr + k * p.bits, 4 * size_t(p.bits));
      } else if (r.t.dtype == DType::MLX_MXFP8) {
        dst[0] = s8[g];
        std::memcpy(dst + 1, wr + k * 8, 32);  // byte j of the little-endian words is value j
      } else {
        // mxfp4 / nvfp4: value j of the block is nibble j of its words (LSB first).
        uint32_t q[kMlxBlock];
        for (int j = 0; j < be; ++j) q[j] = mlx_unpack(wr, k * be + j, 4);
        dst[0] = s8[g];
        if (r.t.dtype == DType::MXFP4) {  // ggml's order: value j low nibble, j + 16 high
          for (int j = 0; j < 16; ++j) dst[1 + j] = uint8_t(q[j] | q[j + 16] << 4);
        } else {
          for (int j = 0; j < 8; ++j) dst[1 + j] = uint8_t(q[2 * j] | q[2 * j + 1] << 4);
        }
      }
    }
  }
  consumed_[name] = consumed_[sname] = true;
  if (affine) consumed_[bname] = true;
  auto ins = repacked_.emplace(name, std::move(r));
  ins.first->second.t.data = ins.first->second.bytes.data();
  return &ins.first->second.t;
}

void mlx_affine_quantize(const float* x, int64_t rows, int64_t cols, int g, int bits, uint32_t* words,
                         float* scales, float* biases) {
  const int64_t wcols = cols * bits / 32, groups = cols / g;
  std::vector<uint32_t> q(static_cast<size_t>(g));
  for (int64_t r = 0; r < rows; ++r) {
    uint32_t* wr = words + r * wcols;
    std::fill(wr, wr + wcols, 0u);
    for (int64_t k = 0; k < groups; ++k) {
      mlx_affine_quantize_group(x + r * cols + k * g, g, bits, scales[r * groups + k], biases[r * groups + k], q.data());
      for (int j = 0; j < g; ++j) mlx_pack(wr, k * g + j, bits, q[size_t(j)]);
    }
  }
}

}  // namespace arbiter
