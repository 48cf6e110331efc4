// softcap: x = tanh(x / cap) * cap (gemma's final_logit_softcapping), on activation and logits
// buffers; and scale: x *= s (gemma's embedding scale). ref against the definitions, every
// tier against ref.
#include "tier_util.h"

#include "backend/ref/ref_backend.h"
#include "core/error.h"

namespace arbiter::test {
namespace {

const int64_t kSizes[] = {1, 15, 33, 1024, 8192 * 5 + 3};

TEST(SoftcapRef, MatchesTheDefinition) {
  auto ref = make_ref_backend();
  Buf x(*ref, {0.0, 15.0, -30.0, 1e6, 2.0}, /*logits=*/true);
  ref->softcap(x.b, 5, 15.0);
  const std::vector<double> got = x.read();
  EXPECT_EQ(got[0], 0.0);
  EXPECT_NEAR(got[1], 15.0 * 0.7615941559557649, 1e-14);  // tanh(1)
  EXPECT_NEAR(got[2], -15.0 * 0.9640275800758169, 1e-14);  // tanh(-2)
  EXPECT_EQ(got[3], 15.0);                                 // saturates at the cap
  EXPECT_NEAR(got[4], 15.0 * 0.13254878839087839, 1e-14);  // tanh(2/15)
  Buf y(*ref, {1.0, -2.5, 0.125});
  ref->scale(y.b, 3, 8.0);
  EXPECT_EQ(y.read(), std::vector<double>({8.0, -20.0, 1.0}));
}

class Softcap : public OpTest {};

TEST_P(Softcap, MatchesRef) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 2400;
  for (int64_t n : kSizes)
    for (bool logits : {false, true}) {
      ++seed;
      const std::vector<double> x = values(n, seed, 20.0, logits ? DType::F32 : tier.compute);
      Buf xb(*be, x, logits), xr(*ref, x, logits), yb(*be, x), yr(*ref, x);
      be->softcap(xb.b, n, 15.0);
      ref->softcap(xr.b, n, 15.0);
      const std::string what = strformat("n=%lld%s", (long long)n, logits ? " logits" : "");
      // A division, a tanh (a few u) and a product.
      check_close("softcap", tier, what, seed, xb.read(), xr.read(),
                  nmse_bound(logits ? DType::F32 : tier.compute, tier.compute, 0, 8));
      be->scale(yb.b, n, 8.0);
      ref->scale(yr.b, n, 8.0);
      check_close("scale", tier, what, seed, yb.read(), yr.read(),
                  nmse_bound(tier.compute, tier.compute, 0, 1));
    }
}

INSTANTIATE_TEST_SUITE_P(Tiers, Softcap, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
