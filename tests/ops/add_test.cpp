// add: x += y, elementwise, every length class (SIMD tails, one element, long).
#include "tier_util.h"

#include "backend/ref/ref_backend.h"

namespace arbiter::test {
namespace {

const int64_t kSizes[] = {1, 7, 15, 16, 17, 31, 33, 172, 1001, 65536 + 3, 3072 * 3 + 7};

class Add : public OpTest {};

TEST_P(Add, MatchesRef) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 900;
  for (int64_t n : kSizes) {
    ++seed;
    const std::vector<double> x = values(n, seed, 1.0, tier.compute);
    const std::vector<double> y = values(n, seed + 1, 1.0, tier.compute);
    Buf xb(*be, x), yb(*be, y), xr(*ref, x), yr(*ref, y);
    be->add(xb.b, yb.b, n);
    ref->add(xr.b, yr.b, n);
    check_close("add", tier, strformat("n=%lld", (long long)n), seed, xb.read(), xr.read(),
                nmse_bound(tier.compute, tier.compute, 0, 1));
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, Add, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
