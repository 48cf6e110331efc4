// load_model: a GGUF file or an HF directory -> Model (config, weight views into the mapped
// files, tokenizer, provenance). Weights are never copied. Every tensor the architecture
// needs is looked up by name and its shape checked against the config; a tensor in the file
// that the architecture does not use is an error too (an ignored bias or extra norm would
// silently compute a different model).
//
// Parameter count rule (Model::n_params): the sum of element counts over the distinct
// tensors the model reads, where "distinct" means distinct storage. A matrix stored once and
// used as both embedding and output (HF tie_word_embeddings, GGUF without output.weight)
// counts once; a matrix stored twice counts twice even when the copies are equal (e.g.
// stories260K.gguf stores output.weight as a copy of token_embd.weight: 292,800, while
// llama2.c counts 260,032 trainable parameters). Tensors the forward pass does not read
// (GGUF rope_freqs, HF rotary_emb.inv_freq buffers) are not parameters.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "core/error.h"
#include "io/gguf.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "io/sha256.h"
#include "model/model.h"
#include "model/validate.h"

namespace arbiter {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Looks tensors up by name, checks shapes, and remembers which names were consumed.
class Binder {
 public:
  using Lookup = std::function<const Tensor*(const std::string&)>;
  Binder(std::string path, Lookup lookup) : path_(std::move(path)), lookup_(std::move(lookup)) {}

  Tensor require(const std::string& name, const std::vector<int64_t>& shape) {
    const Tensor* t = lookup_(name);
    if (t == nullptr) throw Error("[loader] " + path_ + ": missing tensor '" + name + "' (expected shape " + shape_str(shape) + ")");
    return check(name, *t, shape);
  }
  Tensor optional(const std::string& name, const std::vector<int64_t>& shape) {
    const Tensor* t = lookup_(name);
    return t == nullptr ? Tensor{} : check(name, *t, shape);
  }
  bool has(const std::string& name) const { return lookup_(name) != nullptr; }
  void mark_used(const std::string& name) { used_.insert(name); }
  const std::set<std::string>& used() const { return used_; }

 private:
  Tensor check(const std::string& name, const Tensor& t, const std::vector<int64_t>& shape) {
    if (t.shape != shape)
      throw Error("[loader] " + path_ + ": tensor '" + name + "' has shape " + shape_str(t.shape) + " (expected " +
                  shape_str(shape) + ")");
    used_.insert(name);
    used_.insert(t.name);  // the stored name, when `name` reached it through an alias
    Tensor out = t;
    out.name = name;
    return out;
  }
  std::string path_;
  Lookup lookup_;
  std::set<std::string> used_;
};

void refuse_unused(const std::string& path, const std::vector<std::string>& all, const std::set<std::string>& used,
                   const std::function<bool(const std::string&)>& ignorable) {
  for (const std::string& n : all)
    if (!used.count(n) && !ignorable(n))
      throw Error("[loader] " + path + ": tensor '" + n + "' is not used by this architecture (refusing to ignore it)");
}

// Distinct-storage element count (see the rule at the top of the file).
int64_t count_params(const Weights& w) {
  int64_t n = 0;
  for_each_distinct_tensor(w, [&](const Tensor& t) { n += t.numel(); });
  return n;
}

// Shapes every loader checks, from the config: [out, in] for matrices.
void bind_layers(const ModelConfig& c, Binder& b, Weights& w,
                 const std::function<std::string(int, const char*)>& name) {
  const int64_t D = c.d_model, F = c.d_ff, Dh = c.head_dim;
  const int64_t Hq = int64_t(c.n_head) * Dh, Hk = int64_t(c.n_head_kv) * Dh;
  w.layers.resize(c.n_layer);
  for (int l = 0; l < c.n_layer; ++l) {
    LayerWeights& L = w.layers[l];
    L.attn_norm = b.require(name(l, "attn_norm"), {D});
    L.wq = b.require(name(l, "wq"), {Hq, D});
    L.wk = b.require(name(l, "wk"), {Hk, D});
    L.wv = b.require(name(l, "wv"), {Hk, D});
    L.wo = b.require(name(l, "wo"), {D, Hq});
    if (c.qkv_bias) {
      L.bq = b.require(name(l, "bq"), {Hq});
      L.bk = b.require(name(l, "bk"), {Hk});
      L.bv = b.require(name(l, "bv"), {Hk});
    }
    if (c.qk_norm) {
      L.q_norm = b.require(name(l, "q_norm"), {Dh});
      L.k_norm = b.require(name(l, "k_norm"), {Dh});
    }
    L.ffn_norm = b.require(name(l, "ffn_norm"), {D});
    L.w_gate = b.require(name(l, "w_gate"), {F, D});
    L.w_up = b.require(name(l, "w_up"), {F, D});
    L.w_down = b.require(name(l, "w_down"), {D, F});
  }
}

std::string hash_files(const std::vector<std::shared_ptr<MappedFile>>& files) {
  Sha256 h;
  for (const auto& f : files) h.update(f->data(), f->size());
  return h.hex_digest();
}

// ---------------------------------------------------------------------------------------
// GGUF

int gguf_pos_int(const GgufFile& g, const std::string& key, int64_t dflt = -1) {
  int64_t v = dflt >= 0 ? g.get_int(key, dflt) : g.get_int(key);
  if (v <= 0 || v > std::numeric_limits<int>::max())
    throw Error("[loader] " + g.path() + ": '" + key + "' is " + std::to_string(v) + " (expected a positive int)");
  return int(v);
}

// llama.cpp stores Llama-3.1-style RoPE scaling as a tensor of per-frequency divisors
// (rope_freqs.weight, [Dh/2]) instead of metadata. We recover the llama3 parameters and
// check the whole tensor against transformers' _compute_llama3_parameters formula, so the
// RoPE op can recompute it; anything else is refused.
RopeScaling rope_scaling_from_freqs(const GgufFile& g, const Tensor& t, const ModelConfig& c,
                                    const std::string& arch) {
  const std::string& path = g.path();
  if (t.dtype != DType::F32 || t.shape != std::vector<int64_t>{c.head_dim / 2})
    throw Error("[loader] " + path + ": rope_freqs.weight is " + dtype_name(t.dtype) + " " + shape_str(t.shape) +
                " (expected f32 [" + std::to_string(c.head_dim / 2) + "])");
  std::vector<float> f(size_t(c.head_dim / 2));
  std::memcpy(f.data(), t.data, f.size() * sizeof(float));
  RopeScaling s;
  s.kind = RopeScaling::Kind::Llama3;
  s.factor = *std::max_element(f.begin(), f.end());
  s.low_freq_factor = 1.0;  // Llama 3.1/3.2 values; GGUF does not record them
  s.high_freq_factor = 4.0;
  s.original_max_pos = g.get_int(arch + ".rope.scaling.original_context_length", 8192);
  const double lo_wl = double(s.original_max_pos) / s.low_freq_factor;
  const double hi_wl = double(s.original_max_pos) / s.high_freq_factor;
  for (size_t i = 0; i < f.size(); ++i) {
    double inv_freq = std::pow(c.rope_theta, -2.0 * double(i) / c.head_dim);
    double wl = 2 * 3.14159265358979323846 / inv_freq;
    double want;
    if (wl < hi_wl) want = 1.0;
    else if (wl > lo_wl) want = s.factor;
    else {
      double smooth = (double(s.original_max_pos) / wl - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      want = 1.0 / ((1 - smooth) / s.factor + smooth);
    }
    if (std::fabs(f[i] - want) > 1e-4 * want)
      throw Error(strformat("[loader] %s: rope_freqs.weight[%zu] = %g does not match llama3 RoPE scaling "
                            "(factor %g, low 1, high 4, original context %lld) which gives %g; unsupported",
                            path.c_str(), i, f[i], s.factor, (long long)s.original_max_pos, want));
  }
  return s;
}

std::unique_ptr<Model> load_gguf(const std::string& path) {
  GgufFile g(path);
  auto m = std::make_unique<Model>();
  m->path = path;
  m->format = "gguf";
  ModelConfig& c = m->config;
  const std::string arch = g.get_string("general.architecture");
  if (arch != "llama" && arch != "mistral" && arch != "qwen2" && arch != "qwen3")
    throw Error("[loader] " + path + ": unsupported architecture '" + arch + "' (supported: " + kSupportedArchs + ")");
  c.arch = arch;
  const std::string p = arch + ".";
  c.d_model = gguf_pos_int(g, p + "embedding_length");
  c.n_layer = gguf_pos_int(g, p + "block_count");
  c.n_head = gguf_pos_int(g, p + "attention.head_count");
  c.n_head_kv = gguf_pos_int(g, p + "attention.head_count_kv", c.n_head);
  c.d_ff = gguf_pos_int(g, p + "feed_forward_length");
  c.max_pos = gguf_pos_int(g, p + "context_length");
  if (c.n_head % c.n_head_kv != 0)
    throw Error(strformat("[loader] %s: head_count %d is not a multiple of head_count_kv %d", path.c_str(), c.n_head,
                          c.n_head_kv));
  if (!g.has(p + "attention.key_length") && c.d_model % c.n_head != 0)
    throw Error(strformat("[loader] %s: embedding_length %d is not a multiple of head_count %d", path.c_str(),
                          c.d_model, c.n_head));
  c.head_dim = gguf_pos_int(g, p + "attention.key_length", c.d_model / c.n_head);
  if (gguf_pos_int(g, p + "attention.value_length", c.head_dim) != c.head_dim)
    throw Error("[loader] " + path + ": attention.value_length differs from key_length (unsupported)");
  if (gguf_pos_int(g, p + "rope.dimension_count", c.head_dim) != c.head_dim)
    throw Error("[loader] " + path + ": rope.dimension_count differs from the head size (partial RoPE unsupported)");
  c.norm_eps = g.get_float(p + "attention.layer_norm_rms_epsilon", 1e-5);
  c.rope_theta = g.get_float(p + "rope.freq_base", 10000.0);
  if (!(c.norm_eps > 0) || !(c.rope_theta > 0))
    throw Error("[loader] " + path + ": layer_norm_rms_epsilon and rope.freq_base must be positive");
  if (g.has(p + "attention.sliding_window")) c.sliding_window = gguf_pos_int(g, p + "attention.sliding_window");
  // llama.cpp's converters permute Q/K rows of llama-family models so that its "normal"
  // RoPE rotates adjacent pairs; qwen2/qwen3 use NEOX RoPE on unpermuted rows.
  c.rope_layout = (arch == "llama" || arch == "mistral") ? RopeLayout::Adjacent : RopeLayout::Half;

  // RoPE scaling: rope.scaling.type / factor (or the older rope.scale_linear), or llama3
  // factors stored as the rope_freqs tensor.
  std::string scaling = g.get_string(p + "rope.scaling.type", "none");
  if (scaling == "linear") {
    c.rope_scaling.kind = RopeScaling::Kind::Linear;
    c.rope_scaling.factor = g.get_float(p + "rope.scaling.factor");
  } else if (scaling != "none") {
    throw Error("[loader] " + path + ": rope.scaling.type '" + scaling + "' is not supported (supported: none, linear)");
  } else if (g.has(p + "rope.scale_linear") && g.get_float(p + "rope.scale_linear") != 1.0) {
    c.rope_scaling.kind = RopeScaling::Kind::Linear;
    c.rope_scaling.factor = g.get_float(p + "rope.scale_linear");
  }
  if (c.rope_scaling.kind == RopeScaling::Kind::Linear && !(c.rope_scaling.factor > 0))
    throw Error("[loader] " + path + ": rope scaling factor must be positive");
  if (const Tensor* rf = g.tensor("rope_freqs.weight")) {
    if (c.rope_scaling.kind != RopeScaling::Kind::None)
      throw Error("[loader] " + path + ": both rope.scaling metadata and rope_freqs.weight given");
    c.rope_scaling = rope_scaling_from_freqs(g, *rf, c, arch);
  }

  const Tensor* embd = g.tensor("token_embd.weight");
  if (embd == nullptr) throw Error("[loader] " + path + ": missing tensor 'token_embd.weight'");
  c.vocab = g.has("tokenizer.ggml.tokens") ? int(g.get_string_array("tokenizer.ggml.tokens").size())
                                           : int(embd->shape.empty() ? 0 : embd->shape[0]);
  if (c.vocab <= 0) throw Error("[loader] " + path + ": empty vocabulary");

  // Optional per-layer tensors decide the flags (checked for every layer by bind_layers).
  c.qkv_bias = g.tensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = g.tensor("blk.0.attn_q_norm.weight") != nullptr;
  if (arch == "qwen2" && !c.qkv_bias) throw Error("[loader] " + path + ": qwen2 model without blk.0.attn_q.bias");
  if (arch == "qwen3" && !c.qk_norm) throw Error("[loader] " + path + ": qwen3 model without blk.0.attn_q_norm.weight");

  validate_config(c, {path, true, g.tensors().size(), g.file()->size()});
  Binder b(path, [&g](const std::string& n) { return g.tensor(n); });
  Weights& w = m->weights;
  const int64_t D = c.d_model, V = c.vocab;
  w.embed = b.require("token_embd.weight", {V, D});
  w.out_norm = b.require("output_norm.weight", {D});
  if (g.tensor("output.weight") != nullptr) {
    w.lm_head = b.require("output.weight", {V, D});
    // Tied in spirit when the file stores the output matrix as an exact copy.
    c.tied_embeddings = w.lm_head.dtype == w.embed.dtype &&
                        std::memcmp(w.lm_head.data, w.embed.data, w.embed.nbytes()) == 0;
  } else {
    w.lm_head = w.embed;
    c.tied_embeddings = true;
  }
  static const std::map<std::string, std::string> kNames = {
      {"attn_norm", "attn_norm.weight"}, {"wq", "attn_q.weight"},     {"wk", "attn_k.weight"},
      {"wv", "attn_v.weight"},           {"wo", "attn_output.weight"}, {"bq", "attn_q.bias"},
      {"bk", "attn_k.bias"},             {"bv", "attn_v.bias"},        {"q_norm", "attn_q_norm.weight"},
      {"k_norm", "attn_k_norm.weight"},  {"ffn_norm", "ffn_norm.weight"}, {"w_gate", "ffn_gate.weight"},
      {"w_up", "ffn_up.weight"},         {"w_down", "ffn_down.weight"}};
  bind_layers(c, b, w, [](int l, const char* role) { return "blk." + std::to_string(l) + "." + kNames.at(role); });
  std::vector<std::string> all;
  for (const Tensor& t : g.tensors()) all.push_back(t.name);
  refuse_unused(path, all, b.used(), [](const std::string& n) { return n == "rope_freqs.weight"; });

  m->files.push_back(g.file());
  m->weights_sha256 = hash_files(m->files);
  m->n_params = count_params(w);
  m->weight_dtype = w.layers.empty() ? w.embed.dtype : w.layers[0].wq.dtype;
  m->tokenizer = tokenizer_from_gguf(g);
  // EOS, plus EOT when the vocabulary names a distinct end-of-turn token (chat models).
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    if (!g.has(key)) continue;
    int64_t id = g.get_int(key);
    if (id >= 0 && id < c.vocab && std::find(m->eos_ids.begin(), m->eos_ids.end(), int32_t(id)) == m->eos_ids.end())
      m->eos_ids.push_back(int32_t(id));
  }
  return m;
}

// ---------------------------------------------------------------------------------------
// HF directory

std::unique_ptr<Model> load_hf(const std::string& path) {
  auto m = std::make_unique<Model>();
  m->path = path;
  m->format = "hf";
  ModelConfig& c = m->config;
  c = load_hf_config(path);
  SafetensorsSet st = SafetensorsSet::open_dir(path);

  // A name the writer dropped as a duplicate of a shared tensor is recorded in
  // __metadata__ as {dropped: kept} (safetensors' torch save_model); follow that alias.
  auto lookup = [&st](const std::string& n) -> const Tensor* {
    if (const Tensor* t = st.tensor(n)) return t;
    auto it = st.metadata().find(n);
    return it == st.metadata().end() ? nullptr : st.tensor(it->second);
  };
  validate_config(c, {path + "/config.json", false, st.tensors().size(), st.total_bytes()});
  Binder b(path, lookup);
  Weights& w = m->weights;
  const int64_t D = c.d_model, V = c.vocab;
  if (!b.has("model.embed_tokens.weight") && c.tied_embeddings && st.tensor("lm_head.weight") != nullptr) {
    // Tied checkpoint that kept only lm_head.weight (no alias in __metadata__ either).
    w.embed = b.require("lm_head.weight", {V, D});
  } else {
    w.embed = b.require("model.embed_tokens.weight", {V, D});
  }
  w.out_norm = b.require("model.norm.weight", {D});
  if (c.tied_embeddings) {
    // transformers ties lm_head to the embedding, whatever a stored lm_head.weight holds.
    w.lm_head = w.embed;
    if (st.tensor("lm_head.weight")) b.mark_used("lm_head.weight");
  } else {
    w.lm_head = b.require("lm_head.weight", {V, D});
  }
  static const std::map<std::string, std::string> kNames = {
      {"attn_norm", "input_layernorm.weight"},  {"wq", "self_attn.q_proj.weight"},
      {"wk", "self_attn.k_proj.weight"},        {"wv", "self_attn.v_proj.weight"},
      {"wo", "self_attn.o_proj.weight"},        {"bq", "self_attn.q_proj.bias"},
      {"bk", "self_attn.k_proj.bias"},          {"bv", "self_attn.v_proj.bias"},
      {"q_norm", "self_attn.q_norm.weight"},    {"k_norm", "self_attn.k_norm.weight"},
      {"ffn_norm", "post_attention_layernorm.weight"}, {"w_gate", "mlp.gate_proj.weight"},
      {"w_up", "mlp.up_proj.weight"},           {"w_down", "mlp.down_proj.weight"}};
  bind_layers(c, b, w,
              [](int l, const char* role) { return "model.layers." + std::to_string(l) + "." + kNames.at(role); });
  std::vector<std::string> all;
  for (const auto& [n, t] : st.tensors()) all.push_back(n);
  refuse_unused(path, all, b.used(), [](const std::string& n) {
    // Old llama checkpoints saved the RoPE inverse-frequency buffer; it is recomputed.
    const std::string suffix = "rotary_emb.inv_freq";
    return n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
  });

  m->files = st.files();
  m->weights_sha256 = hash_files(m->files);
  m->n_params = count_params(w);
  m->weight_dtype = w.layers.empty() ? w.embed.dtype : w.layers[0].wq.dtype;
  m->tokenizer = tokenizer_from_hf_dir(path);
  m->eos_ids = load_hf_eos_ids(path);
  return m;
}

}  // namespace

std::unique_ptr<Model> load_model(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw Error("[loader] " + path + ": no such file or directory");
  if (fs::is_directory(st)) {
    if (!fs::exists(path + "/config.json"))
      throw Error("[loader] " + path + ": directory has no config.json (expected an HF model directory)");
    validate_hf_dir_files(path);
    return validated(load_hf(path));
  }
  bool gguf = path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
  if (!gguf) {
    MappedFile f(path);
    gguf = f.size() >= 4 && std::memcmp(f.data(), "GGUF", 4) == 0;
  }
  if (!gguf) throw Error("[loader] " + path + ": not a GGUF file (pass a .gguf file or an HF model directory)");
  return validated(load_gguf(path));
}

}  // namespace arbiter
