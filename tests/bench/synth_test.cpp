// Tests of `arbiter synth` (src/model/synth.h) and the safetensors and GGUF writers it uses.
// Expected dimensions come from each model's official config.json on the Hugging Face Hub
// (repository named next to each case), not from synth.cpp's table; expected parameter
// counts are worked out by hand from those dimensions. To add a preset, add its official
// values to kOfficial below.
#include <bit>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/session.h"
#include "model/arch.h"
#include "model/synth.h"
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "io/json_config.h"
#include "model/model.h"
#include "model/quantize.h"
#include "io/safetensors.h"
#include "io/safetensors_write.h"
#include "io/sha256.h"
#include "model/model.h"
#include "test_util.h"

namespace arbiter {
namespace {

using test::read_file;
using test::run_cli;
using test::temp_dir;

struct Official {
  const char* preset;
  const char* arch;
  int L, D, H, Hkv, Dh, F, V;
  bool tied;
  double theta, eps;
  int window;
};

// Values as published in config.json of: Qwen/Qwen3-0.6B, Qwen/Qwen3-8B, Qwen/Qwen2.5-0.5B,
// meta-llama/Llama-3.2-1B, mistralai/Mistral-7B-v0.1.
const Official kOfficial[] = {
    {"qwen3-0.6b", "qwen3", 28, 1024, 16, 8, 128, 3072, 151936, true, 1000000.0, 1e-6, 0},
    {"qwen3-8b", "qwen3", 36, 4096, 32, 8, 128, 12288, 151936, false, 1000000.0, 1e-6, 0},
    {"qwen2.5-0.5b", "qwen2", 24, 896, 14, 2, 64, 4864, 151936, true, 1000000.0, 1e-6, 0},
    {"llama-3.2-1b", "llama", 16, 2048, 32, 8, 64, 8192, 128256, true, 500000.0, 1e-5, 0},
    {"mistral-7b", "mistral", 32, 4096, 32, 8, 128, 14336, 32000, false, 10000.0, 1e-5, 4096},
};

// Hand count: embedding (+ output matrix when untied) + final norm + per layer two norms,
// q/k/v/o, three MLP matrices, qwen2 biases, qwen3 q/k norms.
int64_t hand_params(const Official& o, int layers) {
  const int64_t D = o.D, Hq = int64_t(o.H) * o.Dh, Hk = int64_t(o.Hkv) * o.Dh, F = o.F, V = o.V;
  int64_t per = 2 * D + D * Hq + 2 * D * Hk + Hq * D + 3 * D * F;
  if (std::string(o.arch) == "qwen2") per += Hq + 2 * Hk;
  if (std::string(o.arch) == "qwen3") per += 2 * o.Dh;
  return V * D * (o.tied ? 1 : 2) + D + per * layers;
}

std::string file_sha(const std::string& path) {
  std::string b = read_file(path);
  return sha256_hex(b.data(), b.size());
}

SynthOptions opts(const std::string& preset, const std::string& dir, uint64_t seed = 1, int layers = 0,
                  DType dt = DType::BF16) {
  SynthOptions o;
  o.preset = preset;
  o.out_dir = dir;
  o.seed = seed;
  o.layers = layers;
  o.dtype = dt;
  return o;
}

// --- the safetensors writer ------------------------------------------------------------

TEST(SafetensorsWrite, RoundTripsThroughTheReader) {
  const std::string dir = temp_dir("stw");
  const std::string path = dir + "/t.safetensors";
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -8.5f};  // [2, 3]
  std::vector<uint16_t> b = {f32_to_bf16(1.0f), f32_to_bf16(-0.5f), f32_to_bf16(2.0f)};
  SafetensorsEntry ea{"a", DType::F32, {2, 3}, nullptr, a.data(), {}};
  SafetensorsEntry eb{"b.weight", DType::BF16, {3}, nullptr, nullptr, {}};
  eb.fill = [&](int64_t begin, int64_t n, void* dst) { std::memcpy(dst, b.data() + begin, size_t(n) * 2); };
  write_safetensors(path, {ea, eb}, {{"format", "pt"}});

  std::string bytes = read_file(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
  EXPECT_EQ((8 + n) % 64, 0u) << "data should start 64-byte aligned";
  EXPECT_EQ(bytes.size(), 8 + n + 6 * 4 + 3 * 2);

  SafetensorsSet st = SafetensorsSet::open_file(path);
  const Tensor* ta = st.tensor("a");
  const Tensor* tb = st.tensor("b.weight");
  ASSERT_TRUE(ta && tb);
  EXPECT_EQ(ta->dtype, DType::F32);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(ta->data, a.data(), 24), 0);
  EXPECT_EQ(tb->dtype, DType::BF16);
  EXPECT_EQ(std::memcmp(tb->data, b.data(), 6), 0);
  EXPECT_EQ(st.metadata().at("format"), "pt");
}

TEST(SafetensorsWrite, RefusesDuplicatesAndBadDtypes) {
  const std::string dir = temp_dir("stw-bad");
  float x = 1;
  SafetensorsEntry e{"x", DType::F32, {1}, nullptr, &x, {}};
  EXPECT_THROW(write_safetensors(dir + "/d.safetensors", {e, e}), Error);
  SafetensorsEntry q{"q", DType::Q8_0, {32}, nullptr, &x, {}};
  EXPECT_THROW(write_safetensors(dir + "/q.safetensors", {q}), Error);
  SafetensorsEntry none{"n", DType::F32, {1}, nullptr, nullptr, {}};
  EXPECT_THROW(write_safetensors(dir + "/n.safetensors", {none}), Error);
}

// --- random numbers ----------------------------------------------------------------------

TEST(SynthNormals, HaveTheMomentsOfANormal) {
  const int64_t n = 400000;
  std::vector<float> z(static_cast<size_t>(n));
  synth_normals(12345, 0, n, 1.0, z.data());
  double sum = 0, sq = 0, within1 = 0, within2 = 0;
  for (float v : z) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sq += double(v) * v;
    within1 += std::fabs(v) < 1.0;
    within2 += std::fabs(v) < 2.0;
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  // N(0, 1): mean 0 (SE 1/sqrt(n) = 0.0016), variance 1 (SE sqrt(2/n) = 0.0022),
  // P(|z| < 1) = 0.682689, P(|z| < 2) = 0.954500 (SE <= 0.0008). Bounds are ~5 SE.
  EXPECT_NEAR(mean, 0.0, 0.008);
  EXPECT_NEAR(var, 1.0, 0.011);
  EXPECT_NEAR(within1 / n, 0.682689, 0.004);
  EXPECT_NEAR(within2 / n, 0.954500, 0.002);
}

TEST(SynthNormals, DependOnlyOnKeyAndIndex) {
  std::vector<float> whole(1001), a(500), b(501);
  synth_normals(7, 0, 1001, 0.02, whole.data());
  synth_normals(7, 0, 500, 0.02, a.data());
  synth_normals(7, 500, 501, 0.02, b.data());  // starts at an even index
  for (int i = 0; i < 500; ++i) ASSERT_EQ(whole[size_t(i)], a[size_t(i)]) << i;
  for (int i = 0; i < 501; ++i) ASSERT_EQ(whole[size_t(500 + i)], b[size_t(i)]) << i;
  std::vector<float> odd(10);
  synth_normals(7, 333, 10, 0.02, odd.data());  // starts at an odd index
  for (int i = 0; i < 10; ++i) ASSERT_EQ(whole[size_t(333 + i)], odd[size_t(i)]) << i;
  std::vector<float> other(1001);
  synth_normals(8, 0, 1001, 0.02, other.data());
  int same = 0;
  for (int i = 0; i < 1001; ++i) same += whole[size_t(i)] == other[size_t(i)];
  EXPECT_LT(same, 5) << "another key must give another stream";
}

// synth_normals computes pairs in vectorised batches (model/synth_normals.cpp): every value
// must be the one a lone call computes (one element, the loop's scalar path), at every offset
// inside a batch and across batch boundaries (128 pairs), from odd and even starts.
TEST(SynthNormals, BatchedIsElementwise) {
  const int64_t begin = 12345, n = 777;
  std::vector<float> bulk(static_cast<size_t>(n));
  synth_normals(99, begin, n, 0.02, bulk.data());
  for (int64_t i = 0; i < n; ++i) {
    float one = 0;
    synth_normals(99, begin + i, 1, 0.02, &one);
    ASSERT_EQ(std::bit_cast<uint32_t>(one), std::bit_cast<uint32_t>(bulk[size_t(i)])) << "element " << begin + i;
  }
}

TEST(SynthTokenizer, ByteLevelAlphabetIsGpt2s) {
  // GPT-2 bytes_to_unicode: printable bytes map to themselves; space (0x20) is the 33rd
  // non-printable byte (0x00..0x20), so U+0100 + 32 = U+0120 'Ġ'; newline (0x0A) is U+010A 'Ċ'.
  EXPECT_EQ(byte_level_char('a'), "a");
  EXPECT_EQ(byte_level_char(' '), "\xC4\xA0");
  EXPECT_EQ(byte_level_char('\n'), "\xC4\x8A");
  EXPECT_EQ(byte_level_char(0), "\xC4\x80");
  EXPECT_EQ(byte_level_char(0xAD), "\xC5\x83");  // soft hyphen: the 68th remapped byte, U+0143
  EXPECT_EQ(byte_level_char(0xFF), "\xC3\xBF");
}

// --- presets and config.json -------------------------------------------------------------

TEST(SynthPresets, ConfigJsonCarriesTheOfficialValues) {
  for (const Official& o : kOfficial) {
    SCOPED_TRACE(o.preset);
    SynthOptions so = opts(o.preset, "unused");
    ModelConfig c = parse_hf_config(synth_config_json(so), "config.json");
    EXPECT_EQ(c.arch, o.arch);
    EXPECT_EQ(c.n_layer, o.L);
    EXPECT_EQ(c.d_model, o.D);
    EXPECT_EQ(c.n_head, o.H);
    EXPECT_EQ(c.n_head_kv, o.Hkv);
    EXPECT_EQ(c.head_dim, o.Dh);
    EXPECT_EQ(c.d_ff, o.F);
    EXPECT_EQ(c.vocab, o.V);
    EXPECT_EQ(c.tied_embeddings, o.tied);
    EXPECT_EQ(c.rope.theta, o.theta);
    EXPECT_EQ(c.norm_eps, o.eps);
    EXPECT_EQ(c.sliding_window, o.window);
    EXPECT_EQ(synth_plan(so).n_params, hand_params(o, o.L));
  }
  // Llama 3.2's RoPE scaling (config.json rope_scaling): llama3, factor 32, low 1, high 4,
  // original_max_position_embeddings 8192.
  ModelConfig c = parse_hf_config(synth_config_json(opts("llama-3.2-1b", "unused")), "config.json");
  EXPECT_EQ(c.rope.scaling.kind, RopeScaling::Kind::Llama3);
  EXPECT_EQ(c.rope.scaling.factor, 32.0);
  EXPECT_EQ(c.rope.scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope.scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.scaling.original_max_pos, 8192);
  // Totals: Llama-3.2-1B's published 1,235,814,400 (1.24B); Qwen3-0.6B by hand from the
  // dimensions, 596,049,920, of which 440,467,456 non-embedding (model card: 0.6B, 0.44B).
  EXPECT_EQ(synth_plan(opts("qwen3-0.6b", "unused")).n_params, 596049920);
  EXPECT_EQ(synth_plan(opts("llama-3.2-1b", "unused")).n_params, 1235814400);
  // The layer override changes only the layer count.
  SynthOptions one = opts("qwen3-0.6b", "unused", 1, 3);
  EXPECT_EQ(parse_hf_config(synth_config_json(one), "config.json").n_layer, 3);
}

// The MoE presets: config.json of Qwen/Qwen3-30B-A3B (128 experts of 768, top-8, norm_topk_prob
// true, 48 layers all sparse, D 2048, H 32, Hkv 4, Dh 128) and mistralai/Mixtral-8x7B-v0.1
// (8 experts of 14336, top-2, 32 layers, D 4096, H 32, Hkv 8). Parameter totals by hand:
// Qwen3: 2 V D + D + 48 (2D + 2 D Hq + 2 D Hk + 2 Dh + E D + 3 E Fe D) = 30,532,122,624
// (model card: 30.5B); Mixtral: 2 V D + D + 32 (2D + 2 D Hq + 2 D Hk + E D + 3 E F D) =
// 46,702,792,704 (46.7B).
TEST(SynthPresets, MoePresetsCarryTheOfficialValues) {
  ModelConfig q = parse_hf_config(synth_config_json(opts("qwen3-30b-a3b", "unused")), "config.json");
  EXPECT_EQ(q.arch, "qwen3_moe");
  EXPECT_EQ(q.n_layer, 48);
  EXPECT_EQ(q.d_model, 2048);
  EXPECT_EQ(q.n_head_kv, 4);
  EXPECT_EQ(q.router.n_experts, 128);
  EXPECT_EQ(q.router.top_k, 8);
  EXPECT_TRUE(q.router.norm_topk_prob);
  EXPECT_EQ(q.d_ff_expert, 768);
  EXPECT_EQ(q.layer_moe, std::vector<bool>(48, true));
  EXPECT_EQ(synth_plan(opts("qwen3-30b-a3b", "unused")).n_params, 30532122624);
  ModelConfig m = parse_hf_config(synth_config_json(opts("mixtral-8x7b", "unused")), "config.json");
  EXPECT_EQ(m.arch, "mixtral");
  EXPECT_EQ(m.router.n_experts, 8);
  EXPECT_EQ(m.router.top_k, 2);
  EXPECT_EQ(m.d_ff_expert, 14336);
  EXPECT_EQ(m.rope.theta, 1000000.0);
  EXPECT_EQ(synth_plan(opts("mixtral-8x7b", "unused")).n_params, 46702792704);
  // A layer override keeps every layer sparse.
  EXPECT_EQ(parse_hf_config(synth_config_json(opts("mixtral-8x7b", "unused", 1, 2)), "config.json")
                .layer_moe,
            std::vector<bool>(2, true));
}

TEST(SynthPresets, RefusesUnknownPresetsAndBadArguments) {
  const std::string dir = temp_dir("synth-bad");
  EXPECT_THROW(synth_preset("gpt-5"), Error);
  EXPECT_THROW(synth_checkpoint(opts("no-such-model", dir + "/a")), Error);
  EXPECT_THROW(synth_checkpoint(opts("tiny", dir + "/b", 1, 0, DType::Q8_0)), Error);
  EXPECT_THROW(synth_checkpoint(opts("tiny", dir + "/c", 1, 0, DType::F64)), Error);
  EXPECT_THROW(synth_checkpoint(opts("tiny", dir + "/d", 1, -1)), Error);
  EXPECT_FALSE(std::filesystem::exists(dir + "/a") || std::filesystem::exists(dir + "/b"));

  auto r = run_cli("synth --preset gpt-5 -o " + dir + "/e");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("qwen3-0.6b"), std::string::npos) << "the error should list the presets: " << r.err;
  r = run_cli("synth --preset tiny --dtype q4 -o " + dir + "/f");
  EXPECT_NE(r.exit_code, 0);
  r = run_cli("synth --preset tiny --layers 0 -o " + dir + "/g");
  EXPECT_NE(r.exit_code, 0);
  r = run_cli("synth --preset tiny --seed x -o " + dir + "/h");
  EXPECT_NE(r.exit_code, 0);
  r = run_cli("synth --preset tiny");  // no -o
  EXPECT_NE(r.exit_code, 0);
  r = run_cli("synth --preset tiny --bogus 1 -o " + dir + "/i");
  EXPECT_NE(r.exit_code, 0);
}

TEST(SynthPresets, RefusesToOverwriteWithoutForce) {
  const std::string dir = temp_dir("synth-force") + "/m";
  synth_checkpoint(opts("tiny", dir, 1));
  const std::string before = file_sha(dir + "/model.safetensors");
  EXPECT_THROW(synth_checkpoint(opts("tiny", dir, 2)), Error);
  EXPECT_EQ(file_sha(dir + "/model.safetensors"), before);
  // What a killed synth left (a temporary and a moved-aside checkpoint of a process that no
  // longer exists: no pid reaches 999999999) goes; a live process's temporary stays.
  const std::string parent = std::filesystem::path(dir).parent_path().string();
  for (const char* stale : {"/.m.synth-tmp-999999999", "/.m.synth-old-999999999"})
    std::filesystem::create_directories(parent + stale + "/sub");
  const std::string live = parent + "/.m.synth-tmp-1";  // init: alive
  std::filesystem::create_directories(live);
  SynthOptions f = opts("tiny", dir, 2);
  f.force = true;
  synth_checkpoint(f);
  EXPECT_NE(file_sha(dir + "/model.safetensors"), before);
  EXPECT_TRUE(std::filesystem::exists(live));
  std::filesystem::remove(live);
  // No temporary directories are left beside it.
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(dir).parent_path()))
    EXPECT_EQ(e.path().filename().string().find(".synth-"), std::string::npos) << e.path();
}

// --- written checkpoints load with the preset's shapes -------------------------------------

TEST(SynthCheckpoint, TinyLoadsWithItsShapes) {
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    SCOPED_TRACE(dtype_name(dt));
    const std::string dir = temp_dir("synth-tiny") + "/m";
    SynthResult res = synth_checkpoint(opts("tiny", dir, 1, 0, dt));
    auto m = load_model(dir);
    const ModelConfig& c = m->config;
    EXPECT_EQ(c.arch, "llama");
    EXPECT_EQ(c.n_layer, 2);
    EXPECT_EQ(c.d_model, 64);
    EXPECT_EQ(c.vocab, 512);
    EXPECT_FALSE(c.tied_embeddings);
    EXPECT_EQ(m->weight_dtype, dt);
    const test::LlamaLayer l = test::llama_layer(*m, int(1));
    EXPECT_EQ(l.wq.shape, (std::vector<int64_t>{64, 64}));
    EXPECT_EQ(l.wk.shape, (std::vector<int64_t>{32, 64}));
    EXPECT_EQ(l.w_gate.shape, (std::vector<int64_t>{192, 64}));
    EXPECT_EQ(l.w_down.shape, (std::vector<int64_t>{64, 192}));
    EXPECT_NE(test::weight(*m, "lm_head").data, test::weight(*m, "embed").data);
    // 512*64*2 + 64 + 2 * (2*64 + 64*64 + 2*32*64 + 64*64 + 3*64*192) = 164,160.
    EXPECT_EQ(m->n_params, 164160);
    EXPECT_EQ(res.n_params, 164160);
    EXPECT_EQ(res.weight_bytes, uint64_t(164160) * dtype_bytes(dt, 1));
    // Norms are exactly 1; matrices look like N(0, 0.02).
    std::vector<double> row(64);
    row_to_f64(l.attn_norm.dtype, l.attn_norm.data, row.data(), 64);
    for (double v : row) EXPECT_EQ(v, 1.0);
    const int64_t n = l.w_gate.numel();
    std::vector<double> w(static_cast<size_t>(n));
    row_to_f64(l.w_gate.dtype, l.w_gate.data, w.data(), n);
    double sq = 0;
    for (double v : w) sq += v * v;
    EXPECT_NEAR(std::sqrt(sq / n), 0.02, 0.001);  // n = 12288: SE of the sd ~ 0.00013
    // Tokenizer: 512 ids, BOS prepended, text round-trips.
    EXPECT_EQ(m->tokenizer->vocab_size(), 512);
    EXPECT_EQ(m->tokenizer->bos_id(), 510);
    const std::string text = "Hello, world! The theme: tea at three.\n\tÜnïcödé 你好 🙂";
    std::vector<int32_t> ids = m->tokenizer->encode(text, true, false);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], 510);
    EXPECT_EQ(m->tokenizer->decode(ids, true), text);
    EXPECT_EQ(m->eos_ids, std::vector<int32_t>{511});
  }
}

TEST(SynthCheckpoint, Qwen3OneLayerLoadsWithTheOfficialShapes) {
  const std::string dir = temp_dir("synth-qwen3") + "/m";
  synth_checkpoint(opts("qwen3-0.6b", dir, 1, 1));
  auto m = load_model(dir);
  const ModelConfig& c = m->config;
  EXPECT_EQ(c.arch, "qwen3");
  EXPECT_EQ(c.n_layer, 1);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(test::weight(*m, "embed").shape, (std::vector<int64_t>{151936, 1024}));
  EXPECT_EQ(test::weight(*m, "lm_head").data, test::weight(*m, "embed").data);
  const test::LlamaLayer l = test::llama_layer(*m, int(0));
  EXPECT_EQ(l.wq.shape, (std::vector<int64_t>{16 * 128, 1024}));
  EXPECT_EQ(l.wk.shape, (std::vector<int64_t>{8 * 128, 1024}));
  EXPECT_EQ(l.wo.shape, (std::vector<int64_t>{1024, 16 * 128}));
  EXPECT_EQ(l.q_norm.shape, (std::vector<int64_t>{128}));
  EXPECT_EQ(l.w_up.shape, (std::vector<int64_t>{3072, 1024}));
  EXPECT_EQ(m->weight_dtype, DType::BF16);
  const Official& o = kOfficial[0];
  EXPECT_EQ(m->n_params, hand_params(o, 1));
  // Qwen tokenizers add no BOS; synthetic merges make English text shorter than its bytes.
  EXPECT_EQ(m->tokenizer->bos_id(), -1);
  EXPECT_EQ(m->tokenizer->vocab_size(), 151936);
  const std::string text = "the quick brown fox jumps over the lazy dog, then rests in the shade";
  std::vector<int32_t> ids = m->tokenizer->encode(text, true, false);
  EXPECT_LT(ids.size() * 2, text.size());
  EXPECT_EQ(m->tokenizer->decode(ids, false), text);
  EXPECT_EQ(m->tokenizer->encode("<|im_end|>", false, true), std::vector<int32_t>{151935});
  // The same tokenizer.json through HF tokenizers 0.23.2 (transformers 5.17 AutoTokenizer,
  // run on the GPU machine, 2026-11-29) gave these ids; ours must agree.
  const std::vector<int32_t> hf = {72,  335, 387, 44,  376, 351, 498, 33,  662, 309, 259, 309, 390, 58,
                                   259, 267, 9514, 259, 417, 260, 46, 10,  9,   195, 156, 110, 195, 175,
                                   99,  195, 182, 100, 195, 169, 32,  228, 189, 160, 229, 165, 189};
  EXPECT_EQ(m->tokenizer->encode("Hello, world! The theme: tea at three.\n\t\u00dcn\u00efc\u00f6d\u00e9 \u4f60\u597d",
                                 true, false),
            hf);
}

TEST(SynthCheckpoint, Qwen25OneLayerHasBiases) {
  const std::string dir = temp_dir("synth-qwen25") + "/m";
  synth_checkpoint(opts("qwen2.5-0.5b", dir, 1, 1));
  auto m = load_model(dir);
  EXPECT_EQ(m->config.arch, "qwen2");
  EXPECT_TRUE(m->config.qkv_bias);
  const test::LlamaLayer l = test::llama_layer(*m, int(0));
  EXPECT_EQ(l.bq.shape, (std::vector<int64_t>{14 * 64}));
  EXPECT_EQ(l.bk.shape, (std::vector<int64_t>{2 * 64}));
  EXPECT_EQ(l.w_gate.shape, (std::vector<int64_t>{4864, 896}));
  EXPECT_EQ(m->n_params, hand_params(kOfficial[2], 1));
}

// --- GGUF: the same checkpoint in llama.cpp's format -----------------------------------------

// Logits rows of `ids` in one forward on the cpu tier, one thread.
std::vector<std::vector<double>> cpu_logits(const Model& m, const std::vector<int32_t>& ids,
                                            const std::string& device = "cpu") {
  DeviceSpec spec;
  spec.device = device;
  spec.threads = 1;
  auto be = make_backend(spec);
  Session s(m, *be, 64, 16);
  s.forward(ids);
  std::vector<std::vector<double>> rows;
  for (int t = 0; t < int(ids.size()); ++t) rows.push_back(s.logits(t));
  return rows;
}

// Writes the preset both ways with one seed; the GGUF must load as the same model: same
// config, same tensor shapes, same tokenizer ids, and the same logits.
void expect_gguf_matches_hf(const std::string& preset, int layers, DType dt, double logit_tol) {
  SCOPED_TRACE(preset + " " + dtype_name(dt));
  const std::string root = temp_dir("synth-gguf");
  synth_checkpoint(opts(preset, root + "/hf", 7, layers, dt));
  SynthOptions g = opts(preset, root + "/m.gguf", 7, layers, dt);
  g.format = SynthFormat::Gguf;
  synth_checkpoint(g);
  auto a = load_model(root + "/hf");
  auto b = load_model(root + "/m.gguf");
  EXPECT_EQ(b->format, "gguf");
  const ModelConfig &x = a->config, &y = b->config;
  EXPECT_EQ(y.arch, x.arch);
  EXPECT_EQ(y.n_layer, x.n_layer);
  EXPECT_EQ(y.d_model, x.d_model);
  EXPECT_EQ(y.n_head, x.n_head);
  EXPECT_EQ(y.n_head_kv, x.n_head_kv);
  EXPECT_EQ(y.head_dim, x.head_dim);
  EXPECT_EQ(y.d_ff, x.d_ff);
  EXPECT_EQ(y.vocab, x.vocab);
  EXPECT_EQ(y.tied_embeddings, x.tied_embeddings);
  EXPECT_EQ(y.qk_norm, x.qk_norm);
  EXPECT_EQ(y.norm_eps, x.norm_eps);
  EXPECT_EQ(y.rope.theta, x.rope.theta);
  EXPECT_EQ(y.rope.scaling.kind, x.rope.scaling.kind);
  EXPECT_EQ(b->n_params, a->n_params);
  EXPECT_EQ(b->weight_dtype, dt);
  for (int l = 0; l < x.n_layer; ++l) {
    const test::LlamaLayer p = test::llama_layer(*a, l), q = test::llama_layer(*b, l);
    EXPECT_EQ(q.wq.shape, p.wq.shape);
    EXPECT_EQ(q.wk.shape, p.wk.shape);
    EXPECT_EQ(q.wo.shape, p.wo.shape);
    EXPECT_EQ(q.w_down.shape, p.w_down.shape);
  }
  const std::string text = "Once upon a time, the theme: tea at three.\n";
  EXPECT_EQ(b->tokenizer->encode(text, true, false), a->tokenizer->encode(text, true, false));
  EXPECT_EQ(b->tokenizer->bos_id(), a->tokenizer->bos_id());
  EXPECT_EQ(b->eos_ids, a->eos_ids);

  const std::vector<int32_t> ids = {3, 100, 57, 250, 9};
  auto la = cpu_logits(*a, ids), lb = cpu_logits(*b, ids);
  double worst = 0, scale = 0;
  for (size_t t = 0; t < ids.size(); ++t)
    for (size_t v = 0; v < la[t].size(); ++v) {
      worst = std::max(worst, std::fabs(la[t][v] - lb[t][v]));
      scale = std::max(scale, std::fabs(la[t][v]));
    }
  EXPECT_GT(scale, 0.05) << "logits carry signal";
  EXPECT_LE(worst, logit_tol) << "max |logit| " << scale;
}

// llama: Q/K rows are permuted for llama.cpp's adjacent-pair RoPE, so the q.k sums run in
// another order: equal up to f32 rounding, bounded by 64 u_f32 (u = 2^-24) on logits of
// size ~1 through two layers. qwen3 (1 layer of the 0.6B shape): no permutation, the same
// bf16 values and the same kernels, so the logits are identical.
TEST(SynthGguf, SameWeightsAndLogitsAsTheHfCheckpoint) {
  expect_gguf_matches_hf("tiny", 0, DType::F32, 64 * std::ldexp(1.0, -24));
  expect_gguf_matches_hf("tiny", 0, DType::BF16, 64 * std::ldexp(1.0, -24));
  expect_gguf_matches_hf("qwen3-0.6b", 1, DType::BF16, 0.0);
}

// An MoE preset: its experts go into one ffn_{gate,up,down}_exps stack per layer, filled
// from the per-expert HF tensors' seeded values, and load back as the same model.
TEST(SynthGguf, MoeExpertStacksHoldTheHfExperts) {
  expect_gguf_matches_hf("tiny-moe", 0, DType::BF16, 0.0);
  const std::string root = temp_dir("synth-gguf-moe");
  SynthOptions g = opts("tiny-moe", root + "/m.gguf", 7, 0, DType::BF16);
  g.format = SynthFormat::Gguf;
  synth_checkpoint(g);
  GgufFile f(root + "/m.gguf");
  EXPECT_EQ(f.get_string("general.architecture"), "qwen3moe");
  ASSERT_NE(f.tensor("blk.1.ffn_up_exps.weight"), nullptr);
  EXPECT_EQ(f.tensor("blk.1.ffn_up_exps.weight")->shape, (std::vector<int64_t>{4, 32, 64}));
  EXPECT_EQ(f.tensor("blk.1.ffn_up.0.weight"), nullptr);
}

// What llama.cpp 80fb11a needs to load a hybrid GGUF beyond what arbiter reads
// (scripts/llama-cpp-check.sh found both): Nemotron-H's two epsilon keys, and Mamba2's conv1d
// in F32 in a bf16 file (ggml's CPU ssm_conv asserts an f32 kernel). The file still loads here.
TEST(SynthGguf, HybridsCarryWhatLlamaCppLoads) {
  const std::string root = temp_dir("synth-gguf-llamacpp");
  for (const char* preset : {"tiny-nemotron-h", "tiny-granite-h"}) {
    SCOPED_TRACE(preset);
    SynthOptions g = opts(preset, root + "/" + preset + ".gguf", 7, 0, DType::BF16);
    g.format = SynthFormat::Gguf;
    g.progress = false;
    synth_checkpoint(g);
    GgufFile f(g.out_dir);
    const std::string p = f.get_string("general.architecture") + ".attention.";
    if (std::string(preset) == "tiny-nemotron-h") {
      EXPECT_EQ(f.get_float(p + "layer_norm_epsilon"), f.get_float(p + "layer_norm_rms_epsilon"));
      EXPECT_NEAR(f.get_float(p + "layer_norm_epsilon"), 1e-5, 1e-12);  // layer_norm_epsilon in config.json
    }
    int convs = 0;
    for (const Tensor& t : f.tensors()) {
      if (t.name.ends_with("ssm_conv1d.weight")) {
        ++convs;
        EXPECT_EQ(t.dtype, DType::F32) << t.name;
      } else if (t.name.ends_with("attn_q.weight")) {
        EXPECT_EQ(t.dtype, DType::BF16) << t.name;  // the other matrices keep the file's type
      }
    }
    EXPECT_GT(convs, 0);
    EXPECT_EQ(load_model(g.out_dir)->config.arch, synth_preset(preset).config.arch);
  }
}

// gemma presets: the official config values re-read from the written config.json, and
// gemma-3-1b's published parameter count (999,885,952; summed by hand from the shapes: embed
// 262144 x 1152, per layer 2,949,120 attention + 512 q/k norm + 23,887,872 MLP + 4 x 1152
// norms, 26 layers, the final norm).
TEST(SynthPresets, GemmaConfigsCarryTheOfficialValues) {
  ModelConfig c = parse_hf_config(synth_config_json(opts("gemma3-1b", "unused")), "config.json");
  EXPECT_EQ(c.arch, "gemma3");
  EXPECT_EQ(c.n_layer, 26);
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_EQ(c.attn_scale, 1.0 / 16);
  EXPECT_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.rope_local.theta, 1e4);
  EXPECT_EQ(synth_plan(opts("gemma3-1b", "unused")).n_params, 999885952);
  int full = 0;
  for (bool s : c.layer_sliding) full += s ? 0 : 1;
  EXPECT_EQ(full, 4);  // layers 5, 11, 17, 23
  c = parse_hf_config(synth_config_json(opts("gemma3-27b", "unused")), "config.json");
  EXPECT_EQ(c.n_layer, 62);
  EXPECT_EQ(c.d_model, 5376);
  EXPECT_EQ(c.n_head_kv, 16);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.attn_scale, 1.0 / std::sqrt(168.0));
  EXPECT_EQ(c.rope.scaling.kind, RopeScaling::Kind::Linear);
  EXPECT_EQ(c.rope.scaling.factor, 8.0);
  EXPECT_EQ(c.vocab, 262208);
}

// gemma GGUF as llama.cpp's converter writes it: norms stored as 1 + w in F32 and read with
// the plain rmsnorm, the layer pattern and query_pre_attn_scalar derived from the metadata.
// The file loads as the HF checkpoint's model, and its logits over 12 positions (past the
// window of 8) are the HF path's on cpu, bit for bit: the same f32 multiplier 1 + w in the
// same norm kernel. A config llama.cpp cannot hold (the fixture's query_pre_attn_scalar 24
// with head_dim 32) is refused by the writer.
TEST(SynthGguf, GemmaSameModelAsTheHfCheckpoint) {
  for (const char* preset : {"tiny-gemma3", "tiny-gemma2"}) {
    SCOPED_TRACE(preset);
    const std::string root = temp_dir("synth-gguf-gemma");
    synth_checkpoint(opts(preset, root + "/hf", 7, 0, DType::BF16));
    SynthOptions g = opts(preset, root + "/m.gguf", 7, 0, DType::BF16);
    g.format = SynthFormat::Gguf;
    synth_checkpoint(g);
    auto a = load_model(root + "/hf");
    auto b = load_model(root + "/m.gguf");
    const ModelConfig &x = a->config, &y = b->config;
    EXPECT_FALSE(x.norms_hold_one);
    EXPECT_TRUE(y.norms_hold_one);
    EXPECT_EQ(y.arch, x.arch);
    EXPECT_EQ(y.layer_sliding, x.layer_sliding);
    EXPECT_EQ(y.sliding_window, x.sliding_window);
    EXPECT_EQ(y.attn_scale, x.attn_scale);
    EXPECT_EQ(y.attn_softcap, x.attn_softcap);
    EXPECT_EQ(y.final_softcap, x.final_softcap);
    EXPECT_EQ(y.rope, x.rope);
    EXPECT_EQ(y.rope_local, x.rope_local);
    EXPECT_EQ(y.qk_norm, x.qk_norm);
    EXPECT_EQ(y.tied_embeddings, x.tied_embeddings);
    EXPECT_EQ(b->n_params, a->n_params);
    const std::vector<int32_t> ids = {3, 100, 57, 250, 9, 11, 400, 7, 8, 300, 2, 77};
    EXPECT_EQ(cpu_logits(*a, ids), cpu_logits(*b, ids));
  }
  ModelConfig c = load_model(test::source_path("tests/fixtures/models/tiny-gemma3"))->config;
  GgufWriter w;
  EXPECT_THROW(arch_of(c.arch).gguf_metadata(c, w), Error);
}

// Llama 3 RoPE scaling travels as rope_freqs.weight, which the loader checks against
// transformers' formula; `-o X.gguf` picks the format, as does --format gguf.
TEST(SynthGguf, Llama32ScalingAndCliFormatChoice) {
  const std::string root = temp_dir("synth-gguf-cli");
  auto r = run_cli("synth --preset llama-3.2-1b --layers 1 --dtype bf16 -o " + root + "/l.gguf");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto m = load_model(root + "/l.gguf");
  EXPECT_EQ(m->config.rope.scaling.kind, RopeScaling::Kind::Llama3);
  EXPECT_EQ(m->config.rope.scaling.factor, 32.0);
  EXPECT_EQ(m->config.rope.scaling.original_max_pos, 8192);
  EXPECT_EQ(m->config.vocab, 128256);
  EXPECT_TRUE(m->config.tied_embeddings);
  EXPECT_EQ(m->n_params, hand_params(kOfficial[3], 1));
  GgufFile g(root + "/l.gguf");
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.get_string("general.architecture"), "llama");
  // As llama.cpp's converter writes them (llama.cpp refuses bf16 norm weights).
  for (const Tensor& t : g.tensors())
    EXPECT_EQ(t.dtype, t.shape.size() == 1 ? DType::F32 : DType::BF16) << t.name;
  // An existing file is kept unless --force; --format gguf works with any name; a bad
  // --format is refused.
  const std::string before = file_sha(root + "/l.gguf");
  EXPECT_NE(run_cli("synth --preset tiny -o " + root + "/l.gguf").exit_code, 0);
  EXPECT_EQ(file_sha(root + "/l.gguf"), before);
  EXPECT_EQ(run_cli("synth --preset tiny --force -o " + root + "/l.gguf").exit_code, 0);
  EXPECT_NE(file_sha(root + "/l.gguf"), before);
  ASSERT_EQ(run_cli("synth --preset tiny --format gguf -o " + root + "/t.bin").exit_code, 0);
  EXPECT_EQ(load_model(root + "/t.bin")->format, "gguf");
  EXPECT_NE(run_cli("synth --preset tiny --format onnx -o " + root + "/x").exit_code, 0);
  for (const auto& e : std::filesystem::directory_iterator(root))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

// --- reproducibility ---------------------------------------------------------------------

TEST(SynthCheckpoint, SameSeedSameBytesOtherSeedOtherBytes) {
  const std::string root = temp_dir("synth-seed");
  SynthOptions a = opts("tiny", root + "/a", 42);
  a.threads = 3;  // the thread count must not matter (3: chunks do not divide evenly)
  synth_checkpoint(a);
  SynthOptions b = opts("tiny", root + "/b", 42);
  b.threads = 1;
  synth_checkpoint(b);
  synth_checkpoint(opts("tiny", root + "/c", 43));
  for (const char* f : {"model.safetensors", "tokenizer.json", "config.json", "tokenizer_config.json",
                        "generation_config.json"})
    EXPECT_EQ(file_sha(root + "/a/" + f), file_sha(root + "/b/" + f)) << f;
  EXPECT_NE(file_sha(root + "/a/model.safetensors"), file_sha(root + "/c/model.safetensors"));
  EXPECT_EQ(file_sha(root + "/a/tokenizer.json"), file_sha(root + "/c/tokenizer.json"));
  // The CLI writes the same bytes as the library.
  auto r = run_cli("synth --preset tiny --dtype bf16 --seed 42 -o " + root + "/d");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(file_sha(root + "/a/model.safetensors"), file_sha(root + "/d/model.safetensors"));
  EXPECT_NE(read_file(root + "/d/README.md").find("never for correctness"), std::string::npos);
}


// --- the hybrid presets and the in-memory model ----------------------------------------

// The config fields a hybrid's forward reads: the generic dimensions and its family's own.
void expect_same_hybrid_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.n_head_kv, b.n_head_kv);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.d_ff, b.d_ff);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.max_pos, b.max_pos);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.rope.theta, b.rope.theta);
  EXPECT_EQ(a.attn_scale, b.attn_scale);
  EXPECT_EQ(arch_of(a.arch).describe(a), arch_of(b.arch).describe(b));  // blocks, ssm_*, moe_*
  EXPECT_EQ(a.ssm_chunk, b.ssm_chunk);
  EXPECT_EQ(a.ssm_conv_bias, b.ssm_conv_bias);
  EXPECT_EQ(a.moe_shared_ff, b.moe_shared_ff);
  EXPECT_EQ(a.moe_norm_topk, b.moe_norm_topk);
  EXPECT_EQ(a.moe_scaling, b.moe_scaling);
  EXPECT_EQ(a.moe_n_group, b.moe_n_group);
  EXPECT_EQ(a.moe_topk_group, b.moe_topk_group);
}

// Every hybrid preset's config.json reads back as the preset's config (hf_config_json writes
// every key the family parses), at full size and with the layer count overridden (the block
// pattern repeats). The values themselves: the official config.json of
// ibm-granite/granite-4.0-h-tiny (hidden 1536, 40 layers, attention at 5/15/25/35, 12 heads,
// 4 KV, 64 experts top-6 of 512, shared 1024, Mamba 48 x 64, d_state 128, 1 group, conv 4,
// vocab 100352, tied) and nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 (hidden 2688, 52 blocks
// 23 M / 23 E / 6 *, 32 heads, 2 KV, head_dim 128, 128 experts top-6 of 1856, shared 3712,
// Mamba 64 x 64, 8 groups, d_state 128, vocab 131072, untied). Parameter totals by hand:
// granite-4.0-h-tiny: V D + D + 36 (D + D (2I + 2GN + nh) + C K + C + 3 nh + I + I D)
//   + 4 (D + 2 D (H + Hkv) Dh) + 40 (D + 3 D Fs + E D + 3 E Fe D) = 6,939,037,248 (6.94B)
// nemotron-3-nano: 2 V D + D + 23 (D + mixer) + 6 (D + 2 D (H + Hkv) Dh)
//   + 23 (D + E D + E + 2 E Fe D + 2 Fs D) = 31,577,940,288 (model card: 31.6B).
TEST(SynthPresets, HybridPresetsRoundTripWithTheOfficialValues) {
  for (const char* name : {"granite-4.0-h-tiny", "granite-4.0-h-1b", "granite-4.0-h-350m",
                           "nemotron-3-nano-30b-a3b", "tiny-granite-h", "tiny-nemotron-h"}) {
    SCOPED_TRACE(name);
    const SynthPreset& p = synth_preset(name);
    expect_same_hybrid_config(parse_hf_config(synth_config_json(opts(name, "unused")), "config.json"),
                              p.config);
    const ModelConfig small = parse_hf_config(synth_config_json(opts(name, "unused", 1, 6)), "config.json");
    EXPECT_EQ(small.n_layer, 6);
    for (int l = 0; l < 6; ++l)
      EXPECT_EQ(small.layer_blocks[size_t(l)], p.config.layer_blocks[size_t(l) % p.config.layer_blocks.size()]);
  }
  const ModelConfig g = synth_preset("granite-4.0-h-tiny").config;
  EXPECT_EQ(g.layer_blocks, "MMMMM*MMMMMMMMM*MMMMMMMMM*MMMMMMMMM*MMMM");
  EXPECT_EQ(g.d_model, 1536);
  EXPECT_EQ(g.head_dim, 128);
  EXPECT_EQ(g.moe_experts, 64);
  EXPECT_EQ(g.moe_top_k, 6);
  EXPECT_EQ(g.moe_ff, 512);
  EXPECT_EQ(g.d_ff, 1024);
  EXPECT_EQ(g.ssm_heads * g.ssm_head_dim, 3072);
  EXPECT_FALSE(g.use_rope);
  EXPECT_EQ(g.embed_mult, 12);
  EXPECT_EQ(g.logits_scaling, 6);
  auto granite_params = [](const ModelConfig& c) {
    const int64_t D = c.d_model, V = c.vocab, I = int64_t(c.ssm_heads) * c.ssm_head_dim, nh = c.ssm_heads;
    const int64_t G = c.ssm_groups, N = c.ssm_state, C = I + 2 * G * N, K = c.ssm_conv;
    const int64_t Hd = int64_t(c.n_head + c.n_head_kv) * c.head_dim, E = c.moe_experts, Fe = c.moe_ff;
    const int64_t mamba = D + D * (I + C + nh) + C * K + C + 3 * nh + I + I * D;
    return V * D + D + 36 * mamba + 4 * (D + 2 * D * Hd) + 40 * (D + 3 * D * c.d_ff + E * D + 3 * E * Fe * D);
  };
  EXPECT_EQ(synth_plan(opts("granite-4.0-h-tiny", "unused")).n_params, granite_params(g));
  EXPECT_EQ(granite_params(g), 6939037248);
  const ModelConfig n = synth_preset("nemotron-3-nano-30b-a3b").config;
  EXPECT_EQ(n.n_layer, 52);
  EXPECT_EQ(std::count(n.layer_blocks.begin(), n.layer_blocks.end(), 'M'), 23);
  EXPECT_EQ(std::count(n.layer_blocks.begin(), n.layer_blocks.end(), 'E'), 23);
  EXPECT_EQ(std::count(n.layer_blocks.begin(), n.layer_blocks.end(), '*'), 6);
  EXPECT_EQ(n.moe_experts, 128);
  EXPECT_EQ(n.moe_top_k, 6);
  EXPECT_EQ(n.moe_ff, 1856);
  EXPECT_EQ(n.moe_shared_ff, 3712);
  EXPECT_EQ(n.moe_scaling, 2.5);
  EXPECT_EQ(n.ssm_groups, 8);
  EXPECT_TRUE(n.ssm_norm_per_group);
  {
    const int64_t D = 2688, V = 131072, I = 4096, nh = 64, C = I + 2 * 8 * 128, K = 4;
    const int64_t mixer = D * (I + C + nh) + C * K + C + 3 * nh + I + I * D;
    const int64_t attn = 2 * D * (32 + 2) * 128;
    const int64_t moe = 128 * D + 128 + 2 * 128 * 1856 * D + 2 * 3712 * D;
    const int64_t want = 2 * V * D + D + 23 * (D + mixer) + 6 * (D + attn) + 23 * (D + moe);
    EXPECT_EQ(synth_plan(opts("nemotron-3-nano-30b-a3b", "unused")).n_params, want);
    EXPECT_EQ(want, 31577940288);
  }
}

// bench --synth's model: synth_model builds in memory what synth_checkpoint writes, so the
// in-memory model is the directory's: the same config, every tensor's bytes, the tokenizer,
// and the ref tier's logits bit for bit (a prefill and a decode step). The tiny hybrid
// directories also load back as their presets' configs.
TEST(SynthModel, InMemoryIsTheSynthDirectoryBitForBit) {
  for (const char* name : {"tiny-granite-h", "tiny-nemotron-h", "tiny"}) {
    SCOPED_TRACE(name);
    const std::string dir = temp_dir("synth-mem") + "/m";
    synth_checkpoint(opts(name, dir, 3, 0, DType::BF16));
    auto disk = load_model(dir);
    auto mem = synth_model(opts(name, "", 3, 0, DType::BF16));
    EXPECT_EQ(mem->format, "synth (in memory)");
    EXPECT_EQ(mem->path, std::string("synth:") + name);
    EXPECT_EQ(mem->n_params, disk->n_params);
    if (disk->config.arch != "llama") {
      expect_same_hybrid_config(disk->config, synth_preset(name).config);  // the directory round trip
      expect_same_hybrid_config(mem->config, disk->config);
    }
    ASSERT_EQ(mem->weights.specs.size(), disk->weights.specs.size());
    for (size_t i = 0; i < disk->weights.specs.size(); ++i) {
      const Tensor& a = mem->weights.at(mem->weights.specs[i]);
      const Tensor& b = disk->weights.at(disk->weights.specs[i]);
      ASSERT_EQ(a.shape, b.shape) << disk->weights.specs[i].hf;
      EXPECT_EQ(0, std::memcmp(a.data, b.data, b.nbytes())) << disk->weights.specs[i].hf;
    }
    const std::string text = "synthetic weights, same tokens";
    EXPECT_EQ(mem->tokenizer->encode(text, true, false), disk->tokenizer->encode(text, true, false));
    EXPECT_EQ(mem->eos_ids, disk->eos_ids);
    DeviceSpec spec;
    spec.device = "ref";
    auto be = make_backend(spec);
    auto logits = [&](const Model& m) {
      Session s(m, *be, 16);
      s.forward({5, 300, 17, 42, 99});
      std::vector<double> out = s.logits(4);
      s.forward({7});
      std::vector<double> d = s.logits(0);
      out.insert(out.end(), d.begin(), d.end());
      return out;
    };
    const std::vector<double> a = logits(*mem), b = logits(*disk);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(double)));
  }
  EXPECT_NE(test::error_of([] { synth_model(opts("no-such-preset", "")); }).find("unknown preset"),
            std::string::npos);
}

}  // namespace
}  // namespace arbiter

namespace arbiter {
namespace {

// synth --dtype RECIPE writes what `arbiter quantize --type RECIPE` makes of the f32 synth
// GGUF (whose recipe quantize_test.cpp checks against llama.cpp's), tensor for tensor and byte
// for byte, without the f32 file; it loads and runs with ref and cpu agreeing.
TEST(SynthGguf, QuantizedIsQuantizeOfTheF32File) {
  const std::string root = temp_dir("synth-quant");
  SynthOptions f = opts("tiny", root + "/f32.gguf", 3, 0, DType::F32);
  f.format = SynthFormat::Gguf;
  f.progress = false;
  synth_checkpoint(f);
  // tiny's rows (64 and 192 values) do not divide into 256-value super-blocks, so Q4_K_M
  // falls back as llama-quant.cpp does: Q4_K -> Q5_0 for every matrix, Q6_K -> Q8_0 for the
  // untied output and layer 1's attn_v and ffn_down (use_more_bits(1, 2)).
  struct Want {
    QuantRecipe r;
    DType matrix, singled_out;
  };
  for (const Want w : {Want{QuantRecipe::Q8_0, DType::Q8_0, DType::Q8_0},
                       Want{QuantRecipe::Q4_K_M, DType::Q5_0, DType::Q8_0}}) {
    const std::string name = quant_recipe_name(w.r);
    SCOPED_TRACE(name);
    SynthOptions q = f;
    q.out_dir = root + "/" + name + ".gguf";
    q.quant = w.r;
    const SynthResult res = synth_checkpoint(q);
    const std::string want_path = root + "/quantized-" + name + ".gguf";
    quantize_gguf(f.out_dir, want_path, w.r, 2);
    GgufFile got(q.out_dir), want(want_path);
    EXPECT_EQ(got.find("general.file_type")->u, want.find("general.file_type")->u);
    EXPECT_EQ(got.find("general.quantization_version")->u, 2u);
    ASSERT_EQ(got.tensors().size(), want.tensors().size());
    uint64_t bytes = 0;
    for (const Tensor& t : got.tensors()) {
      SCOPED_TRACE(t.name);
      const Tensor* u = want.tensor(t.name);
      ASSERT_NE(u, nullptr);
      EXPECT_EQ(t.dtype, u->dtype);
      EXPECT_EQ(t.shape, u->shape);
      ASSERT_EQ(t.nbytes(), u->nbytes());
      EXPECT_EQ(std::memcmp(t.data, u->data, t.nbytes()), 0);
      const bool singled_out = t.name == "output.weight" || t.name == "blk.1.attn_v.weight" ||
                               t.name == "blk.1.ffn_down.weight";
      EXPECT_EQ(t.dtype, t.shape.size() == 1 ? DType::F32 : singled_out ? w.singled_out : w.matrix);
      bytes += t.nbytes();
    }
    EXPECT_EQ(res.weight_bytes, bytes);
    EXPECT_EQ(synth_plan(q).weight_bytes, bytes);

    auto m = load_model(q.out_dir);
    const std::vector<int32_t> ids = {3, 100, 57, 250, 9};
    const auto r = cpu_logits(*m, ids, "ref"), c = cpu_logits(*m, ids);
    // Kernel error only (the same quantized weights on both tiers): quantize_test.cpp's bound.
    for (size_t t = 0; t < ids.size(); ++t) EXPECT_LT(test::rel_l2(c[t], r[t]), 1e-5) << "row " << t;
  }
}

TEST(SynthGguf, QuantizedRefusals) {
  const std::string dir = temp_dir("synth-quant-bad");
  auto r = run_cli("synth --preset tiny --dtype q4_k_m -o " + dir + "/hf");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--format gguf"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("quantize --mlx"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  r = run_cli("synth --preset tiny --dtype q4_k -o " + dir + "/k.gguf");  // a block type, no recipe
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("q4_k_m"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/hf") || std::filesystem::exists(dir + "/k.gguf"));
}

}  // namespace
}  // namespace arbiter
