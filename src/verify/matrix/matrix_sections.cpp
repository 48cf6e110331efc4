// The matrix report's sections, each from the judged comparisons (matrix_reporter.h).
#include "verify/matrix/matrix_reporter.h"

namespace arbiter::verify::report {

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
        if (x.routes.compared)
          cell += strformat("<br>routing flips %lld (%lld decided)", (long long)x.routes.flips,
                            (long long)x.routes.decided);
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
    if (x.routes.compared)
      items.push_back(strformat(
          "routing flips %lld of %lld (position, layer) pairs: %lld decided (reference %s margin "
          ">= %g), %lld near-tie; largest reference margin at a flip %s",
          (long long)x.routes.flips, (long long)x.routes.pairs, (long long)x.routes.decided,
          x.routes.score.c_str(), x.routes.threshold, (long long)x.routes.near_tie,
          num(x.routes.max_margin_at_flip).c_str()));
    else if (x.routes.recorded)
      items.push_back("routing flips not compared: " + x.routes.note);
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

void Reporter::section_quantization(Doc& d) {
  if (res_.quantization.empty()) return;
  d.heading(2, "Quantization error", "quantization");
  d.para(
      "Two questions, kept apart. **Kernel error** is what the results above judge: every arm "
      "against the reference `" + spec_.reference + "` on the same quantized weights, whose "
      "oracle is their exact dequantization. **Quantization error** is this table: the reference "
      "on the quantized weights against the same reference on the unquantized parent "
      "(`[parents]`), with the statistics `llama-perplexity --kl-divergence` reports, from full "
      "logits: KLD(parent ‖ quantized) per position, Δp = p(target) quantized − parent, the "
      "share of positions whose top token agrees. It is measured, not judged: it does not change "
      "the verdict.");
  auto at = [](const std::vector<std::pair<double, double>>& p, double f) {
    for (const auto& [frac, v] : p)
      if (frac == f) return v;
    return std::nan("");
  };
  auto pm = [](const ValueUnc& x, double scale, const char* fmt) {
    return strformat(fmt, scale * x.value) + " ± " + strformat(fmt, scale * x.unc);
  };
  std::vector<std::vector<std::string>> rows = {
      {"model", "parent", "shape", "rows", "mean KLD", "KLD 99% / 99.9% / max", "same top p",
       "mean Δp", "RMS Δp", "Δp 1% / 99%", "PPL(Q)/PPL(parent)", "parent-decided flips"}};
  std::vector<std::string> notes;
  for (const auto& c : res_.quantization) {
    std::vector<std::string> r = {matrix_model_name(spec_.models[c.model]),
                                  md_code(spec_.parents[c.model]),
                                  spec_.shapes[c.shape].shape.name};
    if (c.state != State::Compared || !c.result.llama) {
      const std::string why = c.state != State::Compared ? c.why : c.result.llama_note;
      notes.push_back(r[0] + " " + r[2] + ": " + md_code(why));
      r.insert(r.end(), {"–", "–", "–", "–", "–", "–", "–", "–", "–"});
    } else {
      const LlamaKldStats& k = *c.result.llama;
      const auto& kp = k.kld_percentiles;
      r.insert(r.end(),
               {std::to_string(k.count), pm(k.kld, 1, "%.4g"),
                num(at(kp, 0.99)) + " / " + num(at(kp, 0.999)) + " / " + num(at(kp, 1.0)),
                pm(k.same_top, 100, "%.2f") + " %", pm(k.dp, 100, "%.3f") + " %",
                pm(k.rms_dp, 100, "%.3f") + " %",
                num(100 * at(k.dp_percentiles, 0.01), "%.3f") + " / " +
                    num(100 * at(k.dp_percentiles, 0.99), "%.3f") + " %",
                pm(k.ppl_ratio, 1, "%.5f")});
    }
    r.push_back(c.state == State::Compared
                    ? strformat("%lld / %lld", (long long)c.result.decided_disagree,
                                (long long)c.result.decided)
                    : "–");
    rows.push_back(std::move(r));
  }
  d.table(rows, "quantization-table");
  if (!notes.empty()) d.list(notes);
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

}  // namespace arbiter::verify::report
