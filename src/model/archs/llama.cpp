// The llama family: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and
// Qwen3ForCausalLM, and their GGUF forms; and their mixture-of-experts members
// MixtralForCausalLM, Qwen2MoeForCausalLM and Qwen3MoeForCausalLM (GGUF: llama with
// llama.expert_count > 0, qwen2moe, qwen3moe), whose attention is the same and whose sparse
// layers' FFN is moe_ffn.h's block. One decoder
// block, pre-norm:
//   x += o_proj(attention(rope(q), rope(k), v)),  q/k/v = proj(rmsnorm(x))
//   x += down(silu(gate(xn)) * up(xn)),           xn = rmsnorm(x)   (dense layers)
//   x += moe(xn)                                                    (sparse layers)
// The members differ by flags: q/k/v biases (qwen2, qwen2_moe, llama attention_bias),
// per-head q/k RMSNorm before RoPE (qwen3, qwen3_moe), a sliding window (mistral, mixtral;
// the qwens when every layer slides), Llama 3 RoPE scaling, and GGUF's Q/K rows in adjacent
// RoPE pairs (llama, mistral).
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "io/json_config.h"
#include "model/archs/batched.h"
#include "model/archs/decoder_state.h"
#include "model/archs/moe_ffn.h"
#include "model/model.h"
#include "model/rope_config.h"
#include "model/synth.h"

namespace arbiter {

namespace {

// Tensor slots (Weights::global / Weights::layer).
enum Global { kEmbed, kOutNorm, kLmHead, kGlobalSlots };
enum Layer {
  kAttnNorm, kWq, kWk, kWv, kBq, kBk, kBv, kQNorm, kKNorm, kWo, kFfnNorm, kGate, kUp, kDown,
  kLayerSlots
};

class Llama final : public Arch {
 public:
  std::string family() const override { return "llama"; }
  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    return {{"LlamaForCausalLM", "llama"},
            {"MistralForCausalLM", "mistral"},
            {"Qwen2ForCausalLM", "qwen2"},
            {"Qwen3ForCausalLM", "qwen3"},
            {"MixtralForCausalLM", "mixtral"},
            {"Qwen2MoeForCausalLM", "qwen2_moe"},
            {"Qwen3MoeForCausalLM", "qwen3_moe"}};
  }
  std::vector<std::string> gguf_names() const override {
    return {"llama", "mistral", "qwen2", "qwen3", "qwen2moe", "qwen3moe"};
  }
  // llama.cpp writes Mixtral as "llama" (with llama.expert_count) and drops the Qwen MoE
  // names' underscore.
  std::string gguf_arch(const ModelConfig& c) const override {
    if (c.arch == "mixtral") return "llama";
    if (c.arch == "qwen2_moe") return "qwen2moe";
    if (c.arch == "qwen3_moe") return "qwen3moe";
    return c.arch;
  }
  // transformers 5.17 loads Mixtral's fused form with the router renamed
  // (conversion_mapping.py: .block_sparse_moe.gate -> .mlp.gate).
  std::vector<std::string> hf_stored_names(const ModelConfig& c,
                                           const std::string& hf) const override {
    const std::string from = ".block_sparse_moe.gate.";
    const size_t at = hf.find(from);
    if (c.arch != "mixtral" || at == std::string::npos) return {hf};
    return {hf, hf.substr(0, at) + ".mlp.gate." + hf.substr(at + from.size())};
  }
  int global_slots() const override { return kGlobalSlots; }
  int layer_slots() const override { return kLayerSlots; }
  // The MoE block's slots follow the dense ones.
  int layer_slots_for(const ModelConfig& c) const override {
    return kLayerSlots + (c.router.n_experts > 0 ? moe_layer_slots(c) : 0);
  }
  std::vector<std::string> stages() const override {
    std::vector<std::string> s = {"embed", "attn_norm", "q",    "k",  "v",   "q_norm", "k_norm",
                                  "q_rope", "k_rope",   "attn", "o",  "attn_res", "ffn_norm",
                                  "gate",   "up",       "act",  "down", "ffn_res", "final_norm",
                                  "logits"};
    for (std::string& m : moe_stages()) s.push_back(std::move(m));
    return s;
  }

  // Defaults are the ones transformers' LlamaConfig, MistralConfig, Qwen2Config and
  // Qwen3Config apply when a key is absent (noted per key); the dimensions themselves are
  // required, since a guessed dimension would only surface later as a shape error.
  void parse_hf(const JsonConfig& j, ModelConfig& c) const override {
    c.d_model = j.positive_int("hidden_size");
    c.n_layer = j.positive_int("num_hidden_layers");
    c.n_head = j.positive_int("num_attention_heads");
    c.n_head_kv = j.positive_int("num_key_value_heads", c.n_head);  // default: MHA
    c.d_ff = j.positive_int("intermediate_size");
    c.vocab = j.positive_int("vocab_size");
    if (c.n_head % c.n_head_kv != 0)
      j.fail(strformat("num_attention_heads %d is not a multiple of num_key_value_heads %d",
                       c.n_head, c.n_head_kv));
    if (j.has("head_dim")) {
      c.head_dim = j.positive_int("head_dim");
    } else {
      if (c.d_model % c.n_head != 0)
        j.fail(strformat("hidden_size %d is not a multiple of num_attention_heads %d", c.d_model,
                         c.n_head));
      c.head_dim = c.d_model / c.n_head;
    }
    // transformers defaults: llama 2048, mistral 4096*32, qwen2/qwen3 32768.
    // transformers defaults: mixtral 4096*32, qwen2_moe/qwen3_moe 32768.
    const int max_pos_default = c.arch == "llama"                          ? 2048
                                : c.arch == "mistral" || c.arch == "mixtral" ? 4096 * 32
                                                                             : 32768;
    c.max_pos = j.positive_int("max_position_embeddings", max_pos_default);
    c.norm_eps = j.number("rms_norm_eps", 1e-6);  // all four default to 1e-6
    if (!(c.norm_eps > 0)) j.fail("rms_norm_eps must be positive");
    c.tied_embeddings = j.flag("tie_word_embeddings", false);

    if (j.has("hidden_act") && !(j.raw("hidden_act").is_string() && j.str("hidden_act") == "silu"))
      j.fail("hidden_act " + j.raw("hidden_act").dump() + " is not supported (expected \"silu\")");
    if (j.flag("mlp_bias", false)) j.fail("mlp_bias=true is not supported");
    // Qwen2 always has q/k/v biases (and no o_proj bias); llama and qwen3 put a bias on q/k/v
    // AND o_proj when attention_bias is true: the loader refuses the o_proj bias tensor by
    // name. Mistral has no biases.
    // Qwen2-MoE: q/k/v biases unless qkv_bias (transformers 5 writes it) says otherwise.
    if (c.arch == "qwen2") c.qkv_bias = true;
    else if (c.arch == "qwen2_moe") c.qkv_bias = j.flag("qkv_bias", true);
    else if (c.arch != "mistral" && c.arch != "mixtral")
      c.qkv_bias = j.flag("attention_bias", false);
    c.qk_norm = c.arch == "qwen3" || c.arch == "qwen3_moe";
    parse_hf_window(j, c);
    if (c.arch == "mixtral" || c.arch == "qwen2_moe" || c.arch == "qwen3_moe") parse_hf_moe(j, c);

    c.rope.dims = c.head_dim;
    c.rope.layout = RopeLayout::Half;  // HF "rotate_half"
    read_hf_rope(j, c.rope);
  }

  void parse_gguf(const GgufFile& g, ModelConfig& c) const override {
    const std::string& path = g.path();
    const std::string p = c.arch + ".";
    c.d_model = gguf_positive(g, p + "embedding_length");
    c.n_layer = gguf_positive(g, p + "block_count");
    c.n_head = gguf_positive(g, p + "attention.head_count");
    c.n_head_kv = gguf_positive(g, p + "attention.head_count_kv", c.n_head);
    c.d_ff = gguf_positive(g, p + "feed_forward_length");
    c.max_pos = gguf_positive(g, p + "context_length");
    if (c.n_head % c.n_head_kv != 0)
      throw Error(strformat("[loader] %s: head_count %d is not a multiple of head_count_kv %d",
                            path.c_str(), c.n_head, c.n_head_kv));
    if (!g.has(p + "attention.key_length") && c.d_model % c.n_head != 0)
      throw Error(strformat("[loader] %s: embedding_length %d is not a multiple of head_count %d",
                            path.c_str(), c.d_model, c.n_head));
    c.head_dim = gguf_positive(g, p + "attention.key_length", c.d_model / c.n_head);
    if (gguf_positive(g, p + "attention.value_length", c.head_dim) != c.head_dim)
      throw Error("[loader] " + path + ": attention.value_length differs from key_length (unsupported)");
    c.norm_eps = g.get_float(p + "attention.layer_norm_rms_epsilon", 1e-5);
    if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps))
      throw Error("[loader] " + path + ": " + p +
                  "attention.layer_norm_rms_epsilon must be positive and finite");
    if (g.has(p + "attention.sliding_window"))
      c.sliding_window = gguf_positive(g, p + "attention.sliding_window");
    c.rope.dims = c.head_dim;
    c.rope.layout = gguf_rope_layout(c.arch);
    read_gguf_rope(g, c.arch, c.rope);
    // Optional per-layer tensors decide the flags (every layer is checked at binding).
    c.qkv_bias = g.tensor("blk.0.attn_q.bias") != nullptr;
    c.qk_norm = g.tensor("blk.0.attn_q_norm.weight") != nullptr;
    if (c.arch == "qwen2" && !c.qkv_bias)
      throw Error("[loader] " + path + ": qwen2 model without blk.0.attn_q.bias");
    if (c.arch == "qwen3" && !c.qk_norm)
      throw Error("[loader] " + path + ": qwen3 model without blk.0.attn_q_norm.weight");
    c.tied_embeddings = g.tensor("output.weight") == nullptr;
    const int64_t experts = g.get_int(p + "expert_count", 0);
    const bool moe_name = c.arch == "qwen2moe" || c.arch == "qwen3moe";
    if (experts > 0 && !moe_name && c.arch != "llama")
      throw Error("[loader] " + path + ": " + p + "expert_count is " + std::to_string(experts) +
                  " but llama.cpp reads experts for " + c.arch + " never (refusing it)");
    if (experts > 0 || moe_name) parse_gguf_moe(g, p, c);
  }

  std::vector<TensorSpec> tensors(const ModelConfig& c) const override {
    const int64_t D = c.d_model, F = c.d_ff, Dh = c.head_dim, V = c.vocab;
    const int64_t Hq = int64_t(c.n_head) * Dh, Hk = int64_t(c.n_head_kv) * Dh;
    std::vector<TensorSpec> t;
    auto global = [&](const char* role, int slot, const char* hf, const char* gguf,
                      std::vector<int64_t> shape, TensorKind kind, const char* family) {
      TensorSpec s;
      s.role = role, s.slot = slot, s.hf = hf, s.gguf = gguf, s.shape = std::move(shape);
      s.kind = kind, s.family = family;
      t.push_back(std::move(s));
      return &t.back();
    };
    global("embed", kEmbed, "model.embed_tokens.weight", "token_embd.weight", {V, D},
           TensorKind::Matrix, "embed");
    global("out_norm", kOutNorm, "model.norm.weight", "output_norm.weight", {D}, TensorKind::Norm,
           "norm");
    global("lm_head", kLmHead, "lm_head.weight", "output.weight", {V, D}, TensorKind::Matrix,
           "logits")
        ->tie_to = "embed";
    for (int l = 0; l < c.n_layer; ++l) {
      const std::string hf = "model.layers." + std::to_string(l) + ".";
      const std::string gg = "blk." + std::to_string(l) + ".";
      auto layer = [&](const char* role, int slot, const char* hf_name, const char* gguf_name,
                       std::vector<int64_t> shape, TensorKind kind, const char* family,
                       bool rope_rows = false) {
        TensorSpec s;
        s.role = role, s.slot = slot, s.layer = l, s.hf = hf + hf_name, s.gguf = gg + gguf_name;
        s.shape = std::move(shape), s.kind = kind, s.family = family, s.rope_rows = rope_rows;
        t.push_back(std::move(s));
      };
      layer("attn_norm", kAttnNorm, "input_layernorm.weight", "attn_norm.weight", {D},
            TensorKind::Norm, "norm");
      layer("wq", kWq, "self_attn.q_proj.weight", "attn_q.weight", {Hq, D}, TensorKind::Matrix,
            "attn", true);
      layer("wk", kWk, "self_attn.k_proj.weight", "attn_k.weight", {Hk, D}, TensorKind::Matrix,
            "attn", true);
      layer("wv", kWv, "self_attn.v_proj.weight", "attn_v.weight", {Hk, D}, TensorKind::Matrix,
            "attn");
      if (c.qkv_bias) {
        layer("bq", kBq, "self_attn.q_proj.bias", "attn_q.bias", {Hq}, TensorKind::Bias, "attn");
        layer("bk", kBk, "self_attn.k_proj.bias", "attn_k.bias", {Hk}, TensorKind::Bias, "attn");
        layer("bv", kBv, "self_attn.v_proj.bias", "attn_v.bias", {Hk}, TensorKind::Bias, "attn");
      }
      if (c.qk_norm) {
        layer("q_norm", kQNorm, "self_attn.q_norm.weight", "attn_q_norm.weight", {Dh},
              TensorKind::Norm, "norm");
        layer("k_norm", kKNorm, "self_attn.k_norm.weight", "attn_k_norm.weight", {Dh},
              TensorKind::Norm, "norm");
      }
      layer("wo", kWo, "self_attn.o_proj.weight", "attn_output.weight", {D, Hq},
            TensorKind::Matrix, "attn");
      layer("ffn_norm", kFfnNorm, "post_attention_layernorm.weight", "ffn_norm.weight", {D},
            TensorKind::Norm, "norm");
      if (is_moe(c, l)) {
        const MoeNames names = c.arch == "mixtral" ? MoeNames{"block_sparse_moe", "w1", "w3", "w2"}
                                                   : MoeNames{"mlp", "gate_proj", "up_proj",
                                                              "down_proj"};
        moe_tensors(c, names, l, kLayerSlots, t);
        continue;
      }
      layer("w_gate", kGate, "mlp.gate_proj.weight", "ffn_gate.weight", {F, D},
            TensorKind::Matrix, "mlp");
      layer("w_up", kUp, "mlp.up_proj.weight", "ffn_up.weight", {F, D}, TensorKind::Matrix,
            "mlp");
      layer("w_down", kDown, "mlp.down_proj.weight", "ffn_down.weight", {D, F},
            TensorKind::Matrix, "mlp");
    }
    return t;
  }

  std::unique_ptr<ForwardState> make_state(const Model& m, Backend& be, int max_ctx,
                                           int max_T) const override {
    return std::make_unique<DecoderState>(be, m.config, max_ctx, max_T);
  }

  // The pool is a DecoderState's caches: one of pool_rows rows per layer, paged by BatchSeq.
  std::unique_ptr<ForwardState> make_batch_state(const Model& m, Backend& be, int pool_rows,
                                                 int max_T, int) const override {
    return std::make_unique<DecoderState>(be, m.config, pool_rows, max_T);
  }

  void forward(const Model& m, Backend& be, ForwardState& state,
               const ForwardArgs& a) const override {
    DecoderState& s = static_cast<DecoderState&>(state);
    const ModelConfig& c = m.config;
    const Weights& w = m.weights;
    const int T = a.T, pos0 = a.pos0;
    ARB_CHECK(T >= 1 && T <= s.max_T, "[model] forward of %d tokens exceeds scratch width %d", T,
              s.max_T);
    ARB_CHECK(a.batch || pos0 + T <= s.max_ctx,
              "[model] position %d exceeds the KV cache (%d rows)", pos0 + T, s.max_ctx);
    ARB_CHECK(a.ids || T == 1, "[model] a forward of %d picked tokens (only one is kept)", T);
    if (a.batch) check_batch(a);
    const int D = c.d_model, H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim, F = c.d_ff;
    const int q_dim = H * Dh, kv_dim = Hkv * Dh;
    const double eps = c.norm_eps;
    const Stages tap = a.batch ? batch_stages(a) : Stages(a.hook, pos0, T, a.routes);

    if (a.ids) be.embed(w.global(kEmbed), a.ids, T, s.x);  // x [T, D]
    else be.embed_picked(w.global(kEmbed), s.x);
    be.apply_tap(tap("embed", -1, "embed", D, 1, 2), s.x, T, D);

    // The attention's geometry, for its stage's error bound (scores scaled by 1/sqrt(Dh)).
    const AttentionGeometry geo{"q_rope", "k_rope",        "v",
                                H,        Hkv,             Dh,
                                c.sliding_window, 1.0 / std::sqrt(double(Dh))};
    for (int l = 0; l < c.n_layer; ++l) {
      auto lw = [&](int slot) -> const Tensor& { return w.layer(l, slot); };
      // attention block: x += o_proj(attn(rope(q), rope(k), v)), q/k/v of rmsnorm(x)
      const StageTap* norm = tap("attn_norm", l, "rmsnorm", D, D, 3);
      const Backend::MatmulTarget qkv[3] = {
          {&lw(kWq), &lw(kBq), &s.q, tap("q", l, "matmul", q_dim, D, 3)},  // q [T, H*Dh]
          {&lw(kWk), &lw(kBk), &s.k, tap("k", l, "matmul", kv_dim, D, 3)},  // k [T, Hkv*Dh]
          {&lw(kWv), &lw(kBv), &s.v, tap("v", l, "matmul", kv_dim, D, 3)}};  // v [T, Hkv*Dh]
      be.rmsnorm_matmul(s.x, lw(kAttnNorm), NormWeight::Plain, T, D, eps, s.xn, false, norm, qkv,
                        3);
      Backend::AttentionTaps at;
      if (c.qk_norm) {  // qwen3: RMSNorm over each head before RoPE (HF Qwen3Attention)
        at.q_norm = tap("q_norm", l, "rmsnorm", q_dim, Dh, 3);
        at.k_norm = tap("k_norm", l, "rmsnorm", kv_dim, Dh, 3);
      }
      at.q_rope = tap("q_rope", l, "rope", q_dim, 2, 3);  // x_a cos - x_b sin: two terms
      at.k_rope = tap("k_rope", l, "rope", kv_dim, 2, 3);
      // q, k, v, out; scores over Dh, weighted sum over the cache rows
      at.out = tap("attn", l, "attention", q_dim, std::max(Dh, pos0 + T), 4, &geo);
      const Tensor* q_norm = c.qk_norm ? &lw(kQNorm) : nullptr;
      const Tensor* k_norm = c.qk_norm ? &lw(kKNorm) : nullptr;
      if (a.batch) {  // each sequence's rows at its own positions, against its own pages
        batch_attention(be, *a.batch, s.q, s.k, s.v, q_norm, k_norm, NormWeight::Plain, eps, H,
                        Hkv, Dh, &c.rope, s.k_cache[size_t(l)], s.v_cache[size_t(l)],
                        c.sliding_window, {}, s.att);
      } else {
        be.qk_rope_attention(s.q, s.k, s.v, q_norm, k_norm, NormWeight::Plain, eps, T, H, Hkv, Dh,
                             pos0, c.rope, s.k_cache[size_t(l)], s.v_cache[size_t(l)],
                             c.sliding_window, {}, s.att, at);
      }
      const StageTap* o = tap("o", l, "matmul", D, q_dim, 3);  // o [T, D]
      const StageTap* attn_res = tap("attn_res", l, "add", D, 1, 3);
      be.matmul_add(s.att, lw(kWo), T, s.o, s.x, 1, o, attn_res);

      if (is_moe(c, l)) {  // x += moe(xn), xn = rmsnorm(x)
        moe_ffn(m, be, l, kLayerSlots, lw(kFfnNorm), tap("ffn_norm", l, "rmsnorm", D, D, 3), T,
                tap, *s.moe, s.x, s.xn, s.down, tap("ffn_res", l, "add", D, 1, 3));
        continue;
      }
      // feed-forward block: x += down(silu(gate(xn)) * up(xn)), xn = rmsnorm(x)
      Backend::GluTaps ft;
      ft.norm = tap("ffn_norm", l, "rmsnorm", D, D, 3);
      ft.gate = tap("gate", l, "matmul", F, D, 3);  // [T, F]
      ft.up = tap("up", l, "matmul", F, D, 3);
      ft.act = tap("act", l, "swiglu", F, 1, 3);
      be.rmsnorm_glu(s.x, lw(kFfnNorm), NormWeight::Plain, T, D, eps, s.xn, lw(kGate), lw(kUp),
                     GluAct::SiLU, s.gate, s.up, s.act, ft);
      const StageTap* down = tap("down", l, "matmul", D, F, 3);  // [T, D]
      const StageTap* ffn_res = tap("ffn_res", l, "add", D, 1, 3);
      be.matmul_add(s.act, lw(kDown), T, s.down, s.x, 1, down, ffn_res);
    }
    if (a.batch) {
      batch_logits(be, *a.batch, s.x, w.global(kOutNorm), NormWeight::Plain, D, eps, s.xn,
                   w.global(kLmHead), s.logits);
      return;
    }
    if (!a.logits) return;
    int rows;
    const Buffer x = logit_rows(a, s.x, T, D, rows);
    const StageTap* final_norm = tap("final_norm", -1, "rmsnorm", D, D, 3);
    const Backend::MatmulTarget head = {&w.global(kLmHead), nullptr, &s.logits,
                                        tap("logits", -1, "matmul", c.vocab, D, 3)};
    be.rmsnorm_matmul(x, w.global(kOutNorm), NormWeight::Plain, rows, D, eps, s.xn, false,
                      final_norm, &head, 1);  // [rows, V]
  }

  std::vector<SynthPreset> presets() const override;

  void hf_config_json(const ModelConfig& c, nlohmann::json& j) const override {
    j["hidden_size"] = c.d_model;
    j["intermediate_size"] = c.d_ff;
    j["num_hidden_layers"] = c.n_layer;
    j["num_attention_heads"] = c.n_head;
    j["num_key_value_heads"] = c.n_head_kv;
    j["head_dim"] = c.head_dim;
    j["hidden_act"] = "silu";
    j["rms_norm_eps"] = c.norm_eps;
    write_hf_rope(c.rope, j);
    j["attention_dropout"] = 0.0;
    if (c.arch == "llama") {
      j["attention_bias"] = c.qkv_bias;
      j["mlp_bias"] = false;
      j["pretraining_tp"] = 1;
    } else if (c.arch == "qwen3" || c.arch == "qwen2" || c.arch == "qwen3_moe" ||
               c.arch == "qwen2_moe") {
      if (c.arch == "qwen3" || c.arch == "qwen3_moe") j["attention_bias"] = false;
      if (c.arch == "qwen2_moe") j["qkv_bias"] = c.qkv_bias;
      j["max_window_layers"] = c.sliding_window > 0 ? 0 : c.n_layer;  // layers >= it slide
      j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nullptr;
      j["use_sliding_window"] = c.sliding_window > 0;
    } else if (c.arch == "mistral" || c.arch == "mixtral") {
      j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nullptr;
    }
    if (c.router.n_experts > 0) {  // the keys parse_hf_moe reads
      j[c.arch == "mixtral" ? "num_local_experts" : "num_experts"] = c.router.n_experts;
      j["num_experts_per_tok"] = c.router.top_k;
      if (c.arch != "mixtral") {
        j["moe_intermediate_size"] = c.d_ff_expert;
        j["norm_topk_prob"] = c.router.norm_topk_prob;
        j["decoder_sparse_step"] = 1;
        nlohmann::json dense = nlohmann::json::array();
        for (int l = 0; l < c.n_layer; ++l)
          if (!is_moe(c, l)) dense.push_back(l);
        j["mlp_only_layers"] = dense;
      }
      if (c.arch == "qwen2_moe") j["shared_expert_intermediate_size"] = c.d_ff_shared;
    }
  }

  // llama.cpp's converters permute Q/K rows of llama-family models so that its "normal" RoPE
  // rotates adjacent pairs; qwen2/qwen3 use NEOX RoPE on unpermuted rows.
  RopeLayout gguf_rope_layout(const std::string& name) const override {
    return name == "llama" || name == "mistral" || name == "mixtral" ? RopeLayout::Adjacent
                                                                      : RopeLayout::Half;
  }

  nlohmann::ordered_json describe(const ModelConfig& c) const override {
    nlohmann::ordered_json j = {
        {"qkv_bias", c.qkv_bias}, {"qk_norm", c.qk_norm}, {"sliding_window", c.sliding_window}};
    if (c.router.n_experts > 0) {
      int sparse = 0;
      for (int l = 0; l < c.n_layer; ++l) sparse += is_moe(c, l);
      j["experts"] = c.router.n_experts;
      j["experts_per_token"] = c.router.top_k;
      j["norm_topk_prob"] = c.router.norm_topk_prob;
      j["expert_ffn"] = c.d_ff_expert;
      j["shared_expert_ffn"] = c.d_ff_shared;
      j["moe_layers"] = sparse;
    }
    return j;
  }

  // K and V of every layer, over the window's keys.
  double state_bytes_per_token(const ModelConfig& c, double ctx, int elem_bytes) const override {
    return 2.0 * c.n_layer * attended(c, ctx) * double(c.n_head_kv) * c.head_dim * elem_bytes;
  }

  // A decode step reads the experts its rows picked, k of the E of each MoE layer for one row.
  double weight_bytes_per_step(const Model& m, int rows) const override {
    return routed_weight_bytes(m, rows, m.config.router.top_k, m.config.router.n_experts);
  }

  // 2 x (matmul weights, of MoE layers the router, k experts and the shared expert with its
  // gate; the output matrix once per forward) + 4 H Dh keys per layer (QK^T and PV).
  double flops_per_token(const ModelConfig& c, int T, int pos0) const override {
    const double D = c.d_model, F = c.d_ff, Hq = double(c.n_head) * c.head_dim;
    const double Hk = double(c.n_head_kv) * c.head_dim;
    const double per_layer = D * Hq + 2 * D * Hk + Hq * D + 3 * D * F;
    const double moe = D * c.router.n_experts + 3 * D * c.d_ff_expert * c.router.top_k +
                       (c.d_ff_shared > 0 ? 3 * D * c.d_ff_shared + D : 0);
    int n_moe = 0;
    for (int l = 0; l < c.n_layer; ++l) n_moe += is_moe(c, l);
    const double matmul =
        2.0 * (c.n_layer * per_layer + n_moe * (moe - 3 * D * F) +
               double(c.vocab) * D / std::max(T, 1));
    double keys = 0;  // keys attended, summed over the T tokens
    for (int t = 0; t < T; ++t) keys += attended(c, double(pos0) + t + 1);
    return matmul + 4.0 * c.n_layer * Hq * keys / std::max(T, 1);
  }

  void gguf_metadata(const ModelConfig& c, GgufWriter& g) const override {
    const std::string a = gguf_arch(c) + ".";
    g.add_u32(a + "embedding_length", uint32_t(c.d_model));
    g.add_u32(a + "block_count", uint32_t(c.n_layer));
    g.add_u32(a + "feed_forward_length", uint32_t(c.d_ff));
    g.add_u32(a + "attention.head_count", uint32_t(c.n_head));
    g.add_u32(a + "attention.head_count_kv", uint32_t(c.n_head_kv));
    g.add_u32(a + "attention.key_length", uint32_t(c.head_dim));
    g.add_u32(a + "attention.value_length", uint32_t(c.head_dim));
    g.add_f32(a + "attention.layer_norm_rms_epsilon", float(c.norm_eps));
    if (c.sliding_window > 0) g.add_u32(a + "attention.sliding_window", uint32_t(c.sliding_window));
    write_gguf_rope(c.rope, gguf_arch(c), g);
    if (c.router.n_experts == 0) return;
    // What llama.cpp's converter writes (TextModel / Qwen2MoeModel.set_gguf_parameters); the
    // routing each graph hard-codes is checked, so that llama.cpp reads the file as c.
    const RouterSpec& r = c.router;
    if (r.norm_topk_prob != (c.arch != "qwen2_moe"))
      throw Error("[synth] " + c.arch + ": norm_topk_prob " + (r.norm_topk_prob ? "true" : "false") +
                  " has no GGUF form llama.cpp reads (its " + gguf_arch(c) + " graph " +
                  (r.norm_topk_prob ? "never" : "always") + " renormalises)");
    g.add_u32(a + "expert_count", uint32_t(r.n_experts));
    g.add_u32(a + "expert_used_count", uint32_t(r.top_k));
    if (c.arch != "mixtral") g.add_u32(a + "expert_feed_forward_length", uint32_t(c.d_ff_expert));
    if (c.d_ff_shared > 0) g.add_u32(a + "expert_shared_feed_forward_length", uint32_t(c.d_ff_shared));
  }

 private:
  static bool is_moe(const ModelConfig& c, int l) {
    return !c.layer_moe.empty() && c.layer_moe[size_t(l)];
  }

  // llama.cpp's MoE keys (src/models/{llama,qwen2moe,qwen3moe}.cpp) -> the HF config name and
  // router. Routing is fixed per graph there: softmax over every expert, top-k, the k weights
  // renormalised for llama (Mixtral) and qwen3moe, not for qwen2moe; a key saying otherwise
  // is refused. The experts' width: feed_forward_length for llama; for the Qwens
  // expert_feed_forward_length (llama.cpp's default feed_forward_length / expert_used_count),
  // the shared expert's expert_shared_feed_forward_length (default feed_forward_length).
  // Dense layers are the ones without ffn_gate_inp (llama.cpp's llama graph; its Qwen MoE
  // graphs have none, but the converter writes Qwen's mlp_only_layers / decoder_sparse_step
  // layers so).
  static void parse_gguf_moe(const GgufFile& g, const std::string& p, ModelConfig& c) {
    const std::string& path = g.path();
    const std::string gname = c.arch;
    auto refuse = [&](const std::string& key, const std::string& why) {
      throw Error("[loader] " + path + ": " + p + key + " " + why);
    };
    RouterSpec& r = c.router;
    r.n_experts = gguf_positive(g, p + "expert_count");
    r.top_k = gguf_positive(g, p + "expert_used_count");
    if (r.top_k > r.n_experts)
      refuse("expert_used_count", strformat("%d is larger than %sexpert_count %d", r.top_k,
                                             p.c_str(), r.n_experts));
    r.scoring = RouterScoring::Softmax;
    r.order = RouterOrder::ScoreThenTopK;
    r.norm_topk_prob = gname != "qwen2moe";
    if (g.has(p + "expert_weights_norm") && g.get_bool(p + "expert_weights_norm") != r.norm_topk_prob)
      refuse("expert_weights_norm", "differs from what llama.cpp's " + gname + " graph computes");
    if (g.has(p + "expert_gating_func") && g.get_int(p + "expert_gating_func") != 1)
      refuse("expert_gating_func", "is not 1 (softmax), the only gating llama.cpp's " + gname +
                                       " graph computes");
    if (g.has(p + "expert_weights_scale")) {
      const double w = g.get_float(p + "expert_weights_scale");
      if (w != 0 && w != 1) refuse("expert_weights_scale", "is not supported (expected 0 or 1)");
    }
    for (const char* key : {"expert_shared_count", "expert_group_count", "expert_group_used_count"})
      if (g.has(p + key)) refuse(key, "is not read by llama.cpp for " + gname + " (refusing it)");
    if (gname == "llama") {
      c.arch = "mixtral";
      c.d_ff_expert = c.d_ff;
      if (g.has(p + "expert_feed_forward_length") &&
          g.get_int(p + "expert_feed_forward_length") != c.d_ff)
        refuse("expert_feed_forward_length", "differs from feed_forward_length, which llama.cpp "
                                             "reads for llama's experts");
    } else {
      c.arch = gname == "qwen3moe" ? "qwen3_moe" : "qwen2_moe";
      c.d_ff_expert = g.has(p + "expert_feed_forward_length")
                          ? gguf_positive(g, p + "expert_feed_forward_length")
                          : std::max(1, c.d_ff / r.top_k);
    }
    if (gname == "qwen2moe")
      c.d_ff_shared = g.has(p + "expert_shared_feed_forward_length")
                          ? gguf_positive(g, p + "expert_shared_feed_forward_length")
                          : c.d_ff;
    else if (g.has(p + "expert_shared_feed_forward_length"))
      refuse("expert_shared_feed_forward_length", "is not read by llama.cpp for " + gname +
                                                      " (refusing it)");
    // The routers' rows bound the expert count by the file (a hostile count would size a
    // tensor list of that length before any shape check).
    c.layer_moe.assign(size_t(c.n_layer), false);
    for (int l = 0; l < c.n_layer; ++l) {
      const std::string router = "blk." + std::to_string(l) + ".ffn_gate_inp.weight";
      const Tensor* t = g.tensor(router);
      c.layer_moe[size_t(l)] = t != nullptr;
      if (t && t->shape[0] != r.n_experts)
        refuse("expert_count", strformat("is %d but %s has %lld rows", r.n_experts, router.c_str(),
                                         (long long)t->shape[0]));
    }
    if (const char* problem = router_spec_problem(r))
      throw Error("[loader] " + path + ": router: " + problem);
  }

  static double attended(const ModelConfig& c, double ctx) {
    return c.sliding_window > 0 ? std::min<double>(ctx, c.sliding_window) : ctx;
  }

  static int gguf_positive(const GgufFile& g, const std::string& key, int64_t dflt = -1) {
    const int64_t v = dflt >= 0 ? g.get_int(key, dflt) : g.get_int(key);
    if (v <= 0 || v > std::numeric_limits<int>::max())
      throw Error("[loader] " + g.path() + ": '" + key + "' is " + std::to_string(v) +
                  " (expected a positive int)");
    return int(v);
  }

  // The MoE keys, as MixtralConfig / Qwen2MoeConfig / Qwen3MoeConfig read them (5.17).
  // Mixtral: every layer sparse, num_local_experts of intermediate_size, softmax then top-k
  // renormalised (MixtralSparseMoeBlock divides by the top-k sum). Qwen: layer l sparse
  // unless in mlp_only_layers, when (l + 1) % decoder_sparse_step == 0; experts of
  // moe_intermediate_size; renormalised when norm_topk_prob; Qwen2-MoE adds the shared expert
  // (shared_expert_intermediate_size) with its sigmoid gate. The expert count is
  // num_experts (Qwen) or num_local_experts (Mixtral; transformers 5 writes it for Qwen3-MoE
  // too). Dimensions are required, as above.
  static void parse_hf_moe(const JsonConfig& j, ModelConfig& c) {
    const bool mixtral = c.arch == "mixtral";
    const char* e_key = mixtral || !j.has("num_experts") ? "num_local_experts" : "num_experts";
    if (!mixtral && j.has("num_experts") && j.has("num_local_experts") &&
        j.integer("num_experts") != j.integer("num_local_experts"))
      j.fail("num_experts and num_local_experts differ");
    RouterSpec& r = c.router;
    r.n_experts = j.positive_int(e_key);
    r.top_k = j.positive_int("num_experts_per_tok");
    if (r.top_k > r.n_experts)
      j.fail(strformat("num_experts_per_tok %d is larger than %s %d", r.top_k, e_key,
                       r.n_experts));
    r.scoring = RouterScoring::Softmax;
    r.order = RouterOrder::ScoreThenTopK;
    r.norm_topk_prob = mixtral || j.flag("norm_topk_prob", false);
    if (const char* problem = router_spec_problem(r)) j.fail(std::string("router: ") + problem);
    c.layer_moe.assign(size_t(c.n_layer), mixtral);
    if (mixtral) {
      c.d_ff_expert = c.d_ff;
      return;
    }
    c.d_ff_expert = j.positive_int("moe_intermediate_size");
    const int step = j.positive_int("decoder_sparse_step", 1);
    std::vector<bool> mlp_only(size_t(c.n_layer), false);
    if (j.has("mlp_only_layers")) {
      const nlohmann::json& m = j.raw("mlp_only_layers");
      if (!m.is_array()) j.fail("'mlp_only_layers' is not a list");
      for (const nlohmann::json& v : m) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c.n_layer)
          j.fail("'mlp_only_layers' entry " + v.dump() + " is not a layer index");
        mlp_only[size_t(v.get<int64_t>())] = true;
      }
    }
    for (int l = 0; l < c.n_layer; ++l)
      c.layer_moe[size_t(l)] = !mlp_only[size_t(l)] && (l + 1) % step == 0;
    if (c.arch == "qwen2_moe") c.d_ff_shared = j.positive_int("shared_expert_intermediate_size");
  }

  // Sliding window. Mistral: sliding_window (null -> full attention). Qwen2/Qwen3: only when
  // use_sliding_window, and then on layers >= max_window_layers; one window for every layer
  // is all this family models, so a per-layer mix is refused.
  static void parse_hf_window(const JsonConfig& j, ModelConfig& c) {
    const bool qwen = c.arch == "qwen2" || c.arch == "qwen3" || c.arch == "qwen2_moe" ||
                      c.arch == "qwen3_moe";
    if ((c.arch == "mistral" || c.arch == "mixtral") && j.has("sliding_window")) {
      c.sliding_window = j.positive_int("sliding_window");
    } else if (qwen && j.has("layer_types")) {
      // transformers v5 spells the per-layer choice out; it is the source of truth.
      const nlohmann::json& lt = j.raw("layer_types");
      if (!lt.is_array() || int(lt.size()) != c.n_layer)
        j.fail("'layer_types' is not a list of num_hidden_layers entries");
      int n_sliding = 0;
      for (const nlohmann::json& t : lt) {
        if (!t.is_string()) j.fail("'layer_types' entry " + t.dump() + " is not a string");
        const std::string s = t.get<std::string>();
        if (s == "sliding_attention") ++n_sliding;
        else if (s != "full_attention") j.fail("layer type '" + s + "' is not supported");
      }
      if (n_sliding == c.n_layer) c.sliding_window = j.positive_int("sliding_window");
      else if (n_sliding > 0) j.fail("a mix of sliding and full attention layers is not supported");
    } else if (qwen && j.flag("use_sliding_window", false) && j.has("sliding_window")) {
      const int w = j.positive_int("sliding_window");
      const int64_t first = j.has("max_window_layers") ? j.integer("max_window_layers") : 28;
      if (first <= 0) c.sliding_window = w;
      else if (first < c.n_layer)
        j.fail(strformat("sliding window on layers %lld..%d only (max_window_layers) is not supported",
                         (long long)first, c.n_layer - 1));
    }
  }
};

ModelConfig preset_config(const char* arch, int L, int D, int H, int Hkv, int Dh, int F, int V,
                          int max_pos, double eps, double theta, bool tied) {
  ModelConfig c;
  c.arch = arch;
  c.n_layer = L;
  c.d_model = D;
  c.n_head = H;
  c.n_head_kv = Hkv;
  c.head_dim = Dh;
  c.d_ff = F;
  c.vocab = V;
  c.max_pos = max_pos;
  c.norm_eps = eps;
  c.rope.dims = Dh;
  c.rope.theta = theta;
  c.tied_embeddings = tied;
  c.qk_norm = std::string(arch) == "qwen3";
  c.qkv_bias = std::string(arch) == "qwen2";
  return c;
}

// An MoE preset's routing: E experts of width F, top-k renormalised, every layer sparse.
void every_layer_sparse(ModelConfig& c, int E, int k, int F) {
  c.router.n_experts = E;
  c.router.top_k = k;
  c.router.norm_topk_prob = true;
  c.d_ff_expert = F;
  c.layer_moe.assign(size_t(c.n_layer), true);
}

// Every number below is the value in that model's official config.json on the Hugging Face
// Hub (repository named in hf_id), read 2026-11; docs/performance.md repeats the table. tiny
// and tiny-moe are ours: a 2-layer llama and qwen3_moe for fast tests.
std::vector<SynthPreset> Llama::presets() const {
  std::vector<SynthPreset> p;
  auto add = [&](const char* name, const char* hf_id, const char* cls, const char* source,
                 ModelConfig c, std::vector<std::string> specials, int bos, int eos,
                 bool add_bos) {
    SynthPreset s;
    s.name = name, s.hf_id = hf_id, s.hf_class = cls, s.source = source;
    s.config = std::move(c), s.specials = std::move(specials);
    s.bos = bos, s.eos = eos, s.add_bos = add_bos;
    p.push_back(std::move(s));
    return &p.back();
  };
  const std::vector<std::string> qwen_specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  // Qwen3 config: eos_token_id 151645 = <|im_end|>
  add("qwen3-0.6b", "Qwen/Qwen3-0.6B", "Qwen3ForCausalLM",
      "huggingface.co/Qwen/Qwen3-0.6B config.json (transformers 4.51.0)",
      preset_config("qwen3", 28, 1024, 16, 8, 128, 3072, 151936, 40960, 1e-6, 1000000.0, true),
      qwen_specials, -1, 2, false);
  add("qwen3-8b", "Qwen/Qwen3-8B", "Qwen3ForCausalLM",
      "huggingface.co/Qwen/Qwen3-8B config.json (transformers 4.51.0)",
      preset_config("qwen3", 36, 4096, 32, 8, 128, 12288, 151936, 40960, 1e-6, 1000000.0, false),
      qwen_specials, -1, 2, false);
  // base model: eos_token_id 151643 = <|endoftext|>
  add("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", "Qwen2ForCausalLM",
      "huggingface.co/Qwen/Qwen2.5-0.5B config.json",
      preset_config("qwen2", 24, 896, 14, 2, 64, 4864, 151936, 32768, 1e-6, 1000000.0, true),
      qwen_specials, -1, 0, false);
  ModelConfig llama32 =
      preset_config("llama", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 1e-5, 500000.0, true);
  llama32.rope.scaling = {RopeScaling::Kind::Llama3, 32.0, 1.0, 4.0, 8192};
  add("llama-3.2-1b", "meta-llama/Llama-3.2-1B", "LlamaForCausalLM",
      "huggingface.co/meta-llama/Llama-3.2-1B config.json (transformers 4.45)", llama32,
      {"<|begin_of_text|>", "<|end_of_text|>"}, 0, 1, true);
  ModelConfig mistral =
      preset_config("mistral", 32, 4096, 32, 8, 128, 14336, 32000, 32768, 1e-5, 10000.0, false);
  mistral.sliding_window = 4096;
  add("mistral-7b", "mistralai/Mistral-7B-v0.1", "MistralForCausalLM",
      "huggingface.co/mistralai/Mistral-7B-v0.1 config.json (transformers 4.34)", mistral,
      {"<s>", "</s>"}, 0, 1, true);
  // Mixture of experts (every layer sparse in both).
  ModelConfig qwen3_moe =
      preset_config("qwen3_moe", 48, 2048, 32, 4, 128, 6144, 151936, 40960, 1e-6, 1000000.0,
                    false);
  qwen3_moe.qk_norm = true;
  every_layer_sparse(qwen3_moe, 128, 8, 768);
  add("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "Qwen3MoeForCausalLM",
      "huggingface.co/Qwen/Qwen3-30B-A3B config.json (transformers 4.51.0)", qwen3_moe,
      qwen_specials, -1, 2, false);
  ModelConfig mixtral =
      preset_config("mixtral", 32, 4096, 32, 8, 128, 14336, 32000, 32768, 1e-5, 1000000.0, false);
  every_layer_sparse(mixtral, 8, 2, 14336);
  add("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", "MixtralForCausalLM",
      "huggingface.co/mistralai/Mixtral-8x7B-v0.1 config.json (transformers 4.36)", mixtral,
      {"<s>", "</s>"}, 0, 1, true);
  // 4 experts of 32, top-2 renormalised, every layer sparse (synth's GGUF expert stacks).
  ModelConfig tiny_moe =
      preset_config("qwen3_moe", 2, 64, 4, 2, 16, 192, 512, 2048, 1e-6, 1000000.0, false);
  tiny_moe.qk_norm = true;
  every_layer_sparse(tiny_moe, 4, 2, 32);
  add("tiny-moe", "none (arbiter test shape)", "Qwen3MoeForCausalLM",
      "arbiter: a 2-layer qwen3_moe small enough for unit tests", tiny_moe, qwen_specials, -1, 2,
      false);
  add("tiny", "none (arbiter test shape)", "LlamaForCausalLM",
      "arbiter: a 2-layer llama small enough for unit tests",
      preset_config("llama", 2, 64, 4, 2, 16, 192, 512, 2048, 1e-5, 10000.0, false),
      {"<s>", "</s>"}, 0, 1, true);
  // Rows of 256 and 768 values: the k-quants' 256-value super-blocks divide them, so
  // `--dtype q4_k_m` writes Q4_K and Q6_K (tiny's rows fall back to Q5_0 and Q8_0); tied, so
  // the Q6_K embedding is the lm_head too.
  add("tiny-qwen3-256", "none (arbiter test shape)", "Qwen3ForCausalLM",
      "arbiter: a 2-layer qwen3 whose rows the k-quants' super-blocks divide",
      preset_config("qwen3", 2, 256, 4, 2, 64, 768, 512, 2048, 1e-6, 1000000.0, true),
      qwen_specials, -1, 2, false);
  // Rows of 256 (the k-quants' block) where D or F is the row; attn_output and ffn_down rows
  // of 32 (the recipes' fallbacks), tied (token_embd takes the output rule): every branch of
  // the recipe in 122K parameters, small enough to commit llama-quantize's outputs
  // (tests/fixtures/quant/).
  add("tiny-256", "none (arbiter test shape)", "LlamaForCausalLM",
      "arbiter: a 1-layer llama whose rows divide into 256, for the llama-quantize comparison",
      preset_config("llama", 1, 256, 1, 1, 32, 32, 260, 2048, 1e-5, 10000.0, true),
      {"<s>", "</s>"}, 0, 1, true);
  return p;
}

}  // namespace

const Arch& llama_family() {
  static const Llama arch;
  return arch;
}

}  // namespace arbiter
