// arbiter info MODEL [--json]: what a checkpoint is, as the loader understood it —
// architecture, dimensions, RoPE, flags, storage dtypes, parameter count (the rule is in
// src/model/loader.cpp), weight sha256 and tokenizer. Loads the model (no backend).
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "core/error.h"
#include "model/model.h"

namespace arbiter::cli {

namespace {

const char* scaling_name(RopeScaling::Kind k) {
  switch (k) {
    case RopeScaling::Kind::None: return "none";
    case RopeScaling::Kind::Linear: return "linear";
    case RopeScaling::Kind::Llama3: return "llama3";
  }
  return "?";
}

// Storage dtype -> number of distinct tensors the model reads in it.
std::map<std::string, int> dtype_counts(const Weights& w) {
  std::map<std::string, int> out;
  w.for_each_distinct([&](const TensorSpec&, const Tensor& t) { ++out[dtype_name(t.dtype)]; });
  return out;
}

std::string id_or_none(int32_t id) { return id < 0 ? "none" : std::to_string(id); }

int cmd_info(int argc, char** argv) {
  Args a("info", {"-m|--model"}, {"--json", "-h|--help"});
  a.parse(argc, argv);
  if (a.flag("help")) {
    std::fprintf(stderr, "usage: arbiter info MODEL [--json]   (MODEL: a .gguf file or an HF model directory)\n");
    return 0;
  }
  std::string path = a.str("model", "");
  if (path.empty()) {
    if (a.positional().size() != 1) throw Error("[cli] info: expected one MODEL path (see --help)");
    path = a.positional()[0];
  } else if (!a.positional().empty()) {
    throw Error("[cli] info: unexpected argument '" + a.positional()[0] + "'");
  }
  ActivityScope scope("loading model " + path);
  std::unique_ptr<Model> m = load_model(path);
  const ModelConfig& c = m->config;
  const Tokenizer* tok = m->tokenizer.get();
  auto dtypes = dtype_counts(m->weights);

  if (a.flag("json")) {
    nlohmann::ordered_json j;
    j["path"] = m->path;
    j["format"] = m->format;
    j["arch"] = c.arch;
    j["family"] = m->arch->family();
    j["n_layer"] = c.n_layer;
    j["d_model"] = c.d_model;
    j["n_head"] = c.n_head;
    j["n_head_kv"] = c.n_head_kv;
    j["head_dim"] = c.head_dim;
    j["d_ff"] = c.d_ff;
    j["vocab"] = c.vocab;
    j["max_pos"] = c.max_pos;
    j["rope_theta"] = c.rope.theta;
    j["rope_scaling"] = {{"kind", scaling_name(c.rope.scaling.kind)},
                         {"factor", c.rope.scaling.factor},
                         {"low_freq_factor", c.rope.scaling.low_freq_factor},
                         {"high_freq_factor", c.rope.scaling.high_freq_factor},
                         {"original_max_pos", c.rope.scaling.original_max_pos}};
    j["rope_layout"] = c.rope.layout == RopeLayout::Half ? "half" : "adjacent";
    j["norm_eps"] = c.norm_eps;
    j["tied_embeddings"] = c.tied_embeddings;
    const nlohmann::ordered_json fields = m->arch->describe(c);
    for (const auto& [k, v] : fields.items()) j[k] = v;
    j["weight_dtype"] = dtype_name(m->weight_dtype);
    j["tensor_dtypes"] = dtypes;
    j["n_params"] = m->n_params;
    j["weights_sha256"] = m->weights_sha256;
    j["eos_ids"] = m->eos_ids;
    j["tokenizer"] = {{"kind", tok->kind()},       {"vocab", tok->vocab_size()}, {"bos", tok->bos_id()},
                      {"eos", tok->eos_id()},      {"add_bos", tok->add_bos()},  {"sha256", tok->sha256()}};
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
    return 0;
  }

  std::string dt;
  for (const auto& [name, n] : dtypes) dt += (dt.empty() ? "" : ", ") + name + " x" + std::to_string(n);
  std::string eos;
  for (int32_t id : m->eos_ids) eos += (eos.empty() ? "" : ",") + std::to_string(id);
  std::printf("model         %s\n", m->path.c_str());
  std::printf("format        %s\n", m->format.c_str());
  std::printf("architecture  %s (family %s)\n", c.arch.c_str(), m->arch->family().c_str());
  std::printf("dims          L=%d D=%d H=%d Hkv=%d Dh=%d F=%d V=%d max_pos=%d\n", c.n_layer, c.d_model, c.n_head,
              c.n_head_kv, c.head_dim, c.d_ff, c.vocab, c.max_pos);
  std::printf("rope          theta=%.9g scaling=%s", c.rope.theta, scaling_name(c.rope.scaling.kind));
  if (c.rope.scaling.kind != RopeScaling::Kind::None) std::printf(" factor=%.9g", c.rope.scaling.factor);
  if (c.rope.scaling.kind == RopeScaling::Kind::Llama3)
    std::printf(" low_freq_factor=%.9g high_freq_factor=%.9g original_max_pos=%lld", c.rope.scaling.low_freq_factor,
                c.rope.scaling.high_freq_factor, (long long)c.rope.scaling.original_max_pos);
  std::printf(" layout=%s\n", c.rope.layout == RopeLayout::Half ? "half" : "adjacent");
  std::printf("norm_eps      %.9g\n", c.norm_eps);
  std::string flags = std::string("tied_embeddings=") + (c.tied_embeddings ? "yes" : "no");
  const nlohmann::ordered_json fields = m->arch->describe(c);
  for (const auto& [k, v] : fields.items())
    flags += " " + k + "=" + (v.is_boolean() ? (v.get<bool>() ? "yes" : "no") : v.dump());
  std::printf("flags         %s\n", flags.c_str());
  std::printf("weight_dtype  %s (tensors: %s)\n", dtype_name(m->weight_dtype), dt.c_str());
  std::printf("params        %lld\n", (long long)m->n_params);
  std::printf("sha256        %s\n", m->weights_sha256.c_str());
  std::printf("tokenizer     %s vocab=%d bos=%s eos=%s add_bos=%s sha256=%s\n", tok->kind().c_str(), tok->vocab_size(),
              id_or_none(tok->bos_id()).c_str(), id_or_none(tok->eos_id()).c_str(), tok->add_bos() ? "yes" : "no",
              tok->sha256().c_str());
  std::printf("eos_ids       %s\n", eos.empty() ? "none" : eos.c_str());
  return 0;
}

}  // namespace

REGISTER_COMMAND("info", "describe a model: config, dtypes, params, weight sha256, tokenizer", cmd_info);

}  // namespace arbiter::cli
