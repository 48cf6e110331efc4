// swiglu: out = silu(gate) * up, elementwise, every length class (SIMD tails, one element,
// long), silu's exp clamp region included.
#include "tier_util.h"

#include "backend/ref/ref_backend.h"

namespace arbiter::test {
namespace {

const int64_t kSizes[] = {1, 7, 15, 16, 17, 31, 33, 172, 1001, 3072 * 3 + 7, 8192 * 13 + 5};

class Swiglu : public OpTest {};

TEST_P(Swiglu, MatchesRef) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 800;
  for (int64_t n : kSizes) {
    ++seed;
    std::vector<double> g = values(n, seed, 8.0, tier.compute);
    const std::vector<double> u = values(n, seed + 1, 1.5, tier.compute);
    if (n > 4) g[0] = -100, g[1] = 100, g[2] = -88.5, g[3] = 0;  // exp's clamp region
    Buf gb(*be, g), ub(*be, u), ob(*be, n), gr(*ref, g), ur(*ref, u), want(*ref, n);
    ob.poison();
    be->swiglu(gb.b, ub.b, n, ob.b);
    ref->swiglu(gr.b, ur.b, n, want.b);
    // An exp (within 3u), 1 + e, a division and a product.
    check_close("swiglu", tier, strformat("n=%lld", (long long)n), seed, ob.read(), want.read(),
                nmse_bound(tier.compute, tier.compute, 0, 12));
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, Swiglu, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
