// Matrix spec: strict TOML reading (every key consumed or named as unknown), validation of
// devices, dtypes, shapes, arms and controls, and the list of traces that follows.
#include "verify/matrix/matrix_spec.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "io/file.h"
#include "engine/inject.h"
#include "engine/probe.h"

namespace arbiter::verify {

namespace {

const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date/time";
  }
}

// A TOML table being read: each get marks its key used; finish() names the first key nobody
// asked for. Messages are "[matrix] FILE:LINE: KEY: problem".
class Table {
 public:
  Table(const std::string& file, const toml::table& t, std::string prefix)
      : file_(file), t_(t), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail_at(const toml::source_region& src, const std::string& key,
                            const std::string& what) const {
    throw Error("[matrix] " + file_ + ":" + std::to_string(src.begin.line) + ": " + key + ": " +
                what);
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    const toml::node* n = t_.get(key);
    fail_at(n ? n->source() : t_.source(), full(key), what);
  }
  std::string full(const std::string& key) const {
    return prefix_.empty() ? key : prefix_ + "." + key;
  }

  const toml::node* node(const std::string& key, bool required) {
    used_.insert(key);
    const toml::node* n = t_.get(key);
    if (!n && required) fail_at(t_.source(), full(key), "missing (required)");
    return n;
  }
  template <class T>
  const T& typed(const toml::node& n, const std::string& key, const char* want) {
    const T* v = n.as<T>();
    if (!v) fail(key, std::string("expected ") + want + ", got " + type_name(n));
    return *v;
  }
  std::string str(const std::string& key, bool required, const std::string& dflt = "") {
    const toml::node* n = node(key, required);
    if (!n) return dflt;
    std::string v = typed<toml::value<std::string>>(*n, key, "a string").get();
    if (v.find_first_of("\t\n\r") != std::string::npos)
      fail(key, "must not contain a tab or a line break");
    return v;
  }
  int64_t integer(const std::string& key, int64_t dflt, int64_t lo, int64_t hi) {
    const toml::node* n = node(key, false);
    if (!n) return dflt;
    int64_t v = typed<toml::value<int64_t>>(*n, key, "an integer").get();
    if (v < lo || v > hi)
      fail(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                    std::to_string(v));
    return v;
  }
  bool boolean(const std::string& key, bool dflt) {
    const toml::node* n = node(key, false);
    return n ? typed<toml::value<bool>>(*n, key, "a boolean").get() : dflt;
  }
  double number(const toml::node& n, const std::string& key) {
    if (auto i = n.as_integer()) return double(i->get());
    return typed<toml::value<double>>(n, key, "a number").get();
  }
  std::vector<std::string> strings(const std::string& key, bool required) {
    const toml::node* n = node(key, required);
    std::vector<std::string> out;
    if (!n) return out;
    const auto& arr = typed<toml::array>(*n, key, "an array of strings");
    for (size_t i = 0; i < arr.size(); ++i) {
      const auto* s = arr[i].as_string();
      if (!s)
        fail_at(arr[i].source(), full(key) + "[" + std::to_string(i) + "]",
                std::string("expected a string, got ") + type_name(arr[i]));
      out.push_back(s->get());
    }
    if (required && out.empty()) fail(key, "must not be empty");
    return out;
  }
  const toml::table* table(const std::string& key, bool required) {
    const toml::node* n = node(key, required);
    return n ? &typed<toml::table>(*n, key, "a table") : nullptr;
  }
  void finish(const std::string& allowed) const {
    for (const auto& [k, v] : t_)
      if (!used_.count(std::string(k.str())))
        fail_at(v.source(), full(std::string(k.str())),
                "unknown key (allowed here: " + allowed + ")");
  }
  const toml::table& raw() const { return t_; }
  const std::string& file() const { return file_; }

 private:
  std::string file_;
  const toml::table& t_;
  std::string prefix_;
  std::set<std::string> used_;
};

bool valid_arm_name(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum((unsigned char)c) || c == '_' || c == '-';
  });
}

bool valid_env_name(const std::string& s) {
  return !s.empty() && !std::isdigit((unsigned char)s[0]) &&
         std::all_of(s.begin(), s.end(), [](char c) {
           return std::isupper((unsigned char)c) || std::isdigit((unsigned char)c) || c == '_';
         });
}

MatrixArm read_arm(Table& parent, const std::string& name, const toml::node& n) {
  const std::string key = "arms." + name;
  const auto* t = n.as_table();
  if (!t) parent.fail_at(n.source(), key, std::string("expected a table, got ") + type_name(n));
  if (!valid_arm_name(name))
    parent.fail_at(n.source(), key, "arm names may hold only letters, digits, '_' and '-'");
  Table a(parent.file(), *t, key);
  MatrixArm arm;
  arm.name = name;
  arm.endpoint = a.str("endpoint", false);
  if (!arm.endpoint.empty()) {
    if (arm.endpoint.rfind("http://", 0) != 0 && arm.endpoint.rfind("https://", 0) != 0)
      a.fail("endpoint", "expected http://HOST:PORT[/v1]");
    arm.api_model = a.str("model", true);
    arm.dtype = a.str("dtype", false);
    if (!arm.dtype.empty() && arm.dtype != "f64" && arm.dtype != "f32" && arm.dtype != "bf16" && arm.dtype != "f16")
      a.fail("dtype", "unknown dtype '" + arm.dtype + "' (expected f64, f32, bf16 or f16: the engine's compute)");
    arm.device = "api:" + arm.endpoint;
    arm.note = a.str("note", false);
    a.finish("endpoint, model, dtype, note (an endpoint arm has no device, threads, env, inject or mix)");
    return arm;
  }
  arm.device = a.str("device", true);
  const std::string& d = arm.device;
  bool cuda = d == "cuda" || d.rfind("cuda:", 0) == 0;
  if (d.rfind("cuda:", 0) == 0) {
    std::string idx = d.substr(5);
    if (idx.empty() || idx.size() > 3 || !std::all_of(idx.begin(), idx.end(), ::isdigit))
      a.fail("device", "bad device '" + d + "' (expected cuda:N)");
  }
  if (d != "ref" && d != "cpu" && !cuda)
    a.fail("device", "unknown device '" + d + "' (expected ref, cpu, cuda or cuda:N)");
  arm.dtype = a.str("dtype", false);
  if (!arm.dtype.empty()) {
    if (d == "ref" && arm.dtype != "f64")
      a.fail("dtype", "device ref computes in f64, not " + arm.dtype);
    if (d == "cpu" && arm.dtype != "f32")
      a.fail("dtype", "device cpu computes in f32, not " + arm.dtype);
    if (cuda && arm.dtype != "bf16" && arm.dtype != "f16" && arm.dtype != "f32")
      a.fail("dtype", "unknown cuda dtype '" + arm.dtype + "' (expected bf16, f16 or f32)");
  }
  arm.threads = int(a.integer("threads", 0, 0, 4096));
  if (arm.threads != 0 && d != "cpu") a.fail("threads", "only the cpu device takes threads");
  std::string inject = a.str("inject", false, "none");
  try {
    arm.inject = InjectSpec::parse(inject).text;
  } catch (const Error& e) {
    a.fail("inject", e.what());
  }
  std::string mix = a.str("mix", false);
  try {
    arm.mix = canonical_mix(mix);
  } catch (const Error& e) {
    a.fail("mix", e.what());
  }
  if (!arm.mix.empty() && !cuda) a.fail("mix", "per-family precision exists only on the cuda tier");
  if (const toml::table* env = a.table("env", false)) {
    for (const auto& [k, v] : *env) {
      std::string name(k.str());
      std::string ek = key + ".env." + name;
      if (!valid_env_name(name))
        a.fail_at(v.source(), ek, "environment variable names are A-Z, 0-9 and '_'");
      const auto* s = v.as_string();
      if (!s) a.fail_at(v.source(), ek, std::string("expected a string, got ") + type_name(v));
      if (s->get().find_first_of("\t\n\r ") != std::string::npos)
        a.fail_at(v.source(), ek, "value must not contain whitespace");
      arm.env.emplace_back(name, s->get());
    }
  }
  arm.note = a.str("note", false);
  a.finish("device, dtype, threads, env, inject, mix, note");
  return arm;
}

// [gate]: the arms must be local tiers that one process can hold side by side, so arms with
// an endpoint or their own environment are refused (the traces run those apart; the gate
// cannot), and the cpu arms must agree on one thread count.
void read_gate(MatrixSpec& spec, Table g) {
  MatrixGate& gate = spec.gate;
  spec.has_gate = true;
  const std::filesystem::path base = std::filesystem::path(spec.path).parent_path();
  auto resolve = [&](const std::string& p) {
    return std::filesystem::path(p).is_absolute() ? p : (base / p).lexically_normal().string();
  };
  gate.prompts = g.str("prompts", true);
  if (gate.prompts.empty()) g.fail("prompts", "must not be empty");
  gate.prompts_path = resolve(gate.prompts);
  gate.n_tokens = int(g.integer("n", 32, 1, 4096));
  gate.runs = int(g.integer("runs", 2, 1, 100));
  if (const toml::node* n = g.node("band", false)) {
    gate.band = g.number(*n, "band");
    if (!(gate.band >= 0) || !std::isfinite(gate.band)) g.fail("band", "must be >= 0 (nats)");
  }
  gate.against = g.strings("against", false);
  for (const auto& a : gate.against) {
    if (a.empty()) g.fail("against", "an empty directory name");
    gate.against_paths.push_back(resolve(a));
  }
  const bool listed = g.node("arms", false) != nullptr;
  gate.arms = listed ? g.strings("arms", true) : matrix_arm_order(spec);
  const std::string hint = listed ? "" : " (gate.arms defaults to every arm: list the arms)";
  std::set<std::string> seen;
  std::string cpu_arm;
  for (const auto& name : gate.arms) {
    auto it = std::find_if(spec.arms.begin(), spec.arms.end(),
                           [&](const MatrixArm& a) { return a.name == name; });
    if (it == spec.arms.end()) g.fail("arms", "no arm named '" + name + "' under [arms]");
    if (!seen.insert(name).second) g.fail("arms", "'" + name + "' is listed twice");
    if (it->is_endpoint())
      g.fail("arms", "arm '" + name + "' is an endpoint; the gate decodes on local tiers" + hint);
    if (!it->env.empty())
      g.fail("arms", "arm '" + name +
                         "' sets environment variables, which one gate process cannot set per "
                         "side" + hint);
    if (it->device != "cpu") continue;
    if (!cpu_arm.empty() && spec.arm(cpu_arm).threads != it->threads)
      g.fail("arms", "cpu arms '" + cpu_arm + "' and '" + name +
                         "' ask for different threads; the gate runs every side with one count");
    cpu_arm = name;
  }
  if (gate.arms.front() != spec.reference)
    g.fail("arms", "the first arm must be the reference '" + spec.reference +
                       "' (the gate judges every side on it)");
  if (gate.arms.size() + gate.against.size() < 2)
    g.fail("arms", "the gate needs a second side (another arm or an against record)");
  if (!cpu_arm.empty()) gate.threads = spec.arm(cpu_arm).threads;
  gate.localize = g.boolean("localize", false);
  g.finish("prompts, n, runs, band, against, arms, localize");
}

}  // namespace

bool MatrixArm::is_gpu() const {
  return device == "cuda" || device.rfind("cuda:", 0) == 0;
}

std::string MatrixArm::compute() const {
  if (is_endpoint()) return dtype;
  if (device == "ref") return "f64";
  if (device == "cpu") return "f32";
  return dtype.empty() ? "bf16" : dtype;
}

std::string MatrixArm::describe() const {
  if (is_endpoint()) return "endpoint " + endpoint + " model " + api_model + " " + (dtype.empty() ? "compute unknown" : dtype);
  std::string s = device + " " + compute();
  if (threads) s += " -t " + std::to_string(threads);
  if (inject != "none") s += " inject " + inject;
  if (!mix.empty()) s += " mix " + mix;
  for (const auto& [k, v] : env) s += " " + k + "=" + v;
  return s;
}

const MatrixArm& MatrixSpec::arm(const std::string& name) const {
  for (const auto& a : arms)
    if (a.name == name) return a;
  throw Error("[matrix] " + path + ": no arm named '" + name + "'");
}

MatrixSpec parse_matrix_spec(const std::string& path) {
  return parse_matrix_spec_text(read_input_file(path, "[matrix]", kMaxInputBytes, "a matrix spec"), path);
}

MatrixSpec parse_matrix_spec_text(const std::string& text, const std::string& path) {
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw Error("[matrix] " + path + ":" + std::to_string(e.source().begin.line) +
                ": not valid TOML: " + std::string(e.description()));
  }
  Table top(path, root, "");
  MatrixSpec spec;
  spec.path = path;
  spec.text = text;
  spec.question = top.str("question", false,
                          "Does every candidate arm compute the same model as the reference arm?");
  spec.corpus = top.str("corpus", true);
  spec.models = top.strings("models", true);
  std::set<std::string> model_names;
  for (const auto& m : spec.models)
    if (!model_names.insert(matrix_model_name(m)).second)
      top.fail("models", "two models share the name '" + matrix_model_name(m) +
                             "' (trace files are named after it)");
  spec.parents.assign(spec.models.size(), "");
  if (const toml::table* t = top.table("parents", false)) {
    for (const auto& [k, v] : *t) {
      const std::string model(k.str()), key = "parents.\"" + model + "\"";
      auto it = std::find(spec.models.begin(), spec.models.end(), model);
      if (it == spec.models.end())
        top.fail_at(v.source(), key, "not one of the spec's models (written as in `models`)");
      const auto* p = v.as_string();
      if (!p) top.fail_at(v.source(), key, std::string("expected a string, got ") + type_name(v));
      if (p->get().empty() || p->get() == model)
        top.fail_at(v.source(), key, "the parent must be another checkpoint");
      spec.parents[size_t(it - spec.models.begin())] = p->get();
    }
  }
  spec.topk = int(top.integer("topk", 8, 2, 1000));
  spec.allow_long_context = top.boolean("allow_long_context", false);
  if (const toml::node* n = top.node("decided", false)) {
    spec.decided = top.number(*n, "decided");
    if (!(spec.decided > 0) || !std::isfinite(spec.decided)) top.fail("decided", "must be > 0");
  }
  if (const toml::node* n = top.node("kl_kappa", false)) {
    spec.kl_kappa = top.number(*n, "kl_kappa");
    if (!(spec.kl_kappa > 0) || !std::isfinite(spec.kl_kappa)) top.fail("kl_kappa", "must be > 0");
  }
  spec.sweep = {0.5, 1.0, 2.0, 5.0};
  if (const toml::node* n = top.node("sweep", false)) {
    const auto& arr = top.typed<toml::array>(*n, "sweep", "an array of numbers");
    spec.sweep.clear();
    for (size_t i = 0; i < arr.size(); ++i) {
      double v = top.number(arr[i], "sweep");
      if (!(v > 0) || !std::isfinite(v)) top.fail("sweep", "thresholds must be > 0");
      spec.sweep.push_back(v);
    }
    if (spec.sweep.empty()) top.fail("sweep", "must not be empty");
  }

  for (const auto& name : top.strings("shapes", true)) {
    MatrixShape ms;
    try {
      ms.shape = named_shape(name);
    } catch (const Error& e) {
      top.fail("shapes", e.what());
    }
    for (const auto& s : spec.shapes)
      if (s.shape.name == name) top.fail("shapes", "'" + name + "' is listed twice");
    ms.full_chunks = ms.shape.max_chunks;
    spec.shapes.push_back(ms);
  }
  if (const toml::table* t = top.table("chunks", false)) {
    for (const auto& [k, v] : *t) {
      std::string name(k.str());
      auto it = std::find_if(spec.shapes.begin(), spec.shapes.end(),
                             [&](const MatrixShape& s) { return s.shape.name == name; });
      if (it == spec.shapes.end())
        top.fail_at(v.source(), "chunks." + name, "not one of the spec's shapes");
      const auto* i = v.as_integer();
      if (!i)
        top.fail_at(v.source(), "chunks." + name,
                    std::string("expected an integer, got ") + type_name(v));
      if (i->get() < 1) top.fail_at(v.source(), "chunks." + name, "must be >= 1");
      it->shape.max_chunks = int(std::min<int64_t>(i->get(), it->full_chunks));
    }
  }

  const toml::table* arms = top.table("arms", true);
  Table arms_t(path, *arms, "arms");
  for (const auto& [k, v] : *arms) spec.arms.push_back(read_arm(arms_t, std::string(k.str()), v));
  if (spec.arms.empty()) top.fail("arms", "no arm defined");
  auto known = [&](const std::string& name) {
    return std::any_of(spec.arms.begin(), spec.arms.end(),
                       [&](const MatrixArm& a) { return a.name == name; });
  };
  std::set<std::string> used;
  spec.reference = top.str("reference", true);
  if (!known(spec.reference))
    top.fail("reference", "no arm named '" + spec.reference + "' under [arms]");
  used.insert(spec.reference);
  spec.candidates = top.strings("candidates", true);
  for (const auto& c : spec.candidates) {
    if (!known(c)) top.fail("candidates", "no arm named '" + c + "' under [arms]");
    if (c == spec.reference)
      top.fail("candidates",
               "the reference '" + c + "' cannot be its own candidate (use controls.aa)");
    if (!used.insert(c).second) top.fail("candidates", "'" + c + "' is listed twice");
  }
  if (const toml::table* ct = top.table("controls", false)) {
    Table c(path, *ct, "controls");
    spec.aa = c.strings("aa", false);
    std::set<std::string> seen;
    for (const auto& a : spec.aa) {
      if (!known(a)) c.fail("aa", "no arm named '" + a + "' under [arms]");
      if (!seen.insert(a).second) c.fail("aa", "'" + a + "' is listed twice");
      used.insert(a);
    }
    if (const toml::node* n = c.node("noise_floor", false)) {
      const auto& arr =
          c.typed<toml::array>(*n, "noise_floor", "an array of [reference, candidate] pairs");
      for (size_t i = 0; i < arr.size(); ++i) {
        std::string k = "controls.noise_floor[" + std::to_string(i) + "]";
        const auto* p = arr[i].as_array();
        if (!p || p->size() != 2 || !(*p)[0].as_string() || !(*p)[1].as_string())
          c.fail_at(arr[i].source(), k, "expected a pair of arm names [\"ref\", \"cpu\"]");
        ArmPair pair{(*p)[0].as_string()->get(), (*p)[1].as_string()->get()};
        for (const auto& a : {pair.ref, pair.cand})
          if (!known(a)) c.fail_at(arr[i].source(), k, "no arm named '" + a + "' under [arms]");
        if (pair.ref == pair.cand)
          c.fail_at(arr[i].source(), k, "an arm against itself is controls.aa");
        for (const auto& q : spec.noise_floor)
          if (q.ref == pair.ref && q.cand == pair.cand)
            c.fail_at(arr[i].source(), k, "listed twice");
        used.insert(pair.ref);
        used.insert(pair.cand);
        spec.noise_floor.push_back(pair);
      }
    }
    c.finish("aa, noise_floor");
  }
  for (const auto& a : spec.arms)
    if (!used.count(a.name))
      arms_t.fail(a.name, "defined but not used as reference, candidate or control");
  if (const toml::table* gt = top.table("gate", false)) read_gate(spec, Table(path, *gt, "gate"));
  top.finish(
      "question, corpus, models, parents, shapes, chunks, topk, decided, sweep, "
      "allow_long_context, reference, candidates, arms, controls, gate");
  return spec;
}

std::string matrix_model_name(const std::string& model_path) {
  std::string p = model_path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  std::string base = std::filesystem::path(p).filename().string();
  if (base.size() > 5 && base.compare(base.size() - 5, 5, ".gguf") == 0)
    base.resize(base.size() - 5);
  return base;
}

std::vector<std::string> matrix_arm_order(const MatrixSpec& spec) {
  std::vector<std::string> order = {spec.reference};
  auto add = [&](const std::string& a) {
    if (std::find(order.begin(), order.end(), a) == order.end()) order.push_back(a);
  };
  for (const auto& c : spec.candidates) add(c);
  for (const auto& p : spec.noise_floor) add(p.ref), add(p.cand);
  for (const auto& a : spec.aa) add(a);
  return order;
}

std::vector<MatrixTrace> matrix_traces(const MatrixSpec& spec) {
  const std::vector<std::string> order = matrix_arm_order(spec);
  std::vector<MatrixTrace> out;
  for (size_t m = 0; m < spec.models.size(); ++m)
    for (size_t s = 0; s < spec.shapes.size(); ++s) {
      const std::string stem = matrix_model_name(spec.models[m]) + "." + spec.shapes[s].shape.name + ".";
      const bool quantized = !spec.parents[m].empty();
      auto add = [&](const std::string& arm, bool aa, bool parent) {
        MatrixTrace t{m, s, arm, aa, parent, "", ""};
        const std::string base = stem + arm + (aa ? ".aa" : "") + (parent ? ".parent" : "");
        t.file = base + ".tsv";
        if (quantized && arm == spec.reference && !aa) t.logits = t.file + ".logits";  // the store's name
        out.push_back(t);
      };
      for (const auto& a : order) {
        add(a, false, false);
        if (std::find(spec.aa.begin(), spec.aa.end(), a) != spec.aa.end()) add(a, true, false);
        if (quantized && a == spec.reference) add(a, false, true);
      }
    }
  return out;
}

const std::string& matrix_trace_model(const MatrixSpec& spec, const MatrixTrace& t) {
  return t.parent ? spec.parents[t.model] : spec.models[t.model];
}

std::string matrix_trace_mismatch(const MatrixSpec& spec, const MatrixTrace& t,
                                  const TraceHeader& h, const std::string& model_sha256,
                                  const std::string& corpus_sha256) {
  const MatrixArm& arm = spec.arm(t.arm);
  const TraceShape& sh = spec.shapes[t.shape].shape;
  auto differs = [](const std::string& what, const std::string& got, const std::string& want) {
    return what + " is '" + got + "', the spec asks for '" + want + "'";
  };
  if (h.model_path != matrix_trace_model(spec, t))
    return differs("model", h.model_path, matrix_trace_model(spec, t));
  if (!model_sha256.empty() && h.model_sha256 != model_sha256)
    return differs("model sha256", h.model_sha256, model_sha256);
  if (h.corpus_path != spec.corpus) return differs("corpus", h.corpus_path, spec.corpus);
  if (!corpus_sha256.empty() && h.corpus_sha256 != corpus_sha256)
    return differs("corpus sha256", h.corpus_sha256, corpus_sha256);
  auto num = [](int64_t v) { return std::to_string(v); };
  std::string got_shape = h.shape_name + " W" + num(h.chunk_tokens) + " C" + num(h.max_chunks) +
                          " P" + num(h.prefill) + " S" + num(h.start_token) + " K" + num(h.topk);
  std::string want_shape = sh.name + " W" + num(sh.chunk_tokens) + " C" + num(sh.max_chunks) +
                           " P" + num(sh.prefill) + " S" + num(sh.start_token) + " K" +
                           num(spec.topk);
  if (got_shape != want_shape) return differs("shape", got_shape, want_shape);
  std::string dev = arm.is_endpoint() ? h.device : h.device.substr(0, h.device.find(' '));
  bool dev_ok = arm.device == "cuda" ? dev.rfind("cuda:", 0) == 0 : dev == arm.device;
  if (!dev_ok) return differs("device", h.device, arm.device);
  if (h.compute != arm.compute()) return differs("compute", h.compute, arm.compute());
  if (h.inject != arm.inject) return differs("inject", h.inject, arm.inject);
  std::string mix = "none";
  for (const auto& [k, v] : h.extra)
    if (k == "mix") mix = v;
  if (mix != (arm.mix.empty() ? "none" : arm.mix))
    return differs("mix", mix, arm.mix.empty() ? "none" : arm.mix);
  // The environment variables any arm of the spec sets must have this arm's values.
  std::set<std::string> controlled;
  for (const auto& a : spec.arms)
    for (const auto& [k, v] : a.env) controlled.insert(k);
  std::string got_env, want_env;
  for (const auto& e : h.env) {
    std::string k = e.substr(0, e.find('='));
    if (controlled.count(k)) got_env += (got_env.empty() ? "" : " ") + e;
  }
  for (const auto& [k, v] : arm.env) want_env += (want_env.empty() ? "" : " ") + k + "=" + v;
  if (got_env != want_env) return differs("env", got_env, want_env);
  return "";
}

std::vector<std::string> matrix_trace_args(const MatrixSpec& spec, const MatrixTrace& t,
                                           const std::string& tdir) {
  const MatrixArm& arm = spec.arm(t.arm);
  const MatrixShape& ms = spec.shapes[t.shape];
  std::vector<std::string> a = {"trace",     "-m",      matrix_trace_model(spec, t), "--corpus",
                                spec.corpus, "--shape", ms.shape.name};
  if (ms.capped()) a.insert(a.end(), {"--chunks", std::to_string(ms.shape.max_chunks)});
  if (arm.is_endpoint()) {  // -m names the API's model; the checkpoint is the tokenizer
    a[2] = arm.api_model;
    a.insert(a.end(), {"--tokenizer", spec.models[t.model], "--endpoint", arm.endpoint, "--topk",
                       std::to_string(spec.topk)});
    if (!arm.dtype.empty()) a.insert(a.end(), {"--compute", arm.dtype});
    a.push_back("--quiet");
    return a;
  }
  a.insert(a.end(), {"--topk", std::to_string(spec.topk), "--device", arm.device});
  if (!arm.dtype.empty()) a.insert(a.end(), {"--dtype", arm.dtype});
  if (arm.threads) a.insert(a.end(), {"-t", std::to_string(arm.threads)});
  if (arm.inject != "none") a.insert(a.end(), {"--inject", arm.inject});
  if (!arm.mix.empty()) a.insert(a.end(), {"--mix", arm.mix});
  if (spec.allow_long_context) a.push_back("--allow-long-context");
  if (!t.logits.empty()) a.insert(a.end(), {"--full-logits", tdir + "/" + t.logits});
  a.push_back("--quiet");
  return a;
}

}  // namespace arbiter::verify
