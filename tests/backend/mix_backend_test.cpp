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
  std::vector<int32_t> ids = {1, 80, 147, 201, 282, 57, 8, 1137};
  for (int32_t& id : ids) id %= m.config.vocab;  // the hybrid fixtures have 1,024 and 2,048
  Session s(m, be, int(ids.size()) + 2);
  s.forward(ids);
  std::vector<double> out = s.logits(int(ids.size()) - 1);
  s.forward({57});  // a decode step after the prefill
  std::vector<double> d = s.logits(0);
  out.insert(out.end(), d.begin(), d.end());
  return out;
}

std::unique_ptr<Backend> mixed(const std::string& spec, const std::string& base = "f32") {
  std::vector<std::pair<std::string, std::unique_ptr<Backend>>> tiers;
  tiers.emplace_back("f32", make_cpu_backend(1));
  tiers.emplace_back("bf16", make_ref_backend());
  return make_mix_backend(std::move(tiers), base, parse_mix(spec));
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

// The hybrids under --mix, on the ref tier ("bf16" here) as the base: every op of their
// forward has a family (the Mamba2 mixer's ops and in_proj/out_proj, including in_proj's row
// slices, are `ssm`; relu2 and the experts `mlp`; Granite's multipliers run where their input
// is). No family named is ref bit for bit; every family on cpu ("f32") is cpu bit for bit, so
// no op stayed on ref; all but `ssm` on cpu is not, so `ssm` is what moves the mixer. (The
// base is ref because the host's writes, such as the MoE sum, land on the base tier.)
TEST(MixBackend, SsmFamilyOnTheHybrids) {
  const std::string others = "embed=f32,norm=f32,attn=f32,mlp=f32,residual=f32,logits=f32";
  for (const char* dir : {"tests/fixtures/models/tiny-granite-h-moe", "tests/fixtures/models/tiny-nemotron-h"}) {
    SCOPED_TRACE(dir);
    auto m = load_model(test::source_path(dir));
    auto cpu = make_cpu_backend(1);
    auto ref = make_ref_backend();
    const auto lc = last_logits(*m, *cpu), lr = last_logits(*m, *ref);
    auto same = [](const std::vector<double>& a, const std::vector<double>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
    };
    auto base = mixed("", "bf16");
    EXPECT_TRUE(same(last_logits(*m, *base), lr));
    auto all = mixed(others + ",ssm=f32", "bf16");
    EXPECT_TRUE(same(last_logits(*m, *all), lc));
    auto no_ssm = mixed(others, "bf16");
    EXPECT_FALSE(same(last_logits(*m, *no_ssm), lc));
    const auto& calls = all->stats().calls();
    for (const char* op : {"ssm_conv", "ssm_scan", "rmsnorm_gated"}) {
      EXPECT_EQ(calls.at(op).size(), 1u) << op;
      EXPECT_GT(calls.at(op).count("mix.ssm.f32"), 0u) << op;
    }
    // Per Mamba2 layer and forward: z, xBC and dt (slices of in_proj) and out_proj.
    int mamba = 0;
    for (char b : m->config.layer_blocks) mamba += b == 'M';
    EXPECT_EQ(calls.at("matmul").at("mix.ssm.f32"), int64_t(4 * mamba * 2));  // 2 forwards
    EXPECT_EQ(calls.at("matmul").count("mix.base.bf16"), 0u);  // every weight has its family
  }
  EXPECT_EQ(parse_mix("ssm=f32,attn=bf16").dtype_of("ssm"), "f32");
}

// The gemma family under --mix (its own ops: rmsnorm_1p is norm, geglu mlp, scaled_attention
// attn; the embedding scale and the soft caps run where their input is): nothing named is ref,
// every family on cpu is cpu, bit for bit.
TEST(MixBackend, GemmaOpsHaveFamilies) {
  const std::string all = "embed=f32,norm=f32,attn=f32,mlp=f32,residual=f32,logits=f32";
  for (const char* dir : {"tests/fixtures/models/tiny-gemma3", "tests/fixtures/models/tiny-gemma2"}) {
    SCOPED_TRACE(dir);
    auto m = load_model(test::source_path(dir));
    auto cpu = make_cpu_backend(1);
    auto ref = make_ref_backend();
    const auto lc = last_logits(*m, *cpu), lr = last_logits(*m, *ref);
    auto base = mixed("", "bf16");
    const auto lb = last_logits(*m, *base);
    EXPECT_EQ(0, std::memcmp(lb.data(), lr.data(), lr.size() * sizeof(double)));
    auto mix = mixed(all, "bf16");
    const auto lm = last_logits(*m, *mix);
    EXPECT_EQ(0, std::memcmp(lm.data(), lc.data(), lc.size() * sizeof(double)));
    EXPECT_GT(mix->stats().calls().at("geglu").count("mix.mlp.f32"), 0u);
    EXPECT_GT(mix->stats().calls().at("rmsnorm_1p").count("mix.norm.f32"), 0u);
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
