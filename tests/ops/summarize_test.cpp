// summarize (lse, target logit, top-K with ties to the lower id, non-finite count) and the
// greedy pick (summarize's top-1 kept on the tier) of logits rows, against ref's summary of
// the same rows: the top-K, target and counts exactly; the lse in f64, exactly on the host
// tiers and within 1e-10 (relative) where the device sums in another order. Rows: random,
// long runs of ties, NaN/Inf, signed zeros, rows of NaN and -Inf only; long rows with few
// rows split into many slices.
#include <algorithm>

#include "tier_util.h"

#include "backend/ref/ref_backend.h"

namespace arbiter::test {
namespace {

// special: 0 random, 1 ties, 2 non-finite, 3 signed zeros, 4 rows of NaN and -Inf only
struct Case {
  int T, V, K, special;
};
const Case kCases[] = {{2, 151936, 8, 0}, {3, 512, 64, 0},  {1, 33, 33, 0},    {2, 2048, 16, 1},
                       {2, 1000, 10, 2},  {1, 128, 5, 3},   {1, 32000, 1, 0},  {2, 2048, 1, 1},
                       {2, 1000, 1, 2},   {1, 128, 1, 3},   {1, 50000, 1, 2},  {1, 50000, 4, 1},
                       {3, 151936, 1, 0}, {1, 7, 1, 1},     {3, 1001, 8, 2},
                       {3, 4099, 1, 4},   {2, 300, 4, 4}};

std::vector<double> logits(const Case& c, uint64_t seed) {
  std::vector<double> v = values(int64_t(c.T) * c.V, seed, 3.0, DType::F32);
  std::mt19937_64 rng(seed);
  if (c.special == 1)  // few distinct values: long runs of ties, broken by the lower id
    for (double& x : v) x = double(int(rng() % 7)) - 3.0;
  if (c.special == 2) {
    v[5] = std::nan("");
    v[17] = INFINITY;
    v[40] = -INFINITY;
    if (c.T > 1) v[size_t(c.V) + 3] = std::nan("");  // second row: NaN only
  }
  if (c.special == 4)  // row 0 all NaN; later rows -Inf with NaN at every third id
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = i < size_t(c.V) || i % 3 == 0 ? std::nan("") : -INFINITY;
  if (c.special == 3)
    for (size_t i = 0; i < v.size(); ++i) v[i] = i % 3 == 0 ? -0.0 : (i % 3 == 1 ? 0.0 : -1.0);
  return v;
}

bool same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

class Summarize : public OpTest {};
class PickGreedy : public OpTest {};

TEST_P(Summarize, MatchesRef) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 1100;
  for (const Case& c : kCases) {
    ++seed;
    const std::vector<double> v = logits(c, seed);
    std::mt19937_64 rng(seed);
    std::vector<int32_t> targets(size_t(c.T));
    for (int t = 0; t < c.T; ++t) targets[size_t(t)] = t == 0 ? -1 : int32_t(rng() % uint64_t(c.V));
    Buf lb(*be, v, true), lr(*ref, v, true);
    std::vector<LogitsSummary> got, want;
    be->summarize(lb.b, c.T, c.V, c.K, targets.data(), got);
    ref->summarize(lr.b, c.T, c.V, c.K, targets.data(), want);
    ASSERT_EQ(got.size(), size_t(c.T));
    double worst = 0;
    for (int t = 0; t < c.T; ++t) {
      const std::string where = strformat("%s T=%d V=%d K=%d special=%d row %d seed %llu",
                                          tier.name.c_str(), c.T, c.V, c.K, c.special, t,
                                          (unsigned long long)seed);
      const LogitsSummary &g = got[size_t(t)], &w = want[size_t(t)];
      EXPECT_EQ(g.n_nonfinite, w.n_nonfinite) << where;
      EXPECT_EQ(g.top_ids, w.top_ids) << where;
      ASSERT_EQ(g.top_logits.size(), w.top_logits.size()) << where;
      for (size_t k = 0; k < w.top_logits.size(); ++k)
        EXPECT_TRUE(same(g.top_logits[k], w.top_logits[k])) << where << " k " << k;
      EXPECT_TRUE(same(g.target_logit, w.target_logit)) << where;
      if (std::isnan(w.lse)) {
        EXPECT_TRUE(std::isnan(g.lse)) << where;
      } else {
        const double err = std::fabs(g.lse - w.lse);
        worst = std::max(worst, err);
        if (tier.cuda) EXPECT_LE(err, 1e-10 * std::max(1.0, std::fabs(w.lse))) << where;
        else EXPECT_EQ(g.lse, w.lse) << where;
      }
    }
    std::printf("NMSE %-12s %-16s %-48s seed=%-6llu lse_abs_err=%.3e top-k/target exact\n",
                "summarize", tier.name.c_str(),
                strformat("T=%d V=%d K=%d special=%d", c.T, c.V, c.K, c.special).c_str(),
                (unsigned long long)seed, worst);
  }
}

// The greedy pick takes summarize's top-1 of the ref tier on every row, ties and non-finite
// values included, and hands the picks back in order.
TEST_P(PickGreedy, IsSummarizesTop1) {
  const OpTier& tier = GetParam();
  ARB_TIER_OR_SKIP(be, tier);
  auto ref = make_ref_backend();
  uint64_t seed = 1200;
  for (const Case& c : kCases) {
    ++seed;
    const std::vector<double> v = logits(c, seed);
    Buf lb(*be, v, true), lr(*ref, v, true);
    std::vector<LogitsSummary> want;
    const std::vector<int32_t> none(size_t(c.T), -1);
    ref->summarize(lr.b, c.T, c.V, 1, none.data(), want);
    for (int t = 0; t < c.T; ++t) be->pick_greedy(lb.b, t, c.V);
    for (int t = 0; t < c.T; ++t)
      EXPECT_EQ(be->take_pick(), want[size_t(t)].top_ids[0])
          << strformat("%s T=%d V=%d special=%d row %d seed %llu", tier.name.c_str(), c.T, c.V,
                       c.special, t, (unsigned long long)seed);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, Summarize, testing::ValuesIn(op_tiers()), op_tier_name);
INSTANTIATE_TEST_SUITE_P(Tiers, PickGreedy, testing::ValuesIn(op_tiers()), op_tier_name);

}  // namespace
}  // namespace arbiter::test
