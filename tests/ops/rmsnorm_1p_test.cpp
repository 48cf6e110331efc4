// rmsnorm_1p: out[R, N] = x / sqrt(mean(x^2) + eps) * (1 + w) (HF Gemma3RMSNorm), in place or
// not, every norm weight storage. ref against the plain rmsnorm with the weight 1 + w stored
// exactly (f64); every tier against ref.
#include "tier_util.h"

#include "backend/ref/ref_backend.h"
#include "core/error.h"

namespace arbiter::test {
namespace {

struct Case {
  int R, N;
  bool in_place;
};
const Case kCases[] = {{1, 64, false}, {5, 31, false}, {7, 33, true},
                       {4, 32, true},  {3, 1, false},  {80, 256, true}};

class Rmsnorm1p : public OpTest {};

TEST_P(Rmsnorm1p, MatchesRef) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 2500;
  for (const Case& c : kCases)
    for (DType st : {DType::F32, DType::BF16}) {
      ++seed;
      const std::vector<double> x = values(int64_t(c.R) * c.N, seed, 1.5, tier.compute);
      // Gemma's weights sit around 0 (the 1 is added by the norm), some near -1.
      std::vector<double> wv = values(c.N, seed + 1000, 0.5, st);
      wv[0] = round_to(st, -0.999);
      auto w = make_tensor("norm", {c.N}, wv, st);
      std::vector<double> wp(wv.size());
      for (size_t i = 0; i < wv.size(); ++i) wp[i] = 1.0 + wv[i];
      auto w1 = make_tensor("norm+1", {c.N}, wp, DType::F64);
      const std::string what = strformat("R=%d N=%d%s w %s", c.R, c.N,
                                         c.in_place ? " in-place" : "", dtype_name(st));
      Buf xb(*be, x), ob(*be, x.size()), xr(*ref, x), want(*ref, x.size()), plain(*ref, x.size());
      ob.poison();
      Buf& out = c.in_place ? xb : ob;
      ref->rmsnorm_1p(xr.b, w->t, c.R, c.N, 1e-6, want.b);
      ref->rmsnorm(xr.b, w1->t, c.R, c.N, 1e-6, plain.b);
      check_exact("rmsnorm_1p", tier, "ref vs rmsnorm(1 + w): " + what, seed, want.read(),
                  plain.read());
      be->rmsnorm_1p(xb.b, w->t, c.R, c.N, 1e-6, out.b);
      check_close("rmsnorm_1p", tier, what, seed, out.read(), want.read(),
                  nmse_bound(tier.compute, tier.compute, c.N, 4));
    }
}

INSTANTIATE_TEST_SUITE_P(Tiers, Rmsnorm1p, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
