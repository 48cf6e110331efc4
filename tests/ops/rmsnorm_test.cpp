// rmsnorm: out[R, N] = x / sqrt(mean(x^2) + eps) * w, in place or not, every norm weight
// storage (norm weights are read exactly on every tier).
#include "tier_util.h"

#include "backend/ref/ref_backend.h"

namespace arbiter::test {
namespace {

struct Case {
  int R, N;
  bool in_place;
};
const Case kCases[] = {{1, 64, false},   {5, 31, false},  {7, 33, true},    {13, 32, false},
                       {11, 13, true},   {3, 1, false},   {16, 64, true},   {9, 8, true},
                       {7, 1024, false}, {1, 2048, false}, {80, 128, true}, {512, 2048, false}};

class Rmsnorm : public OpTest {};

TEST_P(Rmsnorm, MatchesRef) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 200;
  for (const Case& c : kCases)
    for (DType st : {DType::F32, DType::F16, DType::BF16}) {
      ++seed;
      const std::vector<double> x = values(int64_t(c.R) * c.N, seed, 1.5, tier.compute);
      std::vector<double> wv = values(c.N, seed + 1000, 0.1, DType::F32);
      for (double& w : wv) w += 1.0;
      auto w = make_tensor("norm", {c.N}, wv, st);
      Buf xb(*be, x), ob(*be, x.size()), xr(*ref, x), orf(*ref, x.size());
      ob.poison();
      Buf& out = c.in_place ? xb : ob;
      Buf& want = c.in_place ? xr : orf;
      be->rmsnorm(xb.b, w->t, c.R, c.N, 1e-6, out.b);
      ref->rmsnorm(xr.b, w->t, c.R, c.N, 1e-6, want.b);
      check_close("rmsnorm", tier,
                  strformat("R=%d N=%d%s w %s", c.R, c.N, c.in_place ? " in-place" : "",
                            dtype_name(st)),
                  seed, out.read(), want.read(), nmse_bound(tier.compute, tier.compute, c.N, 3));
    }
}

INSTANTIATE_TEST_SUITE_P(Tiers, Rmsnorm, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
