// End to end through the CLI on real models: traces on ref match HF transformers' float64
// traces (tests/fixtures/traces, tools/hf_trace.py); ref vs cpu passes compare with zero
// decided disagreements and within the drift budget; cpu traces are byte-identical across
// runs and thread counts; a large injected fault fails on the token gate and a 2% one on the
// drift gate. To add a model, add it to kFixtureModels.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "verify/trace/trace.h"

using namespace arbiter;

namespace {

const char* kCorpus = "models/corpus/stories.txt";

std::string trace_cmd(const std::string& model, const std::string& device, const std::string& shape,
                      const std::string& out, const std::string& extra = "") {
  return "trace -m " + test::source_path(model) + " --corpus " + test::source_path(kCorpus) + " " +
         shape + " --device " + device + " -o " + out + " --quiet " + extra;
}

// Rows after the `# columns` line (the header holds timings and providers).
std::string rows_of(const std::string& text) {
  size_t at = text.find("# columns");
  size_t end = text.rfind("# end");
  return text.substr(at, end - at);
}

}  // namespace

struct FixtureModel {
  const char* dir;
  const char* name;
};
const FixtureModel kFixtureModels[] = {
    {"models/TinyStories-656K", "TinyStories-656K"},
    {"tests/fixtures/models/tiny-llama", "tiny-llama"},
    {"tests/fixtures/models/tiny-mistral", "tiny-mistral"},
    {"tests/fixtures/models/tiny-qwen2", "tiny-qwen2"},
    {"tests/fixtures/models/tiny-qwen3", "tiny-qwen3"},
    {"tests/fixtures/models/tiny-gemma3", "tiny-gemma3"},
    {"tests/fixtures/models/tiny-gemma2", "tiny-gemma2"},
};

// The ref tier against transformers float64 traces: same targets and top-k ids, every logit
// within 1e-6 (the floor; measured differences are ~1e-13).
TEST(TraceE2E, RefMatchesTransformersFloat64Traces) {
  const std::pair<const char*, const char*> shapes[] = {
      {"w1", "--chunk 1 --chunks 16 --prefill 0 --start 0"},
      {"w8", "--chunk 8 --chunks 8 --prefill 64 --start 0"}};
  int compared = 0;
  for (const FixtureModel& m : kFixtureModels)
    for (auto [shape, args] : shapes) {
      std::string fixture =
          test::source_path(std::string("tests/fixtures/traces/") + m.name + "." + shape + ".f64.tsv");
      if (!std::ifstream(fixture).good()) continue;  // regenerated on the GPU machine
      SCOPED_TRACE(fixture);
      std::string out = test::temp_dir("e2e") + "/ref.tsv";
      auto r = test::run_cli(trace_cmd(m.dir, "ref", args, out));
      ASSERT_EQ(r.exit_code, 0) << r.err;
      verify::Trace hf = verify::read_trace(fixture), ours = verify::read_trace(out);
      EXPECT_EQ(ours.header.model_sha256, hf.header.model_sha256);
      EXPECT_EQ(ours.header.corpus_sha256, hf.header.corpus_sha256);
      EXPECT_EQ(ours.header.corpus_tokens, hf.header.corpus_tokens);
      ASSERT_EQ(ours.rows.size(), hf.rows.size());
      double worst = 0;
      for (size_t i = 0; i < hf.rows.size(); ++i) {
        const auto &a = ours.rows[i], &b = hf.rows[i];
        ASSERT_EQ(a.abs_pos, b.abs_pos);
        ASSERT_EQ(a.target, b.target) << "row " << i;
        EXPECT_EQ(a.top_ids, b.top_ids) << "row " << i;
        worst = std::max({worst, std::abs(a.lse - b.lse), std::abs(a.target_logit - b.target_logit)});
        for (size_t k = 0; k < b.top_logits.size(); ++k)
          worst = std::max(worst, std::abs(a.top_logits[k] - b.top_logits[k]));
      }
      EXPECT_LE(worst, 1e-6);
      std::printf("[ hf-trace ] %-18s %s max |dlogit| %.3g\n", m.name, shape, worst);
      ++compared;
    }
  EXPECT_GE(compared, 5) << "fixture traces missing";
}

// The cpu tier (f32) on the gemma fixtures against transformers' float64 traces: compare
// passes at w1 and at w8 behind 64 tokens of context (past both sliding windows).
TEST(TraceE2E, GemmaCpuPassesAgainstTransformersTraces) {
  const std::pair<const char*, const char*> shapes[] = {
      {"w1", "--chunk 1 --chunks 16 --prefill 0 --start 0"},
      {"w8", "--chunk 8 --chunks 8 --prefill 64 --start 0"}};
  for (const char* name : {"tiny-gemma3", "tiny-gemma2"})
    for (auto [shape, args] : shapes) {
      const std::string fixture =
          test::source_path(std::string("tests/fixtures/traces/") + name + "." + shape + ".f64.tsv");
      SCOPED_TRACE(fixture);
      const std::string out = test::temp_dir("e2e") + "/cpu.tsv";
      auto r = test::run_cli(trace_cmd(std::string("tests/fixtures/models/") + name, "cpu", args, out));
      ASSERT_EQ(r.exit_code, 0) << r.err;
      auto c = test::run_cli("compare --json " + fixture + " " + out);
      EXPECT_EQ(c.exit_code, 0) << c.out << c.err;
      EXPECT_EQ(nlohmann::json::parse(c.out)["verdict"], "pass");
    }
}

TEST(TraceE2E, RefVsCpuPassesAtW1W8W256) {
  const char* model = "models/TinyStories-656K";
  const std::pair<const char*, const char*> shapes[] = {
      {"w1", "--shape w1"}, {"w8", "--chunk 8 --chunks 16 --prefill 64"}, {"w256", "--shape w256"}};
  for (auto [name, args] : shapes) {
    SCOPED_TRACE(name);
    std::string dir = test::temp_dir("e2e");
    ASSERT_EQ(test::run_cli(trace_cmd(model, "ref", args, dir + "/ref.tsv")).exit_code, 0);
    ASSERT_EQ(test::run_cli(trace_cmd(model, "cpu", args, dir + "/cpu.tsv")).exit_code, 0);
    auto c = test::run_cli("compare --json " + dir + "/ref.tsv " + dir + "/cpu.tsv");
    EXPECT_EQ(c.exit_code, 0) << c.out << c.err;
    auto j = nlohmann::json::parse(c.out);
    EXPECT_EQ(j["verdict"], "pass");
  }
}

TEST(TraceE2E, CpuTracesAreByteIdenticalAcrossRunsAndThreads) {
  std::string dir = test::temp_dir("e2e");
  const char* args = "--chunk 8 --chunks 8 --prefill 32";
  ASSERT_EQ(test::run_cli(trace_cmd("models/TinyStories-656K", "cpu", args, dir + "/a.tsv", "-t 1")).exit_code, 0);
  ASSERT_EQ(test::run_cli(trace_cmd("models/TinyStories-656K", "cpu", args, dir + "/b.tsv", "-t 2")).exit_code, 0);
  std::string a = test::read_file(dir + "/a.tsv"), b = test::read_file(dir + "/b.tsv");
  ASSERT_NE(a.find("# columns"), std::string::npos);
  EXPECT_EQ(rows_of(a), rows_of(b));
}

// Faults fail compare through both gates, and the candidate's header names the fault.
// scale=10 on layer 0's MLP output moves logits by whole nats and flips decided positions
// (token gate). scale=1.02 on layer 1's -- the "realistic size" -- moves them by
// ~0.02-0.09 and flips nothing decided; it fails on the drift gate (mean KL ~1e-4 nats
// against a budget kappa * 2^-48 for f32 arms), while the clean cpu trace passes it.
TEST(TraceE2E, InjectedFaultsFailCompare) {
  std::string dir = test::temp_dir("e2e");
  const char* args = "--chunk 8 --chunks 16 --prefill 64";
  const char* model = "models/TinyStories-656K";
  ASSERT_EQ(test::run_cli(trace_cmd(model, "ref", args, dir + "/ref.tsv")).exit_code, 0);
  ASSERT_EQ(test::run_cli(trace_cmd(model, "cpu", args, dir + "/cpu.tsv")).exit_code, 0);
  ASSERT_EQ(test::run_cli(trace_cmd(model, "cpu", args, dir + "/bad.tsv", "--inject op=down,layer=0,scale=10")).exit_code, 0);
  ASSERT_EQ(test::run_cli(trace_cmd(model, "cpu", args, dir + "/two.tsv", "--inject op=down,layer=1,scale=1.02")).exit_code, 0);
  EXPECT_NE(test::read_file(dir + "/bad.tsv").find("op=down,layer=0,scale=10"), std::string::npos);
  EXPECT_NE(test::read_file(dir + "/two.tsv").find("op=down,layer=1,scale=1.02"), std::string::npos);

  auto big = test::run_cli("compare " + dir + "/ref.tsv " + dir + "/bad.tsv");
  EXPECT_EQ(big.exit_code, 1) << big.out;
  EXPECT_NE(big.out.find("VERDICT: fail"), std::string::npos) << big.out;
  EXPECT_NE(big.out.find("top-1 disagreements on"), std::string::npos) << big.out;

  auto clean = test::run_cli("compare --json " + dir + "/ref.tsv " + dir + "/cpu.tsv");
  ASSERT_EQ(clean.exit_code, 0) << clean.out << clean.err;
  auto jc = nlohmann::json::parse(clean.out);
  EXPECT_EQ(jc["drift_gate"]["status"], "pass");
  EXPECT_LT(jc["drift_gate"]["kl_over_budget"].get<double>(), 1.0 / 30) << "trusted pair within 30x of the budget";

  auto two = test::run_cli("compare --json " + dir + "/ref.tsv " + dir + "/two.tsv");
  EXPECT_EQ(two.exit_code, 1) << two.out << two.err;
  auto j = nlohmann::json::parse(two.out);
  EXPECT_EQ(j["verdict"], "fail");
  EXPECT_EQ(j["top1"]["decided_disagree"], 0) << "the token gate alone passes a 2% fault";
  EXPECT_EQ(j["drift_gate"]["status"], "fail");
  EXPECT_GT(j["drift_gate"]["kl_over_budget"].get<double>(), 30.0) << "fails by a wide margin";
  ASSERT_EQ(j["reasons"].size(), 1u);
  EXPECT_NE(j["reasons"][0].get<std::string>().find("exceeds the drift budget"), std::string::npos) << j["reasons"];
}

TEST(TraceE2E, BadArgumentsAreRefused) {
  std::string dir = test::temp_dir("e2e");
  // top-k larger than the vocabulary, a non-number, a corpus too short for the shape.
  EXPECT_NE(test::run_cli(trace_cmd("models/stories260K/stories260K.gguf", "cpu", "--shape w1", dir + "/x.tsv", "--topk 100000")).exit_code, 0);
  EXPECT_NE(test::run_cli(trace_cmd("models/stories260K/stories260K.gguf", "cpu", "--chunk 8x --chunks 2", dir + "/x.tsv")).exit_code, 0);
  EXPECT_NE(test::run_cli(trace_cmd("models/stories260K/stories260K.gguf", "cpu", "--chunk 4096 --chunks 100", dir + "/x.tsv")).exit_code, 0);
  EXPECT_FALSE(std::ifstream(dir + "/x.tsv").good()) << "nothing half-written";
}
