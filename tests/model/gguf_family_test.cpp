// GGUF files of the MoE and Mamba2-hybrid families, in the names llama.cpp's converter
// writes: each HF fixture written to GGUF by arbiter (add_model_gguf: 3-D _exps stacks,
// llama.cpp's reshapes, A = -exp(A_log), permuted Q/K rows) loads back and gives the HF
// model's ref-tier logits; the 3-D expert stacks bind as views; bad files are refused with
// one line naming the file and the key or tensor.
// Add a family: a Case in kRoundTrip, with the bound its transforms allow (0: bitwise).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/session.h"
#include "io/gguf.h"
#include "io/gguf_write.h"
#include "io/safetensors_write.h"
#include "model/model.h"
#include "model/quantize.h"
#include "model/synth.h"
#include "test_util.h"

using namespace arbiter;

namespace {

// A stand-in vocabulary of V tokens (the logits do not depend on it): byte-level, no merges.
void add_stand_in_vocab(int V, GgufWriter& g) {
  std::vector<std::string> tokens;
  for (int i = 0; i < V; ++i)
    tokens.push_back(i < 256 ? byte_level_char(uint8_t(i)) : "t" + std::to_string(i));
  g.add_string("tokenizer.ggml.model", "gpt2");
  g.add_string("tokenizer.ggml.pre", "gpt-2");
  g.add_string_array("tokenizer.ggml.tokens", tokens);
  g.add_string_array("tokenizer.ggml.merges", {});
}

// Writes model m as a GGUF file in a fresh temporary directory.
std::string write_gguf_of(const Model& m, const std::string& tag) {
  GgufWriter g;
  add_model_gguf(m, g);
  add_stand_in_vocab(m.config.vocab, g);
  const std::string path = test::temp_dir(tag) + "/m.gguf";
  g.write(path);
  return path;
}

std::vector<int32_t> prompt_of(const std::string& dir) {
  std::ifstream f(test::source_path(dir + "/reference_logits.json"));
  return nlohmann::json::parse(f)["prompt_ids"].get<std::vector<int32_t>>();
}

// max |a - b| over every logit of the prompt's positions on the ref tier.
double ref_logit_diff(const Model& a, const Model& b, const std::vector<int32_t>& prompt) {
  DeviceSpec spec;
  spec.device = "ref";
  auto be = make_backend(spec);
  Session sa(a, *be, int(prompt.size())), sb(b, *be, int(prompt.size()));
  sa.forward(prompt);
  sb.forward(prompt);
  double worst = 0;
  for (int p = 0; p < int(prompt.size()); ++p) {
    const std::vector<double> x = sa.logits(p), y = sb.logits(p);
    EXPECT_EQ(x.size(), y.size());
    for (size_t v = 0; v < x.size(); ++v) worst = std::max(worst, std::abs(x[v] - y[v]));
  }
  return worst;
}

std::string error_of(const std::string& path) {
  try {
    load_model(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// m written by add_model_gguf, then copied with tensor `from` renamed `to` (and reshaped to
// shape, when given) and metadata key kv.first replaced by kv.second's writer.
std::string rewrite(const Model& m, const std::string& from, const std::string& to,
                    std::vector<int64_t> shape,
                    const std::function<bool(const std::string&, GgufWriter&)>& kv) {
  GgufWriter g;
  add_model_gguf(m, g);
  add_stand_in_vocab(m.config.vocab, g);
  const std::string p = test::temp_dir("gguffam-bad") + "/m.gguf";
  const std::string tmp = p + ".src.gguf";
  g.write(tmp);
  GgufFile src(tmp);
  GgufWriter w;
  for (const auto& [k, v] : src.metadata())
    if (k != "general.alignment" && !(kv && kv(k, w))) w.add_value(k, v);
  for (const Tensor& t : src.tensors()) {
    GgufTensorEntry en;
    en.name = t.name == from ? to : t.name;
    en.dtype = t.dtype;
    en.shape = t.name == from && !shape.empty() ? shape : t.shape;
    const Tensor tt = t;
    en.fill = [tt](int64_t begin, int64_t n, void* dst) {
      std::memcpy(dst, static_cast<const float*>(tt.data) + begin, size_t(n) * 4);
    };
    w.add_tensor(std::move(en));
  }
  w.write(p);
  return p;
}

struct Case {
  const char* dir;
  const char* gguf_arch;
  // Bound on max |logit difference| (0: bitwise). Nonzero where the GGUF form changes the
  // arithmetic: Mixtral's Q/K rows permuted to llama.cpp's adjacent pairs (the q.k sums run
  // in another order: ~1e-15 relative), Mamba2's A stored as f32 -exp(A_log) (a relative
  // change of up to 2^-24 in A, through the scan's decays; measured up to 8e-9).
  double bound;
};

const Case kRoundTrip[] = {
    {"tests/fixtures/models/tiny-qwen3-moe", "qwen3moe", 0},
    {"tests/fixtures/models/tiny-qwen2-moe", "qwen2moe", 0},
    {"tests/fixtures/models/tiny-mixtral", "llama", 1e-12},
    {"tests/fixtures/models/tiny-granite-h", "granitehybrid", 1e-7},
    {"tests/fixtures/models/tiny-granite-h-moe", "granitehybrid", 1e-7},
    {"tests/fixtures/models/tiny-nemotron-h", "nemotron_h_moe", 1e-7},
};

}  // namespace

class GgufRoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(GgufRoundTrip, ArbiterWrittenGgufGivesTheHfLogits) {
  const Case& c = GetParam();
  auto hf = load_model(test::source_path(c.dir));
  const std::string path = write_gguf_of(*hf, "gguffam");
  GgufFile g(path);
  EXPECT_EQ(g.get_string("general.architecture"), c.gguf_arch);
  auto gg = load_model(path);
  EXPECT_EQ(gg->config.arch, hf->config.arch);
  EXPECT_EQ(gg->n_params, hf->n_params);
  const double d = ref_logit_diff(*hf, *gg, prompt_of(c.dir));
  std::printf("[ gguf     ] %-40s max |dlogit| = %.3g\n", c.dir, d);
  EXPECT_LE(d, c.bound) << c.dir;
}

INSTANTIATE_TEST_SUITE_P(Families, GgufRoundTrip, ::testing::ValuesIn(kRoundTrip));

// The experts of one layer are one 3-D tensor per projection, and each expert's matrix is a
// view into it (no copy): expert e's gate starts e * F * D elements into ffn_gate_exps.
TEST(GgufStacks, ExpertsAreViewsIntoOneTensorPerLayer) {
  auto hf = load_model(test::source_path("tests/fixtures/models/tiny-qwen3-moe"));
  const std::string path = write_gguf_of(*hf, "gguffam");
  GgufFile g(path);
  const Tensor* gate = g.tensor("blk.0.ffn_gate_exps.weight");
  ASSERT_NE(gate, nullptr);
  const int64_t E = hf->config.router.n_experts, F = hf->config.d_ff_expert, D = hf->config.d_model;
  EXPECT_EQ(gate->shape, (std::vector<int64_t>{E, F, D}));
  EXPECT_EQ(g.tensor("blk.0.ffn_down_exps.weight")->shape, (std::vector<int64_t>{E, D, F}));
  EXPECT_EQ(g.tensor("blk.0.ffn_gate.0.weight"), nullptr);  // not the old per-expert names
  EXPECT_EQ(g.tensor("blk.1.ffn_gate_inp.weight"), nullptr);  // mlp_only_layers [1]: dense
  EXPECT_NE(g.tensor("blk.1.ffn_gate.weight"), nullptr);
  auto m = load_model(path);
  for (int e = 0; e < E; ++e) {
    const Tensor* w = m->weights.find("expert" + std::to_string(e) + "_gate", 0);
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->shape, (std::vector<int64_t>{F, D}));
    // The model's view points into the mapped file's stack (the loader maps it once).
    EXPECT_EQ(static_cast<const float*>(w->data) - static_cast<const float*>(
                                                      m->weights.find("expert0_gate", 0)->data),
              int64_t(e) * F * D);
  }
}

// transformers 5's fused form (mlp.experts.gate_up_proj [E, 2F, D], gate rows then up, and
// mlp.experts.down_proj [E, D, F]; Mixtral's router under mlp.gate) loads to the same model.
TEST(GgufStacks, HfFusedExpertsLoadAsTheModulesDo) {
  for (const char* dir : {"tests/fixtures/models/tiny-qwen3-moe", "tests/fixtures/models/tiny-mixtral"}) {
    SCOPED_TRACE(dir);
    const std::string src = test::source_path(dir);
    auto per_expert = load_model(src);
    const bool mixtral = per_expert->config.arch == "mixtral";
    const std::string out = test::temp_dir("gguffam-fused");
    for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"})
      std::filesystem::copy_file(src + "/" + f, out + "/" + f,
                                 std::filesystem::copy_options::overwrite_existing);
    // Rewrite the safetensors: each MoE layer's experts as the two fused stacks.
    std::vector<SafetensorsEntry> entries;
    std::vector<std::vector<uint8_t>> owned;
    const ModelConfig& c = per_expert->config;
    const int64_t E = c.router.n_experts;
    for (const TensorSpec& s : per_expert->weights.specs) {
      if (s.tie_to && c.tied_embeddings) continue;
      const Tensor& t = per_expert->weights.at(s);
      std::string name = s.hf;
      if (mixtral && name.find(".block_sparse_moe.gate.") != std::string::npos)
        name.replace(name.find(".block_sparse_moe."), 18, ".mlp.");
      if (s.hf_stack.empty() || s.hf_stack.expert != 0 || s.hf_stack.row0 != 0) {
        if (s.hf_stack.empty()) entries.push_back({name, t.dtype, t.shape, {}, t.data, {}});
        continue;
      }
      // The first slice of a stack: the experts' matrices of this projection, in order.
      const bool gate_up = s.hf_stack.name.find("gate_up_proj") != std::string::npos;
      std::vector<uint8_t>& b = owned.emplace_back(dtype_bytes(t.dtype, E * s.hf_stack.rows * t.cols()));
      const size_t mat = dtype_bytes(t.dtype, t.numel());
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = std::to_string(e);
        const std::string role = gate_up ? "_gate" : "_down";
        const Tensor* w = per_expert->weights.find("expert" + x + role, s.layer);
        std::memcpy(b.data() + size_t(e) * (gate_up ? 2 : 1) * mat, w->data, mat);
        if (gate_up)
          std::memcpy(b.data() + (size_t(e) * 2 + 1) * mat,
                      per_expert->weights.find("expert" + x + "_up", s.layer)->data, mat);
      }
      entries.push_back(
          {s.hf_stack.name, t.dtype, {E, s.hf_stack.rows, t.cols()}, {}, b.data(), {}});
    }
    write_safetensors(out + "/model.safetensors", entries, {{"format", "pt"}});
    auto fused = load_model(out);
    EXPECT_EQ(ref_logit_diff(*per_expert, *fused, prompt_of(dir)), 0.0);
  }
}

// Bad files: one line naming the file and the key or tensor.
TEST(GgufFamiliesRefuse, TopKExpertCountMissingStackWrongShape) {
  auto hf = load_model(test::source_path("tests/fixtures/models/tiny-qwen3-moe"));
  const ModelConfig& c = hf->config;
  const int64_t E = c.router.n_experts, F = c.d_ff_expert, D = c.d_model;

  // A u32 key of a written file set to v.
  auto patched = [&](const std::string& key, uint32_t v) {
    const std::string path = write_gguf_of(*hf, "gguffam-patch");
    std::string bytes = test::read_file(path);
    std::string needle;
    const uint64_t len = key.size();
    needle.append(reinterpret_cast<const char*>(&len), 8).append(key);
    const size_t at = bytes.find(needle);
    EXPECT_NE(at, std::string::npos) << key;
    std::memcpy(&bytes[at + needle.size() + 4], &v, 4);  // after the value's type code
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  };
  // expert_used_count > expert_count; an expert count the routers do not have.
  std::string path = patched("qwen3moe.expert_used_count", uint32_t(E + 1));
  std::string e = error_of(path);
  EXPECT_NE(e.find(path + ": qwen3moe.expert_used_count " + std::to_string(E + 1) +
                   " is larger than qwen3moe.expert_count " + std::to_string(E)),
            std::string::npos)
      << e;
  path = patched("qwen3moe.expert_count", uint32_t(E + 1));
  e = error_of(path);
  EXPECT_NE(e.find(path + ": qwen3moe.expert_count is " + std::to_string(E + 1) +
                   " but blk.0.ffn_gate_inp.weight has " + std::to_string(E) + " rows"),
            std::string::npos)
      << e;

  // A missing _exps tensor, and one of the wrong 3-D shape: a file written with the layer's
  // down stack renamed, then with its up stack's dimensions in the wrong order.
  auto rename = [&](const std::string& from, const std::string& to, std::vector<int64_t> shape) {
    return rewrite(*hf, from, to, std::move(shape), nullptr);
  };
  path = rename("blk.2.ffn_down_exps.weight", "blk.2.ffn_down_experts.weight", {});
  e = error_of(path);
  EXPECT_NE(e.find(path + ": missing tensor 'blk.2.ffn_down_exps.weight' (expected shape [" +
                   std::to_string(E) + ", " + std::to_string(D) + ", " + std::to_string(F) + "])"),
            std::string::npos)
      << e;
  path = rename("blk.2.ffn_up_exps.weight", "blk.2.ffn_up_exps.weight", {F, E, D});
  e = error_of(path);
  EXPECT_NE(e.find(path + ": tensor 'blk.2.ffn_up_exps.weight' has shape [" + std::to_string(F) +
                   ", " + std::to_string(E) + ", " + std::to_string(D) + "] (expected [" +
                   std::to_string(E) + ", " + std::to_string(F) + ", " + std::to_string(D) + "])"),
            std::string::npos)
      << e;
}

// Files made by llama.cpp's own converter (convert_hf_to_gguf.py --outtype f32, llama.cpp
// 80fb11a; tests/fixtures/README.md) from the HF fixtures: each loads, and its ref-tier
// logits match the fixture's float64 transformers logits. Bounds: Mixtral's 1e-9 (bf16
// weights widen to f32 exactly; only the q.k order changes with the permuted rows); the
// hybrids' A is stored as f32 -exp(A_log) (relative 2^-24), measured 1.8e-9 and 5e-9: 1e-7.
TEST(GgufLlamaCpp, ConverterFilesMatchTheFloat64Logits) {
  struct File {
    const char* gguf;
    const char* fixture;
    const char* arch;
    double bound;
  };
  const File files[] = {
      {"tests/fixtures/gguf/tiny-mixtral.gguf", "tests/fixtures/models/tiny-mixtral", "mixtral", 1e-9},
      {"tests/fixtures/gguf/tiny-granite-h.gguf", "tests/fixtures/models/tiny-granite-h",
       "granitemoehybrid", 1e-7},
      {"tests/fixtures/gguf/tiny-nemotron-h.gguf", "tests/fixtures/models/tiny-nemotron-h",
       "nemotron_h", 1e-7},
  };
  DeviceSpec spec;
  spec.device = "ref";
  auto be = make_backend(spec);
  for (const File& f : files) {
    SCOPED_TRACE(f.gguf);
    auto m = load_model(test::source_path(f.gguf));
    EXPECT_EQ(m->config.arch, f.arch);
    const double worst = test::max_reference_logit_error(
        *m, *be, test::source_path(std::string(f.fixture) + "/reference_logits.json"));
    std::printf("[ llama.cpp ] %-40s ref max |logit - HF float64| = %.3g\n", f.gguf, worst);
    EXPECT_LE(worst, f.bound);
  }
}

// arbiter quantize on these families' files: the 3-D _exps stacks quantize whole (each
// expert's rows are whole blocks, so the views stay valid), the router and Mamba's conv
// kernel stay as they are (llama-quant.cpp), and the quantized model runs close to the f32 one.
TEST(GgufFamilies, QuantizedStacksLoadAndRunClose) {
  for (const char* dir : {"tests/fixtures/models/tiny-qwen3-moe", "tests/fixtures/models/tiny-granite-h-moe"}) {
    SCOPED_TRACE(dir);
    auto hf = load_model(test::source_path(dir));
    const std::string f32 = write_gguf_of(*hf, "gguffam-q");
    const std::string q8 = f32 + ".q8_0.gguf";
    quantize_gguf(f32, q8, QuantRecipe::Q8_0, 1);
    GgufFile g(q8);
    EXPECT_EQ(g.tensor("blk.0.ffn_gate_inp.weight")->dtype, DType::F32);
    EXPECT_EQ(g.tensor("blk.0.ffn_down_exps.weight")->dtype, DType::Q8_0);
    if (const Tensor* conv = g.tensor("blk.1.ssm_conv1d.weight")) {
      EXPECT_EQ(conv->dtype, DType::F32);
    }
    auto m = load_model(q8);
    const Tensor* down = m->weights.find("expert1_down", 0);
    if (!down) down = m->weights.find("expert_down.1", 0);
    ASSERT_NE(down, nullptr);
    EXPECT_EQ(down->dtype, DType::Q8_0);
    DeviceSpec spec;
    spec.device = "ref";
    auto be = make_backend(spec);
    const std::vector<int32_t> prompt = prompt_of(dir);
    Session a(*hf, *be, int(prompt.size())), b(*m, *be, int(prompt.size()));
    a.forward(prompt);
    b.forward(prompt);
    // Q8_0's relative error per weight is about 2^-8: logits within a few percent.
    const double r = test::rel_l2(b.logits(int(prompt.size()) - 1), a.logits(int(prompt.size()) - 1));
    std::printf("[ gguf q8  ] %-40s rel l2 of the last logits = %.3g\n", dir, r);
    EXPECT_LT(r, 0.05);
  }
}

// A converter that takes attention layers for Mamba2 (llama.cpp's GraniteHybridModel reads
// only the Hub's "attention" layer type, not transformers 5.17's "full_attention", and writes
// head_count_kv 0 for them) makes a file arbiter refuses naming the key and the layer.
TEST(GgufFamiliesRefuse, AttentionLayerMarkedMamba) {
  auto hf = load_model(test::source_path("tests/fixtures/models/tiny-granite-h-moe"));
  const std::string path =
      rewrite(*hf, "", "", {}, [&](const std::string& k, GgufWriter& w) {
        if (k != "granitehybrid.attention.head_count_kv") return false;
        w.add_i32_array(k, std::vector<int32_t>(size_t(hf->config.n_layer), 0));
        return true;
      });
  const std::string e = error_of(path);
  EXPECT_NE(e.find(path + ": granitehybrid.attention.head_count_kv is 0 for layer 0, which holds "
                          "attention tensors"),
            std::string::npos)
      << e;
}
