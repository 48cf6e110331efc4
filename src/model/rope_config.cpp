#include "model/rope_config.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "io/json_config.h"

namespace arbiter {

// `type` or `rope_type` names the kind.
void read_hf_rope_dict(const JsonConfig& j, const char* key, RopeSpec& rope) {
  if (!j.raw(key).is_object()) j.fail(std::string("'") + key + "' is not an object");
  const JsonConfig r = j.object(key);
  const std::string type = r.str_of({"rope_type", "type"}, "default");
  const std::string w = j.name(key) + ".";
  if (r.has("rope_theta")) rope.theta = r.number("rope_theta");
  auto need = [&](const char* k) {
    if (!r.has(k)) j.fail(w + k + " missing for rope type '" + type + "'");
    return r.number(k);
  };
  RopeScaling& s = rope.scaling;
  if (type == "default") {
    s = RopeScaling{};
  } else if (type == "linear") {
    s.kind = RopeScaling::Kind::Linear;
    s.factor = need("factor");
  } else if (type == "llama3") {
    // transformers' _compute_llama3_parameters reads all four keys (no defaults).
    s.kind = RopeScaling::Kind::Llama3;
    s.factor = need("factor");
    s.low_freq_factor = need("low_freq_factor");
    s.high_freq_factor = need("high_freq_factor");
    const double orig = need("original_max_position_embeddings");
    if (orig <= 0 || orig != std::floor(orig) || orig > 9e15)
      j.fail(w + "original_max_position_embeddings is not a positive integer");
    s.original_max_pos = int64_t(orig);
    if (!(s.high_freq_factor > s.low_freq_factor))
      j.fail(w + "high_freq_factor must exceed low_freq_factor");
  } else {
    j.fail(w + "rope type '" + type + "' is not supported (supported: default, linear, llama3)");
  }
  if (s.kind != RopeScaling::Kind::None && !(s.factor > 0)) j.fail(w + "factor must be positive");
}

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The per-frequency divisors llama.cpp stores for Llama 3 scaling (rope_freqs.weight):
// 1 / (the factor transformers' _compute_llama3_parameters applies to inv_freq[i]).
std::vector<double> llama3_divisors(const RopeSpec& r) {
  const RopeScaling& s = r.scaling;
  const double lo_wl = double(s.original_max_pos) / s.low_freq_factor;
  const double hi_wl = double(s.original_max_pos) / s.high_freq_factor;
  std::vector<double> f(size_t(r.dims / 2));
  for (size_t i = 0; i < f.size(); ++i) {
    const double wl = 2 * 3.14159265358979323846 / std::pow(r.theta, -2.0 * double(i) / r.dims);
    const double smooth = (double(s.original_max_pos) / wl - s.low_freq_factor) /
                          (s.high_freq_factor - s.low_freq_factor);
    f[i] = wl < hi_wl ? 1.0 : wl > lo_wl ? s.factor : 1.0 / ((1 - smooth) / s.factor + smooth);
  }
  return f;
}

}  // namespace

void read_hf_rope(const JsonConfig& j, RopeSpec& rope) {
  rope.theta = j.number("rope_theta", 10000.0);
  if (j.has("rope_scaling")) read_hf_rope_dict(j, "rope_scaling", rope);
  if (j.has("rope_parameters")) read_hf_rope_dict(j, "rope_parameters", rope);
  if (!(rope.theta > 0)) j.fail("rope_theta must be positive");
  if (j.has("partial_rotary_factor") && j.number("partial_rotary_factor") != 1.0)
    j.fail("partial_rotary_factor != 1 is not supported");
}

void write_hf_rope(const RopeSpec& rope, nlohmann::json& j) {
  j["rope_theta"] = rope.theta;
  const RopeScaling& s = rope.scaling;
  if (s.kind == RopeScaling::Kind::Llama3)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", s.factor},
                         {"low_freq_factor", s.low_freq_factor},
                         {"high_freq_factor", s.high_freq_factor},
                         {"original_max_position_embeddings", s.original_max_pos}};
  else if (s.kind == RopeScaling::Kind::Linear)
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", s.factor}};
  else
    j["rope_scaling"] = nullptr;
}

void read_gguf_rope(const GgufFile& g, const std::string& arch, RopeSpec& rope) {
  const std::string& path = g.path();
  const std::string p = arch + ".";
  if (g.get_int(p + "rope.dimension_count", rope.dims) != rope.dims)
    throw Error("[loader] " + path +
                ": rope.dimension_count differs from the head size (partial RoPE unsupported)");
  rope.theta = g.get_float(p + "rope.freq_base", 10000.0);
  if (!(rope.theta > 0) || !std::isfinite(rope.theta))
    throw Error("[loader] " + path + ": " + p + "rope.freq_base must be positive and finite");
  RopeScaling& s = rope.scaling;
  const std::string scaling = g.get_string(p + "rope.scaling.type", "none");
  if (scaling == "linear") {
    s.kind = RopeScaling::Kind::Linear;
    s.factor = g.get_float(p + "rope.scaling.factor");
  } else if (scaling != "none") {
    throw Error("[loader] " + path + ": rope.scaling.type '" + scaling +
                "' is not supported (supported: none, linear)");
  } else if (g.has(p + "rope.scale_linear") && g.get_float(p + "rope.scale_linear") != 1.0) {
    s.kind = RopeScaling::Kind::Linear;
    s.factor = g.get_float(p + "rope.scale_linear");
  }
  if (s.kind == RopeScaling::Kind::Linear && !(s.factor > 0 && std::isfinite(s.factor)))
    throw Error("[loader] " + path + ": rope scaling factor must be positive and finite");
  // llama.cpp stores Llama-3.1-style scaling as a tensor of per-frequency divisors instead of
  // metadata. We recover the llama3 parameters and check the whole tensor against
  // transformers' formula, so the RoPE op can recompute it; anything else is refused.
  const Tensor* t = g.tensor("rope_freqs.weight");
  if (!t) return;
  if (s.kind != RopeScaling::Kind::None)
    throw Error("[loader] " + path + ": both rope.scaling metadata and rope_freqs.weight given");
  const int half = rope.dims / 2;
  if (t->dtype != DType::F32 || t->shape != std::vector<int64_t>{half})
    throw Error("[loader] " + path + ": rope_freqs.weight is " + dtype_name(t->dtype) + " " +
                shape_str(t->shape) + " (expected f32 [" + std::to_string(half) + "])");
  std::vector<float> f(static_cast<size_t>(half));
  std::memcpy(f.data(), t->data, f.size() * sizeof(float));
  s.kind = RopeScaling::Kind::Llama3;
  s.factor = 0;
  for (float v : f) s.factor = std::max(s.factor, double(v));
  s.low_freq_factor = 1.0;  // Llama 3.1/3.2 values; GGUF does not record them
  s.high_freq_factor = 4.0;
  s.original_max_pos = g.get_int(p + "rope.scaling.original_context_length", 8192);
  const std::vector<double> want = llama3_divisors(rope);
  for (size_t i = 0; i < f.size(); ++i)
    if (!(std::fabs(f[i] - want[i]) <= 1e-4 * want[i]))
      throw Error(strformat("[loader] %s: rope_freqs.weight[%zu] = %g does not match llama3 RoPE "
                            "scaling (factor %g, low 1, high 4, original context %lld) which "
                            "gives %g; unsupported",
                            path.c_str(), i, f[i], s.factor, (long long)s.original_max_pos,
                            want[i]));
}

void write_gguf_rope(const RopeSpec& rope, const std::string& arch, GgufWriter& g) {
  const std::string a = arch + ".";
  g.add_u32(a + "rope.dimension_count", uint32_t(rope.dims));
  g.add_f32(a + "rope.freq_base", float(rope.theta));
  const RopeScaling& s = rope.scaling;
  if (s.kind == RopeScaling::Kind::Linear) {
    g.add_string(a + "rope.scaling.type", "linear");
    g.add_f32(a + "rope.scaling.factor", float(s.factor));
  } else if (s.kind == RopeScaling::Kind::Llama3) {
    g.add_u32(a + "rope.scaling.original_context_length", uint32_t(s.original_max_pos));
    std::vector<float> f;
    for (double d : llama3_divisors(rope)) f.push_back(float(d));
    g.add_tensor({"rope_freqs.weight", DType::F32, {int64_t(f.size())},
                  [f](int64_t b, int64_t n, void* dst) {
                    std::memcpy(dst, f.data() + b, size_t(n) * 4);
                  }});
  }
}

}  // namespace arbiter
