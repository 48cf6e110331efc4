// geglu: out = gelu_tanh(gate) * up (gemma's MLP, HF gelu_pytorch_tanh). ref against values of
// the definition worked by hand; every tier against ref over the length classes (SIMD tails,
// one element, long) and large |gate| where tanh saturates.
#include "tier_util.h"

#include "backend/ref/ref_backend.h"
#include "core/error.h"

namespace arbiter::test {
namespace {

const int64_t kSizes[] = {1, 7, 16, 17, 33, 1001, 8192 * 5 + 3};

// 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) at g = 1, -1, 2 (python, float64).
TEST(GegluRef, MatchesTheDefinition) {
  auto ref = make_ref_backend();
  const std::vector<double> g = {1.0, -1.0, 2.0, 0.0, 30.0, -30.0};
  const std::vector<double> u = {1.0, 1.0, 0.5, 3.0, 1.0, 1.0};
  Buf gb(*ref, g), ub(*ref, u), ob(*ref, 6);
  ref->geglu(gb.b, ub.b, 6, ob.b);
  const std::vector<double> got = ob.read();
  EXPECT_NEAR(got[0], 0.8411919906082768, 1e-15);
  EXPECT_NEAR(got[1], -0.15880800939172324, 1e-15);
  EXPECT_NEAR(got[2], 0.5 * 1.954597694087775, 1e-15);
  EXPECT_EQ(got[3], 0.0);
  EXPECT_EQ(got[4], 30.0);  // tanh saturates: gelu(g) = g
  EXPECT_EQ(got[5], 0.0);
}

class Geglu : public OpTest {};

TEST_P(Geglu, MatchesRef) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 2300;
  for (int64_t n : kSizes) {
    ++seed;
    std::vector<double> g = values(n, seed, 3.0, tier.compute);
    const std::vector<double> u = values(n, seed + 1, 1.5, tier.compute);
    if (n > 4) g[0] = -40, g[1] = 40, g[2] = 0;
    Buf gb(*be, g), ub(*be, u), ob(*be, n), gr(*ref, g), ur(*ref, u), want(*ref, n);
    ob.poison();
    be->geglu(gb.b, ub.b, n, ob.b);
    ref->geglu(gr.b, ur.b, n, want.b);
    // A cube, a tanh (a few u), a sum and three products.
    check_close("geglu", tier, strformat("n=%lld", (long long)n), seed, ob.read(), want.read(),
                nmse_bound(tier.compute, tier.compute, 0, 12));
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, Geglu, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
