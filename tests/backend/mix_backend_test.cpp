// The --mix tier (backend/mix.h) on CPU tiers: families routed by the spec, activations moved
// between tiers only at family boundaries. The CUDA version of these checks (bf16 with one
// family at f32) is in tests/cuda/cuda_fused_test.cpp. Here "bf16" names the ref tier (f64)
// and "f32" the cpu tier, so a family sent to "bf16" runs at higher precision.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "backend/mix.h"
#include "backend/ref/ref_backend.h"
#include "engine/session.h"
#include "model/model.h"
#include "test_util.h"

namespace arbiter {
namespace {

using test::rel_l2;

std::vector<double> last_logits(const Model& m, Backend& be) {
  const std::vector<int32_t> ids = {1, 80, 147, 201, 282, 57, 8, 1137};
  Session s(m, be, int(ids.size()) + 2);
  s.forward(ids);
  std::vector<double> out = s.logits(int(ids.size()) - 1);
  s.forward({57});  // a decode step after the prefill
  std::vector<double> d = s.logits(0);
  out.insert(out.end(), d.begin(), d.end());
  return out;
}

std::unique_ptr<Backend> mixed(const std::string& spec) {
  std::vector<std::pair<std::string, std::unique_ptr<Backend>>> tiers;
  tiers.emplace_back("f32", make_cpu_backend(1));
  tiers.emplace_back("bf16", make_ref_backend());
  return make_mix_backend(std::move(tiers), "f32", parse_mix(spec));
}

TEST(MixBackend, EveryFamilyOnTheBaseTierEqualsThatTier) {
  auto m = load_model(test::source_path("models/TinyStories-656K"));
  auto cpu = make_cpu_backend(1);
  auto mix = mixed("");
  const auto a = last_logits(*m, *cpu), b = last_logits(*m, *mix);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(double)));
  EXPECT_GT(mix->stats().calls().at("matmul").count("mix.attn.f32"), 0u);
}

TEST(MixBackend, OneFamilyAtHigherPrecisionMovesTowardsTheOracle) {
  auto m = load_model(test::source_path("models/TinyStories-656K"));
  auto cpu = make_cpu_backend(1);
  auto ref = make_ref_backend();
  const auto lc = last_logits(*m, *cpu), lr = last_logits(*m, *ref);
  const double uniform = rel_l2(lc, lr);
  for (const char* spec : {"mlp=bf16", "attn=bf16,mlp=bf16,norm=bf16,residual=bf16"}) {
    SCOPED_TRACE(spec);
    auto mix = mixed(spec);
    const auto lm = last_logits(*m, *mix);
    const double d = rel_l2(lm, lr);
    EXPECT_NE(0, std::memcmp(lm.data(), lc.data(), lc.size() * sizeof(double)));
    EXPECT_LT(d, uniform) << "mixed " << d << " vs uniform cpu " << uniform;
    EXPECT_GT(mix->stats().calls().at("matmul").count("mix.mlp.bf16"), 0u);
    EXPECT_GT(mix->stats().calls().at("swiglu").count("mix.mlp.bf16"), 0u);
    std::printf("[ mix ] %-45s rel L2 to ref %.3e (uniform cpu %.3e)\n", spec, d, uniform);
  }
}

TEST(MixBackend, RefusedOffTheCudaTier) {
  DeviceSpec s;
  s.device = "cpu";
  s.mix = "attn=f32";
  EXPECT_THROW(make_backend(s), Error);
  s.device = "cuda";
  s.mix = "attn=f64";  // parsed (and refused) before any device is looked for
  EXPECT_THROW(make_backend(s), Error);
}

}  // namespace
}  // namespace arbiter
