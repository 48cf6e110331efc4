// The hybrid family: Mamba2/attention hybrids. GraniteMoeHybridForCausalLM (granite-4.0-h)
// and NemotronHForCausalLM (Nemotron-H, Nemotron 3). Semantics from transformers v5.17's
// modeling_granitemoehybrid.py and modeling_nemotron_h.py (its mixer is Zamba2MambaMixer's);
// GGUF as llama.cpp's converter writes them (granitehybrid, nemotron_h, nemotron_h_moe).
//
// Granite, per layer (pre-norm, both sublayers scaled by residual_multiplier):
//   x += m * mixer(input_layernorm(x)),  mixer = Mamba2 or attention (layer_types)
//   x += m * shared_mlp(xn),             xn = post_attention_layernorm(x); shared_mlp is
//        SwiGLU with gate and up stacked in input_linear
// with the embedding times embedding_multiplier, attention scores times attention_multiplier,
// RoPE only under position_embedding_type "rope", and the logits divided by logits_scaling.
// Nemotron-H: one block per layer, x += block(norm(x)), the block a Mamba2 mixer ('M'),
// attention without RoPE ('*'), a relu2 MLP ('-') or an MoE ('E'), after its pattern string.
//
// The Mamba2 mixer: in_proj gives z [I], xBC [I + 2 G N] and dt [nh]; xBC goes through the
// causal conv (ssm_conv) and the selective scan (ssm_scan, from the layer's state); then
// out_proj(rmsnorm_gated(y, z)). The two models differ inside it in two places, both taken
// from HF's torch paths: the gated norm's RMS (Granite: the full width; Nemotron-H: each of
// the n_groups groups) and dt's clamp (Granite: time_step_limit; Nemotron-H: time_step_min
// from below only, Zamba2MambaMixer's torch_forward).
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/moe_routing.h"
#include "core/error.h"
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "io/json_config.h"
#include "model/archs/decoder_state.h"
#include "model/model.h"
#include "model/rope_config.h"
#include "model/synth.h"

namespace arbiter {

namespace {

enum Global { kEmbed, kOutNorm, kLmHead, kGlobalSlots };
enum Layer {
  kNorm,                                                    // the block's (input) norm
  kInProj, kConvW, kConvB, kALog, kD, kDtBias, kSsmNorm, kOutProj,  // Mamba2 mixer
  kWq, kWk, kWv, kWo,                                       // attention
  kFfnNorm,                                                 // Granite post_attention_layernorm
  kMlpGate, kMlpUp, kMlpOut,  // Granite shared_mlp: input_linear's gate and up rows, output_linear
  kUp, kDown,                                               // Nemotron-H relu2 MLP
  kRouter, kRouterBias,                                     // MoE router (+ Nemotron-H bias)
  kShUp, kShDown,                                           // Nemotron-H shared expert
  // Expert e: gate (Granite) at kExpert0 + 3e, up at + 1, down at + 2; Granite's are views
  // into its 3-D input_linear / output_linear (TensorSpec::hf_stack), GGUF's into _exps.
  kExpert0,
  kMaxExperts = 512,
  kLayerSlots = kExpert0 + 3 * kMaxExperts
};

bool granite(const ModelConfig& c) { return c.arch == "granitemoehybrid"; }

// NemotronHConfig's time_step_min: Zamba2MambaMixer.torch_forward clamps dt from below at it.
constexpr double kNemotronDtMin = 0.001;

// Rows [r0, r0 + n) of a matrix as a matrix of their own (in_proj's z / xBC / dt parts): a
// view into the same storage.
Tensor row_slice(const Tensor& W, int64_t r0, int64_t n, const char* part) {
  Tensor t;
  t.name = W.name + part;
  t.dtype = W.dtype;
  t.shape = {n, W.cols()};
  t.data = W.row(r0);
  return t;
}

// The MoE router of each hybrid, from its config.
RouterSpec router_spec(const ModelConfig& c) {
  RouterSpec r;
  r.n_experts = c.moe_experts;
  r.top_k = c.moe_top_k;
  if (granite(c)) {  // GraniteMoeHybridTopKGating: top-k of the logits, softmax over the k
    r.scoring = RouterScoring::Softmax;
    r.order = RouterOrder::TopKThenScore;
  } else {  // NemotronHTopkRouter (DeepSeek-V3's noaux_tc)
    r.scoring = RouterScoring::Sigmoid;
    r.order = RouterOrder::ScoreThenTopK;
    r.norm_topk_prob = c.moe_norm_topk;
    r.norm_eps = 1e-20;
    r.routed_scaling_factor = c.moe_scaling;
    r.n_group = c.moe_n_group;
    r.topk_group = c.moe_topk_group;
  }
  return r;
}

/// DecoderState's KV caches (attention layers only) and scratch, plus each Mamba2 layer's
/// conv state [K-1, conv_dim] and SSM state [nh, hd, N], and the mixer's scratch.
class HybridState final : public DecoderState {
 public:
  HybridState(Backend& be, const ModelConfig& c, int max_ctx_, int max_T_)
      : DecoderState(be, c, max_ctx_, max_T_, /*ring_sliding=*/false, kv_layers(c)) {
    const int64_t T = max_T_, I = int64_t(c.ssm_heads) * c.ssm_head_dim;
    const int64_t C = I + 2 * int64_t(c.ssm_groups) * c.ssm_state;
    for (int l = 0; l < c.n_layer; ++l) {
      const bool m = c.layer_blocks[size_t(l)] == 'M';
      conv_state.push_back(m ? be.alloc((c.ssm_conv - 1) * C) : Buffer{});
      // The SSM state in the tier's logits type (f32 on cuda, as on cpu; f64 on ref): each
      // token decays and adds to it, so a bf16 state would be rounded T times over.
      ssm_state.push_back(m ? be.alloc(I * c.ssm_state, /*logits=*/true) : Buffer{});
    }
    if (c.moe_experts > 0) {
      router = be.alloc(T * c.moe_experts);
      moe = be.alloc(T * c.d_model);
    }
    z = be.alloc(T * I);
    xbc = be.alloc(T * C);
    xbc_act = be.alloc(T * C);
    dt = be.alloc(T * c.ssm_heads);
    y = be.alloc(T * I);
    yn = be.alloc(T * I);
  }
  ~HybridState() override {
    for (Buffer* b : {&z, &xbc, &xbc_act, &dt, &y, &yn, &router, &moe})
      be_.free(*b);
    for (Buffer& b : conv_state) be_.free(b);
    for (Buffer& b : ssm_state) be_.free(b);
  }
  /// Zeroes every recurrent state (a sequence starting at position 0).
  void clear_recurrent() {
    for (std::vector<Buffer>* v : {&conv_state, &ssm_state})
      for (Buffer& b : *v)
        if (b.n) {
          const std::vector<double> zeros(size_t(b.n), 0.0);
          be_.write(b, 0, b.n, zeros.data());
        }
  }

  /// Layer l's routed experts as Backend::moe reads them, built at the layer's first MoE
  /// forward (a decode step would otherwise rebuild 3E views per layer).
  const Backend::MoeExperts& experts(const Model& m, int l);

  std::vector<Buffer> conv_state, ssm_state;  // [L]; empty on non-Mamba layers
  Buffer z, xbc, xbc_act, dt, y, yn;           // [max_T, ...]
  Buffer router, moe;                          // [max_T, E], [max_T, D]
  int ssm_pos = 0;  // tokens the recurrent states have consumed

 private:
  std::vector<Backend::MoeExperts> experts_;  // [L], filled on first use
  static std::vector<bool> kv_layers(const ModelConfig& c) {
    std::vector<bool> kv(static_cast<size_t>(c.n_layer));
    for (int l = 0; l < c.n_layer; ++l) kv[size_t(l)] = c.layer_blocks[size_t(l)] == '*';
    return kv;
  }
};

const Backend::MoeExperts& HybridState::experts(const Model& m, int l) {
  const ModelConfig& c = m.config;
  if (experts_.empty()) experts_.resize(size_t(c.n_layer));
  Backend::MoeExperts& ex = experts_[size_t(l)];
  if (!ex.up.empty()) return ex;
  auto lw = [&](int slot) -> const Tensor& { return m.weights.layer(l, slot); };
  const int E = c.moe_experts;
  ex.spec = router_spec(c);
  if (granite(c)) {  // views into [E, 2F, D] (gate rows, then up rows) and [E, D, F]
    for (int e = 0; e < E; ++e) {
      ex.gate.push_back(&lw(kExpert0 + 3 * e));
      ex.up.push_back(&lw(kExpert0 + 3 * e + 1));
      ex.down.push_back(&lw(kExpert0 + 3 * e + 2));
    }
  } else {  // Nemotron-H: relu2 experts, a selection bias
    ex.bias = &lw(kRouterBias);
    ex.relu2 = true;
    for (int e = 0; e < E; ++e) {
      ex.up.push_back(&lw(kExpert0 + 3 * e + 1));
      ex.down.push_back(&lw(kExpert0 + 3 * e + 2));
    }
  }
  return ex;
}

class Hybrid final : public Arch {
 public:
  std::string family() const override { return "hybrid"; }
  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    return {{"GraniteMoeHybridForCausalLM", "granitemoehybrid"},
            {"NemotronHForCausalLM", "nemotron_h"}};
  }
  // llama.cpp's names; Nemotron-H with experts is nemotron_h_moe.
  std::vector<std::string> gguf_names() const override {
    return {"granitehybrid", "nemotron_h", "nemotron_h_moe"};
  }
  std::string gguf_arch(const ModelConfig& c) const override {
    return granite(c) ? "granitehybrid" : c.moe_experts > 0 ? "nemotron_h_moe" : "nemotron_h";
  }
  int global_slots() const override { return kGlobalSlots; }
  int layer_slots() const override { return kLayerSlots; }
  std::vector<std::string> stages() const override {
    return {"embed",   "attn_norm", "ssm_z",  "ssm_xbc",   "ssm_dt",  "ssm_conv", "ssm_scan",
            "ssm_norm", "ssm_out",  "q",      "k",         "v",       "q_rope",   "k_rope",
            "attn",    "o",         "attn_res", "ffn_norm", "gate",   "up",       "act",
            "down",    "router",    "moe",    "ffn_out",   "ffn_res", "final_norm", "logits",
            // Last: all_stage_names' order seeds --inject noise; the earlier names keep theirs.
            "ssm_conv_state", "ssm_state"};
  }

  void parse_hf(const JsonConfig& j, ModelConfig& c) const override {
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
  void parse_gguf(const GgufFile& g, ModelConfig& c) const override {
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

  // HF names from transformers' modules; GGUF names and shapes as llama.cpp's converter writes
  // them (conversion/mamba.py, granite.py, nemotron.py; gguf-py tensor_mapping.py): conv1d
  // [C, 1, K] as [C, K], A and D as [nh, 1], the gated norm as [G, I / G], A = -exp(A_log),
  // Granite's input_linear split into gate and up (ffn_gate/ffn_up, the shared expert's
  // _shexp when there are experts, the experts' ffn_{gate,up}_exps).
  std::vector<TensorSpec> tensors(const ModelConfig& c) const override {
    const bool g = granite(c);
    const int64_t D = c.d_model, Dh = c.head_dim, V = c.vocab, F = c.d_ff;
    const int64_t Hq = int64_t(c.n_head) * Dh, Hk = int64_t(c.n_head_kv) * Dh;
    const int64_t nh = c.ssm_heads, I = nh * c.ssm_head_dim, G = c.ssm_groups;
    const int64_t C = I + 2 * G * c.ssm_state;
    const std::string root = g ? "model." : "backbone.";
    std::vector<TensorSpec> t;
    auto global = [&](const char* role, int slot, const std::string& hf, const char* gguf,
                      std::vector<int64_t> shape, TensorKind kind, const char* family) {
      TensorSpec s;
      s.role = role, s.slot = slot, s.hf = hf, s.gguf = gguf, s.shape = std::move(shape);
      s.kind = kind, s.family = family;
      t.push_back(std::move(s));
      return &t.back();
    };
    global("embed", kEmbed, root + (g ? "embed_tokens.weight" : "embeddings.weight"),
           "token_embd.weight", {V, D}, TensorKind::Matrix, "embed");
    global("out_norm", kOutNorm, root + (g ? "norm.weight" : "norm_f.weight"),
           "output_norm.weight", {D}, TensorKind::Norm, "norm");
    global("lm_head", kLmHead, "lm_head.weight", "output.weight", {V, D}, TensorKind::Matrix,
           "logits")
        ->tie_to = "embed";
    for (int l = 0; l < c.n_layer; ++l) {
      const char b = c.layer_blocks[size_t(l)];
      const std::string hf = root + "layers." + std::to_string(l) + ".";
      const std::string gg = "blk." + std::to_string(l) + ".";
      auto layer = [&](const std::string& role, int slot, const std::string& name,
                       const std::string& gguf, std::vector<int64_t> shape, TensorKind kind,
                       const char* family) -> TensorSpec& {
        TensorSpec s;
        s.role = role, s.slot = slot, s.layer = l, s.hf = name.empty() ? "" : hf + name;
        s.gguf = gguf.empty() ? "" : gg + gguf, s.shape = std::move(shape);
        s.kind = kind, s.family = family;
        t.push_back(std::move(s));
        return t.back();
      };
      layer("norm", kNorm, g ? "input_layernorm.weight" : "norm.weight", "attn_norm.weight", {D},
            TensorKind::Norm, "norm");
      const std::string mixer = g ? (b == 'M' ? "mamba." : "self_attn.") : "mixer.";
      if (b == 'M') {
        layer("ssm_in", kInProj, mixer + "in_proj.weight", "ssm_in.weight", {I + C + nh, D},
              TensorKind::Matrix, "ssm");
        layer("ssm_conv1d", kConvW, mixer + "conv1d.weight", "ssm_conv1d.weight",
              {C, 1, c.ssm_conv}, TensorKind::Bias, "ssm")
            .gguf_shape = {C, c.ssm_conv};
        if (c.ssm_conv_bias)
          layer("ssm_conv1d_b", kConvB, mixer + "conv1d.bias", "ssm_conv1d.bias", {C},
                TensorKind::Bias, "ssm");
        TensorSpec& a = layer("ssm_a_log", kALog, mixer + "A_log", "ssm_a", {nh}, TensorKind::Bias,
                              "ssm");
        a.gguf_shape = {nh, 1};
        a.gguf_value = TensorSpec::GgufValue::NegExp;
        layer("ssm_d", kD, mixer + "D", "ssm_d", {nh}, TensorKind::Norm, "ssm").gguf_shape = {nh, 1};
        layer("ssm_dt_bias", kDtBias, mixer + "dt_bias", "ssm_dt.bias", {nh}, TensorKind::Bias,
              "ssm");
        layer("ssm_norm", kSsmNorm, mixer + "norm.weight", "ssm_norm.weight", {I},
              TensorKind::Norm, "norm")
            .gguf_shape = {G, I / G};
        layer("ssm_out", kOutProj, mixer + "out_proj.weight", "ssm_out.weight", {D, I},
              TensorKind::Matrix, "ssm");
      } else if (b == '*') {
        layer("wq", kWq, mixer + "q_proj.weight", "attn_q.weight", {Hq, D}, TensorKind::Matrix,
              "attn");
        layer("wk", kWk, mixer + "k_proj.weight", "attn_k.weight", {Hk, D}, TensorKind::Matrix,
              "attn");
        layer("wv", kWv, mixer + "v_proj.weight", "attn_v.weight", {Hk, D}, TensorKind::Matrix,
              "attn");
        layer("wo", kWo, mixer + "o_proj.weight", "attn_output.weight", {D, Hq},
              TensorKind::Matrix, "attn");
      } else if (b == '-') {
        layer("w_up", kUp, "mixer.up_proj.weight", "ffn_up.weight", {F, D}, TensorKind::Matrix,
              "mlp");
        layer("w_down", kDown, "mixer.down_proj.weight", "ffn_down.weight", {D, F},
              TensorKind::Matrix, "mlp");
      } else if (b == 'E') {
        const int64_t E = c.moe_experts, Fe = c.moe_ff, Fs = c.moe_shared_ff;
        layer("router", kRouter, "mixer.gate.weight", "ffn_gate_inp.weight", {E, D},
              TensorKind::Matrix, "mlp");
        layer("router_bias", kRouterBias, "mixer.gate.e_score_correction_bias",
              "exp_probs_b.bias", {E}, TensorKind::Bias, "mlp");
        for (int e = 0; e < E; ++e) {
          const std::string x = "mixer.experts." + std::to_string(e) + ".";
          const std::string n = std::to_string(e);
          layer("expert_up." + n, kExpert0 + 3 * e + 1, x + "up_proj.weight", "", {Fe, D},
                TensorKind::Matrix, "mlp")
              .gguf_stack = {gg + "ffn_up_exps.weight", E, Fe, e, 0};
          layer("expert_down." + n, kExpert0 + 3 * e + 2, x + "down_proj.weight", "", {D, Fe},
                TensorKind::Matrix, "mlp")
              .gguf_stack = {gg + "ffn_down_exps.weight", E, D, e, 0};
        }
        layer("shared_up", kShUp, "mixer.shared_experts.up_proj.weight", "ffn_up_shexp.weight",
              {Fs, D}, TensorKind::Matrix, "mlp");
        layer("shared_down", kShDown, "mixer.shared_experts.down_proj.weight",
              "ffn_down_shexp.weight", {D, Fs}, TensorKind::Matrix, "mlp");
      }
      if (g) {
        const bool moe = c.moe_experts > 0;
        layer("ffn_norm", kFfnNorm, "post_attention_layernorm.weight", "ffn_norm.weight", {D},
              TensorKind::Norm, "norm");
        // shared_mlp.input_linear [2F, D]: HF's chunk(2), gate rows first, then up.
        const std::string in = hf + "shared_mlp.input_linear.weight";
        layer("mlp_gate", kMlpGate, "", moe ? "ffn_gate_shexp.weight" : "ffn_gate.weight", {F, D},
              TensorKind::Matrix, "mlp")
            .hf_stack = {in, 0, 2 * F, 0, 0};
        layer("mlp_up", kMlpUp, "", moe ? "ffn_up_shexp.weight" : "ffn_up.weight", {F, D},
              TensorKind::Matrix, "mlp")
            .hf_stack = {in, 0, 2 * F, 0, F};
        layer("mlp_out", kMlpOut, "shared_mlp.output_linear.weight",
              moe ? "ffn_down_shexp.weight" : "ffn_down.weight", {D, F}, TensorKind::Matrix, "mlp");
        if (moe) {
          const int64_t E = c.moe_experts, Fe = c.moe_ff;
          layer("router", kRouter, "block_sparse_moe.router.layer.weight", "ffn_gate_inp.weight",
                {E, D}, TensorKind::Matrix, "mlp");
          const std::string ein = hf + "block_sparse_moe.input_linear.weight";
          const std::string eout = hf + "block_sparse_moe.output_linear.weight";
          for (int e = 0; e < E; ++e) {
            const std::string n = std::to_string(e);
            TensorSpec& wg = layer("expert_gate." + n, kExpert0 + 3 * e, "", "", {Fe, D},
                                   TensorKind::Matrix, "mlp");
            wg.hf_stack = {ein, E, 2 * Fe, e, 0};
            wg.gguf_stack = {gg + "ffn_gate_exps.weight", E, Fe, e, 0};
            TensorSpec& wu = layer("expert_up." + n, kExpert0 + 3 * e + 1, "", "", {Fe, D},
                                   TensorKind::Matrix, "mlp");
            wu.hf_stack = {ein, E, 2 * Fe, e, Fe};
            wu.gguf_stack = {gg + "ffn_up_exps.weight", E, Fe, e, 0};
            TensorSpec& wd = layer("expert_down." + n, kExpert0 + 3 * e + 2, "", "", {D, Fe},
                                   TensorKind::Matrix, "mlp");
            wd.hf_stack = {eout, E, D, e, 0};
            wd.gguf_stack = {gg + "ffn_down_exps.weight", E, D, e, 0};
          }
        }
      }
    }
    return t;
  }

  std::unique_ptr<ForwardState> make_state(const Model& m, Backend& be, int max_ctx,
                                           int max_T) const override {
    return std::make_unique<HybridState>(be, m.config, max_ctx, max_T);
  }

  void forward(const Model& m, Backend& be, ForwardState& state,
               const ForwardArgs& a) const override {
    HybridState& s = static_cast<HybridState&>(state);
    const ModelConfig& c = m.config;
    const Weights& w = m.weights;
    const int T = a.T, pos0 = a.pos0, D = c.d_model;
    ARB_CHECK(T >= 1 && T <= s.max_T, "[model] forward of %d tokens exceeds scratch width %d", T,
              s.max_T);
    ARB_CHECK(pos0 + T <= s.max_ctx, "[model] position %d exceeds the KV cache (%d rows)",
              pos0 + T, s.max_ctx);
    ARB_CHECK(a.ids || T == 1, "[model] a forward of %d picked tokens (only one is kept)", T);
    // The recurrent states hold a summary of every token before pos0: they continue a
    // sequence or start one, and cannot rewind.
    if (pos0 == 0) s.clear_recurrent(), s.ssm_pos = 0;
    ARB_CHECK(pos0 == s.ssm_pos,
              "[model] %s: a forward at position %d, but the Mamba2 states hold %d tokens (they "
              "cannot rewind; start again at 0)",
              c.arch.c_str(), pos0, s.ssm_pos);
    const Stages tap(a.hook, pos0, T, a.routes);

    const Tensor& embed = w.global(kEmbed);
    if (a.ids) be.embed(embed, a.ids, T, s.x);  // x [T, D]
    else be.embed_picked(embed, s.x);
    if (c.embed_mult != 1) be.scale(s.x, int64_t(T) * D, c.embed_mult);
    be.apply_tap(tap("embed", -1, "embed", D, 1, 3), s.x, T, D);

    for (int l = 0; l < c.n_layer; ++l) {
      const char b = c.layer_blocks[size_t(l)];
      const bool ffn_block = b == '-' || b == 'E';  // Nemotron-H's MLP and MoE blocks
      // Each block: x += residual_multiplier * block(rmsnorm(x)), the norm and the residual
      // add fused into the block's first and last matmuls (Backend's fused ops).
      const Block in{w.layer(l, kNorm), ffn_block ? "ffn_norm" : "attn_norm",
                     ffn_block ? "ffn_res" : "attn_res"};
      if (b == 'M') mamba(m, be, s, l, T, pos0, in, tap);
      else if (b == '*') attention(m, be, s, l, T, pos0, in, tap);
      else if (b == '-') mlp(m, be, s, l, T, in, tap);
      else moe(m, be, s, l, T, in, tap);
      if (!granite(c)) continue;
      const Block ffn{w.layer(l, kFfnNorm), "ffn_norm", "ffn_res"};
      if (c.moe_experts > 0) moe(m, be, s, l, T, ffn, tap);
      else mlp(m, be, s, l, T, ffn, tap);
    }
    s.ssm_pos = pos0 + T;
    if (!a.logits) return;
    const Backend::MatmulTarget head = {&w.global(kLmHead), nullptr, &s.logits, nullptr};
    be.rmsnorm_matmul(s.x, w.global(kOutNorm), NormWeight::Plain, T, D, c.norm_eps, s.xn,
                      tap("final_norm", -1, "rmsnorm", D, D, 3), &head, 1);  // [T, V]
    if (c.logits_scaling != 1) be.scale(s.logits, int64_t(T) * c.vocab, 1.0 / c.logits_scaling);
    be.apply_tap(tap("logits", -1, "matmul", c.vocab, D, c.logits_scaling != 1 ? 4 : 3),
                 s.logits, T, c.vocab);
  }

  std::vector<SynthPreset> presets() const override;

  // Every key parse_granite / parse_nemotron reads, as the Hub's configs spell them (the
  // generic ones are model/synth.cpp's), so the directory loads back as the same config.
  void hf_config_json(const ModelConfig& c, nlohmann::json& j) const override {
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
  void gguf_metadata(const ModelConfig& c, GgufWriter& g) const override {
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
  RopeLayout gguf_rope_layout(const std::string&) const override { return RopeLayout::Half; }

  nlohmann::ordered_json describe(const ModelConfig& c) const override {
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

  // Arch's default (every distinct tensor once), but a decode step reads only k of the E
  // routed experts' matrices.
  double weight_bytes_per_token(const Model& m) const override {
    const ModelConfig& c = m.config;
    double w = Arch::weight_bytes_per_token(m), experts = 0;
    for (const TensorSpec& s : m.weights.specs)
      if (s.role.rfind("expert", 0) == 0) experts += double(m.weights.at(s).nbytes());
    if (c.moe_experts > 0) w -= experts * (1.0 - double(c.moe_top_k) / c.moe_experts);
    return w;
  }

  // K and V of the attention layers over ctx keys, plus each Mamba2 layer's recurrent state,
  // which a step reads whole and writes back whole whatever the context: the conv window
  // [K-1, C] at elem_bytes and the SSM state [nh, hd, N] in the tier's logits type (HybridState:
  // f32 where the cache is bf16, f16 or f32; f64 on ref, whose cache is f64).
  double state_bytes_per_token(const ModelConfig& c, double ctx, int elem_bytes) const override {
    double attn = 0, mamba = 0;
    const double I = double(c.ssm_heads) * c.ssm_head_dim;
    const double C = I + 2.0 * c.ssm_groups * c.ssm_state;
    for (char b : c.layer_blocks) {
      if (b == '*') attn += 1;
      if (b == 'M') mamba += 1;
    }
    const int ssm_bytes = std::max(elem_bytes, 4);
    return 2.0 * attn * ctx * c.n_head_kv * c.head_dim * elem_bytes +
           2.0 * mamba * ((c.ssm_conv - 1) * C * elem_bytes + I * c.ssm_state * ssm_bytes);
  }

  // 2 x (matmul weights incl. the output matrix) + 4 H Dh keys per attention layer + the
  // scan's ~6 flops per state element per token.
  double flops_per_token(const ModelConfig& c, int T, int pos0) const override {
    const double D = c.d_model, F = c.d_ff, Hq = double(c.n_head) * c.head_dim;
    const double Hk = double(c.n_head_kv) * c.head_dim;
    const double nh = c.ssm_heads, I = nh * c.ssm_head_dim;
    const double C = I + 2.0 * c.ssm_groups * c.ssm_state;
    double matmul = double(c.vocab) * D, scan = 0, attn_layers = 0;
    for (char b : c.layer_blocks) {
      if (b == 'M') matmul += D * (I + C + nh) + I * D, scan += 6 * I * c.ssm_state;
      if (b == '*') matmul += 2 * D * Hq + 2 * D * Hk, attn_layers += 1;
      if (b == '-') matmul += 2 * D * F;
      if (granite(c)) matmul += 3 * D * F;
      const bool moe = b == 'E' || (granite(c) && c.moe_experts > 0);
      if (moe)  // router + k experts (+ Nemotron-H's shared expert; Granite's is counted above)
        matmul += D * c.moe_experts + double(c.moe_top_k) * (granite(c) ? 3 : 2) * D * c.moe_ff +
                  (granite(c) ? 0 : 2 * D * c.moe_shared_ff);
    }
    const double keys = double(pos0) + (T + 1) / 2.0;  // mean keys attended per token
    return 2.0 * matmul + scan + 4.0 * Hq * keys * attn_layers;
  }

 private:
  // A block's norm weight and the names of its norm and residual stages.
  struct Block {
    const Tensor& w;
    const char* norm;
    const char* res;
  };
  // x += residual_multiplier * out_proj(rmsnorm_gated(scan(conv(xBC)), z)), z/xBC/dt of
  // rmsnorm(x).
  static void mamba(const Model& m, Backend& be, HybridState& s, int l, int T, int pos0,
                    const Block& in, const Stages& tap) {
    const ModelConfig& c = m.config;
    auto lw = [&](int slot) -> const Tensor& { return m.weights.layer(l, slot); };
    const int D = c.d_model, nh = c.ssm_heads, hd = c.ssm_head_dim, N = c.ssm_state;
    const int G = c.ssm_groups, I = nh * hd, C = I + 2 * G * N, K = c.ssm_conv;
    const Tensor& in_proj = lw(kInProj);
    const Tensor wz = row_slice(in_proj, 0, I, "[z]"), wxbc = row_slice(in_proj, I, C, "[xBC]");
    const Tensor wdt = row_slice(in_proj, I + C, nh, "[dt]");
    const StageTap* norm = tap(in.norm, l, "rmsnorm", D, D, 3);
    const Backend::MatmulTarget proj[3] = {
        {&wz, nullptr, &s.z, tap("ssm_z", l, "matmul", I, D, 3)},          // z [T, I]
        {&wxbc, nullptr, &s.xbc, tap("ssm_xbc", l, "matmul", C, D, 3)},  // xBC [T, C]
        {&wdt, nullptr, &s.dt, tap("ssm_dt", l, "matmul", nh, D, 3)}};   // dt [T, nh]
    be.rmsnorm_matmul(s.x, in.w, NormWeight::Plain, T, D, c.norm_eps, s.xn, norm, proj, 3);
    const Tensor* conv_b = c.ssm_conv_bias ? &lw(kConvB) : nullptr;
    be.ssm_conv(s.xbc, lw(kConvW), conv_b, T, C, K, s.conv_state[size_t(l)], s.xbc_act);
    be.apply_tap(tap("ssm_conv", l, "ssm_conv", C, K + 1, 4), s.xbc_act, T, C);
    // The conv state keeps the last K-1 input rows: a copy of xBC, one rounding to its type.
    be.apply_tap(tap.state("ssm_conv_state", l, "ssm_conv", K - 1, C, 1, 1),
                 s.conv_state[size_t(l)], K - 1, C);
    be.ssm_scan(s.xbc_act, s.dt, lw(kALog), lw(kD), lw(kDtBias), c.ssm_dt_min, c.ssm_dt_max, T,
                nh, hd, G, N, c.ssm_chunk, s.ssm_state[size_t(l)], s.y);
    // Each output sums N state terms; each state carries every earlier token's update; a
    // prefill's chunked form (cpu, cuda) adds a chunk's terms, each with its summed decays.
    const int chunk_terms = T > 1 ? 2 * std::min(c.ssm_chunk, T) : 0;
    be.apply_tap(tap("ssm_scan", l, "ssm_scan", I, N + pos0 + T + chunk_terms, 6), s.y, T, I);
    // The state [nh, hd * N], one row per head: each element sums every token's decayed
    // update so far (plus the chunked form's terms), without the output's sum over N.
    be.apply_tap(tap.state("ssm_state", l, "ssm_scan", nh, hd * N, pos0 + T + chunk_terms, 6),
                 s.ssm_state[size_t(l)], nh, hd * N);
    const int group = c.ssm_norm_per_group ? I / G : I;
    be.rmsnorm_gated(s.y, s.z, lw(kSsmNorm), T, I, group, c.norm_eps, s.yn);
    be.apply_tap(tap("ssm_norm", l, "rmsnorm_gated", I, group, 4), s.yn, T, I);
    const StageTap* out = tap("ssm_out", l, "matmul", D, I, 3);
    be.matmul_add(s.yn, lw(kOutProj), T, s.o, s.x, c.residual_mult, out, residual_tap(c, in, l, tap));
  }

  // x += residual_multiplier * o_proj(attention(q, k, v)), q/k/v of rmsnorm(x), RoPE'd when
  // the config says so.
  static void attention(const Model& m, Backend& be, HybridState& s, int l, int T, int pos0,
                        const Block& in, const Stages& tap) {
    const ModelConfig& c = m.config;
    auto lw = [&](int slot) -> const Tensor& { return m.weights.layer(l, slot); };
    const int D = c.d_model, H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim;
    const int q_dim = H * Dh, kv_dim = Hkv * Dh;
    const char* q_stage = c.use_rope ? "q_rope" : "q";
    const char* k_stage = c.use_rope ? "k_rope" : "k";
    const AttentionGeometry geo{q_stage, k_stage, "v", H, Hkv, Dh, 0, c.attn_scale};
    const StageTap* norm = tap(in.norm, l, "rmsnorm", D, D, 3);
    const Backend::MatmulTarget qkv[3] = {
        {&lw(kWq), nullptr, &s.q, tap("q", l, "matmul", q_dim, D, 3)},
        {&lw(kWk), nullptr, &s.k, tap("k", l, "matmul", kv_dim, D, 3)},
        {&lw(kWv), nullptr, &s.v, tap("v", l, "matmul", kv_dim, D, 3)}};
    be.rmsnorm_matmul(s.x, in.w, NormWeight::Plain, T, D, c.norm_eps, s.xn, norm, qkv, 3);
    Buffer &kc = s.k_cache[size_t(l)], &vc = s.v_cache[size_t(l)];
    if (c.use_rope) {
      Backend::AttentionTaps at;
      at.q_rope = tap("q_rope", l, "rope", q_dim, 2, 3);
      at.k_rope = tap("k_rope", l, "rope", kv_dim, 2, 3);
      at.out = tap("attn", l, "attention", q_dim, std::max(Dh, pos0 + T), 4, &geo);
      be.qk_rope_attention(s.q, s.k, s.v, nullptr, nullptr, NormWeight::Plain, c.norm_eps, T, H,
                           Hkv, Dh, pos0, c.rope, kc, vc, 0, {c.attn_scale, 0}, s.att, at);
    } else {
      be.kv_store(s.k, s.v, kc, vc, T, pos0, kv_dim);
      be.scaled_attention(s.q, kc, vc, T, pos0, H, Hkv, Dh, 0, c.attn_scale, 0, s.att);
      be.apply_tap(tap("attn", l, "attention", q_dim, std::max(Dh, pos0 + T), 4, &geo), s.att,
                   T, q_dim);
    }
    const StageTap* o = tap("o", l, "matmul", D, q_dim, 3);
    be.matmul_add(s.att, lw(kWo), T, s.o, s.x, c.residual_mult, o, residual_tap(c, in, l, tap));
  }

  // x += residual_multiplier * mlp(rmsnorm(x)): Granite's shared SwiGLU MLP or Nemotron-H's
  // relu2 MLP as a block of its own (no experts).
  static void mlp(const Model& m, Backend& be, HybridState& s, int l, int T, const Block& in,
                  const Stages& tap) {
    const ModelConfig& c = m.config;
    auto lw = [&](int slot) -> const Tensor& { return m.weights.layer(l, slot); };
    const int D = c.d_model, F = c.d_ff;
    const StageTap* norm = tap(in.norm, l, "rmsnorm", D, D, 3);
    const Tensor* down = nullptr;
    if (granite(c)) {
      Backend::GluTaps ft;
      ft.norm = norm;
      ft.gate = tap("gate", l, "matmul", F, D, 3);
      ft.up = tap("up", l, "matmul", F, D, 3);
      ft.act = tap("act", l, "swiglu", F, 1, 3);
      be.rmsnorm_glu(s.x, in.w, NormWeight::Plain, T, D, c.norm_eps, s.xn, lw(kMlpGate),
                     lw(kMlpUp), GluAct::SiLU, s.gate, s.up, s.act, ft);
      down = &lw(kMlpOut);
    } else {
      const Backend::MatmulTarget up = {&lw(kUp), nullptr, &s.up, tap("up", l, "matmul", F, D, 3)};
      be.rmsnorm_matmul(s.x, in.w, NormWeight::Plain, T, D, c.norm_eps, s.xn, norm, &up, 1);
      be.relu2(s.up, int64_t(T) * F, s.act);
      be.apply_tap(tap("act", l, "relu2", F, 1, 3), s.act, T, F);
      down = &lw(kDown);
    }
    const StageTap* product = tap("down", l, "matmul", D, F, 3);
    be.matmul_add(s.act, *down, T, s.o, s.x, c.residual_mult, product, residual_tap(c, in, l, tap));
  }

  // o [T, D]: the MoE block's shared expert of xn (Granite's shared SwiGLU MLP, Nemotron-H's
  // relu2 one).
  static void shared_expert(const Model& m, Backend& be, HybridState& s, int l, int T,
                            const Stages& tap) {
    const ModelConfig& c = m.config;
    auto lw = [&](int slot) -> const Tensor& { return m.weights.layer(l, slot); };
    const int D = c.d_model, F = granite(c) ? c.d_ff : c.moe_shared_ff;
    if (granite(c)) {
      be.matmul(s.xn, lw(kMlpGate), nullptr, T, s.gate);
      be.apply_tap(tap("gate", l, "matmul", F, D, 3), s.gate, T, F);
      be.matmul(s.xn, lw(kMlpUp), nullptr, T, s.up);
      be.apply_tap(tap("up", l, "matmul", F, D, 3), s.up, T, F);
      be.swiglu(s.gate, s.up, int64_t(T) * F, s.act);
      be.apply_tap(tap("act", l, "swiglu", F, 1, 3), s.act, T, F);
      be.matmul(s.act, lw(kMlpOut), nullptr, T, s.o);
    } else {
      be.matmul(s.xn, lw(kShUp), nullptr, T, s.up);
      be.apply_tap(tap("up", l, "matmul", F, D, 3), s.up, T, F);
      be.relu2(s.up, int64_t(T) * F, s.act);
      be.apply_tap(tap("act", l, "relu2", F, 1, 3), s.act, T, F);
      be.matmul(s.act, lw(kShDown), nullptr, T, s.o);
    }
    be.apply_tap(tap("down", l, "matmul", D, F, 3), s.o, T, D);
  }

  // x += residual_multiplier * (shared expert(xn) + the routed sum), xn = rmsnorm(x); the
  // routed sum is Backend::moe, the op every MoE family calls (experts in ascending index per token, HF's index_add over the experts hit).
  // Granite's experts are the loader's views into its 3-D stacks (TensorSpec::hf_stack,
  // gguf_stack).
  static void moe(const Model& m, Backend& be, HybridState& s, int l, int T, const Block& in,
                  const Stages& tap) {
    const ModelConfig& c = m.config;
    auto lw = [&](int slot) -> const Tensor& { return m.weights.layer(l, slot); };
    const int D = c.d_model, E = c.moe_experts, Fe = c.moe_ff;
    // The router, the experts and the shared expert all read xn: the norm stays on its own.
    be.rmsnorm(s.x, in.w, T, D, c.norm_eps, s.xn);
    be.apply_tap(tap(in.norm, l, "rmsnorm", D, D, 3), s.xn, T, D);
    be.matmul(s.xn, lw(kRouter), nullptr, T, s.router);  // [T, E]
    be.apply_tap(tap("router", l, "matmul", E, D, 3), s.router, T, E);
    const Backend::MoeExperts& ex = s.experts(m, l);
    std::vector<Route> routes;
    be.moe(s.router, s.xn, ex, T, s.moe, tap.wants_routes() ? &routes : nullptr);
    for (int t = 0; t < int(routes.size()); ++t)
      tap.route(l, t, routes[size_t(t)].ids, routes[size_t(t)].margin, E,
                router_score_name(ex.spec));
    be.apply_tap(tap("moe", l, "moe", D, int64_t(c.moe_top_k) * Fe, 4), s.moe, T, D);
    shared_expert(m, be, s, l, T, tap);  // s.o
    be.add(s.o, s.moe, int64_t(T) * D);
    be.apply_tap(tap("ffn_out", l, "add", D, 1, 3), s.o, T, D);
    if (c.residual_mult != 1) be.scale(s.o, int64_t(T) * D, c.residual_mult);
    be.add(s.x, s.o, int64_t(T) * D);
    be.apply_tap(residual_tap(c, in, l, tap), s.x, T, D);
  }

  // The stage of x += residual_multiplier * o (Granite; Nemotron-H adds o as it is).
  static const StageTap* residual_tap(const ModelConfig& c, const Block& in, int l,
                                      const Stages& tap) {
    return tap(in.res, l, "add", c.d_model, 1, c.residual_mult != 1 ? 4 : 3);
  }

  // "mamba"/"attention" (the Hub's configs) or "linear_attention"/"full_attention"
  // (transformers 5.17 writes these); absent: every layer Mamba2 (GraniteMoeHybridConfig).
  static void parse_granite(const JsonConfig& j, ModelConfig& c) {
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

  static void parse_nemotron(const JsonConfig& j, ModelConfig& c) {
    c.d_model = j.positive_int("hidden_size");
    c.n_head = j.positive_int("num_attention_heads", 32);
    c.n_head_kv = j.positive_int("num_key_value_heads", c.n_head);
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

  static void check_router(const JsonConfig& j, const ModelConfig& c, const char* keys) {
    if (const char* why = router_spec_problem(router_spec(c)))
      j.fail(std::string("MoE routing (") + keys + "): " + why);
  }

  static int head_dim(const JsonConfig& j, const ModelConfig& c) {
    if (j.has("head_dim")) return j.positive_int("head_dim");
    if (c.d_model % c.n_head != 0)
      j.fail(strformat("hidden_size %d is not a multiple of num_attention_heads %d", c.d_model,
                       c.n_head));
    return c.d_model / c.n_head;
  }

  // A list of layer types into c.layer_blocks (n_layer < 0: its length sets the layer count).
  static void read_blocks(const JsonConfig& j, const char* key, int n_layer, bool nemotron,
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
  static void read_dt_limit(const JsonConfig& j, ModelConfig& c) {
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
};

// Each preset is the official config.json's keys read by parse_hf, so a preset holds what
// loading that file gives. Sources, read 2026-12 (the Hub is not reachable from the machine
// these were written on: each is the file as quoted verbatim elsewhere, named per preset).
std::vector<SynthPreset> Hybrid::presets() const {
  std::vector<SynthPreset> p;
  auto add = [&](const char* name, const char* hf_id, const char* cls, const char* source,
                 const char* arch, nlohmann::json keys, std::vector<std::string> specials,
                 int bos, int eos) {
    SynthPreset s;
    s.name = name, s.hf_id = hf_id, s.hf_class = cls, s.source = source;
    s.config.arch = arch;
    const JsonConfig j(keys.dump(), std::string("synth preset ") + name);
    parse_hf(j, s.config);
    s.specials = std::move(specials), s.bos = bos, s.eos = eos, s.add_bos = false;
    p.push_back(std::move(s));
  };
  // Granite 4.0-H: attention at layers 5, 15, 25 and 35 of 40, the rest Mamba2.
  nlohmann::json granite40 = nlohmann::json::array();
  for (int l = 0; l < 40; ++l) granite40.push_back(l % 10 == 5 ? "attention" : "mamba");
  // <|end_of_text|> 100257 is BOS and EOS, <|pad|> 100256; Granite adds no BOS.
  const std::vector<std::string> granite_specials = {"<|end_of_text|>", "<|pad|>"};
  const nlohmann::json granite_common = {
      {"hidden_act", "silu"},       {"rms_norm_eps", 1e-5},        {"vocab_size", 100352},
      {"tie_word_embeddings", true}, {"position_embedding_type", "nope"},
      {"rope_theta", 10000},        {"mamba_expand", 2},           {"mamba_n_groups", 1},
      {"mamba_d_state", 128},       {"mamba_d_conv", 4},           {"mamba_conv_bias", true},
      {"mamba_proj_bias", false},   {"attention_bias", false},     {"embedding_multiplier", 12}};
  auto granite_keys = [&](nlohmann::json own) {
    nlohmann::json k = granite_common;
    k.update(own);
    return k;
  };
  add("granite-4.0-h-tiny", "ibm-granite/granite-4.0-h-tiny", "GraniteMoeHybridForCausalLM",
      "huggingface.co/ibm-granite/granite-4.0-h-tiny config.json as quoted in public code "
      "(dimensions, layer_types and mamba_* keys verbatim; hidden 1536, 40 layers, 64 experts "
      "top-6 of 512, shared 1024, embedding_multiplier 12, logits_scaling 6, rms_norm_eps "
      "1e-5); attention_multiplier 0.0078125 (= 1 / head_dim 128) and residual_multiplier "
      "0.22 are the Granite 4.0 values, not found quoted for this file",
      "granitemoehybrid",
      granite_keys({{"hidden_size", 1536}, {"num_hidden_layers", 40},
                    {"num_attention_heads", 12}, {"num_key_value_heads", 4},
                    {"max_position_embeddings", 131072}, {"shared_intermediate_size", 1024},
                    {"intermediate_size", 512}, {"num_local_experts", 64},
                    {"num_experts_per_tok", 6}, {"mamba_n_heads", 48}, {"mamba_d_head", 64},
                    {"mamba_chunk_size", 256}, {"layer_types", granite40},
                    {"attention_multiplier", 0.0078125}, {"residual_multiplier", 0.22},
                    {"logits_scaling", 6}}),
      granite_specials, 0, 0);
  add("granite-4.0-h-1b", "ibm-granite/granite-4.0-h-1b", "GraniteMoeHybridForCausalLM",
      "huggingface.co/ibm-granite/granite-4.0-h-1b config.json as quoted in public code "
      "(dimensions, layer_types and mamba_* keys verbatim: hidden 1536, 40 layers, dense, "
      "shared 4096); the four multipliers were not found quoted for this file and are "
      "granite-4.0-h-tiny's (they change no shape or byte count)",
      "granitemoehybrid",
      granite_keys({{"hidden_size", 1536}, {"num_hidden_layers", 40},
                    {"num_attention_heads", 12}, {"num_key_value_heads", 4},
                    {"max_position_embeddings", 131072}, {"shared_intermediate_size", 4096},
                    {"intermediate_size", 4096}, {"num_local_experts", 0},
                    {"num_experts_per_tok", 0}, {"mamba_n_heads", 48}, {"mamba_d_head", 64},
                    {"mamba_chunk_size", 256}, {"layer_types", granite40},
                    {"attention_multiplier", 0.0078125}, {"residual_multiplier", 0.22},
                    {"logits_scaling", 6}}),
      granite_specials, 0, 0);
  nlohmann::json granite32 = nlohmann::json::array();
  for (int l = 0; l < 32; ++l)
    granite32.push_back(l == 10 || l == 13 || l == 17 || l == 27 ? "attention" : "mamba");
  add("granite-4.0-h-350m", "ibm-granite/granite-4.0-h-350m", "GraniteMoeHybridForCausalLM",
      "ibm-granite/granite-4.0-h-350m's config.json as an MLX conversion's test quotes it "
      "(every key used here but mamba_chunk_size, which is at the class default 256)",
      "granitemoehybrid",
      granite_keys({{"hidden_size", 768}, {"num_hidden_layers", 32},
                    {"num_attention_heads", 12}, {"num_key_value_heads", 4},
                    {"max_position_embeddings", 32768}, {"shared_intermediate_size", 2048},
                    {"intermediate_size", 2048}, {"num_local_experts", 0},
                    {"num_experts_per_tok", 0}, {"mamba_n_heads", 48}, {"mamba_d_head", 32},
                    {"layer_types", granite32}, {"attention_multiplier", 0.015625},
                    {"residual_multiplier", 0.246}, {"logits_scaling", 3}}),
      granite_specials, 0, 0);
  // Nemotron 3 Nano: 23 Mamba2, 23 MoE and 6 attention blocks. <s> 1, </s> 2 (eos_token_id).
  add("nemotron-3-nano-30b-a3b", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
      "NemotronHForCausalLM",
      "huggingface.co/nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 config.json as quoted "
      "verbatim in public code (every key used here)",
      "nemotron_h",
      {{"hidden_size", 2688},
       {"hybrid_override_pattern", "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"},
       {"num_attention_heads", 32}, {"num_key_value_heads", 2}, {"head_dim", 128},
       {"intermediate_size", 1856}, {"layer_norm_epsilon", 1e-5}, {"vocab_size", 131072},
       {"max_position_embeddings", 262144}, {"tie_word_embeddings", false},
       {"mamba_num_heads", 64}, {"mamba_head_dim", 64}, {"n_groups", 8},
       {"ssm_state_size", 128}, {"conv_kernel", 4}, {"chunk_size", 128},
       {"use_conv_bias", true}, {"time_step_min", 0.001}, {"mamba_hidden_act", "silu"},
       {"mlp_hidden_act", "relu2"}, {"n_routed_experts", 128}, {"num_experts_per_tok", 6},
       {"moe_intermediate_size", 1856}, {"moe_shared_expert_intermediate_size", 3712},
       {"n_shared_experts", 1}, {"norm_topk_prob", true}, {"routed_scaling_factor", 2.5},
       {"n_group", 1}, {"topk_group", 1}, {"attention_bias", false}, {"mlp_bias", false},
       {"use_bias", false}},
      {"<unk>", "<s>", "</s>"}, 1, 2);
  // Ours: small shapes that cover each family's blocks (Granite's MoE with its shared MLP and
  // RoPE; every Nemotron-H block type), for tests.
  add("tiny-granite-h", "none (arbiter test shape)", "GraniteMoeHybridForCausalLM",
      "arbiter: a 4-layer Granite 4.0-H MoE hybrid small enough for unit tests",
      "granitemoehybrid",
      {{"hidden_size", 64}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
       {"num_key_value_heads", 2}, {"vocab_size", 512}, {"max_position_embeddings", 2048},
       {"rms_norm_eps", 1e-6}, {"tie_word_embeddings", false},
       {"layer_types", {"mamba", "attention", "mamba", "mamba"}},
       {"position_embedding_type", "rope"}, {"rope_theta", 10000},
       {"shared_intermediate_size", 64}, {"intermediate_size", 32},
       {"num_local_experts", 4}, {"num_experts_per_tok", 2}, {"embedding_multiplier", 8},
       {"residual_multiplier", 0.5}, {"attention_multiplier", 0.125}, {"logits_scaling", 2},
       {"mamba_expand", 2}, {"mamba_n_heads", 8}, {"mamba_d_head", 16}, {"mamba_n_groups", 2},
       {"mamba_d_state", 16}, {"mamba_d_conv", 4}, {"mamba_chunk_size", 16}},
      granite_specials, 0, 0);
  add("tiny-nemotron-h", "none (arbiter test shape)", "NemotronHForCausalLM",
      "arbiter: a 4-layer Nemotron-H (Mamba2, MoE, attention, MLP) for unit tests",
      "nemotron_h",
      {{"hidden_size", 64}, {"hybrid_override_pattern", "ME*-"}, {"num_attention_heads", 4},
       {"num_key_value_heads", 2}, {"head_dim", 16}, {"intermediate_size", 128},
       {"layer_norm_epsilon", 1e-5}, {"vocab_size", 512}, {"max_position_embeddings", 2048},
       {"mamba_num_heads", 8}, {"mamba_head_dim", 16}, {"n_groups", 2},
       {"ssm_state_size", 16}, {"conv_kernel", 4}, {"chunk_size", 16},
       {"n_routed_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 32},
       {"moe_shared_expert_intermediate_size", 48}, {"routed_scaling_factor", 2.0}},
      {"<unk>", "<s>", "</s>"}, 1, 2);
  return p;
}

}  // namespace

const Arch& hybrid_family() {
  static const Hybrid arch;
  return arch;
}

}  // namespace arbiter
