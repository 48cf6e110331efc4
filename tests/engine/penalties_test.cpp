// Sampling additions for serve/generate: penalties (exact values by their definitions),
// min-p (the cut drops exactly the candidates below min_p x the best probability), and
// row_logprobs (log-softmax, top-N ties to the lower id).
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/error.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"

namespace arbiter {
namespace {

TEST(Penalties, RepeatPresenceFrequencyByDefinition) {
  PenaltyParams p;
  p.repeat = 2.0;
  p.presence = 0.5;
  p.frequency = 0.25;
  std::vector<double> l = {4.0, -4.0, 4.0, 1.0};
  apply_penalties(p, /*prompt*/ {0, 1}, /*generated*/ {2, 2, 1}, l);
  EXPECT_DOUBLE_EQ(l[0], 2.0);                  // prompt only: repetition
  EXPECT_DOUBLE_EQ(l[1], -8.0 - 0.5 - 0.25);    // negative: multiplied; generated once
  EXPECT_DOUBLE_EQ(l[2], 2.0 - 0.5 - 0.5);      // generated twice
  EXPECT_DOUBLE_EQ(l[3], 1.0);                  // unseen
  p.repeat = 0;
  EXPECT_THROW(check_penalties(p), Error);
}

TEST(Sampler, MinPKeepsOnlyCandidatesNearTheBest) {
  // probabilities at T=1: exp(0), exp(-1), exp(-3) relative to the best
  const std::vector<double> l = {0.0, -1.0, -3.0};
  SamplerParams sp;
  sp.temperature = 1.0;
  sp.min_p = 0.2;  // exp(-1) = 0.37 stays, exp(-3) = 0.05 goes
  std::set<int32_t> seen;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    sp.seed = seed;
    Sampler s(sp);
    seen.insert(s.sample(l));
  }
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1}));
  sp.min_p = 1.5;
  EXPECT_THROW(Sampler{sp}, Error);
}

TEST(RowLogprobs, LogSoftmaxAndTiesToLowerId) {
  const std::vector<double> l = {1.0, 3.0, 3.0, -2.0};
  const TokenLogprob r = row_logprobs(l, 3, 3);
  double lse = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(-2.0));
  EXPECT_NEAR(r.logprob, -2.0 - lse, 1e-15);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].first, 1);
  EXPECT_EQ(r.top[1].first, 2);
  EXPECT_EQ(r.top[2].first, 0);
  EXPECT_NEAR(r.top[2].second, 1.0 - lse, 1e-15);
}

}  // namespace
}  // namespace arbiter
