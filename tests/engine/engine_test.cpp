// Unit tests of the engine pieces that need no model: sampler, fault-injection specs.
#include <gtest/gtest.h>

#include <map>

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
  EXPECT_EQ(s.stage, Stage::Down);
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
