// `matrix plan --slurm`: the text of the scripts it writes (one array per GPU count, one task
// per planned trace, --gres only where an arm runs on cuda, the report job after every array),
// submit.sh driven by a stand-in sbatch, and its refusals. A real Slurm runs the scripts in
// tests/matrix/slurm.sh (ctest matrix_slurm). To add a case: build a spec, plan it with
// all = true (no traces needed), and read the files matrix_slurm_scripts returns.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>

#include "matrix_test_util.h"
#include "verify/matrix/matrix_slurm.h"

using namespace arbiter;
namespace fs = std::filesystem;

namespace {

std::map<std::string, std::string> scripts(const verify::MatrixSpec& spec,
                                           const verify::MatrixRunOptions& opt,
                                           std::vector<verify::MatrixPlanLine>* lines = nullptr) {
  auto planned = verify::matrix_plan(spec, opt, true);
  std::map<std::string, std::string> files;
  for (auto& f : verify::matrix_slurm_scripts(spec, planned, opt)) files[f.name] = f.text;
  if (lines) *lines = planned;
  return files;
}

verify::MatrixRunOptions options(const std::string& dir) {
  verify::MatrixRunOptions opt;
  opt.out_dir = dir;
  opt.self_exe = ARBITER_CLI;
  opt.cwd = ARBITER_SOURCE_DIR;
  return opt;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

TEST(MatrixSlurm, DefaultSpecOneArrayPerGpuCount) {
  test::enter_source_dir();
  const std::string dir = test::temp_dir("slurm-default");
  verify::MatrixSpec spec = verify::parse_matrix_spec("matrix/default.toml");
  std::vector<verify::MatrixPlanLine> lines;
  auto files = scripts(spec, options(dir), &lines);
  ASSERT_EQ(files.size(), 4u);
  ASSERT_TRUE(files.count("traces-cpu.sbatch") && files.count("traces-gpu1.sbatch") &&
              files.count("report.sbatch") && files.count("submit.sh"));
  // 3 shapes x (ref, ref A/A, cpu) on the cpu array; 3 shapes x 3 cuda arms on the GPU one.
  const std::string& cpu = files["traces-cpu.sbatch"];
  const std::string& gpu = files["traces-gpu1.sbatch"];
  EXPECT_NE(cpu.find("\n#SBATCH --array=0-8\n"), std::string::npos) << cpu;
  EXPECT_NE(gpu.find("\n#SBATCH --array=0-8\n"), std::string::npos) << gpu;
  EXPECT_EQ(cpu.find("--gres"), std::string::npos) << cpu;
  EXPECT_NE(gpu.find("\n#SBATCH --gres=gpu:1\n"), std::string::npos) << gpu;
  EXPECT_EQ(count(cpu, " --device cuda"), 0u);
  EXPECT_EQ(count(gpu, " --device cuda"), 9u);
  // Task i of an array runs the plan's i-th line of that array, verbatim.
  int i_cpu = 0, i_gpu = 0;
  for (const auto& l : lines) {
    bool on_gpu = spec.arm(l.trace.arm).is_gpu();
    int i = on_gpu ? i_gpu++ : i_cpu++;
    EXPECT_NE((on_gpu ? gpu : cpu).find("\n  " + std::to_string(i) + ") " + l.command + " ;;\n"),
              std::string::npos)
        << l.command;
  }
  EXPECT_EQ(i_cpu, 9);
  EXPECT_EQ(i_gpu, 9);
  // Absolute log paths, one log per task; the job names say which matrix and which array.
  const std::string base = fs::path(dir).filename().string();
  EXPECT_NE(cpu.find("\n#SBATCH --output=" + dir + "/slurm/logs/%x-%A_%a.out\n"),
            std::string::npos)
      << cpu;
  EXPECT_NE(gpu.find("\n#SBATCH --job-name=arbiter-" + base + "-gpu1\n"), std::string::npos);
  // The report job judges DIR once both arrays have ended, whatever their exit.
  const std::string& report = files["report.sbatch"];
  EXPECT_NE(report.find(" matrix report " + dir + "\n"), std::string::npos) << report;
  EXPECT_EQ(report.find("--gres"), std::string::npos);
  const std::string& submit = files["submit.sh"];
  EXPECT_NE(submit.find("sbatch --parsable"), std::string::npos);
  EXPECT_LT(submit.find("traces-cpu.sbatch"), submit.find("traces-gpu1.sbatch"));
  EXPECT_NE(submit.find("submit report --dependency=afterany:$cpu:$gpu1 "), std::string::npos)
      << submit;
}

TEST(MatrixSlurm, CudaDeviceIndexAsksForEnoughGpus) {
  test::enter_source_dir();
  // cuda:1 opens the second GPU Slurm makes visible, so its tasks ask for two.
  auto spec = verify::parse_matrix_spec_text(
      test::small_spec("[\"cpu\", \"gpu0\", \"gpu1\"]",
                       "[arms.gpu0]\ndevice = \"cuda:0\"\n[arms.gpu1]\ndevice = \"cuda:1\"\n",
                       "[\"w1\"]", "w1 = 8"),
      "indexed.toml");
  EXPECT_EQ(verify::matrix_arm_gpus(spec.arm("ref")), 0);
  EXPECT_EQ(verify::matrix_arm_gpus(spec.arm("gpu0")), 1);
  EXPECT_EQ(verify::matrix_arm_gpus(spec.arm("gpu1")), 2);
  auto files = scripts(spec, options(test::temp_dir("slurm-indexed")));
  ASSERT_TRUE(files.count("traces-gpu2.sbatch"));
  const std::string& two = files["traces-gpu2.sbatch"];
  EXPECT_NE(two.find("\n#SBATCH --gres=gpu:2\n"), std::string::npos) << two;
  EXPECT_NE(two.find("\n#SBATCH --array=0-0\n"), std::string::npos) << two;
  EXPECT_NE(two.find("--device cuda:1 "), std::string::npos) << two;
  EXPECT_NE(files["traces-gpu1.sbatch"].find("--device cuda:0 "), std::string::npos);
  EXPECT_NE(files["traces-cpu.sbatch"].find("\n#SBATCH --array=0-2\n"), std::string::npos);
  EXPECT_NE(files["submit.sh"].find("--dependency=afterany:$cpu:$gpu1:$gpu2 "), std::string::npos);
}

TEST(MatrixSlurm, CliWritesScriptsThatSubmitInOrder) {
  test::enter_source_dir();
  const std::string dir = test::temp_dir("slurm-cli");
  auto r = test::run_cli("matrix plan matrix/default.toml -o " + dir + " --slurm");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string slurm = dir + "/slurm";
  EXPECT_EQ(r.out, slurm + "/submit.sh\n");
  EXPECT_TRUE(fs::is_directory(slurm + "/logs"));
  for (const char* f : {"traces-cpu.sbatch", "traces-gpu1.sbatch", "report.sbatch", "submit.sh"}) {
    ASSERT_EQ(std::system(("bash -n " + slurm + "/" + f).c_str()), 0) << f;
    EXPECT_NE(fs::status(slurm + "/" + f).permissions() & fs::perms::owner_exec, fs::perms::none);
  }
  // A stand-in sbatch on PATH: logs its arguments, answers like `sbatch --parsable` on a
  // multi-cluster site (JOBID;CLUSTER). Extra arguments of submit.sh reach every sbatch.
  const std::string bin = test::temp_dir("fake-sbatch");
  test::write_file(bin + "/sbatch",
                   "#!/bin/sh\necho \"$*\" >>" + bin + "/calls\n"
                   "n=$(wc -l <" + bin + "/calls)\necho \"$((100 + n));cluster\"\n");
  fs::permissions(bin + "/sbatch", fs::perms::owner_all);
  ASSERT_EQ(std::system(("PATH=" + bin + ":$PATH " + slurm + "/submit.sh --partition=p >" + bin +
                         "/out").c_str()),
            0);
  EXPECT_EQ(test::read_file(bin + "/calls"),
            "--parsable --partition=p " + slurm + "/traces-cpu.sbatch\n" +
            "--parsable --partition=p " + slurm + "/traces-gpu1.sbatch\n" +
            "--parsable --partition=p --dependency=afterany:101:102 " + slurm + "/report.sbatch\n");
  EXPECT_EQ(test::read_file(slurm + "/jobs.txt"), "traces-cpu\t101\ntraces-gpu1\t102\nreport\t103\n");
  EXPECT_NE(test::read_file(bin + "/out").find("report: " + dir + "/report.md once job 103"),
            std::string::npos);
  // An sbatch that fails cancels what this run submitted.
  test::write_file(bin + "/sbatch", "#!/bin/sh\ncase \"$*\" in *gpu1*) exit 1 ;; esac\necho 7\n");
  test::write_file(bin + "/scancel", "#!/bin/sh\necho \"$*\" >" + bin + "/cancelled\n");
  fs::permissions(bin + "/scancel", fs::perms::owner_all);
  EXPECT_NE(std::system(("PATH=" + bin + ":$PATH " + slurm + "/submit.sh 2>/dev/null").c_str()), 0);
  EXPECT_EQ(test::read_file(bin + "/cancelled"), "7\n");
}

TEST(MatrixSlurm, Refusals) {
  test::enter_source_dir();
  const std::string dir = test::temp_dir("slurm-done");
  const std::string spec = dir + ".toml";
  test::write_file(spec, test::small_spec("[\"cpu\"]", "", "[\"w1\"]", "w1 = 8"));
  ASSERT_EQ(test::run_cli("matrix run " + spec + " -o " + dir + " --quiet").exit_code, 0);
  auto done = test::run_cli("matrix plan " + spec + " -o " + dir + " --slurm");
  EXPECT_EQ(done.exit_code, 4);
  EXPECT_NE(done.err.find(spec + ": every trace is already valid in " + dir +
                          "/traces, nothing to submit"),
            std::string::npos)
      << done.err;
  EXPECT_FALSE(fs::exists(dir + "/slurm/submit.sh"));
  EXPECT_EQ(test::run_cli("matrix plan " + spec + " -o " + dir + " --slurm --all").exit_code, 0);

  const std::string spaced = test::temp_dir("slurm-space") + "/a b";
  auto space = test::run_cli("matrix plan " + spec + " -o '" + spaced + "' --slurm");
  EXPECT_EQ(space.exit_code, 4);
  EXPECT_NE(space.err.find(spaced + ": an #SBATCH --output line cannot hold this path"),
            std::string::npos)
      << space.err;
  EXPECT_NE(test::run_cli("matrix run " + spec + " -o " + dir + " --slurm").exit_code, 0);
}
