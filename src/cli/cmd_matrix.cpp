// arbiter matrix run|plan|gate|report: the correctness matrix (docs/matrix.md).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "cli/command.h"
#include "cli/common.h"
#include "core/error.h"
#include "verify/matrix/matrix_gate.h"
#include "verify/matrix/matrix_report.h"
#include "verify/matrix/matrix_run.h"
#include "verify/matrix/matrix_slurm.h"

namespace arbiter::cli {

static const char* kMatrixUsage =
    "usage: arbiter matrix run SPEC.toml -o DIR [--quiet]\n"
    "           run every missing trace (resumable), judge, write DIR/report.md, report.html,\n"
    "           results.json; exit code = worst verdict (0 pass, 1 fail, 2 inconclusive,\n"
    "           3 incomparable, 4 unreadable)\n"
    "       arbiter matrix plan SPEC.toml -o DIR [--all] [--slurm]\n"
    "           print one shell command per trace still missing (--all: every trace);\n"
    "           --slurm: write them as Slurm job arrays and a dependent report job into\n"
    "           DIR/slurm/ and print the path of the script that submits them\n"
    "       arbiter matrix gate SPEC.toml -o DIR [--model NAME] [--quiet]\n"
    "           run only the [gate] token gates still missing in DIR (a plan's gate line);\n"
    "           exit 0 when every gate file is there, 4 when a gate could not run\n"
    "       arbiter matrix report DIR | SPEC.toml DIR\n"
    "           rebuild the report from the traces on disk (the spec defaults to "
    "DIR/matrix.toml)\n";

// Markdown emphasis off, for the terminal.
static std::string plain(std::string s) {
  std::string o;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '`') continue;
    if (s.compare(i, 2, "**") == 0) {
      ++i;
      continue;
    }
    o += s[i];
  }
  return o;
}

static std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  ARB_CHECK(n > 0, "[matrix] cannot find this executable (/proc/self/exe)");
  return std::string(buf, size_t(n));
}

static int print_report(const verify::MatrixSpec& spec, const std::string& dir) {
  verify::MatrixResults r = verify::matrix_report(spec, dir);
  std::printf("report: %s (also %s, %s)\n", r.report_md.c_str(), r.report_html.c_str(),
              r.results_json.c_str());
  std::printf("question: %s\n", spec.question.c_str());
  std::printf("answer: %s\n\n", plain(r.answer).c_str());
  std::fputs(verify::format_matrix_summary(spec, r).c_str(), stdout);
  std::printf("\nVERDICT: %s (exit %d)\n", verify::verdict_name(r.worst), int(r.worst));
  return int(r.worst);
}

static int cmd_matrix(int argc, char** argv) {
  using namespace verify;
  if (argc < 1 || !std::strcmp(argv[0], "-h") || !std::strcmp(argv[0], "--help")) {
    std::fputs(kMatrixUsage, argc < 1 ? stderr : stdout);
    return argc < 1 ? 2 : 0;
  }
  const std::string sub = argv[0];
  // A spec or directory that cannot be used is unreadable input: exit 4, never a verdict.
  try {
    if (sub == "run" || sub == "plan") {
      Args a("matrix " + sub, {"-o|--out"}, {"--quiet", "--all", "--slurm"});
      a.parse(argc - 1, argv + 1);
      ARB_CHECK(a.positional().size() == 1, "[cli] matrix %s: expected SPEC.toml -o DIR",
                sub.c_str());
      ARB_CHECK(sub == "plan" || (!a.flag("all") && !a.flag("slurm")),
                "[cli] matrix run: --all and --slurm belong to plan");
      MatrixSpec spec = parse_matrix_spec(a.positional()[0]);
      MatrixRunOptions opt;
      opt.out_dir = a.str("out");
      opt.env = arbiter_env();
      opt.self_exe = self_exe();
      opt.cwd = std::filesystem::current_path().string();
      opt.progress = !a.flag("quiet");
      if (sub == "plan" && a.flag("slurm")) {
        std::printf("%s\n", matrix_slurm_plan(spec, opt, a.flag("all")).c_str());
        std::fprintf(stderr, "[matrix] submit with that script (its arguments go to every sbatch); "
                     "the report job writes %s/report.md\n", opt.out_dir.c_str());
        return 0;
      }
      if (sub == "plan") {
        for (const auto& line : matrix_plan(spec, opt, a.flag("all")))
          std::printf("%s\n", line.command.c_str());
        std::fprintf(stderr, "[matrix] then: arbiter matrix report %s\n", opt.out_dir.c_str());
        return 0;
      }
      matrix_run_traces(spec, opt);
      return print_report(spec, opt.out_dir);
    }
    if (sub == "gate") {
      Args a("matrix gate", {"-o|--out", "--model"}, {"--quiet"});
      a.parse(argc - 1, argv + 1);
      ARB_CHECK(a.positional().size() == 1, "[cli] matrix gate: expected SPEC.toml -o DIR");
      MatrixSpec spec = parse_matrix_spec(a.positional()[0]);
      ARB_CHECK(spec.has_gate, "[matrix] %s: no [gate] table", spec.path.c_str());
      MatrixRunOptions opt;
      opt.out_dir = a.str("out");
      opt.progress = !a.flag("quiet");
      matrix_prepare_dir(spec, opt.out_dir, false);
      // The verdict is the report's; this exit code says only whether every gate file exists.
      int rc = 0;
      for (const auto& g : matrix_run_gates(spec, opt, a.str("model", "")))
        if (g.status == MatrixTraceStatus::Failed || g.status == MatrixTraceStatus::Skipped) {
          std::fprintf(stderr, "arbiter matrix gate: %s: %s: %s\n", g.file.c_str(),
                       matrix_status_name(g.status), g.reason.c_str());
          rc = int(Verdict::Unreadable);
        }
      return rc;
    }
    if (sub == "report") {
      Args a("matrix report", {}, {});
      a.parse(argc - 1, argv + 1);
      const auto& p = a.positional();
      ARB_CHECK(p.size() == 1 || p.size() == 2,
                "[cli] matrix report: expected DIR or SPEC.toml DIR");
      std::string dir = p.back();
      std::string spec_path = p.size() == 2 ? p[0] : dir + "/" + kMatrixSpecCopy;
      return print_report(parse_matrix_spec(spec_path), dir);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "arbiter matrix %s: %s\n", sub.c_str(), e.what());
    return int(Verdict::Unreadable);
  }
  std::fprintf(stderr, "arbiter matrix: unknown subcommand '%s' (run, plan, gate, report)\n",
               sub.c_str());
  return 2;
}

REGISTER_COMMAND("matrix", "correctness matrix: run, plan, gate, report (models x shapes x arms)",
                 cmd_matrix);

}  // namespace arbiter::cli
