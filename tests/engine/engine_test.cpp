// Unit tests of the engine pieces that need no model: sampler, fault-injection specs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "core/error.h"
#include "engine/inject.h"
#include "engine/sampler.h"

using namespace arbiter;

TEST(Sampler, GreedyPicksArgmaxTiesToLowerId) {
  Sampler s(SamplerParams{});
  EXPECT_EQ(s.sample({0.1, 3.0, -2.0, 3.0}), 1);
}

TEST(Sampler, SeedReproducesAndTopKLimits) {
  SamplerParams p;
  p.temperature = 1.0;
  p.top_k = 2;
  p.seed = 42;
  std::vector<double> logits = {1.0, 0.9, 0.8, 5.0};
  Sampler a(p), b(p);
  std::map<int, int> seen;
  for (int i = 0; i < 200; ++i) {
    int x = a.sample(logits);
    EXPECT_EQ(x, b.sample(logits));
    ++seen[x];
  }
  // top-2 keeps ids 3 and 0 only; with probabilities e^5/(e^5+e^1) ~ 0.982 and ~0.018.
  for (auto& [id, n] : seen) EXPECT_TRUE(id == 3 || id == 0) << id;
  EXPECT_GT(seen[3], 180);
}

TEST(Sampler, TopPKeepsSmallestPrefix) {
  SamplerParams p;
  p.temperature = 1.0;
  p.top_p = 0.5;  // the top token alone has mass ~0.98 >= 0.5
  Sampler s(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample({0.0, 0.0, 5.0}), 2);
}

// The ordering of the candidates (a partial sort under top-k) must not change which token a
// seed draws: against the plain algorithm (every logit stable-sorted), on logits with many
// ties, for several temperatures, top-k and top-p.
TEST(Sampler, DrawsTheTokensOfAFullStableSort) {
  auto reference = [](const SamplerParams& p, std::mt19937_64& rng, const std::vector<double>& logits) {
    const int V = int(logits.size());
    std::vector<int32_t> idx(V);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    const int n = p.top_k > 0 ? std::min(p.top_k, V) : V;
    std::vector<double> prob(n);
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += prob[i] = std::exp((logits[idx[i]] - logits[idx[0]]) / p.temperature);
    double mass = 0;
    int keep = n;
    for (int i = 0; i < n; ++i)
      if ((mass += prob[i] / sum) >= p.top_p) {
        keep = i + 1;
        break;
      }
    double r = std::uniform_real_distribution<double>(0.0, std::accumulate(prob.begin(), prob.begin() + keep, 0.0))(rng);
    for (int i = 0; i < keep; ++i)
      if ((r -= prob[i]) < 0) return idx[i];
    return idx[keep - 1];
  };
  std::mt19937_64 gen(7);
  std::normal_distribution<double> normal(0.0, 2.0);
  std::vector<double> logits(5000);
  for (double& x : logits) x = std::round(normal(gen) * 4) / 4;  // quarter steps: many ties
  int checked = 0;
  for (double t : {0.7, 1.3})
    for (int k : {1, 5, 50, 0})
      for (double top_p : {1.0, 0.9, 0.3}) {
        SamplerParams p;
        p.temperature = t;
        p.top_k = k;
        p.top_p = top_p;
        p.seed = uint64_t(k) * 31 + 3;
        Sampler s(p);
        std::mt19937_64 rng(p.seed);
        for (int i = 0; i < 50; ++i, ++checked)
          ASSERT_EQ(s.sample(logits), reference(p, rng, logits))
              << "T " << t << " top-k " << k << " top-p " << top_p << " draw " << i;
      }
  EXPECT_EQ(checked, 2 * 4 * 3 * 50);
}

// rank_row (a radix sort of order keys) against the stable sort it replaced, on rows with
// ties, signed zeros, infinities, subnormals, the extremes and NaN: rows of f32 values
// (32-bit keys) and rows with values only f64 holds (64-bit keys).
TEST(Sampler, RankRowIsTheStableSortByLogit) {
  auto reference = [](const std::vector<double>& l) {
    std::vector<int32_t> idx(l.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
      return !std::isnan(l[size_t(a)]) && (std::isnan(l[size_t(b)]) || l[size_t(a)] > l[size_t(b)]);
    });
    return idx;
  };
  // f32 values (rank_row's 32-bit keys) and values only f64 holds (its 64-bit keys)
  const std::vector<double> specials32 = {
      0.0, -0.0, INFINITY, -INFINITY, std::nan(""), -std::nan(""), 1.401298464324817e-45,
      -1.401298464324817e-45, 3.4028234663852886e38, -3.4028234663852886e38, 1.0, -1.0};
  const std::vector<double> specials64 = {0.0, -0.0, INFINITY, -INFINITY, std::nan(""),
                                          4.9e-324, -4.9e-324, 2.2e-308, -2.2e-308,
                                          1.7976931348623157e308, -1.7976931348623157e308};
  for (const double x : specials32) ASSERT_TRUE(std::isnan(x) || double(float(x)) == x) << x;
  std::mt19937_64 gen(23);
  std::normal_distribution<double> normal(0.0, 3.0);
  int rows = 0;
  for (const size_t V : {size_t(0), size_t(1), size_t(2), size_t(257), size_t(5000)})
    for (const bool widened : {false, true})
      for (const bool with_specials : {false, true}) {
        std::vector<double> l(V);
        for (double& x : l) {
          x = normal(gen);
          if (gen() % 3 == 0) x = std::round(x * 4) / 4;  // ties
          if (widened) x = double(float(x));
        }
        const std::vector<double>& sp = widened ? specials32 : specials64;
        if (with_specials)
          for (size_t i = 0; i < V; i += 3) l[i] = sp[gen() % sp.size()];
        ASSERT_EQ(rank_row(l), reference(l)) << "V " << V << " widened " << widened;
        ++rows;
      }
  EXPECT_EQ(rows, 20);
}

// generate() samples under top-k from summarize's top-K (ids and logits best first, ties to
// the lower id) instead of the whole row: the same seed must draw the same tokens.
TEST(Sampler, TopCandidatesDrawTheTokensOfTheWholeRow) {
  std::mt19937_64 gen(11);
  std::normal_distribution<double> normal(0.0, 2.0);
  std::vector<double> logits(3000);
  for (double& x : logits) x = std::round(normal(gen) * 4) / 4;  // many ties
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  for (double t : {0.0, 0.8})
    for (int k : {1, 7, 40, 1024})
      for (double top_p : {1.0, 0.8}) {
        SamplerParams p;
        p.temperature = t;
        p.top_k = k;
        p.top_p = top_p;
        p.seed = uint64_t(k) + 5;
        Sampler whole(p), top(p);
        const std::vector<int32_t> ids(order.begin(), order.begin() + k);
        std::vector<double> vals;
        for (int32_t id : ids) vals.push_back(logits[size_t(id)]);
        for (int i = 0; i < 40; ++i)
          ASSERT_EQ(top.sample_top(ids, vals), whole.sample(logits))
              << "T " << t << " top-k " << k << " top-p " << top_p << " draw " << i;
      }
  SamplerParams p;
  p.temperature = 1.0;
  EXPECT_THROW(Sampler(p).sample_top({1, 2}, {3.0, 2.0}), arbiter::Error);  // no top-k
  p.top_k = 3;
  EXPECT_THROW(Sampler(p).sample_top({1, 2}, {3.0, 2.0}), arbiter::Error);  // too few
  EXPECT_THROW(Sampler(p).sample_top({1, 2, 3}, {3.0, 2.0}), arbiter::Error);
}

// A tier that produces NaN logits is broken, but sampling must stay defined: NaN ranks after
// every number (as in summarize's order) and gets no mass, so it is never drawn while a
// number is left, and the draws are those of the row with -inf in its place; infinite
// logits share the draw; a row of NaN only is refused.
TEST(Sampler, NanLogitsAreNeverDrawn) {
  std::mt19937_64 gen(5);
  std::normal_distribution<double> normal(0.0, 1.5);
  std::vector<double> with_nan(400), with_inf;
  for (double& x : with_nan) x = std::round(normal(gen) * 4) / 4;
  for (size_t i = 0; i < with_nan.size(); i += 7) with_nan[i] = std::nan("");  // index 0 too
  with_inf = with_nan;
  for (double& x : with_inf)
    if (std::isnan(x)) x = -INFINITY;
  for (double t : {0.0, 1.0})
    for (int k : {0, 3, 100})
      for (double top_p : {1.0, 0.9}) {
        SamplerParams p;
        p.temperature = t;
        p.top_k = k;
        p.top_p = top_p;
        p.seed = 17;
        Sampler a(p), b(p);
        for (int i = 0; i < 60; ++i) {
          const int32_t id = a.sample(with_nan);
          ASSERT_FALSE(std::isnan(with_nan[size_t(id)])) << "T " << t << " top-k " << k;
          ASSERT_EQ(id, b.sample(with_inf)) << "T " << t << " top-k " << k << " draw " << i;
        }
      }
  SamplerParams p;
  p.temperature = 1.0;
  Sampler s(p);
  std::vector<int> drawn(4, 0);
  for (int i = 0; i < 200; ++i) ++drawn[size_t(s.sample({5.0, INFINITY, std::nan(""), INFINITY}))];
  EXPECT_EQ(drawn[0] + drawn[2], 0);
  EXPECT_GT(drawn[1], 0);
  EXPECT_GT(drawn[3], 0);
  EXPECT_THROW(s.sample({std::nan(""), std::nan("")}), arbiter::Error);
  EXPECT_EQ(Sampler(SamplerParams{}).sample({std::nan(""), 1.0, std::nan("")}), 1);
}

TEST(Sampler, BadParamsRefused) {
  SamplerParams p;
  p.temperature = -1;
  EXPECT_THROW(Sampler s(p), arbiter::Error);
  p = SamplerParams{};
  p.top_p = 0;
  EXPECT_THROW(Sampler s(p), arbiter::Error);
}

TEST(Inject, ParsesAndRefuses) {
  InjectSpec s = InjectSpec::parse("op=down,layer=1,scale=1.02");
  EXPECT_TRUE(s.active);
  EXPECT_EQ(s.stage, "down");
  EXPECT_EQ(s.layer, 1);
  EXPECT_DOUBLE_EQ(s.scale, 1.02);
  EXPECT_EQ(s.text, "op=down,layer=1,scale=1.02");
  EXPECT_FALSE(InjectSpec::parse("none").active);
  EXPECT_THROW(InjectSpec::parse("op=nosuch,scale=2"), arbiter::Error);
  EXPECT_THROW(InjectSpec::parse("op=down"), arbiter::Error);           // no effect
  EXPECT_THROW(InjectSpec::parse("layer=1,scale=2"), arbiter::Error);   // no op
  EXPECT_THROW(InjectSpec::parse("op=down,scale=abc"), arbiter::Error);
  EXPECT_THROW(InjectSpec::parse("op=down,layer=-1,bias=1"), arbiter::Error);
  EXPECT_THROW(InjectSpec::parse("op=down,colour=red"), arbiter::Error);
}
