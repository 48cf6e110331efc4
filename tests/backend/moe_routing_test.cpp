// MoE routing (backend/moe_routing.h) on hand-worked vectors, one case per HF variant: the
// expected ids, weights and margins are worked out by hand in the comments, not taken from
// route() itself. Add a case: write the logits so that softmax/sigmoid give round numbers.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/moe_routing.h"

using namespace arbiter;

namespace {

RouterSpec spec(int E, int k) {
  RouterSpec s;
  s.n_experts = E;
  s.top_k = k;
  return s;
}

}  // namespace

// Qwen2-MoE (norm_topk_prob false): logits ln[1,2,4,1] -> p = [1,2,4,1]/8; top-2 = experts
// 2 (0.5) and 1 (0.25); margin p2nd - p3rd = 2/8 - 1/8.
TEST(MoeRouting, SoftmaxThenTopK) {
  const double l[4] = {0, std::log(2.0), std::log(4.0), 0};
  const Route r = route(spec(4, 2), l);
  ASSERT_EQ(r.ids, (std::vector<int>{2, 1}));
  EXPECT_NEAR(r.weights[0], 0.5, 1e-15);
  EXPECT_NEAR(r.weights[1], 0.25, 1e-15);
  EXPECT_NEAR(r.margin, 0.125, 1e-15);
}

// Qwen3-MoE / Mixtral (renormalised): the same top-2 weights over their sum 0.75: 2/3, 1/3.
TEST(MoeRouting, SoftmaxThenTopKRenormalised) {
  RouterSpec s = spec(4, 2);
  s.norm_topk_prob = true;
  const double l[4] = {0, std::log(2.0), std::log(4.0), 0};
  const Route r = route(s, l);
  ASSERT_EQ(r.ids, (std::vector<int>{2, 1}));
  EXPECT_NEAR(r.weights[0], 2.0 / 3, 1e-15);
  EXPECT_NEAR(r.weights[1], 1.0 / 3, 1e-15);
}

// Three experts tie for the best score: the two lowest indices win, and the margin is 0.
TEST(MoeRouting, TiesGoToTheLowerIndex) {
  const double l[4] = {0, 1, 1, 1};
  const Route r = route(spec(4, 2), l);
  EXPECT_EQ(r.ids, (std::vector<int>{1, 2}));
  EXPECT_EQ(r.margin, 0.0);
}

// Granite: top-2 of the logits [1,3,2,0] = experts 1, 2; weights softmax([3, 2]) =
// [e, 1] / (e + 1); the margin is on the logits: 2 - 1.
TEST(MoeRouting, TopKThenSoftmax) {
  RouterSpec s = spec(4, 2);
  s.order = RouterOrder::TopKThenScore;
  const double l[4] = {1, 3, 2, 0};
  const Route r = route(s, l);
  ASSERT_EQ(r.ids, (std::vector<int>{1, 2}));
  const double e = std::exp(1.0);
  EXPECT_NEAR(r.weights[0], e / (e + 1), 1e-15);
  EXPECT_NEAR(r.weights[1], 1 / (e + 1), 1e-15);
  EXPECT_NEAR(r.margin, 1.0, 1e-15);
}

// Nemotron-H without groups: sigmoid of [0, 0, ln3, -ln3] = [.5, .5, .75, .25]; + bias
// [.3, 0, 0, .6] selects on [.8, .5, .75, .85] -> experts 3, 0 (margin .8 - .75); weights from
// the uncorrected sigmoid [.25, .5], renormalised [1/3, 2/3], times the scaling factor 2.
TEST(MoeRouting, SigmoidWithSelectionBiasRenormalisedAndScaled) {
  RouterSpec s = spec(4, 2);
  s.scoring = RouterScoring::Sigmoid;
  s.norm_topk_prob = true;
  s.norm_eps = 1e-20;
  s.routed_scaling_factor = 2;
  const double l[4] = {0, 0, std::log(3.0), -std::log(3.0)};
  const double bias[4] = {0.3, 0, 0, 0.6};
  const Route r = route(s, l, bias);
  ASSERT_EQ(r.ids, (std::vector<int>{3, 0}));
  EXPECT_NEAR(r.weights[0], 2.0 / 3, 1e-15);
  EXPECT_NEAR(r.weights[1], 4.0 / 3, 1e-15);
  EXPECT_NEAR(r.margin, 0.05, 1e-15);
}

// Group limit (n_group 4 of 2 experts, topk_group 2): sigmoid(0) = .5 plus the bias gives
// selection scores [.9,.1 | .6,.6 | .8,.7 | .5,0]; group sums 1.0, 1.2, 1.5, 0.5 keep groups
// 2 and 1, so expert 0 (the best, .9) is masked to 0 and the top-2 is 4, 5 (margin .7 - .6);
// the weights are the uncorrected .5 each.
TEST(MoeRouting, GroupLimitMasksTheBestExpertOfADroppedGroup) {
  RouterSpec s = spec(8, 2);
  s.scoring = RouterScoring::Sigmoid;
  s.n_group = 4;
  s.topk_group = 2;
  const double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const double bias[8] = {0.4, -0.4, 0.1, 0.1, 0.3, 0.2, 0, -0.5};
  const Route r = route(s, l, bias);
  ASSERT_EQ(r.ids, (std::vector<int>{4, 5}));
  EXPECT_NEAR(r.weights[0], 0.5, 1e-15);
  EXPECT_NEAR(r.weights[1], 0.5, 1e-15);
  EXPECT_NEAR(r.margin, 0.1, 1e-15);
  s.n_group = 1;  // without the limit, expert 0 is first
  s.topk_group = 1;
  EXPECT_EQ(route(s, l, bias).ids, (std::vector<int>{0, 4}));
}

TEST(MoeRouting, AllExpertsSelectedHasAnInfiniteMargin) {
  const double l[2] = {0, 0};
  EXPECT_TRUE(std::isinf(route(spec(2, 2), l).margin));
}

TEST(MoeRouting, RefusesSpecsItCannotRoute) {
  EXPECT_EQ(router_spec_problem(spec(4, 2)), nullptr);
  EXPECT_NE(router_spec_problem(spec(4, 5)), nullptr);  // k > E
  EXPECT_NE(router_spec_problem(spec(4, 0)), nullptr);
  RouterSpec s = spec(4, 2);
  s.order = RouterOrder::TopKThenScore;
  s.scoring = RouterScoring::Sigmoid;
  EXPECT_NE(router_spec_problem(s), nullptr);
  s = spec(6, 2);
  s.n_group = 4;  // 6 experts in 4 groups
  s.topk_group = 1;
  EXPECT_NE(router_spec_problem(s), nullptr);
  s = spec(8, 3);
  s.n_group = 4;
  s.topk_group = 1;  // one kept group holds 2 < 3 experts
  EXPECT_NE(router_spec_problem(s), nullptr);
}
