// Recorded gate legs (verify/localize/gate_record.h): the resolution rule on synthetic
// reports, and through the real CLI on stories260K: a record made by one process gated
// against in another, refusals (tampered file, other prompts, other model, fallbacks, a
// non-empty target), an injected leg resolved as "wrong", and --reproduce exact and not.
// To add a resolution case: build sides with side(), mark recorded ones in the report, run
// gate_analyze, then gate_resolve.
#include "verify/localize/gate_record.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/sha256.h"
#include "model/model.h"
#include "test_util.h"
#include "verify/trace/store.h"

using namespace arbiter;
using namespace arbiter::verify;
using namespace arbiter::test;
namespace fs = std::filesystem;

namespace {

using Runs = std::vector<std::vector<std::vector<int32_t>>>;  // [prompt][run][step]

GateSideRuns side(const std::string& label, Runs t) {
  GateSideRuns s;
  s.label = label;
  s.tokens = std::move(t);
  return s;
}

// sides: (label, recorded, device, runs); the reference's logits always prefer token 1.
GateReport analyzed(const std::vector<std::tuple<std::string, bool, std::string, Runs>>& sides) {
  GateReport r;
  std::vector<GateSideRuns> runs;
  for (const auto& [label, recorded, device, t] : sides) {
    GateSideSummary g;
    g.label = label;
    g.recorded = recorded;
    g.device = device;
    r.sides.push_back(g);
    runs.push_back(side(label, t));
  }
  gate_analyze(runs, [](int, int, int) { std::vector<double> l(10, 0.0); l[1] = 5; return l; },
               0.5, r);
  return r;
}

}  // namespace

TEST(GateResolve, OneSideAloneIsWrong) {
  GateReport r = analyzed({{"ref", false, "ref", {{{1, 1, 1}}}},
                           {"cpu", false, "cpu", {{{1, 1, 1}}}},
                           {"rec:cpu@b", true, "cpu", {{{1, 1, 7}}}}});
  auto rows = gate_resolve(r);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].step, 2);
  EXPECT_EQ(rows[0].kind, "wrong");
  EXPECT_EQ(rows[0].named, std::vector<int>{2});
  EXPECT_EQ(rows[0].tokens, (std::vector<int32_t>{1, 1, 7}));
  EXPECT_EQ(rows[0].text, "side rec:cpu@b wrong (alone against ref and cpu, which agree)");
}

TEST(GateResolve, AgreeingWithTheRecordedOracleIsRight) {
  // ref and the recorded oracle agree; cpu and cuda agree on another token: no single
  // outlier, so the oracle decides between the live tiers.
  GateReport r = analyzed({{"ref", false, "ref", {{{1, 1}}}},
                           {"cpu", false, "cpu", {{{1, 2}}}},
                           {"cuda:bf16", false, "cuda:0", {{{1, 2}}}},
                           {"rec:ref@oracle", true, "ref", {{{1, 1}}}}});
  auto rows = gate_resolve(r);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].kind, "right");
  EXPECT_EQ(rows[0].named, std::vector<int>{0});
  EXPECT_EQ(rows[0].text,
            "side ref right (agrees with the recorded oracle rec:ref@oracle; cpu and cuda:bf16 "
            "do not)");
  // The same split without an oracle (a recorded cpu leg) is only a split.
  r.sides[3].device = "cpu";
  rows = gate_resolve(r);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].kind, "split");
}

TEST(GateResolve, RecordedLegThatDisagreesWithItself) {
  // The recorded leg's run 2 changes its token at step 1 (where it also leaves the others).
  GateReport r = analyzed({{"ref", false, "ref", {{{1, 1, 1}, {1, 1, 1}}}},
                           {"cpu", false, "cpu", {{{1, 1, 1}, {1, 1, 1}}}},
                           {"rec:cuda:bf16@b", true, "cuda:0", {{{1, 3, 1}, {1, 4, 1}}}}});
  auto rows = gate_resolve(r);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].kind, "self-inconsistent");
  EXPECT_EQ(rows[0].named, std::vector<int>{2});
  EXPECT_EQ(rows[0].text, "our tiers agree; rec:cuda:bf16@b disagrees with itself");
  // A side whose runs differ only after the step still votes there.
  GateReport r2 = analyzed({{"ref", false, "ref", {{{1, 1, 1}, {1, 1, 1}}}},
                            {"cpu", false, "cpu", {{{1, 1, 1}, {1, 1, 1}}}},
                            {"rec:cpu@b", true, "cpu", {{{1, 3, 1}, {1, 3, 5}}}}});
  rows = gate_resolve(r2);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].kind, "wrong");
}

TEST(GateResolve, ThreeWaySplitAndRenderers) {
  GateReport r = analyzed({{"ref", false, "ref", {{{1, 1}}}},
                           {"cpu", false, "cpu", {{{1, 2}}}},
                           {"rec:a|b@h", true, "cpu", {{{3, 1}}}}});
  r.pieces[1] = "x";
  auto rows = gate_resolve(r);
  ASSERT_EQ(rows.size(), 2u);  // step 0: rec alone against ref and cpu
  EXPECT_EQ(rows[0].step, 0);
  EXPECT_EQ(rows[0].kind, "wrong");
  EXPECT_EQ(rows[1].step, 1);  // step 1: ref and cpu, one each: a split
  EXPECT_EQ(rows[1].kind, "split");
  EXPECT_EQ(rows[1].text, "split (ref / cpu)");
  EXPECT_EQ(rows[1].tokens[2], kGateLeftEarlier);
  const std::string t = gate_resolution_text(r, rows);
  EXPECT_NE(t.find("(left)"), std::string::npos) << t;
  EXPECT_NE(t.find("'x'(1)"), std::string::npos) << t;
  const std::string md = gate_resolution_markdown(r, rows);
  EXPECT_NE(md.find("| prompt | step | ref | cpu | rec:a\\|b@h | resolution |"), std::string::npos)
      << md;
  EXPECT_NE(md.find("| 1 | 1 | `'x'(1)` | `2` | `(left)` | split (ref / cpu) |"), std::string::npos)
      << md;
  nlohmann::json j = gate_resolution_json(r, rows);
  EXPECT_EQ(j[1]["class"], "split");
  EXPECT_TRUE(j[1]["tokens"]["rec:a|b@h"].is_null());
  EXPECT_EQ(j[0]["sides"][0], "rec:a|b@h");
}

// --- through the CLI ----------------------------------------------------------------------

namespace {

const std::string kStories = source_path("models/stories260K/stories260K.gguf");
const std::string kTiny = source_path("models/TinyStories-656K");

std::string prompts_in(const std::string& dir) {
  std::string p = dir + "/prompts.txt";
  write_file(p, "Once upon a time\nThe little dog\n\nLily wanted to\n");
  return p;
}

nlohmann::json json_file(const std::string& path) { return nlohmann::json::parse(read_file(path)); }

// Copies a record so a test can tamper with the copy.
std::string copy_record(const std::string& from, const std::string& to) {
  fs::remove_all(to);
  fs::copy(from, to, fs::copy_options::recursive);
  return to;
}

// One cpu record shared by the tests below (made once: each gate run loads the model).
const std::string& cpu_record() {
  static const std::string dir = [] {
    std::string base = temp_dir("gate-rec");
    std::string d = base + "/cpu";
    fs::remove_all(d);
    CliResult r = run_cli("gate -m " + kStories + " --prompts " + prompts_in(base) +
                          " -n 8 --runs 2 --sides cpu --record " + d + " -t 1 --quiet");
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return d;
  }();
  return dir;
}

}  // namespace

TEST(CliGateRecord, RecordHoldsTheEvidenceAndItsCustody) {
  const std::string& d = cpu_record();
  EXPECT_TRUE(check_sha256sums(d).empty());
  EXPECT_EQ(fs::exists(d + "/manifest.json") + fs::exists(d + "/side-1.json") +
                fs::exists(d + "/SHA256SUMS"),
            3);
  nlohmann::json m = json_file(d + "/manifest.json");
  const std::string prompts = read_file(fs::path(d).parent_path().string() + "/prompts.txt");
  EXPECT_EQ(m["prompts"]["sha256"], sha256_hex(prompts.data(), prompts.size()));
  EXPECT_EQ(m["prompts"]["count"], 3);
  auto model = load_model(kStories);
  EXPECT_EQ(m["model"]["weights_sha256"], model->weights_sha256);
  EXPECT_EQ(m["tokenizer"]["sha256"], model->tokenizer->sha256());
  EXPECT_EQ(m["prompts"]["ids"][0], model->tokenizer->encode("Once upon a time", true, false));
  EXPECT_FALSE(m["build"]["commit"].get<std::string>().empty());
  EXPECT_FALSE(m["build"]["compiler"].get<std::string>().empty());
  EXPECT_FALSE(m["host"]["host"].get<std::string>().empty());
  ASSERT_EQ(m["sides"].size(), 1u);
  EXPECT_EQ(m["sides"][0]["spec"], "cpu");
  EXPECT_EQ(m["sides"][0]["fallbacks"], 0);
  EXPECT_NE(m["sides"][0]["providers"].get<std::string>().find("matmul="), std::string::npos);
  nlohmann::json s = json_file(d + "/side-1.json");
  ASSERT_EQ(s["tokens"].size(), 3u);
  for (size_t p = 0; p < 3; ++p) {
    ASSERT_EQ(s["tokens"][p].size(), 2u);  // both runs
    ASSERT_EQ(s["tokens"][p][0].size(), 8u);
    for (size_t i = 0; i < 8; ++i) {
      // The greedy token is the top-1; five log-probabilities, descending, below 0; the own
      // gap is the top-1/top-2 log-probability difference.
      const auto& ids = s["top_ids"][p][i];
      const auto& lp = s["top_logprobs"][p][i];
      ASSERT_EQ(ids.size(), 5u);
      EXPECT_EQ(ids[0], s["tokens"][p][0][i]);
      for (size_t k = 1; k < 5; ++k) EXPECT_LE(lp[k].get<double>(), lp[k - 1].get<double>());
      EXPECT_LE(lp[0].get<double>(), 0.0);
      EXPECT_NEAR(s["own_gap"][p][i].get<double>(), lp[0].get<double>() - lp[1].get<double>(),
                  1e-6);
    }
  }
}

TEST(CliGateRecord, GatedAgainstInAnotherProcess) {
  const std::string& d = cpu_record();
  const std::string base = fs::path(d).parent_path().string();
  CliResult r = run_cli("gate -m " + kStories + " --prompts " + base + "/prompts.txt" +
                        " --runs 2 --sides ref --against " + d + " -t 1 --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("8 tokens"), std::string::npos) << r.out;  // -n taken from the record
  EXPECT_NE(r.out.find("] rec:cpu@"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokenized identically on all 2 sides"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("VERDICT: pass"), std::string::npos) << r.out;
}

TEST(CliGateRecord, RefusesTamperedOtherPromptsOtherModelAndFallbacks) {
  const std::string& d = cpu_record();
  const std::string base = fs::path(d).parent_path().string();
  const std::string p = base + "/prompts.txt";
  // An edited ids file fails its checksum.
  std::string t = copy_record(d, base + "/tampered");
  std::string side = read_file(t + "/side-1.json");
  const std::string key = "\"tokens\":[[[";
  ASSERT_NE(side.find(key), std::string::npos) << side;
  side.replace(side.find(key), key.size(), key + "1,");
  write_file(t + "/side-1.json", side);
  CliResult r = run_cli("gate -m " + kStories + " --prompts " + p + " --sides ref --against " + t);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(t + ": checksum check failed: " + t + "/side-1.json: checksum mismatch"),
            std::string::npos)
      << r.err;
  // Another prompts file.
  std::string other = base + "/other.txt";
  write_file(other, "Once upon a time\nThe little dog\n\nLily wanted\n");
  r = run_cli("gate -m " + kStories + " --prompts " + other + " --sides ref --against " + d);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(d + ": recorded on prompts sha256"), std::string::npos) << r.err;
  // Another model.
  r = run_cli("gate -m " + kTiny + " --prompts " + p + " --sides ref --against " + d);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(d + ": recorded with weights sha256"), std::string::npos) << r.err;
  // A leg that fell back to another provider (re-checksummed, so only the fallback is wrong).
  std::string f = copy_record(d, base + "/fallback");
  nlohmann::json m = json_file(f + "/manifest.json");
  m["sides"][0]["fallbacks"] = 2;
  write_file(f + "/manifest.json", m.dump(2));
  write_sha256sums(f, "[test]");
  r = run_cli("gate -m " + kStories + " --prompts " + p + " --sides ref --against " + f);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(f + ": side cpu recorded 2 op fallback(s)"), std::string::npos) << r.err;
  // A malformed manifest (re-checksummed) is refused with one line, naming the field.
  std::string bad = copy_record(d, base + "/malformed");
  nlohmann::json mb = json_file(bad + "/manifest.json");
  mb["sides"][0].erase("file");
  mb["host"] = "a string";
  write_file(bad + "/manifest.json", mb.dump(2));
  write_sha256sums(bad, "[test]");
  r = run_cli("gate -m " + kStories + " --prompts " + p + " --sides ref --against " + bad);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("[gate] " + bad + ": not a gate record ("), std::string::npos) << r.err;
  mb["host"] = {{"host", "h"}};
  write_file(bad + "/manifest.json", mb.dump(2));
  write_sha256sums(bad, "[test]");
  r = run_cli("gate -m " + kStories + " --prompts " + p + " --sides ref --against " + bad);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(bad + "/manifest.json: field 'file' missing"), std::string::npos) << r.err;
  // A record is never written over another, and a failed run leaves none behind.
  r = run_cli("gate -m " + kStories + " --prompts " + p + " --sides cpu --record " + d);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(d + ": exists and is not empty"), std::string::npos) << r.err;
  const std::string failed = base + "/failed";
  r = run_cli("gate -m " + kStories + " --prompts " + p + " --sides cpu -n 100000 --record " +
              failed);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("exceed the model's context"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(failed));
  for (const auto& e : fs::directory_iterator(base))
    EXPECT_EQ(e.path().filename().string().find(".failed"), std::string::npos) << e.path();
}

TEST(CliGateRecord, InjectedLegIsResolvedWrong) {
  const std::string base = temp_dir("gate-rec-inject");
  const std::string d = base + "/faulty";
  fs::remove_all(d);
  const std::string p = prompts_in(base);
  const std::string leg = "cpu+inject=op=down,layer=0,scale=3";
  CliResult r = run_cli("gate -m " + kStories + " --prompts " + p + " -n 16 --runs 1 --sides " +
                        leg + " --record " + d + " -t 1 --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = run_cli("gate -m " + kStories + " --prompts " + p +
              " --runs 1 --sides ref,cpu --against " + d + " -t 1 --quiet --json");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;  // the faulty leg's divergence is a defect
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_GE(j["resolution"].size(), 1u) << j.dump(2);
  for (const auto& row : j["resolution"]) {
    EXPECT_EQ(row["class"], "wrong") << row.dump();
    ASSERT_EQ(row["sides"].size(), 1u);
    EXPECT_EQ(row["sides"][0].get<std::string>().rfind("rec:" + leg + "@", 0), 0u) << row.dump();
    EXPECT_EQ(row["tokens"]["ref"], row["tokens"]["cpu"]);
  }
}

TEST(CliGateRecord, ReproduceExactlyAndNameTheFirstDifference) {
  const std::string& d = cpu_record();
  const std::string base = fs::path(d).parent_path().string();
  const std::string p = base + "/prompts.txt";
  CliResult r = run_cli("gate -m " + kStories + " --prompts " + p +
                        " --runs 2 --sides ref --against " + d + " --reproduce -t 1 --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("reproduced on cpu (f32): all 48 steps reproduced"), std::string::npos)
      << r.out;  // 3 prompts x 2 runs x 8 tokens
  // Tampered and re-checksummed: run 2 of prompt 2 holds another token at step 5.
  std::string t = copy_record(d, base + "/rechecksummed");
  nlohmann::json s = json_file(t + "/side-1.json");
  const int32_t was = s["tokens"][1][1][5];
  const int32_t now = was == 1 ? 2 : 1;
  s["tokens"][1][1][5] = now;
  write_file(t + "/side-1.json", s.dump());
  write_sha256sums(t, "[test]");
  r = run_cli("gate -m " + kStories + " --prompts " + p + " --runs 2 --sides ref --against " + t +
              " --reproduce -t 1 --quiet --json");
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["reproduction"].size(), 1u) << j.dump(2);
  const auto& x = j["reproduction"][0];
  EXPECT_EQ(x["exact"], false);
  EXPECT_EQ(x["first_difference"]["prompt"], 2);
  EXPECT_EQ(x["first_difference"]["run"], 2);
  EXPECT_EQ(x["first_difference"]["step"], 5);
  EXPECT_EQ(x["first_difference"]["recorded_token"], now);
  EXPECT_EQ(x["first_difference"]["here_token"], was);
  // --reproduce without a record is refused.
  r = run_cli("gate -m " + kStories + " --prompts " + p + " --sides ref,cpu --reproduce");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--reproduce reruns recorded sides"), std::string::npos) << r.err;
}
