// The hybrid family's configs (model/archs/hybrid.h): HF config.json and GGUF metadata read
// into ModelConfig as transformers 5.17 and llama.cpp read them, with the refusals of what the
// forward does not compute, and written back (synth, `arbiter quantize`, add_model_gguf).
#include <cmath>
#include <limits>

#include "core/error.h"
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "io/json_config.h"
#include "model/archs/hybrid.h"
#include "model/rope_config.h"

namespace arbiter::hybrid {

namespace {

void check_router(const JsonConfig& j, const ModelConfig& c, const char* keys) {
  if (const char* why = router_spec_problem(router_spec(c)))
    j.fail(std::string("MoE routing (") + keys + "): " + why);
}

int head_dim(const JsonConfig& j, const ModelConfig& c) {
  if (j.has("head_dim")) return j.positive_int("head_dim");
  if (c.d_model % c.n_head != 0)
    j.fail(strformat("hidden_size %d is not a multiple of num_attention_heads %d", c.d_model,
                     c.n_head));
  return c.d_model / c.n_head;
}

// A list of layer types into c.layer_blocks (n_layer < 0: its length sets the layer count).
void read_blocks(const JsonConfig& j, const char* key, int n_layer, bool nemotron,
                 ModelConfig& c) {
  const nlohmann::json& lt = j.raw(key);
  if (!lt.is_array() || (n_layer >= 0 && int(lt.size()) != n_layer) || lt.empty())
    j.fail(strformat("'%s' is not a list of %s entries", key,
                     n_layer >= 0 ? "num_hidden_layers" : "one or more"));
  c.layer_blocks.clear();
  for (size_t l = 0; l < lt.size(); ++l) {
    const std::string s = lt[l].is_string() ? lt[l].get<std::string>() : lt[l].dump();
    char b = 0;
    if (s == "mamba" || s == "linear_attention") b = 'M';
    else if (s == "attention" || s == "full_attention") b = '*';
    else if (nemotron && s == "mlp") b = '-';
    else if (nemotron && s == "moe") b = 'E';
    if (!b)
      j.fail(strformat("%s[%zu] '%s' is not a layer type (expected %s)", key, l, s.c_str(),
                       nemotron ? "mamba, attention, mlp, moe, linear_attention or full_attention"
                                : "mamba, attention, linear_attention or full_attention"));
    c.layer_blocks += b;
  }
}

// time_step_limit: [lo, hi], hi possibly infinite (written as {"__float__": "Infinity"} by
// transformers' JSON encoder, or a string); default (0, inf).
void read_dt_limit(const JsonConfig& j, ModelConfig& c) {
  c.ssm_dt_min = 0;
  c.ssm_dt_max = std::numeric_limits<double>::infinity();
  if (!j.has("time_step_limit")) return;
  const nlohmann::json& v = j.raw("time_step_limit");
  auto value = [&](const nlohmann::json& e) {
    if (e.is_number()) return e.get<double>();
    const nlohmann::json& f = e.is_object() && e.contains("__float__") ? e["__float__"] : e;
    if (f.is_string()) {
      const std::string s = f.get<std::string>();
      if (s == "Infinity" || s == "inf") return std::numeric_limits<double>::infinity();
    }
    j.fail("time_step_limit entry " + e.dump() + " is not a number");
  };
  if (!v.is_array() || v.size() != 2) j.fail("time_step_limit is not a pair [min, max]");
  c.ssm_dt_min = value(v[0]);
  c.ssm_dt_max = value(v[1]);
  if (!(c.ssm_dt_min <= c.ssm_dt_max)) j.fail("time_step_limit: min exceeds max");
}

// "mamba"/"attention" (the Hub's configs) or "linear_attention"/"full_attention"
// (transformers 5.17 writes these); absent: every layer Mamba2 (GraniteMoeHybridConfig).
void parse_granite(const JsonConfig& j, ModelConfig& c) {
  c.d_model = j.positive_int("hidden_size");
  const int n_layer = j.positive_int("num_hidden_layers");
  c.n_head = j.positive_int("num_attention_heads");
  c.n_head_kv = j.positive_int("num_key_value_heads", c.n_head);
  c.vocab = j.positive_int("vocab_size");
  c.max_pos = j.positive_int("max_position_embeddings", 2048);
  c.norm_eps = j.number("rms_norm_eps", 1e-6);
  c.tied_embeddings = j.flag("tie_word_embeddings", false);
  c.head_dim = head_dim(j, c);
  c.d_ff = j.positive_int("shared_intermediate_size", 1024);
  if (j.has("hidden_act") && j.str("hidden_act") != "silu")
    j.fail("hidden_act \"" + j.str("hidden_act") + "\" is not supported (expected \"silu\")");
  if (j.flag("attention_bias", false)) j.fail("attention_bias=true is not supported");
  if (j.flag("mamba_proj_bias", false)) j.fail("mamba_proj_bias=true is not supported");
  const int64_t experts = j.has("num_local_experts") ? j.integer("num_local_experts") : 8;
  if (experts < 0 || experts > kMaxExperts)
    j.fail(strformat("num_local_experts %lld is outside [0, %d]", (long long)experts,
                     kMaxExperts));
  c.moe_experts = int(experts);
  if (c.moe_experts > 0) {
    c.moe_top_k = j.positive_int("num_experts_per_tok", 2);
    c.moe_ff = j.positive_int("intermediate_size", 11008);
    check_router(j, c, "num_local_experts, num_experts_per_tok");
  }
  c.embed_mult = j.number("embedding_multiplier", 1.0);
  c.residual_mult = j.number("residual_multiplier", 1.0);
  c.attn_scale = j.number("attention_multiplier", 1.0);
  c.logits_scaling = j.number("logits_scaling", 1.0);
  if (!(c.logits_scaling != 0)) j.fail("logits_scaling must not be 0");
  const std::string pos = j.has("position_embedding_type") ? j.str("position_embedding_type")
                                                           : "nope";
  if (pos != "rope" && pos != "nope")
    j.fail("position_embedding_type \"" + pos + "\" is not supported (expected rope or nope)");
  c.use_rope = pos == "rope";
  c.layer_blocks = std::string(size_t(n_layer), 'M');
  if (j.has("layer_types")) read_blocks(j, "layer_types", n_layer, false, c);

  const int expand = j.positive_int("mamba_expand", 2);
  const int inner = expand * c.d_model;
  c.ssm_heads = j.positive_int("mamba_n_heads", 128);
  if (inner % c.ssm_heads != 0)
    j.fail(strformat("mamba_n_heads %d does not divide mamba_expand * hidden_size = %d",
                     c.ssm_heads, inner));
  c.ssm_head_dim = j.has("mamba_d_head") && j.raw("mamba_d_head") != "auto"
                       ? j.positive_int("mamba_d_head")
                       : inner / c.ssm_heads;
  if (c.ssm_head_dim * c.ssm_heads != inner)
    j.fail(strformat("mamba_d_head %d x mamba_n_heads %d is not mamba_expand * hidden_size = %d",
                     c.ssm_head_dim, c.ssm_heads, inner));
  c.ssm_groups = j.positive_int("mamba_n_groups", 1);
  c.ssm_state = j.positive_int("mamba_d_state", 256);
  c.ssm_conv = j.positive_int("mamba_d_conv", 4);
  c.ssm_chunk = j.positive_int("mamba_chunk_size", 256);
  c.ssm_conv_bias = j.flag("mamba_conv_bias", true);
  read_dt_limit(j, c);
  c.ssm_norm_per_group = false;  // GraniteMoeHybridRMSNormGated: the full width
}

void parse_nemotron(const JsonConfig& j, ModelConfig& c) {
  c.d_model = j.positive_int("hidden_size");
  c.n_head = j.positive_int("num_attention_heads", 32);
  // NemotronHConfig: 8 when absent, num_attention_heads when null.
  c.n_head_kv = j.positive_int("num_key_value_heads", j.contains("num_key_value_heads") ? c.n_head : 8);
  c.head_dim = j.positive_int("head_dim", 128);
  c.vocab = j.positive_int("vocab_size");
  c.max_pos = j.positive_int("max_position_embeddings", 4096);
  c.norm_eps = j.number("layer_norm_epsilon", 1e-5);
  c.tied_embeddings = j.flag("tie_word_embeddings", false);
  c.d_ff = j.positive_int("intermediate_size", 21504);
  c.attn_scale = 1.0 / std::sqrt(double(c.head_dim));  // JambaAttention: head_dim^-0.5
  c.use_rope = false;
  for (const char* key : {"attention_bias", "mlp_bias", "use_bias"})
    if (j.flag(key, false)) j.fail(std::string(key) + "=true is not supported");
  if (j.has("sliding_window")) j.fail("sliding_window is not supported (expected null)");
  if (j.has("mamba_hidden_act") && j.str("mamba_hidden_act") != "silu")
    j.fail("mamba_hidden_act \"" + j.str("mamba_hidden_act") +
           "\" is not supported (expected silu)");
  if (j.has("mlp_hidden_act") && j.str("mlp_hidden_act") != "relu2")
    j.fail("mlp_hidden_act \"" + j.str("mlp_hidden_act") +
           "\" is not supported (expected relu2)");
  // layers_block_type (5.17) or the Hub's hybrid_override_pattern; HF's default pattern.
  if (j.has("layers_block_type")) {
    read_blocks(j, "layers_block_type", -1, true, c);
  } else if (j.has("hybrid_override_pattern")) {
    c.layer_blocks = j.str("hybrid_override_pattern");
    for (size_t i = 0; i < c.layer_blocks.size(); ++i)
      if (std::string("ME*-").find(c.layer_blocks[i]) == std::string::npos)
        j.fail(strformat("hybrid_override_pattern[%zu] '%c' is not a layer type (expected M, E, "
                         "* or -)", i, c.layer_blocks[i]));
    if (c.layer_blocks.empty()) j.fail("hybrid_override_pattern is empty");
  } else {
    c.layer_blocks = "ME*-";
  }
  if (c.layer_blocks.find('E') != std::string::npos) {
    c.moe_experts = j.positive_int("n_routed_experts", 8);
    if (c.moe_experts > kMaxExperts)
      j.fail(strformat("n_routed_experts %d exceeds %d", c.moe_experts, kMaxExperts));
    c.moe_top_k = j.positive_int("num_experts_per_tok", 2);
    c.moe_ff = j.positive_int("moe_intermediate_size", 7688);
    c.moe_shared_ff = j.positive_int("moe_shared_expert_intermediate_size", 7688);
    c.moe_norm_topk = j.flag("norm_topk_prob", true);
    c.moe_scaling = j.number("routed_scaling_factor", 1.0);
    c.moe_n_group = j.positive_int("n_group", 1);
    c.moe_topk_group = j.positive_int("topk_group", 1);
    if (j.has("moe_latent_size")) j.fail("moe_latent_size is not supported (expected null)");
    if (j.has("n_shared_experts") && j.integer("n_shared_experts") != 1)
      j.fail("n_shared_experts other than 1 is not supported (HF builds one shared expert)");
    check_router(j, c, "n_routed_experts, num_experts_per_tok, n_group, topk_group");
  }

  c.ssm_heads = j.positive_int("mamba_num_heads", 128);
  c.ssm_head_dim = j.positive_int("mamba_head_dim", 64);
  c.ssm_groups = j.positive_int(j.has("mamba_n_groups") ? "mamba_n_groups" : "n_groups", 8);
  c.ssm_state = j.positive_int("ssm_state_size", 128);
  c.ssm_conv = j.positive_int(j.has("mamba_d_conv") ? "mamba_d_conv" : "conv_kernel", 4);
  c.ssm_chunk =
      j.positive_int(j.has("mamba_chunk_size") ? "mamba_chunk_size" : "chunk_size", 128);
  c.ssm_conv_bias = j.flag(j.has("mamba_conv_bias") ? "mamba_conv_bias" : "use_conv_bias", true);
  // Zamba2MambaMixer.torch_forward clamps dt from below at time_step_min and ignores
  // time_step_limit.
  c.ssm_dt_min =
      j.number(j.has("mamba_dt_min") ? "mamba_dt_min" : "time_step_min", kNemotronDtMin);
  c.ssm_dt_max = std::numeric_limits<double>::infinity();
  c.ssm_norm_per_group = true;  // Zamba2RMSNormGated, group_size = I / n_groups
}

}  // namespace

void Hybrid::parse_hf(const JsonConfig& j, ModelConfig& c) const {
  if (granite(c)) parse_granite(j, c);
  else parse_nemotron(j, c);
  c.n_layer = int(c.layer_blocks.size());
  if (c.n_head % c.n_head_kv != 0)
    j.fail(strformat("num_attention_heads %d is not a multiple of num_key_value_heads %d",
                     c.n_head, c.n_head_kv));
  const char* groups_key = granite(c) ? "mamba_n_groups" : "n_groups";
  if (c.ssm_heads % c.ssm_groups != 0)
    j.fail(strformat("%s %d does not divide the %d Mamba heads", groups_key, c.ssm_groups,
                     c.ssm_heads));
  if (!(c.norm_eps > 0)) j.fail("the RMSNorm epsilon must be positive");
  c.rope.dims = c.head_dim;
  c.rope.layout = RopeLayout::Half;  // HF rotate_half
  if (c.use_rope) read_hf_rope(j, c.rope);
}

// The keys llama.cpp reads (src/models/granite-hybrid.cpp, nemotron-h.cpp). A layer's kind
// comes from the per-layer arrays: head_count_kv > 0 is attention; otherwise Granite's is
// Mamba2, and Nemotron-H's is Mamba2 when feed_forward_length is 0 too, else its MLP ('-')
// or, with experts (nemotron_h_moe), its MoE ('E'). The converter writes a dense MLP layer
// of an MoE Nemotron-H with feed_forward_length 0 (its _mlp_layers are the 'E' ones), which
// llama.cpp then takes for Mamba2 and fails to load; here its ffn_up tensor makes it '-'.
// What GGUF cannot say takes the HF default of the class: Granite's gated norm over the full
// width (llama.cpp normalises per group, which differs when the group count is above 1),
// dt's clamp (Granite: none; Nemotron-H: from below at time_step_min 0.001; llama.cpp
// clamps nowhere), the chunk sizes (256 and 128: the cpu and cuda prefill's rounding).
void Hybrid::parse_gguf(const GgufFile& g, ModelConfig& c) const {
  const std::string gname = c.arch, p = gname + ".", path = g.path();
  const bool gr = gname == "granitehybrid";
  c.arch = gr ? "granitemoehybrid" : "nemotron_h";
  auto fail = [&](const std::string& key, const std::string& why) {
    throw Error("[loader] " + path + ": " + p + key + " " + why);
  };
  auto positive = [&](const std::string& key, int64_t dflt = -1) {
    const int64_t v = dflt >= 0 ? g.get_int(p + key, dflt) : g.get_int(p + key);
    if (v <= 0 || v > std::numeric_limits<int>::max())
      fail(key, "is " + std::to_string(v) + " (expected a positive int)");
    return int(v);
  };
  auto scale = [&](const std::string& key) {  // llama.cpp: absent or 0 means none
    const double v = g.get_float(p + key, 0.0);
    if (!std::isfinite(v)) fail(key, "is not finite");
    return v == 0 ? 1.0 : v;
  };
  c.d_model = positive("embedding_length");
  c.n_layer = positive("block_count");
  c.max_pos = positive("context_length");
  c.n_head = positive("attention.head_count");
  c.head_dim = positive("attention.key_length", c.d_model / c.n_head);
  if (positive("attention.value_length", c.head_dim) != c.head_dim)
    fail("attention.value_length", "differs from key_length (unsupported)");
  c.norm_eps = g.has(p + "attention.layer_norm_rms_epsilon")
                   ? g.get_float(p + "attention.layer_norm_rms_epsilon")
                   : g.get_float(p + "attention.layer_norm_epsilon");
  if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps))
    fail("attention.layer_norm_rms_epsilon", "must be positive and finite");
  c.tied_embeddings = g.tensor("output.weight") == nullptr;
  // Per-layer values: an array of block_count entries, or one value for every layer.
  auto per_layer = [&](const std::string& key) {
    const GgufValue* v = g.find(p + key);
    const bool arr = v && (v->kind == GgufValue::Kind::ArrU64 || v->kind == GgufValue::Kind::ArrI64);
    std::vector<int64_t> out(size_t(c.n_layer), v && !arr ? g.get_int(p + key) : 0);
    if (arr) out = g.get_int_array(p + key);
    if (int(out.size()) != c.n_layer)
      fail(key, strformat("has %zu entries (expected block_count %d)", out.size(), c.n_layer));
    for (int64_t x : out)
      if (x < 0 || x > std::numeric_limits<int>::max()) fail(key, "has an entry out of range");
    return out;
  };
  const std::vector<int64_t> kv = per_layer("attention.head_count_kv");
  const std::vector<int64_t> ff = gr ? std::vector<int64_t>(size_t(c.n_layer), 0)
                                     : per_layer("feed_forward_length");
  const int experts = int(g.get_int(p + "expert_count", 0));
  if (experts < 0 || experts > kMaxExperts)
    fail("expert_count", strformat("%d is outside [0, %d]", experts, kMaxExperts));
  if (!gr && (experts > 0) != (gname == "nemotron_h_moe"))
    fail("expert_count", std::to_string(experts) + " does not fit the architecture " + gname);
  c.layer_blocks.clear();
  c.n_head_kv = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    const int64_t k = kv[size_t(l)], f = ff[size_t(l)];
    if (k > 0 && f > 0)
      fail("feed_forward_length", strformat("and head_count_kv are both set for layer %d", l));
    if (k > 0 && c.n_head_kv > 0 && k != c.n_head_kv)
      fail("attention.head_count_kv", "differs between layers (unsupported)");
    if (k > 0) c.n_head_kv = int(k);
    if (f > 0 && c.d_ff > 0 && f != c.d_ff)
      fail("feed_forward_length", "differs between layers (unsupported)");
    if (f > 0) c.d_ff = int(f);  // an MoE file's: the experts' width (replaced below)
    const std::string blk = "blk." + std::to_string(l) + ".";
    if (k == 0 && g.tensor(blk + "attn_q.weight") != nullptr)
      fail("attention.head_count_kv", strformat("is 0 for layer %d, which holds attention "
                                                "tensors (a converter that took it for Mamba2?)", l));
    const bool mlp = !gr && k == 0 && f == 0 && g.tensor(blk + "ffn_up.weight") != nullptr;
    c.layer_blocks += k > 0 ? '*' : mlp ? '-' : f == 0 ? 'M' : experts > 0 ? 'E' : '-';
  }
  // The dense MLP's width: feed_forward_length, or in an MoE file its ffn_up's rows.
  if (!gr && experts > 0)
    for (int l = 0; l < c.n_layer; ++l)
      if (c.layer_blocks[size_t(l)] == '-')
        c.d_ff = int(g.tensor("blk." + std::to_string(l) + ".ffn_up.weight")->shape[0]);
  if (c.n_head_kv == 0) c.n_head_kv = c.n_head;  // no attention layer: unused
  if (c.n_head % c.n_head_kv != 0)
    fail("attention.head_count_kv", strformat("%d does not divide head_count %d", c.n_head_kv,
                                              c.n_head));
  const bool has_mamba = c.layer_blocks.find('M') != std::string::npos;
  if (has_mamba) {
    // Each SSM size within 2^24, so that the tensors' shapes (products of two or three of
    // them) cannot overflow before the file's own shapes are checked against them.
    for (const char* key : {"ssm.conv_kernel", "ssm.state_size", "ssm.group_count",
                            "ssm.time_step_rank", "ssm.inner_size"})
      if (positive(key) > (1 << 24)) fail(key, "exceeds 2^24");
    c.ssm_conv = positive("ssm.conv_kernel");
    c.ssm_state = positive("ssm.state_size");
    c.ssm_groups = positive("ssm.group_count");
    c.ssm_heads = positive("ssm.time_step_rank");
    const int inner = positive("ssm.inner_size");
    if (inner % c.ssm_heads != 0)
      fail("ssm.time_step_rank", strformat("%d does not divide ssm.inner_size %d", c.ssm_heads, inner));
    c.ssm_head_dim = inner / c.ssm_heads;
    if (c.ssm_heads % c.ssm_groups != 0)
      fail("ssm.group_count", strformat("%d does not divide the %d Mamba heads", c.ssm_groups,
                                        c.ssm_heads));
    const int first = int(c.layer_blocks.find('M'));
    c.ssm_conv_bias = g.tensor("blk." + std::to_string(first) + ".ssm_conv1d.bias") != nullptr;
  } else {
    c.ssm_conv = 4, c.ssm_state = 1, c.ssm_groups = 1, c.ssm_heads = 1, c.ssm_head_dim = 1;
  }
  c.ssm_chunk = gr ? 256 : 128;  // HF's defaults (mamba_chunk_size, chunk_size)
  c.ssm_dt_min = gr ? 0 : kNemotronDtMin;
  c.ssm_dt_max = std::numeric_limits<double>::infinity();
  c.ssm_norm_per_group = !gr;
  if (gr) {
    c.embed_mult = scale("embedding_scale");
    c.residual_mult = scale("residual_scale");
    c.logits_scaling = scale("logit_scale");
    c.attn_scale = g.get_float(p + "attention.scale", 0.0);
    if (c.attn_scale == 0) c.attn_scale = 1.0 / std::sqrt(double(c.head_dim));  // llama.cpp
    // rope.scaling.finetuned is llama.cpp's switch for RoPE in granitehybrid (default on).
    c.use_rope = g.get_bool(p + "rope.scaling.finetuned", true);
    c.moe_experts = experts;
    if (experts > 0) {
      c.moe_ff = positive("feed_forward_length");
      c.d_ff = positive("expert_shared_feed_forward_length");
    } else {
      c.d_ff = positive("feed_forward_length");
    }
  } else {
    c.attn_scale = 1.0 / std::sqrt(double(c.head_dim));
    c.use_rope = false;
    c.moe_experts = experts;
    if (experts > 0) {
      c.moe_ff = positive("expert_feed_forward_length", c.d_ff > 0 ? c.d_ff : -1);
      c.moe_shared_ff = positive("expert_shared_feed_forward_length");
      c.moe_norm_topk = g.get_bool(p + "expert_weights_norm", false);
      c.moe_scaling = scale("expert_weights_scale");
      c.moe_n_group = positive("expert_group_count", 1);
      c.moe_topk_group = positive("expert_group_used_count", 1);
      if (g.get_int(p + "expert_shared_count", 1) != 1)
        fail("expert_shared_count", "is not 1 (HF builds one shared expert)");
      if (g.has(p + "moe_latent_size")) fail("moe_latent_size", "is not supported");
      if (g.has(p + "expert_gating_func") && g.get_int(p + "expert_gating_func") != 2)
        fail("expert_gating_func", "is not 2 (sigmoid), which Nemotron-H's router computes");
    }
  }
  if (experts > 0) {
    c.moe_top_k = positive("expert_used_count");
    if (c.moe_top_k > experts)
      fail("expert_used_count", strformat("%d is larger than %sexpert_count %d", c.moe_top_k,
                                          p.c_str(), experts));
    if (const char* why = router_spec_problem(router_spec(c)))
      throw Error("[loader] " + path + ": MoE routing (" + p + "expert_*): " + why);
  }
  c.rope.dims = c.head_dim;
  c.rope.layout = RopeLayout::Half;  // llama.cpp's NEOX RoPE for granitehybrid: no permutation
  if (c.use_rope) read_gguf_rope(g, gname, c.rope);
}

// Every key parse_granite / parse_nemotron reads, as the Hub's configs spell them (the
// generic ones are model/synth.cpp's), so the directory loads back as the same config.
void Hybrid::hf_config_json(const ModelConfig& c, nlohmann::json& j) const {
  const int64_t I = int64_t(c.ssm_heads) * c.ssm_head_dim;
  j["hidden_size"] = c.d_model;
  j["num_hidden_layers"] = c.n_layer;
  j["num_attention_heads"] = c.n_head;
  j["num_key_value_heads"] = c.n_head_kv;
  j["attention_bias"] = false;
  j["mamba_proj_bias"] = false;
  write_hf_rope(c.rope, j);
  if (granite(c)) {
    // GraniteMoeHybridConfig derives the head size and the mixer width: both must follow.
    if (c.head_dim * c.n_head != c.d_model || I % c.d_model != 0)
      throw Error("[synth] " + c.arch + ": head_dim or the Mamba width is not what " +
                  "hidden_size / num_attention_heads and mamba_expand * hidden_size give");
    nlohmann::json types = nlohmann::json::array();
    for (char b : c.layer_blocks) types.push_back(b == 'M' ? "mamba" : "attention");
    j["layer_types"] = types;
    j["rms_norm_eps"] = c.norm_eps;
    j["hidden_act"] = "silu";
    j["shared_intermediate_size"] = c.d_ff;
    j["num_local_experts"] = c.moe_experts;
    j["num_experts_per_tok"] = c.moe_top_k;
    // The Hub's dense configs repeat the shared MLP's width here.
    j["intermediate_size"] = c.moe_experts > 0 ? c.moe_ff : c.d_ff;
    j["embedding_multiplier"] = c.embed_mult;
    j["residual_multiplier"] = c.residual_mult;
    j["attention_multiplier"] = c.attn_scale;
    j["logits_scaling"] = c.logits_scaling;
    j["position_embedding_type"] = c.use_rope ? "rope" : "nope";
    j["mamba_expand"] = I / c.d_model;
    j["mamba_n_heads"] = c.ssm_heads;
    j["mamba_d_head"] = c.ssm_head_dim;
    j["mamba_n_groups"] = c.ssm_groups;
    j["mamba_d_state"] = c.ssm_state;
    j["mamba_d_conv"] = c.ssm_conv;
    j["mamba_chunk_size"] = c.ssm_chunk;
    j["mamba_conv_bias"] = c.ssm_conv_bias;
    // transformers' JSON encoder writes an infinite bound this way.
    auto bound = [](double v) {
      return std::isinf(v) ? nlohmann::json{{"__float__", "Infinity"}} : nlohmann::json(v);
    };
    j["time_step_limit"] = {bound(c.ssm_dt_min), bound(c.ssm_dt_max)};
    return;
  }
  j["head_dim"] = c.head_dim;
  j["hybrid_override_pattern"] = c.layer_blocks;
  j["layer_norm_epsilon"] = c.norm_eps;
  j["intermediate_size"] = c.d_ff;
  j["mamba_hidden_act"] = "silu";
  j["mlp_hidden_act"] = "relu2";
  j["mlp_bias"] = false;
  j["use_bias"] = false;
  if (c.layer_blocks.find('E') != std::string::npos) {
    j["n_routed_experts"] = c.moe_experts;
    j["num_experts_per_tok"] = c.moe_top_k;
    j["moe_intermediate_size"] = c.moe_ff;
    j["moe_shared_expert_intermediate_size"] = c.moe_shared_ff;
    j["n_shared_experts"] = 1;
    j["norm_topk_prob"] = c.moe_norm_topk;
    j["routed_scaling_factor"] = c.moe_scaling;
    j["n_group"] = c.moe_n_group;
    j["topk_group"] = c.moe_topk_group;
  }
  j["mamba_num_heads"] = c.ssm_heads;
  j["mamba_head_dim"] = c.ssm_head_dim;
  j["n_groups"] = c.ssm_groups;
  j["ssm_state_size"] = c.ssm_state;
  j["conv_kernel"] = c.ssm_conv;
  j["chunk_size"] = c.ssm_chunk;
  j["use_conv_bias"] = c.ssm_conv_bias;
  j["time_step_min"] = c.ssm_dt_min;
}

// What llama.cpp's converter writes (GraniteHybridModel / NemotronHModel
// .set_gguf_parameters), an MoE Nemotron-H's dense MLP layers included (feed_forward_length
// 0 there, as the converter writes them; parse_gguf reads them back). What GGUF cannot hold
// is refused: a head_dim other than hidden_size / heads for Granite (the converter drops
// head_dim), a dt clamp other than the class's default.
void Hybrid::gguf_metadata(const ModelConfig& c, GgufWriter& g) const {
  const bool gr = granite(c);
  const std::string p = gguf_arch(c) + ".";
  auto refuse = [&](const std::string& what) {
    throw Error("[gguf] " + c.arch + ": " + what + " has no GGUF form llama.cpp reads");
  };
  if (gr && c.head_dim * c.n_head != c.d_model) refuse("head_dim != hidden_size / heads");
  if (gr && (c.ssm_dt_min != 0 || std::isfinite(c.ssm_dt_max))) refuse("time_step_limit");
  if (!gr && (c.ssm_dt_min != kNemotronDtMin || std::isfinite(c.ssm_dt_max)))
    refuse("time_step_min other than 0.001");
  std::vector<int32_t> kv, ff;
  for (char b : c.layer_blocks) {
    kv.push_back(b == '*' ? c.n_head_kv : 0);
    ff.push_back(b == '-' && c.moe_experts == 0 ? c.d_ff : b == 'E' ? c.moe_ff : 0);
  }
  g.add_u32(p + "embedding_length", uint32_t(c.d_model));
  g.add_u32(p + "block_count", uint32_t(c.n_layer));
  g.add_u32(p + "attention.head_count", uint32_t(c.n_head));
  g.add_i32_array(p + "attention.head_count_kv", kv);
  g.add_f32(p + "attention.layer_norm_rms_epsilon", float(c.norm_eps));
  g.add_u32(p + "ssm.conv_kernel", uint32_t(c.ssm_conv));
  g.add_u32(p + "ssm.state_size", uint32_t(c.ssm_state));
  g.add_u32(p + "ssm.group_count", uint32_t(c.ssm_groups));
  g.add_u32(p + "ssm.inner_size", uint32_t(c.ssm_heads * c.ssm_head_dim));
  g.add_u32(p + "ssm.time_step_rank", uint32_t(c.ssm_heads));
  if (gr) {
    g.add_u32(p + "feed_forward_length", uint32_t(c.moe_experts > 0 ? c.moe_ff : c.d_ff));
    if (c.moe_experts > 0) {
      g.add_u32(p + "expert_shared_feed_forward_length", uint32_t(c.d_ff));
      g.add_u32(p + "expert_count", uint32_t(c.moe_experts));
      g.add_u32(p + "expert_used_count", uint32_t(c.moe_top_k));
    }
    g.add_f32(p + "attention.scale", float(c.attn_scale));
    g.add_f32(p + "embedding_scale", float(c.embed_mult));
    g.add_f32(p + "residual_scale", float(c.residual_mult));
    g.add_f32(p + "logit_scale", float(c.logits_scaling));
    g.add_bool(p + "rope.scaling.finetuned", c.use_rope);
    if (c.use_rope) write_gguf_rope(c.rope, gguf_arch(c), g);
    return;
  }
  // llama.cpp (80fb11a, src/models/nemotron-h.cpp) requires both epsilon keys for Nemotron-H
  // (the plain one for its MTP head's final norm); its converter writes only the plain one,
  // a file that llama.cpp then fails to load. Both hold the one epsilon.
  g.add_f32(p + "attention.layer_norm_epsilon", float(c.norm_eps));
  g.add_u32(p + "attention.key_length", uint32_t(c.head_dim));
  g.add_u32(p + "attention.value_length", uint32_t(c.head_dim));
  g.add_i32_array(p + "feed_forward_length", ff);
  if (c.moe_experts == 0) return;
  g.add_u32(p + "expert_count", uint32_t(c.moe_experts));
  g.add_u32(p + "expert_used_count", uint32_t(c.moe_top_k));
  g.add_u32(p + "expert_feed_forward_length", uint32_t(c.moe_ff));
  g.add_u32(p + "expert_shared_feed_forward_length", uint32_t(c.moe_shared_ff));
  g.add_u32(p + "expert_shared_count", 1);
  g.add_bool(p + "expert_weights_norm", c.moe_norm_topk);
  g.add_f32(p + "expert_weights_scale", float(c.moe_scaling));
  g.add_u32(p + "expert_group_count", uint32_t(c.moe_n_group));
  g.add_u32(p + "expert_group_used_count", uint32_t(c.moe_topk_group));
}

nlohmann::ordered_json Hybrid::describe(const ModelConfig& c) const {
  return {{"layer_blocks", c.layer_blocks},
          {"ssm_heads", c.ssm_heads},
          {"ssm_head_dim", c.ssm_head_dim},
          {"ssm_state", c.ssm_state},
          {"ssm_groups", c.ssm_groups},
          {"ssm_conv", c.ssm_conv},
          {"ssm_chunk", c.ssm_chunk},
          {"ssm_dt_clamp", {c.ssm_dt_min, c.ssm_dt_max}},
          {"ssm_norm_per_group", c.ssm_norm_per_group},
          {"rope", c.use_rope},
          {"attn_scale", c.attn_scale},
          {"embedding_multiplier", c.embed_mult},
          {"residual_multiplier", c.residual_mult},
          {"logits_scaling", c.logits_scaling},
          {"moe_experts", c.moe_experts},
          {"moe_top_k", c.moe_top_k},
          {"moe_ff", c.moe_ff}};
}

}  // namespace arbiter::hybrid
