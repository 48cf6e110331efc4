// Model-level checks on the shipped real models: greedy ids equal the independent
// references in models/*/greedy_reference.json on every CPU tier, first-step logits match
// the stored ones, ref and cpu agree closely, and ref is bit-deterministic.
// To add a model: ship it under models/ with a greedy_reference.json and add a TEST below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/generate.h"
#include "engine/session.h"
#include "model/model.h"
#include "test_util.h"

using namespace arbiter;
using nlohmann::json;

namespace {

using test::rel_l2;

json load_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}

std::unique_ptr<Backend> backend(const std::string& device) {
  DeviceSpec spec;
  spec.device = device;
  return make_backend(spec);
}

// Greedy continuation of prompt on device, stopping at any id in stop (not included).
std::vector<int32_t> greedy(const Model& m, const std::string& device,
                            const std::vector<int32_t>& prompt, int n,
                            const std::vector<int32_t>& stop) {
  auto be = backend(device);
  Session s(m, *be, int(prompt.size()) + n);
  Sampler sampler(SamplerParams{});
  return generate(s, prompt, n, sampler, stop, nullptr).tokens;
}

std::vector<double> first_logits(const Model& m, const std::string& device,
                                 const std::vector<int32_t>& prompt) {
  auto be = backend(device);
  Session s(m, *be, int(prompt.size()));
  s.forward(prompt);
  return s.logits(int(prompt.size()) - 1);
}

const char* kTiers[] = {"ref", "cpu"};

}  // namespace

TEST(Greedy, Stories260KGguf) {
  auto m = load_model(test::source_path("models/stories260K/stories260K.gguf"));
  json ref = load_json(test::source_path("models/stories260K/greedy_reference.json"));
  std::vector<int32_t> want = ref["generated_ids"].get<std::vector<int32_t>>();
  const int32_t bos = ref["bos_id"];
  for (const char* tier : kTiers) {
    SCOPED_TRACE(tier);
    // run.c semantics: start from BOS, stop when BOS is produced.
    EXPECT_EQ(greedy(*m, tier, {bos}, int(want.size()), {bos}), want);
    std::vector<double> logits = first_logits(*m, tier, {bos});
    std::vector<double> stored = ref["logits_pos0_after_bos"].get<std::vector<double>>();
    ASSERT_EQ(logits.size(), stored.size());
    for (size_t v = 0; v < stored.size(); ++v) EXPECT_NEAR(logits[v], stored[v], 1e-3) << "id " << v;
  }
}

static void check_tinystories(const std::string& dir) {
  auto m = load_model(test::source_path(dir));
  json ref = load_json(test::source_path("models/TinyStories-656K/greedy_reference.json"));
  std::vector<int32_t> prompt = ref["prompt_ids_with_bos"].get<std::vector<int32_t>>();
  EXPECT_EQ(m->tokenizer->encode(ref["prompt"].get<std::string>(), true, false), prompt);
  std::vector<int32_t> want = ref["generated_ids"].get<std::vector<int32_t>>();
  // The reference stops after emitting EOS (2); it lists the EOS itself last.
  ASSERT_FALSE(want.empty());
  ASSERT_EQ(want.back(), 2);
  want.pop_back();
  for (const char* tier : kTiers) {
    SCOPED_TRACE(tier);
    EXPECT_EQ(greedy(*m, tier, prompt, 200, {2}), want);
    std::vector<double> logits = first_logits(*m, tier, prompt);
    std::vector<double> stored = ref["logits_last_prompt_pos_first16"].get<std::vector<double>>();
    for (size_t v = 0; v < stored.size(); ++v) EXPECT_NEAR(logits[v], stored[v], 1e-3) << "id " << v;
  }
}

TEST(Greedy, TinyStories656KBf16) { check_tinystories("models/TinyStories-656K"); }
TEST(Greedy, TinyStories656KFp32) { check_tinystories("models/TinyStories-656K/fp32"); }

// ref (f64) and cpu (f32) on the same input: relative L2 of the logits below 1e-5 on the
// f32 checkpoints (f32 rounding through a few layers is ~1e-7 relative per op).
TEST(Tiers, RefCpuAgreeOnF32Checkpoints) {
  for (std::string path : {"models/TinyStories-656K/fp32", "models/stories260K/stories260K.gguf"}) {
    SCOPED_TRACE(path);
    auto m = load_model(test::source_path(path));
    std::vector<int32_t> ids = m->tokenizer->encode(
        "Once upon a time, there was a little dog. He liked to run in the park.", true, false);
    auto be_ref = backend("ref"), be_cpu = backend("cpu");
    Session sr(*m, *be_ref, int(ids.size())), sc(*m, *be_cpu, int(ids.size()));
    sr.forward(ids);
    sc.forward(ids);
    for (int t = 0; t < int(ids.size()); ++t) EXPECT_LT(rel_l2(sc.logits(t), sr.logits(t)), 1e-5) << "row " << t;
  }
}

// Gemma past its sliding window (tiny-gemma3: 16, tiny-gemma2: 24): 48 greedy tokens behind
// a 6-token prompt give the same ids on cpu (f32) as on ref (f64), and decode token by token
// gives the logits of one prefill of the same ids (the window is applied identically in both).
TEST(Greedy, GemmaCpuEqualsRefPastTheWindow) {
  for (const char* dir : {"tests/fixtures/models/tiny-gemma3", "tests/fixtures/models/tiny-gemma2"}) {
    SCOPED_TRACE(dir);
    auto m = load_model(test::source_path(dir));
    ASSERT_GT(m->config.sliding_window, 0);
    const std::vector<int32_t> prompt = m->tokenizer->encode("Once upon a time, a cat", true, false);
    const int n = 48;
    ASSERT_GT(int(prompt.size()) + n, 2 * m->config.sliding_window);
    std::vector<int32_t> want = greedy(*m, "ref", prompt, n, {});
    ASSERT_EQ(int(want.size()), n);
    EXPECT_EQ(greedy(*m, "cpu", prompt, n, {}), want);

    std::vector<int32_t> all = prompt;
    all.insert(all.end(), want.begin(), want.end());
    auto be = backend("ref");
    Session one(*m, *be, int(all.size())), steps(*m, *be, int(all.size()));
    one.forward(all);
    steps.forward(prompt);
    for (size_t t = prompt.size(); t < all.size(); ++t) steps.forward({all[t]});
    const int last = int(all.size()) - 1;
    EXPECT_LT(rel_l2(steps.logits(0), one.logits(last)), 1e-12);
  }
}

// Gemma's sliding layers keep a ring of window + max_T - 1 rows. 100 positions in chunks of 5
// (the ring of tiny-gemma3's window 16 wraps five times) give, on ref and cpu, the logits of
// sessions whose caches hold every position (max_T 100: a ring as long as the context), and
// decode token by token (a ring of the window alone) gives the last row too.
TEST(Greedy, GemmaRingCacheGivesTheFullCachesLogits) {
  for (const char* dir : {"tests/fixtures/models/tiny-gemma3", "tests/fixtures/models/tiny-gemma2"}) {
    auto m = load_model(test::source_path(dir));
    std::vector<int32_t> ids(100);
    for (int t = 0; t < 100; ++t) ids[size_t(t)] = int32_t((t * 37 + 11) % m->config.vocab);
    for (const char* tier : kTiers) {
      SCOPED_TRACE(std::string(dir) + " " + tier);
      auto be = backend(tier);
      const double tol = std::string(tier) == "ref" ? 1e-13 : 1e-6;  // cpu: gemv vs gemm
      Session full(*m, *be, 100, 100), ring(*m, *be, 100, 5), steps(*m, *be, 100, 1);
      full.forward(ids);
      for (int c = 0; c < 100; c += 5) {
        ring.forward(std::vector<int32_t>(ids.begin() + c, ids.begin() + c + 5));
        for (int t = 0; t < 5; ++t)
          ASSERT_LT(rel_l2(ring.logits(t), full.logits(c + t)), tol) << "position " << c + t;
      }
      for (int32_t id : ids) steps.forward({id});
      EXPECT_LT(rel_l2(steps.logits(0), full.logits(99)), tol);
    }
  }
}

// The memory claim: doubling max_ctx grows only the full layers' caches; the sliding layers'
// rings stay window + max_T - 1 rows (tiny-gemma3: layers 0 and 2 slide, window 16).
TEST(Greedy, GemmaSlidingCachesDoNotGrowWithTheContext) {
  auto m = load_model(test::source_path("tests/fixtures/models/tiny-gemma3"));
  const ModelConfig& c = m->config;
  int full_layers = 0;
  for (bool s : c.layer_sliding) full_layers += s ? 0 : 1;
  ASSERT_EQ(full_layers, 2);
  auto be = backend("ref");  // f64 caches
  Session a(*m, *be, 4096, 8), b(*m, *be, 8192, 8);
  const int64_t kv_row = int64_t(c.n_head_kv) * c.head_dim * 8;
  EXPECT_EQ(b.state_bytes() - a.state_bytes(), full_layers * 2 * 4096 * kv_row);
  // What the state holds: 2 full layers of 4096 rows, 2 sliding ones of 16 + 8 - 1, scratch.
  EXPECT_LT(a.state_bytes(), 2 * (full_layers * 4096 + 2 * 23) * kv_row + 8 * 8 * 4096);
}

// Prefill of many tokens and token-by-token decode run the same model code: same logits.
TEST(Tiers, PrefillEqualsDecode) {
  auto m = load_model(test::source_path("models/TinyStories-656K/fp32"));
  std::vector<int32_t> ids = m->tokenizer->encode("Tom and Sue went to the shop.", true, false);
  for (const char* tier : kTiers) {
    SCOPED_TRACE(tier);
    auto be = backend(tier);
    Session a(*m, *be, int(ids.size())), b(*m, *be, int(ids.size()));
    a.forward(ids);
    for (int32_t id : ids) b.forward({id});
    EXPECT_LT(rel_l2(b.logits(0), a.logits(int(ids.size()) - 1)), 1e-6);
  }
}

TEST(Tiers, RefIsBitDeterministic) {
  auto m = load_model(test::source_path("models/TinyStories-656K"));
  std::vector<int32_t> ids = m->tokenizer->encode("One day, a bird sang.", true, false);
  std::vector<double> first;
  for (int run = 0; run < 2; ++run) {
    auto be = backend("ref");
    Session s(*m, *be, int(ids.size()));
    s.forward(ids);
    std::vector<double> l = s.logits(int(ids.size()) - 1);
    if (run == 0) first = l;
    else EXPECT_EQ(0, std::memcmp(first.data(), l.data(), l.size() * sizeof(double)));
  }
}

TEST(Session, PromptLongerThanContextIsRefused) {
  auto m = load_model(test::source_path("models/stories260K/stories260K.gguf"));
  auto be = backend("cpu");
  Session s(*m, *be, 8);
  Sampler sampler(SamplerParams{});
  std::vector<int32_t> prompt(9, 1);
  EXPECT_THROW(generate(s, prompt, 1, sampler, {}, nullptr), arbiter::Error);
  EXPECT_THROW(s.forward(prompt), arbiter::Error);
  EXPECT_THROW(s.forward(std::vector<int32_t>{100000}), arbiter::Error);  // outside the vocabulary
}

// A context pass fills the cache exactly like a forward that also computes logits (the
// logits are the only thing it skips), and leaves no logits to read.
TEST(Session, ContextFillsTheCacheLikeForward) {
  auto m = load_model(test::source_path("models/TinyStories-656K"));
  std::vector<int32_t> ids = m->tokenizer->encode("The cat sat on the mat.", true, false);
  const std::vector<int32_t> ctx(ids.begin(), ids.end() - 1), last(ids.end() - 1, ids.end());
  for (const char* tier : kTiers) {
    SCOPED_TRACE(tier);
    auto be = backend(tier);
    Session a(*m, *be, int(ids.size()), 4), b(*m, *be, int(ids.size()), 4);  // several pieces
    a.prefill(ctx);
    b.context(ctx);
    EXPECT_THROW(b.summarize(1, {-1}), arbiter::Error);
    EXPECT_THROW(b.logits(0), arbiter::Error);
    a.forward(last);
    b.forward(last);
    std::vector<double> la = a.logits(0), lb = b.logits(0);
    EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(double)));
  }
}

// Greedy with the token kept on the tier (Session::pick, what generate and bench run) picks
// the same ids as reading each token back with summarize, and leaves the same logits.
TEST(Session, PickedTokensEqualSummarizedTokens) {
  auto m = load_model(test::source_path("models/TinyStories-656K"));
  const std::vector<int32_t> prompt = m->tokenizer->encode("Lily had a red ball.", true, false);
  const int n = 24;
  for (const char* tier : kTiers) {
    SCOPED_TRACE(tier);
    auto be = backend(tier);
    Session a(*m, *be, int(prompt.size()) + n), b(*m, *be, int(prompt.size()) + n);
    const std::vector<int32_t> want = test::greedy_by_summarize(a, prompt, n);
    EXPECT_EQ(test::greedy_by_pick(b, prompt, n), want);
    std::vector<double> la = a.logits(0), lb = b.logits(0);
    EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(double)));
  }
}

// Sampling under top-k: generate() draws from summarize's top-K, the whole row stays on the
// tier; the tokens are those of drawing from the whole row read back.
TEST(Session, SampledTokensFromTheTopKEqualThoseFromTheRow) {
  auto m = load_model(test::source_path("models/TinyStories-656K"));
  const std::vector<int32_t> prompt = m->tokenizer->encode("Lily had a red ball.", true, false);
  const int n = 24;
  const SamplerParams p{1.1, 40, 0.95, 17};  // temperature, top-k, top-p, seed
  for (const char* tier : kTiers) {
    SCOPED_TRACE(tier);
    auto be = backend(tier);
    Session s(*m, *be, int(prompt.size()) + n);
    const std::vector<int32_t> want = test::sampled_by_rows(s, prompt, n, p);
    Sampler sampler(p);
    EXPECT_EQ(generate(s, prompt, n, sampler, {}, nullptr).tokens, want);
    EXPECT_GT(std::set<int32_t>(want.begin(), want.end()).size(), 8u) << "hardly sampled";
  }
}

// Misuse of the picks fails with an error, and reset() (generate calls it) drops a pick left
// behind by a generation that stopped early.
TEST(Session, PicksAreCheckedAndResetDropsThem) {
  auto m = load_model(test::source_path("models/stories260K/stories260K.gguf"));
  auto be = backend("cpu");
  Session s(*m, *be, 16);
  EXPECT_THROW(s.pick(), arbiter::Error);            // no forward yet
  EXPECT_THROW(s.forward_picked(), arbiter::Error);  // no pick yet
  EXPECT_THROW(s.take_pick(), arbiter::Error);
  s.context({1, 2});
  EXPECT_THROW(s.pick(), arbiter::Error);  // a context pass leaves no logits
  const std::vector<int32_t> prompt = {1, 300, 40};
  const std::vector<int32_t> want = test::greedy_by_summarize(s, prompt, 6);
  Sampler sampler(SamplerParams{});
  GenerateResult stopped = generate(s, prompt, 6, sampler, {want[2]}, nullptr);
  EXPECT_TRUE(stopped.stopped_on_eos);
  const auto first_stop = std::find(want.begin(), want.end(), want[2]);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(want.begin(), first_stop));
  EXPECT_EQ(generate(s, prompt, 6, sampler, {}, nullptr).tokens, want);
  EXPECT_THROW(s.take_pick(), arbiter::Error);  // generate took every pick it made
}

// A prefill computes the logits of its last token alone (the output matrix once, not per
// row): row 0 after it is the last row of a forward of the same ids, on every family's tail
// (llama/qwen, gemma's softcap, the hybrids' logits scaling) and tier, from one piece or
// several (max_T 4).
TEST(Greedy, PrefillComputesTheLastRowsLogitsAlone) {
  for (const char* dir : {"tests/fixtures/models/tiny-qwen3", "tests/fixtures/models/tiny-gemma2",
                          "tests/fixtures/models/tiny-granite-h"}) {
    auto m = load_model(test::source_path(dir));
    std::vector<int32_t> ids(11);
    for (int t = 0; t < 11; ++t) ids[size_t(t)] = int32_t((t * 29 + 5) % m->config.vocab);
    for (const char* tier : kTiers) {
      SCOPED_TRACE(std::string(dir) + " " + tier);
      auto be = backend(tier);
      const double tol = std::string(tier) == "ref" ? 1e-13 : 1e-6;  // cpu: gemv vs gemm
      Session full(*m, *be, 11), one(*m, *be, 11), pieces(*m, *be, 11, 4);
      full.forward(ids);
      one.prefill(ids);
      pieces.prefill(ids);
      ASSERT_EQ(full.last_T(), 11);
      ASSERT_EQ(one.last_T(), 1);
      ASSERT_EQ(pieces.last_T(), 1);
      EXPECT_LT(rel_l2(one.logits(0), full.logits(10)), tol);
      EXPECT_LT(rel_l2(pieces.logits(0), full.logits(10)), tol);
      EXPECT_EQ(one.summarize(4, {-1})[0].top_ids, full.summarize(4, std::vector<int32_t>(11, -1))[10].top_ids);
    }
  }
}
