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
  void write_files();
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
  std::set<std::string> skipped;
  for (const auto& c : res_.comparisons) {
    if (c.state == State::Skipped) {
      skipped.insert(c.cand_arm + " (" + c.why + ")");
      continue;
    }
    if (c.candidate && c.state == State::Compared) {
      decided += c.result.decided;
      ++compared;
    }
    if (!c.counted || c.verdict == Verdict::Pass) continue;
    std::string what = label(c) + ": ";
    if (c.state != State::Compared)
      what += upper(verdict_name(c.verdict)) + " — " + c.why;
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
        why.push_back("mean KL " + num(x.kl.mean) + " nats exceeds the drift budget " +
                      num(x.drift_budget));
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
    std::set<std::string> arms;
    std::string why;
    for (const auto& c : res_.comparisons)
      if (c.state == State::Skipped) arms.insert("`" + c.cand_arm + "`"), why = c.why;
    a += " **Not tested here:** " + joined(arms, "", ", ") + " — SKIP (" + why +
         "); a skipped arm is never counted as passed.";
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
  if (c.state == State::Skipped) return "SKIP: " + c.why;
  if (c.state == State::Missing) return "MISSING: " + c.why;
  if (c.state == State::Error) return upper(verdict_name(c.verdict)) + ": " + c.why;
  std::string v = upper(verdict_name(c.verdict));
  if (c.verdict == Verdict::Incomparable && !c.result.reasons.empty())
    v += ": " + c.result.reasons[0];
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

void Reporter::section_results(Doc& d) {
  d.heading(2, "Results", "results");
  d.para(
      "Per model, shape and compared pair. *top-1 disagree*: positions whose top-1 ids differ; "
      "*decided*: disagreements among decided positions / decided positions, and that *rate*; "
      "*max gap*: the largest reference top-1 margin at any disagreement (the verdict flips at a "
      "threshold below it); *|δ|*: |candidate − reference| logit of the reference's top-1 token "
      "(p50/p90/p99/max); *ppl Δ*: perplexity difference in percent ± SE (chunk batch means); "
      "*KL*: mean KL(ref‖cand) per position (top-k tail estimate, a lower bound, unless full "
      "logits "
      "were stored); *drift gate*: mean KL against its budget κ·u² (u the coarser unit roundoff "
      "of the two arms; `docs/traces.md`), pass/fail/n/a; *noise floor*: p99 |δ| of the spec's "
      "trusted pairs at the same model and shape, "
      "and this row's multiple of it.");
  for (size_t m = 0; m < spec_.models.size(); ++m) {
    d.heading(3, "Model " + matrix_model_name(spec_.models[m]),
              "results-" + matrix_model_name(spec_.models[m]));
    std::vector<std::vector<std::string>> rows = {
        {"shape", "arm", "vs", "positions", "top-1 disagree", "decided", "rate", "max gap",
         "|δ| p50", "|δ| p90", "|δ| p99", "|δ| max", "ppl Δ % ± SE", "KL mean", "drift gate",
         "noise floor", "verdict"}};
    for (const auto& c : res_.comparisons) {
      if (c.model != m || c.aa) continue;
      std::vector<std::string> r = {spec_.shapes[c.shape].shape.name, "`" + c.cand_arm + "`",
                                    "`" + c.ref_arm + "`"};
      if (c.state != State::Compared) {
        r.resize(16, "–");
        r.push_back(verdict_cell(c));
        rows.push_back(r);
        continue;
      }
      const CompareResult& x = c.result;
      r.push_back(std::to_string(x.positions));
      r.push_back(strformat("%lld (%.2f%%)", (long long)x.disagree,
                            x.positions ? 100.0 * x.disagree / x.positions : 0.0));
      r.push_back(strformat("%lld / %lld", (long long)x.decided_disagree, (long long)x.decided));
      r.push_back(x.decided ? strformat("%.3g%%", 100.0 * x.decided_disagree / x.decided) : "–");
      r.push_back(num(x.max_gap_at_disagreement));
      r.push_back(num(x.top1_logit_abs_delta.p50));
      r.push_back(num(x.top1_logit_abs_delta.p90));
      r.push_back(num(x.top1_logit_abs_delta.p99));
      r.push_back(num(x.top1_logit_abs_delta.max));
      r.push_back(num(x.ppl_diff_pct, "%+.3g") + " ± " + num(x.ppl_diff_pct_se));
      r.push_back(num(x.kl.mean) + (x.kl_method == "exact" ? " (exact)" : ""));
      r.push_back(x.drift_status +
                  (std::isfinite(x.kl_over_u2) ? " (KL/u² " + num(x.kl_over_u2) + ")" : ""));
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
                                                 "|δ| max", "ppl Δ %", "KL mean", "decided",
                                                 "verdict"}};
  for (const auto& c : res_.comparisons) {
    if (!c.noise) continue;
    bool ok = c.state == State::Compared;
    rows.push_back({matrix_model_name(spec_.models[c.model]), spec_.shapes[c.shape].shape.name,
                    "`" + c.cand_arm + "` vs `" + c.ref_arm + "`",
                    ok ? num(c.result.top1_logit_abs_delta.p50) : "–",
                    ok ? num(c.result.top1_logit_abs_delta.p99) : "–",
                    ok ? num(c.result.top1_logit_abs_delta.max) : "–",
                    ok ? num(c.result.ppl_diff_pct, "%+.3g") : "–",
                    ok ? num(c.result.kl.mean) : "–",
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
      "Per model and shape: top-1 disagreement rate by reference gap (the decided threshold is " +
      num(spec_.decided, "%g") +
      "; a correct candidate disagrees only at small gaps), where the "
      "reference's top-1 token ranks in the candidate's list (log scale), and the per-position NLL "
      "shift (candidate − reference, nats) in trace order.");
  std::error_code ec;
  fs::create_directories(dir_ + "/plots", ec);
  if (ec) throw Error("[matrix] " + dir_ + "/plots: cannot create (" + ec.message() + ")");
  for (size_t m = 0; m < spec_.models.size(); ++m)
    for (size_t s = 0; s < spec_.shapes.size(); ++s) {
      std::vector<const MatrixComparison*> cs;
      for (const auto& c : res_.comparisons)
        if (c.model == m && c.shape == s && !c.aa && c.state == State::Compared) cs.push_back(&c);
      if (cs.empty()) continue;
      const std::string mn = matrix_model_name(spec_.models[m]), sn = spec_.shapes[s].shape.name;
      auto name = [&](const MatrixComparison* c) {
        return c->ref_arm == spec_.reference ? c->cand_arm : c->cand_arm + " vs " + c->ref_arm;
      };
      auto emit = [&](const SvgChart& ch, const std::string& kind, const std::string& caption) {
        std::string file = "plots/" + mn + "." + sn + "." + kind + ".svg";
        std::string svg = render_svg(ch);
        write_file_atomic(dir_ + "/" + file, svg, "[matrix]");
        d.figure(caption, svg, file, "plot-" + mn + "-" + sn + "-" + kind);
      };
      SvgChart gap;
      gap.kind = SvgChart::Kind::Bar;
      gap.title = mn + " " + sn + ": top-1 disagreement vs reference gap";
      gap.x_label = "reference top-1 − top-2 logit gap (positions)";
      gap.y_label = "disagreement rate (%)";
      gap.height = 360;
      for (size_t i = 0; i < cs[0]->result.gap_buckets.size(); ++i) {
        const GapBucket& b = cs[0]->result.gap_buckets[i];
        gap.x_ticks.emplace_back(double(i),
                                 "[" + svg_number(b.lo) + ", " +
                                     (std::isfinite(b.hi) ? svg_number(b.hi) : std::string("∞")) +
                                     ") n=" + std::to_string(b.positions));
      }
      for (const auto* c : cs) {
        SvgSeries se;
        se.name = name(c);
        for (const auto& b : c->result.gap_buckets)
          se.y.push_back(b.positions ? 100.0 * double(b.disagree) / double(b.positions) : NAN);
        gap.series.push_back(se);
      }
      emit(gap, "gap", mn + " " + sn + ": top-1 disagreement rate by reference gap bucket");

      SvgChart rank;
      rank.kind = SvgChart::Kind::Bar;
      rank.log_y = true;
      rank.title = mn + " " + sn + ": rank of the reference's top-1 in the candidate's top-k";
      rank.x_label = "rank (1 = agreement)";
      rank.y_label = "positions";
      rank.height = 360;
      for (int k = 1; k <= spec_.topk; ++k)
        rank.x_ticks.emplace_back(double(k - 1), std::to_string(k));
      rank.x_ticks.emplace_back(double(spec_.topk), "beyond");
      for (const auto* c : cs) {
        SvgSeries se;
        se.name = name(c);
        for (int k = 0; k < spec_.topk; ++k)
          se.y.push_back(size_t(k) < c->result.rank_hist.size()
                             ? double(c->result.rank_hist[size_t(k)])
                             : 0.0);
        se.y.push_back(double(c->result.rank_beyond));
        rank.series.push_back(se);
      }
      emit(rank, "rank", mn + " " + sn + ": rank histogram (log scale; empty bars are zero)");

      SvgChart nll;
      nll.title = mn + " " + sn + ": per-position NLL shift";
      nll.x_label = "traced position (chunk-major)";
      nll.y_label = "NLL cand − ref (nats)";
      nll.height = 360;
      for (const auto* c : cs) {
        SvgSeries se;
        se.name = name(c);
        se.markers = c->nll_shift.size() <= 160;
        for (size_t i = 0; i < c->nll_shift.size(); ++i) {
          se.x.push_back(double(i));
          se.y.push_back(c->nll_shift[i]);
        }
        nll.series.push_back(se);
      }
      nll.hlines.emplace_back(0.0, "0");
      emit(nll, "nll", mn + " " + sn + ": NLL shift per position (candidate − reference)");
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
  section_environment(d);
  section_method(d);
  section_results(d);
  section_sweep_ranks(d);
  section_controls(d);
  matrix_gate_section(spec_, gates_, d);
  section_like_for_like(d);
  section_plots(d);
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
    d.list(res_.problems);
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
