// gate, drift and opcheck end to end through the CLI on the shipped models: exit codes,
// the classification of constructed cases, what the reports name, and bad input.
// The gate's near-tie case: small noise on the candidate's logits flips only positions where
// the reference is nearly tied; its defect case: the layer-0 down projection scaled by 3.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/generate.h"
#include "engine/sampler.h"
#include "io/sha256.h"
#include "model/model.h"
#include "test_util.h"
#include "verify/trace/trace.h"
#include "verify/trace/trace_run.h"

using namespace arbiter;
using namespace arbiter::test;

namespace {

const std::string kStories = source_path("models/stories260K/stories260K.gguf");
const std::string kTiny = source_path("models/TinyStories-656K");
const std::string kCorpus = source_path("models/corpus/stories.txt");

std::string prompts_file() {
  std::string p = temp_dir("gate") + "/prompts.txt";
  write_file(p,
             "Once upon a time\nThe little dog\n\nLily wanted to\nTom and his mom went to "
             "the park. They\n");
  return p;
}

nlohmann::json json_of(const CliResult& r) {
  try {
    return nlohmann::json::parse(r.out);
  } catch (...) {
    ADD_FAILURE() << "not JSON:\n" << r.out << r.err;
    return {};
  }
}

}  // namespace

TEST(CliGate, RefAndCpuPassOnBothModels) {
  std::string p = prompts_file();
  std::string bytes = read_file(p);
  for (const std::string& m : {kStories, kTiny}) {
    CliResult r = run_cli("gate -m " + m + " --prompts " + p +
                          " -n 40 --runs 2 --sides ref,cpu -t 1 --quiet");
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("VERDICT: pass"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(sha256_hex(bytes.data(), bytes.size())), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("(4 prompts)"), std::string::npos) << r.out;  // blank line skipped
    EXPECT_NE(r.out.find("tokenized identically on all 2 sides"), std::string::npos) << r.out;
  }
}

TEST(CliGate, SmallLogitNoiseGivesNearTiesOnly) {
  std::string p = prompts_file();
  CliResult r = run_cli("gate -m " + kStories + " --prompts " + p +
                        " -n 48 --runs 2 --sides ref,cpu+inject=op=logits,noise=0.1 -t 1 "
                        "--json --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  nlohmann::json j = json_of(r);
  EXPECT_EQ(j["verdict"], "pass");
  ASSERT_GE(j["divergences"].size(), 1u) << j.dump(2);
  // Cross-check each divergence against an independent greedy decode on ref: the reference
  // token at that step is ref's own choice, and the side's token is within the band.
  auto m = load_model(kStories);
  DeviceSpec spec{"ref", "", 1, ""};
  auto be = make_backend(spec);
  std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily wanted to",
                                      "Tom and his mom went to the park. They"};
  for (const auto& d : j["divergences"]) {
    EXPECT_EQ(d["class"], "near-tie");
    EXPECT_LE(d["deficit"].get<double>(), 0.5);
    EXPECT_GE(d["side_rank"].get<int>(), 2);
    int prompt = d["prompt"].get<int>() - 1, step = d["step"].get<int>();
    std::vector<int32_t> ids = m->tokenizer->encode(prompts[size_t(prompt)], true, false);
    Session s(*m, *be, int(ids.size()) + 48);
    Sampler greedy(SamplerParams{});
    GenerateResult g = generate(s, ids, step + 1, greedy, {}, nullptr);
    ASSERT_EQ(int(g.tokens.size()), step + 1);
    EXPECT_EQ(g.tokens.back(), d["ref_token"].get<int32_t>());
    EXPECT_NE(g.tokens.back(), d["side_token"].get<int32_t>());
  }
}

TEST(CliGate, LargeFaultIsADefect) {
  std::string p = prompts_file();
  CliResult r = run_cli("gate -m " + kStories + " --prompts " + p +
                        " -n 32 --runs 1 --sides ref,cpu+inject=op=down,layer=0,scale=3 -t 1 "
                        "--quiet");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("DEFECT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("VERDICT: fail"), std::string::npos) << r.out;
}

TEST(CliGate, ThreeSidesShowContestedSteps) {
  std::string p = prompts_file();
  CliResult r = run_cli("gate -m " + kStories + " --prompts " + p +
                        " -n 32 --runs 1 --sides ref,cpu,cpu+inject=op=down,layer=0,scale=3 -t 1 "
                        "--quiet");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("ref and cpu agree on"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cpu+inject=op=down,layer=0,scale=3 differs:"), std::string::npos) << r.out;
}

TEST(CliGate, BadInput) {
  std::string dir = temp_dir("gate-bad");
  std::string empty = dir + "/empty.txt";
  write_file(empty, "\n  \n");
  CliResult r =
      run_cli("gate -m " + kStories + " --prompts " + dir + "/missing.txt --sides ref,cpu");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("missing.txt: cannot open"), std::string::npos) << r.err;
  r = run_cli("gate -m " + kStories + " --prompts " + empty + " --sides ref,cpu");
  EXPECT_NE(r.err.find("no prompts"), std::string::npos) << r.err;
  std::string p = prompts_file();
  r = run_cli("gate -m " + kStories + " --prompts " + p + " --sides ref,gpu");
  EXPECT_NE(r.err.find("unknown device 'gpu'"), std::string::npos) << r.err;
  r = run_cli("gate -m " + kStories + " --prompts " + p + " --sides ref");
  EXPECT_NE(r.err.find("at least two sides"), std::string::npos) << r.err;
  r = run_cli("gate -m " + kStories + " --prompts " + p +
              " --sides ref,cpu --inject op=up,scale=2");
  EXPECT_NE(r.err.find("a fault belongs to one side"), std::string::npos) << r.err;
  r = run_cli("gate -m " + kStories + " --prompts " + p + " --sides ref,cpu --mix attn=f32");
  EXPECT_NE(r.err.find("--mix applies to cuda sides"), std::string::npos) << r.err;
  r = run_cli("gate -m " + kStories + " --prompts " + p + " --sides ref,cpu -n 0");
  EXPECT_NE(r.err.find("--n-tokens 0 is outside [1, "), std::string::npos) << r.err;
  r = run_cli("gate -m " + kStories + " --prompts " + p + " --sides ref,cpu --band -1");
  EXPECT_NE(r.err.find("--band"), std::string::npos) << r.err;
}

TEST(CliDrift, InjectedFaultNamedAndFilesWritten) {
  std::string dir = temp_dir("drift");
  CliResult r = run_cli("drift -m " + kStories + " --corpus " + kCorpus +
                        " --a ref --b cpu --inject op=up,layer=1,scale=1.05 --positions 24 -t 1"
                        " --tsv " +
                        dir + "/d.tsv --svg " + dir + "/d.svg");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("FIRST FLAGGED: up (op matmul, layer 1)"), std::string::npos) << r.out;
  std::string tsv = read_file(dir + "/d.tsv");
  size_t first = tsv.find("\tfirst\n");
  ASSERT_NE(first, std::string::npos) << tsv;
  size_t bol = tsv.rfind('\n', first) + 1;
  EXPECT_EQ(tsv.substr(bol, 5), "up\t1\t") << tsv.substr(bol, first - bol);
  EXPECT_EQ(read_file(dir + "/d.svg").rfind("<svg", 0), 0u);
  // Same fault through the side suffix, on the decode path.
  r = run_cli(
      "drift -m " + kTiny + " --corpus " + kCorpus +
      " --a ref --b cpu+inject=op=v,layer=1,scale=1.02 --positions 12 --width 1 -t 1 --json");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  nlohmann::json j = json_of(r);
  EXPECT_EQ(j["first_flagged"]["stage"], "v");
  EXPECT_EQ(j["first_flagged"]["layer"], 1);
  EXPECT_EQ(j["forwards"], 12);
}

TEST(CliDrift, NoFaultNothingFlagged) {
  for (const std::string& m : {kStories, kTiny}) {
    CliResult r =
        run_cli("drift -m " + m + " --corpus " + kCorpus + " --a ref --b cpu --positions 40 -t 1");
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("no stage over its bound"), std::string::npos) << r.out;
  }
}

TEST(CliDrift, BadInput) {
  CliResult r =
      run_cli("drift -m " + kStories + " --corpus " + kCorpus + " --a ref --b cpu --positions 0");
  EXPECT_NE(r.err.find("--positions 0 is outside [1, "), std::string::npos) << r.err;
  r = run_cli("drift -m " + kStories + " --corpus " + kCorpus +
              " --a ref --b cpu --positions 100000");
  EXPECT_NE(r.err.find("--positions 100000 passes the model's maximum of 2048 positions"), std::string::npos)
      << r.err;
  r = run_cli("drift -m " + kStories + " --corpus /nonexistent --a ref --b cpu");
  EXPECT_NE(r.err.find("/nonexistent: cannot open"), std::string::npos) << r.err;
  r = run_cli("drift -m " + kStories + " --corpus " + kCorpus + " --a ref --b cpu --device cpu");
  EXPECT_NE(r.err.find("--a and --b"), std::string::npos) << r.err;
  r = run_cli("drift -m " + kStories + " --corpus " + kCorpus + " --a ref --b cpu --mix attn=f32");
  EXPECT_NE(r.err.find("--mix applies to a cuda side"), std::string::npos) << r.err;
}

TEST(CliOpcheck, CpuPassesAndInjectedOpIsFlagged) {
  CliResult r = run_cli("opcheck -m " + kTiny + " --device cpu -t 1 --positions 32");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("OPCHECK: pass"), std::string::npos) << r.out;
  r = run_cli("opcheck -m " + kStories + " --device cpu -t 1 --positions 32 --corpus " + kCorpus +
              " --inject op=down,layer=2,scale=1.01 --json");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  nlohmann::json j = json_of(r);
  int flagged = 0;
  for (const auto& c : j["checks"])
    if (c["flagged"].get<bool>()) {
      ++flagged;
      EXPECT_EQ(c["op"], "matmul");
      EXPECT_EQ(c["stage"], "down");
      EXPECT_EQ(c["layer"], 2);
    }
  EXPECT_EQ(flagged, 1);
  EXPECT_EQ(j["verdict"], "fail");
}

TEST(CliOpcheck, MixIsRefusedNotIgnored) {
  CliResult r = run_cli("opcheck -m " + kStories + " --device cpu --mix attn=f32");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("only on the cuda tier"), std::string::npos) << r.err;
  r = run_cli("opcheck -m " + kStories + " --device cpu --mix attn=f64");
  EXPECT_NE(r.err.find("dtype 'f64'"), std::string::npos) << r.err;
  r = run_cli("generate -m " + kStories + " -p hi --device cpu --mix mlp=bf16");
  EXPECT_NE(r.err.find("only on the cuda tier"), std::string::npos) << r.err;
}

TEST(TraceMix, ExtraHeaderLineIsWrittenAndReadBack) {
  // The `# mix` line of an ablation trace (what --mix records), via the runner's extra header.
  auto m = load_model(kStories);
  DeviceSpec spec{"cpu", "", 1, ""};
  auto be = make_backend(spec);
  Session s(*m, *be, 8, 8);
  verify::TraceRunOptions opt;
  opt.shape.name = "custom";
  opt.shape.chunk_tokens = 4;
  opt.shape.max_chunks = 2;
  opt.corpus_path = kCorpus;
  opt.out_path = temp_dir("mix") + "/t.tsv";
  opt.progress = false;
  opt.extra_header = {{"mix", "attn=f32,mlp=bf16"}};
  verify::run_trace(s, opt, verify::load_trace_corpus(opt, *m));
  EXPECT_NE(read_file(opt.out_path).find("\n# mix\tattn=f32,mlp=bf16\n"), std::string::npos);
  verify::Trace t = verify::read_trace(opt.out_path);
  bool found = false;
  for (const auto& [k, v] : t.header.extra)
    if (k == "mix") found = v == "attn=f32,mlp=bf16";
  EXPECT_TRUE(found);
}
