// Progress on stderr (core/progress.h) through the real binary, with stderr a pipe as in a
// CI log: every stderr line is timestamped as it arrives, and no gap between the start, the
// lines and the exit may pass kMaxGap (issue 32: synth was silent for 41 s, matrix run for
// 27.5 s on one trace). A pipe is not a terminal, so no '\r' may appear. To add a command:
// give check_progress its arguments and the words its periodic line holds.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "core/progress.h"
#include "matrix/matrix_test_util.h"  // enter_source_dir
#include "test_util.h"

using namespace arbiter;
namespace fs = std::filesystem;

namespace {

// Issue 32's "no gap over ~2 s" with slack for a loaded CI machine (lines are due every
// kProgressPlainInterval = 1 s, at the first update after it).
constexpr double kMaxGap = 2.5;

struct TimedRun {
  int exit_code = -1;
  std::string err;                                  // all of stderr, raw
  std::vector<std::pair<double, std::string>> lines;  // (seconds since start, line)
  double seconds = 0;                               // start to exit
};

// Runs `arbiter args...` with stdout to /dev/null and stderr to a pipe read as it comes.
TimedRun run_timed(const std::vector<std::string>& args) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    ::close(fds[1]);
    if (!freopen("/dev/null", "w", stdout)) ::_exit(126);
    std::vector<char*> argv = {const_cast<char*>(ARBITER_CLI)};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(ARBITER_CLI, argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  auto now = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  TimedRun r;
  std::string partial;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    const double t = now();
    r.err.append(buf, size_t(n));
    partial.append(buf, size_t(n));
    for (size_t nl; (nl = partial.find('\n')) != std::string::npos; partial.erase(0, nl + 1))
      r.lines.emplace_back(t, partial.substr(0, nl));
  }
  ::close(fds[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  r.seconds = now();
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// Checks the gaps and the absence of '\r'. Every meter ends with "[tag] done ... in T s"; a
// meter that ran T >= 2 intervals must have printed a periodic line (holding `periodic`) with
// the same tag, and at least one meter must have.
void check_progress(const std::vector<std::string>& args, const std::string& periodic) {
  std::string cmd;
  for (const auto& a : args) cmd += " " + a;
  const TimedRun r = run_timed(args);
  ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.err;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "a '\\r' in piped stderr:" << cmd;
  double last = 0, worst = 0;
  std::string where = "start";
  std::string log;
  for (const auto& [t, line] : r.lines) {
    log += std::to_string(t) + "  " + line + "\n";
    if (t - last > worst) worst = t - last, where = "before '" + line + "'";
    last = t;
  }
  if (r.seconds - last > worst) worst = r.seconds - last, where = "before the exit";
  EXPECT_LE(worst, kMaxGap) << cmd << ": " << worst << " s of silence " << where << "\n" << log;
  int meters = 0, long_meters = 0;
  for (const auto& [t, line] : r.lines) {
    const size_t done = line.find("] done "), in = line.rfind(" in ");
    if (done == std::string::npos || in == std::string::npos) continue;
    ++meters;
    const std::string tag = line.substr(0, done + 1);
    if (std::stod(line.substr(in + 4)) < 2 * kProgressPlainInterval) continue;
    ++long_meters;
    bool periodic_seen = false;
    for (const auto& [t2, l2] : r.lines)
      periodic_seen |= l2.rfind(tag, 0) == 0 && l2.find(periodic) != std::string::npos;
    EXPECT_TRUE(periodic_seen) << cmd << ": '" << line << "' without a periodic line\n" << log;
  }
  EXPECT_GE(meters, 1) << cmd << ": no meter's final line\n" << log;
  if (long_meters == 0)
    std::fprintf(stderr, "note: %s: no phase lasted %.0f s here, so no periodic line was due\n", cmd.c_str(),
                 2 * kProgressPlainInterval);
  std::fprintf(stderr, "%s: %.2f s, %zu lines, longest gap %.2f s\n", cmd.c_str(), r.seconds, r.lines.size(), worst);
}

}  // namespace

TEST(ProgressCli, SynthReportsBytesWithoutSilenceOrCarriageReturns) {
  const std::string out = test::temp_dir("progress-synth") + "/m";
  // The smallest preset past `tiny`: 151M bf16 weights (0.30 GB, mostly the embedding), 2-8 s
  // on the 2-core dev machine, long enough for periodic lines.
  check_progress({"synth", "--preset", "qwen2.5-0.5b", "--layers", "1", "--dtype", "bf16", "-t", "2", "-o", out},
                 "MB/s, ETA");
  fs::remove_all(out);
}

TEST(ProgressCli, MatrixRunReportsEachTraceWithoutSilence) {
  test::enter_source_dir();
  const std::string dir = test::temp_dir("progress-matrix");
  // w8 behind 512 tokens of context: each chunk is a 521-position forward, so the ref trace of
  // 16 chunks takes 3-5 s on the 2-core dev machine and needs periodic lines; the cpu one 1-2 s.
  test::write_file(dir + "/spec.toml",
                   "corpus = \"models/corpus/stories.txt\"\nmodels = [\"models/TinyStories-656K\"]\n"
                   "shapes = [\"w8\"]\nreference = \"ref\"\nallow_long_context = true\ncandidates = [\"cpu\"]\n"
                   "[chunks]\nw8 = 16\n[arms.ref]\ndevice = \"ref\"\n[arms.cpu]\ndevice = \"cpu\"\nthreads = 2\n");
  check_progress({"matrix", "run", dir + "/spec.toml", "-o", dir + "/out"}, "positions/s, ETA");
}
