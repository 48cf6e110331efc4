// Matrix judgement and report: load the spec's traces from DIR/traces, regenerate and
// verify the store, compare every pair, write report.md / report.html / results.json and
// the SVG plots. Everything is derived from files on disk (and DIR/run-status.tsv for the
// traces a run skipped or failed), so `matrix report DIR` rebuilds what `matrix run` wrote.
#include "verify/matrix/matrix_report.h"

#include "verify/matrix/matrix_reporter.h"

namespace arbiter::verify {

namespace report {

const Side& Reporter::side(size_t m, size_t s, const std::string& arm, bool aa, bool parent) const {
  for (const auto& t : traces_)
    if (t.model == m && t.shape == s && t.arm == arm && t.aa == aa && t.parent == parent)
      return sides_.at(t.file);
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
    if (!t.logits.empty() && fs::exists(tdir_ + "/" + t.logits)) sd.logits = tdir_ + "/" + t.logits;
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
                                 const std::string& cand, bool aa, bool quantization) {
  MatrixComparison c;
  c.model = m;
  c.shape = s;
  c.ref_arm = ref;
  c.cand_arm = cand;
  c.aa = aa;
  c.counted = !quantization;
  const Side& a = side(m, s, ref, false, quantization);
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
    if (c.state == State::Skipped && !quantization) {
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
  if (quantization) {
    opt.other_weights = true;
    if (!a.logits.empty() && !b.logits.empty()) opt.ref_logits = a.logits, opt.cand_logits = b.logits;
  }
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
      if (!spec_.parents[m].empty())
        res_.quantization.push_back(judge(m, s, spec_.reference, spec_.reference, false, true));
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
  section_quantization(d);
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
  j["quantization"] = nlohmann::json::array();
  for (const auto& c : res_.quantization) {
    nlohmann::json e = {{"model", matrix_model_name(spec_.models[c.model])},
                        {"parent", spec_.parents[c.model]},
                        {"shape", spec_.shapes[c.shape].shape.name},
                        {"arm", c.ref_arm},
                        {"state", states[int(c.state)]}};
    if (!c.why.empty()) e["why"] = c.why;
    if (c.state == State::Compared) e["result"] = to_json(c.result);
    j["quantization"].push_back(e);
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

}  // namespace report

using report::num;
using report::Reporter;
using report::State;
using report::upper;

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
  for (const auto& c : r.quantization) {
    s += "quantization error " + matrix_model_name(spec.models[c.model]) + " " +
         spec.shapes[c.shape].shape.name + " vs parent " + spec.parents[c.model] + ": ";
    if (c.state == State::Compared && c.result.llama)
      s += strformat("mean KLD %.4g ± %.2g, same top p %.2f ± %.2f %% (measured, not judged)\n",
                     c.result.llama->kld.value, c.result.llama->kld.unc,
                     100 * c.result.llama->same_top.value, 100 * c.result.llama->same_top.unc);
    else
      s += (c.state == State::Compared ? c.result.llama_note : c.why) + "\n";
  }
  for (const auto& p : r.problems) s += "PROBLEM " + p + "\n";
  return s;
}

}  // namespace arbiter::verify
