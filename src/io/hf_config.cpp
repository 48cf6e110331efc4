// config.json -> ModelConfig. Defaults are the ones transformers' LlamaConfig, MistralConfig,
// Qwen2Config and Qwen3Config apply when a key is absent (noted per key below); the
// dimensions themselves are required, since a guessed dimension would only surface later
// as a confusing shape error.
#include "io/hf_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace arbiter {

namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("[hf] " + path + ": " + what);
}

json parse_json(const std::string& text, const std::string& path) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(path, std::string("not valid JSON (") + e.what() + ")");
  }
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("[hf] " + path + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool present(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

int64_t get_int(const json& j, const char* key, const std::string& path) {
  const json& v = j[key];
  if (v.is_number_integer()) return v.get<int64_t>();
  // Some writers emit 128.0 for an integer field; accept exact integers only.
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return int64_t(d);
  }
  fail(path, std::string("'") + key + "' is not an integer (got " + v.dump() + ")");
}

int positive_int(const json& j, const char* key, const std::string& path) {
  if (!present(j, key)) fail(path, std::string("missing required key '") + key + "'");
  int64_t v = get_int(j, key, path);
  if (v <= 0 || v > std::numeric_limits<int>::max())
    fail(path, std::string("'") + key + "' is " + std::to_string(v) + " (expected a positive int)");
  return int(v);
}

int positive_int(const json& j, const char* key, int dflt, const std::string& path) {
  return present(j, key) ? positive_int(j, key, path) : dflt;
}

double get_number(const json& j, const char* key, double dflt, const std::string& path) {
  if (!present(j, key)) return dflt;
  const json& v = j[key];
  if (!v.is_number()) fail(path, std::string("'") + key + "' is not a number (got " + v.dump() + ")");
  double d = v.get<double>();
  if (!std::isfinite(d)) fail(path, std::string("'") + key + "' is not finite");
  return d;
}

bool get_bool(const json& j, const char* key, bool dflt, const std::string& path) {
  if (!present(j, key)) return dflt;
  if (!j[key].is_boolean()) fail(path, std::string("'") + key + "' is not a bool (got " + j[key].dump() + ")");
  return j[key].get<bool>();
}

// Maps architectures[0] (or model_type when architectures is absent) to our arch name.
std::string parse_arch(const json& j, const std::string& path) {
  static const std::pair<const char*, const char*> kClasses[] = {
      {"LlamaForCausalLM", "llama"}, {"MistralForCausalLM", "mistral"},
      {"Qwen2ForCausalLM", "qwen2"}, {"Qwen3ForCausalLM", "qwen3"}};
  if (present(j, "architectures")) {
    const json& a = j["architectures"];
    if (!a.is_array() || a.empty() || !a[0].is_string())
      fail(path, "'architectures' is not a non-empty list of strings");
    std::string cls = a[0].get<std::string>();
    for (auto& [c, arch] : kClasses)
      if (cls == c) return arch;
    fail(path, "unsupported architecture '" + cls + "' (supported: " + kSupportedArchs + ")");
  }
  if (present(j, "model_type")) {
    if (!j["model_type"].is_string()) fail(path, "'model_type' is not a string");
    std::string mt = j["model_type"].get<std::string>();
    for (auto& [c, arch] : kClasses)
      if (mt == arch) return arch;
    fail(path, "unsupported model_type '" + mt + "' (supported: " + kSupportedArchs + ")");
  }
  fail(path, std::string("neither 'architectures' nor 'model_type' given (supported: ") + kSupportedArchs + ")");
}

// One RoPE description: the older rope_scaling dict, or v5's rope_parameters (which also
// carries rope_theta). `type` or `rope_type` names the kind.
void parse_rope_dict(const json& r, const char* what, ModelConfig& c, const std::string& path) {
  if (!r.is_object()) fail(path, std::string("'") + what + "' is not an object");
  std::string type = "default";
  for (const char* k : {"rope_type", "type"})
    if (present(r, k)) {
      if (!r[k].is_string()) fail(path, std::string(what) + "." + k + " is not a string");
      type = r[k].get<std::string>();
      break;
    }
  const std::string w = std::string(what) + ".";
  if (present(r, "rope_theta")) c.rope_theta = get_number(r, "rope_theta", c.rope_theta, path);
  auto need = [&](const char* k) {
    if (!present(r, k)) fail(path, w + k + " missing for rope type '" + type + "'");
    return get_number(r, k, 0, path);
  };
  if (type == "default") {
    c.rope_scaling = RopeScaling{};
  } else if (type == "linear") {
    c.rope_scaling.kind = RopeScaling::Kind::Linear;
    c.rope_scaling.factor = need("factor");
  } else if (type == "llama3") {
    // transformers' _compute_llama3_parameters reads all four keys (no defaults).
    c.rope_scaling.kind = RopeScaling::Kind::Llama3;
    c.rope_scaling.factor = need("factor");
    c.rope_scaling.low_freq_factor = need("low_freq_factor");
    c.rope_scaling.high_freq_factor = need("high_freq_factor");
    double orig = need("original_max_position_embeddings");
    if (orig <= 0 || orig != std::floor(orig)) fail(path, w + "original_max_position_embeddings is not a positive integer");
    c.rope_scaling.original_max_pos = int64_t(orig);
    if (!(c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor))
      fail(path, w + "high_freq_factor must exceed low_freq_factor");
  } else {
    fail(path, w + "rope type '" + type + "' is not supported (supported: default, linear, llama3)");
  }
  if (c.rope_scaling.kind != RopeScaling::Kind::None && !(c.rope_scaling.factor > 0))
    fail(path, w + "factor must be positive");
}

}  // namespace

ModelConfig parse_hf_config(const std::string& json_text, const std::string& path) {
  json j = parse_json(json_text, path);
  if (!j.is_object()) fail(path, "not a JSON object");
  ModelConfig c;
  try {
    c.arch = parse_arch(j, path);
    c.d_model = positive_int(j, "hidden_size", path);
    c.n_layer = positive_int(j, "num_hidden_layers", path);
    c.n_head = positive_int(j, "num_attention_heads", path);
    c.n_head_kv = positive_int(j, "num_key_value_heads", c.n_head, path);  // default: MHA
    c.d_ff = positive_int(j, "intermediate_size", path);
    c.vocab = positive_int(j, "vocab_size", path);
    if (c.n_head % c.n_head_kv != 0)
      fail(path, strformat("num_attention_heads %d is not a multiple of num_key_value_heads %d", c.n_head, c.n_head_kv));
    if (present(j, "head_dim")) {
      c.head_dim = positive_int(j, "head_dim", path);
    } else {
      if (c.d_model % c.n_head != 0)
        fail(path, strformat("hidden_size %d is not a multiple of num_attention_heads %d", c.d_model, c.n_head));
      c.head_dim = c.d_model / c.n_head;
    }
    // transformers defaults: llama 2048, mistral 4096*32, qwen2/qwen3 32768.
    int max_pos_default = c.arch == "llama" ? 2048 : c.arch == "mistral" ? 4096 * 32 : 32768;
    c.max_pos = positive_int(j, "max_position_embeddings", max_pos_default, path);
    c.norm_eps = get_number(j, "rms_norm_eps", 1e-6, path);  // all four default to 1e-6
    if (!(c.norm_eps > 0)) fail(path, "rms_norm_eps must be positive");
    c.tied_embeddings = get_bool(j, "tie_word_embeddings", false, path);
    c.rope_layout = RopeLayout::Half;

    if (present(j, "hidden_act")) {
      if (!j["hidden_act"].is_string() || j["hidden_act"].get<std::string>() != "silu")
        fail(path, "hidden_act " + j["hidden_act"].dump() + " is not supported (expected \"silu\")");
    }
    if (get_bool(j, "mlp_bias", false, path)) fail(path, "mlp_bias=true is not supported");
    // Qwen2 always has q/k/v biases (and no o_proj bias); llama and qwen3 put a bias on
    // q/k/v AND o_proj when attention_bias is true: the loader refuses the o_proj bias
    // tensor by name. Mistral has no biases.
    if (c.arch == "qwen2") c.qkv_bias = true;
    else if (c.arch != "mistral") c.qkv_bias = get_bool(j, "attention_bias", false, path);
    c.qk_norm = c.arch == "qwen3";

    // Sliding window. Mistral: sliding_window (null -> full attention). Qwen2/Qwen3: only
    // when use_sliding_window, and then on layers >= max_window_layers; one window for
    // every layer is all we model, so a per-layer mix is refused.
    if (c.arch == "mistral" && present(j, "sliding_window")) {
      c.sliding_window = positive_int(j, "sliding_window", path);
    } else if ((c.arch == "qwen2" || c.arch == "qwen3") && present(j, "layer_types")) {
      // transformers v5 spells the per-layer choice out; it is the source of truth.
      const json& lt = j["layer_types"];
      if (!lt.is_array() || int(lt.size()) != c.n_layer)
        fail(path, "'layer_types' is not a list of num_hidden_layers entries");
      int n_sliding = 0;
      for (const json& t : lt) {
        if (!t.is_string()) fail(path, "'layer_types' entry " + t.dump() + " is not a string");
        std::string s = t.get<std::string>();
        if (s == "sliding_attention") ++n_sliding;
        else if (s != "full_attention") fail(path, "layer type '" + s + "' is not supported");
      }
      if (n_sliding == c.n_layer) c.sliding_window = positive_int(j, "sliding_window", path);
      else if (n_sliding > 0) fail(path, "a mix of sliding and full attention layers is not supported");
    } else if ((c.arch == "qwen2" || c.arch == "qwen3") && get_bool(j, "use_sliding_window", false, path) &&
               present(j, "sliding_window")) {
      int w = positive_int(j, "sliding_window", path);
      int first = present(j, "max_window_layers") ? int(get_int(j, "max_window_layers", path)) : 28;
      if (first <= 0) c.sliding_window = w;
      else if (first < c.n_layer)
        fail(path, strformat("sliding window on layers %d..%d only (max_window_layers) is not supported", first,
                             c.n_layer - 1));
    }

    // RoPE: rope_theta (default 10000 for all four) + rope_scaling, or rope_parameters.
    c.rope_theta = get_number(j, "rope_theta", 10000.0, path);
    if (present(j, "rope_scaling")) parse_rope_dict(j["rope_scaling"], "rope_scaling", c, path);
    if (present(j, "rope_parameters")) parse_rope_dict(j["rope_parameters"], "rope_parameters", c, path);
    if (!(c.rope_theta > 0)) fail(path, "rope_theta must be positive");
    if (present(j, "partial_rotary_factor") && get_number(j, "partial_rotary_factor", 1.0, path) != 1.0)
      fail(path, "partial_rotary_factor != 1 is not supported");
  } catch (const json::exception& e) {
    fail(path, std::string("malformed config (") + e.what() + ")");
  }
  return c;
}

ModelConfig load_hf_config(const std::string& dir) {
  std::string p = dir + "/config.json";
  return parse_hf_config(read_text(p), p);
}

std::vector<int32_t> parse_eos_ids(const std::string& json_text, const std::string& path) {
  json j = parse_json(json_text, path);
  std::vector<int32_t> out;
  if (!j.is_object() || !present(j, "eos_token_id")) return out;
  const json& v = j["eos_token_id"];
  auto one = [&](const json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > std::numeric_limits<int32_t>::max())
      fail(path, "eos_token_id entry " + x.dump() + " is not a token id");
    out.push_back(int32_t(x.get<int64_t>()));
  };
  if (v.is_array()) {
    for (const json& x : v) one(x);
  } else {
    one(v);
  }
  return out;
}

std::vector<int32_t> load_hf_eos_ids(const std::string& dir) {
  std::vector<int32_t> ids;
  for (const char* name : {"generation_config.json", "config.json"}) {
    std::string p = dir + "/" + name;
    if (!std::filesystem::exists(p)) continue;
    for (int32_t id : parse_eos_ids(read_text(p), p))
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

}  // namespace arbiter
