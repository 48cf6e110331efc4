// compare_traces on hand-designed traces (fixtures.h): verdict rules (token gate and drift
// gate), the threshold-free numbers, and each statistic against values computed by hand in
// the comments. To add a case: build a candidate from six_rows(), write both with write_trace, compare.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "fixtures.h"
#include "test_util.h"
#include "verify/judge/compare.h"

using namespace arbiter;
using namespace arbiter::verify;
using namespace arbiter::test;

namespace {

struct Pair {
  Trace ref, cand;
};

Pair traces_of(const std::vector<TraceRow>& ref, const std::vector<TraceRow>& cand,
               TraceHeader href = fixture_header(), TraceHeader hcand = fixture_header()) {
  std::string dir = temp_dir("cmp");
  return {read_trace(write_trace(dir + "/ref.tsv", href, ref)),
          read_trace(write_trace(dir + "/cand.tsv", hcand, cand))};
}

CompareResult run(const Pair& p, CompareOptions o = {}) { return compare_traces(p.ref, p.cand, o); }

bool has_field(const CompareResult& r, const std::string& f) {
  for (const auto& m : r.mismatches)
    if (m.field == f) return true;
  return false;
}

}  // namespace

TEST(Compare, IdenticalPasses) {
  auto rows = six_rows();
  CompareResult r = run(traces_of(rows, rows));
  EXPECT_EQ(r.verdict, Verdict::Pass);
  EXPECT_EQ(r.positions, 6);
  EXPECT_EQ(r.chunks, 2);
  EXPECT_EQ(r.disagree, 0);
  EXPECT_EQ(r.decided, 3);  // gaps 3.0, 3.0, 6.0
  EXPECT_EQ(r.decided_disagree, 0);
  EXPECT_TRUE(std::isnan(r.max_gap_at_disagreement));
  EXPECT_EQ(r.rank_hist, (std::vector<int64_t>{6, 0, 0}));
  EXPECT_EQ(r.worst_rank, 1);
  EXPECT_EQ(r.nll_shift.mean, 0.0);
  EXPECT_EQ(r.nll_equal, 6);
  EXPECT_EQ(r.ppl_diff_pct, 0.0);
  EXPECT_EQ(r.kl_method, "topk_tail_estimate");
  EXPECT_NEAR(r.kl.mean, 0.0, 1e-12);
  EXPECT_EQ(r.nonfinite_ref + r.nonfinite_cand, 0);
  EXPECT_TRUE(r.mismatches.empty());
}

TEST(Compare, SweepBucketsAndGapOnHandDesignedRows) {
  auto rows = six_rows();
  CompareResult r = run(traces_of(rows, rows));
  // Gaps 3.0 0.5 3.0 1.5 6.0 0.2.
  ASSERT_EQ(r.sweep.size(), 4u);  // 0.5 1 2 5 (2 = --decided is already there)
  int64_t expect_decided[] = {5, 4, 3, 1};
  double expect_t[] = {0.5, 1, 2, 5};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r.sweep[size_t(i)].threshold, expect_t[i]);
    EXPECT_EQ(r.sweep[size_t(i)].decided, expect_decided[i]) << expect_t[i];
  }
  // Buckets [0,.5) [.5,1) [1,2) [2,5) [5,inf): 0.2 | 0.5 | 1.5 | 3.0 3.0 | 6.0
  ASSERT_EQ(r.gap_buckets.size(), 5u);
  int64_t expect_bucket[] = {1, 1, 1, 2, 1};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(r.gap_buckets[size_t(i)].positions, expect_bucket[i]) << i;

  CompareOptions o;
  o.decided = 0.7;
  CompareResult r2 = run(traces_of(rows, rows), o);
  EXPECT_EQ(r2.decided, 4);        // 3.0 3.0 1.5 6.0
  EXPECT_EQ(r2.sweep.size(), 5u);  // 0.5 0.7 1 2 5
}

TEST(Compare, FlipAtDecidedPositionFails) {
  auto ref = six_rows();
  auto cand = ref;
  // Row (0,0) has reference gap 3.0; the candidate prefers token 11 there.
  cand[0].top_ids = {11, 10, 12};
  cand[0].top_logits = {5.1, 5.0, 1.0};
  CompareResult r = run(traces_of(ref, cand));
  EXPECT_EQ(r.verdict, Verdict::Fail);
  EXPECT_EQ(r.disagree, 1);
  EXPECT_EQ(r.decided_disagree, 1);
  EXPECT_DOUBLE_EQ(r.max_gap_at_disagreement, 3.0);
  EXPECT_EQ(r.rank_hist, (std::vector<int64_t>{5, 1, 0}));
  EXPECT_EQ(r.worst_rank, 2);
  ASSERT_EQ(r.worst_disagreements.size(), 1u);
  EXPECT_EQ(r.worst_disagreements[0].ref_top1, 10);
  EXPECT_EQ(r.worst_disagreements[0].cand_top1, 11);
  EXPECT_EQ(r.gap_buckets[3].disagree, 1);  // [2,5)
  ASSERT_EQ(r.points.size(), 6u);
  EXPECT_TRUE(r.points[0].disagree);
  EXPECT_NEAR(r.points[0].logit_delta, 0.0, 1e-12);  // token 10: 5.0 in both, at rank 2 here
  for (size_t i = 1; i < 6; ++i) EXPECT_FALSE(r.points[i].disagree) << i;
  EXPECT_NE(format_report(r).find("VERDICT: fail"), std::string::npos);
}

TEST(Compare, FlipsOnlyBelowThresholdPass) {
  auto ref = six_rows();
  auto cand = ref;
  cand[3].top_ids = {41, 40, 42};  // ref gap 1.5
  cand[3].top_logits = {1.6, 1.4, 0.0};
  cand[5].top_ids = {61, 60, 62};  // ref gap 0.2
  cand[5].top_logits = {1.9, 1.85, 1.0};
  // These flips move logits by whole tenths of a nat: the drift gate fails them at any
  // sensible kappa (DriftGate tests). Here the token gate alone is under test.
  CompareOptions token_gate_only;
  token_gate_only.kl_kappa = 1e300;
  EXPECT_EQ(run(traces_of(ref, cand)).drift_status, "fail");
  CompareResult r = run(traces_of(ref, cand), token_gate_only);
  EXPECT_EQ(r.verdict, Verdict::Pass);
  EXPECT_EQ(r.disagree, 2);
  EXPECT_EQ(r.decided, 3);
  EXPECT_EQ(r.decided_disagree, 0);
  EXPECT_DOUBLE_EQ(r.max_gap_at_disagreement, 1.5);  // threshold-free: the larger flipped gap
  EXPECT_EQ(r.rank_hist, (std::vector<int64_t>{4, 2, 0}));
  EXPECT_EQ(r.gap_buckets[0].disagree, 1);  // 0.2
  EXPECT_EQ(r.gap_buckets[2].disagree, 1);  // 1.5
  // Sweep: at 1.0 the 1.5 flip counts; at 0.5 too; at 2 and 5 nothing.
  EXPECT_EQ(r.sweep[0].disagree, 1);
  EXPECT_EQ(r.sweep[1].disagree, 1);
  EXPECT_EQ(r.sweep[2].disagree, 0);
  // Ordered by reference gap: 1.5 before 0.2.
  ASSERT_EQ(r.worst_disagreements.size(), 2u);
  EXPECT_DOUBLE_EQ(r.worst_disagreements[0].ref_gap, 1.5);
  // The same candidate fails when the threshold is lowered below 1.5.
  CompareOptions o = token_gate_only;
  o.decided = 1.0;
  EXPECT_EQ(run(traces_of(ref, cand), o).verdict, Verdict::Fail);
  // Beyond top-k: the reference's top-1 absent from the candidate's list.
  cand[5].top_ids = {61, 62, 63};
  cand[5].top_logits = {1.9, 1.0, 0.5};
  CompareResult r3 = run(traces_of(ref, cand));
  EXPECT_EQ(r3.rank_beyond, 1);
  EXPECT_EQ(r3.worst_rank, 0);
  EXPECT_EQ(r3.top1_logit_unavailable, 1);  // token 60: not in cand top-k, not the target (61)
}

TEST(Compare, NoDecidedPositionIsInconclusive) {
  auto rows = six_rows();
  for (auto& r : rows) r.top_logits = {2.0, 1.0, 0.5};  // every gap 1.0
  CompareResult r = run(traces_of(rows, rows));
  EXPECT_EQ(r.decided, 0);
  EXPECT_EQ(r.verdict, Verdict::Inconclusive);
}

TEST(Compare, NonFiniteFails) {
  auto ref = six_rows();
  auto cand = ref;
  cand[1].nll = std::nan("");
  CompareResult r = run(traces_of(ref, cand));
  EXPECT_EQ(r.verdict, Verdict::Fail);
  EXPECT_EQ(r.nonfinite_ref, 0);
  EXPECT_EQ(r.nonfinite_cand, 1);  // the nll (target_logit was set before, stays finite)
  EXPECT_EQ(r.nll_shift.n, 5);     // the NaN position is left out of the statistics
  // Non-finite fails even when nothing is decided.
  for (auto* rows : {&ref, &cand})
    for (auto& x : *rows) x.top_logits = {2.0, 1.0, 0.5};
  cand[2].top_logits = {INFINITY, 1.0, 0.5};
  EXPECT_EQ(run(traces_of(ref, cand)).verdict, Verdict::Fail);
}

TEST(Compare, IdentityMismatchesAreIncomparable) {
  auto rows = six_rows();
  struct Case {
    const char* field;
    void (*edit)(TraceHeader&);
  } cases[] = {
      {"corpus", [](TraceHeader& h) { h.corpus_sha256 = std::string(64, 'd'); }},
      {"model", [](TraceHeader& h) { h.model_sha256 = std::string(64, 'e'); }},
      {"tokenizer", [](TraceHeader& h) { h.tokenizer_sha256 = std::string(64, 'f'); }},
      {"tokenizer", [](TraceHeader& h) { h.tokenizer_bos = "none"; }},
      {"shape", [](TraceHeader& h) { h.shape_name = "w8"; }},
      {"shape", [](TraceHeader& h) { h.prefill = 512; }},
  };
  for (const auto& c : cases) {
    TraceHeader h = fixture_header();
    c.edit(h);
    Pair p = traces_of(rows, rows, fixture_header(), h);
    CompareResult r = run(p);
    EXPECT_EQ(r.verdict, Verdict::Incomparable) << c.field;
    EXPECT_TRUE(has_field(r, c.field)) << c.field;
    EXPECT_NE(format_report(r).find(std::string("DIFFERS ") + c.field), std::string::npos);
    CompareOptions o;
    o.force = true;
    CompareResult f = run(p, o);
    EXPECT_EQ(f.verdict, Verdict::Pass) << c.field;
    EXPECT_TRUE(f.forced);
    EXPECT_NE(format_report(f).find("FORCED"), std::string::npos);
    EXPECT_EQ(to_json(f)["forced"], true);
  }
}

TEST(Compare, TargetsAndRowsMustMatch) {
  auto ref = six_rows();
  auto cand = ref;
  cand[4].target = 51;
  CompareResult r = run(traces_of(ref, cand));
  EXPECT_EQ(r.verdict, Verdict::Incomparable);
  ASSERT_TRUE(has_field(r, "targets"));
  EXPECT_NE(r.reasons[0].find("chunk 1 pos 1"), std::string::npos) << r.reasons[0];
  cand = ref;
  cand[4].abs_pos = 7;
  EXPECT_TRUE(has_field(run(traces_of(ref, cand)), "targets"));
  cand = ref;
  cand.pop_back();
  CompareResult r2 = run(traces_of(ref, cand));
  EXPECT_EQ(r2.verdict, Verdict::Incomparable);
  EXPECT_TRUE(has_field(r2, "rows"));
  CompareOptions o;
  o.force = true;
  CompareResult f = run(traces_of(ref, cand), o);
  EXPECT_EQ(f.positions, 5);
  EXPECT_EQ(f.verdict, Verdict::Pass);
}

// The paired NLL shift on six rows, by hand. d = cand - ref = 0.1 0.2 -0.1 | 0.3 0.0 0.1
// mean 0.6/6 = 0.1; deviations 0 .1 -.2 .2 -.1 0, sum of squares 0.10, var 0.10/5 = 0.02,
// SE iid = sqrt(0.02/6) = sqrt(1/300) = 0.0577350269. Chunk sums 0.2 and 0.4 against
// n_c*mean = 0.3: residuals -0.1, 0.1, SS 0.02, SE chunk = sqrt(2/1 * 0.02)/6 = 0.2/6.
// Perplexity: ref mean nll 9/6 = 1.5 -> e^1.5; cand 9.6/6 = 1.6 -> e^1.6; diff 100(e^0.1-1)%.
TEST(Compare, NllShiftPerplexityAndStandardErrors) {
  auto ref = six_rows();
  auto cand = ref;
  const double d[] = {0.1, 0.2, -0.1, 0.3, 0.0, 0.1};
  for (int i = 0; i < 6; ++i) {
    cand[size_t(i)].nll = ref[size_t(i)].nll + d[i];
    cand[size_t(i)].target_logit = cand[size_t(i)].lse - cand[size_t(i)].nll;
  }
  CompareResult r = run(traces_of(ref, cand));
  EXPECT_NEAR(r.nll_shift.mean, 0.1, 1e-12);
  EXPECT_NEAR(r.nll_shift.se_iid, std::sqrt(1.0 / 300.0), 1e-12);
  EXPECT_NEAR(r.nll_shift.se_chunk, 0.2 / 6.0, 1e-12);
  EXPECT_NEAR(r.nll_shift.t_iid, std::sqrt(3.0), 1e-9);
  EXPECT_NEAR(r.nll_shift.t_chunk, 3.0, 1e-9);
  EXPECT_EQ(r.nll_shift.chunks, 2);
  EXPECT_NEAR(r.mean_nll_ref, 1.5, 1e-12);
  EXPECT_NEAR(r.mean_nll_cand, 1.6, 1e-12);
  EXPECT_NEAR(r.ppl_ref, 4.4816890703380645, 1e-9);  // e^1.5
  EXPECT_NEAR(r.ppl_cand, 4.953032424395115, 1e-9);  // e^1.6
  EXPECT_NEAR(r.ppl_diff_pct, 10.517091807564771, 1e-8);
  EXPECT_NEAR(r.ppl_diff_pct_se, 100 * std::exp(0.1) * 0.2 / 6.0, 1e-9);
  EXPECT_EQ(r.nll_higher, 4);
  EXPECT_EQ(r.nll_lower, 1);
  EXPECT_EQ(r.nll_equal, 1);
  auto j = to_json(r);
  EXPECT_NEAR(j["nll"]["shift"]["se_chunk"].get<double>(), 0.2 / 6.0, 1e-12);
  EXPECT_EQ(j["verdict"], "pass");
}

// Batch means on a correlated example: 4 chunks x 4 positions, each chunk one shared value
// 0.4 0.0 0.2 0.2. mean 0.2. iid: deviations +-.2 (8 of them), SS 0.32, var 0.32/15,
// SE = sqrt(0.32/15/16) = 0.0365148. Chunk means 0.4 0 0.2 0.2: sd^2 = 0.08/3,
// SE = sqrt(0.08/3/4) = 0.0816497 -- the correlation more than doubles the honest SE.
TEST(MeanSe, BatchMeansOnCorrelatedChunks) {
  std::vector<double> x;
  std::vector<int64_t> c;
  const double v[] = {0.4, 0.0, 0.2, 0.2};
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 4; ++i) {
      x.push_back(v[k]);
      c.push_back(k);
    }
  MeanSe m = mean_se(x, c);
  EXPECT_NEAR(m.mean, 0.2, 1e-12);
  EXPECT_NEAR(m.se_iid, std::sqrt(0.32 / 15 / 16), 1e-12);
  EXPECT_NEAR(m.se_chunk, std::sqrt(0.08 / 3 / 4), 1e-12);
  EXPECT_EQ(m.chunks, 4);
  // Unequal chunks: values 1 2 | 3, mean 2; residual sums (3 - 2*2) = -1 and (3 - 2) = 1,
  // SE = sqrt(2/1 * 2) / 3 = 2/3.
  MeanSe u = mean_se({1, 2, 3}, {0, 0, 1});
  EXPECT_NEAR(u.se_chunk, 2.0 / 3.0, 1e-12);
  // One chunk: no chunk SE; empty: nothing.
  EXPECT_TRUE(std::isnan(mean_se({1, 2}, {0, 0}).se_chunk));
  EXPECT_EQ(mean_se({}, {}).n, 0);
}

TEST(Quantiles, NearestRank) {
  // sorted 0 .05 .1 .15 .2 .3: p50 -> ceil(3)=3rd = .1; p90 -> ceil(5.4)=6th = .3
  Quantiles q = quantiles({0.3, 0.1, 0.0, 0.2, 0.05, 0.15});
  EXPECT_DOUBLE_EQ(q.p50, 0.1);
  EXPECT_DOUBLE_EQ(q.p90, 0.3);
  EXPECT_DOUBLE_EQ(q.p99, 0.3);
  EXPECT_DOUBLE_EQ(q.max, 0.3);
  std::vector<double> h(100);
  for (int i = 0; i < 100; ++i) h[size_t(i)] = i + 1;  // 1..100
  Quantiles q2 = quantiles(h);
  EXPECT_EQ(q2.p50, 50);
  EXPECT_EQ(q2.p90, 90);
  EXPECT_EQ(q2.p99, 99);
  EXPECT_EQ(q2.max, 100);
}

// Candidate raises only its top-1 logit by delta = .1 -.2 0 | .3 -.05 .15.
// |delta| sorted 0 .05 .1 .15 .2 .3 -> p50 .1, p90 .3, max .3; signed mean 0.3/6 = 0.05.
// Spread (top-1 minus top-3) shifts by the same delta: mean 0.05, deviations
// .05 -.25 -.05 .25 -.1 .1 (SS .15, var .03, SE iid sqrt(.005)); chunk sums -0.1, 0.4 vs
// 0.15: residuals -.25, .25, SE chunk = sqrt(2 * .125)/6 = 0.5/6.
// Reference spreads 4 3 4 3 6.5 1: mean 21.5/6.
TEST(Compare, LogitDeltaAndSpread) {
  auto ref = six_rows();
  auto cand = ref;
  const double d[] = {0.1, -0.2, 0.0, 0.3, -0.05, 0.15};
  for (int i = 0; i < 6; ++i) cand[size_t(i)].top_logits[0] += d[i];
  CompareResult r = run(traces_of(ref, cand));
  EXPECT_EQ(r.disagree, 0);
  EXPECT_NEAR(r.top1_logit_abs_delta.p50, 0.1, 1e-9);
  EXPECT_NEAR(r.top1_logit_abs_delta.p90, 0.3, 1e-9);
  EXPECT_NEAR(r.top1_logit_abs_delta.max, 0.3, 1e-9);
  EXPECT_NEAR(r.top1_logit_delta.mean, 0.05, 1e-9);
  EXPECT_EQ(r.top1_logit_unavailable, 0);
  EXPECT_EQ(r.spread_k, 3);
  EXPECT_NEAR(r.spread_ref.mean, 21.5 / 6, 1e-9);
  EXPECT_NEAR(r.spread_shift.mean, 0.05, 1e-9);
  EXPECT_NEAR(r.spread_shift.se_iid, std::sqrt(0.005), 1e-9);
  EXPECT_NEAR(r.spread_shift.se_chunk, 0.5 / 6, 1e-9);
  // The per-position points the matrix report plots: reference gap and delta per row.
  const double gaps[] = {3.0, 0.5, 3.0, 1.5, 6.0, 0.2};
  ASSERT_EQ(r.points.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_NEAR(r.points[i].ref_gap, gaps[i], 1e-12) << i;
    EXPECT_NEAR(r.points[i].logit_delta, d[i], 1e-12) << i;
    EXPECT_FALSE(r.points[i].disagree) << i;
    EXPECT_TRUE(std::isfinite(r.points[i].drift_kl)) << i;
  }
  EXPECT_NEAR(r.points[2].drift_kl, 0.0, 1e-12);  // delta 0: the same distribution
  EXPECT_GT(r.points[3].drift_kl, 0.0);
}

namespace {

// Two-position traces over a 4-token vocabulary with full logits, W = 1, K = 2.
struct KlCase {
  std::vector<std::vector<double>> ref, cand;  // [row][vocab]
};

double lse4(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += std::exp(v);
  return std::log(s);
}

TraceRow kl_row(int chunk, const std::vector<double>& x) {
  // top-2 ids by logit, ties by lower id
  std::vector<int32_t> idx = {0, 1, 2, 3};
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return x[size_t(a)] > x[size_t(b)]; });
  TraceRow r;
  r.chunk = chunk;
  r.pos = 0;
  r.abs_pos = chunk + 1;
  r.target = 0;
  r.lse = lse4(x);
  r.target_logit = x[0];
  r.nll = r.lse - x[0];
  r.top_ids = {idx[0], idx[1]};
  r.top_logits = {x[size_t(idx[0])], x[size_t(idx[1])]};
  return r;
}

CompareResult run_kl(const KlCase& k, bool full, CompareOptions o = {},
                     const std::string& ref_compute = "f32", const std::string& cand_compute = "f32",
                     double cand_lse_error = 0) {
  std::string dir = temp_dir("kl");
  TraceHeader h = fixture_header(1, 2, 2), hc = h;
  h.compute = ref_compute;
  hc.compute = cand_compute;
  std::vector<TraceRow> rr, cr;
  LogitsWriter lr, lc;
  lr.open(dir + "/ref.tsv.logits", 4);
  lc.open(dir + "/cand.tsv.logits", 4);
  for (size_t i = 0; i < k.ref.size(); ++i) {
    rr.push_back(kl_row(int(i), k.ref[i]));
    cr.push_back(kl_row(int(i), k.cand[i]));
    cr.back().lse += cand_lse_error;  // as if the candidate's log-sum-exp were rounded
    cr.back().nll += cand_lse_error;
    std::vector<float> a(k.ref[i].begin(), k.ref[i].end()), b(k.cand[i].begin(), k.cand[i].end());
    lr.write_row(a.data());
    lc.write_row(b.data());
  }
  lr.finish();
  lc.finish();
  Trace tr = read_trace(write_trace(dir + "/ref.tsv", h, rr));
  Trace tc = read_trace(write_trace(dir + "/cand.tsv", hc, cr));
  if (full) {
    o.ref_logits = dir + "/ref.tsv.logits";
    o.cand_logits = dir + "/cand.tsv.logits";
  }
  return compare_traces(tr, tc, o);
}

}  // namespace

// Exact KL(p||q) with p uniform over 4 and q = (2,1,1,1)/5 (cand logits ln2,0,0,0):
// 0.25 ln(0.25/0.4) + 0.75 ln(0.25/0.2) = 0.0498567562; second row identical (0).
TEST(Compare, KlExactFromFullLogits) {
  KlCase k{{{0, 0, 0, 0}, {1, 2, 3, 4}}, {{std::log(2.0), 0, 0, 0}, {1, 2, 3, 4}}};
  CompareResult r = run_kl(k, true);
  EXPECT_EQ(r.kl_method, "exact");
  const double row0 = 0.25 * std::log(0.625) + 0.75 * std::log(1.25);
  EXPECT_NEAR(row0, 0.0498567562, 1e-9);
  EXPECT_NEAR(r.kl.mean, row0 / 2, 1e-6);
  EXPECT_NEAR(r.kl_q.max, row0, 1e-6);
}

// The top-k estimate: buckets = ids in both top-2 lists + one tail. When the candidate's
// tail is proportional to the reference's (here both uniform over ids 2,3), coarsening
// loses nothing and the estimate equals the exact KL; otherwise it is smaller.
TEST(Compare, KlTopkEstimateIsALowerBound) {
  auto exact = [](const std::vector<double>& x, const std::vector<double>& y) {
    double lx = lse4(x), ly = lse4(y), s = 0;
    for (size_t i = 0; i < 4; ++i) s += std::exp(x[i] - lx) * ((x[i] - lx) - (y[i] - ly));
    return s;
  };
  KlCase prop{{{2, 1, 0, 0}}, {{2, 1.5, 0, 0}}};
  CompareResult e = run_kl(prop, false);
  EXPECT_EQ(e.kl_method, "topk_tail_estimate");
  EXPECT_NEAR(e.kl.mean, exact(prop.ref[0], prop.cand[0]), 1e-7);
  EXPECT_NEAR(run_kl(prop, true).kl.mean, exact(prop.ref[0], prop.cand[0]), 1e-6);

  KlCase skew{{{2, 1, 0, -1}}, {{2, 1.5, -1, 0}}};
  // Hand formula for the estimate: p,q over {0, 1, tail}.
  double lr = lse4(skew.ref[0]), lc = lse4(skew.cand[0]);
  double p0 = std::exp(2 - lr), p1 = std::exp(1 - lr), q0 = std::exp(2 - lc), q1 = std::exp(1.5 - lc);
  double pt = 1 - p0 - p1, qt = 1 - q0 - q1;
  double est = p0 * std::log(p0 / q0) + p1 * std::log(p1 / q1) + pt * std::log(pt / qt);
  CompareResult s = run_kl(skew, false);
  EXPECT_NEAR(s.kl.mean, est, 1e-7);
  EXPECT_LT(s.kl.mean, exact(skew.ref[0], skew.cand[0]));
  EXPECT_NEAR(run_kl(skew, true).kl.mean, exact(skew.ref[0], skew.cand[0]), 1e-6);

  // Random distributions: estimate <= exact (up to the traces' float rounding).
  std::mt19937 rng(7);
  std::normal_distribution<double> n(0, 2);
  for (int it = 0; it < 20; ++it) {
    KlCase k;
    k.ref.push_back({n(rng), n(rng), n(rng), n(rng)});
    k.cand.push_back(k.ref[0]);
    for (double& v : k.cand[0]) v += 0.5 * n(rng);
    double ex = exact(k.ref[0], k.cand[0]);
    CompareResult rr = run_kl(k, false);
    EXPECT_LE(rr.kl.mean, ex + 1e-6) << "seed 7 iteration " << it;
  }
}

TEST(DriftGate, UnitRoundoffOfComputeDtypes) {
  EXPECT_EQ(drift_unit_roundoff("f64"), std::ldexp(1.0, -53));
  EXPECT_EQ(drift_unit_roundoff("f32"), std::ldexp(1.0, -24));
  EXPECT_EQ(drift_unit_roundoff("f16"), std::ldexp(1.0, -11));
  EXPECT_EQ(drift_unit_roundoff("bf16"), std::ldexp(1.0, -8));
  EXPECT_TRUE(std::isnan(drift_unit_roundoff("")));
  EXPECT_TRUE(std::isnan(drift_unit_roundoff("q4_0")));
  // Activations quantized to 8 bits on the fly: no finer than bf16.
  EXPECT_EQ(drift_unit_roundoff("f32", "q8_0"), std::ldexp(1.0, -8));
  EXPECT_EQ(drift_unit_roundoff("f64", "q8_0,q8_K"), std::ldexp(1.0, -8));
  EXPECT_EQ(drift_unit_roundoff("f32", ""), std::ldexp(1.0, -24));
}

namespace {

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

// Binary KL between Bernoulli(p) and Bernoulli(q).
double kl_bin(double p, double q) { return p * std::log(p / q) + (1 - p) * std::log((1 - p) / (1 - q)); }

// Ref logits {a, 0, 0, 0}, cand {a + eps, 0, 0, 0}; top-2 ids {0, 1} on both sides.
// Exact KL: only token 0's share changes, the other three stay proportional:
//   kl_bin(e^a / (e^a + 3), e^(a+eps) / (e^(a+eps) + 3)).
double exact_first_logit_moved(double a, double eps) {
  return kl_bin(std::exp(a) / (std::exp(a) + 3), std::exp(a + eps) / (std::exp(a + eps) + 3));
}
// The drift gate's statistic without full logits, P_S * KL(p|S || q|S) over S = {0, 1}:
// p|S = (sigmoid(a), 1 - sigmoid(a)), q|S the same at a + eps, P_S = (e^a + 1) / (e^a + 3).
double shared_first_logit_moved(double a, double eps) {
  return (std::exp(a) + 1) / (std::exp(a) + 3) * kl_bin(sigmoid(a), sigmoid(a + eps));
}

}  // namespace

// Two positions; the reference's top-1 leads by 3 (decided). The candidate moves position
// 0's top-1 logit by eps = 1e-4 and leaves position 1 alone. By hand (second order,
// kl_bin(s, s') ~ s(1-s) d^2 / 2): sigmoid(3) = 0.952574, s(1-s) = 0.045177, P_S = 0.913365,
// so the judged KL = P_S * 0.0225885 * 1e-8 / 2 = 1.0316e-10 per position. Both arms f32:
// u = 2^-24, KL/u^2 = 1.0316e-10 * 2^48 = 2.90e4. kappa just above passes, just below fails,
// and the reason names KL, budget, kappa, u and KL/u^2.
TEST(DriftGate, BelowBudgetPassesAboveFails) {
  const double eps = 1e-4, kl = shared_first_logit_moved(3, eps) / 2, u2 = std::ldexp(1.0, -48);
  EXPECT_NEAR(kl, 1.0316e-10, 1e-13);
  KlCase k{{{3, 0, 0, 0}, {3, 0, 0, 0}}, {{3 + eps, 0, 0, 0}, {3, 0, 0, 0}}};
  CompareOptions lo, hi;
  hi.kl_kappa = 1.1 * kl / u2;
  lo.kl_kappa = 0.9 * kl / u2;
  CompareResult p = run_kl(k, false, hi);
  EXPECT_EQ(p.drift_kl_method, "shared_topk");
  EXPECT_NEAR(p.drift_kl.mean, kl, 1e-3 * kl);
  EXPECT_EQ(p.drift_u, std::ldexp(1.0, -24));
  EXPECT_NEAR(p.kl_over_u2, 2.90e4, 0.01e4);
  EXPECT_NEAR(p.drift_budget, hi.kl_kappa * u2, 1e-9 * hi.kl_kappa * u2);
  EXPECT_EQ(p.decided, 2);
  EXPECT_EQ(p.drift_status, "pass");
  EXPECT_EQ(p.verdict, Verdict::Pass);

  CompareResult f = run_kl(k, false, lo);
  EXPECT_EQ(f.decided_disagree, 0);  // the token gate alone would pass
  EXPECT_EQ(f.drift_status, "fail");
  EXPECT_EQ(f.verdict, Verdict::Fail);
  ASSERT_EQ(f.reasons.size(), 1u);
  for (const char* s : {"mean KL(ref||cand)", "exceeds the drift budget", "kappa", "u = 2^-24", "KL/u^2 = 2.9"})
    EXPECT_NE(f.reasons[0].find(s), std::string::npos) << s << ": " << f.reasons[0];
  // The report and JSON always show the margin, on a pass too.
  std::string rep = format_report(p);
  EXPECT_NE(rep.find("drift gate   KL/u^2 2.9"), std::string::npos) << rep;
  EXPECT_NE(rep.find("budget kappa*u^2"), std::string::npos) << rep;
  auto j = to_json(f);
  EXPECT_EQ(j["drift_gate"]["status"], "fail");
  EXPECT_NEAR(j["drift_gate"]["kl_over_u2"].get<double>(), 2.90e4, 0.01e4);
  EXPECT_NEAR(j["drift_gate"]["kappa"].get<double>(), lo.kl_kappa, 1e-9 * lo.kl_kappa);
  EXPECT_EQ(j["verdict"], "fail");

  // With full logits the exact KL is judged: kl_bin over {token 0, the rest}, by hand
  // 0.5 * p(1-p) * eps^2 / 2 with p = e^3/(e^3+3) = 0.870048: 2.827e-10 per position. The
  // logits file holds float32: 3.0001 is stored as 3.000099897, eps 0.1% smaller.
  const double eps_f32 = double(float(3 + eps)) - 3;
  CompareResult e = run_kl(k, true, hi);
  EXPECT_EQ(e.drift_kl_method, "exact");
  EXPECT_NEAR(e.drift_kl.mean, exact_first_logit_moved(3, eps_f32) / 2, 1e-3 * kl);
  EXPECT_NEAR(e.drift_kl.mean, 2.827e-10, 0.01e-10);
  EXPECT_EQ(e.drift_status, "fail");  // 2.7x the shared-top-k value, above 1.1x of it
}

// The top-k estimate's tail bucket is a complement, 1 - sum_S exp(logit - lse): an error of
// 1e-6 in a recorded lse (f32 rounding of a log-sum-exp near 20 is ~1e-6) moves a tail of
// true mass 4e-9 by 1e-6 and adds ~1e-6 nats (2.8e8 u^2) of KL that is not there. The
// drift gate's statistic does not use the lse, so identical logits pass.
TEST(DriftGate, RoundedLseCannotFailTheGate) {
  KlCase k{{{20, 0, 0, 0}, {20, 0, 0, 0}}, {{20, 0, 0, 0}, {20, 0, 0, 0}}};
  CompareResult r = run_kl(k, false, {}, "f32", "f32", 1e-6);
  EXPECT_GT(r.kl.mean, 1e-7) << "the tail bucket sees the lse error";
  EXPECT_LT(std::fabs(r.drift_kl.mean), 1e-14);  // 0 up to the double rounding of the sums
  EXPECT_EQ(r.drift_status, "pass");
  EXPECT_EQ(r.verdict, Verdict::Pass);
}

// The default kappa on f32 arms: a candidate whose top-1 logit moved by 0.01 at one of two
// positions has KL/u^2 = 1.0316e-6 * 2^48 = 2.9e8 (the case above at eps 100x larger), far
// above the budget; identical traces (KL 0) pass.
TEST(DriftGate, DefaultKappaFailsACoherentDriftOnF32Arms) {
  KlCase k{{{3, 0, 0, 0}, {3, 0, 0, 0}}, {{3.01, 0, 0, 0}, {3, 0, 0, 0}}};
  CompareResult r = run_kl(k, false);
  EXPECT_EQ(r.drift_kappa, kDefaultKlKappa);
  EXPECT_NEAR(r.kl_over_u2, 2.9e8, 0.05e8);
  EXPECT_EQ(r.verdict, Verdict::Fail);
  KlCase same{k.ref, k.ref};
  EXPECT_EQ(run_kl(same, false).verdict, Verdict::Pass);
}

// u is the coarser arm's unit roundoff, floored at f32's (the trace's own resolution): the
// same 0.01 drift is within budget between a ref and a bf16 arm (u = 2^-8, KL/u^2 =
// 1.0316e-6 * 2^16 = 0.0676), judged at u = 2^-11 against f16, and at the floor 2^-24 for
// f64 vs f64.
TEST(DriftGate, MixedPrecisionUsesTheCoarserRoundoff) {
  KlCase k{{{3, 0, 0, 0}, {3, 0, 0, 0}}, {{3.01, 0, 0, 0}, {3, 0, 0, 0}}};
  CompareResult b = run_kl(k, false, {}, "f64", "bf16");
  EXPECT_EQ(b.drift_u, std::ldexp(1.0, -8));
  EXPECT_NEAR(b.kl_over_u2, 0.0676, 0.0005);
  EXPECT_EQ(b.drift_status, "pass");
  EXPECT_EQ(b.verdict, Verdict::Pass);
  EXPECT_EQ(run_kl(k, false, {}, "f16", "f32").drift_u, std::ldexp(1.0, -11));
  EXPECT_EQ(run_kl(k, false, {}, "bf16", "f16").drift_u, std::ldexp(1.0, -8));
  CompareResult d = run_kl(k, false, {}, "f64", "f64");
  EXPECT_EQ(d.drift_u, std::ldexp(1.0, -24));
  EXPECT_NE(d.drift_note.find("floored"), std::string::npos) << d.drift_note;
  EXPECT_EQ(d.verdict, Verdict::Fail);
}

// No decided position is inconclusive only when nothing fails: a drift over budget is a fail
// even there. An unknown compute dtype cannot set a budget: the gate says n/a, not pass.
TEST(DriftGate, ExcessWithoutDecidedPositionsFailsAndUnknownDtypeIsNotApplied) {
  KlCase k{{{1, 0, 0, 0}, {1, 0, 0, 0}}, {{1.01, 0, 0, 0}, {1, 0, 0, 0}}};  // gaps 1: none decided
  CompareResult f = run_kl(k, false);
  EXPECT_EQ(f.decided, 0);
  EXPECT_EQ(f.drift_status, "fail");
  EXPECT_EQ(f.verdict, Verdict::Fail);
  KlCase same{k.ref, k.ref};
  EXPECT_EQ(run_kl(same, false).verdict, Verdict::Inconclusive);
  CompareResult n = run_kl(KlCase{{{3, 0, 0, 0}, {3, 0, 0, 0}}, {{3.01, 0, 0, 0}, {3, 0, 0, 0}}}, false, {}, "f64", "");
  EXPECT_EQ(n.drift_status, "n/a");
  EXPECT_TRUE(std::isnan(n.drift_budget));
  EXPECT_NE(n.drift_note.find("compute dtype unknown for cand"), std::string::npos) << n.drift_note;
  EXPECT_EQ(n.verdict, Verdict::Pass);
  EXPECT_NE(format_report(n).find("drift gate   KL/u^2 n/a"), std::string::npos);
  CompareOptions bad;
  bad.kl_kappa = 0;
  EXPECT_THROW(run_kl(same, false, bad), Error);
}

TEST(Compare, LogitsFileOfAnotherTraceIsRefused) {
  KlCase k{{{0, 0, 0, 0}, {1, 2, 3, 4}}, {{0, 0, 0, 0}, {1, 2, 3, 4}}};
  std::string dir = temp_dir("kl-wrong");
  LogitsWriter w;
  w.open(dir + "/wrong.logits", 4);
  float a[4] = {9, 0, 0, 0};
  w.write_row(a);
  w.write_row(a);
  w.finish();
  TraceHeader h = fixture_header(1, 2, 2);
  Trace t = read_trace(write_trace(dir + "/t.tsv", h, {kl_row(0, k.ref[0]), kl_row(1, k.ref[1])}));
  CompareOptions o;
  o.ref_logits = o.cand_logits = dir + "/wrong.logits";
  EXPECT_THROW(compare_traces(t, t, o), Error);
}

TEST(Compare, ForeignAgainstArbiter) {
  std::string dir = temp_dir("cmp-foreign");
  auto rows = six_rows();
  Trace ref = read_trace(write_trace(dir + "/ref.tsv", fixture_header(), rows));
  std::string text = "# engine other\nchunk\tpos\ttarget\tnll\ttop_ids\ttop_logits\n";
  for (const auto& r : rows)
    text += std::to_string(r.chunk) + "\t" + std::to_string(r.pos) + "\t" + std::to_string(r.target) +
            "\t" + format_trace_float(r.nll) + "\t" + std::to_string(r.top_ids[0]) + "," +
            std::to_string(r.top_ids[1]) + "," + std::to_string(r.top_ids[2]) + "\t" +
            format_trace_float(r.top_logits[0]) + "," + format_trace_float(r.top_logits[1]) + "," +
            format_trace_float(r.top_logits[2]) + "\n";
  write_file(dir + "/other.tsv", text);
  Trace cand = read_trace(dir + "/other.tsv");
  CompareResult r = compare_traces(ref, cand, {});
  EXPECT_EQ(r.verdict, Verdict::Pass);
  EXPECT_EQ(r.kl_method, "unavailable");
  EXPECT_FALSE(r.unchecked.empty());  // model/corpus/... unknown in cand: said, not hidden
  EXPECT_NE(format_report(r).find("not checked: model sha256 (unknown in cand)"), std::string::npos);
}

TEST(Compare, ReportAlwaysHasThresholdFreeNumbers) {
  auto rows = six_rows();
  std::string rep = format_report(run(traces_of(rows, rows)));
  for (const char* s : {"largest ref top1-top2 gap at any disagreement", "sweep:", "by ref gap:",
                        "rank of ref top-1 in cand top-k", "SE chunk", "VERDICT: pass"})
    EXPECT_NE(rep.find(s), std::string::npos) << s << "\n" << rep;
  auto j = to_json(run(traces_of(rows, rows)));
  for (const char* k : {"verdict", "top1", "nll", "spread", "kl", "top1_logit_delta", "ref", "cand"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["top1"]["sweep"].size(), 4u);
}
