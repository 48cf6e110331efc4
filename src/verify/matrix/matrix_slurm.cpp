// Slurm scripts of `matrix plan --slurm`. Each trace command is the plan's own line (`cd CWD
// && ARBITER trace ... -o DIR/traces/FILE`), so a task does exactly what `parallel` would run;
// the scripts add only what Slurm needs: the array bounds, the GPUs, the log paths.
#include "verify/matrix/matrix_slurm.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "io/atomic_file.h"

namespace arbiter::verify {

namespace fs = std::filesystem;

namespace {

// DIR made absolute; refused when an #SBATCH line could not carry it (those lines are not
// shell: a path there cannot be quoted).
std::string slurm_out_dir(const std::string& dir) {
  fs::path p = fs::absolute(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "out/" -> "out"
  if (shell_quote(p.string()) != p.string())
    throw Error("[matrix] " + p.string() + ": an #SBATCH --output line cannot hold this path " +
                "(use letters, digits and _./:=,+-)");
  return p.string();
}

std::string array_name(int gpus) {
  return gpus == 0 ? "cpu" : "gpu" + std::to_string(gpus);
}

std::string array_script(const std::string& spec_path, const std::string& job,
                         const std::string& logs, int gpus,
                         const std::vector<const MatrixPlanLine*>& lines) {
  std::string s = "#!/bin/bash\n";
  s += "# arbiter matrix plan --slurm: " + std::to_string(lines.size()) + " job(s) of " +
       spec_path + ", array task i runs the i-th (docs/matrix.md, Slurm).\n";
  s += "#SBATCH --job-name=" + job + "\n";
  s += "#SBATCH --array=0-" + std::to_string(lines.size() - 1) + "\n";
  s += "#SBATCH --ntasks=1\n";
  if (gpus > 0) s += "#SBATCH --gres=gpu:" + std::to_string(gpus) + "\n";
  s += "#SBATCH --output=" + logs + "/%x-%A_%a.out\n";
  s += "# The log shows each command before it runs, so it names its trace.\n";
  s += "set -x\n";
  s += "case \"${SLURM_ARRAY_TASK_ID:?not a Slurm array task}\" in\n";
  for (size_t i = 0; i < lines.size(); ++i)
    s += "  " + std::to_string(i) + ") " + lines[i]->command + " ;;\n";
  s += "  *) echo \"no trace for array task $SLURM_ARRAY_TASK_ID (0-" +
       std::to_string(lines.size() - 1) + ")\" >&2; exit 2 ;;\n";
  s += "esac\n";
  return s;
}

}  // namespace

int matrix_arm_gpus(const MatrixArm& arm) {
  if (!arm.is_gpu()) return 0;
  if (arm.device == "cuda") return 1;
  return std::stoi(arm.device.substr(5)) + 1;  // "cuda:K", validated by the spec parser
}

std::vector<MatrixSlurmFile> matrix_slurm_scripts(const MatrixSpec& spec,
                                                  const std::vector<MatrixPlanLine>& lines,
                                                  const MatrixRunOptions& opt) {
  const std::string dir = slurm_out_dir(opt.out_dir);
  if (lines.empty())
    throw Error("[matrix] " + spec.path + ": every trace is already valid in " + dir +
                "/traces, nothing to submit (--all plans them again; arbiter matrix report " +
                dir + " judges them)");
  const std::string slurm = dir + "/" + kMatrixSlurmDir, logs = slurm + "/logs";
  const std::string prefix = "arbiter-" + fs::path(dir).filename().string() + "-";

  // A gate line runs every gate arm in one process: it needs the most GPUs any of them does.
  auto gpus_of = [&](const MatrixPlanLine& l) {
    if (l.gate.empty()) return matrix_arm_gpus(spec.arm(l.trace.arm));
    int n = 0;
    for (const auto& a : spec.gate.arms) n = std::max(n, matrix_arm_gpus(spec.arm(a)));
    return n;
  };
  std::map<int, std::vector<const MatrixPlanLine*>> by_gpus;
  for (const auto& l : lines) by_gpus[gpus_of(l)].push_back(&l);

  std::vector<MatrixSlurmFile> files;
  std::string submit =
      "#!/usr/bin/env bash\n"
      "# arbiter matrix plan --slurm: submits the trace arrays of " + spec.path + ", then the\n"
      "# report job once they have all ended, whatever their exit (afterany: a failed trace is\n"
      "# reported as missing, with its log in logs/). Arguments go to every sbatch\n"
      "# (--partition=P --account=A --time=T ...). Prints the job ids and keeps them in jobs.txt;\n"
      "# when an sbatch fails, the jobs this run already submitted are cancelled.\n"
      "set -euo pipefail\n"
      "here=" + slurm + "\n"
      "opts=(\"$@\")\n"
      "jobs=\"\"\n"
      ": >\"$here/jobs.txt\"\n"
      "submit() {  # NAME SBATCH-ARGS...: sets id\n"
      "  local name=\"$1\"\n"
      "  shift\n"
      "  if ! id=\"$(sbatch --parsable \"${opts[@]}\" \"$@\")\"; then\n"
      "    echo \"submit.sh: sbatch of $name failed${jobs:+, cancelling$jobs}\" >&2\n"
      "    [ -z \"$jobs\" ] || scancel $jobs\n"
      "    exit 1\n"
      "  fi\n"
      "  id=\"${id%%;*}\"  # --parsable prints JOBID or JOBID;CLUSTER\n"
      "  jobs=\"$jobs $id\"\n"
      "  printf '%s\\t%s\\n' \"$name\" \"$id\" | tee -a \"$here/jobs.txt\"\n"
      "}\n";
  std::string after = "afterany";
  for (const auto& [gpus, group] : by_gpus) {
    const std::string name = "traces-" + array_name(gpus);
    files.push_back({name + ".sbatch", array_script(spec.path, prefix + array_name(gpus), logs,
                                                    gpus, group)});
    submit += "submit " + name + " \"$here/" + name + ".sbatch\"\n";
    submit += array_name(gpus) + "=$id\n";
    after += ":$" + array_name(gpus);
  }
  submit += "submit report --dependency=" + after + " \"$here/report.sbatch\"\n";
  submit += "echo \"report: " + dir + "/report.md once job $id has ended (squeue -j $id)\"\n";
  files.push_back(
      {"report.sbatch",
       "#!/bin/bash\n"
       "# arbiter matrix plan --slurm: judges the traces in " + dir + " (docs/matrix.md, Slurm);\n"
       "# the job's exit code is the matrix's worst verdict.\n"
       "#SBATCH --job-name=" + prefix + "report\n"
       "#SBATCH --ntasks=1\n"
       "#SBATCH --output=" + logs + "/%x-%j.out\n"
       "set -x\n"
       "cd " + shell_quote(opt.cwd) + " && " + shell_quote(opt.self_exe) + " matrix report " +
           dir + "\n"});
  files.push_back({"submit.sh", submit});
  return files;
}

std::string matrix_slurm_plan(const MatrixSpec& spec, const MatrixRunOptions& opt, bool all) {
  const std::string slurm = slurm_out_dir(opt.out_dir) + "/" + kMatrixSlurmDir;
  const auto files = matrix_slurm_scripts(spec, matrix_plan(spec, opt, all), opt);
  std::error_code ec;
  fs::create_directories(slurm + "/logs", ec);
  if (ec) throw Error("[matrix] " + slurm + "/logs: cannot create (" + ec.message() + ")");
  // An array of an earlier plan (say a GPU array, now complete) must not look current.
  for (const auto& e : fs::directory_iterator(slurm)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("traces-", 0) == 0 && e.path().extension() == ".sbatch") fs::remove(e.path(), ec);
  }
  for (const auto& f : files) {
    write_file_atomic(slurm + "/" + f.name, f.text, "[matrix]");
    fs::permissions(slurm + "/" + f.name, fs::perms::owner_exec | fs::perms::group_exec,
                    fs::perm_options::add, ec);
  }
  return slurm + "/submit.sh";
}

}  // namespace arbiter::verify
