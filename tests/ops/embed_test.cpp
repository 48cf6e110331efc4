// embed: out[t, :] = table[ids[t], :], a gather: exact on every tier (a table stored in a
// type the tier rounds on upload: ref's row rounded once to the compute type).
#include "core/quant.h"
#include "tier_util.h"

#include "backend/ref/ref_backend.h"

namespace arbiter::test {
namespace {

struct Case {
  int V, D;
  std::vector<int32_t> ids;
};
const Case kCases[] = {{50, 33, {0, 49, 7, 7, 23}},
                       {512, 64, {1, 0, 511, 7, 7}},
                       {4096, 1024, {4095, 17, 2}},
                       {64, 2048, {63, 0}}};

class Embed : public OpTest {};

TEST_P(Embed, MatchesRef) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 100;
  for (const Case& c : kCases)
    for (DType st : weight_types(tier)) {
      ++seed;
      if (c.D % block_elems(st)) continue;
      // The block formats' encoders search scales: their large tables would cost seconds.
      if (block_elems(st) > 1 && st != DType::Q8_0 && int64_t(c.V) * c.D > (int64_t(1) << 20)) continue;
      auto tab = make_tensor("embed", {c.V, c.D}, values(int64_t(c.V) * c.D, seed, 1.0, DType::F32), st);
      const int T = int(c.ids.size());
      Buf out(*be, int64_t(T) * c.D), want(*ref, int64_t(T) * c.D);
      out.poison();
      be->embed(tab->t, c.ids.data(), T, out.b);
      ref->embed(tab->t, c.ids.data(), T, want.b);
      std::vector<double> w = want.read();
      for (double& x : w) x = round_to(tier.compute, x);
      check_exact("embed", tier, strformat("V=%d D=%d T=%d %s", c.V, c.D, T, dtype_name(st)), seed,
                  out.read(), w);
      const int32_t bad[] = {c.V};
      EXPECT_THROW(be->embed(tab->t, bad, 1, out.b), Error) << "id past the table";
    }
}

INSTANTIATE_TEST_SUITE_P(Tiers, Embed, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
