// load_model on the shipped checkpoints (config values from models/README.md, weight hashes
// from models/SHA256SUMS, parameter counts summed by hand from the documented shapes), the
// fp32 tied-as-lm_head quirk, tiny synthetic GGUFs for the qwen2/qwen3/llama3-rope paths
// (tokenizer metadata copied from stories260K.gguf), and refusals that must name the tensor.
// Add a case: build a GGUF with make_gguf(...) or edit a copy of an HF dir, then load_model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/session.h"
#include "io/gguf.h"
#include "io/io_test_util.h"
#include "model/model_test_util.h"
#include "io/sha256.h"
#include "model/arch.h"
#include "model/model.h"

using namespace arbiter;
using test::Dims;
using test::GgufBuilder;
using test::make_gguf;
using test::write_gguf;
namespace fs = std::filesystem;

namespace {

std::string error_of(const std::string& path) {
  return test::error_of([&] { load_model(path); });
}

std::vector<float> floats(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  row_to_f32(t.dtype, t.data, v.data(), t.numel());
  return v;
}

}  // namespace

// ---- shipped models ---------------------------------------------------------------------

TEST(Loader, Stories260kGguf) {
  std::string path = test::stories260k_gguf();
  if (path.empty()) GTEST_SKIP() << "stories260K.gguf not found";
  auto m = load_model(path);
  const ModelConfig& c = m->config;
  EXPECT_EQ(m->format, "gguf");
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.d_model, 64);
  EXPECT_EQ(c.n_layer, 5);
  EXPECT_EQ(c.n_head, 8);
  EXPECT_EQ(c.n_head_kv, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.d_ff, 172);
  EXPECT_EQ(c.vocab, 512);
  EXPECT_EQ(c.max_pos, 2048);  // the converter's default, not the trained 512 (README)
  EXPECT_EQ(c.norm_eps, 1e-5);  // stored as f32; read back as the decimal it was written from
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.rope.scaling.kind, RopeScaling::Kind::None);
  EXPECT_EQ(c.rope.layout, RopeLayout::Adjacent);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.tied_embeddings);  // output.weight is an exact copy of token_embd.weight
  EXPECT_EQ(c.sliding_window, 0);
  // output.weight is stored separately: a distinct view, equal values.
  EXPECT_NE(test::weight(*m, "lm_head").data, test::weight(*m, "embed").data);
  EXPECT_EQ(floats(test::weight(*m, "lm_head")), floats(test::weight(*m, "embed")));
  // 260,032 trainable + 32,768 for the stored output copy = 292,800 floats (README).
  EXPECT_EQ(m->n_params, 292800);
  EXPECT_EQ(m->weight_dtype, DType::F32);
  ASSERT_EQ(size_t(m->weights.n_layers()), 5u);
  EXPECT_EQ(test::weight(*m, "wk", 4).shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(test::weight(*m, "w_down", 4).shape, (std::vector<int64_t>{64, 172}));
  EXPECT_TRUE(test::weight(*m, "bq", 0).empty());
  EXPECT_EQ(m->eos_ids, (std::vector<int32_t>{2}));
  EXPECT_EQ(m->weights_sha256, test::published_sha("stories260K/stories260K.gguf"));
  ASSERT_NE(m->tokenizer, nullptr);
  EXPECT_EQ(m->tokenizer->vocab_size(), 512);
}

TEST(Loader, TinyStories656kBf16) {
  std::string dir = test::tinystories656k_dir();
  if (dir.empty()) GTEST_SKIP() << "TinyStories-656K not found";
  auto m = load_model(dir);
  const ModelConfig& c = m->config;
  EXPECT_EQ(m->format, "hf");
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.d_model, 128);
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope.layout, RopeLayout::Half);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(test::weight(*m, "lm_head").data, test::weight(*m, "embed").data);
  EXPECT_EQ(m->weight_dtype, DType::BF16);
  // embed 2048*128 + 2 layers * (128 + 128*128 + 2*64*128 + 128*128 + 128 + 3*384*128) + 128.
  EXPECT_EQ(m->n_params, 2048 * 128 + 2 * (128 + 16384 + 2 * 8192 + 16384 + 128 + 3 * 49152) + 128);
  EXPECT_EQ(m->n_params, 656000);
  EXPECT_EQ(m->eos_ids, (std::vector<int32_t>{2}));
  EXPECT_EQ(m->weights_sha256, test::published_sha("TinyStories-656K/model.safetensors"));
  EXPECT_EQ(test::weight(*m, "wk", 1).shape, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(test::weight(*m, "wk", 1).name, "model.layers.1.self_attn.k_proj.weight");
}

TEST(Loader, TinyStories656kFp32TiedStoredAsLmHead) {
  std::string dir = test::tinystories656k_dir();
  if (dir.empty()) GTEST_SKIP() << "TinyStories-656K not found";
  auto m = load_model(dir + "/fp32");
  auto ref = load_model(dir);
  // Only lm_head.weight is stored; the embedding must be that same matrix.
  EXPECT_EQ(test::weight(*m, "embed").data, test::weight(*m, "lm_head").data);
  EXPECT_EQ(test::weight(*m, "embed").dtype, DType::F32);
  EXPECT_EQ(test::weight(*m, "embed").shape, (std::vector<int64_t>{2048, 128}));
  EXPECT_EQ(floats(test::weight(*m, "embed")), floats(test::weight(*ref, "embed")));  // F32 = BF16 widened (README)
  EXPECT_EQ(m->n_params, 656000);
  EXPECT_EQ(m->weight_dtype, DType::F32);
  EXPECT_EQ(m->weights_sha256, test::published_sha("TinyStories-656K/fp32/model.safetensors"));
}

TEST(Loader, TinyFixturesOnePerArch) {
  // tests/fixtures/models (tests/fixtures/README.md gives the parameter counts).
  struct Case {
    const char* name;
    const char* arch;
    int64_t params;
    DType dtype;
    bool tied, bias, qk_norm;
    int window, head_dim;
  };
  const Case cases[] = {{"tiny-llama", "llama", 229696, DType::BF16, true, false, false, 0, 16},
                        {"tiny-mistral", "mistral", 356672, DType::F32, false, false, false, 32, 16},
                        {"tiny-qwen2", "qwen2", 229952, DType::F32, false, true, false, 0, 16},
                        {"tiny-qwen3", "qwen3", 188864, DType::F32, true, false, true, 0, 32}};
  for (const Case& k : cases) {
    std::string dir = test::source_path(std::string("tests/fixtures/models/") + k.name);
    if (!fs::exists(dir + "/model.safetensors")) GTEST_SKIP() << dir << " not found";
    auto m = load_model(dir);
    const ModelConfig& c = m->config;
    EXPECT_EQ(c.arch, k.arch) << k.name;
    EXPECT_EQ(m->n_params, k.params) << k.name;
    EXPECT_EQ(m->weight_dtype, k.dtype) << k.name;
    EXPECT_EQ(c.tied_embeddings, k.tied) << k.name;
    EXPECT_EQ(test::weight(*m, "lm_head").data == test::weight(*m, "embed").data, k.tied) << k.name;
    EXPECT_EQ(c.qkv_bias, k.bias) << k.name;
    EXPECT_EQ(!test::weight(*m, "bv", 1).empty(), k.bias) << k.name;
    EXPECT_EQ(c.qk_norm, k.qk_norm) << k.name;
    EXPECT_EQ(!test::weight(*m, "k_norm", 1).empty(), k.qk_norm) << k.name;
    EXPECT_EQ(c.sliding_window, k.window) << k.name;
    EXPECT_EQ(c.head_dim, k.head_dim) << k.name;
    EXPECT_EQ(c.d_model, 64) << k.name;
    EXPECT_EQ(c.d_ff, 192) << k.name;
    EXPECT_EQ(c.n_layer, 2) << k.name;
    EXPECT_EQ(c.rope.layout, RopeLayout::Half) << k.name;
    EXPECT_EQ(m->weights_sha256, sha256_file(dir + "/model.safetensors")) << k.name;
  }
}

// ---- HF refusals: a copy of TinyStories with one thing broken ------------------------------

namespace {

// Copies the TinyStories dir's small files; writes model.safetensors from `header`/the
// original data buffer (callers edit the header JSON).
struct HfCopy {
  std::string dir;
  nlohmann::json header;
  std::string data;
  explicit HfCopy(const std::string& src) {
    dir = test::temp_dir("hfcopy");
    for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                          "special_tokens_map.json"})
      if (fs::exists(src + "/" + f)) fs::copy_file(src + "/" + f, dir + "/" + f);
    std::string b = test::read_file(src + "/model.safetensors");
    uint64_t n;
    std::memcpy(&n, b.data(), 8);
    header = nlohmann::json::parse(b.substr(8, n));
    data = b.substr(8 + n);
  }
  void write() const { test::write_file(dir + "/model.safetensors", test::safetensors_bytes(header.dump(), data)); }
  void edit_config(const std::function<void(nlohmann::json&)>& f) const {
    nlohmann::json c = nlohmann::json::parse(test::read_file(dir + "/config.json"));
    f(c);
    test::write_file(dir + "/config.json", c.dump());
  }
  /// Adds a tensor of 64 zero f32 values under name (to the header; write() stores it).
  void add_zeros(const std::string& name) {
    const size_t at = data.size();
    data += std::string(256, '\0');
    header[name] = {{"dtype", "F32"}, {"shape", {64}}, {"data_offsets", {at, at + 256}}};
  }
};

/// The ref tier's logits of the last of a few fixed tokens.
std::vector<double> last_logits_on_ref(const Model& m) {
  DeviceSpec spec;
  spec.device = "ref";
  auto be = make_backend(spec);
  const std::vector<int32_t> ids = {2, 100, 7, 199, 42, 5};
  Session s(m, *be, 8);
  s.forward(ids);
  return s.logits(int(ids.size()) - 1);
}

}  // namespace

TEST(LoaderRefuse, HfMissingExtraAndMisshapenTensors) {
  std::string src = test::tinystories656k_dir();
  if (src.empty()) GTEST_SKIP() << "TinyStories-656K not found";
  {
    HfCopy c(src);
    c.header.erase("model.norm.weight");
    c.write();
    std::string e = error_of(c.dir);
    EXPECT_NE(e.find("missing tensor 'model.norm.weight' (expected shape [128])"), std::string::npos) << e;
  }
  {
    HfCopy c(src);
    c.write();
    c.edit_config([](nlohmann::json& j) { j["intermediate_size"] = 383; });
    std::string e = error_of(c.dir);
    EXPECT_NE(e.find("tensor 'model.layers.0.mlp.gate_proj.weight' has shape [384, 128] (expected [383, 128])"),
              std::string::npos)
        << e;
  }
  {
    HfCopy c(src);
    size_t at = c.data.size();
    c.data += std::string(256, '\0');
    c.header["model.layers.0.self_attn.o_proj.bias"] = {
        {"dtype", "BF16"}, {"shape", {128}}, {"data_offsets", {at, at + 256}}};
    c.write();
    std::string e = error_of(c.dir);
    EXPECT_NE(e.find("tensor 'model.layers.0.self_attn.o_proj.bias' is not used"), std::string::npos) << e;
    // ...but an old checkpoint's rotary_emb.inv_freq buffer is ignored.
    c.header.erase("model.layers.0.self_attn.o_proj.bias");
    c.header["model.layers.0.self_attn.rotary_emb.inv_freq"] = {
        {"dtype", "F32"}, {"shape", {8}}, {"data_offsets", {at, at + 32}}};
    c.write();
    EXPECT_NO_THROW(load_model(c.dir));
  }
  {
    HfCopy c(src);
    c.write();
    c.edit_config([](nlohmann::json& j) { j["architectures"] = {"PhiForCausalLM"}; });
    std::string e = error_of(c.dir);
    EXPECT_NE(e.find("PhiForCausalLM"), std::string::npos) << e;
    EXPECT_NE(e.find(supported_archs()), std::string::npos) << e;
  }
  {
    HfCopy c(src);  // untied config: lm_head.weight is now required
    c.write();
    c.edit_config([](nlohmann::json& j) { j["tie_word_embeddings"] = false; });
    std::string e = error_of(c.dir);
    EXPECT_NE(e.find("missing tensor 'lm_head.weight'"), std::string::npos) << e;
  }
}

TEST(LoaderRefuse, MoeMissingExpertTensor) {
  const std::string src = test::source_path("tests/fixtures/models/tiny-qwen2-moe");
  if (!fs::exists(src + "/model.safetensors")) GTEST_SKIP() << src << " not found";
  HfCopy c(src);
  c.header.erase("model.layers.1.mlp.experts.3.up_proj.weight");
  c.write();
  const std::string e = error_of(c.dir);
  EXPECT_NE(e.find(c.dir), std::string::npos) << e;
  EXPECT_NE(e.find("missing tensor 'model.layers.1.mlp.experts.3.up_proj.weight' (expected shape [32, 64])"),
            std::string::npos)
      << e;
}

// Gemma3ForConditionalGeneration: tiny-gemma3's text model wrapped as google/gemma-3-4b-it
// stores it (config in text_config, tensors under language_model.model., a vision tower and a
// projector beside them) and as transformers 5 saves it (model.language_model.): the text
// model's logits on ref are the fixture's, bit for bit, with the vision tensors left unread; a
// stray tensor under the text prefix is still refused.
TEST(Loader, Gemma3ConditionalGenerationReadsTheTextModel) {
  const std::string src = test::source_path("tests/fixtures/models/tiny-gemma3");
  auto want = load_model(src);
  const std::vector<double> want_logits = last_logits_on_ref(*want);
  for (const std::string prefix : {"language_model.model.", "model.language_model."}) {
    SCOPED_TRACE(prefix);
    HfCopy c(src);
    nlohmann::json h;
    for (auto& [k, v] : c.header.items())
      h[k.rfind("model.", 0) == 0 ? prefix + k.substr(6) : k] = v;
    c.header = h;
    for (const char* vision : {"vision_tower.vision_model.post_layernorm.weight",
                               "multi_modal_projector.mm_soft_emb_norm.weight"})
      c.add_zeros(prefix[0] == 'm' ? "model." + std::string(vision) : std::string(vision));
    c.write();
    c.edit_config([](nlohmann::json& j) {
      nlohmann::json text = j;
      text.erase("architectures");
      text["model_type"] = "gemma3_text";
      j = {{"architectures", {"Gemma3ForConditionalGeneration"}}, {"model_type", "gemma3"},
           {"text_config", text}, {"vision_config", {{"model_type", "siglip_vision_model"}}},
           {"mm_tokens_per_image", 256}};
    });
    auto m = load_model(c.dir);
    EXPECT_TRUE(m->config.multimodal_text);
    EXPECT_EQ(m->config.n_layer, want->config.n_layer);
    EXPECT_EQ(last_logits_on_ref(*m), want_logits);

    c.add_zeros(prefix + "layers.0.self_attn.extra.weight");
    c.write();
    const std::string e = error_of(c.dir);
    EXPECT_NE(e.find("'" + prefix + "layers.0.self_attn.extra.weight' is not used"),
              std::string::npos)
        << e;
  }
}

// Nemotron-H checkpoints carry a multi-token-prediction head (mtp.*) that transformers drops
// at load: tiny-nemotron-h with such tensors added loads, and its logits on ref are the
// fixture's, bit for bit; the same names on a Granite hybrid, or a stray tensor under
// backbone., are still refused.
TEST(Loader, NemotronHLeavesItsMtpHeadUnread) {
  const std::string src = test::source_path("tests/fixtures/models/tiny-nemotron-h");
  auto want = load_model(src);
  HfCopy c(src);
  c.add_zeros("mtp.layers.0.norm.weight");
  c.add_zeros("mtp.layers.1.mixer.experts.0.up_proj.weight");
  c.write();
  EXPECT_EQ(last_logits_on_ref(*load_model(c.dir)), last_logits_on_ref(*want));
  c.add_zeros("backbone.layers.0.mixer.extra.weight");
  c.write();
  std::string e = error_of(c.dir);
  EXPECT_NE(e.find("'backbone.layers.0.mixer.extra.weight' is not used"), std::string::npos) << e;

  HfCopy g(test::source_path("tests/fixtures/models/tiny-granite-h"));
  g.add_zeros("mtp.layers.0.norm.weight");
  g.write();
  e = error_of(g.dir);
  EXPECT_NE(e.find("'mtp.layers.0.norm.weight' is not used"), std::string::npos) << e;
}

TEST(LoaderRefuse, Paths) {
  EXPECT_NE(error_of("/nonexistent/arbiter-model").find("/nonexistent/arbiter-model"), std::string::npos);
  std::string dir = test::temp_dir("empty");
  EXPECT_NE(error_of(dir).find("no config.json"), std::string::npos);
  test::write_file(dir + "/notes.txt", "hello");
  EXPECT_NE(error_of(dir + "/notes.txt").find("not a GGUF file"), std::string::npos);
}

// ---- synthetic GGUFs ----------------------------------------------------------------------

TEST(LoaderGguf, Qwen3Q8TiedWithHeadDimNotDOverH) {
  if (test::stories260k_gguf().empty()) GTEST_SKIP() << "stories260K.gguf (tokenizer source) not found";
  Dims d;  // D 32, H 2, Dh 32 (!= D/H = 16)
  auto m = load_model(write_gguf(make_gguf("qwen3", d, true, false, true, false)));
  const ModelConfig& c = m->config;
  EXPECT_EQ(c.arch, "qwen3");
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.rope.layout, RopeLayout::Half);  // NEOX rope, rows not permuted
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.norm_eps, 1e-6);
  EXPECT_EQ(c.max_pos, 4096);
  EXPECT_EQ(c.vocab, 512);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(test::weight(*m, "lm_head").data, test::weight(*m, "embed").data);
  EXPECT_EQ(m->weight_dtype, DType::Q8_0);
  EXPECT_EQ(test::weight(*m, "wq", 0).shape, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(test::weight(*m, "wo", 0).shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(test::weight(*m, "q_norm", 0).shape, (std::vector<int64_t>{32}));
  // embed 512*32 (once, tied) + out_norm 32 + attn_norm, q_norm, k_norm, ffn_norm 4*32
  // + wq 64*32 + wk 32*32 + wv 32*32 + wo 32*64 + gate/up/down 3 * 64*32.
  EXPECT_EQ(m->n_params, 512 * 32 + 32 + 4 * 32 + 2048 + 1024 + 1024 + 2048 + 3 * 2048);
  // Whole-file hash for GGUF.
  EXPECT_EQ(m->weights_sha256, sha256_file(m->path));
}

TEST(LoaderGguf, Qwen2BiasesAndUntiedOutput) {
  if (test::stories260k_gguf().empty()) GTEST_SKIP() << "stories260K.gguf (tokenizer source) not found";
  Dims d;
  d.Dh = 16;
  d.L = 2;
  auto m = load_model(write_gguf(make_gguf("qwen2", d, false, true, false, true)));
  EXPECT_TRUE(m->config.qkv_bias);
  EXPECT_FALSE(m->config.tied_embeddings);  // output.weight holds different values
  EXPECT_EQ(test::weight(*m, "bk", 1).shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(m->config.rope.layout, RopeLayout::Half);
  EXPECT_EQ(m->weight_dtype, DType::F32);
  // qwen2 without biases is refused.
  std::string e = error_of(write_gguf(make_gguf("qwen2", d, false, false, false, true)));
  EXPECT_NE(e.find("attn_q.bias"), std::string::npos) << e;
}

TEST(LoaderGguf, Llama3RopeFreqsRecognised) {
  if (test::stories260k_gguf().empty()) GTEST_SKIP() << "stories260K.gguf (tokenizer source) not found";
  Dims d;
  d.Dh = 128;  // Llama-3's head size, so the 64 frequencies span all three llama3 regions
  d.H = 1;
  d.Hkv = 1;
  d.theta = 500000.0f;
  // transformers' _compute_llama3_parameters, written out: factor 8, low 1, high 4, 8192.
  const double theta = d.theta, factor = 8, lo = 1, hi = 4, orig = 8192;
  std::vector<float> rf;
  int n_mid = 0;
  for (int i = 0; i < d.Dh / 2; ++i) {
    double freq = std::pow(theta, -2.0 * i / d.Dh), wl = 2 * M_PI / freq;
    if (wl < orig / hi) rf.push_back(1.0f);
    else if (wl > orig / lo) rf.push_back(float(factor));
    else {
      double s = (orig / wl - lo) / (hi - lo);
      rf.push_back(float(1.0 / ((1 - s) / factor + s)));
      ++n_mid;
    }
  }
  ASSERT_GT(n_mid, 0);
  GgufBuilder good = make_gguf("llama", d, false, false, false, true);
  good.add_f32("rope_freqs.weight", {uint64_t(d.Dh / 2)}, rf);
  auto m = load_model(write_gguf(good));
  EXPECT_EQ(m->config.rope.scaling.kind, RopeScaling::Kind::Llama3);
  EXPECT_EQ(m->config.rope.scaling.factor, 8.0);
  EXPECT_EQ(m->config.rope.scaling.original_max_pos, 8192);
  EXPECT_EQ(m->config.rope.layout, RopeLayout::Adjacent);
  // A factor table that is not llama3's is refused.
  rf[d.Dh / 4] *= 1.5f;
  GgufBuilder bad = make_gguf("llama", d, false, false, false, true);
  bad.add_f32("rope_freqs.weight", {uint64_t(d.Dh / 2)}, rf);
  std::string e = error_of(write_gguf(bad));
  EXPECT_NE(e.find("rope_freqs.weight"), std::string::npos) << e;
}

// gemma3's optional keys as llama.cpp's gemma3 loader reads them: the sliding period
// `attention.sliding_window_pattern` (default 6) or a per-layer bool array, and the local
// layers' RoPE base `rope.freq_base_swa` (default 10000).
TEST(LoaderGguf, Gemma3SlidingPatternAndLocalRopeBase) {
  if (test::stories260k_gguf().empty()) GTEST_SKIP() << "stories260K.gguf (tokenizer source) not found";
  Dims d;
  d.L = 6;
  auto config_of = [](const GgufBuilder& b) {
    GgufFile g(write_gguf(b));
    ModelConfig c;
    c.arch = "gemma3";
    arch_of("gemma3").parse_gguf(g, c);
    return c;
  };
  GgufBuilder base = make_gguf("gemma3", d, false, false, true, true);
  base.kv_u32("gemma3.attention.sliding_window", 4);
  ModelConfig c = config_of(base);
  EXPECT_EQ(c.layer_sliding, (std::vector<bool>{true, true, true, true, true, false}));
  EXPECT_EQ(c.rope_local.theta, 10000.0);
  GgufBuilder two = base;
  two.kv_u32("gemma3.attention.sliding_window_pattern", 2);
  two.kv_f32("gemma3.rope.freq_base_swa", 20000.f);
  c = config_of(two);
  EXPECT_EQ(c.layer_sliding, (std::vector<bool>{true, false, true, false, true, false}));
  EXPECT_EQ(c.rope_local.theta, 20000.0);
  auto bools = [](std::vector<uint8_t> v) {  // a GGUF array of BOOL (type 7)
    std::string b;
    test::put<uint32_t>(b, 7);
    test::put<uint64_t>(b, v.size());
    for (uint8_t x : v) test::put<uint8_t>(b, x);
    return b;
  };
  GgufBuilder arr = base;
  arr.kv_raw("gemma3.attention.sliding_window_pattern", 9, bools({0, 1, 1, 0, 1, 1}));
  EXPECT_EQ(config_of(arr).layer_sliding, (std::vector<bool>{false, true, true, false, true, true}));
  GgufBuilder short_arr = base;
  short_arr.kv_raw("gemma3.attention.sliding_window_pattern", 9, bools({1, 0, 1}));
  const std::string e = error_of(write_gguf(short_arr));
  EXPECT_NE(e.find("gemma3.attention.sliding_window_pattern holds 3 layers, the model has 6"), std::string::npos) << e;
}

TEST(LoaderGguf, Refusals) {
  if (test::stories260k_gguf().empty()) GTEST_SKIP() << "stories260K.gguf (tokenizer source) not found";
  Dims d;
  std::string e = error_of(write_gguf(make_gguf("gemma", d, false, false, false, true)));
  EXPECT_NE(e.find("unsupported architecture 'gemma'"), std::string::npos) << e;
  EXPECT_NE(e.find("(supported in GGUF: llama, mistral, qwen2, qwen3, qwen2moe, qwen3moe, gemma2, gemma3, granitehybrid, nemotron_h, nemotron_h_moe)"), std::string::npos) << e;
  // gemma3 metadata llama.cpp does not read for gemma3 (an attention soft cap), and a negative
  // window: refused before any tensor is bound, naming the key.
  GgufBuilder g3 = make_gguf("gemma3", d, false, false, true, true);
  g3.kv_f32("gemma3.attn_logit_softcapping", 50.f);
  e = error_of(write_gguf(g3));
  EXPECT_NE(e.find("gemma3.attn_logit_softcapping is not read by llama.cpp"), std::string::npos) << e;
  GgufBuilder g2 = make_gguf("gemma2", d, false, false, false, true);
  g2.kv_u32("gemma2.attention.sliding_window", 0);
  e = error_of(write_gguf(g2));
  EXPECT_NE(e.find("'gemma2.attention.sliding_window' is 0"), std::string::npos) << e;
  // An extra per-layer tensor the architecture does not read.
  GgufBuilder w = make_gguf("llama", d, false, false, false, true);
  w.add_f32("blk.0.attn_output.bias", {32}, std::vector<float>(32, 0.f));
  e = error_of(write_gguf(w));
  EXPECT_NE(e.find("tensor 'blk.0.attn_output.bias' is not used"), std::string::npos) << e;
  // Wrong head_count_kv for the stored K matrix: named with both shapes.
  GgufBuilder k = make_gguf("llama", d, false, false, false, true);
  k.kv_u32("llama.attention.head_count_kv", 2);  // duplicate key -> the reader refuses
  e = error_of(write_gguf(k));
  EXPECT_NE(e.find("duplicate metadata key"), std::string::npos) << e;
  Dims d2 = d;
  d2.Hkv = 2;  // writes K/V for 2 kv heads...
  GgufBuilder k2 = make_gguf("llama", d2, false, false, false, true);
  std::string bytes = k2.build();
  // ...then patch head_count_kv back to 1 in place (u32 right after its key).
  std::string key = "llama.attention.head_count_kv";
  size_t at = bytes.find(key) + key.size() + 4;
  uint32_t one = 1;
  std::memcpy(&bytes[at], &one, 4);
  std::string p = test::temp_dir("synth") + "/kv.gguf";
  test::write_file(p, bytes);
  e = error_of(p);
  EXPECT_NE(e.find("tensor 'blk.0.attn_k.weight' has shape [64, 32] (expected [32, 32])"), std::string::npos) << e;
}
