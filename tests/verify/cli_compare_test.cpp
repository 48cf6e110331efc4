// `arbiter compare` end to end: the exit code is the verdict (0 pass, 1 fail,
// 2 inconclusive, 3 incomparable, 4 unreadable), messages name file and line.
// To add a case: write traces with fixtures.h, run_cli, check exit code and output.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "test_util.h"

using namespace arbiter;
using namespace arbiter::verify;
using namespace arbiter::test;

namespace {

struct Files {
  std::string dir, ref, cand;
};

Files write_pair(const std::vector<TraceRow>& ref, const std::vector<TraceRow>& cand,
                 TraceHeader hc = fixture_header()) {
  Files f;
  f.dir = temp_dir("cli-cmp");
  f.ref = write_trace(f.dir + "/ref.tsv", fixture_header(), ref);
  f.cand = write_trace(f.dir + "/cand.tsv", hc, cand);
  return f;
}

CliResult compare(const Files& f, const std::string& extra = "") {
  return run_cli("compare " + f.ref + " " + f.cand + (extra.empty() ? "" : " " + extra));
}

}  // namespace

TEST(CliCompare, ExitCodesFollowVerdicts) {
  auto ref = six_rows();
  {
    CliResult r = compare(write_pair(ref, ref));
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("VERDICT: pass"), std::string::npos) << r.out;
  }
  {
    auto cand = ref;  // flip at reference gap 3.0
    cand[0].top_ids = {11, 10, 12};
    cand[0].top_logits = {5.1, 5.0, 1.0};
    CliResult r = compare(write_pair(ref, cand));
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  }
  {
    auto cand = ref;  // flip at reference gap 1.5 only
    cand[3].top_ids = {41, 40, 42};
    cand[3].top_logits = {1.6, 1.4, 0.0};
    Files f = write_pair(ref, cand);
    // The flip moves logits by tenths of a nat: the drift gate fails it on f32 arms...
    CliResult d = compare(f);
    EXPECT_EQ(d.exit_code, 1) << d.out << d.err;
    EXPECT_NE(d.out.find("exceeds the drift budget"), std::string::npos) << d.out;
    // ...and with the drift gate out of the way only the token gate decides.
    CliResult r = compare(f, "--kl-kappa 1e300");
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("3 positions, 0 disagreements"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("kappa 1e+300"), std::string::npos) << r.out;
    EXPECT_EQ(compare(f, "--kl-kappa 1e300 --decided 1.0").exit_code, 1);
    EXPECT_EQ(compare(f, "--kl-kappa=1e300 --decided=1.0").exit_code, 1);
  }
  {
    auto flat = ref;
    for (auto& x : flat) x.top_logits = {2.0, 1.0, 0.5};
    EXPECT_EQ(compare(write_pair(flat, flat)).exit_code, 2);
  }
  {
    auto cand = ref;
    cand[2].lse = std::nan("");
    EXPECT_EQ(compare(write_pair(ref, cand)).exit_code, 1);
  }
}

TEST(CliCompare, IncomparableNamesFieldAndForceOverrides) {
  auto rows = six_rows();
  TraceHeader h = fixture_header();
  h.corpus_sha256 = std::string(64, '9');
  Files f = write_pair(rows, rows, h);
  CliResult r = compare(f);
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_NE(r.out.find("corpus"), std::string::npos) << r.out;
  CliResult forced = compare(f, "--force");
  EXPECT_EQ(forced.exit_code, 0) << forced.out << forced.err;
  EXPECT_NE(forced.out.find("FORCED"), std::string::npos) << forced.out;
}

TEST(CliCompare, UnreadableNamesFileAndLine) {
  auto rows = six_rows();
  Files f = write_pair(rows, rows);
  std::string text = read_file(f.cand);
  write_file(f.cand, text.substr(0, text.find("# end")));  // truncated: no end line
  CliResult r = compare(f);
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_NE(r.err.find(f.cand + ":17:"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;

  size_t row2 = text.find("\n0\t1\t") + 1;  // line 13
  std::string bad = text.substr(0, row2) + "0\t1\tX" + text.substr(text.find('\n', row2));
  write_file(f.cand, bad);
  r = compare(f);
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_NE(r.err.find(f.cand + ":13:"), std::string::npos) << r.err;

  EXPECT_EQ(run_cli("compare " + f.ref).exit_code, 4);                      // missing CAND
  EXPECT_EQ(run_cli("compare " + f.ref + " " + f.ref + " --decided x").exit_code, 4);
  EXPECT_EQ(run_cli("compare " + f.ref + " " + f.ref + " --kl-kappa 0").exit_code, 4);
  EXPECT_EQ(run_cli("compare " + f.ref + " " + f.ref + " --kl-kappa -5").exit_code, 4);
  EXPECT_EQ(run_cli("compare " + f.ref + " " + f.dir + "/absent.tsv").exit_code, 4);
}

TEST(CliCompare, JsonAndLogitsSideFiles) {
  auto rows = six_rows();
  Files f = write_pair(rows, rows);
  CliResult r = compare(f, "--json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["verdict"], "pass");
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_EQ(j["top1"]["decided"], 3);
  EXPECT_EQ(j["kl"]["method"], "topk_tail_estimate");

  // Side files TRACE.logits are picked up when both exist; --topk-only ignores them.
  // Vocabulary 70 with each row's top-3 logits at their ids and -10 elsewhere.
  for (const auto& path : {f.ref, f.cand}) {
    LogitsWriter w;
    w.open(path + ".logits", 70);
    for (const auto& row : rows) {
      std::vector<float> x(70, -10.0f);
      for (size_t k = 0; k < 3; ++k) x[size_t(row.top_ids[k])] = float(row.top_logits[k]);
      w.write_row(x.data());
    }
    w.finish();
  }
  // Only one side file: estimated, and the report says why.
  std::filesystem::rename(f.cand + ".logits", f.dir + "/aside");
  j = nlohmann::json::parse(compare(f, "--json").out);
  EXPECT_EQ(j["kl"]["method"], "topk_tail_estimate");
  EXPECT_NE(j["kl"]["note"].get<std::string>().find("one side only"), std::string::npos);
  std::filesystem::rename(f.dir + "/aside", f.cand + ".logits");
  j = nlohmann::json::parse(compare(f, "--json").out);
  EXPECT_EQ(j["kl"]["method"], "exact");
  EXPECT_NEAR(j["kl"]["mean"]["mean"].get<double>(), 0.0, 1e-12);
  j = nlohmann::json::parse(compare(f, "--json --topk-only").out);
  EXPECT_EQ(j["kl"]["method"], "topk_tail_estimate");
}

// Issue 32: a passing compare printed "t chunk 229.26" with nothing saying what it is.
TEST(CliCompare, LegendSaysWhatTChunkIsAndThatItDecidesNothing) {
  Files f = write_pair(six_rows(), six_rows());
  CliResult r = compare(f);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("legend: t = mean / SE"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("'t chunk' uses the SE of\n  chunk batch means"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("it decides nothing: the gates are the lines marked '<- gate'"), std::string::npos) << r.out;
  // Under the statistics, before the verdict.
  EXPECT_LT(r.out.find("drift gate"), r.out.find("legend:"));
  EXPECT_LT(r.out.find("legend:"), r.out.find("VERDICT"));
}

TEST(CliCompare, ExplainShowsTheFormulasWithThisRunsValues) {
  // cand nll = ref nll + d, d = 0.1 0.2 0.3 | 0.3 0.4 0.5 (chunks 0 | 1). By hand: mean 0.3;
  // sd = sqrt(0.1 / 5) = 0.141421; SE iid = sd / sqrt 6 = 0.057735; t iid = 5.196; chunk sums
  // 0.6 and 1.2 against 3 * 0.3: SE chunk = sqrt(2 * (0.09 + 0.09)) / 6 = 0.1, t chunk = 3;
  // ppl diff = 100 (e^0.3 - 1) = 34.9859 %, its SE 100 e^0.3 * 0.1 = 13.5 %.
  const std::vector<TraceRow> ref = six_rows();
  std::vector<TraceRow> cand;
  const double d[6] = {0.1, 0.2, 0.3, 0.3, 0.4, 0.5};
  for (size_t i = 0; i < ref.size(); ++i)
    cand.push_back(make_row(ref[i].chunk, ref[i].pos, ref[i].target, ref[i].nll + d[i], ref[i].top_ids,
                            ref[i].top_logits));
  Files f = write_pair(ref, cand);
  CliResult r = compare(f, "--explain");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* want : {
           "nll shift, x_i = cand nll - ref nll (nats): n 6 positions in B 2 chunks\n",
           "  mean x̄ = Σ x_i / n = 0.3\n",
           "  sd = sqrt(Σ (x_i - x̄)² / (n - 1)) = 0.141421\n",
           "  SE iid = sd / √n = 0.141421 / √6 = 0.057735\n",
           "(S_c - n_c·x̄)²) / n, S_c and n_c chunk c's sum and count = 0.1\n",
           "  t iid = x̄ / SE iid = 0.3 / 0.057735 = 5.196\n",
           "  t chunk = x̄ / SE chunk = 0.3 / 0.1 = 3\n",
           "  ppl diff = 100·(exp(x̄) - 1) = 34.9859%, SE = 100·exp(x̄)·SE chunk = 13.5%\n",
           "decided gate: a position is decided when ref top1 - top2 logit >= 2; 3 decided, 0 disagree there",
       })
    EXPECT_NE(r.out.find(want), std::string::npos) << "missing: " << want << "\n" << r.out;
  // The report itself is unchanged and comes first.
  EXPECT_LT(r.out.find("VERDICT"), r.out.find("how these numbers are computed"));
  CliResult j = compare(f, "--explain --json");
  EXPECT_EQ(j.exit_code, 4) << j.out << j.err;
  EXPECT_NE(j.err.find("--explain adds to the text report; not with --json"), std::string::npos) << j.err;
}
