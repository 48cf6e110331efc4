// MLX-quantized HF directories (model/mlx.h): tiny-qwen3 (tied embeddings) quantized by our
// own `quantize --mlx` at test time, loaded and run on ref and cpu; the ref tier against the
// same model with every weight dequantized by an independent bit-by-bit reading of MLX's
// layout and stored as f64 (bit-identical logits); per-module overrides; the refusals of
// bad packed shapes, missing scales, bits MLX does not define and other tools' configs.
// To add a refusal: a row in MlxModel.Refusals built with rewrite().
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <tuple>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/quant.h"
#include "engine/session.h"
#include "io/safetensors.h"
#include "io/safetensors_write.h"
#include "model/mlx.h"
#include "model/model.h"
#include "model/quantize.h"
#include "test_util.h"

namespace arbiter::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* kParent = "tests/fixtures/models/tiny-qwen3";

std::vector<std::vector<double>> logits(const Model& m, const std::string& tier, const std::vector<int32_t>& ids) {
  DeviceSpec spec;
  spec.device = tier;
  auto be = make_backend(spec);
  Session s(m, *be, int(ids.size()));
  s.forward(ids);
  std::vector<std::vector<double>> out;
  for (int t = 0; t < int(ids.size()); ++t) out.push_back(s.logits(t));
  return out;
}

const std::vector<int32_t> kIds = {5, 77, 300, 12, 999, 41, 640, 3};

std::string quantized(int bits, int group) {
  const std::string out = temp_dir("mlx") + "/q";
  quantize_mlx(source_path(kParent), out, bits, group, 2);
  return out;
}

// A copy of dir (tokenizer files, config.json edited by cfg, tensors edited by edit) at a
// fresh path. Entries point into `keep`'s mapped files.
std::string rewrite(const std::string& dir, const std::function<void(json&)>& cfg,
                    const std::function<void(std::vector<SafetensorsEntry>&)>& edit, SafetensorsSet& keep) {
  const std::string out = temp_dir("mlx-rw");
  keep = SafetensorsSet::open_dir(dir);
  std::vector<SafetensorsEntry> e;
  for (const auto& [n, t] : keep.tensors()) e.push_back({n, t.dtype, t.shape, {}, t.data, {}});
  for (const auto& [n, t] : keep.int_tensors()) e.push_back({n, DType::F32, t.shape, {}, t.data, t.type});
  edit(e);
  write_safetensors(out + "/model.safetensors", e);
  json j = json::parse(read_file(dir + "/config.json"));
  cfg(j);
  write_file(out + "/config.json", j.dump());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    fs::copy_file(dir + "/" + f, out + "/" + f);
  return out;
}

void erase(std::vector<SafetensorsEntry>& e, const std::string& name) {
  e.erase(std::remove_if(e.begin(), e.end(), [&](const SafetensorsEntry& x) { return x.name == name; }), e.end());
}

TEST(MlxModel, ParamsAsMlxChecksThem) {
  EXPECT_EQ(mlx_params_error({"affine", 64, 4}), "");
  EXPECT_EQ(mlx_params_error({"mxfp4", 32, 4}), "");
  EXPECT_EQ(mlx_params_error({"nvfp4", 16, 4}), "");
  EXPECT_EQ(mlx_params_error({"mxfp8", 32, 8}), "");
  EXPECT_NE(mlx_params_error({"affine", 64, 7}).find("affine bits must be 2, 3, 4, 5, 6 or 8"), std::string::npos);
  EXPECT_NE(mlx_params_error({"affine", 48, 4}).find("group_size must be 32, 64 or 128"), std::string::npos);
  EXPECT_NE(mlx_params_error({"mxfp4", 64, 4}).find("mxfp4 needs bits 4 and group_size 32"), std::string::npos);
}

TEST(MlxModel, QuantizedLoadsAndRunsOnRefAndCpu) {
  auto parent = load_model(source_path(kParent));
  const auto want = logits(*parent, "ref", kIds);
  // Quantization error bounds (relative L2 of the logits against the f32 parent) measured on
  // this random-init model, mean over the rows: 8-bit 0.010, 4-bit 0.24, 3-bit 0.37 (a
  // misread block gives unrelated logits, ~1 to 1.4); each bound about 1.6x its measure, and
  // fewer bits must err more.
  double last = 0;
  for (auto [bits, group, qbound] : {std::tuple{8, 32, 0.016}, {4, 64, 0.4}, {3, 64, 0.6}}) {
    SCOPED_TRACE("bits " + std::to_string(bits) + " group " + std::to_string(group));
    auto m = load_model(quantized(bits, group));
    const DType t = mlx_affine_dtype(bits);
    EXPECT_EQ(weight(*m, "wq", 0).dtype, t);
    EXPECT_EQ(weight(*m, "embed").dtype, t);  // MLX quantizes the embedding, tied lm_head too
    EXPECT_TRUE(m->config.tied_embeddings);
    EXPECT_EQ(weight(*m, "lm_head").data, weight(*m, "embed").data);
    EXPECT_EQ(m->n_params, parent->n_params);
    const auto r = logits(*m, "ref", kIds), c = logits(*m, "cpu", kIds);
    double kernel = 0, quant = 0;
    for (size_t i = 0; i < kIds.size(); ++i) {
      // Kernel error alone (cpu f32 against ref f64 on the same quantized weights), as the
      // GGUF round trips bound it (tests/engine/quantize_test.cpp).
      EXPECT_LT(rel_l2(c[i], r[i]), 1e-5) << "row " << i;
      kernel = std::max(kernel, rel_l2(c[i], r[i]));
      quant += rel_l2(r[i], want[i]) / double(kIds.size());
    }
    std::printf("[ mlx      ] %d-bit g%d: kernel rel_l2 %.2e, quantization rel_l2 %.4f (mean)\n", bits, group, kernel, quant);
    EXPECT_GT(quant, last);
    EXPECT_LT(quant, qbound);
    last = quant;
  }
}

// Weights are below the architecture files, so every family reads MLX checkpoints: one
// fixture per family (llama, gemma's sandwich norms, a Mamba2 hybrid, an MoE with an untied lm_head), each
// quantized at test time, on ref and cpu.
TEST(MlxModel, EveryFamilyRunsQuantized) {
  for (const char* f : {"tiny-llama", "tiny-gemma3", "tiny-granite-h", "tiny-qwen3-moe"}) {
    SCOPED_TRACE(f);
    const std::string out = temp_dir("mlx-fam") + "/q";
    quantize_mlx(source_path(std::string("tests/fixtures/models/") + f), out, 4, 32, 2);
    auto m = load_model(out);
    EXPECT_EQ(m->weight_dtype, DType::MLX_Q4);
    const auto r = logits(*m, "ref", kIds), c = logits(*m, "cpu", kIds);
    double worst = 0;
    for (size_t i = 0; i < kIds.size(); ++i) worst = std::max(worst, rel_l2(c[i], r[i]));
    EXPECT_LT(worst, 1e-5);
    std::printf("[ mlx      ] %-15s 4-bit g32: kernel rel_l2 %.2e\n", f, worst);
  }
}

// Value i of a packed row, read one bit at a time (independent of mlx_unpack).
uint32_t bit_by_bit(const uint32_t* w, int64_t i, int bits) {
  uint32_t v = 0;
  for (int k = 0; k < bits; ++k) {
    const int64_t p = i * bits + k;
    v |= ((w[p / 32] >> (p % 32)) & 1u) << k;
  }
  return v;
}

TEST(MlxModel, RefEqualsAnIndependentDequantization) {
  auto ends = [](const std::string& s, const char* t) { return s.size() >= 7 && s.compare(s.size() - 7, 7, t) == 0; };
  for (auto [bits, g] : {std::pair{5, 32}, {6, 64}, {2, 64}}) {
    SCOPED_TRACE("bits " + std::to_string(bits));
    const std::string q = quantized(bits, g);
    SafetensorsSet keep;
    std::vector<std::vector<double>> owned;
    const std::string f64 = rewrite(
        q, [](json& j) { j.erase("quantization"), j.erase("quantization_config"); },
        [&](std::vector<SafetensorsEntry>& e) {
          std::vector<SafetensorsEntry> out;
          owned.reserve(e.size());
          for (const SafetensorsEntry& x : e) {
            if (ends(x.name, ".scales") || ends(x.name, ".biases")) continue;
            if (!x.int_type) {
              out.push_back(x);
              continue;
            }
            // x = scale * q + bias (mlx/ops.cpp affine_dequantize), each group of g values.
            const std::string mod = x.name.substr(0, x.name.size() - 7);
            const Tensor& s = *keep.tensor(mod + ".scales");
            const Tensor& b = *keep.tensor(mod + ".biases");
            const int64_t rows = x.shape[0], wc = x.shape[1], cols = wc * 32 / bits;
            std::vector<double>& v = owned.emplace_back(size_t(rows * cols));
            const auto* w = static_cast<const uint32_t*>(x.data);
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t i = 0; i < cols; ++i) {
                double sc, bi;
                const int64_t gi = r * (cols / g) + i / g;
                row_to_f64(s.dtype, static_cast<const uint8_t*>(s.data) + dtype_bytes(s.dtype, gi), &sc, 1);
                row_to_f64(b.dtype, static_cast<const uint8_t*>(b.data) + dtype_bytes(b.dtype, gi), &bi, 1);
                v[size_t(r * cols + i)] = sc * bit_by_bit(w + r * wc, i, bits) + bi;
              }
            out.push_back({x.name, DType::F64, {rows, cols}, {}, v.data(), {}});
          }
          e = std::move(out);
        },
        keep);
    auto mq = load_model(q), md = load_model(f64);
    EXPECT_EQ(weight(*md, "wq", 0).dtype, DType::F64);
    EXPECT_EQ(logits(*mq, "ref", kIds), logits(*md, "ref", kIds));
  }
}

// The fp modes through the loader's repacking, one 32-value row each: codes chosen, values
// by hand. E2M1 codes 0..15 are 0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, -1, -1.5, -2, -3, -4, -6;
// 4-bit code i sits in nibble i % 8 of word i / 8, so codes 0..15 twice are the words
// 0x76543210, 0xFEDCBA98, 0x76543210, 0xFEDCBA98.
TEST(MlxModel, FpModesRepackExactly) {
  const double e2m1[16] = {0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6};
  const uint32_t nib[4] = {0x76543210, 0xFEDCBA98, 0x76543210, 0xFEDCBA98};
  uint32_t fp8[8];
  for (int i = 0; i < 32; ++i) reinterpret_cast<uint8_t*>(fp8)[i] = uint8_t(3 * i);  // byte i = value i
  struct FpCase {
    const char* mode;
    const uint32_t* words;
    int64_t nwords;
    std::vector<uint8_t> scales;
    DType want_type;
    std::function<double(int)> value;
  };
  const FpCase cases[] = {
      // E8M0 128 = 2^1.
      {"mxfp4", nib, 4, {128}, DType::MXFP4, [&](int i) { return 2 * e2m1[i % 16]; }},
      // E4M3 scales 0x38 = 1 (values 0..15) and 0x40 = 2 (values 16..31).
      {"nvfp4", nib, 4, {0x38, 0x40}, DType::MLX_NVFP4, [&](int i) { return (i < 16 ? 1 : 2) * e2m1[i % 16]; }},
      // E8M0 126 = 2^-1; code 3i is E4M3 (e = 3i >> 3, m = 3i & 7).
      {"mxfp8", fp8, 8, {126}, DType::MLX_MXFP8, [](int i) {
         const int c = 3 * i, e = c >> 3, m = c & 7;
         return 0.5 * (e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10));
       }},
  };
  for (const FpCase& c : cases) {
    SCOPED_TRACE(c.mode);
    const std::string dir = temp_dir("mlx-fp");
    const int64_t ns = int64_t(c.scales.size());
    write_safetensors(dir + "/model.safetensors",
                      {{"m.weight", DType::F32, {1, c.nwords}, {}, c.words, StInt::U32},
                       {"m.scales", DType::F32, {1, ns}, {}, c.scales.data(), StInt::U8}});
    const SafetensorsSet st = SafetensorsSet::open_file(dir + "/model.safetensors");
    const json cfg = {{"quantization", {{"group_size", ns == 2 ? 16 : 32}, {"bits", c.nwords == 8 ? 8 : 4}, {"mode", c.mode}}}};
    MlxQuant q(JsonConfig(cfg.dump(), dir + "/config.json"));
    const Tensor* t = q.tensor(st, "m.weight");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, c.want_type);
    ASSERT_EQ(t->shape, (std::vector<int64_t>{1, 32}));
    double y[32];
    row_to_f64(t->dtype, t->data, y, 32);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], c.value(i)) << "value " << i;
    EXPECT_TRUE(q.consumed("m.scales"));
  }
}

TEST(MlxModel, PerModuleOverrides) {
  const std::string q4 = quantized(4, 64), q8 = quantized(8, 32);
  SafetensorsSet k8 = SafetensorsSet::open_dir(q8), kp = SafetensorsSet::open_dir(source_path(kParent));
  SafetensorsSet keep;
  const std::string down = "model.layers.1.mlp.down_proj", o = "model.layers.0.self_attn.o_proj";
  const std::string mixed = rewrite(
      q4,
      [&](json& j) {
        j["quantization"][down] = {{"group_size", 32}, {"bits", 8}};
        j["quantization"][o] = false;
      },
      [&](std::vector<SafetensorsEntry>& e) {
        for (const char* s : {".weight", ".scales", ".biases"}) {
          erase(e, down + s);
          erase(e, o + s);
        }
        const IntTensor& w = *k8.int_tensor(down + ".weight");
        e.push_back({down + ".weight", DType::F32, w.shape, {}, w.data, StInt::U32});
        for (const char* s : {".scales", ".biases"}) {
          const Tensor& t = *k8.tensor(down + s);
          e.push_back({down + s, t.dtype, t.shape, {}, t.data, {}});
        }
        const Tensor& f = *kp.tensor(o + ".weight");
        e.push_back({o + ".weight", f.dtype, f.shape, {}, f.data, {}});
      },
      keep);
  auto m = load_model(mixed);
  EXPECT_EQ(weight(*m, "w_down", 1).dtype, DType::MLX_Q8);
  EXPECT_EQ(weight(*m, "w_down", 0).dtype, DType::MLX_Q4);
  EXPECT_EQ(weight(*m, "wo", 0).dtype, DType::F32);
  EXPECT_EQ(weight(*m, "wo", 1).dtype, DType::MLX_Q4);
  const auto r = logits(*m, "ref", kIds), c = logits(*m, "cpu", kIds);
  for (size_t i = 0; i < kIds.size(); ++i) EXPECT_LT(rel_l2(c[i], r[i]), 1e-5) << "row " << i;
}

TEST(MlxModel, Refusals) {
  const std::string q = quantized(4, 64);
  const std::string up = "model.layers.0.mlp.up_proj";
  auto none = [](std::vector<SafetensorsEntry>&) {};
  auto same = [](json&) {};
  struct Row {
    const char* what;
    std::function<void(json&)> cfg;
    std::function<void(std::vector<SafetensorsEntry>&)> edit;
    std::string expect;
  };
  const Row rows[] = {
      {"bits 7", [](json& j) { j["quantization"]["bits"] = 7; }, none,
       "config.json: quantization: affine bits must be 2, 3, 4, 5, 6 or 8 (got bits 7, group_size 64)"},
      {"wrong packed shape (the file is 4-bit, the config says 8)", [](json& j) { j["quantization"]["bits"] = 8; },
       none, "which 'model.embed_tokens.scales' [1024, 1] does not cover in groups of 64"},
      {"missing scales", same, [&](auto& e) { erase(e, up + ".scales"); },
       "tensor '" + up + ".weight' is packed but '" + up + ".scales' is missing"},
      {"missing biases", same, [&](auto& e) { erase(e, up + ".biases"); },
       "tensor '" + up + ".weight' is affine-quantized but '" + up + ".biases' is missing"},
      {"bits past int's range", [](json& j) { j["quantization"]["bits"] = 4294967300LL; }, none,
       "quantization.bits is 4294967300 (expected a small positive integer)"},
      {"unknown mode", [](json& j) { j["quantization"]["mode"] = "int4"; }, none,
       "quantization.mode 'int4' is not an MLX mode"},
      {"another tool's config",
       [](json& j) {
         j.erase("quantization");
         j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
       },
       none, "quantization_config.quant_method 'gptq' and there is no MLX 'quantization' block"},
      {"packed words without a quantization block",
       [](json& j) { j.erase("quantization"), j.erase("quantization_config"); }, none,
       "has dtype U32 and config.json has no MLX 'quantization' block"},
      {"an override leaving a packed module in float", [&](json& j) { j["quantization"][up] = false; }, none,
       "tensor '" + up + ".weight' is packed but config.json's quantization." + up + " is false"},
      {"a stray scales tensor", same,
       [&](auto& e) {
         const SafetensorsEntry s = *std::find_if(e.begin(), e.end(), [&](auto& x) { return x.name == up + ".scales"; });
         e.push_back({"model.norm.scales", s.dtype, s.shape, {}, s.data, {}});
       },
       "tensor 'model.norm.weight' has 'model.norm.scales' but is not stored as uint32"},
      {"scales of no module", same,
       [&](auto& e) {
         const SafetensorsEntry s = *std::find_if(e.begin(), e.end(), [&](auto& x) { return x.name == up + ".scales"; });
         e.push_back({"model.extra.scales", s.dtype, s.shape, {}, s.data, {}});
       },
       "tensor 'model.extra.scales' is not used by this architecture"},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.what);
    SafetensorsSet keep;
    const std::string dir = rewrite(q, r.cfg, r.edit, keep);
    const std::string e = error_of([&] { load_model(dir); });
    EXPECT_NE(e.find(r.expect), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  // quantize --mlx: bits MLX does not define, the input as output, an existing output, an
  // input already quantized.
  const std::string in = source_path(kParent);
  EXPECT_NE(error_of([&] { quantize_mlx(in, temp_dir("mlx") + "/x", 7, 64, 1); }).find("affine bits must be"),
            std::string::npos);
  EXPECT_NE(error_of([&] { quantize_mlx(in, temp_dir("mlx") + "/x", 4, 48, 1); }).find("group_size must be 32, 64 or 128"),
            std::string::npos);
  EXPECT_NE(error_of([&] { quantize_mlx(in, in, 4, 64, 1); }).find("the output is the input"), std::string::npos);
  EXPECT_NE(error_of([&] { quantize_mlx(in, q, 4, 64, 1); }).find("already exists"), std::string::npos);
  EXPECT_NE(error_of([&] { quantize_mlx(q, temp_dir("mlx") + "/x", 4, 64, 1); }).find("already MLX-quantized"),
            std::string::npos);
}

TEST(MlxModel, QuantizeCli) {
  const std::string out = temp_dir("mlx-cli") + "/q";
  const CliResult r = run_cli("quantize " + source_path(kParent) + " -o " + out + " --mlx 4 --group-size 32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(read_file(out + "/config.json"));
  const json want = {{"group_size", 32}, {"bits", 4}, {"mode", "affine"}};
  EXPECT_EQ(j["quantization"], want);
  EXPECT_EQ(j["quantization_config"], want);  // mlx-lm's save_config writes both
  EXPECT_FALSE(fs::exists(out + "/reference_logits.json"));
  const CliResult bad = run_cli("quantize " + source_path(kParent) + " -o " + out + "2 --mlx 7");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("affine bits must be 2, 3, 4, 5, 6 or 8"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(out + "2"));
}

}  // namespace
}  // namespace arbiter::test
