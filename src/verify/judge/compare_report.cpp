// The human report and the JSON form of a CompareResult. The report always prints the
// threshold-free numbers (largest reference gap at any disagreement, gap buckets, rank
// histogram, sweep) so that nobody tunes a threshold after seeing the verdict.
#include <cmath>

#include "core/error.h"
#include "core/text_table.h"
#include "verify/judge/compare.h"

namespace arbiter::verify {

namespace {

std::string num(double v, const char* fmt = "%.4g") {
  if (std::isnan(v)) return "n/a";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return strformat(fmt, v);
}

std::string pct(int64_t a, int64_t b) {
  return b > 0 ? strformat("%.3f%%", 100.0 * double(a) / double(b)) : "n/a";
}

std::string mean_line(const MeanSe& m, const char* unit) {
  if (m.n == 0) return "n/a (no positions)";
  return strformat("%s%s%s  (SE iid %s, SE chunk %s over %lld chunks; t iid %s, t chunk %s; n %lld)",
                   num(m.mean, "%+.6g").c_str(), *unit ? " " : "", unit, num(m.se_iid, "%.3g").c_str(),
                   num(m.se_chunk, "%.3g").c_str(), (long long)m.chunks,
                   num(m.t_iid, "%.2f").c_str(), num(m.t_chunk, "%.2f").c_str(), (long long)m.n);
}

std::string quant_line(const Quantiles& q) {
  if (q.n == 0) return "n/a (no positions)";
  return strformat("p50 %s  p90 %s  p99 %s  max %s  (n %lld)", num(q.p50, "%.4g").c_str(),
                   num(q.p90, "%.4g").c_str(), num(q.p99, "%.4g").c_str(),
                   num(q.max, "%.4g").c_str(), (long long)q.n);
}

std::string bucket_name(const GapBucket& b) {
  return std::isinf(b.hi) ? strformat("[%g, inf)", b.lo) : strformat("[%g, %g)", b.lo, b.hi);
}

nlohmann::json jnum(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

nlohmann::json jmean(const MeanSe& m) {
  return {{"n", m.n},           {"chunks", m.chunks},         {"mean", jnum(m.mean)},
          {"sd", jnum(m.sd)},   {"se_iid", jnum(m.se_iid)},   {"se_chunk", jnum(m.se_chunk)},
          {"t_iid", jnum(m.t_iid)}, {"t_chunk", jnum(m.t_chunk)}};
}

nlohmann::json jquant(const Quantiles& q) {
  return {{"n", q.n}, {"p50", jnum(q.p50)}, {"p90", jnum(q.p90)}, {"p99", jnum(q.p99)},
          {"max", jnum(q.max)}};
}

// Always present, so that a script can tell "no preamble" from an older compare.
nlohmann::json jpreamble(const TracePreamble& p) {
  return {{"lines", p.lines}, {"first", p.lines > 0 ? nlohmann::json(p.first) : nlohmann::json()}};
}

}  // namespace

std::string format_report(const CompareResult& r) {
  std::string s;
  auto line = [&](const std::string& l) { s += l + "\n"; };
  line("arbiter compare");
  line("  ref   " + r.ref_label + "  (" + r.ref_device + ")");
  line("  cand  " + r.cand_label + "  (" + r.cand_device + ")");
  for (const auto& n : r.notes) line("  note: " + n);
  for (const auto& m : r.mismatches) line("  DIFFERS " + m.field + ": " + m.detail);
  for (const auto& u : r.unchecked) line("  not checked: " + u);

  if (r.verdict != Verdict::Incomparable) {
    line(strformat("  positions %lld in %lld chunks (ref rows %lld, cand rows %lld); top-k ref %lld, "
                   "cand %lld",
                   (long long)r.positions, (long long)r.chunks, (long long)r.ref_rows,
                   (long long)r.cand_rows, (long long)r.topk_ref, (long long)r.topk_cand));
    line("");
    line("top-1 agreement");
    line(strformat("  disagreements                 %lld / %lld (%s)", (long long)r.disagree,
                   (long long)r.positions, pct(r.disagree, r.positions).c_str()));
    line(strformat("  decided (ref gap >= %g)        %lld positions, %lld disagreements   <- gate",
                   r.decided_threshold, (long long)r.decided, (long long)r.decided_disagree));
    line("  largest ref top1-top2 gap at any disagreement: " +
         (r.disagree == 0 ? std::string("none (no disagreement)")
                          : num(r.max_gap_at_disagreement, "%.6g")));
    std::string sw = "  sweep:";
    for (const auto& p : r.sweep)
      sw += strformat("  gap>=%g: %lld/%lld", p.threshold, (long long)p.disagree,
                      (long long)p.decided);
    line(sw + "   (disagreements/decided)");
    std::string bk = "  by ref gap:";
    for (const auto& b : r.gap_buckets)
      bk += strformat("  %s %lld/%lld", bucket_name(b).c_str(), (long long)b.disagree,
                      (long long)b.positions);
    if (r.gap_unknown) bk += strformat("  unknown %lld", (long long)r.gap_unknown);
    line(bk + "   (disagreements/positions)");
    std::string rk = "  rank of ref top-1 in cand top-k:";
    for (size_t i = 0; i < r.rank_hist.size(); ++i)
      if (r.rank_hist[i]) rk += strformat("  %zu: %lld", i + 1, (long long)r.rank_hist[i]);
    rk += strformat("  beyond: %lld;  worst %s", (long long)r.rank_beyond,
                    r.worst_rank == 0 ? (r.rank_beyond ? "beyond top-k" : "n/a")
                                      : std::to_string(r.worst_rank).c_str());
    line(rk);
    if (!r.worst_disagreements.empty()) {
      line("  disagreements, largest ref gap first (cand_rank: of the ref top-1 in cand's top-k):");
      TextTable t({{"chunk"}, {"pos"}, {"abs_pos"}, {"target"}, {"ref_top1"}, {"cand_top1"}, {"ref_gap"},
                   {"cand_rank"}});
      for (const auto& d : r.worst_disagreements)
        t.row({std::to_string(d.chunk), std::to_string(d.pos), std::to_string(d.abs_pos), std::to_string(d.target),
               std::to_string(d.ref_top1), std::to_string(d.cand_top1), num(d.ref_gap, "%.6g"),
               d.cand_rank ? std::to_string(d.cand_rank) : "beyond"});
      s += t.str("    ");
    }
    if (r.routes.recorded) {
      line("");
      s += format_route_flips(r.routes, "");
    }
    line("");
    if (r.logit_units == "shifted") {
      line("logit of ref top-1 token, cand - ref: n/a (raw logits without lse against log-probabilities)");
    } else {
      line(r.logit_units == "logprob" ? "log-probability of ref top-1 token, cand - ref (not raw logits)"
                                      : "logit of ref top-1 token, cand - ref");
      line("  |delta|      " + quant_line(r.top1_logit_abs_delta));
      line("  mean delta   " + mean_line(r.top1_logit_delta, ""));
    }
    if (r.top1_logit_unavailable)
      line(strformat("  unavailable at %lld positions (token not in cand top-k)",
                     (long long)r.top1_logit_unavailable));
    line("");
    line("nll / perplexity (positions where both nll are finite)");
    line(strformat("  ppl ref %s  cand %s  diff %s%% (SE %s%%)", num(r.ppl_ref, "%.6g").c_str(),
                   num(r.ppl_cand, "%.6g").c_str(), num(r.ppl_diff_pct, "%+.4g").c_str(),
                   num(r.ppl_diff_pct_se, "%.2g").c_str()));
    line("  nll shift    " + mean_line(r.nll_shift, "nats"));
    line(strformat("  cand nll higher at %lld, lower at %lld, equal at %lld positions",
                   (long long)r.nll_higher, (long long)r.nll_lower, (long long)r.nll_equal));
    line("");
    line(strformat("spread (top-1 minus top-%lld logit)", (long long)r.spread_k));
    if (r.spread_k < 2) {
      line("  n/a (top-k < 2)");
    } else {
      line("  ref          " + mean_line(r.spread_ref, ""));
      line("  cand         " + mean_line(r.spread_cand, ""));
      line("  cand - ref   " + mean_line(r.spread_shift, ""));
    }
    line("");
    line("KL(ref || cand), nats per position: " + r.kl_method + " -- " + r.kl_note);
    if (r.kl_method != "unavailable") {
      line("  mean         " + mean_line(r.kl, "nats"));
      line("  per position " + quant_line(r.kl_q));
    }
    if (!r.drift_kl_method.empty())
      line("  judged       " + mean_line(r.drift_kl, "nats") + "  (" + r.drift_kl_method + ")");
    line(strformat("  drift gate   KL/u^2 %s, budget kappa*u^2 %s nats (kappa %s; %s): %s   <- gate",
                   num(r.kl_over_u2, "%.4g").c_str(), num(r.drift_budget, "%.3g").c_str(),
                   num(r.drift_kappa, "%g").c_str(), r.drift_note.c_str(),
                   r.drift_status == "fail"   ? "FAIL"
                   : r.drift_status == "pass" ? strformat("pass (KL/budget %.3g)", r.drift_kl.mean / r.drift_budget).c_str()
                                              : "n/a"));
    line("");
    // "t chunk 229" on a passing run alarms readers who take t for a size (issue 32).
    line("legend: t = mean / SE, how many standard errors the mean is from 0; 't chunk' uses the SE of");
    line("  chunk batch means (positions inside a chunk are correlated). It measures certainty, not size:");
    line("  a consistent rounding shift of a lower-precision tier gives t in the hundreds over many");
    line("  positions. It matters only when the mean itself is material (a shift of ~0.01 nats or more);");
    line("  it decides nothing: the gates are the lines marked '<- gate'. `compare --explain` shows the sums.");
    line("");
  }
  if (r.llama) s += format_llama_kld(*r.llama) + "\n";
  else line("llama-perplexity statistics: " + r.llama_note);
  line(strformat("non-finite values: ref %lld, cand %lld", (long long)r.nonfinite_ref,
                 (long long)r.nonfinite_cand) +
       (r.kl_method == "exact" ? strformat("; in full-logits files: ref %lld, cand %lld",
                                           (long long)r.nonfinite_logits_ref,
                                           (long long)r.nonfinite_logits_cand)
                               : std::string()));
  line(std::string("VERDICT: ") + verdict_name(r.verdict) + (r.forced ? " (FORCED)" : ""));
  for (const auto& why : r.reasons) line("  " + why);
  return s;
}

namespace {

void explain_mean(std::string& s, const char* name, const MeanSe& m, const char* unit) {
  s += strformat("%s (%s): n %lld positions in B %lld chunks\n", name, unit, (long long)m.n, (long long)m.chunks);
  if (m.n == 0) {
    s += "  n/a (no positions)\n";
    return;
  }
  s += strformat("  mean x̄ = Σ x_i / n = %s\n", num(m.mean, "%.6g").c_str());
  s += strformat("  sd = sqrt(Σ (x_i - x̄)² / (n - 1)) = %s\n", num(m.sd, "%.6g").c_str());
  s += strformat("  SE iid = sd / √n = %s / √%lld = %s\n", num(m.sd, "%.6g").c_str(), (long long)m.n,
                 num(m.se_iid, "%.6g").c_str());
  s += strformat("  SE chunk = sqrt(B/(B-1) · Σ_c (S_c - n_c·x̄)²) / n, S_c and n_c chunk c's sum and count = %s%s\n",
                 num(m.se_chunk, "%.6g").c_str(), m.chunks < 2 ? " (needs B >= 2)" : "");
  s += strformat("  t iid = x̄ / SE iid = %s / %s = %s\n", num(m.mean, "%.6g").c_str(), num(m.se_iid, "%.6g").c_str(),
                 num(m.t_iid, "%.4g").c_str());
  s += strformat("  t chunk = x̄ / SE chunk = %s / %s = %s\n", num(m.mean, "%.6g").c_str(),
                 num(m.se_chunk, "%.6g").c_str(), num(m.t_chunk, "%.4g").c_str());
}

}  // namespace

std::string format_explain(const CompareResult& r) {
  std::string s = "how these numbers are computed (docs/traces.md §Standard errors, §Drift gate)\n";
  if (r.verdict == Verdict::Incomparable) return s + "  n/a: the traces are incomparable\n";
  s += strformat("decided gate: a position is decided when ref top1 - top2 logit >= %g; %lld decided, "
                 "%lld disagree there (fail when > 0)\n",
                 r.decided_threshold, (long long)r.decided, (long long)r.decided_disagree);
  if (r.logit_units != "shifted") explain_mean(s, "mean delta, x_i = cand - ref logit of ref top-1", r.top1_logit_delta, r.logit_units.c_str());
  explain_mean(s, "nll shift, x_i = cand nll - ref nll", r.nll_shift, "nats");
  s += strformat("  ppl = exp(mean nll): ref exp(%s) = %s, cand exp(%s) = %s\n", num(r.mean_nll_ref, "%.6g").c_str(),
                 num(r.ppl_ref, "%.6g").c_str(), num(r.mean_nll_cand, "%.6g").c_str(), num(r.ppl_cand, "%.6g").c_str());
  s += strformat("  ppl diff = 100·(exp(x̄) - 1) = %s%%, SE = 100·exp(x̄)·SE chunk = %s%%\n",
                 num(r.ppl_diff_pct, "%.6g").c_str(), num(r.ppl_diff_pct_se, "%.3g").c_str());
  if (r.spread_k >= 2) explain_mean(s, "spread shift, x_i = cand - ref (top-1 minus top-K logit)", r.spread_shift, "logits");
  if (!r.drift_kl_method.empty()) {
    explain_mean(s, ("KL judged (" + r.drift_kl_method + ")").c_str(), r.drift_kl, "nats");
    s += strformat("drift gate: u = max(u_ref, u_cand, 2^-24) = %s; budget = kappa·u² = %s·%s² = %s nats; "
                   "KL/u² = %s / %s² = %s; fail when mean KL > budget: %s\n",
                   num(r.drift_u, "%.6g").c_str(), num(r.drift_kappa, "%g").c_str(), num(r.drift_u, "%.6g").c_str(),
                   num(r.drift_budget, "%.6g").c_str(), num(r.drift_kl.mean, "%.6g").c_str(),
                   num(r.drift_u, "%.6g").c_str(), num(r.kl_over_u2, "%.6g").c_str(), r.drift_status.c_str());
  } else {
    s += "drift gate: n/a (" + r.drift_note + ")\n";
  }
  if (r.routes.compared)
    s += strformat("routing flips: a (position, layer) pair flips when the two sides' expert sets differ; "
                   "decided when the reference's %s margin (k-th minus (k+1)-th score) >= %g, else "
                   "near-tie: %lld of %lld pairs flip, %lld decided + %lld near-tie (reported, not a gate)\n",
                   r.routes.score.c_str(), r.routes.threshold, (long long)r.routes.flips,
                   (long long)r.routes.pairs, (long long)r.routes.decided, (long long)r.routes.near_tie);
  return s;
}

nlohmann::json to_json(const CompareResult& r) {
  using nlohmann::json;
  json j;
  j["verdict"] = verdict_name(r.verdict);
  j["exit_code"] = int(r.verdict);
  j["reasons"] = r.reasons;
  j["forced"] = r.forced;
  j["routing_flips"] = to_json(r.routes);
  j["ref"] = {{"label", r.ref_label}, {"device", r.ref_device}, {"rows", r.ref_rows},
              {"topk", r.topk_ref}, {"nonfinite", r.nonfinite_ref},
              {"nonfinite_logits", r.nonfinite_logits_ref}, {"preamble", jpreamble(r.ref_preamble)}};
  j["cand"] = {{"label", r.cand_label}, {"device", r.cand_device}, {"rows", r.cand_rows},
               {"topk", r.topk_cand}, {"nonfinite", r.nonfinite_cand},
               {"nonfinite_logits", r.nonfinite_logits_cand}, {"preamble", jpreamble(r.cand_preamble)}};
  j["mismatches"] = json::array();
  for (const auto& m : r.mismatches) j["mismatches"].push_back({{"field", m.field}, {"detail", m.detail}});
  j["unchecked"] = r.unchecked;
  j["notes"] = r.notes;
  if (r.verdict == Verdict::Incomparable) return j;

  j["positions"] = r.positions;
  j["chunks"] = r.chunks;
  json top1;
  top1["disagree"] = r.disagree;
  top1["decided_threshold"] = r.decided_threshold;
  top1["decided"] = r.decided;
  top1["decided_disagree"] = r.decided_disagree;
  top1["gap_unknown"] = r.gap_unknown;
  top1["max_ref_gap_at_disagreement"] = jnum(r.max_gap_at_disagreement);
  top1["sweep"] = json::array();
  for (const auto& p : r.sweep)
    top1["sweep"].push_back({{"threshold", p.threshold}, {"decided", p.decided}, {"disagree", p.disagree}});
  top1["gap_buckets"] = json::array();
  for (const auto& b : r.gap_buckets)
    top1["gap_buckets"].push_back({{"lo", b.lo}, {"hi", jnum(b.hi)}, {"positions", b.positions},
                                   {"disagree", b.disagree}});
  top1["rank_hist"] = r.rank_hist;
  top1["rank_beyond"] = r.rank_beyond;
  top1["worst_rank"] = r.worst_rank == 0 ? (r.rank_beyond ? json("beyond") : json()) : json(r.worst_rank);
  top1["worst_disagreements"] = json::array();
  for (const auto& d : r.worst_disagreements)
    top1["worst_disagreements"].push_back(
        {{"chunk", d.chunk}, {"pos", d.pos}, {"abs_pos", d.abs_pos}, {"target", d.target},
         {"ref_top1", d.ref_top1}, {"cand_top1", d.cand_top1}, {"ref_gap", jnum(d.ref_gap)},
         {"cand_rank", d.cand_rank ? json(d.cand_rank) : json("beyond")}});
  j["top1"] = top1;
  j["top1_logit_delta"] = {{"units", r.logit_units},
                           {"abs", jquant(r.top1_logit_abs_delta)},
                           {"signed", jmean(r.top1_logit_delta)},
                           {"unavailable", r.top1_logit_unavailable}};
  j["nll"] = {{"mean_ref", jnum(r.mean_nll_ref)},   {"mean_cand", jnum(r.mean_nll_cand)},
              {"ppl_ref", jnum(r.ppl_ref)},         {"ppl_cand", jnum(r.ppl_cand)},
              {"ppl_diff_pct", jnum(r.ppl_diff_pct)}, {"ppl_diff_pct_se", jnum(r.ppl_diff_pct_se)},
              {"shift", jmean(r.nll_shift)},        {"cand_higher", r.nll_higher},
              {"cand_lower", r.nll_lower},          {"equal", r.nll_equal}};
  j["spread"] = {{"k", r.spread_k}, {"ref", jmean(r.spread_ref)}, {"cand", jmean(r.spread_cand)},
                 {"shift", jmean(r.spread_shift)}};
  j["kl"] = {{"method", r.kl_method}, {"note", r.kl_note}, {"mean", jmean(r.kl)},
             {"per_position", jquant(r.kl_q)}};
  j["llama_perplexity"] = r.llama ? to_json(*r.llama) : json{{"note", r.llama_note}};
  j["drift_gate"] = {{"status", r.drift_status},       {"note", r.drift_note},
                     {"kl_method", r.drift_kl_method}, {"kl", jmean(r.drift_kl)},
                     {"kappa", jnum(r.drift_kappa)},   {"u", jnum(r.drift_u)},
                     {"budget", jnum(r.drift_budget)}, {"kl_over_u2", jnum(r.kl_over_u2)},
                     {"kl_over_budget", jnum(r.drift_kl.mean / r.drift_budget)}};
  return j;
}

}  // namespace arbiter::verify
