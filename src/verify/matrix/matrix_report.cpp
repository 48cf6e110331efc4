// Matrix judgement and report: load the spec's traces from DIR/traces, regenerate and
// verify the store, compare every pair, write report.md / report.html / results.json and
// the SVG plots. Everything is derived from files on disk (and DIR/run-status.tsv for the
// traces a run skipped or failed), so `matrix report DIR` rebuilds what `matrix run` wrote.
#include "verify/matrix/matrix_report.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/file.h"
#include "verify/matrix/matrix_doc.h"
#include "verify/matrix/matrix_files.h"
#include "verify/matrix/matrix_gate.h"
#include "verify/matrix/matrix_run.h"
#include "verify/trace/store.h"
#include "verify/localize/svg.h"

namespace arbiter::verify {

namespace fs = std::filesystem;
using State = MatrixComparison::State;

namespace {

bool require_cuda() {
  const char* v = std::getenv("ARBITER_REQUIRE_CUDA");
  return v && *v && std::strcmp(v, "0") != 0;
}

std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper((unsigned char)c));
  return s;
}

std::string num(double v, const char* fmt = "%.3g") {
  return std::isfinite(v) ? strformat(fmt, v) : std::string("–");
}

// A CommonMark code span holding s verbatim (a fence longer than any backtick run in s).
std::string md_code(const std::string& s) {
  size_t run = 0, longest = 0;
  for (char c : s) longest = std::max(longest, run = c == '`' ? run + 1 : 0);
  std::string fence(longest + 1, '`');
  bool pad = !s.empty() && (s.front() == '`' || s.back() == '`');
  return fence + (pad ? " " : "") + s + (pad ? " " : "") + fence;
}

// The KL one row shows: the one the drift gate judged (exact, or the shared top-k part of
// the estimate), or without a gate the estimate compare reports; labelled with its method.
std::string kl_text(const CompareResult& x) {
  if (x.drift_status != "n/a")
    return num(x.drift_kl.mean) + " nats (" +
           (x.drift_kl_method == "exact" ? "exact" : "shared top-k") + ")";
  if (x.kl_method == "unavailable") return "–";
  return num(x.kl.mean) + " nats (" + (x.kl_method == "exact" ? "exact" : "top-k estimate") +
         ", no gate)";
}

// Anchor of a comparison's detail section.
std::string detail_id(const std::string& model, const std::string& shape,
                      const MatrixComparison& c) {
  return "detail-" + model + "-" + shape + "-" + c.cand_arm + (c.aa ? "-aa" : "-vs-" + c.ref_arm);
}

// A trace of the spec as found on disk.
struct Side {
  State state = State::Missing;
  Verdict verdict = Verdict::Inconclusive;  // when not usable
  std::string why;
  Trace trace;
  std::string path;
};

std::string extra(const TraceHeader& h, const std::string& key) {
  for (const auto& [k, v] : h.extra)
    if (k == key) return v;
  return "";
}

std::string joined(const std::set<std::string>& s, const std::string& none = "unknown",
                   const std::string& sep = "; ") {
  std::string o;
  for (const auto& v : s)
    if (!v.empty()) o += (o.empty() ? "" : sep) + v;
  return o.empty() ? none : o;
}

class Reporter {
 public:
  Reporter(const MatrixSpec& spec, const std::string& dir) : spec_(spec), dir_(dir) {}
  MatrixResults run();

 private:
  void load_sides();
  void update_store();
  void compare_all();
  MatrixComparison judge(size_t m, size_t s, const std::string& ref, const std::string& cand,
                         bool aa);
  void headline();
  void group_skips();
  void write_files();
  void section_summary(Doc& d);
  void section_details(Doc& d);
  void section_environment(Doc& d);
  void section_method(Doc& d);
  void section_results(Doc& d);
  void section_sweep_ranks(Doc& d);
  void section_controls(Doc& d);
  void section_like_for_like(Doc& d);
  void section_plots(Doc& d);
  std::string floor_cell(const MatrixComparison& c) const;
  std::string verdict_cell(const MatrixComparison& c) const;
  std::string label(const MatrixComparison& c) const;
  const Side& side(size_t m, size_t s, const std::string& arm, bool aa) const;

  const MatrixSpec& spec_;
  std::string dir_, tdir_;
  std::vector<MatrixTrace> traces_;
  std::map<std::string, Side> sides_;  // by trace file name
  MatrixResults res_;
  std::vector<MatrixGateResult> gates_;
  bool any_capped_ = false;
  // Each distinct skip reason once, with the comparisons it covers (report order).
  std::vector<std::pair<std::string, std::vector<const MatrixComparison*>>> skips_;
  size_t skip_number(const MatrixComparison& c) const;
};

const Side& Reporter::side(size_t m, size_t s, const std::string& arm, bool aa) const {
  for (const auto& t : traces_)
    if (t.model == m && t.shape == s && t.arm == arm && t.aa == aa) return sides_.at(t.file);
  throw Error("[matrix] internal: no trace for arm " + arm);
}

void Reporter::load_sides() {
  tdir_ = dir_ + "/" + kMatrixTraceDir;
  std::error_code ec;
  if (!fs::is_directory(tdir_, ec))
    throw Error("[matrix] " + tdir_ +
                ": no traces directory (run `arbiter matrix run` or the plan first)");
  for (const auto& e : fs::directory_iterator(tdir_)) {
    std::string name = e.path().filename().string();
    if (atomic_temp_pid(name) > 0)
      throw Error(
          "[matrix] " + e.path().string() +
          ": a trace is still being written, or a killed run left it; let it finish, or run "
          "`arbiter matrix run` (which removes stale ones) or delete it");
  }
  auto status = read_status(dir_);
  traces_ = matrix_traces(spec_);
  for (const auto& t : traces_) {
    Side sd;
    sd.path = tdir_ + "/" + t.file;
    if (fs::exists(sd.path)) {
      try {
        sd.trace = read_trace(sd.path);
        std::string mm = sd.trace.format == TraceFormat::Arbiter
                             ? matrix_trace_mismatch(spec_, t, sd.trace.header, "", "")
                             : "a foreign trace, not written by arbiter trace";
        if (mm.empty()) {
          sd.state = State::Compared;
        } else {
          sd.state = State::Error;
          sd.verdict = Verdict::Incomparable;
          sd.why = t.file + ": not what the spec asks for: " + mm + " (`matrix run` redoes it)";
        }
      } catch (const Error& e) {
        sd.state = State::Error;
        sd.verdict = Verdict::Unreadable;
        sd.why = e.what();
      }
    } else if (auto it = status.find(t.file); it != status.end()) {
      sd.state = it->second.first == "skipped" ? State::Skipped : State::Error;
      sd.verdict = it->second.first == "skipped" ? Verdict::Inconclusive : Verdict::Unreadable;
      sd.why = it->second.second;
    } else {
      sd.why = t.file + ": no trace on disk (not run yet)";
    }
    sides_[t.file] = std::move(sd);
  }
}

void Reporter::update_store() {
  std::vector<std::string> good;
  for (const auto& t : traces_)
    if (sides_[t.file].state == State::Compared) good.push_back(sides_[t.file].path);
  std::set<std::string> spec_files;
  for (const auto& t : traces_) spec_files.insert(t.file);
  for (const auto& name : store_trace_names(tdir_))
    if (!spec_files.count(name))
      res_.problems.push_back(tdir_ + "/" + name +
                              ": not a trace of this spec (kept in the store, not judged)");
  if (good.empty()) {
    res_.problems.push_back(tdir_ + ": no usable trace, store files not written");
    return;
  }
  try {
    store_add(tdir_, good);
  } catch (const Error& e) {
    res_.problems.push_back(std::string("store not updated: ") + e.what());
  }
  for (auto& p : store_verify(tdir_)) res_.problems.push_back("store: " + p);
}

MatrixComparison Reporter::judge(size_t m, size_t s, const std::string& ref,
                                 const std::string& cand, bool aa) {
  MatrixComparison c;
  c.model = m;
  c.shape = s;
  c.ref_arm = ref;
  c.cand_arm = cand;
  c.aa = aa;
  const Side& a = side(m, s, ref, false);
  const Side& b = side(m, s, cand, aa);
  // The worse side decides: a broken trace over a missing one over a skipped GPU arm.
  auto rank = [](State st) {
    return st == State::Error ? 3 : st == State::Missing ? 2 : st == State::Skipped ? 1 : 0;
  };
  const Side& worst = rank(a.state) >= rank(b.state) ? a : b;
  if (worst.state != State::Compared) {
    c.state = worst.state;
    c.why = worst.why;
    c.verdict = worst.verdict;
    if (c.state == State::Skipped) {
      c.counted = require_cuda();
      if (c.counted) {
        c.verdict = Verdict::Fail;
        c.why += " (ARBITER_REQUIRE_CUDA=1 makes a skipped GPU arm a failure)";
      }
    }
    return c;
  }
  c.state = State::Compared;
  CompareOptions opt;
  opt.decided = spec_.decided;
  opt.sweep = spec_.sweep;
  if (spec_.kl_kappa > 0) opt.kl_kappa = spec_.kl_kappa;
  opt.ref_label = fs::path(a.path).filename().string();
  opt.cand_label = fs::path(b.path).filename().string();
  try {
    c.result = compare_traces(a.trace, b.trace, opt);
    c.verdict = c.result.verdict;
  } catch (const Error& e) {
    c.state = State::Error;
    c.verdict = Verdict::Unreadable;
    c.why = e.what();
    return c;
  }
  std::map<std::pair<int, int>, const TraceRow*> by_pos;
  for (const auto& r : b.trace.rows) by_pos[{r.chunk, r.pos}] = &r;
  for (const auto& r : a.trace.rows) {
    auto it = by_pos.find({r.chunk, r.pos});
    c.nll_shift.push_back(it == by_pos.end() ? NAN : it->second->nll - r.nll);
  }
  if (aa) {
    c.aa_identical = rows_identical(a.path, b.path, c.aa_detail);
    if (c.verdict != Verdict::Incomparable)
      c.verdict = c.aa_identical && c.result.nonfinite_ref == 0 && c.result.nonfinite_cand == 0
                      ? Verdict::Pass
                      : Verdict::Fail;
  }
  return c;
}

void Reporter::compare_all() {
  for (size_t m = 0; m < spec_.models.size(); ++m)
    for (size_t s = 0; s < spec_.shapes.size(); ++s) {
      size_t first = res_.comparisons.size();
      for (const auto& cand : spec_.candidates) {
        res_.comparisons.push_back(judge(m, s, spec_.reference, cand, false));
        res_.comparisons.back().candidate = true;
      }
      for (const auto& p : spec_.noise_floor) {
        auto it = std::find_if(res_.comparisons.begin() + long(first), res_.comparisons.end(),
                               [&](const MatrixComparison& c) {
                                 return !c.aa && c.ref_arm == p.ref && c.cand_arm == p.cand;
                               });
        if (it != res_.comparisons.end()) {
          it->noise = true;
          continue;
        }
        res_.comparisons.push_back(judge(m, s, p.ref, p.cand, false));
        res_.comparisons.back().noise = true;
      }
      for (const auto& a : spec_.aa) {
        res_.comparisons.push_back(judge(m, s, a, a, true));
        res_.comparisons.back().aa = true;
      }
    }
  bool any_candidate = false;
  for (const auto& c : res_.comparisons) {
    if (c.counted) res_.worst = worse_verdict(res_.worst, c.verdict);
    if (c.candidate && c.state == State::Compared) any_candidate = true;
  }
  if (!any_candidate) res_.worst = worse_verdict(res_.worst, Verdict::Inconclusive);
  gates_ = matrix_gate_results(spec_, dir_, require_cuda());
  for (const auto& g : gates_)
    if (g.counted) res_.worst = worse_verdict(res_.worst, g.verdict);
  if (!res_.problems.empty()) res_.worst = worse_verdict(res_.worst, Verdict::Unreadable);
  for (const auto& s : spec_.shapes) any_capped_ = any_capped_ || s.capped();
}

std::string Reporter::label(const MatrixComparison& c) const {
  std::string where =
      matrix_model_name(spec_.models[c.model]) + " " + spec_.shapes[c.shape].shape.name;
  if (c.aa) return "`" + c.cand_arm + "` A/A on " + where;
  return "`" + c.cand_arm + "`" + (c.ref_arm == spec_.reference ? "" : " vs `" + c.ref_arm + "`") +
         " on " + where;
}

void Reporter::headline() {
  std::vector<std::string> failed, open;
  int64_t decided = 0, compared = 0;
  std::set<std::string> skipped;  // arms; their reasons are listed once under the summary
  for (const auto& c : res_.comparisons) {
    if (c.state == State::Skipped) {
      skipped.insert("`" + c.cand_arm + "`");
      continue;
    }
    if (c.candidate && c.state == State::Compared) {
      decided += c.result.decided;
      ++compared;
    }
    if (!c.counted || c.verdict == Verdict::Pass) continue;
    std::string what = label(c) + ": ";
    if (c.state != State::Compared)
      what += upper(verdict_name(c.verdict)) + " — " + md_code(c.why);
    else if (c.aa)
      what += "rows not byte-identical, " + c.aa_detail;
    else if (c.verdict == Verdict::Fail) {
      const CompareResult& x = c.result;
      std::vector<std::string> why;
      if (x.decided_disagree > 0)
        why.push_back(strformat(
            "%lld of %lld decided positions disagree (largest reference gap at a disagreement %s)",
            (long long)x.decided_disagree, (long long)x.decided,
            num(x.max_gap_at_disagreement).c_str()));
      if (x.drift_status == "fail")
        why.push_back("mean KL " + kl_text(x) + " is " + num(x.drift_kl.mean / x.drift_budget) +
                      "× the drift budget " + num(x.drift_budget) + " nats");
      if (x.nonfinite_cand + x.nonfinite_ref) why.push_back("NaN/Inf present");
      if (why.empty() && !x.reasons.empty()) why.push_back(x.reasons[0]);
      for (size_t i = 0; i < why.size(); ++i) what += (i ? "; " : "") + why[i];
    } else
      what += upper(verdict_name(c.verdict)) +
              (c.result.reasons.empty() ? "" : " — " + c.result.reasons[0]);
    (c.verdict == Verdict::Fail ? failed : open).push_back(what);
  }
  for (const auto& g : gates_)
    if (std::string what = matrix_gate_finding(spec_, g); !what.empty())
      (g.verdict == Verdict::Fail ? failed : open).push_back(what);
  std::string cands;
  for (const auto& c : spec_.candidates) cands += (cands.empty() ? "`" : ", `") + c + "`";
  std::string a;
  const std::string scope =
      strformat("%zu model(s) × %zu shape(s)", spec_.models.size(), spec_.shapes.size());
  if (res_.worst == Verdict::Pass) {
    a = "**Yes.** Every candidate arm that ran agrees with the reference `" + spec_.reference +
        "` at every decided position (reference top-1 margin ≥ " + num(spec_.decided, "%g") +
        " logits) on " + scope + ": 0 decided disagreements in " + std::to_string(decided) +
        " decided positions over " + std::to_string(compared) +
        " comparisons; every control passed.";
  } else if (!failed.empty()) {
    a = "**No.** " + std::to_string(failed.size()) + " comparison(s) failed: ";
    for (size_t i = 0; i < failed.size() && i < 6; ++i) a += (i ? "; " : "") + failed[i];
    if (failed.size() > 6) a += strformat("; and %zu more", failed.size() - 6);
    a += ".";
  } else {
    a = "**No answer.** The matrix holds no failure, but not every comparison reached a verdict: ";
    for (size_t i = 0; i < open.size() && i < 6; ++i) a += (i ? "; " : "") + open[i];
    if (open.size() > 6) a += strformat("; and %zu more", open.size() - 6);
    if (compared == 0)
      a += (open.empty() ? "" : "; ") + std::string("no candidate arm could be compared");
    a += ".";
  }
  if (!skipped.empty()) {
    a += " **Not tested here:** " + joined(skipped, "", ", ") +
         " — SKIP (the reasons are under the summary); a skipped arm is never counted as passed.";
  }
  a += matrix_gate_note(spec_, gates_);
  if (!res_.problems.empty())
    a += strformat(" %zu problem(s) with the files on disk (see Files).", res_.problems.size());
  res_.answer = a;
}

void Reporter::section_environment(Doc& d) {
  std::set<std::string> hosts, cpus, gpus, drivers, cudas, builds, commits, compilers, envs;
  std::map<std::string, std::string> models;
  std::set<std::string> corpora;
  for (const auto& t : traces_) {
    const Side& sd = sides_.at(t.file);
    if (sd.state != State::Compared) continue;
    const TraceHeader& h = sd.trace.header;
    hosts.insert(extra(h, "host"));
    cpus.insert(extra(h, "cpu"));
    if (h.device.rfind("cuda", 0) == 0) gpus.insert(h.device);
    drivers.insert(extra(h, "driver"));
    if (h.device.rfind("cuda", 0) == 0 || h.build_cuda != "none") cudas.insert(h.build_cuda);
    builds.insert(h.build_version);
    commits.insert(h.build_commit);
    compilers.insert(h.build_compiler);
    std::string env;
    for (const auto& e : h.env) env += (env.empty() ? "" : " ") + e;
    envs.insert(env.empty() ? "none" : env);
    models[matrix_model_name(h.model_path)] =
        "`" + h.model_path + "` sha256 `" + h.model_sha256 + "`, " + h.model_arch + ", " +
        std::to_string(h.model_params) + " parameters, weights " + h.weights +
        ", tokenizer sha256 `" + h.tokenizer_sha256.substr(0, 16) + "…`";
    corpora.insert("`" + h.corpus_path + "` sha256 `" + h.corpus_sha256 + "`");
  }
  d.heading(2, "Environment", "environment");
  d.para(
      "From the trace headers (every value that occurs; more than one value in a row means the "
      "traces were made in different places or by different builds).");
  std::vector<std::vector<std::string>> rows = {{"what", "value"}};
  rows.push_back({"host", joined(hosts)});
  rows.push_back({"CPU", joined(cpus)});
  rows.push_back({"GPU", joined(gpus, "none (no cuda arm ran)")});
  rows.push_back({"driver", joined(drivers, "none recorded")});
  rows.push_back({"CUDA (build)", joined(cudas, "none")});
  rows.push_back({"arbiter build", joined(builds)});
  rows.push_back({"commit", joined(commits)});
  rows.push_back({"compiler", joined(compilers)});
  rows.push_back({"ARBITER_* env", joined(envs, "none")});
  for (const auto& [name, v] : models) rows.push_back({"model " + name, v});
  rows.push_back({"corpus", joined(corpora)});
  d.table(rows, "environment-table");
}

void Reporter::section_method(Doc& d) {
  d.heading(2, "Method", "method");
  d.para(
      "Every arm teacher-forces the corpus through each model and records, at every traced "
      "position, the target's NLL, the log-sum-exp and the top-" +
      std::to_string(spec_.topk) +
      " logits (`docs/traces.md`). Each candidate is compared with the reference `" +
      spec_.reference +
      "` position by position (`docs/traces.md`, Part B). **What must match** before any "
      "statistic: model weights (sha256), tokenizer, corpus, shape and the target at every "
      "position; "
      "otherwise the verdict is INCOMPARABLE. A position is **decided** when the reference's top-1 "
      "logit exceeds its top-2 by at least **" +
      num(spec_.decided, "%g") +
      "** (fixed in the spec "
      "before the run). The **drift gate** also fails a comparison whose mean KL(ref‖cand) "
      "exceeds κ·u², u the coarser unit roundoff of the two arms, κ = " +
      num(spec_.kl_kappa > 0 ? spec_.kl_kappa : kDefaultKlKappa, "%g") +
      ". PASS: at least one decided position, no decided disagreement, the drift gate passed "
      "or not applicable, no NaN/Inf. FAIL: a decided disagreement, the drift gate, or any "
      "NaN/Inf. INCONCLUSIVE: no decided position. The "
      "threshold-free numbers (largest reference gap at any disagreement, the sweep, the rank "
      "distribution) are shown so that the threshold is never tuned after the fact.");
  std::vector<std::vector<std::string>> rows = {{"shape", "W (tokens per traced forward)", "chunks",
                                                 "prefill", "start", "positions", "exercises"}};
  for (const auto& ms : spec_.shapes) {
    const TraceShape& s = ms.shape;
    rows.push_back(
        {s.name, std::to_string(s.chunk_tokens),
         std::to_string(s.max_chunks) +
             (ms.capped() ? " (capped; named shape: " + std::to_string(ms.full_chunks) + ")" : ""),
         std::to_string(s.prefill), std::to_string(s.start_token),
         std::to_string(int64_t(s.max_chunks) * s.chunk_tokens), s.models});
  }
  d.table(rows, "shapes-table");
  if (any_capped_)
    d.para(
        "**Capped shapes** run fewer chunks than the named shape (the spec's `[chunks]` table) to "
        "keep "
        "the run short; their statistics rest on fewer positions.");
  rows = {{"arm", "role", "device / compute", "note"}};
  std::vector<const MatrixArm*> order = {&spec_.arm(spec_.reference)};
  for (const auto& c : spec_.candidates) order.push_back(&spec_.arm(c));
  for (const auto& a : spec_.arms)
    if (std::find(order.begin(), order.end(), &a) == order.end()) order.push_back(&a);
  for (const MatrixArm* ap : order) {
    const MatrixArm& a = *ap;
    std::string role;
    auto add = [&](const std::string& r) { role += (role.empty() ? "" : ", ") + r; };
    if (a.name == spec_.reference) add("reference");
    if (std::count(spec_.candidates.begin(), spec_.candidates.end(), a.name)) add("candidate");
    for (const auto& p : spec_.noise_floor)
      if (p.ref == a.name || p.cand == a.name) {
        add("noise floor");
        break;
      }
    if (std::count(spec_.aa.begin(), spec_.aa.end(), a.name)) add("A/A control");
    rows.push_back({"`" + a.name + "`", role, a.describe(), a.note});
  }
  d.table(rows, "arms-table");
}

std::string Reporter::verdict_cell(const MatrixComparison& c) const {
  if (c.state == State::Skipped) return strformat("SKIP (reason %zu)", skip_number(c));
  // Messages about files are quoted as code: a path or an error text is never read as
  // Markdown or HTML.
  if (c.state == State::Missing) return "MISSING: " + md_code(c.why);
  if (c.state == State::Error) return upper(verdict_name(c.verdict)) + ": " + md_code(c.why);
  std::string v = upper(verdict_name(c.verdict));
  if (c.verdict == Verdict::Incomparable && !c.result.reasons.empty())
    v += ": " + md_code(c.result.reasons[0]);
  return v;
}

std::string Reporter::floor_cell(const MatrixComparison& c) const {
  std::string o;
  for (const auto& f : res_.comparisons) {
    if (!f.noise || f.model != c.model || f.shape != c.shape || f.state != State::Compared)
      continue;
    if (f.ref_arm == c.ref_arm && f.cand_arm == c.cand_arm && !c.aa) {
      o += (o.empty() ? "" : "; ") + std::string("(this pair is a noise floor)");
      continue;
    }
    double fl = f.result.top1_logit_abs_delta.p99, me = c.result.top1_logit_abs_delta.p99;
    o += (o.empty() ? "" : "; ") + std::string("`") + f.cand_arm + "`: p99 " + num(fl);
    if (c.state == State::Compared && std::isfinite(me) && fl > 0)
      o += " (this ×" + num(me / fl, "%.2g") + ")";
  }
  return o.empty() ? "–" : o;
}

size_t Reporter::skip_number(const MatrixComparison& c) const {
  size_t i = 0;
  while (i < skips_.size() && skips_[i].first != c.why) ++i;
  ARB_ASSERT(i < skips_.size());  // group_skips saw every skipped comparison
  return i + 1;
}

void Reporter::group_skips() {
  for (const auto& c : res_.comparisons) {
    if (c.state != State::Skipped) continue;
    auto it =
        std::find_if(skips_.begin(), skips_.end(), [&](const auto& g) { return g.first == c.why; });
    if (it == skips_.end()) it = skips_.insert(skips_.end(), {c.why, {}});
    it->second.push_back(&c);
  }
}

void Reporter::section_summary(Doc& d) {
  d.heading(2, "Summary", "summary");
  d.para(
      "One cell per model, shape and candidate (✓ PASS, ✗ FAIL, ? not decided, ! not "
      "comparable): decided disagreements / decided positions, then what decided it — the "
      "largest reference gap at a disagreement (*gap*) and the drift gate's KL as a multiple of "
      "its budget (*KL/budget*). Each cell links to its details.");
  std::vector<std::vector<std::string>> rows = {{"model", "shape"}};
  for (const auto& cand : spec_.candidates) rows[0].push_back("`" + cand + "`");
  for (size_t m = 0; m < spec_.models.size(); ++m)
    for (size_t s = 0; s < spec_.shapes.size(); ++s) {
      const std::string mn = matrix_model_name(spec_.models[m]), sn = spec_.shapes[s].shape.name;
      std::vector<std::string> r = {mn, sn};
      for (const auto& c : res_.comparisons) {
        if (c.model != m || c.shape != s || !c.candidate || c.aa) continue;
        const std::string v = upper(verdict_name(c.verdict));
        if (c.state == State::Skipped) {
          r.push_back(strformat("[? SKIP](#skipped) reason %zu", skip_number(c)) +
                      (c.counted ? " (counted: FAIL)" : ""));
          continue;
        }
        std::string cell =
            "[" + doc_verdict_glyph(v) + " " + v + "](#" + detail_id(mn, sn, c) + ")";
        if (c.state != State::Compared) {
          r.push_back(cell + "<br>" + (c.state == State::Missing ? "no trace" : "see details"));
          continue;
        }
        const CompareResult& x = c.result;
        cell += strformat("<br>%lld / %lld decided", (long long)x.decided_disagree,
                          (long long)x.decided);
        std::vector<std::string> why;
        if (x.decided_disagree > 0) why.push_back("gap " + num(x.max_gap_at_disagreement));
        if (x.drift_status != "n/a")
          why.push_back("KL/budget " + num(x.drift_kl.mean / x.drift_budget, "%.2g"));
        if (x.nonfinite_cand + x.nonfinite_ref) why.push_back("NaN/Inf");
        for (size_t i = 0; i < why.size(); ++i) cell += (i ? " · " : "<br>") + why[i];
        r.push_back(cell);
      }
      rows.push_back(r);
    }
  d.table(rows, "summary-grid", "grid");
  if (skips_.empty()) return;
  d.heading(3, "Not run here (SKIP)", "skipped");
  std::vector<std::string> items;
  for (size_t i = 0; i < skips_.size(); ++i) {
    std::set<std::string> arms;
    std::set<size_t> shape_ids;
    for (const auto* c : skips_[i].second) {
      arms.insert("`" + c->cand_arm + "`" + (c->aa ? " A/A" : ""));
      shape_ids.insert(c->shape);
    }
    std::string shapes;  // in the spec's order
    for (size_t s : shape_ids) shapes += (shapes.empty() ? "" : ", ") + spec_.shapes[s].shape.name;
    items.push_back(strformat("**reason %zu** ", i + 1) + md_code(skips_[i].first) + " — " +
                    joined(arms, "", ", ") + " at " + shapes +
                    strformat(" (%zu comparisons)", skips_[i].second.size()));
  }
  d.list(items);
}

void Reporter::section_details(Doc& d) {
  d.heading(2, "Details", "details");
  d.para(
      "Per compared pair: what the verdict rests on. Plots of the same model and shape are "
      "linked from each.");
  for (const auto& c : res_.comparisons) {
    if (c.aa || c.state == State::Skipped) continue;
    const std::string mn = matrix_model_name(spec_.models[c.model]),
                      sn = spec_.shapes[c.shape].shape.name;
    d.heading(3,
              label(c) + ": " + doc_verdict_glyph(upper(verdict_name(c.verdict))) + " " +
                  upper(verdict_name(c.verdict)),
              detail_id(mn, sn, c));
    if (c.state != State::Compared) {
      d.para(verdict_cell(c));
      continue;
    }
    const CompareResult& x = c.result;
    std::vector<std::string> items;
    for (const auto& why : x.reasons) items.push_back(why);
    items.push_back(strformat(
        "decided disagreements %lld / %lld (threshold %s); top-1 "
        "disagreements at any gap %lld of %lld; largest reference gap at "
        "a disagreement %s",
        (long long)x.decided_disagree, (long long)x.decided, num(spec_.decided, "%g").c_str(),
        (long long)x.disagree, (long long)x.positions, num(x.max_gap_at_disagreement).c_str()));
    items.push_back("KL " + kl_text(x) + "; drift gate " + x.drift_status +
                    (std::isfinite(x.drift_budget)
                         ? " (budget " + num(x.drift_budget) + " nats, KL/budget " +
                               num(x.drift_kl.mean / x.drift_budget) + ")"
                         : ""));
    items.push_back("|δ| top-1 logit p50 " + num(x.top1_logit_abs_delta.p50) + ", p99 " +
                    num(x.top1_logit_abs_delta.p99) + ", max " + num(x.top1_logit_abs_delta.max) +
                    "; noise floor " + floor_cell(c));
    items.push_back("NLL shift " + num(x.nll_shift.mean) + " ± " + num(x.nll_shift.se_chunk) +
                    " nats (SE over chunks); perplexity Δ " + num(x.ppl_diff_pct, "%+.3g") +
                    " % ± " + num(x.ppl_diff_pct_se));
    items.push_back("[plots of " + mn + " " + sn + "](#plots-" + mn + "-" + sn + ")");
    d.list(items);
  }
}

void Reporter::section_results(Doc& d) {
  d.heading(2, "Results", "results");
  d.para(
      "Per model, shape and compared pair (skipped pairs are in the summary). *top-1 "
      "disagree*: positions whose top-1 ids differ; *decided*: disagreements among decided "
      "positions / decided positions; *max gap*: the largest reference top-1 margin at any "
      "disagreement (the verdict flips at a threshold below it); *|δ|*: |candidate − reference| "
      "logit of the reference's top-1 token (p50 / p99 / max); *ppl Δ*: perplexity difference in "
      "percent ± SE (chunk batch means); *KL*: mean KL(ref‖cand) per position, the one the drift "
      "gate judged, with its method (exact from full logits, or the shared top-k part of the "
      "estimate; `docs/traces.md`); *drift gate*: that KL against its budget κ·u² (u the coarser "
      "unit roundoff of the two arms), pass/fail/n/a; *noise floor*: p99 |δ| of the spec's "
      "trusted pairs at the same model and shape, and this row's multiple of it.");
  for (size_t m = 0; m < spec_.models.size(); ++m) {
    d.heading(3, "Model " + matrix_model_name(spec_.models[m]),
              "results-" + matrix_model_name(spec_.models[m]));
    std::vector<std::vector<std::string>> rows = {
        {"shape", "arm", "vs", "positions", "top-1 disagree", "decided", "max gap",
         "|δ| p50 / p99 / max", "ppl Δ % ± SE", "KL (method)", "drift gate", "noise floor",
         "verdict"}};
    for (const auto& c : res_.comparisons) {
      if (c.model != m || c.aa || c.state == State::Skipped) continue;
      std::vector<std::string> r = {spec_.shapes[c.shape].shape.name, "`" + c.cand_arm + "`",
                                    "`" + c.ref_arm + "`"};
      if (c.state != State::Compared) {
        r.resize(12, "–");
        r.push_back(verdict_cell(c));
        rows.push_back(r);
        continue;
      }
      const CompareResult& x = c.result;
      r.push_back(std::to_string(x.positions));
      r.push_back(strformat("%lld (%.2f%%)", (long long)x.disagree,
                            x.positions ? 100.0 * x.disagree / x.positions : 0.0));
      r.push_back(strformat("%lld / %lld", (long long)x.decided_disagree, (long long)x.decided));
      r.push_back(num(x.max_gap_at_disagreement));
      r.push_back(num(x.top1_logit_abs_delta.p50) + " / " + num(x.top1_logit_abs_delta.p99) +
                  " / " + num(x.top1_logit_abs_delta.max));
      r.push_back(num(x.ppl_diff_pct, "%+.3g") + " ± " + num(x.ppl_diff_pct_se));
      r.push_back(kl_text(x));
      r.push_back(x.drift_status +
                  (std::isfinite(x.drift_budget)
                       ? " (KL/budget " + num(x.drift_kl.mean / x.drift_budget) + ")"
                       : ""));
      r.push_back(c.noise && !c.candidate ? "(a noise floor)" : floor_cell(c));
      r.push_back(verdict_cell(c));
      rows.push_back(r);
    }
    d.table(rows, "results-table-" + std::to_string(m));
  }
}

void Reporter::section_sweep_ranks(Doc& d) {
  d.heading(2, "Threshold sweep", "sweep");
  d.para(
      "Decided disagreements / decided positions at each threshold t (decided: reference top-1 "
      "margin ≥ t). The verdict uses t = " +
      num(spec_.decided, "%g") +
      " only; the others show how "
      "close it was.");
  std::vector<double> ts = spec_.sweep;
  if (std::find(ts.begin(), ts.end(), spec_.decided) == ts.end()) ts.push_back(spec_.decided);
  std::sort(ts.begin(), ts.end());
  std::vector<std::vector<std::string>> rows = {{"model", "shape", "arm", "vs"}};
  for (double t : ts) rows[0].push_back("t = " + num(t, "%g"));
  for (const auto& c : res_.comparisons) {
    if (c.aa || c.state != State::Compared) continue;
    std::vector<std::string> r = {matrix_model_name(spec_.models[c.model]),
                                  spec_.shapes[c.shape].shape.name, "`" + c.cand_arm + "`",
                                  "`" + c.ref_arm + "`"};
    for (double t : ts) {
      std::string cell = "–";
      for (const auto& p : c.result.sweep)
        if (std::fabs(p.threshold - t) < 1e-12)
          cell = strformat("%lld / %lld", (long long)p.disagree, (long long)p.decided);
      r.push_back(cell);
    }
    rows.push_back(r);
  }
  d.table(rows, "sweep-table");

  d.heading(2, "Rank distribution", "ranks");
  d.para("Where the reference's top-1 token sits in the candidate's top-" +
         std::to_string(spec_.topk) +
         " (rank 1 = agreement; beyond = not in the candidate's list).");
  int K = spec_.topk;
  rows = {{"model", "shape", "arm", "vs"}};
  for (int k = 1; k <= K; ++k) rows[0].push_back("rank " + std::to_string(k));
  rows[0].push_back("beyond");
  rows[0].push_back("worst");
  for (const auto& c : res_.comparisons) {
    if (c.aa || c.state != State::Compared) continue;
    std::vector<std::string> r = {matrix_model_name(spec_.models[c.model]),
                                  spec_.shapes[c.shape].shape.name, "`" + c.cand_arm + "`",
                                  "`" + c.ref_arm + "`"};
    for (int k = 0; k < K; ++k)
      r.push_back(size_t(k) < c.result.rank_hist.size()
                      ? std::to_string(c.result.rank_hist[size_t(k)])
                      : "0");
    r.push_back(std::to_string(c.result.rank_beyond));
    r.push_back(c.result.rank_beyond ? "beyond top-k" : std::to_string(c.result.worst_rank));
    rows.push_back(r);
  }
  d.table(rows, "rank-table");
}

void Reporter::section_controls(Doc& d) {
  d.heading(2, "Controls and noise floor", "controls");
  if (spec_.aa.empty()) {
    d.para("No A/A control in this spec (`controls.aa`): determinism is not checked.");
  } else {
    d.para(
        "**A/A**: each listed arm runs twice; the two traces' rows must be byte-identical "
        "(a deterministic tier gives the same bits for the same input). A difference makes the "
        "control FAIL: every other verdict of that arm then rests on a non-reproducible run.");
    std::vector<std::vector<std::string>> rows = {
        {"model", "shape", "arm", "rows", "|δ| max", "verdict"}};
    for (const auto& c : res_.comparisons) {
      if (!c.aa) continue;
      rows.push_back({matrix_model_name(spec_.models[c.model]), spec_.shapes[c.shape].shape.name,
                      "`" + c.cand_arm + "`", c.state == State::Compared ? c.aa_detail : "–",
                      c.state == State::Compared ? num(c.result.top1_logit_abs_delta.max) : "–",
                      verdict_cell(c)});
    }
    d.table(rows, "aa-table");
  }
  if (spec_.noise_floor.empty()) {
    d.para("No noise-floor pair in this spec (`controls.noise_floor`).");
    return;
  }
  d.para(
      "**Noise floor**: pairs of trusted arms. Their differences are what rounding alone produces "
      "here; the results table puts them next to every candidate so a candidate's |δ| can be read "
      "as a multiple of the floor.");
  std::vector<std::vector<std::string>> rows = {{"model", "shape", "pair", "|δ| p50", "|δ| p99",
                                                 "|δ| max", "ppl Δ %", "KL (method)", "decided",
                                                 "verdict"}};
  for (const auto& c : res_.comparisons) {
    if (!c.noise) continue;
    bool ok = c.state == State::Compared;
    rows.push_back({matrix_model_name(spec_.models[c.model]), spec_.shapes[c.shape].shape.name,
                    "`" + c.cand_arm + "` vs `" + c.ref_arm + "`",
                    ok ? num(c.result.top1_logit_abs_delta.p50) : "–",
                    ok ? num(c.result.top1_logit_abs_delta.p99) : "–",
                    ok ? num(c.result.top1_logit_abs_delta.max) : "–",
                    ok ? num(c.result.ppl_diff_pct, "%+.3g") : "–", ok ? kl_text(c.result) : "–",
                    ok ? strformat("%lld / %lld", (long long)c.result.decided_disagree,
                                   (long long)c.result.decided)
                       : "–",
                    verdict_cell(c)});
  }
  d.table(rows, "noise-table");
}

void Reporter::section_like_for_like(Doc& d) {
  d.heading(2, "Not like-for-like", "like-for-like");
  d.para(
      "Derived from the op providers each trace header records (which kernel served each op, "
      "and fallbacks). Arms are meant to differ in precision and kernels; this section lists "
      "what else differs, so no comparison is read as more than it is.");
  // arm -> op -> provider -> shapes using it; arm -> fallbacks; arm -> weights dtypes.
  std::map<std::string, std::map<std::string, std::map<std::string, std::set<std::string>>>> use;
  std::map<std::string, int64_t> fallbacks;
  std::map<std::string, std::set<std::string>> weights;
  std::vector<std::string> arms_seen;
  for (const auto& t : traces_) {
    const Side& sd = sides_.at(t.file);
    if (t.aa || sd.state != State::Compared) continue;
    if (std::find(arms_seen.begin(), arms_seen.end(), t.arm) == arms_seen.end())
      arms_seen.push_back(t.arm);
    for (const auto& [op, provs] : parse_providers(sd.trace.header.providers))
      for (const auto& [p, n] : provs) use[t.arm][op][p].insert(spec_.shapes[t.shape].shape.name);
    fallbacks[t.arm] += std::max<int64_t>(sd.trace.header.fallbacks, 0);
    weights[t.arm].insert(sd.trace.header.weights);
  }
  std::set<std::string> ops;
  for (const auto& [arm, m] : use)
    for (const auto& [op, p] : m) ops.insert(op);
  std::vector<std::string> findings;
  const std::string& R = spec_.reference;
  // The same observation about several arms is one finding naming them all.
  std::map<std::string, std::set<std::string>> grouped;  // finding text -> arms
  auto arms_text = [](const std::set<std::string>& arms) {
    std::string o;
    for (const auto& a : arms) o += (o.empty() ? "`" : "`, `") + a;
    return o + "`";
  };
  for (const auto& arm : arms_seen) {
    const MatrixArm& a = spec_.arm(arm);
    if (fallbacks[arm] > 0)
      findings.push_back(
          strformat("`%s`: %lld op calls fell back to another provider than the tier promises.",
                    arm.c_str(), (long long)fallbacks[arm]));
    if (a.inject != "none")
      findings.push_back("`" + arm + "`: a deliberate fault is injected (`" + a.inject + "`).");
    if (!a.mix.empty())
      findings.push_back("`" + arm + "`: per-family precision mix `" + a.mix + "`.");
    for (const auto& [k, v] : a.env)
      findings.push_back("`" + arm + "`: environment `" + k + "=" + v + "`.");
    if (use.count(R) && arm != R && weights[arm] != weights[R])
      findings.push_back("`" + arm + "` holds weights as " + joined(weights[arm]) +
                         ", the reference as " + joined(weights[R]) + ".");
    for (const auto& op : ops) {
      bool here = use[arm].count(op), in_ref = use.count(R) && use[R].count(op);
      if (use.count(R) && arm != R && here && !in_ref)
        grouped["call op `" + op + "`, which the reference `" + R +
                "` does not (a fused or extra op: a different op sequence)"]
            .insert(arm);
      if (use.count(R) && arm != R && !here && in_ref)
        grouped["never call op `" + op + "`, which the reference `" + R + "` calls"].insert(arm);
      if (!here) continue;
      const auto& provs = use[arm][op];
      for (const auto& [p, shapes] : provs)
        if (!provider_of_device(p, a.device))
          findings.push_back("`" + arm + "` (" + a.device + "): op `" + op + "` was served by `" +
                             p + "`, a provider of another tier, at " + joined(shapes) + ".");
      // Group the shapes by the set of providers that served the op there.
      std::map<std::string, std::set<std::string>> by_shape;
      for (const auto& [p, shapes] : provs)
        for (const auto& sh : shapes) by_shape[sh].insert(p.substr(p.find('.') + 1));
      std::map<std::string, std::set<std::string>> groups;  // provider set -> shapes
      for (const auto& [sh, ps] : by_shape) groups[joined(ps, "", " + ")].insert(sh);
      if (groups.size() > 1) {
        std::string what;
        for (const auto& [ps, shapes] : groups)
          what += (what.empty() ? "" : "; ") + ps + " at " + joined(shapes, "", ", ");
        grouped["run op `" + op + "` on different kernels by shape (" + what +
                "): the shapes do not exercise the same code"]
            .insert(arm);
      }
    }
  }
  for (const auto& [text, arms] : grouped) findings.push_back(arms_text(arms) + ": " + text + ".");
  // Arms of one device and one compute dtype that still use different kernels for an op (an
  // env switch, a mix): differences between them are not precision alone.
  for (size_t i = 0; i < arms_seen.size(); ++i)
    for (size_t j = i + 1; j < arms_seen.size(); ++j) {
      const MatrixArm &a = spec_.arm(arms_seen[i]), &b = spec_.arm(arms_seen[j]);
      if (a.is_gpu() != b.is_gpu() || (!a.is_gpu() && a.device != b.device) ||
          a.compute() != b.compute())
        continue;
      for (const auto& op : ops) {
        std::set<std::string> pa, pb;
        for (const auto& [p, s] : use[a.name][op]) pa.insert(p);
        for (const auto& [p, s] : use[b.name][op]) pb.insert(p);
        if (!pa.empty() && !pb.empty() && pa != pb)
          findings.push_back("`" + a.name + "` and `" + b.name + "` (both " + a.compute() +
                             ") run op `" + op + "` on different kernels (" + joined(pa) + " vs " +
                             joined(pb) + ").");
      }
    }
  if (findings.empty())
    findings.push_back(
        "Nothing beyond the intended differences: every arm called the same ops with "
        "its own tier's providers, no fallbacks, no injected faults or mixes.");
  d.list(findings);
  std::vector<std::vector<std::string>> rows = {{"op"}};
  for (const auto& a : arms_seen) rows[0].push_back("`" + a + "`");
  for (const auto& op : ops) {
    std::vector<std::string> r = {"`" + op + "`"};
    for (const auto& a : arms_seen) {
      std::string cell;
      if (use[a].count(op))
        for (const auto& [p, s] : use[a][op]) cell += (cell.empty() ? "" : ", ") + p;
      r.push_back(cell.empty() ? "–" : cell);
    }
    rows.push_back(r);
  }
  d.table(rows, "providers-table");
}

void Reporter::section_plots(Doc& d) {
  d.heading(2, "Plots", "plots");
  d.para(
      "Per model and shape, one panel per compared pair, each on its own axes (a gross fault "
      "does not flatten a small one): (1) candidate − reference logit of the reference's top-1 "
      "token against the reference's top-1 − top-2 gap, top-1 disagreements as vermillion crosses, "
      "the "
      "decided threshold " +
      num(spec_.decided, "%g") +
      " dashed — a correct candidate disagrees only left of it; (2) the drift gate's KL at "
      "each position with its budget; (3) decided disagreements at each threshold of the sweep; "
      "(4) the distribution of the per-position NLL shift with its mean ± SE. Log axes only "
      "where the values span two decades or more. The matrix runs no per-layer drift "
      "(`arbiter drift`, `docs/localize.md`).");
  std::error_code ec;
  fs::create_directories(dir_ + "/plots", ec);
  if (ec) throw Error("[matrix] " + dir_ + "/plots: cannot create (" + ec.message() + ")");
  const char* kAgree = "#0072b2";     // Okabe-Ito blue
  const char* kDisagree = "#d55e00";  // Okabe-Ito vermillion
  for (size_t m = 0; m < spec_.models.size(); ++m)
    for (size_t s = 0; s < spec_.shapes.size(); ++s) {
      std::vector<const MatrixComparison*> cs;
      for (const auto& c : res_.comparisons)
        if (c.model == m && c.shape == s && !c.aa && c.state == State::Compared) cs.push_back(&c);
      if (cs.empty()) continue;
      const std::string mn = matrix_model_name(spec_.models[m]), sn = spec_.shapes[s].shape.name;
      d.heading(3, mn + " " + sn, "plots-" + mn + "-" + sn);
      const int columns = cs.size() > 1 ? 2 : 1, pw = 1200 / columns, ph = 300;
      auto panel = [&](const MatrixComparison* c, SvgChart::Kind kind) {
        SvgChart ch;
        ch.kind = kind;
        ch.width = pw;
        ch.height = ph;
        ch.title = c->ref_arm == spec_.reference ? c->cand_arm : c->cand_arm + " vs " + c->ref_arm;
        ch.title += " (" + upper(verdict_name(c->verdict)) + ")";
        return ch;
      };
      auto emit = [&](const std::vector<SvgChart>& panels, const std::string& kind,
                      const std::string& caption) {
        std::string file = "plots/" + mn + "." + sn + "." + kind + ".svg";
        std::string svg = render_svg_panels(panels, columns);
        write_file_atomic(dir_ + "/" + file, svg, "[matrix]");
        d.figure(caption, svg, file, "plot-" + mn + "-" + sn + "-" + kind);
      };

      std::vector<SvgChart> delta, kl, sweep, nll;
      for (const auto* c : cs) {
        const CompareResult& x = c->result;
        SvgChart ch = panel(c, SvgChart::Kind::Line);
        ch.x_label = "reference top-1 − top-2 gap (logits)";
        ch.y_label = "cand − ref logit of ref top-1";
        SvgSeries agree{"top-1 agrees", {}, {}, kAgree}, differ{"top-1 differs", {}, {}, kDisagree};
        agree.line = differ.line = false;
        differ.cross = true;
        for (const auto& p : x.points) {
          SvgSeries& se = p.disagree ? differ : agree;
          se.x.push_back(p.ref_gap);
          se.y.push_back(p.logit_delta);
        }
        ch.series = {agree, differ};
        ch.vlines.emplace_back(spec_.decided, "decided");
        delta.push_back(ch);

        ch = panel(c, SvgChart::Kind::Line);
        ch.auto_log_y = true;
        ch.x_label = "traced position (chunk-major)";
        ch.y_label = "KL(ref‖cand), nats";
        SvgSeries k{"", {}, {}, kAgree};
        for (size_t i = 0; i < x.points.size(); ++i) {
          k.x.push_back(double(i));
          k.y.push_back(x.points[i].drift_kl);
        }
        ch.series = {k};
        if (std::isfinite(x.drift_budget)) ch.hlines.emplace_back(x.drift_budget, "budget κu²");
        kl.push_back(ch);

        ch = panel(c, SvgChart::Kind::Line);
        ch.auto_log_y = true;
        ch.x_label = "decided threshold t (logits)";
        ch.y_label = "decided disagreements";
        SvgSeries w{"", {}, {}, kDisagree};
        for (const auto& p : x.sweep) {
          w.x.push_back(p.threshold);
          w.y.push_back(double(p.disagree));
        }
        ch.series = {w};
        ch.vlines.emplace_back(spec_.decided, "verdict");
        sweep.push_back(ch);

        ch = panel(c, SvgChart::Kind::Bar);
        ch.x_label = "NLL cand − ref (nats)";
        ch.y_label = "positions";
        double lo = INFINITY, hi = -INFINITY;
        for (double v : c->nll_shift)
          if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
        if (lo <= hi) {
          const int bins = 24;
          const double wd = hi > lo ? (hi - lo) / bins : 1.0;
          SvgSeries h{"", {}, std::vector<double>(hi > lo ? bins : 1, 0.0), kAgree};
          for (double v : c->nll_shift)
            if (std::isfinite(v)) h.y[std::min(h.y.size() - 1, size_t((v - lo) / wd))] += 1;
          ch.series = {h};
          for (size_t i = 0; i < h.y.size(); i += std::max<size_t>(1, h.y.size() / 6))
            ch.x_ticks.emplace_back(double(i), svg_number(lo + (double(i) + 0.5) * wd));
          // A value's position on the categorical axis: bin i is centred on x = i.
          auto at = [&](double v) { return (v - lo) / wd - 0.5; };
          double mean = x.nll_shift.mean, se = std::isfinite(x.nll_shift.se_chunk)
                                                   ? x.nll_shift.se_chunk
                                                   : x.nll_shift.se_iid;
          if (std::isfinite(mean)) {
            ch.title += ": mean " + svg_number(mean) + " ± " + svg_number(se) + " nats";
            ch.vlines.emplace_back(at(mean), "mean");
            if (std::isfinite(se) && se > 0) {
              ch.vlines.emplace_back(at(mean - se), "");
              ch.vlines.emplace_back(at(mean + se), "");
            }
          }
        }
        nll.push_back(ch);
      }
      emit(delta, "delta",
           mn + " " + sn + ": logit delta of the reference's top-1 against the reference gap");
      emit(kl, "kl", mn + " " + sn + ": per-position KL along the trace, with the drift budget");
      emit(sweep, "sweep", mn + " " + sn + ": decided disagreements by threshold");
      emit(nll, "nll", mn + " " + sn + ": NLL shift distribution, mean ± SE (dashed)");
    }
}

void Reporter::write_files() {
  Doc d;
  d.heading(1, "arbiter correctness matrix", "top");
  d.para("**Question:** " + spec_.question);
  d.para("**Answer:** " + res_.answer);
  d.para(strformat(
      "**Verdict:** %s (exit code %d). Spec `%s` (copied to `%s/%s`); traces and checksums in "
      "`%s/` (`sha256sum -c SHA256SUMS` there); machine-readable results in `results.json`.",
      upper(verdict_name(res_.worst)).c_str(), int(res_.worst), spec_.path.c_str(), dir_.c_str(),
      kMatrixSpecCopy, tdir_.c_str()));
  // The answer first (summary grid, then the plots), the tables and provenance below.
  section_summary(d);
  section_plots(d);
  section_results(d);
  section_details(d);
  section_sweep_ranks(d);
  section_controls(d);
  matrix_gate_section(spec_, gates_, d);
  section_like_for_like(d);
  section_environment(d);
  section_method(d);
  d.heading(2, "Files", "files");
  std::vector<std::string> files = {
      "`matrix.toml`: the spec this report judges",
      "`traces/`: every trace, with `METADATA.txt`, `RUNS.txt`, `SHA256SUMS`",
      "`run-status.tsv`: traces the last run skipped or failed",
      "`plots/`: the SVG plots (inlined in report.html)", "`results.json`: every number above"};
  if (spec_.has_gate) files.push_back("`gate-<model>.json`: each model's token gate");
  d.list(files);
  if (res_.problems.empty())
    d.para("Store check: every checksum matches and every trace is complete.");
  else {
    d.para("**Problems with the files on disk:**");
    std::vector<std::string> items;
    for (const auto& p : res_.problems) items.push_back(md_code(p));
    d.list(items);
  }

  res_.report_md = dir_ + "/report.md";
  res_.report_html = dir_ + "/report.html";
  res_.results_json = dir_ + "/results.json";
  write_file_atomic(res_.report_md, d.markdown(), "[matrix]");
  write_file_atomic(res_.report_html, d.html("arbiter correctness matrix"), "[matrix]");

  nlohmann::json j;
  j["spec"] = spec_.path;
  j["question"] = spec_.question;
  j["answer"] = res_.answer;
  j["verdict"] = verdict_name(res_.worst);
  j["exit_code"] = int(res_.worst);
  j["reference"] = spec_.reference;
  j["decided"] = spec_.decided;
  j["kl_kappa"] = spec_.kl_kappa > 0 ? spec_.kl_kappa : kDefaultKlKappa;
  j["sweep"] = spec_.sweep;
  j["topk"] = spec_.topk;
  j["models"] = spec_.models;
  j["corpus"] = spec_.corpus;
  j["shapes"] = nlohmann::json::array();
  for (const auto& s : spec_.shapes)
    j["shapes"].push_back({{"name", s.shape.name},
                           {"chunk_tokens", s.shape.chunk_tokens},
                           {"max_chunks", s.shape.max_chunks},
                           {"named_max_chunks", s.full_chunks},
                           {"prefill", s.shape.prefill},
                           {"start_token", s.shape.start_token}});
  j["arms"] = nlohmann::json::array();
  for (const auto& a : spec_.arms) {
    nlohmann::json env = nlohmann::json::object();
    for (const auto& [k, v] : a.env) env[k] = v;
    j["arms"].push_back({{"name", a.name},
                         {"device", a.device},
                         {"compute", a.compute()},
                         {"threads", a.threads},
                         {"inject", a.inject},
                         {"mix", a.mix.empty() ? "none" : a.mix},
                         {"env", env},
                         {"note", a.note}});
  }
  j["comparisons"] = nlohmann::json::array();
  const char* states[] = {"compared", "skipped", "missing", "error"};
  for (const auto& c : res_.comparisons) {
    nlohmann::json e = {{"model", matrix_model_name(spec_.models[c.model])},
                        {"shape", spec_.shapes[c.shape].shape.name},
                        {"ref", c.ref_arm},
                        {"cand", c.cand_arm},
                        {"candidate", c.candidate},
                        {"noise_floor", c.noise},
                        {"aa", c.aa},
                        {"state", states[int(c.state)]},
                        {"verdict", verdict_name(c.verdict)},
                        {"counted", c.counted}};
    if (!c.why.empty()) e["why"] = c.why;
    if (c.aa && c.state == State::Compared) {
      e["aa_identical"] = c.aa_identical;
      e["aa_detail"] = c.aa_detail;
    }
    if (c.state == State::Compared) e["result"] = to_json(c.result);
    j["comparisons"].push_back(e);
  }
  if (spec_.has_gate) j["gates"] = matrix_gate_json(spec_, gates_);
  j["problems"] = res_.problems;
  write_file_atomic(res_.results_json, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                    "[matrix]");
}

MatrixResults Reporter::run() {
  load_sides();
  update_store();
  compare_all();
  group_skips();
  headline();
  write_files();
  return res_;
}

}  // namespace

MatrixResults matrix_report(const MatrixSpec& spec, const std::string& dir) {
  Reporter r(spec, dir);
  return r.run();
}

std::string format_matrix_summary(const MatrixSpec& spec, const MatrixResults& r) {
  std::string s = strformat("%-20s %-9s %-14s %-10s %9s %9s %10s  %s\n", "model", "shape", "arm",
                            "vs", "decided", "disagree", "p99|d|", "verdict");
  for (const auto& c : r.comparisons) {
    std::string arm = c.cand_arm + (c.aa ? " (A/A)" : "");
    std::string v = upper(verdict_name(c.verdict));
    if (c.state == State::Skipped)
      v = "SKIP" + std::string(c.counted ? " (counted: FAIL)" : "");
    else if (c.state == State::Missing)
      v = "MISSING";
    bool ok = c.state == State::Compared;
    s += strformat("%-20s %-9s %-14s %-10s %9s %9s %10s  %s%s\n",
                   matrix_model_name(spec.models[c.model]).c_str(),
                   spec.shapes[c.shape].shape.name.c_str(), arm.c_str(), c.ref_arm.c_str(),
                   ok ? std::to_string(c.result.decided).c_str() : "-",
                   ok ? std::to_string(c.result.decided_disagree).c_str() : "-",
                   ok ? num(c.result.top1_logit_abs_delta.p99).c_str() : "-", v.c_str(),
                   c.noise && !c.candidate ? " (noise floor)" : "");
  }
  for (const auto& p : r.problems) s += "PROBLEM " + p + "\n";
  return s;
}

}  // namespace arbiter::verify
