// Every CPU tier against float64 logits from HF transformers (an independent
// implementation; tools/make_fixtures.py), on the four architecture fixtures
// (tests/fixtures/models: llama with llama3 RoPE scaling, mistral with a sliding window,
// qwen2 with QKV bias, qwen3 with q/k norm), the gemma fixtures (gemma3: sliding and full
// layers with their own RoPEs, q/k norm, final softcap; gemma2: attention softcap), the
// Mamba2 hybrids (tiny-granite-h: dense, no RoPE; tiny-granite-h-moe: MoE, RoPE;
// tiny-nemotron-h: mixer, sigmoid-routed MoE, attention, relu2 MLP) and the shipped
// TinyStories-656K.
// The corpus tokenization is checked too: the fixtures' prompt ids come from HF tokenizers.
// To add a model: add its directory and reference JSON to kCases.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "engine/session.h"
#include "model/model.h"
#include "test_util.h"

using namespace arbiter;

namespace {

struct Case {
  const char* model_dir;
  const char* reference;
  double ref_bound = 1e-6;  // the ref tier's max |logit - HF float64|
};

const Case kCases[] = {
    {"tests/fixtures/models/tiny-llama", "tests/fixtures/models/tiny-llama/reference_logits.json"},
    {"tests/fixtures/models/tiny-mistral", "tests/fixtures/models/tiny-mistral/reference_logits.json"},
    {"tests/fixtures/models/tiny-qwen2", "tests/fixtures/models/tiny-qwen2/reference_logits.json"},
    {"tests/fixtures/models/tiny-qwen3", "tests/fixtures/models/tiny-qwen3/reference_logits.json"},
    // Issue 23 asks 1e-9 of the gemma fixtures (made after the f64 fixups of tools/README.md).
    {"tests/fixtures/models/tiny-gemma3", "tests/fixtures/models/tiny-gemma3/reference_logits.json",
     1e-9},
    {"tests/fixtures/models/tiny-gemma2", "tests/fixtures/models/tiny-gemma2/reference_logits.json",
     1e-9},
    // The MoE members of the llama family (issue 23: 1e-9 on every fixture).
    {"tests/fixtures/models/tiny-qwen3-moe",
     "tests/fixtures/models/tiny-qwen3-moe/reference_logits.json", 1e-9},
    {"tests/fixtures/models/tiny-mixtral", "tests/fixtures/models/tiny-mixtral/reference_logits.json",
     1e-9},
    {"tests/fixtures/models/tiny-qwen2-moe",
     "tests/fixtures/models/tiny-qwen2-moe/reference_logits.json", 1e-9},
    // Issue 24 asks 1e-9 of the Mamba2 hybrids too.
    {"tests/fixtures/models/tiny-granite-h",
     "tests/fixtures/models/tiny-granite-h/reference_logits.json", 1e-9},
    {"tests/fixtures/models/tiny-granite-h-moe",
     "tests/fixtures/models/tiny-granite-h-moe/reference_logits.json", 1e-9},
    {"tests/fixtures/models/tiny-nemotron-h",
     "tests/fixtures/models/tiny-nemotron-h/reference_logits.json", 1e-9},
    {"models/TinyStories-656K", "tests/fixtures/reference/TinyStories-656K.json"},
    {"models/TinyStories-656K/fp32", "tests/fixtures/reference/TinyStories-656K-fp32.json"},
};

// Bounds: ref computes in f64 like the (patched) HF float64 run, so only reduction order
// differs (~1e-13); the floor is 1e-6 (Case::ref_bound). The cpu tier computes in
// f32: relative error of a few u = 6e-8 per op through a few layers on logits of magnitude ~10.
double bound(const Case& c, const std::string& tier) { return tier == "ref" ? c.ref_bound : 2e-4; }

}  // namespace

class HfReference : public ::testing::TestWithParam<Case> {};

TEST_P(HfReference, LogitsMatchTransformersFloat64) {
  const Case& c = GetParam();
  std::ifstream f(test::source_path(c.reference));
  ASSERT_TRUE(f.good()) << c.reference;
  nlohmann::json ref = nlohmann::json::parse(f);
  auto m = load_model(test::source_path(c.model_dir));
  EXPECT_EQ(m->weights_sha256, ref["weights_sha256"].get<std::string>());
  EXPECT_EQ(m->tokenizer->sha256(), ref["tokenizer_sha256"].get<std::string>());

  std::vector<int32_t> prompt = ref["prompt_ids"].get<std::vector<int32_t>>();
  // prompt = BOS (if any) + the first tokens of the corpus, tokenized by HF tokenizers.
  std::string corpus = test::read_file(test::source_path(ref["corpus"].get<std::string>()));
  std::vector<int32_t> ours = m->tokenizer->encode(corpus, false, false);
  const size_t skip = m->tokenizer->bos_id() >= 0 ? 1 : 0;
  if (skip) {
    EXPECT_EQ(prompt[0], m->tokenizer->bos_id());
  }
  ASSERT_GE(ours.size(), prompt.size() - skip);
  EXPECT_EQ(std::vector<int32_t>(ours.begin(), ours.begin() + (prompt.size() - skip)),
            std::vector<int32_t>(prompt.begin() + skip, prompt.end()));

  const std::string ref_path = test::source_path(c.reference);
  for (const std::string tier : {"ref", "cpu"}) {
    SCOPED_TRACE(tier);
    DeviceSpec spec;
    spec.device = tier;
    auto be = make_backend(spec);
    const double worst = test::max_reference_logit_error(*m, *be, ref_path);
    EXPECT_LE(worst, bound(c, tier)) << c.model_dir << ": max |logit - HF float64|";
    std::printf("[ hf-ref   ] %-36s %s max |dlogit| = %.3g\n", c.model_dir, tier.c_str(), worst);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfReference, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string n = info.param.model_dir;
                           std::string out;
                           for (char ch : n.substr(n.find_last_of('/') + 1))
                             out += std::isalnum((unsigned char)ch) ? ch : '_';
                           return out + "_" + std::to_string(info.index);
                         });
