// `arbiter matrix` end to end through the CLI: the shipped default matrix on the CPU arms
// (verdicts, files, checksums, SKIP lines for GPU arms without a GPU), an injected-fault
// arm that must fail while the others pass, plan -> run the printed commands -> report
// (including an arm whose environment needs a subprocess), ARBITER_REQUIRE_CUDA=1 turning a
// skipped GPU arm into a failure, bad input, the routing flips of a mixture-of-experts
// model in the report's cells and details, and a quantized model's two error terms.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "matrix_test_util.h"
#include "verify/trace/trace.h"

using namespace arbiter;
namespace fs = std::filesystem;

TEST(MatrixCli, DefaultMatrixOnCpuArms) {
  test::enter_source_dir();
  std::string dir = test::temp_dir("default-matrix");
  auto r = test::run_cli("matrix run matrix/default.toml -o " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // The output opens with the report's path.
  EXPECT_EQ(r.out.rfind("report: " + dir + "/report.md", 0), 0u) << r.out;
  std::printf("%s\n", r.out.substr(0, r.out.find("\n\n")).c_str());
  for (const char* f : {"report.md", "report.html", "results.json", "matrix.toml",
                        "traces/SHA256SUMS", "traces/METADATA.txt", "traces/RUNS.txt"})
    EXPECT_TRUE(fs::exists(dir + "/" + f)) << f;

  nlohmann::json j = test::read_json(dir + "/results.json");
  EXPECT_EQ(j["verdict"], "pass");
  for (const char* shape : {"w1", "w8", "w256"}) {
    SCOPED_TRACE(shape);
    auto cpu = test::comparison(j, shape, "cpu");
    ASSERT_FALSE(cpu.is_null());
    EXPECT_EQ(cpu["verdict"], "pass");
    EXPECT_EQ(cpu["noise_floor"], true);
    EXPECT_GT(cpu["result"]["top1"]["decided"].get<int>(), 0);
    auto aa = test::comparison(j, shape, "ref", true);
    ASSERT_FALSE(aa.is_null());
    EXPECT_EQ(aa["verdict"], "pass");
    EXPECT_EQ(aa["aa_identical"], true);
    for (const char* gpu : {"cuda-bf16", "cuda-f16", "cuda-f32"}) {
      auto g = test::comparison(j, shape, gpu);
      ASSERT_FALSE(g.is_null()) << gpu;
      // Without a GPU the arm is skipped, and a skipped arm is never a pass.
      if (g["state"] == "skipped")
        EXPECT_NE(g["verdict"], "pass") << gpu;
      else
        EXPECT_EQ(g["state"], "compared") << gpu;
    }
  }
  std::string md = test::read_file(dir + "/report.md");
  auto skipped = test::comparison(j, "w1", "cuda-bf16")["state"] == "skipped";
  if (skipped) {
    EXPECT_NE(md.find("SKIP"), std::string::npos);
    EXPECT_NE(md.find("Not tested here"), std::string::npos);
    // Three cuda arms at three shapes share one reason: stated once, not per row.
    const std::string why = test::comparison(j, "w1", "cuda-bf16")["why"];
    EXPECT_NE(md.find(why), std::string::npos) << why;
    EXPECT_EQ(md.find(why), md.rfind(why)) << why;
    EXPECT_NE(r.out.find("SKIP"), std::string::npos);
  }
  for (const char* section :
       {"**Question:**", "**Answer:** **Yes.**", "## Environment", "## Method", "## Results",
        "## Threshold sweep", "## Rank distribution", "## Controls and noise floor",
        "## Not like-for-like", "## Plots", "## Summary", "## Details",
        "plots/TinyStories-656K.w8.delta.svg", "plots/TinyStories-656K.w8.kl.svg",
        "plots/TinyStories-656K.w8.sweep.svg", "plots/TinyStories-656K.w8.nll.svg"})
    EXPECT_NE(md.find(section), std::string::npos) << section;

  // The store is sound: `sha256sum -c` and `arbiter store verify` both accept it.
  EXPECT_EQ(std::system(("cd " + dir + "/traces && sha256sum --quiet -c SHA256SUMS").c_str()), 0);
  EXPECT_EQ(test::run_cli("store verify " + dir + "/traces").exit_code, 0);

  // report DIR rebuilds the same verdicts from disk alone.
  auto again = test::run_cli("matrix report " + dir);
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(test::read_json(dir + "/results.json")["verdict"], "pass");
}

TEST(MatrixCli, InjectedFaultArmFailsOthersPass) {
  test::enter_source_dir();
  std::string dir = test::temp_dir("fault-matrix");
  std::string spec = dir + ".toml";
  test::write_file(spec, test::small_spec("[\"cpu\", \"cpu-bad\"]",
                                          "[arms.cpu-bad]\ndevice = \"cpu\"\nthreads = 2\n"
                                          "inject = \"op=down,layer=0,scale=10\"\n"));
  auto r = test::run_cli("matrix run " + spec + " -o " + dir + " --quiet");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  nlohmann::json j = test::read_json(dir + "/results.json");
  EXPECT_EQ(j["verdict"], "fail");
  for (const char* shape : {"w1", "w8"}) {
    SCOPED_TRACE(shape);
    EXPECT_EQ(test::comparison(j, shape, "cpu-bad")["verdict"], "fail");
    EXPECT_GT(
        test::comparison(j, shape, "cpu-bad")["result"]["top1"]["decided_disagree"].get<int>(), 0);
    EXPECT_EQ(test::comparison(j, shape, "cpu")["verdict"], "pass");
    EXPECT_EQ(test::comparison(j, shape, "ref", true)["verdict"], "pass");
  }
  std::string md = test::read_file(dir + "/report.md");
  EXPECT_NE(md.find("**Answer:** **No.**"), std::string::npos);
  EXPECT_NE(md.find("`cpu-bad` on TinyStories-656K w1"), std::string::npos);
  EXPECT_NE(md.find("a deliberate fault is injected"), std::string::npos);  // not like-for-like
  EXPECT_NE(md.find("capped"), std::string::npos);  // small_spec caps w1 and w8
  // One KL per row, the one the drift gate judged, labelled with its method; the answer
  // quotes the same number (not the top-k estimate, which differs).
  const nlohmann::json bad = test::comparison(j, "w1", "cpu-bad")["result"];
  ASSERT_EQ(bad["drift_gate"]["kl_method"], "shared_topk");
  const std::string gate_kl = strformat("%.3g nats (shared top-k)",
                                        bad["drift_gate"]["kl"]["mean"].get<double>());
  const std::string est_kl = strformat("%.3g", bad["kl"]["mean"]["mean"].get<double>());
  const std::string answer = j["answer"];
  EXPECT_NE(answer.find(gate_kl), std::string::npos) << gate_kl << "\n" << answer;
  ASSERT_NE(est_kl, strformat("%.3g", bad["drift_gate"]["kl"]["mean"].get<double>()));
  EXPECT_EQ(answer.find(est_kl), std::string::npos) << est_kl << "\n" << answer;
  std::string table = md.substr(md.find("## Results"));
  table = table.substr(0, table.find("\n## "));
  EXPECT_NE(table.find("| " + gate_kl + " |"), std::string::npos) << table;
  EXPECT_EQ(table.find("KL mean"), std::string::npos) << table;
  EXPECT_NE(r.out.find("VERDICT: fail (exit 1)"), std::string::npos) << r.out;

  // A file name is quoted, never read as Markdown or HTML (libcmark passes raw HTML).
  fs::copy_file(dir + "/traces/TinyStories-656K.w1.cpu.tsv", dir + "/traces/odd<b>name<i>*x*.tsv");
  auto again = test::run_cli("matrix report " + dir);
  EXPECT_EQ(again.exit_code, 4) << again.out << again.err;  // a problem with the files
  std::string html = test::read_file(dir + "/report.html");
  EXPECT_NE(html.find("odd&lt;b&gt;name&lt;i&gt;*x*.tsv"), std::string::npos);
  EXPECT_EQ(html.find("<b>name"), std::string::npos);
}

TEST(MatrixCli, RoutingFlipsInCellsAndDetails) {
  // tiny-qwen3-moe routes at layers 0 and 2; scale=-1 on layer 0's router logits reverses its
  // order, so every traced position flips there (16 of 32 pairs), decided where the
  // reference's margin is >= 0.01; the cpu arm keeps every route.
  test::enter_source_dir();
  const std::string dir = test::temp_dir("moe-matrix");
  const std::string spec = dir + ".toml";
  test::write_file(spec,
                   "corpus = \"models/corpus/stories.txt\"\n"
                   "models = [\"tests/fixtures/models/tiny-qwen3-moe\"]\n"
                   "shapes = [\"w1\"]\nreference = \"ref\"\n"
                   "candidates = [\"cpu\", \"cpu-router\"]\n[chunks]\nw1 = 16\n"
                   "[arms.ref]\ndevice = \"ref\"\n[arms.cpu]\ndevice = \"cpu\"\nthreads = 2\n"
                   "[arms.cpu-router]\ndevice = \"cpu\"\nthreads = 2\n"
                   "inject = \"op=router,layer=0,scale=-1\"\n");
  auto r = test::run_cli("matrix run " + spec + " -o " + dir + " --quiet");
  nlohmann::json j = test::read_json(dir + "/results.json");
  const nlohmann::json ok = test::comparison(j, "w1", "cpu")["result"]["routing_flips"];
  const nlohmann::json bad = test::comparison(j, "w1", "cpu-router")["result"]["routing_flips"];
  ASSERT_EQ(ok["compared"], true) << r.out << r.err;
  EXPECT_EQ(ok["decided"], 0);
  EXPECT_EQ(bad["pairs"], 32);
  EXPECT_EQ(bad["layers"][0]["flips"], 16);
  const int decided = bad["decided"].get<int>();
  EXPECT_GT(decided, 0);
  const std::string md = test::read_file(dir + "/report.md");
  EXPECT_NE(md.find(strformat("<br>routing flips %d (%d decided)", bad["flips"].get<int>(), decided)),
            std::string::npos) << md;
  EXPECT_NE(md.find("<br>routing flips 0 (0 decided)"), std::string::npos) << md;
  EXPECT_NE(md.find(strformat("routing flips %d of 32 (position, layer) pairs: %d decided (reference "
                              "softmax margin >= 0.01)",
                              bad["flips"].get<int>(), decided)),
            std::string::npos) << md;
}

TEST(MatrixCli, PlanCommandsThenReport) {
  test::enter_source_dir();
  std::string dir = test::temp_dir("plan-matrix");
  std::string spec = dir + ".toml";
  // cpu-scalar sets an environment variable: run in-process it could not be honoured, so
  // `matrix run` spawns `arbiter trace` for it, and the plan prefixes the variable.
  test::write_file(spec, test::small_spec("[\"cpu\", \"cpu-scalar\"]",
                                          "[arms.cpu-scalar]\ndevice = \"cpu\"\nthreads = 2\n"
                                          "env = { ARBITER_CPU_ISA = \"scalar\" }\n",
                                          "[\"w1\"]", "w1 = 24"));
  auto plan = test::run_cli("matrix plan " + spec + " -o " + dir);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  std::istringstream in(plan.out);
  int n = 0;
  for (std::string line; std::getline(in, line); ++n) {
    EXPECT_EQ(line.rfind("cd ", 0), 0u) << line;
    ASSERT_EQ(std::system(line.c_str()), 0) << line;
  }
  EXPECT_EQ(n, 4);  // ref, ref A/A, cpu, cpu-scalar
  EXPECT_NE(plan.out.find("ARBITER_CPU_ISA=scalar "), std::string::npos) << plan.out;
  // Nothing left to plan once every trace is on disk. A temporary file (a writer on another
  // host, say) is left alone by plan, and report refuses to judge while it is there.
  std::string tmp = dir + "/traces/TinyStories-656K.w1.cpu.tsv.tmp.999999999";
  test::write_file(tmp, "# arbiter-trace\t1\n");
  EXPECT_EQ(test::run_cli("matrix plan " + spec + " -o " + dir).out, "");
  EXPECT_TRUE(fs::exists(tmp));
  auto refused = test::run_cli("matrix report " + dir);
  EXPECT_EQ(refused.exit_code, 4);
  EXPECT_NE(refused.err.find(tmp + ": a trace is still being written"), std::string::npos) << refused.err;
  fs::remove(tmp);
  auto rep = test::run_cli("matrix report " + dir);
  EXPECT_EQ(rep.exit_code, 0) << rep.out << rep.err;
  nlohmann::json j = test::read_json(dir + "/results.json");
  EXPECT_EQ(test::comparison(j, "w1", "cpu-scalar")["verdict"], "pass");
  verify::Trace t = verify::read_trace(dir + "/traces/TinyStories-656K.w1.cpu-scalar.tsv");
  EXPECT_NE(std::find(t.header.env.begin(), t.header.env.end(), "ARBITER_CPU_ISA=scalar"),
            t.header.env.end());

  // `matrix run` keeps all four traces (their headers match) and agrees with the report.
  auto run = test::run_cli("matrix run " + spec + " -o " + dir);
  EXPECT_EQ(run.exit_code, 0) << run.err;
  size_t kept = 0;
  for (size_t at = 0; (at = run.err.find(": kept\n", at)) != std::string::npos; ++at) ++kept;
  EXPECT_EQ(kept, 4u) << run.err;
}

TEST(MatrixCli, EnvArmRunsAsSubprocess) {
  test::enter_source_dir();
  std::string dir = test::temp_dir("env-matrix");
  std::string spec = dir + ".toml";
  test::write_file(spec, test::small_spec("[\"cpu\", \"cpu-scalar\"]",
                                          "[arms.cpu-scalar]\ndevice = \"cpu\"\nthreads = 2\n"
                                          "env = { ARBITER_CPU_ISA = \"scalar\" }\n",
                                          "[\"w1\"]", "w1 = 24"));
  auto r = test::run_cli("matrix run " + spec + " -o " + dir);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  verify::Trace t = verify::read_trace(dir + "/traces/TinyStories-656K.w1.cpu-scalar.tsv");
  EXPECT_NE(std::find(t.header.env.begin(), t.header.env.end(), "ARBITER_CPU_ISA=scalar"),
            t.header.env.end());
  // The environment shows up as a like-for-like caveat.
  EXPECT_NE(test::read_file(dir + "/report.md").find("environment `ARBITER_CPU_ISA=scalar`"),
            std::string::npos);
}

TEST(MatrixCli, BadInputIsOneLineAndExit4) {
  test::enter_source_dir();
  std::string dir = test::temp_dir("bad-matrix");
  std::string spec = dir + "/bad.toml";
  test::write_file(spec, test::small_spec("[\"cpu\"]", "") + "surprise = true\n");
  auto r = test::run_cli("matrix run " + spec + " -o " + dir + "/out");
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_NE(r.err.find(spec), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("controls.surprise: unknown key"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(dir + "/out")) << "nothing may be written for a bad spec";

  auto rep = test::run_cli("matrix report " + dir + "/nowhere");
  EXPECT_EQ(rep.exit_code, 4);
  EXPECT_NE(rep.err.find(dir + "/nowhere/matrix.toml: cannot open"), std::string::npos) << rep.err;

  auto usage = test::run_cli("matrix frobnicate");
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_NE(usage.err.find("unknown subcommand 'frobnicate'"), std::string::npos);
}

TEST(MatrixCli, RequireCudaTurnsSkipIntoFailure) {
  test::enter_source_dir();
  std::string dir = test::temp_dir("require-cuda-matrix");
  std::string spec = dir + ".toml";
  test::write_file(spec, test::small_spec("[\"cpu\", \"gpu\"]", "[arms.gpu]\ndevice = \"cuda\"\n",
                                          "[\"w1\"]", "w1 = 8"));
  const char* saved = std::getenv("ARBITER_REQUIRE_CUDA");
  std::string restore = saved ? saved : "";
  ::unsetenv("ARBITER_REQUIRE_CUDA");
  auto r = test::run_cli("matrix run " + spec + " -o " + dir + " --quiet");
  nlohmann::json g = test::comparison(test::read_json(dir + "/results.json"), "w1", "gpu");
  if (g["state"] != "skipped") {
    if (saved) ::setenv("ARBITER_REQUIRE_CUDA", restore.c_str(), 1);
    GTEST_SKIP() << "a CUDA device is present: the gpu arm ran, nothing to skip";
  }
  // Skipped: visible, not counted, never a pass.
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(g["counted"], false);
  EXPECT_NE(g["verdict"], "pass");
  EXPECT_NE(r.out.find("SKIP"), std::string::npos) << r.out;
  // ARBITER_REQUIRE_CUDA=1 (the GPU machine's check) makes the same skip a failure.
  ::setenv("ARBITER_REQUIRE_CUDA", "1", 1);
  auto req = test::run_cli("matrix report " + dir);
  if (saved)
    ::setenv("ARBITER_REQUIRE_CUDA", restore.c_str(), 1);
  else
    ::unsetenv("ARBITER_REQUIRE_CUDA");
  EXPECT_EQ(req.exit_code, 1) << req.out << req.err;
  g = test::comparison(test::read_json(dir + "/results.json"), "w1", "gpu");
  EXPECT_EQ(g["verdict"], "fail");
  EXPECT_EQ(g["counted"], true);
  EXPECT_NE(g["why"].get<std::string>().find("ARBITER_REQUIRE_CUDA=1"), std::string::npos);
}

// A quantized model with its parent: the cpu arm is judged against ref on the same quantized
// weights (kernel error: rounding-sized), while the quantization error (ref on Q4_0 against ref
// on the f32 parent) is measured with llama-perplexity's statistics and never judged.
TEST(MatrixCli, QuantizedModelKeepsKernelAndQuantizationErrorApart) {
  test::enter_source_dir();
  const std::string dir = test::temp_dir("quant-matrix");
  const std::string q = dir + "-q4_0.gguf", parent = "models/stories260K/stories260K.gguf";
  auto qr = test::run_cli("quantize " + parent + " -o " + q + " --type Q4_0");
  ASSERT_EQ(qr.exit_code, 0) << qr.err;
  const std::string spec = dir + ".toml";
  test::write_file(spec, "corpus = \"models/corpus/stories.txt\"\nmodels = [\"" + q +
                             "\"]\nshapes = [\"w8\"]\nreference = \"ref\"\ncandidates = [\"cpu\"]\n"
                             "[parents]\n\"" + q + "\" = \"" + parent + "\"\n[chunks]\nw8 = 8\n"
                             "[arms.ref]\ndevice = \"ref\"\n[arms.cpu]\ndevice = \"cpu\"\n");
  auto r = test::run_cli("matrix run " + spec + " -o " + dir + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;  // the quantization error is not a failure
  nlohmann::json j = test::read_json(dir + "/results.json");
  const nlohmann::json kernel = test::comparison(j, "w8", "cpu")["result"];
  EXPECT_EQ(test::comparison(j, "w8", "cpu")["verdict"], "pass");
  ASSERT_EQ(j["quantization"].size(), 1u);
  const nlohmann::json& qe = j["quantization"][0];
  EXPECT_EQ(qe["parent"], parent);
  ASSERT_EQ(qe["state"], "compared") << qe.dump();
  const nlohmann::json k = qe["result"]["llama_perplexity"];
  ASSERT_TRUE(k.contains("kld")) << k.dump();
  EXPECT_EQ(k["rows"].get<int>(), 8 * 8);
  // Q4_0 moves the distribution by orders of magnitude more than the cpu tier's rounding.
  const double kld = k["kld"]["value"].get<double>();
  EXPECT_GT(kld, 1e-3);
  EXPECT_GT(kld, 1e3 * kernel["drift_gate"]["kl"]["mean"].get<double>());
  EXPECT_GT(k["same_top_p"]["value"].get<double>(), 0.3);
  EXPECT_LT(k["same_top_p"]["value"].get<double>(), 1.0);
  EXPECT_GT(k["rms_delta_p"]["value"].get<double>(), 0.0);
  EXPECT_FALSE(k["kld_percentiles"].empty());
  const std::string md = test::read_file(dir + "/report.md");
  EXPECT_NE(md.find("## Quantization error"), std::string::npos);
  EXPECT_NE(md.find("`" + parent + "`"), std::string::npos);
  EXPECT_NE(r.out.find("quantization error"), std::string::npos) << r.out;
  EXPECT_EQ(test::run_cli("store verify " + dir + "/traces").exit_code, 0);
}
