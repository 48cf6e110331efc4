// The gate's judgement and analysis on synthetic sequences and hand-made logits (no model):
// near-tie vs defect, first divergence, self-consistency, contested steps, verdicts.
// To add a case: build GateSideRuns, a TeacherForcedFn returning chosen logits, and check
// the report fields.
#include "verify/localize/gate.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"

using namespace arbiter;
using namespace arbiter::verify;

namespace {

using Runs = std::vector<std::vector<std::vector<int32_t>>>;  // [prompt][run][step]

GateSideRuns side(const std::string& label, Runs t) {
  GateSideRuns s;
  s.label = label;
  s.tokens = std::move(t);
  return s;
}

GateReport fresh(const std::vector<GateSideRuns>& sides) {
  GateReport r;
  for (const auto& s : sides) {
    GateSideSummary g;
    g.label = s.label;
    r.sides.push_back(g);
  }
  return r;
}

// V = 10 logits: the reference's token `ref` at 5.0, `other` at 5.0 - deficit, the rest 0.
TeacherForcedFn logits_with(int32_t ref, int32_t other, double deficit,
                            std::vector<std::tuple<int, int, int>>* calls = nullptr) {
  return [=](int s, int p, int step) {
    if (calls) calls->emplace_back(s, p, step);
    std::vector<double> l(10, 0.0);
    l[size_t(ref)] = 5.0;
    l[size_t(other)] = 5.0 - deficit;
    return l;
  };
}

}  // namespace

TEST(GateJudge, HandMadeLogits) {
  // ids:        0    1    2     3    4
  std::vector<double> l = {0.0, 2.0, 1.7, -1.0, 2.0};
  // top-1 is id 1 (tie with id 4 goes to the lower id), top-2 id 4, gap 0.
  StepJudgement j = judge_step(l, 1, 4, 0.5);
  EXPECT_EQ(j.ref_top1, 1);
  EXPECT_EQ(j.ref_top2, 4);
  EXPECT_DOUBLE_EQ(j.ref_gap, 0.0);
  EXPECT_EQ(j.side_rank, 2);
  EXPECT_DOUBLE_EQ(j.deficit, 0.0);
  EXPECT_TRUE(j.near_tie);
  j = judge_step(l, 1, 2, 0.5);
  EXPECT_EQ(j.side_rank, 3);
  EXPECT_NEAR(j.deficit, 0.3, 1e-12);
  EXPECT_TRUE(j.near_tie);
  EXPECT_FALSE(judge_step(l, 1, 2, 0.25).near_tie);  // 0.3 nats is outside a 0.25 band
  j = judge_step(l, 1, 0, 0.5);
  EXPECT_EQ(j.side_rank, 4);
  EXPECT_DOUBLE_EQ(j.deficit, 2.0);
  EXPECT_FALSE(j.near_tie);
  double lse = std::log(std::exp(0.0) + 2 * std::exp(2.0) + std::exp(1.7) + std::exp(-1.0));
  EXPECT_NEAR(j.side_logprob, 0.0 - lse, 1e-12);
  EXPECT_THROW(judge_step(l, 1, 5, 0.5), Error);
  EXPECT_THROW(judge_step({}, 0, 0, 0.5), Error);
}

TEST(GateAnalyze, IdenticalSidesPass) {
  std::vector<GateSideRuns> s = {side("ref", {{{1, 2, 3}, {1, 2, 3}}}),
                                 side("cpu", {{{1, 2, 3}, {1, 2, 3}}})};
  GateReport r = fresh(s);
  std::vector<std::tuple<int, int, int>> calls;
  gate_analyze(s, logits_with(3, 9, 0.1, &calls), 0.5, r);
  EXPECT_EQ(r.verdict, Verdict::Pass);
  EXPECT_TRUE(r.divergences.empty());
  EXPECT_TRUE(calls.empty());  // nothing to judge, no teacher-forced pass
}

TEST(GateAnalyze, FirstDivergenceNearTieAndDefect) {
  // prompt 0: cpu leaves at step 2 (ref 3, cpu 9); prompt 1: identical.
  std::vector<GateSideRuns> s = {side("ref", {{{1, 2, 3, 4}}, {{5, 6}}}),
                                 side("cpu", {{{1, 2, 9, 8}}, {{5, 6}}})};
  {
    GateReport r = fresh(s);
    std::vector<std::tuple<int, int, int>> calls;
    gate_analyze(s, logits_with(3, 9, 0.2, &calls), 0.5, r);
    ASSERT_EQ(r.divergences.size(), 1u);
    const GateDivergence& d = r.divergences[0];
    EXPECT_EQ(d.side, 1);
    EXPECT_EQ(d.prompt, 0);
    EXPECT_EQ(d.step, 2);
    EXPECT_EQ(d.j.ref_token, 3);
    EXPECT_EQ(d.j.side_token, 9);
    EXPECT_NEAR(d.j.deficit, 0.2, 1e-12);
    EXPECT_EQ(d.j.side_rank, 2);
    EXPECT_TRUE(d.j.near_tie);
    // The reference (side 0) is asked, at the shared prefix of 2 tokens.
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0], std::make_tuple(0, 0, 2));
    EXPECT_EQ(r.verdict, Verdict::Pass);
    EXPECT_EQ(r.sides[1].near_ties, 1);
  }
  {
    GateReport r = fresh(s);
    gate_analyze(s, logits_with(3, 9, 4.0), 0.5, r);
    ASSERT_EQ(r.divergences.size(), 1u);
    EXPECT_FALSE(r.divergences[0].j.near_tie);
    EXPECT_EQ(r.verdict, Verdict::Fail);
    EXPECT_EQ(r.sides[1].defects, 1);
  }
}

TEST(GateAnalyze, SelfInconsistentSideIsInconclusiveNotFail) {
  // cpu's run 2 leaves its run 1 at step 1; its run-1 sequence has a large defect.
  std::vector<GateSideRuns> s = {side("ref", {{{1, 2, 3}, {1, 2, 3}}}),
                                 side("cpu", {{{1, 7, 3}, {1, 2, 3}}})};
  GateReport r = fresh(s);
  gate_analyze(s, logits_with(2, 7, 6.0), 0.5, r);
  ASSERT_EQ(r.inconsistencies.size(), 1u);
  EXPECT_EQ(r.inconsistencies[0].side, 1);
  EXPECT_EQ(r.inconsistencies[0].run, 1);
  EXPECT_EQ(r.inconsistencies[0].step, 1);
  EXPECT_EQ(r.inconsistencies[0].run0_token, 7);
  EXPECT_EQ(r.inconsistencies[0].run_token, 2);
  EXPECT_FALSE(r.sides[1].consistent);
  ASSERT_EQ(r.divergences.size(), 1u);
  EXPECT_FALSE(r.divergences[0].counts);
  EXPECT_EQ(r.verdict, Verdict::Inconclusive);
}

TEST(GateAnalyze, DefectOnAConsistentSideStillFails) {
  std::vector<GateSideRuns> s = {side("ref", {{{1, 2, 3}, {1, 2, 3}}}),
                                 side("a", {{{1, 2, 4}, {1, 2, 5}}}),   // inconsistent
                                 side("b", {{{1, 8, 3}, {1, 8, 3}}})};  // consistent, defect
  GateReport r = fresh(s);
  gate_analyze(
      s,
      [](int, int, int step) {
        std::vector<double> l(10, 0.0);
        l[step == 1 ? 2 : 3] = 5.0;  // reference top-1 is its own token; the rest 5 nats below
        return l;
      },
      0.5, r);
  EXPECT_EQ(r.verdict, Verdict::Fail);
}

TEST(GateAnalyze, InconsistentReferenceMakesEverythingUnjudged) {
  std::vector<GateSideRuns> s = {side("ref", {{{1, 2, 3}, {1, 2, 4}}}),
                                 side("cpu", {{{1, 9, 3}, {1, 9, 3}}})};
  GateReport r = fresh(s);
  gate_analyze(s, logits_with(2, 9, 6.0), 0.5, r);
  EXPECT_FALSE(r.sides[0].consistent);
  ASSERT_EQ(r.divergences.size(), 1u);
  EXPECT_FALSE(r.divergences[0].counts);
  EXPECT_EQ(r.verdict, Verdict::Inconclusive);
}

TEST(GateAnalyze, ContestedStepsShowTheOutlier) {
  // step 1: ref and a agree on 2, b differs (7); step 3: a leaves ref (5 vs 4).
  std::vector<GateSideRuns> s = {side("ref", {{{1, 2, 3, 4}}}), side("a", {{{1, 2, 3, 5}}}),
                                 side("b", {{{1, 7, 7, 7}}})};
  GateReport r = fresh(s);
  gate_analyze(s, logits_with(2, 7, 0.1), 0.5, r);
  ASSERT_EQ(r.contested.size(), 2u);
  const GateContested& c0 = r.contested[0];
  EXPECT_EQ(c0.step, 1);
  ASSERT_EQ(c0.groups.size(), 2u);
  EXPECT_EQ(c0.groups[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(c0.groups[1], (std::vector<int>{2}));
  EXPECT_EQ(c0.tokens, (std::vector<int32_t>{2, 7}));
  const GateContested& c1 = r.contested[1];
  EXPECT_EQ(c1.step, 3);
  EXPECT_EQ(c1.left_earlier, (std::vector<int>{2}));
  std::string text = gate_text(r);
  EXPECT_NE(text.find("ref and a agree on 2; b differs: 7"), std::string::npos) << text;
  // Two candidates agreeing against the reference: the reference is the outlier.
  std::vector<GateSideRuns> t = {side("ref", {{{1, 2}}}), side("a", {{{1, 6}}}),
                                 side("b", {{{1, 6}}})};
  GateReport r2 = fresh(t);
  gate_analyze(t, logits_with(2, 6, 0.1), 0.5, r2);
  ASSERT_EQ(r2.contested.size(), 1u);
  EXPECT_EQ(r2.contested[0].groups[1], (std::vector<int>{1, 2}));
  EXPECT_NE(gate_text(r2).find("ref has 2; a and b agree on 6"), std::string::npos)
      << gate_text(r2);
}

TEST(GateAnalyze, TokenizerDisagreementIsIncomparable) {
  std::vector<GateSideRuns> s = {side("ref", {{{1}}}), side("cpu", {{{1}}})};
  GateReport r = fresh(s);
  r.tokenizers_agree = false;
  gate_analyze(s, logits_with(1, 2, 0.1), 0.5, r);
  EXPECT_EQ(r.verdict, Verdict::Incomparable);
  EXPECT_EQ(int(r.verdict), 3);
}

TEST(GateAnalyze, RefusesMalformedInput) {
  std::vector<GateSideRuns> one = {side("ref", {{{1}}})};
  GateReport r = fresh(one);
  EXPECT_THROW(gate_analyze(one, logits_with(1, 2, 0.1), 0.5, r), Error);
  std::vector<GateSideRuns> s = {side("ref", {{{1}}}), side("cpu", {{{1}}, {{2}}})};
  GateReport r2 = fresh(s);
  EXPECT_THROW(gate_analyze(s, logits_with(1, 2, 0.1), 0.5, r2), Error);
}
