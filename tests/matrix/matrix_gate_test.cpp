// The matrix's token gate (verify/matrix/matrix_gate.h, docs/matrix.md "Token gate"): the
// [gate] table's defaults and refusals, and through the real CLI on stories260K (2 prompts,
// -n 8, one w1 shape of 8 chunks): an injected arm's defect named in the report and failing
// the matrix, a clean spec passing, resume keeping the gate file, a tampered or foreign gate
// file judged, not trusted, and with localize = true the injected stage named in the report.
// To add a refusal: one more row of GateSpec.BadValuesAreRefused.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "core/error.h"
#include "matrix_test_util.h"
#include "verify/matrix/matrix_slurm.h"
#include "verify/matrix/matrix_spec.h"

using namespace arbiter;
using namespace arbiter::verify;
namespace fs = std::filesystem;

namespace {

// A stories260K spec with arms ref, cpu and (when inject) an injected cpu arm, and a [gate]
// table holding gate_keys.
std::string gate_spec(bool inject, const std::string& gate_keys) {
  std::string s =
      "corpus = \"models/corpus/stories.txt\"\n"
      "models = [\"models/stories260K/stories260K.gguf\"]\n"
      "shapes = [\"w1\"]\n"
      "reference = \"ref\"\n"
      "candidates = [\"cpu\"" + std::string(inject ? ", \"inj\"" : "") + "]\n"
      "[chunks]\nw1 = 8\n"
      "[arms.ref]\ndevice = \"ref\"\n"
      "[arms.cpu]\ndevice = \"cpu\"\nthreads = 1\n";
  if (inject)
    s += "[arms.inj]\ndevice = \"cpu\"\nthreads = 1\ninject = \"op=down,layer=0,scale=3\"\n";
  return s + "[gate]\n" + gate_keys;
}

// Writes the spec and its prompts (two prompts, next to the spec) into a fresh directory.
std::string write_spec(const std::string& tag, const std::string& text) {
  const std::string dir = test::temp_dir(tag);
  fs::remove_all(dir);
  fs::create_directories(dir);
  test::write_file(dir + "/prompts.txt", "Once upon a time\nThe little dog\n");
  test::write_file(dir + "/spec.toml", text);
  return dir;
}

int64_t mtime_ns(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

std::string section(const std::string& report, const std::string& heading) {
  size_t a = report.find("## " + heading);
  if (a == std::string::npos) return "";
  size_t b = report.find("\n## ", a + 3);
  return report.substr(a, b == std::string::npos ? std::string::npos : b - a);
}

}  // namespace

TEST(GateSpec, DefaultsTakeEveryArmReferenceFirstAndResolvePromptsBesideTheSpec) {
  MatrixSpec s = parse_matrix_spec_text(gate_spec(true, "prompts = \"p/prompts.txt\"\n"),
                                        "specs/m.toml");
  ASSERT_TRUE(s.has_gate);
  EXPECT_EQ(s.gate.arms, (std::vector<std::string>{"ref", "cpu", "inj"}));
  EXPECT_EQ(s.gate.prompts_path, "specs/p/prompts.txt");
  EXPECT_EQ(s.gate.n_tokens, 32);
  EXPECT_EQ(s.gate.runs, 2);
  EXPECT_EQ(s.gate.band, 0.5);
  EXPECT_EQ(s.gate.threads, 1);
  EXPECT_FALSE(s.gate.localize);
  MatrixSpec t = parse_matrix_spec_text(
      gate_spec(true, "prompts = \"/abs/p.txt\"\nn = 8\nruns = 1\nband = 1\narms = [\"ref\", "
                      "\"inj\"]\nagainst = [\"rec\"]\nlocalize = true\n"),
      "specs/m.toml");
  EXPECT_EQ(t.gate.prompts_path, "/abs/p.txt");
  EXPECT_EQ(t.gate.arms, (std::vector<std::string>{"ref", "inj"}));
  EXPECT_EQ(t.gate.against_paths, (std::vector<std::string>{"specs/rec"}));
  EXPECT_EQ(t.gate.n_tokens, 8);
  EXPECT_EQ(t.gate.band, 1.0);
  EXPECT_TRUE(t.gate.localize);
  std::string without = gate_spec(false, "");
  without.resize(without.find("[gate]"));
  EXPECT_FALSE(parse_matrix_spec_text(without, "m.toml").has_gate);
}

TEST(GateSpec, BadValuesAreRefused) {
  const std::string env_arm =
      "[arms.envy]\ndevice = \"cpu\"\nthreads = 1\nenv = { ARBITER_X = \"1\" }\n";
  struct Case {
    std::string spec, want;
  } cases[] = {
      {gate_spec(false, "n = 8\n"), "gate.prompts: missing (required)"},
      {gate_spec(false, "prompts = \"\"\n"), "gate.prompts: must not be empty"},
      {gate_spec(false, "prompts = \"p\"\nn = 0\n"), "gate.n: must be in [1, 4096], got 0"},
      {gate_spec(false, "prompts = \"p\"\nruns = \"2\"\n"), "gate.runs: expected an integer"},
      {gate_spec(false, "prompts = \"p\"\nband = -1\n"), "gate.band: must be >= 0"},
      {gate_spec(false, "prompts = \"p\"\nbands = 1\n"), "gate.bands: unknown key"},
      {gate_spec(false, "prompts = \"p\"\narms = [\"ref\", \"gpu\"]\n"),
       "gate.arms: no arm named 'gpu'"},
      {gate_spec(false, "prompts = \"p\"\narms = [\"ref\", \"cpu\", \"cpu\"]\n"),
       "gate.arms: 'cpu' is listed twice"},
      {gate_spec(false, "prompts = \"p\"\narms = [\"cpu\", \"ref\"]\n"),
       "gate.arms: the first arm must be the reference 'ref'"},
      {gate_spec(false, "prompts = \"p\"\narms = [\"ref\"]\n"),
       "gate.arms: the gate needs a second side"},
      {gate_spec(false, "prompts = \"p\"\nagainst = [\"\"]\n"),
       "gate.against: an empty directory name"},
      {gate_spec(false, "prompts = \"p\"\nlocalize = 1\n"), "gate.localize: expected a boolean"},
  };
  for (const Case& c : cases) {
    try {
      parse_matrix_spec_text(c.spec, "m.toml");
      ADD_FAILURE() << "accepted, wanted: " << c.want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.want), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("[matrix] m.toml:", 0), 0u) << e.what();
    }
  }
  // Arms that one gate process cannot hold: the default list names them and says to list arms.
  std::string with_env = gate_spec(false, "prompts = \"p\"\n");
  with_env.insert(with_env.find("[gate]"), env_arm);
  with_env.replace(with_env.find("candidates = [\"cpu\"]"), 20, "candidates = [\"cpu\", \"envy\"]");
  try {
    parse_matrix_spec_text(with_env, "m.toml");
    ADD_FAILURE() << "an env arm accepted as a gate side";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gate.arms: arm 'envy' sets environment variables"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("list the arms"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(parse_matrix_spec_text(with_env + "arms = [\"ref\", \"cpu\"]\n", "m.toml"));
  std::string threads = with_env + "arms = [\"ref\", \"cpu\", \"other\"]\n";
  threads.insert(threads.find("[gate]"), "[arms.other]\ndevice = \"cpu\"\nthreads = 2\n");
  threads.replace(threads.find("\"envy\"]"), 7, "\"envy\", \"other\"]");
  try {
    parse_matrix_spec_text(threads, "m.toml");
    ADD_FAILURE() << "cpu arms with different threads accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ask for different threads"), std::string::npos)
        << e.what();
  }
}

TEST(MatrixGateCli, InjectedArmDefectFailsTheMatrixAndResumeKeepsTheGate) {
  test::enter_source_dir();
  const std::string dir =
      write_spec("mgate-inj", gate_spec(true, "prompts = \"prompts.txt\"\nn = 8\n"));
  const std::string out = dir + "/out";
  test::CliResult r = test::run_cli("matrix run " + dir + "/spec.toml -o " + out);
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("gate 1/1 gate-stories260K.json: ran"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("token gate on stories260K: inj 1 defect(s)"), std::string::npos) << r.out;

  const std::string report = section(test::read_file(out + "/report.md"), "Token gate");
  ASSERT_FALSE(report.empty());
  EXPECT_NE(report.find("**Verdict:** FAIL"), std::string::npos) << report;
  EXPECT_NE(report.find("| `inj` | cpu f32 | op=down,layer=0,scale=3 | yes |"), std::string::npos)
      << report;
  EXPECT_NE(report.find("FAIL defect"), std::string::npos) << report;
  EXPECT_NE(report.find("side inj wrong (alone against ref and cpu, which agree)"),
            std::string::npos) << report;
  EXPECT_NE(report.find("| `cpu` | cpu f32 | none | yes | 0/2 | 0 | 0 |"), std::string::npos)
      << report;

  nlohmann::json res = test::read_json(out + "/results.json");
  ASSERT_EQ(res["gates"].size(), 1u);
  EXPECT_EQ(res["gates"][0]["verdict"], "fail");
  EXPECT_EQ(res["verdict"], "fail");
  int defects_inj = -1, defects_cpu = -1;
  for (const auto& s : res["gates"][0]["gate"]["sides"]) {
    if (s["side"] == "inj") defects_inj = s["defects"];
    if (s["side"] == "cpu") defects_cpu = s["defects"];
  }
  EXPECT_GE(defects_inj, 1);
  EXPECT_EQ(defects_cpu, 0);
  EXPECT_EQ(res["gates"][0]["resolution"][0]["class"], "wrong");
  EXPECT_EQ(res["gates"][0]["resolution"][0]["sides"][0], "inj");

  // Resume: the gate file is kept as it is; `matrix report DIR` (the spec's copy) shows it.
  const std::string gate = out + "/gate-stories260K.json";
  const int64_t before = mtime_ns(gate);
  r = test::run_cli("matrix run " + dir + "/spec.toml -o " + out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("gate 1/1 gate-stories260K.json: kept"), std::string::npos) << r.err;
  EXPECT_EQ(mtime_ns(gate), before);
  r = test::run_cli("matrix report " + out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(section(test::read_file(out + "/report.md"), "Token gate").find("FAIL defect"),
            std::string::npos);

  // Other prompt bytes: the kept file no longer answers the spec and is redone.
  test::write_file(dir + "/prompts.txt", "Once upon a time\nA big cat\n");
  r = test::run_cli("matrix run " + dir + "/spec.toml -o " + out);
  EXPECT_NE(r.err.find("gate 1/1 gate-stories260K.json: redo: its prompts sha256"),
            std::string::npos) << r.err;

  // A gate file that is not one, or that asks for something else, is judged, never trusted.
  test::write_file(gate, "{\"format\": \"arbiter-matrix-gate\"");
  r = test::run_cli("matrix report " + out);
  EXPECT_EQ(r.exit_code, 4) << r.out;
  EXPECT_NE(section(test::read_file(out + "/report.md"), "Token gate")
                .find("gate-stories260K.json: not a matrix gate file"),
            std::string::npos);
}

TEST(MatrixGateCli, CleanSpecPassesAndAForeignGateFileIsIncomparable) {
  test::enter_source_dir();
  const std::string dir =
      write_spec("mgate-clean", gate_spec(false, "prompts = \"prompts.txt\"\nn = 8\nruns = 1\n"));
  const std::string out = dir + "/out";
  test::CliResult r = test::run_cli("matrix run " + dir + "/spec.toml -o " + out);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string report = section(test::read_file(out + "/report.md"), "Token gate");
  EXPECT_NE(report.find("**Verdict:** PASS"), std::string::npos) << report;
  EXPECT_NE(report.find("No divergence"), std::string::npos) << report;
  EXPECT_EQ(test::read_json(out + "/results.json")["gates"][0]["verdict"], "pass");
  EXPECT_NE(r.out.find("The token gate passed on every model."), std::string::npos) << r.out;

  // The same directory judged under a spec asking for more tokens: the file answers another
  // question (incomparable), and a missing gate file leaves the matrix without an answer.
  const std::string other = dir + "/other.toml";
  test::write_file(other, gate_spec(false, "prompts = \"prompts.txt\"\nn = 9\nruns = 1\n"));
  r = test::run_cli("matrix report " + other + " " + out);
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_NE(test::read_file(out + "/report.md").find("its n is 8, the spec asks for 9"),
            std::string::npos);
  fs::remove(out + "/gate-stories260K.json");
  r = test::run_cli("matrix report " + out);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("token gate on stories260K: inconclusive — not run"), std::string::npos)
      << r.out;
}

// A gate that cannot run (its prompts file is missing) is a run-status line, and the matrix
// says unreadable naming the file, not pass.
TEST(MatrixGateCli, AGateThatCannotRunMakesTheMatrixUnreadable) {
  test::enter_source_dir();
  const std::string dir =
      write_spec("mgate-noprompts", gate_spec(false, "prompts = \"absent.txt\"\nn = 8\n"));
  test::CliResult r = test::run_cli("matrix run " + dir + "/spec.toml -o " + dir + "/out");
  EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
  EXPECT_NE(r.out.find("token gate on stories260K: unreadable — the gate failed: [gate] " + dir +
                       "/absent.txt: cannot open"),
            std::string::npos) << r.out;
  EXPECT_NE(test::read_file(dir + "/out/run-status.tsv").find("gate-stories260K.json\tfailed\t"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir + "/out/gate-stories260K.json"));
}

// The traces of ref and cpu pass; the only failure is a recorded injected leg (gate --record
// elsewhere, `against` here), so the matrix fails through its gate alone.
TEST(MatrixGateCli, AgainstAnInjectedRecordFailsTheMatrixThroughTheGateAlone) {
  test::enter_source_dir();
  const std::string dir = write_spec(
      "mgate-against", gate_spec(false, "prompts = \"prompts.txt\"\nn = 8\nagainst = [\"rec\"]\n"));
  test::CliResult r = test::run_cli(
      "gate -m models/stories260K/stories260K.gguf --prompts " + dir +
      "/prompts.txt -n 8 --runs 2 --sides cpu+inject=op=down,layer=0,scale=3 --record " + dir +
      "/rec -t 1 --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string out = dir + "/out";
  r = test::run_cli("matrix run " + dir + "/spec.toml -o " + out);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  nlohmann::json res = test::read_json(out + "/results.json");
  for (const auto& c : res["comparisons"]) EXPECT_EQ(c["verdict"], "pass") << c.dump();
  EXPECT_EQ(res["gates"][0]["verdict"], "fail");
  EXPECT_EQ(res["verdict"], "fail");
  const std::string report = section(test::read_file(out + "/report.md"), "Token gate");
  EXPECT_NE(report.find("(recorded)"), std::string::npos) << report;
  EXPECT_NE(report.find("FAIL defect"), std::string::npos) << report;
  EXPECT_NE(test::read_file(out + "/report.md").find("**Answer:** **No.**"), std::string::npos);
}

// [gate] localize = true: the gate file keeps each divergence's localization, the report's
// Token gate section names the stage the injection made wrong (down, layer 1), results.json
// carries it, toggling the key redoes the gate, and a malformed localization is refused in one
// line. The injection sits on layer 1 so that the layer is the localization's, not a default.
TEST(MatrixGateCli, LocalizeNamesTheInjectedStageAndTogglingItRedoesTheGate) {
  test::enter_source_dir();
  std::string text = gate_spec(true, "prompts = \"prompts.txt\"\nn = 8\nruns = 1\narms = "
                                     "[\"ref\", \"inj\"]\nlocalize = true\n");
  text.replace(text.find("layer=0"), 7, "layer=1");
  const std::string dir = write_spec("mgate-localize", text);
  const std::string out = dir + "/out";
  test::CliResult r = test::run_cli("matrix run " + dir + "/spec.toml -o " + out);
  ASSERT_EQ(r.exit_code, 1) << r.out << r.err;

  nlohmann::json res = test::read_json(out + "/results.json");
  const nlohmann::json& loc = res["gates"][0]["localize"];
  ASSERT_GE(loc["divergences"].size(), 1u) << res["gates"][0].dump();
  for (const auto& d : loc["divergences"]) {
    EXPECT_EQ(d["side"], "inj");
    EXPECT_EQ(d["class"], "localized defect") << d.dump();
    EXPECT_EQ(d["drift"]["first_flagged"]["layer"], 1) << d.dump();
    EXPECT_EQ(d["drift"]["first_flagged"]["stage"], "down") << d.dump();
    EXPECT_EQ(d["drift"]["first_flagged"]["op"], "matmul") << d.dump();
    EXPECT_EQ(d["ref_top"].size(), 5u);
    EXPECT_EQ(d["side_top"].size(), 5u);
  }
  const std::string report = section(test::read_file(out + "/report.md"), "Token gate");
  EXPECT_NE(report.find("**Localization**"), std::string::npos) << report;
  EXPECT_NE(report.find("**FAIL localized defect**. First stage over its bound: "),
            std::string::npos) << report;
  EXPECT_NE(report.find("`down` (op `matmul`, layer 1)"), std::string::npos) << report;
  EXPECT_NE(report.find("| rank | reference `ref` | logit | side `inj` | logit |"),
            std::string::npos) << report;
  EXPECT_NE(report.find("\n| 5 | `"), std::string::npos) << report;
  // A localized defect is the gate's defect already: the answer names no unexplained one.
  EXPECT_EQ(r.out.find("unexplained"), std::string::npos) << r.out;

  // The same spec without localize asks another question: the gate is redone, without it.
  const std::string gate = out + "/gate-stories260K.json";
  text.replace(text.find("localize = true"), 15, "localize = false");
  test::write_file(dir + "/spec.toml", text);
  r = test::run_cli("matrix run " + dir + "/spec.toml -o " + out);
  EXPECT_NE(r.err.find("gate 1/1 gate-stories260K.json: redo: its localize is true, the spec "
                       "asks for false"),
            std::string::npos) << r.err;
  EXPECT_FALSE(test::read_json(gate).contains("localize"));
  EXPECT_EQ(section(test::read_file(out + "/report.md"), "Token gate").find("**Localization**"),
            std::string::npos);

  // Back to localize = true: the plan's gate job (what Slurm runs) redoes it, localized.
  text.replace(text.find("localize = false"), 16, "localize = true");
  test::write_file(dir + "/spec.toml", text);
  r = test::run_cli("matrix plan " + dir + "/spec.toml -o " + out);
  const std::string gate_job = "matrix gate " + dir + "/spec.toml -o " + out +
                               " --model stories260K";
  ASSERT_NE(r.out.find(" " + gate_job + " --quiet\n"), std::string::npos) << r.out;
  r = test::run_cli(gate_job);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("redo: its localize is false, the spec asks for true"), std::string::npos)
      << r.err;
  nlohmann::json f = test::read_json(gate);
  ASSERT_GE(f["localize"]["divergences"].size(), 1u);

  // An unexplained divergence (no stage over its bound) is named in the answer; a piece with
  // a backtick and a pipe stays one code span in one table cell.
  nlohmann::json& d0 = f["localize"]["divergences"][0];
  d0["class"] = "unexplained";
  d0["drift"]["first_flagged"] = nullptr;
  d0["ref_top"][0]["piece"] = "a`|b";
  const std::string where = "stories260K `inj` prompt " + d0["prompt"].dump() + " step " +
                            d0["step"].dump();
  const int32_t id = d0["ref_top"][0]["id"];
  test::write_file(gate, f.dump());
  r = test::run_cli("matrix report " + out);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  const std::string md = test::read_file(out + "/report.md");
  EXPECT_NE(md.find("**Token gate, unexplained:** 1 divergence(s) (" + where + ") cost more "
                    "than the band with no stage over its bound"),
            std::string::npos) << md;
  EXPECT_NE(md.find("**FAIL unexplained**. First stage over its bound: none;"),
            std::string::npos) << md;
  EXPECT_NE(md.find("| 1 | ``'a`\\|b'(" + std::to_string(id) + ")`` |"), std::string::npos) << md;
  EXPECT_NE(test::read_file(out + "/report.html")
                .find("<td><code>'a`|b'(" + std::to_string(id) + ")</code></td>"),
            std::string::npos);

  d0["class"] = "bad luck";
  test::write_file(gate, f.dump());
  r = test::run_cli("matrix report " + out);
  EXPECT_EQ(r.exit_code, 4) << r.out;
  EXPECT_NE(section(test::read_file(out + "/report.md"), "Token gate")
                .find("**Verdict:** UNREADABLE — [matrix] " + gate +
                      ": not a matrix gate file (localize class \"bad luck\")\n"),
            std::string::npos);
}

// plan: one `matrix gate` line per model after the traces, run by the shell like the trace
// lines, then left out once its file is valid; under Slurm it joins the array of the most GPUs
// any gate arm needs.
TEST(MatrixGatePlan, OneGateLinePerModelThatTheShellRunsAndSlurmPlacesByGpus) {
  test::enter_source_dir();
  const std::string dir =
      write_spec("mgate-plan", gate_spec(false, "prompts = \"prompts.txt\"\nn = 8\nruns = 1\n"));
  const std::string out = dir + "/out";
  test::CliResult r = test::run_cli("matrix plan " + dir + "/spec.toml -o " + out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string gate_line = " matrix gate " + dir + "/spec.toml -o " + out +
                                " --model stories260K --quiet";
  ASSERT_NE(r.out.find(gate_line + "\n"), std::string::npos) << r.out;
  test::write_file(dir + "/plan.sh", r.out);
  ASSERT_EQ(std::system(("bash -e " + dir + "/plan.sh").c_str()), 0);
  r = test::run_cli("matrix plan " + dir + "/spec.toml -o " + out);
  EXPECT_EQ(r.out.find(" matrix gate "), std::string::npos) << r.out;
  r = test::run_cli("matrix report " + out);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(test::read_json(out + "/results.json")["gates"][0]["verdict"], "pass");

  std::string gpu_spec = gate_spec(false, "prompts = \"prompts.txt\"\n");
  gpu_spec.insert(gpu_spec.find("[gate]"), "[arms.gpu]\ndevice = \"cuda:1\"\n");
  gpu_spec.replace(gpu_spec.find("[\"cpu\"]"), 7, "[\"cpu\", \"gpu\"]");
  test::write_file(dir + "/gpu.toml", gpu_spec);
  verify::MatrixSpec spec = verify::parse_matrix_spec(dir + "/gpu.toml");
  verify::MatrixRunOptions opt;
  opt.out_dir = dir + "/gpu-out";
  opt.self_exe = ARBITER_CLI;
  opt.cwd = ARBITER_SOURCE_DIR;
  std::map<std::string, std::string> files;
  for (auto& f : verify::matrix_slurm_scripts(spec, verify::matrix_plan(spec, opt, true), opt))
    files[f.name] = f.text;
  ASSERT_TRUE(files.count("traces-gpu2.sbatch"));
  EXPECT_NE(files["traces-gpu2.sbatch"].find(" matrix gate "), std::string::npos);
  EXPECT_EQ(files["traces-cpu.sbatch"].find(" matrix gate "), std::string::npos);
}

// Without a GPU a gate with a cuda arm is skipped like the arm's traces: SKIP in its section
// and in the answer, not counted, never "passed"; ARBITER_REQUIRE_CUDA=1 makes it a failure.
TEST(MatrixGateCli, CudaArmWithoutGpuSkipsTheGate) {
  test::enter_source_dir();
  std::string text = gate_spec(false, "prompts = \"prompts.txt\"\nn = 8\nruns = 1\n");
  text.insert(text.find("[gate]"), "[arms.gpu]\ndevice = \"cuda\"\n");
  text.replace(text.find("[\"cpu\"]"), 7, "[\"cpu\", \"gpu\"]");
  const std::string dir = write_spec("mgate-gpu", text);
  const std::string out = dir + "/out";
  const char* saved = std::getenv("ARBITER_REQUIRE_CUDA");
  const std::string restore = saved ? saved : "";
  auto put_back = [&] {
    if (saved)
      ::setenv("ARBITER_REQUIRE_CUDA", restore.c_str(), 1);
    else
      ::unsetenv("ARBITER_REQUIRE_CUDA");
  };
  ::unsetenv("ARBITER_REQUIRE_CUDA");
  test::CliResult r = test::run_cli("matrix run " + dir + "/spec.toml -o " + out);
  if (r.err.find("gate-stories260K.json: SKIP") == std::string::npos) {
    put_back();
    GTEST_SKIP() << "SKIP: a CUDA device is here, the gate ran (" << r.exit_code << ")";
  }
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Token gate not run here: stories260K — SKIP"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("The token gate passed"), std::string::npos) << r.out;
  EXPECT_NE(section(test::read_file(out + "/report.md"), "Token gate")
                .find("**Verdict:** SKIP (not counted)"),
            std::string::npos);
  nlohmann::json g = test::read_json(out + "/results.json")["gates"][0];
  EXPECT_EQ(g["state"], "skipped");
  EXPECT_EQ(g["counted"], false);
  ::setenv("ARBITER_REQUIRE_CUDA", "1", 1);
  r = test::run_cli("matrix report " + out);
  put_back();
  EXPECT_EQ(r.exit_code, 1) << r.out;
  g = test::read_json(out + "/results.json")["gates"][0];
  EXPECT_EQ(g["verdict"], "fail");
  EXPECT_EQ(g["counted"], true);
}
