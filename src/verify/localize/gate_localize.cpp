#include "verify/localize/gate_localize.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "core/error.h"
#include "core/progress.h"

namespace arbiter::verify {

const char* localize_class_name(LocalizeClass c) {
  switch (c) {
    case LocalizeClass::NearTieFlip: return "near-tie flip";
    case LocalizeClass::LocalizedDefect: return "localized defect";
    case LocalizeClass::Unexplained: return "unexplained";
  }
  return "?";
}

LocalizeClass localize_class(const DriftReport& drift, double deficit, double band) {
  if (drift.n_flagged > 0) return LocalizeClass::LocalizedDefect;
  if (deficit <= band) return LocalizeClass::NearTieFlip;
  return LocalizeClass::Unexplained;
}

namespace {

constexpr int kTopK = 5;

std::vector<TopToken> top_tokens(const std::vector<double>& row, const Model& m) {
  LogitsSummary s;
  summarize_on_host(row.data(), int(row.size()), std::min(kTopK, int(row.size())), -1, s);
  std::vector<TopToken> out;
  for (size_t k = 0; k < s.top_ids.size(); ++k)
    out.push_back({s.top_ids[k], m.tokenizer->token_bytes(s.top_ids[k]), s.top_logits[k]});
  return out;
}

// The greedy order every tier uses: larger logit first, ties to the lower id; NaN last.
int rank_of(const std::vector<double>& row, int32_t id) {
  const double x = row[size_t(id)];
  int rank = 1;
  for (size_t v = 0; v < row.size(); ++v) {
    if (int32_t(v) == id || std::isnan(row[v])) continue;
    if (std::isnan(x) || row[v] > x || (row[v] == x && int32_t(v) < id)) ++rank;
  }
  return rank;
}

}  // namespace

GateLocalization localize_divergence(const GateDivergence& d, DriftReport drift,
                                     const std::vector<double>& ref_row,
                                     const std::vector<double>& side_row, const Model& m,
                                     double band, double jump_factor) {
  ARB_CHECK(!ref_row.empty() && ref_row.size() == side_row.size(),
            "[gate] localize: logits rows of %zu and %zu entries", ref_row.size(),
            side_row.size());
  ARB_CHECK(d.j.ref_token >= 0 && size_t(d.j.ref_token) < ref_row.size(),
            "[gate] localize: reference token %d outside the vocabulary [0, %zu)", d.j.ref_token,
            ref_row.size());
  GateLocalization g;
  g.side = d.side, g.prompt = d.prompt, g.step = d.step;
  g.positions = drift.positions;
  g.ref_token = d.j.ref_token, g.side_token = d.j.side_token;
  g.ref_top = top_tokens(ref_row, m);
  g.side_top = top_tokens(side_row, m);
  g.ref_gap = g.ref_top.size() > 1 ? g.ref_top[0].logit - g.ref_top[1].logit : INFINITY;
  g.deficit = d.j.deficit;
  g.ref_rank_in_side = rank_of(side_row, d.j.ref_token);
  g.summary = drift_summary(drift, jump_factor);
  g.cls = localize_class(drift, d.j.deficit, band);
  g.drift = std::move(drift);
  return g;
}

GateLocalizeReport run_gate_localize(const GateOptions& opt, const GateReport& gate) {
  GateLocalizeReport r;
  r.band = gate.band;
  for (const GateSideSummary& s : gate.sides) r.side_labels.push_back(s.label);
  ARB_CHECK(opt.sides.size() <= gate.sides.size() && !gate.side_runs.empty(),
            "[gate] localize: %zu sides run, the report has %zu", opt.sides.size(),
            gate.sides.size());
  std::unique_ptr<Model> m;
  std::map<int, std::unique_ptr<Backend>> backends;  // made once per side that needs one
  auto backend = [&](int s) -> Backend& {
    auto& be = backends[s];
    if (!be) be = make_side_backend(opt.sides[size_t(s)], opt.threads);
    return *be;
  };
  for (const GateDivergence& d : gate.divergences) {
    if (!d.counts) continue;  // a self-inconsistent side's flips are not judged; nor localized
    // A side recorded elsewhere (gate --against) has no tier here to run drift on.
    if (d.side >= int(opt.sides.size())) {
      ++r.recorded_skipped;
      continue;
    }
    if (!m) m = load_model(opt.model_path);
    std::vector<int32_t> ids = gate.prompt_ids[size_t(d.prompt)];
    const std::vector<int32_t>& ref = gate.side_runs[0].tokens[size_t(d.prompt)][0];
    ARB_CHECK(d.step <= int(ref.size()), "[gate] localize: step %d past the reference's %zu tokens",
              d.step, ref.size());
    ids.insert(ids.end(), ref.begin(), ref.begin() + d.step);
    const int n = int(ids.size());
    ARB_CHECK(n <= m->config.max_pos,
              "[gate] localize: a prefix of %d tokens passes the model's %d positions", n,
              m->config.max_pos);
    const Side &sa = opt.sides[0], &sb = opt.sides[size_t(d.side)];
    if (opt.progress)
      progress_note("gate", "localizing side " + sb.label + ", prompt " + std::to_string(d.prompt + 1) +
                   ", step " + std::to_string(d.step) + ": drift over " + std::to_string(n) +
                   " positions");
    // Fresh sessions as wide as the prefix: one forward, whose last row is the judged step.
    Session s_a(*m, backend(0), n, n), s_b(*m, backend(d.side), n, n);
    s_a.set_inject(sa.inject);
    s_b.set_inject(sb.inject);
    std::vector<double> ref_row, side_row;
    DriftReport dr = drift_run(s_a, s_b, ids, n, &ref_row, &side_row);
    dr.model_path = opt.model_path;
    dr.input = "prompt " + std::to_string(d.prompt + 1) + " + " + std::to_string(d.step) +
               " reference tokens";
    dr.a_label = sa.label, dr.b_label = sb.label;
    r.items.push_back(localize_divergence(d, std::move(dr), ref_row, side_row, *m, gate.band));
  }
  return r;
}

// --- reports ------------------------------------------------------------------------------

namespace {

std::string tok_text(const TopToken& t) {
  return "'" + printable_piece(t.piece) + "'(" + std::to_string(t.id) + ")";
}

std::string stage_text(const DriftRow& w) {
  return w.id.stage + " (op " + w.id.op +
         (w.id.layer >= 0 ? ", layer " + std::to_string(w.id.layer) : std::string()) + ")";
}

std::string first_text(const GateLocalization& g) {
  if (g.drift.first_flagged < 0) return "none";
  const DriftRow& w = g.drift.rows[size_t(g.drift.first_flagged)];
  const double e = w.local.rel_l2();
  return stage_text(w) + ", local/bound " + fmt_g(std::isfinite(e) ? e / w.id.bound.value : e);
}

std::string worst_text(const GateLocalization& g) {
  if (g.summary.worst < 0) return "none";
  const DriftRow& w = g.drift.rows[size_t(g.summary.worst)];
  return fmt_g(g.summary.worst_ratio) + " at " + stage_id_name(w.id.stage, w.id.layer);
}

std::string growth_text(const GateLocalization& g, double factor) {
  const DriftSummary& s = g.summary;
  if (s.growth_layer < 0) return "no layers";
  if (s.jump)
    return "jump at layer " + std::to_string(s.growth_layer) + " (accumulated error x" +
           fmt_g(s.growth) + " over the layer, local/bound " + fmt_g(s.growth_ratio) + ")";
  return "uniform (largest growth x" + fmt_g(s.growth) + " at layer " +
         std::to_string(s.growth_layer) + "; a jump needs > x" + fmt_g(factor) +
         " with local/bound > 1)";
}

std::string class_text(const GateLocalization& g) {
  std::string c = localize_class_name(g.cls);
  if (g.cls == LocalizeClass::LocalizedDefect)
    c += ": " + stage_text(g.drift.rows[size_t(g.drift.first_flagged)]);
  return c;
}

std::string header_line(const GateLocalizeReport& r, const GateLocalization& g) {
  return "side " + r.side_labels[size_t(g.side)] + ", prompt " + std::to_string(g.prompt + 1) +
         ", step " + std::to_string(g.step) + " (prefix of " + std::to_string(g.positions) +
         " positions)";
}

std::string count_line(const GateLocalizeReport& r) {
  int n[3] = {0, 0, 0};
  for (const GateLocalization& g : r.items) ++n[int(g.cls)];
  char b[160];
  std::snprintf(b, sizeof b,
                "%zu divergence(s) localized: %d localized defect, %d near-tie flip, %d "
                "unexplained",
                r.items.size(), n[int(LocalizeClass::LocalizedDefect)],
                n[int(LocalizeClass::NearTieFlip)], n[int(LocalizeClass::Unexplained)]);
  return b;
}

}  // namespace

std::string gate_localize_text(const GateLocalizeReport& r) {
  std::string o =
      "\nlocalize (drift between the reference and the diverging side on each divergence's "
      "prefix, one forward; its last position is the judged step):\n";
  if (r.items.empty()) o += "  no counted divergence to localize\n";
  if (r.recorded_skipped)
    o += "  " + std::to_string(r.recorded_skipped) +
         " divergence(s) of recorded sides not localized: their tiers did not run here\n";
  char b[1024];
  for (const GateLocalization& g : r.items) {
    o += "\n  " + header_line(r, g) + "\n";
    const std::string rh = "reference " + r.side_labels[0];
    const std::string sh = "side " + r.side_labels[size_t(g.side)];
    int w = int(std::max(rh.size(), sh.size()));  // one width for both token columns
    for (const auto* v : {&g.ref_top, &g.side_top})
      for (const TopToken& t : *v) w = std::max(w, int(tok_text(t).size()));
    std::snprintf(b, sizeof b, "    %4s  %-*s %12s   %-*s %12s\n", "rank", w, rh.c_str(),
                  "logit", w, sh.c_str(), "logit");
    o += b;
    for (size_t k = 0; k < std::max(g.ref_top.size(), g.side_top.size()); ++k) {
      auto cell = [&](const std::vector<TopToken>& v, bool logit) {
        if (k >= v.size()) return std::string();
        if (!logit) return tok_text(v[k]);
        std::snprintf(b, sizeof b, "%.6f", v[k].logit);
        return std::string(b);
      };
      const std::string rt = cell(g.ref_top, false), rl = cell(g.ref_top, true);
      const std::string st = cell(g.side_top, false), sl = cell(g.side_top, true);
      std::snprintf(b, sizeof b, "    %4zu  %-*s %12s   %-*s %12s\n", k + 1, w, rt.c_str(),
                    rl.c_str(), w, st.c_str(), sl.c_str());
      o += b;
    }
    std::snprintf(b, sizeof b,
                  "    reference top-1/top-2 gap %.6f nats; the reference's token is rank %d in "
                  "the side's logits; gate deficit %.6f (band %g)\n",
                  g.ref_gap, g.ref_rank_in_side, g.deficit, r.band);
    o += b;
    o += "    first stage over its bound: " + first_text(g) + "\n";
    o += "    max local/bound: " + worst_text(g) + "\n";
    o += "    growth: " + growth_text(g, r.jump_factor) + "\n";
    o += "    class: " + class_text(g) + "\n";
  }
  o += "\n" + count_line(r) + "\n";
  return o;
}

std::string gate_localize_markdown(const GateLocalizeReport& r) {
  // Table cells: a '|' inside a piece would end the cell.
  auto cell = [](std::string s) {
    std::string o;
    for (char c : s) o += c == '|' ? std::string("\\|") : std::string(1, c);
    return o;
  };
  std::string o = "### Localized divergences\n\n";
  if (r.recorded_skipped)
    o += std::to_string(r.recorded_skipped) +
         " divergence(s) of recorded sides not localized: their tiers did not run here.\n\n";
  if (r.items.empty()) return o + "No counted divergence to localize.\n";
  char b[256];
  for (const GateLocalization& g : r.items) {
    o += "#### " + cell(header_line(r, g)) + "\n\n";
    o += "| rank | reference " + cell(r.side_labels[0]) + " | logit | side " +
         cell(r.side_labels[size_t(g.side)]) + " | logit |\n|---|---|---|---|---|\n";
    for (size_t k = 0; k < std::max(g.ref_top.size(), g.side_top.size()); ++k) {
      o += "| " + std::to_string(k + 1);
      for (const auto* v : {&g.ref_top, &g.side_top}) {
        if (k < v->size()) {
          std::snprintf(b, sizeof b, "%.6f", (*v)[k].logit);
          o += " | `" + cell(tok_text((*v)[k])) + "` | " + b;
        } else {
          o += " | | ";
        }
      }
      o += " |\n";
    }
    std::snprintf(b, sizeof b,
                  "\n- reference top-1/top-2 gap: %.6f nats; rank of the reference's token in the "
                  "side's logits: %d; gate deficit %.6f (band %g)\n",
                  g.ref_gap, g.ref_rank_in_side, g.deficit, r.band);
    o += b;
    o += "- first stage over its bound: " + cell(first_text(g)) + "\n";
    o += "- max local/bound: " + cell(worst_text(g)) + "\n";
    o += "- growth: " + cell(growth_text(g, r.jump_factor)) + "\n";
    o += "- **class: " + cell(class_text(g)) + "**\n\n";
  }
  return o + count_line(r) + "\n";
}

nlohmann::json gate_localize_json(const GateLocalizeReport& r) {
  auto num = [](double v) -> nlohmann::json {
    if (std::isfinite(v)) return v;
    return fmt_g(v);
  };
  auto tops = [&](const std::vector<TopToken>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const TopToken& t : v)
      a.push_back({{"id", t.id}, {"piece", t.piece}, {"logit", num(t.logit)}});
    return a;
  };
  auto stage = [](const DriftRow& w) {
    return nlohmann::json{{"stage", w.id.stage}, {"layer", w.id.layer}, {"op", w.id.op}};
  };
  nlohmann::json items = nlohmann::json::array();
  for (const GateLocalization& g : r.items) {
    const DriftSummary& s = g.summary;
    nlohmann::json drift = {
        {"positions", g.drift.positions},
        {"n_flagged", g.drift.n_flagged},
        {"first_flagged", g.drift.first_flagged >= 0
                              ? stage(g.drift.rows[size_t(g.drift.first_flagged)])
                              : nlohmann::json(nullptr)},
        {"max_local_over_bound", num(s.worst_ratio)},
        {"max_at", s.worst >= 0 ? stage(g.drift.rows[size_t(s.worst)]) : nlohmann::json(nullptr)},
        {"growth",
         {{"kind", s.growth_layer < 0 ? "none" : (s.jump ? "jump" : "uniform")},
          {"layer", s.growth_layer},
          {"factor", num(s.growth)},
          {"local_over_bound", num(s.growth_ratio)},
          {"jump_factor", r.jump_factor}}},
        {"b_providers", g.drift.b_providers}};
    items.push_back({{"side", r.side_labels[size_t(g.side)]},
                     {"prompt", g.prompt + 1},
                     {"step", g.step},
                     {"ref_token", g.ref_token},
                     {"side_token", g.side_token},
                     {"ref_top", tops(g.ref_top)},
                     {"side_top", tops(g.side_top)},
                     {"ref_gap", num(g.ref_gap)},
                     {"deficit", num(g.deficit)},
                     {"ref_rank_in_side", g.ref_rank_in_side},
                     {"drift", drift},
                     {"class", localize_class_name(g.cls)}});
  }
  return items;
}

}  // namespace arbiter::verify
