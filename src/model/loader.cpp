// load_model: a GGUF file or an HF directory -> Model (config, weight views into the mapped
// files, tokenizer, provenance). Weights are never copied, except MLX's packed tensors,
// which are repacked into blocks (model/mlx.h). The architecture family
// (model/arch.h) parses the config and lists every tensor its forward reads; each is looked
// up by its name in the file's format and its shape checked. A tensor in the file that the
// architecture does not use is an error too (an ignored bias or extra norm would silently
// compute a different model).
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
#include <set>

#include "core/error.h"
#include "io/gguf.h"
#include "io/json_config.h"
#include "io/safetensors.h"
#include "io/sha256.h"
#include "model/mlx.h"
#include "model/model.h"
#include "model/validate.h"

namespace arbiter {

namespace {

enum class Format { Hf, Gguf };

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
    if (t == nullptr)
      throw Error("[loader] " + path_ + ": missing tensor '" + name + "' (expected shape " +
                  shape_str(shape) + ")");
    if (t->shape != shape)
      throw Error("[loader] " + path_ + ": tensor '" + name + "' has shape " + shape_str(t->shape) +
                  " (expected " + shape_str(shape) + ")");
    used_.insert(name);
    used_.insert(t->name);  // the stored name, when `name` reached it through an alias
    Tensor out = *t;
    out.name = name;
    return out;
  }
  /// One expert's rows of a 3-D stack [E, R, C] (StackSlice), as a view of its storage.
  Tensor require_slice(const StackSlice& st, const std::vector<int64_t>& shape) {
    ARB_ASSERT(shape.size() == 2 && st.row0 + shape[0] <= st.rows &&
               (st.experts == 0 ? st.expert == 0 : st.expert < st.experts));
    // experts == 0: a 2-D [R, C] matrix whose rows hold several (Granite's shared input_linear).
    const Tensor t = require(st.name, st.experts > 0
                                          ? std::vector<int64_t>{st.experts, st.rows, shape[1]}
                                          : std::vector<int64_t>{st.rows, shape[1]});
    Tensor out;
    out.name = st.name + (st.experts > 0 ? "[" + std::to_string(st.expert) + "]" : "");
    if (st.row0 > 0 || shape[0] < st.rows)
      out.name += "[" + std::to_string(st.row0) + ":" + std::to_string(st.row0 + shape[0]) + "]";
    out.dtype = t.dtype;
    out.shape = shape;
    out.data = t.row(st.expert * st.rows + st.row0);
    return out;
  }
  bool has(const std::string& name) const { return lookup_(name) != nullptr; }
  const std::string& path() const { return path_; }
  void mark_used(const std::string& name) {
    used_.insert(name);
    if (const Tensor* t = lookup_(name)) used_.insert(t->name);  // stored under an alias
  }

  /// Refuses a stored tensor nothing consumed, unless ignorable (recomputed RoPE tables).
  void refuse_unused(const std::vector<std::string>& all,
                     const std::function<bool(const std::string&)>& ignorable) const {
    for (const std::string& n : all)
      if (!used_.count(n) && !ignorable(n))
        throw Error("[loader] " + path_ + ": tensor '" + n +
                    "' is not used by this architecture (refusing to ignore it)");
  }

 private:
  std::string path_;
  Lookup lookup_;
  std::set<std::string> used_;
};

// A GGUF tensor stored in llama.cpp's own shape or as a function of the HF values, as the
// spec's view: the same elements under the HF shape, and inverted values in f64 (derived).
Tensor gguf_form(const std::string& path, Tensor t, const TensorSpec& s,
                 std::vector<std::vector<double>>& derived) {
  t.shape = s.shape;
  if (s.gguf_value == TensorSpec::GgufValue::Same) return t;
  // NegExp: the file holds A = -exp(A_log) (llama.cpp's Mamba2 converter); A_log = log(-A).
  std::vector<double>& v = derived.emplace_back(size_t(t.numel()));
  row_to_f64(t.dtype, t.data, v.data(), t.numel());
  for (double& x : v) {
    if (!(x < 0))
      throw Error("[loader] " + path + ": tensor '" + t.name + "' holds " + std::to_string(x) +
                  " (expected A = -exp(A_log) < 0)");
    x = std::log(-x);
  }
  t.dtype = DType::F64;
  t.data = v.data();
  return t;
}

// Binds every tensor of the architecture's list. A spec with tie_to (lm_head) may alias the
// global it names: HF ties when tie_word_embeddings says so (transformers ties lm_head to the
// embedding whatever a stored lm_head.weight holds); GGUF ties when the file stores no such
// tensor, and calls a stored exact copy tied too.
void bind(const Arch& arch, ModelConfig& c, Format fmt, Binder& b, Weights& w,
          std::vector<std::vector<double>>& derived) {
  w.specs = arch.tensors(c);
  w.resize(arch.global_slots(), c.n_layer, arch.layer_slots_for(c));
  auto name_of = [&](const TensorSpec& s) { return fmt == Format::Hf ? s.hf : s.gguf; };
  auto slot = [&](const TensorSpec& s) -> Tensor& {
    return s.layer < 0 ? w.global(s.slot) : w.layer(s.layer, s.slot);
  };
  auto tied_to_me = [&](const TensorSpec& target) -> const TensorSpec* {
    for (const TensorSpec& s : w.specs)
      if (s.tie_to && s.tie_to == target.role && s.layer == target.layer) return &s;
    return nullptr;
  };
  for (const TensorSpec& s : w.specs) {
    const std::string name = name_of(s);
    if (fmt == Format::Gguf && !s.gguf_stack.empty()) {
      slot(s) = b.require_slice(s.gguf_stack, s.shape);
      continue;
    }
    // HF: the per-expert tensor, else the stack (when both are absent, the error names the
    // per-expert one, or the stack where the family stores only stacks).
    if (fmt == Format::Hf && !s.hf_stack.empty() &&
        (s.hf.empty() || (!b.has(s.hf) && b.has(s.hf_stack.name)))) {
      slot(s) = b.require_slice(s.hf_stack, s.shape);
      continue;
    }
    if (fmt == Format::Gguf &&
        (!s.gguf_shape.empty() || s.gguf_value != TensorSpec::GgufValue::Same)) {
      const Tensor t = b.require(name, s.gguf_shape.empty() ? s.shape : s.gguf_shape);
      slot(s) = gguf_form(b.path(), t, s, derived);
      continue;
    }
    if (!s.tie_to) {
      // A tied HF checkpoint may keep only lm_head.weight (no alias in __metadata__ either).
      const TensorSpec* tier = tied_to_me(s);
      if (fmt == Format::Hf && c.tied_embeddings && tier && !b.has(name) && b.has(tier->hf))
        slot(s) = b.require(tier->hf, s.shape);
      else
        slot(s) = b.require(name, s.shape);
      continue;
    }
    const auto target = std::find_if(w.specs.begin(), w.specs.end(), [&](const TensorSpec& t) {
      return !t.tie_to && t.role == s.tie_to && t.layer < 0;
    });
    ARB_ASSERT(target != w.specs.end());
    const Tensor& to = slot(*target);
    if (fmt == Format::Hf) {
      if (c.tied_embeddings) {
        slot(s) = to;
        if (b.has(name)) b.mark_used(name);
      } else {
        slot(s) = b.require(name, s.shape);
      }
    } else if (b.has(name)) {
      slot(s) = b.require(name, s.shape);
      const Tensor& t = slot(s);
      c.tied_embeddings = t.dtype == to.dtype && std::memcmp(t.data, to.data, to.nbytes()) == 0;
    } else {
      slot(s) = to;
      c.tied_embeddings = true;
    }
  }
}

void finish(Model& m) {
  Sha256 h;
  for (const auto& f : m.files) h.update(f->data(), f->size());
  m.weights_sha256 = h.hex_digest();
  m.weights.for_each_distinct([&](const TensorSpec&, const Tensor& t) { m.n_params += t.numel(); });
  // The dtype of the large matrices: the first per-layer matrix (the embedding without layers).
  m.weight_dtype = m.weights.global(0).dtype;
  for (const TensorSpec& s : m.weights.specs)
    if (s.layer >= 0 && s.kind == TensorKind::Matrix) {
      m.weight_dtype = m.weights.at(s).dtype;
      break;
    }
}

// ---------------------------------------------------------------------------------------
// GGUF

std::unique_ptr<Model> load_gguf(const std::string& path) {
  GgufFile g(path);
  auto m = std::make_unique<Model>();
  m->path = path;
  m->format = "gguf";
  ModelConfig& c = m->config;
  c.arch = g.get_string("general.architecture");
  for (const Arch* a : arch_registry())
    for (const std::string& n : a->gguf_names())
      if (n == c.arch) m->arch = a;
  if (!m->arch) {
    // The GGUF names only: a family may read HF checkpoints alone.
    std::string names;
    for (const Arch* a : arch_registry())
      for (const std::string& n : a->gguf_names()) names += (names.empty() ? "" : ", ") + n;
    throw Error("[loader] " + path + ": unsupported architecture '" + c.arch +
                "' (supported in GGUF: " + names + ")");
  }
  const Tensor* embd = g.tensor("token_embd.weight");
  if (embd == nullptr) throw Error("[loader] " + path + ": missing tensor 'token_embd.weight'");
  c.vocab = g.has("tokenizer.ggml.tokens")
                ? int(g.get_string_array("tokenizer.ggml.tokens").size())
                : int(embd->shape.empty() ? 0 : embd->shape[0]);
  if (c.vocab <= 0) throw Error("[loader] " + path + ": empty vocabulary");
  m->arch->parse_gguf(g, c);

  validate_config(c, {path, true, g.tensors().size()});
  Binder b(path, [&g](const std::string& n) { return g.tensor(n); });
  bind(*m->arch, c, Format::Gguf, b, m->weights, m->derived);
  std::vector<std::string> all;
  for (const Tensor& t : g.tensors()) all.push_back(t.name);
  b.refuse_unused(all, [](const std::string& n) { return n == "rope_freqs.weight"; });

  m->files.push_back(g.file());
  finish(*m);
  m->tokenizer = tokenizer_from_gguf(g);
  // EOS, plus EOT when the vocabulary names a distinct end-of-turn token (chat models).
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    if (!g.has(key)) continue;
    int64_t id = g.get_int(key);
    if (id >= 0 && id < c.vocab &&
        std::find(m->eos_ids.begin(), m->eos_ids.end(), int32_t(id)) == m->eos_ids.end())
      m->eos_ids.push_back(int32_t(id));
  }
  return m;
}

// ---------------------------------------------------------------------------------------
// HF directory

// The family and config name of architectures[0] (or of model_type when that is absent).
const Arch& hf_arch(const JsonConfig& j, std::string& config_name) {
  const std::string supported = " (supported: " + supported_archs() + ")";
  if (j.has("architectures")) {
    const nlohmann::json& a = j.raw("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string())
      j.fail("'architectures' is not a non-empty list of strings");
    const std::string cls = a[0].get<std::string>();
    for (const Arch* arch : arch_registry())
      for (const auto& [c, name] : arch->hf_classes())
        if (c == cls) {
          config_name = name;
          return *arch;
        }
    j.fail("unsupported architecture '" + cls + "'" + supported);
  }
  if (j.has("model_type")) {
    const std::string mt = j.str("model_type");
    for (const Arch* arch : arch_registry())
      for (const auto& [c, name] : arch->hf_classes())
        if (name == mt) {
          config_name = name;
          return *arch;
        }
    j.fail("unsupported model_type '" + mt + "'" + supported);
  }
  j.fail("neither 'architectures' nor 'model_type' given" + supported);
}

ModelConfig parse_hf(const std::string& text, const std::string& path, const Arch** arch) {
  const JsonConfig j(text, path);
  ModelConfig c;
  try {
    const Arch& a = hf_arch(j, c.arch);
    a.parse_hf(j, c);
    if (arch) *arch = &a;
  } catch (const nlohmann::json::exception& e) {
    j.fail(std::string("malformed config (") + e.what() + ")");
  }
  return c;
}

std::unique_ptr<Model> load_hf(const std::string& path) {
  auto m = std::make_unique<Model>();
  m->path = path;
  m->format = "hf";
  const std::string cfg_path = path + "/config.json";
  const std::string cfg_text = read_config_text(cfg_path);
  m->config = parse_hf(cfg_text, cfg_path, &m->arch);
  auto mlx = std::make_shared<MlxQuant>(JsonConfig(cfg_text, cfg_path));
  SafetensorsSet st = SafetensorsSet::open_dir(path);

  // A name the writer dropped as a duplicate of a shared tensor is recorded in
  // __metadata__ as {dropped: kept} (safetensors' torch save_model); follow that alias.
  // The family may store a tensor under a wrapper's prefix (hf_stored_names). An MLX-packed
  // weight is read as its repacked blocks.
  auto lookup = [&st, &m, &mlx](const std::string& name) -> const Tensor* {
    for (const std::string& n : m->arch->hf_stored_names(m->config, name)) {
      if (const Tensor* t = mlx->tensor(st, n)) return t;
      if (const Tensor* t = st.tensor(n)) return t;
      auto it = st.metadata().find(n);
      if (it != st.metadata().end()) return st.tensor(it->second);
    }
    return nullptr;
  };
  // An integer tensor is only ever an MLX weight's words or fp scales.
  for (const auto& [n, t] : st.int_tensors())
    if (!mlx->enabled() && !m->arch->hf_ignored(m->config, n))
      throw Error("[loader] " + path + ": tensor '" + n + "' has dtype " + st_int_name(t.type) +
                  " and config.json has no MLX 'quantization' block");
  validate_config(m->config, {cfg_path, false, st.tensors().size() + st.int_tensors().size()});
  Binder b(path, lookup);
  bind(*m->arch, m->config, Format::Hf, b, m->weights, m->derived);
  std::vector<std::string> all;
  for (const auto& [n, t] : st.tensors()) all.push_back(n);
  for (const auto& [n, t] : st.int_tensors()) all.push_back(n);
  b.refuse_unused(all, [&m, &mlx](const std::string& n) {
    if (m->arch->hf_ignored(m->config, n) || mlx->consumed(n)) return true;
    // Old llama checkpoints saved the RoPE inverse-frequency buffer; it is recomputed.
    const std::string suffix = "rotary_emb.inv_freq";
    return n.size() >= suffix.size() &&
           n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
  });

  m->files = st.files();
  m->repacked = mlx;
  finish(*m);
  m->tokenizer = tokenizer_from_hf_dir(path);
  m->eos_ids = load_hf_eos_ids(path);
  return m;
}

}  // namespace

std::unique_ptr<Model> load_hf_in_memory(HfInMemory src) {
  auto m = std::make_unique<Model>();
  m->path = src.path;
  m->format = src.format;
  const std::string cfg_path = src.path + "/config.json";
  m->config = parse_hf(src.config_text, cfg_path, &m->arch);
  validate_config(m->config, {cfg_path, false, src.tensors.size()});
  Binder b(src.path, [&src](const std::string& name) -> const Tensor* {
    auto it = src.tensors.find(name);
    return it == src.tensors.end() ? nullptr : &it->second;
  });
  bind(*m->arch, m->config, Format::Hf, b, m->weights, m->derived);
  std::vector<std::string> all;
  for (const auto& [n, t] : src.tensors) all.push_back(n);
  b.refuse_unused(all, [](const std::string&) { return false; });
  m->repacked = std::move(src.storage);
  finish(*m);
  m->weights_sha256 = src.weights_id;  // no file to hash
  m->tokenizer = tokenizer_from_hf_json(src.tokenizer_json, src.path + "/tokenizer.json",
                                        src.tokenizer_config_json,
                                        src.path + "/tokenizer_config.json");
  m->eos_ids = std::move(src.eos_ids);
  return validated(std::move(m));
}

ModelConfig parse_hf_config(const std::string& json_text, const std::string& path) {
  return parse_hf(json_text, path, nullptr);
}

ModelConfig load_hf_config(const std::string& dir) {
  const std::string p = dir + "/config.json";
  return parse_hf_config(read_config_text(p), p);
}

std::unique_ptr<Model> load_model(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw Error("[loader] " + path + ": no such file or directory");
  if (fs::is_directory(st)) {
    if (!fs::exists(path + "/config.json"))
      throw Error("[loader] " + path + ": directory has no config.json (expected an HF model directory)");
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
