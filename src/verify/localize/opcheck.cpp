#include "verify/localize/opcheck.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/text_table.h"

namespace arbiter::verify {

namespace {

// The tier's summarize() on exactly ref's logits, against the same summary on the host.
SummarizeCheck check_summarize(const Capture& cap, Backend& be, int V, const Roundoff& u) {
  SummarizeCheck s;
  const int K = std::min(8, V);
  DType logits_dtype = DType::F32;
  double max_logit = 0;
  std::vector<std::pair<double, int>> gaps_lse;  // (ref top-1/top-2 gap, top-1 flipped) per row
  for (size_t f = 0; f < cap.size(); ++f) {
    const CapturedForward& cf = cap[f];
    const std::vector<double>& logits = cf.at("logits", -1).values;
    std::vector<int32_t> targets(size_t(cf.T), -1);
    for (int t = 0; t < cf.T; ++t) {
      // The next token is the target when the capture holds it (as in a trace).
      if (t + 1 < cf.T)
        targets[size_t(t)] = cf.ids[size_t(t) + 1];
      else if (f + 1 < cap.size())
        targets[size_t(t)] = cap[f + 1].ids[0];
    }
    const std::vector<LogitsSummary> got =
        summarize_on_tier(be, logits, cf.T, V, K, targets, &logits_dtype);
    for (int t = 0; t < cf.T; ++t) {
      LogitsSummary want;
      const double* row = logits.data() + size_t(t) * V;
      summarize_on_host(row, V, K, targets[size_t(t)], want);
      for (int v = 0; v < V; ++v) max_logit = std::max(max_logit, std::fabs(row[v]));
      const LogitsSummary& g = got[size_t(t)];
      s.nonfinite += g.n_nonfinite;
      double le = std::fabs(g.lse - want.lse);
      s.max_lse_err = std::isfinite(le) ? std::max(s.max_lse_err, le) : INFINITY;
      if (targets[size_t(t)] >= 0) {
        double te = std::fabs(g.target_logit - want.target_logit);
        s.max_target_err = std::isfinite(te) ? std::max(s.max_target_err, te) : INFINITY;
      }
      double gap = want.top_logits.size() > 1 ? want.top_logits[0] - want.top_logits[1] : INFINITY;
      gaps_lse.emplace_back(gap, 0);
      if (g.top_ids.empty() || g.top_ids[0] != want.top_ids[0]) {
        // A flip is excusable only when rounding the logits to the buffer type can close
        // ref's gap (checked below, once max|logit| is known).
        gaps_lse.back().second = 1;
      }
      ++s.rows;
    }
  }
  const double ul = unit_roundoff(logits_dtype);  // rounding ref's logits into the buffer
  s.lse_bound = kBoundSafety * (ul * max_logit + u.accum * std::sqrt(double(V)));
  for (const auto& [gap, flip] : gaps_lse)
    if (flip && gap > 2 * ul * max_logit) ++s.top1_mismatch;
  s.flagged = s.nonfinite > 0 || !(s.max_lse_err <= s.lse_bound) ||
              !(s.max_target_err <= s.lse_bound) || s.top1_mismatch > 0;
  return s;
}

}  // namespace

OpcheckReport run_opcheck(const Capture& ref_cap, const Capture& replayed, Backend& be, int V,
                          const Roundoff& u) {
  ARB_CHECK(ref_cap.size() == replayed.size(), "[opcheck] %zu forwards captured, %zu replayed",
            ref_cap.size(), replayed.size());
  OpcheckReport r;
  r.u = u;
  r.forwards = int(ref_cap.size());
  for (const CapturedForward& f : ref_cap) {
    r.positions += f.T;
    r.width = std::max(r.width, f.T);
  }
  for (LocalRow& id : local_rows(ref_cap, u, &replayed)) {
    OpcheckRow row;
    for (size_t f = 0; f < ref_cap.size(); ++f) {
      const std::vector<double>& want = ref_cap[f].at(id.stage, id.layer).values;
      const std::vector<double>& got = replayed[f].at(id.stage, id.layer).values;
      ARB_CHECK(want.size() == got.size(), "[opcheck] %s: %zu vs %zu values",
                stage_id_name(id.stage, id.layer).c_str(), want.size(), got.size());
      row.err.add(want.data(), got.data(), int64_t(want.size()));
    }
    row.id = std::move(id);
    row.flagged = !(row.err.rel_l2() <= row.id.bound.value);
    r.n_flagged += row.flagged;
    auto it = std::find_if(r.ops.begin(), r.ops.end(),
                           [&](const OpcheckOp& o) { return o.op == row.id.op; });
    if (it == r.ops.end()) {
      r.ops.push_back(OpcheckOp{row.id.op, 0, 0, -1, "", 0});
      it = r.ops.end() - 1;
    }
    ++it->checks;
    it->flagged += row.flagged;
    double ratio = row.err.rel_l2() / row.id.bound.value;
    if (!(ratio <= it->worst_ratio)) {
      it->worst_ratio = ratio;
      it->worst = stage_id_name(row.id.stage, row.id.layer);
      it->worst_nmse = row.err.nmse();
    }
    r.rows.push_back(std::move(row));
  }
  r.summarize = check_summarize(ref_cap, be, V, u);
  r.n_flagged += r.summarize.flagged;
  return r;
}

std::string opcheck_text(const OpcheckReport& r) {
  const bool act = std::any_of(r.rows.begin(), r.rows.end(), [](const OpcheckRow& w) { return w.id.bound.act > 0; });
  std::string o = strformat(
      "opcheck: %s (compute %s, inject %s) vs ref (f64) on ref's captured inputs\n"
      "inputs: %d positions (BOS + text) in %d forward(s) of up to %d\n"
      "bound on rel_l2 = %s; NMSE bound = bound^2\n\n",
      r.device.c_str(), r.compute.c_str(), r.inject.c_str(), r.positions, r.forwards, r.width,
      bound_formula_text(r.u, act).c_str());
  std::vector<TextTable::Column> cols = {{"op", TextTable::Left}, {"layer", TextTable::Left},
                                         {"stage", TextTable::Left}, {"shape"}, {"max_abs"}, {"mean_abs"},
                                         {"nmse"}, {"rel_l2"}, {"bound"}, {"n"}, {"flag", TextTable::Left}};
  if (act) cols.insert(cols.begin() + 8, TextTable::Column{"act_q"});
  TextTable t(cols);
  t.separator_before(act ? 11 : 10, "  ");
  for (const OpcheckRow& w : r.rows) {
    std::string shape = std::to_string(w.id.rows) + "x" + std::to_string(w.id.cols);
    std::string flag;
    if (w.flagged)
      flag = "OUT OF LINE x" + fmt_g(w.err.rel_l2() / w.id.bound.value) +
             (w.err.nonfinite ? " (" + std::to_string(w.err.nonfinite) + " NaN/Inf)" : "");
    std::vector<std::string> cells = {w.id.op, w.id.layer >= 0 ? std::to_string(w.id.layer) : "-", w.id.stage,
                                      shape, fmt_g(w.err.max_abs), fmt_g(w.err.mean_abs()), fmt_g(w.err.nmse()),
                                      fmt_g(w.err.rel_l2())};
    if (act) cells.push_back(w.id.bound.act > 0 ? fmt_g(w.id.bound.act) : "-");
    cells.insert(cells.end(), {fmt_g(w.id.bound.value), std::to_string(w.id.bound.reduction), flag});
    t.row(cells);
  }
  o += t.str();
  o += "\nper op (worst error / bound over all its uses):\n";
  TextTable per({{"op", TextTable::Left},
                 {"checks"},
                 {"flagged"},
                 {"worst_ratio"},
                 {"worst_nmse"},
                 {"worst_at", TextTable::Left}});
  per.separator_before(5, "  ");
  for (const OpcheckOp& op : r.ops)
    per.row({op.op, std::to_string(op.checks), std::to_string(op.flagged), fmt_g(op.worst_ratio),
             fmt_g(op.worst_nmse), op.worst});
  o += per.str();
  const SummarizeCheck& s = r.summarize;
  o += strformat("summarize: %d rows, %d flagged; lse err %s, target-logit err %s (bound %s), top-1 flips "
                 "beyond rounding %d, NaN/Inf %lld\n\n",
                 s.rows, int(s.flagged), fmt_g(s.max_lse_err).c_str(), fmt_g(s.max_target_err).c_str(),
                 fmt_g(s.lse_bound).c_str(), s.top1_mismatch, (long long)s.nonfinite);
  if (r.n_flagged == 0) {
    o += "OPCHECK: pass (every op within its bound)\n";
  } else {
    std::string first;
    for (const OpcheckRow& w : r.rows)
      if (w.flagged) {
        first = w.id.op + " (" + stage_id_name(w.id.stage, w.id.layer) + ")";
        break;
      }
    if (first.empty()) first = "summarize";
    o += "OPCHECK: fail (" + std::to_string(r.n_flagged) +
         " check(s) out of line; first: " + first + ")\n";
  }
  return o;
}

std::string opcheck_tsv(const OpcheckReport& r) {
  std::string o =
      "op\tstage\tlayer\trows\tcols\tmax_abs\tmean_abs\tnmse\trel_l2\tbound_rel_l2\t"
      "reduction\tact_q\tnonfinite\tflagged\n";
  auto g = [](double v) { return fmt_num("%.6g", v); };
  for (const OpcheckRow& w : r.rows)
    o += w.id.op + "\t" + w.id.stage + "\t" + std::to_string(w.id.layer) + "\t" +
         std::to_string(w.id.rows) + "\t" + std::to_string(w.id.cols) + "\t" + g(w.err.max_abs) + "\t" +
         g(w.err.mean_abs()) + "\t" + g(w.err.nmse()) + "\t" + g(w.err.rel_l2()) + "\t" +
         g(w.id.bound.value) + "\t" + std::to_string(w.id.bound.reduction) + "\t" + g(w.id.bound.act) +
         "\t" + std::to_string(w.err.nonfinite) + "\t" + (w.flagged ? "yes" : "no") + "\n";
  return o;
}

nlohmann::json opcheck_json(const OpcheckReport& r) {
  auto num = [](double v) -> nlohmann::json {
    if (std::isfinite(v)) return v;
    return fmt_g(v);
  };
  nlohmann::json j;
  j["model"] = r.model_path;
  j["device"] = r.device;
  j["compute"] = r.compute;
  j["inject"] = r.inject;
  j["positions"] = r.positions;
  j["forwards"] = r.forwards;
  j["roundoff"] = {{"storage", r.u.storage}, {"accum", r.u.accum}, {"safety", kBoundSafety}};
  j["checks"] = nlohmann::json::array();
  for (const OpcheckRow& w : r.rows)
    j["checks"].push_back({{"op", w.id.op},
                           {"stage", w.id.stage},
                           {"layer", w.id.layer},
                           {"rows", w.id.rows},
                           {"cols", w.id.cols},
                           {"max_abs", num(w.err.max_abs)},
                           {"mean_abs", num(w.err.mean_abs())},
                           {"nmse", num(w.err.nmse())},
                           {"rel_l2", num(w.err.rel_l2())},
                           {"bound", num(w.id.bound.value)},
                           {"act_q", num(w.id.bound.act)},
                           {"nonfinite", w.err.nonfinite},
                           {"flagged", w.flagged}});
  j["ops"] = nlohmann::json::array();
  for (const OpcheckOp& op : r.ops)
    j["ops"].push_back({{"op", op.op},
                        {"checks", op.checks},
                        {"flagged", op.flagged},
                        {"worst_ratio", num(op.worst_ratio)},
                        {"worst_at", op.worst}});
  const SummarizeCheck& s = r.summarize;
  j["summarize"] = {{"rows", s.rows},
                    {"max_lse_err", num(s.max_lse_err)},
                    {"max_target_err", num(s.max_target_err)},
                    {"lse_bound", num(s.lse_bound)},
                    {"top1_mismatch", s.top1_mismatch},
                    {"nonfinite", s.nonfinite},
                    {"flagged", s.flagged}};
  j["n_flagged"] = r.n_flagged;
  j["verdict"] = r.n_flagged == 0 ? "pass" : "fail";
  return j;
}

}  // namespace arbiter::verify
