// The mixture-of-experts members of the llama family (Qwen3-MoE, Mixtral, Qwen2-MoE): their
// config keys as parse_hf reads them (expected values written from the fixtures' config.json
// and tests/fixtures/README.md, never from the parser), refusals of configs the forward
// cannot compute, the cpu tier computing only the experts the router picked, and bench's
// bytes per decode step counting only those.
// The logits against transformers' float64 are tests/engine/hf_reference_test.cpp's cases.
// Add a case: a config text (or a fixture copy) and what it must parse to or be refused with.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backend/moe_routing.h"
#include "core/error.h"
#include "engine/session.h"
#include "io/io_test_util.h"
#include "model/arch.h"
#include "model/model.h"

using namespace arbiter;
namespace fs = std::filesystem;

namespace {

std::string fixture(const char* name) {
  return test::source_path(std::string("tests/fixtures/models/") + name);
}

std::string error_of(const std::string& body) {
  try {
    parse_hf_config(body, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A Qwen3-MoE config with `extra` spliced in (a leading comma when non-empty).
std::string qwen3_moe(const std::string& extra) {
  return R"({"architectures":["Qwen3MoeForCausalLM"],"hidden_size":64,"num_hidden_layers":4,)"
         R"("num_attention_heads":4,"intermediate_size":128,"vocab_size":100,)"
         R"("moe_intermediate_size":32)" + extra + "}";
}

}  // namespace

TEST(Moe, FixtureConfigs) {
  {  // tiny-qwen3-moe: 8 experts (num_local_experts), top-2 renormalised, layer 1 dense
    const ModelConfig c = load_hf_config(fixture("tiny-qwen3-moe"));
    EXPECT_EQ(c.arch, "qwen3_moe");
    EXPECT_EQ(c.router.n_experts, 8);
    EXPECT_EQ(c.router.top_k, 2);
    EXPECT_TRUE(c.router.norm_topk_prob);
    EXPECT_EQ(c.router.scoring, RouterScoring::Softmax);
    EXPECT_EQ(c.d_ff_expert, 32);
    EXPECT_EQ(c.d_ff, 128);
    EXPECT_EQ(c.d_ff_shared, 0);
    EXPECT_EQ(c.layer_moe, (std::vector<bool>{true, false, true}));
    EXPECT_TRUE(c.qk_norm);
    EXPECT_FALSE(c.qkv_bias);
  }
  {  // tiny-mixtral: 4 experts of intermediate_size 64, every layer sparse, renormalised
    const ModelConfig c = load_hf_config(fixture("tiny-mixtral"));
    EXPECT_EQ(c.arch, "mixtral");
    EXPECT_EQ(c.router.n_experts, 4);
    EXPECT_EQ(c.router.top_k, 2);
    EXPECT_TRUE(c.router.norm_topk_prob);
    EXPECT_EQ(c.d_ff_expert, 64);
    EXPECT_EQ(c.layer_moe, (std::vector<bool>{true, true}));
    EXPECT_EQ(c.sliding_window, 0);
    EXPECT_EQ(c.head_dim, 16);
  }
  {  // tiny-qwen2-moe: decoder_sparse_step 2 -> only layer 1 sparse; shared expert 96
    const ModelConfig c = load_hf_config(fixture("tiny-qwen2-moe"));
    EXPECT_EQ(c.arch, "qwen2_moe");
    EXPECT_EQ(c.router.n_experts, 4);
    EXPECT_FALSE(c.router.norm_topk_prob);
    EXPECT_EQ(c.d_ff_shared, 96);
    EXPECT_EQ(c.layer_moe, (std::vector<bool>{false, true, false}));
    EXPECT_TRUE(c.qkv_bias);
  }
}

TEST(Moe, SparseStepAndMlpOnlyLayers) {
  // Sparse when (l + 1) % step == 0 and l is not in mlp_only_layers (HF Qwen3MoeDecoderLayer).
  const ModelConfig c =
      parse_hf_config(qwen3_moe(R"(,"num_experts":4,"num_experts_per_tok":2,)"
                                R"("decoder_sparse_step":2,"mlp_only_layers":[3])"),
                      "config.json");
  EXPECT_EQ(c.layer_moe, (std::vector<bool>{false, true, false, false}));
}

TEST(Moe, Refusals) {
  std::string e = error_of(qwen3_moe(R"(,"num_experts":4,"num_experts_per_tok":5)"));
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("num_experts_per_tok 5 is larger than num_experts 4"), std::string::npos) << e;
  e = error_of(qwen3_moe(R"(,"num_experts":4,"num_experts_per_tok":2,"mlp_only_layers":[7])"));
  EXPECT_NE(e.find("'mlp_only_layers' entry 7 is not a layer index"), std::string::npos) << e;
  e = error_of(qwen3_moe(R"(,"num_experts":4,"num_local_experts":8,"num_experts_per_tok":2)"));
  EXPECT_NE(e.find("num_experts and num_local_experts differ"), std::string::npos) << e;
  e = error_of(R"({"architectures":["Qwen2MoeForCausalLM"],"hidden_size":64,"num_hidden_layers":2,)"
               R"("num_attention_heads":4,"intermediate_size":128,"vocab_size":100,)"
               R"("num_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":32})");
  EXPECT_NE(e.find("shared_expert_intermediate_size"), std::string::npos) << e;
  e = error_of(qwen3_moe(R"(,"num_experts_per_tok":2)"));  // no expert count at all
  EXPECT_NE(e.find("num_local_experts"), std::string::npos) << e;
}

// One token routes to k = 2 of tiny-mixtral's 4 experts in each of its 2 layers, so the cpu
// tier runs 3 matmuls (gate, up, down) for 2 experts per layer, not for all 4. Per layer:
// q, k, v, o (4) + the router (1) + 2 x 3 expert matmuls = 11; plus the output head: 23
// (reading every expert would be 2 x (5 + 12) + 1 = 35).
TEST(Moe, CpuRunsOnlyTheSelectedExperts) {
  const std::string dir = fixture("tiny-mixtral");
  if (!fs::exists(dir + "/model.safetensors")) GTEST_SKIP() << dir << " not found";
  auto m = load_model(dir);
  DeviceSpec spec;
  spec.device = "cpu";
  auto be = make_backend(spec);
  Session s(*m, *be, 4);
  be->stats().reset();
  s.forward({1});
  int64_t matmuls = 0;
  for (const auto& [provider, n] : be->stats().calls().at("matmul")) matmuls += n;
  EXPECT_EQ(matmuls, 23);
}

// bench's work model: a decode step reads k/E of the experts. tiny-mixtral (bf16, 381,760
// parameters): every tensor but the embedding table (2048 x 64) plus one embedding row is
// (381,760 - 131,072) x 2 + 128 = 501,504 bytes; its experts are 2 layers x 4 x 3 x 64 x 64 x 2
// = 196,608 bytes, of which top-2 of 4 reads half: 501,504 - 98,304 = 403,200.
TEST(Moe, DecodeReadsOnlyTheSelectedFractionOfTheExperts) {
  const std::string dir = fixture("tiny-mixtral");
  if (!fs::exists(dir + "/model.safetensors")) GTEST_SKIP() << dir << " not found";
  auto m = load_model(dir);
  EXPECT_EQ(arch_of(m->config.arch).weight_bytes_per_step(*m), 403200.0);
}
