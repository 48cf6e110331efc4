// Matrix runner: keeps traces whose headers match the spec, redoes the others, runs arms
// in-process (one model load per model, a fresh backend per trace, as `arbiter trace` does)
// or, when an arm sets environment variables, as a child `arbiter trace` with that
// environment (variables are read once by the tiers, so they cannot be switched in-process).
#include "verify/matrix/matrix_run.h"
#include "verify/matrix/matrix_gate.h"
#include "verify/trace/api_trace.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/progress.h"
#include "engine/inject.h"
#include "engine/probe.h"
#include "io/atomic_file.h"
#include "io/sha256.h"
#include "model/model.h"
#include "verify/trace/host_info.h"
#include "verify/localize/svg.h"
#include "verify/trace/trace_run.h"

namespace arbiter::verify {

namespace fs = std::filesystem;

namespace {

bool process_alive(long pid) {
  return ::kill(pid_t(pid), 0) == 0 || errno == EPERM;
}

// Runs `self_exe args... -o out` with env added; returns "" or why it failed (stderr tail).
// The child runs quiet (its stderr is the error's source); while it runs, `heartbeat` gets
// the seconds elapsed every kProgressPlainInterval, so a long child trace is not silence.
std::string run_child(const std::string& self_exe, const std::vector<std::string>& args,
                      const std::vector<std::pair<std::string, std::string>>& env,
                      const std::string& out, const std::function<void(double)>& heartbeat) {
  int fds[2];
  ARB_CHECK(::pipe(fds) == 0, "[matrix] pipe: %s", std::strerror(errno));
  pid_t pid = ::fork();
  ARB_CHECK(pid >= 0, "[matrix] fork: %s", std::strerror(errno));
  if (pid == 0) {
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    ::close(fds[1]);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<std::string> all = args;
    all.insert(all.end(), {"-o", out});
    std::vector<char*> argv = {const_cast<char*>(self_exe.c_str())};
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(self_exe.c_str(), argv.data());
    std::fprintf(stderr, "exec %s: %s\n", self_exe.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string err;
  char buf[4096];
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    pollfd pfd{fds[0], POLLIN, 0};
    const int ready = ::poll(&pfd, 1, int(kProgressPlainInterval * 1000));
    if (ready == 0) {
      if (heartbeat) heartbeat(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      continue;
    }
    if (ready < 0 && errno == EINTR) continue;
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n == 0) break;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    err.append(buf, size_t(n));
  }
  ::close(fds[0]);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return "";
  // A trace with NaN/Inf is written and exits 1: the trace is the evidence, compare judges it.
  if (WIFEXITED(st) && WEXITSTATUS(st) == 1 && fs::exists(out)) return "";
  while (!err.empty() && (err.back() == '\n' || err.back() == '\r')) err.pop_back();
  std::string last =
      err.substr(err.find_last_of("\n\r") == std::string::npos ? 0 : err.find_last_of("\n\r") + 1);
  return (WIFEXITED(st) ? "exit code " + std::to_string(WEXITSTATUS(st))
                        : "killed by signal " + std::to_string(WTERMSIG(st))) +
         (last.empty() ? "" : ": " + last);
}

void run_in_process(const MatrixSpec& spec, const MatrixTrace& t, const Model& model,
                    const MatrixRunOptions& opt, const std::string& out) {
  const MatrixArm& arm = spec.arm(t.arm);
  TraceRunOptions ro;
  ro.shape = spec.shapes[t.shape].shape;
  ro.topk = spec.topk;
  ro.corpus_path = spec.corpus;
  ro.out_path = out;
  ro.model_path = matrix_trace_model(spec, t);
  if (!t.logits.empty()) ro.full_logits_path = opt.out_dir + "/" + kMatrixTraceDir + "/" + t.logits;
  ro.env = opt.env;
  // One line per trace with its rate (and periodic lines on long traces), tagged with the file.
  ro.progress = opt.progress;
  ro.progress_tag = "matrix " + t.file;
  ro.allow_long_context = spec.allow_long_context;
  ro.extra_header = host_header_lines();
  if (!arm.mix.empty()) ro.extra_header.emplace_back("mix", arm.mix);
  if (arm.is_endpoint()) {
    ApiTraceOptions api;
    api.endpoint = arm.endpoint;
    api.api_model = arm.api_model;
    api.compute = arm.dtype;
    api.trace = ro;
    run_api_trace(model, api);
    return;
  }
  DeviceSpec ds;
  ds.device = arm.device;
  ds.dtype = arm.dtype;
  ds.threads = arm.threads;
  ds.mix = arm.mix;
  std::unique_ptr<Backend> be = make_tier(ds);
  // Cache and batch sizes as `arbiter trace` chooses them, so both paths run the same code.
  const TraceCorpus corpus = load_trace_corpus(ro, model);
  const int W = ro.shape.chunk_tokens, ctx = int(trace_positions(ro.shape, model));
  Session s(model, *be, ctx, std::max(W, std::min(ctx, 512)));
  s.set_inject(InjectSpec::parse(arm.inject));
  run_trace(s, ro, corpus);
}

}  // namespace

// The CUDA tier says one of these when there is nothing to run on (same test as the CUDA
// tests' skip): a reason to skip a GPU arm. Any other start-up error is a failure.
bool matrix_gpu_unavailable(const std::string& msg) {
  return msg.find("no CUDA device") != std::string::npos ||
         msg.find("cuda tier not built") != std::string::npos;
}

const char* matrix_status_name(MatrixTraceStatus s) {
  switch (s) {
    case MatrixTraceStatus::Kept:
      return "kept";
    case MatrixTraceStatus::Ran:
      return "ran";
    case MatrixTraceStatus::Skipped:
      return "skipped";
    default:
      return "failed";
  }
}

std::string shell_quote(const std::string& s) {
  bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum((unsigned char)c) || std::strchr("_./:=,+-", c);
  });
  if (plain) return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

void matrix_prepare_dir(const MatrixSpec& spec, const std::string& dir, bool remove_stale) {
  std::error_code ec;
  fs::create_directories(dir + "/" + kMatrixTraceDir, ec);
  if (ec) throw Error("[matrix] " + dir + ": cannot create (" + ec.message() + ")");
  std::string copy = dir + "/" + kMatrixSpecCopy;
  if (!fs::exists(copy) || sha256_file(copy) != sha256_hex(spec.text.data(), spec.text.size()))
    write_file_atomic(copy, spec.text, "[matrix]");
  if (!remove_stale) return;
  for (const auto& e : fs::directory_iterator(dir + "/" + kMatrixTraceDir)) {
    std::string name = e.path().filename().string();
    long pid = atomic_temp_pid(name);
    if (pid == 0) continue;
    if (process_alive(pid))
      throw Error("[matrix] " + e.path().string() + ": being written by process " +
                  std::to_string(pid) + " (another run into this directory?)");
    fs::remove(e.path(), ec);
  }
}

std::vector<MatrixTraceRun> matrix_run_traces(const MatrixSpec& spec, const MatrixRunOptions& opt) {
  matrix_prepare_dir(spec, opt.out_dir, true);
  const std::string tdir = opt.out_dir + "/" + kMatrixTraceDir;
  const std::vector<MatrixTrace> traces = matrix_traces(spec);
  std::vector<MatrixTraceRun> runs;
  std::string corpus_sha;
  try {
    corpus_sha = sha256_file(spec.corpus);
  } catch (const Error& e) {
    throw Error("[matrix] " + spec.path + ": corpus " + spec.corpus + ": " + e.what());
  }
  std::map<std::string, std::string> gpu_skip;  // arm -> why it cannot run here
  size_t done = 0;
  for (size_t m = 0; m < spec.models.size(); ++m) {
    // The model, and its parent when it has one: each loaded once, or why it cannot be.
    struct Loaded {
      std::unique_ptr<Model> model;
      std::string error;
    };
    std::map<std::string, Loaded> loaded;
    for (const std::string& p : {spec.models[m], spec.parents[m]}) {
      if (p.empty()) continue;
      try {
        loaded[p].model = load_model(p);
      } catch (const Error& e) {
        loaded[p].error = e.what();
      }
    }
    for (const MatrixTrace& t : traces) {
      if (t.model != m) continue;
      ++done;
      MatrixTraceRun r;
      r.trace = t;
      const std::string path = tdir + "/" + t.file;
      const std::string logits = t.logits.empty() ? "" : tdir + "/" + t.logits;
      const MatrixArm& arm = spec.arm(t.arm);
      const Model* model = loaded[matrix_trace_model(spec, t)].model.get();
      const std::string& load_error = loaded[matrix_trace_model(spec, t)].error;
      auto log = [&](const char* what, const std::string& why) {
        if (opt.progress)
          progress_note("matrix", strformat("%zu/%zu %s: %s%s%s", done, traces.size(), t.file.c_str(), what,
                                            why.empty() ? "" : ": ", why.c_str()));
      };
      if (!load_error.empty()) {
        r.reason = load_error;
        log("FAILED", r.reason);
        runs.push_back(r);
        continue;
      }
      if (fs::exists(path)) {
        try {
          Trace old = read_trace(path);
          r.reason = matrix_trace_mismatch(spec, t, old.header, model->weights_sha256, corpus_sha);
        } catch (const Error& e) {
          r.reason = e.what();
        }
        if (r.reason.empty() && !logits.empty() && !fs::exists(logits))
          r.reason = "its full-logits file " + t.logits + " is missing";
        if (r.reason.empty()) {
          r.status = MatrixTraceStatus::Kept;
          log("kept", "");
          runs.push_back(r);
          continue;
        }
        log("redo", r.reason);
        fs::remove(path);
        if (!logits.empty()) fs::remove(logits);
      }
      if (arm.is_gpu() && !gpu_skip.count(arm.name)) {
        DeviceSpec ds;
        ds.device = arm.device;
        ds.dtype = arm.dtype;
        try {
          make_tier(ds);
          gpu_skip[arm.name] = "";
        } catch (const Error& e) {
          gpu_skip[arm.name] = matrix_gpu_unavailable(e.what()) ? e.what() : "";
        }
      }
      if (arm.is_gpu() && !gpu_skip[arm.name].empty()) {
        r.status = MatrixTraceStatus::Skipped;
        r.reason = gpu_skip[arm.name];
        log("SKIP", r.reason);
        runs.push_back(r);
        continue;
      }
      auto t0 = std::chrono::steady_clock::now();
      try {
        if (arm.env.empty()) {
          run_in_process(spec, t, *model, opt, path);
        } else {
          auto heartbeat = [&](double secs) {
            if (opt.progress) progress_note("matrix", strformat("%s: child trace running, %.0f s", t.file.c_str(), secs));
          };
          std::string err = run_child(opt.self_exe, matrix_trace_args(spec, t, tdir), arm.env, path, heartbeat);
          if (!err.empty()) throw Error("[matrix] " + t.file + ": arbiter trace failed: " + err);
        }
        r.status = MatrixTraceStatus::Ran;
      } catch (const Error& e) {
        r.status = MatrixTraceStatus::Failed;
        r.reason = e.what();
      }
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r.status == MatrixTraceStatus::Ran)
        log(strformat("ran in %.1f s", r.seconds).c_str(), "");
      else
        log("FAILED", r.reason);
      runs.push_back(r);
    }
  }
  std::string status =
      "# file\tstatus\treason (traces and gates the last `matrix run` skipped or failed)\n";
  auto add_status = [&](const std::string& file, MatrixTraceStatus st, std::string why) {
    if (st != MatrixTraceStatus::Skipped && st != MatrixTraceStatus::Failed) return;
    for (char& c : why)
      if (c == '\t' || c == '\n') c = ' ';
    status += file + "\t" + matrix_status_name(st) + "\t" + why + "\n";
  };
  for (const auto& r : runs) add_status(r.trace.file, r.status, r.reason);
  for (const auto& g : matrix_run_gates(spec, opt)) add_status(g.file, g.status, g.reason);
  write_file_atomic(opt.out_dir + "/" + kMatrixStatus, status, "[matrix]");
  return runs;
}

std::vector<MatrixPlanLine> matrix_plan(const MatrixSpec& spec, const MatrixRunOptions& opt,
                                        bool all) {
  matrix_prepare_dir(spec, opt.out_dir, false);
  std::string tdir = fs::absolute(opt.out_dir + "/" + kMatrixTraceDir).lexically_normal().string();
  std::vector<MatrixPlanLine> lines;
  for (const MatrixTrace& t : matrix_traces(spec)) {
    std::string path = tdir + "/" + t.file;
    if (!all && fs::exists(path)) {
      try {
        if (matrix_trace_mismatch(spec, t, read_trace(path).header, "", "").empty() &&
            (t.logits.empty() || fs::exists(tdir + "/" + t.logits)))
          continue;
      } catch (const Error&) {
      }
    }
    std::string cmd = "cd " + shell_quote(opt.cwd) + " && ";
    for (const auto& [k, v] : spec.arm(t.arm).env) cmd += k + "=" + shell_quote(v) + " ";
    cmd += shell_quote(opt.self_exe);
    for (const auto& a : matrix_trace_args(spec, t, tdir)) cmd.append(" ").append(shell_quote(a));
    cmd += " -o " + shell_quote(path);
    lines.push_back({t, "", 0, cmd});
  }
  // The gate runs all its arms in one process and needs no trace: one more line per model.
  const std::string dir = fs::absolute(opt.out_dir).lexically_normal().string();
  for (size_t m = 0; spec.has_gate && m < spec.models.size(); ++m) {
    const std::string file = matrix_gate_file(spec, m);
    if (!all && fs::exists(opt.out_dir + "/" + file) &&
        matrix_gate_stale(spec, m, opt.out_dir + "/" + file).empty())
      continue;
    std::string cmd = "cd " + shell_quote(opt.cwd) + " && " + shell_quote(opt.self_exe);
    for (const auto& a : {std::string("matrix"), std::string("gate"), spec.path, std::string("-o"),
                          dir, std::string("--model"), matrix_model_name(spec.models[m]),
                          std::string("--quiet")})
      cmd.append(" ").append(shell_quote(a));
    lines.push_back({MatrixTrace{}, file, m, cmd});
  }
  return lines;
}

}  // namespace arbiter::verify
