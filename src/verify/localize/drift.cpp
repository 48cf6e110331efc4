#include "verify/localize/drift.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "core/error.h"
#include "core/text_table.h"
#include "verify/localize/svg.h"

namespace arbiter::verify {

std::string fmt_g(double v) { return fmt_num("%.3g", v); }

std::string bound_formula_text(const Roundoff& u, bool act) {
  return strformat("%.0f * (u_s * (sqrt(m) + amp) + u_a * sqrt(n)%s),  u_s = %s, u_a = %s%s",
                   kBoundSafety, act ? " + q" : "", fmt_g(u.storage).c_str(),
                   fmt_g(u.accum).c_str(),
                   act ? "; q: what the tier's rounding of x on the fly (8-bit codes, bf16) can add (act_q column)" : "");
}

std::string stage_id_name(const std::string& stage, int layer) {
  return layer >= 0 ? stage + "@L" + std::to_string(layer) : stage;
}

// --- error statistics ---------------------------------------------------------------------

void ErrAccum::add(const double* ref, const double* cand, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    double r = ref[i], c = cand[i];
    if (!std::isfinite(r) || !std::isfinite(c)) {
      ++nonfinite;
      continue;
    }
    double d = c - r;
    ++n;
    sum_d2 += d * d;
    sum_r2 += r * r;
    sum_c2 += c * c;
    sum_rc += r * c;
    sum_abs += std::fabs(d);
    max_abs = std::max(max_abs, std::fabs(d));
  }
}

double ErrAccum::rel_l2() const {
  if (nonfinite > 0) return INFINITY;
  if (sum_r2 == 0) return sum_d2 == 0 ? 0.0 : INFINITY;
  return std::sqrt(sum_d2 / sum_r2);
}
double ErrAccum::nmse() const {
  double r = rel_l2();
  return r * r;
}
double ErrAccum::mean_abs() const { return n ? sum_abs / double(n) : 0.0; }
double ErrAccum::cosine() const {
  if (sum_r2 == 0 && sum_c2 == 0) return 1.0;
  if (sum_r2 == 0 || sum_c2 == 0) return NAN;
  return sum_rc / std::sqrt(sum_r2 * sum_c2);
}

// --- bounds -------------------------------------------------------------------------------

StageBound stage_bound(int64_t reduction, int roundings, double score_scale, const Roundoff& u,
                       double act) {
  StageBound b;
  b.reduction = reduction;
  b.roundings = roundings;
  b.amp = 2 * score_scale;
  b.act = act;
  b.value = kBoundSafety * (u.storage * (std::sqrt(double(b.roundings)) + b.amp) +
                            u.accum * std::sqrt(double(b.reduction)) + b.act);
  return b;
}

double attention_score_scale(const Capture& cap, const std::string& stage, int layer) {
  // First-order effect of rounding q and k on out = sum_j p_j v_j: a score shift ds_j moves
  // the output by sum_j p_j ds_j (v_j - out) (the common part of the shifts cancels, since
  // sum_j p_j (v_j - out) = 0). Rounding moves score j by about u * r_j,
  // r_j^2 = sum_i (q_i k_ji)^2 / Dh (a random walk over the Dh products), independently per
  // key, so |d out|^2 ~ u^2 sum_j p_j^2 r_j^2 |v_j - out|^2. S is that, summed over queries
  // and heads, relative to sum |out|^2: the relative L2 of the output per unit roundoff,
  // measured the way drift and opcheck measure errors.
  if (cap.empty()) return 0.0;
  const StageRecord& at = cap.front().at(stage, layer);
  if (!at.has_attention) return 0.0;
  const CapturedAttention& g = at.attention;
  const int H = g.H, Hkv = g.Hkv, Dh = g.Dh, group = H / std::max(Hkv, 1);
  const int q_dim = H * Dh, kv_dim = Hkv * Dh, W = g.window;
  const double scale = g.scale;
  std::vector<double> keys, vals;  // k_rope and v rows of every forward so far, [pos, kv_dim]
  std::vector<double> p, r2, out(static_cast<size_t>(Dh), 0.0);
  double num = 0, den = 0;
  for (const CapturedForward& f : cap) {
    const std::vector<double>& k = f.at(g.k, layer).values;
    const std::vector<double>& v = f.at(g.v, layer).values;
    keys.insert(keys.end(), k.begin(), k.end());
    vals.insert(vals.end(), v.begin(), v.end());
    const std::vector<double>& q = f.at(g.q, layer).values;
    for (int t = 0; t < f.T; ++t) {
      const int i_pos = f.pos0 + t;
      const int j0 = W > 0 ? std::max(0, i_pos - W + 1) : 0;  // the op's window (i-W, i]
      for (int h = 0; h < H; ++h) {
        const double* qh = q.data() + size_t(t) * q_dim + size_t(h) * Dh;
        const size_t off = size_t(h / group) * Dh;
        p.clear(), r2.clear();
        double smax = -INFINITY;
        for (int j = j0; j <= i_pos; ++j) {
          const double* kh = keys.data() + size_t(j) * kv_dim + off;
          double dot = 0, ss = 0;
          for (int i = 0; i < Dh; ++i)
            dot += qh[i] * kh[i], ss += (qh[i] * kh[i]) * (qh[i] * kh[i]);
          p.push_back(dot * scale);
          r2.push_back(ss * scale * scale);
          smax = std::max(smax, dot * scale);
        }
        double z = 0;
        for (double& x : p) z += (x = std::exp(x - smax));
        std::fill(out.begin(), out.end(), 0.0);
        for (size_t j = 0; j < p.size(); ++j) {
          p[j] /= z;
          const double* vj = vals.data() + size_t(j0 + int(j)) * kv_dim + off;
          for (int i = 0; i < Dh; ++i) out[size_t(i)] += p[j] * vj[i];
        }
        for (size_t j = 0; j < p.size(); ++j) {
          const double* vj = vals.data() + size_t(j0 + int(j)) * kv_dim + off;
          double d2 = 0;
          for (int i = 0; i < Dh; ++i) d2 += (vj[i] - out[size_t(i)]) * (vj[i] - out[size_t(i)]);
          num += p[j] * p[j] * r2[j] * d2;
        }
        for (double o : out) den += o * o;
      }
    }
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

// --- drift --------------------------------------------------------------------------------

std::vector<LocalRow> local_rows(const Capture& a, const Roundoff& u, const Capture* other) {
  ARB_CHECK(!a.empty(), "[drift] empty capture");
  ARB_CHECK(!other || other->size() == a.size(), "[drift] %zu forwards against %zu", a.size(),
            other ? other->size() : 0);
  std::vector<LocalRow> rows;
  for (const StageRecord& r : a.front().stages) {
    LocalRow row;
    row.stage = r.name;
    row.op = r.op;
    row.layer = r.layer;
    row.cols = r.cols;
    int64_t reduction = 0;
    double rounding = 0, sum_a2 = 0;  // q's numerator and denominator
    for (size_t f = 0; f < a.size(); ++f) {
      const StageRecord& fr = a[f].at(r.name, r.layer);
      row.rows += fr.rows;
      reduction = std::max(reduction, fr.reduction);
      rounding += fr.input_rounding;
      if (other) rounding += (*other)[f].at(r.name, r.layer).input_rounding;
      for (double v : fr.values) sum_a2 += v * v;
    }
    ARB_CHECK(!std::isnan(rounding),
              "[localize] %s: its op ran matmuls on activations rounded on the fly (8-bit codes "
              "or bf16) whose rounding the tier cannot carry to this stage's output, so its "
              "bound is not known; rerun with ARBITER_CPU_ACT_QUANT=0 and ARBITER_CPU_BF16_DOT "
              "unset",
              stage_id_name(r.name, r.layer).c_str());
    const double q = rounding == 0 ? 0.0 : sum_a2 > 0 ? std::sqrt(rounding / sum_a2) : INFINITY;
    const double S = r.has_attention ? attention_score_scale(a, r.name, r.layer) : 0.0;
    row.bound = stage_bound(reduction, r.roundings, S, u, q);
    rows.push_back(std::move(row));
  }
  return rows;
}

namespace {

// The routing decisions of a capture, one sample per (token, MoE layer).
std::vector<RouteSample> route_samples(const Capture& c) {
  std::vector<RouteSample> out;
  for (const CapturedForward& f : c)
    for (const RoutePick& p : f.routes.picks)
      out.push_back({0, p.pos, p.layer, std::vector<int32_t>(p.ids.begin(), p.ids.end()), p.margin});
  return out;
}

}  // namespace

DriftReport drift_compare(const Capture& a, const Capture& b, const Capture& b_local,
                          const Roundoff& u, double route_decided) {
  ARB_CHECK(a.size() == b.size() && a.size() == b_local.size(),
            "[drift] sides ran %zu, %zu and %zu forwards", a.size(), b.size(), b_local.size());
  DriftReport r;
  r.u = u;
  r.forwards = int(a.size());
  for (size_t f = 0; f < a.size(); ++f) {
    ARB_CHECK(a[f].pos0 == b[f].pos0 && a[f].T == b[f].T && a[f].ids == b[f].ids &&
                  a[f].ids == b_local[f].ids,
              "[drift] forward %zu differs between the sides (tokens or positions)", f);
    r.positions += a[f].T;
    r.width = std::max(r.width, a[f].T);
  }
  for (LocalRow& id : local_rows(a, u, &b_local)) {
    DriftRow row;
    for (size_t f = 0; f < a.size(); ++f) {
      const std::vector<double>& ra = a[f].at(id.stage, id.layer).values;
      const std::vector<double>& rb = b[f].at(id.stage, id.layer).values;
      const std::vector<double>& rl = b_local[f].at(id.stage, id.layer).values;
      ARB_CHECK(ra.size() == rb.size() && ra.size() == rl.size(), "[drift] %s: %zu vs %zu values",
                stage_id_name(id.stage, id.layer).c_str(), ra.size(), rb.size());
      row.acc.add(ra.data(), rb.data(), int64_t(ra.size()));
      row.local.add(ra.data(), rl.data(), int64_t(ra.size()));
    }
    row.id = std::move(id);
    row.flagged = !(row.local.rel_l2() <= row.id.bound.value);
    if (row.flagged) {
      ++r.n_flagged;
      if (r.first_flagged < 0) r.first_flagged = int(r.rows.size());
    }
    r.rows.push_back(std::move(row));
  }
  const std::vector<RouteSample> ra = route_samples(a), rb = route_samples(b);
  if (!ra.empty() || !rb.empty()) {
    r.routes = count_route_flips(ra, rb, route_decided);
    for (const CapturedForward& f : a)
      if (!f.routes.score.empty()) r.routes.score = f.routes.score;
  }
  return r;
}

DriftReport drift_run(Session& a, Session& b, const std::vector<int32_t>& tokens, int width,
                      std::vector<double>* a_last, std::vector<double>* b_last,
                      const std::string& progress_tag, double route_decided) {
  auto tag = [&](const char* what) { return progress_tag.empty() ? "" : progress_tag + " " + what; };
  Capture ca = capture_forwards(a, tokens, width, tag("a"));
  if (a_last) *a_last = a.logits(a.last_T() - 1);
  Capture cb = capture_forwards(b, tokens, width, tag("b"));
  if (b_last) *b_last = b.logits(b.last_T() - 1);
  Capture cl = replay_forwards(b, ca, tag("replay"));
  Backend &ba = a.backend(), &bb = b.backend();
  DriftReport r =
      drift_compare(ca, cb, cl, coarser(roundoff_of(ba.compute()), roundoff_of(bb.compute())),
                    route_decided);
  r.b_providers = bb.stats().summary();
  r.a_device = ba.device_name(), r.b_device = bb.device_name();
  r.a_compute = dtype_name(ba.compute()), r.b_compute = dtype_name(bb.compute());
  r.a_inject = a.inject().text, r.b_inject = b.inject().text;
  return r;
}

DriftSummary drift_summary(const DriftReport& r, double jump_factor) {
  DriftSummary s;
  auto ratio = [&](const DriftRow& w) {
    const double e = w.local.rel_l2();
    return std::isfinite(e) ? e / w.id.bound.value : INFINITY;
  };
  for (size_t i = 0; i < r.rows.size(); ++i)
    if (s.worst < 0 || ratio(r.rows[i]) > s.worst_ratio)
      s.worst = int(i), s.worst_ratio = ratio(r.rows[i]);
  // Walk the layers in forward order; `entering` is the accumulated error of the last stage
  // before the current layer (embed before layer 0).
  double entering = NAN, best = -1;
  for (size_t i = 0; i < r.rows.size();) {
    const int layer = r.rows[i].id.layer;
    size_t end = i;
    double worst = 0;
    while (end < r.rows.size() && r.rows[end].id.layer == layer)
      worst = std::max(worst, ratio(r.rows[end++]));
    const double leaving = r.rows[end - 1].acc.rel_l2();
    if (layer >= 0 && !std::isnan(entering)) {
      const double g = entering > 0 ? leaving / entering : (leaving > 0 ? INFINITY : 1.0);
      const bool jump = g > jump_factor && worst > 1;
      // The first jump names the layer; without one, the largest growth is reported.
      if ((jump && !s.jump) || (!s.jump && g > best)) {
        s.jump = jump;
        s.growth_layer = layer, s.growth = g, s.growth_ratio = worst;
        best = g;
      }
    }
    entering = leaving;
    i = end;
  }
  return s;
}

std::string drift_text(const DriftReport& r) {
  const bool act = std::any_of(r.rows.begin(), r.rows.end(), [](const DriftRow& w) { return w.id.bound.act > 0; });
  std::string o = strformat(
      "drift: a = %s (%s, %s, inject %s)   b = %s (%s, %s, inject %s)\n"
      "tokens: %d positions (%s) in %d forward(s) of up to %d\n"
      "bound: %s\n\n",
      r.a_label.c_str(), r.a_device.c_str(), r.a_compute.c_str(), r.a_inject.c_str(), r.b_label.c_str(),
      r.b_device.c_str(), r.b_compute.c_str(), r.b_inject.c_str(), r.positions, r.input.c_str(), r.forwards, r.width,
      bound_formula_text(r.u, act).c_str());
  if (!r.b_providers.empty()) o += "b's op providers (the same kernels as its traces): " + r.b_providers + "\n\n";
  std::vector<TextTable::Column> cols = {{"layer", TextTable::Left}, {"stage", TextTable::Left}, {"rel_l2"},
                                         {"max_abs"}, {"cosine"}, {"rel_l2"}, {"max_abs"}, {"mean_abs"},
                                         {"cosine"}, {"rel_l2", TextTable::Left}, {"flag", TextTable::Left}};
  if (act) cols.insert(cols.begin() + 9, TextTable::Column{"act_q"});
  TextTable t(cols);
  t.groups({{"", 2}, {"accumulated (b chain vs a)", 3}, {"local (b op on a's inputs vs a)", 4},
            {"bound", act ? 3 : 2}});
  for (size_t c : {2, 5, 9}) t.separator_before(c, " | ");
  int last_layer = -2;
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const DriftRow& w = r.rows[i];
    if (w.id.layer != last_layer && i > 0) t.blank();
    last_layer = w.id.layer;
    std::string flag = w.flagged ? (int(i) == r.first_flagged ? "FIRST" : "over") : "";
    if (w.flagged && w.local.rel_l2() > 0 && std::isfinite(w.local.rel_l2()))
      flag += " x" + fmt_g(w.local.rel_l2() / w.id.bound.value);
    std::vector<std::string> cells = {w.id.layer >= 0 ? std::to_string(w.id.layer) : "-", w.id.stage,
                                      fmt_g(w.acc.rel_l2()), fmt_g(w.acc.max_abs), fmt_num("%.6f", w.acc.cosine()),
                                      fmt_g(w.local.rel_l2()), fmt_g(w.local.max_abs), fmt_g(w.local.mean_abs()),
                                      fmt_num("%.6f", w.local.cosine())};
    if (act) cells.push_back(w.id.bound.act > 0 ? fmt_g(w.id.bound.act) : "-");
    cells.push_back(fmt_g(w.id.bound.value));
    cells.push_back(flag);
    t.row(cells);
  }
  o += t.str();
  // Per layer: the hidden state leaving the layer (accumulated) and the worst local stage.
  o += "\nper layer: hidden state after the layer (accumulated) and worst local error / bound\n";
  TextTable per({{"layer", TextTable::Left},
                 {"acc_rel_l2"},
                 {"local/bound"},
                 {"worst_stage", TextTable::Left},
                 {"flagged", TextTable::Left}});
  per.separator_before(3, "  ");
  // Rows outside the blocks before the first layer ("embed") and after the last ("head");
  // a group's hidden state is its last stage's (the layer's residual stream leaving it).
  auto group_line = [&](const std::string& name, const std::function<bool(size_t)>& in_group) {
    double acc = NAN, worst = -1;
    std::string ws;
    int nflag = 0;
    for (size_t i = 0; i < r.rows.size(); ++i) {
      if (!in_group(i)) continue;
      const DriftRow& w = r.rows[i];
      acc = w.acc.rel_l2();
      double ratio = w.local.rel_l2() / w.id.bound.value;
      if (!(ratio <= worst)) worst = ratio, ws = w.id.stage;
      nflag += w.flagged;
    }
    per.row({name, fmt_g(acc), fmt_g(worst), ws, std::to_string(nflag)});
  };
  size_t first_layer_row = r.rows.size();
  int L = 0;
  for (size_t i = 0; i < r.rows.size(); ++i)
    if (r.rows[i].id.layer >= 0) {
      first_layer_row = std::min(first_layer_row, i);
      L = std::max(L, r.rows[i].id.layer + 1);
    }
  group_line("embed", [&](size_t i) { return i < first_layer_row; });
  for (int l = 0; l < L; ++l)
    group_line(std::to_string(l), [&](size_t i) { return r.rows[i].id.layer == l; });
  group_line("head", [&](size_t i) { return i > first_layer_row && r.rows[i].id.layer < 0; });
  o += per.str() + "\n";
  if (r.first_flagged >= 0) {
    const DriftRow& w = r.rows[size_t(r.first_flagged)];
    o += strformat("FIRST FLAGGED: %s (op %s%s): local rel_l2 %s > bound %s; %d stage(s) over their bound\n",
                   w.id.stage.c_str(), w.id.op.c_str(),
                   w.id.layer >= 0 ? (", layer " + std::to_string(w.id.layer)).c_str() : "",
                   fmt_g(w.local.rel_l2()).c_str(), fmt_g(w.id.bound.value).c_str(), r.n_flagged);
  } else {
    o += "no stage over its bound: every op of b reproduces a's outputs within rounding\n";
  }
  if (r.routes.recorded) o += "\n" + format_route_flips(r.routes, "");
  return o;
}

std::string drift_tsv(const DriftReport& r) {
  std::string o =
      "stage\tlayer\top\trows\tcols\tacc_rel_l2\tacc_max_abs\tacc_cosine\tlocal_rel_l2\t"
      "local_max_abs\tlocal_mean_abs\tlocal_cosine\tlocal_nmse\tbound_rel_l2\treduction\t"
      "roundings\tamp\tact_q\tflagged\n";
  auto g = [](double v) { return fmt_num("%.6g", v); };
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const DriftRow& w = r.rows[i];
    o += w.id.stage + "\t" + std::to_string(w.id.layer) + "\t" + w.id.op + "\t" +
         std::to_string(w.id.rows) + "\t" + std::to_string(w.id.cols) +
         "\t" + g(w.acc.rel_l2()) + "\t" + g(w.acc.max_abs) + "\t" + g(w.acc.cosine()) + "\t" +
         g(w.local.rel_l2()) + "\t" + g(w.local.max_abs) + "\t" + g(w.local.mean_abs()) + "\t" +
         g(w.local.cosine()) + "\t" + g(w.local.nmse()) + "\t" + g(w.id.bound.value) + "\t" +
         std::to_string(w.id.bound.reduction) + "\t" + std::to_string(w.id.bound.roundings) +
         "\t" + g(w.id.bound.amp) + "\t" + g(w.id.bound.act) + "\t" +
         (w.flagged ? (int(i) == r.first_flagged ? "first" : "yes") : "no") + "\n";
  }
  return o;
}

std::string drift_svg(const DriftReport& r) {
  SvgChart c;
  c.title = "drift: " + r.b_label + " vs " + r.a_label + " (relative L2 per stage)";
  c.x_label = "stage along the forward (ticks: first stage of each layer)";
  c.y_label = "relative L2 error";
  c.log_y = true;
  SvgSeries acc{"accumulated", {}, {}, "#1f77b4", false, true};
  SvgSeries loc{"local", {}, {}, "#d62728", false, true};
  SvgSeries bnd{"bound (local)", {}, {}, "#555555", true, false};
  SvgSeries flg{"flagged", {}, {}, "#000000", false, true};
  int last = -2;
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const DriftRow& w = r.rows[i];
    double x = double(i);
    // Exact zeros cannot sit on a log axis; they are gaps in the line.
    acc.x.push_back(x), acc.y.push_back(w.acc.rel_l2());
    loc.x.push_back(x), loc.y.push_back(w.local.rel_l2());
    bnd.x.push_back(x), bnd.y.push_back(w.id.bound.value);
    if (w.flagged)
      flg.x.push_back(x), flg.y.push_back(std::isfinite(w.local.rel_l2()) ? w.local.rel_l2() : NAN);
    if (w.id.layer != last) {
      std::string lab = w.id.layer >= 0 ? "L" + std::to_string(w.id.layer)
                                        : (i == 0 ? "emb" : "head");
      c.x_ticks.emplace_back(x, lab);
      last = w.id.layer;
    }
  }
  c.series = {acc, loc, bnd};
  if (!flg.x.empty()) c.series.push_back(flg);
  if (r.first_flagged >= 0)
    c.title += "; first flagged: " + stage_id_name(r.rows[size_t(r.first_flagged)].id.stage,
                                                   r.rows[size_t(r.first_flagged)].id.layer);
  return render_svg(c);
}

nlohmann::json drift_json(const DriftReport& r) {
  nlohmann::json j;
  auto num = [](double v) -> nlohmann::json {
    if (std::isfinite(v)) return v;
    return fmt_g(v);
  };
  j["model"] = r.model_path;
  j["corpus"] = r.corpus_path;
  j["input"] = r.input;
  j["a"] = {{"side", r.a_label},
            {"device", r.a_device},
            {"compute", r.a_compute},
            {"inject", r.a_inject}};
  j["b"] = {{"side", r.b_label},
            {"device", r.b_device},
            {"compute", r.b_compute},
            {"inject", r.b_inject}};
  j["positions"] = r.positions;
  j["forwards"] = r.forwards;
  j["width"] = r.width;
  j["roundoff"] = {{"storage", r.u.storage}, {"accum", r.u.accum}, {"safety", kBoundSafety}};
  j["stages"] = nlohmann::json::array();
  for (const DriftRow& w : r.rows)
    j["stages"].push_back({{"stage", w.id.stage},
                           {"layer", w.id.layer},
                           {"op", w.id.op},
                           {"rows", w.id.rows},
                           {"cols", w.id.cols},
                           {"acc",
                            {{"rel_l2", num(w.acc.rel_l2())},
                             {"max_abs", num(w.acc.max_abs)},
                             {"cosine", num(w.acc.cosine())},
                             {"nonfinite", w.acc.nonfinite}}},
                           {"local",
                            {{"rel_l2", num(w.local.rel_l2())},
                             {"max_abs", num(w.local.max_abs)},
                             {"mean_abs", num(w.local.mean_abs())},
                             {"cosine", num(w.local.cosine())},
                             {"nmse", num(w.local.nmse())},
                             {"nonfinite", w.local.nonfinite}}},
                           {"bound", num(w.id.bound.value)},
                           {"act_q", num(w.id.bound.act)},
                           {"flagged", w.flagged}});
  j["b_providers"] = r.b_providers;
  j["n_flagged"] = r.n_flagged;
  if (r.first_flagged >= 0) {
    const LocalRow& id = r.rows[size_t(r.first_flagged)].id;
    j["first_flagged"] = {{"stage", id.stage}, {"layer", id.layer}, {"op", id.op}};
  } else {
    j["first_flagged"] = nullptr;
  }
  j["routing_flips"] = to_json(r.routes);
  return j;
}

}  // namespace arbiter::verify
