// Resumability of `arbiter matrix run`: a run killed with SIGKILL mid-way resumes without
// redoing the traces it finished (same inode and mtime) and without accepting anything
// partial; a stale temporary file of a dead writer is removed; a cut-off trace and a trace
// whose header asks for something else (another inject) are redone.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <thread>

#include "matrix_test_util.h"
#include "verify/trace/trace.h"

using namespace arbiter;
namespace fs = std::filesystem;

namespace {

struct Stamp {
  ino_t inode = 0;
  int64_t mtime_ns = 0;
  bool operator==(const Stamp& o) const { return inode == o.inode && mtime_ns == o.mtime_ns; }
};

std::map<std::string, Stamp> stamps(const std::string& tdir) {
  std::map<std::string, Stamp> out;
  for (const auto& e : fs::directory_iterator(tdir)) {
    std::string name = e.path().filename().string();
    if (name.size() < 4 || name.substr(name.size() - 4) != ".tsv") continue;
    struct stat st;
    if (::stat(e.path().c_str(), &st) == 0)
      out[name] = {st.st_ino, int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
  }
  return out;
}

// A process id that is certainly not running: a child that has already been reaped.
pid_t dead_pid() {
  pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  int st;
  ::waitpid(p, &st, 0);
  return p;
}

}  // namespace

TEST(MatrixResume, KilledRunResumesWithoutRedoingFinishedTraces) {
  test::enter_source_dir();
  std::string dir = test::temp_dir("resume-matrix");
  std::string spec = dir + ".toml";
  // Six traces: w1 {ref, ref A/A, cpu} are quick, w8 {ref, ...} takes a few seconds on ref.
  test::write_file(spec, test::small_spec("[\"cpu\"]", "", "[\"w1\", \"w8\"]", "w1 = 32\nw8 = 12"));
  const std::string tdir = dir + "/traces";

  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
    ::execl(ARBITER_CLI, ARBITER_CLI, "matrix", "run", spec.c_str(), "-o", dir.c_str(),
            (char*)nullptr);
    ::_exit(127);
  }
  // Kill it as soon as the first trace is complete: the run is then inside a later trace.
  auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(tdir + "/TinyStories-656K.w1.ref.tsv") &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  int st;
  ::waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFSIGNALED(st)) << "the run finished before it could be killed";
  EXPECT_FALSE(fs::exists(dir + "/report.md")) << "a killed run must not leave a report";

  // Every trace file present is complete; remember them.
  std::map<std::string, Stamp> before = stamps(tdir);
  ASSERT_GE(before.size(), 1u);
  for (const auto& [name, s] : before)
    EXPECT_NO_THROW(verify::read_trace(tdir + "/" + name)) << name;
  ASSERT_LT(before.size(), 6u) << "killed too late to test resuming";

  // Leftovers a crash can leave: a dead writer's temporary file, a cut-off copy of a trace
  // under the name of one not finished yet.
  std::string stale = tdir + "/TinyStories-656K.w8.cpu.tsv.tmp." + std::to_string(dead_pid());
  test::write_file(stale, "# arbiter-trace\t1\n");
  std::string cut_name = "TinyStories-656K.w8.cpu.tsv";
  ASSERT_FALSE(before.count(cut_name));
  std::string whole = test::read_file(tdir + "/TinyStories-656K.w1.ref.tsv");
  test::write_file(tdir + "/" + cut_name, whole.substr(0, whole.rfind("# end")));

  auto r = test::run_cli("matrix run " + spec + " -o " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::map<std::string, Stamp> after = stamps(tdir);
  EXPECT_EQ(after.size(), 6u);
  for (const auto& [name, s] : before) {
    EXPECT_EQ(after[name], s) << name << " was redone";
    EXPECT_NE(r.err.find(name + ": kept"), std::string::npos) << r.err;
  }
  EXPECT_NE(r.err.find(cut_name + ": redo: [trace]"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(stale));
  for (const auto& [name, s] : after)
    EXPECT_NO_THROW(verify::read_trace(tdir + "/" + name)) << name;
  EXPECT_EQ(test::read_json(dir + "/results.json")["verdict"], "pass");
  EXPECT_EQ(test::run_cli("store verify " + tdir).exit_code, 0);
}

TEST(MatrixResume, TraceWithWrongHeaderIsRedone) {
  test::enter_source_dir();
  std::string dir = test::temp_dir("header-matrix");
  std::string spec = dir + ".toml";
  test::write_file(spec, test::small_spec("[\"cpu\"]", "", "[\"w1\"]", "w1 = 16"));
  ASSERT_EQ(test::run_cli("matrix run " + spec + " -o " + dir + " --quiet").exit_code, 0);
  const std::string cpu = dir + "/traces/TinyStories-656K.w1.cpu.tsv";
  std::map<std::string, Stamp> before = stamps(dir + "/traces");

  // Rewrite the cpu trace as if made with a fault injected: complete and readable, but not
  // what the spec asks for. It must be redone, and only it.
  std::string text = test::read_file(cpu);
  size_t at = text.find("# inject\tnone");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 13, "# inject\top=down,layer=0,scale=10");
  ::unlink(cpu.c_str());
  test::write_file(cpu, text);
  ASSERT_EQ(verify::read_trace(cpu).header.inject, "op=down,layer=0,scale=10");
  Stamp edited = stamps(dir + "/traces")["TinyStories-656K.w1.cpu.tsv"];

  // `matrix report` alone judges what is on disk: the edited trace is not the spec's.
  auto rep = test::run_cli("matrix report " + dir);
  EXPECT_EQ(rep.exit_code, 3) << rep.out << rep.err;
  EXPECT_NE(test::read_file(dir + "/report.md").find("inject is 'op=down,layer=0,scale=10'"),
            std::string::npos);

  auto r = test::run_cli("matrix run " + spec + " -o " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("TinyStories-656K.w1.cpu.tsv: redo: inject is 'op=down,layer=0,scale=10', "
                       "the spec asks for 'none'"),
            std::string::npos)
      << r.err;
  std::map<std::string, Stamp> after = stamps(dir + "/traces");
  EXPECT_FALSE(after["TinyStories-656K.w1.cpu.tsv"] == edited);
  EXPECT_EQ(verify::read_trace(cpu).header.inject, "none");
  for (const char* kept : {"TinyStories-656K.w1.ref.tsv", "TinyStories-656K.w1.ref.aa.tsv"})
    EXPECT_EQ(after[kept], before[kept]) << kept;
}
