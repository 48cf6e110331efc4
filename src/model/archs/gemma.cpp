// The gemma family: Gemma2ForCausalLM and Gemma3ForCausalLM (the text model, config
// `gemma3_text`). One decoder block, sandwich-normed (HF Gemma3DecoderLayer):
//   x += post_attn_norm(o_proj(attention(rope(q_norm(q)), rope(k_norm(k)), v))),
//        q/k/v = proj(input_norm(x))
//   x += post_ffn_norm(down(gelu_tanh(gate(xn)) * up(xn))),  xn = pre_ffn_norm(x)
// with every norm an RMSNorm scaled by (1 + w), the embedding scaled by sqrt(D) rounded to the
// weight dtype, scores scaled by query_pre_attn_scalar^-0.5, and per layer either a sliding
// window (its own RoPE: rope_local_base_freq) or full attention (rope_theta + scaling).
// Gemma 2 differs by flags: no q/k norm, attention scores soft-capped, one RoPE.
// Gemma3ForConditionalGeneration checkpoints are read for their text model alone: its config
// is text_config, its tensors are stored under the wrapper's prefixes, its vision tower and
// projector are left unread.
// Semantics from transformers' modeling_gemma2.py / modeling_gemma3.py (v5.17).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "io/json_config.h"
#include "model/archs/batched.h"
#include "model/archs/decoder_state.h"
#include "model/model.h"
#include "model/rope_config.h"
#include "model/synth.h"

namespace arbiter {

namespace {

// Tensor slots (Weights::global / Weights::layer).
enum Global { kEmbed, kOutNorm, kLmHead, kGlobalSlots };
enum Layer {
  kAttnNorm, kWq, kWk, kWv, kQNorm, kKNorm, kWo, kPostAttnNorm, kFfnNorm, kGate, kUp, kDown,
  kPostFfnNorm, kLayerSlots
};

// sqrt(D) as HF applies it: Gemma3TextScaledWordEmbedding keeps it as an f32 tensor and casts
// it to the weight dtype; Gemma2Model makes it in the activations' dtype (the weight dtype).
// Both are the f32 value rounded to the weight dtype here (exact for every D in the fixtures;
// for f64 weights Gemma 2's is sqrt(D) itself).
double embed_scale(const ModelConfig& c, DType weights) {
  const double s = std::sqrt(double(c.d_model));
  switch (weights) {
    case DType::F64: return c.arch == "gemma2" ? s : double(float(s));
    case DType::BF16: return bf16_to_f32(f32_to_bf16(float(s)));
    case DType::F16: return f16_to_f32(f32_to_f16(float(s)));
    default: return double(float(s));
  }
}

class Gemma final : public Arch {
 public:
  std::string family() const override { return "gemma"; }
  std::vector<std::pair<std::string, std::string>> hf_classes() const override {
    return {{"Gemma2ForCausalLM", "gemma2"},
            {"Gemma3ForCausalLM", "gemma3"},
            {"Gemma3ForConditionalGeneration", "gemma3"}};
  }
  // llama.cpp's convert_hf_to_gguf.py (Gemma2Model, Gemma3Model) stores every norm weight
  // with the 1 already added, in the checkpoint's dtype, then as F32: the file holds the
  // multiplier 1 + w, rounded. It is read as it is, with the plain rmsnorm (what llama.cpp
  // computes): subtracting 1 would not give w back exactly (1 + w was rounded when written,
  // and s - 1 rounds again in f32 for s < 0.5), and adding it back in rmsnorm_1p would round
  // once more, while x / rms * s uses the stored value untouched.
  std::vector<std::string> gguf_names() const override { return {"gemma2", "gemma3"}; }
  int global_slots() const override { return kGlobalSlots; }
  int layer_slots() const override { return kLayerSlots; }
  std::vector<std::string> stages() const override {
    return {"embed", "attn_norm", "q",        "k",         "v",        "q_norm",
            "k_norm", "q_rope",   "k_rope",   "attn",      "o",        "post_attn_norm",
            "attn_res", "ffn_norm", "gate",   "up",        "act",      "down",
            "post_ffn_norm", "ffn_res", "final_norm", "logits", "logits_softcap"};
  }

  // Gemma3ForConditionalGeneration (Gemma3Config): the text model is text_config, a
  // Gemma3TextConfig; tie_word_embeddings of the outer config, when given, decides the tie.
  void parse_hf(const JsonConfig& j, ModelConfig& c) const override {
    if (!j.has("text_config")) return parse_text(j, c);
    if (c.arch != "gemma3")
      j.fail("'text_config' (a multimodal wrapper) is read for Gemma3ForConditionalGeneration only");
    c.multimodal_text = true;
    parse_text(j.object("text_config"), c);
    if (j.has("tie_word_embeddings")) c.tied_embeddings = j.flag("tie_word_embeddings", true);
  }

  // transformers 5.17's conversion mapping of Gemma3ForConditionalGeneration: Hub files (e.g.
  // google/gemma-3-4b-it) store language_model.model.* and language_model.lm_head.weight,
  // files saved by transformers 5 model.language_model.* and lm_head.weight.
  std::vector<std::string> hf_stored_names(const ModelConfig& c,
                                           const std::string& hf) const override {
    if (!c.multimodal_text) return {hf};
    const std::string model = "model.", head = "lm_head.";
    if (hf.compare(0, model.size(), model) == 0) {
      const std::string rest = hf.substr(model.size());
      return {"model.language_model." + rest, "language_model.model." + rest};
    }
    if (hf.compare(0, head.size(), head) == 0) return {hf, "language_model." + hf};
    return {hf};
  }
  // The vision tower (SigLIP) and the multimodal projector: arbiter runs text only.
  bool hf_ignored(const ModelConfig& c, const std::string& stored) const override {
    if (!c.multimodal_text) return false;
    for (const char* p : {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                          "model.multi_modal_projector."})
      if (stored.compare(0, std::strlen(p), p) == 0) return true;
    return false;
  }

  // Defaults are those of transformers' Gemma2Config / Gemma3TextConfig when a key is absent
  // (both: hidden_size 2304, intermediate_size 9216, 26 layers, 8 heads, 4 KV heads, head_dim
  // 256; vocab_size 256000 / 262208): real configs (gemma-3-4b-it's text_config) omit some.
  static void parse_text(const JsonConfig& j, ModelConfig& c) {
    const bool g3 = c.arch == "gemma3";
    c.d_model = j.positive_int("hidden_size", 2304);
    c.n_layer = j.positive_int("num_hidden_layers", 26);
    c.n_head = j.positive_int("num_attention_heads", 8);
    c.n_head_kv = j.positive_int("num_key_value_heads", 4);
    c.d_ff = j.positive_int("intermediate_size", 9216);
    c.vocab = j.positive_int("vocab_size", g3 ? 262208 : 256000);
    c.head_dim = j.positive_int("head_dim", 256);
    if (c.n_head % c.n_head_kv != 0)
      j.fail(strformat("num_attention_heads %d is not a multiple of num_key_value_heads %d",
                       c.n_head, c.n_head_kv));
    c.max_pos = j.positive_int("max_position_embeddings", g3 ? 131072 : 8192);
    c.norm_eps = j.number("rms_norm_eps", 1e-6);
    if (!(c.norm_eps > 0)) j.fail("rms_norm_eps must be positive");
    c.tied_embeddings = j.flag("tie_word_embeddings", true);
    c.qk_norm = g3;  // Gemma3Attention's q_norm / k_norm; Gemma 2 has none

    const std::string act = j.str_of({"hidden_activation"}, "gelu_pytorch_tanh");
    if (act != "gelu_pytorch_tanh")
      j.fail("hidden_activation \"" + act + "\" is not supported (expected \"gelu_pytorch_tanh\")");
    if (j.flag("attention_bias", false)) j.fail("attention_bias=true is not supported");
    if (j.flag("use_bidirectional_attention", false))
      j.fail("use_bidirectional_attention=true is not supported (a causal LM is expected)");

    c.attn_scale = 1.0 / std::sqrt(positive(j, "query_pre_attn_scalar", 256));
    // Absent: the config's default (Gemma 2: 50 and 30; Gemma 3: none); null: none. Gemma 3's
    // attention takes no soft cap whatever its config says: Gemma3Attention.forward passes
    // none to the attention function (transformers' modeling_gemma3.py).
    c.attn_softcap = g3 ? 0 : softcap(j, "attn_logit_softcapping", 50.0);
    c.final_softcap = softcap(j, "final_logit_softcapping", g3 ? 0 : 30.0);
    parse_layer_types(j, c);
    parse_rope(j, c);
  }

  // The keys llama.cpp's loader reads (src/llama-model.cpp, llm_load_hparams): GGUF has no
  // query_pre_attn_scalar, layer types or local RoPE base; llama.cpp derives them as below.
  void parse_gguf(const GgufFile& g, ModelConfig& c) const override {
    const bool g3 = c.arch == "gemma3";
    const std::string& path = g.path();
    const std::string p = c.arch + ".";
    auto positive = [&](const std::string& key, int64_t dflt) {
      const int64_t v = dflt >= 0 ? g.get_int(key, dflt) : g.get_int(key);
      if (v <= 0 || v > std::numeric_limits<int>::max())
        throw Error("[loader] " + path + ": '" + key + "' is " + std::to_string(v) +
                    " (expected a positive int)");
      return int(v);
    };
    c.d_model = positive(p + "embedding_length", -1);
    c.n_layer = positive(p + "block_count", -1);
    c.n_head = positive(p + "attention.head_count", -1);
    c.n_head_kv = positive(p + "attention.head_count_kv", c.n_head);
    c.d_ff = positive(p + "feed_forward_length", -1);
    c.max_pos = positive(p + "context_length", -1);
    c.head_dim = positive(p + "attention.key_length", c.d_model / c.n_head);
    if (c.n_head % c.n_head_kv != 0)
      throw Error(strformat("[loader] %s: head_count %d is not a multiple of head_count_kv %d",
                            path.c_str(), c.n_head, c.n_head_kv));
    if (positive(p + "attention.value_length", c.head_dim) != c.head_dim)
      throw Error("[loader] " + path + ": " + p +
                  "attention.value_length differs from key_length (unsupported)");
    c.norm_eps = g.get_float(p + "attention.layer_norm_rms_epsilon");
    if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps))
      throw Error("[loader] " + path + ": " + p +
                  "attention.layer_norm_rms_epsilon must be positive and finite");
    c.norms_hold_one = true;
    c.qk_norm = g3;
    c.tied_embeddings = g.tensor("output.weight") == nullptr;
    // query_pre_attn_scalar: llama.cpp takes n_embd / n_head for the 27B models (gemma2: 46
    // layers, gemma3: 62), head_dim for every other size, as the official configs have it.
    const bool is_27b = c.n_layer == (g3 ? 62 : 46);
    c.attn_scale = 1.0 / std::sqrt(double(is_27b ? c.d_model / c.n_head : c.head_dim));
    // Soft caps: gemma2's default to llama.cpp's 50 and 30 when absent; gemma3 has only the
    // final one, when the key is there.
    auto cap = [&](const std::string& key, double dflt) {
      const double v = g.has(key) ? g.get_float(key) : dflt;
      if (!(v >= 0) || !std::isfinite(v))
        throw Error("[loader] " + path + ": " + key + " must be non-negative and finite");
      return v;
    };
    c.attn_softcap = g3 ? 0 : cap(p + "attn_logit_softcapping", 50.0);
    c.final_softcap = cap(p + "final_logit_softcapping", g3 ? 0 : 30.0);
    if (g3 && g.has(p + "attn_logit_softcapping"))
      throw Error("[loader] " + path + ": " + p +
                  "attn_logit_softcapping is not read by llama.cpp for gemma3 (refusing it)");
    // Sliding layers: gemma2 every even layer, window 4096 by default; gemma3 every layer but
    // each 6th, when the window key is there and positive (else every layer is full).
    // gemma3 may state the period (llama.cpp: sliding_window_pattern, default 6) or a per-layer
    // bool array (as llama.cpp's converter writes it for its newer gemmas).
    c.sliding_window = g3 ? int(g.get_int(p + "attention.sliding_window", 0))
                          : positive(p + "attention.sliding_window", 4096);
    if (c.sliding_window < 0)
      throw Error("[loader] " + path + ": " + p + "attention.sliding_window is negative");
    c.layer_sliding.assign(size_t(c.n_layer), false);
    const std::string pattern_key = p + "attention.sliding_window_pattern";
    const GgufValue* pv = g3 ? g.find(pattern_key) : nullptr;
    if (c.sliding_window > 0 && pv && pv->kind == GgufValue::Kind::ArrBool) {
      if (pv->au.size() != size_t(c.n_layer))
        throw Error(strformat("[loader] %s: %s holds %zu layers, the model has %d", path.c_str(),
                              pattern_key.c_str(), pv->au.size(), c.n_layer));
      for (int l = 0; l < c.n_layer; ++l) c.layer_sliding[size_t(l)] = pv->au[size_t(l)] != 0;
    } else if (c.sliding_window > 0) {
      const int pattern = g3 ? (pv ? positive(pattern_key, -1) : 6) : 2;
      for (int l = 0; l < c.n_layer; ++l) c.layer_sliding[size_t(l)] = l % pattern < pattern - 1;
    }
    c.rope.dims = c.head_dim;
    c.rope.layout = RopeLayout::Half;  // llama.cpp's NEOX RoPE: no row permutation for gemma
    read_gguf_rope(g, c.arch, c.rope);
    c.rope_local = c.rope;
    if (g3) {  // llama.cpp's local RoPE: rope.freq_base_swa (default 10000), unscaled
      c.rope_local.theta = g.get_float(p + "rope.freq_base_swa", 10000.0);
      if (!(c.rope_local.theta > 0) || !std::isfinite(c.rope_local.theta))
        throw Error("[loader] " + path + ": " + p + "rope.freq_base_swa must be positive and finite");
      c.rope_local.scaling = RopeScaling{};
    }
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
      s.gguf_offset = kind == TensorKind::Norm ? 1.0 : 0.0;  // llama.cpp stores 1 + w
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
                       std::vector<int64_t> shape, TensorKind kind, const char* family) {
        TensorSpec s;
        s.role = role, s.slot = slot, s.layer = l, s.hf = hf + hf_name, s.gguf = gg + gguf_name;
        s.shape = std::move(shape), s.kind = kind, s.family = family;
        s.gguf_offset = kind == TensorKind::Norm ? 1.0 : 0.0;
        t.push_back(std::move(s));
      };
      layer("attn_norm", kAttnNorm, "input_layernorm.weight", "attn_norm.weight", {D},
            TensorKind::Norm, "norm");
      layer("wq", kWq, "self_attn.q_proj.weight", "attn_q.weight", {Hq, D}, TensorKind::Matrix,
            "attn");
      layer("wk", kWk, "self_attn.k_proj.weight", "attn_k.weight", {Hk, D}, TensorKind::Matrix,
            "attn");
      layer("wv", kWv, "self_attn.v_proj.weight", "attn_v.weight", {Hk, D}, TensorKind::Matrix,
            "attn");
      if (c.qk_norm) {
        layer("q_norm", kQNorm, "self_attn.q_norm.weight", "attn_q_norm.weight", {Dh},
              TensorKind::Norm, "norm");
        layer("k_norm", kKNorm, "self_attn.k_norm.weight", "attn_k_norm.weight", {Dh},
              TensorKind::Norm, "norm");
      }
      layer("wo", kWo, "self_attn.o_proj.weight", "attn_output.weight", {D, Hq},
            TensorKind::Matrix, "attn");
      layer("post_attn_norm", kPostAttnNorm, "post_attention_layernorm.weight",
            "post_attention_norm.weight", {D}, TensorKind::Norm, "norm");
      layer("ffn_norm", kFfnNorm, "pre_feedforward_layernorm.weight", "ffn_norm.weight", {D},
            TensorKind::Norm, "norm");
      layer("w_gate", kGate, "mlp.gate_proj.weight", "ffn_gate.weight", {F, D},
            TensorKind::Matrix, "mlp");
      layer("w_up", kUp, "mlp.up_proj.weight", "ffn_up.weight", {F, D}, TensorKind::Matrix,
            "mlp");
      layer("w_down", kDown, "mlp.down_proj.weight", "ffn_down.weight", {D, F},
            TensorKind::Matrix, "mlp");
      layer("post_ffn_norm", kPostFfnNorm, "post_feedforward_layernorm.weight",
            "post_ffw_norm.weight", {D}, TensorKind::Norm, "norm");
    }
    return t;
  }

  std::unique_ptr<ForwardState> make_state(const Model& m, Backend& be, int max_ctx,
                                           int max_T) const override {
    return std::make_unique<DecoderState>(be, m.config, max_ctx, max_T, /*ring_sliding=*/true);
  }

  // The pool is a DecoderState's caches, paged by BatchSeq; a sliding layer's too (no ring:
  // its attention finds the window's keys through the table, and the blocks it no longer
  // sees stay allocated, since the full layers' rows share them).
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
    const Stages tap(a.hook, pos0, T);
    // HF stores w and the op adds 1; a GGUF stores 1 + w (gguf_names()).
    const NormWeight nw = c.norms_hold_one ? NormWeight::Plain : NormWeight::OnePlus;

    const Tensor& embed = w.global(kEmbed);
    if (a.ids) be.embed(embed, a.ids, T, s.x);  // x [T, D]
    else be.embed_picked(embed, s.x);
    be.scale(s.x, int64_t(T) * D, embed_scale(c, embed.dtype));
    be.apply_tap(tap("embed", -1, "embed", D, 1, 3), s.x, T, D);

    // A block's post norm and residual add, run by the next norm that reads the residual
    // (Backend::NormAdd): the first's in the feed-forward norm, the second's in the next
    // layer's attention norm or the final norm.
    Backend::NormAdd post;
    auto pending = [&]() { return post.y ? &post : nullptr; };
    for (int l = 0; l < c.n_layer; ++l) {
      auto lw = [&](int slot) -> const Tensor& { return w.layer(l, slot); };
      const bool sliding = c.layer_sliding[size_t(l)];
      const int window = sliding ? c.sliding_window : 0;
      const RopeSpec& rope = sliding ? c.rope_local : c.rope;
      const AttentionGeometry geo{"q_rope", "k_rope", "v", H, Hkv, Dh, window, c.attn_scale};

      // attention block: x += post_attn_norm(o_proj(attn(q, k, v))), q/k/v of norm(x)
      const Backend::MatmulTarget qkv[3] = {
          {&lw(kWq), nullptr, &s.q, tap("q", l, "matmul", q_dim, D, 3)},     // q [T, H*Dh]
          {&lw(kWk), nullptr, &s.k, tap("k", l, "matmul", kv_dim, D, 3)},    // k [T, Hkv*Dh]
          {&lw(kWv), nullptr, &s.v, tap("v", l, "matmul", kv_dim, D, 3)}};  // v [T, Hkv*Dh]
      be.rmsnorm_matmul(s.x, lw(kAttnNorm), nw, T, D, eps, s.xn, false,
                        tap("attn_norm", l, "rmsnorm", D, D, 3), qkv, 3, pending());
      Backend::AttentionTaps at;
      if (c.qk_norm) {  // gemma3: (1 + w) RMSNorm over each head before RoPE
        at.q_norm = tap("q_norm", l, "rmsnorm", q_dim, Dh, 3);
        at.k_norm = tap("k_norm", l, "rmsnorm", kv_dim, Dh, 3);
      }
      at.q_rope = tap("q_rope", l, "rope", q_dim, 2, 3);
      at.k_rope = tap("k_rope", l, "rope", kv_dim, 2, 3);
      at.out = tap("attn", l, "attention", q_dim, std::max(Dh, pos0 + T), 4, &geo);
      const Tensor* q_norm = c.qk_norm ? &lw(kQNorm) : nullptr;
      const Tensor* k_norm = c.qk_norm ? &lw(kKNorm) : nullptr;
      const Backend::AttentionScores scores{c.attn_scale, c.attn_softcap};
      if (a.batch)  // each sequence's rows at its own positions, against its own pages
        batch_attention(be, *a.batch, s.q, s.k, s.v, q_norm, k_norm, nw, eps, H, Hkv, Dh, &rope,
                        s.k_cache[size_t(l)], s.v_cache[size_t(l)], window, scores, s.att);
      else
        be.qk_rope_attention(s.q, s.k, s.v, q_norm, k_norm, nw, eps, T, H, Hkv, Dh, pos0, rope,
                             s.k_cache[size_t(l)], s.v_cache[size_t(l)], window, scores, s.att,
                             at);  // att [T, H*Dh]
      be.matmul(s.att, lw(kWo), nullptr, T, s.o);  // o [T, D]
      be.apply_tap(tap("o", l, "matmul", D, q_dim, 3), s.o, T, D);
      post = {&s.o, &lw(kPostAttnNorm), &s.x, tap("post_attn_norm", l, "rmsnorm", D, D, 3),
              tap("attn_res", l, "add", D, 1, 3)};

      // feed-forward block: x += post_ffn_norm(down(gelu_tanh(gate(xn)) * up(xn))), xn = norm(x)
      Backend::GluTaps ft;
      ft.norm = tap("ffn_norm", l, "rmsnorm", D, D, 3);
      ft.gate = tap("gate", l, "matmul", F, D, 3);  // [T, F]
      ft.up = tap("up", l, "matmul", F, D, 3);
      ft.act = tap("act", l, "geglu", F, 1, 3);
      be.rmsnorm_glu(s.x, lw(kFfnNorm), nw, T, D, eps, s.xn, lw(kGate), lw(kUp), GluAct::GeluTanh,
                     s.gate, s.up, s.act, ft, pending());
      be.matmul(s.act, lw(kDown), nullptr, T, s.down);  // [T, D]
      be.apply_tap(tap("down", l, "matmul", D, F, 3), s.down, T, D);
      post = {&s.down, &lw(kPostFfnNorm), &s.x, tap("post_ffn_norm", l, "rmsnorm", D, D, 3),
              tap("ffn_res", l, "add", D, 1, 3)};
    }
    // The final norm takes the last update when it reads all of x.
    if (a.batch || !a.logits || a.last_row) {
      be.norm_add(pending(), nw, T, D, eps);
      post = {};
    }
    int rows = T;  // logits rows
    if (a.batch) {
      rows = batch_logits(be, *a.batch, s.x, w.global(kOutNorm), nw, D, eps, s.xn,
                          w.global(kLmHead), s.logits);
    } else {
      if (!a.logits) return;
      const Buffer x = logit_rows(a, s.x, T, D, rows);
      const Backend::MatmulTarget head = {&w.global(kLmHead), nullptr, &s.logits,
                                          tap("logits", -1, "matmul", c.vocab, D, 3)};
      be.rmsnorm_matmul(x, w.global(kOutNorm), nw, rows, D, eps, s.xn, false,
                        tap("final_norm", -1, "rmsnorm", D, D, 3), &head, 1,
                        pending());  // [rows, V]
    }
    if (c.final_softcap > 0 && rows > 0) {
      be.softcap(s.logits, int64_t(rows) * c.vocab, c.final_softcap);
      be.apply_tap(tap("logits_softcap", -1, "softcap", c.vocab, 1, 3), s.logits, rows, c.vocab);
    }
  }

  std::vector<SynthPreset> presets() const override;

  void hf_config_json(const ModelConfig& c, nlohmann::json& j) const override {
    if (c.arch == "gemma3") j["model_type"] = "gemma3_text";  // "gemma3" is the multimodal config
    j["hidden_size"] = c.d_model;
    j["intermediate_size"] = c.d_ff;
    j["num_hidden_layers"] = c.n_layer;
    j["num_attention_heads"] = c.n_head;
    j["num_key_value_heads"] = c.n_head_kv;
    j["head_dim"] = c.head_dim;
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j["rms_norm_eps"] = c.norm_eps;
    // Official configs give whole numbers (256, 168); 1 / scale^2 is one rounding off them.
    const double qpas = 1.0 / (c.attn_scale * c.attn_scale);
    j["query_pre_attn_scalar"] = std::fabs(qpas - std::round(qpas)) < 1e-9 * qpas ? std::round(qpas) : qpas;
    j["sliding_window"] = c.sliding_window;
    nlohmann::json types = nlohmann::json::array();
    for (bool s : c.layer_sliding) types.push_back(s ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
    auto cap = [](double v) { return v > 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
    j["attn_logit_softcapping"] = cap(c.attn_softcap);
    j["final_logit_softcapping"] = cap(c.final_softcap);
    write_hf_rope(c.rope, j);
    if (c.arch == "gemma3") j["rope_local_base_freq"] = c.rope_local.theta;
  }

  // What llama.cpp's converter writes (Gemma2Model / Gemma3Model.set_gguf_parameters). A
  // config llama.cpp would read back as another model (a scale, layer pattern or local RoPE
  // it derives differently) is refused.
  void gguf_metadata(const ModelConfig& c, GgufWriter& g) const override {
    const bool g3 = c.arch == "gemma3";
    const std::string a = c.arch + ".";
    auto refuse = [&](const std::string& what) {
      throw Error("[synth] " + c.arch + ": " + what + " has no GGUF form llama.cpp reads");
    };
    const bool is_27b = c.n_layer == (g3 ? 62 : 46);
    if (c.attn_scale != 1.0 / std::sqrt(double(is_27b ? c.d_model / c.n_head : c.head_dim)))
      refuse("query_pre_attn_scalar " + std::to_string(1.0 / (c.attn_scale * c.attn_scale)));
    const int pattern = g3 ? 6 : 2;
    for (int l = 0; l < c.n_layer; ++l)
      if (c.layer_sliding[size_t(l)] != (c.sliding_window > 0 && l % pattern < pattern - 1))
        refuse("layer_types (sliding on every layer but each " + std::to_string(pattern) + "th)");
    if (g3 && (c.rope_local.theta != 10000.0 || c.rope_local.scaling.kind != RopeScaling::Kind::None))
      refuse("a local RoPE other than base 10000 unscaled");
    if (g3 && c.attn_softcap > 0) refuse("attn_logit_softcapping");
    g.add_u32(a + "embedding_length", uint32_t(c.d_model));
    g.add_u32(a + "block_count", uint32_t(c.n_layer));
    g.add_u32(a + "feed_forward_length", uint32_t(c.d_ff));
    g.add_u32(a + "attention.head_count", uint32_t(c.n_head));
    g.add_u32(a + "attention.head_count_kv", uint32_t(c.n_head_kv));
    g.add_u32(a + "attention.key_length", uint32_t(c.head_dim));
    g.add_u32(a + "attention.value_length", uint32_t(c.head_dim));
    g.add_f32(a + "attention.layer_norm_rms_epsilon", float(c.norm_eps));
    if (c.sliding_window > 0) g.add_u32(a + "attention.sliding_window", uint32_t(c.sliding_window));
    if (!g3) g.add_f32(a + "attn_logit_softcapping", float(c.attn_softcap));
    if (!g3 || c.final_softcap > 0) g.add_f32(a + "final_logit_softcapping", float(c.final_softcap));
    write_gguf_rope(c.rope, c.arch, g);
  }

  RopeLayout gguf_rope_layout(const std::string&) const override { return RopeLayout::Half; }

  nlohmann::ordered_json describe(const ModelConfig& c) const override {
    std::string types;
    for (bool s : c.layer_sliding) types += std::string(types.empty() ? "" : ",") + (s ? "S" : "F");
    return {{"layer_types", types},
            {"sliding_window", c.sliding_window},
            {"rope_local_theta", c.rope_local.theta},
            {"attn_scale", c.attn_scale},
            {"attn_softcap", c.attn_softcap},
            {"final_softcap", c.final_softcap},
            {"qk_norm", c.qk_norm},
            {"multimodal_text", c.multimodal_text},
            {"norms_hold_one", c.norms_hold_one}};
  }

  // K and V of every layer, sliding layers over their window's keys.
  double state_bytes_per_token(const ModelConfig& c, double ctx, int elem_bytes) const override {
    return 2.0 * keys_over_layers(c, ctx) * double(c.n_head_kv) * c.head_dim * elem_bytes;
  }

  // 2 x (matmul weights; the output matrix once per forward) + 4 H Dh keys per layer (QK^T
  // and PV).
  double flops_per_token(const ModelConfig& c, int T, int pos0) const override {
    const double D = c.d_model, F = c.d_ff, Hq = double(c.n_head) * c.head_dim;
    const double Hk = double(c.n_head_kv) * c.head_dim;
    const double per_layer = D * Hq + 2 * D * Hk + Hq * D + 3 * D * F;
    const double matmul =
        2.0 * (c.n_layer * per_layer + double(c.vocab) * D / std::max(T, 1));
    double keys = 0;  // keys attended by all layers, summed over the T tokens
    for (int t = 0; t < T; ++t) keys += keys_over_layers(c, double(pos0) + t + 1);
    return matmul + 4.0 * Hq * keys / std::max(T, 1);
  }

 private:
  static double keys_over_layers(const ModelConfig& c, double ctx) {
    double keys = 0;
    for (bool s : c.layer_sliding) keys += s ? std::min<double>(ctx, c.sliding_window) : ctx;
    return keys;
  }

  static double positive(const JsonConfig& j, const char* key, double dflt) {
    const double v = j.number(key, dflt);
    if (!(v > 0)) j.fail(std::string(key) + " must be positive");
    return v;
  }

  static double softcap(const JsonConfig& j, const char* key, double dflt) {
    if (!j.contains(key)) return dflt;
    return j.has(key) ? positive(j, key, 0) : 0;
  }

  // layer_types (transformers v5 spells every layer out), else the pattern: Gemma 3 slides on
  // every layer but each sliding_window_pattern-th (default 6), Gemma 2 on the even ones.
  static void parse_layer_types(const JsonConfig& j, ModelConfig& c) {
    c.layer_sliding.assign(size_t(c.n_layer), false);
    if (j.has("layer_types")) {
      const nlohmann::json& lt = j.raw("layer_types");
      if (!lt.is_array() || int(lt.size()) != c.n_layer)
        j.fail("'layer_types' is not a list of num_hidden_layers entries");
      for (int l = 0; l < c.n_layer; ++l) {
        const nlohmann::json& t = lt[size_t(l)];
        const std::string s = t.is_string() ? t.get<std::string>() : t.dump();
        if (s == "sliding_attention") c.layer_sliding[size_t(l)] = true;
        else if (s != "full_attention")
          j.fail(strformat("layer_types[%d] '%s' is not supported (expected sliding_attention or "
                           "full_attention)", l, s.c_str()));
      }
    } else {
      const bool g3 = c.arch == "gemma3";
      const char* key = j.has("_sliding_window_pattern") ? "_sliding_window_pattern"
                                                         : "sliding_window_pattern";
      const int pattern = g3 ? j.positive_int(key, 6) : 2;
      for (int l = 0; l < c.n_layer; ++l) c.layer_sliding[size_t(l)] = (l + 1) % pattern != 0;
    }
    bool any = false;
    for (bool s : c.layer_sliding) any = any || s;
    if (!any) return;
    c.sliding_window = j.positive_int("sliding_window", 4096);  // both configs: 4096
    if (c.sliding_window > c.max_pos)
      j.fail(strformat("sliding_window %d exceeds max_position_embeddings %d", c.sliding_window,
                       c.max_pos));
  }

  // Full layers: rope_theta (Gemma 3 default 1e6, Gemma 2 1e4) and rope_scaling; Gemma 3's
  // sliding layers: rope_local_base_freq (default 1e4), unscaled. transformers v5 writes
  // rope_parameters instead: Gemma 3 one entry per layer type, Gemma 2 one for all.
  static void parse_rope(const JsonConfig& j, ModelConfig& c) {
    const bool g3 = c.arch == "gemma3";
    c.rope = RopeSpec{};
    c.rope.dims = c.head_dim;
    c.rope.layout = RopeLayout::Half;  // HF "rotate_half"
    c.rope.theta = j.number("rope_theta", g3 ? 1e6 : 1e4);
    c.rope_local = c.rope;
    c.rope_local.theta = g3 ? j.number("rope_local_base_freq", 1e4) : c.rope.theta;
    if (j.has("rope_scaling")) read_hf_rope_dict(j, "rope_scaling", c.rope);
    if (j.has("rope_parameters")) {
      const JsonConfig rp = j.object("rope_parameters");
      if (rp.has("full_attention") || rp.has("sliding_attention")) {
        if (rp.has("full_attention")) read_hf_rope_dict(rp, "full_attention", c.rope);
        if (rp.has("sliding_attention")) read_hf_rope_dict(rp, "sliding_attention", c.rope_local);
      } else {
        read_hf_rope_dict(j, "rope_parameters", c.rope);
      }
    }
    if (!g3) c.rope_local = c.rope;  // Gemma 2: one RoPE for every layer
    if (!(c.rope.theta > 0) || !(c.rope_local.theta > 0)) j.fail("rope theta must be positive");
  }
};

// A gemma3 config from its official values: sliding on every layer but each 6th (the
// default sliding_window_pattern), local RoPE 10000 unscaled, no attention soft cap.
ModelConfig gemma3_config(int L, int D, int H, int Hkv, int Dh, int F, int V, int max_pos,
                          int window, double query_pre_attn_scalar) {
  ModelConfig c;
  c.arch = "gemma3";
  c.n_layer = L, c.d_model = D, c.n_head = H, c.n_head_kv = Hkv, c.head_dim = Dh, c.d_ff = F;
  c.vocab = V, c.max_pos = max_pos, c.norm_eps = 1e-6, c.tied_embeddings = true;
  c.qk_norm = true;
  c.attn_scale = 1.0 / std::sqrt(query_pre_attn_scalar);
  c.sliding_window = window;
  c.layer_sliding.assign(size_t(L), false);
  for (int l = 0; l < L; ++l) c.layer_sliding[size_t(l)] = (l + 1) % 6 != 0;
  c.rope.dims = Dh;
  c.rope.theta = 1e6;
  c.rope_local = c.rope;
  c.rope_local.theta = 1e4;
  return c;
}

// Every number is the official config.json's on the Hugging Face Hub (read 2026-12), the
// absent keys at Gemma3TextConfig's defaults. tiny-gemma2/3 are ours: small shapes for tests
// that llama.cpp's GGUF form can also hold (query_pre_attn_scalar = head_dim).
std::vector<SynthPreset> Gemma::presets() const {
  std::vector<SynthPreset> p;
  // Gemma's tokenizer: <pad> 0, <eos> 1, <bos> 2, BOS prepended; synth puts them at the end.
  const std::vector<std::string> specials = {"<pad>", "<eos>", "<bos>", "<end_of_turn>"};
  auto add = [&](const char* name, const char* hf_id, const char* cls, const char* source,
                 ModelConfig c) {
    SynthPreset s;
    s.name = name, s.hf_id = hf_id, s.hf_class = cls, s.source = source;
    s.config = std::move(c), s.specials = specials;
    s.bos = 2, s.eos = 1, s.add_bos = true;
    p.push_back(std::move(s));
  };
  add("gemma3-1b", "google/gemma-3-1b-it", "Gemma3ForCausalLM",
      "huggingface.co/google/gemma-3-1b-it config.json (transformers 4.50.0.dev0)",
      gemma3_config(26, 1152, 4, 1, 256, 6912, 262144, 32768, 512, 256));
  ModelConfig g27 = gemma3_config(62, 5376, 32, 16, 128, 21504, 262208, 131072, 1024, 168);
  g27.rope.scaling.kind = RopeScaling::Kind::Linear;
  g27.rope.scaling.factor = 8.0;
  add("gemma3-27b", "google/gemma-3-27b-it", "Gemma3ForCausalLM",
      "huggingface.co/google/gemma-3-27b-it config.json text_config (transformers "
      "4.50.0.dev0; the text model of Gemma3ForConditionalGeneration)",
      g27);
  add("tiny-gemma3", "none (arbiter test shape)", "Gemma3ForCausalLM",
      "arbiter: a 6-layer gemma3 (5 sliding, 1 full) small enough for unit tests",
      gemma3_config(6, 64, 4, 2, 16, 192, 512, 2048, 8, 16));
  ModelConfig g2 = gemma3_config(4, 64, 4, 2, 16, 192, 512, 2048, 8, 16);
  g2.arch = "gemma2";
  g2.qk_norm = false;
  for (int l = 0; l < 4; ++l) g2.layer_sliding[size_t(l)] = l % 2 == 0;
  g2.rope.theta = 1e4;
  g2.rope_local = g2.rope;
  g2.attn_softcap = 50.0;
  g2.final_softcap = 30.0;
  add("tiny-gemma2", "none (arbiter test shape)", "Gemma2ForCausalLM",
      "arbiter: a 4-layer gemma2 (even layers sliding, both soft caps) for unit tests", g2);
  return p;
}

}  // namespace

const Arch& gemma_family() {
  static const Gemma arch;
  return arch;
}

}  // namespace arbiter
