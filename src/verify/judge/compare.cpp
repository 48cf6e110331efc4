// compare_traces: the statistics of docs/traces.md. Every statistic here has a definition
// in that document; keep the two in step.
#include "verify/judge/compare.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>

#include "core/dtype.h"
#include "core/error.h"
#include "verify/trace/api_trace.h"

namespace arbiter::verify {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
// Gap buckets [lo, hi): the sweep thresholds as edges, so the two tables read together.
constexpr double kBucketEdges[] = {0.0, 0.5, 1.0, 2.0, 5.0, kInf};
// The tail mass of the candidate in the KL estimate is floored here: a tail that rounds
// to <= 0 (its lse is f32-rounded) would otherwise make one position's KL infinite.
constexpr double kTailFloor = 1e-12;
// Traces record logits with %.9g and logits files as float32, so two arms can never be
// compared more finely than f32's unit roundoff: the drift gate's u is floored here
// (otherwise f64-vs-f64 pairs, e.g. ref vs transformers float64, would be judged on the
// rounding of the file format; docs/traces.md §"Drift gate").
constexpr double kTraceResolutionU = 0x1p-24;

double t_value(double mean, double se) {
  if (std::isnan(mean) || std::isnan(se)) return kNaN;
  if (se > 0) return mean / se;
  return mean == 0 ? 0.0 : std::copysign(kInf, mean);
}

std::string device_desc(const Trace& t) {
  const TraceHeader& h = t.header;
  if (t.format == TraceFormat::Foreign) return "foreign trace";
  if (t.format == TraceFormat::LogprobsJsonl)
    for (const auto& [k, v] : t.header.extra)
      if (k == "logprobs_jsonl") {
        std::string d = v;
        std::replace(d.begin(), d.end(), '\t', ' ');
        return "logprobs dump: " + d;
      }
  std::string s = h.device.empty() ? "device unknown" : h.device;
  if (!h.compute.empty()) s += ", compute " + h.compute;
  if (!h.weights.empty()) s += ", weights " + h.weights;
  if (!h.inject.empty() && h.inject != "none") s += ", INJECT " + h.inject;
  return s;
}

void check_str(CompareResult& res, const char* field, const char* what, const std::string& a,
               const std::string& b) {
  if (a.empty() || b.empty()) {
    res.unchecked.push_back(std::string(field) + " " + what + " (unknown in " +
                            (a.empty() && b.empty() ? "ref and cand" : a.empty() ? "ref" : "cand") +
                            ")");
    return;
  }
  if (a != b) res.mismatches.push_back({field, std::string(what) + ": ref " + a + ", cand " + b});
}

void check_int(CompareResult& res, const char* field, const char* what, int64_t a, int64_t b) {
  check_str(res, field, what, a < 0 ? "" : std::to_string(a), b < 0 ? "" : std::to_string(b));
}

void check_identity(const Trace& R, const Trace& C, bool other_weights, CompareResult& res) {
  const TraceHeader &a = R.header, &b = C.header;
  if (other_weights) {
    res.notes.push_back("different checkpoints of one model (quantization vs parent): model " +
                        a.model_path + " vs " + b.model_path +
                        "; only their tokens must match, position by position");
  } else {
    check_str(res, "model", "sha256", a.model_sha256, b.model_sha256);
    check_str(res, "tokenizer", "sha256", a.tokenizer_sha256, b.tokenizer_sha256);
  }
  check_str(res, "tokenizer", "bos", a.tokenizer_bos, b.tokenizer_bos);
  check_str(res, "corpus", "sha256", a.corpus_sha256, b.corpus_sha256);
  check_str(res, "shape", "name", a.shape_name, b.shape_name);
  check_int(res, "shape", "chunk_tokens", a.chunk_tokens, b.chunk_tokens);
  check_int(res, "shape", "max_chunks", a.max_chunks, b.max_chunks);
  check_int(res, "shape", "prefill", a.prefill, b.prefill);
  check_int(res, "shape", "start_token", a.start_token, b.start_token);
}

std::string at(const TraceRow& r) {
  return "chunk " + std::to_string(r.chunk) + " pos " + std::to_string(r.pos);
}

// Log-sum-exp of one full-logits row in double, max-shifted.
double row_lse(const std::vector<float>& x, double& mx) {
  mx = -kInf;
  for (float v : x) mx = std::max(mx, double(v));
  double s = 0;
  for (float v : x) s += std::exp(double(v) - mx);
  return mx + std::log(s);
}

// Full-logits files must belong to their traces: same row count, and each row's largest
// logit equal to the trace's top-1 logit up to float32 rounding of the trace value.
void check_logits_row(const LogitsReader& L, uint64_t i, double mx, const TraceRow& r) {
  double t = r.top_logits.empty() ? kNaN : r.top_logits[0];
  if (!std::isfinite(t) || !std::isfinite(mx)) return;
  if (std::fabs(mx - t) > 1e-6 * std::max(1.0, std::fabs(t)))
    throw Error(strformat("[compare] %s: row %llu largest logit %.9g differs from the trace's "
                          "top-1 logit %.9g (%s): not this trace's logits file",
                          L.path().c_str(), (unsigned long long)i, mx, t, at(r).c_str()));
}

}  // namespace

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::Pass: return "pass";
    case Verdict::Fail: return "fail";
    case Verdict::Inconclusive: return "inconclusive";
    case Verdict::Incomparable: return "incomparable";
    case Verdict::Unreadable: return "unreadable";
  }
  return "?";
}

Verdict worse_verdict(Verdict a, Verdict b) {
  auto rank = [](Verdict v) {
    switch (v) {
      case Verdict::Pass: return 0;
      case Verdict::Inconclusive: return 1;
      case Verdict::Fail: return 2;
      case Verdict::Incomparable: return 3;
      case Verdict::Unreadable: return 4;
    }
    return 4;
  };
  return rank(a) >= rank(b) ? a : b;
}

double drift_unit_roundoff(const std::string& compute, const std::string& act_quant) {
  if (compute.empty()) return kNaN;
  try {
    const double u = unit_roundoff(compute_dtype_from_name(compute));
    return act_quant.empty() ? u : std::max(u, std::ldexp(1.0, -8));
  } catch (const Error&) {
    return kNaN;  // a dtype this build does not know: the gate cannot be set
  }
}

std::string logits_path_for(const std::string& trace_path) { return trace_path + ".logits"; }

MeanSe mean_se(const std::vector<double>& x, const std::vector<int64_t>& cluster) {
  ARB_ASSERT(x.size() == cluster.size());
  MeanSe m;
  m.n = int64_t(x.size());
  std::map<int64_t, std::pair<double, int64_t>> groups;  // chunk -> (sum, count)
  for (size_t i = 0; i < x.size(); ++i) {
    auto& g = groups[cluster[i]];
    g.first += x[i];
    g.second += 1;
  }
  m.chunks = int64_t(groups.size());
  if (m.n == 0) return m;
  double sum = 0;
  for (double v : x) sum += v;
  m.mean = sum / double(m.n);
  if (m.n >= 2) {
    double ss = 0;
    for (double v : x) ss += (v - m.mean) * (v - m.mean);
    m.sd = std::sqrt(ss / double(m.n - 1));
    m.se_iid = m.sd / std::sqrt(double(m.n));
  }
  if (m.chunks >= 2) {
    // Batch means with chunks as batches, in the cluster (ratio-estimator) form so that
    // unequal chunk sizes are weighted by size; equals sd(chunk means)/sqrt(B) when equal.
    double ss = 0;
    for (const auto& [c, g] : groups) {
      double d = g.first - double(g.second) * m.mean;
      ss += d * d;
    }
    double B = double(m.chunks);
    m.se_chunk = std::sqrt(B / (B - 1) * ss) / double(m.n);
  }
  m.t_iid = t_value(m.mean, m.se_iid);
  m.t_chunk = t_value(m.mean, m.se_chunk);
  return m;
}

Quantiles quantiles(std::vector<double> v) {
  Quantiles q;
  q.n = int64_t(v.size());
  if (v.empty()) return q;
  std::sort(v.begin(), v.end());
  auto pick = [&](double p) {
    int64_t k = int64_t(std::ceil(p * double(v.size()))) - 1;
    return v[size_t(std::clamp<int64_t>(k, 0, int64_t(v.size()) - 1))];
  };
  q.p50 = pick(0.50);
  q.p90 = pick(0.90);
  q.p99 = pick(0.99);
  q.max = v.back();
  return q;
}

namespace {

// The routing flips of the matched rows, or why they cannot be counted.
RouteFlips route_flips_of(const Trace& R, const Trace& C,
                          const std::vector<std::pair<size_t, size_t>>& pairs, double threshold) {
  const TraceRoutesHeader &hr = R.header.routes, &hc = C.header.routes;
  RouteFlips f;
  f.threshold = threshold;
  if (hr.layers.empty() && hc.layers.empty()) {
    f.note = "neither trace records routes (a dense model, or a trace without a routes column)";
    return f;
  }
  if (hr.layers.empty() || hc.layers.empty()) {
    f.recorded = true;
    f.note = std::string("only the ") + (hr.layers.empty() ? "candidate" : "reference") +
             " trace records routes";
    return f;
  }
  if (hr.layers != hc.layers || hr.experts != hc.experts || hr.top_k != hc.top_k ||
      hr.score != hc.score) {
    f.recorded = true;
    f.note = "the traces' '# routes' lines differ (layers, experts, top_k or score)";
    return f;
  }
  std::vector<RouteSample> a, b;
  for (const auto& [i, j] : pairs)
    for (size_t l = 0; l < hr.layers.size(); ++l) {
      const TraceRow &r = R.rows[i], &c = C.rows[j];
      a.push_back({r.chunk, r.pos, hr.layers[l], r.routes[l].ids, r.routes[l].margin});
      b.push_back({c.chunk, c.pos, hc.layers[l], c.routes[l].ids, c.routes[l].margin});
    }
  f = count_route_flips(a, b, threshold);
  f.score = hr.score;
  return f;
}

}  // namespace

CompareResult compare_traces(const Trace& R_in, const Trace& C_in, const CompareOptions& opt) {
  // A trace through an API or a logprobs dump holds log-probabilities (no lse); the other
  // side is then judged as log-probabilities too, so logit differences do not carry the lse.
  // Without an lse (a foreign trace) it cannot be: its rows then differ from the other
  // side's by an unknown shift each, which leaves only the shift-invariant statistics.
  const bool lp_r = holds_logprobs(R_in), lp_c = holds_logprobs(C_in);
  const Trace& raw_side = lp_r ? C_in : R_in;
  const bool shifted = lp_r != lp_c && !raw_side.has_lse;
  std::optional<Trace> r_lp, c_lp;
  if (lp_r != lp_c && !shifted) (lp_r ? c_lp : r_lp) = as_logprobs(raw_side);
  const Trace& R = r_lp ? *r_lp : R_in;
  const Trace& C = c_lp ? *c_lp : C_in;
  ARB_CHECK(opt.decided > 0 && std::isfinite(opt.decided),
            "[compare] decided threshold must be a positive number (got %g)", opt.decided);
  CompareResult res;
  res.ref_label = opt.ref_label.empty() ? R.path : opt.ref_label;
  res.cand_label = opt.cand_label.empty() ? C.path : opt.cand_label;
  res.ref_device = device_desc(R);
  res.cand_device = device_desc(C);
  res.ref_rows = int64_t(R.rows.size());
  res.cand_rows = int64_t(C.rows.size());
  res.topk_ref = R.header.topk;
  res.topk_cand = C.header.topk;
  res.nonfinite_ref = R.nonfinite_values;
  res.nonfinite_cand = C.nonfinite_values;
  res.decided_threshold = opt.decided;
  if (R.format == TraceFormat::Foreign) res.notes.push_back("ref is a foreign 6-column trace");
  if (C.format == TraceFormat::Foreign) res.notes.push_back("cand is a foreign 6-column trace");
  res.ref_preamble = R.preamble;
  res.cand_preamble = C.preamble;
  for (const auto& [side, p] : {std::pair{"ref", &R.preamble}, std::pair{"cand", &C.preamble}})
    if (p->lines > 0)
      res.notes.push_back(strformat("%s: skipped %lld preamble lines before its first '#' header line (first: '%s')",
                                    side, (long long)p->lines, p->first.c_str()));
  if (shifted) {
    res.logit_units = "shifted";
    res.notes.push_back(std::string(lp_r ? "cand" : "ref") +
                        " holds raw logits without lse, the other side log-probabilities: each row differs by an "
                        "unknown shift, so only gap, spread, ranks and nll are computed (no logit delta, no KL)");
  } else if (lp_r || lp_c) {
    res.logit_units = "logprob";
    res.notes.push_back("compared as log-probabilities (a side came through an API or a logprobs dump, which give "
                        "no lse): gap, spread, ranks and nll are as with logits; the top-1 delta is of "
                        "log-probabilities; the KL from top-k log-probabilities is a lower bound");
  }

  // ---- identity and row matching ----
  check_identity(R, C, opt.other_weights, res);
  std::unordered_map<int64_t, size_t> cand_at;
  for (size_t j = 0; j < C.rows.size(); ++j)
    cand_at[(int64_t(C.rows[j].chunk) << 32) | C.rows[j].pos] = j;
  std::vector<std::pair<size_t, size_t>> pairs;
  int64_t missing = 0, target_diff = 0;
  std::string first_missing, first_target;
  for (size_t i = 0; i < R.rows.size(); ++i) {
    const TraceRow& r = R.rows[i];
    auto it = cand_at.find((int64_t(r.chunk) << 32) | r.pos);
    if (it == cand_at.end()) {
      if (missing++ == 0) first_missing = at(r);
      continue;
    }
    const TraceRow& c = C.rows[it->second];
    bool abs_differs = R.has_abs_pos && C.has_abs_pos && r.abs_pos != c.abs_pos;
    if (r.target != c.target || abs_differs) {
      if (target_diff++ == 0)
        first_target = strformat("%s: ref target %d abs_pos %lld, cand target %d abs_pos %lld",
                                 at(r).c_str(), r.target, (long long)r.abs_pos, c.target,
                                 (long long)c.abs_pos);
    }
    pairs.emplace_back(i, it->second);
  }
  int64_t extra = int64_t(C.rows.size()) - int64_t(pairs.size());
  if (missing || extra)
    res.mismatches.push_back(
        {"rows", strformat("%lld ref positions missing from cand%s%s; %lld cand positions not "
                           "in ref",
                           (long long)missing, missing ? " (first: " : "",
                           missing ? (first_missing + ")").c_str() : "", (long long)extra)});
  if (target_diff)
    res.mismatches.push_back(
        {"targets", strformat("%lld positions differ (first: %s)", (long long)target_diff,
                              first_target.c_str())});
  if (!R.has_abs_pos || !C.has_abs_pos) res.unchecked.push_back("targets abs_pos (unknown in a foreign trace or a logprobs dump)");

  if (!res.mismatches.empty()) {
    if (!opt.force) {
      res.verdict = Verdict::Incomparable;
      for (const auto& m : res.mismatches)
        res.reasons.push_back(m.field + " differs: " + m.detail);
      return res;
    }
    res.forced = true;
    res.notes.push_back("FORCED: compared despite differing " + [&] {
      std::string s;
      for (const auto& m : res.mismatches)
        if (s.find(m.field) == std::string::npos) s += (s.empty() ? "" : ", ") + m.field;
      return s;
    }());
  }
  res.positions = int64_t(pairs.size());
  res.routes = route_flips_of(R, C, pairs, opt.route_decided);

  // ---- per-position statistics ----
  std::vector<double> thresholds = opt.sweep;
  thresholds.push_back(opt.decided);
  std::sort(thresholds.begin(), thresholds.end());
  thresholds.erase(std::unique(thresholds.begin(), thresholds.end()), thresholds.end());
  for (double t : thresholds) res.sweep.push_back({t, 0, 0});
  for (size_t b = 0; b + 1 < std::size(kBucketEdges); ++b)
    res.gap_buckets.push_back({kBucketEdges[b], kBucketEdges[b + 1], 0, 0});
  // Sized from the rows, which hold exactly K entries each, not from the header's K: a trace
  // without rows may claim any K (10^15 was a std::bad_alloc).
  res.rank_hist.assign(C.rows.empty() ? 0 : C.rows[0].top_ids.size(), 0);
  res.spread_k = std::min(R.header.topk, C.header.topk);

  // KL method: exact when both full-logits files are given, else the top-k estimate.
  std::unique_ptr<LogitsReader> lref, lcand;
  if (!opt.ref_logits.empty() && !opt.cand_logits.empty()) {
    lref = std::make_unique<LogitsReader>(opt.ref_logits);
    lcand = std::make_unique<LogitsReader>(opt.cand_logits);
    ARB_CHECK(lref->rows() == R.rows.size(), "[compare] %s: %llu rows but the trace has %zu",
              opt.ref_logits.c_str(), (unsigned long long)lref->rows(), R.rows.size());
    ARB_CHECK(lcand->rows() == C.rows.size(), "[compare] %s: %llu rows but the trace has %zu",
              opt.cand_logits.c_str(), (unsigned long long)lcand->rows(), C.rows.size());
    ARB_CHECK(lref->vocab() == lcand->vocab(), "[compare] full-logits vocab differs: %s %u, %s %u",
              opt.ref_logits.c_str(), lref->vocab(), opt.cand_logits.c_str(), lcand->vocab());
    res.kl_method = "exact";
    res.kl_note = "from full logits (" + std::to_string(lref->vocab()) + " vocab)";
  } else if (R.has_lse && C.has_lse) {
    res.kl_method = "topk_tail_estimate";
    res.kl_note = res.logit_units == "logprob"
                      ? "estimated from top-k log-probabilities with the tail as one bucket: a lower bound"
                      : "estimated from top-k + lse with the tail as one bucket: a lower bound";
    if (!opt.ref_logits.empty() || !opt.cand_logits.empty())
      res.kl_note += " (full logits given for one side only)";
  } else {
    res.kl_method = "unavailable";
    res.kl_note = "a foreign trace has no lse and no full logits";
  }

  std::vector<double> d_logit, abs_d_logit, nll_d, sp_r, sp_c, sp_d, kl, kl_drift;
  std::vector<int64_t> cl_logit, cl_nll, cl_sp, cl_kl;
  double sum_nll_r = 0, sum_nll_c = 0;
  std::vector<Disagreement> dis;
  std::vector<float> xr, xc, lp_ref;
  LlamaKld llama;
  int64_t kl_skipped = 0;
  std::map<int64_t, int> chunks;

  for (auto [a, b] : pairs) {
    const TraceRow& r = R.rows[a];
    const TraceRow& c = C.rows[b];
    chunks[r.chunk] = 1;
    ARB_CHECK(!r.top_ids.empty() && !c.top_ids.empty() &&
                  r.top_ids.size() == r.top_logits.size() && c.top_ids.size() == c.top_logits.size(),
              "[compare] %s: row without a consistent top-k list", at(r).c_str());
    const int32_t ref_top1 = r.top_ids[0];
    const bool disagree = ref_top1 != c.top_ids[0];
    const double gap = r.top_ids.size() >= 2 ? r.top_logits[0] - r.top_logits[1] : kNaN;
    int rank = 0;
    for (size_t k = 0; k < c.top_ids.size(); ++k)
      if (c.top_ids[k] == ref_top1) {
        rank = int(k) + 1;
        break;
      }
    if (rank > 0) {
      if (size_t(rank) > res.rank_hist.size()) res.rank_hist.resize(size_t(rank), 0);
      res.rank_hist[size_t(rank - 1)]++;
      res.worst_rank = std::max(res.worst_rank, rank);
    } else {
      res.rank_beyond++;
    }

    if (disagree) {
      res.disagree++;
      dis.push_back({r.chunk, r.pos, r.abs_pos, r.target, ref_top1, c.top_ids[0], gap, rank});
    }
    if (!std::isfinite(gap)) {
      res.gap_unknown++;
    } else {
      for (auto& g : res.gap_buckets)
        if (gap >= g.lo && gap < g.hi) {
          g.positions++;
          g.disagree += disagree;
        }
      for (auto& s : res.sweep)
        if (gap >= s.threshold) {
          s.decided++;
          s.disagree += disagree;
        }
      if (gap >= opt.decided) {
        res.decided++;
        res.decided_disagree += disagree;
      }
      if (disagree && !(gap <= res.max_gap_at_disagreement))  // NaN-safe max
        res.max_gap_at_disagreement = gap;
    }

    // Candidate logit of the reference's top-1 token: from its top-k, or its target logit.
    double cl = kNaN;
    bool have = false;
    if (rank > 0) {
      cl = c.top_logits[size_t(rank - 1)];
      have = true;
    } else if (c.target == ref_top1 && C.has_target_logit) {
      cl = c.target_logit;
      have = true;
    }
    PositionPoint pt{gap, kNaN, kNaN, disagree};
    if (!shifted && have && std::isfinite(cl) && std::isfinite(r.top_logits[0]))
      pt.logit_delta = cl - r.top_logits[0];
    if (shifted) {
      // Not a statistic of these two rows: their logits differ by an unknown constant.
    } else if (!have) {
      res.top1_logit_unavailable++;
    } else if (std::isfinite(cl) && std::isfinite(r.top_logits[0])) {
      d_logit.push_back(cl - r.top_logits[0]);
      abs_d_logit.push_back(std::fabs(cl - r.top_logits[0]));
      cl_logit.push_back(r.chunk);
    }

    if (std::isfinite(r.nll) && std::isfinite(c.nll)) {
      nll_d.push_back(c.nll - r.nll);
      cl_nll.push_back(r.chunk);
      sum_nll_r += r.nll;
      sum_nll_c += c.nll;
      if (c.nll > r.nll) res.nll_higher++;
      else if (c.nll < r.nll) res.nll_lower++;
      else res.nll_equal++;
    }

    if (res.spread_k >= 2 && r.top_logits.size() >= size_t(res.spread_k) &&
        c.top_logits.size() >= size_t(res.spread_k)) {
      size_t k = size_t(res.spread_k - 1);
      double s_r = r.top_logits[0] - r.top_logits[k], s_c = c.top_logits[0] - c.top_logits[k];
      if (std::isfinite(s_r) && std::isfinite(s_c)) {
        sp_r.push_back(s_r);
        sp_c.push_back(s_c);
        sp_d.push_back(s_c - s_r);
        cl_sp.push_back(r.chunk);
      }
    }

    double k_pos = kNaN, k_drift = kNaN;  // k_drift: the drift gate's statistic
    if (res.kl_method == "exact") {
      double mr, mc;
      res.nonfinite_logits_ref += lref->read_row(a, xr);
      res.nonfinite_logits_cand += lcand->read_row(b, xc);
      double lse_r = row_lse(xr, mr), lse_c = row_lse(xc, mc);
      check_logits_row(*lref, a, mr, r);
      check_logits_row(*lcand, b, mc, c);
      double s = 0;
      lp_ref.resize(xr.size());
      for (size_t v = 0; v < xr.size(); ++v) {
        double lp = double(xr[v]) - lse_r, lq = double(xc[v]) - lse_c;
        double p = std::exp(lp);
        if (p > 0) s += p * (lp - lq);
        lp_ref[v] = float(lp);
      }
      k_pos = k_drift = s;
      llama.add(lp_ref.data(), xc.data(), int(xc.size()), r.target);
    } else if (res.kl_method == "topk_tail_estimate") {
      // Buckets: each id in both top-k lists, plus one bucket for everything else.
      double s = 0, mass_p = 0, mass_q = 0;
      for (size_t i = 0; i < r.top_ids.size(); ++i) {
        for (size_t j = 0; j < c.top_ids.size(); ++j) {
          if (c.top_ids[j] != r.top_ids[i]) continue;
          double lp = r.top_logits[i] - r.lse, lq = c.top_logits[j] - c.lse;
          double p = std::exp(lp);
          s += p * (lp - lq);
          mass_p += p;
          mass_q += std::exp(lq);
          break;
        }
      }
      // Chain rule: the coarsened KL = P_S * KL(p|S || q|S) + binary KL(S vs tail). The
      // first term needs no lse (p|S is a softmax over S); the drift gate uses it alone.
      k_drift = mass_p > 0 ? s - mass_p * std::log(mass_p / mass_q) : 0.0;
      double tail_p = std::max(0.0, 1.0 - mass_p);
      double tail_q = std::max(kTailFloor, 1.0 - mass_q);
      if (tail_p > 0) s += tail_p * std::log(tail_p / tail_q);
      k_pos = s;
    }
    pt.drift_kl = k_drift;
    res.points.push_back(pt);
    if (res.kl_method != "unavailable") {
      if (std::isfinite(k_pos) && std::isfinite(k_drift)) {
        kl.push_back(k_pos);
        kl_drift.push_back(k_drift);
        cl_kl.push_back(r.chunk);
      } else {
        kl_skipped++;
      }
    }
  }
  res.chunks = int64_t(chunks.size());
  if (res.rank_beyond > 0) res.worst_rank = 0;

  std::stable_sort(dis.begin(), dis.end(), [](const Disagreement& x, const Disagreement& y) {
    double gx = std::isnan(x.ref_gap) ? -kInf : x.ref_gap, gy = std::isnan(y.ref_gap) ? -kInf : y.ref_gap;
    return gx > gy;
  });
  if (dis.size() > 10) dis.resize(10);
  res.worst_disagreements = dis;

  res.top1_logit_delta = mean_se(d_logit, cl_logit);
  res.top1_logit_abs_delta = quantiles(abs_d_logit);
  res.nll_shift = mean_se(nll_d, cl_nll);
  if (!nll_d.empty()) {
    res.mean_nll_ref = sum_nll_r / double(nll_d.size());
    res.mean_nll_cand = sum_nll_c / double(nll_d.size());
    res.ppl_ref = std::exp(res.mean_nll_ref);
    res.ppl_cand = std::exp(res.mean_nll_cand);
    res.ppl_diff_pct = 100.0 * (std::exp(res.mean_nll_cand - res.mean_nll_ref) - 1.0);
    double se = std::isfinite(res.nll_shift.se_chunk) ? res.nll_shift.se_chunk
                                                      : res.nll_shift.se_iid;
    res.ppl_diff_pct_se = 100.0 * std::exp(res.mean_nll_cand - res.mean_nll_ref) * se;
  }
  res.spread_ref = mean_se(sp_r, cl_sp);
  res.spread_cand = mean_se(sp_c, cl_sp);
  res.spread_shift = mean_se(sp_d, cl_sp);
  res.kl = mean_se(kl, cl_kl);
  res.drift_kl = mean_se(kl_drift, cl_kl);
  res.kl_q = quantiles(kl);
  if (kl_skipped)
    res.kl_note += "; " + std::to_string(kl_skipped) + " positions skipped (non-finite)";
  if (res.kl_method == "exact" && res.positions > 0) res.llama = llama.finish();
  else
    res.llama_note = "need full logits on both sides (trace --full-logits), or two llama.cpp KL-divergence files "
                     "(trace --kld-out; compare A.kld B.kld)";

  // ---- drift gate (docs/traces.md §Drift gate) ----
  ARB_CHECK(opt.kl_kappa > 0 && std::isfinite(opt.kl_kappa),
            "[compare] kl kappa must be a positive number (got %g)", opt.kl_kappa);
  res.drift_kappa = opt.kl_kappa;
  const double u_ref = drift_unit_roundoff(R.header.compute, R.header.act_quant);
  const double u_cand = drift_unit_roundoff(C.header.compute, C.header.act_quant);
  if (std::isnan(u_ref) || std::isnan(u_cand)) {
    res.drift_note = strformat("not applied: compute dtype unknown for %s",
                               std::isnan(u_ref) && std::isnan(u_cand) ? "ref and cand"
                               : std::isnan(u_ref)                     ? "ref"
                                                                       : "cand");
  } else {
    res.drift_u = std::max({u_ref, u_cand, kTraceResolutionU});
    res.drift_budget = opt.kl_kappa * res.drift_u * res.drift_u;
    auto arm = [](const TraceHeader& h) {
      return h.act_quant.empty() ? h.compute : h.compute + " with act_quant " + h.act_quant;
    };
    res.drift_note = strformat("u = 2^%d (ref %s, cand %s%s)", int(std::lround(std::log2(res.drift_u))),
                               arm(R.header).c_str(), arm(C.header).c_str(),
                               res.drift_u == kTraceResolutionU && std::max(u_ref, u_cand) < res.drift_u
                                   ? "; floored at the trace's f32 resolution"
                                   : "");
    if (res.kl_method == "unavailable" || res.drift_kl.n == 0) {
      res.drift_note = "not applied: no KL (" + res.kl_note + "); " + res.drift_note;
    } else {
      res.drift_kl_method = res.kl_method == "exact" ? "exact" : "shared_topk";
      res.kl_over_u2 = res.drift_kl.mean / (res.drift_u * res.drift_u);
      res.drift_status = res.drift_kl.mean > res.drift_budget ? "fail" : "pass";
    }
  }

  // ---- verdict (docs/traces.md §Verdict) ----
  bool fail = false;
  if (res.nonfinite_ref || res.nonfinite_cand) {
    fail = true;
    res.reasons.push_back(strformat("non-finite values: ref %lld, cand %lld",
                                    (long long)res.nonfinite_ref, (long long)res.nonfinite_cand));
  }
  if (res.nonfinite_logits_ref || res.nonfinite_logits_cand) {
    fail = true;
    res.reasons.push_back(strformat("non-finite values in the full-logits files: ref %lld, cand %lld",
                                    (long long)res.nonfinite_logits_ref,
                                    (long long)res.nonfinite_logits_cand));
  }
  if (res.decided_disagree) {
    fail = true;
    res.reasons.push_back(strformat("%lld top-1 disagreements on %lld decided positions (gap >= %g)",
                                    (long long)res.decided_disagree, (long long)res.decided,
                                    opt.decided));
  }
  const std::string drift_line = strformat(
      "mean KL(ref||cand) %.3g nats (%s) %s the drift budget %.3g = kappa*u^2 (kappa %g, %s): "
      "KL/u^2 = %.3g",
      res.drift_kl.mean, res.drift_kl_method.c_str(),
      res.drift_status == "fail" ? "exceeds" : "is within", res.drift_budget, res.drift_kappa,
      res.drift_note.c_str(), res.kl_over_u2);
  if (res.drift_status == "fail") {
    fail = true;
    res.reasons.push_back(drift_line);
  }
  if (fail) {
    res.verdict = Verdict::Fail;
  } else if (res.decided == 0) {
    res.verdict = Verdict::Inconclusive;
    res.reasons.push_back(strformat("no decided position (reference top1 - top2 >= %g) among %lld",
                                    opt.decided, (long long)res.positions));
  } else {
    res.verdict = Verdict::Pass;
    res.reasons.push_back(strformat("0 top-1 disagreements on %lld decided positions (gap >= %g)",
                                    (long long)res.decided, opt.decided));
  }
  if (res.verdict != Verdict::Fail)
    res.reasons.push_back(res.drift_status == "pass" ? drift_line : "drift gate " + res.drift_note);
  return res;
}

}  // namespace arbiter::verify
